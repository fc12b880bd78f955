"""Input checks behind ``validate=True``: every problem is named before any work is done.

Structural checks (types, ranks, sizes, devices) are host-only. Value checks (ids in range,
NaN/inf, distributions) read the inputs once and are gathered into a single device-to-host
transfer, so validation costs one synchronisation however many checks run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from portable_verify.core.constants import PROB_SUM_ATOL, PROB_SUM_ATOL_HALF

_HALF = (torch.float16, torch.bfloat16)


def in_float32_note(dtype: torch.dtype) -> str:
    """What an error about values adds for a float64 input: the checks see its values in
    float32, the dtype the decision computes in, where a finite value beyond 3.4e38 is inf."""
    if dtype != torch.float64:
        return ""
    return " in float32, the dtype the decision computes in (float64 values beyond 3.4e38 are inf)"


def require_int(name: str, t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")


def require_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(
            f"{name} must have a floating dtype (float32/float16/bfloat16), got {t.dtype}"
        )


def require_rank(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{name} must be {layout} (rank {rank}), got shape {tuple(t.shape)}")


def require_same_device(named: dict[str, torch.Tensor | None]) -> torch.device:
    devices = {name: t.device for name, t in named.items() if t is not None}
    distinct = set(devices.values())
    if len(distinct) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device; got {listing}")
    return next(iter(distinct))


def require_together(name_a: str, a: object, name_b: str, b: object) -> None:
    """Two arguments that only mean something as a pair (a map and the rows it points into):
    one without the other is refused in every form and at every level (a host check)."""
    if (a is None) != (b is None):
        given, missing = (name_a, name_b) if b is None else (name_b, name_a)
        raise ValueError(f"{given} needs {missing}: {name_a} and {name_b} come together (the "
                         "rows of each draft's distribution and the map into them)")


def require_at_most(name: str, value: int | None, bound: int, why: str) -> None:
    """A size option (it sets the width of the result) refused above ``bound`` before anything
    is allocated, at every level: a host comparison, free."""
    if value is not None and value > bound:
        raise ValueError(f"{name}={value} exceeds {bound}: {why}")


def rows_read(n_rows: int, row_map: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """bool ``[n_rows]``: the rows some read position maps to (``read`` masks ``row_map``).

    Why the mask: a row is checked only where a position that is read points at it, so a row
    that only positions past a ``-1`` cut (or past ``n``) map to is neither read nor checked.
    A scatter, not a boolean index: no host synchronisation. Out-of-range maps are clamped
    (their own check names them).
    """
    index = row_map.clamp(0, max(n_rows - 1, 0)).reshape(-1)
    marks = torch.zeros(n_rows, dtype=torch.int8, device=row_map.device)
    if index.numel() and n_rows:
        marks.scatter_reduce_(0, index, read.reshape(-1).to(torch.int8), reduce="amax")
    return marks.bool()


class ValueChecks:
    """Collects lazy device-side checks, then evaluates them with one host transfer."""

    def __init__(self) -> None:
        self._flags: list[torch.Tensor] = []
        self._messages: list[Callable[[], str]] = []

    def add(self, failed: torch.Tensor | np.ndarray, message: Callable[[], str]) -> None:
        """``failed``: a 0-dim bool tensor (or numpy bool, for host arrays), True when the check
        fails; message built on failure."""
        self._flags.append(failed.reshape(()))
        self._messages.append(message)

    def raise_first(self) -> None:
        if not self._flags:
            return
        if not isinstance(self._flags[0], torch.Tensor):  # host arrays: no transfer at all
            failed = [bool(f) for f in self._flags]
        else:
            failed = torch.stack([f.to(self._flags[0].device) for f in self._flags]).tolist()
        for bad, message in zip(failed, self._messages, strict=True):
            if bad:
                raise ValueError(message())


def _first_bad(mask: torch.Tensor | np.ndarray) -> str:
    idx = tuple(int(i) for i in torch.nonzero(torch.as_tensor(mask))[0].tolist())
    return f"first at index {idx}"


def check_ids(
    checks: ValueChecks, name: str, ids: torch.Tensor, used: torch.Tensor, vocab: int
) -> None:
    """Ids at ``used`` positions must lie in ``[0, vocab)``."""
    bad = used & ((ids < 0) | (ids >= vocab))
    checks.add(
        bad.any(),
        lambda: f"{name} has ids outside [0, {vocab}) at positions that are read "
        f"({_first_bad(bad)}, value "
        f"{int(ids[tuple(torch.nonzero(torch.as_tensor(bad))[0].tolist())])})",
    )


def check_logits(
    checks: ValueChecks, name: str, logits: torch.Tensor, used_rows: torch.Tensor
) -> None:
    """No NaN or +inf; at least one finite logit per used row.

    One max-reduction reads the tensor once (at the memory-read floor): a row's max is NaN when
    the row holds a NaN (reductions propagate NaN), +inf when it holds +inf, -inf when every
    entry is -inf.
    """
    top = logits.amax(dim=-1).float()  # rounding is monotone: the max of the rounded values
    note = in_float32_note(logits.dtype)
    bad_value = (torch.isnan(top) | torch.isposinf(top)) & used_rows
    checks.add(bad_value.any(),
               lambda: f"{name} contains NaN or +inf{note} ({_first_bad(bad_value)})")
    no_finite = torch.isneginf(top) & used_rows
    checks.add(no_finite.any(), lambda: f"{name} has a row of only -inf ({_first_bad(no_finite)})")


def check_probs(
    checks: ValueChecks, name: str, probs: torch.Tensor, used_rows: torch.Tensor
) -> None:
    """Finite, non-negative rows summing to 1 within the dtype's tolerance."""
    atol = PROB_SUM_ATOL_HALF if probs.dtype in _HALF else PROB_SUM_ATOL
    # amax and amin separately: on CPU each reads at the memory floor; torch's fused aminmax
    # is a slower kernel there.
    low, high = probs.amin(dim=-1), probs.amax(dim=-1).float()  # NaN propagates into both
    note = in_float32_note(probs.dtype)
    bad_value = (torch.isnan(high) | torch.isinf(high) | (low < 0)) & used_rows
    checks.add(
        bad_value.any(),
        lambda: f"{name} contains NaN, inf or negative entries{note} ({_first_bad(bad_value)})",
    )
    sums = probs.sum(-1, dtype=torch.float32)
    bad_sum = ((sums - 1).abs() > atol) & used_rows & ~bad_value
    checks.add(
        bad_sum.any(),
        lambda: f"{name} rows must sum to 1 within {atol}; {_first_bad(bad_sum)} sums to "
        f"{float(sums[torch.nonzero(bad_sum)[0][0]]):.6g}",
    )


def check_temperatures(checks: ValueChecks, temps: Any, target_name: str) -> None:
    """Temperatures finite and ``>= 0``; with probabilities only 0 (greedy) or 1 per row."""
    bad_t = ~((temps >= 0) & (temps < float("inf")))
    checks.add(bad_t.any(),
               lambda: f"temperature must be finite and >= 0, got {temps.tolist()}")
    if target_name == "target_probs":
        rescaled = (temps != 0) & (temps != 1)
        checks.add(rescaled.any(), lambda: "temperature cannot be applied to target_probs (only "
                   f"0 = greedy or 1 per row); pass target_logits. Got {temps.tolist()}")


def check_uniforms(checks: ValueChecks, u: Any) -> None:
    """A caller's own uniforms lie in ``(0, 1]`` (derived ones always do)."""
    bad_u = ~((u > 0) & (u <= 1))
    checks.add(bad_u.any(), lambda: "uniforms must lie in (0, 1] (and not be NaN)")
