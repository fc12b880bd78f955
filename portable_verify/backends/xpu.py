"""Intel GPUs: the Triton kernels on XPU tensors when Intel's Triton is installed, else torch.

Stock PyTorch has ``torch.xpu`` since 2.4; the kernels need the ``pytorch-triton-xpu`` wheel
(Triton with Intel's backend). intel-extension-for-pytorch (IPEX) is never required: it is
imported only when it is installed, and only its import's success or failure is reported (it is
archived, and its last releases pin older torch versions, so it often cannot load beside the
running torch). Nothing here calls an IPEX API; on a torch without ``torch.xpu`` its import is
what provides the device.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import torch

from portable_verify.backends.accel_common import run_plan, torch_device_available, triton_plan
from portable_verify.backends.base import Availability, Backend
from portable_verify.core.types import VerifyInputs

IPEX_MODULE = "intel_extension_for_pytorch"


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


class XpuBackend(Backend):
    """Triton kernels on Intel GPUs; the torch backend without Intel's Triton (said once)."""

    name = "xpu"
    description = "Triton kernels on Intel GPUs (needs pytorch-triton-xpu; torch fallback)"
    device_types = ("xpu",)

    def availability(self) -> Availability:
        ipex = ipex_status()  # first, so that an IPEX-provided torch.xpu is seen below
        if not torch_device_available("xpu"):
            return Availability(False, f"torch.xpu.is_available() is False; {ipex}")
        return Availability(True, f"{torch.xpu.get_device_name()}: {triton_plan('xpu').reason}; "
                                  f"{ipex}")

    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        return run_plan(self.name, "xpu", inputs)
