"""Bad-input conformance: clear errors with ``validate=True``, safe garbage with ``validate=False``.

Validation lives in the front door, so ``bad_input.raises`` mostly proves that a backend is
reached only through it; the ``validate=False`` check is the backend's own promise: on NaN/inf
inputs every emitted id stays in ``[0, V)`` and the output shapes hold (docs/semantics.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core import methods
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.bad_inputs import (
    ACCEPTED,
    BAD_CASES,
    FULL_ONLY_CASES,
    probs_call,
    valid_call,
)
from portable_verify.testing.checks.reference_comparison import check_shapes
from portable_verify.testing.kit import CheckResult, check, summarize

METHODS = methods.distinct(methods.CHAIN)
"""The chain methods of the method table (``auto`` is ``rejection``)."""


def methods_of(backend: str, layout: str = methods.CHAIN) -> tuple[str, ...]:
    """The methods of ``layout`` the backend implements (read from the table and its traits;
    ``auto`` left out: it is ``rejection``)."""
    traits = pv.get_backend(backend).traits
    return tuple(m for m in methods.distinct(layout)
                 if traits.implements(layout, methods.TABLE[m].rule))


def expect_error(call: dict[str, Any], backend: str, argument: str,
                 error: type[Exception]) -> str | None:
    """None when ``verify(**call)`` raises ``error`` naming ``argument``; else what went wrong."""
    call = {"backend": backend, **call}
    try:
        pv.verify(**call)
    except (ValueError, TypeError) as exc:
        if type(exc) is not error:
            return f"raised {type(exc).__name__} ({exc}), expected {error.__name__}"
        if argument not in str(exc):
            return f"message does not name {argument!r}: {exc}"
        return None
    except Exception as exc:
        return f"raised {type(exc).__name__} ({exc}), expected {error.__name__}"
    return "did not raise"


@check("bad_input.raises")
def raises(backend: str, quick: bool) -> CheckResult:
    """Every documented bad input raises ValueError/TypeError naming the argument."""
    failures = []
    by_data = [m for m in methods_of(backend) if methods.reads_rows_by_data(m)]
    device = torch_device(backend)
    for case in BAD_CASES:
        problem = expect_error(case.build(device), backend, case.argument, case.error)
        if problem:
            failures.append(f"{case.label}: {problem}")
        call = case.build(device)
        for method in by_data if "method" not in call else ():  # checked at the door too
            problem = expect_error({**call, "method": method}, backend, case.argument,
                                   case.error)
            if problem:
                failures.append(f"{case.label} ({method}): {problem}")
    for case in FULL_ONLY_CASES:  # values the default level does not read
        problem = expect_error({**case.build(device), "validate": "full"}, backend, case.argument,
                               case.error)
        if problem:
            failures.append(f"{case.label} (validate='full'): {problem}")
    accepted = [(label, build) for label, build in ACCEPTED  # numpy arrays: host backends
                if device.type == "cpu" or "numpy inputs" not in label]
    for label, build in accepted:
        try:
            pv.verify(**{"backend": backend, **build(device)})
        except Exception as exc:
            failures.append(f"{label}: allowed input raised {type(exc).__name__}: {exc}")
    detail = summarize(failures) or f"{len(BAD_CASES)} bad inputs refused, {len(accepted)} allowed"
    return CheckResult("bad_input.raises", not failures, detail,
                       {"bad_cases": len(BAD_CASES), "allowed_cases": len(accepted)})


def _snapshot(call: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.items()}


def _unchanged(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        k for k, v in before.items()
        if isinstance(v, torch.Tensor) and not torch.equal(v.nan_to_num(), after[k].nan_to_num())
    ]


@check("bad_input.no_mutation")
def no_mutation(backend: str, quick: bool) -> CheckResult:
    """Inputs are never written, whether the call succeeds, raises, or skips validation."""
    failures = []
    device = torch_device(backend)
    calls: list[tuple[str, Callable[[], dict[str, Any]]]] = [  # each built when it is run
        (f"{method} {name}", lambda b=build, m=method: {**b(device), "method": m})
        for method in methods_of(backend)
        for name, build in (("logits", valid_call), ("probs", probs_call))
    ]
    calls += [(f"bad: {c.label}", lambda c=c: c.build(device))
              for c in BAD_CASES if "device" not in c.label]
    calls += [(f"unvalidated: {label}", lambda call=call: {**call, "validate": False})
              for label, call in _garbage_calls(methods_of(backend), device)]
    for label, build in calls:
        call = build()
        before = _snapshot(call)
        with contextlib.suppress(ValueError, TypeError):  # raising is fine; writing is not
            pv.verify(**{"backend": backend, **call})
        changed = _unchanged(before, call)
        if changed:
            failures.append(f"{label}: {changed} modified")
    detail = summarize(failures) or f"{len(calls)} calls left their inputs untouched"
    return CheckResult("bad_input.no_mutation", not failures, detail, {"calls": len(calls)})


def _garbage_calls(methods: tuple[str, ...] = METHODS, device: torch.device | str = "cpu"
                   ) -> list[tuple[str, dict[str, Any]]]:
    """NaN/inf/negative inputs the contract says an unvalidated call must survive."""
    nan, inf = float("nan"), float("inf")
    out: list[tuple[str, dict[str, Any]]] = []
    for method in methods:
        for label, target_key, fill in (
            ("NaN logits row", "target_logits", nan),
            ("+inf logits entry", "target_logits", inf),
            ("-inf logits row", "target_logits", -inf),
            ("NaN probs row", "target_probs", nan),
            ("inf probs entry", "target_probs", inf),
            ("negative probs", "target_probs", -0.5),
        ):
            call = (valid_call if target_key == "target_logits" else probs_call)(device)
            t = call[target_key].clone()
            t[0, 0] = fill  # a whole row, read by every method
            t[1, 1, 2] = fill  # one entry
            call[target_key] = t
            call["draft_probs"] = call["draft_probs"].clone()
            call["draft_probs"][0, 1] = nan
            out.append((f"{method} {label}", {**call, "method": method}))
    return out


@check("bad_input.unvalidated")
def unvalidated(backend: str, quick: bool) -> CheckResult:
    """validate=False: no checks run, and NaN/inf inputs still give in-range ids and shapes."""
    failures = []
    device = torch_device(backend)
    garbage = _garbage_calls(methods_of(backend), device)
    for label, call in garbage:
        with np.errstate(all="ignore"):  # the numpy reference meets the NaNs head-on
            res = pv.verify(**call, validate=False, backend=backend)
        target = call.get("target_logits", call.get("target_probs"))
        problem = check_shapes(res, *call["draft_token_ids"].shape, target.shape[-1])
        if problem:
            failures.append(f"{label}: {problem}")
    # No checks at all: inputs that validation refuses are not refused.
    for label, call in (
        ("probs summing to 0.9",
         {**probs_call(device), "target_probs": probs_call(device)["target_probs"] * 0.9}),
        ("temperature 0.5 with probs", {**probs_call(device), "temperature": 0.5}),
    ):
        try:
            res = pv.verify(**call, validate=False, backend=backend)
        except (ValueError, TypeError) as exc:
            failures.append(f"{label}: validate=False still checked ({exc})")
            continue
        problem = check_shapes(res, *call["draft_token_ids"].shape, call["target_probs"].shape[-1])
        if problem:
            failures.append(f"{label}: {problem}")
    n = len(garbage) + 2
    return CheckResult("bad_input.unvalidated", not failures,
                       summarize(failures) or f"{n} unvalidated calls returned well-formed results",
                       {"calls": n})

