"""Soak: many verification calls of mixed small shapes, with no growth in memory.

Why: a serving engine calls the verifier every decoding step for days; a few bytes kept per call
(a cache keyed by shape, a list of tensors, a leaked graph) is invisible in unit tests and fatal
in production. The soak cycles through mixed shapes, methods and target kinds, gives every call
a fresh ``seed_offset`` (as engines do), and compares

* resident memory (``/proc/self/statm``) after warm-up and at the end, within
  ``RSS_TOLERANCE`` (allocator noise; a leak of 24 bytes per call over a million calls exceeds it);
* Python heap (``tracemalloc``) over two equal windows of calls: the second window may not grow
  the heap by more than ``HEAP_TOLERANCE`` (32 bytes per call at the default window);
* every ``1/50`` of the run, the result against the reference (state must not rot).

The count comes from ``PORTABLE_VERIFY_SOAK_CALLS`` (default one million, the CLI's run; its
duration is measured in docs/testing.md, *Soak*); under pytest, unless the variable is set, it
makes ``PYTEST_CALLS``.
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from dataclasses import replace
from itertools import cycle
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core import methods, rng
from portable_verify.core.arguments import SEED_RANGE
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.random_cases import build_case, random_specs
from portable_verify.testing.checks.reference_comparison import Tally, compare, host
from portable_verify.testing.kit import CheckResult, check

CALLS_ENV = "PORTABLE_VERIFY_SOAK_CALLS"
DEFAULT_CALLS = 1_000_000
QUICK_CALLS = 3_000
PYTEST_CALLS = 3_000
RSS_TOLERANCE = 24 * 2**20
HEAP_TOLERANCE = 64 * 2**10
HEAP_WINDOW = 2_000
METHODS = ("greedy", "rejection", "typical", "auto")  # narrower: the rules first soaked


def rss_bytes() -> int:
    """Current resident set size; peak RSS where /proc is missing (then only growth shows)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def soak_calls(quick: bool) -> int:
    """How many calls to make: the env override, else the quick or the full default."""
    value = os.environ.get(CALLS_ENV, "").strip()
    if value:
        count = int(value)
        if count < 4:
            raise ValueError(f"{CALLS_ENV} must be >= 4, got {count}")
        return count
    if quick:
        return QUICK_CALLS
    # Under pytest a million calls would eat the CI budget; the CLI run makes the full count.
    return PYTEST_CALLS if "PYTEST_CURRENT_TEST" in os.environ else DEFAULT_CALLS


def _workload(seed: int = 77, device: torch.device | str = "cpu"
              ) -> list[tuple[str, dict[str, Any], str]]:
    """Mixed small calls (label, kwargs without uniforms, method) on ``device``."""
    gen = np.random.default_rng(seed)
    work = []
    specs = random_specs(gen, 24, max_batch=8, max_positions=4, max_vocab=32)
    for i, spec in enumerate(s for s in specs if s.batch > 0):
        kwargs = build_case(replace(spec, uniforms=False), device=device)
        b = spec.batch
        kwargs["seed"] = torch.from_numpy(gen.integers(0, SEED_RANGE, b)).to(device)
        kwargs["validate"] = i % 3 != 0  # hot loops skip validation
        work.append((spec.label, kwargs, METHODS[i % len(METHODS)]))
    return work


def _run(work: list[tuple[str, dict[str, Any], str]], backend: str, start: int, count: int) -> None:
    items = cycle(work)
    for step in range(start, start + count):
        _, kwargs, method = next(items)
        pv.verify(**kwargs, seed_offset=step, method=method, backend=backend)


def _spot_check(tally: Tally, work: list[tuple[str, dict[str, Any], str]], backend: str,
                step: int) -> None:
    label, kwargs, method = work[step % len(work)]
    b, k = kwargs["draft_token_ids"].shape
    seeds = host(kwargs["seed"])
    u = torch.from_numpy(rng.uniforms_numpy(seeds, np.full(b, step), k + 1)).to(
        kwargs["seed"].device)
    call = {key: val for key, val in kwargs.items() if key not in ("seed", "validate")}
    compare(tally, backend, f"{label}@{step}", {**call, "uniforms": u},
            methods.TABLE[method].rule or method)


def soak(backend: str, calls: int) -> CheckResult:
    """Run ``calls`` verification calls on ``backend`` and judge memory growth."""
    work = _workload(device=torch_device(backend))
    tally = Tally()
    warmup = max(1, min(calls // 10, 2_000))
    window = max(1, min(HEAP_WINDOW, (calls - warmup) // 4))
    _run(work, backend, 0, warmup)
    t0 = time.perf_counter()

    tracemalloc.start()
    _run(work, backend, warmup, window)
    gc.collect()
    heap_1 = tracemalloc.get_traced_memory()[0]
    _run(work, backend, warmup + window, window)
    gc.collect()
    heap_2 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()  # before the RSS baseline: tracing's own memory must not count

    gc.collect()
    rss_start = rss_bytes()
    done = warmup + 2 * window
    chunk = max(1, (calls - done) // 50)
    rss_trace = []
    while done < calls:
        n = min(chunk, calls - done)
        _run(work, backend, done, n)
        done += n
        _spot_check(tally, work, backend, done)
        rss_trace.append(rss_bytes())
    gc.collect()
    rss_end = rss_bytes()
    elapsed = time.perf_counter() - t0

    failures = list(tally.failures)
    if rss_end - rss_start > RSS_TOLERANCE:
        failures.append(f"RSS grew {(rss_end - rss_start) / 2**20:.1f} MiB over {calls} calls")
    if heap_2 - heap_1 > HEAP_TOLERANCE:
        failures.append(f"Python heap grew {(heap_2 - heap_1) / 1024:.1f} KiB over {window} calls")
    stats = {
        "calls": calls,
        "calls_per_s": round((calls - warmup) / elapsed, 1),
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "rss_max_mib": round(max([rss_end, *rss_trace]) / 2**20, 1),
        "heap_growth_bytes": heap_2 - heap_1,
        "heap_window_calls": window,
        "spot_checks": tally.cases,
        "excused_near_boundary": tally.excused_near_boundary,
    }
    detail = "; ".join(failures[:5]) or (
        f"{calls} calls, RSS {stats['rss_start_mib']} -> {stats['rss_end_mib']} MiB, "
        f"heap +{heap_2 - heap_1} B over {window} calls"
    )
    return CheckResult("soak.memory", not failures, detail, stats)


@check("soak.memory", quick=False)
def soak_memory(backend: str, quick: bool) -> CheckResult:
    """A million mixed small calls (PORTABLE_VERIFY_SOAK_CALLS) without memory growth."""
    return soak(backend, soak_calls(quick))
