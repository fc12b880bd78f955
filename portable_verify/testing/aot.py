"""Every Triton kernel variant compiled ahead of time for a GPU, on a machine without one.

Why: register pressure, spills and float64 arithmetic decide the kernels' speed on a GPU, and CI
has none. Triton builds cubins without a device (its bundled ``ptxas``), so each variant the
launchers select is compiled here for :data:`H200` (``GPUTarget("cuda", 90, 32)``) exactly as a
GPU launch would compile it: the public doors run on CPU tensors, the Triton backend's launcher
is the compiled one (``triton:cuda``'s), and each launch is compiled, not run.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import portable_verify as pv
from portable_verify.core import methods

H200 = ("cuda", 90, 32)
"""The lent GPU's target: backend, compute capability, warp size."""


@dataclass(frozen=True)
class CompiledVariant:
    """One kernel variant: its constexprs, and what ``ptxas -v`` says of its cubin."""

    kernel: str
    constants: tuple[tuple[str, Any], ...]
    float_pointers: str  # the float element types its pointers take, e.g. "bf16+fp32"
    signature: str
    n_regs: int
    n_spills: int  # bytes of spill stores
    f64_in_ttir: bool

    def describe(self) -> str:
        flags = " ".join(f"{k}={v}" for k, v in self.constants)
        return (f"{self.kernel:18s} regs {self.n_regs:3d} spills {self.n_spills:4d} B "
                f"f64 {'yes' if self.f64_in_ttir else 'no '} {self.float_pointers:9s} {flags}")


def chain_calls(full: bool = True) -> list[dict[str, Any]]:
    """Arguments of ``pv.verify`` that select every chain launcher branch (``full``), or a
    representative pair (greedy; rejection from logits with draft probabilities)."""
    b, k, v = 2, 4, 32000
    drafts = torch.zeros((b, k), dtype=torch.int64)
    q = torch.full((b, k, v), 1.0 / v)
    logits = torch.zeros((b, k + 1, v))
    if not full:
        return [dict(draft_token_ids=drafts, target_logits=logits, method="greedy"),
                dict(draft_token_ids=drafts, target_logits=logits, draft_probs=q,
                     method="rejection", temperature=0.8, seed=1)]
    calls = []
    for method in methods.distinct(methods.CHAIN):
        for target in ("target_logits", "target_probs"):
            for temperature in ([1.0] if target == "target_probs" else [0.8, torch.tensor(
                    [0.0, 0.8])]):
                for draft in ([None, q] if methods.reads_draft_probs(method) else [None]):
                    calls.append(dict(draft_token_ids=drafts, method=method, draft_probs=draft,
                                      temperature=temperature, seed=1,
                                      **{target: logits.softmax(-1) if "probs" in target
                                         else logits}))
    calls.append(dict(draft_token_ids=drafts, target_logits=logits.bfloat16(), method="rejection",
                      temperature=0.8, seed=1))
    return calls


def tree_calls() -> list[dict[str, Any]]:
    """Arguments of ``pv.verify_tree`` for each tree rule and children mode."""
    b, n, v = 2, 8, 32000
    nodes = torch.ones((b, n), dtype=torch.int64)
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 2, 3]).repeat(b, 1)
    logits = torch.zeros((b, n, v))
    q = torch.full((b, n, v), 1.0 / v)
    calls = [dict(node_token_ids=nodes, parents=parents, target_logits=logits, method="greedy")]
    for method in methods.sampled(methods.TREE):
        for children, draft in (("deterministic", None), ("iid", q),
                                ("without_replacement", q)):
            if children != "deterministic" and not methods.reads_draft_probs(method):
                continue  # a rule that reads no draft probabilities has no sampled children
            calls.append(dict(node_token_ids=nodes, parents=parents, target_logits=logits,
                              draft_probs=draft, children=children, method=method,
                              temperature=0.8, seed=1))
    return calls


def compile_variants(chain: Sequence[dict[str, Any]], tree: Sequence[dict[str, Any]] = (),
                     target: tuple[str, int, int] = H200) -> list[CompiledVariant]:
    """Compile, for ``target``, every kernel variant the given door calls launch (each once)."""
    from triton.backends.compiler import GPUTarget

    gpu = GPUTarget(*target)
    found: dict[tuple[Any, ...], CompiledVariant] = {}
    with _compiled_launches(gpu, found):
        for args in chain:
            pv.verify(**args, backend="triton:interpreter", validate=False)
        for args in tree:
            pv.verify_tree(**args, backend="triton:interpreter", validate=False)
    return list(found.values())


@contextlib.contextmanager
def _compiled_launches(gpu: Any, found: dict[tuple[Any, ...], CompiledVariant]
                       ) -> Iterator[None]:
    """The Triton backend runs its compiled launchers on CPU tensors; each launch compiles."""
    from triton.runtime.jit import JITFunction

    from portable_verify.backends.triton import chain, spec, tree
    from portable_verify.backends.triton.backend import TritonBackend

    def run(self: Any, inputs: Any) -> Any:
        return tuple(x.zero_() for x in chain.verify_triton(inputs))

    def run_lean(self: Any, call: Any) -> Any:
        return tuple(x.zero_() for x in chain.launch(spec.from_call(call)))

    def run_tree(self: Any, inputs: Any) -> Any:
        return tuple(x.zero_() for x in tree.verify_tree_triton(inputs))

    def launch(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        variant = _compile(self, gpu, args, kwargs)
        found.setdefault((variant.kernel, variant.constants, variant.signature), variant)

    saved = [(TritonBackend, name, getattr(TritonBackend, name))
             for name in ("run", "run_lean", "run_tree")] + [(JITFunction, "run", JITFunction.run)]
    TritonBackend.run, TritonBackend.run_lean, TritonBackend.run_tree = run, run_lean, run_tree
    JITFunction.run = launch
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _compile(kernel: Any, gpu: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> CompiledVariant:
    """What ``JITFunction.run`` compiles for these arguments, compiled for ``gpu``."""
    import triton
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(gpu)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound,
                                                              specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=gpu,
                              options=options.__dict__)
    names = [p.name for p in kernel.params]
    constants = tuple((names[path[0]], value) for path, value in constexprs.items()
                      if len(path) == 1)
    regs, spills = ptxas_usage(compiled.asm["ptx"], gpu.arch, options.enable_fp_fusion)
    floats = {t[1:] for t in _leaves(list(signature.values())) if t[:3] in ("*fp", "*bf")}
    return CompiledVariant(kernel.fn.__name__, constants, "+".join(sorted(floats)),
                           str(signature), regs, spills, _has_f64(compiled.asm["ttir"]))


def _leaves(values: Any) -> list[str]:
    if isinstance(values, (list, tuple)):
        return [leaf for v in values for leaf in _leaves(v)]
    return [values]


def _has_f64(ttir: str) -> bool:
    return re.search(r"\bf64\b", ttir) is not None


def ptxas_usage(ptx: str, arch: int, fp_fusion: bool) -> tuple[int, int]:
    """``(registers, spill-store bytes)`` of ``ptx`` from Triton's bundled ``ptxas -v`` (the
    compile's own log is not kept: the figures are recomputed with its flags)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(arch).path, "-lineinfo", "-v", *([] if fp_fusion else ["--fmad=false"]),
               f"--gpu-name={sm_arch_from_capability(arch)}", src, "-o",
               os.path.join(tmp, "k.o")]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return int(regs[1]) if regs else -1, int(spills[1]) if spills else 0


def report(variants: list[CompiledVariant], say: Callable[[str], None] = print) -> None:
    for variant in sorted(variants, key=lambda x: (x.kernel, x.constants)):
        say(variant.describe())
