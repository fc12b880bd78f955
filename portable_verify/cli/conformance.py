"""``portable-verify conformance``: run the conformance kit on backends and print the evidence.

Exit status: 0 when every check passed (or was skipped), 1 when any failed, 2 for a backend
that does not exist or cannot run here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "conformance",
        help="prove a backend matches the reference: exact, statistical, seed and input checks",
    )
    p.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="backend to test (repeatable; default: every available backend)",
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller samples, and skip the long checks"
    )
    p.add_argument(
        "--check",
        action="append",
        metavar="TEXT",
        help="only checks whose name contains TEXT (repeatable), e.g. --check stat.",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch intra-op threads while checking (default 1: the checks use small tensors, "
        "and extra threads only oversubscribe a shared machine)",
    )
    add_json_option(p, "one row per check and backend (status, seconds, evidence)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import portable_verify as pv
    from portable_verify.testing.stats.negative_controls import controls_registered

    if args.threads < 1:
        print("portable-verify conformance: --threads must be >= 1", file=sys.stderr)
        return 2
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        # The kit's negative controls (``_wrong_*``, ``_exact_rule``) can be run by name, to
        # watch the checks catch a broken backend.
        with controls_registered():
            return _run(args, args.backend or pv.available_backends())
    finally:
        torch.set_num_threads(previous)


def _run(args: argparse.Namespace, backends: list[str]) -> int:
    import portable_verify as pv
    from portable_verify.testing import kit, report

    for name in backends:
        try:
            pv.get_backend(name)
        except (ValueError, RuntimeError) as exc:
            print(f"portable-verify conformance: {exc}", file=sys.stderr)
            return 2
    wanted = kit.all_checks()
    if args.check:
        wanted = [c for c in wanted if any(t in c.name for t in args.check)]
        if not wanted:
            print(f"portable-verify conformance: no check matches {args.check}", file=sys.stderr)
            return 2
    rows = report.run_checks(backends, args.quick, checks=wanted, progress=_progress)
    if to_stdout(args):  # the JSON owns standard output; the table goes to stderr
        from rich.console import Console

        report.render(rows, Console(stderr=True))
    else:
        report.render(rows)
    if args.json:
        write_json(args.json, {"rows": [
            {"backend": r.backend, "check": r.result.name, "status": r.status,
             "seconds": r.seconds, "evidence": report.evidence(r.result),
             "stats": r.result.stats} for r in rows]})
    return 1 if report.failures(rows) else 0


def _progress(row: Any) -> None:
    print(f"  {row.status} {row.backend} {row.result.name} ({row.seconds:.1f} s)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run this subcommand alone (``python -m portable_verify.cli.conformance``)."""
    parser = argparse.ArgumentParser(prog="portable-verify")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["conformance", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
