"""The kit builds every case on the device of the backend under test.

CI has no GPU, so a test-only backend on torch's ``meta`` device stands in for one: the sweep
runs every registered check on it (verdicts ignored) and fails naming any check that handed it a
tensor (or array) not on ``meta``, the way ``triton:cuda`` was handed CPU tensors on the first
GPU run. The public doors refuse meta tensors by contract (they hold no values), so while the
sweep runs, a call naming the stand-in is answered at the door: the device of every array
argument is recorded and meta outputs of the documented shapes come back. A check then crashes
at its first read of a value (the reference's host copy, a comparison): what it handed before is
what the sweep judges, so each check must reach the stand-in at least once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.core import methods
from portable_verify.dispatch import torch_device
from portable_verify.testing import isolation, kit
from portable_verify.testing.cases import bad_inputs
from portable_verify.testing.checks import bad_input_errors, exact_decisions, fuzz, long_run

NAME = "_meta_stand_in"
RULES = tuple(dict.fromkeys(m.rule for m in methods.TABLE.values() if m.rule))

NOT_REACHED = {
    # The reference's own checks: they skip every other backend (or test only its controls).
    "stat.negative_controls_caught", "stat.tree_negative_controls",
    "traversal.negative_controls", "traversal.gain",
    # Its probes run only in a child whose address space is capped.
    "fuzz.ragged_extremes",
}
"""Checks that never hand the stand-in a call (and why), left out of the sweep: every other
check must hand it one."""


class MetaStandIn(Backend):
    """Picked for every layout and rule; its inputs live on ``meta``. Never run: the doors
    refuse meta tensors, so the sweep answers its calls there."""

    name = NAME
    description = "test double: the kit's device stand-in"
    traits = BackendTraits(full_conformance_sizes=False, layouts=methods.LAYOUTS,
                           chain_rules=RULES, tree_rules=RULES)

    def torch_device_type(self) -> str:
        return "meta"

    def availability(self) -> Availability:
        return Availability(True, "test double")

    def run(self, inputs: Any) -> tuple[Any, Any]:
        raise AssertionError("the doors refuse meta tensors; the sweep answers at the door")


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, dtype=torch.int64, device="meta")


def _chain_answer(args: tuple[Any, ...], kwargs: dict[str, Any], ragged: bool
                  ) -> pv.VerifyResult:
    drafts = args[0] if args else kwargs["draft_token_ids"]
    if ragged:
        counts = kwargs.get("num_draft_tokens")
        b = len(counts) if counts is not None else len(kwargs["cu_num_draft_tokens"]) - 1
        k = kwargs.get("max_num_draft_tokens") or 0
    else:
        b, k = drafts.shape
    return pv.VerifyResult(_meta(b, k + 1), _meta(b), _meta(b), _meta(b))


def _tree_answer(args: tuple[Any, ...], kwargs: dict[str, Any]) -> pv.TreeResult:
    b, n = (args[0] if args else kwargs["node_token_ids"]).shape
    depth = kwargs.get("max_depth")
    w = n if depth is None else depth + 1
    return pv.TreeResult(_meta(b, w), _meta(b, w), _meta(b), _meta(b))


def _door(real: Callable[..., Any], answer: Callable[..., Any],
          log: Callable[[], list[str]]) -> Callable[..., Any]:
    """``real``, except that a call naming the stand-in is logged and answered here."""

    def door(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") != NAME:
            return real(*args, **kwargs)
        handed = log()
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                handed.append(value.device.type)
            elif isinstance(value, np.ndarray):
                handed.append("numpy")
        return answer(args, kwargs)

    return door


def _in_process(target: str, *args: Any, **_: Any) -> isolation.ChildOutcome:
    """run_isolated, in this process (the stand-in is registered here only); not the ragged
    probes' child, which caps its own address space."""
    if target == fuzz.RAGGED_CHILD:
        raise RuntimeError("not run in-process: it caps the address space")
    module, _, function = target.partition(":")
    return isolation.ChildOutcome(0, getattr(importlib.import_module(module), function)(*args),
                                  "")


@pytest.fixture
def sweep(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., dict[str, list[str]]]]:
    """``sweep(names)``: check name -> the devices of everything it handed the stand-in."""
    handed_by: dict[str, list[str]] = {}
    current: list[str] = []

    def log() -> list[str]:
        return handed_by[current[-1]]

    for attr, answer in (("verify", lambda a, k: _chain_answer(a, k, False)),
                         ("verify_ragged", lambda a, k: _chain_answer(a, k, True)),
                         ("verify_tree", _tree_answer)):
        monkeypatch.setattr(pv, attr, _door(getattr(pv, attr), answer, log))
    for module in (fuzz, long_run):
        monkeypatch.setattr(module, "run_isolated", _in_process)
    # Each of these puts one argument on another device on purpose (test_validation.py).
    monkeypatch.setattr(bad_input_errors, "BAD_CASES", tuple(
        c for c in bad_inputs.BAD_CASES if "another device" not in c.label))
    pv.register_backend(NAME, lambda device: MetaStandIn(device))
    threads = torch.get_num_threads()

    def run(names: list[str]) -> dict[str, list[str]]:
        for check in kit.all_checks():
            if check.name in names:
                current.append(check.name)
                handed_by[check.name] = []
                check.fn(NAME, True)  # the registry's copy: a crash is a verdict, ignored
        return handed_by

    try:
        yield run
    finally:
        pv.unregister_backend(NAME)
        torch.set_num_threads(threads)  # a child function run here may set it


def elsewhere(handed: dict[str, list[str]]) -> dict[str, list[str]]:
    """The checks that handed the stand-in something not on ``meta``, and what."""
    return {name: sorted(set(d) - {"meta"}) for name, d in handed.items() if set(d) - {"meta"}}


def test_the_stand_in_is_on_meta_and_hidden(sweep: Callable[..., Any]) -> None:
    assert torch_device(NAME) == torch.device("meta")
    assert NAME not in pv.available_backends()


def test_every_check_builds_its_cases_on_the_backends_device(
        sweep: Callable[..., dict[str, list[str]]]) -> None:
    names = [c.name for c in kit.all_checks()]
    assert set(names) >= NOT_REACHED, "a check listed in NOT_REACHED no longer exists"
    handed = sweep([name for name in names if name not in NOT_REACHED])
    assert not elsewhere(handed), f"checks that handed a meta backend other devices: " \
        f"{elsewhere(handed)}"
    silent = sorted(name for name, d in handed.items() if not d)
    assert not silent, f"checks that never reached the stand-in: {silent}"


def test_a_check_building_on_the_cpu_is_named(
        sweep: Callable[..., dict[str, list[str]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: exact.greedy's cases built on the CPU whatever the backend."""
    real = exact_decisions.build_case
    monkeypatch.setattr(exact_decisions, "build_case",
                        lambda spec, device="cpu", **kw: real(spec, **kw))
    handed = sweep(["exact.greedy", "exact.block", "tree.exact"])
    assert elsewhere(handed) == {"exact.greedy": ["cpu"]}
