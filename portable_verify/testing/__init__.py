"""The conformance kit: every check a backend must pass, runnable from pytest or the CLI.

>>> from portable_verify.testing import run_conformance
>>> results = run_conformance("numpy", quick=True)  # doctest: +SKIP
"""

from portable_verify.testing.kit import CheckResult, all_checks, run_check, run_conformance

__all__ = ["CheckResult", "all_checks", "run_check", "run_conformance"]
