"""One-shot check of the CUDA backend on a machine with an NVIDIA GPU: exactness, then speed.

Usage (from the repository root; ``bench/gpu_check.sh OUT`` wraps it with a time limit)::

    PYTHONPATH=. python bench/gpu_check.py OUT_DIR

Needs only torch (with CUDA), triton and numpy; pytest is used when present. Each section is
guarded: a failure is recorded and the next section still runs, and ``OUT_DIR/gpu_check.json``
is rewritten after every section, so a timeout still leaves what was measured. Sections:

1. environment and ``backend_status()``;
2. kernels vs the numpy reference on random cases (small V must agree exactly; at large V the
   agreement rate is reported next to the torch backend's, see docs/backends.md);
3. CUDA-graph capture and replay of a kernel call;
4. timing: Triton kernels vs the torch eager backend vs the memory-read floor (one
   ``torch.amax`` over exactly the input bytes), CUDA events, median of repeats;
5. ``tests/test_triton.py`` on ``device="cuda"`` (pytest subprocess);
6. the conformance kit's quick checks on ``backend="cuda"`` (subprocess), if time is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # works without `pip install -e .`

import portable_verify as pv  # noqa: E402
from portable_verify.core.types import VerifyInputs  # noqa: E402

DEADLINE_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "330"))
BENCH_METHODS = ["greedy", "rejection", "rejection_probs"]
START = time.monotonic()
# GPU_CHECK_DRY_RUN=1 rehearses every section on CPU (kernels through the interpreter, tiny
# shapes, perf_counter timing) so the script itself is tested where no GPU is lent.
DRY_RUN = os.environ.get("GPU_CHECK_DRY_RUN") == "1"
DEVICE = "cpu" if DRY_RUN else "cuda"
KERNELS = "triton" if DRY_RUN else "cuda"
BENCH_SHAPES = ([(1, 2, 64), (2, 2, 96)] if DRY_RUN else
                [(1, 2, 32000), (8, 4, 32000), (32, 4, 32000), (64, 5, 128256)])
EXACT_SHAPES = ([(3, 2, 37), (2, 2, 70)] if DRY_RUN else
                [(6, 3, 37), (8, 4, 64), (5, 2, 1000), (4, 4, 32000), (2, 3, 128256)])


def left() -> float:
    return DEADLINE_S - (time.monotonic() - START)


class Report:
    """The JSON document, rewritten after every section."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.data: dict[str, Any] = {"sections": {}}

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        print(f"== {name} ({left():.0f} s left)", flush=True)
        try:
            result = {"ok": True, "result": fn()}
        except Exception as exc:  # record and continue: one shot, every section counts
            traceback.print_exc()
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-4000:]}
        result["seconds"] = round(time.monotonic() - t0, 2)
        self.data["sections"][name] = result
        self.save()
        return result

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2, default=str))


# ---------------------------------------------------------------------------------------------
# 1. environment


def environment() -> dict[str, Any]:
    import numpy as np

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "numpy": np.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:
        info["triton"] = f"not importable: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device"] = props.name
        info["capability"] = f"{props.major}.{props.minor}"
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    info["backend_status"] = {k: [v.available, v.reason] for k, v in pv.backend_status().items()}
    return info


# ---------------------------------------------------------------------------------------------
# 2. exactness


def random_case(g: torch.Generator, b: int, k: int, v: int) -> dict[str, torch.Tensor]:
    """Mixed greedy/sampled rows, ragged drafts, -inf logits, drafts often equal to the argmax."""
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    logits[torch.rand(b, k + 1, v, generator=g) < 0.05] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp(min=-5.0)
    drafts = torch.randint(0, v, (b, k), generator=g)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, logits[:, :k].argmax(-1), drafts)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    return {
        "logits": logits,
        "probs": torch.softmax(logits, -1),
        "q": q,
        "drafts": drafts,
        "n": torch.randint(0, k + 1, (b,), generator=g),
        "temp": (torch.rand(b, generator=g) * 1.5 + 0.25) * (torch.rand(b, generator=g) > 0.3),
        "u": torch.randint(1, 2**24 + 1, (b, k + 1), generator=g).float() * 2.0**-24,
    }


def case_kwargs(case: dict[str, torch.Tensor], target: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"num_draft_tokens": case["n"], "uniforms": case["u"]}
    if target.startswith("logits"):
        kw.update(target_logits=case["logits"], temperature=case["temp"])
    else:
        kw.update(target_probs=case["probs"], temperature=(case["temp"] > 0).float())
    if target.endswith("+q"):
        kw["draft_probs"] = case["q"]
    return kw


def exactness() -> dict[str, Any]:
    """Per (V, method, target): rows whose tokens / accepted counts equal the reference's."""
    g = torch.Generator().manual_seed(20260601)
    rows: list[dict[str, Any]] = []
    for b, k, v in EXACT_SHAPES:
        for method in ("greedy", "rejection", "typical"):
            for target in ("logits", "probs", "logits+q", "probs+q"):
                if left() < 200:
                    return {"rows": rows, "stopped_early": True}
                case = random_case(g, b, k, v)
                kw = case_kwargs(case, target)
                want = pv.verify(case["drafts"], method=method, backend="numpy", **kw)
                on_gpu = {n: x.to(DEVICE) if isinstance(x, torch.Tensor) else x
                          for n, x in kw.items()}
                entry: dict[str, Any] = {"B": b, "K": k, "V": v, "method": method,
                                         "target": target}
                for backend in (KERNELS, "torch"):
                    try:
                        got = pv.verify(case["drafts"].to(DEVICE), method=method,
                                        backend=backend, **on_gpu)
                    except Exception as exc:  # keep going: the other backend still counts
                        entry[backend] = {"rows_equal": 0, "accepted_equal": 0, "rows": b,
                                          "error": f"{type(exc).__name__}: {exc}"[:2000]}
                        continue
                    tok = (got.token_ids.cpu() == want.token_ids).all(1)
                    acc = got.num_accepted.cpu() == want.num_accepted
                    entry[backend] = {"rows_equal": int(tok.sum()), "accepted_equal":
                                      int(acc.sum()), "rows": b}
                rows.append(entry)
    small = [r for r in rows if r["V"] <= 1000]
    return {
        "rows": rows,
        "small_v_all_exact": all(r[KERNELS]["rows_equal"] == r["B"] for r in small),
        "all_accepted_counts_equal": all(r[KERNELS]["accepted_equal"] == r["B"] for r in rows),
    }


# ---------------------------------------------------------------------------------------------
# 3 + 4. inputs for direct backend calls, CUDA graphs, timing


def bench_inputs(b: int, k: int, v: int, method: str, seed: int = 0) -> VerifyInputs:
    """Padded-layout inputs on the GPU, as ``verify`` builds them (all drafts used)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    dev = DEVICE
    logits = torch.randn(b * (k + 1), v, device=dev, generator=g) * 2
    drafts = torch.randint(0, v, (b, k), device=dev, generator=g)
    sampled = method != "greedy"
    q = torch.softmax(torch.randn(b * k, v, device=dev, generator=g), -1) if sampled else None
    target = torch.softmax(logits, -1) if method == "rejection_probs" else logits
    return VerifyInputs(
        draft_token_ids=drafts,
        num_draft_tokens=torch.full((b,), k, dtype=torch.int64, device=dev),
        target=target,
        target_rows=(torch.arange(b, device=dev)[:, None] * (k + 1)
                     + torch.arange(k + 1, device=dev)[None, :]),
        target_is_logits=method != "rejection_probs",
        draft_probs=q,
        draft_rows=(torch.arange(b, device=dev)[:, None] * k
                    + torch.arange(k, device=dev)[None, :]) if sampled else None,
        temperature=torch.full((b,), 1.0 if sampled else 0.0, device=dev),
        all_greedy=not sampled,
        none_greedy=sampled,
        sampled_method="rejection",
        uniforms=(torch.rand(b, k + 1, device=dev, generator=g).clamp_(min=2**-24)
                  if sampled else None),
    )


def cuda_time_ms(fn: Callable[[], Any], reps: int = 5, target_ms: float = 25.0) -> float:
    """Median over ``reps`` of the mean time per call, CUDA events, after warm-up."""
    if DRY_RUN:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    iters = int(min(200, max(3, target_ms / max(start.elapsed_time(end), 1e-3))))
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def graph_of(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture ``fn`` (already warmed up) in a CUDA graph; returns the graph and its outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_check() -> dict[str, Any]:
    """Capture a kernel call, change the inputs in place, replay, compare with eager."""
    if DRY_RUN:
        return {"skipped": "no CUDA graphs on CPU"}
    backend = pv.get_backend(KERNELS)
    results = {}
    for method in BENCH_METHODS:
        try:
            results[method] = _graph_replay_matches(backend, method)
        except Exception as exc:
            results[method] = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        results["pv.verify(validate=False)"] = _graph_of_full_call_matches()
    except Exception as exc:
        results["pv.verify(validate=False)"] = f"{type(exc).__name__}: {exc}"[:2000]
    return {"replay_matches_eager": results}


def _graph_of_full_call_matches() -> bool:
    """The whole public call, not just the kernels, captured and replayed."""
    g = torch.Generator(device=DEVICE).manual_seed(3)
    logits = torch.randn(4, 4, 500, device=DEVICE, generator=g)
    q = torch.softmax(torch.randn(4, 3, 500, device=DEVICE, generator=g), -1)
    drafts = torch.randint(0, 500, (4, 3), device=DEVICE, generator=g)
    u = torch.rand(4, 4, device=DEVICE, generator=g).clamp_(min=2**-24)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3], device=DEVICE)

    def call() -> Any:
        res = pv.verify(drafts, target_logits=logits, draft_probs=q, uniforms=u,
                        temperature=temp, backend=KERNELS, validate=False)
        return res.token_ids, res.num_accepted

    graph, (tokens, accepted) = graph_of(call)
    logits.copy_(torch.randn(4, 4, 500, device=DEVICE, generator=g))
    u.copy_(torch.rand(4, 4, device=DEVICE, generator=g).clamp_(min=2**-24))
    graph.replay()
    torch.cuda.synchronize()
    want_tokens, want_accepted = call()
    return bool(torch.equal(tokens, want_tokens) and torch.equal(accepted, want_accepted))


def _graph_replay_matches(backend: Any, method: str) -> bool:
    """Capture on one set of inputs, overwrite them in place, replay, compare with eager."""
    inputs = bench_inputs(4, 3, 1000, method, seed=1)
    graph, (tokens, accepted) = graph_of(lambda: backend.run(inputs))
    fresh = bench_inputs(4, 3, 1000, method, seed=2)
    for name in ("target", "draft_token_ids", "draft_probs", "uniforms"):
        if getattr(inputs, name) is not None:
            getattr(inputs, name).copy_(getattr(fresh, name))
    graph.replay()
    torch.cuda.synchronize()
    want_tokens, want_accepted = backend.run(fresh)
    return bool(torch.equal(tokens, want_tokens) and torch.equal(accepted, want_accepted))


def benchmark() -> dict[str, Any]:
    from portable_verify.backends.torch_eager import verify_torch

    backend = pv.get_backend(KERNELS)
    rows = []
    for b, k, v in BENCH_SHAPES:
        for method in BENCH_METHODS:
            if left() < 130:
                return {"rows": rows, "stopped_early": True}
            inputs = bench_inputs(b, k, v, method)
            nbytes = inputs.target.numel() * inputs.target.element_size()
            if inputs.draft_probs is not None:
                nbytes += inputs.draft_probs.numel() * inputs.draft_probs.element_size()
            flat = torch.empty(nbytes // 4, dtype=torch.float32, device=DEVICE).normal_()
            eager = verify_torch(inputs)
            row: dict[str, Any] = {
                "B": b, "K": k, "V": v, "method": method, "input_mb": round(nbytes / 1e6, 1),
                "torch_ms": cuda_time_ms(lambda inputs=inputs: verify_torch(inputs)),
                "floor_ms": cuda_time_ms(lambda flat=flat: torch.amax(flat)),
                "triton_ms": None, "triton_graph_ms": None,
            }
            try:  # the kernels may fail where torch does not: keep torch's and the floor's rows
                tri = backend.run(inputs)
                row["triton_equals_torch_accepted"] = bool(torch.equal(tri[1], eager[1]))
                row["triton_equals_torch_tokens"] = bool(torch.equal(tri[0], eager[0]))
                row["triton_ms"] = cuda_time_ms(lambda inputs=inputs: backend.run(inputs))
                if not DRY_RUN:
                    graph, _ = graph_of(lambda inputs=inputs: backend.run(inputs))
                    row["triton_graph_ms"] = cuda_time_ms(graph.replay)
            except Exception as exc:
                row["triton_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            if row["triton_ms"]:
                row["torch_over_triton"] = round(row["torch_ms"] / row["triton_ms"], 2)
                row["triton_over_floor"] = round(row["triton_ms"] / row["floor_ms"], 2)
                row["triton_gb_s"] = round(nbytes / row["triton_ms"] / 1e6, 1)
            rows.append(row)
            print(f"   {row}", flush=True)
            del inputs, flat
            if not DRY_RUN:
                torch.cuda.empty_cache()
    return {"rows": rows}


def bench_table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'B,K,V':>16} {'method':>16} {'MB':>7} {'triton':>9} {'graph':>9} {'torch':>9} "
            f"{'floor':>9} {'torch/tri':>9} {'tri/floor':>9} {'tri GB/s':>9}")
    lines = ["times in ms per call (CUDA events, median of 5)", head]
    def cell(value: Any, fmt: str = ".4f") -> str:
        return "-" if value is None else format(value, fmt)

    for r in rows:
        shape = f"{r['B']},{r['K']},{r['V']}"
        lines.append(
            f"{shape:>16} {r['method']:>16} {r['input_mb']:>7} {cell(r['triton_ms']):>9} "
            f"{cell(r['triton_graph_ms']):>9} {cell(r['torch_ms']):>9} {cell(r['floor_ms']):>9} "
            f"{cell(r.get('torch_over_triton'), ''):>9} {cell(r.get('triton_over_floor'), ''):>9} "
            f"{cell(r.get('triton_gb_s'), ''):>9}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# 5 + 6. the project's tests, in subprocesses with time limits


def run_subprocess(name: str, cmd: list[str], out: Path, limit: float) -> dict[str, Any]:
    if limit < 20:
        return {"skipped": f"only {limit:.0f} s left"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                   "")]),
               PORTABLE_VERIFY_TEST_DEVICE=DEVICE)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=limit)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMED OUT after {limit:.0f} s"
        rc = None
    (out / f"{name}.txt").write_text(text if isinstance(text, str) else str(text))
    return {"returncode": rc, "tail": str(text)[-1500:]}


def pytest_on_cuda(out: Path) -> dict[str, Any]:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "pytest is not installed; section 2 covers the same ground"}
    cmd = [sys.executable, "-m", "pytest", "tests/test_triton.py", "-q", "-p", "no:cacheprovider",
           "-x", "--tb=short"]
    if DRY_RUN:
        cmd += ["-k", "ties or degenerate"]
    return run_subprocess("pytest_test_triton_cuda", cmd, out, min(150.0, left() - 20))


CONFORMANCE_SNIPPET = """
import json, sys
from portable_verify.testing.kit import run_conformance
res = run_conformance(sys.argv[1], quick=True)
print(json.dumps([{"name": r.name, "passed": r.passed, "skipped": r.skipped,
                   "detail": r.detail[:300]} for r in res]))
"""


def conformance_on_cuda(out: Path) -> dict[str, Any]:
    if DRY_RUN:
        return {"skipped": "dry run"}
    result = run_subprocess("conformance_cuda", [sys.executable, "-c", CONFORMANCE_SNIPPET,
                                                 KERNELS], out, left() - 10)
    with contextlib.suppress(Exception):  # the last line is the JSON list when all went well
        result["checks"] = json.loads(result["tail"].strip().splitlines()[-1])
    return result


def verdict(sections: dict[str, Any]) -> dict[str, Any]:
    """The few answers a reader wants first, pulled out of the sections (None: not measured)."""

    def get(name: str, *keys: str) -> Any:
        value: Any = sections.get(name, {}).get("result")
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    graph = get("cuda_graph", "replay_matches_eager")
    checks = get("conformance_cuda_quick", "checks")
    bench_rows = get("benchmark", "rows") or []
    return {
        "small_v_exact": get("exactness", "small_v_all_exact"),
        "accepted_counts_equal": get("exactness", "all_accepted_counts_equal"),
        "graph_replay_ok": None if not isinstance(graph, dict) else all(
            v is True for v in graph.values()),
        "bench_kernels_ran": bool(bench_rows) and all(r.get("triton_ms") for r in bench_rows),
        "pytest_returncode": get("pytest_test_triton_cuda", "returncode"),
        "conformance_failed": None if checks is None else [
            c["name"] for c in checks if not c["passed"] and not c["skipped"]],
    }


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    env = report.section("environment", environment)
    if not (DRY_RUN or torch.cuda.is_available()):
        print("no CUDA device: nothing to check", flush=True)
        return 2
    print(json.dumps(env.get("result", {}), indent=1, default=str), flush=True)
    report.section("exactness", exactness)
    report.section("cuda_graph", graph_check)
    bench = report.section("benchmark", benchmark)
    if bench["ok"]:
        table = bench_table(bench["result"]["rows"])
        (out / "gpu_check.txt").write_text(table + "\n")
        print(table, flush=True)
    report.section("pytest_test_triton_cuda", lambda: pytest_on_cuda(out))
    report.section("conformance_cuda_quick", lambda: conformance_on_cuda(out))
    summary = {name: s["ok"] for name, s in report.data["sections"].items()}
    report.data["summary"] = summary
    report.data["verdict"] = verdict(report.data["sections"])
    print("verdict:", json.dumps(report.data["verdict"]), flush=True)
    report.data["total_seconds"] = round(time.monotonic() - START, 1)
    report.save()
    print(json.dumps(summary), f"{report.data['total_seconds']} s", flush=True)
    return 0 if all(summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
