"""Block verification (docs/semantics.md, *Block verification*) as one compiled CPU kernel.

Each request is the numpy family's ``block_one``'s twin: the chain ``P_j`` from ``p_j(x_j)`` and
``q_j(x_j)`` (from logits every row's maximum and normaliser, on a pass that stores nothing),
a backward scan that computes ``Z_j`` only where ``u_j <= P_j`` (from logits the row's
exponentials recomputed: in this kernel that costs no more than keeping ``K`` rows of them),
and one draw. The residual ``Z_j`` is computed on is the row the draw reads when the scan
stops there, so it is drawn from where it lies.

:func:`_block_one` is one request, called by the chain family's entry kernel
(``entries.decide``) for sampled requests when the record's ``rule`` is ``rules.BLOCK``; the
backend runs it over request ranges on its worker threads (bit-identical at any thread count).
Counts, greedy rows, uniforms, the caller's bonus and the ``O(K)`` checks are the rejection kernel's
own helpers. Under ``options.check`` every target row ``j <= n`` and draft row ``j < n`` of
every request is checked, as ``validate="full"`` does: the rows the scan reads depend on the
uniforms (docs/semantics.md, *Validation*).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from portable_verify.backends.numba.chain import (
    DRAW_COUNTER,
    ERROR_NONE,
    _bad_logit_max,
    _bad_request,
    _count,
    _draft_row,
    _emit,
    _flag,
    _greedy_request,
    _key_of,
    _not_a_distribution,
    _target_row,
    _u,
    draw,
    normal_temperature,
)
from portable_verify.backends.numba.rows import (
    INNER,
    JIT,
    _add_reassoc,
    _exp32,
    _exp_row,
    exp_sum,
    row_max,
)

_PART = 512  # residual sums: float32 partial sums per part (16 lanes), float64 across parts
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@numba.njit(**JIT, **INNER)
def _residual_part(p, s, scale, q, x, out):
    """``out = max(scale * (p / s) - q, 0)`` over one part (``q`` one-hot at ``x`` when empty),
    float32 ops in the reference's order (no contraction; ``p / 1`` is ``p``, so probabilities
    skip the division); returns the part's float32 sum."""
    total = _ZERO
    divide = s != _ONE
    if q.shape[0] == 0:
        for j in range(p.shape[0]):
            d = scale * (p[j] / s if divide else p[j]) - (_ONE if j == x else _ZERO)
            d = d if d > _ZERO else _ZERO
            out[j] = d
            total = _add_reassoc(total, d)
    else:
        for j in range(p.shape[0]):
            d = scale * (p[j] / s if divide else p[j]) - q[j]
            d = d if d > _ZERO else _ZERO
            out[j] = d
            total = _add_reassoc(total, d)
    return total


@numba.njit(**JIT, **INNER, fastmath={"contract"})
def _exp_sum_part(row, m, t):
    """float32 sum of ``exp((row - m) / t)`` over one part, nothing stored: ``P_j`` needs only
    each row's normaliser, and a pass that writes the row costs more (docs/benchmarks.md,
    "numba family")."""
    total = _ZERO
    for j in range(row.shape[0]):
        total = _add_reassoc(total, _exp32((row[j] - m) / t))
    return total


@numba.njit(**JIT, **INNER, fastmath={"contract"})
def _normaliser(row, t, x):
    """``(max, sum, e_x)`` of a logits row in one read of it: part by part, the running max
    (a part's own max first, while it is in L1) and the float64 sum of ``exp((row - max) / t)``,
    rescaled when the max grows; ``e_x`` the exponential at ``x``. Equal to the reference's
    normaliser within float rounding (docs/semantics.md); a separate max pass would re-read the
    row from memory (docs/benchmarks.md, "numba family")."""
    size = row.shape[0]
    top = np.float32(-np.inf)
    total = 0.0
    for b0 in range(0, size, _PART):
        part = row[b0:min(size, b0 + _PART)]
        m = max(top, row_max(part)[0])
        if m > top:  # the first part, or a larger max: earlier terms shrink by exp(delta / t)
            total *= math.exp((np.float64(top) - np.float64(m)) / np.float64(t))
            top = m
        if top > -np.inf:  # rows of -inf so far contribute nothing (and -inf - -inf is NaN)
            total += np.float64(_exp_sum_part(part, top, t))
    return top, total, _exp32((row[x] - top) / t)


@numba.njit(inline="always", **JIT)
def _residual(target, drafts, arrays, is_logits, i, j, scale, tf, work):
    """``max(scale * p_j - q_j, 0)`` of request ``i`` into ``work``'s ``out``; its float64 total
    (``Z``). From logits row ``j``'s exponentials are recomputed into ``work``'s ``scratch``
    (left there)."""
    rows, _, q, qrows, _, _, _, _, _ = arrays
    maxes, sums, _, scratch, out = work
    k = drafts.shape[1]
    p = target[_target_row(rows, i, j, k, target.shape[0])]
    s = _ONE
    if is_logits:
        _exp_row(p, maxes[j], tf, scratch)
        p, s = scratch, np.float32(sums[j])
    qrow = out[:0] if q.shape[0] == 0 else q[_draft_row(qrows, i, j, k, q.shape[0])]
    x = drafts[i, j]
    size = p.shape[0]
    total = 0.0
    for b0 in range(0, size, _PART):  # views, not offsets: an offset loop does not vectorise
        b1 = min(size, b0 + _PART)
        part_q = qrow if qrow.shape[0] == 0 else qrow[b0:b1]
        total += np.float64(_residual_part(p[b0:b1], s, scale, part_q, x - b0, out[b0:b1]))
    return total


@numba.njit(**JIT, **INNER)
def _chain(target, drafts, arrays, is_logits, i, n, tf, work):
    """``chain[j] = P_j`` for ``j < n`` (float32, as the reference); from logits also each
    row's maximum and the float64 sum of its exponentials (``maxes[j]``, ``sums[j]``), all
    three in ``work``."""
    rows, _, q, qrows, _, _, _, _, _ = arrays
    maxes, sums, chain, _, _ = work
    k = drafts.shape[1]
    v_size = target.shape[1]
    prev = _ONE
    for j in range(n):
        row = target[_target_row(rows, i, j, k, target.shape[0])]
        x = drafts[i, j]
        in_vocab = x >= 0 and x < v_size
        xc = min(max(x, 0), v_size - 1)
        if is_logits:
            maxes[j], sums[j], e_x = _normaliser(row, tf, xc)
            px = _ZERO
            if sums[j] > 0:
                px = e_x / np.float32(sums[j])
            else:  # a row of only -inf or NaN (validate=False): p(x) = 0, no zero division later
                sums[j] = np.nan
        else:
            px = row[xc]
        qx = _ONE if q.shape[0] == 0 else q[_draft_row(qrows, i, j, k, q.shape[0]), xc]
        px = px if in_vocab else _ZERO
        qx = qx if in_vocab else _ZERO
        if prev == _ZERO or px == _ZERO:
            prev = _ZERO
        elif qx == _ZERO:
            prev = _ONE
        else:
            prev = min(prev * px / qx, _ONE)
        chain[j] = prev


@numba.njit(**JIT, **INNER)
def _scan(target, drafts, arrays, is_logits, i, n, key, tf, work):
    """The backward scan: ``a``. Where it stops at ``j < n-1`` the residual of row ``a = j+1``
    (``Z_j``'s terms) is left in ``work``'s ``out``."""
    explicit_u = arrays[5]
    chain = work[2]
    for j in range(n - 1, -1, -1):
        u = np.float32(_u(explicit_u, key, i, j, 2 * j))
        if u > chain[j]:
            continue  # h_j <= P_j: no row read
        if j == n - 1:  # h_{n-1} = P_{n-1}
            return n
        z = _residual(target, drafts, arrays, is_logits, i, j + 1, chain[j], tf, work)
        p_j = np.float64(chain[j])
        h = z / (z + (1.0 - p_j)) if z > 0 else 0.0
        if np.float64(u) <= h:
            return j + 1
    return 0


@numba.njit(inline="always", **JIT)
def _bad_rows(target, arrays, o, i, n, k):
    """``validate="full"``'s row checks of request ``i``: target rows ``j <= n``, draft rows
    ``j < n``."""
    rows, _, q, qrows, _, _, _, _, _ = arrays
    bad = False
    for j in range(n + 1):
        row = target[_target_row(rows, i, j, k, target.shape[0])]
        if o.is_logits:
            m, has_nan = row_max(row)
            bad = bad or _bad_logit_max(m, has_nan)
        else:
            bad = bad or _not_a_distribution(row, o.atol)
        if j < n and q.shape[0] > 0:
            bad = bad or _not_a_distribution(q[_draft_row(qrows, i, j, k, q.shape[0])], o.q_atol)
    return bad


@numba.njit(inline="always", **JIT)
def _block_token(target, drafts, arrays, o, i, a, n, tf, v, work):
    """The draw after ``a`` accepted drafts: from ``p_n`` when ``a = n``, else from the residual
    ``max(P_{a-1} p_a - q_a, 0)`` (already in ``work``'s ``out`` for ``a > 0``), ``p_a`` when
    empty."""
    rows = arrays[0]
    _, _, _, scratch, out = work
    k = drafts.shape[1]
    if a == n:
        row = target[_target_row(rows, i, n, k, target.shape[0])]
        if o.is_logits:
            exp_sum(row, row_max(row)[0], tf, scratch)
            row = scratch
        return draw(row, v)[0]
    if a == 0:
        _residual(target, drafts, arrays, o.is_logits, i, 0, _ONE, tf, work)
    token, total = draw(out, v)
    if total > 0:
        return token
    # Empty: from p_a (from logits its exponentials, left in scratch by the residual's pass).
    p = scratch if o.is_logits else target[_target_row(rows, i, a, k, target.shape[0])]
    return draw(p, v)[0]


@numba.njit(**JIT, **INNER)
def _block_one(target, drafts, arrays, o, i, work, outs):
    """Request ``i`` from its count to its emission; returns its flag."""
    rows, counts, _, _, temps, explicit_u, _, _, bonus = arrays
    k = drafts.shape[1]
    v_size = target.shape[1]
    n, n_raw, reported, bad = _count(counts, drafts, i, o.check)
    outs[3][i] = reported
    t = o.temp_scalar if temps.shape[0] == 0 else np.float64(temps[i])
    error = _flag(ERROR_NONE, o.check and (
        bad or _bad_request(drafts, bonus, explicit_u, i, n, t, v_size, o.is_logits)
        or _bad_rows(target, arrays, o, i, n, k)))
    caller_bonus = bonus.shape[0] > 0
    if o.all_greedy or t == 0:
        accepted, final, _ = _greedy_request(target, rows, drafts, i, n, o.is_logits, False)
    else:
        tf = normal_temperature(t)
        key = _key_of(o, arrays, i)
        _chain(target, drafts, arrays, o.is_logits, i, n, tf, work)
        accepted = _scan(target, drafts, arrays, o.is_logits, i, n, key, tf, work)
        final = 0
        if not (caller_bonus and accepted == n_raw):  # else the caller's draw replaces ours
            v = _u(explicit_u, key, i, k, DRAW_COUNTER)
            final = _block_token(target, drafts, arrays, o, i, accepted, n, tf, v, work)
    _emit(outs, drafts, bonus, i, accepted, n_raw, final)
    return error
