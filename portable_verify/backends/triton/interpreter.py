"""Running the Triton kernels in Triton's interpreter on CPU tensors, without TRITON_INTERPRET.

Why: Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` *decorates* a function, not at
launch. Setting that process-wide variable would turn a real GPU session's kernels into
interpreted ones. Instead :func:`interpreted_kernels` executes ``triton/chain.py`` a second time
as a private module with ``_INTERPRET = True`` injected, so its kernels are wrapped in Triton's
``InterpretedFunction`` directly, and :func:`verify_interpreted` launches them with the standard
library swapped for interpreted versions. This module never imports the kernel module itself.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import triton.language as tl

KERNEL_MODULE = "portable_verify.backends.triton.chain"
TREE_MODULE = "portable_verify.backends.triton.tree"

_COPY_LOCK = threading.RLock()  # a tree kernel copy imports the chain kernels' copy
_COPIES: dict[str, ModuleType] = {}
_LAUNCH_LOCK = threading.Lock()
_STDLIB_SWAPS: dict[int, object] = {}


class InterpretedDevice:
    """A device function for interpreted kernels: the interpreter's rewritten Python function,
    called directly. (Triton's ``InterpretedFunction`` re-patches ``triton.language`` on every
    device-function call, which dominated small launches; the kernel launch has already
    patched it, including ``tl.core`` through the kernel module's ``_TL_CORE``.)"""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        from triton.runtime.interpreter import InterpretedFunction

        self.fn = fn
        self._rewritten = InterpretedFunction(fn).rewrite()

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._rewritten(*args, **kwargs)


def _import_lazy_triton_modules() -> None:
    """Import now what Triton imports lazily at the first launch: Gluon asserts, at import, that
    the standard library is made of JIT functions, so it must not first load mid-swap."""
    with contextlib.suppress(ImportError):  # older Triton has no Gluon
        importlib.import_module("triton.experimental.gluon")


@contextmanager
def _interpreted_stdlib() -> Iterator[None]:
    """Swap ``tl.max``/``tl.sum``/... for interpreted versions for the duration of a launch.

    Triton's standard-library functions (``tl.max``, ``tl.cumsum``, ...) are themselves
    ``@jit`` functions, decorated when ``triton.language`` is imported; unless TRITON_INTERPRET
    was set at that moment they cannot be called from interpreted code. Triton's interpreter
    already patches ``triton.language`` for the duration of each launch; this does the same for
    the standard library, and restores it afterwards.
    """
    from triton.runtime.jit import JITFunction

    _import_lazy_triton_modules()
    swapped: list[tuple[ModuleType, str, object]] = []
    try:
        for module in (tl, tl.standard):
            for name, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    if id(value) not in _STDLIB_SWAPS:
                        _STDLIB_SWAPS[id(value)] = InterpretedDevice(value.fn)
                    setattr(module, name, _STDLIB_SWAPS[id(value)])
                    swapped.append((module, name, value))
        yield
    finally:
        for module, name, value in reversed(swapped):
            setattr(module, name, value)


def interpreted_kernels() -> ModuleType:
    """A private copy of the kernel module whose kernels run in Triton's interpreter."""
    return interpreted_copy(KERNEL_MODULE)


def interpreted_copy(module_name: str) -> ModuleType:
    """A private copy of ``module_name`` (a kernel module) executed with ``_INTERPRET = True``:
    its kernels run in Triton's interpreter. One copy per module, made once."""
    with _COPY_LOCK:
        if module_name not in _COPIES:
            spec = importlib.util.find_spec(module_name)
            assert spec is not None and spec.origin is not None
            name = f"{module_name}_interpreted"
            copy_spec = importlib.util.spec_from_file_location(name, spec.origin)
            assert copy_spec is not None and copy_spec.loader is not None
            module = importlib.util.module_from_spec(copy_spec)
            module.__dict__["_INTERPRET"] = True
            sys.modules[name] = module  # the interpreter reads the kernels' source via inspect
            copy_spec.loader.exec_module(module)
            _COPIES[module_name] = module
    return _COPIES[module_name]


def verify_interpreted(inputs: Any) -> tuple[Any, Any]:
    """The kernels' decision for CPU tensors, computed by Triton's interpreter (one at a time:
    the standard-library swap is process-wide)."""
    module = interpreted_kernels()
    with _LAUNCH_LOCK, _interpreted_stdlib():
        return module.verify_triton(inputs)


def launch_interpreted(spec: Any) -> tuple[Any, ...]:
    """The kernels' launch pair for a lean call on CPU tensors, in Triton's interpreter."""
    module = interpreted_kernels()
    with _LAUNCH_LOCK, _interpreted_stdlib():
        return module.launch(spec)


def verify_tree_interpreted(inputs: Any) -> tuple[Any, Any, Any]:
    """The tree kernel's decision for CPU tensors, computed by Triton's interpreter."""
    module = interpreted_copy(TREE_MODULE)
    with _LAUNCH_LOCK, _interpreted_stdlib():
        return module.verify_tree_triton(inputs)
