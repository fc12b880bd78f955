"""The numba backend's runtime state, read without compiling anything (for ``info``, bench).

Why: a cold first call compiles the kernels for tens of seconds (docs/benchmarks.md, *Caveats*,
"First call"), and a server wants to know before its first step whether that cost is still ahead
(server start-up). numba keeps one index file per cached function; an entry counts only for this
numba version, the source file's current stamp, this CPU (target triple, CPU name and features) and
the function's current bytecode. We read those index files the way numba's own loader does, so
"warm" means numba would load instead of compile. The loader's internals are private: any surprise
reads as "unknown", never a crash.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

KERNEL_MODULES = ("portable_verify.backends.numba.chain", "portable_verify.backends.numba.rows")
THREADS_ENV = "PORTABLE_VERIFY_NUM_THREADS"
"""The variable that overrides the numba backend's thread count (else torch's)."""


def _cached_dispatchers(module: Any) -> dict[str, Any]:
    """The module's own cached, separately compiled kernels (``inline="always"`` ones are
    compiled into their callers and never cached on their own)."""
    from numba.core.dispatcher import Dispatcher

    found = {}
    for name, obj in vars(module).items():
        if not isinstance(obj, Dispatcher) or getattr(obj, "__module__", None) != module.__name__:
            continue
        if obj.targetoptions.get("inline", "never") == "always":
            continue
        if type(obj._cache).__name__ == "NullCache":
            continue
        found[name] = obj
    return found


def _entries_for_here(dispatcher: Any) -> int:
    """How many cached signatures of ``dispatcher`` numba would load on this machine."""
    cache = dispatcher._cache
    codegen = dispatcher.targetctx.codegen()
    _, here_machine, here_code = cache._index_key(None, codegen)
    index = cache._cache_file._load_index()  # {} when absent, another version or stale
    return sum(1 for key in index if key[1] == here_machine and key[2] == here_code)


def kernel_cache() -> dict[str, Any]:
    """``state`` (warm / partial / cold / unavailable / unknown), the cache folder and, per
    kernel, how many signatures are cached for this numba version and CPU."""
    try:
        import numba
    except ImportError as exc:
        return {"state": "unavailable", "detail": f"numba not importable: {exc}", "kernels": {}}
    kernels: dict[str, int] = {}
    where: set[str] = set()
    try:
        for module_name in KERNEL_MODULES:
            module = importlib.import_module(module_name)
            for name, dispatcher in _cached_dispatchers(module).items():
                key = f"{module_name.partition('backends.')[2]}.{name}"
                kernels[key] = _entries_for_here(dispatcher)
                where.add(dispatcher._cache.cache_path)
    except Exception as exc:  # private numba API, or no cache locator (read-only install)
        return {"state": "unknown", "detail": f"{type(exc).__name__}: {exc}",
                "numba": numba.__version__, "kernels": kernels}
    warm = sum(1 for n in kernels.values() if n > 0)
    state = "cold" if warm == 0 else "warm" if warm == len(kernels) else "partial"
    return {"state": state, "numba": numba.__version__, "cache_dirs": sorted(where),
            "detail": f"{warm} of {len(kernels)} kernels cached for numba "
                      f"{numba.__version__} on this CPU", "kernels": kernels}


def threading() -> dict[str, Any]:
    """numba's threading layer and thread counts, beside what decides the backend's count.

    Asking numba for its thread count starts its thread pool (no compilation); the layer is
    only known once the pool has started.
    """
    try:
        import numba
    except ImportError as exc:
        return {"available": False, "detail": f"numba not importable: {exc}"}
    import torch

    out: dict[str, Any] = {
        "available": True,
        "layer_requested": numba.config.THREADING_LAYER,
        "numba_num_threads": numba.config.NUMBA_NUM_THREADS,
        "env": {THREADS_ENV: os.environ.get(THREADS_ENV),
                "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS"),
                "NUMBA_THREADING_LAYER": os.environ.get("NUMBA_THREADING_LAYER"),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "torch_threads": torch.get_num_threads(),
    }
    try:
        out["numba_threads"] = numba.get_num_threads()
        out["layer"] = numba.threading_layer()
    except Exception as exc:  # no usable layer (e.g. a forbidden one was requested)
        out["layer"] = None
        out["detail"] = f"{type(exc).__name__}: {exc}"
    return out
