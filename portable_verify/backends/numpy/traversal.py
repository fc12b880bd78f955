"""Traversal verification, the numpy reference: docs/semantics.md ("Traversal verification")
written as code, one request at a time, for clarity rather than speed.

The walk enters nodes in preorder (a child's weight is computed when it is entered, from its
parent's *current* state), tests a node once all of its children were entered and rejected
(post-order), and on a rejection updates the parent's weight, law and draw weights. The first
test that passes ends the request. On a chain this is block verification decision for decision
(same float32/float64 arithmetic as ``chain.block_one``).

The state changes are small methods of :class:`TraversalWalk` so that the conformance kit's
negative controls (testing/stats/traversal_controls.py) can each change exactly one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from portable_verify.backends.numpy.chain import inverse_cdf_draw

F32_ZERO, F32_ONE = np.float32(0.0), np.float32(1.0)


def weight(w: float, r: np.float32, s: np.float32) -> np.float32:
    """``min(w r / s, 1)`` in float32; 0 when ``w`` or ``r`` is 0, 1 when only ``s`` is (the
    ratio is +inf and capped), exactly as block verification's ``P_j``."""
    if w == 0 or r == 0:
        return F32_ZERO
    if s == 0:
        return F32_ONE
    return min(np.float32(w) * r / s, F32_ONE)


@dataclass
class Entered:
    """The state of a node once the walk has entered it.

    ``entered`` (E, float32) is its weight when entered; ``weight`` (W) its current one (float64
    after a child's rejection updated it); ``law`` (R) the target-side law of the token after
    it; ``draw`` (D) the weights of the draw if the request ends here; ``q`` the law its next
    child was drawn from (``None``: deterministic children, a point mass at the child's token);
    ``next_child`` (k) the index of its next child to enter.
    """

    node: int
    entered: np.float32
    weight: float
    law: np.ndarray
    draw: np.ndarray
    q: np.ndarray | None
    next_child: int = 0


class TraversalWalk:
    """One request's walk. ``kids[i]``: node ``i``'s children in sibling order (``-1`` nodes and
    garbage already left out); ``p(i)``: target row ``i`` as float32 probabilities; ``q(i)``: draft
    row ``i`` (``None`` for deterministic children); ``u``: the request's uniforms (node ``i``
    tests with column ``i - 1``, the draw reads the last column)."""

    def __init__(self, tokens: np.ndarray, kids: list[list[int]], max_depth: int,
                 p: Callable[[int], np.ndarray], q: Callable[[int], np.ndarray] | None,
                 u: np.ndarray, without_replacement: bool) -> None:
        self.tokens, self.kids, self.max_depth = tokens, kids, max_depth
        self.p, self.q, self.u = p, q, u
        self.without_replacement = without_replacement

    def run(self) -> tuple[list[int], int]:
        """``(accepted nodes, next token)``: the post-order walk over a stack of entered nodes
        (the current root-to-node path)."""
        root = self.state(0, F32_ONE)
        stack = [root]
        while True:
            top = stack[-1]
            options = self.kids[top.node] if len(stack) - 1 < self.max_depth else []
            if top.next_child < len(options):  # descend to the first remaining leaf
                stack.append(self.enter(top, options[top.next_child]))
                continue
            if top is root:  # every child of the root rejected
                return [], self.next_token(root)
            if self.passes(top):
                return [s.node for s in stack[1:]], self.next_token(top)
            stack.pop()
            self.reject(stack[-1], top.node)

    def state(self, node: int, entered: np.float32) -> Entered:
        """A node's state when entered with weight ``entered``: ``R = D = p``, ``Q = q``
        (the draft row is read only when the node has children)."""
        row = self.p(node)
        has_kids = bool(self.kids[node])
        q = self.q(node) if self.q is not None and has_kids else None
        return Entered(node, entered, entered, row, row, q)

    def enter(self, parent: Entered, child: int) -> Entered:
        """The child's weight from its parent's *current* weight and law, and the law its token
        was drawn from: ``min(W R(x) / Q(x), 1)``."""
        x = int(self.tokens[child])
        s = F32_ONE if parent.q is None else np.float32(parent.q[x])
        return self.state(child, weight(parent.weight, parent.law[x], s))

    def passes(self, node: Entered) -> bool:
        """Node ``c``'s one test, ``u <= E and u <= W`` (``u``: column ``c - 1``); the first
        condition is implied in exact arithmetic and is there for floating point."""
        u = np.float32(self.u[node.node - 1])
        return bool(u <= node.entered) and float(u) <= node.weight

    def reject(self, parent: Entered, child: int) -> None:
        """Delete the rejected ``child`` and update its parent: ``r = max(W R - Q, 0)`` with the
        weight and the ``Q`` from *before* this update, ``W <- S / (S + 1 - W)``, ``R <- r / S``,
        ``D <- r``; an empty residual (``S = 0``) sets ``W = 0`` and keeps ``R`` and ``D``."""
        x = int(self.tokens[child])
        r = np.maximum(np.float32(parent.weight) * parent.law - self.drawn_from(parent, x),
                       F32_ZERO)
        total = float(r.sum(dtype=np.float64))
        if total > 0:
            parent.weight = self.new_weight(parent, total, x)
            parent.law = (r / r.sum(dtype=np.float32)).astype(np.float32)
            parent.draw = r
        else:
            parent.weight = 0.0
        if self.without_replacement:
            parent.q = without(parent.q, x)
        parent.next_child += 1

    def new_weight(self, parent: Entered, total: float, x: int) -> float:
        """``S / (S + 1 - W)``: the chance the parent is still accepted given that this child's
        subtree was rejected (block verification's ``h``)."""
        return total / (total + (1.0 - float(parent.weight)))

    def drawn_from(self, parent: Entered, x: int) -> np.ndarray:
        """The law the rejected child's token ``x`` was drawn from (a point mass when the
        children are deterministic)."""
        if parent.q is not None:
            return parent.q
        one_hot = np.zeros_like(parent.law)
        one_hot[x] = 1.0
        return one_hot

    def next_token(self, node: Entered) -> int:
        """The inverse-CDF draw from the node's draw weights ``D`` (its target row when no child
        was rejected, else the latest residual) with the draw uniform."""
        return inverse_cdf_draw(node.draw, float(self.u[-1]))


def without(q: np.ndarray, x: int) -> np.ndarray:
    """``q`` without token ``x``, renormalised (as the token-level rule): the next sibling's law
    when children are drawn without replacement."""
    q = q.copy()
    q[x] = 0.0
    total = q.sum(dtype=np.float32)
    return q / total if total > 0 else q
