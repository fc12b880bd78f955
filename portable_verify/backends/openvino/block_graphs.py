"""The per-row work of block verification as OpenVINO graphs (see :mod:`.block`).

Rows are normalised as the token-wise graphs do (``p = e / s`` with ``e = exp((l - max) / T)``
from logits) and every index from caller data is clamped, for the reasons given in
:mod:`.chain_graphs`. Shapes are dynamic; the host guarantees ``B >= 1`` and ``K >= 1``. These
graphs read no per-call scalar (no argmax block, no typical parameter), so they take no
``scalars`` record.
"""

from __future__ import annotations

import openvino as ov
import openvino.opset13 as ops

from portable_verify.backends.openvino.chain_graphs import (
    Node,
    _clamp_index,
    _col,
    _dim,
    _f32,
    _i64,
    _iota,
    _row_temperatures,
    inverse_cdf_draw,
    safe_temperature,
)


def _param(name: str, shape: list[int], dtype: ov.Type) -> ov.Node:
    return ops.parameter(ov.PartialShape(shape), dtype, name=name)


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


def _positions(params: dict[str, Node]) -> tuple[Node, Node, Node]:
    """``(target rows [B, K], drafts clamped into [0, V), shape [B, K])`` of the draft
    positions."""
    target, drafts = params["target"], params["draft_token_ids"]
    k = _dim(drafts, 1)
    rows = ops.gather(_clamp_index(params["target_rows"], _dim(target, 0)), _iota(k), _i64(1))
    return rows, _clamp_index(drafts, _dim(target, 1)), ops.shape_of(drafts, "i64")


def _draft_values(params: dict[str, Node], is_logits: bool,
                  has_q: bool) -> tuple[Node, Node, Node | None, Node | None]:
    """``(px, qx, max, sum)`` at every draft position, ``[B, K]``, as the rejection graph
    computes them: one pass over the target rows for their max and ``sum e``, then
    ``p(x) = e(x) / s`` by flat-index ``Gather`` (max and sum are None for probabilities)."""
    target = params["target"]
    rows, x, _ = _positions(params)
    vocab = _dim(target, 1)
    flat_index = ops.add(ops.multiply(rows, vocab), x)
    m = s = None
    if is_logits:
        t_col = _col(_row_temperatures(params["temperature"], params["target_rows"], target))
        m_all = ops.reduce_max(target, _i64([1]), True)  # [R, 1]
        e = ops.exp(ops.divide(ops.subtract(target, m_all), t_col))
        s_all = ops.reduce_sum(e, _i64([1]), False)
        px = ops.divide(ops.gather(_flat(e), flat_index, _i64(0)), ops.gather(s_all, rows, _i64(0)))
        m = ops.gather(_flat(m_all), rows, _i64(0))
        s = ops.gather(s_all, rows, _i64(0))
    else:
        px = ops.gather(_flat(target), flat_index, _i64(0))
    if has_q:
        q_rows = _clamp_index(params["draft_rows"], _dim(params["draft_probs"], 0))
        q_index = ops.add(ops.multiply(q_rows, vocab), x)
        qx = ops.gather(_flat(params["draft_probs"]), q_index, _i64(0))
    else:
        qx = ops.broadcast(_f32(1.0), ops.shape_of(x, "i64"))
    return px, qx, m, s


def _position_masses(params: dict[str, Node], is_logits: bool, has_q: bool) -> Node:
    """``sum_v max(P_{j-1} p_j(v) - q_j(v), 0)`` at every position, ``[B, K]``; from logits the
    rows reuse the ``values`` stage's max and sum (``p = exp((l - max) / T) / s``)."""
    target, drafts = params["target"], params["draft_token_ids"]
    rows, _, shape = _positions(params)
    p = ops.gather(target, _flat(rows), _i64(0))  # [B*K, V]
    if is_logits:
        # The same per-row temperatures as the values stage (and the rejection graph).
        t = ops.gather(_row_temperatures(params["temperature"], params["target_rows"], target),
                       _flat(rows), _i64(0))
        e = ops.exp(ops.divide(ops.subtract(p, _col(_flat(params["row_max"]))), _col(t)))
        p = ops.divide(e, _col(_flat(params["row_sum"])))
    if has_q:
        q_rows = _clamp_index(params["draft_rows"], _dim(params["draft_probs"], 0))
        q = ops.gather(params["draft_probs"], _flat(q_rows), _i64(0))
    else:
        q = _one_hot(_flat(drafts), _dim(target, 1))
    scaled = ops.multiply(p, _col(_flat(params["scale"])))
    residual = ops.maximum(ops.subtract(scaled, q), _f32(0.0))
    return ops.reshape(ops.reduce_sum(residual, _i64([1]), False), shape, False)


def build_block(stage: str, is_logits: bool, has_q: bool) -> ov.Model:
    """The ``ov.Model`` of one stage: ``values`` (outputs ``px``, ``qx`` ``[B, K]``, and from
    logits each position's row max and sum),
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
        if is_logits:
            names += [("row_max", [-1, -1], ov.Type.f32), ("row_sum", [-1, -1], ov.Type.f32)]
    params = {name: _param(name, shape, dtype) for name, shape, dtype in names}
    if stage == "values":
        outputs = [out for out in _draft_values(params, is_logits, has_q) if out is not None]
    else:
        outputs = [_position_masses(params, is_logits, has_q)]
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

