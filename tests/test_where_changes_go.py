"""docs/architecture.md's "Where each change goes" lists are the dry run's edits.

``scripts/dry_run_change.py`` writes a new chain method, tree rule and scalar option into every
family; its files are the lists in the doc. This test holds the doc's lists (names and counts)
to the script's edits, and every edit's anchor to the code, so that a table that moves (or a
family that grows a second place to change) fails here, not in a later dry run. The dry run
itself (a git worktree) is the script's, not the suite's.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("dry_run_change",
                                                  ROOT / "scripts" / "dry_run_change.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  (dataclasses look it up)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


SCRIPT = _script()
LISTED = {"chain method": "a new chain method", "tree rule": "a new tree rule",
          "scalar option": "a new scalar option"}


def documented(text: str) -> dict[str, tuple[int, list[str]]]:
    """The doc's lists: change -> (the count it states, the files it names)."""
    section = text.split("## Where each change goes", 1)[1].split("\n## ", 1)[0]
    found = {}
    for change, label in LISTED.items():
        match = re.search(rf"^\* {label}, (\d+) files: (.*?)(?=^\* |^$)", section,
                          re.MULTILINE | re.DOTALL)
        assert match, f"docs/architecture.md lists no files for {label!r}"
        names = re.findall(r"`([\w/<>.]+\.(?:py|md))`", match.group(2))
        found[change] = (int(match.group(1)), names)
    return found


def _as_repo_path(name: str) -> str:
    name = name.replace("<rule>", "placeholder")
    return name if name.startswith(("docs/", "tests/", "scripts/")) else f"portable_verify/{name}"


def _check(text: str) -> None:
    for change, (count, names) in documented(text).items():
        assert sorted(_as_repo_path(n) for n in names) == SCRIPT.files(change), change
        assert count == len(SCRIPT.files(change)), change


def test_the_documented_lists_are_the_dry_runs_files() -> None:
    _check(DOC.read_text(encoding="utf-8"))


def test_the_list_check_sees_a_missing_file() -> None:
    """Negative control: a list that drops a file (or miscounts) no longer matches."""
    text = DOC.read_text(encoding="utf-8")
    with pytest.raises(AssertionError):
        _check(text.replace("`backends/numba/entries.py` (its branch),", "", 1))
    with pytest.raises(AssertionError):
        _check(text.replace("a new scalar option, 6 files", "a new scalar option, 5 files", 1))


@pytest.mark.parametrize("change", sorted(SCRIPT.CHANGES))
def test_every_edit_of_the_dry_run_finds_its_place(change: str) -> None:
    """Each anchor is in its file today (a new file's folder exists): the script still
    describes the code, so its counts do."""
    for edit in SCRIPT.CHANGES[change]:
        path = ROOT / edit.path
        if edit.anchor is None:
            assert path.parent.is_dir() and not path.exists(), edit.path
        else:
            assert edit.anchor in path.read_text(encoding="utf-8"), (edit.path, edit.anchor)


def test_the_dry_run_stops_at_a_missing_anchor(tmp_path: Path) -> None:
    """Negative control: an edit whose anchor moved is an error naming it, never a silent
    smaller count."""
    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="anchor not found"):
        SCRIPT.apply(tmp_path, [SCRIPT.Edit("f.py", "y = 2", "y = 3")])
