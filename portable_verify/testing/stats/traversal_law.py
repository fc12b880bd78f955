"""Exact laws of traversal verification and of the token-level rule, by enumeration.

Written independently of the reference's walk (backends/numpy/traversal.py): a recursion over
the subtrees in float64 that integrates the verifier's randomness out instead of drawing it.
It rests on the fact behind the rule's exactness: once a child's whole subtree is rejected, the
parent's update depends only on the child's token, not on how the subtree was rejected; so a
node's subtree is summarised by the law of its accepting outcomes and its rejection chance.

``variant`` names a deliberately wrong rule (the conformance kit's negative controls) so that
each control's exact law, hence the test's exact power against it, is known:
``bonus_from_row`` (the next token from the node's row after its children were rejected),
``keep_weight`` (the parent's weight not updated), ``s_over_q`` (it becomes
``min(S / (1 - Q(x)), 1)``) and ``token_ratio`` (a child's weight leaves out the parent's
current weight).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

VARIANTS = ("", "bonus_from_row", "keep_weight", "s_over_q", "token_ratio")

Outcome = tuple[tuple[int, ...], int]  # (accepted nodes, next token)


@dataclass(frozen=True)
class FixedTree:
    """One drafted tree: ``tokens[i]`` proposed by node ``i`` (``tokens[0]`` unused), target
    rows ``p[i]`` and draft rows ``q[i]`` (float64, each summing to 1), children ``mode``."""

    parents: tuple[int, ...]
    tokens: tuple[int, ...]
    p: np.ndarray
    q: np.ndarray
    mode: str

    def children(self, node: int) -> list[int]:
        return [c for c in range(1, len(self.parents)) if self.parents[c] == node]


def _ratio(w: float, r: float, s: float) -> float:
    if w == 0 or r == 0:
        return 0.0
    return 1.0 if s == 0 else min(w * r / s, 1.0)


def traversal_law(tree: FixedTree, variant: str = "") -> dict[Outcome, float]:
    """``P(accepted nodes, next token)`` of traversal verification on one fixed tree."""
    law, _ = _subtree(tree, 0, 1.0, (), variant)
    return law


def _subtree(tree: FixedTree, a: int, entered: float, path: tuple[int, ...],
             variant: str) -> tuple[dict[Outcome, float], float]:
    """Node ``a``'s subtree entered with weight ``entered``: the law of its accepting outcomes
    and the chance that every node of it (``a`` included) is rejected."""
    w, law_r, draw = entered, tree.p[a].copy(), tree.p[a].copy()
    q = tree.q[a].copy()
    out: dict[Outcome, float] = {}
    alive = 1.0  # the chance the walk is still inside a's subtree
    for c in tree.children(a):
        x = tree.tokens[c]
        drawn = q if tree.mode != "deterministic" else np.eye(len(q))[x]
        w_in = 1.0 if variant == "token_ratio" and w > 0 else w
        sub, rejected = _subtree(tree, c, _ratio(w_in, law_r[x], drawn[x]), (*path, c), variant)
        for key, prob in sub.items():
            out[key] = out.get(key, 0.0) + alive * prob
        alive *= rejected
        r = np.maximum(w * law_r - drawn, 0.0)
        s = r.sum()
        if s > 0:
            w = _new_weight(w, s, drawn[x], variant)
            law_r, draw = r / s, r
        else:
            w = 0.0
        if tree.mode == "without_replacement":
            q[x] = 0.0
            q = q / q.sum() if q.sum() > 0 else q
    accept = 1.0 if a == 0 else min(entered, w)
    final = tree.p[a] if variant == "bonus_from_row" else draw / draw.sum()
    for y in np.flatnonzero(final > 0):
        out[(path, int(y))] = out.get((path, int(y)), 0.0) + alive * accept * final[y]
    return out, alive * (1.0 - accept)


def _new_weight(w: float, s: float, qx: float, variant: str) -> float:
    if variant == "keep_weight":
        return w
    if variant == "s_over_q":
        return min(s / (1.0 - qx), 1.0) if qx < 1 else 1.0
    return s / (s + 1.0 - w)


def token_level_accepted(tree: FixedTree, node: int = 0) -> float:
    """Expected accepted drafts of the token-level rule (the root-down walk of
    docs/semantics.md, "Trees") on one fixed tree, its uniforms integrated out."""
    r, q = tree.p[node].copy(), tree.q[node].copy()
    alive, total = 1.0, 0.0
    for c in tree.children(node):
        x = tree.tokens[c]
        drawn = q if tree.mode != "deterministic" else np.eye(len(q))[x]
        accept = _ratio(1.0, r[x], drawn[x])
        total += alive * accept * (1.0 + token_level_accepted(tree, c))
        alive *= 1.0 - accept
        residual = np.maximum(r - drawn, 0.0)
        if residual.sum() > 0:
            r = residual / residual.sum()
        if tree.mode == "without_replacement":
            q[x] = 0.0
            q = q / q.sum() if q.sum() > 0 else q
    return total


def traversal_accepted(tree: FixedTree) -> float:
    """Expected accepted drafts of traversal verification on one fixed tree."""
    return sum(len(path) * prob for (path, _), prob in traversal_law(tree).items())


def draft_trees(parents: tuple[int, ...], q_of: dict[tuple[int, ...], np.ndarray],
                mode: str) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every draft tree of the shape with its probability: children drawn from their parent's
    draft row ``q_of[prefix]`` i.i.d. or without replacement, in sibling order."""
    n = len(parents)

    def extend(tokens: tuple[int, ...], prob: float) -> Iterator[tuple[tuple[int, ...], float]]:
        i = len(tokens)
        if i == n:
            yield tokens, prob
            return
        row = q_of[prefix_of(parents, tokens, parents[i])]
        if mode == "without_replacement":
            row = row.copy()
            earlier = [tokens[j] for j in range(1, i) if parents[j] == parents[i]]
            row[earlier] = 0.0
            row = row / row.sum()
        for x in np.flatnonzero(row > 0):
            yield from extend((*tokens, int(x)), prob * float(row[x]))

    yield from extend((0,), 1.0)


def prefix_of(parents: tuple[int, ...], tokens: tuple[int, ...], node: int) -> tuple[int, ...]:
    """The tokens on the path from the root to ``node`` (the root's prefix is empty)."""
    out: list[int] = []
    while node > 0:
        out.append(tokens[node])
        node = parents[node]
    return tuple(reversed(out))
