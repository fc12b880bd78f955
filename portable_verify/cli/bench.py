"""``portable-verify bench``: time the verifier beside the dense baseline and the memory floor."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark verification against the dense baseline and the memory-read floor",
        description="Sweep (B, K, V) x method x input kind on a device; report medians of "
        "interleaved repetitions and the ratios to the dense textbook verifier, the "
        "memory-read floor, torch.argmax and HF transformers (batch 1).",
    )
    p.add_argument("--quick", action="store_true", help="small grid, fewer repetitions (<1 min)")
    p.add_argument("--shapes", help="override the grid: 'B,K,V;B,K,V;...'")
    p.add_argument("--variants", help="comma list of method/inputs, e.g. greedy/logits")
    p.add_argument("--device", action="append", help="torch device (repeatable); default: auto")
    p.add_argument("--backend", action="append",
                   help="backend name (repeatable); default: the one 'auto' selects")
    p.add_argument("--dtype", action="append", choices=("float32", "bfloat16", "float16"),
                   help="input dtype (repeatable); default float32")
    p.add_argument("--half", action="store_true", help="also run bfloat16 and float16 inputs")
    p.add_argument("--repetitions", type=int, help="interleaved repetitions (default 7; 3 quick)")
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
    add_json_option(p, "every figure and the context")
    p.add_argument("--csv", metavar="PATH", help="write one row per cell as CSV")
    p.add_argument("--markdown", metavar="PATH", help="write the ratios as a Markdown table")
    p.add_argument("--plot", metavar="PNG", help="plot time per call against batch size "
                   "(against threads for a sweep)")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> Any:
    import torch

    from portable_verify.bench.cases import FULL_SHAPES, QUICK_SHAPES, VARIANTS, parse_shapes
    from portable_verify.bench.environment import default_device
    from portable_verify.bench.run import BenchConfig
    from portable_verify.bench.threads import parse_counts

    counts = parse_counts(args.threads)
    shapes = parse_shapes(args.shapes) if args.shapes else (QUICK_SHAPES if args.quick
                                                            else FULL_SHAPES)
    variants = VARIANTS
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        known = {v.label: v for v in VARIANTS}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise ValueError(f"--variants: unknown {unknown}; choose from {sorted(known)}")
        variants = tuple(known[w] for w in wanted)
    dtypes = list(args.dtype or ["float32"])
    if args.half:
        dtypes += [d for d in ("bfloat16", "float16") if d not in dtypes]
    try:
        devices = [torch.device(d) for d in args.device] if args.device else [default_device()]
    except RuntimeError as exc:
        raise ValueError(f"--device: {exc}") from exc
    for d in devices:
        module = getattr(torch, d.type, None)
        if d.type != "cpu" and not (module is not None and module.is_available()):
            raise ValueError(f"--device {d}: no such device is available here "
                             "(see `portable-verify info`)")
    repetitions = args.repetitions or (3 if args.quick else 7)
    if repetitions < 1:
        raise ValueError(f"--repetitions must be >= 1, got {repetitions}")
    if args.clock == "cpu" and (counts != (1,) or any(d.type != "cpu" for d in devices)):
        raise ValueError("--clock cpu measures one thread's CPU time: use it with --threads 1 "
                         "on CPU devices only")
    return BenchConfig(
        shapes=shapes, devices=devices, backends=list(args.backend or ["auto"]),
        variants=variants, dtypes=tuple(dtypes), repetitions=repetitions,
        min_block_s=0.01 if args.quick else 0.03,
        validation={None: False, "default": True}.get(args.validation, args.validation),
        threads=counts, clock=args.clock,
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from portable_verify.bench import output
    from portable_verify.bench.run import metadata, plan
    from portable_verify.bench.run import run as run_grid

    try:
        config = _config(args)
    except ValueError as exc:
        print(f"portable-verify bench: {exc}", file=sys.stderr)
        return 2
    # With the JSON on standard output, the human-readable table goes to stderr.
    console = Console(width=None if sys.stdout.isatty() else 150, stderr=to_stdout(args))
    meta = metadata(config, getattr(args, "argv", None))
    cells: list[dict[str, Any]] = []
    total = len(plan(config))
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=total)
        for m, new in run_grid(config):
            cells.extend(new)
            b, k, v = m.shape
            progress.update(task, advance=1,
                            description=f"{m.device} {m.dtype} ({b},{k},{v}) {m.variant.label}")
    console.print(output.render_table(cells, meta))
    summary = output.target_summary(cells)
    for t in summary:
        mark = "[green]met[/]" if t["met"] else "[red]MISSED[/]"
        console.print(f"target {t['target']} [{t['backend']}]: {t['value']:.2f} -> {mark}")
    peer = next(iter(meta["peers"].items()))
    console.print(f"peer {peer[0]}: {peer[1]['detail']}")
    if args.json:
        write_json(args.json, {"meta": meta, "cells": cells,
                               "targets": output.target_summary(cells)})
    if args.csv:
        output.write_csv(args.csv, meta, cells)
    if args.markdown:
        output.write_markdown(args.markdown, meta, cells)
    if args.plot:
        output.plot(args.plot, cells, meta)
    return 0
