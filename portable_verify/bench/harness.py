"""Timing: warm-up, calibrated inner loops, interleaved repetitions, medians, device sync.

Contenders of one cell are timed in turn inside every repetition (rotating the order), so a
burst of load from another process hits them alike and the *ratios* stay meaningful on a shared
machine even when absolute times drift.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work; a no-op on CPU (eager CPU ops are synchronous)."""
    if device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        accelerator.synchronize(device)
        return
    getattr(torch, device.type).synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Per-call seconds of one contender: the median and the spread over repetitions.

    ``cpu_median_s`` is the calling thread's CPU time (``time.thread_time``): on a shared,
    oversubscribed CPU it leaves out the time the thread waited for a core, so for one-thread
    CPU runs it estimates the uncontended wall time. It means nothing for GPU work.
    """

    median_s: float
    min_s: float
    max_s: float
    cpu_median_s: float
    repetitions: int
    calls_per_repetition: int
    cpu_min_s: float = 0.0
    cpu_max_s: float = 0.0


def _time_block(fn: Callable[[], object], number: int,
                device: torch.device) -> tuple[float, float]:
    """``(wall, thread CPU)`` seconds per call over ``number`` back-to-back calls."""
    synchronize(device)
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(number):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / number, (time.thread_time() - c0) / number


def _nothing() -> None:
    pass


def measure(
    contenders: dict[str, Callable[[], object]],
    device: torch.device,
    *,
    repetitions: int = 7,
    warmup: int = 1,
    min_block_s: float = 0.02,
    setups: dict[str, Callable[[], None]] | None = None,
) -> dict[str, Timing]:
    """Median per-call time of every contender, interleaved within each repetition.

    Each contender runs ``warmup`` times first; its inner-loop count is then chosen so one
    timed block lasts at least ``min_block_s`` (short calls are otherwise dominated by timer
    and Python overhead). ``setups[name]``, when given, runs untimed before each of that
    contender's blocks (e.g. its thread count), so contenders with different settings still
    interleave.
    """
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    setups = setups or {}
    numbers: dict[str, int] = {}
    for name, fn in contenders.items():
        setups.get(name, _nothing)()
        for _ in range(max(warmup, 0)):
            fn()
        once = _time_block(fn, 1, device)[0]
        numbers[name] = max(1, min(1000, math.ceil(min_block_s / max(once, 1e-9))))
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(repetitions):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            setups.get(name, _nothing)()
            w, c = _time_block(contenders[name], numbers[name], device)
            wall[name].append(w)
            cpu[name].append(c)
    return {
        name: Timing(statistics.median(s), min(s), max(s), statistics.median(cpu[name]),
                     len(s), numbers[name], min(cpu[name]), max(cpu[name]))
        for name, s in wall.items()
    }
