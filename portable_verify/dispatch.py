"""Backend registry and run-time selection: the one place that knows every implementation.

Backends register a factory under their implementation's name (``numpy``, ``torch``,
``numba``, ``triton``, ``openvino``); a name may carry a device suffix (``torch:cuda``,
``openvino:GPU``). Nothing is imported until it is asked for, so a missing optional package costs
nothing and is reported, not raised, by :func:`backend_status`; a factory that raises anything
else is reported broken. A registration may declare the backend's traits and its warming (a
backend whose first call would compile), read without importing it. Dispatch also owns what sits
between the front doors and a backend: resolving ``auto`` and the old names, the stand-in while
a backend warms, the fallback from Triton to torch on a GPU without Triton (announced once), and
the conversion to numpy for numpy-kind backends.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch

from portable_verify.backends.base import ENV_INTERIM as ENV_INTERIM  # the warming switch
from portable_verify.backends.base import (
    Availability,
    Backend,
    BackendTraits,
    ReadValueError,
    Warming,
)
from portable_verify.core.methods import CHAIN
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyCall, VerifyInputs

ENV_BACKEND = "PORTABLE_VERIFY_BACKEND"
ENV_REQUIRE = "PORTABLE_VERIFY_REQUIRE_BACKENDS"
"""A comma list of canonical names that must run here (CI): see :func:`unmet_requirements`."""

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
_DECLARED: dict[str, dict[str, Any]] = {}  # name -> {"traits": ..., "warming": ...}, as given
_CACHE: dict[str, Backend] = {}
_SELECTED: dict[tuple[str, str, str | None, Any], Backend] = {}
_INTERIM = {"answers": 0}  # stand-in answers so far: no selection made while it moves is cached
_INTERIM_LOCK = threading.Lock()


def register_backend(name: str, factory: Callable[[str | None], Backend], *,
                     traits: BackendTraits | str | None = None,
                     warming: Warming | str | None = None) -> None:
    """Register ``factory(device_suffix or None) -> Backend`` under ``name`` (replacing any).

    ``traits``: what every backend of this implementation is like, declared so that ``auto``
    can filter on it without importing the implementation (it must equal the backends' own).
    ``warming``: a :class:`~portable_verify.backends.base.Warming` for an implementation whose
    first call would compile; ``auto`` answers from the next choice until it is ready. Either
    may be given as ``"module:attribute"``, imported when first needed.
    """
    if ":" in name:
        raise ValueError(f"backend names carry no device suffix; got {name!r}")
    _REGISTRY[name] = factory
    _DECLARED[name] = {"traits": traits, "warming": warming}
    _forget(name)


def unregister_backend(name: str) -> None:
    """Remove ``name`` from the registry (test doubles, plugins being unloaded); no-op if absent."""
    _REGISTRY.pop(name, None)
    _DECLARED.pop(name, None)
    _forget(name)


def _declared(base: str, what: str) -> Any:
    """The registration's ``traits`` or ``warming`` for ``base`` (imported on first need)."""
    value = _DECLARED.get(base, {}).get(what)
    if isinstance(value, str):
        module, _, attribute = value.partition(":")
        value = _DECLARED[base][what] = getattr(importlib.import_module(module), attribute)
    return value


def warming_of(name: str) -> Warming | None:
    """The warming declared for ``name``'s implementation (``"numba:cpu"`` or ``"numba"``), or
    None: its build's status and its kernel cache, read without importing the backend."""
    return _declared(ALIASES.get(name, name).partition(":")[0], "warming")


def _traits(name: str) -> BackendTraits:
    """The traits of a canonical name: declared at registration, else the backend's own."""
    declared = _declared(name.partition(":")[0], "traits")
    return declared if declared is not None else _instantiate(name).traits


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

    def __init__(self, name: str, reason: str, broken: bool = False) -> None:
        self.name = name  # type: ignore[misc]
        self.device = None
        self._status = Availability(False, reason, broken)

    def availability(self) -> Availability:
        return self._status

    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        raise RuntimeError(self._status.reason)


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
    except ImportError as exc:
        backend = _Unavailable(name, f"import failed: {exc}", broken=_ours(exc))
    except ValueError:  # an unknown device suffix: the caller's mistake, said by the backend
        raise
    except Exception as exc:  # listed, never raised here: broken, and said so wherever it runs
        backend = _Unavailable(name, f"failed to load: {type(exc).__name__}: {exc}", broken=True)
    declared = _declared(base, "traits")
    if declared is not None and not isinstance(backend, _Unavailable) \
            and backend.traits != declared:
        backend = _Unavailable(name, "its traits differ from those declared at registration",
                               broken=True)
    _CACHE[name] = backend
    return backend


def _ours(exc: ImportError) -> bool:
    """An import of this package failed (a bug, not a missing optional dependency)."""
    return (exc.name or "").partition(".")[0] == __package__


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


def torch_device(name: str) -> torch.device:
    """The torch device backend ``name``'s tensors live on (``triton:cuda``: cuda; ``numpy``,
    ``numba:cpu``, ``triton:interpreter``: cpu; a registered backend: its
    ``torch_device_type()``), so tools build its inputs there; ``auto:X`` means X."""
    name = ALIASES.get(name, name)
    if name == "auto" or name.startswith("auto:"):
        return torch.device(name.partition(":")[2] or "cpu")
    return torch.device(_instantiate(_canonical(name, None)).torch_device_type())


def required_backends() -> list[str]:
    """The canonical names ``PORTABLE_VERIFY_REQUIRE_BACKENDS`` lists (none when unset)."""
    return [n.strip() for n in os.environ.get(ENV_REQUIRE, "").split(",") if n.strip()]


def unmet_requirements(required: Iterable[str] | None = None) -> dict[str, str]:
    """Each backend of ``required`` (default :func:`required_backends`) that does not run
    here, with why: a machine that should have it (CI, a GPU check) fails instead of skipping
    its tests."""
    status = backend_status()
    wanted = required_backends() if required is None else list(required)
    return {n: (f"{status[n].status}: {status[n].reason}" if n in status
                else f"not a registered backend; known: {sorted(status)}")
            for n in wanted if n not in status or not status[n].available}


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


def select_backend(requested: str, device_type: str, rule: str | None = None,
                   layout: str = CHAIN) -> Backend:
    """Resolve ``backend=`` for a call of ``layout`` on ``device_type`` tensors.

    ``rule``: the rule of the call's sampled rows (the method table's ``rule``; None: greedy
    rows only). ``"auto"`` honours ``PORTABLE_VERIFY_BACKEND`` first, then the device type's
    preference list (:data:`AUTO_PREFERENCE`, then ``torch`` and, on CPU, the numpy
    reference), keeping only backends that implement the layout and rule: it never picks, nor
    falls back to, one that lacks them. Anything else names one backend, which must run and
    implement them. The answer is cached per name, device type, rule, layout and override
    (this runs on every call; registering a backend forgets it).
    """
    if type(requested) is not str:
        raise TypeError(f"backend must be a backend name (str), got {requested!r}")
    key = (requested, device_type, rule, layout,  # (the override's raw value, read inline: hot)
           os.environ.get(ENV_BACKEND) if _ENVIRON_DATA is None else _ENVIRON_DATA.get(_ENV_KEY))
    backend = _SELECTED.get(key)
    if backend is None:
        answered = _INTERIM["answers"]
        backend = _select(requested, device_type, rule, layout)
        if _INTERIM["answers"] == answered:  # an interim answer is never cached
            _SELECTED[key] = backend
    return backend


def _select(requested: str, device_type: str, rule: str | None, layout: str) -> Backend:
    requested = ALIASES.get(requested, requested)
    if requested == "auto":
        override = os.environ.get(ENV_BACKEND, "").strip()
        if override and override != "auto":
            return _select(override, device_type, rule, layout)
        requested = f"auto:{device_type}"
    if requested.startswith("auto:"):
        return _automatic(requested.partition(":")[2], rule, layout)
    backend = get_backend(_canonical(requested, device_type))
    if not backend.traits.implements(layout, rule):
        name = backend.qualified_name
        lacks = (f"backend {name!r} does not verify {layout}s"
                 if layout not in backend.traits.layouts
                 else f"{_what(rule, layout)} is not implemented by backend {name!r}")
        raise ValueError(f"{lacks}; use backend=\"auto\" or one of "
                         f"{_backends_with(rule, layout)}")
    return backend


def settled_auto(device_type: str) -> Backend:
    """What ``backend="auto"`` picks for ``device_type`` chain calls once every kernel is ready
    (no interim stand-in; ``PORTABLE_VERIFY_BACKEND`` honoured): what a warm-up warms."""
    override = os.environ.get(ENV_BACKEND, "").strip()
    if override and override != "auto":
        return _select(override, device_type, None, CHAIN)
    return _automatic(device_type, None, CHAIN, interim=False)


def _automatic(device_type: str, rule: str | None, layout: str,
               interim: bool = True) -> Backend:
    """The first available backend of the device's preference list that implements ``rule``
    for ``layout`` (filtered on declared traits first: nothing is imported for that); while
    one that warms is not ready, the next available one answers; a warning, once, names a
    better one that could not run."""
    names = dict.fromkeys([*AUTO_PREFERENCE.get(device_type, ()), f"torch:{device_type}",
                           *(["numpy"] if device_type == "cpu" else [])])
    capable = [n for n in names if _traits(n).implements(layout, rule)]
    if not capable:
        raise ValueError(f"no backend implements {_what(rule, layout)} on {device_type}; "
                         f"backends that do: {_backends_with(rule, layout)}")
    for i, name in enumerate(capable):
        stand_in = _interim(name, capable[i + 1:]) if interim else None
        if stand_in is not None:
            return stand_in
        backend = _instantiate(name)
        if backend.availability().available:
            if i > 0:
                _warn_once(f"auto:{device_type}", capable[0],
                           _instantiate(capable[0]).availability().reason, name)
            return backend
    return get_backend(capable[-1])  # raises, naming why


def _interim(name: str, later: list[str]) -> Backend | None:
    """The backend that answers while ``name``'s kernels build (the next available one of the
    preference list: the same tokens), decided before ``name`` is imported, so that a cold
    first call costs the stand-in's call and a file lookup; None where ``name`` declares no
    warming or cannot run here, once it is ready, or when no build is wanted (its
    :class:`~portable_verify.backends.base.Warming` says)."""
    warms = _declared(name.partition(":")[0], "warming")
    if warms is None or not warms.installed():
        return None
    stand_in = next((b for b in map(_instantiate, later) if b.availability().available), None)
    if stand_in is None or warms.ready():
        return None
    with _INTERIM_LOCK:
        _INTERIM["answers"] += 1
    return stand_in


def _what(rule: str | None, layout: str) -> str:
    return f"greedy {layout}s" if rule is None else f"method={rule!r} for {layout}s"


def _backends_with(rule: str | None, layout: str) -> list[str]:
    """The available backends that implement ``rule`` for ``layout`` (for error messages)."""
    return [n for n in available_backends() if _traits(n).implements(layout, rule)]


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


def run(backend: Backend, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``backend`` on ``inputs``: ``(token_ids, num_accepted)`` as int64 tensors on the
    inputs' device. A value a compiled backend only flagged (:class:`ReadValueError`) is worded
    by :func:`reword`. The layout's shapes are checked first (metadata, free): with
    ``validate=False`` a mismatch would be an out-of-bounds read, which on a GPU is a
    device-side assert that ends the process, not an exception."""
    device = _same_device(backend, inputs.target)
    inputs.check_layout()
    try:
        if backend.array_kind == "numpy":
            tokens, accepted = (torch.from_numpy(np.asarray(a))
                                for a in backend.run(numpy_inputs(inputs)))
        else:
            tokens, accepted = backend.run(inputs)
    except ReadValueError:
        tokens, accepted = reword(inputs, device)
    return (tokens.to(device=device, dtype=torch.int64),
            accepted.to(device=device, dtype=torch.int64))


def run_call(backend: Backend, call: VerifyCall) -> tuple[Any, Any, Any, Any] | None:
    """A plain host call decided by a backend with ``traits.host_calls``: its four numpy
    arrays, or None when the kernel flagged a value it reads (the caller then completes the call
    into :class:`VerifyInputs` and :func:`run` words the error, the one protocol)."""
    try:
        return backend.run_call(call)
    except ReadValueError:
        return None


def run_tree(backend: Backend, inputs: TreeInputs
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`run` for trees: ``(token_ids, node_ids, num_accepted)`` as int64 tensors."""
    device = _same_device(backend, inputs.target)
    inputs.check_layout()
    try:
        if backend.array_kind == "numpy":
            out = tuple(torch.from_numpy(np.asarray(a))
                        for a in backend.run_tree(numpy_inputs(inputs)))
        else:
            out = backend.run_tree(inputs)
    except ReadValueError:
        out = reword(inputs, device)
    tokens, nodes, accepted = (a.to(device=device, dtype=torch.int64) for a in out)
    return tokens, nodes, accepted


def reword(inputs: VerifyInputs | TreeInputs, device: torch.device) -> tuple[Any, ...]:
    """The one protocol for a flagged value: a compiled kernel returns a flag, not a message,
    so the same inputs run on the torch backend of their device with every value it reads
    checked, which raises the worded error (one source of messages)."""
    fallback = get_backend(f"torch:{device.type}")
    checked = replace(inputs, check_read_values=True)
    if isinstance(inputs, TreeInputs):
        return fallback.run_tree(checked)
    return fallback.run(checked)


def _same_device(backend: Backend, target: torch.Tensor) -> torch.device:
    device = target.device
    if backend.torch_device_type() != device.type:
        raise ValueError(
            f"backend={backend.qualified_name!r} runs on {backend.torch_device_type()} tensors; "
            f"the inputs are on {device}")
    return device


_NUMBA = "portable_verify.backends.numba"
register_backend("numba", lazy(f"{_NUMBA}.backend", "NumbaBackend"),
                 traits=f"{_NUMBA}.readiness:TRAITS", warming=f"{_NUMBA}.readiness:WARMING")
register_backend("numpy", lazy("portable_verify.backends.numpy.backend", "NumpyReferenceBackend"))
register_backend("torch", lazy("portable_verify.backends.torch.backend", "TorchBackend"))
register_backend("triton", lazy("portable_verify.backends.triton.backend", "TritonBackend"))
register_backend("openvino", lazy("portable_verify.backends.openvino.backend", "OpenVINOBackend"))
