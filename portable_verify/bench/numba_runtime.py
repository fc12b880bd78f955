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

from portable_verify import dispatch

THREADS_ENV = "PORTABLE_VERIFY_NUM_THREADS"
"""The variable that overrides the numba backend's thread count (else torch's)."""


def kernel_cache() -> dict[str, Any]:
    """numba's kernel cache as its registration's warming reads it (numba's index: one
    reader), without compiling anything."""
    warms = dispatch.warming_of("numba")
    if warms is None:
        return {"state": "unavailable", "detail": "no numba backend is registered", "kernels": {}}
    return warms.kernel_cache()


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


def compile_profile(run: Any) -> dict[str, Any]:
    """Process CPU time spent compiling while ``run()`` runs, per compiled function (exclusive
    of the functions it compiles in turn) and per stage: numba's passes (from its
    ``numba:compile`` / ``numba:run_pass`` events) and LLVM's (timers around numba's library
    methods, private: they may move between numba versions), plus the ``inline="always"`` call
    sites inlined per helper. Why: a cold build's cost is spread over dozens of functions,
    and which function or stage to cut is only visible this way (docs/benchmarks.md, "The
    first call, cold cache"). Run it with an empty ``NUMBA_CACHE_DIR``."""
    import collections
    import time

    from numba.core import codegen, event
    from numba.core import inline_closurecall as inlining

    clock = time.process_time
    stack: list[list[Any]] = []  # [stage, function or None, start, children's time]
    spent: dict[tuple[str, str], float] = collections.defaultdict(float)
    sites: collections.Counter[str] = collections.Counter()

    def owner() -> str:
        return next((f[1] for f in reversed(stack) if f[1] is not None), "<none>")

    def push(stage: str, function: str | None = None) -> None:
        stack.append([stage, function, clock(), 0.0])

    def pop() -> None:
        stage, function, start, children = stack.pop()
        elapsed = clock() - start
        spent[(function or owner(), stage)] += elapsed - children
        if stack:
            stack[-1][3] += elapsed

    class _Listener(event.Listener):
        def on_start(self, e: Any) -> None:
            if e.kind == "numba:compile":
                f = e.data["dispatcher"].py_func
                push("other", f"{f.__module__.rsplit('.', 1)[-1]}.{f.__name__}")
            else:
                push(e.data["name"].split(" [")[0])

        def on_end(self, e: Any) -> None:
            pop()

    def timed(cls: Any, name: str, stage: str) -> tuple[Any, str, Any]:
        original = getattr(cls, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if stage == "inline":
                sites[args[3].__name__] += 1
            push(stage)
            try:
                return original(self, *args, **kwargs)
            finally:
                pop()

        setattr(cls, name, wrapper)
        return cls, name, original

    patched = [timed(codegen.CPUCodeLibrary, "_optimize_functions", "llvm_function_passes"),
               timed(codegen.CPUCodeLibrary, "_optimize_final_module", "llvm_final_module"),
               timed(codegen.JITCodeLibrary, "_finalize_specific", "llvm_machine_code"),
               timed(inlining.InlineWorker, "inline_function", "inline")]
    listener = _Listener()
    start = clock()
    try:
        with event.install_listener("numba:compile", listener), \
                event.install_listener("numba:run_pass", listener):
            run()
    finally:
        for cls, name, original in patched:
            setattr(cls, name, original)
    functions: dict[str, dict[str, float]] = collections.defaultdict(dict)
    stages: dict[str, float] = collections.defaultdict(float)
    for (function, stage), seconds in spent.items():
        functions[function][stage] = functions[function].get(stage, 0.0) + seconds
        stages[stage] += seconds
    return {"cpu_s": clock() - start, "functions": dict(functions), "stages": dict(stages),
            "inline_sites": dict(sites)}


def _print_profile() -> None:
    """``python -m portable_verify.bench.numba_runtime``: a cold ``warm-up``'s profile."""
    from portable_verify.warmup import warm_up

    profile = compile_profile(lambda: warm_up(backend="numba:cpu"))
    rows = sorted(profile["functions"].items(), key=lambda kv: -sum(kv[1].values()))
    modules = ("chain", "block", "tree", "traversal", "rows", "entries")  # not a method: modules
    ours = sum(1 for name, _ in rows if name.split(".")[0] in modules)
    print(f"CPU {profile['cpu_s']:.1f} s, {ours} kernel functions compiled (exclusive s; "
          "arrayobj: numba's own array constructors):")
    for name, stages in rows:
        print(f"  {name:32s} {sum(stages.values()):6.2f}")
    print("by stage:")
    for stage, seconds in sorted(profile["stages"].items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {stage:32s} {seconds:6.2f}")
    print("inline=\"always\" call sites:", sum(profile["inline_sites"].values()))


if __name__ == "__main__":
    _print_profile()
