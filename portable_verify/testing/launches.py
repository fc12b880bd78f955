"""Launches and device reads counted on the host code a backend runs, without a GPU.

Why: the GPU targets (issue 38: at most two launches per chain call, no read of a device value)
must be held in CI, which has no GPU. :func:`count_launches` records, while active, every aten
op that launches device work (a ``TorchDispatchMode``; allocation, view and metadata ops are
not launches) and every Triton kernel launch (``JITFunction.run`` / ``InterpretedFunction.run``
intercepted: kernel name and grid), and refuses every read of a device value
(``_local_scalar_dense`` and friends, a copy to the CPU, ``.numpy()``, ``.tolist()``, host
data entering as ``torch.from_numpy`` is counted as the copy it is on a GPU). On CPU tensors it
sees what ``triton:interpreter`` runs, which is what ``triton:cuda`` runs once the host/device
split is chosen by the backend. On a real GPU, :func:`profile_launches` counts the same call
with ``torch.profiler`` (gpu-check compares the two).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NOT_LAUNCHES = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view",
    "_unsafe_view", "_reshape_alias", "as_strided", "slice", "select", "unsqueeze", "squeeze",
    "expand", "permute", "transpose", "t", "detach", "alias", "lift_fresh", "unbind", "split",
    "split_with_sizes", "chunk", "narrow", "view_as", "resize_", "set_", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
    "record_stream", "is_pinned", "size", "stride", "numel", "dim", "scalar_tensor",
})
"""Ops that allocate, alias or describe a tensor: no device work (``func.is_view`` too;
``scalar_tensor`` is the host-side 0-dim number ``torch.where(c, x, 0.0)`` wraps)."""

READS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "equal",
    "allclose", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "bincount", "argwhere", "tolist",
})
"""Ops whose result the host must wait for (a synchronisation on a GPU)."""


class DeviceRead(AssertionError):
    """A read of a device value on a path that must not read one."""


@dataclass(frozen=True)
class Launch:
    """One launch: ``kind`` "aten" (an op's kernel or copy) or "triton"; ``grid`` for Triton."""

    kind: str
    name: str
    grid: tuple[int, ...] = ()

    @property
    def programs(self) -> int:
        return math.prod(self.grid) if self.grid else 0


@dataclass
class LaunchCounter:
    """What :func:`count_launches` saw: launches in order, and any device read (refused)."""

    launches: list[Launch] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    refuse_reads: bool = True
    paused: int = 0

    @property
    def count(self) -> int:
        return len(self.launches)

    @property
    def kernels(self) -> list[Launch]:
        return [x for x in self.launches if x.kind == "triton"]

    def names(self) -> list[str]:
        return [x.name for x in self.launches]

    def read(self, what: str) -> None:
        self.reads.append(what)
        if self.refuse_reads:
            raise DeviceRead(f"a device value is read on the host ({what}); the path must not sync")


def _is_device(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta")


class _Recorder(TorchDispatchMode):
    def __init__(self, counter: LaunchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not self.counter.paused:
            name = func.overloadpacket.__name__
            to_cpu = str(kwargs.get("device", "")) == "cpu" or (
                name == "copy_" and args and not _is_device(args[0]))
            if to_cpu and any(_is_device(a) for a in torch.utils._pytree.tree_leaves(args)):
                self.counter.read(f"aten.{name} to the CPU")
            if name in READS:  # a read, not counted as a launch
                self.counter.read(f"aten.{name}")
            elif name not in NOT_LAUNCHES and not func.is_view:
                self.counter.launches.append(Launch("aten", name))
        return func(*args, **kwargs)


def _grid(grid: Any, kwargs: dict[str, Any]) -> tuple[int, ...]:
    grid = grid(kwargs) if callable(grid) else grid
    return tuple(int(g) for g in grid)


def _launch_runners() -> list[Any]:
    """The classes whose ``run`` launches a Triton kernel (compiled and interpreted)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    return [JITFunction, InterpretedFunction]


def _host_reader(counter: LaunchCounter, what: str, original: Callable[..., Any]
                 ) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not counter.paused:
            counter.read(what)
        return original(*args, **kwargs)
    return guarded


def _counted_from_numpy(counter: LaunchCounter, original: Callable[..., Any]
                        ) -> Callable[..., Any]:
    def from_numpy(array: Any) -> torch.Tensor:
        if not counter.paused:  # host data made into a tensor: a copy on a GPU
            counter.launches.append(Launch("aten", "from_numpy"))
        return original(array)
    return from_numpy


@contextlib.contextmanager
def count_launches(*, execute: bool = True, refuse_reads: bool = True
                   ) -> Iterator[LaunchCounter]:
    """Count launches and refuse device reads while active (see the module docstring).

    ``execute=False`` records each Triton launch without running it (its outputs keep whatever
    their allocation held): grids of full-size calls cost nothing on the interpreter. A read
    raises :class:`DeviceRead` where it happens, and again on exit should the code under test
    have swallowed it; ``refuse_reads=False`` only records reads (to report them).
    """
    counter = LaunchCounter(refuse_reads=refuse_reads)
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    for cls in _launch_runners():
        patch(cls, "run", _intercepted(counter, cls.run, execute))
    for method in ("numpy", "tolist"):
        patch(torch.Tensor, method, _host_reader(counter, f"Tensor.{method}()",
                                                 getattr(torch.Tensor, method)))
    patch(torch, "from_numpy", _counted_from_numpy(counter, torch.from_numpy))
    try:
        with _Recorder(counter):
            yield counter
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
    if counter.reads and refuse_reads:
        raise DeviceRead(f"device values read on the host: {counter.reads}")


def _intercepted(counter: LaunchCounter, run: Callable[..., Any], execute: bool
                 ) -> Callable[..., Any]:
    def launch(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if warmup or counter.paused:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        fn = getattr(self, "fn", self)
        counter.launches.append(Launch("triton", getattr(fn, "__name__", str(fn)),
                                       _grid(grid, kwargs)))
        if not execute:
            return None
        counter.paused += 1  # the interpreter's own numpy work is the device's, not the host's
        try:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            counter.paused -= 1
    return launch


@contextlib.contextmanager
def syncs_refused() -> Iterator[None]:
    """On a GPU: every synchronising CUDA call raises while active
    (``torch.cuda.set_sync_debug_mode("error")``), the real twin of the reads refused here."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@dataclass(frozen=True)
class ProfiledLaunches:
    """A call's launches as ``torch.profiler`` saw them on a GPU: device activities (kernels,
    memcpy, memset) and the host's launch API calls (graph launches included)."""

    device_activities: int
    launch_calls: int
    names: tuple[str, ...]


LAUNCH_APIS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpy", "cudaMemset", "cuMemcpy",
               "cuMemset", "cudaGraphLaunch", "cuGraphLaunch", "hipLaunchKernel",
               "hipModuleLaunchKernel", "hipMemcpy", "hipMemset", "hipGraphLaunch")


def profile_launches(call: Callable[[], Any], warmups: int = 2) -> ProfiledLaunches:
    """Launches of one ``call()`` on a GPU counted by ``torch.profiler`` (after ``warmups``
    calls, so compilation and caches are out of it): gpu-check compares this with
    :func:`count_launches` on the same call."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmups):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    device_type = torch.autograd.DeviceType.CUDA
    device = [e.name for e in prof.events() if e.device_type == device_type]
    calls = [e.name for e in prof.events() if e.name.startswith(LAUNCH_APIS)]
    return ProfiledLaunches(len(device), len(calls), tuple(device))
