"""The statistical tree scenario: does the emitted sequence follow the target's law?

A target ``p(. | prefix)`` and a draft ``q(. | prefix)`` are fixed tables over every prefix of
length ``<= D`` at a small vocabulary. Each trial draws a fresh tree of depth ``D`` from the
draft (``children`` mode: i.i.d., without replacement, or deterministic top-k of ``q``), lets
the verifier pick its path and next token, and completes the emitted sequence with target
samples to ``D + 1`` tokens. For an exact verifier that sequence is a sample of the target's
own ``D + 1``-token law, whatever the tree and the draft: that is the claim tested, by
chi-square over the ``V^(D+1)`` sequences (testing/stats/chi_square.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from portable_verify.core import rng as counter_rng

VOCAB = 4
BRANCHING = (3, 3, 1)  # children per node at depths 0, 1, 2: depth D = 3, N = 22 nodes
DEPTH = len(BRANCHING)
TABLE_SEED = 20261206  # searched: the un-renormalised-residual control shows in iid mode too


@dataclass(frozen=True)
class TreeScenario:
    """Tables and the fixed tree layout (breadth-first: parents precede children)."""

    p: np.ndarray  # float32 [prefixes, V]: target rows (some zeros: impossible tokens)
    q: np.ndarray  # float32 [prefixes, V]: draft rows, strictly positive
    parents: np.ndarray  # int64 [N]
    depth: np.ndarray  # int64 [N]

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])


def prefix_offset(length: int) -> int:
    """Row of the first prefix of ``length`` tokens (prefixes are numbered by length, then in
    base V)."""
    return sum(VOCAB**j for j in range(length))


def make_scenario() -> TreeScenario:
    gen = np.random.default_rng(TABLE_SEED)
    rows = prefix_offset(DEPTH + 1)
    p = gen.dirichlet(np.full(VOCAB, 0.8), size=rows)
    p[gen.random(p.shape) < 0.12] = 0.0  # impossible tokens: any observation there fails
    p[np.arange(rows), p.argmax(1)] += 1e-3 * (p.sum(1) == 0)
    p = (p / p.sum(1, keepdims=True)).astype(np.float32)
    q = gen.dirichlet(np.full(VOCAB, 1.5), size=rows) + 0.02
    q = (q / q.sum(1, keepdims=True)).astype(np.float32)
    parents, depth = [-1], [0]
    level = [0]
    for width in BRANCHING:
        nxt = []
        for node in level:
            for _ in range(width):
                parents.append(node)
                depth.append(depth[node] + 1)
                nxt.append(len(parents) - 1)
        level = nxt
    return TreeScenario(p, q, np.array(parents), np.array(depth))


def expected_law(scenario: TreeScenario) -> np.ndarray:
    """float64 ``[V^(D+1)]``: the target's law of ``D + 1`` tokens (base-V sequence index)."""
    p = scenario.p.astype(np.float64)
    p /= p.sum(1, keepdims=True)
    law = np.ones(1)
    for length in range(DEPTH + 1):
        rows = p[prefix_offset(length):prefix_offset(length + 1)]  # in base-V order
        law = (law[:, None] * rows).reshape(-1)
    return law


def _inverse_cdf(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    c = np.cumsum(weights, axis=1)
    return np.minimum((c < (v * c[:, -1])[:, None]).sum(1), weights.shape[1] - 1)


def draw_trees(scenario: TreeScenario, mode: str, trials: int, seed: int,
               device: torch.device | str = "cpu") -> dict[str, Any]:
    """Fresh trees for ``trials`` requests (drawn on the host): ``node_token_ids`` and the
    ``verify_tree`` target/draft tensors, on ``device``."""
    gen = np.random.default_rng(seed)
    n = scenario.num_nodes
    tokens = np.zeros((trials, n), dtype=np.int64)
    local = np.zeros((trials, n), dtype=np.int64)  # the node's prefix in base V
    row = np.zeros((trials, n), dtype=np.int64)
    for node in range(n):
        kids = np.flatnonzero(scenario.parents == node)
        if kids.size == 0:
            continue
        q = scenario.q[row[:, node]].astype(np.float64)
        if mode == "deterministic":  # top-k of q, in q's order: a function of the prefix
            chosen = np.argsort(-q, axis=1, kind="stable")[:, : kids.size]
        else:
            chosen = np.zeros((trials, kids.size), dtype=np.int64)
            weights = q.copy()
            for k in range(kids.size):
                chosen[:, k] = _inverse_cdf(weights, gen.random(trials))
                if mode == "without_replacement":
                    weights[np.arange(trials), chosen[:, k]] = 0.0
        for k, child in enumerate(kids):
            tokens[:, child] = chosen[:, k]
            local[:, child] = local[:, node] * VOCAB + chosen[:, k]
            row[:, child] = prefix_offset(int(scenario.depth[child])) + local[:, child]
    call: dict[str, Any] = {
        "node_token_ids": torch.from_numpy(tokens).to(device),
        "parents": torch.from_numpy(np.broadcast_to(scenario.parents, (trials, n)).copy()
                                    ).to(device),
        "target_probs": torch.from_numpy(scenario.p[row]).to(device),
        "children": mode,
    }
    if mode != "deterministic":
        call["draft_probs"] = torch.from_numpy(scenario.q[row]).to(device)
    return call


def shared_sibling_uniforms(scenario: TreeScenario, trials: int, seed: int,
                            device: torch.device | str = "cpu") -> torch.Tensor:
    """The uniforms ``seed`` gives, but every sibling reads its first sibling's: the bug of one
    uniform per level (negative control)."""
    seeds = counter_rng.row_seeds(seed, np.arange(trials, dtype=np.int64))
    u = counter_rng.uniforms_numpy(seeds, np.zeros(trials, dtype=np.int64),
                                   scenario.num_nodes)
    for node in range(1, scenario.num_nodes):
        first = int(np.flatnonzero(scenario.parents == scenario.parents[node])[0])
        u[:, node - 1] = u[:, first - 1]
    return torch.from_numpy(u).to(device)


def complete(scenario: TreeScenario, token_ids: np.ndarray, emitted: np.ndarray,
             seed: int) -> np.ndarray:
    """Base-V index of each trial's sequence: its emitted tokens, then target samples to
    ``D + 1`` tokens."""
    gen = np.random.default_rng(seed)
    trials = token_ids.shape[0]
    seq = np.zeros((trials, DEPTH + 1), dtype=np.int64)
    local = np.zeros(trials, dtype=np.int64)
    for length in range(DEPTH + 1):
        rows = scenario.p[prefix_offset(length) + local].astype(np.float64)
        sampled = _inverse_cdf(rows, gen.random(trials))
        have = length < emitted
        seq[:, length] = np.where(have, token_ids[:, min(length, token_ids.shape[1] - 1)],
                                  sampled)
        local = local * VOCAB + seq[:, length]
    return local
