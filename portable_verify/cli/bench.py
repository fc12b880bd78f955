"""``portable-verify bench``: time the verifier beside the dense baseline and the memory floor.

The default run is sized for a person at a terminal (a few minutes, cold kernel cache
included); ``--full`` adds the largest shape and more repetitions, ``--quick`` is a first look.
The table shows what a reader needs at 100 columns; ``--wide`` shows every measured column. On
a CUDA device the table puts eager wall time per call beside device time by graph replay.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json
from portable_verify.cli.progress import NARROW_WIDTH, Progress, add_quiet_option, verdict


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark verification against the dense baseline and the memory-read floor",
        description="Sweep (B, K, V) x method x input kind on a device; report medians of "
        "interleaved repetitions and the ratios to the dense textbook verifier, the "
        "memory-read floor, torch.argmax and HF transformers (batch 1). On a CUDA device the "
        "floor comes from its copy bandwidth and each call's device time by CUDA-graph replay "
        "is shown beside its eager time.",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="small grid, fewer repetitions (about a minute)")
    size.add_argument("--full", action="store_true",
                      help="the whole grid, with B=64 at V=128256, and 7 repetitions")
    p.add_argument("--shapes", help="override the grid: 'B,K,V;B,K,V;...'")
    p.add_argument("--variants", help="comma list of method/inputs, e.g. greedy/logits")
    p.add_argument("--device", action="append", help="torch device (repeatable); default: auto")
    p.add_argument("--backend", action="append",
                   help="backend name (repeatable); default: the one 'auto' selects")
    p.add_argument("--dtype", action="append", choices=("float32", "bfloat16", "float16"),
                   help="input dtype (repeatable); default float32")
    p.add_argument("--half", action="store_true", help="also run bfloat16 and float16 inputs")
    p.add_argument("--repetitions", type=int,
                   help="interleaved repetitions (default 5; 3 quick; 7 full)")
    p.add_argument("--threads", default="1",
                   help="CPU thread count, or a comma list for a sweep in one run (e.g. 1,2): "
                   "every count is timed inside the same interleaved repetitions and each cell "
                   "reports its speed-up over the first count beside torch.amax's (default 1; "
                   "sets torch's threads and PORTABLE_VERIFY_NUM_THREADS)"),
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time by wall clock (default) or by this thread's CPU time, which "
                   "discounts waiting for a core on a shared CPU (one-thread CPU runs only)")
    p.add_argument("--validation", nargs="?", const="default", choices=("default", "full"),
                   help="also time verify(validate=True) as its own column; '--validation full' "
                   "adds verify(validate=\"full\") (every full-row check) beside it")
    p.add_argument("--wide", action="store_true",
                   help="every measured column (the default table fits 100 columns)")
    add_json_option(p, "every figure and the context")
    p.add_argument("--csv", metavar="PATH", help="write one row per cell as CSV")
    p.add_argument("--markdown", metavar="PATH", help="write the ratios as a Markdown table")
    p.add_argument("--plot", metavar="PNG", help="plot time per call against batch size "
                   "(against threads for a sweep)")
    add_quiet_option(p)
    checks.register(p, run, check)


def check(args: argparse.Namespace) -> None:
    """Every option judged before any timing: the grid, the backends, the output paths."""
    _config(args)
    checks.backends("--backend", args.backend)
    checks.writable_file("--json", args.json, stdout_ok=True)
    for flag, path in (("--csv", args.csv), ("--markdown", args.markdown),
                       ("--plot", args.plot)):
        checks.writable_file(flag, path)
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise checks.UsageError("--plot", "needs matplotlib (pip install matplotlib)")


def _shapes(args: argparse.Namespace) -> Any:
    from portable_verify.bench.cases import (
        DEFAULT_SHAPES,
        FULL_SHAPES,
        QUICK_SHAPES,
        input_bytes,
        parse_shapes,
    )

    if not args.shapes:
        return QUICK_SHAPES if args.quick else FULL_SHAPES if args.full else DEFAULT_SHAPES
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        raise checks.UsageError("--shapes", str(exc).removeprefix("--shapes: ")) from None
    limit = checks.memory_limit_bytes()
    for shape in shapes:
        if input_bytes(shape) > limit:
            raise checks.UsageError(
                "--shapes", f"{','.join(map(str, shape))} needs {input_bytes(shape) / 2**30:.1f}"
                f" GiB of float32 inputs; the limit is {limit / 2**30:.1f} GiB (2 GiB, or a "
                "quarter of physical memory where less)")
    return shapes


def _variants(args: argparse.Namespace) -> Any:
    from portable_verify.bench.cases import VARIANTS

    if not args.variants:
        return VARIANTS
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    known = {v.label: v for v in VARIANTS}
    unknown = [w for w in wanted if w not in known]
    if unknown or not wanted:
        raise checks.UsageError("--variants", f"unknown {unknown or args.variants!r}; "
                                f"choose from {', '.join(known)}")
    return tuple(known[w] for w in wanted)


def _devices(args: argparse.Namespace) -> list[Any]:
    import torch

    from portable_verify.bench.environment import default_device

    try:
        devices = [torch.device(d) for d in args.device] if args.device else [default_device()]
    except RuntimeError as exc:
        raise checks.UsageError("--device", str(exc)) from None
    for d in devices:
        module = getattr(torch, d.type, None)
        if d.type != "cpu" and not (module is not None and module.is_available()):
            raise checks.UsageError("--device", f"{d}: no such device is available here "
                                    "(see `portable-verify info`)")
    return devices


def _config(args: argparse.Namespace) -> Any:
    from portable_verify.bench.run import BenchConfig
    from portable_verify.bench.threads import parse_counts

    try:
        counts = parse_counts(args.threads)
    except ValueError as exc:
        raise checks.UsageError("--threads", str(exc).removeprefix("--threads: ")) from None
    dtypes = list(args.dtype or ["float32"])
    if args.half:
        dtypes += [d for d in ("bfloat16", "float16") if d not in dtypes]
    devices = _devices(args)
    repetitions = (args.repetitions if args.repetitions is not None
                   else 3 if args.quick else 7 if args.full else 5)
    checks.at_least("--repetitions", repetitions, 1)
    if args.clock == "cpu" and (counts != (1,) or any(d.type != "cpu" for d in devices)):
        raise checks.UsageError("--clock", "cpu measures one thread's CPU time: use it with "
                                "--threads 1 on CPU devices only")
    return BenchConfig(
        shapes=_shapes(args), devices=devices, backends=list(args.backend or ["auto"]),
        variants=_variants(args), dtypes=tuple(dtypes), repetitions=repetitions,
        min_block_s=0.01 if args.quick else 0.03,
        validation={None: False, "default": True}.get(args.validation, args.validation),
        threads=counts, clock=args.clock,
    )


def _console(args: argparse.Namespace, table: Any = None) -> Any:
    """The terminal's width on a terminal, else 100 columns (``--wide``: the table's own)."""
    from rich.console import Console

    stderr = to_stdout(args)  # with the JSON on standard output, the tables go to stderr
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    width = NARROW_WIDTH
    if table is not None:
        width = max(width, Console(width=1000).measure(table).maximum)
    return Console(width=width, stderr=stderr)


def run(args: argparse.Namespace) -> int:
    from portable_verify.bench import output
    from portable_verify.bench.run import metadata, plan
    from portable_verify.bench.run import run as run_grid
    from portable_verify.dispatch import ENV_INTERIM

    try:
        config = _config(args)
    except checks.UsageError as exc:  # called without cli.main's check (e.g. from a test)
        checks.say_error("portable-verify bench", str(exc))
        return 2
    # A benchmark times the compiled kernels, never the interim stand-in: a cold cache compiles
    # the kernels it times on the first cells, here (docs/decisions.md, "The first call").
    os.environ.setdefault(ENV_INTERIM, "0")
    meta = metadata(config, getattr(args, "argv", None))
    cells: list[dict[str, Any]] = []
    total = len(plan(config))
    with Progress("bench", total=total, quiet=args.quiet) as progress:
        progress.say(f"timing {total} cells, {config.repetitions} interleaved repetitions "
                     "each (a cold numba cache compiles on the first cells)")
        for m, new in run_grid(config):
            cells.extend(new)
            b, k, v = m.shape
            ms = ", ".join(f"{c['backend']} {c['times_ms']['verify']:.3f} ms" for c in new)
            progress.advance(f"{m.device} {m.dtype} {m.variant.label} ({b},{k},{v}): {ms}")
    _print_results(args, cells, meta)
    if args.json:
        write_json(args.json, {"meta": meta, "cells": cells,
                               "targets": output.target_summary(cells)})
    if args.csv:
        output.write_csv(args.csv, meta, cells)
    if args.markdown:
        output.write_markdown(args.markdown, meta, cells)
    if args.plot:
        output.plot(args.plot, cells, meta)
    groups = output.target_groups(cells)
    verdict("bench", output.verdict_text(groups, cells, meta), to_stderr=to_stdout(args))
    return 0


def _print_results(args: argparse.Namespace, cells: list[dict[str, Any]],
                   meta: dict[str, Any]) -> None:
    from portable_verify.bench import output

    tables = [output.render_table(cells, meta)] if args.wide else output.compact_tables(
        cells, meta)
    for table in tables:
        _console(args, table if args.wide else None).print(table)
    console = _console(args)
    for line in output.target_lines(output.target_groups(cells)):
        console.print(line, markup=False, highlight=False)
    peer = next(iter(meta["peers"].items()))
    console.print(f"peer {peer[0]}: {peer[1]['detail']}", highlight=False)
    failed = {(name, why) for c in cells for name, why in c.get("peer_errors", {}).items()}
    for name, why in sorted(failed):
        console.print(f"peer {name} not timed: {why}", markup=False, highlight=False)
    uncaptured = {(c["backend"], c["graph_error"]) for c in cells if c.get("graph_error")}
    for name, why in sorted(uncaptured):
        console.print(f"{name}: no graph time: {why}", markup=False, highlight=False)
