"""Argument checks every subcommand runs before it starts work.

Why: a bad command line should cost one line on stderr and exit status 2, not a traceback
after minutes of benchmarking (e.g. a ``--json`` path whose folder does not exist). Each
subcommand registers a ``check(args)`` (:func:`register`) that raises :class:`UsageError`;
``cli.main`` turns it into argparse's own one-line error
(``portable-verify bench: error: --backend: ...``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

INPUT_BYTES_LIMIT = 2 * 1024**3
"""Largest benchmark cell (its float32 target and draft distributions) ``bench`` accepts:
2 GiB, or a quarter of physical memory where that is less."""


class UsageError(ValueError):
    """A bad command line: ``flag`` is the option at fault, ``message`` says why."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (``prog: error: message``) without the
    usage block, so a mistake reads at once; ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run_checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check ``args`` with the subcommand's ``check`` (if any), then run it; a
    :class:`UsageError` from either becomes a one-line error and exit status 2."""
    sub = getattr(args, "cli_parser", parser)
    try:
        check = getattr(args, "cli_check", None)
        if check is not None:
            check(args)
        return int(args.func(args) or 0)
    except UsageError as exc:
        sub.error(str(exc))


def writable_file(flag: str, path: str | None, stdout_ok: bool = False) -> None:
    """``path`` can be created or overwritten, found by doing it: a new file is created and
    removed, an existing one opened to append (left unchanged); ``-`` is standard output where
    ``stdout_ok``. Why not ``os.access``: it says yes to root everywhere, and a folder such as
    ``/proc`` refuses new files whatever its mode bits say."""
    if path is None or (stdout_ok and path == "-"):
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise UsageError(flag, f"{path!r} is a folder, not a file")
    _existing_folder(flag, target.parent, path)
    existed = target.exists()
    if existed and not target.is_file():  # a device such as /dev/null: opening is the write
        if not os.access(target, os.W_OK):
            raise UsageError(flag, f"{path!r} exists and is not writable")
        return
    try:
        with open(target, "a" if existed else "x", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(flag, f"cannot write {path!r}: {exc.strerror or exc}") from None
    if not existed:
        target.unlink(missing_ok=True)


def writable_dir(flag: str, path: str | None) -> None:
    """``path`` is a folder files can be written in, or one that can be created, found by
    doing it: a file is created and removed in the folder, or (where it does not exist yet) a
    folder created and removed in its nearest existing parent."""
    if path is None:
        return
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(flag, f"{path!r} exists and is not a folder")
    folder = target if target.exists() else next(
        (p for p in target.parents if p.exists()), Path("."))
    _existing_folder(flag, folder, path)
    try:
        if target.exists():
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".pv-probe-")
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".pv-probe-"))
    except OSError as exc:
        raise UsageError(flag, f"cannot write {path!r}: folder {str(folder)!r}: "
                         f"{exc.strerror or exc}") from None


def _existing_folder(flag: str, folder: Path, path: str) -> None:
    folder = folder if str(folder) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise UsageError(flag, f"cannot write {path!r}: {str(folder)!r} is not a folder")
    if not folder.is_dir():
        raise UsageError(flag, f"cannot write {path!r}: folder {str(folder)!r} does not exist")


def at_least(flag: str, value: float | None, low: float) -> None:
    if value is not None and not value >= low:
        raise UsageError(flag, f"must be >= {low:g}, got {value}")


def at_most(flag: str, value: float | None, high: float, why: str = "") -> None:
    if value is not None and value > high:
        raise UsageError(flag, f"must be at most {high:g}{why}, got {value}")


def finite(flag: str, value: float | None, low: float | None = None) -> None:
    """A finite number (NaN and infinities refused), at least ``low`` when given."""
    if value is None:
        return
    if not math.isfinite(value):
        raise UsageError(flag, f"must be a finite number, got {value}")
    if low is not None:
        at_least(flag, value, low)


def backends(flag: str, names: Iterable[str] | None, allow_auto: bool = True) -> None:
    """Every name is a backend that exists and can run here."""
    import portable_verify as pv

    for name in names or ():
        if allow_auto and name == "auto":
            continue
        try:
            pv.get_backend(name)
        except (ValueError, RuntimeError) as exc:
            known = ", ".join(pv.available_backends())
            reason = "unknown backend" if isinstance(exc, ValueError) else "not available here"
            raise UsageError(flag, f"{reason} {name!r}; available: {known}") from None


def physical_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def memory_limit_bytes() -> int:
    """:data:`INPUT_BYTES_LIMIT`, or a quarter of physical memory where that is less."""
    phys = physical_memory_bytes()
    return min(INPUT_BYTES_LIMIT, phys // 4) if phys else INPUT_BYTES_LIMIT


def say_error(prog: str, message: str) -> None:
    """The one-line error of a run that had to stop (not a command-line mistake)."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def register(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
             check: Callable[[argparse.Namespace], None] | None = None,
             **defaults: Any) -> None:
    """Set a subcommand's ``func``, its ``check`` and its own parser (for the error line)."""
    parser.set_defaults(func=run, cli_check=check, cli_parser=parser, **defaults)
