"""``portable-verify conformance``: run the conformance kit on backends and print the evidence.

Exit status: 0 when every check passed (or was skipped), 1 when any failed, 2 for a backend
that does not exist or cannot run here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json
from portable_verify.cli.progress import Progress, add_quiet_option, verdict


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
    add_quiet_option(p)
    checks.register(p, run, check)


def check(args: argparse.Namespace) -> None:
    """Backends, check names, threads and the JSON path, judged before any check runs."""
    from portable_verify.testing import kit
    from portable_verify.testing.stats.negative_controls import controls_registered

    checks.at_least("--threads", args.threads, 1)
    checks.writable_file("--json", args.json, stdout_ok=True)
    with controls_registered():  # the kit's negative controls are backends by name too
        checks.backends("--backend", args.backend, allow_auto=False)
    if args.check and not _wanted(args, kit.all_checks()):
        names = ", ".join(sorted({c.name.split(".")[0] + "." for c in kit.all_checks()}))
        raise checks.UsageError("--check", f"no check matches {args.check}; check names start "
                                f"with {names}")


def _wanted(args: argparse.Namespace, every: list[Any]) -> list[Any]:
    return [c for c in every if any(t in c.name for t in args.check)] if args.check else every


def run(args: argparse.Namespace) -> int:
    import torch

    import portable_verify as pv
    from portable_verify.testing.stats.negative_controls import controls_registered

    try:
        check(args)  # again, for callers that skip cli.main (this module's own main)
    except checks.UsageError as exc:
        checks.say_error("portable-verify conformance", str(exc))
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
        pv.get_backend(name)  # checked already: raises only for a backend that broke since
    wanted = _wanted(args, kit.all_checks())
    with Progress("conformance", total=len(backends) * len(wanted),
                  quiet=args.quiet) as progress:
        rows = report.run_checks(
            backends, args.quick, checks=wanted,
            progress=lambda row: progress.advance(
                f"{row.status} {row.backend} {row.result.name} ({row.seconds:.1f} s)"))
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
    verdict("conformance", _verdict_text(rows, backends), to_stderr=to_stdout(args))
    return 1 if report.failures(rows) else 0


def _verdict_text(rows: list[Any], backends: list[str]) -> str:
    """``312 of 312 checks passed, 0 failed, 14 skipped (numba:cpu, torch:cpu)``."""
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    ran = counts["PASS"] + counts["FAIL"]
    return (f"{counts['PASS']} of {ran} checks passed, {counts['FAIL']} failed, "
            f"{counts['SKIP']} skipped ({', '.join(backends)})")


def main(argv: list[str] | None = None) -> int:
    """Run this subcommand alone (``python -m portable_verify.cli.conformance``)."""
    parser = argparse.ArgumentParser(prog="portable-verify")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["conformance", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))  # run() checks its arguments itself, returning 2


if __name__ == "__main__":
    sys.exit(main())
