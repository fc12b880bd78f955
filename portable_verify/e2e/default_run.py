"""The command a new user runs first: greedy and T = 0.8 on one load, best chain vs target-only.

Why both: greedy shows the speed-up with output checked token for token against target-only
decoding; T = 0.8 (token-wise rejection, sampled drafts) shows what sampling keeps of it. The
models load (and convert, once) a single time for both halves, so the one-time conversion is
reported apart from every timed figure.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from portable_verify.e2e.config import SAMPLED_TEMPERATURE, E2EConfig
from portable_verify.e2e.paired import mean_interval
from portable_verify.e2e.runner import Progress, run_e2e
from portable_verify.e2e.runtimes import load_engines

TREES_NOT_RUN = "trees are not in this run (--tree SHAPES adds them; the default run has them " \
    "on the openvino runtime)"


def run_default(cfg: E2EConfig, progress: Progress | None = None,
                argv: list[str] | None = None) -> dict[str, Any]:
    """``cfg`` greedy, then the same budgets under rejection at :data:`SAMPLED_TEMPERATURE`.

    Returns the greedy run's data (the shape every ``e2e`` run has) with ``sampled_run`` (the
    second run's data) and ``headline``: per half, the best chain against target-only.
    """
    say = progress or (lambda line: None)
    previous_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        engines = load_engines(cfg, say)
    finally:
        torch.set_num_threads(previous_threads)
    greedy_cfg = dataclasses.replace(cfg, method="greedy")
    sampled_cfg = dataclasses.replace(cfg, method="rejection", temperature=SAMPLED_TEMPERATURE)
    say("greedy half")
    data = run_e2e(greedy_cfg, progress, argv, engines)
    say(f"sampled half: rejection at temperature {SAMPLED_TEMPERATURE}")
    sampled = run_e2e(sampled_cfg, progress, argv, engines)
    data["sampled_run"] = sampled
    data["headline"] = [best_chain(data, "greedy"), best_chain(sampled, f"T={SAMPLED_TEMPERATURE}")]
    data["tree_headline"] = [best_tree(data, "greedy"), best_tree(sampled,
                                                                  f"T={SAMPLED_TEMPERATURE}")]
    data["trees"] = TREES_NOT_RUN if not cfg.trees else None
    return data


def _best(data: dict[str, Any], trees: bool) -> dict[str, Any] | None:
    runs = [r for r in data["results"] if r["k"] and bool(r.get("tree")) == trees
            and r.get("speedup_vs_target_only")]
    return max(runs, key=lambda r: r["speedup_vs_target_only"]) if runs else None


def best_tree(data: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The best tree against the best chain: per-trial tokens/s ratio (mean, 95% interval),
    accepted tokens per target forward of each, and the tree's ceiling (tokens per forward if
    every scored node on its deepest path were accepted: depth + 1). Both are chosen and
    reported on the same trials, so the interval is optimistic (``--sweep`` holds prompts
    out)."""
    tree, chain = _best(data, True), _best(data, False)
    if tree is None or chain is None:
        return None
    ratios = [t / c for t, c in zip(tree["per_trial"]["tokens_per_s"],
                                    chain["per_trial"]["tokens_per_s"], strict=True) if c > 0]
    depth = int(tree["k"])
    return {"run": label, "tree": tree["name"], "chain": chain["name"],
            "tokens_per_s_ratio": mean_interval(ratios),
            "tree_speedup": tree["speedup_vs_target_only"],
            "chain_speedup": chain["speedup_vs_target_only"],
            "tokens_per_target_forward_tree": tree["tokens_per_target_forward"],
            "tokens_per_target_forward_chain": chain["tokens_per_target_forward"],
            "tree_ceiling": depth + 1, "chain_ceiling": int(chain["k"]) + 1}


def best_chain(data: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The chain with the highest whole-run speed-up over target-only, with its per-trial
    ratios' mean and 95% interval (chosen and reported on the same trials: no held-out
    prompts here, which ``--sweep`` adds)."""
    chains = [r for r in data["results"] if r["k"] and not r.get("tree")
              and r.get("speedup_vs_target_only")]
    if not chains:
        return None
    best = max(chains, key=lambda r: r["speedup_vs_target_only"])
    return {"run": label, "best": best["name"], "speedup": best["speedup_vs_target_only"],
            "per_trial": mean_interval(best["per_trial"]["speedup"]),
            "tokens_per_target_forward": best["tokens_per_target_forward"],
            "tokens_per_s": best["tokens_per_s"],
            "target_only_tokens_per_s": data["results"][0]["tokens_per_s"]}
