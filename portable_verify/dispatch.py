"""Backend registry and run-time selection: the one place that knows every implementation.

Backends register a factory under their implementation's name (``numpy``, ``torch``,
``triton``, ``openvino``); a name may carry a device suffix (``torch:cuda``, ``openvino:GPU``).
Nothing is imported until it is asked for, so a missing optional package costs nothing and is
reported, not raised, by :func:`backend_status`. Dispatch also owns what sits between the front
doors and a backend: resolving ``auto`` and the old names, the fallback from Triton to torch on a
GPU without Triton (announced once), and the conversion to numpy for numpy-kind backends.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch

from portable_verify.backends.base import Availability, Backend, ReadValueError
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyInputs

ENV_BACKEND = "PORTABLE_VERIFY_BACKEND"

ALIASES: dict[str, str] = {"cpu": "torch:cpu", "cuda": "auto:cuda", "xpu": "auto:xpu"}
"""Names of earlier releases. ``cuda``/``xpu`` mean "the best backend for that GPU"."""

AUTO_PREFERENCE: dict[str, tuple[str, ...]] = {
    "cpu": ("numba:cpu", "torch:cpu"),
    "cuda": ("triton:cuda", "torch:cuda"),
    "xpu": ("triton:xpu", "torch:xpu"),
}
"""What ``auto`` picks per torch device type, best first; other device types get ``torch``."""

log = logging.getLogger("portable_verify")

_REGISTRY: dict[str, Callable[[str | None], Backend]] = {}
_CACHE: dict[str, Backend] = {}
_SELECTED: dict[tuple[str, str, str | None, Any], Backend] = {}


def register_backend(name: str, factory: Callable[[str | None], Backend]) -> None:
    """Register ``factory(device_suffix or None) -> Backend`` under ``name`` (replacing any)."""
    if ":" in name:
        raise ValueError(f"backend names carry no device suffix; got {name!r}")
    _REGISTRY[name] = factory
    _forget(name)


def unregister_backend(name: str) -> None:
    """Remove ``name`` from the registry (test doubles, plugins being unloaded); no-op if absent."""
    _REGISTRY.pop(name, None)
    _forget(name)


def _forget(name: str) -> None:
    _SELECTED.clear()
    for key in [k for k in _CACHE if k.split(":", 1)[0] == name]:
        del _CACHE[key]


def lazy(module: str, cls: str) -> Callable[[str | None], Backend]:
    """A factory that imports ``module`` only when the backend is first asked for."""

    def factory(device: str | None) -> Backend:
        return getattr(importlib.import_module(module), cls)(device)

    return factory


class _Unavailable(Backend):
    """Stands in for a backend whose module could not even be imported."""

    description = "could not be imported"

    def __init__(self, name: str, reason: str) -> None:
        self.name = name  # type: ignore[misc]
        self.device = None
        self._reason = reason

    def availability(self) -> Availability:
        return Availability(False, self._reason)

    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        raise RuntimeError(self._reason)


def _instantiate(name: str) -> Backend:
    """The backend for a canonical ``impl`` or ``impl:device`` name (cached)."""
    if name in _CACHE:
        return _CACHE[name]
    base, _, device = name.partition(":")
    if base not in _REGISTRY:
        known = sorted([*_REGISTRY, *ALIASES, "auto"])
        raise ValueError(f"backend={name!r} is not a known backend; known: {known}")
    try:
        backend = _REGISTRY[base](device or None)
    except ImportError as exc:  # optional dependency missing
        backend = _Unavailable(name, f"import failed: {exc}")
    except ValueError:  # an unknown device suffix: the caller's mistake, said by the backend
        raise
    except Exception as exc:  # a broken optional wheel must not break backend listing
        backend = _Unavailable(name, f"failed to load: {type(exc).__name__}: {exc}")
    _CACHE[name] = backend
    return backend


def _expanded(base: str) -> list[str]:
    """Every canonical name of a registered implementation: one per device it knows."""
    devices = _instantiate(base).devices
    return [f"{base}:{d}" for d in devices] if devices else [base]


def backend_status() -> dict[str, Availability]:
    """Every registered backend and device, with its availability and the reason."""
    names = [n for base in sorted(_REGISTRY) for n in _expanded(base)]
    return {name: _instantiate(name).availability() for name in names}


def available_backends() -> list[str]:
    """Canonical names of the backends that run here (``_``-prefixed test doubles hidden)."""
    return [n for n, status in backend_status().items() if status.available and n[0] != "_"]


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (a bare implementation means its default device).

    Raises ``RuntimeError`` naming why when it cannot run here.
    """
    backend = _instantiate(_canonical(name, None))
    status = backend.availability()
    if not status.available:
        raise RuntimeError(
            f"backend {name!r} is not available: {status.reason}. "
            f"Available backends: {available_backends()}"
        )
    return backend


def _canonical(name: str, device_type: str | None) -> str:
    """``impl:device`` for a bare implementation name, given the inputs' device type."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a backend name (str), got {name!r}")
    name = ALIASES.get(name, name)
    base, _, device = name.partition(":")
    if device or base not in _REGISTRY:
        return name
    chosen = _instantiate(base).device_for(device_type or "cpu")
    return f"{base}:{chosen}" if chosen else base


@functools.cache
def _warn_once(requested: str, skipped: str, reason: str, chosen: str) -> None:
    log.warning("portable_verify: %s skipped %s (%s); using %s (same semantics)",
                requested, skipped, reason, chosen)


def select_backend(requested: str, device_type: str, method: str | None = None) -> Backend:
    """Resolve ``backend=`` for inputs on ``device_type``.

    ``"auto"`` honours ``PORTABLE_VERIFY_BACKEND`` first, then the preference list of the
    device type (:data:`AUTO_PREFERENCE`); anything else names one backend, which must run.
    ``method``: the rule of the call's sampled rows (None: greedy only, which every backend
    does); ``auto`` skips backends without it and an explicit backend without it is refused.
    The answer is cached per name, device type, method and ``PORTABLE_VERIFY_BACKEND`` (this
    runs on every call; registering a backend forgets it).
    """
    if not isinstance(requested, str):
        raise TypeError(f"backend must be a backend name (str), got {requested!r}")
    key = (requested, device_type, method,  # (the override's raw value, read inline: hot)
           os.environ.get(ENV_BACKEND) if _ENVIRON_DATA is None else _ENVIRON_DATA.get(_ENV_KEY))
    backend = _SELECTED.get(key)
    if backend is None:
        backend = _SELECTED[key] = _select(requested, device_type, method)
    return backend


def _select(requested: str, device_type: str, method: str | None) -> Backend:
    if not isinstance(requested, str):
        raise TypeError(f"backend must be a backend name (str), got {requested!r}")
    requested = ALIASES.get(requested, requested)
    if requested == "auto":
        override = os.environ.get(ENV_BACKEND, "").strip()
        if override and override != "auto":
            return _select(override, device_type, method)
        requested = f"auto:{device_type}"
    if requested.startswith("auto:"):
        wanted = requested.partition(":")[2]
        candidates = AUTO_PREFERENCE.get(wanted, (f"torch:{wanted}",))
        if method is not None:  # greedy-only calls need no filter
            candidates = tuple(n for n in candidates
                               if _has_method(_instantiate(n), method)) or (f"torch:{wanted}",)
        for i, name in enumerate(candidates):
            backend = _instantiate(name)
            status = backend.availability()
            if status.available:
                if i > 0:
                    _warn_once(requested, candidates[0],
                               _instantiate(candidates[0]).availability().reason, name)
                return backend
        return get_backend(candidates[-1])  # raises, naming why
    backend = get_backend(_canonical(requested, device_type))
    if not _has_method(backend, method):
        has = list(backend.traits.sampled_methods)
        raise ValueError(f"method={method!r} is not implemented by backend "
                         f"{backend.qualified_name!r} (it has {has}); use backend=\"auto\" or "
                         f"one of {_backends_with(method)}")
    return backend


def _has_method(backend: Backend, method: str | None) -> bool:
    return method is None or method in backend.traits.sampled_methods


def _backends_with(method: str | None) -> list[str]:
    """The available backends that implement ``method`` (for an error message)."""
    return [n for n in available_backends() if _has_method(_instantiate(n), method)]


try:  # CPython keeps the environment in an encoded dict: reading it directly skips decoding
    _ENVIRON_DATA: Any = os.environ._data  # type: ignore[attr-defined]
    _ENV_KEY: Any = os.environ.encodekey(ENV_BACKEND)  # type: ignore[attr-defined]
except AttributeError:  # another Python: the public (slower) spelling
    _ENVIRON_DATA, _ENV_KEY = None, None


def numpy_inputs(inputs: Any) -> Any:
    """The same inputs (``VerifyInputs`` or ``TreeInputs``) as host numpy arrays (floats upcast
    to float32)."""
    changes: dict[str, Any] = {}
    for f in fields(inputs):
        value = getattr(inputs, f.name)
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            if value.is_floating_point() and value.dtype != torch.float32:
                value = value.float()
            changes[f.name] = value.numpy()
    return replace(inputs, **changes)


def run(requested: str | Backend, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the backend ``requested`` names (or that backend itself, already selected) on
    ``inputs``; int64 tensors on the inputs' device."""
    device = inputs.target.device
    backend = (requested if isinstance(requested, Backend)
               else select_backend(requested, device.type,
                                   None if inputs.all_greedy else inputs.sampled_method))
    if backend.torch_device_type() != device.type:
        raise ValueError(
            f"backend={backend.qualified_name!r} runs on {backend.torch_device_type()} tensors; "
            f"the inputs are on {device}"
        )
    if backend.array_kind == "numpy":
        tokens, accepted = backend.run(numpy_inputs(inputs))
        tokens, accepted = torch.from_numpy(np.asarray(tokens)), torch.from_numpy(
            np.asarray(accepted))
    else:
        try:
            tokens, accepted = backend.run(inputs)
        except ReadValueError:
            # The backend only flagged a bad value: the torch backend's checks word it.
            fallback = get_backend(f"torch:{device.type}")
            tokens, accepted = fallback.run(replace(inputs, check_read_values=True))
    return (tokens.to(device=device, dtype=torch.int64),
            accepted.to(device=device, dtype=torch.int64))


def tree_backends() -> list[str]:
    """Canonical names of the available backends that verify trees."""
    return [n for n in available_backends() if _instantiate(n).traits.supports_trees]


def select_tree_backend(requested: str, device_type: str) -> Backend:
    """:func:`select_backend` for ``verify_tree``: ``auto`` takes the first backend of the
    device's preference list (the override included) that verifies trees; a named backend that
    does not is an error saying which do."""
    if not isinstance(requested, str):
        raise TypeError(f"backend must be a backend name (str), got {requested!r}")
    name = ALIASES.get(requested, requested)
    if name == "auto" or name.startswith("auto:"):
        wanted = device_type if name == "auto" else name.partition(":")[2]
        override = os.environ.get(ENV_BACKEND, "").strip() if name == "auto" else ""
        candidates = ([override] if override and override != "auto" else []) + [
            *AUTO_PREFERENCE.get(wanted, ()), f"torch:{wanted}", *(["numpy"] * (wanted == "cpu"))]
        for candidate in candidates:
            backend = _instantiate(_canonical(candidate, wanted))
            if backend.traits.supports_trees and backend.availability().available:
                return backend
        raise RuntimeError(f"no available backend verifies trees on {wanted}; "
                           f"backends that do: {tree_backends()}")
    backend = select_backend(name, device_type)
    if not backend.traits.supports_trees:
        raise ValueError(f"backend={requested!r} does not verify trees; backends that do: "
                         f"{tree_backends()}")
    return backend


def run_tree(backend: Backend, inputs: TreeInputs
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run a tree backend on ``inputs``: ``(token_ids, node_ids, num_accepted)`` as int64
    tensors on the inputs' device."""
    device = inputs.target.device
    if backend.torch_device_type() != device.type:
        raise ValueError(
            f"backend={backend.qualified_name!r} runs on {backend.torch_device_type()} tensors; "
            f"the inputs are on {device}"
        )
    inputs.check_layout()
    if backend.array_kind == "numpy":
        out = backend.run_tree(numpy_inputs(inputs))
        out = tuple(torch.from_numpy(np.asarray(a)) for a in out)
    else:
        out = backend.run_tree(inputs)
    tokens, nodes, accepted = (a.to(device=device, dtype=torch.int64) for a in out)
    return tokens, nodes, accepted


register_backend("numba", lazy("portable_verify.backends.numba.backend", "NumbaBackend"))
register_backend("numpy", lazy("portable_verify.backends.numpy.tree",
                                "NumpyReferenceTreeBackend"))
register_backend("torch", lazy("portable_verify.backends.torch.tree", "TorchTreeBackend"))
register_backend("triton", lazy("portable_verify.backends.triton.backend", "TritonBackend"))
register_backend("openvino", lazy("portable_verify.backends.openvino.backend", "OpenVINOBackend"))
