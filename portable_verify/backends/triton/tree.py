"""The Triton tree kernel: ``pv.verify_tree`` as one program per request walking its tree.

Design (docs/backends.md, "Trees on Triton"): one launch, grid ``(B,)``, no host sync. A program
holds its request's ``parents`` and ``node_token_ids`` as ``[NB]`` lanes and walks from the root:
a loop over depth, and (exact rule) a loop over sibling rank inside it. It reads only the rows
on its walk: the row statistics of each node it enters (one chunked pass, the chain kernels'
``_row_stats``), one pass per rejected child (the residual fold), and the final draw's two
passes. The residual lives in a per-request scratch ``[2, V]`` (ping-pong, so an empty residual
keeps the previous one as the reference does); ``without_replacement`` keeps its draft row with
the rejected tokens zeroed in a second scratch ``[V]``.

Exactness: the chain kernels' device functions (softmax chunks, first argmax, the float64
inverse-CDF scan) are imported, with their chunk sizes, so a chain (``parents = [-1, 0, 1, ...]``)
decides bit for bit as ``verify`` on this backend. Later siblings read ``r(x) = w(x) / S`` from
the stored residual ``w`` and its sum ``S``: the reference's normalised residual up to rounding.

Interpreter: like the chain kernels, this file is executed a second time with ``_INTERPRET``
injected (:func:`portable_verify.backends.triton.interpreter.interpreted_copy`) and then
imports the interpreted copy of the chain kernels.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import triton
import triton.language as tl

from portable_verify.backends.triton import spec
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID

_INTERPRET: bool = bool(globals().get("_INTERPRET", False))  # injected by the interpreter copy
if _INTERPRET:
    from portable_verify.backends.triton.interpreter import interpreted_kernels

    _chain = interpreted_kernels()
else:
    from portable_verify.backends.triton import chain as _chain

_kernel, _device = _chain._kernel, _chain._device
_row_stats, _p_chunk, _row_argmax = _chain._row_stats, _chain._p_chunk, _chain._row_argmax
_last_of_cumsum, _safe_temperature = _chain._last_of_cumsum, _chain._safe_temperature
_scan_chunk, _typical_threshold = _chain._scan_chunk, _chain._typical_threshold
PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN_ID)
_TL_CORE = tl.core  # in the globals so the interpreter patches it at launch
CHILDREN_CODES = {"deterministic": 0, "iid": 1, "without_replacement": 2}
RULE_CODES = spec.TREE_RULE_CODES
"""The kernel's ``RULE`` switch for sampled rows (declared in triton/spec.py, read by the host
without Triton)."""


@_device
def _lane_value(values, lanes, at):
    """``values[at]`` of a lane vector, as a scalar."""
    return tl.sum(tl.where(lanes == at, values, 0), 0)


@_device
def _prob_at(row, x, mask, t_safe, m, s, IS_LOGITS: tl.constexpr):
    """``p(x)`` of one row from its max ``m`` and normaliser ``s`` (the chain's arithmetic)."""
    val = tl.load(row + x, mask=mask, other=0.0).to(tl.float32)
    if IS_LOGITS:
        val = tl.where(val > float("-inf"), tl.exp((val - m) / t_safe) / s, 0.0)
    return val


@_device
def _record(path, a, child, tok, lanes):
    """Store the accepted ``child`` (and its token) in column ``a`` of the path."""
    out_nodes, out_tokens = path
    tl.store(out_nodes + a, child)
    tl.store(out_tokens + a, _lane_value(tok, lanes, child))


@_device
def _greedy_walk(rows, tree, path, t_safe, scalars, STATS_BLOCK: tl.constexpr,
                 NB: tl.constexpr):
    """Descend into the lowest-index child whose token is the node row's first argmax."""
    tbase, target_stride, _qbase, _q_stride = rows
    tok, par, valid, lanes = tree
    V, _N, W, _eps, _alpha = scalars
    g, _m, _s, _h = _row_stats(tbase, t_safe, V, True, False, False, STATS_BLOCK)
    node = tl.min(lanes, 0)
    a = node
    going = a < W - 1
    while going:
        match = tl.min(tl.where(valid & (par == node) & (tok == g), lanes, NB), 0)
        going = (match < NB) & (a < W - 1)
        if going:
            _record(path, a, match, tok, lanes)
            a += 1
            node = match
            g, _m, _s, _h = _row_stats(tbase + node.to(tl.int64) * target_stride, t_safe, V,
                                       True, False, False, STATS_BLOCK)
    return a, g


@_device
def _typical_walk(rows, tree, path, t_safe, v_draw, scalars, IS_LOGITS: tl.constexpr,
                  STATS_BLOCK: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr):
    """First child (sibling order) passing the chain's typical test; none passing: the row's
    argmax; no child to test: a draw from the row."""
    tbase, target_stride, _qbase, _q_stride = rows
    tok, par, valid, lanes = tree
    V, _N, W, eps, alpha = scalars
    _, m, s, h = _row_stats(tbase, t_safe, V, False, IS_LOGITS, True, STATS_BLOCK)
    node = tl.min(lanes, 0)
    a = node
    row = tbase
    has_kids = a < 0
    going = a == 0
    while going:
        kids = valid & (par == node) & (lanes < tl.where(a < W - 1, NB, 0))
        px = _prob_at(row, tl.minimum(tl.maximum(tok, 0), V - 1), kids, t_safe, m, s,
                      IS_LOGITS)
        passing = kids & (px > _typical_threshold(h, eps, alpha))
        first = tl.min(tl.where(passing, lanes, NB), 0)
        has_kids = tl.max(kids.to(tl.int32), 0) > 0
        going = first < NB
        if going:
            _record(path, a, first, tok, lanes)
            a += 1
            node = first
            row = tbase + node.to(tl.int64) * target_stride
            _, m, s, h = _row_stats(row, t_safe, V, False, IS_LOGITS, True, STATS_BLOCK)
    final = a * 0
    if has_kids:
        final = _row_argmax(row, t_safe, m, s, V, IS_LOGITS, BLOCK).to(a.dtype)
    else:
        final = _draw(row, row, a * 0 - 1, v_draw, t_safe, m, s, V, IS_LOGITS, BLOCK).to(a.dtype)
    return a, final


@_device
def _weights_chunk(row, wrow, cur, offs, V, t_safe, m, s, IS_LOGITS: tl.constexpr):
    """One chunk of what a test or the draw reads: the stored residual ``cur`` (0 or 1) of the
    scratch, or (``cur < 0``) the node's target row ``p``."""
    if cur < 0:
        w = _p_chunk(row, offs, V, t_safe, m, s, IS_LOGITS)
    else:
        w = tl.load(wrow + cur * V + offs, mask=offs < V, other=0.0).to(tl.float32)
    return w


@_device
def _draw(row, wrow, cur, v_draw, t_safe, m, s, V, IS_LOGITS: tl.constexpr, BLOCK: tl.constexpr):
    """The inverse-CDF draw of the chain kernels (``_final_draw``) from the weights that
    :func:`_weights_chunk` reads: float64 prefix sums, the first positive weight at or past
    ``v * total``, the last positive one should rounding run past the end."""
    lane = tl.arange(0, BLOCK)
    zero = tl.sum(tl.zeros([BLOCK], tl.float32), 0).to(tl.float64)
    total = zero
    for start in range(0, V, BLOCK):
        w = _weights_chunk(row, wrow, cur, start + lane, V, t_safe, m, s, IS_LOGITS)
        total += _last_of_cumsum(w.to(tl.float64), BLOCK)
    threshold = v_draw.to(tl.float64) * total
    carry = zero
    pick = tl.min(tl.full([BLOCK], -1, tl.int32), 0)
    last_pos = pick * 0
    start = pick * 0
    while (start < V) & (pick < 0):
        offs = start + lane
        wgt = _weights_chunk(row, wrow, cur, offs, V, t_safe, m, s, IS_LOGITS)
        pick, last_pos, carry = _scan_chunk(wgt, offs, carry, threshold, pick, last_pos, V,
                                            BLOCK)
        start += BLOCK
    return tl.where(pick >= 0, pick, last_pos)


@_device
def _draft_chunk(qrow, qsrow, offs, V, x, Qs, fresh, CHILDREN: tl.constexpr):
    """``(q_k, raw)`` over one chunk: the draft distribution the current child was drawn from
    and (without replacement) the stored draft row it is normalised from."""
    valid = offs < V
    if CHILDREN == 0:
        q = tl.where(offs == x, 1.0, 0.0)
        raw = q
    elif CHILDREN == 1:
        q = tl.load(qrow + offs, mask=valid, other=0.0).to(tl.float32)
        raw = q
    else:
        if fresh:
            raw = tl.load(qrow + offs, mask=valid, other=0.0).to(tl.float32)
            q = raw
        else:
            raw = tl.load(qsrow + offs, mask=valid, other=0.0)
            q = tl.where(Qs > 0, raw / tl.where(Qs > 0, Qs, 1.0), raw)
    return q, raw


@_device
def _fold(row, qrow, scratch, x, residual_state, fresh, t_safe, m, s, V,
          IS_LOGITS: tl.constexpr, CHILDREN: tl.constexpr, BLOCK: tl.constexpr):
    """Fold the rejected ``x`` into the residual: ``r <- norm(max(0, r - q_k))`` into the other
    scratch row (kept only when not empty), then (without replacement) ``q`` loses ``x``.
    ``residual_state`` is ``(cur, S, Qs)`` (see :func:`_rejection_walk`); returns the new one."""
    wrow, qsrow = scratch
    cur, S, Qs = residual_state
    lane = tl.arange(0, BLOCK)
    nxt = tl.where(cur == 0, 1, 0)
    total = tl.sum(tl.zeros([BLOCK], tl.float64), 0)
    q_total = total
    for start in range(0, V, BLOCK):
        offs = start + lane
        valid = offs < V
        r = _weights_chunk(row, wrow, cur, offs, V, t_safe, m, s, IS_LOGITS)
        if cur >= 0:
            r = r / S
        q, raw = _draft_chunk(qrow, qsrow, offs, V, x, Qs, fresh, CHILDREN)
        residual = tl.maximum(r - q, 0.0)
        tl.store(wrow + nxt * V + offs, residual, mask=valid)
        total += tl.sum(residual.to(tl.float64), 0)
        if CHILDREN == 2:  # after the subtraction: the rejected token leaves q
            raw = tl.where(offs == x, 0.0, raw)
            tl.store(qsrow + offs, raw, mask=valid)
            q_total += tl.sum(raw.to(tl.float64), 0)
    tl.debug_barrier()  # the next test reads what other threads of this program stored
    kept = total > 0
    if CHILDREN == 2:
        Qs = q_total.to(tl.float32)
    return tl.where(kept, nxt, cur), tl.where(kept, total.to(tl.float32), S), Qs


@_device
def _test_values(row, qrow, scratch, x, residual_state, fresh, t_safe, m, s, V,
                 IS_LOGITS: tl.constexpr, CHILDREN: tl.constexpr):
    """``(r(x), q(x))`` for a child: the node row's ``p(x)`` until a residual is stored, then
    ``w(x) / S``; ``q(x)`` from the draft row, the stored one, or 1 (deterministic)."""
    wrow, qsrow = scratch
    cur, S, Qs = residual_state
    if cur < 0:
        rx = _prob_at(row, x, x >= 0, t_safe, m, s, IS_LOGITS)
    else:
        rx = tl.load(wrow + cur * V + x) / S
    qx = rx * 0.0 + 1.0
    if CHILDREN != 0:
        qx, _raw = _draft_chunk(qrow, qsrow, x, V, x, Qs, fresh, CHILDREN)
    return rx, qx


@_device
def _rejection_walk(rows, scratch, urow, tree, path, t_safe, scalars, IS_LOGITS: tl.constexpr,
                    CHILDREN: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                    NB: tl.constexpr):
    """The exact rule: at each node test its children in sibling order against the residual,
    descend into the first accepted one; none accepted (or none to test): draw from ``w``.
    The residual's state is ``(cur, S, Qs)``: the scratch row holding it (-1: none stored
    yet, read the node's ``p``), its sum, and (without replacement) the stored draft row's."""
    tbase, target_stride, qbase, q_stride = rows
    wrow, _qsrow = scratch
    tok, par, valid, lanes = tree
    V, N, W, _eps, _alpha = scalars
    m = t_safe * 0.0  # probabilities: p is read as given; m and s are not used
    s = m + 1.0
    if IS_LOGITS:
        _, m, s, _h = _row_stats(tbase, t_safe, V, False, True, False, STATS_BLOCK)
    node = tl.min(lanes, 0)
    a = node
    row, qrow = tbase, qbase
    cur = node - 1
    S = t_safe * 0.0 + 1.0
    going = a == 0
    while going:
        cur = node * 0 - 1
        S = S * 0.0 + 1.0
        Qs = S
        fresh = a >= 0
        depth_ok = lanes < tl.where(a < W - 1, NB, 0)  # a lane bound, not a scalar mask
        child = tl.min(tl.where(valid & (par == node) & depth_ok, lanes, NB), 0)
        found = a < 0
        while (child < NB) & (found == 0):
            x = _lane_value(tok, lanes, child)
            rx, qx = _test_values(row, qrow, scratch, x, (cur, S, Qs), fresh, t_safe, m, s, V,
                                  IS_LOGITS, CHILDREN)
            found = (rx > 0) & (tl.load(urow + child - 1) * qx <= rx)
            if found == 0:
                cur, S, Qs = _fold(row, qrow, scratch, x, (cur, S, Qs), fresh, t_safe, m, s, V,
                                   IS_LOGITS, CHILDREN, BLOCK)
                fresh = a < 0
                child = tl.min(tl.where(valid & (par == node) & (lanes > child), lanes, NB), 0)
        going = found
        if found:
            _record(path, a, child, tok, lanes)
            a += 1
            node = child
            row = tbase + node.to(tl.int64) * target_stride
            qrow = qbase + node.to(tl.int64) * q_stride
            if IS_LOGITS:
                _, m, s, _h = _row_stats(row, t_safe, V, False, True, False, STATS_BLOCK)
    final = _draw(row, wrow, cur, tl.load(urow + N - 1), t_safe, m, s, V, IS_LOGITS, BLOCK)
    return a, final.to(a.dtype)


@_device
def _weight(w, r, s):
    """Traversal's child weight ``min(f32(w) r / s, 1)`` in float32: 0 when ``w`` or ``r`` is 0,
    1 when only ``s`` is (block verification's ``P_j``, so a chain rounds alike)."""
    ratio = tl.minimum(w.to(tl.float32) * r / tl.where(s == 0, 1.0, s), 1.0)
    return tl.where((w == 0) | (r == 0), 0.0, tl.where(s == 0, 1.0, ratio))


@_device
def _levels_at(lv, lanes, level):
    """One level's scalars of the level record (see :func:`_traversal_walk`)."""
    lm, ls, lres, lslot, lsum, lqs, lfresh = lv
    return (_lane_value(lm, lanes, level), _lane_value(ls, lanes, level),
            _lane_value(lres, lanes, level), _lane_value(lslot, lanes, level),
            _lane_value(lsum, lanes, level), _lane_value(lqs, lanes, level),
            _lane_value(lfresh, lanes, level))


@_device
def _law_values(here, scratch, x, at, t_safe, V, IS_LOGITS: tl.constexpr,
                CHILDREN: tl.constexpr):
    """``(R(x), Q(x))`` of the node ``here = (row, qrow, level)`` whose level scalars are ``at``:
    its latest residual ``D / sum(D)`` or its row ``p``, and the law its children are drawn
    from (the draft row, the stored one without replacement, or 1 for deterministic)."""
    row, qrow, level = here
    wbase, qsbase = scratch
    m, s, res, slot, dsum, qs, fresh = at
    if res > 0:
        rx = tl.load(wbase + slot.to(tl.int64) * V + x) / dsum
    else:
        rx = _prob_at(row, x, x >= 0, t_safe, m, s, IS_LOGITS)
    sx = rx * 0.0 + 1.0
    if CHILDREN != 0:
        sx, _raw = _draft_chunk(qrow, qsbase + level.to(tl.int64) * V, x, V, x, qs, fresh > 0,
                                CHILDREN)
    return rx, sx


@_device
def _traversal_enter(rows, tree, scratch, c, d, walk, t_safe, scalars, IS_LOGITS: tl.constexpr,
                     CHILDREN: tl.constexpr, STATS_BLOCK: tl.constexpr):
    """Enter child ``d`` of ``c``: its weight from ``c``'s *current* weight and law, its level's
    scalars reset (row statistics read only when ``d`` has children: a leaf's are read at the
    draw). ``walk`` is ``(nodes, lv, spare)``; returns the new one."""
    tbase, target_stride, qbase, q_stride = rows
    tok, par, valid, lanes = tree
    V, _N, W, _eps, _alpha = scalars
    nodes, lv, spare = walk
    e_w, w_w, nxt, depth = nodes
    lm, ls, lres, lslot, lsum, lqs, lfresh = lv
    level = _lane_value(depth, lanes, c)
    here = (tbase + c.to(tl.int64) * target_stride, qbase + c.to(tl.int64) * q_stride, level)
    rx, sx = _law_values(here, scratch, _lane_value(tok, lanes, d).to(tl.int64),
                         _levels_at(lv, lanes, level), t_safe, V, IS_LOGITS, CHILDREN)
    e = _weight(_lane_value(w_w, lanes, c), rx, sx)
    below = level + 1 < W - 1
    first = tl.min(tl.where(valid & (par == d) & below, lanes, tl.max(lanes, 0) + 1), 0)
    m = _lane_value(lm, lanes, level) * 0.0
    s = m + 1.0
    if IS_LOGITS:  # noqa: SIM102 - a constexpr branch: a combined test is not one in Triton
        if first <= tl.max(lanes, 0):
            _, m, s, _h = _row_stats(tbase + d.to(tl.int64) * target_stride, t_safe, V, False,
                                     True, False, STATS_BLOCK)
    at = lanes == level + 1
    nodes = (tl.where(lanes == d, e, e_w), tl.where(lanes == d, e.to(tl.float64), w_w),
             tl.where(lanes == d, first, nxt), tl.where(lanes == d, level + 1, depth))
    lv = (tl.where(at, m, lm), tl.where(at, s, ls), tl.where(at, 0, lres), lslot, lsum, lqs,
          tl.where(at, 1, lfresh))
    return nodes, lv, spare


@_device
def _traversal_fold(here, scratch, x, wa, at, spare, t_safe, V, IS_LOGITS: tl.constexpr,
                    CHILDREN: tl.constexpr, BLOCK: tl.constexpr):
    """One rejection folded into the parent ``here``: ``r = max(f32(W) R - Q, 0)`` into the
    spare scratch row with its float64 sum, and (without replacement) ``Q`` without ``x``,
    stored unnormalised with its sum. Returns ``(S, sum of the stored Q)``."""
    row, qrow, level = here
    wbase, qsbase = scratch
    m, s, res, slot, dsum, qs, fresh = at
    qsrow = qsbase + level.to(tl.int64) * V
    lane = tl.arange(0, BLOCK)
    total = tl.sum(tl.zeros([BLOCK], tl.float64), 0)
    q_total = total
    wf = wa.to(tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + lane
        valid = offs < V
        if res > 0:
            law = tl.load(wbase + slot.to(tl.int64) * V + offs, mask=valid, other=0.0) / dsum
        else:
            law = _p_chunk(row, offs, V, t_safe, m, s, IS_LOGITS)
        q, _raw = _draft_chunk(qrow, qsrow, offs, V, x, qs, fresh > 0, CHILDREN)
        r = tl.maximum(wf * law - q, 0.0)
        tl.store(wbase + spare.to(tl.int64) * V + offs, r, mask=valid)
        total += tl.sum(tl.where(valid, r, 0.0).to(tl.float64), 0)
        if CHILDREN == 2:  # after the subtraction: the rejected token leaves Q
            kept_q = tl.where(offs == x, 0.0, q)
            tl.store(qsrow + offs, kept_q, mask=valid)
            q_total += tl.sum(tl.where(valid, kept_q, 0.0).to(tl.float64), 0)
    tl.debug_barrier()  # later reads of this program see what its other threads stored
    return total, q_total


@_device
def _traversal_reject(rows, tree, scratch, c, walk, t_safe, scalars, IS_LOGITS: tl.constexpr,
                      CHILDREN: tl.constexpr, BLOCK: tl.constexpr):
    """Node ``c`` failed its test: fold it into its parent ``a`` (``W_a <- S / (S + 1 - W_a)``,
    the residual kept only when ``S > 0``, else ``W_a <- 0``), move ``a`` to its next child.
    Returns ``(a, walk)``."""
    tbase, target_stride, qbase, q_stride = rows
    tok, par, valid, lanes = tree
    V, _N, _W, _eps, _alpha = scalars
    nodes, lv, spare = walk
    e_w, w_w, nxt, depth = nodes
    lm, ls, lres, lslot, lsum, lqs, lfresh = lv
    a = _lane_value(par, lanes, c)
    level = _lane_value(depth, lanes, a)
    here = (tbase + a.to(tl.int64) * target_stride, qbase + a.to(tl.int64) * q_stride, level)
    at = _levels_at(lv, lanes, level)
    wa = _lane_value(w_w, lanes, a)
    total, q_total = _traversal_fold(here, scratch, _lane_value(tok, lanes, c).to(tl.int64), wa,
                                     at, spare, t_safe, V, IS_LOGITS, CHILDREN, BLOCK)
    kept = total > 0
    new_w = tl.where(kept, total / tl.where(kept, total + (1.0 - wa), 1.0), 0.0)
    slot = at[3]
    here_level = lanes == level
    grown = tl.where(kept, here_level, lanes < 0)  # (a scalar mask & a vector: interpreter)
    lv = (lm, ls, tl.where(grown, 1, lres), tl.where(grown, spare, lslot),
          tl.where(grown, total.to(tl.float32), lsum),
          tl.where(here_level, q_total.to(tl.float32), lqs), tl.where(here_level, 0, lfresh))
    spare = tl.where(kept, slot, spare)
    sibling = tl.min(tl.where(valid & (par == a) & (lanes > c), lanes, tl.max(lanes, 0) + 1), 0)
    nodes = (e_w, tl.where(lanes == a, new_w, w_w), tl.where(lanes == a, sibling, nxt), depth)
    return a, (nodes, lv, spare)


@_device
def _traversal_walk(rows, scratch, urow, tree, path, t_safe, scalars, IS_LOGITS: tl.constexpr,
                    CHILDREN: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                    NB: tl.constexpr):
    """Traversal verification (docs/semantics.md): enter children down to the first remaining
    leaf, test it (``u <= E and u <= W``), on a rejection fold it into its parent; the first
    pass ends the walk, the root ends it with every child rejected. The draw reads the final
    node's latest residual (its row ``p`` when none was stored).

    State: per node lanes ``(E, W, next child, depth)``; per depth level (the node on the stack
    there) ``(max, normaliser, residual stored?, its scratch slot, its sum, the stored Q's sum,
    Q fresh?)``; residuals live in ``W + 1`` scratch rows per request (one spare, swapped in
    when a residual is kept, so an empty one leaves the last one intact)."""
    tbase, target_stride, _qbase, _q_stride = rows
    tok, par, valid, lanes = tree
    V, N, W, _eps, _alpha = scalars
    wbase, _qsbase = scratch
    zero = tl.zeros([NB], tl.float32)
    lanes_i = lanes * 0
    first = tl.min(tl.where(valid & (par == 0) & (W > 1), lanes, NB), 0)
    nodes = (zero + 1.0, zero.to(tl.float64) + 1.0, tl.where(lanes == 0, first, NB), lanes_i)
    m = t_safe * 0.0
    s = m + 1.0
    if IS_LOGITS:  # noqa: SIM102 - constexpr branch; the root's statistics (a leaf's: at the draw)
        if first < NB:
            _, m, s, _h = _row_stats(tbase, t_safe, V, False, True, False, STATS_BLOCK)
    lv = (tl.where(lanes == 0, m, zero), tl.where(lanes == 0, s, zero + 1.0), lanes_i, lanes,
          zero + 1.0, zero + 1.0, lanes_i + 1)
    walk = (nodes, lv, first * 0 + W)  # slots 0..W-1 per level, W spare
    c = first * 0
    done = c < 0
    while done == 0:
        d = _lane_value(walk[0][2], lanes, c)
        if d < NB:
            walk = _traversal_enter(rows, tree, scratch, c, d, walk, t_safe, scalars, IS_LOGITS,
                                    CHILDREN, STATS_BLOCK)
            c = d
        elif c == 0:
            done = c == 0
        else:
            u = tl.load(urow + c - 1)
            done = ((u <= _lane_value(walk[0][0], lanes, c))
                    & (u.to(tl.float64) <= _lane_value(walk[0][1], lanes, c)))
            if done == 0:
                c, walk = _traversal_reject(rows, tree, scratch, c, walk, t_safe, scalars,
                                            IS_LOGITS, CHILDREN, BLOCK)
    a = _lane_value(walk[0][3], lanes, c)
    m, s, res, slot, _dsum, _qs, _fresh = _levels_at(walk[1], lanes, a)
    row = tbase + c.to(tl.int64) * target_stride
    if IS_LOGITS:  # noqa: SIM102 - a constexpr branch: a combined test is not one in Triton
        if res == 0:  # a leaf's statistics are read only now
            _, m, s, _h = _row_stats(row, t_safe, V, False, True, False, STATS_BLOCK)
    final = _draw(row, wbase + slot.to(tl.int64) * V, tl.where(res > 0, 0, -1),
                  tl.load(urow + N - 1), t_safe, m, s, V, IS_LOGITS, BLOCK)
    node = c
    for i in range(NB):  # the path, written from the final node up
        col = a - 1 - i
        if col >= 0:
            _record(path, col, node, tok, lanes)
            node = _lane_value(par, lanes, node)
    return a, final.to(a.dtype)


@_kernel
def _tree_kernel(
    rows, request, scratch, out, scalars,
    IS_LOGITS: tl.constexpr, HAS_U: tl.constexpr, HAS_GREEDY: tl.constexpr,
    RULE: tl.constexpr, CHILDREN: tl.constexpr, STATS_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr, NB: tl.constexpr, WB: tl.constexpr,
):  # fmt: skip
    """Grid ``(B,)``: one request's walk from the root, its path and its next token."""
    target_ptr, target_stride, q_ptr, q_stride = rows
    tokens_ptr, parents_ptr, counts_ptr, temp_ptr, u_ptr = request
    w_ptr, qs_ptr = scratch
    out_tokens_ptr, out_nodes_ptr, accepted_ptr = out
    V, N, W, _eps, _alpha = scalars
    b = tl.program_id(0)
    lanes = tl.arange(0, NB)
    n = tl.minimum(tl.maximum(tl.load(counts_ptr + b), 1), N).to(tl.int32)  # garbage clamped
    # Parents are range-checked at their own width, then narrowed: a parent such as 2**32
    # must stay out of range (absent), not wrap to the root.
    par_raw = tl.load(parents_ptr + b * N + lanes, mask=lanes < N, other=-2)
    tok = tl.load(tokens_ptr + b * N + lanes, mask=lanes < N, other=-1)
    # A child can be tested: below n, a valid parent, an id in the vocabulary (-1: none).
    valid = ((lanes >= 1) & (lanes < n) & (par_raw >= 0) & (par_raw < lanes) & (tok >= 0)
             & (tok < V))
    par = par_raw.to(tl.int32)  # read only where valid, so in [0, lanes)
    t = tl.load(temp_ptr + b)
    t_safe = _safe_temperature(t)
    if HAS_GREEDY:  # noqa: SIM108 - kernel code: constexpr branches, not Python ternaries
        greedy = t == 0
    else:
        greedy = t != t
    if not HAS_U:
        greedy = t == t
    tbase = target_ptr + b.to(tl.int64) * N * target_stride
    qbase = q_ptr + b.to(tl.int64) * N * q_stride
    path = (out_nodes_ptr + b * W, out_tokens_ptr + b * W)
    tree = (tok, par, valid, lanes)
    urow = u_ptr + b * N
    a = n * 0
    final = a
    if greedy:
        a, final = _greedy_walk((tbase, target_stride, qbase, q_stride), tree, path, t_safe,
                                scalars, STATS_BLOCK, NB)
    else:
        if RULE == 1:
            a, final = _typical_walk((tbase, target_stride, qbase, q_stride), tree, path, t_safe,
                                     tl.load(urow + N - 1), scalars, IS_LOGITS, STATS_BLOCK,
                                     BLOCK, NB)
        elif RULE == 2:
            a, final = _traversal_walk(
                (tbase, target_stride, qbase, q_stride),
                (w_ptr + b.to(tl.int64) * (W + 1) * V, qs_ptr + b.to(tl.int64) * W * V), urow,
                tree, path, t_safe, scalars, IS_LOGITS, CHILDREN, STATS_BLOCK, BLOCK, NB)
        elif RULE == 0:
            a, final = _rejection_walk(
                (tbase, target_stride, qbase, q_stride),
                (w_ptr + b.to(tl.int64) * 2 * V, qs_ptr + b.to(tl.int64) * V), urow, tree, path,
                t_safe, scalars, IS_LOGITS, CHILDREN, STATS_BLOCK, BLOCK, NB)
        else:  # a declared rule without a walk here: flagged (-1), never run as another rule
            a = a - 1
    final = tl.minimum(tl.maximum(final, 0), V - 1)
    cols = tl.arange(0, WB)
    tail = (cols >= a) & (cols < W)
    out_nodes, out_tokens = path
    tl.store(out_tokens + cols, tl.where(cols == a, final, PLACEHOLDER), mask=tail)
    tl.store(out_nodes + cols, tl.full([WB], -1, tl.int64), mask=tail)
    tl.store(accepted_ptr + b, a)


def verify_tree_triton(inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token_ids [B, W], node_ids [B, W], num_accepted [B])`` from one launch (CPU tensors in
    the interpreter copy). Host work is shape arithmetic and allocation only."""
    interpreted = _INTERPRET or _chain.KERNELS_INTERPRETED
    mod = sys.modules[__name__]
    inputs.check_layout()
    b, n, width = inputs.batch_size, inputs.num_slots, inputs.width
    device = inputs.node_token_ids.device
    tokens = torch.empty((b, width), dtype=torch.int64, device=device)
    nodes = torch.empty((b, width), dtype=torch.int64, device=device)
    accepted = torch.empty((b,), dtype=torch.int64, device=device)
    if b == 0:
        return tokens, nodes, accepted
    sampled = not inputs.all_greedy
    rule = spec.rule_code(inputs.sampled_method if sampled else None, methods.TREE)
    rows, request, scratch, scalars = _records(inputs, interpreted, rule,
                                               sampled and rule != RULE_CODES["typical"])
    v = scalars[0]
    mod._tree_kernel[(b,)](
        rows, request, scratch, (tokens, nodes, accepted), scalars,
        IS_LOGITS=inputs.target_is_logits, HAS_U=inputs.uniforms is not None,
        HAS_GREEDY=not inputs.none_greedy, RULE=rule,
        CHILDREN=CHILDREN_CODES[inputs.children],
        STATS_BLOCK=_chain._block(v, 1024 if interpreted else 4096),
        BLOCK=_chain._block(v, 1024 if interpreted else 2048),
        NB=max(2, triton.next_power_of_2(n)), WB=max(2, triton.next_power_of_2(width)),
        # 8 warps: the row statistics reduce as the chain's _row_stats_kernel does.
        **({} if interpreted else {"num_warps": 8, **_chain._COMPILE_OPTIONS}),
    )  # fmt: skip
    return tokens, nodes, accepted


def _records(inputs: TreeInputs, interpreted: bool, rule: int,
             exact: bool) -> tuple[tuple[Any, ...], ...]:
    """The tree kernel's grouped arguments, built here once: ``rows`` (target rows and stride,
    draft rows and stride), ``request`` (node ids, parents, counts, temperatures, uniforms),
    ``scratch`` (the ``exact`` rule's residual rows and the without-replacement draft row) and the
    per-call ``scalars`` record ``(V, N, W, eps, alpha)``. A tensor the call does not use is
    stood in for by one that is never read, so every group keeps its shape."""
    b, n, width = inputs.batch_size, inputs.num_slots, inputs.width
    device = inputs.node_token_ids.device
    target = _chain._rows_contiguous(inputs.target, interpreted)
    v = target.shape[1]
    q = (target if inputs.draft_probs is None
         else _chain._rows_contiguous(inputs.draft_probs, interpreted))
    temps = inputs.temperature.to(torch.float32).contiguous()
    wr = exact and inputs.children == "without_replacement"
    # Residual rows per request: two (ping-pong) for the token-level rule; for traversal one per
    # depth level plus a spare, and one stored draft row per level without replacement.
    traversal = exact and rule == RULE_CODES["traversal"]
    levels = width if traversal else 1
    rows_per = width + 1 if traversal else 2
    scratch = torch.empty((b * rows_per * v if exact else 1,), dtype=torch.float32,
                          device=device)
    q_scratch = torch.empty((b * levels * v if wr else 1,), dtype=torch.float32, device=device)
    request = (inputs.node_token_ids.contiguous(), inputs.parents.contiguous(),
               inputs.num_nodes.contiguous(), temps,
               inputs.uniforms.contiguous() if inputs.uniforms is not None else temps)
    eps, alpha = inputs.typical.kernel_scalars()
    return ((target, target.stride(0), q, q.stride(0)), request, (scratch, q_scratch),
            (v, n, width, eps, alpha))
