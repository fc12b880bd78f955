"""What the CUDA and XPU backends share: can the Triton kernels run on this device type, and if
not, the torch fallback, announced once.

Not a backend itself. The fallback is composed here rather than in dispatch because it is a
property of one call path (same device, same tensors, same semantics, only slower), and the
availability reason shown by ``portable-verify info`` must say which path a backend will take.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from portable_verify.core.types import VerifyInputs

log = logging.getLogger("portable_verify")

# Triton's name for the active driver's backend, per torch device type (ROCm GPUs are "cuda"
# devices in torch and "hip" in Triton; Intel's Triton calls its backend "xpu").
TRITON_BACKENDS: dict[str, tuple[str, ...]] = {"cuda": ("cuda", "hip"), "xpu": ("xpu",)}


@dataclass(frozen=True)
class TritonPlan:
    """Whether a device type runs the Triton kernels, and why (or why not)."""

    use_triton: bool
    reason: str


@functools.cache
def triton_plan(device_type: str) -> TritonPlan:
    """Decide once per process; never raises (a broken Triton is a reason, not an error)."""
    fallback = "using the device-generic torch backend instead (same semantics, slower)"
    try:
        import triton
    except Exception as exc:  # ImportError, or a wheel that fails to load its library
        return TritonPlan(False, f"Triton is not importable ({exc}); {fallback}")
    try:
        target = triton.runtime.driver.active.get_current_target()
    except Exception as exc:
        return TritonPlan(False, f"Triton {triton.__version__} found no active driver ({exc}); "
                                 f"{fallback}")
    wanted = TRITON_BACKENDS.get(device_type, ())
    if target.backend not in wanted:
        return TritonPlan(False, f"Triton {triton.__version__} drives {target.backend!r}, not "
                                 f"{device_type!r} devices; {fallback}")
    try:
        from portable_verify.backends import triton_kernels
    except Exception as exc:  # pragma: no cover - a Triton too old for the kernels' language
        return TritonPlan(False, f"the Triton kernels failed to load ({exc}); {fallback}")
    mode = ("interpreted (TRITON_INTERPRET=1 was set when Triton loaded: slow)"
            if triton_kernels.KERNELS_INTERPRETED else "compiled")
    return TritonPlan(True, f"Triton {triton.__version__} kernels, {mode}, on {target.backend} "
                            f"arch {target.arch}")


@functools.cache
def warn_fallback_once(backend: str, reason: str) -> None:
    """One ``logging`` warning per backend and reason, not one per call."""
    log.warning("portable_verify backend %r: %s", backend, reason)


def run_plan(backend: str, device_type: str, inputs: VerifyInputs) -> tuple[Any, Any]:
    """The kernels when the plan allows, else the torch backend's function (announced once)."""
    plan = triton_plan(device_type)
    if plan.use_triton:
        if inputs.target.device.type != device_type:
            raise ValueError(f"backend={backend!r} runs on {device_type} tensors; got target on "
                             f"{inputs.target.device}")
        from portable_verify.backends.triton_kernels import verify_triton

        return verify_triton(inputs)
    warn_fallback_once(backend, plan.reason)
    from portable_verify.backends.torch_eager import verify_torch

    return verify_torch(inputs)


def torch_device_available(device_type: str) -> bool:
    """``torch.<device_type>.is_available()``, False when torch lacks the module."""
    module = getattr(torch, device_type, None)
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # a broken driver install must not break backend_status()
        return False
