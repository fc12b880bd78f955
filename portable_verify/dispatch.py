"""Backend registry and run-time selection: the one front door to every implementation.

Backends register a factory under a name; nothing is imported until it is asked for, so a
missing optional package (openvino, triton) costs nothing and is reported, not raised, by
:func:`backend_status`. Names may carry a device suffix (``"openvino:GPU"``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from portable_verify.backends.base import Availability, Backend

ENV_BACKEND = "PORTABLE_VERIFY_BACKEND"


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[str | None], Backend]
    auto: bool  # eligible for "auto" selection by device type


_REGISTRY: dict[str, _Entry] = {}
_CACHE: dict[str, Backend] = {}


def register_backend(
    name: str, factory: Callable[[str | None], Backend], *, auto: bool = True
) -> None:
    """Register ``factory(device_suffix) -> Backend`` under ``name`` (replacing any previous)."""
    _REGISTRY[name] = _Entry(factory, auto)
    for key in [k for k in _CACHE if k.split(":", 1)[0] == name]:
        del _CACHE[key]


def unregister_backend(name: str) -> None:
    """Remove ``name`` from the registry (test doubles, plugins being unloaded); no-op if absent."""
    _REGISTRY.pop(name, None)
    for key in [k for k in _CACHE if k.split(":", 1)[0] == name]:
        del _CACHE[key]


def _lazy(module: str, cls: str) -> Callable[[str | None], Backend]:
    def factory(suffix: str | None) -> Backend:
        backend_cls = getattr(importlib.import_module(module), cls)
        return backend_cls(suffix) if suffix is not None else backend_cls()

    return factory


class _Unavailable(Backend):
    """Stands in for a backend whose module could not even be imported."""

    description = "could not be imported"

    def __init__(self, name: str, reason: str) -> None:
        self.name = name  # type: ignore[misc]
        self._reason = reason

    def availability(self) -> Availability:
        return Availability(False, self._reason)

    def run(self, inputs):  # type: ignore[no-untyped-def]
        raise RuntimeError(self._reason)


def _instantiate(name: str) -> Backend:
    if name in _CACHE:
        return _CACHE[name]
    base, _, suffix = name.partition(":")
    if base not in _REGISTRY:
        raise ValueError(
            f"backend={name!r} is not a known backend; known: {sorted(_REGISTRY)}"
        )
    try:
        backend = _REGISTRY[base].factory(suffix or None)
    except ImportError as exc:  # optional dependency missing
        backend = _Unavailable(name, f"import failed: {exc}")
    except Exception as exc:  # a broken optional wheel must not break backend listing
        backend = _Unavailable(name, f"failed to load: {type(exc).__name__}: {exc}")
    _CACHE[name] = backend
    return backend


def backend_status() -> dict[str, Availability]:
    """Every registered backend with its availability and the reason."""
    return {name: _instantiate(name).availability() for name in sorted(_REGISTRY)}


def available_backends() -> list[str]:
    """Names of the backends that can run on this machine (``_``-prefixed test doubles hidden)."""
    return [n for n, status in backend_status().items() if status.available and n[0] != "_"]


def get_backend(name: str) -> Backend:
    """The backend called ``name``; raises ``RuntimeError`` naming why when it cannot run here."""
    backend = _instantiate(name)
    status = backend.availability()
    if not status.available:
        raise RuntimeError(
            f"backend {name!r} is not available: {status.reason}. "
            f"Available backends: {available_backends()}"
        )
    return backend


def select_backend(requested: str, device_type: str) -> Backend:
    """Resolve ``backend=`` for inputs on ``device_type``.

    ``"auto"`` honours ``PORTABLE_VERIFY_BACKEND`` first, then the first available backend that
    claims the device type; the device-generic ``torch`` backend is the last resort.
    """
    if requested != "auto":
        return get_backend(requested)
    override = os.environ.get(ENV_BACKEND, "").strip()
    if override and override != "auto":
        return get_backend(override)
    for name, entry in _REGISTRY.items():
        if not entry.auto:
            continue
        backend = _instantiate(name)
        if device_type in backend.device_types and backend.availability().available:
            return backend
    return get_backend("torch")


register_backend("numpy", _lazy("portable_verify.backends.numpy_ref", "NumpyReferenceBackend"),
                 auto=False)
register_backend("torch", _lazy("portable_verify.backends.torch_eager", "TorchBackend"),
                 auto=False)
register_backend("cpu", _lazy("portable_verify.backends.torch_eager", "CpuBackend"))
register_backend("cuda", _lazy("portable_verify.backends.cuda", "CudaBackend"))
register_backend("xpu", _lazy("portable_verify.backends.xpu", "XpuBackend"))
_TRITON = _lazy("portable_verify.backends.triton_kernels", "TritonInterpreterBackend")
register_backend("triton", _TRITON, auto=False)
register_backend("openvino", _lazy("portable_verify.backends.openvino", "OpenVINOBackend"),
                 auto=False)
