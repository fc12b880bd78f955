"""Bad command lines: one line on stderr naming the flag, exit status 2, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_verify.cli import main as cli

BAD = [
    (["info", "--json", "/nonexistent/x.json"], "--json"),
    (["bench", "--backend", "nosuch"], "--backend"),
    (["bench", "--shapes", "1000000000,3,32000"], "--shapes"),
    (["bench", "--shapes", "1,2"], "--shapes"),
    (["bench", "--json", "missing/dir/r.json"], "--json"),
    (["bench", "--csv", "missing/r.csv"], "--csv"),
    (["bench", "--markdown", "missing/r.md"], "--markdown"),
    (["bench", "--plot", "missing/r.png"], "--plot"),
    (["bench", "--repetitions", "0"], "--repetitions"),
    (["bench", "--threads", "0"], "--threads"),
    (["bench", "--variants", "greedy/probs"], "--variants"),
    (["bench", "--clock", "cpu", "--threads", "1,2"], "--clock"),
    (["e2e", "--temperature", "nan"], "--temperature"),
    (["e2e", "--temperature", "-1"], "--temperature"),
    (["e2e", "--temperature", "inf"], "--temperature"),
    (["e2e", "--batch", "1000000000"], "--batch"),
    (["e2e", "--batch", "0"], "--batch"),
    (["e2e", "--k", "0"], "--k"),
    (["e2e", "--prompts", "99"], "--prompts"),
    (["e2e", "--json", "missing/e.json"], "--json"),
    (["conformance", "--backend", "nosuch"], "--backend"),
    (["conformance", "--check", "no-such-check"], "--check"),
    (["conformance", "--threads", "0"], "--threads"),
    (["conformance", "--json", "missing/c.json"], "--json"),
    (["gpu-check", "--dry-run", "--budget", "0"], "--budget"),
    (["gpu-check", "--dry-run", "--budget", "nan"], "--budget"),
    (["gpu-check", "--dry-run", "--out", "a-file/out"], "--out"),
    (["gpu-check", "--dry-run", "--json", "missing/g.json"], "--json"),
    (["serve-check", "--repeats", "0"], "--repeats"),
    (["serve-check", "--batches", "0"], "--batches"),
    (["serve-check", "--max-tokens", "0"], "--max-tokens"),
    (["serve-check", "--draft-layers", "0"], "--draft-layers"),
    (["serve-check", "--seam", "--threads", "0"], "--threads"),
    (["serve-check", "--temperature", "nan"], "--temperature"),
    (["serve-check", "--methods", "beam"], "--methods"),
    (["serve-check", "--json", "missing/s.json"], "--json"),
]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Relative paths resolve in an empty folder holding one plain file, ``a-file``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    return tmp_path


@pytest.mark.parametrize(("argv", "flag"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_command_line_is_one_line_naming_the_flag(
        argv: list[str], flag: str, in_tmp: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_verify.bench import run as bench_run

    def no_work(*_: object, **__: object) -> None:
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(bench_run, "run", no_work)  # the benchmark grid must never start
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"portable-verify {argv[0]}: error: {flag}"), err
    assert "Traceback" not in err
    assert list(in_tmp.iterdir()) == [in_tmp / "a-file"]  # nothing was written


GOOD = [
    ["info", "--json", "-"],
    ["bench", "--quick", "--json", "r.json", "--csv", "r.csv", "--plot", "r.png"],
    ["bench", "--shapes", "64,5,128256", "--backend", "torch:cpu", "--threads", "1,2"],
    ["e2e", "--temperature", "0.5", "--batch", "2", "--json", "-"],
    ["conformance", "--backend", "numpy", "--check", "exact.", "--json", "c.json"],
    ["gpu-check", "--dry-run", "--out", "new/out", "--budget", "10"],
    ["serve-check", "--methods", "ngram", "--temperature", "0", "--json", "s.json"],
]


@pytest.mark.parametrize("argv", GOOD, ids=[" ".join(a) for a in GOOD])
def test_good_command_lines_pass_the_checks(argv: list[str], in_tmp: Path) -> None:
    """The negative control: the checks refuse only what is wrong."""
    args = cli.build_parser().parse_args(argv)
    args.cli_check(args)
    assert list(in_tmp.iterdir()) == [in_tmp / "a-file"]  # checking writes nothing
