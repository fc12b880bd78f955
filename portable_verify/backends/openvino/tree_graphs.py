"""The per-row work of tree verification as OpenVINO graphs (see :mod:`.tree`).

Each graph takes the rows it works on as ``[M, V]`` inputs (the host gathers the rows on the
walked paths), so one compiled model per variant serves every tree shape. The arithmetic is the
token-wise graphs' own (``p = e / s`` from logits, the entropy from ``log s``, the typical
threshold, the blocked argmax, the two-level draw: the helpers of :mod:`.chain_graphs`), so a
chain gives exactly ``verify``'s answer on this backend. The graphs that read per-call scalars
(``rows`` for typical, ``argmax``) take them as the one ``scalars`` record of :mod:`.record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import openvino as ov
import openvino.opset13 as ops

from portable_verify.backends.openvino.chain_graphs import (
    _col,
    _dim,
    _f32,
    _i64,
    _iota,
    block_size,
    entropy_from_logits,
    entropy_of_probs,
    first_argmax,
    inverse_cdf_draw,
    safe_temperature,
    typical_threshold,
)


@dataclass(frozen=True)
class TreeGraph:
    """The key of one compiled tree graph.

    ``rows``: a node's normalised row ``p`` (and, for typical, its threshold and argmax);
    ``argmax``: the greedy argmax of raw rows; ``residual``: one rejected child folded in;
    ``traversal``: traversal verification's fold of one rejected child into its parent;
    ``draw``: the inverse-CDF draw.
    """

    kind: Literal["rows", "argmax", "residual", "traversal", "draw"]
    is_logits: bool = False
    typical: bool = False
    children: str = "deterministic"

    def build(self) -> ov.Model:
        builders = {"rows": _rows, "argmax": _argmax, "residual": _residual,
                    "traversal": _traversal, "draw": _draw}
        return builders[self.kind](self)


def _param(name: str, shape: list[int], dtype: ov.Type = ov.Type.f32) -> ov.Node:
    return ops.parameter(ov.PartialShape(shape), dtype, name=name)


def _model(outputs: list, params: list, name: str) -> ov.Model:
    results = [ops.result(out, name=f"out{i}") for i, out in enumerate(outputs)]
    return ov.Model(results, params, name)


def _rows(graph: TreeGraph) -> ov.Model:
    """``p [M, V]``; typical adds ``threshold [M]`` (``min(eps, alpha exp(-H))``) and
    ``argmax(p) [M]``."""
    rows = _param("rows", [-1, -1])
    params = [rows]
    if graph.is_logits:
        temp = _param("temperature", [-1])
        params.append(temp)
        zm = ops.divide(ops.subtract(rows, ops.reduce_max(rows, _i64([1]), True)),
                        _col(safe_temperature(temp)))
        e = ops.exp(zm)
        s = ops.reduce_sum(e, _i64([1]), False)
        p = ops.divide(e, _col(s))
    else:
        p = rows
    outputs = [p]
    if graph.typical:
        scalars = _param("scalars", [-1])
        params.append(scalars)
        entropy = entropy_from_logits(e, zm, s) if graph.is_logits else entropy_of_probs(p)
        outputs += [typical_threshold(entropy, scalars), first_argmax(p, block_size(scalars))[0]]
    return _model(outputs, params, "tree_rows")


def _argmax(graph: TreeGraph) -> ov.Model:
    rows, scalars = _param("rows", [-1, -1]), _param("scalars", [-1])
    return _model([first_argmax(rows, block_size(scalars))[0]], [rows, scalars], "tree_argmax")


def _residual(graph: TreeGraph) -> ov.Model:
    """``(w, r, q)`` after rejecting ``x``: ``w = max(r - q_x, 0)`` (``r`` itself when that is
    empty), ``r`` its normalisation, and, without replacement, ``q`` with ``x`` zeroed and
    renormalised (after the subtraction). Deterministic children use ``q_x = one-hot(x)``."""
    r, x = _param("r", [-1, -1]), _param("x", [-1], ov.Type.i64)
    hit = ops.equal(ops.unsqueeze(_iota(_dim(r, 1)), _i64(0)), _col(x))  # [M, V]
    if graph.children == "deterministic":
        params, q = [r, x], ops.convert(hit, "f32")
    else:
        params, q = [r, _param("q", [-1, -1]), x], None
        q = params[1]
    residual = ops.maximum(ops.subtract(r, q), _f32(0.0))
    total = ops.reduce_sum(residual, _i64([1]), True)
    kept = ops.greater(total, _f32(0.0))
    w = ops.select(kept, residual, r)
    outputs = [w, ops.select(kept, ops.divide(residual, total), r)]
    if graph.children == "without_replacement":
        removed = ops.select(hit, _f32(0.0), q)
        q_total = ops.reduce_sum(removed, _i64([1]), True)
        outputs.append(ops.select(ops.greater(q_total, _f32(0.0)),
                                  ops.divide(removed, q_total), removed))
    return _model(outputs, params, "tree_residual")


def _traversal(graph: TreeGraph) -> ov.Model:
    """Traversal's fold of a rejected child (token ``x``) into its parent: ``r = max(f32(W) R -
    Q, 0)`` with ``R = D / sum`` and its float32 sum ``S``; without replacement also ``Q`` without
    ``x``, renormalised (after the subtraction). Deterministic children use ``Q = one-hot(x)``.
    Inputs ``D [M, V]``, ``sum [M]``, ``W [M]``, (``Q [M, V]``), ``x [M]``."""
    d, d_sum, w = _param("d", [-1, -1]), _param("d_sum", [-1]), _param("w", [-1])
    x = _param("x", [-1], ov.Type.i64)
    hit = ops.equal(ops.unsqueeze(_iota(_dim(d, 1)), _i64(0)), _col(x))  # [M, V]
    if graph.children == "deterministic":
        params, q = [d, d_sum, w, x], ops.convert(hit, "f32")
    else:
        q = _param("q", [-1, -1])
        params = [d, d_sum, w, q, x]
    law = ops.divide(d, _col(d_sum))
    r = ops.maximum(ops.subtract(ops.multiply(_col(w), law), q), _f32(0.0))
    outputs = [r, ops.reduce_sum(r, _i64([1]), False)]
    if graph.children == "without_replacement":
        removed = ops.select(hit, _f32(0.0), q)
        q_total = ops.reduce_sum(removed, _i64([1]), True)
        outputs.append(ops.select(ops.greater(q_total, _f32(0.0)),
                                  ops.divide(removed, q_total), removed))
    return _model(outputs, params, "tree_traversal")


def _draw(graph: TreeGraph) -> ov.Model:
    weights, v = _param("weights", [-1, -1]), _param("v", [-1])
    return _model([inverse_cdf_draw(weights, v)], [weights, v], "tree_draw")
