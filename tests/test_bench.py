"""The benchmark: the dense baseline is a correct verifier, and the CLI reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import portable_verify as pv
from portable_verify.backends.torch import draw as torch_draw
from portable_verify.backends.torch import ops as torch_ops
from portable_verify.bench import numba_runtime, targets
from portable_verify.bench import threads as bench_threads
from portable_verify.bench.dense import dense_verify
from portable_verify.bench.harness import measure
from portable_verify.testing.stats.chi_square import FitResult, chi_square_fit, power_against

# Chi-square tests below: false-alarm rate ALPHA = 1e-3 per test with fixed seeds, so a correct
# sampler passes deterministically here; each test states its power against a named wrong
# answer, computes it (testing/stats/chi_square.power_against) and runs that wrong answer
# through the same test as a negative control that must fail.
ALPHA = 1e-3


def _fit(samples: torch.Tensor, probs: torch.Tensor) -> FitResult:
    counts = torch.bincount(samples, minlength=probs.numel()).double().numpy()
    return chi_square_fit("tokens", counts, probs.double().numpy(), ALPHA)


def _power(probs: torch.Tensor, wrong: torch.Tensor, n: int) -> float:
    return power_against(probs.double().numpy(), wrong.double().numpy(), n, ALPHA)


def test_dense_greedy_equals_reference() -> None:
    g = torch.Generator().manual_seed(7)
    for v in (1, 3, 50):
        logits = torch.randn(9, 4, v, generator=g).round()  # rounding creates argmax ties
        drafts = logits[:, :3].argmax(-1)
        drafts[::2, 1] = torch.randint(0, v, (5,), generator=g)  # some rows reject midway
        for kw in (dict(target_logits=logits), dict(target_probs=torch.softmax(logits, -1))):
            want = pv.verify(drafts, method="greedy", backend="numpy", **kw).token_ids
            for method in ("greedy", "rejection", "typical"):
                got = dense_verify(drafts, method=method, temperature=0.0, generator=g, **kw)
                assert torch.equal(got, want), (v, method)


def test_dense_typical_decisions_match_reference() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 4, 6, generator=g) * 3
    drafts = torch.randint(0, 6, (64, 3), generator=g)
    want = pv.verify(drafts, target_logits=logits, method="typical", temperature=0.8, seed=1,
                     backend="numpy")
    got = dense_verify(drafts, target_logits=logits, method="typical", temperature=0.8,
                       generator=g)
    a = want.num_accepted
    assert torch.equal((got >= 0).sum(1) - 1, a)
    rejected = a < 3  # the recovered token is deterministic (argmax); the bonus is sampled
    assert torch.equal(got[rejected], want.token_ids[rejected])
    assert rejected.any() and (~rejected).any()


def test_dense_rejection_emits_the_target_distribution() -> None:
    """First emitted token ~ p_0 exactly, and the bonus ~ p_1 at temperature 0.7. N = 40000
    draws, V = 5 (one token impossible) and V = 3. Power (computed, >= 0.999 each): against
    the draft distribution q instead of p (total variation 0.3), and against the bonus drawn
    untempered (T = 1 instead of 0.7, total variation 0.074); both wrong answers are run
    through the same test and must fail."""
    g = torch.Generator().manual_seed(11)
    n = 40000
    p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    drafts = torch.multinomial(q, n, replacement=True, generator=g).view(n, 1)
    target = torch.stack([p, p]).expand(n, 2, 5)
    out = dense_verify(drafts, target_probs=target, draft_probs=q.expand(n, 1, 5), generator=g)
    assert _fit(out[:, 0], p).passed
    assert _power(p, q, n) > 0.999
    assert not _fit(drafts[:, 0], p).passed  # negative control: the raw drafts fail
    # The bonus: with q == p every draft is accepted, so position 1 is a pure draw from p_1.
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    p1 = torch.softmax(logits / 0.7, -1)
    untempered = torch.softmax(logits, -1)
    drafts = torch.multinomial(p1, n, replacement=True, generator=g).view(n, 1)
    out = dense_verify(drafts, target_logits=logits.expand(n, 2, 3), temperature=0.7,
                       draft_probs=p1.expand(n, 1, 3), generator=g)
    assert (out[:, 0] == drafts[:, 0]).all()
    assert _fit(out[:, 1], p1).passed
    assert _power(p1, untempered, n) > 0.999
    wrong = dense_verify(drafts, target_logits=logits.expand(n, 2, 3), temperature=1.0,
                         draft_probs=p1.expand(n, 1, 3), generator=g)
    # Negative control: at T = 1 the first token follows the untempered law; the test of p1
    # must reject it.
    assert not _fit(wrong[:, 0], p1).passed


@pytest.mark.parametrize("tile", [1, 7, 1 << 16])
def test_torch_backend_row_tiles_match_reference(monkeypatch: pytest.MonkeyPatch,
                                                 tile: int) -> None:
    """The CPU cache-blocked row passes (one row per tile up to all rows at once, reusing the
    per-thread scratch buffers across calls) change only the loop structure: decisions must
    equal the reference's, including ragged rows, mixed greedy rows, one-hot and explicit
    drafts."""
    monkeypatch.setattr(torch_ops, "CPU_TILE_ELEMENTS", tile)
    monkeypatch.setattr(torch_ops, "CPU_FINAL_TILE_ELEMENTS", tile)
    g = torch.Generator().manual_seed(5)
    b, k, v = 6, 3, 11
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    logits[0, 1, 3] = -float("inf")
    drafts = torch.randint(0, v, (b, k), generator=g)
    drafts[1] = logits[1, :k].argmax(-1)
    n = torch.tensor([3, 3, 2, 0, 1, 3])
    temp = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.5, 2.0])
    dq = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    for method in ("rejection", "typical"):
        for kw in (dict(target_logits=logits, temperature=temp),
                   dict(target_probs=torch.softmax(logits, -1)),
                   dict(target_probs=torch.softmax(logits, -1), draft_probs=dq),
                   dict(target_logits=logits, temperature=temp, draft_probs=dq)):
            for seed in range(4):
                want = pv.verify(drafts, num_draft_tokens=n, method=method, seed=seed,
                                 backend="numpy", **kw)
                got = pv.verify(drafts, num_draft_tokens=n, method=method, seed=seed,
                                backend="torch", **kw)
                assert torch.equal(want.token_ids, got.token_ids), (method, list(kw), seed)


def _bench_cli(argv: list[str]) -> int:
    """Run ``portable-verify bench`` in-process (a subprocess would re-import torch)."""
    import argparse

    from portable_verify.cli import bench

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def test_bench_cli_writes_every_figure(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import importlib.util

    out = {name: tmp_path / f"r.{name}" for name in ("json", "csv", "png", "md")}
    rc = _bench_cli(["--shapes", "1,2,300;3,1,300", "--repetitions", "1", "--validation",
                     "--json", str(out["json"]), "--csv", str(out["csv"]),
                     "--plot", str(out["png"]), "--markdown", str(out["md"])])
    assert rc == 0
    data = json.loads(out["json"].read_text())
    meta = data["meta"]
    assert meta["threads"] == 1
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["numpy"] and meta["machine"]["cpu"]
    cells = data["cells"]
    assert {(c["B"], c["variant"]) for c in cells} == {
        (b, v) for b in (1, 3)
        for v in ("greedy/logits", "rejection/logits", "rejection/probs", "typical/logits",
                  "block/logits", "block/probs")}
    has_hf = importlib.util.find_spec("transformers") is not None
    for c in cells:
        t, r = c["times_ms"], c["ratios"]
        for key in ("verify", "dense", "floor", "verify_validated"):
            assert t[key] > 0, (key, c["variant"])
        assert r["speedup_vs_dense"] == pytest.approx(t["dense"] / t["verify"])
        assert r["x_floor"] == pytest.approx(t["verify"] / t["floor"])
        assert c["floor_bytes"] > 0 and c["floor_impl"]
        assert t["argmax"] > 0 and r["x_argmax"] == pytest.approx(t["verify"] / t["argmax"])
        assert (t["vllm_v0_typical"] is not None) == (c["method"] == "typical")
        hf_applies = has_hf and c["B"] == 1 and c["method"] == "rejection"
        assert (t["hf"] is not None) == hf_applies, c["variant"]
        is_block = c["method"] == "block"
        assert (t["rejection_same_inputs"] is not None) == is_block, c["variant"]
        if is_block:  # timed beside rejection on the same inputs; drafts' acceptance stated
            assert r["x_rejection"] == pytest.approx(t["verify"] / t["rejection_same_inputs"])
            assert len(c["acceptance_per_position"]) == c["K"]
            assert all(0 < a <= 1 for a in c["acceptance_per_position"])
    # Rejection from probabilities must read only one row of p and q per request.
    b3 = {c["variant"]: c["floor_bytes"] for c in cells if c["B"] == 3}
    assert b3["rejection/probs"] == 2 * 3 * 300 * 4
    assert b3["greedy/logits"] == 3 * 2 * 300 * 4
    rows = list(csv.DictReader(out["csv"].open()))
    assert len(rows) == len(cells) and "speedup_vs_dense" in rows[0] and rows[0]["threads"] == "1"
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["md"].read_text().count("| cpu/") == len(cells)
    printed = capsys.readouterr().out.splitlines()  # captured: not a terminal, 100 columns
    assert printed and all(len(line) <= 100 for line in printed)
    assert not any("\u2026" in line for line in printed), "a cell was cut"
    assert printed[-1].startswith("bench: ") and "targets met" in printed[-1]


def test_bench_cli_thread_sweep_reports_speedups_beside_amax(tmp_path: Path) -> None:
    import csv

    out = {name: tmp_path / f"r.{name}" for name in ("json", "csv", "png", "md")}
    threads_before = torch.get_num_threads()
    env_before = os.environ.get(numba_runtime.THREADS_ENV)
    rc = _bench_cli(["--shapes", "2,2,300", "--variants", "greedy/logits,rejection/probs",
                     "--backend", "auto", "--backend", "torch:cpu", "--threads", "2,1",
                     "--repetitions", "1", "--json", str(out["json"]), "--csv", str(out["csv"]),
                     "--plot", str(out["png"]), "--markdown", str(out["md"])])
    assert rc == 0
    assert torch.get_num_threads() == threads_before  # the caller's pools are restored
    assert os.environ.get(numba_runtime.THREADS_ENV) == env_before
    data = json.loads(out["json"].read_text())
    assert data["meta"]["thread_counts"] == [1, 2]
    cells = {(c["backend"], c["variant"], c["threads"]): c for c in data["cells"]}
    backends = {c["backend"] for c in data["cells"]}
    assert "torch:cpu" in backends and len(cells) == len(backends) * 2 * 2
    for (backend, variant, count), c in cells.items():
        t, r = c["times_ms"], c["ratios"]
        one = cells[(backend, variant, 1)]
        assert t["amax"] > 0 and r["x_amax"] == pytest.approx(t["verify"] / t["amax"])
        assert c["threads_base"] == 1
        if count == 1:  # nothing compared at the base count itself
            assert r["thread_speedup"] is r["thread_scaling_vs_amax"] is None
            continue
        assert r["thread_speedup"] == pytest.approx(one["times_ms"]["verify"] / t["verify"])
        assert r["amax_thread_speedup"] == pytest.approx(one["times_ms"]["amax"] / t["amax"])
        assert r["thread_scaling_vs_amax"] == pytest.approx(
            r["thread_speedup"] / r["amax_thread_speedup"])
    for (backend, variant, count), c in cells.items():
        r = c["ratios"]
        torch_cell = cells[("torch:cpu", variant, count)]
        if backend == "torch:cpu":
            assert r["speedup_vs_torch_backend"] is None
        else:
            assert r["speedup_vs_torch_backend"] == pytest.approx(
                torch_cell["times_ms"]["verify"] / c["times_ms"]["verify"])
    rows = list(csv.DictReader(out["csv"].open()))
    assert sorted(r["threads"] for r in rows) == sorted(str(c["threads"]) for c in cells.values())
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = out["md"].read_text()
    assert "torch.amax x faster than at 1" in md and md.count("| cpu/") == 2 * len(cells)


def test_each_sweep_contender_runs_at_its_own_thread_count() -> None:
    """The harness sets each contender's count before each of its blocks, and the counts
    interleave within a repetition (so load bursts hit every count)."""
    seen: list[tuple[str, int, str | None]] = []

    def recorder(label: str) -> Callable[[], None]:
        return lambda: seen.append((label, torch.get_num_threads(),
                                    os.environ.get(numba_runtime.THREADS_ENV)))

    contenders = {f"x@{n}": recorder(f"x@{n}") for n in (1, 2)}
    setups = {f"x@{n}": (lambda n=n: bench_threads.apply(n)) for n in (1, 2)}
    with bench_threads.restored():
        measure(contenders, torch.device("cpu"), repetitions=4, warmup=1, min_block_s=0.0,
                setups=setups)
    assert {(label, n, env) for label, n, env in seen} == {("x@1", 1, "1"), ("x@2", 2, "2")}
    timed = [label for label, _, _ in seen[2 + 2:]]  # after each one's warm-up and calibration
    assert timed[:4] == ["x@1", "x@2", "x@2", "x@1"]  # rotated order, both in each repetition


def test_thread_counts_parse_and_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert bench_threads.parse_counts("2, 1,2") == (1, 2)
    assert bench_threads.parse_counts("4") == (4,)
    for bad in ("0", "1,x", "", "-1"):
        with pytest.raises(ValueError, match="--threads"):
            bench_threads.parse_counts(bad)
    assert _bench_cli(["--threads", "0,2"]) == 2
    assert "--threads" in capsys.readouterr().err


def test_thread_targets_apply_at_two_threads_only() -> None:
    cell = {"device": "cpu", "dtype": "float32", "B": 256, "K": 3, "V": 32000, "threads": 2,
            "threads_base": 1, "variant": "greedy/logits",
            "ratios": {"thread_scaling_vs_amax": 0.9, "speedup_vs_torch_backend": 0.8}}
    got = {t["metric"]: t["met"] for t in targets.evaluate(cell)}
    assert got == {"thread_scaling_vs_amax": True, "speedup_vs_torch_backend": False}
    cell["threads_base"] = 2  # a sweep from 2 threads says nothing about scaling from 1
    assert [t["metric"] for t in targets.evaluate(cell)] == ["speedup_vs_torch_backend"]
    cell["threads"] = 1
    assert targets.evaluate(cell) == []


def test_targets_flag_met_and_missed() -> None:
    cell = {"device": "cpu", "dtype": "float32", "B": 32, "K": 4, "V": 32000,
            "variant": "greedy/logits", "ratios": {"x_floor": 1.4}}
    assert [t["met"] for t in targets.evaluate(cell)] == [True]
    cell["ratios"]["x_floor"] = 1.6
    assert [t["met"] for t in targets.evaluate(cell)] == [False]
    cell["device"] = "cuda"  # the performance targets are CPU targets
    assert targets.evaluate(cell) == []


def test_bench_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench_cli(["--shapes", "1,2"]) == 2
    assert "--shapes" in capsys.readouterr().err
    assert _bench_cli(["--variants", "greedy/probs"]) == 2
    assert _bench_cli(["--clock", "cpu", "--threads", "2"]) == 2
    if not torch.cuda.is_available():
        assert _bench_cli(["--device", "cuda"]) == 2
    assert "--clock" in capsys.readouterr().err


def test_info_lists_backends_with_reasons() -> None:
    proc = subprocess.run([sys.executable, "-m", "portable_verify.cli.main", "info", "--json", "-"],
                          capture_output=True, text=True, timeout=120, check=True)
    data = json.loads(proc.stdout)
    assert data["backends"]["numpy"]["available"] is True
    assert set(pv.available_backends()) == {n for n, s in data["backends"].items()
                                            if s["available"]}
    assert all(s["reason"] for s in data["backends"].values())
    assert data["devices"][0]["device"] == "cpu"
    assert data["versions"]["torch"] == torch.__version__
    assert data["numba"]["kernel_cache"]["state"] in ("warm", "partial", "cold", "unavailable")
    if data["backends"]["numba:cpu"]["available"]:
        assert data["numba"]["threading"]["layer"] in ("tbb", "omp", "workqueue")


_CACHE_PROBE = """
import json, numpy as np
from portable_verify.bench import numba_runtime
from portable_verify.backends.numba import chain as numba_kernels
from portable_verify.backends.numba import rows as numba_math
from portable_verify.backends.numba.readiness import cached_dispatchers
before = numba_runtime.kernel_cache()
compiled = sum(len(d.overloads) for m in (numba_kernels, numba_math)
               for d in cached_dispatchers(m).values())
numba_math.row_max(np.zeros(3, np.float32))  # compiles (and caches) one kernel
print(json.dumps({"before": before, "compiled": compiled, "after": numba_runtime.kernel_cache()}))
"""


def test_info_tells_a_cold_kernel_cache_from_a_cached_kernel(tmp_path: Path) -> None:
    """An empty cache folder reads cold without compiling anything; one compiled kernel then
    reads as cached (partial), so the check cannot pass by always saying one thing."""
    pytest.importorskip("numba")
    proc = subprocess.run([sys.executable, "-c", _CACHE_PROBE], capture_output=True, text=True,
                          timeout=300, check=True,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["compiled"] == 0  # reading the cache compiled nothing
    before, after = data["before"], data["after"]
    assert before["state"] == "cold" and set(before["kernels"].values()) == {0}
    assert before["cache_dirs"] and before["cache_dirs"][0].startswith(str(tmp_path))
    assert after["state"] == "partial" and after["kernels"]["numba.rows.row_max"] == 1


def test_two_level_draw_matches_the_plain_scan() -> None:
    """The blocked inverse-CDF draw (V > 4 blocks, with a ragged tail block) picks what the
    full cumulative sum picks, up to float rounding at boundaries, and never a zero weight."""
    g = torch.Generator().manual_seed(2)
    v_size = 4 * torch_draw.DRAW_BLOCK + 77
    w = torch.softmax(torch.randn(4000, v_size, generator=g) * 3, -1)
    w[w < w.median()] = 0.0  # half the tokens impossible
    w[:50, : v_size - 2] = 0.0  # mass only in the tail block
    w[:50, -1] += 0.1
    w[50:100, 3:] = 0.0  # mass only in the first block
    w[50:100, 0] += 0.1
    v = (torch.randint(0, 2**24, (4000,), generator=g) + 1).float() * 2**-24
    v[:20] = 1.0
    picked, total = torch_draw.draw(w.clone(), v)
    plain = torch_draw.inverse_cdf_draw(w, v)
    alive = total > 0
    assert alive[:100].all() and alive.sum() > 3900
    assert (w.gather(1, picked.unsqueeze(1)).squeeze(1)[alive] > 0).all()
    assert (picked != plain)[alive].float().mean() < 2e-3
    shifted = picked.clamp(max=v_size - 2) + 1  # negative control: a pick one token off fails
    assert (shifted != plain)[alive].float().mean() > 0.5
    assert torch.equal(picked[:20][alive[:20]], plain[:20][alive[:20]])  # v = 1: last positive


def test_gpu_check_refuses_without_a_gpu_and_rehearses_on_cpu(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    from portable_verify.bench.gpu_check import SECTION_SHARES
    from portable_verify.cli.main import main

    if not torch.cuda.is_available():
        assert main(["gpu-check", "--out", str(tmp_path / "refused")]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    rc = main(["gpu-check", "--dry-run", "--out", str(tmp_path), "--tests", "tests",
               "--budget", "900", "--json", str(tmp_path / "copy.json")])
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = data["sections"]
    assert list(sections) == [name for name, _ in SECTION_SHARES]  # the order
    for name in ("environment", "targets", "kit_quick", "device_tests"):
        assert sections[name]["ok"], (name, sections[name])
    env = sections["environment"]["result"]
    assert env["chains"]["small_v_all_exact"] and env["trees"]["small_v_all_exact"]
    assert sections["kit_quick"]["result"]["checks"]["PASS"] >= 2  # both backends, one check
    assert [r["returncode"] for r in sections["device_tests"]["result"]["runs"].values()] == [0]
    launches = sections["targets"]["result"]["launches"]["cells"]
    assert {c["door"] for c in launches} == {"padded", "ragged", "rows", "vllm_v1", "vllm_v2"}
    assert not [c for c in launches if "error" in c]  # every door ran on the interpreter
    assert rc == 0 and all(data["summary"].values()), data["summary"]  # capture included
    assert json.loads((tmp_path / "copy.json").read_text())["verdict"] == data["verdict"]
    out = capsys.readouterr().out.splitlines()  # the one-line verdict ends standard output
    assert out[-1].startswith(f"gpu-check: {len(sections)} of {len(sections)} sections ok"), out


def test_gpu_check_fails_a_section_whose_subprocess_fails_or_is_cut(tmp_path: Path) -> None:
    """Negative controls: a subprocess that exits non-zero, or runs past the section's time,
    fails its section (the first GPU run printed "7 of 8 sections ok" over a pytest exit
    status of 1); only the full kit, which takes what time is left, may be cut and pass."""
    from portable_verify.bench import gpu_check

    check = gpu_check.GpuCheck(out=tmp_path, budget_s=60, dry_run=True)

    def section(cmd: str, share: float = 1.0, cut_fails: bool = True) -> dict:
        return check.section("device_tests", share, lambda: gpu_check._subprocesses(
            check, {"a": [sys.executable, "-c", "pass"], "b": [sys.executable, "-c", cmd]},
            cut_fails=cut_fails), lambda _: None)

    failed = section("raise SystemExit(1)")
    assert failed["ok"] is False and failed["result"]["failures"] == ["b exited 1"]
    assert section("pass")["ok"] is True
    cut = section("import time; time.sleep(60)", share=12 / 60)
    assert cut["ok"] is False and cut["result"]["failures"] == ["b cut after 12 s"]
    assert section("import time; time.sleep(60)", share=12 / 60, cut_fails=False)["ok"] is True


def _synthetic_cells() -> list[dict]:
    """Cells with the widest values a run prints (long names, big shapes, slow times)."""
    cells = []
    for b, k, v in ((1, 2, 64), (64, 5, 128256)):
        for method, inputs in (("greedy", "logits"), ("rejection", "probs"),
                               ("typical", "logits"), ("block", "probs")):
            cell = {"device": "cpu", "backend": "triton:interpreter", "dtype": "bfloat16",
                    "threads": 1, "B": b, "K": k, "V": v, "variant": f"{method}/{inputs}",
                    "method": method, "inputs": inputs,
                    "times_ms": {"verify": 12345.678, "dense": 99999.99, "floor": 0.001,
                                 "argmax": 1.0, "hf": None, "vllm_v0_typical": 1.0,
                                 "verify_validated": 2.0, "verify_validated_full": None,
                                 "rejection_same_inputs": 3.0},
                    "ratios": {"speedup_vs_dense": 1234.5, "x_floor": 12345678.9,
                               "x_argmax": 1.0, "speedup_vs_hf": None,
                               "speedup_vs_vllm_typical": 1.0, "validation_overhead": 1.1,
                               "validation_full_overhead": None, "x_rejection": 1.2},
                    "acceptance_per_position": [0.5] * k}
            cell["targets"] = [{"target": "t", "met": False, "value": 2.0, "op": "<=",
                                "threshold": 1.0}] * 3
            cells.append(cell)
    return cells


def _meta() -> dict:
    return {"machine": {"cpu": "Some Very Long CPU Model Name @ 3.00GHz"}, "threads": 1,
            "thread_counts": [1], "repetitions": 5, "clock": "wall"}


def _rendered(table: object, width: int) -> list[str]:
    import io

    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    return console.file.getvalue().splitlines()


def _compact_text(cells: list[dict], meta: dict, shows: tuple[str, ...] = ()) -> str:
    """The default table rendered at 100 columns, checked to fit without cutting a cell and
    to show each of ``shows``."""
    from portable_verify.bench import output

    (table,) = output.compact_tables(cells, meta)
    lines = _rendered(table, 100)
    assert all(len(line) <= 100 for line in lines)
    assert not any("\u2026" in line for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert [s for s in shows if s not in text] == []
    return text


def test_default_table_fits_100_columns_without_cutting_a_cell() -> None:
    from portable_verify.bench import output

    cells, meta = _synthetic_cells(), _meta()
    _compact_text(cells, meta, ("rejection", "probs", "logits", "64,5,128256", "12345.678",
                                "12345678.90", "1234.5", "MISSED 3 of 3"))
    # The negative control: the wide table at the same width must be cut, or the check above
    # could not see a cut.
    wide = _rendered(output.render_table(cells, meta), 100)
    assert any("\u2026" in line for line in wide)


def test_wide_table_keeps_every_column() -> None:
    from rich.console import Console

    from portable_verify.bench import output

    cells, meta = _synthetic_cells(), _meta()
    table = output.render_table(cells, meta)
    width = Console(width=1000).measure(table).maximum  # what `bench --wide` renders at
    text = "\n".join(_rendered(table, width))
    assert "\u2026" not in text
    for column in ("device/backend", "dtype", "ours", "dense", "floor", "vs dense", "x floor",
                   "x argmax", "vs vLLM typ", "valid.", "x rej.", "accept/pos", "targets"):
        assert column in text, column


def test_target_lines_group_a_target_over_its_shapes() -> None:
    from portable_verify.bench import output

    def cell(b: int, value: float, met: bool) -> dict:
        return {"backend": "numba:cpu", "B": b, "targets": [
            {"target": "typical/logits every shape: >= 2 x faster", "op": ">=",
             "threshold": 2.0, "value": value, "met": met}]}

    groups = output.target_groups([cell(1, 5.0, True), cell(8, 3.0, True)])
    assert [(g["met"], g["worst"]) for g in groups] == [(True, 3.0)]
    (line,) = output.target_lines(groups)
    assert line.startswith("met") and line.endswith("3.00 (worst, 2 shapes)")
    groups = output.target_groups([cell(1, 5.0, True), cell(8, 1.5, False)])  # one shape missed
    assert [(g["met"], g["worst"]) for g in groups] == [(False, 1.5)]
    assert output.target_lines(groups)[0].startswith("MISSED")
    other = dict(cell(1, 5.0, True), backend="torch:cpu")  # two backends: each line names its
    lines = output.target_lines(output.target_groups([cell(1, 5.0, True), other]))
    assert [line.split()[1] for line in lines] == ["numba:cpu:", "torch:cpu:"]
    meta = {"thread_counts": [1]}
    assert output.verdict_text(groups, [cell(1, 5.0, True)], meta) == (
        "0 of 1 targets met (numba:cpu, 1 thread)")


def _peer_config() -> object:
    from portable_verify.bench.cases import VARIANTS
    from portable_verify.bench.run import BenchConfig

    return BenchConfig(shapes=((1, 2, 64),), devices=[torch.device("cpu")],
                       backends=["torch:cpu"], variants=tuple(
                           v for v in VARIANTS if v.label in ("rejection/logits",
                                                              "typical/logits")),
                       repetitions=1, min_block_s=0.0)


def test_a_peer_that_raises_is_recorded_in_its_cell_and_the_run_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_verify.bench import peers
    from portable_verify.bench.run import run

    def raising_call(inputs: object, variant: Any) -> Callable[[], object] | None:
        if variant.method != "rejection":
            return None

        def call() -> object:
            raise TypeError("peer exploded on its first call")
        return call

    def raising_build(inputs: object, variant: Any, *args: object) -> Callable[[], object] | None:
        if variant.method != "typical":
            return None
        raise RuntimeError("peer could not even be built")

    monkeypatch.setattr(peers, "hf_status", lambda: peers.PeerStatus("hf", True, "fake"))
    monkeypatch.setattr(peers, "hf_callable", raising_call)
    monkeypatch.setattr(peers, "vllm_v0_typical_callable", raising_build)
    config = _peer_config()
    rejection_variant = config.variants[0]
    cells = {c["variant"]: c for _, new in run(config) for c in new}
    assert set(cells) == {"rejection/logits", "typical/logits"}  # the run went on
    rejection, typical = cells["rejection/logits"], cells["typical/logits"]
    assert rejection["peer_errors"] == {"hf": "TypeError: peer exploded on its first call"}
    assert typical["peer_errors"] == {
        "vllm_v0_typical": "RuntimeError: peer could not even be built"}
    assert rejection["times_ms"]["hf"] is None and typical["times_ms"]["vllm_v0_typical"] is None
    assert all(c["times_ms"]["verify"] > 0 and c["times_ms"]["dense"] > 0 for c in cells.values())
    assert not any("graph" in c["times_ms"] for c in cells.values())  # CUDA runs only
    # Negative control: the same peer handed to the harness unguarded stops the measurement.
    with pytest.raises(TypeError, match="exploded"):
        measure({"hf": raising_call(None, rejection_variant)}, torch.device("cpu"),
                repetitions=1, min_block_s=0.0)


def test_the_transformers_adapter_follows_the_signature_of_each_release(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from transformers.generation import utils as hf_utils

    from portable_verify.bench import peers
    from portable_verify.bench.cases import VARIANTS, make_inputs

    real = hf_utils._speculative_sampling
    variant = next(v for v in VARIANTS if v.label == "rejection/logits")
    inputs = make_inputs((1, 3, 50), variant, torch.float32, torch.device("cpu"))
    seen: list[dict] = []

    def v5_17(candidate_input_ids, candidate_logits, candidate_length, new_logits,
              is_done_candidate):
        seen.append({"is_done_candidate": is_done_candidate})
        return real(candidate_input_ids, candidate_logits, candidate_length, new_logits)

    def v4_3x(candidate_input_ids, candidate_logits, candidate_length, new_logits,
              last_assistant_token_is_eos, max_matches):
        seen.append({"eos": last_assistant_token_is_eos, "max_matches": max_matches})
        return real(candidate_input_ids, candidate_logits, candidate_length, new_logits)

    def unknown(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                frobnicate):
        return real(candidate_input_ids, candidate_logits, candidate_length, new_logits)

    for fake in (v5_17, v4_3x):
        monkeypatch.setattr(hf_utils, "_speculative_sampling", fake)
        call, why = peers.guarded(lambda: peers.hf_callable(inputs, variant))
        assert why is None and call is not None
        tokens, n_matches = call()
        assert 0 <= int(n_matches) <= 3 and tokens.shape[1] == int(n_matches) + 1
    assert seen[0] == {"is_done_candidate": False}
    assert seen[-1] == {"eos": False, "max_matches": 3}
    # Negative controls: an argument the adapter does not know is named in the cell's reason,
    # and the adapter as it was (four positional arguments) fails on 5.17's signature.
    monkeypatch.setattr(hf_utils, "_speculative_sampling", unknown)
    call, why = peers.guarded(lambda: peers.hf_callable(inputs, variant))
    assert call is None and "'frobnicate'" in why
    with pytest.raises(TypeError, match="is_done_candidate"):
        v5_17(inputs.drafts, torch.zeros(1, 3, 50), 3, inputs.target)


class _FakeCuda:
    """Enough of ``torch.cuda`` to run :func:`device_time_by_graph` on a CPU build: a clock
    that a replay advances by its next duration and an L2 flush by 100 ms, events that read
    the clock, and a log of what ran where."""

    def __init__(self, durations_ms: list[float]) -> None:
        self.clock, self.durations, self.log = 0.0, list(durations_ms), []
        self.capturing = False
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None

            def record(self) -> None:
                self.t = fake.clock
                fake.log.append("record")

            def elapsed_time(self, end: Event) -> float:
                return end.t - self.t

        class Graph:
            def replay(self) -> None:
                fake.clock += fake.durations.pop(0)
                fake.log.append("replay")

        class Flush:
            def zero_(self) -> None:
                fake.clock += 100.0
                fake.log.append("flush")

        class Stream:
            def wait_stream(self, other: object) -> None:
                pass

        class Capture:
            def __init__(self, graph: Graph) -> None:
                pass

            def __enter__(self) -> None:
                fake.capturing = True

            def __exit__(self, *exc: object) -> None:
                fake.capturing = False

        self.Event, self.Graph, self.Flush, self.Stream, self.Capture = (
            Event, Graph, Flush, Stream, Capture)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import contextlib

        from portable_verify.bench import harness

        cuda = torch.cuda
        monkeypatch.setattr(cuda, "device", lambda d: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "Stream", self.Stream)
        monkeypatch.setattr(cuda, "current_stream", self.Stream)
        monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "CUDAGraph", self.Graph)
        monkeypatch.setattr(cuda, "graph", self.Capture)
        monkeypatch.setattr(cuda, "Event", self.Event)
        monkeypatch.setattr(cuda, "synchronize", lambda *a: self.log.append("sync"))
        monkeypatch.setattr(harness, "_l2_flush_buffer", lambda d: self.Flush())

    def call(self) -> None:
        self.log.append("capture" if self.capturing else "eager")


def test_device_time_by_graph_times_each_replay_alone_after_a_flush(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_verify.bench.harness import device_time_by_graph

    fake = _FakeCuda([7.0, 1.0, 3.0, 2.0])  # the first replay is untimed (graph upload)
    fake.install(monkeypatch)
    timing = device_time_by_graph(fake.call, torch.device("cuda"), reps=3)
    assert fake.log == ["eager", "eager", "capture", "replay",
                        *["flush", "record", "replay", "record"] * 3, "sync"]
    # The flushes (100 ms each) stay outside the events: the replays' own times, in seconds.
    assert (timing.median_s, timing.min_s, timing.max_s) == (0.002, 0.001, 0.003)
    assert timing.reps == 3 and timing.l2_flushed
    fake = _FakeCuda([7.0, 1.0, 3.0, 2.0])
    fake.install(monkeypatch)
    timing = device_time_by_graph(fake.call, torch.device("cuda"), reps=3, flush_l2=False)
    assert "flush" not in fake.log and timing.median_s == 0.002 and not timing.l2_flushed
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        device_time_by_graph(fake.call, torch.device("cpu"))


def test_cuda_cells_take_the_floor_from_the_copy_bandwidth_and_add_graph_time() -> None:
    """``_cells`` on a CUDA measurement: the floor is bytes over bandwidth (no floor timed),
    the graph time sits beside the eager one, an uncapturable backend says why."""
    from portable_verify.bench.cases import VARIANTS
    from portable_verify.bench.harness import DeviceTiming, Timing
    from portable_verify.bench.run import Measurement, _cells

    variant = next(v for v in VARIANTS if v.label == "rejection/logits")
    m = Measurement(torch.device("cuda"), "float32", (64, 4, 128256), variant)

    def timing(ms: float) -> Timing:
        return Timing(ms / 1e3, ms / 1e3, ms / 1e3, ms / 1e3, 5, 1)

    timings = {f"{name}@1": timing(ms) for name, ms in (
        ("verify:triton:cuda", 3.0), ("verify:torch:cuda", 6.0), ("dense", 2.0),
        ("argmax", 0.05), ("amax", 0.05))}
    info = {"floor_impl": "copy bandwidth 4000 GB/s", "floor_bytes": 4 * 10**6,
            "floor_ms": 0.001, "acceptance": None, "peer_errors": {},
            "graph": {"triton:cuda": DeviceTiming(0.0004, 0.0003, 0.0005, 50, True),
                      "torch:cuda": "RuntimeError: operation not permitted when capturing"}}
    cells = {c["backend"]: c for c in _cells(m, ["triton:cuda", "torch:cuda"], timings, info,
                                             "wall", (1,))}
    ours, theirs = cells["triton:cuda"], cells["torch:cuda"]
    assert ours["times_ms"]["floor"] == 0.001 and ours["floor_GBps"] == pytest.approx(4000)
    assert ours["ratios"]["x_floor"] == pytest.approx(3000)  # eager over the floor
    assert ours["times_ms"]["graph"] == pytest.approx(0.4)
    assert ours["ratios"]["graph_x_floor"] == pytest.approx(400)
    assert ours["graph_spread_ms"]["reps"] == 50 and ours["graph_error"] is None
    assert theirs["times_ms"]["graph"] is None and "capturing" in theirs["graph_error"]
    assert ours["targets"] == []  # the performance targets are CPU targets


def _gpu_cells() -> list[dict]:
    cells = []
    for c in _synthetic_cells():
        c = {**c, "device": "cuda", "backend": "triton:cuda", "times_ms": dict(c["times_ms"]),
             "ratios": dict(c["ratios"])}
        c["times_ms"]["graph"] = 12345.678
        c["ratios"]["graph_x_floor"] = 12345678.9
        cells.append(c)
    return cells


def _gpu_meta() -> dict:
    return {**_meta(), "device_names": [{"device": "cuda:0", "name": "NVIDIA H200"}],
            "copy_bandwidth_GBps": {"cuda": 4123.4}, "graph_reps": 50}


def test_cuda_table_puts_eager_and_graph_times_side_by_side_in_100_columns() -> None:
    from portable_verify.bench import output

    cells, meta = _gpu_cells(), _gpu_meta()
    _compact_text(cells, meta, ("eager ms", "graph ms", "x floor", "12345.678", "12345678.90",
                                "NVIDIA H200", "4123 GB/s", "median of 50"))
    # Negative control: a CPU run's table (no graph time) has neither column.
    cpu_text = _compact_text(_synthetic_cells(), _meta())
    assert "graph ms" not in cpu_text and "ms/call" in cpu_text
    def wide_header(cells: list[dict], meta: dict) -> list[str]:
        header = next(line for line in _rendered(output.render_table(cells, meta), 1000)
                      if "device/backend" in line)
        return [col.strip() for col in header.strip("┃ ").split("┃")]

    assert "graph" in wide_header(cells, meta)  # --wide: beside "ours", dropped on a CPU run
    assert "graph" not in wide_header(_synthetic_cells(), _meta())
    groups = output.target_groups(cells)
    assert output.verdict_text([], cells, meta) == (
        f"{len(cells)} cells timed, no target applies (triton:cuda on NVIDIA H200)")
    assert groups  # the synthetic cells carry targets: a CPU-style verdict still counts them


def _vllm_step(seed: int, b: int, k: int, v: int, temperature: list[float] | None,
               with_q: bool = False, no_proposal: float = 0.1) -> tuple[tuple, Any]:
    """A ragged vLLM step: counts 0..k, drafts often the argmax, a ``no_proposal`` share of
    them ``-1``."""
    import types

    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, k + 1, (b,), generator=g).tolist()
    n = sum(counts)
    logits = torch.randn(n, v, generator=g) * 2
    drafts = torch.where(torch.rand(n, generator=g) < 0.6, logits.argmax(-1),
                         torch.randint(0, v, (n,), generator=g))
    drafts[torch.rand(n, generator=g) < no_proposal] = -1
    q = torch.softmax(torch.randn(n, v, generator=g), -1) if with_q else None
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    bonus = torch.randint(0, v, (b, 1), generator=g)
    greedy = temperature is None
    md = types.SimpleNamespace(
        temperature=None if greedy else torch.tensor(temperature), all_greedy=greedy,
        all_random=not greedy and 0.0 not in temperature, generators={}, top_k=None,
        top_p=None)
    return (drafts.to(torch.int32), counts, k, cu, q, logits, bonus), md


def test_rebuilt_vllm_sampler_greedy_rows_follow_the_argmax_rule() -> None:
    from portable_verify.bench.vllm_rebuilt import vllm_v1_rejection_sample
    from portable_verify.integrations.vllm_v1.sampler import verify_spec_decode_step

    b = 40
    for temperature in (None, [0.0 if i % 2 else 0.9 for i in range(b)]):
        args, md = _vllm_step(1, b, 4, 300, temperature)
        got = vllm_v1_rejection_sample(*args, md)
        want = verify_spec_decode_step(*args, md, backend="numpy")
        greedy = (torch.ones(b, dtype=torch.bool) if temperature is None
                  else torch.tensor(temperature) == 0)
        assert got.dtype == torch.int32 and got.shape == (b, 5)
        assert torch.equal(got[greedy], want[greedy])
        emitted = (got[greedy] != -1).sum(1)
        counts = torch.tensor(args[1])[greedy]
        assert (emitted == counts + 1).any() and (emitted < counts + 1).any()  # both paths


def test_rebuilt_vllm_sampler_draws_vllms_own_tokens() -> None:
    """Same generator state, same arguments: vLLM's tokens, in every mode (vLLM-CPU's kernel
    stand-ins); the negative control, another generator state, changes the sampled rows."""
    from portable_verify.integrations.vllm_v1 import engine

    missing = engine.vllm_missing_reason()
    if missing:
        pytest.skip(missing)
    import vllm.v1.sample.rejection_sampler as module
    from test_vllm_v1_sampler import _llvmlite_out_of_sight
    from vllm.platforms import current_platform

    from portable_verify.bench.vllm_rebuilt import vllm_v1_rejection_sample as rebuilt

    with _llvmlite_out_of_sight():
        current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does
    vllm = getattr(module.rejection_sample, "vllm_original", module.rejection_sample)
    b = 24
    mixed = [0.0 if i % 3 == 0 else 0.7 for i in range(b)]
    for seed, temperature, with_q in ((1, None, False), (2, [0.7] * b, False),
                                      (3, [0.7] * b, True), (4, mixed, True), (5, mixed, False)):
        # vLLM-CPU's C++ stand-in for the random kernel can accept a -1 draft when draft
        # probabilities are given (vLLM's Triton kernel, the one rebuilt, rejects it): no -1
        # drafts there.
        args, md = _vllm_step(seed, b, 3, 500, temperature, with_q, 0.0 if with_q else 0.1)
        md.generators = {5: torch.Generator().manual_seed(11)} if temperature else {}
        torch.manual_seed(seed)
        want = vllm(*args, md)
        torch.manual_seed(seed)
        md.generators = {5: torch.Generator().manual_seed(11)} if temperature else {}
        assert torch.equal(rebuilt(*args, md), want), (seed, temperature, with_q)
        if temperature is not None:
            torch.manual_seed(seed + 100)
            md.generators = {5: torch.Generator().manual_seed(11)}
            assert not torch.equal(rebuilt(*args, md), want)


def test_rebuilt_vllm_sampler_emits_the_target_distribution(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One draft per request, drawn from q; the first emitted token must follow p exactly
    (rejection sampling's guarantee), with q given and without (a one-hot draft). Negative
    control: a residual that ignores q (the draft masked instead) is caught."""
    import types

    import numpy as np

    from portable_verify.bench import vllm_rebuilt

    n, v = 20000, 5
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.3, 0.3, 0.1, 0.2], dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    drafts = torch.multinomial(q.float(), n, replacement=True, generator=g)
    md = types.SimpleNamespace(temperature=torch.ones(n), all_greedy=False, all_random=True,
                               generators={})

    def first_tokens(draft_probs: torch.Tensor | None) -> torch.Tensor:
        torch.manual_seed(0)
        out = vllm_rebuilt.vllm_v1_rejection_sample(
            drafts.to(torch.int32), [1] * n, 1, torch.arange(1, n + 1, dtype=torch.int32),
            draft_probs, p.float().log().expand(n, v).contiguous(),
            torch.zeros(n, 1, dtype=torch.int64), md)
        return out[:, 0].long()

    q_rows = q.float().expand(n, v).contiguous()
    assert _fit(first_tokens(q_rows), p).passed
    assert _fit(first_tokens(None), p).passed
    # The wrong residual's law: accept min(1, p/q), else draw from p without the draft.
    pn, qn = p.numpy(), q.numpy()
    keep = np.minimum(1.0, pn / qn)
    wrong = np.array([qn[y] * keep[y] + sum(qn[x] * (1 - keep[x]) * pn[y] / (1 - pn[x])
                                            for x in range(v) if x != y) for y in range(v)])
    assert _power(p, torch.from_numpy(wrong), n) > 0.99
    real = vllm_rebuilt._recovered
    monkeypatch.setattr(vllm_rebuilt, "_recovered",
                        lambda probs, dq, *rest: real(probs, None, *rest))
    assert not _fit(first_tokens(q_rows), p).passed


def test_seam_step_inputs_land_on_the_requested_device_and_both_contenders_run() -> None:
    from portable_verify.bench import vllm_seam

    def devices(args: tuple, md: Any) -> set[str]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if md.temperature is not None:
            tensors.append(md.temperature)
        return {t.device.type for t in tensors}

    for mode in (*vllm_seam.MODES, "mixed"):
        assert devices(*vllm_seam.step_inputs(2, 2, 50, mode, device="meta")) == {"meta"}
        args, md = vllm_seam.step_inputs(4, 2, 50, mode)
        assert devices(args, md) == {"cpu"}  # the control: the default stays on the CPU
        calls = vllm_seam.seam_contenders(args, md, backend="numpy")
        out = {name: call() for name, call in calls.items()}
        assert out["plugin"].shape == out["vllm_rebuilt"].shape == (4, 3)
        greedy = (torch.ones(4, dtype=torch.bool) if md.temperature is None
                  else md.temperature == 0)
        assert torch.equal(out["plugin"][greedy], out["vllm_rebuilt"][greedy])
    with pytest.raises(ValueError, match="mode must be one of"):
        vllm_seam.step_inputs(1, 1, 10, "everything")
