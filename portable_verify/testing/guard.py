"""Turn a check's crash into a failed :class:`CheckResult` instead of aborting the whole run.

Why: a conformance run exists to report every problem of a backend at once; a backend that
raises inside one check must still get a verdict from all the others.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable

from portable_verify.testing.kit import CheckResult

CheckFn = Callable[[str, bool], CheckResult]


def guarded(name: str) -> Callable[[CheckFn], CheckFn]:
    """Wrap a check so an unexpected exception becomes ``CheckResult(passed=False)``."""

    def wrap(fn: CheckFn) -> CheckFn:
        @functools.wraps(fn)
        def run(backend: str, quick: bool) -> CheckResult:
            try:
                return fn(backend, quick)
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                return CheckResult(
                    name, False,
                    f"raised {type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})",
                )

        return run

    return wrap


def summarize(failures: list[str], limit: int = 5) -> str:
    """The first ``limit`` failure lines, plus how many more there were."""
    shown = "; ".join(failures[:limit])
    more = len(failures) - limit
    return shown + (f"; ... and {more} more" if more > 0 else "")
