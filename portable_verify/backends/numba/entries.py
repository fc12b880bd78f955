"""The one entry kernel of each rule family: :func:`decide` (every chain rule), its by-address
twin :func:`decide_at` (small calls on tensors), and :func:`walk` (every tree rule).

Why one entry per family, in a module of its own: numba optimises and emits each entry
kernel's whole call tree again, so an entry per rule compiles the shared helpers (counts,
greedy rows, uniforms, draws, row passes) once per entry; one entry per family branches on the
options record's ``rule`` code instead (``rules.py``: the family's one table), which costs one
predictable branch per call, and flags a code it has no branch for (``rules.ERROR_RULE``).
The rules themselves stay in their modules (``chain.py``, ``block.py``, ``tree.py``,
``traversal.py``); this module only dispatches to them.
"""

from __future__ import annotations

import numba
import numpy as np

from portable_verify.backends.numba.block import _block_one
from portable_verify.backends.numba.chain import (
    DRAW_BLOCK,
    ERROR_NONE,
    _one,
    _pointer,
    normal_temperature,
)
from portable_verify.backends.numba.rows import JIT
from portable_verify.backends.numba.rules import (
    BLOCK,
    ERROR_RULE,
    GREEDY,
    REJECTION,
    TRAVERSAL,
    TYPICAL,
)
from portable_verify.backends.numba.traversal import _traverse_one
from portable_verify.backends.numba.tree import (
    _bad_structure,
    _children,
    _greedy_walk,
    _sampled_walk,
)


@numba.njit(**JIT)
def decide(target, drafts, arrays, options, lo, hi, outs):
    """Fill ``outs`` (token ids, accepted, emitted, reported counts) for requests ``lo ..
    hi-1``; return ``ERROR_VALUE`` when ``options.check`` is set and a value the decision
    reads is invalid (docs/semantics.md, Validation). Disjoint request ranges may run at once
    on several threads (the kernel releases the GIL; a request's result depends only on its
    own inputs).

    ``options.rule`` sends sampled requests through block verification
    (``block._block_one``) or rejection sampling / typical acceptance (``chain._one``); any
    other code returns ``rules.ERROR_RULE`` before reading anything.

    ``arrays`` (``chain.ARRAYS``): ``rows`` / ``qrows`` empty: the padded layout (request
    ``i``, position ``j`` is row ``i*(K+1) + min(j, n_i)`` / ``i*K + j``). ``counts`` empty:
    every request has ``K`` drafts. ``temps`` empty: every request has ``temp_scalar``.
    Uniforms: ``uniforms`` if not empty, else the counter hash of a per-request seed and offset
    (``chain.OPTIONS``). ``bonus`` (empty: drawn here): the caller's token for a request that
    accepted every draft.
    """
    k = drafts.shape[1]
    v_size = target.shape[1]
    o = options[0]
    error = ERROR_NONE
    if o.rule == BLOCK:
        block_work = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.float64),
                      np.empty(k, dtype=np.float32), np.empty(v_size, dtype=np.float32),
                      np.empty(v_size, dtype=np.float32))  # maxes, sums, chain, scratch, out
        for i in range(lo, hi):
            error = max(error, _block_one(target, drafts, arrays, o, i, block_work, outs))
        return error
    if not (o.rule == REJECTION or o.rule == TYPICAL or o.rule == GREEDY):
        return ERROR_RULE
    chain_work = (np.empty(v_size, dtype=np.float32), np.empty(v_size, dtype=np.float32),
                  np.empty((v_size + DRAW_BLOCK - 1) // DRAW_BLOCK, dtype=np.float64))
    for i in range(lo, hi):
        error = max(error, _one(target, drafts, arrays, o, i, chain_work, outs))
    return error


@numba.njit(**JIT)
def decide_at(target_address, n_rows, v_size, drafts_address, b, k, arrays, options, tokens,
              accepted, emitted, n_drafts):
    """:func:`decide` (all requests: small calls) on contiguous torch tensors given by address:
    making their numpy views costs more than a small call's whole decision (docs/decisions.md,
    "The first call"). The outputs come one by one (see ``chain.greedy_at``)."""
    target = numba.carray(_pointer(target_address, np.float32), (n_rows, v_size))
    drafts = numba.carray(_pointer(drafts_address, np.int64), (b, k))
    outs = (tokens, accepted, emitted, n_drafts)
    return decide(target, drafts, arrays, options, np.int64(0), b, outs)  # one signature


@numba.njit(**JIT)
def walk(target, tokens, arrays, options, lo, hi, outs):
    """Fill ``outs`` (token ids, node ids, accepted) for requests ``lo .. hi-1``; returns 1
    when ``options.check`` is set and a value the walk reads is invalid. ``target``: flat
    ``[B*N, V]`` rows; ``arrays``: :data:`tree.ARRAYS` (``q`` a dummy for deterministic
    children; ``u`` ``[B, N]``, empty when every row is greedy); the children code and the
    depth cap are the record's. Disjoint request ranges may run at once (nogil).

    ``options.rule`` sends sampled requests through the traversal walk
    (``traversal._traverse_one``) or the token-level walk (``tree._sampled_walk``: rejection,
    typical); greedy rows take ``tree._greedy_walk`` in both. Any other code returns
    ``rules.ERROR_RULE`` before reading anything."""
    o = options[0]
    if not (o.rule == REJECTION or o.rule == TYPICAL or o.rule == TRAVERSAL
            or o.rule == GREEDY):
        return ERROR_RULE
    parents, num_nodes, _, temps, _ = arrays
    out_tokens, out_nodes, out_accepted = outs
    n_slots = tokens.shape[1]
    v_size = target.shape[1]
    first = np.empty(n_slots, dtype=np.int64)
    after = np.empty(n_slots, dtype=np.int64)
    path = np.empty(n_slots, dtype=np.int64)
    token_work = _token_work(o, v_size, path)
    state, work = _traversal_work(o, n_slots, v_size)
    error = 0
    for i in range(lo, hi):
        n = min(max(num_nodes[i], 1), n_slots)  # garbage (validate=False) clamped
        _children(tokens, parents, i, n, v_size, first, after)
        if o.check and _bad_structure(tokens, arrays, o, i, v_size, path):
            error = 1
        t = np.float64(temps[i])
        if o.all_greedy or t == 0:
            a, final, bad = _greedy_walk(target, tokens, o, i, (first, after), path)
        elif o.rule == TRAVERSAL:
            lo_row, hi_row = i * n_slots, (i + 1) * n_slots
            a, final, bad = _traverse_one((target[lo_row:hi_row], arrays[2][lo_row:hi_row]),
                                          (tokens, first, after, o.max_depth), parents, i,
                                          arrays[4], normal_temperature(t), o, o.children,
                                          state, work, path)
        else:
            a, final, bad = _sampled_walk(target, tokens, arrays, o, i, normal_temperature(t),
                                          (first, after), token_work)
        error = max(error, 1 if bad else 0)
        out_accepted[i] = a
        for j in range(out_tokens.shape[1]):
            out_tokens[i, j] = tokens[i, path[j]] if j < a else (final if j == a else -1)
            out_nodes[i, j] = path[j] if j < a else -1
    return error


@numba.njit(inline="always", **JIT)
def _token_work(o, v_size, path):
    """The token-level walk's rows ``(scratch, qbuf, res, path)``; empty for a traversal call."""
    v = 0 if o.rule == TRAVERSAL else v_size
    return (np.empty(v, dtype=np.float32),
            np.empty(v if o.children == 2 else 0, dtype=np.float32),
            np.empty((2, v), dtype=np.float32), path)


@numba.njit(inline="always", **JIT)
def _traversal_work(o, n_slots, v_size):
    """The traversal walk's per-node state ``(fs, ns, w)`` and per-level rows ``(bufs, qbufs,
    scratch)``; empty (no rows) for a token-level call."""
    levels = min(o.max_depth, n_slots - 1) + 1 if o.rule == TRAVERSAL else 0
    v = v_size if o.rule == TRAVERSAL else 0
    state = (np.empty((5, n_slots), dtype=np.float32), np.empty((5, n_slots), dtype=np.int64),
             np.empty(n_slots, dtype=np.float64))
    work = (np.empty((levels, 2, v), dtype=np.float32),
            np.empty((levels, v if o.children == 2 else 0), dtype=np.float32),
            np.empty(v if o.is_logits else 0, dtype=np.float32))
    return state, work
