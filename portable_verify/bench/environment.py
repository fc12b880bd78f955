"""What a result was measured on: machine, devices, library versions (shared with ``info``)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

import torch

LIBRARIES = ("torch", "numpy", "openvino", "triton", "transformers",
             "intel-extension-for-pytorch", "portable-verify")


def library_versions() -> dict[str, str | None]:
    """Installed distribution versions (None when absent); read from metadata, not imported."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SIMD_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "neon", "sve")


def cpu_flags() -> list[str]:
    """The vector-instruction flags of this CPU that decide float32 throughput."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in SIMD_FLAGS if flag in present]
    except OSError:
        pass
    return []


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def devices() -> list[dict[str, Any]]:
    """Torch devices visible here: CPU always, then CUDA/XPU devices, and torch.accelerator."""
    found: list[dict[str, Any]] = [{"device": "cpu", "name": cpu_model(), "available": True}]
    for kind in ("cuda", "xpu"):
        module = getattr(torch, kind, None)
        ok = bool(module is not None and module.is_available())
        if not ok:
            found.append({"device": kind, "name": None, "available": False})
            continue
        for i in range(module.device_count()):
            found.append({"device": f"{kind}:{i}", "name": module.get_device_name(i),
                          "available": True})
    accelerator = getattr(torch, "accelerator", None)
    current = None
    if accelerator is not None and accelerator.is_available():
        current = str(accelerator.current_accelerator())
    found.append({"device": "torch.accelerator", "name": current, "available": current is not None})
    return found


def default_device() -> torch.device:
    """The accelerator when there is one, else the CPU (what ``backend="auto"`` would serve)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return torch.device(accelerator.current_accelerator().type)
    return torch.device("cpu")


def dtype_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a tiny softmax in ``dtype`` runs on ``device`` (old GPUs may lack half)."""
    try:
        torch.softmax(torch.zeros(2, 4, dtype=dtype, device=device), -1)
    except (RuntimeError, TypeError):
        return False
    return True
