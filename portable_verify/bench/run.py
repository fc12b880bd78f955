"""The benchmark grid runner: for every cell, time our verifier beside its baselines.

One *measurement* is one (device, dtype, shape, variant); inside it every contender is timed
interleaved (see :mod:`portable_verify.bench.harness`): each requested backend, the dense
baseline, the memory-read floor, a plain ``torch.argmax`` and ``torch.amax`` over the target,
HF's verifier (batch 1, rejection), vLLM v0's typical sampler (typical) and, optionally, our
verifier with validation on (``validate=True``; with ``"full"`` also ``validate="full"``). One
result row ("cell") is then reported per backend and thread count, with the ratios the
performance targets (:mod:`portable_verify.bench.targets`) ask for.

On an accelerator each call is timed with a sync after it, the floor is the must-read bytes over
the device's copy bandwidth (:func:`portable_verify.bench.floor.copy_bandwidth`), and on CUDA
each verify call's device time by graph replay
(:func:`portable_verify.bench.harness.device_time_by_graph`) sits beside its eager time.

A thread sweep (``threads=(1, 2, ...)``) times every contender at every count inside the same
interleaved repetitions (:mod:`portable_verify.bench.threads` sets the count before each block),
so a burst of load hits all counts alike; each cell then reports its speed-up over the first
count, beside ``torch.amax``'s over the same target (a memory-bound reduction that scales
with threads: the reference for how much a second thread can give).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import portable_verify as pv
from portable_verify.bench import environment, floor, numba_runtime, peers, targets, threads
from portable_verify.bench.cases import VARIANTS, CaseInputs, Shape, Variant, make_inputs
from portable_verify.bench.dense import DENSE_METHODS, dense_verify
from portable_verify.bench.harness import DeviceTiming, Timing, device_time_by_graph, measure
from portable_verify.core import methods
from portable_verify.core.types import DEFAULT_TYPICAL
from portable_verify.dispatch import select_backend

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BenchConfig:
    shapes: tuple[Shape, ...]
    devices: list[torch.device]
    backends: list[str] = field(default_factory=lambda: ["auto"])
    variants: tuple[Variant, ...] = VARIANTS
    dtypes: tuple[str, ...] = ("float32",)
    repetitions: int = 7
    warmup: int = 1
    min_block_s: float = 0.02
    validation: bool | str = False  # False, True (validate=True) or "full" (both levels)
    threads: tuple[int, ...] = (1,)  # ascending; a sweep when more than one
    clock: str = "wall"  # "wall" or "cpu" (thread CPU time; one-thread CPU runs only)
    graph_reps: int = 50  # CUDA devices: replays timed for each verify's device time (0: none)


@dataclass(frozen=True)
class Measurement:
    device: torch.device
    dtype: str
    shape: Shape
    variant: Variant


def plan(config: BenchConfig) -> list[Measurement]:
    """Every measurement of the grid, skipping dtypes a device cannot run."""
    out = []
    for device in config.devices:
        for dtype in config.dtypes:
            if not environment.dtype_supported(DTYPES[dtype], device):
                print(f"bench: skipping {dtype} on {device}: not supported", file=sys.stderr)
                continue
            for shape in config.shapes:
                out.extend(Measurement(device, dtype, shape, v) for v in config.variants)
    return out


def resolve_backends(requested: list[str], device: torch.device,
                     method: str | None = None) -> list[str]:
    """Backend names to time on ``device`` (``auto`` becomes the backend it selects for
    ``method``)."""
    names: list[str] = []
    for name in requested:
        sampled = None if method is None or methods.greedy_only(method) else method
        chosen = (select_backend(name, device.type, sampled).qualified_name
                  if name == "auto" else name)  # not a method: the backend name
        if sampled is not None and not pv.get_backend(chosen).traits.implements("chain", sampled):
            print(f"bench: {chosen} does not implement method={sampled!r}; not timed",
                  file=sys.stderr)
            continue
        if chosen not in names:
            names.append(chosen)
    return names


VALIDATION_CONTENDERS = {"validate": True, "validate_full": "full"}


def _contenders(m: Measurement, inputs: CaseInputs, backends: list[str],
                validation: bool | str) -> tuple[dict[str, Callable[[], object]], dict[str, Any]]:
    kw = inputs.verify_kwargs(m.variant)
    contenders: dict[str, Callable[[], object]] = {}
    for name in backends:
        contenders[f"verify:{name}"] = (
            lambda name=name: pv.verify(inputs.drafts, seed=inputs.seeds, backend=name,
                                        validate=False, **kw)
        )
    levels = {"validate"} if validation is True else set(VALIDATION_CONTENDERS)
    for key in sorted(levels) if validation else ():
        contenders[key] = (
            lambda level=VALIDATION_CONTENDERS[key]: pv.verify(
                inputs.drafts, seed=inputs.seeds, backend=backends[0], validate=level, **kw)
        )
    if m.variant.method not in DENSE_METHODS:
        # Token-wise rejection on the very same inputs, timed beside it (block's target ratio);
        # the dense baseline has no such rule, so it runs rejection too.
        kw_rejection = {**kw, "method": "rejection"}
        contenders["rejection_same_inputs"] = lambda: pv.verify(
            inputs.drafts, seed=inputs.seeds, backend=backends[0], validate=False,
            **kw_rejection)
        contenders["dense"] = lambda: dense_verify(inputs.drafts, **kw_rejection)
    else:
        contenders["dense"] = lambda: dense_verify(inputs.drafts, **kw)
    parts = floor.must_read(inputs, m.variant)
    floor_ms = None
    if m.device.type == "cpu":
        floor_impl, contenders["floor"] = floor.floor_callable(parts)
    else:  # a reduction over a few MB times the launch: bytes over the copy bandwidth instead
        bandwidth = floor.copy_bandwidth(m.device)
        floor_impl = f"copy bandwidth {bandwidth / 1e9:.0f} GB/s"
        floor_ms = floor.bandwidth_floor_ms(floor.num_bytes(parts), bandwidth)
    contenders["argmax"] = lambda: torch.argmax(inputs.target, dim=-1)
    contenders["amax"] = lambda: torch.amax(inputs.target, dim=-1)
    builders: dict[str, Callable[[], Callable[[], object] | None]] = {
        "vllm_v0_typical": lambda: peers.vllm_v0_typical_callable(
            inputs, m.variant, DEFAULT_TYPICAL.eps, DEFAULT_TYPICAL.alpha)}
    if peers.hf_status().available:
        builders = {"hf": lambda: peers.hf_callable(inputs, m.variant), **builders}
    peer_errors: dict[str, str] = {}
    for name, build in builders.items():
        call, why = peers.guarded(build)
        if call is not None:
            contenders[name] = call
        elif why is not None:
            peer_errors[name] = why
    return contenders, {"floor_impl": floor_impl, "floor_bytes": floor.num_bytes(parts),
                        "floor_ms": floor_ms, "acceptance": inputs.acceptance,
                        "peer_errors": peer_errors}


def _graph_times(contenders: dict[str, Callable[[], object]], backends: list[str],
                 device: torch.device, reps: int) -> dict[str, DeviceTiming | str] | None:
    """Each backend's device time by graph replay on a CUDA device (None elsewhere, or with
    ``reps`` 0); a call that cannot be captured gets its reason instead."""
    if device.type != "cuda" or reps < 1:
        return None
    out: dict[str, DeviceTiming | str] = {}
    for name in backends:
        try:
            out[name] = device_time_by_graph(contenders[f"verify:{name}"], device, reps=reps)
        except Exception as exc:  # an uncapturable backend is reported, not fatal
            out[name] = f"{type(exc).__name__}: {exc}"[:500]
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


def _spread(t: Timing, clock: str) -> dict[str, float]:
    """Fastest and slowest repetition of a contender on the reported clock (ms per call)."""
    low, high = (t.cpu_min_s, t.cpu_max_s) if clock == "cpu" else (t.min_s, t.max_s)
    return {"min": low * 1e3, "max": high * 1e3}


def _thread_ratios(ms: dict[str, float], name: str, count: int, base: int,
                   backends: list[str]) -> dict[str, float | None]:
    """Speed-ups over the sweep's first count (None at the first count itself: nothing was
    compared), and against the torch backend at this count."""
    ours, amax = ms[f"verify:{name}@{count}"], ms[f"amax@{count}"]
    compared = count != base
    thread_speedup = _ratio(ms[f"verify:{name}@{base}"], ours) if compared else None
    amax_speedup = _ratio(ms[f"amax@{base}"], amax) if compared else None
    torch_name = next((b for b in backends if b.startswith("torch:") and b != name), None)
    return {
        "x_amax": _ratio(ours, amax),
        "thread_speedup": thread_speedup,
        "amax_thread_speedup": amax_speedup,
        "thread_scaling_vs_amax": _ratio(thread_speedup, amax_speedup),
        "speedup_vs_torch_backend": (_ratio(ms[f"verify:{torch_name}@{count}"], ours)
                                     if torch_name else None),
    }


def _cells(m: Measurement, backends: list[str], timings: dict[str, Timing],
           info: dict[str, Any], clock: str, counts: tuple[int, ...]) -> list[dict[str, Any]]:
    """Result rows, one per (thread count, backend); times and ratios use ``clock``, the other
    clock's times are kept too. ``timings`` is keyed ``contender@count``."""
    wall = {name: t.median_s * 1e3 for name, t in timings.items()}
    cpu = {name: t.cpu_median_s * 1e3 for name, t in timings.items()}
    all_ms, all_other = (cpu, wall) if clock == "cpu" else (wall, cpu)
    b, k, v = m.shape
    cells = []
    for count in counts:
        at = f"@{count}"
        ms = {key[: -len(at)]: x for key, x in all_ms.items() if key.endswith(at)}
        other = {key[: -len(at)]: x for key, x in all_other.items() if key.endswith(at)}
        if info["floor_ms"] is not None:  # computed from the copy bandwidth, not timed
            ms["floor"] = other["floor"] = info["floor_ms"]
        for name in backends:
            t = ms[f"verify:{name}"]
            timing = timings[f"verify:{name}{at}"]
            cell: dict[str, Any] = {
                "device": str(m.device), "backend": name, "dtype": m.dtype, "threads": count,
                "threads_base": counts[0],
                "B": b, "K": k, "V": v, "variant": m.variant.label, "method": m.variant.method,
                "inputs": m.variant.inputs, "temperature": m.variant.temperature,
                "times_ms": {
                    "verify": t, "dense": ms["dense"], "floor": ms["floor"],
                    "argmax": ms.get("argmax"), "amax": ms.get("amax"), "hf": ms.get("hf"),
                    "vllm_v0_typical": ms.get("vllm_v0_typical"),
                    "verify_validated": ms.get("validate") if name == backends[0] else None,
                    "verify_validated_full": (ms.get("validate_full") if name == backends[0]
                                              else None),
                    "rejection_same_inputs": ms.get("rejection_same_inputs"),
                },
                "clock": clock,
                "other_clock_times_ms": {"verify": other[f"verify:{name}"],
                                         "dense": other["dense"], "floor": other["floor"]},
                "wall_spread_ms": {"min": timing.min_s * 1e3, "max": timing.max_s * 1e3},
                "spread_ms": _spread(timing, clock),
                "repetitions": timing.repetitions,
                "floor_impl": info["floor_impl"],
                "floor_bytes": info["floor_bytes"],
                "floor_GBps": info["floor_bytes"] / (ms["floor"] * 1e-3) / 1e9,
                "acceptance_per_position": info["acceptance"],
                "peer_errors": info["peer_errors"],
            }
            cell["ratios"] = {
                "speedup_vs_dense": _ratio(ms["dense"], t),
                "x_floor": _ratio(t, ms["floor"]),
                "x_argmax": _ratio(t, ms["argmax"]),
                "speedup_vs_argmax": (_ratio(ms["argmax"], t)
                                      if methods.greedy_only(m.variant.method) else None),
                "speedup_vs_hf": _ratio(ms.get("hf"), t),
                "speedup_vs_vllm_typical": _ratio(ms.get("vllm_v0_typical"), t),
                "validation_overhead": _ratio(cell["times_ms"]["verify_validated"], t),
                "validation_full_overhead": _ratio(cell["times_ms"]["verify_validated_full"], t),
                "x_rejection": _ratio(t, ms.get("rejection_same_inputs")),
                **_thread_ratios(all_ms, name, count, counts[0], backends),
            }
            if info.get("graph") is not None:
                _add_graph_time(cell, info["graph"][name])
            cell["targets"] = targets.evaluate(cell)
            cells.append(cell)
    return cells


def _add_graph_time(cell: dict[str, Any], timing: DeviceTiming | str) -> None:
    """The cell's device time by graph replay beside its eager time (or why there is none)."""
    graph = timing if isinstance(timing, DeviceTiming) else None
    cell["times_ms"]["graph"] = graph.median_s * 1e3 if graph else None
    cell["graph_spread_ms"] = ({"min": graph.min_s * 1e3, "max": graph.max_s * 1e3,
                                "reps": graph.reps, "l2_flushed": graph.l2_flushed}
                               if graph else None)
    cell["graph_error"] = None if graph else timing
    cell["ratios"]["graph_x_floor"] = _ratio(cell["times_ms"]["graph"],
                                             cell["times_ms"]["floor"])


def run(config: BenchConfig) -> Iterator[tuple[Measurement, list[dict[str, Any]]]]:
    """Yield ``(measurement, cells)`` one measurement at a time (for a progress bar); the
    thread counts of the caller's pools are restored at the end."""
    methods = {v.method for v in config.variants}
    backends_by = {(d, method): resolve_backends(config.backends, d, method)
                   for d in config.devices for method in methods}
    with threads.restored():
        for m in plan(config):
            backends = backends_by[(m.device, m.variant.method)]
            if not backends:
                continue
            inputs = make_inputs(m.shape, m.variant, DTYPES[m.dtype], m.device)
            base, info = _contenders(m, inputs, backends, config.validation)
            contenders = {f"{name}@{count}": fn for count in config.threads
                          for name, fn in base.items()}
            setups = {f"{name}@{count}": (lambda count=count: threads.apply(count))
                      for count in config.threads for name in base}
            timings = measure(contenders, m.device, repetitions=config.repetitions,
                              warmup=config.warmup, min_block_s=config.min_block_s,
                              setups=setups)
            info["graph"] = _graph_times(base, backends, m.device, config.graph_reps)
            yield m, _cells(m, backends, timings, info, config.clock, config.threads)
            del inputs, contenders, base


def metadata(config: BenchConfig, argv: list[str] | None) -> dict[str, Any]:
    """Everything needed to reproduce or judge a result file."""
    hf = peers.hf_status()
    accelerators = [d for d in config.devices if d.type != "cpu"]
    return {
        "command": "portable-verify " + " ".join(argv if argv is not None else sys.argv[1:]),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": environment.machine(),
        "devices": [str(d) for d in config.devices],
        "device_names": environment.devices(),
        "versions": environment.library_versions(),
        "threads": config.threads[0] if len(config.threads) == 1 else list(config.threads),
        "thread_counts": list(config.threads),
        "numba_threading": numba_runtime.threading() if "numba" in sys.modules else None,
        "repetitions": config.repetitions,
        "clock": config.clock,
        "dtypes": list(config.dtypes),
        "peers": {hf.name: {"available": hf.available, "detail": hf.detail}},
        **({"copy_bandwidth_GBps": {str(d): floor.copy_bandwidth(d) / 1e9 for d in accelerators},
            "graph_reps": config.graph_reps} if accelerators else {}),
        "targets_note": "targets apply to CPU float32 at 1 thread (thread-scaling targets at "
                        "2 threads); ratios are side by side",
    }
