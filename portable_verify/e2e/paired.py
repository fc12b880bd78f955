"""Two exact rules on the same model pair, paired two ways: block verification against
token-wise rejection on chains, traversal verification against the token-level rule on trees.

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

from portable_verify import VerifyOptions, verify

PAIRED_METHODS: tuple[str, str] = ("block", "rejection")
"""What ``e2e --method block`` runs, alternated: block first in the name, its baseline second."""
TREE_PAIRED_METHODS: tuple[str, str] = ("traversal", "rejection")
"""What ``e2e --tree --method traversal`` runs per tree, alternated: traversal, then the
token-level tree rule it is measured against."""


@dataclass
class ShadowVerifier:
    """``verify`` (or ``fn``, e.g. ``verify_tree``) with the run's method, plus the other
    method of ``pair`` on the same arguments.

    The shadow's accepted counts stay tensors until read (no extra host sync per step); its
    time on ``clock`` is kept apart so the caller can leave it out of the run's times.
    """

    method: str
    clock: Callable[[], float]
    pair: tuple[str, str] = PAIRED_METHODS
    fn: Callable[..., Any] = verify
    own: list[torch.Tensor] = field(default_factory=list)
    other: list[torch.Tensor] = field(default_factory=list)
    shadow_time_s: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in self.pair:
            raise ValueError(f"method must be one of the pair {self.pair}, got {self.method!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.fn(*args, **kwargs)
        t0 = self.clock()
        other_method = self.pair[1] if self.method == self.pair[0] else self.pair[0]
        same = {name: value for name, value in kwargs.items()
                if name not in ("method", "options")}  # the other rule, on the same arguments
        shadow = self.fn(*args, options=VerifyOptions(other_method), **same)
        self.other.append(shadow.num_accepted)
        self.own.append(result.num_accepted)
        self.shadow_time_s += self.clock() - t0
        return result

    def accepted(self) -> tuple[list[int], list[int]]:
        """Per verified row-step, the accepted drafts of ``pair[0]`` and of ``pair[1]``, both
        judged on the same inputs (one host transfer for the whole run)."""
        if not self.own:
            return [], []
        own = torch.stack(self.own).flatten().tolist()
        other = torch.stack(self.other).flatten().tolist()
        return (own, other) if self.method == self.pair[0] else (other, own)

    def first_minus_second(self) -> list[int]:
        """Per verified row-step: ``pair[0]``'s accepted drafts minus ``pair[1]``'s."""
        first, second = self.accepted()
        return [a - b for a, b in zip(first, second, strict=True)]

    def block_minus_rejection(self) -> list[int]:
        """Per verified row-step: block's accepted drafts minus rejection's, same inputs."""
        return self.first_minus_second()


def mean_interval(values: list[float], level: float = 0.95) -> dict[str, float | int | None]:
    """Mean and Student-t interval over independent trials (``low``/``high`` None if n < 2)."""
    n = len(values)
    mean = statistics.fmean(values) if values else float("nan")
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    from scipy.stats import t

    half = float(t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}
