"""Triton kernels for every method (greedy, rejection, typical, block) and their launcher.

Design (docs/backends.md, "CUDA, XPU and Triton"): at most two launches per call, no host sync.

1. ``_row_stats_kernel``, grid ``(B, K+1)``: one program per (request, position) reads its target
   row once, in ``BLOCK``-sized chunks, and keeps what the decision needs: the first argmax (for
   greedy rows), the online max and sum of ``exp(z - max)`` (logits), the entropy (typical).
   Positions past a request's ``n`` exit at once. Skipped entirely when nothing needs it
   (probabilities in, no greedy row, rejection).
2. ``_decide_kernel``, grid ``(B,)``: one program per request tests its ``n`` positions at once
   (gathers of ``p(x)``, ``q(x)``, uniforms), takes the accepted prefix ``a``, then reads the ONE
   row it needs: the argmax of ``p_a`` (typical rejection), or the residual/target row for the
   inverse-CDF draw (two chunked passes: the total, then a scan that stops at the pick). It
   writes the ``[K+1]`` output row (-1 padded) and ``a``.

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

from portable_verify.backends.triton.interpreter import InterpretedDevice
from portable_verify.core import constants
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs

_INTERPRET: bool = bool(globals().get("_INTERPRET", False))  # injected by the interpreter copy
PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN_ID)
FLOAT32_TINY = tl.constexpr(constants.FLOAT32_TINY)
FLOAT32_MAX = tl.constexpr(constants.FLOAT32_MAX)
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
def _row_stats(base, t_safe, V, NEED_ARGMAX: tl.constexpr, NEED_SOFTMAX: tl.constexpr,
               NEED_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    """One pass over a target row: ``(first argmax, max logit, sum of exp((l - max) / T),
    entropy)``; each only when asked (the tree kernel reuses it, so chains round alike)."""
    lane = tl.arange(0, BLOCK)
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    best_idx = tl.min(tl.zeros([BLOCK], tl.int32), 0)
    m = best
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    w = s  # sum of e * (z - max z) (logits) or -sum p log p (probs)
    for start in range(0, V, BLOCK):
        offs = start + lane
        valid = offs < V
        x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if NEED_ARGMAX:
            best, best_idx = _chunk_first_argmax(x, offs, best, best_idx, V)
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
    if NEED_SOFTMAX:
        w = tl.log(s) - w / s
    return best_idx, m, s, w


@_kernel
def _row_stats_kernel(
    target, request, stats, scalars,
    IS_LOGITS: tl.constexpr, NEED_ARGMAX: tl.constexpr, NEED_SOFTMAX: tl.constexpr,
    NEED_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid ``(B, K+1)``: one target row's statistics per (request, position)."""
    target_ptr, target_stride, rows_ptr = target
    counts_ptr, temp_ptr, _u_ptr = request
    argmax_ptr, max_ptr, sum_ptr, ent_ptr = stats
    V, K, R, _RQ, _eps, _alpha = scalars
    K1 = K + 1
    b = tl.program_id(0)
    j = tl.program_id(1)
    n = _clamped(tl.load(counts_ptr + b), K1)  # every index from caller data is clamped
    if j <= n:
        row = _clamped(tl.load(rows_ptr + b * K1 + j), R)
        base = target_ptr + row * target_stride
        t_safe = _safe_temperature(tl.load(temp_ptr + b))
        best_idx, m, s, ent = _row_stats(base, t_safe, V, NEED_ARGMAX, NEED_SOFTMAX, NEED_ENTROPY,
                                         BLOCK)
        out = b * K1 + j
        if NEED_ARGMAX:
            tl.store(argmax_ptr + out, best_idx)
        if NEED_SOFTMAX:
            tl.store(max_ptr + out, m)
            tl.store(sum_ptr + out, s)
        if NEED_ENTROPY:
            tl.store(ent_ptr + out, ent)


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
    _argmax_ptr, max_ptr, sum_ptr, _ent_ptr = stats
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
def _sampled_token(target, draft, request, stats, scalars, b, a, rejected, scale, t_safe,
                   IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, TYPICAL: tl.constexpr,
                   BLOCK: tl.constexpr):
    """A sampled row's token after its accepted prefix ``a``: typical's recovered token (the
    argmax of ``p_a``) at a rejection, else the one inverse-CDF draw (:func:`_final_draw`)."""
    target_ptr, target_stride, rows_ptr = target
    _argmax_ptr, max_ptr, sum_ptr, _ent_ptr = stats
    V, K, R, _RQ, _eps, _alpha = scalars
    stat_a = b * (K + 1) + a
    base = target_ptr + _clamped(tl.load(rows_ptr + stat_a), R) * target_stride
    if IS_LOGITS:
        m_a = tl.load(max_ptr + stat_a)
        s_a = tl.load(sum_ptr + stat_a)
    else:
        m_a = 0.0
        s_a = 1.0
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


@_kernel
def _decide_kernel(
    target, draft, request, stats, out, scalars,
    IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, HAS_U: tl.constexpr,
    HAS_GREEDY: tl.constexpr, TYPICAL: tl.constexpr, BLOCK_VERIFY: tl.constexpr,
    BLOCK: tl.constexpr, KB: tl.constexpr,
):  # fmt: skip
    """Grid ``(B,)``: one request's accepted prefix, its next token, and its output row."""
    target_ptr, target_stride, rows_ptr = target
    drafts_ptr, q_ptr, q_stride, qrows_ptr = draft
    counts_ptr, temp_ptr, u_ptr = request
    argmax_ptr, max_ptr, sum_ptr, ent_ptr = stats
    tokens_ptr, accepted_ptr = out
    V, K, R, RQ, eps, alpha = scalars
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
    if greedy == 0:
        final = _sampled_token(target, draft, request, stats, scalars, b, a, rejected, scale,
                               t_safe, IS_LOGITS, HAS_Q, TYPICAL, BLOCK).to(final.dtype)

    final = tl.minimum(tl.maximum(final, 0), V - 1)
    d = _clamped(tl.load(drafts_ptr + b * K + lanes, mask=lanes < a, other=0), V)
    tok = tl.where(lanes < a, d, tl.where(lanes == a, final, PLACEHOLDER))
    tl.store(tokens_ptr + b * K1 + lanes, tok, mask=lanes < K1)
    tl.store(accepted_ptr + b, a)


KERNELS_INTERPRETED: bool = not isinstance(_decide_kernel, triton.runtime.jit.JITFunction)
"""True when TRITON_INTERPRET=1 was set as this module loaded: even GPU launches interpret."""


_COMPILE_OPTIONS = {"enable_fp_fusion": False}
"""No fused multiply-adds: float32 results round like the reference's separate operations."""


def _block(v: int, cap: int) -> int:
    return max(16, min(triton.next_power_of_2(v), cap))


def verify_triton(inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernels on ``inputs`` (torch tensors on a Triton device; CPU tensors in the
    interpreter copy, see :func:`portable_verify.backends.triton.interpreter.verify_interpreted`).

    Host work is shape arithmetic and buffer allocation only, so the call is CUDA-graph
    capturable once compiled.
    """
    interpreted_kernels = _INTERPRET or KERNELS_INTERPRETED
    mod = sys.modules[__name__]
    inputs.check_layout()
    b, k = inputs.draft_token_ids.shape
    device = inputs.draft_token_ids.device
    tokens = torch.empty((b, k + 1), dtype=torch.int64, device=device)
    accepted = torch.empty((b,), dtype=torch.int64, device=device)
    if b == 0:
        return tokens, accepted
    target, draft, request, stats, scalars = _records(inputs, interpreted_kernels)
    v = scalars[0]
    method = inputs.sampled_method  # the one place the launcher reads it
    typical = method == "typical" and not inputs.all_greedy
    block = method == "block" and not inputs.all_greedy
    has_greedy = not inputs.none_greedy
    need_softmax = inputs.target_is_logits and not inputs.all_greedy
    need_entropy = typical
    if has_greedy or need_softmax or need_entropy:
        cap = 1024 if interpreted_kernels else 4096
        mod._row_stats_kernel[(b, k + 1)](
            target, request, stats, scalars,
            IS_LOGITS=inputs.target_is_logits, NEED_ARGMAX=has_greedy,
            NEED_SOFTMAX=need_softmax, NEED_ENTROPY=need_entropy, BLOCK=_block(v, cap),
            **({} if interpreted_kernels else {"num_warps": 8, **_COMPILE_OPTIONS}),
        )  # fmt: skip
    mod._decide_kernel[(b,)](
        target, draft, request, stats, (tokens, accepted), scalars,
        IS_LOGITS=inputs.target_is_logits, HAS_Q=inputs.draft_probs is not None,
        HAS_U=inputs.uniforms is not None, HAS_GREEDY=has_greedy, TYPICAL=typical,
        BLOCK_VERIFY=block, BLOCK=_block(v, 1024 if interpreted_kernels else 2048),
        KB=max(2, triton.next_power_of_2(k + 1)),
        **({} if interpreted_kernels else {"num_warps": 4, **_COMPILE_OPTIONS}),
    )  # fmt: skip
    return tokens, accepted


def _records(inputs: VerifyInputs, interpreted_kernels: bool) -> tuple[tuple[Any, ...], ...]:
    """The kernels' grouped arguments, built here once for both launches: ``target`` (rows,
    row stride, row map), ``draft`` (ids, ``q`` rows, row stride, row map), ``request``
    (counts, temperatures, uniforms), ``stats`` (the row-statistics buffers) and the per-call
    ``scalars`` record ``(V, K, R, RQ, eps, alpha)``. Absent tensors are stood in for by one
    that is never read (its flag is off), so every group keeps its shape."""
    drafts = inputs.draft_token_ids
    b, k = drafts.shape
    target = _rows_contiguous(inputs.target, interpreted_kernels)
    temps = inputs.temperature.to(torch.float32).contiguous()
    counts = inputs.num_draft_tokens.contiguous()
    if inputs.draft_probs is None:
        draft = (drafts.contiguous(), temps, 0, counts)
        rq = 1
    else:
        q = _rows_contiguous(inputs.draft_probs, interpreted_kernels)
        draft = (drafts.contiguous(), q, q.stride(0), inputs.draft_rows.contiguous())
        rq = q.shape[0]
    uniforms = inputs.uniforms.contiguous() if inputs.uniforms is not None else temps
    stats = torch.empty((3, b * (k + 1)), dtype=torch.float32, device=drafts.device)
    argmax = torch.empty((b * (k + 1),), dtype=torch.int32, device=drafts.device)
    eps, alpha = inputs.options.typical.kernel_scalars()
    return ((target, target.stride(0), inputs.target_rows.contiguous()), draft,
            (counts, temps, uniforms), (argmax, stats[0], stats[1], stats[2]),
            (target.shape[1], k, target.shape[0], rq, eps, alpha))


def _rows_contiguous(x: torch.Tensor, interpreted_kernels: bool) -> torch.Tensor:
    """Rows with unit stride along V; the interpreter (numpy) gets float32 (exact upcast)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if interpreted_kernels and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x
