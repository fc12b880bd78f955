"""Draft modes, the budget sweep, the default command and their flags, on tiny models.

The loop runs on tiny Llama pairs built from a config (no files); the sweep's selection is
tested on hand-made figures where the budget that wins on the selection prompts differs from
the one that wins on the report prompts, so a selection that peeked at the report prompts fails.
"""

from __future__ import annotations

import argparse
import importlib.util

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_e2e_runner

from portable_verify import verify
from portable_verify.cli import main as cli
from portable_verify.e2e import config as e2e_config
from portable_verify.e2e import sweep
from portable_verify.e2e.config import E2EConfig
from portable_verify.integrations import hf

VOCAB = 64


# --- draft modes in the loop -----------------------------------------------------------------

def test_argmax_mode_proposes_the_argmax_and_passes_no_draft_probs(pair):
    """At T > 0 the argmax mode's first drafts are the greedy run's (same context), and the
    verifier gets no ``draft_probs``; the sampled mode's drafts differ and carry rows."""
    target, draft = pair
    ids = torch.randint(3, VOCAB, (4, 6), generator=torch.Generator().manual_seed(4))
    seen: dict[str, list] = {}

    def spy(name):
        def call(draft_token_ids, **kwargs):
            seen.setdefault(name, []).append((draft_token_ids, kwargs["draft_probs"]))
            return verify(draft_token_ids, **kwargs)
        return call

    hf.speculative_generate(target, draft, ids, max_new_tokens=3, k=3, verifier=spy("greedy"))
    for mode in ("argmax", "sampled"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=3, k=3, method="rejection",
                                temperature=1.5, seed=2, draft_mode=mode, verifier=spy(mode))
    greedy_drafts = seen["greedy"][0][0]
    assert torch.equal(seen["argmax"][0][0], greedy_drafts)
    assert all(q is None for _, q in seen["argmax"])
    assert not torch.equal(seen["sampled"][0][0], greedy_drafts), "T=1.5 draws must differ"
    assert all(q is not None and q.shape == (4, 3, VOCAB) for _, q in seen["sampled"])


@pytest.mark.parametrize("method", ["rejection", "block"])
def test_argmax_mode_is_valid_and_reproducible(pair, method):
    target, draft = pair
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=20, k=3, method=method, temperature=0.9, validate=True,
                  draft_mode="argmax")
    a = hf.speculative_generate(target, draft, ids, seed=11, **kwargs)
    b = hf.speculative_generate(target, draft, ids, seed=11, **kwargs)
    c = hf.speculative_generate(target, draft, ids, seed=12, **kwargs)
    assert a.new_tokens == b.new_tokens and a.new_tokens != c.new_tokens
    assert all(len(row) == 20 and all(0 <= t < VOCAB for t in row) for row in a.new_tokens)
    assert 0 < a.metrics.accepted_tokens < a.metrics.row_steps * 3


def test_draft_mode_is_checked(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="draft_mode must be one of"):
        hf.speculative_generate(target, draft, torch.tensor([[1, 2]]), max_new_tokens=2, k=1,
                                draft_mode="beam")


# --- the runner: modes side by side ----------------------------------------------------------

def _tiny(monkeypatch, pair, prompts: int = 2):
    """The e2e runner on the tiny pair: ``prompts`` one-prompt batches of growing length."""
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randint(3, VOCAB, (1, 4 + i), generator=g),
                torch.ones(1, 4 + i, dtype=torch.int64)) for i in range(prompts)]
    return tiny_e2e_runner(monkeypatch, pair, batches)

def test_draft_modes_run_side_by_side(monkeypatch, pair):
    """``--method block --draft-mode sampled,argmax``: four chains per k, block vs rejection
    within each mode (same steps) and sampled vs argmax per rule (per trial)."""
    runner = _tiny(monkeypatch, pair)
    cfg = E2EConfig(method="block", temperature=1.0, ks=(2,), max_new_tokens=10, num_prompts=2,
                    rounds=2, draft_modes=("sampled", "argmax"))
    data = runner.run_e2e(cfg)
    assert [r["name"] for r in data["results"]] == [
        "target-only", "spec k=2 block sampled", "spec k=2 rejection sampled",
        "spec k=2 block argmax", "spec k=2 rejection argmax"]
    assert [c["draft_mode"] for c in data["block_comparison"]] == ["sampled", "argmax"]
    modes = data["draft_mode_comparison"]
    assert [c["method"] for c in modes] == ["block", "rejection"]
    for c in modes:
        d = c["accepted_per_forward_difference"]
        assert c["trials"] == 4 and d["n"] == 4 and d["low"] <= d["mean"] <= d["high"]


def test_side_by_side_runs_alternate_abab():
    """Every two runs of a group swap order from one trial to the next, whatever the slots."""
    from portable_verify.e2e.runner import _alternate, contenders

    runs = contenders(E2EConfig(method="block", ks=(2, 3), draft_modes=("sampled", "argmax")))
    order = runs[3:] + runs[:3]  # a rotation that splits the k=2 group
    for flip in (False, True):
        out = _alternate(order, runs, flip)
        assert sorted(map(id, out)) == sorted(map(id, runs))
        for k in (2, 3):
            group = [r for r in out if r.k == k]
            listed = [r for r in runs if r.k == k]
            assert group == (listed[::-1] if flip else listed)


# --- the sweep: held-out selection -----------------------------------------------------------

def _fake_result(name: str, k: int, method: str, tps: list[float],
                 base: list[float] | None = None) -> dict:
    base = base or tps
    return {"name": name, "k": k, "method": method, "verifier": "verify" if k else "-",
            "draft_mode": "sampled", "tree": None, "scored_nodes": k + 1,
            "tokens_per_s": sum(tps) / len(tps), "tokens_per_target_forward": 1.0 + k / 2,
            "draft_time_s": 1.0, "decode_time_s": 4.0,
            "per_trial": {"tokens_per_s": tps, "accepted_per_forward": [k / 2] * len(tps),
                          "speedup": [a / b for a, b in zip(tps, base, strict=True)]}}


def test_sweep_picks_on_selection_prompts_and_reports_on_the_others():
    """Four prompt batches, two rounds (trials ordered round by round). k=2 wins on batches
    1-2 (the selection half), k=4 on batches 3-4: the report must name k=2 and give k=2's
    figures on trials of batches 3-4 only. A selection on all trials would pick k=4."""
    base = [10.0] * 8
    k2 = [20, 20, 11, 11, 20, 20, 11, 11]
    k4 = [15, 15, 30, 30, 15, 15, 30, 30]
    blk = [12, 12, 12, 12, 12, 12, 12, 12]
    data = {"config": {"draft_modes": ["sampled"]}, "trial_batches": [0, 1, 2, 3] * 2,
            "results": [_fake_result("target-only", 0, "", base),
                        _fake_result("spec k=2", 2, "rejection", k2, base),
                        _fake_result("spec k=4", 4, "rejection", k4, base),
                        _fake_result("spec k=2 block", 2, "block", blk, base)]}
    data["results"][3]["method"] = "block"
    report = sweep.sweep_report(data, sweep.selection_batches(4))
    assert report["selection_batches"] == [0, 1] and report["report_batches"] == [2, 3]
    assert report["selection_trials"] == report["report_trials"] == 4
    methods = {m["method"]: m for m in report["methods"]}
    rej, blk_row = methods["chain rejection"], methods["chain block"]
    assert rej["best"] == "spec k=2" and report["best_chain"] == "spec k=2"
    assert rej["tokens_per_s"] == pytest.approx(11.0)  # k=2 on the report trials only
    assert rej["vs_target_only"]["mean"] == pytest.approx(1.1)
    assert rej["vs_best_chain"] is None  # the best chain itself
    assert blk_row["vs_best_chain"]["mean"] == pytest.approx(12 / 11)
    assert rej["draft_share_all_trials"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="2 prompt batches"):
        sweep.selection_batches(1)


def test_sweep_runs_end_to_end_with_flatness_and_plot(monkeypatch, pair, tmp_path):
    runner = _tiny(monkeypatch, pair, prompts=2)
    cfg = E2EConfig(method="greedy", ks=(1, 3), max_new_tokens=8, num_prompts=2, rounds=1,
                    sweep=True)
    data = runner.run_e2e(cfg)
    assert [c["positions"] for c in data["flatness"]] == [1, 2, 3, 4]
    assert data["flatness"][0]["relative"] == pytest.approx(1.0)
    sw = data["sweep"]
    assert [c["name"] for c in sw["configs"]] == ["spec k=1", "spec k=3"]
    (m,) = sw["methods"]
    assert m["method"] == "chain greedy" and sw["report_trials"] == 1
    if importlib.util.find_spec("matplotlib") is not None:
        sweep.plot(tmp_path / "s.png", data)
        assert (tmp_path / "s.png").stat().st_size > 1000


def _rendered(data: dict, width: int) -> list[str]:
    import io

    from rich.console import Console

    from portable_verify.cli import e2e as e2e_cli

    console = Console(width=width, file=io.StringIO(), color_system=None)
    e2e_cli._render_all(data, console)
    return console.file.getvalue().splitlines()


def test_e2e_tables_fit_100_columns_without_cutting_a_cell(monkeypatch, pair):
    """The results table and the sweep's, with the longest names and acceptance lists the
    command prints (a dynamic sampled tree, k = 8), at 100 columns: no line wider, no cell cut
    (rich marks a cut with an ellipsis), every long name's words kept. Negative control: at 60
    columns the same tables must show a cut, or this check could not see one."""
    runner = _tiny(monkeypatch, pair, prompts=2)
    cfg = E2EConfig(method="greedy", ks=(1, 8), max_new_tokens=8, num_prompts=2, rounds=1,
                    sweep=True)
    data = runner.run_e2e(cfg)
    long_name = "tree 4x6:12 dynamic sampled"
    data["results"][-1]["name"] = data["sweep"]["configs"][-1]["name"] = long_name
    lines = _rendered(data, 100)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 100
    assert "\u2026" not in text
    for word in ("target-only", "reference", "dynamic", "sampled", "spec k=1"):
        assert word in text, word
    assert any("\u2026" in line for line in _rendered(data, 60))


# --- the default command ---------------------------------------------------------------------

def test_default_runtime_rule(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "openvino" else real(name, *a))
    assert e2e_config.default_runtime() == ("openvino",
                                            "installed; --runtime torch for transformers")
    assert e2e_config.default_runtime("bfloat16")[0] == "torch"
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino" else real(name, *a))
    runtime, why = e2e_config.default_runtime()
    assert runtime == "torch" and "openvino not installed" in why


def _args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["e2e", *argv])


def test_cli_states_the_runtime_first_and_marks_the_default_run():
    from portable_verify.cli import e2e

    cfg, notes = e2e.config_from_args(_args("--quick"))
    want = e2e_config.default_runtime()[0]
    assert cfg.runtime == want and notes[0].startswith(f"runtime: {want} (")
    assert e2e.is_default_run(_args("--quick"))
    cfg, notes = e2e.config_from_args(_args("--runtime", "torch", "--method", "rejection"))
    assert notes[0] == "runtime: torch (--runtime)" and cfg.temperature == 1.0
    assert not e2e.is_default_run(_args("--method", "greedy"))
    cfg, notes = e2e.config_from_args(_args("--sweep", "--method", "rejection"))
    assert cfg.ks == e2e_config.SWEEP_KS and cfg.sweep


def test_default_run_reports_greedy_and_sampled_best_chains(monkeypatch, pair):
    from portable_verify.e2e.default_run import TREES_NOT_RUN, run_default

    _tiny(monkeypatch, pair)
    cfg = E2EConfig(ks=(1, 2), max_new_tokens=8, num_prompts=2, rounds=1)
    data = run_default(cfg)
    assert data["config"]["method"] == "greedy" and data["equality_checked"]
    assert all(r["greedy_equal"] for r in data["results"][1:])
    sampled = data["sampled_run"]["config"]
    assert (sampled["method"], sampled["temperature"]) == ("rejection", 0.8)
    assert [h["run"] for h in data["headline"]] == ["greedy", "T=0.8"]
    for h in data["headline"]:
        assert h["best"] in ("spec k=1", "spec k=2") and h["per_trial"]["n"] == 2
    assert data["trees"] == TREES_NOT_RUN and data["tree_headline"] == [None, None]


def test_default_run_reports_the_best_tree_against_the_best_chain(monkeypatch, pair):
    from portable_verify.e2e.default_run import run_default

    _tiny(monkeypatch, pair)
    cfg = E2EConfig(ks=(1, 2), trees=("2x2",), max_new_tokens=8, num_prompts=2, rounds=1)
    data = run_default(cfg)
    assert data["trees"] is None
    for half, t in zip(("greedy", "T=0.8"), data["tree_headline"], strict=True):
        assert t["run"] == half and t["tree"] == "tree 2x2" and t["chain"].startswith("spec k=")
        assert t["tokens_per_s_ratio"]["n"] == 2 and t["tree_ceiling"] == 3
        chain = next(r for r in (data if half == "greedy" else data["sampled_run"])["results"]
                     if r["name"] == t["chain"])
        assert t["chain_speedup"] == chain["speedup_vs_target_only"]


BAD = [
    (["--draft-mode", "beam", "--method", "rejection"], "--draft-mode"),
    (["--draft-mode", "argmax"], "--draft-mode"),
    (["--draft-mode", "argmax", "--method", "greedy"], "--draft-mode"),
    (["--draft-mode", "argmax", "--method", "rejection", "--temperature", "0"], "--draft-mode"),
    (["--draft-mode", "sampled,sampled", "--method", "block"], "--draft-mode"),
    (["--sweep", "--prompts", "1"], "--sweep"),
    (["--plot", "p.png"], "--plot"),
    (["--sweep", "--plot", "missing/p.png"], "--plot"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_new_flags_exit_2_naming_the_flag(argv, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(["e2e", *argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"portable-verify e2e: error: {flag}"), err
    assert list(tmp_path.iterdir()) == []


def test_plot_without_matplotlib_exits_2(capsys, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        cli.main(["e2e", "--sweep", "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--plot: needs matplotlib" in err, err


def test_good_new_flags_pass_the_checks(tmp_path, monkeypatch):
    """The negative control: the checks refuse only what is wrong."""
    monkeypatch.chdir(tmp_path)
    for argv in (["--draft-mode", "sampled,argmax", "--method", "block"],
                 ["--draft-mode", "argmax", "--method", "rejection", "--temperature", "0.8"],
                 ["--sweep", "--k", "1,2", "--plot", "p.png"]):
        args = _args(*argv)
        args.cli_check(args)
    assert list(tmp_path.iterdir()) == []
