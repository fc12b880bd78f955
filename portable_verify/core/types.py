"""The data that crosses the front door: canonical inputs for backends and the result."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np
import torch

PLACEHOLDER_TOKEN_ID = -1
"""Fills ``token_ids`` after a row's emitted tokens."""

Method = Literal["auto", "greedy", "rejection", "typical"]
METHODS: tuple[str, ...] = ("auto", "greedy", "rejection", "typical")
DEFAULT_TYPICAL_EPS = 0.09
DEFAULT_TYPICAL_ALPHA = 0.3


@dataclass(frozen=True)
class VerifyInputs:
    """Validated, canonical inputs handed to a backend (torch tensors, or numpy via :meth:`numpy`).

    The target is stored as flat rows plus a row map so the padded layout ``[B, K+1, V]`` and the
    ragged layout ``[N+B, V]`` serving engines use reach backends without a copy.
    """

    draft_token_ids: Any  # int64 [B, K]; entries at j >= n are never read
    num_draft_tokens: Any  # int64 [B], 0 <= n <= K
    target: Any  # float [R, V] logits or probabilities
    target_rows: Any  # int64 [B, K+1]: row of `target` for (request, position); j > n -> row of n
    target_is_logits: bool
    draft_probs: Any | None  # float [Rq, V] or None (one-hot draft)
    draft_rows: Any | None  # int64 [B, K] row of `draft_probs`, or None
    temperature: Any  # float32 [B]; 0 marks a greedy row
    all_greedy: bool  # known on the host: every row is greedy (no softmax, no randomness)
    none_greedy: bool  # known on the host: no row is greedy (skip the argmax pass)
    sampled_method: Literal["rejection", "typical"]
    uniforms: Any | None  # float32 [B, K+1] in (0, 1]; None when all_greedy
    typical_eps: float = DEFAULT_TYPICAL_EPS
    typical_alpha: float = DEFAULT_TYPICAL_ALPHA

    @property
    def batch_size(self) -> int:
        return int(self.draft_token_ids.shape[0])

    @property
    def num_positions(self) -> int:
        """``K``: the padded number of draft positions."""
        return int(self.draft_token_ids.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[-1])

    def numpy(self) -> VerifyInputs:
        """The same inputs as numpy arrays on the host (floats upcast to float32)."""
        changes: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu()
                if value.is_floating_point() and value.dtype != torch.float32:
                    value = value.float()
                changes[f.name] = value.numpy()
        return replace(self, **changes)


@dataclass(frozen=True)
class VerifyResult:
    """What one verification call decided, per request.

    ``token_ids`` holds the ``num_emitted`` tokens of each row (accepted drafts, then one
    recovered or bonus token) followed by ``PLACEHOLDER_TOKEN_ID``. Arrays have the caller's
    type (torch tensor on the inputs' device, or numpy array).
    """

    token_ids: Any  # int64 [B, K+1]
    num_accepted: Any  # int64 [B]
    num_emitted: Any  # int64 [B]
    num_draft_tokens: Any  # int64 [B]

    def metrics(self) -> dict[str, Any]:
        """Causal acceptance counters of this call (see :mod:`portable_verify.core.metrics`)."""
        from portable_verify.core.metrics import compute_metrics

        return compute_metrics(self)


def as_numpy(x: Any) -> np.ndarray:
    """Host numpy view of a tensor or array-like (copies only when it must)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)
