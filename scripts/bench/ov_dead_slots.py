"""What dead cache slots cost the OpenVINO runtime, and compaction against a restart.

Why: on the OpenVINO runtime a tree step's rejected nodes stay in the stateful KV cache as dead
slots the attention mask hides (about ``nodes - accepted`` per step). They cost attention work
in every later forward until the cache is compacted (each layer's state read, each row's live
slots gathered, written back) or restarted (the state reset and the live context prefilled
again). This measures, on the e2e default model (SmolLM2-135M, float32 target):

* the target forward (1 and 5 new tokens, the latter a ``2x4`` tree's) after ``CONTEXT`` live
  slots with 0, 64 and 256 dead ones, as ratios to the same forward with none;
* ``SlotCache.compact()`` against a restart (a fresh cache prefilled with the live context)
  for a state of ``L`` live and ``L`` dead slots (the default bound's trigger point).

    python scripts/bench/ov_dead_slots.py [--threads 1] [--repetitions 9]

Process CPU time (one thread: waiting for a core on a shared machine is left out); medians over
repetitions, contenders interleaved (the order rotated each repetition); every cache is built
afresh, untimed, before its timed call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from portable_verify.e2e import openvino_model
from portable_verify.e2e.openvino_model import OpenVINOCausalLM, SlotCache
from portable_verify.integrations import models

CONTEXT = 128
DEAD = (0, 64, 256)
NEW = (1, 5)
LIVE = (128, 384)


def _cache(model: OpenVINOCausalLM, live: int, dead: int, g: torch.Generator) -> SlotCache:
    """``live`` context slots, then ``dead`` slots appended and dropped."""
    cache = model.new_cache()
    model.prefill(torch.randint(0, 1000, (1, live), generator=g), cache,
                  torch.arange(live)[None], None)
    if dead:
        mark = cache.mark()
        model.prefill(torch.randint(0, 1000, (1, dead), generator=g), cache,
                      torch.arange(live, live + dead)[None], None)
        cache.keep(mark, np.zeros((1, 0), np.int64))
    return cache


def _timed(fn: Callable[[], object]) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder, local = models.resolve("default")
    model = OpenVINOCausalLM(openvino_model.export(folder, local, "f32"), args.threads,
                             max_dead_slots=1 << 30)  # no automatic compaction here
    g = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {}
    cells = [("forward", s, d) for s in NEW for d in DEAD] + \
        [(kind, 0, live) for live in LIVE for kind in ("compact", "restart")]
    with torch.inference_mode():
        for rep in range(args.repetitions + 1):  # the first repetition warms up, untimed
            for kind, s, n in cells[rep % len(cells):] + cells[: rep % len(cells)]:
                if kind == "forward":
                    cache = _cache(model, CONTEXT, n, g)
                    ids = torch.randint(0, 1000, (1, s), generator=g)
                    pos = torch.arange(CONTEXT, CONTEXT + s)[None]
                    t = _timed(lambda c=cache, i=ids, p=pos: model.logits(i, c, p, None))
                    key = f"forward new={s} dead={n}"
                elif kind == "compact":
                    cache = _cache(model, n, n, g)
                    t = _timed(cache.compact)
                    key = f"compact live={n} dead={n}"
                else:
                    ids = torch.randint(0, 1000, (1, n), generator=g)

                    def restart(i: torch.Tensor = ids, m: int = n) -> None:
                        model.prefill(i, model.new_cache(), torch.arange(m)[None], None)
                    t = _timed(restart)
                    key = f"restart live={n}"
                if rep:
                    times.setdefault(key, []).append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for s in NEW:
        base = med[f"forward new={s} dead=0"]
        for d in DEAD:
            key = f"forward new={s} dead={d}"
            rows.append({"cell": key, "median_ms": 1e3 * med[key], "ratio": med[key] / base})
    for live in LIVE:
        c, r = med[f"compact live={live} dead={live}"], med[f"restart live={live}"]
        rows.append({"cell": f"compact vs restart, live={live} dead={live}",
                     "compact_ms": 1e3 * c, "restart_ms": 1e3 * r, "ratio": c / r})
    print(json.dumps({"threads": args.threads, "repetitions": args.repetitions,
                      "context": CONTEXT, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
