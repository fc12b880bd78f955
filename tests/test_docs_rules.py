"""The docs' own rules: reference pages carry no dates and no timing figures, docs/ fits its budget.

Dated runs of record live in docs/benchmarks.md and docs/log.md; the reference pages (README.md,
docs/architecture.md, semantics.md, backends.md, testing.md, integrations.md) point there, so a
figure has one home and the pages stay true when the machine changes. Each pattern is tested on
positive and negative examples first: a pattern that matched nothing, or everything, would pass
or fail the pages for the wrong reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE_PAGES = (ROOT / "README.md", DOCS / "architecture.md", DOCS / "semantics.md",
                   DOCS / "backends.md", DOCS / "testing.md", DOCS / "integrations.md")
MAX_DOCS_LINES = 5000
MAX_LINE = 100

# A number not glued to a word before it ("x86", "int64s", "sm_90" are not numbers here).
_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
# Followed by a time unit ("35 s", "4.7 ms", "80 us", "5 ns"; not "s.e.", not "steps"), a ratio
# glued to the number ("1.3x", "3x."; not "2x2" nor "0x1f"), or a percentage ("12%", "12 %").
TIMING = re.compile(
    _NUMBER + r"(?:\s?(?:[uµμn]s|ms|s|sec|seconds?|milliseconds?|microseconds?)\b(?!\.\w)"
    r"|\s?\u00d7(?!\s*\d)|x(?!\w)(?!\.\d)|\s?%)")
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
# 2026-12-01 (or 2026/12/01), "Dec 1", "December 1st", "1 December", "December 2026".
DATE = re.compile(r"\b\d{4}[-/]\d{2}[-/]\d{2}\b"
                  rf"|\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b"
                  rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\b"
                  rf"|\b{_MONTH}\.?\s+\d{{4}}\b")

TIMINGS = ["35 s", "took 4.7 ms", "80 us", "3 µs", "~5 ns", "1.3x faster", "0.09-0.18x vLLM",
           "is 3x.", "(1.27x)", "12%", "12 % of", "1,992 us", "28 s, then", "1.5\u00d7 the floor",
           "30-120 s", "2 seconds", "(35 s)"]
NOT_TIMINGS = ["2x2 trees", "a 4x4 grid", "x86 CPUs", "100 columns", "4 heads", "torch 2.13",
               "vLLM 0.32's seam", "int64s", "sm_90 s", "25-40 s.e. off", "4 steps", "0x1f",
               "B x K rows", "4 methods x 4 input forms", "2 x 3", "V = 128256", "1e-4",
               "Python 3.12", "16 lanes", "64 KiB", "arXiv 2403.10444", "10**7 positions",
               "3 msgs", "`x floor`", "a 2-core machine", "K+1 positions"]
DATES = ["2026-12-01", "on 2026/12/01", "Dec 1", "December 1st", "1 December", "Dec. 4",
         "December 2026", "run of 4 Dec"]
NOT_DATES = ["Sun et al. 2025", "arXiv 2505.12398", "May be", "10-12-2026x", "March forward",
             "a decade", "Decide 4", "commit 6577791", "int4 draft"]

@pytest.mark.parametrize(("pattern", "text", "hit"), [
    *((TIMING, t, True) for t in TIMINGS), *((TIMING, t, False) for t in NOT_TIMINGS),
    *((DATE, t, True) for t in DATES), *((DATE, t, False) for t in NOT_DATES)])
def test_the_patterns_see_what_they_should_and_nothing_else(pattern: re.Pattern[str], text: str,
                                                            hit: bool) -> None:
    """Each pattern against its positive examples and its negative controls."""
    assert bool(pattern.search(text)) is hit, (text, pattern.search(text))


def _offending(page: Path) -> list[str]:
    return [f"{page.name}:{i}: {line.strip()}"
            for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if TIMING.search(line) or DATE.search(line)]


@pytest.mark.parametrize("page", REFERENCE_PAGES, ids=lambda p: p.name)
def test_reference_pages_carry_no_dates_and_no_timings(page: Path) -> None:
    assert _offending(page) == []


def test_the_page_check_sees_a_figure(tmp_path: Path) -> None:
    """Negative control: a page given one dated timing line is reported, on that line."""
    page = tmp_path / "backends.md"
    page.write_text("# Backends\n\nA call takes 4.7 ms (2026-12-01).\n", encoding="utf-8")
    assert _offending(page) == ["backends.md:3: A call takes 4.7 ms (2026-12-01)."]


def _docs_pages() -> list[Path]:
    """The pages of docs/ (docs/img holds the bench's generated tables, not pages)."""
    return sorted(DOCS.glob("*.md"))


def _long_lines(page: Path) -> list[str]:
    return [f"{page.name}:{i}: {len(line)} characters"
            for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_LINE]


def test_docs_fit_their_line_budget() -> None:
    pages = _docs_pages()
    assert len(pages) >= 9, [p.name for p in pages]
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in pages)
    assert total <= MAX_DOCS_LINES, total


@pytest.mark.parametrize("page", [*_docs_pages(), ROOT / "README.md"], ids=lambda p: p.name)
def test_doc_lines_are_at_most_100_characters(page: Path) -> None:
    assert _long_lines(page) == []


def test_the_width_check_sees_a_long_line(tmp_path: Path) -> None:
    """Negative control: a line of 101 characters is reported, in any section; 100 is not."""
    page = tmp_path / "architecture.md"
    page.write_text(f"# A\n{'x' * 100}\n{'y' * 101}\n## Where each change goes\n{'z' * 300}\n",
                    encoding="utf-8")
    assert _long_lines(page) == ["architecture.md:3: 101 characters",
                                 "architecture.md:5: 300 characters"]
