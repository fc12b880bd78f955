"""``portable-verify warm-up``: compile (or load) every kernel of a backend, once, up front.

Why: images and servers run it at build or start-up so that no request's step, and no user's
first call, pays a compile (docs/decisions.md, "The first call"). With numba's disk cache the
kernels it compiles serve every later process on the machine.
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.progress import Progress, add_quiet_option, verdict


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "warm-up",
        help="compile (or load from the cache) every kernel before the first call",
        description="Make tiny calls that reach every kernel of the backend (chain: every "
        "chain method; block; tree: every tree method and children mode it implements), so "
        "the kernels are compiled into numba's disk cache before any real call.",
    )
    p.add_argument("--backend", default="auto",
                   help="the backend to warm (default auto: what auto takes on the CPU)")
    add_quiet_option(p)
    checks.register(p, run, check)


def check(args: argparse.Namespace) -> None:
    """The backend name, judged before anything compiles."""
    checks.backends("--backend", [args.backend])


def run(args: argparse.Namespace) -> int:
    import portable_verify as pv
    from portable_verify.bench.numba_runtime import kernel_cache
    from portable_verify.warmup import WARM_METHODS

    before = kernel_cache()
    name = pv.get_backend(args.backend).qualified_name if args.backend != "auto" else "auto"
    start, cpu = time.perf_counter(), _cpu_seconds()
    with Progress("warm-up", total=len(WARM_METHODS) + 1, quiet=args.quiet) as bar:
        bar.say(f"{name}: kernel cache {before['state']}"
                + (f" ({before['cache_dirs'][0]})" if before.get("cache_dirs") else ""))
        for method in (*WARM_METHODS, "tree"):
            chain = () if method == "tree" else (method,)
            seconds = pv.warm_up(backend=args.backend, methods=chain,
                                 trees=method == "tree")
            bar.advance(f"{method} {sum(seconds.values()):.1f} s")
    pv.warm_up(backend=args.backend)  # all loaded now: marks the process's kernels ready
    after = kernel_cache()
    verdict("warm-up", f"{name} ready in {time.perf_counter() - start:.1f} s "
            f"({_cpu_seconds() - cpu:.1f} s of CPU); kernel cache {after['state']}")
    return 0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
