"""What a long command is doing, on stderr, and its one-line verdict, on stdout.

Why one helper for ``bench``, ``conformance``, ``e2e``, ``serve-check`` and ``gpu-check``: a
run captured by CI, a log or ``| tee`` must show it is alive as well as one in a terminal. On a
terminal a live rich bar (transient); otherwise one plain line per finished cell or event,
and for updates inside a cell at most one line per :data:`PLAIN_EVERY_S`; ``--quiet`` turns
both off. Standard output keeps the results and the verdict only.
"""

from __future__ import annotations

import sys
import time
from typing import Any

PLAIN_EVERY_S = 10.0
NARROW_WIDTH = 100
"""Render width of results when their stream is not a terminal (a log, CI, ``| tee``): every
table a command prints fits it (tests render them at this width)."""


def add_quiet_option(parser: Any) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress on stderr (results and the verdict line only)")


class Progress:
    """Progress of ``command``: :meth:`advance` when a cell ends, :meth:`say` for an event worth
    a line of its own, :meth:`tick` for updates that may come often."""

    def __init__(self, command: str, total: int | None = None, quiet: bool = False,
                 every_s: float = PLAIN_EVERY_S) -> None:
        self.command, self.total, self.quiet, self.every_s = command, total, quiet, every_s
        self.done = 0
        self.start = time.monotonic()
        self.last_line = float("-inf")
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Progress:
        from rich.console import Console

        console = Console(stderr=True)
        if not self.quiet and console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TimeElapsedColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            columns = ((BarColumn(), MofNCompleteColumn()) if self.total else (SpinnerColumn(),))
            self.bar = RichProgress("{task.description}", *columns, TimeElapsedColumn(),
                                    console=console, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.command, total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
            self.bar = None

    def advance(self, description: str, n: int = 1) -> None:
        """A cell (or ``n``) finished: the bar moves, or one plain line says which."""
        self.done += n
        if self.bar is not None:
            self.bar.update(self.task, advance=n, description=description)
        elif not self.quiet:
            count = f"[{self.done}/{self.total}] " if self.total else ""
            self._line(f"{count}{description}")

    def say(self, line: str) -> None:
        """An event worth its own line (a configuration starts, a section ends)."""
        if self.bar is not None:
            self.bar.update(self.task, description=line)
        elif not self.quiet:
            self._line(line)

    def tick(self, line: str) -> None:
        """A frequent update: shown on the bar, as a plain line at most every ``every_s``."""
        if self.bar is not None:
            self.bar.update(self.task, description=line)
        elif not self.quiet and time.monotonic() - self.last_line >= self.every_s:
            self._line(line)

    def _line(self, text: str) -> None:
        self.last_line = time.monotonic()
        elapsed = self.last_line - self.start
        print(f"{self.command}: {text} ({elapsed:.0f} s)", file=sys.stderr, flush=True)


def verdict(command: str, text: str, to_stderr: bool = False) -> None:
    """The run's one-line verdict, last, on stdout (stderr when JSON owns stdout)."""
    print(f"{command}: {text}", file=sys.stderr if to_stderr else sys.stdout, flush=True)
