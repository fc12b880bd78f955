"""What a draft forward over a tree's frontier costs on the OpenVINO runtime.

Why: the dynamic tree drafter (EAGLE-2's expansion) feeds ``F`` frontier nodes per depth in one
draft forward and needs every one's logits; a chain feeds one token and needs one row. Whether
a wider frontier pays depends on how flat that forward is, and two parts of it scale
differently: the transformer body (weights read once for all positions) and the output head
(one ``hidden x vocabulary`` product per logits row). This times a forward of ``S = 1..4`` new
tokens after ``CONTEXT`` cached ones with every row's logits (a frontier) and with the last
row's only (the body alone, plus one head row), as ratios to the one-token forward.

    python scripts/bench/ov_draft_frontier.py [--model default] [--weights int4] \\
        [--threads 1] [--repetitions 9]

``--model``: ``default`` (the packaged SmolLM2) or a model folder (e.g. the Qwen pair's 0.5B
draft); ``--weights``: the draft's format (``f32``, ``int8``, ``int4``). Process CPU time (one
thread: waiting for a core on a shared machine is left out); medians over repetitions, the
sizes in a rotated order each repetition, a fresh cache per repetition, the dead slots each
forward leaves never compacted (a compaction makes the next forward re-read the state).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from portable_verify.e2e import openvino_model
from portable_verify.e2e.tree_loop import cache_mark, keep_slots
from portable_verify.integrations import models

CONTEXT = 100
SIZES = (1, 2, 3, 4)


def _time_one(model: openvino_model.OpenVINOCausalLM, cache: openvino_model.SlotCache, s: int,
              last_only: bool, g: torch.Generator) -> float:
    """CPU seconds of one forward of ``s`` new tokens; its slots are dropped (left dead)."""
    ids = torch.randint(0, 1000, (1, s), generator=g)
    mark = cache_mark(cache)
    pos = torch.arange(CONTEXT + 1, CONTEXT + 1 + s)[None]
    t0 = time.process_time()
    model.tree_logits(ids, cache, pos, mark, torch.ones(1, s, s, dtype=torch.bool), last_only)
    elapsed = time.process_time() - t0
    keep_slots(cache, mark, torch.full((1, 1), -1))
    return elapsed


def measure(model: openvino_model.OpenVINOCausalLM, repetitions: int) -> dict[str, float]:
    """Median ratio to the one-token forward of each (size, logits rows) contender."""
    combos = [(s, last) for s in SIZES for last in (False, True) if s > 1 or not last]
    times: dict[tuple[int, bool], list[float]] = {c: [] for c in combos}
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 1000, (1, CONTEXT), generator=g)
    for rep in range(repetitions + 1):  # repetition 0 warms up and is not kept
        cache = model.new_cache()
        model.prefill(prompt, cache, torch.arange(CONTEXT)[None], None)
        model.logits(torch.tensor([[7]]), cache, torch.tensor([[CONTEXT]]), None, True)
        shift = rep % len(combos)
        for s, last in combos[shift:] + combos[:shift]:
            elapsed = _time_one(model, cache, s, last, g)
            if rep:
                times[(s, last)].append(elapsed)
    one = statistics.median(times[(1, False)])
    out = {"one_token_ms": one * 1e3}
    for (s, last), ts in times.items():
        if s > 1:
            out[f"S={s} {'last row' if last else 'all rows'}"] = statistics.median(ts) / one
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--weights", choices=openvino_model.WEIGHT_FORMATS, default="int4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    src, local = models.resolve(args.model)
    xml = openvino_model.export(src, local, args.weights)
    model = openvino_model.OpenVINOCausalLM(xml, args.threads, exact_kv=args.weights == "f32",
                                            max_dead_slots=1 << 30)
    result = measure(model, args.repetitions)
    print(json.dumps({"model": args.model, "weights": args.weights, **{
        k: round(v, 3) for k, v in result.items()}}, indent=1))


if __name__ == "__main__":
    main()
