"""Cost of one linear layer against the number of rows (new tokens), torch vs OpenVINO, on CPU.

Why: speculative decoding pays off only if scoring ``k+1`` tokens costs little more than one;
this measures that property for the runtime's matmul alone (docs/e2e.md quotes it).

    python scripts/bench/linear_rows.py [--threads 1] [--shape OUT,IN ...]

Both contenders run interleaved through the benchmark harness (medians with min/max), float32,
the OpenVINO model compiled with an explicit f32 inference precision.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import torch

from portable_verify.bench.harness import measure

ROWS = (1, 2, 3, 5, 8)


def openvino_linear(weight: np.ndarray, threads: int) -> ov.CompiledModel:
    x = ops.parameter([-1, weight.shape[1]], np.float32, name="x")
    y = ops.matmul(x, ops.constant(weight), transpose_a=False, transpose_b=True)
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": str(threads),
              "NUM_STREAMS": "1", "PERFORMANCE_HINT": "LATENCY"}
    return ov.Core().compile_model(ov.Model([y], [x]), "CPU", config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shape", action="append",
                        help="OUT,IN of the weight (repeatable; default SmolLM2's MLP "
                        "1536,576 and Qwen2.5-1.5B's 8960,1536)")
    parser.add_argument("--repetitions", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or
                                                            ["1536,576", "8960,1536"])]
    out = []
    for n_out, n_in in shapes:
        w = torch.randn(n_out, n_in) / n_in**0.5
        compiled = openvino_linear(w.numpy(), args.threads)
        request = compiled.create_infer_request()
        contenders = {}
        for m in ROWS:
            x = torch.randn(m, n_in)
            xn = x.numpy()
            contenders[f"torch M={m}"] = lambda x=x, w=w: torch.nn.functional.linear(x, w)
            contenders[f"openvino M={m}"] = lambda xn=xn, r=request: r.infer([xn],
                                                                             share_inputs=True)
        with torch.inference_mode():
            timings = measure(contenders, torch.device("cpu"), repetitions=args.repetitions,
                              min_block_s=0.05)
        for runtime in ("torch", "openvino"):
            base = timings[f"{runtime} M=1"].median_s
            for m in ROWS:
                t = timings[f"{runtime} M={m}"]
                row = {"weight": f"{n_out}x{n_in}", "runtime": runtime, "rows": m,
                       "median_ms": t.median_s * 1e3, "min_ms": t.min_s * 1e3,
                       "max_ms": t.max_s * 1e3, "x_one_row": t.median_s / base,
                       "thread_cpu_ms": t.cpu_median_s * 1e3}
                out.append(row)
                print(f"{row['weight']:>10} {runtime:>9} M={m}: {row['median_ms']:7.3f} ms "
                      f"({row['min_ms']:.3f}-{row['max_ms']:.3f}), {row['x_one_row']:.2f}x "
                      f"one row; calling thread's CPU {row['thread_cpu_ms']:.3f} ms", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
