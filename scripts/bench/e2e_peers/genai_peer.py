"""OpenVINO GenAI's speculative decoding pipeline beside its plain pipeline, on fixed token ids.

Runs inside the environment that ``openvino_genai.sh`` builds (openvino-genai, optimum-intel:
their transformers pin excludes the main environment's), on models exported in optimum-intel's
layout. The prompts arrive as token ids made by ``portable_verify.e2e.runner.prompt_batches``
in the main environment, so both sides decode exactly the same inputs.

The two pipelines are never resident together (a 1.5B float32 target twice does not fit next
to other work), so they alternate per round in ABBA order: plain, speculative, speculative,
plain, ... Tokens/s excludes the first token (GenAI's TPOT, wall clock), as ``e2e`` excludes
prefill; ``cpu_clock`` gives the same from the process's CPU time (``e2e --clock cpu``'s
counterpart), counted from the moment a streamer receives the first new token.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def _properties(threads: int) -> dict[str, Any]:
    # f32 everywhere: the CPU plugin would otherwise pick bf16 (on CPUs that have it) and a
    # quantised KV cache, and greedy output could then differ from float32 decoding.
    props: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    if threads:
        props["INFERENCE_NUM_THREADS"] = threads
    return props


def _pipeline(target: str, draft: str | None, threads: int) -> Any:
    props = _properties(threads)
    if draft is None:
        return ov_genai.LLMPipeline(target, "CPU", **props)
    return ov_genai.LLMPipeline(target, "CPU", draft_model=ov_genai.draft_model(
        draft, "CPU", **props), **props)


def _config(max_new_tokens: int, k: int | None) -> Any:
    cfg = ov_genai.GenerationConfig()
    cfg.max_new_tokens = max_new_tokens
    cfg.do_sample = False
    if k is not None:
        cfg.num_assistant_tokens = k
    return cfg


class _FirstTokenClock(ov_genai.StreamerBase):
    """Notes the process CPU time when the first new token is streamed (prefill done)."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: float | None = None

    def write(self, token: Any) -> Any:
        if self.cpu is None:
            self.cpu = time.process_time()
        return ov_genai.StreamingStatus.RUNNING

    def end(self) -> None:
        pass


def _one(pipe: Any, ids: list[int], cfg: Any) -> dict[str, Any]:
    tensor = ov.Tensor(np.array([ids], dtype=np.int64))
    mask = ov.Tensor(np.ones((1, len(ids)), dtype=np.int64))
    clock = _FirstTokenClock()
    c0, t0 = time.process_time(), time.perf_counter()
    res = pipe.generate(ov_genai.TokenizedInputs(tensor, mask), cfg, streamer=clock)
    wall, c1 = time.perf_counter() - t0, time.process_time()
    pm = res.perf_metrics
    tokens = [int(t) for t in res.tokens[0]]
    tpot_ms = pm.get_tpot().mean
    decode_cpu = c1 - (clock.cpu if clock.cpu is not None else c1)
    out: dict[str, Any] = {"tokens": tokens, "wall_s": wall, "cpu_s": c1 - c0,
                           "decode_cpu_s": decode_cpu, "ttft_ms": pm.get_ttft().mean,
                           "tpot_ms": tpot_ms,
                           "tokens_per_s": 1e3 / tpot_ms if tpot_ms > 0 else None,
                           "cpu_tokens_per_s": (len(tokens) - 1) / decode_cpu
                           if decode_cpu > 0 else None}
    extended = getattr(res, "extended_perf_metrics", None)
    if extended is not None:
        for name in ("get_num_accepted_tokens", "get_acceptance_rate"):
            fn = getattr(extended, name, None)
            if fn is not None:
                try:
                    value = fn()
                    out[name[4:]] = getattr(value, "mean", value)
                except Exception as exc:  # metric names vary across GenAI releases
                    out[name[4:]] = f"unavailable: {exc}"
    return out


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="optimum-intel export of the target")
    p.add_argument("--draft", required=True, help="optimum-intel export of the draft")
    p.add_argument("--prompts", required=True, help="JSON file: list of token-id lists")
    p.add_argument("--k", type=int, default=3, help="num_assistant_tokens (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (default 2)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    with open(args.prompts, encoding="utf-8") as f:
        prompts: list[list[int]] = json.load(f)

    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "speculative": []}
    load_s: dict[str, list[float]] = {"plain": [], "speculative": []}
    order = []
    for r in range(args.rounds):
        pair = ["plain", "speculative"]
        order += pair if r % 2 == 0 else pair[::-1]
    warmed: set[str] = set()
    for i, name in enumerate(order):
        t0 = time.perf_counter()
        pipe = _pipeline(args.target, args.draft if name == "speculative" else None,
                         args.threads)
        load_s[name].append(time.perf_counter() - t0)
        cfg = _config(args.max_new_tokens, args.k if name == "speculative" else None)
        if name not in warmed:  # first use: lazy compilation, allocator growth
            _one(pipe, prompts[0], _config(4, cfg.num_assistant_tokens
                                           if name == "speculative" else None))
            warmed.add(name)
        for pi, ids in enumerate(prompts):
            result = _one(pipe, ids, cfg)
            result.update(prompt=pi, slot=i)
            runs[name].append(result)
            print(f"genai: {name} prompt {pi}: {result['tokens_per_s']:.2f} tokens/s "
                  f"({len(result['tokens'])} tokens)", file=sys.stderr, flush=True)
        del pipe
        gc.collect()

    plain = {(r["slot"], r["prompt"]): r for r in runs["plain"]}
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    matched, compared, equal_rows = 0, 0, 0
    for s in runs["speculative"]:
        # Pair each speculative run with the plain run of the same prompt in the adjacent slot.
        partner = [v for (slot, pi), v in plain.items()
                   if pi == s["prompt"] and abs(slot - s["slot"]) == 1]
        if partner and s["tokens_per_s"] and partner[0]["tokens_per_s"]:
            ratios.append(s["tokens_per_s"] / partner[0]["tokens_per_s"])
        if partner and s["cpu_tokens_per_s"] and partner[0]["cpu_tokens_per_s"]:
            cpu_ratios.append(s["cpu_tokens_per_s"] / partner[0]["cpu_tokens_per_s"])
        ref = next(v for v in runs["plain"] if v["prompt"] == s["prompt"])["tokens"]
        matched += _prefix(s["tokens"], ref)
        compared += len(ref)
        equal_rows += int(s["tokens"] == ref)

    def tps(name: str) -> float:
        toks = sum(len(r["tokens"]) - 1 for r in runs[name])
        secs = sum(r["tpot_ms"] * (len(r["tokens"]) - 1) for r in runs[name]) / 1e3
        return toks / secs if secs else float("nan")

    def cpu_tps(name: str) -> float:
        toks = sum(len(r["tokens"]) - 1 for r in runs[name])
        secs = sum(r["decode_cpu_s"] for r in runs[name])
        return toks / secs if secs > 0 else float("nan")

    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"min": min(values), "median": statistics.median(values), "max": max(values),
                "n": len(values)}

    summary = {
        "peer": "openvino_genai",
        "versions": {"openvino": ov.get_version(), "openvino_genai": ov_genai.__version__},
        "config": {"k": args.k, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                   "threads": args.threads, "prompts": len(prompts), "greedy": True,
                   "properties": _properties(args.threads), "order": order},
        "plain_tokens_per_s": tps("plain"),
        "speculative_tokens_per_s": tps("speculative"),
        "speedup": tps("speculative") / tps("plain"),
        "speedup_spread": spread(ratios),
        "cpu_clock": {"plain_tokens_per_s": cpu_tps("plain"),
                      "speculative_tokens_per_s": cpu_tps("speculative"),
                      "speedup": cpu_tps("speculative") / cpu_tps("plain"),
                      "speedup_spread": spread(cpu_ratios)},
        "speculative_equal_rows": equal_rows,
        "speculative_rows": len(runs["speculative"]),
        "speculative_match_rate": matched / compared if compared else None,
        "load_s": load_s,
        "runs": runs,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
