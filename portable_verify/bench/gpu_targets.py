"""The GPU targets of issue "Verification at the speed of the GPU", measured in one run.

Each function returns plain data plus ``targets``: one entry per target with what was measured,
the bound, and whether it was met (None: not measured here). gpu-check's verdict lists them.
On a CPU dry run the same calls run through ``triton:interpreter`` at tiny shapes, so the
plumbing is tested; device timings and profiler counts are CUDA-only and reported as skipped.

Timing conventions (docs/benchmarks.md, "The GPU run of record"):
- eager: wall time of one call with a device synchronisation after it (what an engine step
  waits for), interleaved with its contenders, median of at least ``MIN_REPS``;
- device time: one call captured in a ``torch.cuda.CUDAGraph``, replays timed by CUDA events,
  the L2 cache flushed between replays by writing a buffer larger than it (TileOPs' method),
  median of ``GRAPH_REPS``;
- launches: device activities (kernels, copies, fills) in a ``torch.profiler`` trace of one call.
"""

from __future__ import annotations

import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch

import portable_verify as pv
from portable_verify.bench import floor, harness, vllm_seam
from portable_verify.bench.cases import Variant, make_inputs
from portable_verify.core import methods
from portable_verify.core.types import VerifyOptions

MIN_REPS = 15
GRAPH_REPS = 50
OVERHEAD_US = 5.0  # the "+ 5 us" every device-time bound allows

FOUNDING = (1, 2, 32000)
LAUNCH_SHAPE = (4, 3, 32000)
DRY_SHAPE = (2, 2, 64)
RNG_KERNEL = "distribution"
"""torch's random-number kernels: an unseeded call's one ``torch.randint`` (and vLLM's
per-request generators' draws) are counted apart from the launches (issue 38, item 1)."""
LAUNCH_BOUND = {"greedy": 2, "rejection": 2, "typical": 3, "block": 3}
"""Kernel launches allowed per chain call (issue 38, item 1; typical and block may take a third,
justified in docs/backends.md)."""

SEAM_MODES = ("all greedy", "all sampled", "sampled with draft probs")
SEAM_CELLS: tuple[tuple[tuple[int, int, int], tuple[str, ...]], ...] = (
    ((1, 2, 32000), SEAM_MODES), ((1, 4, 128256), SEAM_MODES),
    ((8, 3, 49152), (*SEAM_MODES, "mixed")), ((64, 4, 128256), (*SEAM_MODES, "mixed")),
    ((256, 4, 128256), (*SEAM_MODES, "mixed")), ((512, 2, 151936), (*SEAM_MODES, "mixed")))
"""The 22 cells of gpu-measurements.md: 3 modes at B = 1, plus mixed at B >= 8."""
VLLM_US = {((1, 2, 32000), "all greedy"): 76.0, ((1, 2, 32000), "all sampled"): 176.0,
           ((64, 4, 128256), "all sampled"): 421.0}
"""vLLM 0.32's own path, eager, on the H200 of the first GPU run: the contender's calibration."""
CALIBRATION_BAND = 0.30

TILEOPS_CELLS = (((16, 4, 128256), 15.0), ((64, 4, 128256), 30.0))
"""Rejection from float32 p and q: device-time bounds in us (TileOPs' published H200 figures
are 13.7 and 27.3 us)."""
FLOOR_CELLS = ((16, 4, 128256), (64, 4, 128256))
TREE_DEVICE_CELLS = ((8, 64, 128256), (64, 8, 128256))


# ---------------------------------------------------------------- timing primitives


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def eager_us(fns: dict[str, Callable[[], Any]], device: torch.device, min_reps: int = MIN_REPS,
             budget_s: float = 0.4) -> dict[str, dict[str, float]]:
    """Median, min and max wall us of each function with a device sync after each call,
    interleaved (ABAB...) so drift falls alike on all."""
    sync = torch.cuda.synchronize if is_cuda(device) else (lambda: None)
    for fn in fns.values():
        fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while (len(times[next(iter(fns))]) < min_reps
           or (time.perf_counter() - start < budget_s and len(times[next(iter(fns))]) < 400)):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e6)
    return {name: {"median_us": round(statistics.median(t), 2), "min_us": round(min(t), 2),
                   "max_us": round(max(t), 2), "reps": len(t)} for name, t in times.items()}


def graph_device_us(fn: Callable[[], Any], device: torch.device) -> dict[str, float]:
    """:func:`harness.device_time_by_graph` (L2 flushed) as us for the JSON."""
    t = harness.device_time_by_graph(fn, device, reps=GRAPH_REPS)
    return {"median_us": round(t.median_s * 1e6, 2), "min_us": round(t.min_s * 1e6, 2),
            "max_us": round(t.max_s * 1e6, 2), "reps": t.reps}


def launches(fn: Callable[[], Any]) -> dict[str, Any]:
    """Device activities of one call in a torch.profiler trace: kernels, copies and fills,
    counted by name (the launches an engine step pays)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    counts: dict[str, int] = {}
    for name in names:
        counts[name[:120]] = counts.get(name[:120], 0) + 1
    draws = sum(n for name, n in counts.items() if RNG_KERNEL in name)
    return {"launches": len(names) - draws, "rng_draws": draws, "by_name": counts}


def host_profile(fn: Callable[[], Any], calls: int = 50, top: int = 14) -> list[str]:
    """Where one call's host time goes: cProfile's top functions by cumulative time over
    ``calls`` calls (us per call), for the next round of host-path work."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler).sort_stats("cumulative")
    rows = []
    for (path, line, name), (_cc, _nc, _tt, cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{path.rsplit('/', 2)[-1]}:{line}"
        rows.append((cum, f"{cum / calls * 1e6:8.1f} us  {name} ({where})"))
    return [text for _, text in sorted(rows, reverse=True)[:top]]


def sync_free(fn: Callable[[], Any]) -> str | None:
    """None when one call runs under ``set_sync_debug_mode("error")``; else the error."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return None


def target(name: str, measured: Any, bound: str, met: bool | None) -> dict[str, Any]:
    return {"target": name, "measured": measured, "bound": bound, "met": met}


# ---------------------------------------------------------------- calls through every door


def door_calls(shape: tuple[int, int, int], method: str, device: torch.device, backend: str,
               validate: bool = False) -> dict[str, Callable[[], Any]]:
    """Zero-argument calls of one chain step through each door (padded, ragged, rows, the two
    vLLM seams), on ``device`` tensors, sampled rows at temperature 0.8 with int64 seeds."""
    from portable_verify.integrations.vllm_v1 import runner_v2
    from portable_verify.integrations.vllm_v1.sampler import verify_spec_decode_step

    b, k, v = shape
    g = torch.Generator().manual_seed(b * 1000 + k)
    logits = (torch.randn(b, k + 1, v, generator=g) * 2).to(device)
    hit = torch.rand(b, k, generator=g) < 0.6
    drafts = torch.where(hit, logits[:, :k].cpu().argmax(-1),
                         torch.randint(0, v, (b, k), generator=g)).to(device)
    seeds = torch.arange(b, dtype=torch.int64, device=device) + 11
    greedy = methods.greedy_only(method)
    temp = torch.full((b,), 0.0 if greedy else 0.8, device=device)
    q = None
    if methods.reads_rows_by_data(method):  # block: its gain needs the draft's distribution
        q = torch.softmax(torch.randn(b, k, v, generator=g), -1).to(device)
    sampled = {} if greedy else {"method": method}
    common = dict(temperature=temp, seed=seeds, backend=backend, validate=validate, **sampled)
    counts = torch.full((b,), k, dtype=torch.int64, device=device)
    flat = logits.reshape(b * (k + 1), v)
    rows = torch.arange(b * (k + 1), device=device).reshape(b, k + 1)
    q_rows = torch.arange(b * k, device=device).reshape(b, k)
    options = VerifyOptions("greedy" if greedy else method)
    calls: dict[str, Callable[[], Any]] = {
        "padded": lambda: pv.verify(drafts, target_logits=logits, draft_probs=q, **common),
        "ragged": lambda: pv.verify_ragged(  # K given: no device read to find it
            drafts.reshape(-1), num_draft_tokens=counts, target_logits=flat,
            max_num_draft_tokens=k,
            draft_probs=None if q is None else q.reshape(b * k, v), **common),
        "rows": lambda: pv.verify_rows(
            drafts, target_rows=rows, target_logits=flat, num_draft_tokens=counts,
            draft_probs=None if q is None else q.reshape(b * k, v),
            draft_rows=None if q is None else q_rows,
            options=options, temperature=temp, seed=seeds, backend=backend,
            validate=validate),
    }
    step, md = seam_step(shape, "all greedy" if greedy else "all sampled", device,
                         with_q=q is not None)
    calls["vllm_v1"] = lambda: verify_spec_decode_step(*step, md, backend=backend,
                                                       options=options)
    if q is None:  # the V2 runner's seam takes no draft probs
        cu = torch.arange(b + 1, device=device, dtype=torch.int32) * (k + 1)
        draft_sampled = torch.cat([torch.zeros(b, 1, dtype=torch.int64, device=device), drafts],
                                  1).reshape(-1)
        pos = torch.arange(b * (k + 1), device=device, dtype=torch.int64)
        idx = torch.arange(b, device=device, dtype=torch.int32)
        calls["vllm_v2"] = lambda: runner_v2.verify_v2_step(
            flat, draft_sampled, cu, pos, idx, temp, seeds, k, backend=backend, options=options)
    return calls


def seam_step(shape: tuple[int, int, int], mode: str, device: torch.device,
              with_q: bool = False) -> tuple[tuple, Any]:
    """vLLM V1 ``rejection_sample``'s arguments on ``device`` (:func:`vllm_seam.step_inputs`:
    the inputs of gpu-measurements.md)."""
    return vllm_seam.step_inputs(*shape, "sampled with draft probs" if with_q else mode,
                                 device=device)


def mode_of(step: tuple[tuple, Any], mode: str) -> tuple[tuple, Any]:
    """One step's arguments (drawn with draft probabilities) in another mode of
    :data:`SEAM_MODES` or ``"mixed"``: the same logits and drafts, the metadata and ``q`` of
    that mode (as :func:`vllm_seam.step_inputs` would set them)."""
    args, md = step
    q = args[4] if mode == "sampled with draft probs" else None
    b = len(args[1])
    temperature = None
    if mode != "all greedy":
        temperature = torch.full((b,), 0.8, device=args[5].device)
        if mode == "mixed":
            temperature[::2] = 0.0
    metadata = types.SimpleNamespace(**{**vars(md), "temperature": temperature,
                                        "all_greedy": mode == "all greedy",
                                        "all_random": mode not in ("all greedy", "mixed")})
    return (*args[:4], q, *args[5:]), metadata


# ---------------------------------------------------------------- the target sections


def launch_targets(device: torch.device, backend: str, dry_run: bool) -> dict[str, Any]:
    """Launches and host syncs per call, every method through every door."""
    shape = DRY_SHAPE if dry_run else LAUNCH_SHAPE
    cells: list[dict[str, Any]] = []
    for method, bound in LAUNCH_BOUND.items():
        for door, fn in door_calls(shape, method, device, backend).items():
            cell: dict[str, Any] = {"method": method, "door": door, "bound": bound}
            try:
                fn()
                if is_cuda(device):
                    cell.update(launches(fn))
                    cell["sync_error"] = sync_free(fn)
                cell["proxy"] = proxy_count(fn)
            except Exception as exc:
                cell["error"] = f"{type(exc).__name__}: {exc}"[:400]
            cells.append(cell)
    measured = [c for c in cells if "launches" in c]
    differ = [f"{c['method']}/{c['door']}: profiler {c['launches']}, proxy {c['proxy']}"
              for c in measured if isinstance(c.get("proxy"), int)
              and c["proxy"] != c["launches"] + c["rng_draws"]]
    over = [f"{c['method']}/{c['door']}: {c['launches']}" for c in measured
            if c["launches"] > c["bound"]]
    syncs = [f"{c['method']}/{c['door']}" for c in measured if c.get("sync_error")]
    errors = [f"{c['method']}/{c['door']}: {c['error']}" for c in cells if "error" in c]
    done = bool(measured) and not errors
    return {"cells": cells, "failures": errors, "targets": [
        target("launches per chain call", over or "all within bound",
               "<= 2 (typical, block <= 3)", (not over) if done else None),
        target("device reads per call (sync debug mode error)", syncs or "none", "0",
               (not syncs) if done else None),
        target("CI's proxy count equals the profiler's", differ or "equal", "equal",
               (not differ) if done else None)]}


def proxy_count(fn: Callable[[], Any]) -> int | str:
    """Launches of one call as CI's proxy counts them (testing/launches.py: aten ops that
    launch device work plus Triton launches), to hold against the profiler's count."""
    from portable_verify.testing.launches import count_launches

    try:
        with count_launches(refuse_reads=False) as counter:
            fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    return counter.count


def founding_targets(device: torch.device, backend: str, dry_run: bool) -> dict[str, Any]:
    """(1, 2, 32000) eager: greedy <= 40 us, rejection at T = 0.8 <= 60 us, beside
    ``torch.argmax`` over the same rows; validate=True beside validate=False."""
    shape = DRY_SHAPE if dry_run else FOUNDING
    greedy = door_calls(shape, "greedy", device, backend)["padded"]
    sampled = door_calls(shape, "rejection", device, backend)["padded"]
    greedy_v = door_calls(shape, "greedy", device, backend, validate=True)["padded"]
    sampled_v = door_calls(shape, "rejection", device, backend, validate=True)["padded"]
    b, k, v = shape
    rows = torch.randn(b, k + 1, v, device=device)
    timed = eager_us({"argmax": lambda: torch.argmax(rows, -1), "greedy": greedy,
                      "rejection": sampled, "greedy validate=True": greedy_v,
                      "rejection validate=True": sampled_v}, device)
    g, r = timed["greedy"]["median_us"], timed["rejection"]["median_us"]
    argmax = timed["argmax"]["median_us"]
    real = is_cuda(device)
    where = {"greedy": host_profile(greedy), "greedy validate=True": host_profile(greedy_v)}
    if real:
        where["greedy validate=True launches"] = launches(greedy_v)
    return {"shape": shape, "eager": timed, "where_the_host_time_goes": where,
            "greedy_over_argmax": round(g / argmax, 2), "rejection_over_argmax":
            round(r / argmax, 2), "targets": [
                target("founding case greedy, eager", f"{g} us ({g / argmax:.2f}x argmax)",
                       "<= 40 us", g <= 40 if real else None),
                target("founding case rejection T=0.8, eager",
                       f"{r} us ({r / argmax:.2f}x argmax)", "<= 60 us",
                       r <= 60 if real else None)]}


def seam_targets(device: torch.device, backend: str, dry_run: bool,
                 left: Callable[[], float]) -> dict[str, Any]:
    """The plugin's V1 seam against the calibrated vLLM rebuild, eager, on the 22 cells."""
    from portable_verify.bench.vllm_rebuilt import vllm_v1_rejection_sample as theirs
    from portable_verify.integrations.vllm_v1.sampler import verify_spec_decode_step

    cells: list[dict[str, Any]] = []
    plan = (((DRY_SHAPE, (*SEAM_MODES, "mixed")),) if dry_run else SEAM_CELLS)
    for shape, modes in plan:
        every = seam_step(shape, "all sampled", device, with_q=True)  # one draw per shape
        for mode in modes:
            if left() < 5:
                cells.append({"shape": shape, "mode": mode, "cut": "section budget spent"})
                continue
            args, md = mode_of(every, mode)
            fns = {"plugin": lambda a=args, m=md: verify_spec_decode_step(*a, m,
                                                                          backend=backend),
                   "contender": lambda a=args, m=md: theirs(*a, m)}
            cell: dict[str, Any] = {"B": shape[0], "K": shape[1], "V": shape[2], "mode": mode}
            try:
                timed = eager_us(fns, device, min_reps=5 if dry_run else MIN_REPS,
                                 budget_s=0.05 if dry_run else 0.15)
                cell.update(timed)
                cell["contender_over_plugin"] = round(
                    timed["contender"]["median_us"] / timed["plugin"]["median_us"], 3)
                if mode in ("all greedy", "mixed"):
                    ours, want = fns["plugin"](), fns["contender"]()
                    greedy_rows = (md.temperature == 0 if md.temperature is not None
                                   else torch.ones(shape[0], dtype=torch.bool, device=device))
                    cell["greedy_rows_equal"] = bool(
                        (ours[greedy_rows] == want[greedy_rows]).all())
                vllm = VLLM_US.get((shape, mode))
                if vllm is not None:
                    cell["vllm_0_32_us"] = vllm
                    cell["contender_over_vllm"] = round(timed["contender"]["median_us"] / vllm, 3)
            except Exception as exc:
                cell["error"] = f"{type(exc).__name__}: {exc}"[:400]
            cells.append(cell)
            del args, md
        del every
    measured = [c for c in cells if "contender_over_plugin" in c]
    calibrated = [c for c in measured if "contender_over_vllm" in c]
    in_band = bool(calibrated) and all(abs(c["contender_over_vllm"] - 1) <= CALIBRATION_BAND
                                       for c in calibrated)
    real = is_cuda(device) and len(calibrated) == len(VLLM_US)
    slow = [f"{c['B']},{c['K']},{c['V']} {c['mode']}: {c['contender_over_plugin']}"
            for c in measured if c["contender_over_plugin"] < 1.0]
    big = [c for c in measured if c["B"] >= 64 and c["mode"] != "all greedy"]
    short = [f"{c['B']},{c['K']},{c['V']} {c['mode']}: {c['contender_over_plugin']}"
             for c in big if c["contender_over_plugin"] < 3.0]
    unequal = [f"{c['B']} {c['mode']}" for c in measured if c.get("greedy_rows_equal") is False]
    claim = real and in_band and len(measured) == 22
    errors = [f"{c.get('B')} {c['mode']}: {c['error']}" for c in cells if "error" in c]
    return {"cells": cells, "failures": errors + [f"greedy rows differ: {u}" for u in unequal],
            "calibrated": in_band, "targets": [
                target("contender calibrated (+-30% of vLLM 0.32 at 3 cells)",
                       [c["contender_over_vllm"] for c in calibrated], "within +-30%",
                       in_band if real else None),
                target("seam >= 1.0x the contender, all 22 cells", slow or "all", ">= 1.0x",
                       (not slow) if claim else None),
                target("seam >= 3x at B >= 64 sampled, draft probs, mixed", short or "all",
                       ">= 3x", (not short) if claim else None),
                target("greedy rows equal the contender's", unequal or "all equal", "equal",
                       (not unequal) if measured else None)]}


def device_time_targets(device: torch.device, backend: str, dry_run: bool,
                        left: Callable[[], float]) -> dict[str, Any]:
    """Device time by graph replay, L2 flushed: TileOPs' case, typical/block/logits against
    their floor, greedy against ``torch.argmax``."""
    if not is_cuda(device):
        return {"skipped": "device time needs CUDA graphs", "targets": [
            target("rejection from p, q device time (TileOPs' case)", None, "<= 15 / 30 us",
                   None)]}
    bandwidth = floor.copy_bandwidth(device)
    cells: list[dict[str, Any]] = []
    tile = dict(TILEOPS_CELLS)
    for shape in FLOOR_CELLS:
        for variant in (Variant("rejection", "probs"), Variant("typical", "probs"),
                        Variant("block", "probs"), Variant("rejection", "logits"),
                        Variant("greedy", "logits")):
            if left() < 5:
                cells.append({"shape": shape, "variant": variant.label, "cut": True})
                continue
            inputs = make_inputs(shape, variant, torch.float32, device, seed=3)
            kw = inputs.verify_kwargs(variant)

            def call(i=inputs, kw=kw) -> Any:
                return pv.verify(i.drafts, seed=i.seeds, backend=backend, validate=False, **kw)

            floor_us = floor.num_bytes(floor.must_read(inputs, variant)) / bandwidth * 1e6
            cell: dict[str, Any] = {"shape": shape, "variant": variant.label,
                                    "floor_us": round(floor_us, 2)}
            try:
                cell["device"] = graph_device_us(call, device)
                if methods.greedy_only(variant.method):
                    rows = inputs.target
                    cell["argmax"] = graph_device_us(lambda r=rows: torch.argmax(r, -1), device)
            except Exception as exc:
                cell["error"] = f"{type(exc).__name__}: {exc}"[:400]
            cells.append(cell)
            del inputs, kw
    targets = []
    for c in cells:
        if "device" not in c:
            continue
        us, label, shape = c["device"]["median_us"], c["variant"], tuple(c["shape"])
        if label == "rejection/probs":
            bound = tile[shape]
            targets.append(target(f"rejection p,q {shape} device time", f"{us} us",
                                  f"<= {bound} us", us <= bound))
        elif label == "greedy/logits":
            ratio = us / c["argmax"]["median_us"]
            targets.append(target(f"greedy {shape} against torch.argmax", f"{ratio:.2f}x",
                                  "<= 1.2x", ratio <= 1.2))
        else:
            bound = 2 * c["floor_us"] + OVERHEAD_US
            targets.append(target(f"{label} {shape} device time", f"{us} us",
                                  f"<= 2x floor + 5 = {bound:.1f} us", us <= bound))
    errors = [f"{c['shape']} {c['variant']}: {c['error']}" for c in cells if "error" in c]
    return {"copy_bandwidth_tb_s": round(bandwidth / 1e12, 2), "cells": cells,
            "failures": errors, "targets": targets}


def tree_targets(device: torch.device, backend: str, dry_run: bool,
                 left: Callable[[], float]) -> dict[str, Any]:
    """Trees: launches per call, eager (1, 8, 32000) greedy, device time against the floor."""
    from portable_verify.bench.gpu_check_tree import tree_call

    shapes = ((2, 4, 64),) if dry_run else ((1, 8, 32000), *TREE_DEVICE_CELLS)
    cells: list[dict[str, Any]] = []
    bandwidth = floor.copy_bandwidth(device) if is_cuda(device) else None
    for shape in shapes:
        for mode, method in (("deterministic", "greedy"), ("iid", "rejection")):
            if left() < 5:
                continue
            call = {**tree_call(*shape, mode, 7, device), "method": method, "validate": False}

            def fn(c=call) -> Any:
                return pv.verify_tree(**c, backend=backend)

            cell: dict[str, Any] = {"shape": shape, "children": mode, "method": method}
            try:
                fn()
                if is_cuda(device):
                    cell.update(launches(fn))
                    cell["eager"] = eager_us({"tree": fn}, device)["tree"]
                    cell["device"] = graph_device_us(fn, device)
                    b, n, v = shape
                    cell["floor_us"] = round(b * n * v * 4 / (bandwidth or 1) * 1e6, 2)
            except Exception as exc:
                cell["error"] = f"{type(exc).__name__}: {exc}"[:400]
            cells.append(cell)
    targets = []
    measured = [c for c in cells if "launches" in c]
    if measured:
        most = max(c["launches"] for c in measured)
        targets.append(target("tree launches per call", most, "<= 2", most <= 2))
    for c in measured:
        if tuple(c["shape"]) == (1, 8, 32000) and methods.greedy_only(c["method"]):
            us = c["eager"]["median_us"]
            targets.append(target("tree (1,8,32000) greedy eager", f"{us} us", "<= 50 us",
                                  us <= 50))
        if tuple(c["shape"]) in TREE_DEVICE_CELLS:
            us, bound = c["device"]["median_us"], 2 * (c["floor_us"] + OVERHEAD_US)
            targets.append(target(f"tree {c['shape']} {c['method']} device time", f"{us} us",
                                  f"<= 2x (floor + 5) = {bound:.1f} us", us <= bound))
    errors = [f"{c['shape']} {c['method']}: {c['error']}" for c in cells if "error" in c]
    return {"cells": cells, "failures": errors, "targets": targets}
