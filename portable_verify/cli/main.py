"""``portable-verify``: one entry point, one module per subcommand.

Each subcommand module exposes ``add_parser(subparsers)`` (registering its options, ``func``
and, where it has arguments to judge, ``check``) so the modules stay independent and heavy
imports happen only when a command runs. ``check`` runs before ``func``: a bad command line is
refused in one line, before any work (:mod:`portable_verify.cli.checks`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from portable_verify.cli.checks import OneLineParser, run_checked

SUBCOMMANDS = ("bench", "info", "conformance", "e2e", "gpu-check", "serve", "serve-check",
               "warm-up")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="portable-verify",
        description="Speculative-decoding verification on any device: benchmark, inspect, test.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"portable_verify.cli.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_checked(parser, args)


if __name__ == "__main__":
    sys.exit(main())
