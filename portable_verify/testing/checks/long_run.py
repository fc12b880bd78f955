"""Long run: every method on every layout and target kind, cycled, without resident-memory growth.

Why: a serving process alternates graph variants for days. Growth was once seen on OpenVINO only
when calls alternated among three variants (greedy -> auto -> typical on one input), while
two-variant cycles stayed flat; the soak check's mix does not pin that pattern. This check
cycles 12 calls (padded and ragged, logits and probabilities, greedy/auto/typical on the same
input, greedy rows mixed in, draft probabilities on and off, validation on and off in turn),
each with a fresh ``seed_offset``, in a fresh child process (its RSS is the backend's alone, and
a crash is a verdict), and fails when resident memory grows by more than ``RSS_BOUND`` between
the end of the warm-up and the end of the run (medians of the first and last samples). The
slope over all samples is reported per call.

The child runs one thread per runtime by default (torch, and OpenVINO through
``PORTABLE_VERIFY_OPENVINO_THREADS``): with a thread pool, resident memory moves in steps of
megabytes, up and down, as pool threads come and go (docs/testing.md, *Long run*), which would
hide or fake a per-call leak of a few hundred bytes; with one thread it is flat to the page.
"""

from __future__ import annotations

import gc
import os
import time
from itertools import cycle
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.call_forms import to_ragged
from portable_verify.testing.cases.random_cases import CaseSpec, build_case, on_device
from portable_verify.testing.checks.memory_soak import rss_bytes
from portable_verify.testing.checks.reference_comparison import host
from portable_verify.testing.isolation import run_isolated
from portable_verify.testing.kit import CheckResult, check

CALLS_ENV = "PORTABLE_VERIFY_LONG_RUN_CALLS"
DEFAULT_CALLS = 200_000
QUICK_CALLS = 8_000
PYTEST_CALLS = 5_000
RSS_BOUND = 8 * 2**20
"""Allowed growth after warm-up: 8 MiB, i.e. ~470 bytes per call at 20 000 calls."""
WARMUP_CALLS = 3_000
SAMPLES = 40
CHILD_TIMEOUT_S = 6 * 3600.0


def long_run_calls(quick: bool) -> int:
    """The env override, else the quick, pytest or full count."""
    value = os.environ.get(CALLS_ENV, "").strip()
    if value:
        return max(2 * WARMUP_CALLS, int(value))
    if quick:
        return QUICK_CALLS
    return PYTEST_CALLS if "PYTEST_CURRENT_TEST" in os.environ else DEFAULT_CALLS


def workload(device: torch.device | str = "cpu") -> list[tuple[str, dict[str, Any], str]]:
    """(label, call, method): 4 inputs x greedy/auto/typical, each input's methods in a row, on
    ``device``."""
    inputs = [
        ("padded/logits", CaseSpec(4, 3, 64, 31, temperature="vector", ragged=True)),
        ("padded/probs+q", CaseSpec(4, 3, 64, 32, target="probs", draft_probs=True)),
        ("ragged/logits+q", CaseSpec(4, 3, 64, 33, draft_probs=True, temperature="scalar",
                                     ragged=True)),
        ("ragged/probs", CaseSpec(4, 3, 64, 34, target="probs", ragged=True)),
    ]
    work = []
    for label, spec in inputs:
        kwargs = build_case(spec)  # cut to the ragged layout on the host, then moved once
        kwargs.pop("uniforms")  # seeded: the per-call seed_offset advances the streams
        kwargs["seed"] = 1234
        if label.startswith("ragged"):
            kwargs = to_ragged(kwargs)
        kwargs = on_device(kwargs, device)
        for method in ("greedy", "auto", "typical"):  # narrower: one of each kind of rule
            work.append((label, kwargs, method))
    return work


def _call(backend: str, label: str, kwargs: dict[str, Any], method: str, step: int,
          validate: bool) -> pv.VerifyResult:
    fn = pv.verify_ragged if label.startswith("ragged") else pv.verify
    return fn(**kwargs, method=method, seed_offset=step, validate=validate, backend=backend)


def _probe(backend: str, work: list[tuple[str, dict[str, Any], str]]) -> list[Any]:
    return [host(_call(backend, label, kw, m, 0, True).token_ids).tolist()
            for label, kw, m in work]


def long_run_child(backend: str, calls: int, leak_bytes_per_call: int = 0,
                   threads: int = 1) -> dict[str, Any]:
    """Runs in the child process. ``leak_bytes_per_call`` makes the harness itself keep that
    much per call: the negative control proving the measurement sees a leak."""
    import torch

    torch.set_num_threads(threads)
    work = workload(torch_device(backend))
    probe = _probe(backend, work)
    kept: list[bytearray] = []
    items = cycle(work)
    sample_every = max(1, (calls - WARMUP_CALLS) // SAMPLES)
    samples: list[tuple[int, int]] = []
    start = time.perf_counter()
    for step in range(calls):
        label, kwargs, method = next(items)
        _call(backend, label, kwargs, method, step, validate=(step // len(work)) % 2 == 0)
        if leak_bytes_per_call:
            kept.append(bytearray(b"x" * leak_bytes_per_call))
        if step >= WARMUP_CALLS and (step - WARMUP_CALLS) % sample_every == 0:
            gc.collect()
            samples.append((step, rss_bytes()))
    elapsed = time.perf_counter() - start
    steps = np.array([s for s, _ in samples], dtype=float)
    rss = np.array([r for _, r in samples], dtype=float)
    edge = max(1, len(samples) // 8)
    growth = float(np.median(rss[-edge:]) - np.median(rss[:edge]))
    slope = float(np.polyfit(steps, rss, 1)[0]) if len(samples) > 2 else 0.0
    return {
        "calls": calls,
        "calls_per_s": round(calls / elapsed, 1),
        "rss_start_mib": round(float(rss[0]) / 2**20, 1),
        "rss_end_mib": round(float(rss[-1]) / 2**20, 1),
        "rss_growth_mib": round(growth / 2**20, 2),
        "slope_bytes_per_call": round(slope, 1),
        "rss_trace_mib": [round(float(r) / 2**20, 1) for r in rss],
        "probe_unchanged": _probe(backend, work) == probe,
        "harness_leak_bytes_per_call": leak_bytes_per_call,
        "threads": threads,
    }


def long_run(backend: str, calls: int, leak_bytes_per_call: int = 0,
             threads: int = 1) -> CheckResult:
    """Run :func:`long_run_child` in a fresh process and judge it against ``RSS_BOUND``."""
    outcome = run_isolated("portable_verify.testing.checks.long_run:long_run_child", backend,
                           calls, leak_bytes_per_call, threads, timeout=CHILD_TIMEOUT_S,
                           env={"PORTABLE_VERIFY_OPENVINO_THREADS": str(threads)})
    if not outcome.ok or outcome.value is None:
        return CheckResult("long_run.memory", False,
                           f"the child process died: {outcome.describe()}",
                           {"stderr_tail": outcome.stderr_tail[-500:]})
    stats = outcome.value
    failures = []
    if stats["rss_growth_mib"] * 2**20 > RSS_BOUND:
        failures.append(f"RSS grew {stats['rss_growth_mib']} MiB over {calls} calls "
                        f"(bound {RSS_BOUND / 2**20:.0f} MiB; slope "
                        f"{stats['slope_bytes_per_call']} B/call)")
    if not stats["probe_unchanged"]:
        failures.append("the same calls gave other tokens at the end of the run")
    detail = "; ".join(failures) or (
        f"{calls} calls over 12 variants, RSS {stats['rss_start_mib']} -> "
        f"{stats['rss_end_mib']} MiB (growth {stats['rss_growth_mib']} MiB, bound "
        f"{RSS_BOUND / 2**20:.0f}; slope {stats['slope_bytes_per_call']} B/call)")
    return CheckResult("long_run.memory", not failures, detail, stats)


@check("long_run.memory", quick=False)
def long_run_memory(backend: str, quick: bool) -> CheckResult:
    """Every method x layout x target kind cycled (PORTABLE_VERIFY_LONG_RUN_CALLS) in a child
    process; resident memory may not grow by more than 8 MiB after warm-up."""
    return long_run(backend, long_run_calls(quick))
