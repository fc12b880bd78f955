"""Run the conformance registry over backends and render the verdicts as one table.

Why a separate module: pytest, the CLI and a backend author's own scripts all want the same
run-everything-and-show-the-evidence loop; each line of the table carries the statistic behind
its verdict, so a FAIL can be read without rerunning anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from portable_verify.testing.kit import Check, CheckResult, all_checks, skipped_under_quick

MAX_CELL = 260


@dataclass(frozen=True)
class Row:
    """One verdict: a check on a backend, with how long it took."""

    backend: str
    result: CheckResult
    seconds: float

    @property
    def status(self) -> str:
        if self.result.skipped:
            return "SKIP"
        return "PASS" if self.result.passed else "FAIL"


def run_checks(
    backends: Iterable[str],
    quick: bool,
    checks: list[Check] | None = None,
    progress: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Every (or each given) check on every backend (a check that raises is a FAIL row).

    ``progress`` is called with each row as soon as it is decided (long runs show life).
    """
    rows = []
    checks = all_checks() if checks is None else checks
    for backend in backends:
        for c in checks:
            start = time.perf_counter()
            result = skipped_under_quick(c) if quick and not c.quick else c.fn(backend, quick)
            rows.append(Row(backend, result, time.perf_counter() - start))
            if progress is not None:
                progress(rows[-1])
    return rows


def evidence(result: CheckResult) -> str:
    """The statistic behind a verdict: ``stats['summary']``, else the detail, else the stats."""
    text = str(result.stats.get("summary") or result.detail or _compact(result.stats))
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def _compact(stats: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in stats.items() if isinstance(v, (int, float, str)))


def failures(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.status == "FAIL"]


def render(rows: list[Row], console: Any = None) -> None:
    """Print the table with rich when it is installed, as plain text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render_text(rows))
        return
    colours = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
    table = Table(title="portable-verify conformance", show_lines=False)
    for col, style in (("backend", "cyan"), ("check", ""), ("", ""), ("s", ""), ("evidence", "")):
        table.add_column(col, style=style or None, overflow="fold")
    for r in rows:
        table.add_row(
            r.backend,
            r.result.name,
            f"[{colours[r.status]}]{r.status}[/]",
            f"{r.seconds:.1f}",
            evidence(r.result),
        )
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the evidence into 80
            console = Console(width=180)
    console.print(table)
    for lines in extra_tables(rows):
        console.print("\n".join(lines), markup=False, highlight=False)
    print(summary_line(rows))


def render_text(rows: list[Row]) -> str:
    """The same table as plain text (no rich)."""
    lines = [f"{'backend':18} {'check':44} {'':4} {'s':>6}  evidence"]
    for r in rows:
        lines.append(
            f"{r.backend:18} {r.result.name:44} {r.status:4} {r.seconds:6.1f}  {evidence(r.result)}"
        )
    for extra in extra_tables(rows):
        lines.extend(["", *extra])
    lines.append(summary_line(rows))
    return "\n".join(lines)


def extra_tables(rows: list[Row]) -> list[list[str]]:
    """Tables a check returns in ``stats['table']`` (a title, then text lines; e.g. the
    traversal gain), printed after the verdicts: figures too wide for an evidence cell."""
    return [[f"{r.result.stats['table'][0]} ({r.backend})", *r.result.stats["table"][1:]]
            for r in rows if isinstance(r.result.stats.get("table"), list)]


def summary_line(rows: list[Row]) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    return f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"
