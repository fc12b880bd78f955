"""The one ``--json FILE`` option every command with machine-readable output takes.

Why one helper: a flag that prints to stdout in one command and a path in another made scripts
guess; here ``FILE`` is always a path and ``-`` is standard output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def add_json_option(parser: Any, what: str) -> None:
    parser.add_argument("--json", metavar="FILE",
                        help=f"write {what} as JSON to FILE ('-': standard output)")


def to_stdout(args: Any) -> bool:
    """True when JSON goes to standard output (human-readable output must then use stderr)."""
    return getattr(args, "json", None) == "-"


def json_only(args: Any, data: Any) -> bool:
    """Write ``data`` to ``--json FILE`` when it was given; True when it went to standard
    output, where the human-readable report must then not go."""
    if getattr(args, "json", None):
        write_json(args.json, data)
    return to_stdout(args)


def write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(target).write_text(text, encoding="utf-8")
