"""Tree verification (docs/semantics.md, "Trees") on the OpenVINO backend.

Why it looks like this: every request walks its own path, but each step of every walk is the
same few array operations, so one loop over *test steps* (at most ``N - 1``: a node is tested
at most once, as a child of its one parent) runs all requests at once. A step tests each
request's next child, then either descends into it or folds it into the residual and moves on
to its next sibling. The per-row work runs as compiled graphs (:mod:`.tree_graphs`)
on the rows concerned only: a node's softmax with temperature (and, for typical, its threshold)
when a request enters it, the residual update of the requests that just rejected a child, and
one draw per request at the end. The host keeps the ``[B, V]`` state, gathers rows, and runs
the tests (numpy, vectorised over the batch); the arithmetic is the token-wise graphs', so a
chain gives exactly ``verify``'s answer on this backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from portable_verify.backends.openvino.traversal import traversal_walk
from portable_verify.backends.openvino.tree_graphs import TreeGraph
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID


@dataclass
class Tree:
    """A batch of trees as index arrays (``[B, N]``; ``N`` means "none")."""

    tokens: np.ndarray  # ids clipped into [0, V) (only read where valid)
    first_child: np.ndarray  # lowest-index valid child of node c
    next_sibling: np.ndarray  # next valid node after i with the same parent


def tree_structure(inputs: TreeInputs) -> Tree:
    """Children lists as arrays: ``O(B N^2)`` comparisons, no loop. A child lies below its
    request's ``num_nodes``, has a valid parent and proposes an id in ``[0, V)``."""
    tokens, parents = np.asarray(inputs.node_token_ids), np.asarray(inputs.parents)
    n, v = inputs.num_slots, inputs.vocab_size
    count = np.clip(np.asarray(inputs.num_nodes), 1, n)
    index = np.arange(n)
    valid = ((index[None, :] >= 1) & (index[None, :] < count[:, None]) & (parents >= 0)
             & (parents < index[None, :]) & (tokens >= 0) & (tokens < v))
    parent = np.where(valid, parents, -2)  # -2: parent of nothing
    first_child = np.where(parent[:, None, :] == index[None, :, None], index, n).min(-1)
    later = index[None, None, :] > index[None, :, None]  # j > i
    sibling = (parent[:, :, None] == parent[:, None, :]) & valid[:, None, :] & later
    next_sibling = np.where(sibling, index, n).min(-1)
    return Tree(np.clip(tokens, 0, v - 1), first_child, next_sibling)


class Walk:
    """The state every walk shares: each request's node, next child to test, path."""

    def __init__(self, backend: Any, inputs: TreeInputs, tree: Tree,
                 scalars: np.ndarray) -> None:
        """``scalars``: the call's record (:func:`.record.call_scalars`), fed to every graph
        that reads a per-call scalar."""
        self.backend, self.inputs, self.tree = backend, inputs, tree
        b, self.n = inputs.batch_size, inputs.num_slots
        self.all = np.arange(b)
        self.node = np.zeros(b, np.int64)
        self.a = np.zeros(b, np.int64)
        self.path = np.full((b, inputs.width), -1, np.int64)
        self.ptr = tree.first_child[:, 0] if inputs.max_depth > 0 else np.full(b, self.n)
        self.scalars = scalars
        self.temperature = np.asarray(inputs.temperature, np.float32)

    def run(self, graph: TreeGraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
        # Shared (zero-copy) graph inputs must be C-contiguous; this copies only those that
        # are not.
        return self.backend.infer(graph, [np.asarray(x, order="C") for x in arrays],
                                  build=graph.build)

    def rows(self, source: np.ndarray, at: np.ndarray) -> np.ndarray:
        """float32 rows of ``source`` at those requests' current nodes."""
        return np.take(source, at * self.n + self.node[at], axis=0).astype(np.float32, copy=False)

    def steps(self) -> Any:
        """Yield ``(active, child, x)`` per test step until every walk has ended."""
        for _ in range(self.n - 1):
            active = self.ptr < self.n
            if not active.any():
                return
            child = np.minimum(self.ptr, self.n - 1)
            yield active, child, self.tree.tokens[self.all, child]

    def advance(self, accept: np.ndarray, reject: np.ndarray, child: np.ndarray) -> np.ndarray:
        """Accepted requests descend into ``child``, rejecting ones move to its next sibling;
        returns the accepted requests' indices."""
        at = np.flatnonzero(accept)
        self.path[at, self.a[at]] = child[at]
        self.a[at] += 1
        self.node[at] = child[at]
        below = self.a < self.inputs.max_depth
        first = np.where(below, self.tree.first_child[self.all, self.node], self.n)
        self.ptr = np.where(accept, first, np.where(
            reject, self.tree.next_sibling[self.all, child], self.ptr))
        return at


def verify_tree_openvino(backend: Any, inputs: TreeInputs, scalars: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(token_ids [B, W], node_ids [B, W], num_accepted [B])`` for numpy inputs."""
    b, width = inputs.batch_size, inputs.width
    if b == 0:
        return (np.zeros((0, width), np.int64), np.zeros((0, width), np.int64),
                np.zeros(0, np.int64))
    tree = tree_structure(inputs)
    with np.errstate(all="ignore"):  # NaN or inf only arise for garbage (validate=False)
        if inputs.all_greedy:
            path, final, a = greedy_walk(Walk(backend, inputs, tree, scalars))
        else:
            walk = WALKS.get(inputs.sampled_method)
            if walk is None:
                raise methods.unknown_rule(inputs.sampled_method, backend.qualified_name,
                                           methods.TREE)
            path, final, a = walk(Walk(backend, inputs, tree, scalars))
            if not inputs.none_greedy:
                row = np.asarray(inputs.temperature) == 0
                g_path, g_final, g_a = greedy_walk(Walk(backend, inputs, tree, scalars))
                path = np.where(row[:, None], g_path, path)
                final, a = np.where(row, g_final, final), np.where(row, g_a, a)
    col = np.arange(width)[None, :]
    path_tokens = np.take_along_axis(np.asarray(inputs.node_token_ids),
                                     np.clip(path, 0, inputs.num_slots - 1), 1)
    tokens = np.where(col < a[:, None], path_tokens, PLACEHOLDER_TOKEN_ID)
    tokens = np.where(col == a[:, None], final[:, None], tokens).astype(np.int64)
    return tokens, np.where(col < a[:, None], path, -1), a


def greedy_walk(w: Walk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Descend into the lowest-index child whose token is the node row's argmax."""
    graph = TreeGraph("argmax")
    g = w.run(graph, [w.rows(w.inputs.target, w.all), w.scalars])[0]
    for active, child, x in w.steps():
        accept = active & (x == g)
        at = w.advance(accept, active & ~accept, child)
        if at.size:
            g[at] = w.run(graph, [w.rows(w.inputs.target, at), w.scalars])[0]
    return w.path, g, w.a


def typical_walk(w: Walk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first child passing the typical test; none passing: the row's argmax; a leaf: a
    draw from its row."""
    graph = TreeGraph("rows", is_logits=w.inputs.target_is_logits, typical=True)

    def enter(at: np.ndarray) -> list[np.ndarray]:
        temp = [w.temperature[at]] if w.inputs.target_is_logits else []
        return w.run(graph, [w.rows(w.inputs.target, at), *temp, w.scalars])

    p, threshold, argmax = enter(w.all)
    tested = np.zeros(len(w.all), bool)  # a child of the current node failed
    for active, child, x in w.steps():
        accept = active & (p[w.all, x] > threshold)
        tested = (tested | (active & ~accept)) & ~accept
        at = w.advance(accept, active & ~accept, child)
        if at.size:
            p[at], threshold[at], argmax[at] = enter(at)
    v = np.asarray(w.inputs.uniforms, np.float32)[:, w.n - 1]
    draw = w.run(TreeGraph("draw"), [p, v])[0]
    return w.path, np.where(tested, argmax, draw), w.a


def rejection_walk(w: Walk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Accept ``x`` iff ``u q(x) <= r(x)``; on rejection fold ``x`` into the residual ``r``
    (``w``: what the final draw reads); no child accepted: draw from ``w``."""
    inputs = w.inputs
    mode = inputs.children
    rows_graph = TreeGraph("rows", is_logits=inputs.target_is_logits)
    residual_graph = TreeGraph("residual", children=mode)
    u = np.asarray(inputs.uniforms, np.float32)

    def enter(at: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        temp = [w.temperature[at]] if inputs.target_is_logits else []
        p = w.run(rows_graph, [w.rows(inputs.target, at), *temp])[0]
        return p, None if mode == "deterministic" else w.rows(inputs.draft_probs, at)

    r, q = enter(w.all)
    weights = r.copy()
    for active, child, x in w.steps():
        rx = r[w.all, x]
        qx = np.float32(1.0) if q is None else q[w.all, x]
        accept = active & (rx > 0) & (u[w.all, np.maximum(child - 1, 0)] * qx <= rx)
        reject = active & ~accept
        out = np.flatnonzero(reject)
        if out.size:
            fold = [r[out]] if q is None else [r[out], q[out]]
            weights[out], r[out], *q_new = w.run(residual_graph, [*fold, x[out]])
            if q_new:
                q[out] = q_new[0]
        at = w.advance(accept, reject, child)
        if at.size:
            r[at], q_at = enter(at)
            weights[at] = r[at]
            if q is not None:
                q[at] = q_at
    final = w.run(TreeGraph("draw"), [weights, u[:, w.n - 1]])[0]
    return w.path, final, w.a


WALKS: dict[str, Callable[[Walk], tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
    "rejection": rejection_walk, "typical": typical_walk, "traversal": traversal_walk}
"""The tree rules and the walk of each: the family's tree table (``backend.TREE_RULES``)."""
