"""The whole decision of one call as one compiled CPU kernel (numba).

Why: at the serving operating point (batch 1-8) a call's fixed cost is what matters, and a
compiled call is cheap to enter; at serving scale disjoint ranges of requests run at once on
several threads (``backends/numba/backend.py``; docs/decisions.md says why threads and not
numba's parallel layer). Semantics are docs/semantics.md; each request is
``backends/numpy/chain.py``'s ``verify_one``'s twin, in the same two halves
(:func:`accept_prefix`, :func:`final_token`); the row passes are
:mod:`portable_verify.backends.numba.rows` (vectorised max, argmax, exp, log).

A kernel takes few arguments (numba enters a call argument by argument): the target, the
drafts, the call's other arrays as one tuple (:data:`ARRAYS`), the options as one record
(:data:`OPTIONS`), the request range and the outputs as one tuple. Arrays that an option leaves
out are passed as empty arrays of the same dtype and rank, so the tuple's type, and with it the
kernel, is the same in every call of one dtype combination (one compile, one cache entry).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from portable_verify.backends.numba.rows import (
    _CHUNK,
    INNER,
    JIT,
    _chunk_max,
    _exp_row,
    copy_row,
    entropy,
    exp_sum,
    exp_sum_dot,
    residual,
    residual_stats,
    row_argmax,
    row_max,
    row_stats,
)
from portable_verify.backends.numba.rules import TYPICAL
from portable_verify.core import constants, rng

# The counter hash of core/rng.py, as uint64 constants (its one source of truth).
MASK32 = np.uint64(rng.MASK32)
SEED_SALT = np.uint64(rng.SEED_SALT)
COUNTER_SALT = np.uint64(rng.COUNTER_SALT)
MIX_C1 = np.uint64(rng.MIX_C1)
MIX_C2 = np.uint64(rng.MIX_C2)
UNIFORM_SHIFT = np.uint64(32 - rng.UNIFORM_BITS)
UNIFORM_SCALE = np.float32(rng.UNIFORM_SCALE)
DRAW_COUNTER = rng.DRAW_COUNTER  # the draw's counter; acceptance at position j uses 2j
DRAW_BLOCK = constants.DRAW_BLOCK
TEMP_LOW = constants.FLOAT32_TINY
TEMP_HIGH = constants.FLOAT32_MAX
TILE = 16 * DRAW_BLOCK  # fused passes: one row call per tile (a call per draw block costs
# more than it saves), the tile's draw-block sums taken while it is in L1/L2
ONE_KEY = np.int32(0x3F800000)  # the order key (rows.py) of 1.0: its float32 bits

EMPTY_ROWS = np.empty((0, 0), dtype=np.int64)

ERROR_NONE = 0
ERROR_VALUE = 1  # a value the decision reads is invalid: the caller words it (torch backend)

OPTIONS = np.dtype([
    ("is_logits", np.bool_), ("all_greedy", np.bool_), ("check", np.bool_),
    ("rule", np.int64), ("seed_mode", np.int64), ("seed_scalar", np.int64),
    ("offset_scalar", np.int64), ("temp_scalar", np.float64),
    ("eps", np.float64), ("alpha", np.float64), ("atol", np.float64), ("q_atol", np.float64),
    ("children", np.int64), ("max_depth", np.int64),
], align=True)
"""A call's options and scalars as one record (a 1-element array of it goes down to the
kernel), chain and tree kernels alike; ``host.call_record`` builds it (the one place).

``rule``: the sampled rows' rule, a code of ``rules.py`` (the switch each family's one entry
kernel, ``entries.decide`` / ``entries.walk``, branches on; an unknown code is flagged);
``seed_mode`` 1: per-request ``seeds``; 2: ``row_seed(seed_scalar, i)``; ``offset_scalar``
when ``offsets`` is empty; ``temp_scalar`` when ``temps`` is empty; ``eps`` / ``alpha``: the
typical parameters (:func:`typical_threshold`); ``atol`` / ``q_atol``: the sum tolerance of
target / draft probability rows; ``children`` / ``max_depth``: a tree walk's children code
and depth cap (0 in chain calls)."""

ARRAYS = ("rows", "counts", "q", "qrows", "temps", "uniforms", "seeds", "offsets", "bonus")
"""The order of the chain kernels' array tuple (``host.call_arrays`` builds it): target row
map ``[B, K+1]``, draft counts ``[B]``, draft probabilities ``[R, V]`` and their row map
``[B, K]``, temperatures ``[B]``, explicit uniforms ``[B, K+1]``, seeds and offsets ``[B]``,
the caller's bonus ids ``[B]``; each empty where the call leaves it out."""


@numba.njit(inline="always", **JIT)
def _mix32(x):
    """core/rng.mix32 on uint64 holding a 32-bit value (products cannot overflow)."""
    x = x ^ (x >> np.uint64(16))
    x = (x * MIX_C1) & MASK32
    x = x ^ (x >> np.uint64(15))
    x = (x * MIX_C2) & MASK32
    return x ^ (x >> np.uint64(16))


@numba.njit(inline="always", **JIT)
def _uniform(key, counter):
    """core/rng.uniform_bits as the float32 uniform in (0, 1]."""
    bits = _mix32(_mix32(key ^ np.uint64(counter)) ^ COUNTER_SALT) >> UNIFORM_SHIFT
    return np.float32(bits + np.uint64(1)) * UNIFORM_SCALE


@numba.njit(**JIT, **INNER)
def row_seed(seed, row):
    """core/rng.row_seeds for one row: the seed of request ``row`` under one batch seed."""
    s = np.uint64(seed)
    k = _mix32(_mix32(((s >> np.uint64(32)) & MASK32) ^ SEED_SALT) ^ (s & MASK32))
    r = np.uint64(row)
    return np.int64((_mix32(r ^ k) << np.uint64(31)) ^ _mix32(r ^ (k ^ COUNTER_SALT)))


@numba.njit(fastmath={"reassoc"}, **JIT, **INNER)
def _block_sum(block):
    """float64 sum of a float32 slice, reassociated so that it vectorises (not inlined by numba:
    its fast-math flag would be lost in a caller compiled without it)."""
    s = 0.0
    for j in range(block.shape[0]):
        s += np.float64(block[j])
    return s


@numba.njit(**JIT, **INNER)
def draw(w, v):
    """Smallest ``t`` with ``cumsum(w)[t] >= v * sum(w)`` in float64, and the total.

    Two levels: block sums (vectorised), then one sequential scan inside the crossing block.
    Prefixes are float64 as docs/semantics.md prescribes; the pick differs from a single
    sequential scan only where the threshold lies within float64 rounding of a prefix.
    """
    sums, total, _, _ = _block_sums(w, False)
    return _pick(w, sums, total, v, -1), total


@numba.njit(**JIT, **INNER)
def draw_checked(w, v, atol):
    """:func:`draw`, and whether ``w`` is not a distribution (a negative or NaN entry, or a
    total not within ``atol`` of 1), found on the draw's own pass over the row."""
    sums, total, low, has_nan = _block_sums(w, True)
    return _pick(w, sums, total, v, -1), not _is_distribution(low, has_nan, total, atol)


@numba.njit(inline="always", **JIT)
def _block_sums(w, with_stats):
    """Per-block float64 sums and their total; with ``with_stats`` also the row's minimum and
    whether it holds a NaN (:func:`rows.row_stats` per block: the same pass)."""
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
def _pick(w, sums, total, v, zero_at):
    """The draw's second level: the crossing block from ``sums``, then a scan inside it;
    ``w[zero_at]`` is read as 0 (a residual that is ``w`` less one entry, without a copy)."""
    size = w.shape[0]
    n_blocks = sums.shape[0]
    threshold = np.float64(v) * total
    c = 0.0
    for b in range(n_blocks):
        if c + sums[b] >= threshold or b == n_blocks - 1:
            last_positive = -1
            start = b * DRAW_BLOCK
            for j in range(start, min(size, start + DRAW_BLOCK)):
                wj = np.float32(0.0) if j == zero_at else w[j]
                c += np.float64(wj)
                if wj > 0:
                    last_positive = j
                if c >= threshold:
                    return j
            # Rounding left the block's own sum a hair under the crossing it showed.
            return last_positive if last_positive >= 0 else size - 1
        c += sums[b]
    return size - 1  # NaN weights (validate=False): an id in range


@numba.njit(inline="always", **JIT)
def _exp_sums(row, m, tf, out, sums):
    """:func:`rows.exp_sum` tile by tile (:data:`TILE`), each draw block's float64 sum
    (the draw's first level, kept in ``sums``) taken while the tile is in cache: a later draw
    from ``out`` reads only its crossing block. Returns the total (the softmax normaliser)."""
    size = row.shape[0]
    m32 = np.float32(m)
    total = 0.0
    for lo in range(0, size, TILE):
        hi = min(size, lo + TILE)
        _exp_row(row[lo:hi], m32, tf, out[lo:hi])
        total += _tile_sums(out, sums, lo, hi)
    return total


@numba.njit(inline="always", **JIT)
def _residual_sums(p, scale, q, out, sums, stats):
    """``out = max(p / scale - q, 0)`` with each draw block's sum in ``sums``, tile by tile
    (as :func:`_exp_sums`); with ``stats`` also :func:`rows.residual_stats`'s checks of
    both probability rows, on the same pass. ``(bad_p, total_p, bad_q, total_q, total)``."""
    size = p.shape[0]
    bad_p = bad_q = False
    total_p = total_q = total = 0.0
    for lo in range(0, size, TILE):
        hi = min(size, lo + TILE)
        if stats:
            block_bad_p, block_p, block_bad_q, block_q = residual_stats(p[lo:hi], q[lo:hi],
                                                                        out[lo:hi])
            bad_p = bad_p or block_bad_p
            bad_q = bad_q or block_bad_q
            total_p += block_p
            total_q += block_q
        else:
            residual(p[lo:hi], scale, q[lo:hi], out[lo:hi])
        total += _tile_sums(out, sums, lo, hi)
    return bad_p, total_p, bad_q, total_q, total


@numba.njit(inline="always", **JIT)
def _tile_sums(out, sums, lo, hi):
    """The draw-block sums of ``out[lo:hi]`` (``lo`` a multiple of :data:`TILE`) into
    ``sums``, while the tile is still in cache; returns their total."""
    total = 0.0
    for b in range(lo // DRAW_BLOCK, (hi + DRAW_BLOCK - 1) // DRAW_BLOCK):
        sums[b] = _block_sum(out[b * DRAW_BLOCK:min(hi, (b + 1) * DRAW_BLOCK)])
        total += sums[b]
    return total


@numba.njit(inline="always", **JIT)
def _first_one(p):
    """First ``t`` with ``p[t] >= 1`` (-1 if none): chunk maxima (vectorised) find the first
    chunk holding one, and only that chunk is scanned (a scalar scan pays for every entry up to
    the hit)."""
    n = p.shape[0]
    for c0 in range(0, n, _CHUNK):
        c1 = min(n, c0 + _CHUNK)
        if _chunk_max(p[c0:c1])[0] >= ONE_KEY:  # NaN keys are ignored by the chunk max
            for t in range(c0, c1):
                if p[t] >= 1.0:
                    return t
    return -1


@numba.njit(inline="always", **JIT)
def _is_distribution(low, has_nan, total, atol):
    return low >= 0 and not has_nan and total < np.inf and abs(total - 1) <= atol


@numba.njit(inline="always", **JIT)
def _not_a_distribution(row, atol):
    """A row a draw reads in full: a negative or NaN entry, or a total not within ``atol`` of 1."""
    low, has_nan, total = row_stats(row)
    return not _is_distribution(low, has_nan, total, atol)


@numba.njit(inline="always", **JIT)
def typical_threshold(o, h):
    """Typical acceptance's threshold ``min(eps, alpha * exp(-H))`` (docs/semantics.md) for a
    row of entropy ``h``, ``o`` the call's record: its one writing in this family, which the
    chain and the tree kernels both call."""
    return min(o.eps, o.alpha * math.exp(-h))


@numba.njit(inline="always", **JIT)
def normal_temperature(t):
    """The float32 temperature a sampled row divides by: ``t`` clamped into the normal float32
    range (docs/semantics.md), as every backend does."""
    return np.float32(min(max(t, TEMP_LOW), TEMP_HIGH))


@numba.njit(inline="always", **JIT)
def _bad_prob(x):
    return not (x >= 0 and x < np.inf)


@numba.njit(inline="always", **JIT)
def _bad_logit_max(m, has_nan):
    return has_nan or not (m > -np.inf and m < np.inf)


@numba.njit(inline="always", **JIT)
def _flag(error, bad):
    """The one way a check raises the call's flag (docs/semantics.md, Validation)."""
    return ERROR_VALUE if bad else error


@numba.njit(inline="always", **JIT)
def _clamp(r, size):
    """A row index from the caller's maps kept inside the array (garbage under validate=False
    must not read outside it)."""
    return min(max(r, 0), size - 1)


@numba.njit(inline="always", **JIT)
def _target_row(rows, i, j, k, n_rows):
    """Target row of request ``i``, position ``j``: padded ``i*(K+1) + j``, or the caller's map."""
    return (i * (k + 1) + j) if rows.shape[0] == 0 else _clamp(rows[i, j], n_rows)


@numba.njit(inline="always", **JIT)
def _draft_row(qrows, i, j, k, n_rows):
    """Draft-probability row of request ``i``, position ``j`` (padded ``i*K + j``, or a map)."""
    return (i * k + j) if qrows.shape[0] == 0 else _clamp(qrows[i, j], n_rows)


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
def _bad_request(drafts, bonus, explicit_u, i, n, t, v_size, is_logits):
    """The request's ``O(K)`` checks: ids, its temperature, its explicit uniforms."""
    bad = _bad_ids(drafts, bonus, i, n, v_size) or not (t >= 0 and t < np.inf)
    bad = bad or (not is_logits and t != 0 and t != 1)
    if explicit_u.shape[0] > 0:
        for j in range(drafts.shape[1] + 1):
            bad = bad or not (explicit_u[i, j] > 0 and explicit_u[i, j] <= 1)
    return bad


@numba.njit(inline="always", **JIT)
def _greedy_request(target, rows, drafts, i, n, is_logits, check):
    """``(accepted, final, bad)`` of greedy request ``i`` with ``n`` drafts: the longest prefix
    where draft == argmax, then the first unmatched argmax (or the bonus position's)."""
    k = drafts.shape[1]
    bad = False
    for j in range(n + 1):
        row = target[_target_row(rows, i, j, k, target.shape[0])]
        g = row_argmax(row)
        if check:  # the argmax lands on a NaN if the row has one
            top = row[g]
            bad = bad or (is_logits and not (top > -np.inf and top < np.inf))
            bad = bad or (not is_logits and _bad_prob(top))
        if j == n or drafts[i, j] != g:
            return j, g, bad
    return n, 0, bad


@numba.njit(inline="always", **JIT)
def _emit(outs, drafts, bonus, i, accepted, n_raw, final):
    """Request ``i``'s outputs, written once: the accepted drafts, the final token (the
    caller's bonus id where every raw draft was accepted and it gave one), then -1."""
    out_tokens, out_accepted, out_emitted, _ = outs
    if bonus.shape[0] > 0 and accepted == n_raw:
        final = bonus[i]
    out_accepted[i] = accepted
    out_emitted[i] = accepted + 1
    for j in range(out_tokens.shape[1]):
        if j < accepted:
            out_tokens[i, j] = drafts[i, j]
        elif j == accepted:
            out_tokens[i, j] = final
        else:
            out_tokens[i, j] = -1


@numba.njit(inline="always", **JIT)
def _greedy_one(target, drafts, counts, bonus, is_logits, check, i, outs):
    """Greedy request ``i`` from count to emission; returns its flag."""
    n, n_raw, reported, bad = _count(counts, drafts, i, check)
    outs[3][i] = reported
    bad = bad or (check and _bad_ids(drafts, bonus, i, n, target.shape[1]))
    accepted, final, bad_row = _greedy_request(target, EMPTY_ROWS, drafts, i, n, is_logits,
                                               check)
    _emit(outs, drafts, bonus, i, accepted, n_raw, final)
    return _flag(ERROR_NONE, bad or bad_row)


@numba.njit(**JIT)
def greedy(target, drafts, counts, bonus, is_logits, check, lo, hi, outs):
    """:func:`entries.decide` for requests ``lo .. hi-1`` of a padded call whose every row is greedy
    (of the call's arrays only the two it reads: numba enters a call argument by argument).

    Its two options come as two flags, not the record: the greedy path is the cheapest call,
    and typing a record argument costs its dispatcher more than two booleans
    (docs/decisions.md, "numba kernels' arguments")."""
    error = ERROR_NONE
    for i in range(lo, hi):
        error = max(error, _greedy_one(target, drafts, counts, bonus, is_logits, check, i,
                                       outs))
    return error


@intrinsic
def _pointer(typingctx, address, dtype):
    """A typed data pointer from an integer address (a torch tensor's ``data_ptr()``)."""
    element = dtype.dtype
    pointer = types.CPointer(element)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(types.int64, dtype), codegen


@numba.njit(**JIT)
def greedy_at(target_address, n_rows, v_size, drafts_address, b, k, counts, bonus, is_logits,
              check, tokens, accepted, emitted, n_drafts):
    """:func:`greedy` (all requests: small calls) on contiguous torch tensors given by address:
    making their numpy views costs more than a small call's whole decision. The outputs come
    one by one: a tuple argument costs the dispatcher more to type than four arrays."""
    target = numba.carray(_pointer(target_address, np.float32), (n_rows, v_size))
    drafts = numba.carray(_pointer(drafts_address, np.int64), (b, k))
    outs = (tokens, accepted, emitted, n_drafts)
    return greedy(target, drafts, counts, bonus, is_logits, check, np.int64(0), b,
                  outs)  # an int64 start: one signature


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
def _key_of(o, arrays, i):
    """Request ``i``'s counter-hash key (unused when the caller gave uniforms)."""
    _, _, _, _, _, explicit_u, seeds, offsets, _ = arrays
    if explicit_u.shape[0] > 0:
        return np.uint64(0)
    seed = seeds[i] if o.seed_mode == 1 else row_seed(o.seed_scalar, i)
    return _request_key(seed, o.offset_scalar if offsets.shape[0] == 0 else offsets[i])


@numba.njit(inline="always", **JIT)
def _u(explicit_u, key, i, counter_index, counter):
    return explicit_u[i, counter_index] if explicit_u.shape[0] > 0 else _uniform(key, counter)


@numba.njit(inline="always", **JIT)
def _softmax_row(row, tf, scratch, typical, check):
    """Exponentials of a logits row into ``scratch``: ``(sum, entropy, bad)`` (for kernels
    that draw with :func:`draw`; :func:`_softmax_sums` also keeps the draw's block sums)."""
    m, has_nan = row_max(row)
    bad = check and _bad_logit_max(m, has_nan)
    if typical:
        s, d = exp_sum_dot(row, m, tf, scratch)
        return s, math.log(s) - d / s, bad
    return exp_sum(row, m, tf, scratch), 0.0, bad


@numba.njit(inline="always", **JIT)
def _softmax_sums(row, tf, scratch, sums, typical, check):
    """:func:`_softmax_row`, the exponentials' draw-block sums in ``sums`` unless ``typical``
    (whose rows are never drawn from: a rejection takes the argmax)."""
    m, has_nan = row_max(row)
    bad = check and _bad_logit_max(m, has_nan)
    if typical:
        s, d = exp_sum_dot(row, m, tf, scratch)
        return s, math.log(s) - d / s, bad
    return _exp_sums(row, m, tf, scratch, sums), 0.0, bad


@numba.njit(**JIT, **INNER)
def accept_prefix(target, drafts, arrays, o, i, n, tf, key, work):
    """The first half of the numpy family's ``verify_one`` for a sampled request:
    ``(accepted, s, error)``, the length of the accepted prefix of its ``n`` drafts and, for
    logits, the sum of the exponentials of the last row read (they stay in ``work``'s
    scratch, their draw-block sums in its ``sums``)."""
    rows, _, q, qrows, _, explicit_u, _, _, _ = arrays
    scratch, _, sums = work
    k = drafts.shape[1]
    v_size = target.shape[1]
    error = ERROR_NONE
    s = 1.0
    for j in range(n):
        row = target[_target_row(rows, i, j, k, target.shape[0])]
        x = drafts[i, j]
        in_vocab = x >= 0 and x < v_size
        xc = min(max(x, 0), v_size - 1)
        if o.is_logits:
            s, h, bad = _softmax_sums(row, tf, scratch, sums, o.rule == TYPICAL, o.check)
            error = _flag(error, bad)
            px = np.float32(np.float32(scratch[xc]) / np.float32(s))
        else:
            px = row[xc]
            error = _flag(error, o.check and _bad_prob(px))
            h = 0.0
            if o.rule == TYPICAL:  # 0 log 0 = 0; NaN and negative entries are only flagged
                h, finite = entropy(row)
                error = _flag(error, o.check and not finite)
        px = px if in_vocab else np.float32(0.0)
        if o.rule == TYPICAL:
            ok = in_vocab and px > typical_threshold(o, h)
        else:
            qx = np.float32(1.0)
            if q.shape[0] > 0:
                qx = q[_draft_row(qrows, i, j, k, q.shape[0]), xc]
                error = _flag(error, o.check and _bad_prob(qx))
            ok = px > 0 and np.float32(_u(explicit_u, key, i, j, 2 * j)) * qx <= px
        if not ok:
            return j, s, error
    return n, s, error


@numba.njit(**JIT, **INNER)
def _residual_token(p, s, sums, qrow, x, v, o, scratch_residual):
    """After a rejection of draft ``x``: a draw from ``max(p - q, 0)`` (``q`` one-hot at ``x``
    without draft probabilities), from ``p`` when that is empty. ``(token, error)``. For
    logits ``sums`` holds the draw-block sums of ``p`` (the exponentials, total ``s``)."""
    error = ERROR_NONE
    in_vocab = x >= 0 and x < p.shape[0]
    if qrow.shape[0] > 0:
        stats = o.check and not o.is_logits  # both rows checked on the residual's pass
        error = _flag(error, o.check and o.is_logits and _not_a_distribution(qrow, o.q_atol))
        bad_p, total_p, bad_q, total_q, total = _residual_sums(
            p, s if o.is_logits else 1.0, qrow, scratch_residual, sums, stats)
        error = _flag(error, stats and (bad_p or bad_q or not abs(total_p - 1) <= o.atol
                                        or not abs(total_q - 1) <= o.q_atol))
        if total > 0:
            return _pick(scratch_residual, sums, total, v, -1), error
        return draw(p, v)[0], error
    if not o.is_logits:  # the draw's block sums and the distribution check: one pass
        sums, s, low, has_nan = _block_sums(p, o.check)
        error = _flag(error, o.check and not _is_distribution(low, has_nan, s, o.atol))
    total = s
    if in_vocab:  # the residual is p less its entry x: only x's block sum changes
        b = x // DRAW_BLOCK
        lo = b * DRAW_BLOCK
        hi = min(p.shape[0], lo + DRAW_BLOCK)
        copy_row(p[lo:hi], scratch_residual[lo:hi])
        scratch_residual[x] = 0.0
        sums[b] = _block_sum(scratch_residual[lo:hi])
        total = 0.0
        for c in range(sums.shape[0]):
            total += sums[c]
    if total > 0:
        return _pick(p, sums, total, v, x), error
    return (x if in_vocab else draw(p, v)[0]), error


@numba.njit(**JIT, **INNER)
def final_token(target, drafts, arrays, o, i, accepted, n, s, tf, key, work):
    """The second half of the numpy family's ``verify_one`` for a sampled request: the token
    after ``accepted`` drafts (typical: the argmax after a rejection; rejection sampling: a
    draw from the residual; all accepted: a draw from the bonus row). ``(token, error)``."""
    rows, _, q, qrows, _, explicit_u, _, _, _ = arrays
    scratch, scratch_residual, sums = work
    k = drafts.shape[1]
    rejected = accepted < n
    v = _u(explicit_u, key, i, k, DRAW_COUNTER)
    row = target[_target_row(rows, i, accepted, k, target.shape[0])]
    error = ERROR_NONE
    p = row  # probabilities: checked as a distribution on the pass that draws from it
    if o.is_logits:
        if not rejected:  # a rejected row's exponentials and sum are still in scratch and s
            s, _, bad = _softmax_sums(row, tf, scratch, sums, False, o.check)
            error = _flag(error, bad)
        p = scratch
    if o.rule == TYPICAL and rejected:
        if o.is_logits:  # the argmax is the first exponential equal to exp(0) = 1
            t = _first_one(p)
            if t >= 0:
                return t, error
        return row_argmax(p), error
    if not rejected:
        if o.check and not o.is_logits:
            token, bad = draw_checked(p, v, o.atol)
            return token, _flag(error, bad)
        if o.is_logits:  # the block sums of the exponentials are in sums, their total is s
            return _pick(p, sums, s, v, -1), error
        return draw(p, v)[0], error
    qrow = scratch_residual[:0]  # no draft probabilities
    if q.shape[0] > 0:
        qrow = q[_draft_row(qrows, i, accepted, k, q.shape[0])]
    token, bad = _residual_token(p, s, sums, qrow, drafts[i, accepted], v, o, scratch_residual)
    return token, max(error, bad)


@numba.njit(**JIT, **INNER)
def _one(target, drafts, arrays, o, i, work, outs):
    """Request ``i`` from its count to its emission (written once); returns its flag.
    ``work``: ``(scratch, scratch_residual, sums)`` (``entries.decide`` allocates them)."""
    rows, counts, _, _, temps, explicit_u, _, _, bonus = arrays
    v_size = target.shape[1]
    n, n_raw, reported, bad = _count(counts, drafts, i, o.check)
    outs[3][i] = reported
    t = o.temp_scalar if temps.shape[0] == 0 else np.float64(temps[i])
    error = _flag(ERROR_NONE, o.check and (bad or _bad_request(
        drafts, bonus, explicit_u, i, n, t, v_size, o.is_logits)))
    caller_bonus = bonus.shape[0] > 0
    if o.all_greedy or t == 0:
        accepted, final, bad = _greedy_request(target, rows, drafts, i, n, o.is_logits, o.check)
        error = _flag(error, bad)
    else:
        tf = normal_temperature(t)
        key = _key_of(o, arrays, i)
        accepted, s, bad = accept_prefix(target, drafts, arrays, o, i, n, tf, key, work)
        error = max(error, bad)
        final = 0
        if not (caller_bonus and accepted == n_raw):  # else the caller's draw replaces ours
            final, bad = final_token(target, drafts, arrays, o, i, accepted, n, s, tf, key,
                                     work)
            error = max(error, bad)
    _emit(outs, drafts, bonus, i, accepted, n_raw, final)
    return error
