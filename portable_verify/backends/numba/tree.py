"""Token trees on the CPU as one numba kernel: docs/semantics.md ("Trees"), one walk per request.

Why a walk per request: a request's decision reads only the rows on its path (a node's target
row when the walk enters it, its draft row when it tests children), so a compiled walk reads
what the numpy reference reads and no more; the torch backend's vectorised steps and SGLang's
rule read every row or pay dozens of array calls per step. The row passes are the chain kernel's own
(:mod:`rows`, :func:`chain.draw`) in the same order, so a chain (``parents = [-1, 0, 1,
...]``) gives exactly what ``verify`` gives on ``numba:cpu``.

State at a node: ``w`` (the row the draw reads: the node's ``exp((l - max) / T)`` or ``p``, then
each latest non-empty residual before normalisation) and ``scale`` (its sum; the tests read
``r(x) = w(x) / scale``). Deterministic children zero ``x`` in ``w`` (in place: ``w`` is ours);
sampled children write ``max(0, w / scale - q)`` into one of two buffers, so an empty residual
keeps the previous ``w``. Under ``check`` (``validate=True`` for this backend) the rows it
reads are checked on the way (``TreeInputs.check_read_values``); the front door words a flag.

The walk takes the chain kernels' shape of arguments: the target, the node ids, the call's
other arrays as one tuple (:data:`ARRAYS`), the options as the chain's record (its ``children``
and ``max_depth`` fields are the walk's), the request range and the outputs as one tuple.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from portable_verify.backends.numba.chain import (
    _not_a_distribution,
    _softmax_row,
    draw,
    draw_checked,
    typical_threshold,
)
from portable_verify.backends.numba.host import (
    EMPTY_F32_2,
    HALF,
    call_record,
    host_array,
    run_split,
    threads_for,
)
from portable_verify.backends.numba.rows import (
    INNER,
    JIT,
    copy_row,
    entropy,
    residual,
    row_argmax,
    row_stats,
)
from portable_verify.backends.numba.rules import TYPICAL
from portable_verify.core.constants import PROB_SUM_ATOL, PROB_SUM_ATOL_HALF
from portable_verify.core.tree import TreeInputs

CHILDREN_CODES = {"deterministic": 0, "iid": 1, "without_replacement": 2}
"""The record's ``children`` field per children rule."""

ARRAYS = ("parents", "num_nodes", "q", "temps", "uniforms")
"""The order of the walk's array tuple: parents ``[B, N]``, node counts ``[B]``, draft rows
``[B*N, V]``, temperatures ``[B]``, uniforms ``[B, N]``."""


@numba.njit(inline="always", **JIT)
def _children(tokens, parents, i, n, v_size, first, after):
    """Request ``i``'s children lists: ``first[c]`` its lowest-index child, ``after[c]`` the
    next sibling (-1: none). A child lies below ``n``, has a parent before it and an id in
    ``[0, V)`` (-1 nodes and unvalidated garbage are absent, as in the numpy family's tree walk)."""
    first[:] = -1
    after[:] = -1
    for c in range(n - 1, 0, -1):  # backwards, so each list ends up in index order
        p = parents[i, c]
        x = tokens[i, c]
        if p >= 0 and p < c and x >= 0 and x < v_size:
            after[c] = first[p]
            first[p] = c


@numba.njit(inline="always", **JIT)
def _bad_structure(tokens, arrays, o, i, v_size, depth):
    """Request ``i``'s ``O(N)`` checks (``core/tree_validation.py``'s, which word a flag):
    ``num_nodes`` in ``[1, N]``, the root's parent -1, parents before children and ids in
    ``[0, V)`` or -1 below ``num_nodes``, no reachable node deeper than ``max_depth``, the
    temperature, the uniforms in ``(0, 1]``. ``depth`` is scratch (-1: not reached)."""
    parents, num_nodes, _, temps, u = arrays
    n_slots = tokens.shape[1]
    n = num_nodes[i]
    bad = n < 1 or n > n_slots or parents[i, 0] != -1
    t = temps[i]
    bad = bad or not (t >= 0 and t < np.inf) or (not o.is_logits and t != 0 and t != 1)
    if u.shape[0] > 0:
        for j in range(n_slots):
            bad = bad or not (u[i, j] > 0 and u[i, j] <= 1)
    depth[0] = 0
    for c in range(1, min(max(n, 1), n_slots)):
        p = parents[i, c]
        x = tokens[i, c]
        bad = bad or p < 0 or p >= c or x < -1 or x >= v_size
        depth[c] = depth[p] + 1 if (p >= 0 and p < c and x != -1 and depth[p] >= 0) else -1
        bad = bad or depth[c] > o.max_depth
    return bad


@numba.njit(**JIT, **INNER)
def _greedy_walk(target, tokens, o, i, links, path):
    """``(accepted, final, bad)``: descend into the lowest-index child equal to the row's
    argmax; the first unmatched argmax is the final token. ``links``: ``(first, after)``."""
    first, after = links
    n_slots = tokens.shape[1]
    node = 0
    depth = 0
    bad = False
    while True:
        row = target[i * n_slots + node]
        g = row_argmax(row)
        if o.check:  # the argmax lands on a NaN if the row has one
            top = row[g]
            bad = bad or (o.is_logits and not (top > -np.inf and top < np.inf))
            bad = bad or (not o.is_logits and not (top >= 0 and top < np.inf))
        c = first[node] if depth < o.max_depth else -1
        while c >= 0 and tokens[i, c] != g:
            c = after[c]
        if c < 0:
            return depth, g, bad
        path[depth] = c
        depth += 1
        node = c


@numba.njit(**JIT, **INNER)
def _test_children(p, s, p_is_ours, qrow, qbuf, res, tokens, u, i, c, after, mode):
    """Rejection sampling over the children ``c, after[c], ...`` of one node (``mode`` 0
    deterministic, 1 iid, 2 without replacement); ``p`` is the node's row (``s`` its scale;
    ``p_is_ours``: a scratch row, else the caller's, which is never written).
    Returns ``(accepted child or -1, which)``: the draw reads ``p`` (0) or ``res[which - 1]``."""
    w = p
    scale = s
    which = 0
    q = qrow
    fresh = True
    while c >= 0:
        x = tokens[i, c]
        rx = np.float32(np.float32(w[x]) / np.float32(scale))
        qx = np.float32(1.0) if mode == 0 else q[x]
        if rx > 0 and np.float32(u[i, c - 1]) * qx <= rx:
            return c, which
        if mode == 0:  # q = one-hot(x): zero x, unless it empties the residual
            if which == 0 and not p_is_ours:  # probabilities: work on a copy of the row
                copy_row(p, res[0])
                w = res[0]
                which = 1
                scale = row_stats(w)[2]
            wx = np.float64(w[x])
            if wx > 0 and scale - wx > 0:
                w[x] = 0.0
                scale -= wx
        else:
            out = res[1] if which == 1 else res[0]
            residual(w, scale, q, out)
            total = row_stats(out)[2]
            if total > 0:  # an empty residual keeps w
                w = out
                scale = total
                which = 2 if which == 1 else 1
            if mode == 2:  # q <- norm(q with x zeroed), after the subtraction
                if fresh:
                    copy_row(qrow, qbuf)
                    q = qbuf
                q[x] = 0.0
                qt = np.float32(row_stats(q)[2])
                if qt > 0:
                    for j in range(q.shape[0]):
                        q[j] = q[j] / qt
        fresh = False
        c = after[c]
    return -1, which


@numba.njit(**JIT, **INNER)
def _sampled_walk(target, tokens, arrays, o, i, tf, links, work):
    """``(accepted, final, bad)`` of a sampled request: enter a node (its row's softmax, entropy
    and checks), test its children (typical: the first passing; rejection: the residual
    rule), descend or finish with the argmax (typical, after a failed test) or a draw.
    ``links``: ``(first, after)``; ``work``: ``(scratch, qbuf, res, path)``."""
    _, _, q, _, u = arrays
    first, after = links
    scratch, qbuf, res, path = work
    n_slots = tokens.shape[1]
    mode = o.children
    v = np.float32(u[i, n_slots - 1])
    node = 0
    depth = 0
    bad = False
    while True:
        row = target[i * n_slots + node]
        p = row
        s = 1.0
        h = 0.0
        if o.is_logits:
            s, h, bad_row = _softmax_row(row, tf, scratch, o.rule == TYPICAL, o.check)
            bad = bad or bad_row
            p = scratch
        else:
            bad = bad or (o.check and _not_a_distribution(row, o.atol))
            if o.rule == TYPICAL:
                h = entropy(row)[0]
        c = first[node] if depth < o.max_depth else -1
        if c < 0:  # a leaf (or the depth cap): a draw from the node's row
            if o.check and not o.is_logits:
                return depth, draw_checked(p, v, o.atol)[0], bad
            return depth, draw(p, v)[0], bad
        if o.rule == TYPICAL:
            threshold = typical_threshold(o, h)
            while c >= 0 and not (np.float32(np.float32(p[tokens[i, c]]) / np.float32(s))
                                  > threshold):
                c = after[c]
            if c < 0:
                return depth, _argmax_of(p, o.is_logits), bad
        else:
            qrow = p
            if mode != 0:
                qrow = q[i * n_slots + node]
                bad = bad or (o.check and _not_a_distribution(qrow, o.q_atol))
            c, which = _test_children(p, s, o.is_logits, qrow, qbuf, res, tokens, u, i, c,
                                      after, mode)
            if c < 0:
                return depth, draw(p if which == 0 else res[which - 1], v)[0], bad
        path[depth] = c
        depth += 1
        node = c


@numba.njit(inline="always", **JIT)
def _argmax_of(p, is_logits):
    """The row's argmax; of exponentials, the first equal to ``exp(0) = 1`` (as the chain)."""
    if is_logits:
        for t in range(p.shape[0]):
            if p[t] >= 1.0:
                return t
    return row_argmax(p)


def tree_arrays(inputs: TreeInputs, rule: int, kernel: Any
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(token_ids, node_ids, num_accepted, flag)`` from validated torch CPU tree inputs, by
    ``kernel`` (``entries.walk``, the tree family's one entry kernel: this module's walks
    and the traversal walk); ``rule``: the code of the sampled rows' rule (``rules.TREE``)."""
    b, v = inputs.batch_size, inputs.vocab_size
    target, q = inputs.target, inputs.draft_probs
    atol, q_atol = (PROB_SUM_ATOL_HALF if t is not None and t.dtype in HALF else PROB_SUM_ATOL
                    for t in (target, q))
    target = host_array(target.detach().float() if target.dtype != torch.float32 else target,
                        np.float32)
    mode = CHILDREN_CODES[inputs.children]
    q = target if q is None or mode == 0 else host_array(q.detach().float(), np.float32)
    width = inputs.width
    record = call_record(inputs.target_is_logits, inputs.all_greedy, rule, inputs.typical,
                         inputs.check_read_values, atol=atol, q_atol=q_atol, children=mode,
                         max_depth=width - 1)
    u = EMPTY_F32_2 if inputs.uniforms is None else host_array(inputs.uniforms, np.float32)
    arrays = (host_array(inputs.parents, np.int64), host_array(inputs.num_nodes, np.int64), q,
              host_array(inputs.temperature, np.float32), u)
    outs = (np.empty((b, width), dtype=np.int64), np.empty((b, width), dtype=np.int64),
            np.empty(b, dtype=np.int64))
    error = run_split(kernel, b, threads_for(b * v * 2, b),
                      (target, host_array(inputs.node_token_ids, np.int64), arrays, record),
                      (outs,))
    return outs[0], outs[1], outs[2], error
