"""The torch backend's draws: the two-level inverse-CDF search and the residual draws built on
it (for :class:`~portable_verify.backends.torch.ops.ArrayOps` arrays)."""

from __future__ import annotations

import torch

from portable_verify.backends.torch.ops import Array, ArrayOps

DRAW_BLOCK = 256
"""Block length of the two-level inverse-CDF draw (used when ``V > 4 * DRAW_BLOCK``)."""


def _count_below(c: Array, threshold: Array) -> Array:
    """Per row, the smallest ``t`` with ``c[t] >= threshold`` for a non-decreasing ``c`` (a
    batched ``searchsorted``; numpy's is one-dimensional)."""
    return (c < threshold[:, None]).sum(1)


def _draw(ops: ArrayOps, weights: Array, v: Array) -> tuple[Array, Array]:
    """``(t, total)``: per row the smallest ``t`` with ``cumsum(w)[t] >= v * sum(w)``.

    Why two levels: a cumulative sum is a sequential scan (the dearest step of a rejection at
    V = 128k on one CPU core), but the draw only needs the crossing point.
    Block sums (a vectorised float32 reduction) locate the crossing block; one
    ``DRAW_BLOCK``-long scan inside it finds the token. Prefixes are accumulated and compared in
    float64 as docs/semantics.md prescribes, so the pick differs from the reference's sequential
    scan only where a threshold lies within rounding of a prefix sum (the conformance check
    ``exact.large_vocab_draws`` counts such rows). The pick always has ``w[t] > 0`` when the
    total is positive. Small vocabularies take the full scan.
    """
    b, v_size = weights.shape
    v64 = ops.f64(v)
    if v_size <= 4 * DRAW_BLOCK or b == 0:
        c = ops.cumsum64(weights)
        total = c[:, -1]
        # The clamp: NaN rows (validate=False) still give an id in range.
        return ops.clip(_count_below(c, v64 * total), high=v_size - 1), total
    n_full = v_size // DRAW_BLOCK
    # Block sums in float32: a 256-term vectorised sum errs by far less than the drift of a
    # 128k-long float32 scan, and float64 reductions are far slower on CPU.
    blocks = weights[:, : n_full * DRAW_BLOCK].reshape(b, n_full, DRAW_BLOCK)
    sums = ops.rowsum(blocks)
    if n_full * DRAW_BLOCK < v_size:
        sums = ops.concat([sums, ops.rowsum(weights[:, n_full * DRAW_BLOCK:])[:, None]], 1)
    cb = ops.cumsum64(sums)
    total = cb[:, -1]
    threshold = v64 * total
    blk = ops.clip(_count_below(cb, threshold), high=cb.shape[1] - 1)
    prefix = ops.xp.where(blk > 0, ops.pick(cb, ops.clip(blk - 1, low=0)), 0.0)
    inner = ops.arange(DRAW_BLOCK)
    idx = blk[:, None] * DRAW_BLOCK + inner[None, :]
    block = ops.take(weights, ops.clip(idx, high=v_size - 1)) * (idx < v_size)
    t_in = _count_below(prefix[:, None] + ops.cumsum64(block), threshold)
    # Rounding can leave the block's last partial sum a hair under the threshold the block sums
    # crossed; then the block's last positive weight is the crossing token.
    last_pos = ops.rowmax(inner[None, :] * (block > 0))
    t = blk * DRAW_BLOCK + ops.xp.where(t_in < DRAW_BLOCK, t_in, last_pos)
    return ops.clip(t, high=v_size - 1), total


def draw(weights: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_draw` for torch tensors (``weights`` float32 ``[B, V]`` >= 0, ``v`` in (0, 1])."""
    ops = ArrayOps(weights.device)
    t, total = _draw(ops, ops.array(weights), ops.array(v))
    return ops.tensor(t), ops.tensor(total)


def inverse_cdf_draw(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per row, the smallest ``t`` with ``cumsum(w)[t] >= v * cumsum(w)[-1]``, by a full float64
    cumulative sum (what :func:`draw` does in two levels)."""
    c = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    t = torch.searchsorted(c, (v.double() * c[:, -1]).unsqueeze(1)).squeeze(1)
    return t.clamp_(max=weights.shape[-1] - 1)


def _draw_from_residual(ops: ArrayOps, p: Array, q: Array, rejected: Array,
                        v: Array) -> Array:
    """Draw from ``max(0, p - q)`` on rejected rows (``p`` when that is empty) and ``p`` otherwise.

    Both draws are made and the right one picked per row: a second two-level draw costs one
    vectorised block-sum pass, less than testing the residual for emptiness and selecting rows.
    ``q`` is consumed (overwritten) to avoid another row-sized temporary.
    """
    ops.xp.subtract(p, q, out=q)
    from_residual, total = _draw(ops, ops.relu_(q), v)
    return ops.xp.where(rejected & (total > 0), from_residual, _draw(ops, p, v)[0])


def _draw_without_draft(ops: ArrayOps, p: Array, x_a: Array, rejected: Array,
                        v: Array) -> Array:
    """The same draw for a one-hot draft: the residual is ``p`` with ``x`` zeroed.

    ``p`` is consumed. When that residual is empty, ``p`` has no mass outside ``x``, so the
    draw from ``p`` the semantics prescribe is ``x`` itself (for any ``v`` in (0, 1]).
    """
    at = ops.arange(p.shape[0])
    p[at, x_a] = ops.xp.where(rejected, 0.0, p[at, x_a])
    t, total = _draw(ops, p, v)
    return ops.xp.where(rejected & ~(total > 0), x_a, t)
