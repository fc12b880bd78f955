"""The host's share of an eager lean call, measured without a GPU: where `pv.verify`'s time goes
on the way to `triton:cuda`'s two launches.

Why: on the H200 the founding case (1, 2, 32000) took 600-670 us eager with two launches whose
device time is tens of us: the rest is host Python (docs/benchmarks.md, "The GPU run of record:
the lean door"). The compiled launcher's host code runs here on CPU tensors with Triton's
``JITFunction.run`` stubbed (nothing launches), so each layer's cost is timed on any machine:
the whole door, the door from a parsed call (``run_lean``), the launcher from its record
(``chain.launch``), as multiples of the allocation floor (the two output tensors any door must
allocate), side by side in interleaved rounds of thread CPU time, one thread. What this cannot
see: Triton's own launcher (argument binding, the driver call), measured on a GPU only.

    PYTHONPATH=. python scripts/bench/lean_host_cost.py [--shape 1,2,32000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import torch
import triton

import portable_verify as pv
from portable_verify.backends.triton import backend as triton_backend
from portable_verify.backends.triton import chain, spec
from portable_verify.bench.environment import cpu_flags

BACKEND = "triton:interpreter"  # CPU tensors; run_lean is redirected to the compiled launcher


def _compiled_launcher_on_cpu() -> None:
    """Nothing launches; the rest of triton:cuda's host code runs as it does there."""
    triton.runtime.jit.JITFunction.run = lambda self, *args, **kwargs: None
    triton_backend.TritonBackend.run_lean = (  # type: ignore[method-assign]
        lambda self, call: chain.launch(spec.from_call(call)))


def _parts(shape: tuple[int, int, int], method: str) -> dict[str, Callable[[], object]]:
    b, k, v = shape
    logits = torch.randn(b, k + 1, v)
    drafts = torch.randint(0, v, (b, k))
    seed = torch.arange(b)

    def door() -> object:
        return pv.verify(drafts, target_logits=logits, method=method, temperature=0.8,
                         seed=seed, backend=BACKEND, validate=False)

    seen: list[object] = []
    run_lean = triton_backend.TritonBackend.run_lean
    triton_backend.TritonBackend.run_lean = (  # type: ignore[method-assign]
        lambda self, call: seen.append((self, call)) or run_lean(self, call))
    door()
    triton_backend.TritonBackend.run_lean = run_lean  # type: ignore[method-assign]
    backend, call = seen[0]
    record = spec.from_call(call)  # type: ignore[arg-type]
    return {
        "outputs only": lambda: (torch.empty((b, k + 1), dtype=torch.int64),
                                 torch.empty(b, dtype=torch.int64)),
        "door": door,
        "from a parsed call": lambda: backend.run_lean(call),  # type: ignore[attr-defined]
        "launcher from its record": lambda: chain.launch(record),
    }


def _measure(parts: dict[str, Callable[[], object]], rounds: int, repeat: int) -> dict:
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(rounds):  # interleaved: every part sees the same machine
        for name, fn in parts.items():
            start = time.thread_time_ns()
            for _ in range(repeat):
                fn()
            times[name].append((time.thread_time_ns() - start) / repeat / 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1,2,32000", help="B,K,V")
    parser.add_argument("--methods", default="greedy,rejection")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="cProfile the door's top functions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    _compiled_launcher_on_cpu()
    shape = tuple(int(x) for x in args.shape.split(","))
    print(f"shape {shape}, 1 thread, cpu flags {cpu_flags()}; multiples of 'outputs only'"
          " (median [25%, 75%] of the rounds' ratios)")
    for method in args.methods.split(","):
        parts = _parts(shape, method)  # type: ignore[arg-type]
        times = _measure(parts, args.rounds, args.repeat)
        floor = times["outputs only"]
        for name, t in times.items():
            ratios = [x / f for x, f in zip(t, floor, strict=True)]
            q = statistics.quantiles(ratios, n=4)
            print(f"  {method:10s} {name:26s} {statistics.median(ratios):7.1f}"
                  f" [{q[0]:.1f}, {q[2]:.1f}]")
        if args.profile:
            profile = cProfile.Profile()
            door = parts["door"]
            profile.runcall(lambda: [door() for _ in range(args.repeat)])  # noqa: B023
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
