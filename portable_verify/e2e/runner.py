"""The end-to-end experiment: every configuration on the same prompts, interleaved, as data.

Configurations (target-only, then speculative at each ``k``, then the dense verifier when
asked) run round by round over the same prompt batches, the starting configuration rotated each
round, so a burst of load from another process hits them alike and the *ratios* stay meaningful
on a shared machine. Each speed-up is reported with its spread: one ratio per (round, batch),
each against target-only decoding of the same batch in the same round.

Paired rules (``method="block"`` on chains, ``method="traversal"`` on trees) run as two
configurations alternated ABAB over trials, each step of each judged by both rules on identical
inputs (:class:`~portable_verify.e2e.paired.ShadowVerifier`); intervals are over trials (one
prompt batch in one round), never over steps. Under traversal at T > 0 each tree step's spine
is also judged as a chain by rejection and block (:class:`~portable_verify.e2e.paired.
SpineShadow`): the tree rules against the chain on identical steps.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from portable_verify import verify_tree
from portable_verify.bench import environment
from portable_verify.core.types import VerifyOptions
from portable_verify.e2e import tree_drafters
from portable_verify.e2e.config import E2EConfig
from portable_verify.e2e.dense_verifier import dense_verifier
from portable_verify.e2e.paired import (
    PAIRED_METHODS,
    TREE_PAIRED_METHODS,
    ShadowVerifier,
    SpineShadow,
    mean_interval,
    per_trial_data,
    round_means,
    spine_refusal,
    tree_vs_chain,
)
from portable_verify.e2e.runtimes import Engines, load_engines
from portable_verify.e2e.tree_loop import TreeLoopMetrics, TreeShape, tree_generate
from portable_verify.integrations import hf

Progress = Callable[[str], None]
"""Receives one human-readable line per finished stage or configuration run."""


@dataclass
class Contender:
    """One configuration's results, accumulated over prompts and rounds."""

    name: str
    k: int  # 0: target-only decoding; a tree's depth
    verifier: str  # "-" (target-only), "verify", "dense" or "verify_tree"
    metrics: hf.LoopMetrics
    method: str = ""  # the verification method ("" for target-only)
    tree: TreeShape | None = None
    draft_mode: str = "sampled"  # how sampled rows draft (hf.DRAFT_MODES)
    drafter: str = ""  # a tree's drafter (tree_drafters.DRAFTERS)
    accepted_per_forward: list[float] = field(default_factory=list)  # one per (round, batch)
    tokens_per_s: list[float] = field(default_factory=list)  # one per (round, batch)
    speedups: list[float] = field(default_factory=list)  # against target-only, same batch
    matched: int = 0
    compared: int = 0
    mismatched_rows: int = 0
    accepted_per_step: list[float] = field(default_factory=list)  # one per (round, batch)
    same_step_diffs: list[list[int]] = field(default_factory=list)  # block - rejection, same
    # Trees under traversal, per trial: (traversal's, the token-level rule's) accepted drafts
    # per step, both judged on that step's identical inputs.
    same_step_accepted: list[tuple[list[int], list[int]]] = field(default_factory=list)
    # Trees under traversal at T > 0, per trial: each step's tree rules and the chain rules on
    # its spine (paired.SpineShadow.steps), where the spine is a chain draft.
    spine_steps: list[dict[str, list[int]]] = field(default_factory=list)

    def summary(self, greedy: bool, baseline_tokens_per_s: float) -> dict[str, Any]:
        """Plain data: the loop's metrics, the speed-up with its spread, the greedy check."""
        data = self.metrics.as_dict()
        data.update(name=self.name, verifier=self.verifier, method=self.method or None,
                    draft_mode=self.draft_mode if self.k else None,
                    tree=None if self.tree is None else self.tree.label,
                    scored_nodes=(self.tree.nodes if self.tree else self.k) + 1,
                    accepted_drafts_per_target_forward=(
                        self.metrics.accepted_tokens / self.metrics.row_steps
                        if self.metrics.row_steps else None),
                    tokens_per_target_forward=_per_target_forward(self),
                    speedup_vs_target_only=_ratio(data["tokens_per_s"],
                                                  baseline_tokens_per_s) if self.k else 1.0,
                    speedup_spread=spread(self.speedups) if self.k else None,
                    per_trial={"tokens_per_s": self.tokens_per_s,
                               "accepted_per_forward": self.accepted_per_forward,
                               "speedup": self.speedups})
        if self.k and greedy:
            data["greedy_match_rate"] = self.matched / self.compared if self.compared else None
            data["greedy_mismatched_rows"] = self.mismatched_rows
            data["greedy_equal"] = self.mismatched_rows == 0
        return data


def _per_target_forward(c: Contender) -> float | None:
    """New tokens per target forward: the mean accepted length seen from the target's side."""
    return c.metrics.new_tokens / c.metrics.steps if c.metrics.steps else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b and b == b and a == a else None


def spread(values: list[float]) -> dict[str, float] | None:
    """``{"min", "median", "max", "n"}`` of ``values`` (None when empty)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "n": len(values)}


def cpu_flags() -> list[str]:
    """The SIMD features that decide CPU matmul speed (named beside every figure)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
              "amx_int8")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def _load_average() -> list[float] | None:
    """The machine's 1/5/15-minute load: how shared the CPU was while this ran."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def prompt_batches(tokenizer: Any, cfg: E2EConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded ``(input_ids, attention_mask)`` batches, chat-formatted when possible."""
    texts = list(cfg.prompts[: cfg.num_prompts])
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    batches = []
    for i in range(0, len(texts), cfg.batch):
        enc = tokenizer(texts[i: i + cfg.batch], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        batches.append((enc.input_ids, enc.attention_mask))
    return batches


def prefix_match(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _chain_methods(method: str) -> tuple[str, ...]:
    """The chains' methods: the pair under block; block under traversal (traversal on a chain
    is block verification exactly, and ``verify`` names it so)."""
    if method == "block":
        return PAIRED_METHODS
    return ("block",) if method == "traversal" else (method,)


def contenders(cfg: E2EConfig) -> list[Contender]:
    """Target-only first, then speculative at each ``k`` (and with the dense verifier); with
    ``method="block"`` each ``k`` runs block and token-wise rejection side by side; with
    ``method="traversal"`` each tree runs traversal and the token-level rule side by side."""
    runs = [Contender("target-only", 0, "-", hf.LoopMetrics(k=0))]
    verifiers = ["verify", "dense"] if cfg.dense else ["verify"]
    methods = _chain_methods(cfg.method)
    modes = cfg.draft_modes
    for v in verifiers:
        for k in cfg.ks:
            for mode in modes:
                for method in methods:
                    name = f"spec k={k}" + (" dense" if v == "dense" else "") \
                        + (f" {method}" if len(methods) > 1 else "") \
                        + (f" {mode}" if len(modes) > 1 else "")
                    metrics = hf.LoopMetrics(k=k, accepted_per_position=[0] * k)
                    runs.append(Contender(name, k, v, metrics, method, draft_mode=mode))
    # Trees: one run per shape, drafter, draft mode and rule ("argmax": deterministic
    # children verified at T, no draft_probs).
    tree_methods = TREE_PAIRED_METHODS if cfg.method == "traversal" else (cfg.method,)
    drafters = cfg.tree_drafters
    for text in cfg.trees:
        shape = TreeShape.parse(text)
        for drafter in drafters:
            for mode in modes:
                for method in tree_methods:
                    name = f"tree {shape.label}" + (f" {drafter}" if len(drafters) > 1 else "") \
                        + (f" {method}" if len(tree_methods) > 1 else "") \
                        + (f" {mode}" if len(modes) > 1 else "")
                    runs.append(Contender(name, shape.depth, "verify_tree",
                                          TreeLoopMetrics(k=shape.depth,
                                                          accepted_per_position=[0] * shape.depth),
                                          method=method, tree=shape, draft_mode=mode,
                                          drafter=drafter))
    return runs


def _group(run: Contender) -> tuple[Any, ...] | None:
    """Runs compared side by side share a group: same budget, verifier and tree, differing
    only in rule or draft mode (None: a run compared with nothing but target-only)."""
    return None if run.k == 0 else (run.k, run.verifier, run.tree, run.drafter)


def _alternate(order: list[Contender], runs: list[Contender], flip: bool) -> list[Contender]:
    """``order`` with each group's runs, in the slots the rotation gave the group, put in their
    listed order, reversed when ``flip``: every two runs compared side by side go ABAB over
    successive trials, whatever the rotation did."""
    out = list(order)
    groups: dict[Any, list[int]] = {}
    for i, run in enumerate(out):
        if _group(run) is not None:
            groups.setdefault(_group(run), []).append(i)
    for slots in groups.values():
        if len(slots) < 2:
            continue
        members = sorted((out[i] for i in slots), key=runs.index)
        for i, run in zip(slots, reversed(members) if flip else members, strict=True):
            out[i] = run
    return out


def run_e2e(cfg: E2EConfig, progress: Progress | None = None,
            argv: list[str] | None = None, engines: Engines | None = None) -> dict[str, Any]:
    """Load (converting once where needed; ``engines`` given: reuse them), run every
    configuration interleaved, return data (with ``cfg.sweep``: the flatness curve and each
    method's best budget chosen on held-out prompts, :mod:`~portable_verify.e2e.sweep`)."""
    say = progress or (lambda line: None)
    previous_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        engines = engines or load_engines(cfg, say)
        runs = _measure(cfg, engines, say)
        curve = _flatness(cfg, engines, runs, say) if cfg.sweep else None
    finally:
        torch.set_num_threads(previous_threads)
    data = _report(cfg, engines, runs, argv)
    if cfg.sweep:
        from portable_verify.e2e import sweep

        data["flatness"] = curve
        data["sweep"] = sweep.sweep_report(data, sweep.selection_batches(data["num_batches"]))
    return data


def _flatness(cfg: E2EConfig, engines: Engines, runs: list[Contender],
              say: Progress) -> list[dict[str, float]]:
    """The target forward's cost at 1 .. the most scored positions of any run."""
    from portable_verify.e2e import flatness

    most = max(_scored(r) for r in runs)
    say(f"flatness: timing the target's forward at 1..{most} scored positions")
    clock = time.process_time if cfg.clock == "cpu" else time.perf_counter
    return flatness.forward_cost(engines.target, most, clock=clock)


def _scored(run: Contender) -> int:
    """Target positions scored per step: the last token plus every draft (or tree node)."""
    return (run.tree.nodes if run.tree is not None else run.k) + 1


def _measure(cfg: E2EConfig, engines: Engines, say: Progress) -> list[Contender]:
    tokenizer = engines.tokenizer
    batches = prompt_batches(tokenizer, cfg)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    runs = contenders(cfg)
    greedy = cfg.greedy
    clock = time.process_time if cfg.clock == "cpu" else time.perf_counter

    def tree_run(run: Contender, ids: torch.Tensor, mask: torch.Tensor, n: int,
                 seed: int) -> Any:
        shadow = ShadowVerifier(run.method, clock, TREE_PAIRED_METHODS, verify_tree) \
            if cfg.method == "traversal" else None
        children = "deterministic" if run.draft_mode == "argmax" or run.drafter == "ngram" \
            else cfg.children  # the n-gram trie's children are chosen, never drawn
        spine = SpineShadow(clock, shadow) if shadow is not None \
            and spine_refusal(run.drafter, 0.0 if greedy else cfg.temperature,
                              children) is None else None
        out = tree_generate(engines.target, engines.draft, ids, attention_mask=mask,
                            max_new_tokens=n, shape=run.tree, method=run.method,
                            temperature=cfg.temperature, seed=seed, eos_token_id=eos,
                            pad_token_id=pad, children=children,
                            drafter=tree_drafters.get_drafter(run.drafter),
                            verifier=spine or shadow or verify_tree, clock=clock)
        for s in (shadow, spine):  # the shadow calls are the measurement's, not the run's
            if s is not None:
                out.metrics.verify_time_s -= s.shadow_time_s
                out.metrics.decode_time_s -= s.shadow_time_s
        if shadow is not None:
            run.same_step_accepted.append(shadow.accepted())
        if spine is not None and shadow is not None:
            other = TREE_PAIRED_METHODS[1] if run.method == TREE_PAIRED_METHODS[0] \
                else TREE_PAIRED_METHODS[0]
            run.spine_steps.append(spine.steps(run.method, (other, shadow.other)))
        return out

    def generate(run: Contender, ids: torch.Tensor, mask: torch.Tensor, n: int,
                 seed: int) -> Any:
        if run.k == 0:
            return hf.target_only_generate(engines.target, ids, attention_mask=mask,
                                           max_new_tokens=n, eos_token_id=eos, pad_token_id=pad,
                                           clock=clock)
        if run.tree is not None:
            return tree_run(run, ids, mask, n, seed)
        shadow = ShadowVerifier(run.method, clock) if run.method in PAIRED_METHODS \
            and cfg.method == "block" else None
        verifier = dense_verifier(seed) if run.verifier == "dense" else shadow
        out = hf.speculative_generate(
            engines.target, engines.draft, ids, attention_mask=mask, max_new_tokens=n,
            k=run.k, options=VerifyOptions(run.method, cfg.typical),
            temperature=cfg.temperature, seed=seed, verifier=verifier, eos_token_id=eos,
            pad_token_id=pad, clock=clock, draft_mode=run.draft_mode)
        if shadow is not None:  # the shadow call is the measurement's, not the run's
            out.metrics.verify_time_s -= shadow.shadow_time_s
            out.metrics.decode_time_s -= shadow.shadow_time_s
            run.same_step_diffs.append(shadow.block_minus_rejection())
        return out

    ids0, mask0 = batches[0]  # warm-up: allocator, thread pools, compiled kernels, lazy inits
    for run in runs:
        generate(run, ids0, mask0, 4, cfg.seed)
        run.same_step_diffs.clear()
        run.same_step_accepted.clear()
        run.spine_steps.clear()
    reference: dict[int, list[list[int]]] = {}
    total = cfg.rounds * len(batches) * len(runs)
    done = 0
    for rnd in range(cfg.rounds):
        for bi, (ids, mask) in enumerate(batches):
            order = runs[rnd % len(runs):] + runs[: rnd % len(runs)]  # rotate who goes first
            if bi not in reference:  # target-only first in round 0: the equality reference
                order = [runs[0]] + [r for r in order if r is not runs[0]]
            order = _alternate(order, runs, (rnd * len(batches) + bi) % 2 == 1)
            base_tps = float("nan")
            batch_tps: dict[str, float] = {}
            for run in order:
                seed = trial_seed(cfg.seed, rnd, bi, len(batches))
                out = generate(run, ids, mask, cfg.max_new_tokens, seed)
                if run.k == 0:
                    reference.setdefault(bi, out.new_tokens)
                    base_tps = out.metrics.tokens_per_s
                elif greedy:
                    for got, want in zip(out.new_tokens, reference[bi], strict=True):
                        run.matched += prefix_match(got, want)
                        run.compared += len(want)
                        run.mismatched_rows += int(got != want)
                run.metrics.merge(out.metrics)
                m = out.metrics
                run.accepted_per_step.append(m.accepted_tokens / m.row_steps if m.row_steps
                                             else float("nan"))
                run.tokens_per_s.append(out.metrics.tokens_per_s)
                run.accepted_per_forward.append(  # one per trial, as the others
                    out.metrics.accepted_tokens / out.metrics.row_steps if out.metrics.row_steps
                    else float("nan"))
                batch_tps[run.name] = out.metrics.tokens_per_s
                done += 1
                say(f"[{done}/{total}] round {rnd + 1}/{cfg.rounds}, prompts batch "
                    f"{bi + 1}/{len(batches)}: {run.name}: {out.metrics.tokens_per_s:.1f} "
                    f"tokens/s, {out.metrics.steps} steps")
            for run in runs[1:]:
                run.speedups.append(batch_tps[run.name] / base_tps)
    return runs


def trial_seed(seed: int, rnd: int, batch: int, n_batches: int) -> int:
    """The seed of one trial (prompt batch ``batch`` in round ``rnd``): every trial its own,
    shared by the contenders of the trial (paired). Why not ``seed + round``: the prompts of a
    round then draw the same uniforms, their gains move together, and an interval over trials
    counts them as independent when they are not (measured: docs/decisions.md, "Pooling paired
    e2e runs over disjoint seeds"). A run covers ``[seed, seed + rounds x n_batches)``."""
    return seed + rnd * n_batches + batch


def _trial_batches(cfg: E2EConfig, n_batches: int) -> list[int]:
    """The prompt batch of each trial, in the order every run's per-trial lists hold them."""
    return [bi for _ in range(cfg.rounds) for bi in range(n_batches)]


def _report(cfg: E2EConfig, engines: Engines, runs: list[Contender],
            argv: list[str] | None) -> dict[str, Any]:
    greedy = cfg.greedy
    exact = greedy and cfg.dtype == "float32"
    results = [run.summary(greedy, runs[0].metrics.tokens_per_s) for run in runs]
    data: dict[str, Any] = {
        "command": "portable-verify " + " ".join(argv if argv is not None else sys.argv[1:]),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.as_dict(),
        "context": {
            "runtime": cfg.runtime,
            "torch": torch.__version__,
            "versions": environment.library_versions(),
            "machine": environment.machine(),
            "cpu_flags": cpu_flags(),
            "threads": cfg.threads or torch.get_num_threads(),
            "clock": cfg.clock,
            "load_average": _load_average(),
            "target": engines.target_label,
            "draft": engines.draft_label,
            "conversion_time_s": engines.conversion_s,
            "load_time_s": engines.load_s,
            "prompts": cfg.num_prompts,
            "note": "ratios come from interleaved runs in one process; tokens/s excludes "
                    "prefill; spread: one ratio per (round, prompt batch)",
        },
        "equality_checked": exact,
        "results": results,
        "num_batches": -(-cfg.num_prompts // cfg.batch),
        "trial_batches": _trial_batches(cfg, -(-cfg.num_prompts // cfg.batch)),
    }
    if cfg.dense:
        ours = {r["k"]: r for r in results if r["verifier"] == "verify"}
        dense = {r["k"]: r for r in results if r["verifier"] == "dense"}
        data["dense_comparison"] = [
            {"k": k, "tokens_per_s_verify": ours[k]["tokens_per_s"],
             "tokens_per_s_dense": dense[k]["tokens_per_s"],
             "ratio": ours[k]["tokens_per_s"] / dense[k]["tokens_per_s"],
             "verify_ms_per_step": 1e3 * ours[k]["verify_time_s"] / max(ours[k]["steps"], 1),
             "dense_ms_per_step": 1e3 * dense[k]["verify_time_s"] / max(dense[k]["steps"], 1)}
            for k in ours]
    if cfg.method == "block":
        data["block_comparison"] = [block_comparison(runs, k, mode, data["num_batches"])
                                    for k in cfg.ks for mode in cfg.draft_modes]
    if len(cfg.draft_modes) > 1:
        data["draft_mode_comparison"] = [draft_mode_comparison(runs, k, m) for k in cfg.ks
                                         for m in _chain_methods(cfg.method)]
    if cfg.trees:
        data["tree_comparison"] = tree_comparison(runs)
    if cfg.trees and cfg.method == "traversal":
        data["traversal_comparison"] = [
            traversal_comparison(runs, TreeShape.parse(t), data["num_batches"])
            for t in cfg.trees]
        data["tree_vs_chain_same_steps"] = [
            row for t in cfg.trees for row in spine_comparison(runs, TreeShape.parse(t),
                                                               data["num_batches"])]
    return data


def _by_round(values: list[float], per_round: int) -> dict[str, float | int | None] | None:
    """The interval over rounds (each round's trials averaged), or None
    when some trial had no step and the rounds cannot be told apart."""
    if len(values) % per_round:
        return None
    return mean_interval(round_means(values, per_round))


def block_comparison(runs: list[Contender], k: int, mode: str = "sampled",
                     per_round: int = 1) -> dict[str, Any]:
    """Block against token-wise rejection at draft length ``k`` with drafts of ``mode``: the
    gain in mean accepted drafts per step, paired over trials (whole runs) and over steps (same
    inputs), with 95% Student-t intervals over trials, and the tokens/s ratio per trial."""
    block, rej = (next(r for r in runs if r.k == k and r.method == m and r.verifier == "verify"
                       and r.draft_mode == mode) for m in PAIRED_METHODS)
    per_trial = [b - r for b, r in zip(block.accepted_per_step, rej.accepted_per_step,
                                       strict=True)]
    same_steps = [db + dr for db, dr in zip(block.same_step_diffs, rej.same_step_diffs,
                                            strict=True)]
    trial_gains = [statistics.fmean(d) for d in same_steps if d]
    return {
        "k": k,
        "draft_mode": mode,
        "trials": len(per_trial),
        "accepted_per_step_block": block.metrics.accepted_tokens / max(block.metrics.row_steps, 1),
        "accepted_per_step_rejection": rej.metrics.accepted_tokens / max(rej.metrics.row_steps, 1),
        "gain_runs": mean_interval(per_trial),
        "gain_same_steps": mean_interval(trial_gains),
        "gain_same_steps_by_round": _by_round(trial_gains, per_round),
        "same_step_row_steps": sum(len(d) for d in same_steps),
        "same_step_positive": sum(x > 0 for d in same_steps for x in d),
        "same_step_negative": sum(x < 0 for d in same_steps for x in d),
        "per_trial": per_trial_data(trial_gains, per_trial, [len(d) for d in same_steps if d],
                                    [sum(x > 0 for x in d) for d in same_steps if d],
                                    [sum(x < 0 for x in d) for d in same_steps if d]),
        "tokens_per_s_block": block.metrics.tokens_per_s,
        "tokens_per_s_rejection": rej.metrics.tokens_per_s,
        "tokens_per_s_ratio": spread([b / r for b, r in zip(block.tokens_per_s, rej.tokens_per_s,
                                                          strict=True)]),
    }



def draft_mode_comparison(runs: list[Contender], k: int, method: str) -> dict[str, Any]:
    """Sampled against argmax drafts for ``method`` at draft length ``k``, on the same prompts
    and seeds: tokens per target forward and tokens/s, each as a per-trial paired difference
    (sampled - argmax) or ratio with its 95% Student-t interval over trials. No same-step
    pairing: the two modes propose different drafts, so they never share a step's inputs."""
    sampled, argmax = (next(r for r in runs if r.k == k and r.method == method
                            and r.verifier == "verify" and r.draft_mode == m)
                       for m in ("sampled", "argmax"))
    apf = [a - b for a, b in zip(sampled.accepted_per_forward, argmax.accepted_per_forward,
                                 strict=True)]
    tps = [a / b for a, b in zip(sampled.tokens_per_s, argmax.tokens_per_s, strict=True) if b]
    return {
        "k": k,
        "method": method,
        "trials": len(apf),
        "tokens_per_target_forward_sampled": _per_target_forward(sampled),
        "tokens_per_target_forward_argmax": _per_target_forward(argmax),
        "tokens_per_s_sampled": sampled.metrics.tokens_per_s,
        "tokens_per_s_argmax": argmax.metrics.tokens_per_s,
        "accepted_per_forward_difference": mean_interval(apf),
        "tokens_per_s_ratio": mean_interval(tps),
    }


def _trial_means(pairs: list[tuple[list[int], list[int]]]) -> tuple[list[float], list[float]]:
    """Per trial, the mean accepted drafts per step of each rule over that trial's steps."""
    kept = [(a, b) for a, b in pairs if a]
    return [statistics.fmean(a) for a, _ in kept], [statistics.fmean(b) for _, b in kept]


def traversal_comparison(runs: list[Contender], shape: TreeShape,
                         per_round: int = 1) -> dict[str, Any]:
    """Traversal against the token-level tree rule on tree ``shape``: accepted drafts per target
    forward of each on the same steps (both runs' steps, each judged by both rules), the paired
    difference with its 95% Student-t interval over trials, and the whole-run comparison."""
    trav, tok = (next(r for r in runs if r.tree == shape and r.method == m)
                 for m in TREE_PAIRED_METHODS)
    trials = [(a + c, b + d) for (a, b), (c, d) in zip(trav.same_step_accepted,
                                                      tok.same_step_accepted, strict=True)]
    first = [x for a, _ in trials for x in a]
    second = [x for _, b in trials for x in b]
    mean_first, mean_second = _trial_means(trials)
    diff = mean_interval([a - b for a, b in zip(mean_first, mean_second, strict=True)])
    base = statistics.fmean(second) if second else float("nan")
    runs_diff = [a - b for a, b in zip(trav.accepted_per_step, tok.accepted_per_step,
                                       strict=True)]
    return {
        "tree": shape.label,
        "trials": len(mean_first),
        "same_step_row_steps": len(first),
        "accepted_per_forward_traversal": statistics.fmean(first) if first else None,
        "accepted_per_forward_token_level": base if second else None,
        "gain_same_steps": diff,
        "gain_same_steps_by_round": _by_round(
            [a - b for a, b in zip(mean_first, mean_second, strict=True)], per_round),
        "gain_same_steps_relative": _relative(diff, base),
        "same_step_positive": sum(a > b for a, b in zip(first, second, strict=True)),
        "same_step_negative": sum(a < b for a, b in zip(first, second, strict=True)),
        "per_trial": per_trial_data(
            [a - b for a, b in zip(mean_first, mean_second, strict=True)], runs_diff,
            [len(a) for a, _ in trials if a],
            [sum(x > y for x, y in zip(a, b, strict=True)) for a, b in trials if a],
            [sum(x < y for x, y in zip(a, b, strict=True)) for a, b in trials if a]),
        "accepted_per_forward_runs_traversal": trav.metrics.accepted_tokens
        / max(trav.metrics.row_steps, 1),
        "accepted_per_forward_runs_token_level": tok.metrics.accepted_tokens
        / max(tok.metrics.row_steps, 1),
        "gain_runs": mean_interval(runs_diff),
        "tokens_per_s_traversal": trav.metrics.tokens_per_s,
        "tokens_per_s_token_level": tok.metrics.tokens_per_s,
        "tokens_per_s_ratio": spread([a / b for a, b in zip(trav.tokens_per_s, tok.tokens_per_s,
                                                          strict=True) if b]),
    }


def spine_comparison(runs: list[Contender], shape: TreeShape,
                     per_round: int = 1) -> list[dict[str, Any]]:
    """Each tree rule on tree ``shape`` against the chain rules on its spine, on the same steps
    (both tree runs' steps, trial by trial; :func:`paired.tree_vs_chain`). Empty when the
    tree's spine is not a chain draft (greedy, argmax trees, other drafters)."""
    out = []
    for drafter in dict.fromkeys(r.drafter for r in runs if r.tree == shape):
        for mode in dict.fromkeys(r.draft_mode for r in runs if r.tree == shape):
            pair = [r for r in runs if r.tree == shape and r.drafter == drafter
                    and r.draft_mode == mode and r.spine_steps]
            if len(pair) != len(TREE_PAIRED_METHODS):
                continue
            trials = [{k: a.get(k, []) + b.get(k, []) for k in a.keys() | b.keys()}
                      for a, b in zip(*(r.spine_steps for r in pair), strict=True)]
            for row in tree_vs_chain(trials, shape.label, per_round):
                out.append({**row, "drafter": drafter, "draft_mode": mode})
    return out


def _relative(diff: dict[str, Any], base: float) -> dict[str, float | None] | None:
    """The difference and its interval as fractions of the baseline's pooled mean (the
    baseline taken as fixed: a reading aid, not a ratio estimator's own interval)."""
    if not base or base != base:
        return None
    return {k: None if diff[k] is None else diff[k] / base for k in ("mean", "low", "high")}


def tree_comparison(runs: list[Contender]) -> list[dict[str, Any]]:
    """Each tree against the chain scoring as many nodes (``k = nodes``): accepted drafts per
    target forward and tokens/s, as one ratio per (round, prompt batch) with its spread, and
    the paired difference (tree - chain per trial) with its 95% Student-t interval."""
    chains = {(r.k, r.draft_mode): r for r in runs if r.verifier == "verify"}
    rows = []
    for tree in (r for r in runs if r.tree is not None):
        chain = chains.get((tree.tree.nodes, tree.draft_mode))  # type: ignore[union-attr]
        if chain is None:
            continue
        apf = [t / c for t, c in zip(tree.accepted_per_forward, chain.accepted_per_forward,
                                     strict=True) if c > 0]
        tps = [t / c for t, c in zip(tree.tokens_per_s, chain.tokens_per_s, strict=True)]
        gain = [t - c for t, c in zip(tree.accepted_per_forward, chain.accepted_per_forward,
                                      strict=True)]
        t_apf = tree.metrics.accepted_tokens / max(tree.metrics.row_steps, 1)
        c_apf = chain.metrics.accepted_tokens / max(chain.metrics.row_steps, 1)
        rows.append({"tree": tree.name, "chain": chain.name,
                     "scored_nodes": tree.tree.nodes + 1,  # type: ignore[union-attr]
                     "accepted_per_forward_tree": t_apf, "accepted_per_forward_chain": c_apf,
                     "accepted_per_forward_gain": _ratio(t_apf, c_apf),
                     "accepted_per_forward_gain_spread": spread(apf),
                     "accepted_per_forward_difference": mean_interval(gain),
                     "tokens_per_s_ratio": _ratio(tree.metrics.tokens_per_s,
                                                  chain.metrics.tokens_per_s),
                     "tokens_per_s_ratio_spread": spread(tps)})
    return rows


def mismatches(data: dict[str, Any]) -> list[str]:
    """One line per configuration whose greedy output differs from target-only decoding."""
    return [f"{r['name']}: {r['greedy_mismatched_rows']} row(s) differ from target-only greedy "
            f"decoding (match rate {r['greedy_match_rate']:.1%})"
            for r in data["results"] if data["equality_checked"] and r.get("greedy_equal") is False]
