"""The tree rules against the chain on identical steps (``e2e/paired.py``, ``SpineShadow``):
the spine (first-child path) extraction, the chain built from a tree step against a plain
per-row construction and direct ``verify`` calls, the report's arithmetic, the refusals, and
checks that can fail (a draft equal to its target; a mismatched draft).

Tiny Llama models as the other e2e tests use (random weights; the draft a perturbed copy).
"""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("transformers")

from helpers import perturbed, tiny_e2e_runner

from portable_verify import verify, verify_tree
from portable_verify.core import rng
from portable_verify.e2e import paired
from portable_verify.e2e.paired import (
    SpineShadow,
    pool_trials,
    spine_refusal,
    tree_spine,
    tree_vs_chain,
)
from portable_verify.e2e.tree_loop import TreeShape, tree_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 64


def _prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))


def test_tree_spine_on_hand_made_trees():
    """Row 0: the spine drafter's layout of a 2x3 tree (level by level, the spine child first
    at each level). Row 1: the same kind of tree in another valid order (a sibling listed
    before the next spine node's subtree, children of node 2 between): the first child is the
    lowest-index one. Row 2: a spine ending at depth 1 (the next level was not kept)."""
    parents = torch.tensor([
        [-1, 0, 0, 1, 1, 3, 3],
        [-1, 0, 0, 2, 1, 4, 4],
        [-1, 0, 0, 0, 0, 0, 0],
    ])
    nodes, lengths = tree_spine(parents, 3)
    assert nodes.tolist() == [[1, 3, 5], [1, 4, 5], [1, -1, -1]]
    assert lengths.tolist() == [3, 3, 1]
    nodes, lengths = tree_spine(parents, 2)  # the depth bounds the path
    assert nodes.tolist() == [[1, 3], [1, 4], [1, -1]] and lengths.tolist() == [2, 2, 1]
    assert tree_spine(parents, 0)[0].shape == (3, 0)
    # row 0's tree in other orders: the spine first (depth-first), then the siblings; and with
    # each level's two children swapped, so each sibling is its parent's first child (a leaf)
    depth_first = torch.tensor([[-1, 0, 1, 2, 0, 1, 2]])
    assert tree_spine(depth_first, 3)[0].tolist() == [[1, 2, 3]]
    swapped = torch.tensor([[-1, 0, 0, 2, 2, 4, 4]])
    nodes, lengths = tree_spine(swapped, 3)
    assert nodes.tolist() == [[1, -1, -1]] and lengths.tolist() == [1]


def test_spine_refusal_names_what_breaks_the_chain():
    assert spine_refusal("spine", 0.8, "iid") is None
    assert spine_refusal("spine", 0.8, "without_replacement") is None
    assert "drafter" in spine_refusal("dynamic", 0.8, "iid")
    assert "drafter" in spine_refusal("dynamic:3", 0.8, "iid")
    assert "children" in spine_refusal("ngram", 0.8, "deterministic")
    assert "temperature" in spine_refusal("spine", 0.0, "iid")


def _by_hand(args, kw, depth):
    """The spine's chain built per row with Python loops (the test's own construction)."""
    tokens, parents = args
    b, n = tokens.shape
    seeds = kw["seed"] if torch.is_tensor(kw["seed"]) else torch.full((b,), kw["seed"])
    u_tree = rng.uniforms_torch(seeds, torch.full((b,), kw["seed_offset"]), n)
    drafts, t_rows, q_rows, u = [], [], [], []
    for i in range(b):
        par = parents[i].tolist()
        path, node = [], 0
        while len(path) < depth:
            kids = [j for j in range(n) if par[j] == node]
            if not kids:
                break
            node = kids[0]
            path.append(node)
        full = [0, *path] + [path[-1]] * (depth - len(path))
        drafts.append([int(tokens[i, s]) for s in path] + [-1] * (depth - len(path)))
        t_rows.append(kw["target_logits"][i, full])
        q_rows.append(kw["draft_probs"][i, full[:-1]])
        u.append([float(u_tree[i, s - 1]) for s in path] + [1.0] * (depth - len(path))
                 + [float(u_tree[i, -1])])
    return (torch.tensor(drafts), torch.stack(t_rows), torch.stack(q_rows),
            torch.tensor(u, dtype=torch.float32))


class _Spy:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return verify_tree(*args, **kwargs)


@pytest.mark.parametrize("children", ["without_replacement", "iid"])
def test_the_shadow_counts_are_verify_on_the_spine(pair, children):
    """Each step's chain counts equal ``verify`` called directly on the spine as built per row
    by hand (drafts, target rows root..last spine node, the parents' draft rows, the tree's
    uniforms of those nodes), for both chain rules; the tree count is the run's own."""
    target, draft = pair
    spy = _Spy()
    shadow = SpineShadow(time.perf_counter, spy)
    out = tree_generate(target, draft, _prompt(7), max_new_tokens=24, shape=TreeShape(3, 3, 6),
                        method="rejection", temperature=1.0, children=children, seed=3,
                        verifier=shadow)
    steps = shadow.steps("rejection")
    assert len(spy.calls) == out.metrics.steps == len(steps["spine"])
    assert sum(steps["tree:rejection"]) == out.metrics.accepted_tokens
    for s, (args, kw) in enumerate(spy.calls):
        drafts, t_rows, q_rows, u = _by_hand(args, kw, kw["max_depth"])
        assert steps["spine"][s] == int((drafts >= 0).sum())
        for m in ("rejection", "block"):
            direct = verify(drafts, target_logits=t_rows, draft_probs=q_rows, method=m,
                            temperature=kw["temperature"], uniforms=u)
            assert steps[f"chain:{m}"][s] == int(direct.num_accepted[0]), (s, m)
    assert shadow.shadow_time_s > 0


@pytest.mark.parametrize("children", ["without_replacement", "iid"])
def test_a_one_wide_tree_is_its_own_spine(pair, children):
    """Width 1: the tree is the chain, so the chain rules on its spine decide exactly as the
    tree rules on the tree (token-wise = token-level, block = traversal), step by step: what
    fails if a row, a draft row or a uniform were taken from the wrong node."""
    target, draft = pair
    for method in ("rejection", "traversal"):
        other = "traversal" if method == "rejection" else "rejection"
        pair_shadow = paired.ShadowVerifier(method, time.perf_counter,
                                            paired.TREE_PAIRED_METHODS, verify_tree)
        shadow = SpineShadow(time.perf_counter, pair_shadow)
        tree_generate(target, draft, _prompt(8), max_new_tokens=32, shape=TreeShape(1, 4, 4),
                      method=method, temperature=1.0, children=children, seed=5,
                      verifier=shadow)
        steps = shadow.steps(method, (other, pair_shadow.other))
        assert steps["tree:rejection"] == steps["chain:rejection"]
        assert steps["tree:traversal"] == steps["chain:block"]
        assert set(steps["spine"]) == {4}


def _run_steps(target, draft, shape, prompts, seed):
    """Every step of traversal runs over ``prompts``, judged by both tree rules and both chain
    rules on the spine."""
    merged: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        pair_shadow = paired.ShadowVerifier("traversal", time.perf_counter,
                                            paired.TREE_PAIRED_METHODS, verify_tree)
        shadow = SpineShadow(time.perf_counter, pair_shadow)
        tree_generate(target, draft, _prompt(p), max_new_tokens=32, shape=shape,
                      method="traversal", temperature=1.0, seed=seed + i, verifier=shadow)
        for k, v in shadow.steps("traversal", ("rejection", pair_shadow.other)).items():
            merged.setdefault(k, []).extend(v)
    return merged


_SPINE_CHAIN = paired.spine_chain


def _rows_of_the_node_itself(tokens, parents, target_logits, draft_probs, depth, seed, off):
    """The control: draft row ``j`` taken from spine node ``j + 1`` (its own children's law)
    instead of its parent's, the off-by-one the layout invites."""
    c = _SPINE_CHAIN(tokens, parents, target_logits, draft_probs, depth, seed, off)
    nodes, _ = tree_spine(parents, depth)
    q = draft_probs.gather(1, nodes.clamp(min=0)[..., None].expand(-1, -1, draft_probs.shape[-1]))
    return paired.SpineChain(c.drafts, c.target_logits, q, c.uniforms, c.lengths)


def test_a_draft_equal_to_its_target_accepts_the_whole_spine(pair, monkeypatch):
    """q == p (the target drafts for itself) at T = 1: the chain on the spine accepts every
    draft at every step and each tree rule accepts exactly as many (difference 0), since a
    first child is accepted with probability min(1, p/q) = 1. Negative control: the chain given
    the wrong draft rows (the node's own instead of its parent's) must reject somewhere."""
    target, _ = pair
    steps = _run_steps(target, target, TreeShape(2, 4, 6), [11, 12], seed=40)
    assert len(steps["spine"]) >= 12
    assert steps["chain:rejection"] == steps["spine"] == steps["chain:block"]
    assert steps["tree:rejection"] == steps["tree:traversal"] == steps["spine"]
    monkeypatch.setattr(paired, "spine_chain", _rows_of_the_node_itself)
    bad = _run_steps(target, target, TreeShape(2, 4, 6), [11], seed=40)
    assert bad["chain:rejection"] != bad["spine"]


def test_with_a_mismatched_draft_the_tree_rules_accept_at_least_as_many(pair):
    """A draft far from its target (weights perturbed by 1.0 standard deviation, seed 2), tree
    3x3:6, T = 1, prompts 21..24, seeds 60..63. Token-level against rejection: with the
    tree's own uniforms the spine child's test is the chain's, so every step accepts at least
    as many and the mean gain is at least 0.05 drafts per step (the siblings' catches; measured
    0.28 here). Traversal against block: on average at least as many (margin 0; measured +0.22)."""
    target, _ = pair
    far = perturbed(target, 1.0, 2)
    s = _run_steps(target, far, TreeShape(3, 3, 6), [21, 22, 23, 24], seed=60)
    n = len(s["spine"])
    assert n >= 40
    assert all(t >= c for t, c in zip(s["tree:rejection"], s["chain:rejection"], strict=True))
    assert (sum(s["tree:rejection"]) - sum(s["chain:rejection"])) / n >= 0.05
    assert sum(s["tree:traversal"]) >= sum(s["chain:block"])
    assert sum(s["chain:rejection"]) < sum(s["spine"])  # the draft is mismatched indeed


def test_tree_vs_chain_arithmetic_on_hand_made_figures():
    """Two trials (one round of two prompt batches): trial 1 tree [2, 1, 3] vs chain
    [1, 1, 2] (means 2 and 4/3, gain 2/3); trial 2 tree [0, 2] vs chain [0, 1] (1 and 1/2,
    gain 1/2). Mean gain 7/12; the t interval's half width t(0.975, 1) * s / sqrt(2) with
    s = (1/6) / sqrt(2): 12.7062 / 12 = 1.05885."""
    trials = [{"tree:rejection": [2, 1, 3], "chain:rejection": [1, 1, 2], "spine": [3, 3, 3]},
              {"tree:rejection": [0, 2], "chain:rejection": [0, 1], "spine": [2, 3]}]
    (row,) = tree_vs_chain(trials, "2x3", per_round=2)  # no traversal or block counts given
    assert (row["tree_rule"], row["chain_rule"], row["trials"]) == ("rejection", "rejection", 2)
    assert row["same_step_row_steps"] == 5
    assert row["accepted_per_step_tree"] == pytest.approx(8 / 5)
    assert row["accepted_per_step_chain"] == pytest.approx(5 / 5)
    assert row["mean_spine_length"] == pytest.approx(14 / 5)
    g = row["gain_same_steps"]
    assert g["mean"] == pytest.approx(7 / 12)
    assert g["high"] - g["mean"] == pytest.approx(1.05885, abs=1e-4)
    assert row["gain_same_steps_by_round"]["n"] == 1  # one round: no interval over rounds
    assert (row["same_step_positive"], row["same_step_negative"]) == (3, 0)
    assert row["per_trial"]["tree"] == pytest.approx([2, 1])
    assert row["per_trial"]["chain"] == pytest.approx([4 / 3, 1 / 2])
    assert row["gain_same_steps_relative"]["mean"] == pytest.approx(7 / 12)


def test_pooling_two_chunks_over_trials():
    """Two reports on disjoint seeds pool trial by trial: the interval of the union."""
    def report(seed, trials):
        rows = tree_vs_chain(trials, "2x3", per_round=1)
        return {"config": {"seed": seed, "rounds": len(trials), "k": [3]}, "num_batches": 1,
                "tree_vs_chain_same_steps": rows}

    a = report(0, [{"tree:traversal": [2, 2], "chain:block": [1, 2]},
                   {"tree:traversal": [1], "chain:block": [1]}])
    b = report(2, [{"tree:traversal": [3], "chain:block": [1]}])
    pooled = pool_trials([a, b], "tree_vs_chain_same_steps")
    assert (pooled["tree_rule"], pooled["chain_rule"]) == ("traversal", "block")
    assert pooled["trials"] == 3 and pooled["same_step_row_steps"] == 4
    assert pooled["gain_same_steps"]["mean"] == pytest.approx((0.5 + 0 + 2) / 3)
    assert pooled["accepted_per_step_tree"]["mean"] == pytest.approx((2 + 1 + 3) / 3)
    assert "gain_runs" not in pooled
    with pytest.raises(ValueError, match="overlap"):
        pool_trials([a, report(1, [{"tree:traversal": [1], "chain:block": [1]}])],
                    "tree_vs_chain_same_steps")


def test_the_cli_line_fits_in_100_columns():
    from portable_verify.cli.e2e import _spine_lines

    g = {"mean": -0.1234, "low": -0.9876, "high": 0.5556, "n": 32}
    rows = [{"tree": "3x8:16", "tree_rule": t, "chain_rule": c, "trials": 32,
             "gain_same_steps": g, "drafter": "spine", "draft_mode": "sampled"}
            for t, c in paired.SPINE_PAIRS]
    (line,) = _spine_lines(rows, "3x8:16")
    assert len(line) <= 100 and "rej-rej -0.123 [-0.988,+0.556]" in line
    assert _spine_lines(rows, "2x3") == []


def _tiny_runner(monkeypatch, pair):
    """The e2e runner on the tiny pair, two one-prompt batches."""
    prompts = [(_prompt(s), torch.ones(1, 6, dtype=torch.int64)) for s in (5, 6)]
    return tiny_e2e_runner(monkeypatch, pair, prompts)

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_e2e_reports_the_tree_rules_against_the_spine(monkeypatch, pair, temperature):
    """``e2e --tree --method traversal`` at T > 0: per tree, the four (tree rule, chain rule)
    pairs over both tree runs' steps, trial by trial, poolable; at T = 0 none (greedy rows
    draw no chain)."""
    from portable_verify.e2e.config import E2EConfig

    runner = _tiny_runner(monkeypatch, pair)
    cfg = E2EConfig(method="traversal", temperature=temperature, trees=("3x3:5",), ks=(5,),
                    max_new_tokens=12, num_prompts=2, rounds=2)
    data = runner.run_e2e(cfg)
    rows = data["tree_vs_chain_same_steps"]
    if temperature == 0:
        assert rows == []
        return
    assert [(r["tree_rule"], r["chain_rule"]) for r in rows] == list(paired.SPINE_PAIRS)
    steps = sum(r["steps"] for r in data["results"] if r["tree"] == "3x3:5")
    (trav,) = data["traversal_comparison"]
    for r in rows:
        assert r["trials"] == 4 and r["same_step_row_steps"] == steps
        assert r["gain_same_steps_by_round"]["n"] == 2
    token_level = next(r for r in rows if r["tree_rule"] == "rejection")
    assert token_level["accepted_per_step_tree"] == pytest.approx(
        trav["accepted_per_forward_token_level"])
    pooled = pool_trials([data], "tree_vs_chain_same_steps", 1)
    assert pooled["gain_same_steps"] == pytest.approx(rows[1]["gain_same_steps"])
