"""The whole decision of one call as one compiled CPU kernel (numba).

Why: at the serving operating point (batch 1-8) a call's cost was ~100 Python-level array
calls of 0.5-4 us each, against ~2 us for a bare ``torch.argmax``; one compiled call costs
under a microsecond to enter. The loop over requests below is compiled code, not Python.
Semantics are docs/semantics.md, line by line as in ``numpy_ref.verify_one``; the row passes
use :mod:`portable_verify.backends.numba_math` (vectorised max and exp).

Arrays that an option leaves out are passed as empty arrays of the same dtype and rank, so the
kernel compiles once per target dtype (float32).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from portable_verify.backends.numba_math import (
    JIT,
    exp_sum,
    exp_sum_dot,
    residual,
    residual_stats,
    row_max,
    row_stats,
)
from portable_verify.core import rng

# The counter hash of core/rng.py, as uint64 constants (its one source of truth).
MASK32 = np.uint64(rng.MASK32)
SEED_SALT = np.uint64(rng.SEED_SALT)
COUNTER_SALT = np.uint64(rng.COUNTER_SALT)
MIX_C1 = np.uint64(rng.MIX_C1)
MIX_C2 = np.uint64(rng.MIX_C2)
UNIFORM_SHIFT = np.uint64(32 - rng.UNIFORM_BITS)
UNIFORM_SCALE = np.float32(rng.UNIFORM_SCALE)
DRAW_COUNTER = rng.DRAW_COUNTER  # the draw's counter; acceptance at position j uses 2j
DRAW_BLOCK = 256

EMPTY_ROWS = np.empty((0, 0), dtype=np.int64)
EMPTY_ARGMAX = np.empty(0, dtype=np.int64)

ERROR_NONE = 0
ERROR_VALUE = 1  # a value the decision reads is invalid: the caller words it (torch backend)


@numba.njit(inline="always", **JIT)
def _mix32(x):
    """core/rng.mix32 on uint64 holding a 32-bit value (products cannot overflow)."""
    x = x ^ (x >> np.uint64(16))
    x = (x * MIX_C1) & MASK32
    x = x ^ (x >> np.uint64(15))
    x = (x * MIX_C2) & MASK32
    return x ^ (x >> np.uint64(16))


@numba.njit(inline="always", **JIT)
def _request_key(seed, offset):
    """core/rng.request_keys for one request (int64 seed and offset)."""
    s = np.uint64(seed)
    o = np.uint64(offset)
    k = _mix32(((s >> np.uint64(32)) & MASK32) ^ SEED_SALT)
    k = _mix32((s & MASK32) ^ k)
    k = _mix32(((o >> np.uint64(32)) & MASK32) ^ k)
    return _mix32((o & MASK32) ^ k)


@numba.njit(inline="always", **JIT)
def _uniform(key, counter):
    """core/rng.uniform_bits as the float32 uniform in (0, 1]."""
    bits = _mix32(_mix32(key ^ np.uint64(counter)) ^ COUNTER_SALT) >> UNIFORM_SHIFT
    return np.float32(bits + np.uint64(1)) * UNIFORM_SCALE


@numba.njit(**JIT)
def row_seed(seed, row):
    """core/rng.row_seeds for one row: the seed of request ``row`` under one batch seed."""
    s = np.uint64(seed)
    k = _mix32(_mix32(((s >> np.uint64(32)) & MASK32) ^ SEED_SALT) ^ (s & MASK32))
    r = np.uint64(row)
    return np.int64((_mix32(r ^ k) << np.uint64(31)) ^ _mix32(r ^ (k ^ COUNTER_SALT)))


@numba.njit(inline="always", **JIT)
def _argmax(row):
    """First index of the maximum; a NaN wins at its first index (as numpy's argmax)."""
    best = 0
    top = row[0]
    if top != top:
        return 0
    for j in range(1, row.shape[0]):
        x = row[j]
        if x != x:
            return j
        if x > top:
            top = x
            best = j
    return best


@numba.njit(inline="always", **JIT)
def _first_at_least(w, level):
    """First index with ``w >= level`` (the argmax of ``w`` when ``level`` is its maximum)."""
    for j in range(w.shape[0]):
        if w[j] >= level:
            return j
    return _argmax(w)


@numba.njit(fastmath={"reassoc"}, **JIT)
def _block_sum(block):
    """float64 sum of a float32 slice, reassociated so that it vectorises (not inlined by numba:
    its fast-math flag would be lost in a caller compiled without it)."""
    s = 0.0
    for j in range(block.shape[0]):
        s += np.float64(block[j])
    return s


@numba.njit(**JIT)
def draw(w, v):
    """Smallest ``t`` with ``cumsum(w)[t] >= v * sum(w)`` in float64, and the total.

    Two levels: block sums (vectorised), then one sequential scan inside the crossing block.
    Prefixes are float64 as docs/semantics.md prescribes; the pick differs from a single
    sequential scan only where the threshold lies within float64 rounding of a prefix.
    """
    sums, total, _, _ = _block_sums(w, False)
    return _pick(w, sums, total, v), total


@numba.njit(**JIT)
def draw_checked(w, v, atol):
    """:func:`draw`, and whether ``w`` is not a distribution (a negative or NaN entry, or a
    total not within ``atol`` of 1), found on the draw's own pass over the row."""
    sums, total, low, has_nan = _block_sums(w, True)
    bad = not (low >= 0 and not has_nan and total < np.inf and abs(total - 1) <= atol)
    return _pick(w, sums, total, v), bad


@numba.njit(inline="always", **JIT)
def _block_sums(w, with_stats):
    """Per-block float64 sums and their total; with ``with_stats`` also the row's minimum and
    whether it holds a NaN (:func:`numba_math.row_stats` per block: the same pass)."""
    size = w.shape[0]
    n_blocks = (size + DRAW_BLOCK - 1) // DRAW_BLOCK
    sums = np.empty(n_blocks, dtype=np.float64)
    total = 0.0
    low = np.float32(np.inf)
    has_nan = False
    for b in range(n_blocks):
        block = w[b * DRAW_BLOCK:min(size, (b + 1) * DRAW_BLOCK)]
        if with_stats:
            block_low, block_nan, sums[b] = row_stats(block)
            low = min(low, block_low)
            has_nan = has_nan or block_nan
        else:
            sums[b] = _block_sum(block)
        total += sums[b]
    return sums, total, low, has_nan


@numba.njit(inline="always", **JIT)
def _pick(w, sums, total, v):
    """The draw's second level: the crossing block from ``sums``, then a scan inside it."""
    size = w.shape[0]
    n_blocks = sums.shape[0]
    threshold = np.float64(v) * total
    c = 0.0
    for b in range(n_blocks):
        if c + sums[b] >= threshold or b == n_blocks - 1:
            last_positive = -1
            start = b * DRAW_BLOCK
            for j in range(start, min(size, start + DRAW_BLOCK)):
                c += np.float64(w[j])
                if w[j] > 0:
                    last_positive = j
                if c >= threshold:
                    return j
            # Rounding left the block's own sum a hair under the crossing it showed.
            return last_positive if last_positive >= 0 else size - 1
        c += sums[b]
    return size - 1  # NaN weights (validate=False): an id in range


@numba.njit(inline="always", **JIT)
def _not_a_distribution(row, atol):
    """A row a draw reads in full: a negative or NaN entry, or a total not within ``atol`` of 1."""
    low, has_nan, total = row_stats(row)
    return not (low >= 0 and not has_nan and total < np.inf and abs(total - 1) <= atol)


@numba.njit(inline="always", **JIT)
def _bad_prob(x):
    return not (x >= 0 and x < np.inf)


@numba.njit(inline="always", **JIT)
def _greedy_request(target, rows, drafts, argmax_rows, i, n, is_logits, check):
    """``(accepted, final, bad)`` of greedy request ``i`` with ``n`` drafts: the longest prefix
    where draft == argmax, then the first unmatched argmax (or the bonus position's)."""
    k = drafts.shape[1]
    bad = False
    for j in range(n + 1):
        r = (i * (k + 1) + j) if rows.shape[0] == 0 else _clamp(rows[i, j], target.shape[0])
        row = target[r]
        g = _argmax(row) if argmax_rows.shape[0] == 0 else argmax_rows[r]
        if check:  # the argmax lands on a NaN if the row has one
            top = row[g]
            if is_logits and not (top > -np.inf and top < np.inf):
                bad = True
            if not is_logits and _bad_prob(top):
                bad = True
        if j == n or drafts[i, j] != g:
            return j, g, bad
    return n, 0, bad


@numba.njit(inline="always", **JIT)
def _clamp(r, size):
    """A row index from the caller's maps kept inside the array (garbage under validate=False
    must not read outside it)."""
    return min(max(r, 0), size - 1)


@numba.njit(inline="always", **JIT)
def _count(counts, drafts, i, check):
    """``(n, n_raw, reported, bad)``: request ``i``'s draft count cut at its first ``-1``, the
    caller's count, the count the result reports (as ``api.call.effective_counts``)."""
    k = drafts.shape[1]
    n_raw = k if counts.shape[0] == 0 else counts[i]
    bad = check and (n_raw < 0 or n_raw > k)
    n = min(max(n_raw, 0), k)  # garbage (validate=False) clamped, as every backend does
    cut = k
    for j in range(n):
        if drafts[i, j] == -1:  # no proposal: the request's drafts end here
            cut = j
            n = j
            break
    return n, n_raw, min(n_raw, cut), bad


@numba.njit(inline="always", **JIT)
def _bad_ids(drafts, bonus, i, n, v_size):
    """A draft id the decision reads, or the caller's bonus id, outside ``[0, V)``."""
    for j in range(n):
        if drafts[i, j] < 0 or drafts[i, j] >= v_size:
            return True
    return bonus.shape[0] > 0 and (bonus[i] < 0 or bonus[i] >= v_size)


@numba.njit(inline="always", **JIT)
def _greedy_all(target, is_logits, drafts, counts, argmax_rows, bonus, check, out_tokens,
                out_accepted, out_emitted, out_counts):
    error = ERROR_NONE
    v_size = target.shape[1]
    for i in range(drafts.shape[0]):
        n, n_raw, out_counts[i], bad = _count(counts, drafts, i, check)
        if check and _bad_ids(drafts, bonus, i, n, v_size):
            bad = True
        accepted, final, bad_row = _greedy_request(target, EMPTY_ROWS, drafts, argmax_rows, i,
                                                   n, is_logits, check)
        if bad or bad_row:
            error = ERROR_VALUE
        if bonus.shape[0] > 0 and accepted == n_raw:
            final = bonus[i]
        out_accepted[i] = accepted
        out_emitted[i] = accepted + 1
        _emit(out_tokens, drafts, i, accepted, final)
    return error


@numba.njit(**JIT)
def greedy(target, is_logits, drafts, counts, argmax_rows, bonus, check, out_tokens,
           out_accepted, out_emitted, out_counts):
    """:func:`decide` for a padded call whose every row is greedy (fewer arguments: a
    compiled call costs ~50 ns per argument to enter)."""
    return _greedy_all(target, is_logits, drafts, counts, argmax_rows, bonus, check,
                       out_tokens, out_accepted, out_emitted, out_counts)


@intrinsic
def _pointer(typingctx, address, dtype):
    """A typed data pointer from an integer address (a torch tensor's ``data_ptr()``)."""
    element = dtype.dtype
    pointer = types.CPointer(element)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(types.int64, dtype), codegen


@numba.njit(**JIT)
def greedy_at(target_address, rows, v_size, is_logits, drafts_address, b, k, counts, bonus,
              check, out_tokens, out_accepted, out_emitted, out_counts):
    """:func:`greedy` on contiguous torch tensors given by address: making their numpy views
    costs more (~0.7 us each) than a small call's whole decision."""
    target = numba.carray(_pointer(target_address, np.float32), (rows, v_size))
    drafts = numba.carray(_pointer(drafts_address, np.int64), (b, k))
    return _greedy_all(target, is_logits, drafts, counts, EMPTY_ARGMAX, bonus, check,
                       out_tokens, out_accepted, out_emitted, out_counts)


@numba.njit(**JIT)
def decide_at(target_address, n_rows, v_size, is_logits, rows, drafts_address, b, k, counts, q,
              qrows, temps, temp_scalar, all_greedy, typical, eps, alpha, explicit_u, seeds,
              seed_scalar, seed_mode, offsets, offset_scalar, bonus, check, atol, q_atol,
              out_tokens, out_accepted, out_emitted, out_counts):
    """:func:`decide` on contiguous torch tensors given by address (see :func:`greedy_at`)."""
    target = numba.carray(_pointer(target_address, np.float32), (n_rows, v_size))
    drafts = numba.carray(_pointer(drafts_address, np.int64), (b, k))
    return decide(target, is_logits, rows, drafts, counts, q, qrows, temps, temp_scalar,
                  all_greedy, typical, eps, alpha, explicit_u, seeds, seed_scalar, seed_mode,
                  offsets, offset_scalar, EMPTY_ARGMAX, bonus, check, atol, q_atol, out_tokens,
                  out_accepted, out_emitted, out_counts)


@numba.njit(**JIT)
def decide(target, is_logits, rows, drafts, counts, q, qrows, temps, temp_scalar, all_greedy,
           typical, eps, alpha, explicit_u, seeds, seed_scalar, seed_mode, offsets,
           offset_scalar, argmax_rows, bonus, check, atol, q_atol,
           out_tokens, out_accepted, out_emitted, out_counts):
    """Fill ``out_*`` for every request; return ``ERROR_VALUE`` when ``check`` is set and a
    value the decision reads is invalid (docs/semantics.md, Validation), else ``ERROR_NONE``.

    ``rows`` / ``qrows`` empty: the padded layout (request ``i``, position ``j`` is row
    ``i*(K+1) + min(j, n_i)`` / ``i*K + j``). ``counts`` empty: every request has ``K`` drafts.
    ``temps`` empty: every request has ``temp_scalar``. Uniforms: ``explicit_u`` if not empty,
    else derived from a per-request seed (``seed_mode`` 1: ``seeds``; 2: from ``seed_scalar`` and
    the request index) and offset (``offsets``, or ``offset_scalar`` when empty).
    ``argmax_rows`` (empty: computed here): the argmax of every target row, for greedy rows.
    ``bonus`` (empty: drawn here): the caller's token for a request that accepted every draft.
    """
    b, k = drafts.shape
    v_size = target.shape[1]
    error = ERROR_NONE
    padded = rows.shape[0] == 0
    n_rows = target.shape[0]
    has_q = q.shape[0] > 0
    scratch = np.empty(v_size, dtype=np.float32)
    scratch_residual = np.empty(v_size, dtype=np.float32)
    for i in range(b):
        n, n_raw, out_counts[i], bad = _count(counts, drafts, i, check)
        t = temp_scalar if temps.shape[0] == 0 else np.float64(temps[i])
        if check and (bad or _bad_ids(drafts, bonus, i, n, v_size) or not (t >= 0 and t < np.inf)
                      or (not is_logits and t != 0 and t != 1)):
            error = ERROR_VALUE
        if check and explicit_u.shape[0] > 0:
            for j in range(k + 1):
                if not (explicit_u[i, j] > 0 and explicit_u[i, j] <= 1):
                    error = ERROR_VALUE
        use_bonus = bonus.shape[0] > 0
        greedy = all_greedy or t == 0
        accepted = n
        final = 0
        if greedy:
            accepted, final, bad = _greedy_request(target, rows, drafts, argmax_rows, i, n,
                                                   is_logits, check)
            if bad:
                error = ERROR_VALUE
        else:
            tf = np.float32(min(max(t, 1.1754943508222875e-38), 3.4028234663852886e38))
            if explicit_u.shape[0] > 0:
                key = np.uint64(0)
            else:
                seed = seeds[i] if seed_mode == 1 else row_seed(seed_scalar, i)
                key = _request_key(seed, offset_scalar if offsets.shape[0] == 0 else offsets[i])
            s = 1.0
            for j in range(n):
                r = (i * (k + 1) + j) if padded else _clamp(rows[i, j], n_rows)
                row = target[r]
                x = drafts[i, j]
                in_vocab = x >= 0 and x < v_size
                xc = min(max(x, 0), v_size - 1)
                if is_logits:
                    m, has_nan = row_max(row)
                    if check and (has_nan or not (m > -np.inf and m < np.inf)):
                        error = ERROR_VALUE
                    if typical:
                        s, d = exp_sum_dot(row, m, tf, scratch)
                        entropy = math.log(s) - d / s
                    else:
                        s = exp_sum(row, m, tf, scratch)
                        entropy = 0.0
                    px = np.float32(np.float32(scratch[xc]) / np.float32(s))
                else:
                    px = row[xc]
                    if check and _bad_prob(px):
                        error = ERROR_VALUE
                    entropy = 0.0
                    if typical:  # 0 log 0 = 0; NaN and negative entries are only flagged
                        finite = True
                        for c in range(v_size):
                            pc = np.float64(row[c])
                            if pc > 0:
                                entropy -= pc * math.log(pc)
                            elif pc != 0:
                                finite = False
                        if check and not (finite and abs(entropy) < np.inf):
                            error = ERROR_VALUE
                if not in_vocab:
                    px = np.float32(0.0)
                if typical:
                    ok = in_vocab and px > min(eps, alpha * math.exp(-entropy))
                else:
                    u = explicit_u[i, j] if explicit_u.shape[0] > 0 else _uniform(key, 2 * j)
                    qx = np.float32(1.0)
                    if has_q:
                        qr = (i * k + j) if padded else _clamp(qrows[i, j], q.shape[0])
                        qx = q[qr, xc]
                        if check and _bad_prob(qx):
                            error = ERROR_VALUE
                    ok = px > 0 and np.float32(u) * qx <= px
                if not ok:
                    accepted = j
                    break
            rejected = accepted < n
            if use_bonus and accepted == n_raw:
                final = bonus[i]  # the caller's own draw replaces ours: the row is not read
                out_accepted[i] = accepted
                out_emitted[i] = accepted + 1
                _emit(out_tokens, drafts, i, accepted, final)
                continue
            v = explicit_u[i, k] if explicit_u.shape[0] > 0 else _uniform(key, DRAW_COUNTER)
            r = (i * (k + 1) + accepted) if padded else _clamp(rows[i, accepted], n_rows)
            row = target[r]
            if is_logits:
                if not rejected:  # a rejected row's exp and sum are still in scratch and s
                    m, has_nan = row_max(row)
                    if check and (has_nan or not (m > -np.inf and m < np.inf)):
                        error = ERROR_VALUE
                    s = exp_sum(row, m, tf, scratch)
                p = scratch
            else:
                p = row  # checked as a distribution on the pass that draws from it (below)
            if typical and rejected:
                # argmax p: for logits the first exponential equal to exp(0) = 1
                final = _first_at_least(p, np.float32(1.0)) if is_logits else _argmax(p)
            elif not rejected:
                if check and not is_logits:
                    final, bad = draw_checked(p, v, atol)
                    if bad:
                        error = ERROR_VALUE
                else:
                    final = draw(p, v)[0]
            else:
                x = drafts[i, accepted]
                in_vocab = x >= 0 and x < v_size
                if has_q:
                    qr = (i * k + accepted) if padded else _clamp(qrows[i, accepted], q.shape[0])
                    qrow = q[qr]
                    if check and not is_logits:  # both rows checked on the residual's pass
                        bad_p, total_p, bad_q, total_q = residual_stats(p, qrow,
                                                                        scratch_residual)
                        if (bad_p or bad_q or not abs(total_p - 1) <= atol
                                or not abs(total_q - 1) <= q_atol):
                            error = ERROR_VALUE
                    else:
                        if check and _not_a_distribution(qrow, q_atol):
                            error = ERROR_VALUE
                        residual(p, s if is_logits else 1.0, qrow, scratch_residual)
                    final, total = draw(scratch_residual, v)
                    if not total > 0:
                        final = draw(p, v)[0]
                else:
                    if check and not is_logits and _not_a_distribution(p, atol):
                        error = ERROR_VALUE
                    scratch_residual[:] = p
                    if in_vocab:
                        scratch_residual[x] = 0.0
                    final, total = draw(scratch_residual, v)
                    if not total > 0:
                        final = x if in_vocab else draw(p, v)[0]
        if use_bonus and accepted == n_raw:
            final = bonus[i]
        out_accepted[i] = accepted
        out_emitted[i] = accepted + 1
        _emit(out_tokens, drafts, i, accepted, final)
    return error


@numba.njit(inline="always", **JIT)
def _emit(out_tokens, drafts, i, accepted, final):
    """Row ``i``: the accepted drafts, the final token, then placeholders (-1)."""
    for j in range(out_tokens.shape[1]):
        if j < accepted:
            out_tokens[i, j] = drafts[i, j]
        elif j == accepted:
            out_tokens[i, j] = final
        else:
            out_tokens[i, j] = -1
