"""Run a function in a fresh Python process, so a segfault or a hang is a verdict, not the end.

Why: a backend that reads out of bounds (a kernel given unvalidated garbage) can kill the whole
process. In-process guards (``kit.check`` turns exceptions into failed results) cannot catch a
signal; a child process can die alone, and its exit status says how.

The child imports ``module:function`` (a dotted module or a ``.py`` path), calls it with
JSON arguments and prints its JSON-able return value on one marked line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

_MARKER = "@@portable_verify.isolation@@"

_CHILD = f"""
import importlib, importlib.util, json, os, sys
where, name = sys.argv[1].rsplit(":", 1)
if where.endswith(".py"):
    sys.path.insert(0, os.path.dirname(os.path.abspath(where)))  # as when run as a script
    spec = importlib.util.spec_from_file_location("_isolated_target", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
else:
    module = importlib.import_module(where)
value = getattr(module, name)(*json.loads(sys.argv[2]))
sys.stdout.flush()
print({_MARKER!r} + json.dumps(value), flush=True)
"""


@dataclass(frozen=True)
class ChildOutcome:
    """How the child ended and what it returned (``None`` unless it returned normally)."""

    returncode: int | None  # None: killed after the timeout
    value: Any
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        """A one-line verdict: ``exit 0``, ``killed by SIGSEGV``, ``timed out``, ..."""
        if self.returncode is None:
            return "timed out (hang)"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        last = self.stderr_tail.strip().splitlines()[-1:] or [""]
        return f"exit {self.returncode}" + (f": {last[0]}" if self.returncode else "")


def run_isolated(target: str, *args: Any, timeout: float = 600.0,
                 env: dict[str, str] | None = None) -> ChildOutcome:
    """Call ``target`` (``"pkg.module:function"`` or ``"/path/file.py:function"``) with JSON
    ``args`` in a fresh interpreter; never raises for what happens inside the child."""
    child_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, target, json.dumps(list(args))],
            capture_output=True, text=True, timeout=timeout, env=child_env,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return ChildOutcome(None, None, stderr[-2000:])
    value = None
    for line in proc.stdout.splitlines():
        if line.startswith(_MARKER):
            value = json.loads(line[len(_MARKER):])
    return ChildOutcome(proc.returncode, value, proc.stderr[-2000:])
