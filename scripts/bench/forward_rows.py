"""Cost of one model forward against the number of new tokens, torch vs OpenVINO, on CPU.

Why: speculative decoding scores ``k+1`` tokens per target forward; it can only win if that
forward costs little more than a one-token forward. This measures it for the e2e default model
(SmolLM2-135M, float32) in both runtimes, after a 100-token prefill, as docs/e2e.md quotes.

    python scripts/bench/forward_rows.py [--threads 1] [--repetitions 12]

Times are the process's CPU time (one thread: the time waiting for a core on a shared machine is
left out) and wall time; medians over repetitions, contenders interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from portable_verify.e2e import openvino_model
from portable_verify.integrations import hf, models

ROWS = (1, 2, 3, 5, 8)
CONTEXT = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder, local = models.resolve("default")
    runtimes = {
        "openvino": openvino_model.OpenVINOCausalLM(
            openvino_model.export(folder, local, "f32"), args.threads),
        "torch": hf.as_step_model(models.load_model(folder)),
    }
    caches = {}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, model in runtimes.items():
            caches[name] = model.new_cache()
            model.prefill(torch.randint(0, 1000, (1, CONTEXT), generator=g), caches[name],
                          torch.arange(CONTEXT)[None], None)
        cpu: dict[tuple[str, int], list[float]] = {}
        wall: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repetitions):
            for s in ROWS:
                for name, model in runtimes.items():
                    ids = torch.randint(0, 1000, (1, s), generator=g)
                    c0, w0 = time.process_time(), time.perf_counter()
                    model.logits(ids, caches[name], torch.arange(CONTEXT, CONTEXT + s)[None],
                                 None)
                    wall.setdefault((name, s), []).append(time.perf_counter() - w0)
                    cpu.setdefault((name, s), []).append(time.process_time() - c0)
                    caches[name].crop(-s)
    rows = []
    for name in runtimes:
        one = statistics.median(cpu[(name, 1)])
        for s in ROWS:
            c = cpu[(name, s)]
            row = {"runtime": name, "new_tokens": s, "cpu_ms": 1e3 * statistics.median(c),
                   "cpu_min_ms": 1e3 * min(c), "cpu_max_ms": 1e3 * max(c),
                   "wall_ms": 1e3 * statistics.median(wall[(name, s)]),
                   "x_one_token": statistics.median(c) / one}
            rows.append(row)
            print(f"{name:>9} {s} new tokens: CPU {row['cpu_ms']:6.1f} ms "
                  f"({row['cpu_min_ms']:.1f}-{row['cpu_max_ms']:.1f}), "
                  f"{row['x_one_token']:.2f}x one token; wall {row['wall_ms']:.1f} ms",
                  flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
