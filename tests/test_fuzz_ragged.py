"""The ragged-extremes fuzz check itself: crash attribution and the pending marks.

The check's verdicts on real backends run in tests/test_conformance.py (``fuzz.ragged_extremes``
on every backend); here a child that crashes on purpose and stubbed probe outcomes show that
the check can fail, and fails for the right reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_verify.testing.checks import fuzz

_CRASHING_CHILD = '''
import json, os, signal

def child(backend, start, progress):
    from portable_verify.testing.checks.fuzz import ragged_probes
    with open(progress, "a", encoding="utf-8") as f:
        for i in range(start, len(ragged_probes())):
            f.write(json.dumps({"start": i}) + "\\n")
            f.flush()
            if i in (2, 5):
                os.kill(os.getpid(), signal.SIGSEGV)
            f.write(json.dumps({"i": i, "problem": ""}) + "\\n")
    return 0
'''


def test_a_crash_is_pinned_on_its_probe_and_the_rest_still_run(tmp_path: Path) -> None:
    path = tmp_path / "crashing_child.py"
    path.write_text(_CRASHING_CHILD)
    problems = fuzz.run_ragged_extremes("numpy", child=f"{path}:child")
    total = len(fuzz.ragged_probes())
    assert sorted(problems) == list(range(total))
    crashed = {i for i, p in problems.items() if p}
    assert crashed == {2, 5}
    assert "SIGSEGV" in problems[2] and "SIGSEGV" in problems[5]


def _stub(monkeypatch: pytest.MonkeyPatch, problems: dict[int, str],
          pending: dict[tuple[str, str], str]) -> None:
    monkeypatch.setattr(fuzz, "run_ragged_extremes", lambda backend: problems)
    monkeypatch.setattr(fuzz, "RAGGED_PENDING", pending)


def test_an_unmarked_failure_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    probes = fuzz.ragged_probes()
    problems = {i: "" for i in range(len(probes))}
    _stub(monkeypatch, problems, {})
    assert fuzz.fuzz_ragged_extremes("numpy", True).passed
    problems[3] = "MemoryError: Unable to allocate 8.00 TiB"
    result = fuzz.fuzz_ragged_extremes("numpy", True)
    assert not result.passed and probes[3][0].name in result.detail


def test_a_pending_mark_excuses_its_case_until_it_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    probes = fuzz.ragged_probes()
    case = probes[3][0].name
    problems = {i: ("process crashed: killed by SIGSEGV" if probes[i][0].name == case else "")
                for i in range(len(probes))}
    _stub(monkeypatch, problems, {(case, "numpy"): "being fixed elsewhere"})
    result = fuzz.fuzz_ragged_extremes("numpy", True)
    assert result.passed and result.stats["pending"] and "RAGGED_PENDING" in result.detail
    assert not fuzz.fuzz_ragged_extremes("torch:cpu", True).passed  # the mark is per backend
    _stub(monkeypatch, problems, {(case, fuzz.ANY_BACKEND): "fixed in the front door"})
    assert fuzz.fuzz_ragged_extremes("torch:cpu", True).passed  # ... unless it says "*"
    _stub(monkeypatch, {i: "" for i in range(len(probes))}, {(case, "numpy"): "fixed now"})
    result = fuzz.fuzz_ragged_extremes("numpy", True)
    assert not result.passed and "remove it from RAGGED_PENDING" in result.detail


def test_every_case_names_an_argument_the_front_door_takes() -> None:
    import inspect

    import portable_verify as pv

    params = set(inspect.signature(pv.verify_ragged).parameters)
    assert {c.argument for c in fuzz.RAGGED_EXTREMES} <= params
    assert {name for name, _ in fuzz.RAGGED_PENDING} <= {c.name for c in fuzz.RAGGED_EXTREMES}
