"""NVIDIA (and ROCm) GPUs: the Triton kernels on CUDA tensors, else the torch backend.

A call launches at most two kernels and never synchronises with the host, so it can be captured
in a CUDA graph once a warm-up call has compiled the kernels (docs/backends.md).
"""

from __future__ import annotations

from typing import Any

import torch

from portable_verify.backends.accel_common import run_plan, torch_device_available, triton_plan
from portable_verify.backends.base import Availability, Backend
from portable_verify.core.types import VerifyInputs


class CudaBackend(Backend):
    """Triton kernels on CUDA tensors; the torch backend when Triton cannot run (said once)."""

    name = "cuda"
    description = "Triton kernels on NVIDIA/ROCm GPUs (torch fallback without Triton)"
    device_types = ("cuda",)

    def availability(self) -> Availability:
        if not torch_device_available("cuda"):
            build = "" if torch.version.cuda or torch.version.hip else (
                f" (torch {torch.__version__} is built without CUDA)")
            return Availability(False, f"torch.cuda.is_available() is False{build}")
        return Availability(True, f"{torch.cuda.get_device_name()}: {triton_plan('cuda').reason}")

    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        return run_plan(self.name, "cuda", inputs)
