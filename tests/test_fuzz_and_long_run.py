"""The fuzz and long-run conformance checks themselves: they run, they catch a leak and a broken
backend, and crash isolation turns a segfault and a hang into verdicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.testing.isolation import run_isolated

BACKENDS = pv.available_backends()
HERE = str(Path(__file__).resolve())

def _openvino() -> str | None:
    return next((b for b in BACKENDS if b.split(":")[0] == "openvino"), None)


@pytest.mark.slow
@pytest.mark.skipif(_openvino() is None, reason="openvino is not available")
def test_mixed_method_long_run_on_openvino() -> None:
    """20 000 calls cycling every method x layout x target kind (docs/testing.md, Long run)."""
    from portable_verify.testing.checks.long_run import long_run

    result = long_run(str(_openvino()), 20_000)
    assert result.passed, f"{result.detail} {result.stats}"


@pytest.mark.slow
def test_long_run_detects_a_leak() -> None:
    """The negative control: the harness keeping 8 KiB per call must fail the bound."""
    from portable_verify.testing.checks.long_run import WARMUP_CALLS, long_run

    result = long_run("numpy", WARMUP_CALLS + 2_000, leak_bytes_per_call=8192)
    assert not result.passed and "RSS grew" in result.detail, result.detail


def test_fuzz_and_long_run_are_conformance_checks() -> None:
    from portable_verify.testing.kit import all_checks

    names = {c.name for c in all_checks()}
    assert {"fuzz.properties", "fuzz.unvalidated", "long_run.memory"} <= names


def child_segfault() -> None:
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


def child_hang() -> None:
    import time

    time.sleep(60)


def child_value(x: int) -> dict[str, int]:
    return {"twice": 2 * x}


def test_isolation_turns_a_segfault_and_a_hang_into_verdicts() -> None:
    crashed = run_isolated(f"{HERE}:child_segfault", timeout=120)
    assert not crashed.ok and crashed.describe() == "killed by SIGSEGV"
    hung = run_isolated(f"{HERE}:child_hang", timeout=5)
    assert not hung.ok and "timed out" in hung.describe()
    fine = run_isolated(f"{HERE}:child_value", 21, timeout=120)
    assert fine.ok and fine.value == {"twice": 42}


class _BrokenReference(Backend):
    """The reference with one bug, to show the fuzz properties can fail."""

    description = "test double"
    traits = BackendTraits(chain_rules=("rejection", "typical", "block"))
    bug = ""

    def availability(self) -> Availability:
        return Availability(True, "test double")

    def run(self, inputs: Any) -> tuple[Any, Any]:
        from portable_verify.backends.numpy.chain import verify_reference
        from portable_verify.dispatch import numpy_inputs

        tokens, accepted = verify_reference(numpy_inputs(inputs))
        if self.bug == "zero_token" and tokens.size:
            rows = np.arange(tokens.shape[0])
            tokens[rows, accepted] = 0  # the final token is always token 0
        if self.bug == "writes_input" and inputs.target.numel():
            inputs.target.view(-1)[0] = 123.0
        return torch.from_numpy(tokens), torch.from_numpy(accepted)


@pytest.mark.parametrize("bug", ["zero_token", "writes_input"])
def test_fuzz_properties_catch_a_broken_backend(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_verify.testing.checks import fuzz

    name = f"_fuzz_{bug}"
    cls = type(name, (_BrokenReference,), {"name": name, "bug": bug})
    monkeypatch.setenv(fuzz.EXAMPLES_ENV, "60")
    pv.register_backend(name, lambda device: cls(device))
    try:
        result = fuzz.fuzz_properties(name, True)
    finally:
        pv.unregister_backend(name)
    expected = {"zero_token": "target probability 0", "writes_input": "an input was written"}
    assert not result.passed
    assert any(expected[bug] in p for p in result.stats["problems"]), result.stats["problems"]

