"""Small helpers several test files share (no fixtures: those live in conftest.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def random_logits(b: int, k: int, v: int, seed: int = 0) -> torch.Tensor:
    """float32 ``[B, K+1, V]`` standard-normal logits from a seeded generator."""
    return torch.randn(b, k + 1, v, generator=torch.Generator().manual_seed(seed))


def contract_problem(result: Any, b: int, k: int, v: int) -> str | None:
    """What breaks the output contract (shapes, counts, ids in [0, V) then -1), or None."""
    """What breaks the output contract (shapes, counts, ids in [0, V) then -1), or None."""
    tokens = np.asarray(torch.as_tensor(result.token_ids).cpu())
    accepted = np.asarray(torch.as_tensor(result.num_accepted).cpu())
    emitted = np.asarray(torch.as_tensor(result.num_emitted).cpu())
    if tokens.shape != (b, k + 1) or accepted.shape != (b,):
        return f"shapes {tokens.shape}, {accepted.shape}, expected {(b, k + 1)}, {(b,)}"
    if ((accepted < 0) | (accepted > k)).any():
        return f"num_accepted {accepted.tolist()} outside [0, K={k}]"
    if not (emitted == accepted + 1).all():
        return f"num_emitted {emitted.tolist()} != num_accepted + 1"
    for row, a in zip(tokens, accepted, strict=True):
        head, tail = row[: a + 1], row[a + 1:]
        if ((head < 0) | (head >= v)).any() or (tail != -1).any():
            return f"row {row.tolist()} (a={a}) has ids outside [0, {v}) or bad padding"
    return None

