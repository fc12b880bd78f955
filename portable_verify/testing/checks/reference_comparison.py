"""How a backend's tokens are compared with the reference's, and the tally behind a verdict.

Every exact check (and the seed, soak and property tests) runs the backend and
``backend="numpy"`` (the executable specification) on the same call. A disagreement is excused
only on a row whose reference path has a decision within float rounding of its boundary
(:mod:`portable_verify.testing.checks.near_boundary`); those rows are counted in the stats.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.testing.cases.random_cases import on_device
from portable_verify.testing.checks.near_boundary import near_boundary_rows
from portable_verify.testing.kit import CheckResult, summarize

REFERENCE = "numpy"


@dataclass
class Tally:
    """Counts behind an exact check's verdict."""

    cases: int = 0
    rows: int = 0
    mismatched_rows: int = 0
    excused_near_boundary: int = 0
    near_boundary_rows: int = 0
    events: Counter[str] = field(default_factory=Counter)  # edge cases the reference went through
    failures: list[str] = field(default_factory=list)

    def result(self, name: str, **extra: Any) -> CheckResult:
        passed = not self.failures
        stats = {k: v for k, v in vars(self).items() if k not in ("failures", "events")}
        stats |= {f"path.{k}": v for k, v in sorted(self.events.items())} | extra
        detail = (
            f"{self.cases} cases, {self.rows} rows identical to the reference "
            f"({self.excused_near_boundary} near-boundary rows excused)"
            if passed else summarize(self.failures)
        )
        return CheckResult(name, passed, detail, stats)


def host(x: Any) -> np.ndarray:
    """``x`` as a numpy array on the host."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def check_shapes(res: pv.VerifyResult, b: int, k: int, v: int) -> str | None:
    """The documented output contract, independent of any reference; None when it holds."""
    tokens, accepted = host(res.token_ids), host(res.num_accepted)
    if tokens.shape != (b, k + 1) or accepted.shape != (b,):
        return f"shapes {tokens.shape}/{accepted.shape}, expected {(b, k + 1)}/{(b,)}"
    if tokens.dtype != np.int64 or accepted.dtype != np.int64:
        return f"dtypes {tokens.dtype}/{accepted.dtype}, expected int64"
    if not np.array_equal(host(res.num_emitted), accepted + 1):
        return "num_emitted != num_accepted + 1"
    pos = np.arange(k + 1)[None, :]
    emitted = pos <= accepted[:, None]
    if ((tokens < 0) | (tokens >= v))[emitted].any() or (tokens[~emitted] != -1).any():
        return "emitted ids outside [0, V) or padding other than -1"
    return None


def compare(
    tally: Tally, backend: str, label: str, kwargs: dict[str, Any], method: str,
    tolerate: bool = True,
) -> pv.VerifyResult:
    """Run both implementations on ``kwargs`` (on the backend's device; the reference is handed
    a host copy) and record every disagreement in ``tally``."""
    got = pv.verify(**kwargs, method=method, backend=backend)
    kwargs = on_device(kwargs, "cpu")
    want = pv.verify(**kwargs, method=method, backend=REFERENCE)
    b, k = kwargs["draft_token_ids"].shape
    target = kwargs.get("target_logits", kwargs.get("target_probs"))
    tally.cases += 1
    tally.rows += b
    problem = check_shapes(got, b, k, target.shape[-1])
    if problem:
        tally.failures.append(f"{label} {method}: {problem}")
        return got
    bad = (host(want.token_ids) != host(got.token_ids)).any(1)
    bad |= host(want.num_accepted) != host(got.num_accepted)
    near = near_boundary_rows(kwargs, method, tally.events)
    if not tolerate:
        near[:] = False
    tally.near_boundary_rows += int(near.sum())
    tally.mismatched_rows += int(bad.sum())
    tally.excused_near_boundary += int((bad & near).sum())
    for i in np.flatnonzero(bad & ~near):
        tally.failures.append(
            f"{label} {method} row {i}: reference {host(want.token_ids)[i].tolist()}, "
            f"{backend} {host(got.token_ids)[i].tolist()}"
        )
    return got
