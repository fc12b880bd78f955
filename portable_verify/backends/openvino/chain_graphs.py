"""The verification rules of docs/semantics.md as OpenVINO graphs (opset API, dynamic shapes).

One graph per variant (greedy; rejection or typical, from logits or probabilities, with or
without draft probabilities, with or without greedy rows mixed in). B, K, V and the number of
target rows are dynamic, so one compiled model serves every call of its variant.

Graph inputs, in order (see :func:`input_names`): the flat-rows layout of
:class:`~portable_verify.core.types.VerifyInputs` plus ``scalars``, the call's scalar record
(:mod:`.record`: the argmax block and the typical parameters), read by :func:`block_size` and
:func:`typical_threshold`, the helpers every graph family shares. The block is a divisor of V
chosen on the host: the argmax reads the target as ``[R, V/block, block]`` blocks so that it is
one ``ReduceMax`` pass followed by work on ``[R, V/block]`` and ``[R, block]`` only (a full-row
``TopK`` or ``Equal``/``Select``/``ReduceMin`` pass alone costs more than the whole blocked
graph on the CPU plugin: docs/benchmarks.md, "OpenVINO").

The host guarantees ``B >= 1`` and ``K >= 1`` (it pads ``K = 0`` to one unused position), so no
tensor in the graph has a zero-sized dimension.

CPU plugin pitfalls avoided here: no ``Slice`` anywhere (a Slice feeding GatherElements is
mis-compiled; column subsets are taken with ``Gather``), no ``TopK`` and no ``Multinomial``
(the uniforms are a graph input, so results are reproducible and match every other backend).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from portable_verify.backends.openvino import record
from portable_verify.core import methods
from portable_verify.core.constants import DRAW_BLOCK, FLOAT32_LOWEST, FLOAT32_MAX, FLOAT32_TINY

Node = ov.Output | ov.Node


@dataclass(frozen=True)
class Variant:
    """What a compiled graph computes; the compiled-model cache is keyed by it."""

    kind: str | None = None  # a rule of SAMPLED; None: every row greedy (the argmax graph)
    is_logits: bool = True
    has_draft_probs: bool = False
    with_greedy_rows: bool = False  # some rows have temperature 0 (mixed batch)


def input_names(variant: Variant) -> tuple[str, ...]:
    """Names of the graph inputs, in order; the host feeds arrays in the same order."""
    names = ["target", "target_rows", "draft_token_ids", "num_draft_tokens", "scalars"]
    if variant.kind is None:
        return tuple(names)
    names += ["temperature", "uniforms"]
    if variant.has_draft_probs:
        names += ["draft_probs", "draft_rows"]
    return tuple(names)


_INPUT_TYPES: dict[str, tuple[list[int], ov.Type]] = {
    "target": ([-1, -1], ov.Type.f32),
    "target_rows": ([-1, -1], ov.Type.i64),
    "draft_token_ids": ([-1, -1], ov.Type.i64),
    "num_draft_tokens": ([-1], ov.Type.i64),
    "scalars": ([-1], ov.Type.f32),  # record.call_scalars
    "temperature": ([-1], ov.Type.f32),
    "uniforms": ([-1, -1], ov.Type.f32),
    "draft_probs": ([-1, -1], ov.Type.f32),
    "draft_rows": ([-1, -1], ov.Type.i64),
}


def _i64(value: int | list[int]) -> Node:
    return ops.constant(np.array(value, dtype=np.int64))


def _f32(value: float) -> Node:
    return ops.constant(np.array(value, dtype=np.float32))


def _dim(x: Node, axis: int) -> Node:
    """Scalar i64 size of ``x`` along ``axis``."""
    return ops.gather(ops.shape_of(x, "i64"), _i64(axis), _i64(0))


def _iota(n: Node) -> Node:
    """``[0, 1, .., n-1]`` as i64 for a scalar i64 ``n``."""
    return ops.range(_i64(0), n, _i64(1), "i64")


def _col(x: Node) -> Node:
    """``[N] -> [N, 1]``."""
    return ops.unsqueeze(x, _i64(1))


def _take(x: Node, index: Node) -> Node:
    """``x[i, index[i]]`` for a 2-D ``x`` and an i64 ``[N]`` index (Gather with batch_dims=1)."""
    return ops.gather(x, _col(index), _i64(1), 1)


def _squeeze_col(x: Node) -> Node:
    return ops.squeeze(x, _i64([1]))


def _scalar(scalars: Node, index: int) -> Node:
    """Entry ``index`` of the call's scalar record, as a float32 scalar."""
    return ops.gather(scalars, _i64(index), _i64(0))


def block_size(scalars: Node) -> Node:
    """The argmax block (scalar i64), rebuilt exactly from its two float32 parts.

    Why each part is converted on its own before the integer arithmetic: the CPU plugin runs a
    converted vector's multiply-and-sum, and an i64 division by a converted value, in float32,
    which rounds blocks above ``2**24`` (the record's test holds this form to a prime above it).
    """
    high, low = (ops.convert(_scalar(scalars, i), "i64")
                 for i in (record.BLOCK_HIGH, record.BLOCK_LOW))
    return ops.add(ops.multiply(high, _i64(record.BLOCK_RADIX)), low)


def typical_threshold(entropy: Node, scalars: Node) -> Node:
    """``min(eps, alpha * exp(-H))`` for entropies ``H``: the typical threshold, written once
    for every graph family (:meth:`TypicalParams.threshold`'s rule, on the record's
    parameters)."""
    eps, alpha = (_scalar(scalars, record.TYPICAL + i) for i in range(2))
    return ops.minimum(eps, ops.multiply(alpha, ops.exp(ops.negative(entropy))))


def entropy_from_logits(e: Node, zm: Node, s: Node) -> Node:
    """``H [R]`` of the rows ``p = e / s`` with ``e = exp(zm)``, as ``log s - sum(e zm) / s``.

    Why this form: the CPU plugin's ``Log`` is a slow reference kernel, so only ``[R]`` logs
    are taken. A ``-inf`` logit has ``e = 0``; clamping ``zm`` to the lowest float makes its
    term 0, not NaN.
    """
    e_zm = ops.multiply(e, ops.maximum(zm, _f32(FLOAT32_LOWEST)))
    return ops.subtract(ops.log(s), ops.divide(ops.reduce_sum(e_zm, _i64([1]), False), s))


def entropy_of_probs(p: Node) -> Node:
    """``H [R] = -sum p log p`` of probability rows, with ``0 log 0 = 0``."""
    plogp = ops.select(ops.greater(p, _f32(0.0)), ops.multiply(p, ops.log(p)), _f32(0.0))
    return ops.negative(ops.reduce_sum(plogp, _i64([1]), False))


def safe_temperature(temp: Node) -> Node:
    """``T`` clamped into the normal float32 range as the reference does (+inf -> the largest
    float); 1 where ``T <= 0`` (greedy rows, whose sampled answer is discarded)."""
    normal_t = ops.minimum(ops.maximum(temp, _f32(FLOAT32_TINY)), _f32(FLOAT32_MAX))
    return ops.select(ops.greater(temp, _f32(0.0)), normal_t, _f32(1.0))


def first_argmax(x: Node, block: Node) -> tuple[Node, Node]:
    """``(argmax [R] i64, max [R, 1])`` of ``x [R, V]``; ties -> lowest index.

    ``block`` (scalar i64) must divide V. The first block holding the row maximum is found on
    the small ``[R, V/block]`` block maxima, then the first maximal index inside that block.
    """
    rows, vocab = _dim(x, 0), _dim(x, 1)
    blocks = ops.divide(vocab, block)
    shape3 = ops.concat([ops.unsqueeze(n, _i64(0)) for n in (rows, blocks, block)], 0)
    block_max = ops.reduce_max(ops.reshape(x, shape3, False), _i64([2]), False)  # [R, nb]
    row_max = ops.reduce_max(block_max, _i64([1]), True)  # [R, 1]
    hit = ops.equal(block_max, row_max)
    first_block = ops.reduce_min(ops.select(hit, _iota(blocks), blocks), _i64([1]), False)
    # NaN rows (validate=False) find no block; stay in range rather than read out of bounds.
    first_block = ops.minimum(first_block, ops.subtract(blocks, _i64(1)))
    flat_blocks = ops.reshape(x, ops.concat([_i64([-1]), ops.unsqueeze(block, _i64(0))], 0), False)
    block_rows = ops.add(ops.multiply(_iota(rows), blocks), first_block)
    chunk = ops.gather(flat_blocks, block_rows, _i64(0))  # [R, block]
    within = ops.reduce_min(
        ops.select(ops.equal(chunk, row_max), _iota(block), block), _i64([1]), False
    )
    index = ops.add(ops.multiply(first_block, block), within)
    return ops.minimum(index, ops.subtract(vocab, _i64(1))), row_max


def leading_accepted(ok: Node, n: Node) -> Node:
    """Length of the all-True prefix of ``ok [B, K]`` (K >= 1), capped at ``n``: int64 [B]."""
    k = _dim(ok, 1)
    first_fail = ops.select(ok, _col(n), ops.unsqueeze(_iota(k), _i64(0)))
    return ops.minimum(ops.reduce_min(first_fail, _i64([1]), False), n)


def inverse_cdf_draw(weights: Node, v: Node) -> Node:
    """Per row, the smallest ``t`` with ``cumsum(w)[t] >= v * cumsum(w)[-1]``: int64 [B].

    The CPU plugin runs float64 as float32, and one float32 scan over ``V = 128k`` drifts far
    enough to move a share of draws to a neighbour of the float64 reference pick
    (docs/backends.md, "Graphs"). So the prefix sum is two-level: an exclusive scan over
    ``DRAW_BLOCK``-sized block sums plus a scan inside each block, ~500 + 256 additions deep
    instead of 128k. Counting ``cumsum <
    threshold`` equals the index because the prefix sums of non-negative weights never decrease.
    """
    vocab = _dim(weights, 1)
    block = _i64(DRAW_BLOCK)
    n_blocks = ops.divide(ops.add(vocab, _i64(DRAW_BLOCK - 1)), block)  # ceil, int64
    pad = ops.subtract(ops.multiply(n_blocks, block), vocab)
    padded = ops.pad(weights, _i64([0, 0]), ops.concat([_i64([0]), ops.unsqueeze(pad, _i64(0))], 0),
                     "constant", _f32(0.0))  # zeros leave every prefix sum unchanged
    blocks = ops.reshape(padded, _i64([0, -1, DRAW_BLOCK]), True)  # [B, nb, block]
    before = ops.cumsum(ops.reduce_sum(blocks, _i64([2]), False), _i64(1), exclusive=True)
    c = ops.add(ops.cumsum(blocks, _i64(2)), ops.unsqueeze(before, _i64(2)))
    c = ops.reshape(c, _i64([0, -1]), True)  # [B, nb * block]
    total = ops.gather(c, ops.subtract(_dim(c, 1), _i64(1)), _i64(1))  # [B]
    threshold = _col(ops.multiply(v, total))
    below = ops.reduce_sum(ops.convert(ops.less(c, threshold), "i64"), _i64([1]), False)
    return ops.minimum(below, ops.subtract(vocab, _i64(1)))  # only NaN rows need the cap


def _emit(x: Node, final: Node, accepted: Node) -> Node:
    """``[B, K+1]``: the accepted drafts, the final token at position ``a``, then -1."""
    b = _dim(x, 0)
    pos = ops.unsqueeze(_iota(ops.add(_dim(x, 1), _i64(1))), _i64(0))  # [1, K+1]
    zero_col = ops.broadcast(_i64(0), ops.concat([ops.unsqueeze(b, _i64(0)), _i64([1])], 0))
    padded = ops.concat([x, zero_col], 1)
    a = _col(accepted)
    out = ops.select(ops.less(pos, a), padded, _col(final))
    return ops.select(ops.greater(pos, a), _i64(-1), out)


def build(variant: Variant) -> ov.Model:
    """The ``ov.Model`` of ``variant``: outputs ``token_ids [B, K+1]``, ``num_accepted [B]``."""
    params: dict[str, Node] = {}
    for name in input_names(variant):
        shape, dtype = _INPUT_TYPES[name]
        params[name] = ops.parameter(ov.PartialShape(shape), dtype, name=name)
    # Every index computed from caller data is clamped into range, so unvalidated garbage
    # (validate=False) gathers in bounds: an out-of-range index makes the CPU plugin raise
    # mid-inference and leaves the infer request unusable for later calls.
    inp = dict(params)
    inp["block"] = block_size(params["scalars"])
    inp["target_rows"] = _clamp_index(params["target_rows"], _dim(params["target"], 0))
    if "draft_rows" in params:
        inp["draft_rows"] = _clamp_index(params["draft_rows"], _dim(params["draft_probs"], 0))
    target, rows, drafts = inp["target"], inp["target_rows"], inp["draft_token_ids"]
    vocab, k = _dim(target, 1), _dim(drafts, 1)
    n = _clamp_index(inp["num_draft_tokens"], ops.add(k, _i64(1)))  # 0 <= n <= K
    x = _clamp_index(drafts, vocab)
    in_vocab = ops.logical_and(ops.greater_equal(drafts, _i64(0)), ops.less(drafts, vocab))
    # An id outside the vocabulary has probability 0: never accepted.
    valid = ops.logical_and(ops.less(ops.unsqueeze(_iota(k), _i64(0)), _col(n)), in_vocab)
    draft_cols = _iota(k)

    greedy_a = greedy_final = row_max = None
    if variant.kind is None or variant.with_greedy_rows:
        g_rows, row_max = first_argmax(target, inp["block"])
        g = ops.gather(g_rows, rows, _i64(0))  # [B, K+1]
        match = ops.logical_and(ops.equal(drafts, ops.gather(g, draft_cols, _i64(1))), valid)
        greedy_a = leading_accepted(match, n)
        greedy_final = _squeeze_col(_take(g, greedy_a))
    if variant.kind is None:
        accepted, final = greedy_a, greedy_final
    else:
        accepted, final = _sampled(variant, inp, x, n, valid, row_max)
        if greedy_a is not None:
            greedy_row = ops.equal(inp["temperature"], _f32(0.0))
            accepted = ops.select(greedy_row, greedy_a, accepted)
            final = ops.select(greedy_row, greedy_final, final)
    tokens = _emit(x, final, accepted)
    results = [ops.result(tokens, name="token_ids"), ops.result(accepted, name="num_accepted")]
    return ov.Model(results, list(params.values()), f"verify_{variant.kind or 'argmax'}")


def _clamp_index(index: Node, size: Node) -> Node:
    """``index`` clamped into ``[0, size - 1]`` (i64)."""
    return ops.minimum(ops.maximum(index, _i64(0)), ops.subtract(size, _i64(1)))


def _row_temperatures(temp: Node, rows: Node, target: Node) -> Node:
    """``[R]``: each target row's request temperature, as :func:`safe_temperature` clamps it."""
    safe_t = safe_temperature(temp)
    return ops.scatter_nd_update(
        ops.broadcast(_f32(1.0), ops.unsqueeze(_dim(target, 0), _i64(0))),
        ops.reshape(rows, _i64([-1, 1]), False),
        ops.reshape(ops.broadcast(_col(safe_t), ops.shape_of(rows, "i64")), _i64([-1]), False),
    )


def _sampled(
    variant: Variant,
    inp: dict[str, Node],
    x: Node,
    n: Node,
    valid: Node,
    row_max: Node | None,
) -> tuple[Node, Node]:
    """Accepted counts and final tokens of the sampled rule, built by its entry of
    :data:`SAMPLED` (a kind without one is refused by name, never built as another rule)."""
    rule = SAMPLED.get(variant.kind)
    if rule is None:
        raise methods.unknown_rule(variant.kind, "openvino", methods.CHAIN)
    target, rows = inp["target"], inp["target_rows"]
    vocab, k = _dim(target, 1), _dim(x, 1)
    rows_k = ops.gather(rows, _iota(k), _i64(1))  # [B, K]
    flat_target_index = ops.add(ops.multiply(rows_k, vocab), x)
    probs = Probs(rows_k=rows_k)
    if variant.is_logits:
        # p = e / s with e = exp((logits - max) / T), as the numpy reference computes it:
        # subtracting first keeps the quotient in [-inf, 0] (logits / T alone can overflow).
        t_col = _col(_row_temperatures(inp["temperature"], rows, target))  # [R, 1]
        if row_max is None:
            row_max = ops.reduce_max(target, _i64([1]), True)
        probs.zm = ops.divide(ops.subtract(target, row_max), t_col)  # z - max z
        probs.e = ops.exp(probs.zm)
        probs.s = ops.reduce_sum(probs.e, _i64([1]), False)  # [R]
        probs.px = ops.divide(
            ops.gather(ops.reshape(probs.e, _i64([-1]), False), flat_target_index, _i64(0)),
            ops.gather(probs.s, rows_k, _i64(0)),
        )
    else:
        probs.px = ops.gather(ops.reshape(target, _i64([-1]), False), flat_target_index,
                              _i64(0))
    accept, finish = rule(variant, inp, x, probs)
    accepted = leading_accepted(ops.logical_and(accept, valid), n)
    # One target row per request: where it rejected, or its bonus row.
    p_a = probs.rows(target, _squeeze_col(_take(rows, accepted)))  # [B, V]
    v = ops.gather(inp["uniforms"], k, _i64(1))  # column K: the draw uniform, [B]
    return accepted, finish(accepted, ops.less(accepted, n), p_a, v)


@dataclass
class Probs:
    """The target's probabilities as a sampled rule reads them: ``px [B, K]`` (of each draft),
    and from logits ``e = exp(zm)`` with ``zm = (z - max z) / T`` and row sums ``s [R]``."""

    rows_k: Node
    px: Node | None = None
    e: Node | None = None
    zm: Node | None = None
    s: Node | None = None

    def rows(self, target: Node, r: Node) -> Node:
        """The probability rows ``r`` of the target."""
        if self.e is None:
            return ops.gather(target, r, _i64(0))
        return ops.divide(ops.gather(self.e, r, _i64(0)), _col(ops.gather(self.s, r, _i64(0))))


Finish = Callable[[Node, Node, Node, Node], Node]
"""``finish(accepted, rejected, p_a, v)``: the final token of each request."""


def _rejection(variant: Variant, inp: dict[str, Node], x: Node, probs: Probs
               ) -> tuple[Node, Finish]:
    """Rejection sampling: accept ``x`` iff ``u q(x) <= p(x)``; the final token a draw from
    the residual (:func:`_rejection_draw`)."""
    vocab, k = _dim(inp["target"], 1), _dim(x, 1)
    if variant.has_draft_probs:
        flat_q_index = ops.add(ops.multiply(inp["draft_rows"], vocab), x)
        qx = ops.gather(ops.reshape(inp["draft_probs"], _i64([-1]), False), flat_q_index,
                        _i64(0))
    else:
        qx = _f32(1.0)
    u_k = ops.gather(inp["uniforms"], _iota(k), _i64(1))
    accept = ops.logical_and(ops.greater(probs.px, _f32(0.0)),
                             ops.less_equal(ops.multiply(u_k, qx), probs.px))

    def finish(accepted: Node, rejected: Node, p_a: Node, v: Node) -> Node:
        return _rejection_draw(variant, inp, accepted, rejected, p_a, v)

    return accept, finish


def _typical(variant: Variant, inp: dict[str, Node], x: Node, probs: Probs
             ) -> tuple[Node, Finish]:
    """Typical acceptance: accept ``x`` iff ``p(x) > min(eps, alpha exp(-H))``; after a
    rejection the row's argmax, else a draw from the bonus row."""
    if variant.is_logits:
        entropy = entropy_from_logits(probs.e, probs.zm, probs.s)
    else:
        entropy = entropy_of_probs(inp["target"])
    threshold = typical_threshold(ops.gather(entropy, probs.rows_k, _i64(0)), inp["scalars"])

    def finish(accepted: Node, rejected: Node, p_a: Node, v: Node) -> Node:
        recovered, _ = first_argmax(p_a, inp["block"])
        return ops.select(rejected, recovered, inverse_cdf_draw(p_a, v))

    return ops.greater(probs.px, threshold), finish


SAMPLED: dict[str, Callable[[Variant, dict[str, Node], Node, Probs], tuple[Node, Finish]]] = {
    "rejection": _rejection,
    "typical": _typical,
}
"""The token-wise graphs' sampled rules: each builds its acceptance test and final token
(``backend.CHAIN_RULES`` routes these names here)."""


def _rejection_draw(variant: Variant, inp: dict[str, Node], accepted: Node, rejected: Node,
                    p_a: Node, v: Node) -> Node:
    """Rejection's final token: a draw from ``max(p_a - q_a, 0)`` where a draft was rejected
    and that residual is not empty, else from ``p_a`` (the bonus row, or an empty residual)."""
    drafts = inp["draft_token_ids"]
    k, vocab = _dim(drafts, 1), _dim(p_a, 1)
    a_draft = ops.minimum(accepted, ops.subtract(k, _i64(1)))
    if variant.has_draft_probs:
        q_row = _squeeze_col(_take(inp["draft_rows"], a_draft))
        q_a = ops.gather(inp["draft_probs"], q_row, _i64(0))
    else:
        x_a = _take(drafts, a_draft)  # [B, 1]; out of vocabulary: q_a = 0
        q_a = ops.convert(ops.equal(ops.unsqueeze(_iota(vocab), _i64(0)), x_a), "f32")
    residual = ops.maximum(ops.subtract(p_a, q_a), _f32(0.0))
    non_empty = ops.reduce_logical_or(ops.greater(residual, _f32(0.0)), _i64([1]), True)
    use_residual = ops.logical_and(_col(rejected), non_empty)
    return inverse_cdf_draw(ops.select(use_residual, residual, p_a), v)

