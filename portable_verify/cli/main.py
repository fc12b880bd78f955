"""``portable-verify``: one entry point, one module per subcommand.

Each subcommand module exposes ``add_parser(subparsers)`` (registering its options and setting
``func``) so the modules stay independent and heavy imports happen only when a command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("bench", "info", "conformance", "e2e", "gpu-check", "serve", "serve-check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="portable-verify",
        description="Speculative-decoding verification on any device: benchmark, inspect, test.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"portable_verify.cli.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
