"""The one small protocol every backend implements.

A backend is one implementation of docs/semantics.md (numpy, torch, Triton, OpenVINO), made
for one device: the registry name is the implementation and the device is an optional suffix
(``"torch:cuda"``, ``"openvino:GPU"``). Backends never import one another; dispatch composes
them (selection, array conversion, fallbacks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from portable_verify.core.methods import CHAIN, TREE
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyCall, VerifyInputs


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and the reason either way (shown by ``info``)."""

    available: bool
    reason: str

    def __bool__(self) -> bool:
        return self.available


@dataclass(frozen=True)
class BackendTraits:
    """What a backend is like, so that tests and tools never branch on its name.

    ``is_reference``: it is the executable specification the others are compared with.
    ``statistical_sizes``: a call is fast enough for statistical sample sizes (thousands of
    requests per check).
    ``full_conformance_sizes``: the test suite runs the full (not the quick) conformance sizes.
    ``checks_what_it_reads``: under ``validate=True`` it checks the values its decision reads
    during its own passes (``VerifyInputs.check_read_values``), so the front door skips its
    full-row scans.
    ``host_calls``: it decides a plain host call (:class:`VerifyCall`) itself, in
    :meth:`Backend.run_call`: row maps, ``-1`` cuts, temperatures, uniforms and the default
    checks included, so the front door builds nothing for it.
    ``layouts``: the layouts it serves (:data:`~portable_verify.core.methods.CHAIN`, ``TREE``:
    :meth:`Backend.run_tree`); greedy rows are served in each.
    ``chain_rules`` / ``tree_rules``: the sampled rules it implements per layout (names of the
    method table's rules). Dispatch reads them through :meth:`implements`: ``auto`` never picks a
    backend without the call's rule and an explicit one without it is refused by name.
    ``lean_calls``: it decides an unvalidated call (:class:`VerifyCall`, padded, rows or flat)
    from the caller's arrays in :meth:`Backend.run_lean`, computing row maps, ``-1`` cuts,
    temperatures and uniforms on its device: the front door builds nothing for it.
    ``checks_tree_reads``: under ``validate=True`` its :meth:`Backend.run_tree` does the value
    checks itself (``TreeInputs.check_read_values``): the tree's structure, temperatures and
    uniforms, and the target and draft rows its walk reads; the front door skips its own
    value checks (and their host transfer), and dispatch words a flag with them.
    """

    is_reference: bool = False
    statistical_sizes: bool = True
    full_conformance_sizes: bool = True
    checks_what_it_reads: bool = False
    host_calls: bool = False
    layouts: tuple[str, ...] = (CHAIN,)
    chain_rules: tuple[str, ...] = ()
    tree_rules: tuple[str, ...] = ()
    checks_tree_reads: bool = False
    lean_calls: bool = False

    def implements(self, layout: str, rule: str | None) -> bool:
        """Whether it serves ``layout`` with the sampled ``rule`` (None: greedy rows only)."""
        if layout not in self.layouts:
            return False
        return rule is None or rule in (self.tree_rules if layout == TREE else self.chain_rules)


class ReadValueError(ValueError):
    """A backend found an invalid value its decision reads but cannot word the error (a
    compiled kernel returns a flag, not a message): dispatch reruns the call on the torch
    backend of the same device, whose checks say what and where."""


class Backend(ABC):
    """A verifier implementation on one device."""

    name: ClassVar[str]
    """Registry name: the implementation (``"torch"``); :attr:`device` completes it."""
    description: ClassVar[str]
    array_kind: ClassVar[Literal["torch", "numpy"]] = "torch"
    devices: ClassVar[tuple[str, ...]] = ()
    """Device suffixes this implementation knows; the first is its default."""
    traits: BackendTraits = BackendTraits()

    def __init__(self, device: str | None = None) -> None:
        if self.devices and device is not None and device not in self.devices:
            raise ValueError(
                f"backend {self.name!r} has no device {device!r}; devices: {list(self.devices)}"
            )
        self.device = device

    @classmethod
    def device_for(cls, torch_device_type: str) -> str | None:
        """The device a bare name (``"openvino"``) means for inputs on ``torch_device_type``."""
        return cls.devices[0] if cls.devices else None

    @property
    def qualified_name(self) -> str:
        """``name:device`` (just ``name`` for a device-less backend such as ``numpy``)."""
        return f"{self.name}:{self.device}" if self.device else self.name

    def torch_device_type(self) -> str:
        """The torch device type its inputs must live on (``"cpu"`` for host backends)."""
        return "cpu"

    @abstractmethod
    def availability(self) -> Availability:
        """Cheap check (imports, drivers); must not raise."""

    @abstractmethod
    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        """``(token_ids int64 [B, K+1], num_accepted int64 [B])`` for validated inputs.

        ``inputs`` holds torch tensors for ``array_kind == "torch"`` and numpy arrays otherwise.
        """

    def run_call(self, call: VerifyCall) -> tuple[Any, Any, Any, Any]:
        """``(token_ids, num_accepted, num_emitted, num_draft_tokens)`` as numpy arrays for a
        plain host call, for backends with ``traits.host_calls``; raises
        :class:`ReadValueError` when a value it reads is invalid (the front door then words
        the error)."""
        raise NotImplementedError(f"{self.qualified_name} does not decide host calls")

    def run_lean(self, call: VerifyCall) -> tuple[Any, Any, Any, Any]:
        """``(token_ids, num_accepted, num_emitted, num_draft_tokens)`` tensors of an
        unvalidated call on the backend's device, for backends with ``traits.lean_calls``."""
        raise NotImplementedError(f"{self.qualified_name} does not decide lean calls")

    def run_tree(self, inputs: TreeInputs) -> tuple[Any, Any, Any]:
        """``(token_ids int64 [B, W], node_ids int64 [B, W], num_accepted int64 [B])`` for
        validated tree inputs; only for backends whose ``traits.layouts`` has ``TREE``."""
        raise NotImplementedError(f"backend {self.qualified_name!r} does not verify trees")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.qualified_name!r}>"
