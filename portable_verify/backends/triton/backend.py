"""The Triton backend: the same kernels compiled for NVIDIA/AMD (``triton:cuda``) or Intel
(``triton:xpu``) GPUs, or run by Triton's interpreter on CPU tensors (``triton:interpreter``,
for CI).

A GPU call launches at most two kernels and never synchronises with the host, so it can be
captured in a CUDA graph once a warm-up call has compiled the kernels (docs/backends.md). When
Triton cannot drive a GPU here, this backend reports why; dispatch then takes ``torch`` on that
device for automatic selection.

Intel GPUs: stock PyTorch has ``torch.xpu`` since 2.4; the kernels need the
``pytorch-triton-xpu`` wheel. intel-extension-for-pytorch (IPEX) is never required: it is
imported only when installed, and only its import's outcome is reported (it is archived, and
its last releases pin older torch versions). Nothing here calls an IPEX API; on a torch without
``torch.xpu`` its import is what provides the device.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from typing import Any

import torch

from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.backends.triton import spec
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyCall, VerifyInputs

IPEX_MODULE = "intel_extension_for_pytorch"

# Triton's name for the active driver's backend, per torch device type (ROCm GPUs are "cuda"
# devices in torch and "hip" in Triton; Intel's Triton calls its backend "xpu").
TRITON_DRIVERS: dict[str, tuple[str, ...]] = {"cuda": ("cuda", "hip"), "xpu": ("xpu",)}

INTERPRETER = "interpreter"

MIN_TRITON = (3, 3)
"""The kernels take grouped (tuple) arguments: Triton 3.3 is the first release whose compiler
and interpreter both accept them (triton-lang/triton PRs 5220 and 5790)."""


def triton_too_old(version: str) -> str | None:
    """Why Triton ``version`` cannot run the kernels, or None when it can."""
    parts = re.match(r"(\d+)\.(\d+)", version)
    if parts is not None and (int(parts[1]), int(parts[2])) >= MIN_TRITON:
        return None
    return (f"Triton {version} is older than {'.'.join(map(str, MIN_TRITON))}, the first that "
            "passes tuple arguments to kernels both compiled and interpreted")


@functools.cache
def ipex_status() -> str:
    """Import IPEX if (and only if) it is installed; describe the outcome. Never raises."""
    if importlib.util.find_spec(IPEX_MODULE) is None:
        return "intel-extension-for-pytorch not installed (optional; stock torch.xpu is used)"
    try:
        ipex = importlib.import_module(IPEX_MODULE)
    except BaseException as exc:  # some IPEX builds sys.exit() on a torch mismatch
        if isinstance(exc, KeyboardInterrupt):
            raise
        return (f"intel-extension-for-pytorch is installed but cannot be imported beside torch "
                f"{torch.__version__} ({type(exc).__name__}: {exc}); ignored")
    return f"intel-extension-for-pytorch {getattr(ipex, '__version__', '?')} imported"


def torch_device_available(device_type: str) -> bool:
    """``torch.<device_type>.is_available()``, False when torch lacks the module."""
    module = getattr(torch, device_type, None)
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # a broken driver install must not break backend_status()
        return False


@functools.cache
def _gpu_availability(device_type: str) -> Availability:
    """Can the compiled kernels run on ``device_type`` here? Decided once; never raises."""
    extra = f"; {ipex_status()}" if device_type == "xpu" else ""  # first: IPEX may add torch.xpu
    if not torch_device_available(device_type):
        return Availability(False, f"torch.{device_type}.is_available() is False{extra}")
    try:
        import triton
    except Exception as exc:  # ImportError, or a wheel that fails to load its library
        return Availability(False, f"Triton is not importable ({exc}){extra}")
    too_old = triton_too_old(triton.__version__)
    if too_old is not None:
        return Availability(False, too_old + extra)
    try:
        target = triton.runtime.driver.active.get_current_target()
    except Exception as exc:
        return Availability(False, f"Triton {triton.__version__} found no active driver ({exc})")
    if target.backend not in TRITON_DRIVERS.get(device_type, ()):
        return Availability(False, f"Triton {triton.__version__} drives {target.backend!r}, not "
                                   f"{device_type!r} devices{extra}")
    try:
        from portable_verify.backends.triton import chain as triton_kernels
    except Exception as exc:  # pragma: no cover - a Triton too old for the kernels' language
        return Availability(False, f"the Triton kernels failed to load ({exc})")
    mode = ("interpreted (TRITON_INTERPRET=1 was set when Triton loaded: slow)"
            if triton_kernels.KERNELS_INTERPRETED else "compiled")
    name = getattr(torch, device_type).get_device_name()
    return Availability(True, f"{name}: Triton {triton.__version__} kernels, {mode}, on "
                              f"{target.backend} arch {target.arch}{extra}")


@functools.cache
def _interpreter_availability() -> Availability:
    try:
        import triton

        too_old = triton_too_old(triton.__version__)
        if too_old is not None:
            return Availability(False, too_old)
        from portable_verify.backends.triton import interpreter as triton_interpreter

        triton_interpreter.interpreted_kernels()
    except Exception as exc:  # pragma: no cover - depends on the triton build
        return Availability(False, f"Triton interpreter unavailable: {type(exc).__name__}: {exc}")
    return Availability(True, f"Triton {triton.__version__} interpreter (the GPU kernels executed "
                              "in numpy on CPU tensors; independent of TRITON_INTERPRET; slow, "
                              "meant for tests)")


CHAIN_RULES = tuple(spec.RULE_CODES)
"""The chain kernels' sampled rules: the keys of their ``RULE`` table, nothing else."""
TREE_RULES = tuple(spec.TREE_RULE_CODES)
"""The tree kernel's sampled rules: the keys of its ``RULE`` table."""


class TritonBackend(Backend):
    """The Triton kernels on ``cuda``/``xpu`` tensors, or interpreted on CPU tensors."""

    name = "triton"
    description = "Triton kernels on GPUs (triton:cuda, triton:xpu) or interpreted on CPU"
    devices = ("cuda", "xpu", INTERPRETER)

    @classmethod
    def device_for(cls, torch_device_type: str) -> str:
        return INTERPRETER if torch_device_type == "cpu" else torch_device_type

    @property
    def traits(self) -> BackendTraits:  # type: ignore[override]
        sizes = {} if self.device != INTERPRETER else {  # slow per request: quick sizes
            "statistical_sizes": False, "full_conformance_sizes": False}
        return BackendTraits(layouts=(methods.CHAIN, methods.TREE), chain_rules=CHAIN_RULES,
                             tree_rules=TREE_RULES, lean_calls=True, **sizes)

    def torch_device_type(self) -> str:
        return "cpu" if self.device == INTERPRETER else str(self.device)

    def availability(self) -> Availability:
        if self.device == INTERPRETER:
            return _interpreter_availability()
        return _gpu_availability(str(self.device))

    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        if not inputs.all_greedy:
            spec.rule_code(inputs.sampled_method, methods.CHAIN, self.qualified_name)
        if self.device == INTERPRETER:
            from portable_verify.backends.triton.interpreter import verify_interpreted

            return verify_interpreted(inputs)
        from portable_verify.backends.triton.chain import verify_triton

        return verify_triton(inputs)

    def run_lean(self, call: VerifyCall) -> tuple[Any, Any, Any, Any]:
        spec.rule_code(call.rule, methods.CHAIN, self.qualified_name)
        chain_spec = spec.from_call(call)
        if self.device == INTERPRETER:
            from portable_verify.backends.triton.interpreter import launch_interpreted

            return launch_interpreted(chain_spec)
        from portable_verify.backends.triton.chain import launch

        return launch(chain_spec)

    def run_tree(self, inputs: TreeInputs) -> tuple[Any, Any, Any]:
        if not inputs.all_greedy:
            spec.rule_code(inputs.sampled_method, methods.TREE, self.qualified_name)
        if self.device == INTERPRETER:
            from portable_verify.backends.triton.interpreter import verify_tree_interpreted

            return verify_tree_interpreted(inputs)
        from portable_verify.backends.triton.tree import verify_tree_triton

        return verify_tree_triton(inputs)
