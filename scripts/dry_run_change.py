"""Dry-run a change to every family on a scratch worktree and count the files it touches.

Why: docs/architecture.md's "Where each change goes" table says how many files a new chain
method, tree rule or scalar option touches. Counted by hand, such numbers drift; here each
change is written out as edits (a rejection clone: each family wires the placeholder to its
rejection code, where a real rule would go), applied to a scratch ``git worktree`` of HEAD, and
the diff's files (tests/ and docs/ included) are the count. The real checkout is never
touched: the worktree lives in a temporary folder and is removed afterwards.
``tests/test_where_changes_go.py`` holds the table's rows to :data:`CHANGES` and checks every
anchor below still exists, so a moved table fails the suite, not a later dry run.

    python scripts/dry_run_change.py                  # all three changes, counts and files
    python scripts/dry_run_change.py --check          # also run the method tests on each copy

Triton: a clone takes rejection's code in ``spec.py``'s tables (the kernels' ``RULE``), whose
keys are the backend's declared rules; a real rule adds its branch in the kernel too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PV = "portable_verify"


@dataclass(frozen=True)
class Edit:
    """``anchor`` in ``path`` becomes ``text`` (``anchor`` None: ``text`` is a new file)."""

    path: str
    anchor: str | None
    text: str


_CHECK = '''"""A dry run's conformance check (scripts/dry_run_change.py)."""

from portable_verify.testing.cases.random_cases import CaseSpec, build_case
from portable_verify.testing.checks.reference_comparison import Tally, compare
from portable_verify.testing.kit import CheckResult, check


@check("placeholder.exact")
def placeholder_exact(backend: str, quick: bool) -> CheckResult:
    tally = Tally()
    for i in range(4 if quick else 40):
        kwargs = build_case(CaseSpec(batch=3, positions=3, vocab=8, seed=i))
        compare(tally, backend, f"case {i}", kwargs, "placeholder")
    return tally.result("placeholder.exact")
'''

_TREE_CHECK = '''"""A dry run's conformance check (scripts/dry_run_change.py)."""

import numpy as np

import portable_verify as pv
from portable_verify.testing.cases.tree_cases import random_tree_call
from portable_verify.testing.checks.reference_comparison import REFERENCE
from portable_verify.testing.kit import CheckResult, check


@check("placeholder.tree")
def placeholder_tree(backend: str, quick: bool) -> CheckResult:
    rng = np.random.default_rng(0)
    for _ in range(4 if quick else 40):
        call = random_tree_call(rng, "deterministic")
        got = pv.verify_tree(**call, method="placeholder", backend=backend)
        want = pv.verify_tree(**call, method="placeholder", backend=REFERENCE)
        if not np.array_equal(np.asarray(got.token_ids), np.asarray(want.token_ids)):
            return CheckResult("placeholder.tree", False, "differs from the reference")
    return CheckResult("placeholder.tree", True, "equals the reference")
'''


def _row(layouts: str) -> list[Edit]:
    """The table's row and its line in docs/semantics.md: every change of a method."""
    return [
        Edit(f"{PV}/core/methods.py", '''            instead=((CHAIN, "block"),), rows="data"))
''', f'''            instead=((CHAIN, "block"),), rows="data"))
_add(Method("placeholder", "placeholder", True, ({layouts},), "uses", None,
            "a dry run's rejection clone"))
'''),
        Edit("docs/semantics.md", "| `traversal` | yes | tree | used | traversal |\n",
             "| `traversal` | yes | tree | used | traversal |\n"
             f"| `placeholder` | yes | {layouts.lower()} | used | placeholder |\n"),
    ]


_NUMBA_CODE = Edit(f"{PV}/backends/numba/rules.py", "TRAVERSAL = 4\n",
                   "TRAVERSAL = 4\nPLACEHOLDER = 5\n")
_NUMBA_IMPORT = Edit(f"{PV}/backends/numba/entries.py", "    GREEDY,\n",
                     "    GREEDY,\n    PLACEHOLDER,\n")

CHANGES: dict[str, list[Edit]] = {
    "chain method": [
        *_row("CHAIN"),
        Edit(f"{PV}/backends/numpy/chain.py", 'if method not in ("rejection", "typical"):',
             'if method not in ("rejection", "typical", "placeholder"):'),
        Edit(f"{PV}/backends/numpy/chain.py", 'CHAIN_RULES = ("rejection", "typical", "block")',
             'CHAIN_RULES = ("rejection", "typical", "block", "placeholder")'),
        Edit(f"{PV}/backends/torch/chain.py", '    "block": _block}',
             '    "block": _block, "placeholder": _sampled}'),
        _NUMBA_CODE,
        Edit(f"{PV}/backends/numba/rules.py", '"block": BLOCK}',
             '"block": BLOCK, "placeholder": PLACEHOLDER}'),
        _NUMBA_IMPORT,
        Edit(f"{PV}/backends/numba/entries.py",
             "if not (o.rule == REJECTION or o.rule == TYPICAL or o.rule == GREEDY):",
             "if not (o.rule == REJECTION or o.rule == TYPICAL or o.rule == GREEDY\n"
             "            or o.rule == PLACEHOLDER):"),
        Edit(f"{PV}/backends/triton/spec.py", '"block": 2}',
             '"block": 2, "placeholder": 0}'),
        Edit(f"{PV}/backends/openvino/backend.py", '"block": _block}',
             '"block": _block, "placeholder": _token_wise}'),
        Edit(f"{PV}/backends/openvino/chain_graphs.py", '    "typical": _typical,\n}',
             '    "typical": _typical,\n    "placeholder": _rejection,\n}'),
        Edit(f"{PV}/testing/checks/near_boundary.py", '    "typical": _token_row_near_boundary,\n',
             '    "typical": _token_row_near_boundary,\n'
             '    "placeholder": lambda *row: _token_row_near_boundary(*row[:-1], None),\n'),
        Edit(f"{PV}/testing/checks/placeholder.py", None, _CHECK),
        Edit(f"{PV}/testing/kit.py", '    "portable_verify.testing.checks.traversal",\n',
             '    "portable_verify.testing.checks.traversal",\n'
             '    "portable_verify.testing.checks.placeholder",\n'),
    ],
    "tree rule": [
        *_row("TREE"),
        Edit(f"{PV}/backends/numpy/tree.py", 'if rule in ("rejection", "typical"):',
             'if rule in ("rejection", "typical", "placeholder"):'),
        Edit(f"{PV}/backends/numpy/tree.py",
             'TREE_RULES = ("rejection", "typical", "traversal")',
             'TREE_RULES = ("rejection", "typical", "traversal", "placeholder")'),
        Edit(f"{PV}/backends/torch/tree.py", '              "traversal": traversal_walk}',
             '              "traversal": traversal_walk, "placeholder": _rejection_walk}'),
        _NUMBA_CODE,
        Edit(f"{PV}/backends/numba/rules.py", '"traversal": TRAVERSAL}',
             '"traversal": TRAVERSAL, "placeholder": PLACEHOLDER}'),
        _NUMBA_IMPORT,
        Edit(f"{PV}/backends/numba/entries.py", "            or o.rule == GREEDY):",
             "            or o.rule == GREEDY or o.rule == PLACEHOLDER):"),
        Edit(f"{PV}/backends/triton/spec.py", '"traversal": 2}',
             '"traversal": 2, "placeholder": 0}'),
        Edit(f"{PV}/backends/openvino/backend.py",
             'TREE_RULES = ("rejection", "typical", "traversal")',
             'TREE_RULES = ("rejection", "typical", "traversal", "placeholder")'),
        Edit(f"{PV}/backends/openvino/tree.py", '"traversal": traversal_walk}',
             '"traversal": traversal_walk,\n    "placeholder": rejection_walk}'),
        Edit(f"{PV}/testing/checks/placeholder.py", None, _TREE_CHECK),
        Edit(f"{PV}/testing/kit.py", '    "portable_verify.testing.checks.traversal",\n',
             '    "portable_verify.testing.checks.traversal",\n'
             '    "portable_verify.testing.checks.placeholder",\n'),
    ],
    "scalar option": [  # typical.beta: the threshold times beta (1: today's rule)
        Edit(f"{PV}/core/types.py", "    alpha: float = 0.3\n",
             "    alpha: float = 0.3\n    beta: float = 1.0\n"),
        Edit(f"{PV}/core/types.py", '("alpha", "typical_alpha")):',
             '("alpha", "typical_alpha"),\n'
             '                                    ("beta", "typical_beta")):'),
        Edit(f"{PV}/core/types.py",
             "return np.minimum(scaled, self.eps) if xp is np else scaled.clamp(max=self.eps)",
             "bar = np.minimum(scaled, self.eps) if xp is np else scaled.clamp(max=self.eps)\n"
             "        return bar * self.beta"),
        Edit(f"{PV}/core/types.py", "        return self.eps, self.alpha\n",
             "        return self.eps, self.alpha, self.beta\n"),
        Edit("docs/semantics.md", "and the options `typical_eps`",
             "and the options `typical_eps`, `typical.beta` (a factor on the threshold)"),
        Edit(f"{PV}/backends/numba/chain.py", '("alpha", np.float64),',
             '("alpha", np.float64), ("beta", np.float64),'),
        Edit(f"{PV}/backends/numba/chain.py", "return min(o.eps, o.alpha * math.exp(-h))",
             "return min(o.eps, o.alpha * math.exp(-h)) * o.beta"),
        *[Edit(f"{PV}/backends/triton/chain.py", old, new) for old, new in (
            ("def _typical_threshold(entropy, eps, alpha):",
             "def _typical_threshold(entropy, eps, alpha, beta=1.0):"),
            ("V, K, R, _RQ, _eps, _alpha = scalars", "V, K, R, _RQ, _eps, _alpha, _beta = scalars"),
            ("V, K, R, RQ, _eps, _alpha = scalars", "V, K, R, RQ, _eps, _alpha, _beta = scalars"),
            ("V, K, _R, RQ, _eps, _alpha = scalars", "V, K, _R, RQ, _eps, _alpha, _beta = scalars"),
            ("V, K, R, RQ, eps, alpha = scalars", "V, K, R, RQ, eps, alpha, beta = scalars"),
            ("_typical_threshold(h, eps, alpha)", "_typical_threshold(h, eps, alpha, beta)"),
            ("eps, alpha = call.options.typical.kernel_scalars()",
             "eps, alpha, beta = call.options.typical.kernel_scalars()"),
            ("rq, eps, alpha)\n", "rq, eps, alpha, beta)\n"))],
        *[Edit(f"{PV}/backends/triton/tree.py", old, new) for old, new in (
            ("V, _N, W, eps, alpha = scalars", "V, _N, W, eps, alpha, beta = scalars"),
            ("_typical_threshold(h, eps, alpha)", "_typical_threshold(h, eps, alpha, beta)"),
            ("eps, alpha = inputs.typical.kernel_scalars()",
             "eps, alpha, beta = inputs.typical.kernel_scalars()"),
            ("(v, n, width, eps, alpha))", "(v, n, width, eps, alpha, beta))"),
            ("_eps, _alpha = scalars", "_eps, _alpha, _beta = scalars"))],
        Edit(f"{PV}/backends/openvino/chain_graphs.py",
             "eps, alpha = (_scalar(scalars, record.TYPICAL + i) for i in range(2))\n"
             "    return ops.minimum(eps, ops.multiply(alpha, ops.exp(ops.negative(entropy))))",
             "eps, alpha, beta = (_scalar(scalars, record.TYPICAL + i) for i in range(3))\n"
             "    return ops.multiply(ops.minimum(eps, ops.multiply(\n"
             "        alpha, ops.exp(ops.negative(entropy)))), beta)"),
    ],
}
"""Each change as edits: its files are the rows of docs/architecture.md's table."""

CHECKS = (["tests/test_method_table.py", "tests/test_method_names.py", "-k",
           "not the_rule_flags"],
          ["tests/test_conformance.py", "-k", "placeholder"])
"""What ``--check`` runs on each scratch copy: the method table's refusals and docs row, and
the placeholder's own conformance check on every available backend (the clone runs in each
family and equals the reference)."""
NO_TESTS = 5
"""pytest's exit status when ``-k`` selects nothing (a scalar option has no check of its own)."""


def files(change: str) -> list[str]:
    """The files ``change`` touches, sorted."""
    return sorted({edit.path for edit in CHANGES[change]})


def apply(root: Path, edits: list[Edit]) -> None:
    """Write ``edits`` under ``root``; a missing anchor stops with the edit named (every
    occurrence of an anchor is replaced)."""
    for edit in edits:
        path = root / edit.path
        if edit.anchor is None:
            path.write_text(edit.text, encoding="utf-8")
            continue
        text = path.read_text(encoding="utf-8")
        if edit.anchor not in text:
            raise SystemExit(f"{edit.path}: anchor not found (update {Path(__file__).name}): "
                             f"{edit.anchor!r}")
        path.write_text(text.replace(edit.anchor, edit.text), encoding="utf-8")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def dry_run(change: str, check: bool) -> dict:
    """``change`` on a scratch worktree of HEAD: the files its diff touches (and, with
    ``check``, whether the method tests pass there); the worktree is removed after."""
    with tempfile.TemporaryDirectory(prefix="pv-dry-run-") as tmp:
        scratch = Path(tmp) / "tree"
        _git("worktree", "add", "--detach", "--quiet", str(scratch), "HEAD")
        try:
            apply(scratch, CHANGES[change])
            _git("add", "-A", cwd=scratch)
            touched = _git("diff", "--cached", "--name-only", cwd=scratch).split()
            result = {"change": change, "count": len(touched), "files": touched}
            if check:
                runs = [subprocess.run([sys.executable, "-m", "pytest", "-q", "-x",
                                        "-p", "no:cacheprovider", *tests], cwd=scratch,
                                       env={**os.environ, "PYTHONPATH": str(scratch)},
                                       capture_output=True, text=True) for tests in CHECKS]
                result["check"] = [(r.stdout.strip().splitlines() or [r.stderr[-500:]])[-1]
                                   for r in runs]
                result["check_ok"] = all(r.returncode in (0, NO_TESTS) for r in runs)
        finally:
            _git("worktree", "remove", "--force", str(scratch))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--change", choices=sorted(CHANGES), action="append",
                        help="one change (repeatable; default: all)")
    parser.add_argument("--check", action="store_true",
                        help="run the method-table tests on each scratch copy")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    results = [dry_run(change, args.check) for change in args.change or CHANGES]
    if args.json:
        print(json.dumps(results, indent=1))
    for r in [] if args.json else results:
        ok = "" if "check_ok" not in r else f"  check: {'ok' if r['check_ok'] else 'FAILED'}"
        ok += "".join(f"\n  ({line})" for line in r.get("check", []))
        print(f"{r['change']}: {r['count']} files{ok}")
        for name in r["files"]:
            print(f"  {name}")
    return 0 if all(r.get("check_ok", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
