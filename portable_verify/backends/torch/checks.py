"""The torch backend's default level of validation: flags raised on the passes the decision
makes anyway, inspected once after it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from portable_verify.backends.torch.ops import Array, ArrayOps
from portable_verify.core.types import VerifyInputs
from portable_verify.core.validation import PROB_SUM_ATOL, PROB_SUM_ATOL_HALF, in_float32_note


def _place(index: tuple[int, ...]) -> str:
    """``(i,)`` -> "request i"; ``(i, j)`` -> "request i, position j"."""
    return ", ".join(f"{what} {i}" for what, i in zip(("request", "position"), index,
                                                     strict=False))


class ReadChecks:
    """The default level of validation, riding on the passes the decision makes anyway.

    Each check covers exactly what the decision reads (docs/semantics.md, Validation): the
    argmax the greedy decision takes, the maximum of every logits row the softmax normalises,
    ``p(x)`` and ``q(x)`` where they are compared, and the one row per request a draw reads in
    full. Flags are collected as arrays and inspected once, after the decision (one host
    transfer on a device), so a call with good inputs pays a few reductions over rows that
    are already in cache.
    """

    def __init__(self, ops: ArrayOps, inputs: VerifyInputs) -> None:
        self.ops = ops
        self.target_name = "target_logits" if inputs.target_is_logits else "target_probs"
        half = (torch.float16, torch.bfloat16)
        self.atol = {name: PROB_SUM_ATOL_HALF if t.dtype in half else PROB_SUM_ATOL
                     for name, t in (("target_probs", inputs.target),
                                     ("draft_probs", inputs.draft_probs)) if t is not None}
        self._flags: list[tuple[Array, Callable[[tuple[int, ...]], str]]] = []
        self.note = in_float32_note(inputs.target.dtype)  # rows are read as float32

    def add(self, bad: Array, message: Callable[[tuple[int, ...]], str]) -> None:
        """``bad``: True where a value the decision read is invalid (``[B]`` per request or
        ``[B, K+1]`` per position); ``message(first bad index)`` words the error."""
        self._flags.append((bad, message))

    def maxima(self, top: Array, read: Array) -> None:
        """Row maxima of logits rows: NaN or +inf anywhere lands in the maximum (so does a
        NaN in the argmax of numpy and torch); -inf means the row has no finite logit."""
        xp, name = self.ops.xp, self.target_name
        if name == "target_probs":
            self.add((xp.isnan(top) | xp.isinf(top) | (top < 0)) & read,
                     lambda i: f"{name} contains NaN, inf or negative entries{self.note} (first "
                               f"in the row of {_place(i)})")
            return
        self.add((xp.isnan(top) | xp.isposinf(top)) & read,
                 lambda i: f"{name} contains NaN or +inf{self.note} (first in the row of "
                           f"{_place(i)})")
        self.add(xp.isneginf(top) & read,
                 lambda i: f"{name} has a row of only -inf (first: the row of {_place(i)})")

    def values(self, name: str, vals: Array, read: Array) -> None:
        """Probabilities the decision compares (``p(x)``, ``q(x)``) or an entropy: finite
        and non-negative (NaN fails ``>= 0``)."""
        self.add(~((vals >= 0) & self.ops.xp.isfinite(vals)) & read,
                 lambda i: f"{name} contains NaN, inf or negative entries (first in the row of "
                           f"{_place(i)})")

    def distribution(self, name: str, low: Array, total: Array, read: Array) -> None:
        """A row a draw reads in full: non-negative entries summing to 1 within tolerance."""
        xp, atol = self.ops.xp, self.atol[name]
        bad_value = ~((low >= 0) & xp.isfinite(total)) & read
        self.add(bad_value, lambda i: f"{name} contains NaN, inf or negative entries (first "
                                      f"in the row {_place(i)} draws from)")
        self.add((xp.abs(total - 1) > atol) & read & ~bad_value,
                 lambda i: f"{name} rows must sum to 1 within {atol}; the row {_place(i)} "
                           f"draws from sums to {float(total[i]):.6g}")

    def raise_first(self) -> None:
        if not self._flags:
            return
        if self.ops.host:
            hits = [bool(bad.any()) for bad, _ in self._flags]
        else:  # one host transfer for every flag
            hits = torch.stack([bad.any() for bad, _ in self._flags]).tolist()
        for (bad, message), hit in zip(self._flags, hits, strict=True):
            if hit:
                raise ValueError(message(self.ops.first(bad)))
