"""Seeded random tree calls for the tree checks: random shapes, ragged ``num_nodes``, ``-1``
nodes, duplicate siblings, zero-probability children, every ``children`` mode.

Parents are drawn as ``parents[i] ~ U{0..i-1}``, so every tree shape (chains, stars, bushy
trees) turns up; tokens are drawn from a small vocabulary so duplicate siblings are common.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from portable_verify.testing.cases.random_cases import on_device

MODES = ("deterministic", "iid", "without_replacement")


def random_parents(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """int64 ``[B, N]``: ``parents[:, 0] = -1``, ``parents[:, i]`` uniform on ``[0, i)``."""
    parents = np.full((b, n), -1, dtype=np.int64)
    for i in range(1, n):
        parents[:, i] = rng.integers(0, i, size=b)
    return parents


def chain_parents(b: int, n: int) -> np.ndarray:
    return np.broadcast_to(np.arange(-1, n - 1, dtype=np.int64), (b, n)).copy()


def random_tree_call(rng: np.random.Generator, mode: str, *, logits: bool | None = None,
                     greedy_rows: bool = True, device: torch.device | str = "cpu"
                     ) -> dict[str, Any]:
    """``verify_tree`` keyword arguments of one random call (explicit uniforms), on
    ``device`` (drawn on the host, so every device gets the same values)."""
    b, n, v = int(rng.integers(1, 6)), int(rng.integers(1, 9)), int(rng.integers(1, 7))
    logits = bool(rng.integers(2)) if logits is None else logits
    parents = random_parents(rng, b, n)
    tokens = rng.integers(0, v, size=(b, n)).astype(np.int64)
    tokens[rng.random((b, n)) < 0.1] = -1
    tokens[:, 0] = rng.integers(0, v, size=b)  # the root's id is never read
    scale = rng.choice([0.5, 2.0, 8.0])
    raw = rng.normal(size=(b, n, v)) * scale
    raw[rng.random((b, n, v)) < 0.15] = -np.inf  # zero-probability tokens
    raw[..., 0] = np.where(np.isinf(raw).all(-1), 0.0, raw[..., 0])
    call: dict[str, Any] = {"node_token_ids": torch.from_numpy(tokens),
                            "parents": torch.from_numpy(parents), "children": mode}
    target = torch.tensor(raw, dtype=torch.float32)
    if logits:
        call["target_logits"] = target
        temps = rng.choice([0.0, 0.7, 1.0, 1.5], size=b) if greedy_rows else np.ones(b)
        call["temperature"] = torch.tensor(temps, dtype=torch.float32)
    else:
        call["target_probs"] = torch.softmax(target, -1)
    if mode != "deterministic":
        q = rng.random((b, n, v)) ** 2
        q[rng.random((b, n, v)) < 0.2] = 0.0  # children the draft gives probability 0
        q[..., -1] += 1e-3
        call["draft_probs"] = torch.tensor(q / q.sum(-1, keepdims=True), dtype=torch.float32)
    if rng.random() < 0.5:
        call["num_nodes"] = torch.from_numpy(rng.integers(1, n + 1, size=b))
    if rng.random() < 0.3:
        depth = node_depths(parents)
        # At most N - 1 (a larger max_depth is refused): sometimes a cap the tree reaches.
        call["max_depth"] = min(int(depth.max()) + int(rng.integers(0, 2)), n - 1)
    call["uniforms"] = torch.tensor(rng.integers(1, 2**24 + 1, size=(b, n)) / 2**24,
                                    dtype=torch.float32)
    return on_device(call, device)


def node_depths(parents: np.ndarray) -> np.ndarray:
    depth = np.zeros(parents.shape, dtype=np.int64)
    for i in range(1, parents.shape[1]):
        depth[:, i] = depth[np.arange(parents.shape[0]), parents[:, i]] + 1
    return depth
