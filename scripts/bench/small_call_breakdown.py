"""Where a small CPU call's time goes: each part of a greedy `verify` at (B, K, V) = (1, 2, 64)
as a multiple of a bare `torch.argmax` on the same logits, timed side by side (interleaved
repetitions, thread CPU time, one thread). Run: `python scripts/bench/small_call_breakdown.py`.
Needs numba (the `numba:cpu` backend); docs/benchmarks.md quotes its output."""

from __future__ import annotations

import time

import numpy as np
import torch

import portable_verify as pv
from portable_verify.backends.numba import backend as numba_cpu
from portable_verify.core.types import VerifyResult


def main() -> None:
    torch.set_num_threads(1)
    logits, drafts = torch.randn(1, 3, 64), torch.randint(0, 64, (1, 2))
    empty = np.empty(0, np.int64)
    out = numba_cpu.greedy_arrays(logits, True, drafts, empty, empty, True)

    def result_tensors() -> VerifyResult:
        return VerifyResult._of(*(torch.from_numpy(a) for a in out[:4]))

    parts = {
        "torch.argmax": lambda: torch.argmax(logits, -1),
        "verify, greedy": lambda: pv.verify(drafts, target_logits=logits, method="greedy"),
        "compiled kernel alone": lambda: numba_cpu.kernels.greedy_at(
            logits.data_ptr(), 3, 64, drafts.data_ptr(), 1, 2, empty, empty, True, True,
            *out[:4]),
        "output arrays + kernel": lambda: numba_cpu.greedy_arrays(logits, True, drafts, empty,
                                                                  empty, True),
        "result tensors": result_tensors,
    }
    times: dict[str, list[int]] = {name: [] for name in parts}
    for _ in range(9):
        for name, fn in parts.items():
            start = time.thread_time_ns()
            for _ in range(20000):
                fn()
            times[name].append(time.thread_time_ns() - start)
    medians = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    for name, t in medians.items():
        print(f"{name}: {t / medians['torch.argmax']:.2f}x torch.argmax")


if __name__ == "__main__":
    main()
