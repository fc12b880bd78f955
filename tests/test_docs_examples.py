"""Every ```python block of docs/integrations.md runs as written (each in a fresh namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[int, str]]:
    """``(first code line, code)`` of each python block."""
    text = DOC.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_the_page_has_examples() -> None:
    assert len(_blocks()) >= 4


@pytest.mark.parametrize(
    "code", [pytest.param(code, id=f"line{line}") for line, code in _blocks()]
)
def test_example_runs(code: str) -> None:
    line = next(first for first, c in _blocks() if c == code)
    # Leading newlines make tracebacks point at the page's own line numbers.
    exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), {"__name__": "docs_example"})
