"""The conformance kit through pytest: every available backend x every registered check.

A failing :class:`CheckResult` fails its test with the check's detail and statistics. Sample
sizes per backend, chosen to fit the CI budget (2 cores, whole suite < ~20 min):

* ``numpy`` runs ``quick``: the reference loops in Python, and the ``exact.*`` checks compare
  with it, so at full sizes they would mostly compare it with itself (its full statistical set
  takes ~18 s against ~8 s quick).
* ``triton`` runs ``quick``, and skips the ``stat.*`` checks: its interpreter costs ~30 ms per
  request (measured: 256 requests ~8 s), so one statistical check (>= 4096 decodes) would take
  minutes. Its tokens are compared bit for bit with the reference by the ``exact.*`` checks, and
  all backends draw the same uniforms, so a backend that matches the reference also inherits
  the reference's statistical verdicts.
* every other backend (``cpu``, ``torch``, ``openvino``, ...) runs the full sizes.

``stat.negative_controls_caught`` does not depend on the backend under test (the controls are
their own backends), so it runs once, at the quick sizes, under ``cpu``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

import portable_verify as pv
from portable_verify.testing import kit

QUICK_BACKENDS = {"numpy", "triton"}
STAT_SKIP = {"triton": "interpreter too slow for statistical sample sizes; see module docstring"}
BACKEND_INDEPENDENT = {"stat.negative_controls_caught": "cpu"}

BACKENDS = pv.available_backends()
CHECKS = kit.all_checks()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """The checks run small tensors; extra intra-op threads only oversubscribe CI's 2 cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
@pytest.mark.parametrize("backend", BACKENDS)
def test_conformance(backend: str, check: kit.Check) -> None:
    quick = backend in QUICK_BACKENDS
    owner = BACKEND_INDEPENDENT.get(check.name)
    if owner is not None:
        if backend != owner:
            pytest.skip(f"independent of the backend; runs once under {owner!r}")
        quick = True
    if check.name.startswith("stat.") and backend in STAT_SKIP:
        pytest.skip(STAT_SKIP[backend])
    if quick and not check.quick:
        pytest.skip(f"{check.name} is a long check; {backend!r} runs quick sizes only")
    result = check.fn(backend, quick)
    assert not result.skipped or result.passed
    if not result.passed:
        stats = json.dumps(result.stats, default=str)[:2000]
        pytest.fail(f"{backend} / {result.name}: {result.detail}\nstats: {stats}", pytrace=False)


def test_cli_exits_nonzero_and_shows_the_statistic_on_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from portable_verify.cli import conformance

    args = ["--check", "stat.sequence_joint", "--quick"]
    assert conformance.main(["--backend", "cpu", *args]) == 0
    good = capsys.readouterr().out
    assert "PASS" in good and "chi2=" in good
    assert conformance.main(["--backend", "_wrong_accept_q_over_p", *args]) == 1
    bad = capsys.readouterr().out
    assert "FAIL" in bad and "chi2=" in bad


def test_cli_refuses_an_unknown_backend() -> None:
    from portable_verify.cli import conformance

    assert conformance.main(["--backend", "no_such_backend", "--quick"]) == 2
