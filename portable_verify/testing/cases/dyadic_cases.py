"""Cases on a 1/8 grid, where every product and prefix sum is exact in float32.

Why a second builder: random cases meet exact ties (``u * q == p``, ``cumsum == v * total``)
too rarely to test the documented tie rules; on this grid they are frequent and real.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from portable_verify.testing.cases.random_cases import on_device


def dyadic_case(gen: np.random.Generator, b: int, k: int, v: int,
                device: torch.device | str = "cpu") -> dict[str, Any]:
    """Probabilities and uniforms on a 1/8 grid: every product and prefix sum is exact.

    With such inputs any summation order gives the same float32 numbers, so ``u * q == p`` and
    ``cumsum == v * total`` ties are real and the documented ``<=`` / smallest-index rules
    decide them; no tolerance applies. Tensors on ``device``.
    """

    def grid_rows(shape: tuple[int, ...]) -> np.ndarray:
        cuts = np.sort(gen.integers(0, 9, (*shape, v - 1)), axis=-1)
        edges = np.concatenate([np.zeros((*shape, 1)), cuts, np.full((*shape, 1), 8)], -1)
        return (np.diff(edges, axis=-1) / 8).astype(np.float32)

    p = grid_rows((b, k + 1))
    q = np.where(gen.random((b, k, 1)) < 0.3, p[:, :k], grid_rows((b, k)))  # q == p: empty
    return on_device({
        "draft_token_ids": torch.from_numpy(gen.integers(0, v, (b, k))),
        "target_probs": torch.from_numpy(p),
        "draft_probs": torch.from_numpy(q) if gen.random() < 0.5 else None,
        "num_draft_tokens": torch.from_numpy(gen.integers(0, k + 1, b)),
        "uniforms": torch.from_numpy((gen.integers(1, 9, (b, k + 1)) / 8).astype(np.float32)),
    }, device)


