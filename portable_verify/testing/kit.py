"""Registry and runner of conformance checks.

A check is a function ``fn(backend: str, quick: bool) -> CheckResult`` registered with
:func:`check`. Check modules are listed in ``CHECK_MODULES``; importing them registers their
checks. pytest (tests/test_conformance.py) and ``portable-verify conformance`` both run the same
registry, so a backend author gets exactly the proof this project runs on its own backends.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHECK_MODULES: tuple[str, ...] = (
    # Each module registers its checks at import; a module not yet written is skipped.
    "portable_verify.testing.exact",
    "portable_verify.testing.statistical",
    "portable_verify.testing.seeds",
    "portable_verify.testing.bad_input",
    "portable_verify.testing.soak",
)


@dataclass
class CheckResult:
    """Outcome of one check on one backend, with the statistics behind it."""

    name: str
    passed: bool
    detail: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False


CheckFn = Callable[[str, bool], CheckResult]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    quick: bool  # runs under --quick
    description: str


_CHECKS: dict[str, Check] = {}


def check(name: str, *, quick: bool = True) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn(backend, quick) -> CheckResult`` as the conformance check ``name``."""

    def register(fn: CheckFn) -> CheckFn:
        if name in _CHECKS and _CHECKS[name].fn is not fn:
            raise ValueError(f"conformance check {name!r} registered twice")
        _CHECKS[name] = Check(name, fn, quick, (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return register


def all_checks() -> list[Check]:
    """Every registered check, in registration order."""
    for module in CHECK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return list(_CHECKS.values())


def run_check(name: str, backend: str, quick: bool = False) -> CheckResult:
    """Run one registered check on ``backend``."""
    checks = {c.name: c for c in all_checks()}
    return checks[name].fn(backend, quick)


def run_conformance(backend: str, quick: bool = False) -> list[CheckResult]:
    """Run every check on ``backend`` (``quick`` skips the long ones and shrinks samples)."""
    results = []
    for c in all_checks():
        if quick and not c.quick:
            results.append(CheckResult(c.name, True, "skipped under --quick", skipped=True))
            continue
        results.append(c.fn(backend, quick))
    return results
