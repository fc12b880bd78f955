"""Thread scaling of the CPU backends, side by side in one run (the thread targets).

For each (B, K, V) and method: `verify` on `numba:cpu` and `torch:cpu`, and a bare
`torch.amax` over the same target, at each thread count, interleaved (one call of each per
repetition, in turn), wall-clock medians with the spread (min-max) across repetitions.
Drafts equal the target row's argmax with probability 0.6 per position.
Also typical from probabilities against an engine-style pass, the one-thread crossover, and
a 2-thread call right after a torch op (`--part spin`).
Run: `python scripts/bench/threads.py [--threads 1,2] [--reps 7] [--no-torch]
[--shapes 64x4x128256,256x3x32000] [--part grid,typical,crossover,spin]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

import portable_verify as pv


def _inputs(b: int, k: int, v: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(b * 7 + k * 13 + v)
    logits = torch.randn(b, k + 1, v, generator=g) * 4
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, logits[:, :k].argmax(-1),
                         torch.randint(0, v, (b, k), generator=g))
    probs = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 4, -1)
    return {"logits": logits, "drafts": drafts, "probs": probs, "q": q}


def _methods(x: dict[str, torch.Tensor]) -> dict[str, dict]:
    return {
        "greedy": dict(target_logits=x["logits"], method="greedy"),
        "rejection/logits": dict(target_logits=x["logits"], temperature=torch.ones(
            x["drafts"].shape[0])),
        "rejection/probs": dict(target_probs=x["probs"], draft_probs=x["q"]),
        "typical/logits": dict(target_logits=x["logits"], method="typical"),
    }


CLOCK = {"clock": time.perf_counter}


def _time(fn: Callable[[], object]) -> float:
    """Seconds one call takes on the chosen clock: wall time (``--clock wall``), or the
    process's CPU time over all its threads (``--clock cpu``: robust on a shared machine, and
    at 1 thread the same as the call's work; at 2 threads it shows the work, not the speed-up)."""
    clock = CLOCK["clock"]
    start = clock()
    fn()
    return clock() - start


def run(shapes: list[tuple[int, int, int]], threads: list[int], reps: int,
        with_torch: bool = True) -> None:
    with open("/proc/cpuinfo") as info:
        flags = [f for f in info.read().split() if f.startswith(("avx", "fma"))]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"flags {sorted(set(flags))}, torch {torch.__version__}, reps {reps}")
    print("| (B,K,V) | method | threads | numba ms | torch:cpu ms | torch.amax ms |"
          " numba speed-up | amax speed-up | ratio | numba/torch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, k, v in shapes:
        x = _inputs(b, k, v)
        ids = x["drafts"]
        for method, kw in _methods(x).items():
            calls = {
                "numba": lambda kw=kw, ids=ids: pv.verify(ids, seed=1, backend="numba:cpu", **kw),
                "torch": lambda kw=kw, ids=ids: pv.verify(ids, seed=1, backend="torch:cpu", **kw),
                "amax": lambda kw=kw: torch.amax(kw.get("target_logits", kw.get("target_probs")),
                                                 -1),
            }
            if not with_torch:  # torch:cpu's spinning 2-thread calls dominate a loaded run
                calls.pop("torch")
            times = {(n, c): [] for n in threads for c in calls}
            for n in threads:  # warm-up (compile, pools)
                torch.set_num_threads(n)
                for fn in calls.values():
                    fn()
            for _ in range(reps):
                for n in threads:
                    torch.set_num_threads(n)
                    for c, fn in calls.items():
                        times[(n, c)].append(_time(fn))
            med = {key: statistics.median(t) * 1e3 for key, t in times.items()}
            for n in threads:
                spread = "/".join(f"{min(times[(n, c)]) * 1e3:.2f}-{max(times[(n, c)]) * 1e3:.2f}"
                                  for c in calls)
                torch_ms = med.get((n, "torch"), float("nan"))
                su = med[(threads[0], "numba")] / med[(n, "numba")]
                sa = med[(threads[0], "amax")] / med[(n, "amax")]
                print(f"| ({b},{k},{v}) | {method} | {n} | {med[(n, 'numba')]:.2f} | "
                      f"{torch_ms:.2f} | {med[(n, 'amax')]:.2f} | {su:.2f}x | "
                      f"{sa:.2f}x | {su / sa:.2f} | {med[(n, 'numba')] / torch_ms:.2f}"
                      f" |  <!-- spread ms numba/torch/amax {spread} -->")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--shapes", default="64x4x128256,256x3x32000")
    parser.add_argument("--part", default="grid,typical,crossover")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--no-torch", action="store_true",
                        help="grid: numba:cpu and torch.amax only (no torch:cpu column)")
    args = parser.parse_args()
    CLOCK["clock"] = time.perf_counter if args.clock == "wall" else time.process_time
    print(f"# clock {args.clock}, load average {os.getloadavg()}")
    shapes = [tuple(int(s) for s in shape.split("x")) for shape in args.shapes.split(",")]
    if "grid" in args.part:
        run(shapes, [int(n) for n in args.threads.split(",")], args.reps,  # type: ignore[arg-type]
            not args.no_torch)
    if "typical" in args.part:
        typical_probs(args.reps * 3)
    if "crossover" in args.part:
        crossover(args.reps * 3)
    if "spin" in args.part:
        after_torch(args.reps)


def after_torch(reps: int, shape: tuple[int, int, int] = (256, 3, 32000)) -> None:
    """rejection from probabilities at ``shape``, 1 and 2 threads: after a 50 ms rest, and
    right after a ``torch.amax`` at the same thread count, whose OpenMP workers may still be
    spinning on the other cores (``OMP_WAIT_POLICY`` decides; it is printed)."""
    x = _inputs(*shape)
    ids = x["drafts"]

    def call() -> object:
        return pv.verify(ids, target_probs=x["probs"], draft_probs=x["q"], seed=1,
                         backend="numba:cpu")

    def amax() -> object:
        return torch.amax(x["probs"], -1)

    times: dict[tuple[str, int], list[float]] = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        call()
        amax()
    for _ in range(reps):
        for n in (1, 2):
            torch.set_num_threads(n)
            amax()
            time.sleep(0.05)
            times.setdefault(("rested", n), []).append(_time(call))
            amax()
            times.setdefault(("after torch.amax", n), []).append(_time(call))
            times.setdefault(("torch.amax", n), []).append(_time(amax))
    print(f"# {shape}, rejection/probs, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    for case in ("rested", "after torch.amax", "torch.amax"):
        one, two = (statistics.median(times[(case, n)]) * 1e3 for n in (1, 2))
        print(f"{case}: 1 thread {one:.2f} ms, 2 threads {two:.2f} ms, speed-up {one / two:.2f}x")



def typical_probs(reps: int) -> None:
    """Typical acceptance from probabilities at (8,4,32000), 1 thread: `verify` against an
    engine-style pass over every row (entropy on all rows, threshold, argmax)."""
    torch.set_num_threads(1)
    b, k, v = 8, 4, 32000
    x = _inputs(b, k, v)
    probs, ids = x["probs"], x["drafts"]
    eps, alpha = 0.09, 0.3

    def engine() -> torch.Tensor:
        entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
        threshold = torch.minimum(torch.full_like(entropy, eps), alpha * torch.exp(-entropy))
        p_draft = probs[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        accepted = p_draft > threshold[:, :k]
        return accepted, probs.argmax(-1)

    calls = {"verify typical/probs": lambda: pv.verify(ids, target_probs=probs, method="typical",
                                                       seed=1, backend="numba:cpu"),
             "engine-style pass": engine}
    times = {c: [] for c in calls}
    for fn in calls.values():
        fn()
    for _ in range(reps):
        for c, fn in calls.items():
            times[c].append(_time(fn))
    med = {c: statistics.median(t) * 1e3 for c, t in times.items()}
    print(f"typical/probs (8,4,32000), 1 thread: verify {med['verify typical/probs']:.3f} ms, "
          f"engine-style {med['engine-style pass']:.3f} ms, ratio "
          f"{med['engine-style pass'] / med['verify typical/probs']:.2f}x")


def crossover(reps: int) -> None:
    """Where a second thread starts to pay: greedy and rejection `verify` at growing sizes,
    1 thread against 2 (the one-thread threshold lifted for the measurement)."""
    from portable_verify.backends.numba import backend as numba_cpu
    from portable_verify.backends.numba import host as numba_host

    saved = numba_cpu.PARALLEL_MIN_VALUES
    numba_cpu.PARALLEL_MIN_VALUES = numba_host.PARALLEL_MIN_VALUES = 0
    try:
        for b, k, v in [(4, 2, 4096), (8, 3, 4096), (8, 3, 16384), (16, 3, 16384),
                        (32, 3, 32000)]:
            x = _inputs(b, k, v)
            row = [f"({b},{k},{v}) values {b * k * v}"]
            for method, kw in list(_methods(x).items())[:2]:
                times: dict[int, list[float]] = {1: [], 2: []}
                for _ in range(reps):
                    for n in (1, 2):
                        os.environ["PORTABLE_VERIFY_NUM_THREADS"] = str(n)
                        times[n].append(_time(lambda kw=kw, x=x: pv.verify(
                            x["drafts"], seed=1, backend="numba:cpu", **kw)))
                row.append(f"{method} 2-thread speed-up "
                           f"{statistics.median(times[1]) / statistics.median(times[2]):.2f}x")
            print(", ".join(row))
    finally:
        numba_cpu.PARALLEL_MIN_VALUES = numba_host.PARALLEL_MIN_VALUES = saved
        os.environ.pop("PORTABLE_VERIFY_NUM_THREADS", None)


if __name__ == "__main__":
    main()
