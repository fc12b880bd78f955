"""Traversal verification for the torch backend (docs/semantics.md, "Traversal verification";
Weng et al., arXiv 2505.12398): the tree judged from the leaves up, vectorised over the batch.

Why it looks like this: within a request the walk is sequential (a later sibling's weight
depends on what the earlier rejections did to its parent), so one loop of test steps runs
every request at once: a step first enters children down to each request's first remaining
leaf (a short inner loop, one level per pass), then tests one node per request and either
ends the request or folds the rejection into the node's parent. A node is tested at most
once, so there are at most ``N - 1`` steps; on devices the loop counts are fixed (no host
synchronisation), on the host the loops stop once every walk has ended.

State: per node its entered weight ``E`` (float32) and current weight ``W`` (float64); per
request and depth level the draw weights ``D`` of the node on the stack there (its target row,
then its latest non-empty residual) and their float32 sum (``R = D / sum``), and, without
replacement, the remaining draft row ``Q``. Memory is ``B x (depth + 1) x V`` per row kind.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from portable_verify.backends.torch.draw import draw
from portable_verify.core.tree import TreeInputs

Array = Any


def _tensor(x: Array, device: torch.device) -> torch.Tensor:
    """A host numpy array (the tree structure on CPU) or a tensor, as a tensor on ``device``."""
    return torch.as_tensor(np.asarray(x)) if isinstance(x, np.ndarray) else x.to(device)


class Walk:
    """Every request's walk state (see the module docstring), on the inputs' device."""

    def __init__(self, inputs: TreeInputs, tree: Any) -> None:
        target = inputs.target
        self.inputs, self.device = inputs, target.device
        b, n, v = inputs.batch_size, inputs.num_slots, inputs.vocab_size
        self.n, self.host = n, target.device.type == "cpu"
        self.levels = min(inputs.max_depth, n - 1) + 1
        self.batch = torch.arange(b, device=self.device)
        self.tokens = _tensor(tree.tokens, self.device)
        self.first = _tensor(tree.first_child, self.device)
        self.sibling = _tensor(tree.next_sibling, self.device)
        self.parents = inputs.parents.to(self.device).clamp(0, n - 1)
        self.t = torch.where(inputs.temperature > 0, inputs.temperature.clamp(
            torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max), 1.0)
        self.e = torch.ones(b, n, device=self.device)
        self.w = torch.ones(b, n, dtype=torch.float64, device=self.device)
        self.depth = torch.zeros(b, n, dtype=torch.int64, device=self.device)
        self.next = torch.full((b, n), n, dtype=torch.int64, device=self.device)
        self.d = torch.zeros(b, self.levels, v, device=self.device)
        self.d_sum = torch.ones(b, self.levels, device=self.device)
        self.mode = inputs.children
        self.q = (torch.zeros(b, self.levels, v, device=self.device)
                  if self.mode == "without_replacement" else None)
        self.node = torch.zeros(b, dtype=torch.int64, device=self.device)
        self.done = torch.zeros(b, dtype=torch.bool, device=self.device)
        self.enter(~self.done, self.node)

    def _rows(self, source: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
        return source[self.batch * self.n + node].float()

    def enter(self, mask: torch.Tensor, node: torch.Tensor) -> None:
        """The requests of ``mask`` entered ``node``: its target row (and draft row without
        replacement) at its level, its next child to enter."""
        level = self.depth[self.batch, node]
        p = self._rows(self.inputs.target, node)
        if self.inputs.target_is_logits:
            p = torch.softmax(p / self.t[:, None], dim=-1)
        keep = mask[:, None]
        self.d[self.batch, level] = torch.where(keep, p, self.d[self.batch, level])
        self.d_sum[self.batch, level] = torch.where(mask, 1.0, self.d_sum[self.batch, level])
        if self.q is not None:
            q = self._rows(self.inputs.draft_probs, node)
            self.q[self.batch, level] = torch.where(keep, q, self.q[self.batch, level])
        first = torch.where(level < self.inputs.max_depth, self.first[self.batch, node], self.n)
        self.next[self.batch, node] = torch.where(mask, first, self.next[self.batch, node])

    def q_of(self, node: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        """``Q`` of each request's ``node`` (``[B, V]``; not for deterministic children)."""
        if self.q is not None:
            return self.q[self.batch, level]
        return self._rows(self.inputs.draft_probs, node)

    def descend(self) -> None:
        """Enter next children down to each request's first node with none left."""
        for _ in range(self.levels - 1):
            c = self.node
            kid = self.next[self.batch, c]
            can = ~self.done & (kid < self.n)
            if self.host and not bool(can.any()):
                return
            d = kid.clamp(max=self.n - 1)
            x = self.tokens[self.batch, d]
            level = self.depth[self.batch, c]
            r = self.d[self.batch, level, x] / self.d_sum[self.batch, level]
            s = (torch.ones_like(r) if self.mode == "deterministic"
                 else self.q_of(c, level)[self.batch, x])
            w = self.w[self.batch, c]
            e = torch.where((w == 0) | (r == 0), 0.0, torch.where(
                s == 0, 1.0, (w.float() * r / s).clamp(max=1.0)))
            self.e[self.batch, d] = torch.where(can, e, self.e[self.batch, d])
            self.w[self.batch, d] = torch.where(can, e.double(), self.w[self.batch, d])
            self.depth[self.batch, d] = torch.where(can, level + 1, self.depth[self.batch, d])
            self.node = torch.where(can, d, c)
            self.enter(can, self.node)

    def test(self, u: torch.Tensor) -> None:
        """Test each live request's node: accept (the request ends), end at the root, or fold
        the rejection into the parent: ``r = max(W R - Q, 0)``, ``W = S / (S + 1 - W)``."""
        c = self.node
        uc = u[self.batch, (c - 1).clamp(min=0)]
        live = ~self.done & (c > 0)
        accept = live & (uc <= self.e[self.batch, c]) & (uc.double() <= self.w[self.batch, c])
        self.done = self.done | accept | (c == 0)
        reject = live & ~accept
        a = self.parents[self.batch, c]
        x = self.tokens[self.batch, c]
        level = self.depth[self.batch, a]
        w = self.w[self.batch, a]
        d, d_sum = self.d[self.batch, level], self.d_sum[self.batch, level]
        if self.mode == "deterministic":
            q = torch.zeros_like(d)
            q[self.batch, x] = 1.0
        else:
            q = self.q_of(a, level)
        r = torch.relu(w.float()[:, None] * (d / d_sum[:, None]) - q)
        total = r.sum(-1, dtype=torch.float64)
        grown = (reject & (total > 0))
        self.w[self.batch, a] = torch.where(reject, torch.where(
            total > 0, total / (total + (1.0 - w)), 0.0), w)
        self.d[self.batch, level] = torch.where(grown[:, None], r, d)
        self.d_sum[self.batch, level] = torch.where(grown, r.sum(-1), d_sum)
        if self.q is not None:  # after the subtraction: Q loses x, renormalised
            q = q.clone()
            q[self.batch, x] = 0.0
            q_sum = q.sum(-1, keepdim=True)
            q = torch.where(q_sum > 0, q / torch.where(q_sum > 0, q_sum, 1.0), q)
            self.q[self.batch, level] = torch.where(reject[:, None], q, self.q[self.batch, level])
        sibling = self.sibling[self.batch, c]
        self.next[self.batch, a] = torch.where(reject, sibling, self.next[self.batch, a])
        self.node = torch.where(reject, a, c)

    def path(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(path [B, W], accepted [B])``: the nodes from the root down to each final node."""
        b = self.batch.shape[0]
        accepted = self.depth[self.batch, self.node]
        path = torch.full((b, width), -1, dtype=torch.int64, device=self.device)
        node = self.node
        for step in range(width - 1):
            at = accepted - 1 - step
            ok = at >= 0
            path[self.batch, at.clamp(min=0)] = torch.where(
                ok, node, path[self.batch, at.clamp(min=0)])
            node = torch.where(ok, self.parents[self.batch, node], node)
        return path, accepted


def traversal_walk(ops: Any, inputs: TreeInputs, tree: Any,
                   tests: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(path [B, W], final [B], accepted [B])`` of traversal verification for the sampled
    rows (the caller replaces greedy rows), as ``ops``' arrays (numpy on the host); ``tests``,
    the token-level walk's first tests, is not needed here. At most ``N - 1`` test steps."""
    del tests
    walk = Walk(inputs, tree)
    u = inputs.uniforms.to(walk.device)
    for _ in range(walk.n - 1):
        walk.descend()
        if walk.host and bool(walk.done.all()):
            break
        walk.test(u)
    walk.descend()
    walk.test(u)  # no test left: every request that is still live ends at the root
    path, accepted = walk.path(inputs.width)
    level = walk.depth[walk.batch, walk.node]
    final, _ = draw(walk.d[walk.batch, level].contiguous(), u[:, walk.n - 1].contiguous())
    return ops.array(path), ops.array(final), ops.array(accepted)
