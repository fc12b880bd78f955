"""Every ```python block of README.md and docs/integrations.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "integrations.md")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks(doc: Path) -> list[tuple[int, str]]:
    """``(first code line, code)`` of each python block."""
    text = doc.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_the_pages_have_examples() -> None:
    assert len(_blocks(DOCS[0])) >= 1
    assert len(_blocks(DOCS[1])) >= 4


@pytest.mark.parametrize(
    "doc,line,code",
    [pytest.param(doc, line, code, id=f"{doc.name}:{line}") for doc in DOCS
     for line, code in _blocks(doc)],
)
def test_example_runs(doc: Path, line: int, code: str) -> None:
    # Leading newlines make tracebacks point at the page's own line numbers.
    exec(compile("\n" * (line - 1) + code, str(doc), "exec"), {"__name__": "docs_example"})
