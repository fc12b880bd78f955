"""Opt-in: mean accepted tokens per step inside vLLM, by method, through vLLM's own counters.

Not in CI: 5 engine starts and 40 batches of 8 requests x 48 tokens, 20-40 minutes on a
2-core machine. Run ``PYTHONPATH=$PWD python scripts/vllm_acceptance.py [--json FILE]``;
docs/integrations.md ("In-engine acceptance") holds its last output. With ``--json`` the file
is rewritten after every engine start, so a run stopped early keeps its finished trials.

Set-up: the default target (SmolLM2-135M, float32) with its truncated 20-layer draft, k=2, the
draft sampling its drafts (``draft_sample_method: probabilistic``, so draft probabilities reach
the sampler), 8 prompts at T=0.8 with per-request seeds. Engines alternate ABBA (rejection,
block, block, rejection; block only where this build has it), then typical once. A trial is one
batch; batch ``j`` of every start uses the same seeds, so trials pair across methods. Mean
accepted tokens per step = accepted / drafts (vLLM's ``spec_decode_num_accepted_tokens`` over
``spec_decode_num_drafts``; vLLM's mean acceptance length is 1 + that). The block - rejection
gain is reported with a 95% t-interval over the paired trials.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from typing import Any

from portable_verify.core.types import METHODS
from portable_verify.integrations import models
from portable_verify.integrations.vllm_v1 import engine, plugin
from portable_verify.integrations.vllm_v1.engine import DEFAULT_PROMPTS, EngineConfig

BATCHES = 8
MAX_TOKENS = 48
TEMPERATURE = 0.8


def _batches(batches: int, max_tokens: int) -> dict[str, tuple[list[str], Any]]:
    from vllm import SamplingParams

    return {f"batch{j}": (DEFAULT_PROMPTS,
                          [SamplingParams(temperature=TEMPERATURE, seed=1000 * j + i,
                                          max_tokens=max_tokens)
                           for i in range(len(DEFAULT_PROMPTS))]) for j in range(batches)}


def _per_step(counters: dict[str, int]) -> float:
    return counters["num_accepted_tokens"] / counters["num_drafts"]


def _t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% two-sided t-interval (scipy's t quantile)."""
    from scipy import stats

    mean = statistics.fmean(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _machine() -> dict[str, Any]:
    """What the figures were measured on (vLLM's workers bind their own OpenMP threads)."""
    import torch
    import vllm

    with open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cpu_count": os.cpu_count(), "vllm": vllm.__version__,
            "torch": torch.__version__, "load_average": os.getloadavg(),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}


def _report(trials: dict[str, list[dict[str, Any]]], order: list[str], args: Any,
            spec: dict[str, Any]) -> dict[str, Any]:
    """Every figure so far: per method totals and trials, and the paired block gain."""
    report: dict[str, Any] = {"order": order, "batches_per_start": args.batches,
                              "requests_per_batch": len(DEFAULT_PROMPTS),
                              "max_tokens": args.max_tokens, "temperature": TEMPERATURE,
                              "speculative_config": {**spec, "model": "<first 20 layers>"},
                              "machine": _machine(), "methods": {}}
    for method, rows in trials.items():
        drafts = sum(r["counters"]["num_drafts"] for r in rows)
        accepted = sum(r["counters"]["num_accepted_tokens"] for r in rows)
        report["methods"][method] = {"trials": len(rows), "drafts": drafts,
                                     "accepted": accepted,
                                     "accepted_per_step": accepted / drafts if drafts else None,
                                     "per_trial": [r["accepted_per_step"] for r in rows]}
    # ABBA: block start 1 pairs with rejection start 0, block start 2 with rejection start 3.
    pairs = list(zip(trials.get("block", []), trials["rejection"], strict=False))
    if len(pairs) >= 2:
        gains = [b["accepted_per_step"] - r["accepted_per_step"] for b, r in pairs]
        mean, low, high = _t_interval(gains)
        report["block_minus_rejection"] = {"paired_trials": len(gains), "mean": mean,
                                           "ci95": [low, high], "per_trial": gains}
    return report


def _write(path: str, report: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--batches", type=int, default=BATCHES, help="trials per engine start")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--no-typical", action="store_true",
                        help="only the ABBA rejection/block starts (more paired trials)")
    args = parser.parse_args(argv)
    problem = engine.vllm_missing_reason()
    if problem:
        print(f"skipped: {problem}")
        return 0
    target = models.converted_default_dir()
    draft = engine.layer_skip_draft_dir(target, engine.DRAFT_LAYERS, models.cache_dir())
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2,
            "draft_sample_method": "probabilistic"}
    pair = ["rejection", "block"] if "block" in METHODS else ["rejection"]
    order = [*pair, *reversed(pair), *([] if args.no_typical else ["typical"])]
    trials: dict[str, list[dict[str, Any]]] = {m: [] for m in dict.fromkeys(order)}
    for start, method in enumerate(order):
        config = EngineConfig(f"draft+{method}", spec, "sampler",
                              environment={plugin.ENV_METHOD: method})
        gens, state = engine.run_engine(target, config,
                                        _batches(args.batches, args.max_tokens))
        assert state.get("method") == method and state["calls_with_draft_probs"] > 0, state
        for name, gen in gens.items():
            trials[method].append({"start": start, "batch": name, "counters": gen.counters,
                                   "accepted_per_step": _per_step(gen.counters),
                                   "tokens": gen.num_tokens})
        print(f"start {start} ({method}): "
              + ", ".join(f"{t['accepted_per_step']:.3f}" for t in trials[method][-args.batches:]),
              flush=True)
        report = _report(trials, order, args, spec)
        if args.json:
            _write(args.json, report)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
