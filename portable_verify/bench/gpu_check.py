"""The GPU check: one prepared run on a machine with an NVIDIA GPU, exactness first, then speed.

Why one run: GPU machines are lent briefly, so everything worth knowing (do the kernels decide
like the numpy reference, do they survive CUDA-graph capture, how fast are they beside the
torch backend and the memory-read floor, do the tests and the quick conformance kit pass on
the device) is gathered by one command, each section guarded, and the JSON rewritten after
every section so a time-out still leaves what was measured.

Speed reuses the benchmark itself (:mod:`portable_verify.bench.run`: its shapes, variants,
interleaved harness, dense baseline and floor); cases come from the test suite's one builder
(:mod:`portable_verify.testing.cases.random_cases`). ``dry_run`` rehearses every section on the
CPU (kernels through Triton's interpreter, tiny shapes) so the check itself stays tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import portable_verify as pv
from portable_verify.bench import environment, gpu_check_tree
from portable_verify.bench.cases import FULL_SHAPES, VARIANTS, make_inputs
from portable_verify.bench.run import BenchConfig
from portable_verify.bench.run import run as run_bench
from portable_verify.testing.cases.random_cases import CaseSpec, build_case

EXACT_SHAPES = ((6, 3, 37), (8, 4, 64), (5, 2, 1000), (4, 4, 32000), (2, 3, 128256))
DRY_EXACT_SHAPES = ((3, 2, 37), (2, 2, 70))
DRY_BENCH_SHAPES = ((1, 2, 64), (2, 2, 96))
SMALL_VOCAB = 1000
"""At or below it the kernels must agree with the reference exactly; above it float32 sums in
a different order may flip near-ties (the agreement rate is reported beside torch's)."""


@dataclass
class GpuCheck:
    """Where and how long: the device, the kernels' backend, the time budget, the output."""

    out: Path
    budget_s: float = 330.0
    dry_run: bool = False
    started: float = field(default_factory=time.monotonic)
    data: dict[str, Any] = field(default_factory=lambda: {"sections": {}})

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    @property
    def kernels(self) -> str:
        return "triton:interpreter" if self.dry_run else "triton:cuda"

    @property
    def torch_backend(self) -> str:
        return "torch:cpu" if self.dry_run else "torch:cuda"

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def section(self, name: str, fn: Callable[[], Any], say: Callable[[str], None]) -> Any:
        """Run one section, record its result or its error, save the JSON."""
        t0 = time.monotonic()
        say(f"== {name} ({self.left():.0f} s left)")
        try:
            result: dict[str, Any] = {"ok": True, "result": fn()}
        except Exception as exc:  # record and go on: every section of a one-shot run counts
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-4000:]}
            say(result["traceback"])
        result["seconds"] = round(time.monotonic() - t0, 2)
        self.data["sections"][name] = result
        self.save()
        return result

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2, default=str))


def device_available(dry_run: bool) -> tuple[bool, str]:
    """Whether the check can run here, and why not."""
    if dry_run:
        return True, "dry run on the CPU (Triton interpreter)"
    if not torch.cuda.is_available():
        return False, ("no CUDA device here (torch.cuda.is_available() is False): run it on a "
                       "machine with an NVIDIA GPU, or pass --dry-run to rehearse on the CPU")
    return True, torch.cuda.get_device_name(0)


def environment_section() -> dict[str, Any]:
    info: dict[str, Any] = {
        "machine": environment.machine(), "devices": environment.devices(),
        "versions": environment.library_versions(), "torch_cuda": torch.version.cuda,
        "backends": {k: [v.available, v.reason] for k, v in pv.backend_status().items()},
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["capability"] = f"{props.major}.{props.minor}"
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def exactness(check: GpuCheck) -> dict[str, Any]:
    """Per (shape, method, input form): rows whose tokens and accepted counts equal numpy's."""
    rows: list[dict[str, Any]] = []
    shapes = DRY_EXACT_SHAPES if check.dry_run else EXACT_SHAPES
    seed = 20260601
    for b, k, v in shapes:
        for method in pv.core.methods.distinct("chain"):
            for form in ("logits", "probs", "logits+q", "probs+q"):
                if check.left() < 200:
                    return {"rows": rows, "stopped_early": True}
                seed += 1
                spec = CaseSpec(b, k, v, seed, temperature="vector", ragged=True).in_form(form)
                want = pv.verify(**build_case(spec), method=method, backend="numpy")
                entry: dict[str, Any] = {"B": b, "K": k, "V": v, "method": method,
                                         "form": form}
                for backend in (check.kernels, check.torch_backend):
                    try:
                        got = pv.verify(**build_case(spec, device=check.device), method=method,
                                        backend=backend)
                    except Exception as exc:  # the other backend still counts
                        entry[backend] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                        continue
                    entry[backend] = {
                        "rows": b,
                        "rows_equal": int((got.token_ids.cpu() == want.token_ids).all(1).sum()),
                        "accepted_equal": int((got.num_accepted.cpu() == want.num_accepted).sum()),
                    }
                rows.append(entry)
    kernel_rows = [r[check.kernels] for r in rows]
    small = [r[check.kernels] for r in rows if r["V"] <= SMALL_VOCAB]
    return {
        "rows": rows,
        "small_v_all_exact": all(r.get("rows_equal") == r.get("rows") for r in small),
        "all_accepted_counts_equal": all(r.get("accepted_equal") == r.get("rows")
                                         for r in kernel_rows),
    }


def graph_check(check: GpuCheck) -> dict[str, Any]:
    """Capture a whole ``verify`` call in a CUDA graph, refill its inputs, replay, compare."""
    if check.dry_run:
        return {"skipped": "no CUDA graphs on the CPU"}
    results: dict[str, Any] = {}
    traits = pv.get_backend(check.kernels).traits
    for variant in VARIANTS:
        if variant.method != "greedy" and not traits.implements("chain", variant.method):
            continue  # the kernels do not implement it (the benchmark times torch alone)
        try:
            results[variant.label] = _graph_replay_matches(check, variant)
        except Exception as exc:
            results[variant.label] = f"{type(exc).__name__}: {exc}"[:2000]
    return {"replay_matches_eager": results}


def _graph_replay_matches(check: GpuCheck, variant: Any) -> bool:
    device = torch.device(check.device)
    inputs = make_inputs((4, 3, 1000), variant, torch.float32, device, seed=1)
    kw = inputs.verify_kwargs(variant)

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        res = pv.verify(inputs.drafts, seed=inputs.seeds, backend=check.kernels,
                        validate=False, **kw)
        return res.token_ids, res.num_accepted

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, accepted = call()
    fresh = make_inputs((4, 3, 1000), variant, torch.float32, device, seed=2)
    for name in ("drafts", "target", "draft_probs"):
        if getattr(inputs, name) is not None:
            getattr(inputs, name).copy_(getattr(fresh, name))
    graph.replay()
    torch.cuda.synchronize()
    want_tokens, want_accepted = call()
    return bool(torch.equal(tokens, want_tokens) and torch.equal(accepted, want_accepted))


def benchmark(check: GpuCheck) -> dict[str, Any]:
    """The benchmark grid on the device: kernels and the torch backend side by side."""
    config = BenchConfig(
        shapes=DRY_BENCH_SHAPES if check.dry_run else FULL_SHAPES,
        devices=[torch.device(check.device)], backends=[check.kernels, check.torch_backend],
        repetitions=1 if check.dry_run else 5, min_block_s=0.001 if check.dry_run else 0.02)
    cells: list[dict[str, Any]] = []
    for _, new in run_bench(config):
        cells.extend(new)
        if check.left() < 130:
            return {"cells": cells, "stopped_early": True}
    return {"cells": cells}


def _subprocess(check: GpuCheck, name: str, cmd: list[str], limit: float) -> dict[str, Any]:
    if limit < 20:
        return {"skipped": f"only {limit:.0f} s left"}
    env = {**os.environ, "PORTABLE_VERIFY_TEST_DEVICE": check.device}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMED OUT after {limit:.0f} s", None
    (check.out / f"{name}.txt").write_text(str(text))
    return {"returncode": rc, "tail": str(text)[-1500:]}


def pytest_section(check: GpuCheck, tests: Path) -> dict[str, Any]:
    """``tests/test_triton.py`` and ``tests/test_triton_tree.py`` on the device, when the
    repository's tests are at hand."""
    targets = [tests / "test_triton.py", tests / "test_triton_tree.py"]
    if not all(t.exists() for t in targets):
        return {"skipped": f"{targets} not found (run from the repository root)"}
    cmd = [sys.executable, "-m", "pytest", *map(str, targets), "-q", "-p", "no:cacheprovider",
           "-x", "--tb=short"]
    if check.dry_run:
        cmd += ["-k", "ties or degenerate or edge_rules"]
    return _subprocess(check, "pytest_test_triton", cmd, min(150.0, check.left() - 20))


def conformance_section(check: GpuCheck) -> dict[str, Any]:
    """The quick conformance kit on the kernels' backend, in its own process."""
    if check.dry_run:
        return {"skipped": "dry run"}
    out = check.out / "conformance.json"
    result = _subprocess(check, "conformance", [
        sys.executable, "-m", "portable_verify.cli.main", "conformance", "--quick",
        "--backend", check.kernels, "--json", str(out)], check.left() - 10)
    if out.exists():
        result["checks"] = json.loads(out.read_text())["rows"]
    return result


def verdict(sections: dict[str, Any]) -> dict[str, Any]:
    """The few answers a reader wants first (None: not measured)."""

    def get(name: str, *keys: str) -> Any:
        value: Any = sections.get(name, {}).get("result")
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    graph = get("cuda_graph", "replay_matches_eager")
    checks = get("conformance_quick", "checks")
    cells = get("benchmark", "cells") or []
    return {
        "small_v_exact": get("exactness", "small_v_all_exact"),
        "accepted_counts_equal": get("exactness", "all_accepted_counts_equal"),
        "graph_replay_ok": None if not isinstance(graph, dict) else all(
            v is True for v in graph.values()),
        "bench_cells": len(cells),
        "tree_small_v_exact": get("tree_exactness", "small_v_all_exact"),
        "tree_accepted_counts_equal": get("tree_exactness", "all_accepted_counts_equal"),
        "tree_speed_cells": len(get("tree_speed", "cells") or []),
        "pytest_returncode": get("pytest_test_triton", "returncode"),
        "conformance_failed": None if checks is None else [
            f"{c['backend']} {c['check']}" for c in checks if c["status"] == "FAIL"],
    }


def run_gpu_check(check: GpuCheck, say: Callable[[str], None],
                  tests: Path = Path("tests")) -> dict[str, Any]:
    """Every section in turn; returns the document also saved as ``gpu_check.json``."""
    check.section("environment", environment_section, say)
    check.section("exactness", lambda: exactness(check), say)
    check.section("cuda_graph", lambda: graph_check(check), say)
    check.section("tree_exactness", lambda: gpu_check_tree.tree_exactness(check, SMALL_VOCAB), say)
    check.section("tree_speed", lambda: gpu_check_tree.tree_speed(check), say)
    check.section("benchmark", lambda: benchmark(check), say)
    check.section("pytest_test_triton", lambda: pytest_section(check, tests), say)
    check.section("conformance_quick", lambda: conformance_section(check), say)
    sections = check.data["sections"]
    check.data["summary"] = {name: s["ok"] for name, s in sections.items()}
    check.data["verdict"] = verdict(sections)
    check.data["total_seconds"] = round(time.monotonic() - check.started, 1)
    check.save()
    return check.data
