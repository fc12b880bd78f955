"""Triton kernels for every method (greedy, rejection, typical, block) and their launcher.

Design (docs/backends.md, "CUDA, XPU and Triton"): at most two launches per call, no host sync.

1. ``_layout_kernel``, grid ``(B, K+1, S)``: program ``(b, j, s)`` reads what the caller
   passed for position ``j`` of request ``b`` into a work record and keeps the statistics of
   slice ``s`` of its target row (first argmax, online softmax, entropy), each only when
   asked; small batches split the vocabulary into ``S`` slices (``vocabulary_split``).
2. ``_decide_kernel``, grid ``(B, D)``: each program merges its request's slice statistics,
   tests its ``n`` positions at once (gathers of ``p(x)``, ``q(x)``, uniforms) and takes the
   accepted prefix ``a``. Rejection's inverse-CDF draw is split: program ``d`` stores block
   ``d``'s partials and the last program of the request to arrive (an atomic counter) draws
   from them (``_split_draw``). Typical and block keep ``D = 1``: one program reads the ONE row
   it needs (argmax of ``p_a``, or the two chunked passes of ``_final_draw``). The writer
   stores the ``[K+1]`` output row (-1 padded) and ``a``.

Everything is decided on the device from tensors; the launcher only reads shapes and host flags,
so a call can be captured in a CUDA graph (after one warm-up call has compiled the kernels).

Interpreter: :mod:`portable_verify.backends.triton.interpreter` executes this file a second time
as a private module with ``_INTERPRET = True`` injected, so the same kernels run on CPU tensors
while this module's compiled kernels stay untouched.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from portable_verify.backends.triton import spec
from portable_verify.backends.triton.interpreter import InterpretedDevice
from portable_verify.core import constants, rng
from portable_verify.core.types import (
    INVALID_DRAFT_TOKEN_ID,
    PLACEHOLDER_TOKEN_ID,
    VerifyInputs,
)

_INTERPRET: bool = bool(globals().get("_INTERPRET", False))  # injected by the interpreter copy
PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN_ID)
FLOAT32_TINY = tl.constexpr(constants.FLOAT32_TINY)
FLOAT32_MAX = tl.constexpr(constants.FLOAT32_MAX)
INVALID_DRAFT = tl.constexpr(INVALID_DRAFT_TOKEN_ID)
RULE_REJECTION = tl.constexpr(spec.RULE_CODES["rejection"])
RULE_TYPICAL = tl.constexpr(spec.RULE_CODES["typical"])
RULE_BLOCK = tl.constexpr(spec.RULE_CODES["block"])
MIX_C1 = tl.constexpr(rng.MIX_C1)
MIX_C2 = tl.constexpr(rng.MIX_C2)
SEED_SALT = tl.constexpr(rng.SEED_SALT)
COUNTER_SALT = tl.constexpr(rng.COUNTER_SALT)
DRAW_COUNTER = tl.constexpr(rng.DRAW_COUNTER)
UNIFORM_BITS = tl.constexpr(rng.UNIFORM_BITS)
UNIFORM_SCALE = tl.constexpr(rng.UNIFORM_SCALE)
_TL_CORE = tl.core  # in the globals so the interpreter patches it at launch (InterpretedDevice)


def _kernel(fn):  # type: ignore[no-untyped-def]
    """``triton.jit`` for a kernel, or Triton's interpreter in the private interpreted copy."""
    return InterpretedFunction(fn) if _INTERPRET else triton.jit(fn)


def _device(fn):  # type: ignore[no-untyped-def]
    """``triton.jit`` for a device function (inlined into kernels), or its interpreted form."""
    return InterpretedDevice(fn) if _INTERPRET else triton.jit(fn)


@_device
def _chunk_first_argmax(x, offs, best, best_idx, V):
    """Fold one chunk into a running (max, first index); strict ``>`` keeps the lowest index."""
    cmax = tl.max(x, 0)
    cidx = tl.min(tl.where(x == cmax, offs, V), 0)
    better = cmax > best
    return tl.where(better, cmax, best), tl.where(better, cidx, best_idx)


@_device
def _last_of_cumsum(w, BLOCK: tl.constexpr):
    """``cumsum(w)[-1]`` taken from the scan itself, so totals and scans round identically."""
    lane = tl.arange(0, BLOCK)
    return tl.sum(tl.where(lane == BLOCK - 1, tl.cumsum(w, 0), 0.0), 0)


@_device
def _safe_temperature(t):
    """``T`` clamped into the normal float32 range (as the reference); 1 for greedy/NaN rows."""
    return tl.where(t > 0, tl.minimum(tl.maximum(t, FLOAT32_TINY), FLOAT32_MAX), 1.0)


@_device
def _typical_threshold(entropy, eps, alpha):
    """Typical acceptance's bar ``min(eps, alpha * exp(-H))`` (docs/semantics.md): the one
    place the Triton family writes it (chain and tree kernels call it)."""
    return tl.minimum(eps, alpha * tl.exp(-entropy))


@_device
def _clamped(index, size):
    """A row or position index read from caller data, clamped into ``[0, size - 1]``."""
    return tl.minimum(tl.maximum(index, 0), size - 1)


@_device
def _p_chunk(base, offs, V, t, m, s, IS_LOGITS: tl.constexpr):
    """``p`` over one chunk (0 outside the row): ``exp((l - max) / T) / sum`` or the given probs.

    ``m`` is the row's raw maximum logit: subtracting before dividing keeps the quotient in
    ``[-inf, 0]`` (``l / T`` alone overflows for huge logits or tiny T)."""
    valid = offs < V
    if IS_LOGITS:
        x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
        p = tl.where(x > float("-inf"), tl.exp((x - m) / t) / s, 0.0)
    else:
        p = tl.load(base + offs, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, p, 0.0)


@_device
def _row_stats_range(base, t_safe, lo, hi, NEED_ARGMAX: tl.constexpr,
                     NEED_SOFTMAX: tl.constexpr, NEED_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    """One pass over columns ``[lo, hi)`` of a target row: ``(max, first argmax, max logit,
    sum of exp((l - max) / T), w)`` with ``w`` the raw entropy accumulator; each only when
    asked. A vocabulary split's partials combine with :func:`_merge_stats`."""
    lane = tl.arange(0, BLOCK)
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    best_idx = tl.min(tl.zeros([BLOCK], tl.int32), 0)
    m = best
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    w = s  # sum of e * (z - max z) (logits) or -sum p log p (probs)
    for start in range(lo, hi, BLOCK):
        offs = start + lane
        valid = offs < hi
        x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if NEED_ARGMAX:
            best, best_idx = _chunk_first_argmax(x, offs, best, best_idx, hi)
        if NEED_SOFTMAX:  # online softmax; m is the running raw max logit
            m_new = tl.maximum(m, tl.max(x, 0))
            seen = m > float("-inf")
            zc = (x - m_new) / t_safe  # z - max z, in [-inf, 0] (see _p_chunk)
            e = tl.where(x > float("-inf"), tl.exp(zc), 0.0)
            dz = (tl.where(seen, m, m_new) - m_new) / t_safe  # old max in new units
            scale = tl.where(seen, tl.exp(dz), 0.0)
            if NEED_ENTROPY:  # e == 0 terms are 0 (their zc may be -inf or NaN)
                kept = tl.where(scale > 0, scale * (w + dz * s), 0.0)
                w = kept + tl.sum(e * tl.where(e > 0, zc, 0.0), 0)
            s = s * scale + tl.sum(e, 0)
            m = m_new
        elif NEED_ENTROPY:
            px = tl.where(valid & (x > 0), x, 1.0)  # 1 log 1 = 0 stands in for 0 log 0
            w += tl.sum(-px * tl.log(px), 0)
    return best, best_idx, m, s, w


@_device
def _row_stats(base, t_safe, V, NEED_ARGMAX: tl.constexpr, NEED_SOFTMAX: tl.constexpr,
               NEED_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    """One pass over a target row: ``(first argmax, max logit, sum of exp((l - max) / T),
    entropy)``; each only when asked (the tree kernel reuses it, so chains round alike)."""
    _best, best_idx, m, s, w = _row_stats_range(base, t_safe, 0, V, NEED_ARGMAX, NEED_SOFTMAX,
                                                NEED_ENTROPY, BLOCK)
    if NEED_SOFTMAX:
        w = tl.log(s) - w / s
    return best_idx, m, s, w


@_device
def _merge_stats(acc, part, t_safe, NEED_ARGMAX: tl.constexpr, NEED_SOFTMAX: tl.constexpr,
                 NEED_ENTROPY: tl.constexpr):
    """Two states ``(max, first argmax, max logit, sum, w)`` of adjacent column ranges (``acc``
    first) as one, by the rules of :func:`_row_stats_range`'s chunk fold: strict ``>`` keeps
    the lowest index, the sums rescale to the larger max."""
    best, idx, m, s, w = acc
    best2, idx2, m2, s2, w2 = part
    if NEED_ARGMAX:
        better = best2 > best
        best = tl.where(better, best2, best)
        idx = tl.where(better, idx2, idx)
    if NEED_SOFTMAX:
        m_new = tl.maximum(m, m2)
        dz = (tl.where(m > float("-inf"), m, m_new) - m_new) / t_safe
        dz2 = (tl.where(m2 > float("-inf"), m2, m_new) - m_new) / t_safe
        scale = tl.where(m > float("-inf"), tl.exp(dz), 0.0)
        scale2 = tl.where(m2 > float("-inf"), tl.exp(dz2), 0.0)
        if NEED_ENTROPY:
            w = (tl.where(scale > 0, scale * (w + dz * s), 0.0)
                 + tl.where(scale2 > 0, scale2 * (w2 + dz2 * s2), 0.0))
        s = s * scale + s2 * scale2
        m = m_new
    elif NEED_ENTROPY:
        w = w + w2
    return best, idx, m, s, w


@_device
def _mix32(x):
    """:func:`portable_verify.core.rng.mix32` on uint32 words (products wrap mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * MIX_C1
    x = x ^ (x >> 15)
    x = x * MIX_C2
    return x ^ (x >> 16)


@_device
def _request_key(seed, offset):
    """:func:`portable_verify.core.rng.request_keys` of int64 ``seed`` and ``offset``: their
    32-bit words (upper first) folded into one uint32 key."""
    k = _mix32((seed >> 32).to(tl.uint32) ^ SEED_SALT)
    k = _mix32(seed.to(tl.uint32) ^ k)
    k = _mix32((offset >> 32).to(tl.uint32) ^ k)
    return _mix32(offset.to(tl.uint32) ^ k)


@_device
def _hash_uniform(key, col, K):
    """The counter-hash uniform of column ``col`` of ``K+1`` (``rng.uniforms_numpy``):
    counter ``2 col`` for acceptance columns, the draw counter for column ``K``."""
    ctr = tl.where(col < K, 2 * col, DRAW_COUNTER).to(tl.uint32)
    bits = _mix32(_mix32(key ^ ctr) ^ COUNTER_SALT) >> (32 - UNIFORM_BITS)
    return (bits + 1).to(tl.float32) * UNIFORM_SCALE


@_device
def _row_seed(r, k1, k2):
    """:func:`portable_verify.core.rng.row_seeds` of row ``r`` (uint32) from the host's two
    32-bit words of one int seed."""
    return (_mix32(r ^ k1).to(tl.int64) << 31) ^ _mix32(r ^ k2).to(tl.int64)


@_device
def _int64(x):
    """A scalar argument (which Triton may pass as i32, or specialise to 1) as int64."""
    return tl.full([], 0, tl.int64) + x


@_device
def _span(b, sizes_ptr, sizes_stride, K, SIZES: tl.constexpr, FLAT: tl.constexpr,
          COUNT_MINUS: tl.constexpr, SUM_BLOCK: tl.constexpr):
    """``(n, base)`` of request ``b`` (int64): its draft count as the caller gave it, and where
    its positions start (padded: ``b K``; flat: the exclusive prefix sum of the counts, or the
    cumulative offsets' entry; :data:`SIZE_CODES`)."""
    bb = _int64(b)
    lo = bb * K  # padded: b K
    if SIZES == 0:  # no counts: K each
        n = bb * 0 + K
    elif SIZES == 1:  # counts [B]; flat: the exclusive prefix sum
        n = tl.load(sizes_ptr + bb * sizes_stride).to(tl.int64)
        if FLAT:
            lo = bb * 0
            lane = tl.arange(0, SUM_BLOCK)
            for start in range(0, b, SUM_BLOCK):
                offs = start + lane
                lo += tl.sum(tl.load(sizes_ptr + offs * sizes_stride, mask=offs < b,
                                     other=0).to(tl.int64), 0)
    elif SIZES == 2:  # offsets [B+1] from 0
        lo = tl.load(sizes_ptr + bb * sizes_stride).to(tl.int64)
        n = tl.load(sizes_ptr + (bb + 1) * sizes_stride).to(tl.int64) - lo - COUNT_MINUS
    else:  # inclusive offsets [B] (vLLM v1): no leading 0
        lo = tl.load(sizes_ptr + (bb - 1) * sizes_stride, mask=bb > 0, other=0).to(tl.int64)
        n = tl.load(sizes_ptr + bb * sizes_stride).to(tl.int64) - lo
    base = lo
    return n, base


@_device
def _request_temperature(state, temp_ptr, temp_stride, t_scalar, TEMP: tl.constexpr):
    """float32 temperature of a request (:data:`TEMP_CODES`): the scalar, the caller's value
    (a negative one stays negative, so it never reads as greedy), or 0/1 marks (engines'
    logits arrive tempered: only ``t == 0`` matters)."""
    if TEMP == 0:
        t = tl.full([], 0.0, tl.float32) + t_scalar
    else:
        raw = tl.load(temp_ptr + state * temp_stride)
        if TEMP == 1:
            t = tl.where(raw < 0, -FLOAT32_TINY, raw.to(tl.float32))
        else:
            t = tl.where(raw == 0, 0.0, 1.0)
    return t


@_device
def _cut_drafts(source, b, n_caller, base, K, FLAT: tl.constexpr, DRAFT_SHIFT: tl.constexpr,
                KB: tl.constexpr):
    """``(drafts [KB], count)`` of request ``b``: the drafts the caller counts, and the count
    cut at the first ``-1`` draft (``effective_counts``)."""
    drafts_ptr, d_s0, d_s1, N, _sizes_ptr, _sizes_s = source
    lanes = tl.arange(0, KB)
    live = lanes < tl.minimum(tl.maximum(n_caller, 0), K)
    if FLAT:
        at = tl.minimum(tl.maximum(base + DRAFT_SHIFT + lanes, 0), N - 1)
        d = tl.load(drafts_ptr + at * d_s1, mask=live & (lanes < tl.where(N > 0, K, 0)),
                    other=0).to(tl.int64)
    else:
        d = tl.load(drafts_ptr + b * d_s0 + lanes * d_s1, mask=live, other=0).to(tl.int64)
    first_bad = tl.min(tl.where(live & (d == INVALID_DRAFT), lanes, K), 0)
    n_eff = tl.minimum(n_caller, first_bad.to(tl.int64))
    return d, n_eff


@_kernel
def _layout_kernel(
    source, given, request, randomness, target, work, stats, scalars,
    LAYOUT: tl.constexpr, SOURCES: tl.constexpr, STATS: tl.constexpr, BLOCK: tl.constexpr,
    KB: tl.constexpr, SUM_BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid ``(B, K+1)``: position ``j`` of request ``b`` from what the caller passed.

    Writes the decision's work record (``j == 0``: the count cut at the first ``-1`` draft,
    the caller's count, the temperature; every ``j``: the target row, the draft and its ``q``
    row, the uniform) and, when asked, the target row's statistics (``_row_stats``). The
    switches arrive packed in three constexprs (``spec.LAYOUT_BITS`` etc.)."""
    SIZES: tl.constexpr = LAYOUT % 4
    FLAT: tl.constexpr = LAYOUT // 4 % 2 == 1
    COUNT_MINUS: tl.constexpr = LAYOUT // 8 % 2
    DRAFT_SHIFT: tl.constexpr = LAYOUT // 16 % 2
    BONUS_ROWS: tl.constexpr = LAYOUT // 32 % 2 == 1
    ROWS_GIVEN: tl.constexpr = LAYOUT // 64 % 2 == 1
    QROWS_GIVEN: tl.constexpr = LAYOUT // 128 % 2 == 1
    TEMP: tl.constexpr = SOURCES % 4
    U_SRC: tl.constexpr = SOURCES // 4 % 4
    OFFSETS: tl.constexpr = SOURCES // 16 % 4
    REQ_MAP: tl.constexpr = SOURCES // 64 % 2 == 1
    NEED_ARGMAX: tl.constexpr = STATS % 2 == 1
    NEED_SOFTMAX: tl.constexpr = STATS // 2 % 2 == 1
    NEED_ENTROPY: tl.constexpr = STATS // 4 % 2 == 1
    SPLIT: tl.constexpr = STATS // 8 % 2 == 1
    _drafts_ptr, _d_s0, _d_s1, _N, sizes_ptr, sizes_s = source
    rows_ptr, rows_s0, rows_s1, qrows_ptr, qrows_s0, qrows_s1 = given
    map_ptr, temp_ptr, temp_s, t_scalar = request
    w_drafts, w_rows, w_qrows, w_counts, w_caller, w_temps, w_u, w_ctr = work
    V, K, R, _RQ, _eps, _alpha = scalars
    K1 = K + 1
    b = tl.program_id(0)
    j = tl.program_id(1)
    sp = tl.program_id(2)  # the vocabulary slice [sp CHUNK, (sp + 1) CHUNK) of S
    n_caller, base = _span(b, sizes_ptr, sizes_s, K, SIZES, FLAT, COUNT_MINUS, SUM_BLOCK)
    d, n_eff = _cut_drafts(source, b, n_caller, base, K, FLAT, DRAFT_SHIFT, KB)
    lanes = tl.arange(0, KB)
    n = tl.minimum(tl.maximum(n_eff, 0), K)
    if REQ_MAP:  # noqa: SIM108 - kernel code: constexpr branches
        state = tl.load(map_ptr + b).to(tl.int64)
    else:
        state = _int64(b)
    t = _request_temperature(state, temp_ptr, temp_s, t_scalar, TEMP)
    first = sp == 0  # the work record is written by the first slice's program
    if first & (j == 0):
        tl.store(w_counts + b, n_eff)
        tl.store(w_caller + b, n_caller)
        tl.store(w_temps + b, t)
        tl.store(w_ctr + b, 0)  # the decision's split-draw counter (_split_draw)
    # Position j's target row: the caller's map, or first row + min(j, n).
    if ROWS_GIVEN:
        row = tl.load(rows_ptr + b * rows_s0 + j * rows_s1).to(tl.int64)
    else:
        row = base + j + tl.minimum(tl.maximum(n_caller, 0) - j, 0)
        if BONUS_ROWS:
            row += b
        row = tl.minimum(tl.maximum(row, 0), R - 1)
    if first:
        tl.store(w_rows + b * K1 + j, row)
    if first & (j < K):
        tl.store(w_drafts + b * K + j, tl.sum(tl.where(lanes == j, d, 0), 0))
        if QROWS_GIVEN:
            qrow = tl.load(qrows_ptr + b * qrows_s0 + j * qrows_s1).to(tl.int64)
        else:
            qrow = base + j
        tl.store(w_qrows + b * K + j, qrow)
    _store_uniform(randomness, w_u, b, j, K, state, base, R, first, U_SRC, OFFSETS)
    if NEED_ARGMAX or NEED_SOFTMAX or NEED_ENTROPY:  # noqa: SIM102 - constexpr test
        if j <= n:
            _store_row_stats(target, stats, b * K1 + j, row, R, V, sp, _safe_temperature(t),
                             NEED_ARGMAX, NEED_SOFTMAX, NEED_ENTROPY, SPLIT, BLOCK)


@_device
def _store_uniform(randomness, w_u, b, j, K, state, base, R, first, U_SRC: tl.constexpr,
                   OFFSETS: tl.constexpr):
    """Column ``j``'s uniform of request ``b`` into the work record (first slice only): the
    caller's, or the counter hash of the request's seed and offset (``spec.U_CODES``)."""
    u_ptr, u_s0, u_s1, seed_ptr, seed_s, seed_k1, seed_k2, off_ptr, off_s, off_scalar = randomness
    if U_SRC == 1:  # the caller's uniforms
        tl.store(w_u + b * (K + 1) + j, tl.load(u_ptr + b * u_s0 + j * u_s1).to(tl.float32),
                 mask=first)
    elif U_SRC >= 2:  # the counter hash of the request's seed and offset
        if U_SRC == 2:
            seed = tl.load(seed_ptr + state * seed_s).to(tl.int64)
        else:
            r = b.to(tl.uint32)
            seed = _row_seed(r, _int64(seed_k1).to(tl.uint32), _int64(seed_k2).to(tl.uint32))
        if OFFSETS == 0:
            off = _int64(off_scalar)
        elif OFFSETS == 1:
            off = tl.load(off_ptr + b * off_s).to(tl.int64)
        else:  # at the request's first row (vLLM's Model Runner V2: the position there)
            off = tl.load(off_ptr + tl.minimum(tl.maximum(base, 0), R - 1) * off_s).to(tl.int64)
        u = _hash_uniform(_request_key(seed, off), j, K)
        tl.store(w_u + b * (K + 1) + j, u, mask=first)


@_device
def _store_row_stats(target, stats, out, row, R, V, sp, t_safe, NEED_ARGMAX: tl.constexpr,
                     NEED_SOFTMAX: tl.constexpr, NEED_ENTROPY: tl.constexpr,
                     SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Row statistics of work row ``out`` (target row ``row``): this slice's partial state
    (``SPLIT``: decide merges the ``S`` of them) or the whole row's (``_row_stats``)."""
    target_ptr, target_stride = target
    argmax_ptr, max_ptr, sum_ptr, ent_ptr, part_ptr, part_idx_ptr, S, CHUNK = stats
    row_base = target_ptr + tl.minimum(tl.maximum(row, 0), R - 1) * target_stride
    if SPLIT:  # this slice's partial state; decide merges the S of them
        lo = sp * CHUNK
        best, best_idx, m, s, w = _row_stats_range(
            row_base, t_safe, lo, tl.minimum(lo + CHUNK, V),
            NEED_ARGMAX, NEED_SOFTMAX, NEED_ENTROPY, BLOCK)
        slot = (out * S + sp) * 4
        tl.store(part_ptr + slot, best)
        tl.store(part_ptr + slot + 1, m)
        tl.store(part_ptr + slot + 2, s)
        tl.store(part_ptr + slot + 3, w)
        tl.store(part_idx_ptr + out * S + sp, best_idx)
    else:
        best_idx, m, s, ent = _row_stats(row_base, t_safe, V,
                                         NEED_ARGMAX, NEED_SOFTMAX, NEED_ENTROPY, BLOCK)
        if NEED_ARGMAX:
            tl.store(argmax_ptr + out, best_idx)
        if NEED_SOFTMAX:
            tl.store(max_ptr + out, m)
            tl.store(sum_ptr + out, s)
        if NEED_ENTROPY:
            tl.store(ent_ptr + out, ent)


@_device
def _merged_stats(stats, b, n, t, K1, NEED_ARGMAX: tl.constexpr, NEED_SOFTMAX: tl.constexpr,
                  NEED_ENTROPY: tl.constexpr, KB: tl.constexpr):
    """Merge the ``S`` vocabulary slices' partial states of request ``b``'s rows ``j <= n``
    in slice order (``_merge_stats``) and store the row statistics the decision reads."""
    argmax_ptr, max_ptr, sum_ptr, ent_ptr, part_ptr, part_idx_ptr, S, _CHUNK = stats
    lanes = tl.arange(0, KB)
    live = lanes <= n
    out = b * K1 + lanes
    t_safe = _safe_temperature(t)
    acc = (tl.full([KB], float("-inf"), tl.float32), tl.zeros([KB], tl.int32),
           tl.full([KB], float("-inf"), tl.float32), tl.zeros([KB], tl.float32),
           tl.zeros([KB], tl.float32))
    for sp in range(S):
        at = (out * S + sp) * 4
        part = (tl.load(part_ptr + at, mask=live, other=float("-inf")),
                tl.load(part_idx_ptr + out * S + sp, mask=live, other=0),
                tl.load(part_ptr + at + 1, mask=live, other=float("-inf")),
                tl.load(part_ptr + at + 2, mask=live, other=0.0),
                tl.load(part_ptr + at + 3, mask=live, other=0.0))
        acc = _merge_stats(acc, part, t_safe, NEED_ARGMAX, NEED_SOFTMAX, NEED_ENTROPY)
    _best, best_idx, m, s, w = acc
    if NEED_ARGMAX:
        tl.store(argmax_ptr + out, best_idx, mask=live)
    if NEED_SOFTMAX:
        tl.store(max_ptr + out, m, mask=live)
        tl.store(sum_ptr + out, s, mask=live)
        w = tl.log(s) - w / s
    if NEED_ENTROPY:
        tl.store(ent_ptr + out, w, mask=live)
    tl.debug_barrier()  # the program's own later loads see these stores


@_kernel
def _uniforms_probe_kernel(seed_ptr, off_ptr, out_ptr, count, K, BLOCK: tl.constexpr,
                           KB: tl.constexpr):
    """Test-only: ``out[i, j]`` = the kernels' uniform for ``(seed[i], offset[i])``, column
    ``j`` of ``K+1``, through the same device functions as :func:`_layout_kernel`."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < count
    key = _request_key(tl.load(seed_ptr + i, mask=live, other=0).to(tl.int64),
                       tl.load(off_ptr + i, mask=live, other=0).to(tl.int64))
    col = tl.arange(0, KB)
    u = _hash_uniform(key[:, None], col[None, :], K)
    tl.store(out_ptr + i[:, None] * (K + 1) + col[None, :], u,
             mask=live[:, None] & (col[None, :] <= K))


@_device
def _block_accepted(
    target, draft, stats, scalars, b, n, lanes, tests, t_safe,
    IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr,
):  # fmt: skip
    """Block verification's accepted count ``a`` and the residual's scale ``P_{a-1}``
    (docs/semantics.md): the chain ``P_j`` over the lanes, then the backward scan, which reads
    row ``j+1`` (for ``Z_j``) only where it reaches ``j`` with ``u_j <= P_j``. ``tests`` holds
    the token-wise test's lanes ``(live, p(x), q(x), u)``."""
    target_ptr, target_stride, rows_ptr = target
    drafts_ptr, q_ptr, q_stride, qrows_ptr = draft
    _argmax_ptr, max_ptr, sum_ptr, _ent_ptr, _part, _part_idx, _S, _CHUNK = stats
    V, K, R, RQ, _eps, _alpha = scalars
    live, px, qx, u = tests
    K1 = K + 1
    pxs = tl.where(live, px, 0.0)
    prev = tl.sum(tl.zeros([KB], tl.float32), 0) + 1.0
    chain = tl.zeros([KB], tl.float32)
    for j in range(KB):
        pj = tl.sum(tl.where(lanes == j, pxs, 0.0), 0)
        qj = tl.sum(tl.where(lanes == j, qx, 0.0), 0)
        ratio = tl.minimum(prev * pj / tl.where(qj == 0, 1.0, qj), 1.0)
        prev = tl.where((prev == 0) | (pj == 0), 0.0, tl.where(qj == 0, 1.0, ratio))
        chain = tl.where(lanes == j, prev, chain)
    a = n * 0
    searching = n > 0
    lane = tl.arange(0, BLOCK)
    for jj in range(KB):
        j = KB - 1 - jj
        pj = tl.sum(tl.where(lanes == j, chain, 0.0), 0)
        uj = tl.sum(tl.where(lanes == j, u, 0.0), 0)
        cand = searching & (j < n) & (uj <= pj)
        last = cand & (n == j + 1)
        a = tl.where(last, n, a)
        searching = searching & (last == 0)
        mid = cand & (n > j + 1)
        if mid:  # Z_j from rows j+1 of p and q
            row = _clamped(tl.load(rows_ptr + b * K1 + j + 1), R)
            base = target_ptr + row * target_stride
            if IS_LOGITS:
                m1 = tl.load(max_ptr + b * K1 + j + 1)
                s1 = tl.load(sum_ptr + b * K1 + j + 1)
            else:
                m1 = 0.0
                s1 = 1.0
            x1 = _clamped(tl.load(drafts_ptr + b * K + j + 1), V)
            if HAS_Q:
                qbase = q_ptr + _clamped(tl.load(qrows_ptr + b * K + j + 1), RQ) * q_stride
            z = tl.sum(tl.zeros([BLOCK], tl.float64), 0)
            for start in range(0, V, BLOCK):
                offs = start + lane
                p = _p_chunk(base, offs, V, t_safe, m1, s1, IS_LOGITS)
                if HAS_Q:
                    q = tl.load(qbase + offs, mask=offs < V, other=0.0).to(tl.float32)
                else:
                    q = tl.where(offs == x1, 1.0, 0.0)
                z += tl.sum(tl.maximum(pj * p - q, 0.0).to(tl.float64), 0)
            h = tl.where(z > 0, z / (z + (1.0 - pj.to(tl.float64))), 0.0)
            hit = uj.to(tl.float64) <= h
            a = tl.where(hit, j + 1, a)
            searching = searching & (hit == 0)
    scale = tl.where(a > 0, tl.sum(tl.where(lanes == a - 1, chain, 0.0), 0), 1.0)
    return a, scale


@_device
def _target_prob_at(value_ptr, max_ptr, sum_ptr, mask, t_safe, IS_LOGITS: tl.constexpr):
    """``p(x)`` at the draft lanes: the value itself, or its softmax from the row's max and
    normaliser (``-inf`` logits: 0)."""
    val = tl.load(value_ptr, mask=mask, other=0.0).to(tl.float32)
    if IS_LOGITS:
        m = tl.load(max_ptr, mask=mask, other=0.0)
        s = tl.load(sum_ptr, mask=mask, other=1.0)
        val = tl.where(val > float("-inf"), tl.exp((val - m) / t_safe) / s, 0.0)
    return val


@_device
def _row_argmax(base, t_safe, m_a, s_a, V, IS_LOGITS: tl.constexpr, BLOCK: tl.constexpr):
    """First index of the maximum of one target row's ``p`` (typical's recovered token)."""
    lane = tl.arange(0, BLOCK)
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    best_idx = tl.min(tl.zeros([BLOCK], tl.int32), 0)
    for start in range(0, V, BLOCK):
        offs = start + lane
        p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
        p = tl.where(offs < V, p, float("-inf"))
        best, best_idx = _chunk_first_argmax(p, offs, best, best_idx, V)
    return best_idx


@_device
def _q_chunk(qbase, offs, q_len, x_a, HAS_Q: tl.constexpr):
    """One chunk of the draft row (read only below ``q_len``), or a one-hot at ``x_a``."""
    if HAS_Q:
        q = tl.load(qbase + offs, mask=offs < q_len, other=0.0).to(tl.float32)
    else:
        q = tl.where(offs == x_a, 1.0, 0.0)
    return q



@_device
def _scan_chunk(wgt, offs, carry, threshold, pick, last_pos, V, BLOCK: tl.constexpr):
    """One chunk of the inverse-CDF scan over weights ``wgt`` at ``offs``: ``(pick, last_pos,
    carry)`` with the float64 prefix ``carry`` advanced, ``pick`` the first positive weight whose
    prefix reaches ``threshold`` (kept once found) and ``last_pos`` the last positive one seen
    (the fallback should rounding run past the end)."""
    c = carry + tl.cumsum(wgt.to(tl.float64), 0)
    positive = wgt > 0
    first = tl.min(tl.where(positive & (c >= threshold), offs, V), 0)
    pick = tl.where(first < V, first, pick)
    last_pos = tl.maximum(last_pos, tl.max(tl.where(positive, offs, 0), 0))
    return pick, last_pos, carry + _last_of_cumsum(wgt.to(tl.float64), BLOCK)

@_device
def _final_draw(base, draft, request, scalars, b, a, rejected, scale, t_safe, m_a, s_a,
                IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """The one inverse-CDF draw of a sampled request: from the residual
    ``max(0, scale * p - q)`` at a rejection, else (bonus, empty residual) from ``p``."""
    drafts_ptr, q_ptr, q_stride, qrows_ptr = draft
    _counts_ptr, _temp_ptr, u_ptr = request
    V, K, _R, RQ, _eps, _alpha = scalars
    K1 = K + 1
    lane = tl.arange(0, BLOCK)
    zero = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    # Weights: residual max(0, p - q) at a rejection, else (bonus / empty residual) p.
    x_a = tl.load(drafts_ptr + b * K + a, mask=rejected, other=-1)  # -1: no one-hot
    qbase = q_ptr
    if HAS_Q:
        qrow_a = _clamped(tl.load(qrows_ptr + b * K + a, mask=rejected, other=0), RQ)
        qbase = q_ptr + qrow_a * q_stride
    q_len = tl.where(rejected, V, 0)  # q is read only at a rejection
    # Prefix sums accumulate in float64 (docs/semantics.md, inverse-CDF draw).
    total_r = zero.to(tl.float64)
    total_p = zero.to(tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + lane
        p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
        q = _q_chunk(qbase, offs, q_len, x_a, HAS_Q)
        r = tl.where(rejected, tl.maximum(scale * p - q, 0.0), 0.0)
        total_r += _last_of_cumsum(r.to(tl.float64), BLOCK)
        total_p += _last_of_cumsum(p.to(tl.float64), BLOCK)
    use_r = rejected & (total_r > 0)
    q_len = tl.where(use_r, V, 0)
    v_draw = tl.load(u_ptr + b * K1 + K).to(tl.float64)
    threshold = v_draw * tl.where(use_r, total_r, total_p)
    # Smallest t with cumsum[t] >= threshold and w[t] > 0; the w > 0 guard and the
    # last-positive fallback keep the pick valid whatever the scan's rounding.
    carry = zero.to(tl.float64)
    pick = tl.min(tl.full([BLOCK], -1, tl.int32), 0)
    last_pos = pick * 0
    start = pick * 0
    while (start < V) & (pick < 0):
        offs = start + lane
        p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
        q = _q_chunk(qbase, offs, q_len, x_a, HAS_Q)
        wgt = tl.where(use_r, tl.maximum(scale * p - q, 0.0), p)
        pick, last_pos, carry = _scan_chunk(wgt, offs, carry, threshold, pick, last_pos, V,
                                            BLOCK)
        start += BLOCK
    return tl.where(pick >= 0, pick, last_pos)


@_device
def _row_a(target, stats, scalars, b, a, IS_LOGITS: tl.constexpr):
    """``(row pointer, max logit, normaliser)`` of request ``b``'s target row at position
    ``a`` (probabilities: 0 and 1)."""
    target_ptr, target_stride, rows_ptr = target
    _argmax_ptr, max_ptr, sum_ptr, _ent_ptr, _part, _part_idx, _S, _CHUNK = stats
    _V, K, R, _RQ, _eps, _alpha = scalars
    stat_a = b * (K + 1) + a
    base = target_ptr + _clamped(tl.load(rows_ptr + stat_a), R) * target_stride
    if IS_LOGITS:
        m_a = tl.load(max_ptr + stat_a)
        s_a = tl.load(sum_ptr + stat_a)
    else:
        m_a = 0.0
        s_a = 1.0
    return base, m_a, s_a


@_device
def _draw_partial(target, draft, stats, scalars, draw, b, decision, IS_LOGITS: tl.constexpr,
                  HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """This program's ``BLOCK`` of the draw's weights, as :func:`_final_draw` reads it: the
    float64 block sums of the residual and of ``p`` (``_last_of_cumsum``), the largest
    in-block prefix at a positive weight and the last positive index, stored for the last
    program of the request (:func:`_draw_from_partials`); ``decision`` is ``(a, rejected,
    scale, t_safe)``."""
    a, rejected, scale, t_safe = decision
    dpart_ptr, dpos_ptr, _ctr_ptr, D = draw
    V = scalars[0]
    base, m_a, s_a = _row_a(target, stats, scalars, b, a, IS_LOGITS)
    qbase, x_a = _draw_q(draft, scalars, b, a, rejected, HAS_Q)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
    q = _q_chunk(qbase, offs, tl.where(rejected, V, 0), x_a, HAS_Q)
    r = tl.where(rejected, tl.maximum(scale * p - q, 0.0), 0.0)
    slot = b * D + tl.program_id(1)
    _store_partial(dpart_ptr, dpos_ptr, slot, 0, r, offs, BLOCK)
    _store_partial(dpart_ptr, dpos_ptr, slot, 1, p, offs, BLOCK)


@_device
def _store_partial(dpart_ptr, dpos_ptr, slot, which, w, offs, BLOCK: tl.constexpr):
    """One weighting's block partial (``which`` 0: residual, 1: ``p``), see
    :func:`_draw_partial`."""
    w64 = w.to(tl.float64)
    top = tl.max(tl.where(w > 0, tl.cumsum(w64, 0), float("-inf")), 0)
    tl.store(dpart_ptr + slot * 4 + which, _last_of_cumsum(w64, BLOCK))
    tl.store(dpart_ptr + slot * 4 + 2 + which, top)
    tl.store(dpos_ptr + slot * 2 + which, tl.max(tl.where(w > 0, offs, 0), 0))


@_device
def _nth(x, lanes, i):
    """Lane ``i`` of ``x`` (a sum of it and zeros: exact)."""
    return tl.sum(tl.where(lanes == i, x, 0.0), 0)


@_device
def _draw_from_partials(target, draft, request, stats, scalars, draw, b, decision,
                        IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, BLOCK: tl.constexpr,
                        DB: tl.constexpr):
    """:func:`_final_draw`'s token from the ``D`` programs' block partials, bit for bit: the
    totals and carries add the float64 block sums in block order from 0 as its passes do; the
    pick lies in the first block whose carry plus largest positive prefix reaches the
    threshold (rounding is monotone), which alone is scanned; none: the last positive index."""
    a, rejected, scale, t_safe = decision
    dpart_ptr, dpos_ptr, _ctr_ptr, D = draw
    V, K, _R, _RQ, _eps, _alpha = scalars
    lanes = tl.arange(0, DB)
    live = lanes < D
    at = b * D + lanes
    c_r = tl.load(dpart_ptr + at * 4, mask=live, other=0.0, volatile=True)
    c_p = tl.load(dpart_ptr + at * 4 + 1, mask=live, other=0.0, volatile=True)
    zero = tl.sum(tl.zeros([DB], tl.float64), 0)
    total_r = zero
    total_p = zero
    for i in range(0, D):
        total_r += _nth(c_r, lanes, i)
        total_p += _nth(c_p, lanes, i)
    use_r = rejected & (total_r > 0)
    sel = tl.where(use_r, 0, 1)
    c_w = tl.where(use_r, c_r, c_p)
    top = tl.load(dpart_ptr + at * 4 + 2 + sel, mask=live, other=float("-inf"), volatile=True)
    last_pos = tl.max(tl.load(dpos_ptr + at * 2 + sel, mask=live, other=0, volatile=True), 0)
    v_draw = tl.load(request[2] + b * (K + 1) + K).to(tl.float64)
    threshold = v_draw * tl.where(use_r, total_r, total_p)
    carry = zero
    hit_block = tl.min(tl.full([DB], -1, tl.int32), 0)
    hit_carry = zero
    for i in range(0, D):
        hit = (hit_block < 0) & (carry + _nth(top, lanes, i) >= threshold)
        hit_block = tl.where(hit, i, hit_block)
        hit_carry = tl.where(hit, carry, hit_carry)
        carry += _nth(c_w, lanes, i)
    pick = hit_block * 0 - 1
    if hit_block >= 0:
        base, m_a, s_a = _row_a(target, stats, scalars, b, a, IS_LOGITS)
        qbase, x_a = _draw_q(draft, scalars, b, a, rejected, HAS_Q)
        offs = hit_block * BLOCK + tl.arange(0, BLOCK)
        p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
        q = _q_chunk(qbase, offs, tl.where(use_r, V, 0), x_a, HAS_Q)
        wgt = tl.where(use_r, tl.maximum(scale * p - q, 0.0), p)
        pick, _last, _carry = _scan_chunk(wgt, offs, hit_carry, threshold, pick, last_pos, V,
                                          BLOCK)
    return tl.where(pick >= 0, pick, last_pos)


@_device
def _draw_q(draft, scalars, b, a, rejected, HAS_Q: tl.constexpr):
    """``(q row pointer, one-hot index)`` of the draft at position ``a`` (-1: no one-hot)."""
    drafts_ptr, q_ptr, q_stride, qrows_ptr = draft
    _V, K, _R, RQ, _eps, _alpha = scalars
    x_a = tl.load(drafts_ptr + b * K + a, mask=rejected, other=-1)
    qbase = q_ptr
    if HAS_Q:
        qrow_a = _clamped(tl.load(qrows_ptr + b * K + a, mask=rejected, other=0), RQ)
        qbase = q_ptr + qrow_a * q_stride
    return qbase, x_a


@_device
def _split_draw(target, draft, request, stats, scalars, draw, b, decision, greedy, final,
                IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, BLOCK: tl.constexpr,
                DB: tl.constexpr):
    """``(token, last)``: every program of request ``b`` stores its block's partials, then
    takes the request's counter; the last to arrive draws from them all (no program waits on
    another) and resets the counter (the layout launch zeroed it)."""
    ctr_ptr = draw[2]
    D = draw[3]
    if greedy == 0:
        _draw_partial(target, draft, stats, scalars, draw, b, decision, IS_LOGITS, HAS_Q,
                      BLOCK)
    tl.debug_barrier()  # every thread's stores precede the release below
    done = tl.atomic_add(ctr_ptr + b, 1, sem="acq_rel")
    last = done == D - 1
    if last:
        tl.store(ctr_ptr + b, 0)
        if greedy == 0:
            final = _draw_from_partials(target, draft, request, stats, scalars, draw, b,
                                        decision, IS_LOGITS, HAS_Q, BLOCK,
                                        DB).to(final.dtype)
    return final, last


@_device
def _sampled_token(target, draft, request, stats, scalars, b, a, rejected, scale, t_safe,
                   IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, TYPICAL: tl.constexpr,
                   BLOCK: tl.constexpr):
    """A sampled row's token after its accepted prefix ``a``: typical's recovered token (the
    argmax of ``p_a``) at a rejection, else the one inverse-CDF draw (:func:`_final_draw`)."""
    V = scalars[0]
    base, m_a, s_a = _row_a(target, stats, scalars, b, a, IS_LOGITS)
    final = a * 0
    do_draw = rejected == 0
    if not TYPICAL:
        do_draw = rejected == rejected
    if TYPICAL:  # noqa: SIM102 - a constexpr test around a run-time one
        if rejected:  # recovered token: argmax of p_a, lowest index on ties
            final = _row_argmax(base, t_safe, m_a, s_a, V, IS_LOGITS, BLOCK).to(final.dtype)
    if do_draw:
        final = _final_draw(base, draft, request, scalars, b, a, rejected, scale, t_safe,
                            m_a, s_a, IS_LOGITS, HAS_Q, BLOCK).to(final.dtype)
    return final


@_device
def _sampled_tests(target, draft, request, stats, scalars, b, x, sampled, t_safe,
                   IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, HAS_U: tl.constexpr,
                   TYPICAL: tl.constexpr, KB: tl.constexpr):
    """``(ok, p(x), q(x), u)`` of the sampled draft lanes: typical's bar, or the token-wise
    rejection test ``u q(x) <= p(x)`` (``q(x) = 1`` without draft rows)."""
    target_ptr, target_stride, rows_ptr = target
    _drafts_ptr, q_ptr, q_stride, qrows_ptr = draft
    _counts_ptr, _temp_ptr, u_ptr = request
    _argmax_ptr, max_ptr, sum_ptr, ent_ptr, _part, _part_idx, _S, _CHUNK = stats
    _V, K, R, RQ, eps, alpha = scalars
    K1 = K + 1
    lanes = tl.arange(0, KB)
    stat = b * K1 + lanes
    qx = 1.0
    u = 1.0
    row = _clamped(tl.load(rows_ptr + b * K1 + lanes, mask=sampled, other=0), R)
    px = _target_prob_at(target_ptr + row * target_stride + x, max_ptr + stat, sum_ptr + stat,
                         sampled, t_safe, IS_LOGITS)
    if TYPICAL:
        h = tl.load(ent_ptr + stat, mask=sampled, other=0.0)
        ok_s = px > _typical_threshold(h, eps, alpha)
    else:
        if HAS_U:  # noqa: SIM108
            u = tl.load(u_ptr + b * K1 + lanes, mask=sampled, other=1.0)
        else:
            u = 1.0
        if HAS_Q:
            qrow = _clamped(tl.load(qrows_ptr + b * K + lanes, mask=sampled, other=0), RQ)
            qx = tl.load(q_ptr + qrow * q_stride + x, mask=sampled, other=0.0).to(tl.float32)
        else:
            qx = 1.0
        ok_s = (px > 0) & (u * qx <= px)
    return ok_s, px, qx, u


@_device
def _write_outputs(out, bonus, drafts_ptr, b, a, final, V, K, HAS_BONUS: tl.constexpr,
                   RULE: tl.constexpr, KB: tl.constexpr):
    """Request ``b``'s ``[K+1]`` token row (accepted drafts, then ``final`` or the caller's
    bonus token, then placeholders) and its counters."""
    tokens_ptr, accepted_ptr, emitted_ptr = out
    bonus_ptr, bonus_stride, caller_ptr = bonus
    K1 = K + 1
    lanes = tl.arange(0, KB)
    final = tl.minimum(tl.maximum(final, 0), V - 1).to(tl.int64)
    if HAS_BONUS:  # the caller's bonus token where every draft it counted was accepted
        all_in = a.to(tl.int64) == tl.load(caller_ptr + b)
        final = tl.where(all_in, tl.load(bonus_ptr + b * bonus_stride).to(tl.int64), final)
    d = _clamped(tl.load(drafts_ptr + b * K + lanes, mask=lanes < a, other=0), V)
    tok = tl.where(lanes < a, d, tl.where(lanes == a, final, PLACEHOLDER))
    if (RULE != RULE_REJECTION) and (RULE != RULE_TYPICAL) and (RULE != RULE_BLOCK):
        # a code declared in spec.RULE_CODES without a branch here: flagged, never decided
        # as another rule
        tok = tl.where(lanes < 0, tok, PLACEHOLDER)
        a = a * 0 - 1
    tl.store(tokens_ptr + b * K1 + lanes, tok, mask=lanes < K1)
    tl.store(accepted_ptr + b, a)
    tl.store(emitted_ptr + b, a + 1)


@_kernel
def _decide_kernel(
    target, draft, request, stats, out, bonus, scalars, draw,
    FLAGS: tl.constexpr, RULE: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr,
    DB: tl.constexpr,
):  # fmt: skip
    """Grid ``(B, D)``: one request's accepted prefix, its next token (the caller's bonus token
    where every draft it counted was accepted), its output row and counters. ``SPLIT_DRAW``:
    the ``D`` programs of a request each read one ``BLOCK`` of the draw (``_split_draw``);
    else ``D = 1``.

    ``RULE``: the sampled rows' rule (``spec.RULE_CODES``); an unknown code writes the flag
    ``num_accepted = -1`` and a row of placeholders instead of deciding. ``FLAGS``: the host
    facts (``spec.DECIDE_BITS``)."""
    IS_LOGITS: tl.constexpr = FLAGS % 2 == 1
    HAS_Q: tl.constexpr = FLAGS // 2 % 2 == 1
    HAS_U: tl.constexpr = FLAGS // 4 % 2 == 1
    HAS_GREEDY: tl.constexpr = FLAGS // 8 % 2 == 1
    HAS_BONUS: tl.constexpr = FLAGS // 16 % 2 == 1
    SPLIT: tl.constexpr = FLAGS // 32 % 2 == 1
    SPLIT_DRAW: tl.constexpr = FLAGS // 64 % 2 == 1
    TYPICAL: tl.constexpr = RULE == RULE_TYPICAL
    BLOCK_VERIFY: tl.constexpr = RULE == RULE_BLOCK
    drafts_ptr, _q_ptr, _q_stride, _qrows_ptr = draft
    counts_ptr, temp_ptr, _u_ptr = request
    argmax_ptr, _max, _sum, _ent, _part, _part_idx, _S, _CHUNK = stats
    V, K, _R, _RQ, _eps, _alpha = scalars
    b = tl.program_id(0)
    K1 = K + 1
    n = _clamped(tl.load(counts_ptr + b), K1)  # so num_accepted <= K whatever the caller sent
    t = tl.load(temp_ptr + b)
    t_safe = _safe_temperature(t)
    if HAS_GREEDY:  # noqa: SIM108 - kernel code: constexpr branches, not Python ternaries
        greedy = t == 0
    else:
        greedy = t != t  # all False; written as a tensor so both branches share a type
    if not HAS_U:
        greedy = t == t  # no uniforms: every row is greedy
    if SPLIT:  # the layout launch left per-slice partial row statistics
        _merged_stats(stats, b, n, t, K1, HAS_GREEDY, IS_LOGITS & HAS_U, TYPICAL, KB)

    # Accepted prefix: every position's test at once (K is small), then the first failure.
    lanes = tl.arange(0, KB)
    # Row-kind masks as lane bounds (n for this row's kind, else 0): a scalar condition is
    # never broadcast into a vector mask, which Triton's interpreter mishandles.
    has_draft = lanes < n
    greedy_draft = lanes < tl.where(greedy, n, 0)
    sampled = lanes < tl.where(greedy, 0, n)
    x_raw = tl.load(drafts_ptr + b * K + lanes, mask=has_draft, other=0)
    in_vocab = (x_raw >= 0) & (x_raw < V)  # an id outside the vocabulary is never accepted
    x = _clamped(x_raw, V)
    stat = b * K1 + lanes
    if HAS_GREEDY:
        g = tl.load(argmax_ptr + stat, mask=greedy_draft, other=-1)
        ok_g = x == g
    else:
        ok_g = x != x  # all False
    ok_s, px, qx, u = _sampled_tests(target, draft, request, stats, scalars, b, x, sampled,
                                     t_safe, IS_LOGITS, HAS_Q, HAS_U, TYPICAL, KB)
    ok = ((greedy_draft & ok_g) | (sampled & ok_s)) & in_vocab
    a = tl.min(tl.where(ok, KB, lanes), 0).to(n.dtype)  # lanes >= n are never ok, so a <= n
    scale = tl.sum(tl.zeros([BLOCK], tl.float32), 0) + 1.0  # P_{a-1}: 1 outside block
    if BLOCK_VERIFY:  # sampled rows: block verification's a (greedy rows keep the prefix)
        a_blk, scale = _block_accepted(target, draft, stats, scalars, b, n, lanes,
                                       (sampled & in_vocab, px, qx, u), t_safe,
                                       IS_LOGITS, HAS_Q, BLOCK, KB)
        a = tl.where(greedy, a, a_blk)

    rejected = a < n
    stat_a = b * K1 + a
    final = n * 0
    if HAS_GREEDY:
        final = tl.load(argmax_ptr + stat_a, mask=greedy, other=0).to(final.dtype)
    if SPLIT_DRAW:
        final, writer = _split_draw(target, draft, request, stats, scalars, draw, b,
                                    (a, rejected, scale, t_safe), greedy, final, IS_LOGITS,
                                    HAS_Q, BLOCK, DB)
    else:
        if greedy == 0:
            final = _sampled_token(target, draft, request, stats, scalars, b, a, rejected,
                                   scale, t_safe, IS_LOGITS, HAS_Q, TYPICAL,
                                   BLOCK).to(final.dtype)
        writer = tl.program_id(1) == 0
    if writer:
        _write_outputs(out, bonus, drafts_ptr, b, a, final, V, K, HAS_BONUS, RULE, KB)


KERNELS_INTERPRETED: bool = not isinstance(_decide_kernel, triton.runtime.jit.JITFunction)
"""True when TRITON_INTERPRET=1 was set as this module loaded: even GPU launches interpret."""


_COMPILE_OPTIONS = {"enable_fp_fusion": False}
"""No fused multiply-adds: float32 results round like the reference's separate operations."""


def _block(v: int, cap: int) -> int:
    return max(16, min(triton.next_power_of_2(v), cap))


def verify_triton(inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_ids, num_accepted)`` of completed inputs (the validated path)."""
    inputs.check_layout()
    tokens, accepted, _emitted, _counts = launch(spec.from_inputs(inputs))
    return tokens, accepted


def launch(call: spec.ChainSpec) -> tuple[torch.Tensor, ...]:
    """``(token_ids [B, K+1], num_accepted, num_emitted, num_draft_tokens [B])`` of one chain
    call: two launches (``_layout_kernel``, ``_decide_kernel``), no other device op. The host
    allocates the outputs and the work record; the kernels compute the rest (CPU tensors run
    in the interpreted copy of this module, see ``interpreter.py``)."""
    interpreted = _INTERPRET or KERNELS_INTERPRETED
    mod = sys.modules[__name__]
    b, k = call.b, call.k
    k1 = k + 1
    target = _rows_contiguous(call.target, interpreted)
    device = target.device
    # One int64 buffer: the work record (drafts, rows, q rows, caller's counts) and the
    # counters the caller gets back (views of it); one float32 buffer for the rest.
    i64 = torch.empty(b * (3 * k + 1) + 4 * b + 1, dtype=torch.int64, device=device)
    f32 = torch.empty(b * (4 * k1 + 1), dtype=torch.float32, device=device)
    argmax = torch.empty(b * k1 + 1 + b, dtype=torch.int32, device=device)
    tokens = torch.empty((b, k1), dtype=call.tokens_dtype, device=device)
    w_drafts, w_rows, w_qrows = i64[:b * k], i64[b * k:b * (2 * k + 1)], i64[b * (2 * k + 1):]
    w_caller = i64[b * (3 * k + 1):b * (3 * k + 2)]
    accepted = i64[b * (3 * k + 2):b * (3 * k + 3)]
    counts = i64[b * (3 * k + 3):b * (3 * k + 4)]
    emitted = (i64[b * (3 * k + 4):b * (3 * k + 5)] if call.emitted_dtype is torch.int64
               else torch.empty(b, dtype=call.emitted_dtype, device=device))
    if b == 0:
        return tokens, accepted, emitted, counts
    rule = 0 if call.all_greedy else spec.rule_code(call.options.sampled_method)
    typical = rule == spec.RULE_CODES["typical"]
    has_greedy = not call.none_greedy
    need_softmax = call.is_logits and not call.all_greedy
    v = target.shape[1]
    stats_block = _block(v, 1024 if interpreted else 2048)
    splits, chunk = vocabulary_split(b * k1, v, stats_block, interpreted,
                                     has_greedy or need_softmax or typical)
    part = torch.empty(b * k1 * splits * 4 if splits > 1 else 1, dtype=torch.float32,
                       device=device)
    part_idx = torch.empty(b * k1 * splits if splits > 1 else 1, dtype=torch.int32,
                           device=device)
    temps, w_u = f32[:b], f32[b:b + b * k1]
    stats = (argmax[:b * k1 + 1], f32[b + b * k1:b + 2 * b * k1],
             f32[b + 2 * b * k1:b + 3 * b * k1], f32[b + 3 * b * k1:], part, part_idx, splits,
             chunk)
    q = None if call.q is None else _rows_contiguous(call.q, interpreted)
    rq = 1 if q is None else q.shape[0]
    eps, alpha = call.options.typical.kernel_scalars()
    scalars = (v, k, target.shape[0], rq, eps, alpha)
    kb = max(2, triton.next_power_of_2(k1))

    ctr = argmax[b * k1 + 1:]  # zeroed by the layout launch: no device op of its own
    work = (w_drafts, w_rows, w_qrows, counts, w_caller, temps, w_u, ctr)
    _launch_layout(mod, call, target, i64, work, stats, scalars,
                   (has_greedy, need_softmax, typical), kb, interpreted)
    bonus = call.bonus
    block = _block(v, 1024 if interpreted else 2048)
    d = -(-v // block) if rule == spec.RULE_CODES["rejection"] and not call.all_greedy else 1
    dpart = torch.empty(b * d * 4 if d > 1 else 1, dtype=torch.float64, device=device)
    dpos = torch.empty(b * d * 2 if d > 1 else 1, dtype=torch.int32, device=device)
    mod._decide_kernel[(b, d)](
        (target, target.stride(0), w_rows),
        (w_drafts, target if q is None else q, 0 if q is None else q.stride(0), w_qrows),
        (counts, temps, w_u), stats, (tokens, accepted, emitted),
        (_ptr(bonus, i64), _stride(bonus), w_caller), scalars, (dpart, dpos, ctr, d),
        FLAGS=spec.pack(spec.DECIDE_BITS, IS_LOGITS=call.is_logits, HAS_Q=q is not None,
                        HAS_U=not call.all_greedy, HAS_GREEDY=has_greedy,
                        HAS_BONUS=bonus is not None, SPLIT=splits > 1, SPLIT_DRAW=d > 1),
        RULE=rule, BLOCK=block, KB=kb, DB=max(2, triton.next_power_of_2(d)),
        **({} if interpreted else {"num_warps": 4, **_COMPILE_OPTIONS}),
    )  # fmt: skip
    return tokens, accepted, emitted, counts


def _ptr(x: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """``x``, or ``stand_in`` for an absent or empty tensor (never read)."""
    return stand_in if x is None or x.numel() == 0 else x


def _stride(x: Any, dim: int = 0) -> int:
    return x.stride(dim) if isinstance(x, torch.Tensor) and x.dim() > dim else 0


def _launch_layout(mod: Any, call: spec.ChainSpec, target: torch.Tensor, i64: torch.Tensor,
                   work: tuple, stats: tuple, scalars: tuple, needs: tuple[bool, bool, bool],
                   kb: int, interpreted: bool) -> None:
    """The first launch, ``_layout_kernel`` (grid ``(B, K+1, S)``): the work record and the
    target rows' statistics (``i64`` stands in for every absent tensor: never read)."""
    def ptr(x: torch.Tensor | None) -> torch.Tensor:
        return _ptr(x, i64)

    splits = stats[6]
    v = scalars[0]
    has_greedy, need_softmax, typical = needs
    stats_block = _block(v, 1024 if interpreted else 2048)
    drafts = call.drafts
    d_s0, d_s1 = (0, _stride(drafts)) if call.flat else (_stride(drafts), _stride(drafts, 1))
    u_kind = call.u_kind
    seeds = call.seeds
    k_words = spec.row_seed_words(seeds) if u_kind == "seed_int" else (0, 0)
    seed_t = seeds if isinstance(seeds, torch.Tensor) else None
    off_t = call.offsets if isinstance(call.offsets, torch.Tensor) else None
    temp_t = call.temperature if isinstance(call.temperature, torch.Tensor) else None
    rows, qrows, u = call.rows, call.q_rows, call.uniforms
    mod._layout_kernel[(call.b, call.k + 1, splits)](
        (ptr(drafts), d_s0, d_s1, drafts.shape[0] if call.flat else call.b, ptr(call.sizes),
         _stride(call.sizes)),
        (ptr(rows), _stride(rows), _stride(rows, 1), ptr(qrows), _stride(qrows), _stride(qrows, 1)),
        (ptr(call.request_map), ptr(temp_t), _stride(temp_t),
         call.temperature if temp_t is None else 0.0),
        (ptr(u), _stride(u), _stride(u, 1), ptr(seed_t), _stride(seed_t), k_words[0], k_words[1],
         ptr(off_t), _stride(off_t), call.offsets if off_t is None else 0),
        (target, target.stride(0)),
        work, stats, scalars,
        LAYOUT=spec.pack(spec.LAYOUT_BITS, SIZES=spec.SIZE_CODES[call.sizes_kind],
                         FLAT=call.flat, COUNT_MINUS=call.count_minus,
                         DRAFT_SHIFT=call.draft_shift, BONUS_ROWS=call.bonus_rows,
                         ROWS_GIVEN=rows is not None, QROWS_GIVEN=qrows is not None),
        SOURCES=spec.pack(spec.SOURCE_BITS, TEMP=spec.TEMP_CODES[call.temp_kind],
                          U_SRC=spec.U_CODES[u_kind],
                          OFFSETS=spec.OFFSET_CODES[call.offset_kind],
                          REQ_MAP=call.request_map is not None),
        STATS=spec.pack(spec.STATS_BITS, NEED_ARGMAX=has_greedy,
                        NEED_SOFTMAX=need_softmax, NEED_ENTROPY=typical, SPLIT=splits > 1),
        BLOCK=_block(v, 1024 if interpreted else 4096) if splits == 1 else stats_block, KB=kb,
        SUM_BLOCK=256,
        **({} if interpreted else {"num_warps": 8, **_COMPILE_OPTIONS}),
    )  # fmt: skip


TARGET_PROGRAMS = 256
"""Row-statistics programs a GPU launch aims at (about two per SM of a large GPU): fewer
rows than this split each row's vocabulary among programs."""
INTERPRETED_SPLITS = 2
"""The interpreter runs programs one after another: it splits a long row in two, enough to
exercise the merge."""


def vocabulary_split(rows: int, v: int, block: int, interpreted: bool,
                     needed: bool) -> tuple[int, int]:
    """``(S, CHUNK)``: each of ``rows`` target rows is read by ``S`` programs, one slice of
    ``CHUNK`` columns each (a multiple of ``block``), so a small batch still fills the GPU."""
    chunks = -(-v // block)
    if not needed or chunks == 1:
        return 1, v
    want = INTERPRETED_SPLITS if interpreted else -(-TARGET_PROGRAMS // rows)
    per_slice = -(-chunks // max(1, min(chunks, want)))
    chunk = per_slice * block
    return -(-v // chunk), chunk


def _rows_contiguous(x: torch.Tensor, interpreted_kernels: bool) -> torch.Tensor:
    """Rows with unit stride along V; the interpreter (numpy) gets float32 (exact upcast)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if interpreted_kernels and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x
