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

import itertools
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


def per_trial_data(same_steps: list[float], runs: list[float], row_steps: list[int],
                   positive: list[int], negative: list[int]) -> dict[str, list[Any]]:
    """A comparison's per-trial values, kept in the report so that runs on disjoint seeds can
    be pooled trial by trial (:func:`pool_trials`) rather than step by step."""
    return {"gain_same_steps": same_steps, "gain_runs": runs, "row_steps": row_steps,
            "positive": positive, "negative": negative}


def round_means(values: list[float], per_round: int) -> list[float]:
    """Per round, the mean of its trials' values (trials listed round by round, ``per_round``
    prompt batches each). Why: reports from before each trial drew its own seed
    (``runner.trial_seed``) shared a round's seed among its prompts, so their trials are not
    independent; an interval over rounds does not assume they are, and on newer reports it
    shows whether rounds differ more than their trials do."""
    if per_round < 1 or len(values) % per_round:
        raise ValueError(f"per_round: {len(values)} trials do not split into rounds of "
                         f"{per_round} prompt batches")
    return [statistics.fmean(values[i:i + per_round]) for i in range(0, len(values), per_round)]


_POOL_FREE = ("seed", "rounds")
"""Config fields that may differ between pooled runs: which seeds a run drew, and how many."""


def _seed_ranges(runs: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each run's seeds ``[seed, seed + rounds x batches)`` (``runner.trial_seed``), refused
    when two runs overlap: a trial drawn twice would be counted as two."""
    spans = sorted((int(r["config"]["seed"]), int(r["config"]["seed"])
                    + int(r["config"]["rounds"]) * int(r["num_batches"])) for r in runs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start < end:
            raise ValueError(f"runs: seed ranges overlap ({spans}); give each run its own "
                             "--seed so that their trials draw disjoint seeds")
    return spans


def pool_trials(runs: list[dict[str, Any]], section: str = "block_comparison",
                index: int = 0) -> dict[str, Any]:
    """Pool one comparison (``runs[i][section][index]``) of several ``e2e --json`` reports
    over their trials: each trial's paired difference stays as its run computed it, the
    interval is taken over the union of trials. Why: a long measurement split into chunks on
    disjoint seeds gives the same estimate as one run over all of them, never pooled by step."""
    if len(runs) < 1:
        raise ValueError("runs: give at least one e2e --json report")
    base = {k: v for k, v in runs[0]["config"].items() if k not in _POOL_FREE}
    for r in runs[1:]:
        other = {k: v for k, v in r["config"].items() if k not in _POOL_FREE}
        if other != base:
            diff = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
            raise ValueError(f"runs: configurations differ in {diff}; only {_POOL_FREE} may")
    spans = _seed_ranges(runs)
    parts = [r[section][index] for r in runs]
    if any("per_trial" not in p for p in parts):
        raise ValueError(f"runs: {section} has no per-trial values (a report from before they "
                         "were kept); rerun it")
    label = {k: parts[0][k] for k in ("k", "draft_mode", "tree") if k in parts[0]}
    if any({k: p.get(k) for k in label} != label for p in parts):
        raise ValueError(f"runs: {section}[{index}] compares different configurations")
    trials = {key: [x for p in parts for x in p["per_trial"][key]]
              for key in ("gain_same_steps", "gain_runs", "row_steps", "positive", "negative")}
    per_round = int(runs[0]["num_batches"])
    by_round = {key: [x for p in parts for x in round_means(p["per_trial"][key], per_round)]
                for key in ("gain_same_steps", "gain_runs")}
    return {**label, "runs": len(runs), "seeds": [list(s) for s in spans],
            "trials": len(trials["gain_same_steps"]), "rounds": len(by_round["gain_runs"]),
            "same_step_row_steps": sum(trials["row_steps"]),
            "same_step_positive": sum(trials["positive"]),
            "same_step_negative": sum(trials["negative"]),
            "gain_same_steps": mean_interval(trials["gain_same_steps"]),
            "gain_runs": mean_interval(trials["gain_runs"]),
            "gain_same_steps_by_round": mean_interval(by_round["gain_same_steps"]),
            "gain_runs_by_round": mean_interval(by_round["gain_runs"])}


def main(argv: list[str] | None = None) -> None:
    """``python -m portable_verify.e2e.paired SECTION A.json B.json ...``: print the pooled
    comparisons of ``SECTION`` (``block_comparison`` or ``traversal_comparison``) as JSON."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit("usage: python -m portable_verify.e2e.paired SECTION A.json [B.json ...]")
    runs = []
    for path in args[1:]:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    if args[0] not in runs[0]:
        raise SystemExit(f"SECTION: {args[0]!r} is not in {args[1]}")
    pooled = [pool_trials(runs, args[0], i) for i in range(len(runs[0][args[0]]))]
    print(json.dumps(pooled, indent=1))


if __name__ == "__main__":
    main()
