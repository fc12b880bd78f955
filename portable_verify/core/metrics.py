"""Causal acceptance metrics of verification calls, per call and aggregated over calls.

Why causal: ``num_accepted`` is already the length of the accepted *prefix*, so a draft that
would have passed its test after an earlier rejection is never counted (vLLM v0 counted such
"accepts", inflating its acceptance rate). Why tensors: serving loops call this every step on
an accelerator; keeping the counters on the device costs no host sync. Convert to Python
numbers only when logging (:func:`metrics_to_python`, :meth:`MetricsAccumulator.summary`: one
transfer each).

Definitions (vLLM's names where vLLM has one; "drafts" = requests with ``n_i > 0``):

* ``num_requests`` = ``B``; ``num_drafts`` = number of requests with ``n_i > 0``.
* ``num_draft_tokens`` = ``sum n_i``; ``num_accepted_tokens`` = ``sum a_i``;
  ``num_emitted_tokens`` = ``sum (a_i + 1)`` over *all* requests.
* ``num_accepted_per_position[j]`` = number of requests whose accepted prefix reached
  position ``j`` (``a_i > j``), ``j < K``.
* ``acceptance_rate`` = accepted / draft tokens.
* ``mean_acceptance_length`` = ``1 + accepted / num_drafts`` (vLLM v1: it includes the bonus or
  recovered token).
* ``system_efficiency`` = tokens emitted by drafted requests / the most they could emit =
  ``(accepted + num_drafts) / (draft_tokens + num_drafts)``. With every request at ``k``
  drafts this is vLLM v0's ``emitted / (num_seqs * (k + 1))``; with ragged counts it is the
  natural extension (each request's best case is ``n_i + 1``).

Ratios with a zero denominator are NaN.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import torch


class CallCounts(Protocol):
    """What the metrics read of a verification result (``VerifyResult`` satisfies it)."""

    token_ids: Any
    num_accepted: Any
    num_draft_tokens: Any

COUNT_KEYS: tuple[str, ...] = (
    "num_requests",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_emitted_tokens",
)
RATIO_KEYS: tuple[str, ...] = ("acceptance_rate", "mean_acceptance_length", "system_efficiency")


def _counts(
    accepted: torch.Tensor, drafted: torch.Tensor, k: int
) -> dict[str, torch.Tensor]:
    """Integer counters (0-dim int64, and ``[K]`` per position) on the inputs' device."""
    accepted = accepted.to(torch.int64)
    drafted = drafted.to(torch.int64)
    pos = torch.arange(k, device=accepted.device)
    return {
        # A fill, not a host-to-device copy: nothing here waits on the device.
        "num_requests": torch.full((), accepted.shape[0], dtype=torch.int64, device=pos.device),
        "num_drafts": (drafted > 0).sum(),
        "num_draft_tokens": drafted.sum(),
        "num_accepted_tokens": accepted.sum(),
        "num_emitted_tokens": (accepted + 1).sum(),
        "num_accepted_per_position": (accepted.unsqueeze(1) > pos.unsqueeze(0)).sum(0),
    }


def _safe_div(a: Any, b: Any) -> Any:
    """``a / b``, NaN where ``b == 0``: device-side for tensors, float64 for Python ints."""
    if isinstance(a, torch.Tensor):
        b = torch.as_tensor(b, device=a.device)
        return torch.where(b > 0, a.to(torch.float32) / b.clamp(min=1), float("nan"))
    return a / b if b > 0 else math.nan


def _ratios(c: dict[str, Any]) -> dict[str, Any]:
    """The three ratios from the counters (tensors or Python ints)."""
    acc, drafts, tokens = c["num_accepted_tokens"], c["num_drafts"], c["num_draft_tokens"]
    return {
        "acceptance_rate": _safe_div(acc, tokens),
        "mean_acceptance_length": _safe_div(acc, drafts) + 1,
        "system_efficiency": _safe_div(acc + drafts, tokens + drafts),
    }


def compute_metrics(result: CallCounts) -> dict[str, Any]:
    """Causal metrics of one call, as 0-dim tensors (``[K]`` per position) on its device.

    numpy results give numpy values. No host synchronisation; see the module docstring for the
    definitions and :func:`metrics_to_python` to log them.
    """
    is_numpy = not isinstance(result.num_accepted, torch.Tensor)
    accepted = torch.as_tensor(result.num_accepted)
    drafted = torch.as_tensor(result.num_draft_tokens)
    k = int(result.token_ids.shape[1]) - 1
    out = _counts(accepted, drafted, k)
    out.update(_ratios(out))
    if is_numpy:
        return {name: value.numpy() for name, value in out.items()}
    return out


def metrics_to_python(metrics: dict[str, Any]) -> dict[str, Any]:
    """Python ints/floats (and a list per position) from :func:`compute_metrics`'s values.

    The counters travel to the host in one transfer; ratios are recomputed there in float64.
    """
    per_pos = torch.as_tensor(metrics["num_accepted_per_position"])
    scalars = torch.stack([torch.as_tensor(metrics[key]).to(per_pos.device) for key in COUNT_KEYS])
    host = torch.cat([scalars.to(torch.int64), per_pos.to(torch.int64)]).tolist()
    out: dict[str, Any] = dict(zip(COUNT_KEYS, host[: len(COUNT_KEYS)], strict=True))
    out["num_accepted_per_position"] = host[len(COUNT_KEYS) :]
    out.update(_ratios(out))
    return out


class MetricsAccumulator:
    """Sums causal counters over many calls on the device; :meth:`summary` reads them once.

    >>> import torch, portable_verify as pv
    >>> acc = pv.MetricsAccumulator()
    >>> logits = torch.tensor([[[0., 5.], [9., 0.], [0., 3.]]])
    >>> acc.update(pv.verify(torch.tensor([[1, 1]]), target_logits=logits, method="greedy"))
    >>> acc.summary()["num_accepted_tokens"], acc.summary()["num_calls"]
    (1, 1)
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every call seen so far."""
        self.num_calls = 0
        self._totals: dict[str, torch.Tensor] | None = None

    def update(self, result: CallCounts | dict[str, Any]) -> None:
        """Add one call, given as its ``VerifyResult`` or its :func:`compute_metrics`."""
        m = result if isinstance(result, dict) else compute_metrics(result)
        keys = (*COUNT_KEYS, "num_accepted_per_position")
        counts = {key: torch.as_tensor(m[key]) for key in keys}
        self.num_calls += 1
        if self._totals is None:
            self._totals = {key: value.clone() for key, value in counts.items()}
            return
        device = self._totals["num_requests"].device
        for key in COUNT_KEYS:
            self._totals[key] += counts[key].to(device)
        self._totals["num_accepted_per_position"] = _add_padded(
            self._totals["num_accepted_per_position"],
            counts["num_accepted_per_position"].to(device),
        )

    def totals(self) -> dict[str, Any]:
        """Running counters and ratios as device tensors (no host sync)."""
        if self._totals is None:
            return compute_metrics(_EMPTY)
        out: dict[str, Any] = dict(self._totals)
        out.update(_ratios(out))
        return out

    def summary(self) -> dict[str, Any]:
        """Python numbers over every call since the last :meth:`reset` (one host transfer)."""
        out = metrics_to_python(self.totals())
        out["num_calls"] = self.num_calls
        return out


def _add_padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise sum of two per-position vectors of possibly different lengths ``K``."""
    if a.shape[0] < b.shape[0]:
        a, b = b, a
    out = a.clone()
    out[: b.shape[0]] += b
    return out


class _NoCalls:
    """The counts of zero calls (what :meth:`MetricsAccumulator.totals` reports before any)."""

    token_ids = np.zeros((0, 1), dtype=np.int64)
    num_accepted = torch.zeros(0, dtype=torch.int64)
    num_draft_tokens = torch.zeros(0, dtype=torch.int64)


_EMPTY = _NoCalls()
