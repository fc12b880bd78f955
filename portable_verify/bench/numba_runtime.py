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

import os
from typing import Any

from portable_verify.warmup import cached_dispatchers as _cached_dispatchers  # noqa: F401
from portable_verify.warmup import kernel_cache as kernel_cache  # numba's index: one reader

THREADS_ENV = "PORTABLE_VERIFY_NUM_THREADS"
"""The variable that overrides the numba backend's thread count (else torch's)."""


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
