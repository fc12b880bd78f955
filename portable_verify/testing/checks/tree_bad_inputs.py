"""Bad tree inputs: with ``validate=True`` each raises the documented error naming the argument;
with ``validate=False`` garbage trees never crash and every emitted id stays in ``[0, V)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.random_cases import on_device
from portable_verify.testing.cases.tree_cases import random_tree_call
from portable_verify.testing.checks.bad_input_errors import methods_of
from portable_verify.testing.checks.reference_comparison import host
from portable_verify.testing.checks.tree_exact import tree_check
from portable_verify.testing.kit import CheckResult, summarize

Edit = Callable[[dict[str, Any]], None]


def valid_tree_call(device: torch.device | str = "cpu") -> dict[str, Any]:
    """B = 2 trees of N = 4 nodes over V = 5, with draft probabilities (iid children)."""
    gen = torch.Generator().manual_seed(7)
    return on_device({
        "node_token_ids": torch.tensor([[0, 1, 2, 3], [0, 4, 4, 1]]),
        "parents": torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]),
        "target_logits": torch.randn(2, 4, 5, generator=gen),
        "draft_probs": torch.softmax(torch.randn(2, 4, 5, generator=gen), -1),
        "children": "iid",
        "seed": 3,
    }, device)


def _set(key: str, value: Any) -> Edit:
    return lambda call: call.__setitem__(key, value)


def _at(key: str, index: tuple[int, ...], value: float) -> Edit:
    def edit(call: dict[str, Any]) -> None:
        call[key] = call[key].clone()
        call[key][index] = value
    return edit


def _drop(key: str) -> Edit:
    return lambda call: call.pop(key)


def _all(*edits: Edit) -> Edit:
    def edit(call: dict[str, Any]) -> None:
        for one in edits:
            one(call)
    return edit


_TRAVERSAL = _set("method", "traversal")


TREE_BAD_CASES: list[tuple[str, Edit, str, type[Exception]]] = [
    ("a parent after its child", _at("parents", (0, 2), 3), "parents", ValueError),
    ("a parent equal to the node", _at("parents", (1, 3), 3), "parents", ValueError),
    ("a negative parent below node 0", _at("parents", (0, 1), -1), "parents", ValueError),
    ("a root with a parent", _at("parents", (0, 0), 0), "parents", ValueError),
    ("a token id >= V", _at("node_token_ids", (0, 1), 5), "node_token_ids", ValueError),
    ("a token id < -1", _at("node_token_ids", (1, 2), -2), "node_token_ids", ValueError),
    ("parents of another shape", _set("parents", torch.tensor([[-1, 0, 0]] * 2)), "parents",
     ValueError),
    ("float parents", _set("parents", torch.zeros(2, 4)), "parents", TypeError),
    ("a target of another N", _set("target_logits", torch.zeros(2, 3, 5)), "target_logits",
     ValueError),
    ("draft_probs of another V", _set("draft_probs", torch.full((2, 4, 4), 0.25)),
     "draft_probs", ValueError),
    ("iid children without draft_probs", _drop("draft_probs"), "draft_probs", ValueError),
    ("deterministic children with draft_probs", _set("children", "deterministic"),
     "draft_probs", ValueError),
    ("an unknown children mode", _set("children", "sampled"), "children", ValueError),
    ("method='block'", _set("method", "block"), "block", ValueError),
    # The root's row: every walk reads it (a backend with traits.checks_tree_reads checks only
    # the rows its walk reads; docs/semantics.md, Trees).
    ("NaN in the target's root row", _at("target_logits", (1, 0, 0), float("nan")),
     "target_logits", ValueError),
    ("a draft row that does not sum to 1", _at("draft_probs", (0, 0, 1), 3.0), "draft_probs",
     ValueError),
    ("a bad root draft row beside a -1 child", _all(_at("node_token_ids", (0, 2), -1),
     _at("draft_probs", (0, 0, 1), 3.0)), "draft_probs", ValueError),
    ("num_nodes of 0", _set("num_nodes", torch.tensor([0, 4])), "num_nodes", ValueError),
    ("num_nodes beyond N", _set("num_nodes", torch.tensor([4, 5])), "num_nodes", ValueError),
    ("a tree deeper than max_depth", _set("max_depth", 2), "max_depth", ValueError),
    ("a negative max_depth", _set("max_depth", -1), "max_depth", ValueError),
    ("uniforms of shape [B, N-1]", _set("uniforms", torch.full((2, 3), 0.5)), "uniforms",
     ValueError),
    ("a uniform of 0", _set("uniforms", torch.tensor([[0.5, 0.0, 0.5, 0.5]] * 2)), "uniforms",
     ValueError),
    ("rank-1 node_token_ids", _set("node_token_ids", torch.tensor([0, 1, 2, 3])),
     "node_token_ids", ValueError),
    # Traversal (run only where the backend implements it): its walk enters node 1 and reads
    # node 1's rows (it has a child) before any test, whatever the uniforms.
    ("traversal: NaN in an entered inner node's target row",
     _all(_TRAVERSAL, _at("target_logits", (0, 1, 2), float("nan"))), "target_logits",
     ValueError),
    ("traversal: an entered inner node's draft row not summing to 1",
     _all(_TRAVERSAL, _at("draft_probs", (0, 1, 0), 2.0)), "draft_probs", ValueError),
    ("traversal: deterministic children with draft_probs",
     _all(_TRAVERSAL, _set("children", "deterministic")), "draft_probs", ValueError),
    ("traversal: a uniform above 1",
     _all(_TRAVERSAL, _set("uniforms", torch.tensor([[0.5, 0.5, 1.5, 0.5]] * 2))), "uniforms",
     ValueError),
    ("traversal: a tree deeper than max_depth", _all(_TRAVERSAL, _set("max_depth", 1)),
     "max_depth", ValueError),
]
"""(what is wrong, how the valid call is changed, the name the message must hold, the error)."""


def expect_tree_error(call: dict[str, Any], backend: str, argument: str,
                      error: type[Exception]) -> str | None:
    try:
        pv.verify_tree(**call, backend=backend)
    except (ValueError, TypeError) as exc:
        if type(exc) is not error:
            return f"raised {type(exc).__name__} ({exc}), expected {error.__name__}"
        return None if argument in str(exc) else f"message does not name {argument!r}: {exc}"
    return "no error"


@tree_check("tree.bad_input_raises")
def tree_bad_input_raises(backend: str, quick: bool) -> CheckResult:
    """Every bad tree argument raises the documented error naming it (validate=True)."""
    name = "tree.bad_input_raises"
    device = torch_device(backend)
    pv.verify_tree(**valid_tree_call(device), backend=backend)  # the unedited call is accepted
    failures = []
    traversal = pv.get_backend(backend).traits.implements("tree", "traversal")
    cases = [c for c in TREE_BAD_CASES if traversal or not c[0].startswith("traversal")]
    for label, edit, argument, error in cases:
        call = valid_tree_call(device)
        edit(call)  # an edit's new tensors are made on the host: the call moves once
        if (problem := expect_tree_error(on_device(call, device), backend, argument,
                                         error)) is not None:
            failures.append(f"{label}: {problem}")
    detail = (f"{len(cases)} bad tree inputs rejected with the argument named"
              if not failures else summarize(failures))
    return CheckResult(name, not failures, detail, {"cases": len(cases)})


@tree_check("tree.unvalidated_garbage")
def tree_unvalidated_garbage(backend: str, quick: bool) -> CheckResult:
    """validate=False on garbage trees (bad parents, ids, counts, NaN rows) never crashes, and
    every emitted id lies in [0, V) with the documented shapes."""
    name = "tree.unvalidated_garbage"
    gen = np.random.default_rng(20261204)
    failures = []
    cases = 30 if quick else 120
    methods = methods_of(backend, "tree")
    for case in range(cases):
        call = random_tree_call(gen, ("deterministic", "iid", "without_replacement")[case % 3])
        b, n = call["node_token_ids"].shape  # garbage drawn on the host, then moved once
        call["parents"] = torch.from_numpy(gen.integers(-3, n + 2, size=(b, n)))
        call["node_token_ids"] = torch.from_numpy(gen.integers(-3, 9, size=(b, n)))
        call["num_nodes"] = torch.from_numpy(gen.integers(-1, n + 3, size=b))
        key = "target_logits" if "target_logits" in call else "target_probs"
        target = call[key].clone()
        target[gen.random(target.shape) < 0.1] = float("nan")
        call[key] = target
        call.pop("max_depth", None)
        call = on_device(call, torch_device(backend))
        v = target.shape[-1]
        for method in methods:
            try:
                res = pv.verify_tree(**call, method=method, validate=False, backend=backend)
            except Exception as exc:  # any exception is the failure reported
                failures.append(f"case {case}/{method}: raised {type(exc).__name__}: {exc}")
                continue
            tokens = host(res.token_ids)
            a = host(res.num_accepted)
            emitted = np.arange(tokens.shape[1])[None, :] <= a[:, None]
            if tokens.shape != (b, n) or ((tokens < 0) | (tokens >= v))[emitted].any():
                failures.append(f"case {case}/{method}: tokens {tokens.tolist()}")
    detail = (f"{cases} garbage cases x {len(methods)} methods: ids in range, shapes hold"
              if not failures else summarize(failures))
    return CheckResult(name, not failures, detail, {"cases": cases})
