"""No layer re-spells the method table: read from the source with :mod:`ast`.

Two rules (docs/architecture.md, "The method table"):

(a) **No comparison of a method name** in ``backends/``, ``api/``, ``integrations/``,
    ``bench/`` and ``testing/``: an ``==``, ``!=``, ``in`` or ``not in`` with a method's name as
    a string literal, a tuple, list or set of them, or a module constant holding one. A
    switch on names belongs to the method table (``core/methods.py``), a family's rule table
    (a dict: a miss is ``methods.unknown_rule``) or the numpy reference's switch (which ends in
    ``unknown_rule``). Why: a comparison is where a new method silently takes another's rule.
    A comparison of a word that is not a method (``children == "auto"``) says so on its line:
    ``# not a method: <what it is>``.
(b) **No hand-written method list** anywhere in the package: a tuple, list or set literal of
    two or more method names, unless a line of it says ``# narrower: <why>``. Why: a list
    written by hand leaves a new method out of coverage without a word; one read from the
    table (``methods.names``, ``methods.distinct``) cannot.

Each rule has a negative control: a small synthetic source it must flag, and a compliant twin.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from portable_verify.core import methods

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "portable_verify"
NAMES = frozenset(methods.names())

COMPARISON_AREAS = ("backends", "api", "integrations", "bench", "testing")
SWITCHES = frozenset({"core/methods.py", "backends/numpy/chain.py", "backends/numpy/tree.py"})
"""Where a switch on names is the point: the table and the numpy reference (the executable
spec), whose switches end in ``methods.unknown_rule``."""
TEMPORARY: tuple[str, ...] = ()
"""Awaiting the Triton family's one ``RULE`` table (branch ``lean``): the lead removes this line
after merging it."""
PENDING: dict[str, list[int]] = {}
"""Lines allowed while their owner moves them onto the table (none today)."""
NOT_A_METHOD = "# not a method:"
NARROWER = "# narrower:"


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to a method name's string (``REJECTION = "rejection"``)."""
    found = {}
    for node in tree.body:
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
                and node.value.value in NAMES):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update({t.id: node.value.value for t in targets if isinstance(t, ast.Name)})
    return found


def _names_in(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """The method names ``node`` spells: a literal, a constant, or a literal collection."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return [constants[name]] if name in constants else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _names_in(e, constants)]
    return []


def _marked(lines: list[str], node: ast.AST, mark: str) -> bool:
    return any(mark in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1))


def method_comparisons(source: str) -> list[int]:
    """Lines comparing a method name (rule a), unmarked."""
    tree, lines = ast.parse(source), source.splitlines()
    constants = _constants(tree)
    return sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
                   and any(_names_in(x, constants) for x in (node.left, *node.comparators))
                   and not _marked(lines, node, NOT_A_METHOD)})


def method_lists(source: str) -> list[int]:
    """Lines opening a literal of two or more method names (rule b) without a reason (on a line
    of it, or of a literal holding it)."""
    tree, lines = ast.parse(source), source.splitlines()
    literals = [n for n in ast.walk(tree) if isinstance(n, (ast.Tuple, ast.List, ast.Set))]
    said = {i for n in literals if _marked(lines, n, NARROWER) or _marked(lines, n, NOT_A_METHOD)
            for i in range(n.lineno, n.end_lineno + 1)}
    return sorted({n.lineno for n in literals
                   if sum(isinstance(e, ast.Constant) and e.value in NAMES for e in n.elts) >= 2
                   and n.lineno not in said})


def _sources(areas: tuple[str, ...] | None) -> dict[str, str]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in SWITCHES or rel.startswith(TEMPORARY):
            continue
        if areas is None or rel.split("/", 1)[0] in areas:
            out[rel] = path.read_text(encoding="utf-8")
    return out


def test_no_layer_compares_a_method_name() -> None:
    found = {rel: lines for rel, src in _sources(COMPARISON_AREAS).items()
             if (lines := method_comparisons(src)) and lines != PENDING.get(rel)}
    assert not found, f"method names compared (read the table instead): {found}"


def test_no_method_list_is_written_by_hand() -> None:
    found = {rel: lines for rel, src in _sources(None).items() if (lines := method_lists(src))}
    assert not found, f"method lists written by hand (read the table, or say why): {found}"


CASES_FILE = Path(__file__).parent / "data" / "method_name_cases.txt"


def _cases() -> list[tuple[str, str, list[int]]]:
    """(rule, source, flagged lines) from CASES_FILE: each case is a header line
    ``== <rule> <flagged line numbers or ->`` followed by its source."""
    cases: list[tuple[str, str, list[int]]] = []
    for chunk in CASES_FILE.read_text(encoding="utf-8").split("\n== ")[1:]:
        header, _, source = chunk.partition("\n")
        rule, *lines = header.split()
        cases.append((rule, source.rstrip("\n") + "\n", [int(n) for n in lines if n != "-"]))
    return cases


CASES = _cases()


@pytest.mark.parametrize(("rule", "source", "expected"), CASES)
def test_each_rule_flags_what_it_should(rule: str, source: str, expected: list[int]) -> None:
    """Negative controls (flagged sources) and their compliant twins, for both rules."""
    check = method_comparisons if rule == "comparison" else method_lists
    assert check(source) == expected


def test_the_case_file_holds_controls_and_twins_for_both_rules() -> None:
    """A parse that lost cases would let the test above pass on nothing."""
    kinds = {(rule, bool(flagged)) for rule, _, flagged in CASES}
    assert kinds == {(r, f) for r in ("comparison", "list") for f in (True, False)}
    assert len(CASES) == CASES_FILE.read_text(encoding="utf-8").count("\n== ")
