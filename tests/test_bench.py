"""The benchmark: the dense baseline is a correct verifier, and the CLI reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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
    from portable_verify.cli.main import main

    if not torch.cuda.is_available():
        assert main(["gpu-check", "--out", str(tmp_path / "refused")]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    rc = main(["gpu-check", "--dry-run", "--out", str(tmp_path), "--tests",
               str(tmp_path / "no-tests"), "--json", str(tmp_path / "copy.json")])
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 0 and all(data["summary"].values()), data["summary"]
    assert data["verdict"]["small_v_exact"] is True
    assert data["verdict"]["bench_cells"] > 0  # the bench grid itself ran on the device
    assert data["verdict"]["tree_small_v_exact"] is True  # the Triton tree kernel, interpreted
    assert data["verdict"]["tree_speed_cells"] > 0
    assert json.loads((tmp_path / "copy.json").read_text())["verdict"] == data["verdict"]
    out = capsys.readouterr().out.splitlines()  # the one-line verdict ends standard output
    assert out[-1].startswith(f"gpu-check: {len(data['summary'])} of {len(data['summary'])} "
                              "sections ok"), out


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


def test_default_table_fits_100_columns_without_cutting_a_cell() -> None:
    from portable_verify.bench import output

    cells, meta = _synthetic_cells(), _meta()
    (table,) = output.compact_tables(cells, meta)
    lines = _rendered(table, 100)
    assert all(len(line) <= 100 for line in lines)
    assert not any("\u2026" in line for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    for expected in ("rejection", "probs", "logits", "64,5,128256", "12345.678",
                     "12345678.90", "1234.5", "MISSED 3 of 3"):
        assert expected in text, expected
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
