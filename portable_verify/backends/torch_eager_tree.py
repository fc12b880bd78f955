"""Tree verification for the torch backend: the walk of docs/semantics.md ("Trees"), vectorised
over the batch.

Why it looks like this: every request walks its own path, but each step of every walk is the
same few array operations, so one loop over *test steps* (at most ``N - 1``: a node is tested
at most once, as a child of its one parent) runs all requests at once. A step tests each
request's next child, then either descends into it or folds it into the residual and moves on
to its next sibling. The loop count is known on the host (no host sync). The arithmetic is
torch_eager's own (the first test at a node from the row's max and sum, the row loads, the
two-level draw), so a chain gives exactly ``verify``'s answer on this backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from portable_verify.backends.torch_eager import (
    ArrayOps,
    TorchBackend,
    _draw,
    _logits_sums,
    _probs_entropy,
    _temperatures,
    per_row,
)
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID

Array = Any


@dataclasses.dataclass
class Tree:
    """A batch of trees as index arrays (``[B, N]``; ``N`` means "none")."""

    tokens: Array  # ids clipped into [0, V) (only read where valid)
    valid: Array  # bool: node i is a child that can be tested
    first_child: Array  # lowest-index valid child of node c
    next_sibling: Array  # next valid node after i with the same parent


def tree_structure(ops: ArrayOps, inputs: TreeInputs) -> Tree:
    """Children lists as arrays: ``O(B N^2)`` comparisons, no loop."""
    xp = ops.xp
    tokens, parents = ops.array(inputs.node_token_ids), ops.array(inputs.parents)
    n_nodes = ops.array(inputs.num_nodes)
    n, v = inputs.num_slots, inputs.vocab_size
    index = ops.arange(n)
    valid = ((index[None, :] >= 1) & (index[None, :] < n_nodes[:, None]) & (parents >= 0)
             & (parents < index[None, :]) & (tokens >= 0) & (tokens < v))
    parent = xp.where(valid, parents, -2)  # -2: parent of nothing
    is_child = parent[:, None, :] == index[None, :, None]  # [B, c, j]
    first_child = xp.where(is_child, index[None, None, :], n).min(-1)
    later = index[None, None, :] > index[None, :, None]  # j > i
    sibling = (parent[:, :, None] == parent[:, None, :]) & valid[:, None, :] & later
    next_sibling = xp.where(sibling, index[None, None, :], n).min(-1)
    return Tree(ops.clip(tokens, 0, v - 1), valid, first_child, next_sibling)


def verify_tree_torch(inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token_ids [B, W], node_ids [B, W], num_accepted [B])`` for torch tensors."""
    inputs = dataclasses.replace(inputs, target=inputs.target.detach(), draft_probs=(
        None if inputs.draft_probs is None else inputs.draft_probs.detach()))
    ops = ArrayOps(inputs.target.device)
    with np.errstate(all="ignore"):  # -inf - -inf and overflow only arise for garbage inputs
        tree = tree_structure(ops, inputs)
        if inputs.all_greedy:
            path, final, a = _greedy_walk(ops, inputs, tree)
        else:
            path, final, a = _sampled_walk(ops, inputs, tree)
            if not inputs.none_greedy:
                greedy_row = ops.array(inputs.temperature) == 0
                g_path, g_final, g_a = _greedy_walk(ops, inputs, tree)
                path = ops.xp.where(greedy_row[:, None], g_path, path)
                final = ops.xp.where(greedy_row, g_final, final)
                a = ops.xp.where(greedy_row, g_a, a)
        tokens, nodes = _emit(ops, inputs, path, final, a)
    return ops.tensor(tokens), ops.tensor(nodes), ops.tensor(a)


def _emit(ops: ArrayOps, inputs: TreeInputs, path: Array, final: Array,
          a: Array) -> tuple[Array, Array]:
    """``token_ids``: the path's tokens, the final token at column ``a``, then -1;
    ``node_ids``: the path's nodes, then -1."""
    xp = ops.xp
    col = ops.arange(inputs.width)[None, :]
    tokens = ops.array(inputs.node_token_ids)
    path_tokens = ops.take(tokens, ops.clip(path, 0, inputs.num_slots - 1))
    out = xp.where(col < a[:, None], path_tokens, PLACEHOLDER_TOKEN_ID)
    out = xp.where(col == a[:, None], final[:, None], out)
    return out, xp.where(col < a[:, None], path, -1)


def _start(ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> tuple[Array, ...]:
    """``(node, next child to test, accepted count, path [B, W])`` at the root."""
    b, n = inputs.batch_size, inputs.num_slots
    xp = ops.xp
    zeros = xp.zeros(b, dtype=xp.int64) if ops.host else torch.zeros(
        b, dtype=torch.int64, device=ops.device)
    path = xp.full((b, inputs.width), -1, dtype=xp.int64) if ops.host else torch.full(
        (b, inputs.width), -1, dtype=torch.int64, device=ops.device)
    first = tree.first_child[:, 0] if inputs.max_depth > 0 else zeros + n
    return zeros, first, zeros.copy() if ops.host else zeros.clone(), path


def _descend(ops: ArrayOps, inputs: TreeInputs, tree: Tree, accept: Array, child: Array,
             node: Array, a: Array, path: Array) -> tuple[Array, Array, Array, Array]:
    """Accepted requests move into ``child``: ``(node, accepted, path, its first child)``."""
    xp = ops.xp
    n = inputs.num_slots
    col = ops.arange(inputs.width)[None, :]
    path = xp.where((col == a[:, None]) & accept[:, None], child[:, None], path)
    a = a + accept
    node = xp.where(accept, child, node)
    below_limit = a < inputs.max_depth
    first = xp.where(below_limit, ops.pick(tree.first_child, ops.clip(node, 0, n - 1)), n)
    return node, a, path, first


def _greedy_walk(ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> tuple[Array, Array, Array]:
    """Descend into the lowest-index child whose token is the node row's argmax."""
    xp = ops.xp
    n = inputs.num_slots
    g = ops.target_argmax(inputs.target).reshape(inputs.batch_size, n)
    node, ptr, a, path = _start(ops, inputs, tree)
    for _ in range(n - 1):
        child = ops.clip(ptr, 0, n - 1)
        active = ptr < n
        accept = active & (ops.pick(tree.tokens, child) == ops.pick(g, node))
        reject = active & ~accept
        node, a, path, first = _descend(ops, inputs, tree, accept, child, node, a, path)
        ptr = xp.where(accept, first, xp.where(reject, ops.pick(tree.next_sibling, child), ptr))
    return path, ops.pick(g, node), a


def _first_tests(ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> tuple[Array, Array | None]:
    """Per node ``i``: ``p(x_i)`` under its parent's row, computed as torch_eager computes a
    chain's ``p_j(x_j)`` (max and sum of the row, then ``exp((l_x - max) / T) / sum``), and for
    typical the parent row's threshold. Rows of nodes ``0..N-2`` only: node ``N-1`` is a leaf.
    """
    xp = ops.xp
    b, n, v = inputs.batch_size, inputs.num_slots, inputs.vocab_size
    parents = ops.clip(ops.array(inputs.parents), 0, n - 1)
    typical = inputs.sampled_method == "typical"
    request = ops.arange(b)[:, None]
    flat = (request * n + ops.arange(n - 1)[None, :]).reshape(-1)
    parent_rows = request * n + parents  # [B, N]
    if n == 1:
        return xp.zeros((b, 1), dtype=xp.float32) if ops.host else torch.zeros(
            b, 1, device=ops.device), None
    entropy = None
    if inputs.target_is_logits:
        t = _temperatures(ops, ops.array(inputs.temperature))
        m, s, *ey = per_row(ops, _logits_sums(ops, inputs.target, typical), flat,
                            ops.repeat(t, n - 1), width=v, scratch=2 if typical else 1)
        m, s = m.reshape(b, n - 1), s.reshape(b, n - 1)
        par = ops.clip(parents, 0, n - 2)
        e_x = ops.values(inputs.target, parent_rows, tree.tokens) - ops.take(m, par)
        e_x /= t[:, None]
        px = ops.exp_(e_x) / ops.take(s, par)
        if typical:
            entropy = ops.log(s) - ey[0].reshape(b, n - 1) / s
    else:
        px = ops.values(inputs.target, parent_rows, tree.tokens)
        if typical:
            entropy = per_row(ops, _probs_entropy(ops, inputs.target), flat, width=v,
                              scratch=2)[0].reshape(b, n - 1)
    if entropy is None:
        return px, None
    threshold = ops.clip(xp.exp(-entropy) * inputs.typical.alpha, high=inputs.typical.eps)
    return px, threshold


def _node_rows(ops: ArrayOps, inputs: TreeInputs, node: Array, normalise: bool) -> Array:
    """float32 ``[B, V]``: each request's node row as torch_eager's final stage reads it:
    ``exp((l - max) / T)`` from logits (divided by its sum when ``normalise``), else ``p``."""
    b, n, v = inputs.batch_size, inputs.num_slots, inputs.vocab_size
    rows = ops.arange(b) * n + ops.clip(node, 0, n - 1)
    buf = np.empty((b, v), np.float32) if ops.host else torch.empty(
        b, v, dtype=torch.float32, device=ops.device)
    p = ops.load(inputs.target, rows, buf)
    if inputs.target_is_logits:
        t = _temperatures(ops, ops.array(inputs.temperature))
        p -= ops.rowmax(p)[:, None]
        p /= t[:, None]
        ops.exp_(p)
        if normalise:
            p /= ops.rowsum(p)[:, None]
    return p


def _draft_rows(ops: ArrayOps, inputs: TreeInputs, node: Array) -> Array:
    b, n = inputs.batch_size, inputs.num_slots
    rows = ops.arange(b) * n + ops.clip(node, 0, n - 1)
    buf = np.empty((b, inputs.vocab_size), np.float32) if ops.host else torch.empty(
        b, inputs.vocab_size, dtype=torch.float32, device=ops.device)
    return ops.load(inputs.draft_probs, rows, buf)


def _sampled_walk(ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> tuple[Array, Array, Array]:
    xp = ops.xp
    n = inputs.num_slots
    u = ops.array(inputs.uniforms)
    px, threshold = _first_tests(ops, inputs, tree)
    node, ptr, a, path = _start(ops, inputs, tree)
    if inputs.sampled_method == "typical":
        tested = xp.zeros_like(a, dtype=bool) if ops.host else torch.zeros_like(a, dtype=torch.bool)
        for _ in range(n - 1):
            child = ops.clip(ptr, 0, n - 1)
            active = ptr < n
            thr = ops.pick(threshold, ops.clip(node, 0, n - 2))
            accept = active & (ops.pick(px, child) > thr)
            reject = active & ~accept
            tested = (tested | reject) & ~accept
            node, a, path, first = _descend(ops, inputs, tree, accept, child, node, a, path)
            ptr = xp.where(accept, first, xp.where(reject, ops.pick(tree.next_sibling, child),
                                                   ptr))
        e = _node_rows(ops, inputs, node, normalise=False)
        return path, xp.where(tested, ops.argmax(e), _draw(ops, e, u[:, n - 1])[0]), a
    deterministic = inputs.children == "deterministic"
    without_replacement = inputs.children == "without_replacement"
    # r: the residual the tests read (normalised); w: what the draw reads (see the reference).
    # Deterministic children keep w = exp((l - max) / T) with the rejected tokens zeroed, and
    # read r(x) = w(x) / sum(w).
    w = _node_rows(ops, inputs, node, normalise=not deterministic)
    r = w if deterministic else w.copy() if ops.host else w.clone()
    q = None if deterministic else _draft_rows(ops, inputs, node)
    fresh = a == 0  # no child of the current node rejected yet: the first test reads px
    at = ops.arange(inputs.batch_size)
    for _ in range(n - 1):
        child = ops.clip(ptr, 0, n - 1)
        active = ptr < n
        x = ops.pick(tree.tokens, child)
        if deterministic:
            rx_later, qx = ops.pick(w, x) / ops.rowsum(w), 1.0
        else:
            rx_later, qx = ops.pick(r, x), ops.pick(q, x)
        rx = xp.where(fresh, ops.pick(px, child), rx_later)
        ux = ops.pick(u, ops.clip(child - 1, 0, n - 1))
        accept = active & (rx > 0) & (ux * qx <= rx)
        reject = active & ~accept
        if deterministic:
            wx = w[at, x]
            w[at, x] = xp.where(reject, 0.0, wx)
            emptied = reject & ~(ops.rowsum(w) > 0)
            w[at, x] = xp.where(emptied, wx, w[at, x])  # empty residual: keep the previous one
        else:
            residual = ops.relu_(r - q)
            total = ops.rowsum(residual)
            kept = reject & (total > 0)
            w = xp.where(reject[:, None], xp.where(kept[:, None], residual, r), w)
            r = xp.where(kept[:, None], residual / xp.where(kept, total, 1.0)[:, None], r)
            if without_replacement:
                q[at, x] = xp.where(reject, 0.0, q[at, x])
                q_total = ops.rowsum(q)
                q = xp.where((reject & (q_total > 0))[:, None],
                             q / xp.where(q_total > 0, q_total, 1.0)[:, None], q)
        fresh = (fresh & ~reject) | accept
        node, a, path, first = _descend(ops, inputs, tree, accept, child, node, a, path)
        ptr = xp.where(accept, first, xp.where(reject, ops.pick(tree.next_sibling, child), ptr))
        if not ops.host or accept.any():  # the host skips the loads nobody needs
            w_new = _node_rows(ops, inputs, node, normalise=not deterministic)
            w = xp.where(accept[:, None], w_new, w)
            if not deterministic:
                r = xp.where(accept[:, None], w_new, r)
                q = xp.where(accept[:, None], _draft_rows(ops, inputs, node), q)
    return path, _draw(ops, w, u[:, n - 1])[0], a


class TorchTreeBackend(TorchBackend):
    """The torch backend with trees (``pv.verify_tree``)."""

    traits = dataclasses.replace(TorchBackend.traits, supports_trees=True)

    def run_tree(self, inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return verify_tree_torch(inputs)
