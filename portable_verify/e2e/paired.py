"""Block verification against token-wise rejection on the same model pair, paired two ways.

Why two: whole runs of the two methods (same prompt, same seed) part ways after the first step
that accepts differently, so a per-run difference carries the full sampling noise of two
independent texts. Judging each step's inputs (drafts, target and draft rows, uniforms) with
*both* rules removes that noise: the run keeps its own rule, a shadow call applies the other
one to the same arguments and is left out of the run's times. Both estimates are averaged per
trial (one prompt batch in one round) and their intervals are taken over trials, so steps of
one text are never treated as independent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from portable_verify import VerifyOptions, VerifyResult, verify

PAIRED_METHODS: tuple[str, str] = ("block", "rejection")
"""What ``e2e --method block`` runs, alternated: block first in the name, its baseline second."""


@dataclass
class ShadowVerifier:
    """``verify`` with the run's method, plus the other paired method on the same arguments.

    The shadow's accepted counts stay tensors until :meth:`pairs` (no extra host sync per step);
    its time on ``clock`` is kept apart so the caller can leave it out of the run's times.
    """

    method: str
    clock: Callable[[], float]
    own: list[torch.Tensor] = field(default_factory=list)
    other: list[torch.Tensor] = field(default_factory=list)
    shadow_time_s: float = 0.0

    def __call__(self, draft_token_ids: Any, **kwargs: Any) -> VerifyResult:
        result = verify(draft_token_ids, **kwargs)
        t0 = self.clock()
        other_method = PAIRED_METHODS[1] if self.method == PAIRED_METHODS[0] else PAIRED_METHODS[0]
        same = {name: value for name, value in kwargs.items()
                if name not in ("method", "options")}  # the other rule, on the same arguments
        shadow = verify(draft_token_ids, options=VerifyOptions(other_method), **same)
        self.other.append(shadow.num_accepted)
        self.own.append(result.num_accepted)
        self.shadow_time_s += self.clock() - t0
        return result

    def block_minus_rejection(self) -> list[int]:
        """Per verified row-step: block's accepted drafts minus rejection's, same inputs."""
        if not self.own:
            return []
        own, other = torch.stack(self.own), torch.stack(self.other)
        block, rejection = (own, other) if self.method == PAIRED_METHODS[0] else (other, own)
        return (block - rejection).flatten().tolist()


def mean_interval(values: list[float], level: float = 0.95) -> dict[str, float | int | None]:
    """Mean and Student-t interval over independent trials (``low``/``high`` None if n < 2)."""
    n = len(values)
    mean = statistics.fmean(values) if values else float("nan")
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    from scipy.stats import t

    half = float(t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}
