"""Exact rules on the same model pair, paired on identical steps: block verification against
token-wise rejection on chains, traversal verification against the token-level rule on trees,
and each tree rule against the chain rules on the tree's spine (:class:`SpineShadow`).

Why two: whole runs of the two methods (same prompt, same seed) part ways after the first step
that accepts differently, so a per-run difference carries the full sampling noise of two
independent texts. Judging each step's inputs (drafts, target and draft rows, uniforms) with
*both* rules removes that noise: the run keeps its own rule, a shadow call applies the other
one to the same arguments and is left out of the run's times. Both estimates are averaged per
trial (one prompt batch in one round) and their intervals are taken over trials, so steps of
one text are never treated as independent.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from portable_verify import VerifyOptions, verify, verify_tree
from portable_verify.core import arguments, rng
from portable_verify.e2e.tree_loop import SAMPLED_CHILDREN

PAIRED_METHODS: tuple[str, str] = ("block", "rejection")  # narrower: a pair
"""What ``e2e --method block`` runs, alternated: block first in the name, its baseline second."""
TREE_PAIRED_METHODS: tuple[str, str] = ("traversal", "rejection")  # narrower: a pair
"""What ``e2e --tree --method traversal`` runs per tree, alternated: traversal, then the
token-level tree rule it is measured against."""
SPINE_CHAIN_METHODS: tuple[str, str] = ("rejection", "block")  # narrower: exact chains
"""The chain rules a tree step's spine is judged by (:class:`SpineShadow`)."""
SPINE_PAIRS: tuple[tuple[str, str], ...] = (  # narrower: pairs
    ("rejection", "rejection"), ("traversal", "block"),
    ("rejection", "block"), ("traversal", "rejection"))
"""(tree rule, chain rule) on the same steps: the like-for-like pairs first (the token-level
tree rule against token-wise rejection; traversal, the sequence-level rule, against block),
then across."""


@dataclass
class ShadowVerifier:
    """``verify`` (or ``fn``, e.g. ``verify_tree``) with the run's method, plus the other
    method of ``pair`` on the same arguments.

    The shadow's accepted counts stay tensors until read (no extra host sync per step); its
    time on ``clock`` is kept apart so the caller can leave it out of the run's times.
    """

    method: str
    clock: Callable[[], float]
    pair: tuple[str, str] = PAIRED_METHODS
    fn: Callable[..., Any] = verify
    own: list[torch.Tensor] = field(default_factory=list)
    other: list[torch.Tensor] = field(default_factory=list)
    shadow_time_s: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in self.pair:
            raise ValueError(f"method must be one of the pair {self.pair}, got {self.method!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.fn(*args, **kwargs)
        t0 = self.clock()
        other_method = self.pair[1] if self.method == self.pair[0] else self.pair[0]
        same = {name: value for name, value in kwargs.items()
                if name not in ("method", "options")}  # the other rule, on the same arguments
        shadow = self.fn(*args, options=VerifyOptions(other_method), **same)
        self.other.append(shadow.num_accepted)
        self.own.append(result.num_accepted)
        self.shadow_time_s += self.clock() - t0
        return result

    def accepted(self) -> tuple[list[int], list[int]]:
        """Per verified row-step, the accepted drafts of ``pair[0]`` and of ``pair[1]``, both
        judged on the same inputs (one host transfer for the whole run)."""
        if not self.own:
            return [], []
        own = torch.stack(self.own).flatten().tolist()
        other = torch.stack(self.other).flatten().tolist()
        return (own, other) if self.method == self.pair[0] else (other, own)

    def first_minus_second(self) -> list[int]:
        """Per verified row-step: ``pair[0]``'s accepted drafts minus ``pair[1]``'s."""
        first, second = self.accepted()
        return [a - b for a, b in zip(first, second, strict=True)]

    def block_minus_rejection(self) -> list[int]:
        """Per verified row-step: block's accepted drafts minus rejection's, same inputs."""
        return self.first_minus_second()


def spine_refusal(drafter: str, temperature: float, children: str) -> str | None:
    """Why a tree's first-child path is not a chain draft here, or None when it is.

    The spine drafter at ``T > 0`` with ``iid`` or ``without_replacement`` children draws each
    node's first child from the draft's row at that node, exactly as the chain loop draws its
    next draft (in both children modes the first draw sees the whole row, nothing removed).
    Whether the spine node at depth ``j`` is kept depends on the rows up to depth ``j`` only
    (its value and every value that can outrank it come from those rows; deeper candidates
    never outrank it), i.e. on the drafts before it, never on itself: the spine is a chain
    whose length is a stopping rule, which the chain rules judge exactly. Elsewhere it is not:
    greedy rows and argmax trees draw nothing; the dynamic drafter keeps or expands a node by
    comparing it with other branches' draws; the n-gram trie's children are chosen."""
    if not temperature > 0:
        return "temperature: greedy rows draw no chain (the pairing needs T > 0)"
    if children not in SAMPLED_CHILDREN:
        return f"children: {children!r} children are chosen, not drawn"
    if drafter != "spine":
        return f"drafter: the {drafter!r} drafter's first-child path is not a chain draft"
    return None


def tree_spine(parents: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first-child path from the root of each row's tree: nodes ``[B, depth]`` (``-1``
    past the path's end) and the path's length ``[B]``.

    Why the lowest-index child: siblings are drawn (and tested) in node order, so a node's
    lowest-index child is its first draw (docs/semantics.md, "Trees"). ``parents [B, N]``
    lists a parent before its children; the loop runs over depth, never over the batch.
    """
    b, n = parents.shape
    index = torch.arange(n, device=parents.device)
    node = torch.zeros(b, dtype=torch.int64, device=parents.device)
    path = []
    for _ in range(depth):
        child = (parents == node[:, None]) & (node[:, None] >= 0)
        first = torch.where(child, index, n).amin(1)
        node = torch.where(first < n, first, -1)
        path.append(node)
    if not path:
        return parents.new_zeros(b, 0), parents.new_zeros(b)
    nodes = torch.stack(path, 1)
    return nodes, (nodes >= 0).sum(1)


@dataclass(frozen=True)
class SpineChain:
    """One tree step's spine as ``verify``'s chain arguments (``D = depth``): drafts
    ``[B, D]`` (``-1`` past a row's spine), target rows ``[B, D + 1, V]`` (the root's, then
    the spine nodes'; row ``n_i``, the last spine node's, gives the bonus), draft rows
    ``[B, D, V]`` (row ``j``: the law draft ``j`` was drawn from, its parent's row) and the
    uniforms ``[B, D + 1]`` the tree's tests of those nodes read (and its final draw's)."""

    drafts: torch.Tensor
    target_logits: torch.Tensor
    draft_probs: torch.Tensor
    uniforms: torch.Tensor
    lengths: torch.Tensor


def spine_chain(tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor,
                draft_probs: torch.Tensor, depth: int, seed: Any, seed_offset: Any
                ) -> SpineChain:
    """The chain a tree step contains (:func:`tree_spine`), judged on that step's inputs.

    Why the tree's own uniforms: the chain's test of draft ``j`` then reads the number the
    tree's test of spine node ``j + 1`` reads (node ``i`` tests on counter ``2(i - 1)``, the
    final draw on counter 1), so the two rules differ only by what they decide, not by their
    random numbers (common random numbers, as the other pairs share their seeds)."""
    b, n = tokens.shape
    nodes, lengths = tree_spine(parents, depth)
    real = nodes >= 0
    drafts = torch.where(real, tokens.gather(1, nodes.clamp(min=0)), -1)
    # [root, s_1 .. s_L, s_L ..]: node ids increase down a path, so a running max pads with
    # the last spine node (whose row is the bonus row n_i)
    path = torch.cat([nodes.new_zeros(b, 1), nodes], 1).cummax(1).values
    v = target_logits.shape[-1]
    target = target_logits.gather(1, path[..., None].expand(-1, -1, v))
    q = draft_probs.gather(1, path[:, :-1, None].expand(-1, -1, draft_probs.shape[-1]))
    seeds = arguments.request_seeds(seed, b, tokens.device, validate=False)
    offsets = arguments.request_offsets(seed_offset, b, tokens.device, validate=False)
    u_tree = rng.uniforms_torch(seeds, offsets, n)
    u = torch.cat([u_tree.gather(1, (nodes - 1).clamp(min=0)), u_tree[:, -1:]], 1)
    return SpineChain(drafts, target, q, u, lengths)


@dataclass
class SpineShadow:
    """``fn`` (``verify_tree``, or a :class:`ShadowVerifier` over it) for the run, plus the
    chain rules on the step's spine (:func:`spine_chain`, same temperature, seeds and step).

    Counts stay tensors until :meth:`steps` (one host transfer per run); the shadow's time on
    ``clock`` is kept apart so the caller can leave it out of the run's times. Only for steps
    whose spine is a chain draft (:func:`spine_refusal`): a call without ``draft_probs`` or
    with chosen children is refused."""

    clock: Callable[[], float]
    fn: Callable[..., Any] = verify_tree
    chain_methods: tuple[str, ...] = SPINE_CHAIN_METHODS
    tree: list[torch.Tensor] = field(default_factory=list)
    chain: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    lengths: list[torch.Tensor] = field(default_factory=list)
    shadow_time_s: float = 0.0

    def __call__(self, tokens: torch.Tensor, parents: torch.Tensor, **kw: Any) -> Any:
        if kw.get("draft_probs") is None or kw.get("children") not in SAMPLED_CHILDREN:
            raise ValueError("draft_probs: the spine is a chain draft only for children drawn "
                             f"from draft rows ({SAMPLED_CHILDREN}), got children="
                             f"{kw.get('children')!r} with"
                             f"{'out' if kw.get('draft_probs') is None else ''} draft_probs")
        result = self.fn(tokens, parents, **kw)
        t0 = self.clock()
        depth = kw.get("max_depth") or tokens.shape[1] - 1
        c = spine_chain(tokens, parents, kw["target_logits"], kw["draft_probs"], depth,
                        kw.get("seed"), kw.get("seed_offset"))
        for m in self.chain_methods:
            out = verify(c.drafts, target_logits=c.target_logits, draft_probs=c.draft_probs,
                         method=m, temperature=kw.get("temperature"), uniforms=c.uniforms,
                         validate=False)
            self.chain.setdefault(m, []).append(out.num_accepted)
        self.tree.append(result.num_accepted)
        self.lengths.append(c.lengths)
        self.shadow_time_s += self.clock() - t0
        return result

    def steps(self, method: str, other: tuple[str, list[torch.Tensor]] | None = None
              ) -> dict[str, list[int]]:
        """Per verified row-step: ``"tree:<rule>"`` the run's rule (``method``) and ``other``'s
        (a second tree rule's counts on the same steps, e.g. :class:`ShadowVerifier`'s),
        ``"chain:<rule>"`` each chain rule's on the spine, ``"spine"`` the spine's length."""
        if not self.tree:
            return {}
        names = [f"tree:{method}", *(f"chain:{m}" for m in self.chain_methods), "spine"]
        parts = [self.tree, *(self.chain[m] for m in self.chain_methods), self.lengths]
        if other is not None:
            names.append(f"tree:{other[0]}")
            parts.append(other[1])
        host = torch.stack([torch.stack(p).flatten() for p in parts]).tolist()
        return dict(zip(names, host, strict=True))


def mean_interval(values: list[float], level: float = 0.95) -> dict[str, float | int | None]:
    """Mean and Student-t interval over independent trials (``low``/``high`` None if n < 2)."""
    n = len(values)
    mean = statistics.fmean(values) if values else float("nan")
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    from scipy.stats import t

    half = float(t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def per_trial_data(same_steps: list[float], runs: list[float], row_steps: list[int],
                   positive: list[int], negative: list[int]) -> dict[str, list[Any]]:
    """A comparison's per-trial values, kept in the report so that runs on disjoint seeds can
    be pooled trial by trial (:func:`pool_trials`) rather than step by step."""
    return {"gain_same_steps": same_steps, "gain_runs": runs, "row_steps": row_steps,
            "positive": positive, "negative": negative}


def round_means(values: list[float], per_round: int) -> list[float]:
    """Per round, the mean of its trials' values (trials listed round by round, ``per_round``
    prompt batches each). Why: reports from before each trial drew its own seed
    (``runner.trial_seed``) shared a round's seed among its prompts, so their trials are not
    independent; an interval over rounds does not assume they are, and on newer reports it
    shows whether rounds differ more than their trials do."""
    if per_round < 1 or len(values) % per_round:
        raise ValueError(f"per_round: {len(values)} trials do not split into rounds of "
                         f"{per_round} prompt batches")
    return [statistics.fmean(values[i:i + per_round]) for i in range(0, len(values), per_round)]


def tree_vs_chain(trials: list[dict[str, list[int]]], tree: str,
                  per_round: int = 1) -> list[dict[str, Any]]:
    """Each tree rule against each chain rule on the same steps (:data:`SPINE_PAIRS` present in
    ``trials``, one dict of :meth:`SpineShadow.steps` per trial): per-trial mean accepted drafts
    per step of both, their paired difference with its 95% Student-t interval over trials (and
    over rounds of ``per_round`` trials), and how many steps each rule won."""
    rows = []
    for tree_rule, chain_rule in SPINE_PAIRS:
        kt, kc = f"tree:{tree_rule}", f"chain:{chain_rule}"
        kept = [(t[kt], t[kc]) for t in trials if t.get(kt) and kc in t]
        if not kept:
            continue
        tree_means = [statistics.fmean(a) for a, _ in kept]
        chain_means = [statistics.fmean(c) for _, c in kept]
        gains = [a - c for a, c in zip(tree_means, chain_means, strict=True)]
        pos = [sum(x > y for x, y in zip(a, c, strict=True)) for a, c in kept]
        neg = [sum(x < y for x, y in zip(a, c, strict=True)) for a, c in kept]
        steps = [len(a) for a, _ in kept]
        chain_all = [x for _, c in kept for x in c]
        base = statistics.fmean(chain_all)
        by_round = (mean_interval(round_means(gains, per_round))
                    if len(gains) % per_round == 0 and len(kept) == len(trials) else None)
        gain = mean_interval(gains)
        rows.append({
            "tree": tree, "tree_rule": tree_rule, "chain_rule": chain_rule,
            "trials": len(kept), "same_step_row_steps": sum(steps),
            "accepted_per_step_tree": statistics.fmean([x for a, _ in kept for x in a]),
            "accepted_per_step_chain": base,
            "mean_spine_length": statistics.fmean([x for t in trials for x in t.get("spine", [])]
                                                  or [float("nan")]),
            "gain_same_steps": gain, "gain_same_steps_by_round": by_round,
            "gain_same_steps_relative": {k: None if gain[k] is None else gain[k] / base
                                         for k in ("mean", "low", "high")} if base else None,
            "same_step_positive": sum(pos), "same_step_negative": sum(neg),
            "per_trial": {"gain_same_steps": gains, "row_steps": steps, "positive": pos,
                          "negative": neg, "tree": tree_means, "chain": chain_means},
        })
    return rows


_POOL_FREE = ("seed", "rounds")
"""Config fields that may differ between pooled runs: which seeds a run drew, and how many."""


def _seed_ranges(runs: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each run's seeds ``[seed, seed + rounds x batches)`` (``runner.trial_seed``), refused
    when two runs overlap: a trial drawn twice would be counted as two."""
    spans = sorted((int(r["config"]["seed"]), int(r["config"]["seed"])
                    + int(r["config"]["rounds"]) * int(r["num_batches"])) for r in runs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start < end:
            raise ValueError(f"runs: seed ranges overlap ({spans}); give each run its own "
                             "--seed so that their trials draw disjoint seeds")
    return spans


def pool_trials(runs: list[dict[str, Any]], section: str = "block_comparison",
                index: int = 0) -> dict[str, Any]:
    """Pool one comparison (``runs[i][section][index]``) of several ``e2e --json`` reports
    over their trials: each trial's paired difference stays as its run computed it, the
    interval is taken over the union of trials. Why: a long measurement split into chunks on
    disjoint seeds gives the same estimate as one run over all of them, never pooled by step."""
    if len(runs) < 1:
        raise ValueError("runs: give at least one e2e --json report")
    base = {k: v for k, v in runs[0]["config"].items() if k not in _POOL_FREE}
    for r in runs[1:]:
        other = {k: v for k, v in r["config"].items() if k not in _POOL_FREE}
        if other != base:
            diff = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
            raise ValueError(f"runs: configurations differ in {diff}; only {_POOL_FREE} may")
    spans = _seed_ranges(runs)
    parts = [r[section][index] for r in runs]
    if any("per_trial" not in p for p in parts):
        raise ValueError(f"runs: {section} has no per-trial values (a report from before they "
                         "were kept); rerun it")
    label = {k: parts[0][k] for k in ("k", "draft_mode", "tree", "tree_rule", "chain_rule")
             if k in parts[0]}
    if any({k: p.get(k) for k in label} != label for p in parts):
        raise ValueError(f"runs: {section}[{index}] compares different configurations")
    keys = [k for k in _TRIAL_KEYS if k in parts[0]["per_trial"]]
    trials = {key: [x for p in parts for x in p["per_trial"][key]] for key in keys}
    per_round = int(runs[0]["num_batches"])
    gains = [k for k in ("gain_same_steps", "gain_runs") if k in keys]
    by_round = {key: [x for p in parts for x in round_means(p["per_trial"][key], per_round)]
                for key in gains}
    out = {**label, "runs": len(runs), "seeds": [list(s) for s in spans],
           "trials": len(trials["gain_same_steps"]), "rounds": len(by_round["gain_same_steps"]),
           "same_step_row_steps": sum(trials["row_steps"]),
           "same_step_positive": sum(trials["positive"]),
           "same_step_negative": sum(trials["negative"])}
    for key in gains:
        out[key] = mean_interval(trials[key])
        out[f"{key}_by_round"] = mean_interval(by_round[key])
    for key in ("tree", "chain"):  # the two rules' own per-trial means (tree against chain)
        if key in keys:
            out[f"accepted_per_step_{key}"] = mean_interval(trials[key])
    return out


_TRIAL_KEYS = ("gain_same_steps", "gain_runs", "row_steps", "positive", "negative", "tree",
               "chain")
"""Per-trial lists a comparison may keep (``gain_runs`` only where whole runs are paired;
``tree``/``chain`` in the tree-against-chain comparison)."""


def main(argv: list[str] | None = None) -> None:
    """``python -m portable_verify.e2e.paired SECTION A.json B.json ...``: print the pooled
    comparisons of ``SECTION`` (``block_comparison``, ``traversal_comparison`` or
    ``tree_vs_chain_same_steps``) as JSON."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit("usage: python -m portable_verify.e2e.paired SECTION A.json [B.json ...]")
    runs = []
    for path in args[1:]:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    if args[0] not in runs[0]:
        raise SystemExit(f"SECTION: {args[0]!r} is not in {args[1]}")
    pooled = [pool_trials(runs, args[0], i) for i in range(len(runs[0][args[0]]))]
    print(json.dumps(pooled, indent=1))


if __name__ == "__main__":
    main()
