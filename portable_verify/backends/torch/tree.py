"""Tree verification for the torch backend: the walk of docs/semantics.md ("Trees"), vectorised
over the batch.

Why it looks like this: every request walks its own path, but each step of every walk is the
same few array operations, so one loop over *test steps* (at most ``N - 1``: a node is tested
at most once, as a child of its one parent) runs all requests at once. A step tests each
request's next child, then either descends into it or folds it into the residual and moves on
to its next sibling. The loop count is known on the host (no host sync); on CPU, where asking
costs nothing, the loop also stops once every walk has ended. The arithmetic is the torch
chain backend's own (``torch/backend.py``: the first test at a node from the row's max and sum,
the row loads, the two-level draw), so a chain gives exactly ``verify``'s answer on this
backend.

Costs: on CPU only the rows on the walked paths are read (a row's statistics when a request
enters its node, its residual at the node's first rejection, the draw's row at the end), and
each step touches only the requests concerned (index arrays). On devices every row's
statistics come from one up-front pass and the steps run under masks over the whole batch.
Figures: docs/benchmarks.md ("Trees").
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import torch

from portable_verify.backends.torch.draw import _draw
from portable_verify.backends.torch.ops import (
    ArrayOps,
    _logits_sums,
    _probs_entropy,
    _temperatures,
    per_row,
)
from portable_verify.backends.torch.traversal import traversal_walk
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.tree_validation import check_tree_inputs
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
    first_child = ops.rowmin(xp.where(is_child, index[None, None, :], n))
    later = index[None, None, :] > index[None, :, None]  # j > i
    sibling = (parent[:, :, None] == parent[:, None, :]) & valid[:, None, :] & later
    next_sibling = ops.rowmin(xp.where(sibling, index[None, None, :], n))
    return Tree(ops.clip(tokens, 0, v - 1), valid, first_child, next_sibling)


def verify_tree_torch(inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token_ids [B, W], node_ids [B, W], num_accepted [B])`` for torch tensors.

    With ``check_read_values`` it checks every value first (``check_tree_inputs``): it cannot
    check on the way, and this is how a value a compiled walk only flagged gets its words."""
    if inputs.check_read_values:
        check_tree_inputs(inputs)
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


def _row_argmax(ops: ArrayOps, inputs: TreeInputs, requests: np.ndarray,
                node: np.ndarray) -> np.ndarray:
    """Host: the argmax (lowest index on ties) of those requests' node rows."""
    rows = requests * inputs.num_slots + node
    if inputs.target.dtype == torch.float32:
        return np.argmax(_load(ops, inputs.target, rows, "argmax"), axis=-1)
    return torch.argmax(inputs.target[torch.from_numpy(rows)], dim=-1).numpy()


def _greedy_walk(ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> tuple[Array, Array, Array]:
    """Descend into the lowest-index child whose token is the node row's argmax. The host
    takes the argmax of a row when a request enters its node (the walked rows only); devices
    take every row's in one pass."""
    xp = ops.xp
    n = inputs.num_slots
    node, ptr, a, path = _start(ops, inputs, tree)
    if ops.host:
        g_now = _row_argmax(ops, inputs, np.arange(inputs.batch_size), node)
    else:
        g = ops.target_argmax(inputs.target).reshape(inputs.batch_size, n)
    for _ in range(n - 1):
        active = ptr < n
        if ops.host and not active.any():  # every walk has ended (free to know on the host)
            break
        child = ops.clip(ptr, 0, n - 1)
        accept = active & (ops.pick(tree.tokens, child) == (g_now if ops.host
                                                            else ops.pick(g, node)))
        reject = active & ~accept
        node, a, path, first = _descend(ops, inputs, tree, accept, child, node, a, path)
        if ops.host and accept.any():
            at = np.flatnonzero(accept)
            g_now[at] = _row_argmax(ops, inputs, at, node[at])
        ptr = xp.where(accept, first, xp.where(reject, ops.pick(tree.next_sibling, child), ptr))
    return path, g_now if ops.host else ops.pick(g, node), a


class FirstTests:
    """``p(x)`` of a node's children under its row, and (typical) the row's threshold, computed
    as the torch chain backend computes a chain's ``p_j(x_j)``: the row's max ``m`` and sum ``s`` of
    ``exp((l - m) / T)``, then ``exp((l_x - m) / T) / s``.

    On the host the statistics are computed for a row when a request enters its node (only the
    rows on the walked paths are read); on devices for every row that can have children (nodes
    ``0..N-2``) in one pass up front, so nothing waits on the host.
    """

    def __init__(self, ops: ArrayOps, inputs: TreeInputs, tree: Tree, typical: bool) -> None:
        self.ops, self.inputs, self.tree = ops, inputs, tree
        b, n = inputs.batch_size, inputs.num_slots
        self.typical = typical
        self.t = _temperatures(ops, ops.array(inputs.temperature))
        self.requests = ops.arange(b)
        if ops.host:
            zeros = np.zeros(b, np.float32)
            self.m, self.s, self.threshold_now = zeros, zeros.copy(), zeros.copy()
            self.enter(np.ones(b, dtype=bool), np.zeros(b, dtype=np.int64))
            return
        rows = (self.requests[:, None] * n + ops.arange(max(n - 1, 1))[None, :]).reshape(-1)
        m, s, threshold = self._stats(rows, ops.repeat(self.t, max(n - 1, 1)))
        self.m_all, self.s_all, self.threshold_all = (
            None if x is None else x.reshape(b, -1) for x in (m, s, threshold))

    def _stats(self, rows: Array, t: Array) -> tuple[Array | None, Array | None, Array | None]:
        ops, inputs = self.ops, self.inputs
        v = inputs.vocab_size
        m = s = entropy = None
        if inputs.target_is_logits:
            m, s, *ey = per_row(ops, _logits_sums(ops, inputs.target, self.typical), rows, t,
                                width=v, scratch=2 if self.typical else 1)
            if self.typical:
                entropy = ops.log(s) - ey[0] / s
        elif self.typical:
            entropy = per_row(ops, _probs_entropy(ops, inputs.target), rows, width=v,
                              scratch=2)[0]
        if entropy is None:
            return m, s, None
        return m, s, inputs.typical.threshold(entropy, ops.xp)

    def enter(self, mask: Array, node: Array) -> None:
        """The requests of ``mask`` moved to ``node``: their row's statistics (host only)."""
        if not self.ops.host or not (self.inputs.target_is_logits or self.typical):
            return
        at = np.flatnonzero(mask)
        if at.size == 0:
            return
        rows = at * self.inputs.num_slots + node[at]
        m, s, threshold = self._stats(rows, self.t[at])
        if m is not None:
            self.m[at], self.s[at] = m, s
        if threshold is not None:
            self.threshold_now[at] = threshold

    def weight(self, child: Array, node: Array) -> Array:
        """The child's entry in its parent's row as the draw reads it: ``exp((l_x - m) / T)``
        from logits, ``p(x)`` from probabilities."""
        ops, n = self.ops, self.inputs.num_slots
        rows = self.requests * n + ops.clip(node, 0, n - 1)
        value = ops.values(self.inputs.target, rows, ops.pick(self.tree.tokens, child))
        if not self.inputs.target_is_logits:
            return value
        e_x = value - self._row_stat(node)[0]
        e_x /= self.t
        return ops.exp_(e_x)

    def px(self, child: Array, node: Array) -> Array:
        """``p(x_child)`` under the row of ``node`` (the child's parent)."""
        e_x = self.weight(child, node)
        return e_x / self._row_stat(node)[1] if self.inputs.target_is_logits else e_x

    def _row_stat(self, node: Array) -> tuple[Array, Array]:
        if self.ops.host:
            return self.m, self.s
        at = self.ops.clip(node, 0, max(self.inputs.num_slots - 2, 0))
        return self.ops.pick(self.m_all, at), self.ops.pick(self.s_all, at)

    def threshold(self, node: Array) -> Array:
        if self.ops.host:
            return self.threshold_now
        return self.ops.pick(self.threshold_all, self.ops.clip(node, 0, max(self.inputs.num_slots
                                                                          - 2, 0)))


_pool = threading.local()


def _rows_buffer(ops: ArrayOps, name: str, rows: int, width: int) -> Array:
    """A float32 ``[rows, width]`` buffer. On the host one per ``name`` is kept per thread and
    reused across calls: a fresh multi-MiB array costs a page fault per 4 KiB on first touch,
    which measured dearer than the row copy itself. Names in use at the same time differ."""
    if not ops.host:
        return torch.empty(rows, width, dtype=torch.float32, device=ops.device)
    store: dict[str, np.ndarray] = getattr(_pool, "buffers", {})
    _pool.buffers = store
    need = rows * width
    if store.get(name) is None or store[name].size < need:
        store[name] = np.empty(need, np.float32)
    return store[name][:need].reshape(rows, width)


def _load(ops: ArrayOps, source: torch.Tensor, rows: Array, name: str) -> Array:
    """float32 ``source[rows]`` in the buffer ``name`` (rows already in range)."""
    out = _rows_buffer(ops, name, rows.shape[0], source.shape[-1])
    if ops.host and source.dtype == torch.float32:
        # mode="clip": an unbuffered copy (numpy buffers the whole output under "raise").
        return np.take(source.numpy(), rows, axis=0, out=out, mode="clip")
    return ops.load(source, rows, out)


def _node_rows(ops: ArrayOps, inputs: TreeInputs, requests: Array, node: Array,
               normalise: bool, name: str = "node") -> Array:
    """float32 ``[len(requests), V]``: those requests' node rows as the torch chain backend's
    final stage reads them: ``exp((l - max) / T)`` from logits (divided by its sum when
    ``normalise``), else ``p``."""
    n = inputs.num_slots
    p = _load(ops, inputs.target, requests * n + ops.clip(node, 0, n - 1), name)
    if inputs.target_is_logits:
        t = _temperatures(ops, ops.array(inputs.temperature))[requests]
        p -= ops.rowmax(p)[:, None]
        p /= t[:, None]
        ops.exp_(p)
        if normalise:
            p /= ops.rowsum(p)[:, None]
    return p


def _draft_rows(ops: ArrayOps, inputs: TreeInputs, requests: Array, node: Array) -> Array:
    n = inputs.num_slots
    return _load(ops, inputs.draft_probs, requests * n + ops.clip(node, 0, n - 1), "draft")


def _typical_walk(ops: ArrayOps, inputs: TreeInputs, tree: Tree,
                  tests: FirstTests) -> tuple[Array, Array, Array]:
    """First passing child per node; none passing: the row's argmax; a leaf: a draw."""
    xp, n = ops.xp, inputs.num_slots
    node, ptr, a, path = _start(ops, inputs, tree)
    tested = a < 0  # all False: no child of the current node failed yet
    for _ in range(n - 1):
        active = ptr < n
        if ops.host and not active.any():  # every walk has ended (free to know on the host)
            break
        child = ops.clip(ptr, 0, n - 1)
        accept = active & (tests.px(child, node) > tests.threshold(node))
        reject = active & ~accept
        tested = (tested | reject) & ~accept
        node, a, path, first = _descend(ops, inputs, tree, accept, child, node, a, path)
        tests.enter(accept, node)
        ptr = xp.where(accept, first, xp.where(reject, ops.pick(tree.next_sibling, child), ptr))
    e = _node_rows(ops, inputs, ops.arange(inputs.batch_size), node, normalise=False)
    u = ops.array(inputs.uniforms)
    return path, xp.where(tested, ops.argmax(e), _draw(ops, e, u[:, n - 1])[0]), a


class Residuals:
    """Each request's residual at its current node, as ``[B, V]`` rows.

    ``r``: what the tests read (normalised); ``w``: what the draw reads (the latest residual
    before its normalisation, so one rejected child draws from ``max(0, p - q)`` exactly as
    ``verify`` does); ``q``: the current draft row. Deterministic children keep only ``w`` (the
    row ``exp((l - max) / T)`` with the rejected tokens zeroed) and its sum. Rows are loaded
    lazily, at a node's first rejection: the first test reads ``p(x)`` from the row's max and
    sum, as a chain does. On the host only the requests concerned are touched (index arrays);
    on devices every request is, under masks (no host synchronisation).
    """

    def __init__(self, ops: ArrayOps, inputs: TreeInputs) -> None:
        self.ops, self.inputs = ops, inputs
        self.deterministic = inputs.children == "deterministic"
        b, v = inputs.batch_size, inputs.vocab_size
        zeros = (lambda: np.zeros((b, v), np.float32)) if ops.host else (
            lambda: torch.zeros(b, v, dtype=torch.float32, device=ops.device))
        self.w = zeros()
        self.r = None if self.deterministic else zeros()
        self.q = None if self.deterministic else zeros()
        self.w_sum = ops.xp.ones(b, dtype=ops.xp.float32) if ops.host else torch.ones(
            b, device=ops.device)

    def later_test(self, x: Array) -> tuple[Array, Array]:
        """``(r(x), q(x))`` for requests past their node's first rejection."""
        ops = self.ops
        if self.deterministic:
            return ops.pick(self.w, x) / self.w_sum, 1.0
        return ops.pick(self.r, x), ops.pick(self.q, x)

    def load(self, mask: Array, node: Array) -> None:
        """Start the residual of ``mask``'s requests at their node's rows."""
        ops, inputs = self.ops, self.inputs
        at, nodes = self._select(mask, node)
        if at is None:
            return
        rows = _node_rows(ops, inputs, at, nodes, normalise=not self.deterministic)
        self._put("w", at, mask, rows)
        if self.deterministic:
            self._put("w_sum", at, mask, ops.rowsum(rows))
        else:
            self._put("r", at, mask, rows)
            self._put("q", at, mask, _draft_rows(ops, inputs, at, nodes))

    def reject(self, mask: Array, x: Array) -> None:
        """Fold the rejected child ``x`` into the residual of ``mask``'s requests."""
        ops, xp = self.ops, self.ops.xp
        at, x = self._select(mask, x)
        if at is None:
            return
        inner = ops.arange(at.shape[0])
        if self.deterministic:
            w = self._get("w", at)
            wx = w[inner, x]
            w[inner, x] = 0.0
            total = ops.rowsum(w)
            emptied = ~(total > 0)  # an empty residual keeps the previous one
            w[inner, x] = xp.where(emptied, wx, 0.0)
            self._put("w", at, mask, w)
            self._put("w_sum", at, mask, xp.where(emptied, self._get("w_sum", at), total))
            return
        r, q = self._get("r", at), self._get("q", at)
        residual = ops.relu_(r - q)
        total = ops.rowsum(residual)
        kept = (total > 0)[:, None]
        self._put("w", at, mask, xp.where(kept, residual, r))
        self._put("r", at, mask, xp.where(kept, residual / xp.where(kept, total[:, None], 1.0),
                                          r))
        if self.inputs.children == "without_replacement":  # after the subtraction
            q[inner, x] = 0.0
            q_total = ops.rowsum(q)[:, None]
            self._put("q", at, mask, xp.where(q_total > 0, q / xp.where(q_total > 0, q_total,
                                                                         1.0), q))

    def _select(self, mask: Array, values: Array) -> tuple[Array | None, Array]:
        if not self.ops.host:
            return self.ops.arange(mask.shape[0]), values
        at = np.flatnonzero(mask)
        return (at if at.size else None), values[at]

    def _get(self, name: str, at: Array) -> Array:
        value = getattr(self, name)
        return value[at] if self.ops.host else value.clone()

    def _put(self, name: str, at: Array, mask: Array, value: Array) -> None:
        if self.ops.host:
            getattr(self, name)[at] = value
            return
        old = getattr(self, name)
        setattr(self, name, torch.where(mask.reshape(-1, *([1] * (old.dim() - 1))), value, old))


class PointMassResiduals:
    """The residual of deterministic children, without rows: rejecting ``x`` zeroes one entry
    of the node's row ``w`` (``exp((l - m) / T)``, or ``p``), so the walk keeps per request the
    row's remaining sum, how many positive entries are left and which children were removed;
    a later child is tested against ``w(x) / sum``. The one row pass per node is at its first
    rejection (the sum and the count); the draw reads the last node's row with the removed
    tokens zeroed, exactly the row ``verify`` draws from after one rejection.
    """

    def __init__(self, ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> None:
        self.ops, self.inputs, self.tree = ops, inputs, tree
        b, xp = inputs.batch_size, ops.xp
        self.total = xp.ones(b, dtype=xp.float32) if ops.host else torch.ones(b, device=ops.device)
        self.positive = tree.first_child[:, 0] * 0  # int64 [B] zeros of the right kind
        self.removed = tree.valid & False  # bool [B, N]: child i removed at the current node

    def _duplicate(self, x: Array) -> Array:
        return (self.removed & (self.tree.tokens == x[:, None])).any(1)

    def later_test(self, x: Array, w_x: Array) -> Array:
        return self.ops.xp.where(self._duplicate(x), 0.0, w_x) / self.total

    def load(self, mask: Array, node: Array) -> None:
        """The node's row sum and positive count, at its first rejection."""
        ops, xp = self.ops, self.ops.xp
        if ops.host:
            at = np.flatnonzero(mask)
            if at.size:
                rows = _node_rows(ops, self.inputs, at, node[at], normalise=False)
                self.total[at] = ops.rowsum(rows)
                self.positive[at] = (rows > 0).sum(1)
            return
        rows = _node_rows(ops, self.inputs, ops.arange(mask.shape[0]), node, normalise=False)
        self.total = xp.where(mask, ops.rowsum(rows), self.total)
        self.positive = xp.where(mask, (rows > 0).sum(1), self.positive)

    def reject(self, mask: Array, child: Array, x: Array, w_x: Array) -> None:
        """Remove ``x`` unless it is already gone, has no mass, or is the last positive entry
        (an empty residual keeps the previous one)."""
        xp = self.ops.xp
        remove = mask & ~self._duplicate(x) & (w_x > 0) & (self.positive > 1)
        col = self.ops.arange(self.removed.shape[1])[None, :]
        self.removed = self.removed | (remove[:, None] & (col == child[:, None]))
        self.total = xp.where(remove, self.total - w_x, self.total)
        self.positive = self.positive - remove * 1  # bool to int on numpy and torch alike

    def descend(self, accept: Array) -> None:
        self.removed = self.removed & ~accept[:, None]

    def draw_weights(self, node: Array) -> Array:
        ops = self.ops
        b, v = self.inputs.batch_size, self.inputs.vocab_size
        w = _node_rows(ops, self.inputs, ops.arange(b), node, normalise=False, name="draw")
        if ops.host:
            request, child = np.nonzero(self.removed)
            w[request, self.tree.tokens[request, child]] = 0.0
            return w
        hits = torch.zeros(b, v, dtype=torch.int64, device=ops.device).scatter_add_(
            1, self.tree.tokens, self.removed.to(torch.int64))
        return torch.where(hits > 0, 0.0, w)


def _rejection_walk(ops: ArrayOps, inputs: TreeInputs, tree: Tree,
                    tests: FirstTests) -> tuple[Array, Array, Array]:
    xp = ops.xp
    n = inputs.num_slots
    u = ops.array(inputs.uniforms)
    deterministic = inputs.children == "deterministic"
    state: Any = (PointMassResiduals(ops, inputs, tree) if deterministic
                  else Residuals(ops, inputs))
    qx_first = None
    if not deterministic:  # q(x) of each node under its parent's draft row
        parent_rows = (ops.arange(inputs.batch_size)[:, None] * n
                       + ops.clip(ops.array(inputs.parents), 0, n - 1))
        qx_first = ops.values(inputs.draft_probs, parent_rows, tree.tokens)
    node, ptr, a, path = _start(ops, inputs, tree)
    fresh = a == 0  # no child of the current node rejected yet: the first test reads px
    for _ in range(n - 1):
        active = ptr < n
        if ops.host and not active.any():  # every walk has ended (free to know on the host)
            break
        child = ops.clip(ptr, 0, n - 1)
        x = ops.pick(tree.tokens, child)
        if deterministic:
            w_x = tests.weight(child, node)
            px = w_x / tests._row_stat(node)[1] if inputs.target_is_logits else w_x
            rx, qx = xp.where(fresh, px, state.later_test(x, w_x)), 1.0
        else:
            rx_later, qx_later = state.later_test(x)
            rx = xp.where(fresh, tests.px(child, node), rx_later)
            qx = xp.where(fresh, ops.pick(qx_first, child), qx_later)
        accept = active & (rx > 0) & (ops.pick(u, ops.clip(child - 1, 0, n - 1)) * qx <= rx)
        reject = active & ~accept
        state.load(reject & fresh, node)
        if deterministic:
            state.reject(reject, child, x, w_x)
            state.descend(accept)
        else:
            state.reject(reject, x)
        fresh = (fresh & ~reject) | accept
        node, a, path, first = _descend(ops, inputs, tree, accept, child, node, a, path)
        tests.enter(accept, node)
        ptr = xp.where(accept, first, xp.where(reject, ops.pick(tree.next_sibling, child), ptr))
    if deterministic:
        weights = state.draw_weights(node)
    else:
        state.load(fresh, node)  # no rejection at the last node: the draw reads its row
        weights = state.w
    return path, _draw(ops, weights, u[:, n - 1])[0], a


def _sampled_walk(ops: ArrayOps, inputs: TreeInputs, tree: Tree) -> tuple[Array, Array, Array]:
    rule = inputs.sampled_method
    walk = TREE_RULES.get(rule)  # type: ignore[arg-type]
    if walk is None:
        raise methods.unknown_rule(rule, f"torch:{inputs.target.device.type}", methods.TREE)
    # Only the typical walk's tests compute the rows' thresholds (and entropies).
    return walk(ops, inputs, tree, FirstTests(ops, inputs, tree, walk is _typical_walk))


TREE_RULES = {"rejection": _rejection_walk, "typical": _typical_walk,
              "traversal": traversal_walk}
"""The sampled rules this backend implements for trees (its traits read the keys)."""
