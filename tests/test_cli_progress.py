"""Long commands say what they are doing on stderr (plain lines when captured, nothing with
``--quiet``) and end with a one-line verdict on stdout."""

from __future__ import annotations

import re

import pytest

from portable_verify.cli import main as cli
from portable_verify.cli.progress import Progress

TINY_BENCH = ["bench", "--shapes", "1,2,64", "--variants", "greedy/logits,rejection/probs",
              "--backend", "torch:cpu", "--repetitions", "1"]
CONFORMANCE = ["conformance", "--backend", "numpy", "--check", "exact.greedy", "--quick"]


def _progress_lines(err: str, command: str) -> list[str]:
    return [line for line in err.splitlines() if re.match(rf"{command}: \[\d+/\d+\] ", line)]


def test_bench_prints_a_plain_line_per_cell_and_a_verdict(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(TINY_BENCH) == 0
    out, err = capsys.readouterr()
    lines = _progress_lines(err, "bench")
    assert [line.split("]")[0] for line in lines] == ["bench: [1/2", "bench: [2/2"]
    assert "greedy/logits (1,2,64)" in lines[0]
    assert re.fullmatch(r"bench: \d+ of \d+ targets met \(torch:cpu, 1 thread\)",
                        out.splitlines()[-1]), out


def test_bench_quiet_prints_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*TINY_BENCH, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert not [line for line in err.splitlines() if line.startswith("bench: ")], err
    assert out.splitlines()[-1].startswith("bench: ")  # the verdict stays


def test_bench_verdict_goes_to_stderr_when_json_owns_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert cli.main([*TINY_BENCH, "--quiet", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["cells"]  # standard output is the JSON document alone
    assert re.search(r"^bench: \d+ of \d+ targets met", err, re.MULTILINE)


def test_conformance_progress_quiet_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(CONFORMANCE) == 0
    out, err = capsys.readouterr()
    assert _progress_lines(err, "conformance") == [
        line for line in err.splitlines() if "PASS numpy exact.greedy" in line]
    assert len(_progress_lines(err, "conformance")) == 1
    assert out.splitlines()[-1] == "conformance: 1 of 1 checks passed, 0 failed, 0 skipped (numpy)"
    assert cli.main([*CONFORMANCE, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert not _progress_lines(err, "conformance")
    assert out.splitlines()[-1].startswith("conformance: 1 of 1 checks passed")


def test_plain_updates_inside_a_cell_are_rate_limited(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with Progress("demo", total=2, every_s=3600) as progress:
        progress.tick("first update")  # the first one prints
        progress.tick("second update")  # within the interval: not printed
        progress.advance("cell one")  # a finished cell always prints
        progress.say("an event")
    err = capsys.readouterr().err.splitlines()
    assert [line.rsplit(" (", 1)[0] for line in err] == [
        "demo: first update", "demo: [1/2] cell one", "demo: an event"]
    with Progress("demo", total=1, quiet=True) as progress:
        progress.tick("x")
        progress.advance("y")
        progress.say("z")
    assert capsys.readouterr().err == ""
