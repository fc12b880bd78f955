"""The numpy reference for token trees: docs/semantics.md ("Trees") written as code.

A per-request walk from the root, written for clarity: every line should be checkable against
the prose. The chain rule's pieces (softmax, the inverse-CDF draw, the argmax, the entropy) are
the chain module's own (``numpy/chain.py``), so a chain (``parents = [-1, 0, 1, ...]``) gives
exactly ``verify``'s answer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from portable_verify.backends.numpy.chain import (
    entropy,
    first_argmax,
    inverse_cdf_draw,
    softmax,
)
from portable_verify.backends.numpy.traversal import TraversalWalk
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID


def children_of(tokens: np.ndarray, parents: np.ndarray, n: int, vocab: int) -> list[list[int]]:
    """Each node's children in sibling (index) order. A node is a child only when it lies below
    ``n``, has a valid parent and proposes an id in ``[0, V)``: ``-1`` (no proposal) and, with
    ``validate=False``, any garbage are left out, so they are never tested nor accepted and leave
    the residual unchanged."""
    kids: list[list[int]] = [[] for _ in range(len(tokens))]
    ids, up = tokens.tolist(), parents.tolist()
    for i in range(1, n):
        if 0 <= up[i] < i and 0 <= ids[i] < vocab:
            kids[up[i]].append(i)
    return kids


def walk_one(inputs: TreeInputs, b: int) -> tuple[list[int], int]:
    """``(accepted nodes, next token)`` of request ``b``."""
    n_slots, vocab = inputs.num_slots, inputs.vocab_size
    n = min(max(int(inputs.num_nodes[b]), 1), n_slots)  # garbage (validate=False) clamped
    tokens, parents = inputs.node_token_ids[b], inputs.parents[b]
    kids = children_of(tokens, parents, n, vocab)
    temperature = float(inputs.temperature[b])
    target = inputs.target[b * n_slots:(b + 1) * n_slots]

    def p(i: int) -> np.ndarray:
        if inputs.target_is_logits:
            return softmax(target[i], temperature)
        return target[i].astype(np.float32)

    if inputs.all_greedy or temperature == 0.0:
        return greedy_walk(inputs, tokens, kids, target)
    rule = inputs.sampled_method
    if rule == "traversal":
        return traversal_walk(inputs, b, kids, p)
    if rule in ("rejection", "typical"):
        return token_level_walk(inputs, b, kids, p, rule)
    raise methods.unknown_rule(rule, "numpy", methods.TREE)


def greedy_walk(inputs: TreeInputs, tokens: np.ndarray, kids: list[list[int]],
                target: np.ndarray) -> tuple[list[int], int]:
    """Greedy rows under every method: follow the first child whose token is the argmax."""
    path: list[int] = []
    node = 0
    while True:
        g = first_argmax(target[node])
        options = kids[node] if len(path) < inputs.max_depth else []
        match = next((c for c in options if int(tokens[c]) == g), None)
        if match is None:
            return path, g
        path.append(match)
        node = match


def traversal_walk(inputs: TreeInputs, b: int, kids: list[list[int]],
                   p: Callable[[int], np.ndarray]) -> tuple[list[int], int]:
    """Traversal verification of request ``b`` (numpy/traversal.py)."""
    n_slots = inputs.num_slots
    q = None
    if inputs.children != "deterministic":
        draft = inputs.draft_probs[b * n_slots:(b + 1) * n_slots]

        def q(i: int) -> np.ndarray:
            return draft[i].astype(np.float32)

    return TraversalWalk(inputs.node_token_ids[b], kids, inputs.max_depth, p, q,
                         inputs.uniforms[b], inputs.children == "without_replacement").run()


def token_level_walk(inputs: TreeInputs, b: int, kids: list[list[int]],
                     p: Callable[[int], np.ndarray], rule: str) -> tuple[list[int], int]:
    """The walk from the root, token by token (rejection sampling or typical acceptance)."""
    tokens = inputs.node_token_ids[b]
    u = inputs.uniforms[b]
    v = float(u[inputs.num_slots - 1])
    path: list[int] = []
    node = 0
    while True:
        options = kids[node] if len(path) < inputs.max_depth else []
        pn = p(node)
        if rule == "typical":
            threshold = inputs.typical.threshold(entropy(pn))
            passing = next((c for c in options if pn[int(tokens[c])] > threshold), None)
            if passing is None:
                return path, first_argmax(pn) if options else inverse_cdf_draw(pn, v)
            path.append(passing)
            node = passing
            continue
        chosen = test_children(inputs, b, node, pn, options, tokens, u)
        if isinstance(chosen, np.ndarray):  # no child accepted: the residual to draw from
            return path, inverse_cdf_draw(chosen, v)
        path.append(chosen)
        node = chosen


def test_children(inputs: TreeInputs, b: int, node: int, pn: np.ndarray, options: list[int],
                  tokens: np.ndarray, u: np.ndarray) -> int | np.ndarray:
    """The accepted child of ``node``, or the weights of the next token's draw when none is.

    ``r`` is the current residual (normalised; the node's target row to start with), ``w`` what
    the draw reads: ``r`` itself, or the latest residual before its normalisation, so that one
    rejected child draws from ``max(0, p - q)`` exactly as ``verify`` does.
    """
    r = w = pn
    q = None
    if inputs.children != "deterministic":
        q = inputs.draft_probs[b * inputs.num_slots + node].astype(np.float32)
    for child in options:
        x = int(tokens[child])
        qx = np.float32(1.0) if q is None else np.float32(q[x])
        if r[x] > 0 and np.float32(u[child - 1]) * qx <= r[x]:
            return child
        if q is None:
            qk = np.zeros_like(r)
            qk[x] = 1.0
        else:
            qk = q
        residual = np.maximum(r - qk, np.float32(0))
        if residual.any():
            w, r = residual, (residual / residual.sum(dtype=np.float32)).astype(np.float32)
        else:
            w = r  # empty residual: r is kept (see docs/semantics.md, Trees)
        if inputs.children == "without_replacement":
            q = q.copy()
            q[x] = 0.0
            total = q.sum(dtype=np.float32)
            q = q / total if total > 0 else q
    return w


def verify_tree_reference(inputs: TreeInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(token_ids [B, W], node_ids [B, W], num_accepted [B])`` for numpy inputs."""
    b, width = inputs.batch_size, inputs.width
    tokens = np.full((b, width), PLACEHOLDER_TOKEN_ID, dtype=np.int64)
    nodes = np.full((b, width), -1, dtype=np.int64)
    accepted = np.zeros(b, dtype=np.int64)
    for i in range(b):
        path, final = walk_one(inputs, i)
        path_tokens = [int(inputs.node_token_ids[i, c]) for c in path]
        tokens[i, : len(path) + 1] = [*path_tokens, final]
        nodes[i, : len(path)] = path
        accepted[i] = len(path)
    return tokens, nodes, accepted
