"""The conformance kit through pytest: every available backend x every registered check.

A failing :class:`CheckResult` fails its test with the check's detail and statistics. Sample
sizes come from each backend's traits (``pv.get_backend(name).traits``), chosen to fit the CI
budget (2 cores, whole suite < ~20 min):

* without ``full_conformance_sizes`` (the numpy reference, the Triton interpreter) a backend runs
  ``quick``: the reference loops in Python and the ``exact.*`` checks compare with it, so at full
  sizes they would mostly compare it with itself; the interpreter is orders of magnitude slower
  per request than compiled code (figures in docs/testing.md).
* without ``statistical_sizes`` (the Triton interpreter) the ``stat.*`` checks are skipped: one
  statistical check (>= 4096 decodes) would take minutes. Its tokens are compared bit for bit
  with the reference by the ``exact.*`` checks, and all backends draw the same uniforms, so a
  backend that matches the reference also inherits the reference's statistical verdicts.
* every other backend runs the full sizes.

``stat.negative_controls_caught`` does not depend on the backend under test (the controls are
their own backends), so it runs once, at the quick sizes, under the reference.
"""

from __future__ import annotations

import json

import pytest

import portable_verify as pv
from portable_verify.testing import kit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BACKEND_INDEPENDENT = {"stat.negative_controls_caught"}
CHECKS = kit.all_checks()


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_conformance(available_backend: str, check: kit.Check) -> None:
    traits = pv.get_backend(available_backend).traits
    quick = not traits.full_conformance_sizes
    if check.name in BACKEND_INDEPENDENT:
        if not traits.is_reference:
            pytest.skip("independent of the backend; runs once under the reference")
        quick = True
    if check.name.startswith("stat.") and not traits.statistical_sizes:
        pytest.skip("too slow for statistical sample sizes; see module docstring")
    if quick and not check.quick:
        pytest.skip(f"{check.name} is a long check; this backend runs quick sizes only")
    result = check.fn(available_backend, quick)
    assert not result.skipped or result.passed
    if not result.passed:
        stats = json.dumps(result.stats, default=str)[:2000]
        pytest.fail(f"{available_backend} / {result.name}: {result.detail}\nstats: {stats}",
                    pytrace=False)


def test_unknown_check_module_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt entry must stop the run, not shrink it silently."""
    misspelt = "portable_verify.testing.checks.exact_decision"
    monkeypatch.setattr(kit, "CHECK_MODULES", (*kit.CHECK_MODULES, misspelt))
    with pytest.raises(LookupError, match=misspelt):
        kit.all_checks()
    with pytest.raises(LookupError, match="no_such_package"):
        kit.load_check_modules(("no_such_package.checks",))


def test_a_check_module_with_a_broken_import_reports_that_import(tmp_path, monkeypatch) -> None:
    """The module exists but imports something missing: the real error, not 'cannot be found'."""
    (tmp_path / "pv_broken_checks.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        kit.load_check_modules(("pv_broken_checks",))


def test_unknown_check_name_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"exact\.greedy"):
        kit.run_check("exact.gredy", "numpy")


def test_a_crashing_check_is_a_failed_verdict_not_an_abort() -> None:
    result = kit.run_check("exact.greedy", "no_such_backend", quick=True)
    assert not result.passed and "raised ValueError" in result.detail


def test_cli_exits_nonzero_and_shows_the_statistic_on_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from portable_verify.cli import conformance

    args = ["--check", "stat.sequence_joint", "--quick"]
    assert conformance.main(["--backend", "torch:cpu", *args]) == 0
    good = capsys.readouterr().out
    assert "PASS" in good and "chi2=" in good
    assert conformance.main(["--backend", "_wrong_accept_q_over_p", *args]) == 1
    bad = capsys.readouterr().out
    assert "FAIL" in bad and "chi2=" in bad


def test_cli_refuses_an_unknown_backend() -> None:
    from portable_verify.cli import conformance

    assert conformance.main(["--backend", "no_such_backend", "--quick"]) == 2
