"""Traversal verification (docs/semantics.md, "Traversal verification") as one compiled walk per
request: the tree judged from the leaves up with sequence-level weights (Weng et al., arXiv
2505.12398).

Why it looks like this: the walk is strictly sequential within a request (a later sibling's
weight depends on what the earlier rejections did to its parent), so each request is one
post-order walk, and requests are split across threads as the other kernels are. State per
entered node ``c``: ``E[c]`` (its weight when entered, float32), ``W[c]`` (its current weight,
float64 after an update), its row's scale (``s``: the logits' exponential sum, 1 for
probabilities) and the buffer (``cur``: -1 = the node's own row) that holds ``R_c`` and ``D_c``
once a child was rejected with a non-empty residual. Rows live per depth level (two residual
buffers and, without replacement, one draft buffer), so memory is depth x V, not N x V.

The arithmetic is numba block verification's own (``block.py``: the logits normaliser, the
residual parts and their sums, the ``Z / (Z + 1 - P)`` update), so a chain (``parents = [-1, 0,
1, ...]``) gives exactly ``verify(method="block")`` on ``numba:cpu``, decision for decision. A
residual is only computed when its result can be read: not when the parent's weight is 0 (the
residual is then empty), nor when the rejected node was its parent's last child and the
parent's own test fails anyway (block's "no row read" for ``u > P``).

Under ``check`` the walk checks, on the way, the target row of every entered node and the
draft row of every entered node with children (its rows depend on the uniforms); the front
door words a flag.
"""

from __future__ import annotations

import numba
import numpy as np

from portable_verify.backends.numba.block import _PART, _normaliser, _residual_part
from portable_verify.backends.numba.chain import (
    _bad_logit_max,
    _not_a_distribution,
    draw,
)
from portable_verify.backends.numba.rows import (
    INNER,
    JIT,
    _exp_row,
    copy_row,
    exp_sum,
    row_max,
    row_stats,
)

_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)

# Rows of the float32 state ``fs [5, N]``: entered weight, row max, row scale (logits: the
# exponentials' sum), the first child's exponential, the residual's total.
E, MAX, SCALE, EX0, RSUM = 0, 1, 2, 3, 4
# Rows of the int64 state ``ns [5, N]``: depth, the buffer holding R and D (-1: the node's own
# row), the next child to enter (-1: none), the first child's token, whether Q was copied.
DEPTH, CUR, NEXT, KID_TOKEN, Q_COPIED = 0, 1, 2, 3, 4


@numba.njit(inline="always", **JIT)
def _weight(w, r, s):
    """``min(f32(w) * r / s, 1)`` in float32; 0 when ``w`` or ``r`` is 0, 1 when ``s`` is 0
    (block's ``P_j`` rule: the ratio is +inf, capped)."""
    if w == 0 or r == _ZERO:
        return _ZERO
    if s == _ZERO:
        return _ONE
    return min(np.float32(w) * r / s, _ONE)


@numba.njit(**JIT, **INNER)
def _residual_row(p, scale, w32, qrow, x, out):
    """``out = max(w32 * (p / scale) - q, 0)`` (``q`` one-hot at ``x`` when ``qrow`` is
    empty) with block's parts; the float64 total of their float32 sums (``S``)."""
    size = p.shape[0]
    total = 0.0
    for b0 in range(0, size, _PART):  # views: an offset loop does not vectorise
        b1 = min(size, b0 + _PART)
        part_q = qrow if qrow.shape[0] == 0 else qrow[b0:b1]
        total += np.float64(_residual_part(p[b0:b1], scale, w32, part_q, x - b0, out[b0:b1]))
    return total


@numba.njit(**JIT, **INNER)
def _enter(rows, d, has_kids, tf, o, mode, fs, ns):
    """Read node ``d``'s rows on entry; returns whether a value read is invalid. With children:
    from logits the row's max and sum (block's normaliser) and the first child's exponential;
    under ``check`` its target row (always) and draft row (with children)."""
    target, q = rows
    row = target[d]
    bad = False
    if o.check:
        if o.is_logits:
            top, has_nan = row_max(row)
            bad = _bad_logit_max(top, has_nan)
        else:
            bad = _not_a_distribution(row, o.atol)
        if has_kids and mode != 0:
            bad = bad or _not_a_distribution(q[d], o.q_atol)
    fs[SCALE, d] = _ONE
    if has_kids and o.is_logits:
        top, total, e_x = _normaliser(row, tf, ns[KID_TOKEN, d])
        fs[MAX, d] = top
        fs[EX0, d] = e_x
        fs[SCALE, d] = np.float32(total) if total > 0 else np.float32(np.nan)  # garbage rows
    return bad


@numba.njit(inline="always", **JIT)
def _r_at(target, c, x, is_logits, fs, ns, bufs):
    """``R_c(x)`` of a node whose weight is not 0: its row's ``p(x)`` before any update (from
    logits the first child's exponential over the sum, as block's ``P_j``: only the first
    child is entered while ``R`` is the node's own row), else the residual over its total."""
    cur = ns[CUR, c]
    if cur >= 0:
        return np.float32(bufs[cur, x] / fs[RSUM, c])
    if is_logits:
        return np.float32(fs[EX0, c] / fs[SCALE, c])
    return target[c, x]


@numba.njit(inline="always", **JIT)
def _q_at(q, c, x, mode, qbuf, ns):
    """``Q_c(x)``: 1 for deterministic children, else the (remaining) draft row."""
    if mode == 0:
        return _ONE
    if mode == 2 and ns[Q_COPIED, c] != 0:
        return qbuf[x]
    return q[c, x]


@numba.njit(**JIT, **INNER)
def _reject(rows, a, x, tf, o, mode, fs, ns, w, bufs, qbuf, scratch):
    """Fold the rejected child (token ``x``) into its parent ``a``: ``r =
    max(W R - Q, 0)`` with the weight and ``Q`` before the update; ``S > 0``: ``W = S / (S + 1
    - W)``, ``R, D = r``; else ``W = 0`` (``R``, ``D`` kept). Without replacement ``Q`` then
    loses ``x``. ``bufs``: the level's two residual buffers."""
    target, q = rows
    if w[a] > 0:  # else the residual is empty: max(0 * R - Q, 0) = 0
        cur = ns[CUR, a]
        if cur >= 0:
            p, scale = bufs[cur], fs[RSUM, a]
        elif o.is_logits:
            _exp_row(target[a], fs[MAX, a], tf, scratch)
            p, scale = scratch, fs[SCALE, a]
        else:
            p, scale = target[a], _ONE
        qrow = q[a, :0]  # deterministic: one-hot at x
        if mode == 1 or (mode == 2 and ns[Q_COPIED, a] == 0):
            qrow = q[a]
        elif mode == 2:
            qrow = qbuf
        other = 1 if cur == 0 else 0
        total = _residual_row(p, scale, np.float32(w[a]), qrow, x, bufs[other])
        if total > 0:
            w[a] = total / (total + (1.0 - w[a]))
            ns[CUR, a] = other
            fs[RSUM, a] = np.float32(total)
        else:
            w[a] = 0.0
    if mode == 2:  # after the subtraction: q <- q without x, normalised (the token-level rule's)
        if ns[Q_COPIED, a] == 0:
            copy_row(q[a], qbuf)
            ns[Q_COPIED, a] = 1
        qbuf[x] = 0.0
        qt = np.float32(row_stats(qbuf)[2])
        if qt > 0:
            for j in range(qbuf.shape[0]):
                qbuf[j] = qbuf[j] / qt


@numba.njit(**JIT, **INNER)
def _descend(rows, tree, i, c, tf, o, mode, fs, ns, w, bufs, qbufs):
    """From ``c``, enter next children down to a node with none left: ``(node, bad)``.
    ``tree``: ``(tokens, first, after, max_depth)``; rows are request ``i``'s ``[N, V]``."""
    tokens, first, _, max_depth = tree
    target, q = rows
    bad = False
    while ns[NEXT, c] >= 0:
        d = ns[NEXT, c]
        x = tokens[i, d]
        level = ns[DEPTH, c]
        r = _r_at(target, c, x, o.is_logits, fs, ns, bufs[level]) if w[c] > 0 else _ZERO
        fs[E, d] = _weight(w[c], r, _q_at(q, c, x, mode, qbufs[level], ns))
        w[d] = np.float64(fs[E, d])
        ns[DEPTH, d] = level + 1
        ns[CUR, d] = -1
        ns[Q_COPIED, d] = 0
        kid = first[d] if level + 1 < max_depth else -1
        ns[NEXT, d] = kid
        ns[KID_TOKEN, d] = tokens[i, kid] if kid >= 0 else 0
        bad = _enter(rows, d, kid >= 0, tf, o, mode, fs, ns) or bad
        c = d
    return c, bad


@numba.njit(**JIT, **INNER)
def _traverse_one(rows, tree, parents, i, u, tf, o, mode, state, work, path):
    """``(accepted, final, bad)`` of request ``i``: the post-order walk (descend to the first
    remaining leaf, test it, fold a rejection into its parent), then the one draw from the
    accepted node's ``D`` (the root's when every test failed)."""
    fs, ns, w = state
    bufs, qbufs, scratch = work
    tokens, first, after, max_depth = tree
    v = np.float32(u[i, tokens.shape[1] - 1])
    fs[E, 0], w[0] = _ONE, 1.0
    kid = first[0] if max_depth > 0 else -1
    ns[DEPTH, 0], ns[CUR, 0], ns[Q_COPIED, 0], ns[NEXT, 0] = 0, -1, 0, kid
    ns[KID_TOKEN, 0] = tokens[i, kid] if kid >= 0 else 0
    root = np.int64(0)  # not the literal 0: a literal argument compiles a second signature
    bad = _enter(rows, root, kid >= 0, tf, o, mode, fs, ns)
    c = root
    while True:
        c, bad_rows = _descend(rows, tree, i, c, tf, o, mode, fs, ns, w, bufs, qbufs)
        bad = bad or bad_rows
        if c == 0:
            break
        uc = u[i, c - 1]
        if np.float32(uc) <= fs[E, c] and np.float64(uc) <= w[c]:
            break
        a = parents[i, c]
        ns[NEXT, a] = after[c]
        level = ns[DEPTH, a]
        # The parent's last child, and the parent's own test fails on its entered weight:
        # nothing of its state is read again (block's "no row read" where u > P).
        if not (ns[NEXT, a] < 0 and a > 0 and not np.float32(u[i, a - 1]) <= fs[E, a]):
            _reject(rows, a, tokens[i, c], tf, o, mode, fs, ns, w, bufs[level], qbufs[level],
                    scratch)
        c = a
    accepted = ns[DEPTH, c]
    node = c
    for level in range(accepted - 1, -1, -1):
        path[level] = node
        node = parents[i, node]
    if ns[CUR, c] >= 0:
        return accepted, draw(bufs[accepted, ns[CUR, c]], v)[0], bad
    row = rows[0][c]
    if o.is_logits:  # the node's own exponentials (a leaf, or every residual empty)
        exp_sum(row, row_max(row)[0], tf, scratch)
        row = scratch
    return accepted, draw(row, v)[0], bad
