"""Registry and runner of conformance checks.

A check is a function ``fn(backend: str, quick: bool) -> CheckResult`` registered with
:func:`check`. Check modules are listed in ``CHECK_MODULES``; importing them registers their
checks. pytest (tests/test_conformance.py) and ``portable-verify conformance`` both run the same
registry, so a backend author gets exactly the proof this project runs on its own backends.
"""

from __future__ import annotations

import functools
import importlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHECK_MODULES: tuple[str, ...] = (
    # Each module registers its checks at import; a module that cannot be found is an error,
    # so a misspelt entry cannot shrink a conformance run without a word.
    "portable_verify.testing.checks.exact_decisions",
    "portable_verify.testing.checks.losslessness",
    "portable_verify.testing.checks.block_verification",
    "portable_verify.testing.checks.seed_streams",
    "portable_verify.testing.checks.bad_input_errors",
    "portable_verify.testing.checks.memory_soak",
    "portable_verify.testing.checks.fuzz",
    "portable_verify.testing.checks.long_run",
    "portable_verify.testing.checks.tree_exact",
    "portable_verify.testing.checks.tree_law",
    "portable_verify.testing.checks.tree_bad_inputs",
    "portable_verify.testing.checks.traversal",
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


def crash_result(name: str, exc: Exception) -> CheckResult:
    """A failed verdict naming the exception and where it was raised."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return CheckResult(
        name, False, f"raised {type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
    )


def check(name: str, *, quick: bool = True) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn(backend, quick) -> CheckResult`` as the conformance check ``name``.

    The registry's copy turns an unexpected exception into a failed result: a conformance run
    reports every problem of a backend at once, so one crashing check must not abort it. The
    function itself is returned unchanged, so a direct call still shows the traceback.
    """

    def register(fn: CheckFn) -> CheckFn:
        if name in _CHECKS and getattr(_CHECKS[name].fn, "__wrapped__", None) is not fn:
            raise ValueError(f"conformance check {name!r} registered twice")

        @functools.wraps(fn)
        def guarded(backend: str, quick: bool) -> CheckResult:
            try:
                return fn(backend, quick)
            except Exception as exc:
                return crash_result(name, exc)

        _CHECKS[name] = Check(name, guarded, quick, _describe(fn))
        return fn

    return register


def _describe(fn: CheckFn) -> str:
    return (fn.__doc__ or "").strip().split("\n")[0]


def summarize(failures: list[str], limit: int = 5) -> str:
    """The first ``limit`` failure lines, plus how many more there were."""
    shown = "; ".join(failures[:limit])
    more = len(failures) - limit
    return shown + (f"; ... and {more} more" if more > 0 else "")


def load_check_modules(modules: tuple[str, ...] | None = None) -> None:
    """Import every check module; one that does not exist raises a ``LookupError`` naming it."""
    for module in CHECK_MODULES if modules is None else modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module + ".").startswith(exc.name + "."):
                raise  # the module exists but one of its own imports is missing
            raise LookupError(
                f"conformance check module {module!r} (listed in kit.CHECK_MODULES) cannot be "
                f"found: {exc}"
            ) from exc


def all_checks() -> list[Check]:
    """Every registered check, in registration order."""
    load_check_modules()
    return list(_CHECKS.values())


def get_check(name: str) -> Check:
    """The registered check ``name``; an unknown name raises a ``ValueError`` listing them."""
    checks = {c.name: c for c in all_checks()}
    if name not in checks:
        raise ValueError(f"no conformance check named {name!r}; registered: {sorted(checks)}")
    return checks[name]


def run_check(name: str, backend: str, quick: bool = False) -> CheckResult:
    """Run one registered check on ``backend``."""
    return get_check(name).fn(backend, quick)


def skipped_under_quick(c: Check) -> CheckResult:
    return CheckResult(c.name, True, "skipped under --quick", skipped=True)


def run_conformance(backend: str, quick: bool = False) -> list[CheckResult]:
    """Run every check on ``backend`` (``quick`` skips the long ones and shrinks samples)."""
    return [
        skipped_under_quick(c) if quick and not c.quick else c.fn(backend, quick)
        for c in all_checks()
    ]
