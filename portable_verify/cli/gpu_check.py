"""``portable-verify gpu-check``: the one prepared check for a machine with an NVIDIA GPU.

Exit status: 0 when every section passed, 1 when one failed (an exception, a subprocess that
exited non-zero, a failed check), 2 where there is no GPU (pass
``--dry-run`` to rehearse every section on the CPU through the Triton interpreter).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json
from portable_verify.cli.progress import Progress, add_quiet_option, verdict


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gpu-check",
        help="warm-up and exactness, speed targets, capture, the kit and device tests on a GPU",
        description="Check the library on an NVIDIA GPU within a lease, in sections of fixed "
        "order each with its share of --budget: environment and warm-up of every kernel "
        "variant (exactness against the numpy reference), the GPU speed targets, CUDA-graph "
        "capture and torch.compile, the quick conformance kit on triton:cuda and torch:cuda, "
        "the device tests, then the full kit with the time left. Every section is saved to "
        "OUT/gpu_check.json as soon as it ends.",
    )
    p.add_argument("--out", default="gpu_check_out", metavar="DIR",
                   help="folder for gpu_check.json and the logs (default gpu_check_out)")
    p.add_argument("--budget", type=float, default=230.0, metavar="S",
                   help="seconds the whole check may take; each section gets its share and "
                   "the full kit what is left (default 230: with a machine's start-up, two runs "
                   "fit a 15-minute lease)")
    p.add_argument("--dry-run", action="store_true",
                   help="rehearse every section on the CPU (Triton interpreter, tiny shapes)")
    p.add_argument("--tests", default="tests", metavar="DIR",
                   help="the repository's tests folder (default ./tests)")
    add_json_option(p, "the whole check")
    add_quiet_option(p)
    checks.register(p, run, check)


def check(args: argparse.Namespace) -> None:
    """The budget and the output paths, judged before any section runs."""
    checks.finite("--budget", args.budget)
    if not args.budget > 0:
        raise checks.UsageError("--budget", f"must be > 0 seconds, got {args.budget}")
    checks.writable_dir("--out", args.out)
    checks.writable_file("--json", args.json, stdout_ok=True)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from portable_verify.bench.gpu_check import GpuCheck, device_available, run_gpu_check

    ok, why = device_available(args.dry_run)
    if not ok:
        print(f"portable-verify gpu-check: {why}", file=sys.stderr)
        return 2
    try:
        check(args)  # again, for callers that skip cli.main
    except checks.UsageError as exc:
        checks.say_error("portable-verify gpu-check", str(exc))
        return 2
    gpu = GpuCheck(out=Path(args.out).resolve(), budget_s=args.budget, dry_run=args.dry_run)
    with Progress("gpu-check", quiet=args.quiet) as progress:
        progress.say(f"on {why}, results in {args.out}")
        data = run_gpu_check(gpu, progress.say, Path(args.tests))
    if args.json:
        write_json(args.json, data)
    for line in data["verdict"]["sections"]:
        _say(f"section {line['section']}: {line['status']}"
             + "".join(f"\n    {f}" for f in line["failures"]))
    for t in data["verdict"]["targets"]:
        mark = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        _say(f"target {t['target']}: {mark} ({t['measured']}; bound {t['bound']})")
    ok = sum(data["summary"].values())
    failed = [name for name, passed in data["summary"].items() if not passed]
    v = data["verdict"]
    verdict("gpu-check", f"{ok} of {len(data['summary'])} sections ok"
            + (f", failed: {', '.join(failed)}" if failed else "")
            + f"; targets {v['targets_met']} met, {v['targets_missed']} missed, "
            f"{v['targets_unmeasured']} not measured ({data['total_seconds']} s, {why})",
            to_stderr=to_stdout(args))
    return 0 if all(data["summary"].values()) else 1
