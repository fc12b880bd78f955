"""Exact tree conformance: ``verify_tree`` against the reference, against ``verify`` on chains,
and greedy against a brute-force walk.

A backend without tree support (``"tree"`` not in ``traits.layouts``) skips these checks.
A disagreement with the reference is excused only on a row whose reference answer itself
changes when every uniform moves by a relative ``1e-4``: a decision within rounding of its
boundary, where the two computations may round differently. Such rows are counted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core import methods
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.random_cases import on_device
from portable_verify.testing.cases.tree_cases import MODES, chain_parents, random_tree_call
from portable_verify.testing.checks.bad_input_errors import methods_of
from portable_verify.testing.checks.reference_comparison import REFERENCE, host
from portable_verify.testing.kit import CheckFn, CheckResult, check, summarize

CASE_SEED = 20261201
QUICK_CASES, FULL_CASES = 40, 240
SLOW_CHAIN_CASES = 12
"""Chain cases for a backend without ``statistical_sizes`` (the Triton interpreter: each case is
ten interpreted launches, each slow: docs/benchmarks.md, "Figures behind code comments"):
60 chain calls in every method and mode."""
NEAR = 1e-4


def tree_check(name: str, **options: Any) -> Callable[[CheckFn], CheckFn]:
    """:func:`~portable_verify.testing.kit.check` for a tree check: a backend that does not
    verify trees (``"tree"`` not in ``traits.layouts``) gets a skipped verdict instead of a run."""

    def register(fn: CheckFn) -> CheckFn:
        @functools.wraps(fn)
        def on_tree_backends(backend: str, quick: bool) -> CheckResult:
            if "tree" not in pv.get_backend(backend).traits.layouts:
                return CheckResult(name, True, "the backend does not verify trees", skipped=True)
            return fn(backend, quick)

        return check(name, **options)(on_tree_backends)

    return register


def _answer(res: pv.TreeResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return host(res.token_ids), host(res.node_ids), host(res.num_accepted)


def _serves(method: str, mode: str) -> bool:
    """Whether ``method`` takes trees of children ``mode``: sampled children need a rule that
    reads their draft probabilities (typical takes deterministic children only)."""
    rule = methods.TABLE[method].rule
    return mode == "deterministic" or rule is None or methods.reads_draft_probs(rule)


def _near_boundary(call: dict[str, Any], method: str, row: int) -> bool:
    """Does the reference's answer for ``row`` move when the uniforms move by ``NEAR``?"""
    base = _answer(pv.verify_tree(**call, method=method, backend=REFERENCE))
    for factor in (1 - NEAR, 1 + NEAR):
        u = (call["uniforms"] * factor).clamp(2.0**-24, 1.0)
        moved = _answer(pv.verify_tree(**{**call, "uniforms": u}, method=method,
                                       backend=REFERENCE))
        if any(not np.array_equal(x[row], y[row]) for x, y in zip(base, moved, strict=True)):
            return True
    return False


@tree_check("tree.exact")
def tree_exact(backend: str, quick: bool) -> CheckResult:
    """verify_tree equals the reference in every children mode and method (random trees)."""
    name = "tree.exact"
    rng = np.random.default_rng(CASE_SEED)
    failures: list[str] = []
    rows = excused = 0
    device = torch_device(backend)
    for case in range(QUICK_CASES if quick else FULL_CASES):
        mode = MODES[case % 3]
        call = random_tree_call(rng, mode, device=device)
        host_call = None  # the reference's copy, made once the backend has run
        for method in methods_of(backend, "tree"):
            if not _serves(method, mode):
                continue
            got = _answer(pv.verify_tree(**call, method=method, backend=backend))
            host_call = host_call or on_device(call, "cpu")
            want = _answer(pv.verify_tree(**host_call, method=method, backend=REFERENCE))
            if got[0].shape != want[0].shape:
                failures.append(f"case {case}/{method}: shape {got[0].shape} != {want[0].shape}")
                continue
            for row in range(want[0].shape[0]):
                rows += 1
                if all(np.array_equal(g[row], w[row]) for g, w in zip(got, want, strict=True)):
                    continue
                if not methods.greedy_only(method) and _near_boundary(host_call, method, row):
                    excused += 1
                    continue
                failures.append(f"case {case}/{mode}/{method} row {row}: {got[0][row].tolist()}"
                                f" != reference {want[0][row].tolist()}")
    if excused > max(2, rows // 100):
        failures.append(f"{excused} of {rows} rows excused as near-boundary: too many")
    detail = (f"{rows} rows identical to the reference ({excused} near-boundary excused)"
              if not failures else summarize(failures))
    return CheckResult(name, not failures, detail, {"rows": rows, "excused": excused})


@tree_check("tree.chain_equals_verify")
def chain_equals_verify(backend: str, quick: bool) -> CheckResult:
    """On chains, verify_tree gives verify's tokens on the same backend, in every method and
    children mode, with seeds (not only explicit uniforms)."""
    name = "tree.chain_equals_verify"
    rng = np.random.default_rng(CASE_SEED + 1)
    failures: list[str] = []
    calls = 0
    cases = QUICK_CASES if quick else FULL_CASES // 2
    if not pv.get_backend(backend).traits.statistical_sizes:
        cases = min(cases, SLOW_CHAIN_CASES)
    device = torch_device(backend)
    for case in range(cases):
        b, k, v = int(rng.integers(1, 6)), int(rng.integers(0, 6)), int(rng.integers(1, 9))
        logits = torch.tensor(rng.normal(size=(b, k + 1, v)) * 3, dtype=torch.float32)
        q = torch.softmax(torch.tensor(rng.normal(size=(b, k + 1, v)), dtype=torch.float32), -1)
        drafts = torch.from_numpy(rng.integers(0, v, size=(b, k)))
        nodes = torch.cat([torch.zeros(b, 1, dtype=torch.int64), drafts], 1)
        parents = torch.from_numpy(chain_parents(b, k + 1))
        temps = torch.tensor(rng.choice([0.0, 0.6, 1.0], size=b), dtype=torch.float32)
        logits, q, drafts, nodes, parents, temps = (
            x.to(device) for x in (logits, q, drafts, nodes, parents, temps))
        probs = case % 2 == 1
        target = {"target_probs": torch.softmax(logits, -1)} if probs else {
            "target_logits": logits, "temperature": temps}
        for method, mode in (("greedy", "deterministic"), ("rejection", "deterministic"),
                             ("rejection", "iid"), ("rejection", "without_replacement"),
                             ("typical", "deterministic")):
            use_q = mode != "deterministic"
            common = {**target, "method": method, "seed": case, "seed_offset": 3,
                      "backend": backend}
            chain = pv.verify(drafts, draft_probs=q[:, :k] if use_q else None, **common)
            tree = pv.verify_tree(nodes, parents, draft_probs=q if use_q else None,
                                  children=mode, **common)
            calls += 1
            if not (torch.equal(chain.token_ids, tree.token_ids)
                    and torch.equal(chain.num_accepted, tree.num_accepted)):
                failures.append(f"case {case} {method}/{mode}: verify {chain.token_ids.tolist()}"
                                f" != verify_tree {tree.token_ids.tolist()}")
            want_nodes = torch.where(torch.arange(k + 1, device=device)
                                     < chain.num_accepted[:, None],
                                     torch.arange(1, k + 2, device=device), -1)
            if not torch.equal(tree.node_ids, want_nodes):
                failures.append(f"case {case} {method}/{mode}: node_ids {tree.node_ids.tolist()}")
    detail = f"{calls} chain calls equal verify" if not failures else summarize(failures)
    return CheckResult(name, not failures, detail, {"calls": calls})


def brute_force_greedy(tokens: np.ndarray, parents: np.ndarray, n: int, argmax: np.ndarray,
                       max_depth: int) -> tuple[list[int], int]:
    """The greedy answer found without walking: a node is on the greedy path when its parent
    is and it is the lowest-index child whose token is the parent row's argmax; the answer is
    the deepest such node's path and its row's argmax."""
    on_path = {0: []}
    for i in range(1, n):  # parents precede children: one pass in index order suffices
        parent = int(parents[i])
        if parent not in on_path or len(on_path[parent]) >= max_depth:
            continue
        if int(tokens[i]) != int(argmax[parent]):
            continue
        earlier = [j for j in range(1, i) if int(parents[j]) == parent
                   and int(tokens[j]) == int(argmax[parent])]
        if not earlier:
            on_path[i] = [*on_path[parent], i]
    deepest = max(on_path, key=lambda c: len(on_path[c]))
    return on_path[deepest], int(argmax[deepest])


@tree_check("tree.greedy_brute_force")
def greedy_brute_force(backend: str, quick: bool) -> CheckResult:
    """Greedy trees equal a brute-force search for the greedy path (random trees)."""
    name = "tree.greedy_brute_force"
    rng = np.random.default_rng(CASE_SEED + 2)
    failures: list[str] = []
    rows = 0
    for case in range(QUICK_CASES if quick else FULL_CASES):
        call = random_tree_call(rng, "deterministic", device=torch_device(backend))
        call.pop("uniforms")
        res = pv.verify_tree(**call, method="greedy", backend=backend)
        target = host(call.get("target_logits", call.get("target_probs")))
        tokens, parents = host(call["node_token_ids"]), host(call["parents"])
        b, n = tokens.shape
        counts = host(call["num_nodes"]) if "num_nodes" in call else np.full(b, n)
        depth_cap = call.get("max_depth", n - 1)
        for row in range(b):
            rows += 1
            path, final = brute_force_greedy(tokens[row], parents[row], int(counts[row]),
                                             target[row].argmax(-1), depth_cap)
            want = [*[int(tokens[row, i]) for i in path], final]
            got = host(res.token_ids)[row].tolist()
            if got[:len(want)] != want or any(t != -1 for t in got[len(want):]):
                failures.append(f"case {case} row {row}: {got} != brute force {want}")
    detail = f"{rows} greedy rows equal the brute force" if not failures else summarize(failures)
    return CheckResult(name, not failures, detail, {"rows": rows})
