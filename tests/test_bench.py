"""The benchmark: the dense baseline is a correct verifier, and the CLI reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

import portable_verify as pv
from portable_verify.backends import torch_eager
from portable_verify.bench import targets
from portable_verify.bench.dense import dense_verify

# Chi-square tests below use a false-alarm rate of 1e-3 per test with fixed seeds, so a
# correct sampler passes deterministically here; power is stated per test.
ALPHA = 1e-3


def _chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() / probs.double().sum() * samples.numel()
    keep = expected > 0
    if counts[~keep].sum() > 0:
        return 0.0  # a zero-probability token was emitted
    return float(stats.chisquare(counts[keep], expected[keep]).pvalue)


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
    """First emitted token ~ p_0 exactly. N = 40000 draws, V = 5: a sampler that returned the
    draft distribution instead (total variation 0.3 here) is rejected with power ~1."""
    g = torch.Generator().manual_seed(11)
    n = 40000
    p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    drafts = torch.multinomial(q, n, replacement=True, generator=g).view(n, 1)
    target = torch.stack([p, p]).expand(n, 2, 5)
    out = dense_verify(drafts, target_probs=target, draft_probs=q.expand(n, 1, 5), generator=g)
    assert _chi2_pvalue(out[:, 0], p) > ALPHA
    assert _chi2_pvalue(drafts[:, 0], p) < ALPHA  # negative control: the raw drafts fail
    # The bonus: with q == p every draft is accepted, so position 1 is a pure draw from p_1.
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    p1 = torch.softmax(logits / 0.7, -1)
    drafts = torch.multinomial(p1, n, replacement=True, generator=g).view(n, 1)
    out = dense_verify(drafts, target_logits=logits.expand(n, 2, 3), temperature=0.7,
                       draft_probs=p1.expand(n, 1, 3), generator=g)
    assert (out[:, 0] == drafts[:, 0]).all()
    assert _chi2_pvalue(out[:, 1], p1) > ALPHA


@pytest.mark.parametrize("tile", [1, 7, 1 << 16])
def test_torch_backend_row_tiles_match_reference(monkeypatch: pytest.MonkeyPatch,
                                                 tile: int) -> None:
    """The CPU cache-blocked row passes (one row per tile up to all rows at once, reusing the
    per-thread scratch buffers across calls) change only the loop structure: decisions must
    equal the reference's, including ragged rows, mixed greedy rows, one-hot and explicit
    drafts."""
    monkeypatch.setattr(torch_eager, "CPU_TILE_ELEMENTS", tile)
    monkeypatch.setattr(torch_eager, "CPU_FINAL_TILE_ELEMENTS", tile)
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


def test_bench_cli_writes_every_figure(tmp_path: Path) -> None:
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


def test_targets_flag_met_and_missed() -> None:
    cell = {"device": "cpu", "dtype": "float32", "B": 32, "K": 4, "V": 32000,
            "variant": "greedy/logits", "ratios": {"x_floor": 1.4}}
    assert [t["met"] for t in targets.evaluate(cell)] == [True]
    cell["ratios"]["x_floor"] = 1.6
    assert [t["met"] for t in targets.evaluate(cell)] == [False]
    cell["device"] = "cuda"  # the targets are CPU targets
    assert targets.evaluate(cell) == []


def test_bench_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench_cli(["--shapes", "1,2"]) == 2
    assert "--shapes" in capsys.readouterr().err
    assert _bench_cli(["--variants", "greedy/probs"]) == 2
    assert _bench_cli(["--clock", "cpu", "--threads", "2"]) == 2
    if not torch.cuda.is_available():
        assert _bench_cli(["--device", "cuda"]) == 2
    assert "--clock cpu" in capsys.readouterr().err


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


def test_two_level_draw_matches_the_plain_scan() -> None:
    """The blocked inverse-CDF draw (V > 4 blocks, with a ragged tail block) picks what the
    full cumulative sum picks, up to float rounding at boundaries, and never a zero weight."""
    g = torch.Generator().manual_seed(2)
    v_size = 4 * torch_eager.DRAW_BLOCK + 77
    w = torch.softmax(torch.randn(4000, v_size, generator=g) * 3, -1)
    w[w < w.median()] = 0.0  # half the tokens impossible
    w[:50, : v_size - 2] = 0.0  # mass only in the tail block
    w[:50, -1] += 0.1
    w[50:100, 3:] = 0.0  # mass only in the first block
    w[50:100, 0] += 0.1
    v = (torch.randint(0, 2**24, (4000,), generator=g) + 1).float() * 2**-24
    v[:20] = 1.0
    picked, total = torch_eager.draw(w.clone(), v)
    plain = torch_eager.inverse_cdf_draw(w, v)
    alive = total > 0
    assert alive[:100].all() and alive.sum() > 3900
    assert (w.gather(1, picked.unsqueeze(1)).squeeze(1)[alive] > 0).all()
    assert (picked != plain)[alive].float().mean() < 2e-3
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
    assert json.loads((tmp_path / "copy.json").read_text())["verdict"] == data["verdict"]
