"""``portable-verify gpu-check``: the one prepared check for a machine with an NVIDIA GPU.

Exit status: 0 when every section ran, 1 when one failed, 2 where there is no GPU (pass
``--dry-run`` to rehearse every section on the CPU through the Triton interpreter).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from portable_verify.cli.jsonout import add_json_option, write_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gpu-check",
        help="exactness, CUDA graphs, speed (the bench grid), tests and conformance on a GPU",
        description="Check the Triton kernels on an NVIDIA GPU in one run: decisions against "
        "the numpy reference, CUDA-graph capture, the benchmark grid beside the torch backend "
        "and the memory floor, tests/test_triton.py and the quick conformance kit. Every "
        "section is saved to OUT/gpu_check.json as soon as it ends.",
    )
    p.add_argument("--out", default="gpu_check_out", metavar="DIR",
                   help="folder for gpu_check.json and the logs (default gpu_check_out)")
    p.add_argument("--budget", type=float, default=330.0, metavar="S",
                   help="seconds the whole check may take; late sections shrink or skip "
                   "(default 330)")
    p.add_argument("--dry-run", action="store_true",
                   help="rehearse every section on the CPU (Triton interpreter, tiny shapes)")
    p.add_argument("--tests", default="tests", metavar="DIR",
                   help="the repository's tests folder (default ./tests)")
    add_json_option(p, "the whole check")
    p.set_defaults(func=run)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from portable_verify.bench.gpu_check import GpuCheck, device_available, run_gpu_check

    ok, why = device_available(args.dry_run)
    if not ok:
        print(f"portable-verify gpu-check: {why}", file=sys.stderr)
        return 2
    if args.budget <= 0:
        print(f"portable-verify gpu-check: --budget must be > 0, got {args.budget}",
              file=sys.stderr)
        return 2
    _say(f"gpu-check on {why}, results in {args.out}")
    check = GpuCheck(out=Path(args.out).resolve(), budget_s=args.budget, dry_run=args.dry_run)
    data = run_gpu_check(check, _say, Path(args.tests))
    if args.json:
        write_json(args.json, data)
    _say("verdict: " + json.dumps(data["verdict"]))
    _say(f"sections ok: {json.dumps(data['summary'])} in {data['total_seconds']} s")
    return 0 if all(data["summary"].values()) else 1
