"""OpenVINO backend vs the torch ``cpu`` backend, side by side, through the public ``verify``.

Interleaved repetitions in one process; each call is timed by the wall clock and by the
process CPU clock (all threads). Reported as ratios OpenVINO / cpu (< 1: OpenVINO is faster)
of medians, with 1 thread for both (``torch.set_num_threads(1)``, ``INFERENCE_NUM_THREADS=1``)
and with each library's default threading. On a shared machine the wall medians mostly measure
preemption (a call that outlives its time slice waits for the next one); the CPU-time ratio is
the stable figure there. Usage::

    python scripts/bench/openvino_vs_cpu.py [--reps 40] [--shape 32 4 32000] [--methods greedy ...]
                                    [--configs]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import numpy as np
import torch

import portable_verify as pv
from portable_verify.backends.openvino.backend import OpenVINOBackend
from portable_verify.dispatch import register_backend

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _case(b: int, k: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, k + 1, v, generator=g)
    drafts = logits[:, :k].argmax(-1)  # mostly accepted, as in a well-matched draft model
    drafts[::3, -1] = 0
    return drafts, logits


def _call(drafts: torch.Tensor, logits: torch.Tensor, method: str, backend: str) -> None:
    pv.verify(drafts, target_logits=logits, method=method, seed=1, backend=backend,
              validate=False)


def _times_ms(fns: dict[str, Callable[[], object]], reps: int) -> dict[tuple[str, str], float]:
    """Median milliseconds per (function, clock), repetitions interleaved."""
    times: dict[tuple[str, str], list[float]] = {(f, c): [] for f in fns for c in CLOCKS}
    for fn in fns.values():  # warm-up: compile graphs, fault pages in
        fn()
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[(name, "cpu")].append(time.process_time() - c0)
            times[(name, "wall")].append(time.perf_counter() - w0)
    return {key: 1e3 * float(np.median(t)) for key, t in times.items()}


def _argmax_alone(form: str) -> object:
    """The argmax forms the blocked one replaced: ``TopK(k=1)``, or ``ReduceMax`` then the first
    index equal to it over whole rows (``Equal``/``Select``/``ReduceMin``)."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter(ov.PartialShape([-1, -1]), ov.Type.f32, name="target")
    axis = ops.constant(np.array([1], np.int64))
    if form == "topk":
        out = ops.topk(x, ops.constant(np.int64(1)), 1, "max", "index", "i64").output(1)
    else:
        vocab = ops.gather(ops.shape_of(x, "i64"), ops.constant(np.int64(1)),
                           ops.constant(np.int64(0)))
        iota = ops.range(ops.constant(np.int64(0)), vocab, ops.constant(np.int64(1)), "i64")
        hit = ops.equal(x, ops.reduce_max(x, axis, True))
        out = ops.reduce_min(ops.select(hit, iota, vocab), axis, False)
    return ov.Model([out], [x])


def _config_study(drafts: torch.Tensor, logits: torch.Tensor, reps: int) -> None:
    """The greedy graph alone under the settings docs/backends.md discusses, interleaved."""
    import openvino as ov

    from portable_verify.backends.openvino import chain_graphs as graphs
    from portable_verify.backends.openvino.record import call_scalars
    from portable_verify.core.types import DEFAULT_TYPICAL

    b, k1, v = logits.shape
    rows = (np.arange(b)[:, None] * k1 + np.arange(k1)).astype(np.int64)
    feed = [logits.reshape(-1, v).numpy(), rows, drafts.numpy(), np.full(b, k1 - 1, np.int64),
            call_scalars(v, DEFAULT_TYPICAL)]
    core = ov.Core()
    base = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}

    def request(**extra: object) -> object:
        model = graphs.build(graphs.Variant())
        return core.compile_model(model, "CPU", {**base, **extra}).create_infer_request()

    pinned, unpinned, copied = request(), request(ENABLE_CPU_PINNING=False), request(
        ENABLE_CPU_PINNING=False)
    topk, full_row = (
        core.compile_model(_argmax_alone(form), "CPU", {**base, "ENABLE_CPU_PINNING": False})
        .create_infer_request() for form in ("topk", "full_row")
    )
    fns = {
        "argmax alone: TopK(k=1)": lambda: topk.infer(feed[:1], share_inputs=True),
        "argmax alone: full-row first max": lambda: full_row.infer(feed[:1], share_inputs=True),
        "pinning on, shared inputs": lambda: pinned.infer(feed, share_inputs=True),
        "pinning off, shared inputs": lambda: unpinned.infer(feed, share_inputs=True),
        "pinning off, copied inputs": lambda: copied.infer(feed, share_inputs=False),
        "numpy argmax (reference point)": lambda: np.argmax(feed[0], axis=-1),
    }
    ms = _times_ms(fns, reps)
    print(f"greedy graph alone, 1 thread, target [{b * k1}, {v}]; median ms (wall / CPU)")
    for name in fns:
        print(f"  {name:<34} {ms[(name, 'wall')]:>7.2f} {ms[(name, 'cpu')]:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--shape", type=int, nargs=3, default=[32, 4, 32000],
                        metavar=("B", "K", "V"))
    parser.add_argument("--methods", nargs="+", default=["greedy", "rejection", "typical"])
    parser.add_argument("--configs", action="store_true",
                        help="also time the greedy graph under pinning / input-sharing settings")
    args = parser.parse_args()
    b, k, v = args.shape
    drafts, logits = _case(b, k, v)
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if args.configs:
        _config_study(drafts, logits, args.reps)
    register_backend("openvino-1t", lambda s: OpenVINOBackend(s, num_threads=1))
    print(f"B={b} K={k} V={v} float32 logits, validate=False, {args.reps} interleaved reps; "
          "median ms")
    print(f"{'method':<10} {'threads':<8} {'cpu wall':>9} {'ov wall':>8} {'ratio':>6}"
          f" {'cpu CPU':>8} {'ov CPU':>7} {'ratio':>6}")
    for method in args.methods:
        for label, threads, ov_name in (("1", 1, "openvino-1t"),
                                        ("default", default_threads, "openvino")):
            torch.set_num_threads(threads)
            fns = {name: functools.partial(_call, drafts, logits, method, backend)
                   for name, backend in (("cpu", "cpu"), ("ov", ov_name))}
            ms = _times_ms(fns, args.reps)
            row = [ms[("cpu", "wall")], ms[("ov", "wall")], ms[("cpu", "cpu")], ms[("ov", "cpu")]]
            print(f"{method:<10} {label:<8} {row[0]:>9.2f} {row[1]:>8.2f} {row[1] / row[0]:>6.2f}"
                  f" {row[2]:>8.2f} {row[3]:>7.2f} {row[3] / row[2]:>6.2f}")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
