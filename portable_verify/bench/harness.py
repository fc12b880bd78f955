"""Timing: warm-up, calibrated inner loops, interleaved repetitions, medians, device sync.

Contenders of one cell are timed in turn inside every repetition (rotating the order), so a
burst of load from another process hits them alike and the *ratios* stay meaningful on a shared
machine even when absolute times drift. On an accelerator each call is followed by a device
sync (what an engine step waits for); :func:`device_time_by_graph` gives the device time alone.
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
    per_call = device.type != "cpu"
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(number):
        fn()
        if per_call:
            synchronize(device)
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


L2_FLUSH_BYTES = 256 * 2**20
"""Written between graph replays so no input is still in L2 (larger than any GPU's L2 today)."""


@dataclass(frozen=True)
class DeviceTiming:
    """Device seconds of one graph replay: median and spread over ``reps`` replays."""

    median_s: float
    min_s: float
    max_s: float
    reps: int
    l2_flushed: bool


def device_time_by_graph(fn: Callable[[], object], device: torch.device, reps: int = 50,
                         flush_l2: bool = True, warmup: int = 2) -> DeviceTiming:
    """The device time of one ``fn()`` call, as TileOPs measures it: the call is captured once
    in a CUDA graph (after ``warmup`` eager calls on a side stream), then each of ``reps``
    replays is timed by CUDA events recorded around the replay alone, with L2 flushed before
    each one (a :data:`L2_FLUSH_BYTES` buffer zeroed, outside the events) when ``flush_l2``.

    Why: eager wall time on a GPU is mostly host launch overhead; this is what the kernels
    cost the device. ``fn`` must be capturable (no host sync, no device read); what it
    returns lives in the graph's memory pool until the graph is freed.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device_time_by_graph: device must be a CUDA device, got {device}")
    if reps < 1:
        raise ValueError(f"device_time_by_graph: reps must be >= 1, got {reps}")
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        flush = _l2_flush_buffer(device) if flush_l2 else None
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        graph.replay()  # untimed: the first replay uploads the graph
        for start, end in zip(starts, ends, strict=True):
            if flush is not None:
                flush.zero_()
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        seconds = [start.elapsed_time(end) * 1e-3 for start, end in zip(starts, ends,
                                                                         strict=True)]
        del graph, flush
    return DeviceTiming(statistics.median(seconds), min(seconds), max(seconds), reps,
                        flush_l2)


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
