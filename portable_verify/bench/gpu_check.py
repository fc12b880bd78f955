"""The GPU check: one prepared run on a machine with an NVIDIA GPU, within a lease.

Why this shape: GPU machines are lent briefly and start bare (Triton compiles every kernel from
scratch), so one command gathers everything worth knowing in sections of fixed order, each with
its own share of the budget and saved to ``OUT/gpu_check.json`` the moment it ends, so a lease
that runs out still leaves what was measured:

1. ``environment``: the machine, versions, backend status, and the warm-up of every kernel
   variant, which is the exactness sweep itself (every chain method x input form and tree
   mode x rule on small shapes, each row against the numpy reference);
2. ``targets``: issue "Verification at the speed of the GPU"'s cells (:mod:`gpu_targets`);
3. ``capture``: CUDA-graph capture and replay per variant, ``torch.compile(fullgraph=True)``;
4. ``kit_quick``: the quick conformance kit on ``triton:cuda`` and ``torch:cuda``;
5. ``device_tests``: the device-parametrised tests with ``PORTABLE_VERIFY_TEST_DEVICE=cuda``;
6. ``kit_full``: the whole kit with the time left, reported as cut when cut.

A section fails when it raises, when a subprocess exits non-zero, or when its checks fail; the
verdict reads every section and lists every target on a line of its own. Neither vLLM nor
FlashInfer is needed (the lent machine has neither). ``dry_run`` rehearses every section on
the CPU (kernels through Triton's interpreter, tiny shapes) so the check itself stays tested.
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
from portable_verify.bench import environment, gpu_check_tree, gpu_targets
from portable_verify.bench.cases import VARIANTS, make_inputs
from portable_verify.core import methods
from portable_verify.testing.cases.random_cases import CaseSpec, build_case

EXACT_SHAPES = ((6, 3, 37), (5, 2, 1000), (4, 4, 32000), (2, 3, 128256))
DRY_EXACT_SHAPES = ((3, 2, 37), (2, 2, 70))
SMALL_VOCAB = 1000
"""At or below it the kernels must agree with the reference exactly; above it float32 sums in
a different order may flip near-ties (the agreement rate is reported beside torch's)."""
INPUT_FORMS = ("logits", "probs", "logits+q", "probs+q")
REQUIRED_ON_GPU = "triton:cuda,torch:cuda"
"""``PORTABLE_VERIFY_REQUIRE_BACKENDS`` for the check's subprocesses: on a GPU both must run."""
DEVICE_TESTS = ("test_triton.py", "test_triton_tree.py", "test_traversal_backends.py",
                "test_vllm_v1_sampler.py")
"""Test files that build their tensors on ``PORTABLE_VERIFY_TEST_DEVICE`` (docs/testing.md)."""

SECTION_SHARES: tuple[tuple[str, float], ...] = (
    ("environment", 0.16), ("targets", 0.30), ("capture", 0.04), ("kit_quick", 0.26),
    ("device_tests", 0.16), ("kit_full", 1.0))
"""Each section's share of the budget (of what is left for ``kit_full``): the whole run ends
within ``--budget``; 230 s leaves a lent machine time to start and a second run to fit."""


@dataclass
class GpuCheck:
    """Where and how long: the device, the kernels' backend, the time budget, the output."""

    out: Path
    budget_s: float = 230.0
    dry_run: bool = False
    started: float = field(default_factory=time.monotonic)
    section_ends: float = float("inf")
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
        """Seconds left to the current section (never past the whole budget)."""
        whole = self.budget_s - (time.monotonic() - self.started)
        return min(whole, self.section_ends - time.monotonic())

    def section(self, name: str, share: float, fn: Callable[[], Any],
                say: Callable[[str], None]) -> dict[str, Any]:
        """Run one section within ``share`` of the budget; record and save its outcome."""
        t0 = time.monotonic()
        whole = self.budget_s - (t0 - self.started)
        self.section_ends = t0 + max(0.0, min(whole, share * self.budget_s))
        say(f"== {name} ({self.left():.0f} s of {whole:.0f} s left)")
        try:
            value = fn()
            failures = list(value.get("failures", [])) if isinstance(value, dict) else []
            result: dict[str, Any] = {"ok": not failures, "result": value}
        except Exception as exc:  # record and go on: every section of a one-shot run counts
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-4000:]}
            say(result["traceback"])
        result["seconds"] = round(time.monotonic() - t0, 2)
        self.section_ends = float("inf")
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


# ---------------------------------------------------------------- 1. environment and warm-up


def environment_and_warm_up(check: GpuCheck) -> dict[str, Any]:
    """The machine, then every kernel variant compiled by running it against the reference."""
    info: dict[str, Any] = {
        "machine": environment.machine(), "devices": environment.devices(),
        "versions": environment.library_versions(), "torch_cuda": torch.version.cuda,
        "backends": {k: [v.available, v.reason] for k, v in pv.backend_status().items()},
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["capability"] = f"{props.major}.{props.minor}"
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
        info["driver"] = _driver_version()
    status = pv.backend_status()
    missing = [name for name in (check.kernels, check.torch_backend)
               if name not in status or not status[name].available]
    ends = check.section_ends  # chains get a little over half the time left, trees the rest
    check.section_ends = time.monotonic() + 0.55 * check.left()
    chains = exactness(check)
    check.section_ends = ends
    trees = gpu_check_tree.tree_exactness(check, SMALL_VOCAB)
    failures = [f"{name} is not available here" for name in missing]
    for name, part in (("chain", chains), ("tree", trees)):
        if not any(r["V"] <= SMALL_VOCAB for r in part["rows"]):
            failures.append(f"no {name} row at V <= {SMALL_VOCAB} ran within the section")
        elif not part["small_v_all_exact"]:
            failures.append(f"a {name} row differs from the reference at V <= {SMALL_VOCAB}")
    failures += chains["errors"] + trees["errors"]
    return {**info, "chains": chains, "trees": trees, "failures": failures}


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:  # no nvidia-smi: the version is only reported
        return None


def exactness(check: GpuCheck) -> dict[str, Any]:
    """Per (shape, method, input form): rows whose tokens and accepted counts equal numpy's."""
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    seed = 20260601
    for b, k, v in DRY_EXACT_SHAPES if check.dry_run else EXACT_SHAPES:
        for method in methods.distinct(methods.CHAIN):
            for form in INPUT_FORMS:
                if check.left() < 3:
                    return _exactness_summary(check, rows, errors, stopped_early=True)
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
                        errors.append(f"{backend} {method}/{form} {b},{k},{v}: "
                                      f"{type(exc).__name__}: {exc}"[:300])
                        continue
                    entry[backend] = {
                        "rows": b,
                        "rows_equal": int((got.token_ids.cpu() == want.token_ids).all(1).sum()),
                        "accepted_equal": int((got.num_accepted.cpu() == want.num_accepted).sum()),
                    }
                rows.append(entry)
    return _exactness_summary(check, rows, errors)


def _exactness_summary(check: GpuCheck, rows: list[dict[str, Any]], errors: list[str],
                       stopped_early: bool = False) -> dict[str, Any]:
    kernel_rows = [r[check.kernels] for r in rows]
    small = [r[check.kernels] for r in rows if r["V"] <= SMALL_VOCAB]
    return {
        "rows": rows, "errors": errors, "stopped_early": stopped_early,
        "small_v_all_exact": bool(small) and all(r.get("rows_equal") == r.get("rows")
                                                 for r in small),
        "all_accepted_counts_equal": all(r.get("accepted_equal") == r.get("rows")
                                         for r in kernel_rows),
    }


# ---------------------------------------------------------------- 2. targets


def targets(check: GpuCheck) -> dict[str, Any]:
    """Every target cell of the GPU-speed issue, each guarded: one failing cell is recorded."""
    device = torch.device(check.device)
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "launches": lambda: gpu_targets.launch_targets(device, check.kernels, check.dry_run),
        "founding": lambda: gpu_targets.founding_targets(device, check.kernels, check.dry_run),
        "device_time": lambda: gpu_targets.device_time_targets(device, check.kernels,
                                                               check.dry_run, check.left),
        "seam": lambda: gpu_targets.seam_targets(device, check.kernels, check.dry_run,
                                                 check.left),
        "trees": lambda: gpu_targets.tree_targets(device, check.kernels, check.dry_run,
                                                  check.left),
    }
    out: dict[str, Any] = {"failures": []}
    for name, fn in parts.items():
        try:
            out[name] = fn()
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()[-2000:]}
            out["failures"].append(f"{name}: {type(exc).__name__}: {exc}"[:300])
            continue
        out["failures"] += [f"{name}: {f}" for f in out[name].get("failures", [])]
    return out


# ---------------------------------------------------------------- 3. capture


def capture(check: GpuCheck) -> dict[str, Any]:
    """Graph capture and replay per variant; ``torch.compile(fullgraph=True)`` of a step."""
    out: dict[str, Any] = {"compile": _compile_check(check)}
    if check.dry_run:
        out["graphs"] = {"skipped": "no CUDA graphs on the CPU"}
    else:
        out["graphs"] = _graph_check(check)
    failures = [f"graph replay {k}: {v}" for k, v in out["graphs"].items() if v is not True
                and k != "skipped"]
    failures += [f"compile {k}: {v}" for k, v in out["compile"].items() if v is not True]
    return {**out, "failures": failures}


def _graph_check(check: GpuCheck) -> dict[str, Any]:
    results: dict[str, Any] = {}
    traits = pv.get_backend(check.kernels).traits
    for variant in VARIANTS:
        if not methods.greedy_only(variant.method) and not traits.implements("chain",
                                                                       variant.method):
            continue
        try:
            results[variant.label] = _graph_replay_matches(check, variant)
        except Exception as exc:
            results[variant.label] = f"{type(exc).__name__}: {exc}"[:2000]
    return results


def _graph_replay_matches(check: GpuCheck, variant: Any) -> bool:
    """Capture once, refill the inputs in place three times, each replay equal to eager."""
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
    for seed in (2, 3, 4):
        fresh = make_inputs((4, 3, 1000), variant, torch.float32, device, seed=seed)
        for name in ("drafts", "target", "draft_probs", "seeds"):
            if getattr(inputs, name) is not None:
                getattr(inputs, name).copy_(getattr(fresh, name))
        inputs.drafts[0, -1] = -1  # a request that stops proposing
        graph.replay()
        torch.cuda.synchronize()
        want_tokens, want_accepted = call()
        if not (torch.equal(tokens, want_tokens) and torch.equal(accepted, want_accepted)):
            return False
    return True


def _compile_check(check: GpuCheck) -> dict[str, Any]:
    """``torch.compile(fullgraph=True)`` of a step calling ``pv.verify`` (validate=False)."""
    device = torch.device(check.device)
    variant = VARIANTS[0]
    inputs = make_inputs((2, 2, 64), variant, torch.float32, device, seed=5)
    kw = inputs.verify_kwargs(variant)

    def step(drafts: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        return pv.verify(drafts, seed=seeds, backend=check.kernels, validate=False,
                         **kw).token_ids

    try:
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True,
                                 backend="aot_eager" if check.dry_run else "inductor")
        same = torch.equal(compiled(inputs.drafts, inputs.seeds), step(inputs.drafts,
                                                                       inputs.seeds))
        return {"verify": same}
    except Exception as exc:
        return {"verify": f"{type(exc).__name__}: {str(exc)[:500]}"}


# ---------------------------------------------------------------- 4-6. subprocesses


def _subprocesses(check: GpuCheck, cmds: dict[str, list[str]], cut_fails: bool = True
                  ) -> dict[str, Any]:
    """Run ``cmds`` side by side (the lent machine has cores to spare; the GPU is shared) within
    the section's time. A non-zero exit is a failure; a time-out is a cut, itself a failure
    unless ``cut_fails`` is False (the full kit, which takes what time is left)."""
    limit = check.left()
    if limit < 10:
        return {"cut": f"only {limit:.0f} s left",
                "failures": [f"not run: only {limit:.0f} s left"] if cut_fails else []}
    env = {**os.environ, "PORTABLE_VERIFY_TEST_DEVICE": check.device}
    if not check.dry_run:
        env["PORTABLE_VERIFY_REQUIRE_BACKENDS"] = REQUIRED_ON_GPU
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env) for name, cmd in cmds.items()}
    deadline = time.monotonic() + limit
    result: dict[str, Any] = {"runs": {}, "failures": []}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            text = (proc.communicate()[0] or "") + f"\nCUT after {limit:.0f} s"
            rc = None
        (check.out / f"{name}.txt").write_text(text)
        result["runs"][name] = {"returncode": rc, "tail": text[-1200:]}
        if rc is None:
            result["cut"] = f"stopped after {limit:.0f} s"
            if cut_fails:
                result["failures"].append(f"{name} cut after {limit:.0f} s")
        elif rc != 0:
            result["failures"].append(f"{name} exited {rc}")
    return result


def kit(check: GpuCheck, quick: bool) -> dict[str, Any]:
    """The conformance kit on both device backends, one process each, side by side."""
    if check.dry_run and not quick:
        return {"skipped": "dry run: the quick kit stands for it", "failures": []}
    section = "kit_quick" if quick else "kit_full"
    cmds: dict[str, list[str]] = {}
    for backend in (check.kernels, check.torch_backend):
        name = f"{section}_{backend.split(':')[0]}"
        cmd = [sys.executable, "-m", "portable_verify.cli.main", "conformance", "--quiet",
               "--backend", backend, "--json", str(check.out / f"{name}.json")]
        cmd += ["--quick"] if quick else []
        cmd += ["--check", "exact.greedy"] if check.dry_run else []
        cmds[name] = cmd
    result = _subprocesses(check, cmds, cut_fails=quick)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for name in cmds:
        out = check.out / f"{name}.json"
        if out.exists():
            rows = json.loads(out.read_text())["rows"]
            for r in rows:
                counts[r["status"]] = counts.get(r["status"], 0) + 1
            result["failures"] += [f"{r['backend']} {r['check']}" for r in rows
                                   if r["status"] == "FAIL"]
    result["checks"] = counts
    return result


def device_tests(check: GpuCheck, tests: Path) -> dict[str, Any]:
    """The device-parametrised tests on the device, one process per file, side by side."""
    names = DEVICE_TESTS[:1] if check.dry_run else DEVICE_TESTS  # a rehearsal: one file
    targets = [tests / name for name in names if (tests / name).exists()]
    if not targets:
        return {"skipped": f"no device tests under {tests} (run from the repository root)",
                "failures": []}
    cmds = {}
    for path in targets:
        cmd = [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider",
               "--tb=line", "-rf"]
        if check.dry_run:
            cmd += ["-k", "ties or degenerate or edge_rules"]
        cmds[f"device_tests_{path.stem}"] = cmd
    return _subprocesses(check, cmds)


# ---------------------------------------------------------------- the run and its verdict


def verdict(sections: dict[str, Any]) -> dict[str, Any]:
    """Every section's status and every target on a line of its own."""
    lines: list[dict[str, Any]] = []
    for name, s in sections.items():
        result = s.get("result") or {}
        status = "ok" if s["ok"] else "FAILED"
        if isinstance(result, dict) and result.get("cut") and s["ok"]:
            status += " (cut: " + str(result["cut"]) + ")"
        failures = result.get("failures", []) if isinstance(result, dict) else []
        lines.append({"section": name, "status": status,
                      "failures": failures[:8] + ([f"... {len(failures) - 8} more"]
                                                  if len(failures) > 8 else [])
                      or ([s["error"]] if "error" in s else [])})
    found = sections.get("targets", {}).get("result") or {}
    targets = [t for part in found.values() if isinstance(part, dict)
               for t in part.get("targets", [])]
    return {"sections": lines, "targets": targets,
            "targets_met": sum(t["met"] is True for t in targets),
            "targets_missed": sum(t["met"] is False for t in targets),
            "targets_unmeasured": sum(t["met"] is None for t in targets)}


def run_gpu_check(check: GpuCheck, say: Callable[[str], None],
                  tests: Path = Path("tests")) -> dict[str, Any]:
    """Every section in turn; returns the document also saved as ``gpu_check.json``."""
    shares = dict(SECTION_SHARES)
    steps: dict[str, Callable[[], Any]] = {
        "environment": lambda: environment_and_warm_up(check),
        "targets": lambda: targets(check),
        "capture": lambda: capture(check),
        "kit_quick": lambda: kit(check, quick=True),
        "device_tests": lambda: device_tests(check, tests),
        "kit_full": lambda: kit(check, quick=False),
    }
    for name, fn in steps.items():
        check.section(name, shares[name], fn, say)
    sections = check.data["sections"]
    check.data["summary"] = {name: s["ok"] for name, s in sections.items()}
    check.data["verdict"] = verdict(sections)
    check.data["total_seconds"] = round(time.monotonic() - check.started, 1)
    check.save()
    return check.data
