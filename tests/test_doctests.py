"""The package's ``>>>`` examples run in the suite.

pytest's ``--doctest-modules`` only reaches the paths it collects, and ``testpaths`` is
``tests/``: without this module the examples in the doors' docstrings would never run. Every
module under ``portable_verify/`` whose source holds a ``>>>`` is found by reading the files, so a
new example is tested without editing this list. A negative control shows a wrong expected
output is reported as a failure.
"""

from __future__ import annotations

import doctest
import importlib
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import portable_verify

_ROOT = Path(portable_verify.__file__).parent

# Examples whose expected output is wrong today: torch pads a tensor's entries to one width
# (``tensor([[ 1,  0, -1]])``), the docstrings omit the padding. Strict, so the fix (dropping the
# entry) is forced as soon as the example is corrected.
def _modules_with_examples() -> list[str]:
    """Dotted names of the package's modules whose source holds a doctest prompt."""
    names = []
    for path in sorted(_ROOT.rglob("*.py")):
        if ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(_ROOT.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _run_examples(module: ModuleType) -> doctest.TestResults:
    """``doctest.testmod`` with no option flags: an example's output must match exactly."""
    return doctest.testmod(module, verbose=False, report=False)


def test_the_doors_are_covered() -> None:
    """The public doors' examples are among those found (the search itself is not empty)."""
    found = set(_modules_with_examples())
    doors = {"portable_verify", "portable_verify.api.padded", "portable_verify.api.ragged",
             "portable_verify.api.rows", "portable_verify.api.tree"}
    assert doors <= found, sorted(doors - found)


@pytest.mark.parametrize("name", _modules_with_examples())
def test_examples_pass(name: str) -> None:
    module = importlib.import_module(name)
    outcome = _run_examples(module)
    assert outcome.attempted > 0, f"{name} has '>>>' in its source but no docstring example"
    assert outcome.failed == 0, f"{outcome.failed} of {outcome.attempted} examples fail in {name}"


def test_a_wrong_expected_output_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a module whose example expects the wrong output is reported failing,
    and the same module with the right output passes (so the failure is the output's)."""
    body = '''
        def double(x: int) -> int:
            """Twice ``x``.

            >>> double(2)
            {out}
            """
            return 2 * x
        '''
    monkeypatch.syspath_prepend(str(tmp_path))
    outcomes = {}
    for label, out in (("wrong", "5"), ("right", "4")):
        name = f"_doctest_control_{label}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body).format(out=out))
        module = importlib.import_module(name)
        outcomes[label] = _run_examples(module)
        monkeypatch.delitem(sys.modules, name)
    assert outcomes["wrong"] == doctest.TestResults(failed=1, attempted=1)
    assert outcomes["right"] == doctest.TestResults(failed=0, attempted=1)
