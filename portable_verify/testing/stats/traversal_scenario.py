"""The statistical traversal scenario: the joint law of (accepted path, next token) against the
exact law by enumeration (testing/stats/traversal_law.py).

Why this shape and these tables: depth-1 trees and chains hide most errors in the rule (the
root's weight stays 1; a chain has no siblings), and so do models whose first-level weights
are all 0 or 1. The tree ``[-1, 0, 0, 1, 1, 2, 2]`` has siblings below the root at depth 2;
the tables (V = 3, a target and a draft row per prefix, strictly positive) were chosen by seed
so that the first-level weights lie strictly between 0 and 1 and every wrong variant moves the
joint law by a total variation of at least ``MIN_CONTROL_TV`` (asserted by the tests).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from portable_verify.testing.stats.traversal_law import (
    FixedTree,
    Outcome,
    draft_trees,
    prefix_of,
    traversal_law,
)

VOCAB = 3
PARENTS = (-1, 0, 0, 1, 1, 2, 2)
DEPTH = 2
TABLE_SEED = 20261229
MIN_CONTROL_TV = 0.04

Key = tuple[tuple[int, ...], tuple[int, ...], int]  # (accepted nodes, their tokens, next token)


@dataclass(frozen=True)
class TraversalScenario:
    """Target and draft rows per prefix (float32 tables; the law is computed in float64)."""

    p: dict[tuple[int, ...], np.ndarray]
    q: dict[tuple[int, ...], np.ndarray]


def make_scenario(seed: int = TABLE_SEED) -> TraversalScenario:
    gen = np.random.default_rng(seed)
    p, q = {}, {}
    for length in range(DEPTH + 1):
        for prefix in itertools.product(range(VOCAB), repeat=length):
            p[prefix] = _row(gen.dirichlet(np.full(VOCAB, 1.0)))
            q[prefix] = _row(gen.dirichlet(np.full(VOCAB, 1.0)))
    return TraversalScenario(p, q)


def _row(x: np.ndarray) -> np.ndarray:
    x = (x + 0.02).astype(np.float32)
    return x / x.sum(dtype=np.float32)


def fixed_tree(scenario: TraversalScenario, tokens: tuple[int, ...], mode: str) -> FixedTree:
    """The drafted tree with each node's rows (the rows of its prefix)."""
    prefixes = [prefix_of(PARENTS, tokens, i) for i in range(len(PARENTS))]
    p = np.stack([scenario.p[x] for x in prefixes]).astype(np.float64)
    q = np.stack([scenario.q[x] for x in prefixes]).astype(np.float64)
    return FixedTree(PARENTS, tokens, p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True),
                     mode)


def joint_law(scenario: TraversalScenario, mode: str, variant: str = "",
              rule_mode: str | None = None) -> dict[Key, float]:
    """``P(accepted nodes, their tokens, next token)`` over the trees drafted in ``mode`` and
    the verifier (told ``rule_mode``, ``mode`` by default: another is a negative control)."""
    q64 = {k: v.astype(np.float64) / v.astype(np.float64).sum() for k, v in scenario.q.items()}
    law: dict[Key, float] = {}
    for tokens, prob in draft_trees(PARENTS, q64, mode):
        tree = fixed_tree(scenario, tokens, rule_mode or mode)
        outcomes: dict[Outcome, float] = traversal_law(tree, variant)
        for (path, y), pr in outcomes.items():
            key = (path, tuple(tokens[c] for c in path), y)
            law[key] = law.get(key, 0.0) + prob * pr
    return law


def sequence_law(law: dict[Key, float], scenario: TraversalScenario) -> np.ndarray:
    """The law of the emitted tokens completed by target samples to ``DEPTH + 1`` tokens
    (base-V index): the target's own law for a lossless rule."""
    out = np.zeros(VOCAB ** (DEPTH + 1))
    for (_, toks, y), prob in law.items():
        for rest, pr in _completions((*toks, y), scenario):
            out[_index(rest)] += prob * pr
    return out


def target_sequence_law(scenario: TraversalScenario) -> np.ndarray:
    out = np.zeros(VOCAB ** (DEPTH + 1))
    for seq, pr in _completions((), scenario):
        out[_index(seq)] += pr
    return out


def _completions(seq: tuple[int, ...], scenario: TraversalScenario
                 ) -> list[tuple[tuple[int, ...], float]]:
    if len(seq) == DEPTH + 1:
        return [(seq, 1.0)]
    row = scenario.p[seq].astype(np.float64)
    row = row / row.sum()
    return [(s, float(row[y]) * pr) for y in range(VOCAB)
            for s, pr in _completions((*seq, y), scenario)]


def _index(seq: tuple[int, ...]) -> int:
    return int(sum(t * VOCAB ** (len(seq) - 1 - i) for i, t in enumerate(seq)))


def draw_calls(scenario: TraversalScenario, mode: str, trials: int, seed: int,
               device: torch.device | str = "cpu") -> dict[str, Any]:
    """``verify_tree`` arguments for ``trials`` requests, each with a freshly drafted tree
    (node by node, vectorised over the trials on the host; a node's prefix is kept in base V),
    as tensors on ``device``."""
    gen = np.random.default_rng(seed)
    n = len(PARENTS)
    tokens = np.zeros((trials, n), dtype=np.int64)
    local = np.zeros((trials, n), dtype=np.int64)
    p = np.zeros((trials, n, VOCAB), dtype=np.float32)
    q = np.zeros((trials, n, VOCAB), dtype=np.float32)
    depth = [0] * n
    for i in range(n):
        if i > 0:
            parent = PARENTS[i]
            depth[i] = depth[parent] + 1
            row = q[:, parent].astype(np.float64)
            if mode == "without_replacement":
                for j in range(1, i):
                    if PARENTS[j] == parent:
                        row[np.arange(trials), tokens[:, j]] = 0.0
            c = np.cumsum(row / row.sum(1, keepdims=True), axis=1)
            tokens[:, i] = np.minimum((c < gen.random((trials, 1))).sum(1), VOCAB - 1)
            local[:, i] = local[:, parent] * VOCAB + tokens[:, i]
        p_rows, q_rows = _tables(scenario, depth[i])
        p[:, i], q[:, i] = p_rows[local[:, i]], q_rows[local[:, i]]
    return {"node_token_ids": torch.from_numpy(tokens).to(device),
            "parents": torch.tensor([PARENTS] * trials, device=device),
            "target_probs": torch.from_numpy(p).to(device),
            "draft_probs": torch.from_numpy(q).to(device), "children": mode}


def _tables(scenario: TraversalScenario, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of every prefix of ``length`` tokens, in base-V order."""
    prefixes = list(itertools.product(range(VOCAB), repeat=length))
    return (np.stack([scenario.p[x] for x in prefixes]),
            np.stack([scenario.q[x] for x in prefixes]))


def observed_keys(call: dict[str, Any], node_ids: np.ndarray, token_ids: np.ndarray,
                  accepted: np.ndarray) -> list[Key]:
    """Each trial's (accepted nodes, their tokens, next token)."""
    return [(tuple(node_ids[t, :a].tolist()), tuple(token_ids[t, :a].tolist()),
             int(token_ids[t, a])) for t, a in enumerate(accepted.tolist())]
