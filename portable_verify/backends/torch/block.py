"""Block verification for the torch backend (docs/semantics.md, Block verification).

Why its own module: the block rule's backward scan, its ``Z_j`` masses and its final draw share
nothing with token-wise rejection but the array layer and the draw.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from portable_verify.backends.torch import ops as torch_ops
from portable_verify.backends.torch.checks import ReadChecks
from portable_verify.backends.torch.draw import _draw
from portable_verify.backends.torch.ops import (
    Array,
    ArrayOps,
    _logits_sums,
    _row_map,
    _temperatures,
    per_row,
)
from portable_verify.core.types import VerifyInputs


def _rowsum64(ops: ArrayOps, w: Array) -> Array:
    """Per-row sum of float32 values as float64, for the block rule's ``Z_j``.

    The reference sums in float64; here torch's float32 cascade sum (several times faster than
    a float64 one on CPU; relative error ~1e-7 at V = 128k) is widened afterwards, as
    docs/semantics.md allows: the two only disagree where ``u_j`` lies within that rounding of
    ``h_j``."""
    return ops.f64(ops.rowsum(w))


def _block(ops: ArrayOps, inputs: VerifyInputs, x: Array, valid: Array, n: Array, rows: Array,
           checks: ReadChecks | None, greedy_row: Array | None) -> tuple[Array, Array]:
    """Accepted counts and final tokens of block verification (docs/semantics.md).

    Costs: ``p(x)``, ``q(x)`` at every draft (from logits with the log-sum-exp pass over the
    ``B*K`` draft rows, as rejection), then a backward scan over positions, vectorised over the
    batch: ``Z_j`` (one pass over rows ``j+1`` of ``p`` and ``q``) only for requests the scan
    reaches with ``u_j <= P_j``; on the host only those rows are read, on devices every row is
    computed and masked (no data-dependent indexing, so no synchronisation). Then one row per
    request for the draw, as rejection. ``validate=True`` is checked at the front door for this
    method (the rows read depend on the scan), so ``checks`` is not used here.
    """
    del checks, greedy_row  # greedy rows are replaced by the caller
    xp = ops.xp
    b, k = x.shape
    target, draft_probs, v_size = inputs.target, inputs.draft_probs, inputs.vocab_size
    logits = inputs.target_is_logits
    u = ops.array(inputs.uniforms)
    read = rows[:, :k]
    t = _temperatures(ops, ops.array(inputs.temperature)) if logits else None
    m = s = None
    if logits:
        m, s = per_row(ops, _logits_sums(ops, target, False), read.reshape(-1), ops.repeat(t, k),
                       width=v_size, scratch=1)
        m, s = m.reshape(b, k), s.reshape(b, k)
        e_x = ops.values(target, read, x) - m
        e_x /= t[:, None]
        px = ops.exp_(e_x) / s
    else:
        px = ops.values(target, read, x)
    q_map = _row_map(ops, inputs.draft_rows, draft_probs.shape[0]) if draft_probs is not None \
        else None
    qx = ops.values(draft_probs, q_map, x) if q_map is not None else xp.ones_like(px)
    px = xp.where(valid, px, 0.0)
    # P_j: a loop over positions (vectorised over the batch), float32 as the reference.
    one = xp.ones_like(px[:, 0]) if k > 0 else None
    chain = []
    prev = one
    for j in range(k):
        ratio = ops.clip(prev * px[:, j] / qx[:, j], high=1.0)
        prev = xp.where((prev == 0) | (px[:, j] == 0), 0.0, xp.where(qx[:, j] == 0, 1.0, ratio))
        chain.append(prev)
    mass = _block_mass(ops, inputs)
    a = xp.zeros_like(n)
    searching = n > 0
    for j in reversed(range(k)):
        cand = searching & (j < n) & (u[:, j] <= chain[j])
        last = cand & (n == j + 1)
        a = xp.where(last, n, a)
        mid = cand & (n > j + 1)
        searching = searching & ~last
        if j + 1 >= k:
            continue
        row_args = (rows[:, j + 1], q_map[:, j + 1] if q_map is not None else rows[:, j + 1],
                    x[:, j + 1], chain[j], m[:, j + 1] if logits else chain[j],
                    s[:, j + 1] if logits else chain[j], t if logits else chain[j])
        if ops.host:  # only the rows the scan needs
            idx = np.flatnonzero(mid)
            z = np.zeros(b, dtype=np.float64)
            if idx.size:
                z[idx] = per_row(ops, mass, *(arg[idx] for arg in row_args), width=v_size,
                                 scratch=2 if draft_probs is not None else 1)[0]
        else:
            z = per_row(ops, mass, *row_args, width=v_size,
                        scratch=2 if draft_probs is not None else 1)[0]
        p_j = ops.f64(chain[j])
        h = xp.where(z > 0, z / (z + (1.0 - p_j)), 0.0)
        hit = mid & (ops.f64(u[:, j]) <= h)
        a = xp.where(hit, j + 1, a)
        searching = searching & ~hit

    row_a = ops.pick(rows, a)
    a_draft = ops.clip(a, high=max(k - 1, 0))
    x_a = ops.pick(x, a_draft) if k > 0 else a_draft
    q_rows = ops.pick(q_map, a_draft) if q_map is not None and k > 0 else row_a
    if k > 0:
        scale = xp.where(a > 0, ops.pick(xp.stack(chain, 1), ops.clip(a - 1, low=0)), 1.0)
    else:
        scale = ops.clip(u[:, 0], 1.0, 1.0)  # all ones
    t_a = t if t is not None else u[:, k]  # (unused for probabilities)
    (token,) = per_row(ops, _block_final(ops, inputs, k), row_a, x_a, q_rows, a < n, scale,
                       u[:, k], t_a, width=v_size, scratch=2,
                       tile=torch_ops.CPU_FINAL_TILE_ELEMENTS)
    return a, token


def _block_mass(ops: ArrayOps, inputs: VerifyInputs) -> Callable[..., tuple[Array]]:
    """Per request, ``Z_j = sum max(P_j * p_{j+1} - q_{j+1}, 0)`` from its row ``j+1``."""
    target, draft_probs = inputs.target, inputs.draft_probs
    logits = inputs.target_is_logits

    def mass(p_rows: Array, q_rows: Array, x_next: Array, scale: Array, m: Array, s: Array,
             t: Array, bufs: list[torch.Tensor]) -> tuple[Array]:
        w = ops.load(target, p_rows, bufs[0])
        if logits:
            w -= m[:, None]
            w /= t[:, None]
            ops.exp_(w)
            w /= s[:, None]
        w *= scale[:, None]
        if draft_probs is not None:
            w -= ops.load(draft_probs, q_rows, bufs[1])
        else:
            w[ops.arange(w.shape[0]), x_next] -= 1.0
        return (_rowsum64(ops, ops.relu_(w)),)

    return mass


def _block_final(ops: ArrayOps, inputs: VerifyInputs, k: int) -> Callable[..., tuple[Array]]:
    """The draw of block verification: from ``max(P_{a-1} p_a - q_a, 0)`` at row ``a < n``
    (``p_a`` when that is empty), from ``p_n`` when ``a = n``."""
    target, draft_probs = inputs.target, inputs.draft_probs
    logits = inputs.target_is_logits

    def final(row_a: Array, x_a: Array, q_rows: Array, rejected: Array, scale: Array,
              v: Array, t: Array, bufs: list[torch.Tensor]) -> tuple[Array]:
        p = ops.load(target, row_a, bufs[0])
        if logits:
            p -= ops.rowmax(p)[:, None]
            p /= t[:, None]
            ops.exp_(p)
            p /= ops.rowsum(p)[:, None]
        plain = _draw(ops, p, v)[0]
        if k == 0:
            return (plain,)
        p *= scale[:, None]  # p is not needed unscaled any more: no row-sized temporary
        if draft_probs is not None:
            w = ops.load(draft_probs, q_rows, bufs[1])
            ops.xp.subtract(p, w, out=w)
        else:
            w = p
            w[ops.arange(w.shape[0]), x_a] -= 1.0
        residual, total = _draw(ops, ops.relu_(w), v)
        return (ops.xp.where(rejected & (total > 0), residual, plain),)

    return final
