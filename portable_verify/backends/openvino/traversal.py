"""Traversal verification (docs/semantics.md, "Traversal verification"; Weng et al., arXiv
2505.12398) on the OpenVINO backend: the tree judged from the leaves up.

Why it looks like this: within a request the walk is sequential (a later sibling's weight
depends on what the earlier rejections did to its parent), so one loop of test steps runs every
request at once, as the torch walk does: a step enters children down to each request's first
remaining leaf (one level per pass), then tests one node per request and either ends the
request or folds the rejection into the node's parent. A node is tested at most once, so there
are at most ``N - 1`` steps. The host keeps the scalar state and gathers rows (numpy, vectorised
over the batch); the per-row passes run as compiled graphs (:mod:`.tree_graphs`), reused across
steps and calls: a node's softmax when a request enters it (``rows``), the residual
``max(W R - Q, 0)`` with its sum and, without replacement, the draft row without the rejected
token (``traversal``), and the one draw per request (``draw``).

State: per node its entered weight ``E`` (float32) and current weight ``W`` (float64); per
request and depth level the draw weights ``D`` of the node on the stack there (its row ``p``,
then its latest non-empty residual) and their sum (``R = D / sum``), and, without replacement,
the remaining draft row ``Q``. Memory is ``B x (depth + 1) x V`` per row kind. The CPU plugin
computes in float32, so the residual's sum ``S`` is a float32 sum (as the block graphs' masses
are, which keeps a chain equal to ``verify(method="block")`` on this backend).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from portable_verify.backends.openvino.tree_graphs import TreeGraph

F32_ONE = np.float32(1.0)


class TraversalWalk:
    """Every request's walk state (see the module docstring)."""

    def __init__(self, walk: Any) -> None:
        """``walk``: the tree walks' shared :class:`.tree.Walk` (graphs, rows, tree arrays)."""
        self.w, inputs = walk, walk.inputs
        b, n, v = inputs.batch_size, inputs.num_slots, inputs.vocab_size
        self.n, self.all, self.mode = n, walk.all, inputs.children
        self.levels = min(inputs.max_depth, n - 1) + 1
        self.rows_graph = TreeGraph("rows", is_logits=inputs.target_is_logits)
        self.fold_graph = TreeGraph("traversal", children=self.mode)
        self.e = np.ones((b, n), np.float32)
        self.weight = np.ones((b, n), np.float64)
        self.depth = np.zeros((b, n), np.int64)
        self.next = np.full((b, n), n, np.int64)
        self.d = np.zeros((b, self.levels, v), np.float32)
        self.d_sum = np.ones((b, self.levels), np.float32)
        self.q = (np.zeros((b, self.levels, v), np.float32)
                  if self.mode == "without_replacement" else None)
        self.node = np.zeros(b, np.int64)
        self.done = np.zeros(b, bool)
        self.enter(self.all)

    def enter(self, at: np.ndarray) -> None:
        """Requests ``at`` entered their ``node``: its row ``p`` (and draft row without
        replacement) at its level, its first child to enter."""
        w, node = self.w, self.node[at]
        level = self.depth[at, node]
        temp = [w.temperature[at]] if w.inputs.target_is_logits else []
        self.d[at, level] = w.run(self.rows_graph, [self.rows(w.inputs.target, at, node),
                                                    *temp])[0]
        self.d_sum[at, level] = 1.0
        if self.q is not None:
            self.q[at, level] = self.rows(w.inputs.draft_probs, at, node)
        below = level < w.inputs.max_depth
        self.next[at, node] = np.where(below, w.tree.first_child[at, node], self.n)

    def rows(self, source: np.ndarray, at: np.ndarray, node: np.ndarray) -> np.ndarray:
        """float32 rows of ``source`` at requests ``at``'s ``node``."""
        return np.take(source, at * self.n + node, axis=0).astype(np.float32, copy=False)

    def q_of(self, at: np.ndarray, node: np.ndarray, level: np.ndarray) -> np.ndarray:
        """``Q`` of requests ``at`` at ``node`` (``[M, V]``; not for deterministic children)."""
        if self.q is not None:
            return self.q[at, level]
        return self.rows(self.w.inputs.draft_probs, at, node)

    def descend(self) -> None:
        """Enter next children down to each request's first node with none left."""
        for _ in range(self.levels - 1):
            kid = self.next[self.all, self.node]
            at = np.flatnonzero(~self.done & (kid < self.n))
            if not at.size:
                return
            c, d = self.node[at], kid[at]
            x = self.w.tree.tokens[at, d]
            level = self.depth[at, c]
            r = self.d[at, level, x] / self.d_sum[at, level]
            s = (np.ones_like(r) if self.mode == "deterministic"
                 else self.q_of(at, c, level)[np.arange(at.size), x])
            e = child_weight(self.weight[at, c], r, s)
            self.e[at, d], self.weight[at, d] = e, e.astype(np.float64)
            self.depth[at, d] = level + 1
            self.node[at] = d
            self.enter(at)

    def test(self, u: np.ndarray) -> None:
        """Test each live request's node: accept (the request ends), end at the root, or fold
        the rejection into the parent: ``r = max(W R - Q, 0)``, ``W = S / (S + 1 - W)``."""
        c = self.node
        uc = u[self.all, np.maximum(c - 1, 0)]
        live = ~self.done & (c > 0)
        accept = live & (uc <= self.e[self.all, c]) & (uc.astype(np.float64)
                                                       <= self.weight[self.all, c])
        self.done |= accept | (c == 0)
        out = np.flatnonzero(live & ~accept)
        if out.size:
            self.reject(out)

    def reject(self, at: np.ndarray) -> None:
        """Fold the rejected nodes of requests ``at`` into their parents (one graph call)."""
        c = self.node[at]
        a = np.clip(np.asarray(self.w.inputs.parents)[at, c], 0, self.n - 1)
        x = self.w.tree.tokens[at, c]
        level = self.depth[at, a]
        w_a = self.weight[at, a]
        law = [self.d[at, level], self.d_sum[at, level], w_a.astype(np.float32)]
        drawn = [x] if self.mode == "deterministic" else [self.q_of(at, a, level), x]
        r, total, *q_new = self.w.run(self.fold_graph, [*law, *drawn])
        s = total.astype(np.float64)
        grown = s > 0
        self.weight[at, a] = np.where(grown, s / np.where(grown, s + (1.0 - w_a), 1.0), 0.0)
        self.d[at[grown], level[grown]] = r[grown]
        self.d_sum[at[grown], level[grown]] = total[grown]
        if self.q is not None:  # after the subtraction: Q loses x, renormalised
            self.q[at, level] = q_new[0]
        self.next[at, a] = self.w.tree.next_sibling[at, c]
        self.node[at] = a

    def path(self) -> tuple[np.ndarray, np.ndarray]:
        """``(path [B, W], accepted [B])``: the nodes from the root down to each final node."""
        parents = np.clip(np.asarray(self.w.inputs.parents), 0, self.n - 1)
        accepted = self.depth[self.all, self.node]
        path = np.full((self.all.size, self.w.inputs.width), -1, np.int64)
        node = self.node.copy()
        for step in range(self.w.inputs.width - 1):
            at = accepted - 1 - step
            ok = np.flatnonzero(at >= 0)
            path[ok, at[ok]] = node[ok]
            node[ok] = parents[ok, node[ok]]
        return path, accepted


def child_weight(w: np.ndarray, r: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``min(f32(w) r / s, 1)`` in float32: 0 when ``w`` or ``r`` is 0, 1 when only ``s`` is
    (block verification's ``P_j``, so a chain rounds alike)."""
    ratio = np.minimum(w.astype(np.float32) * r / np.where(s == 0, F32_ONE, s), F32_ONE)
    return np.where((w == 0) | (r == 0), np.float32(0.0),
                    np.where(s == 0, F32_ONE, ratio)).astype(np.float32)


def traversal_walk(w: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(path [B, W], final [B], accepted [B])`` of traversal verification for the sampled
    rows (the caller replaces greedy rows). At most ``N - 1`` test steps."""
    walk = TraversalWalk(w)
    u = np.asarray(w.inputs.uniforms, np.float32)
    for _ in range(walk.n - 1):
        walk.descend()
        if walk.done.all():
            break
        walk.test(u)
    walk.descend()
    walk.test(u)  # no test left: every request that is still live ends at the root
    path, accepted = walk.path()
    level = walk.depth[walk.all, walk.node]
    weights = np.ascontiguousarray(walk.d[walk.all, level])
    final = w.run(TreeGraph("draw"), [weights, u[:, walk.n - 1]])[0]
    return path, final.astype(np.int64), accepted
