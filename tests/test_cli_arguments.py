"""Bad command lines: one line on stderr naming the flag, exit status 2, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_verify.cli import main as cli

BAD = [
    (["info", "--json", "/nonexistent/x.json"], "--json"),
    (["info", "--json", "/proc/x.json"], "--json"),  # root passes os.access; /proc refuses
    (["bench", "--csv", "/proc/r.csv"], "--csv"),
    (["conformance", "--json", "/proc/c.json"], "--json"),
    (["gpu-check", "--dry-run", "--out", "/proc/pv-out"], "--out"),
    (["gpu-check", "--dry-run", "--out", "/proc"], "--out"),
    (["serve-check", "--json", "/proc/s.json"], "--json"),
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


def _really_writable(folder: Path) -> bool:
    try:
        (folder / "probe").write_text("x")
    except OSError:
        return False
    (folder / "probe").unlink()
    return True


def test_output_checks_agree_with_a_real_write_in_a_read_only_folder(tmp_path: Path) -> None:
    """The checks write to find out, so they answer what the run's own write would: refused
    for an ordinary user in a read-only folder, allowed for root (who may write there)."""
    import os

    from portable_verify.cli import checks

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        expected = _really_writable(folder)
        for check, path in ((checks.writable_file, folder / "r.json"),
                            (checks.writable_dir, folder / "out"), (checks.writable_dir, folder)):
            try:
                check("--flag", str(path))
                allowed = True
            except checks.UsageError as exc:
                assert str(exc).startswith("--flag: cannot write"), exc
                allowed = False
            assert allowed == expected, (check.__name__, path)
        assert sorted(folder.iterdir()) == []  # the probes leave nothing behind
    finally:
        folder.chmod(0o755)
    checks.writable_file("--flag", str(tmp_path / "new.json"))  # control: a writable folder
    checks.writable_dir("--flag", str(tmp_path / "new" / "out"))
    assert sorted(tmp_path.iterdir()) == [folder]
    existing = tmp_path / "kept.json"
    existing.write_text("kept")
    checks.writable_file("--flag", str(existing))
    assert existing.read_text() == "kept"  # an existing file is probed, not truncated
    # Negative control for /proc: the permission bits let root through, a real write does not.
    if os.geteuid() == 0:
        assert os.access("/proc", os.W_OK) and not _really_writable(Path("/proc"))
