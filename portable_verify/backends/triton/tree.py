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
injected (``triton_interpreter.interpreted_copy``) and then imports the interpreted copy of
the chain kernels.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

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
_scan_chunk = _chain._scan_chunk
PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN_ID)
_TL_CORE = tl.core  # in the globals so the interpreter patches it at launch
CHILDREN_CODES = {"deterministic": 0, "iid": 1, "without_replacement": 2}


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
def _record(out_nodes, out_tokens, a, child, tok, lanes):
    """Store the accepted ``child`` (and its token) in column ``a`` of the path."""
    tl.store(out_nodes + a, child)
    tl.store(out_tokens + a, _lane_value(tok, lanes, child))


@_device
def _greedy_walk(tbase, target_stride, tok, par, valid, lanes, out_nodes, out_tokens, t_safe,
                 V, W, STATS_BLOCK: tl.constexpr, NB: tl.constexpr):
    """Descend into the lowest-index child whose token is the node row's first argmax."""
    g, _m, _s, _h = _row_stats(tbase, t_safe, V, True, False, False, STATS_BLOCK)
    node = tl.min(lanes, 0)
    a = node
    going = a < W - 1
    while going:
        match = tl.min(tl.where(valid & (par == node) & (tok == g), lanes, NB), 0)
        going = (match < NB) & (a < W - 1)
        if going:
            _record(out_nodes, out_tokens, a, match, tok, lanes)
            a += 1
            node = match
            g, _m, _s, _h = _row_stats(tbase + node.to(tl.int64) * target_stride, t_safe, V,
                                       True, False, False, STATS_BLOCK)
    return a, g


@_device
def _typical_walk(tbase, target_stride, tok, par, valid, lanes, out_nodes, out_tokens, t_safe,
                  v_draw, eps, alpha, V, W, IS_LOGITS: tl.constexpr, STATS_BLOCK: tl.constexpr,
                  BLOCK: tl.constexpr, NB: tl.constexpr):
    """First child (sibling order) passing the chain's typical test; none passing: the row's
    argmax; no child to test: a draw from the row."""
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
        passing = kids & (px > tl.minimum(eps, alpha * tl.exp(-h)))
        first = tl.min(tl.where(passing, lanes, NB), 0)
        has_kids = tl.max(kids.to(tl.int32), 0) > 0
        going = first < NB
        if going:
            _record(out_nodes, out_tokens, a, first, tok, lanes)
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
def _fold(row, qrow, wrow, qsrow, x, cur, S, Qs, fresh, t_safe, m, s, V,
          IS_LOGITS: tl.constexpr, CHILDREN: tl.constexpr, BLOCK: tl.constexpr):
    """Fold the rejected ``x`` into the residual: ``r <- norm(max(0, r - q_k))`` into the other
    scratch row (kept only when not empty), then (without replacement) ``q`` loses ``x``.
    Returns the new ``(cur, S, Qs)``."""
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
def _test_values(row, qrow, wrow, qsrow, x, cur, S, Qs, fresh, t_safe, m, s,
                IS_LOGITS: tl.constexpr, CHILDREN: tl.constexpr, V):
    """``(r(x), q(x))`` for a child: the node row's ``p(x)`` until a residual is stored, then
    ``w(x) / S``; ``q(x)`` from the draft row, the stored one, or 1 (deterministic)."""
    if cur < 0:
        rx = _prob_at(row, x, x >= 0, t_safe, m, s, IS_LOGITS)
    else:
        rx = tl.load(wrow + cur * V + x) / S
    qx = rx * 0.0 + 1.0
    if CHILDREN != 0:
        qx, _raw = _draft_chunk(qrow, qsrow, x, V, x, Qs, fresh, CHILDREN)
    return rx, qx


@_device
def _rejection_walk(tbase, target_stride, qbase, q_stride, wrow, qsrow, urow, tok, par, valid,
                    lanes, out_nodes, out_tokens, t_safe, N, V, W, IS_LOGITS: tl.constexpr,
                    CHILDREN: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                    NB: tl.constexpr):
    """The exact rule: at each node test its children in sibling order against the residual,
    descend into the first accepted one; none accepted (or none to test): draw from ``w``."""
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
            rx, qx = _test_values(row, qrow, wrow, qsrow, x, cur, S, Qs, fresh, t_safe, m, s,
                                 IS_LOGITS, CHILDREN, V)
            found = (rx > 0) & (tl.load(urow + child - 1) * qx <= rx)
            if found == 0:
                cur, S, Qs = _fold(row, qrow, wrow, qsrow, x, cur, S, Qs, fresh, t_safe, m, s,
                                   V, IS_LOGITS, CHILDREN, BLOCK)
                fresh = a < 0
                child = tl.min(tl.where(valid & (par == node) & (lanes > child), lanes, NB), 0)
        going = found
        if found:
            _record(out_nodes, out_tokens, a, child, tok, lanes)
            a += 1
            node = child
            row = tbase + node.to(tl.int64) * target_stride
            qrow = qbase + node.to(tl.int64) * q_stride
            if IS_LOGITS:
                _, m, s, _h = _row_stats(row, t_safe, V, False, True, False, STATS_BLOCK)
    final = _draw(row, wrow, cur, tl.load(urow + N - 1), t_safe, m, s, V, IS_LOGITS, BLOCK)
    return a, final.to(a.dtype)


@_kernel
def _tree_kernel(
    target_ptr, target_stride, q_ptr, q_stride, tokens_ptr, parents_ptr, counts_ptr, temp_ptr,
    u_ptr, w_ptr, qs_ptr, out_tokens_ptr, out_nodes_ptr, accepted_ptr,
    V, N, W, eps, alpha,
    IS_LOGITS: tl.constexpr, HAS_U: tl.constexpr, HAS_GREEDY: tl.constexpr,
    TYPICAL: tl.constexpr, CHILDREN: tl.constexpr, STATS_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr, NB: tl.constexpr, WB: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    lanes = tl.arange(0, NB)
    n = tl.minimum(tl.maximum(tl.load(counts_ptr + b), 1), N).to(tl.int32)  # garbage clamped
    par = tl.load(parents_ptr + b * N + lanes, mask=lanes < N, other=-2)
    # Range-checked in 64 bits before narrowing (2**32 would wrap to the root): out of range
    # means absent, as on every backend.
    par = tl.where((par >= 0) & (par < lanes), par, -2).to(tl.int32)
    tok = tl.load(tokens_ptr + b * N + lanes, mask=lanes < N, other=-1)
    # A child can be tested: below n, a valid parent, an id in the vocabulary (-1: none).
    valid = (lanes >= 1) & (lanes < n) & (par >= 0) & (par < lanes) & (tok >= 0) & (tok < V)
    t = tl.load(temp_ptr + b)
    t_safe = _safe_temperature(t)
    if HAS_GREEDY:  # noqa: SIM108 - kernel code: constexpr branches, not Python ternaries
        greedy = t == 0
    else:
        greedy = t != t
    if not HAS_U:
        greedy = t == t
    tbase = target_ptr + b.to(tl.int64) * N * target_stride
    out_nodes, out_tokens = out_nodes_ptr + b * W, out_tokens_ptr + b * W
    urow = u_ptr + b * N
    a = n * 0
    final = a
    if greedy:
        a, final = _greedy_walk(tbase, target_stride, tok, par, valid, lanes, out_nodes,
                                out_tokens, t_safe, V, W, STATS_BLOCK, NB)
    else:
        if TYPICAL:
            a, final = _typical_walk(tbase, target_stride, tok, par, valid, lanes, out_nodes,
                                     out_tokens, t_safe, tl.load(urow + N - 1), eps, alpha, V,
                                     W, IS_LOGITS, STATS_BLOCK, BLOCK, NB)
        else:
            a, final = _rejection_walk(
                tbase, target_stride, q_ptr + b.to(tl.int64) * N * q_stride, q_stride,
                w_ptr + b.to(tl.int64) * 2 * V, qs_ptr + b.to(tl.int64) * V, urow, tok,
                par, valid, lanes, out_nodes, out_tokens, t_safe, N, V, W, IS_LOGITS,
                CHILDREN, STATS_BLOCK, BLOCK, NB)
    final = tl.minimum(tl.maximum(final, 0), V - 1)
    cols = tl.arange(0, WB)
    tail = (cols >= a) & (cols < W)
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
    target = _chain._rows_contiguous(inputs.target, interpreted)
    v = target.shape[1]
    q = (target if inputs.draft_probs is None
         else _chain._rows_contiguous(inputs.draft_probs, interpreted))
    temps = inputs.temperature.to(torch.float32).contiguous()
    sampled = not inputs.all_greedy
    typical = sampled and inputs.sampled_method == "typical"
    exact = sampled and not typical
    wr = exact and inputs.children == "without_replacement"
    scratch = torch.empty((b * 2 * v if exact else 1,), dtype=torch.float32, device=device)
    q_scratch = torch.empty((b * v if wr else 1,), dtype=torch.float32, device=device)
    mod._tree_kernel[(b,)](
        target, target.stride(0), q, q.stride(0), inputs.node_token_ids.contiguous(),
        inputs.parents.contiguous(), inputs.num_nodes.contiguous(), temps,
        inputs.uniforms.contiguous() if inputs.uniforms is not None else temps,
        scratch, q_scratch, tokens, nodes, accepted,
        v, n, width, *inputs.typical.kernel_scalars(),
        IS_LOGITS=inputs.target_is_logits, HAS_U=inputs.uniforms is not None,
        HAS_GREEDY=not inputs.none_greedy, TYPICAL=typical,
        CHILDREN=CHILDREN_CODES[inputs.children],
        STATS_BLOCK=_chain._block(v, 1024 if interpreted else 4096),
        BLOCK=_chain._block(v, 1024 if interpreted else 2048),
        NB=max(2, triton.next_power_of_2(n)), WB=max(2, triton.next_power_of_2(width)),
        # 8 warps: the row statistics reduce as the chain's _row_stats_kernel does.
        **({} if interpreted else {"num_warps": 8, **_chain._COMPILE_OPTIONS}),
    )  # fmt: skip
    return tokens, nodes, accepted
