"""The per-row work of block verification as OpenVINO graphs (see :mod:`.openvino_block`).

Rows are normalised as the token-wise graphs do (``p = e / s`` with ``e = exp((l - max) / T)``
from logits) and every index from caller data is clamped, for the reasons given in
:mod:`.openvino_graphs`. Shapes are dynamic; the host guarantees ``B >= 1`` and ``K >= 1``.
"""

from __future__ import annotations

import openvino as ov
import openvino.opset13 as ops

from portable_verify.backends.openvino_graphs import (
    FLOAT32_MAX,
    FLOAT32_TINY,
    Node,
    _clamp_index,
    _col,
    _dim,
    _f32,
    _i64,
    _iota,
    inverse_cdf_draw,
)


def _param(name: str, shape: list[int], dtype: ov.Type) -> ov.Node:
    return ops.parameter(ov.PartialShape(shape), dtype, name=name)


def safe_temperature(temp: Node) -> Node:
    """``T`` clamped into the normal float32 range as the reference does; 1 where ``T <= 0``
    (greedy rows, whose sampled answer is discarded)."""
    normal_t = ops.minimum(ops.maximum(temp, _f32(FLOAT32_TINY)), _f32(FLOAT32_MAX))
    return ops.select(ops.greater(temp, _f32(0.0)), normal_t, _f32(1.0))


def normalised_rows(rows: Node, temp: Node | None) -> Node:
    """``p`` of ``[M, V]`` rows: ``e / s`` from logits (``temp [M]``), else the rows."""
    if temp is None:
        return rows
    zm = ops.divide(ops.subtract(rows, ops.reduce_max(rows, _i64([1]), True)),
                    _col(safe_temperature(temp)))
    e = ops.exp(zm)
    return ops.divide(e, ops.reduce_sum(e, _i64([1]), True))


def _flat(x: Node) -> Node:
    return ops.reshape(x, _i64([-1]), False)


def _one_hot(x: Node, vocab: Node) -> Node:
    """float32 ``[M, V]`` rows, 1 at ``x`` (an id outside ``[0, V)`` gives a zero row)."""
    return ops.convert(ops.equal(ops.unsqueeze(_iota(vocab), _i64(0)), _col(x)), "f32")


def _position_rows(params: dict[str, Node], is_logits: bool,
                   has_q: bool) -> tuple[Node, Node, Node, Node]:
    """``(p, q, x, shape)`` at every draft position, flattened to ``[B*K, V]`` rows."""
    target, drafts = params["target"], params["draft_token_ids"]
    vocab, k = _dim(target, 1), _dim(drafts, 1)
    rows = ops.gather(_clamp_index(params["target_rows"], _dim(target, 0)), _iota(k), _i64(1))
    temp = None
    if is_logits:
        temp = _flat(ops.broadcast(_col(params["temperature"]), ops.shape_of(drafts, "i64")))
    p = normalised_rows(ops.gather(target, _flat(rows), _i64(0)), temp)
    x = _flat(drafts)
    if has_q:
        q_rows = _clamp_index(params["draft_rows"], _dim(params["draft_probs"], 0))
        q = ops.gather(params["draft_probs"], _flat(q_rows), _i64(0))
    else:
        q = _one_hot(x, vocab)
    return p, q, _clamp_index(x, vocab), ops.shape_of(drafts, "i64")


def _take_flat(rows: Node, index: Node) -> Node:
    """``rows[i, index[i]]`` for ``[M, V]`` rows and ``[M]`` indices."""
    return ops.squeeze(ops.gather(rows, _col(index), _i64(1), 1), _i64([1]))


def build_block(stage: str, is_logits: bool, has_q: bool) -> ov.Model:
    """The ``ov.Model`` of one stage: ``values`` (outputs ``px``, ``qx`` ``[B, K]``),
    ``masses`` (``mass [B, K]``) or ``final`` (``token [B]``)."""
    if stage == "final":
        return _build_final(is_logits, has_q)
    names = [("target", [-1, -1], ov.Type.f32), ("target_rows", [-1, -1], ov.Type.i64),
             ("draft_token_ids", [-1, -1], ov.Type.i64)]
    if is_logits:
        names.append(("temperature", [-1], ov.Type.f32))
    if has_q:
        names += [("draft_probs", [-1, -1], ov.Type.f32), ("draft_rows", [-1, -1], ov.Type.i64)]
    if stage == "masses":
        names.append(("scale", [-1, -1], ov.Type.f32))
    params = {name: _param(name, shape, dtype) for name, shape, dtype in names}
    p, q, x, shape = _position_rows(params, is_logits, has_q)
    if stage == "values":
        outputs = [ops.reshape(_take_flat(p, x), shape, False),
                   ops.reshape(_take_flat(q, x), shape, False)]
    else:
        scaled = ops.multiply(p, _col(_flat(params["scale"])))
        residual = ops.maximum(ops.subtract(scaled, q), _f32(0.0))
        outputs = [ops.reshape(ops.reduce_sum(residual, _i64([1]), False), shape, False)]
    results = [ops.result(out, name=f"out{i}") for i, out in enumerate(outputs)]
    return ov.Model(results, list(params.values()), f"block_{stage}")


def _build_final(is_logits: bool, has_q: bool) -> ov.Model:
    """The draw from ``max(P_{a-1} p_a - q_a, 0)`` where rejected and non-empty, else ``p_a``."""
    names = [("target", [-1, -1], ov.Type.f32), ("row", [-1], ov.Type.i64)]
    if is_logits:
        names.append(("temperature", [-1], ov.Type.f32))
    names += [("scale", [-1], ov.Type.f32), ("rejected", [-1], ov.Type.boolean),
              ("v", [-1], ov.Type.f32)]
    names += ([("draft_probs", [-1, -1], ov.Type.f32), ("draft_row", [-1], ov.Type.i64)]
              if has_q else [("x", [-1], ov.Type.i64)])
    params = {name: _param(name, shape, dtype) for name, shape, dtype in names}
    target = params["target"]
    row = _clamp_index(params["row"], _dim(target, 0))
    p = normalised_rows(ops.gather(target, row, _i64(0)), params.get("temperature"))
    if has_q:
        q = ops.gather(params["draft_probs"], params["draft_row"], _i64(0))
    else:
        q = _one_hot(params["x"], _dim(target, 1))
    residual = ops.maximum(ops.subtract(ops.multiply(p, _col(params["scale"])), q), _f32(0.0))
    non_empty = ops.reduce_logical_or(ops.greater(residual, _f32(0.0)), _i64([1]), True)
    use_residual = ops.logical_and(_col(params["rejected"]), non_empty)
    token = inverse_cdf_draw(ops.select(use_residual, residual, p), params["v"])
    return ov.Model([ops.result(token, name="token")], list(params.values()), "block_final")

