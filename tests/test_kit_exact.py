"""The exact, seed and bad-input checks have power: deliberately broken backends fail them.

Each broken backend is the reference with one documented rule violated, of the kind peers ship
(docs/semantics.md, /work/shared/references.md): ties to the highest index, a strict ``<`` in
the inverse-CDF pick, one random stream for the whole batch, temperature-0 rows sampled, inputs
written in place, NaN rows giving id V. A check that passed them would prove nothing. The margin
analysis that excuses near-ties is tested on rows built to sit on, or far from, a boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.backends.numpy import chain as numpy_ref
from portable_verify.backends.numpy.backend import NumpyReferenceBackend
from portable_verify.backends.torch.backend import TorchBackend
from portable_verify.testing.checks.near_boundary import near_boundary_rows
from portable_verify.testing.kit import run_check


def _last_argmax(row: np.ndarray) -> int:
    return len(row) - 1 - int(np.argmax(row[::-1]))


def _draw_strict(weights: np.ndarray, v: float) -> int:
    c = np.cumsum(weights.astype(np.float32), dtype=np.float32)
    return min(int(np.searchsorted(c, np.float32(v) * c[-1], side="right")), len(c) - 1)


class _Patched(NumpyReferenceBackend):
    """The reference with one of its helpers swapped for the duration of a call."""

    attribute = ""
    replacement: Callable[..., int] = staticmethod(_last_argmax)

    def run(self, inputs):  # type: ignore[no-untyped-def]
        with mock.patch.object(numpy_ref, self.attribute, self.replacement):
            return super().run(inputs)


class TiesHigh(_Patched):
    attribute, replacement = "first_argmax", staticmethod(_last_argmax)


class DrawStrict(_Patched):
    attribute, replacement = "inverse_cdf_draw", staticmethod(_draw_strict)


class SharedStream(NumpyReferenceBackend):
    def run(self, inputs):  # type: ignore[no-untyped-def]
        if inputs.uniforms is not None and len(inputs.uniforms):
            first = np.repeat(inputs.uniforms[:1], len(inputs.uniforms), axis=0)
            inputs = replace(inputs, uniforms=first)
        return super().run(inputs)


class GreedyRowsSampled(NumpyReferenceBackend):
    def run(self, inputs):  # type: ignore[no-untyped-def]
        if inputs.uniforms is not None:
            t = np.where(inputs.temperature == 0, np.float32(1), inputs.temperature)
            inputs = replace(inputs, temperature=t, all_greedy=False, none_greedy=True)
        return super().run(inputs)


class Mutating(TorchBackend):
    def run(self, inputs):  # type: ignore[no-untyped-def]
        out = super().run(inputs)
        inputs.target.mul_(0.5)
        return out


class NanToV(NumpyReferenceBackend):
    def run(self, inputs):  # type: ignore[no-untyped-def]
        tokens, accepted = super().run(inputs)
        bad = np.isnan(inputs.target[inputs.target_rows]).any(axis=(1, 2))
        tokens[bad, 0] = inputs.vocab_size
        return tokens, accepted


@contextmanager
def registered(cls: type) -> Iterator[str]:
    name = f"broken-{cls.__name__.lower()}"
    cls.name = name
    pv.register_backend(name, lambda _device: cls())
    try:
        yield name
    finally:  # never leave a broken backend where test_conformance would find it
        pv.unregister_backend(name)


@pytest.mark.parametrize(
    "cls,check",
    [
        (TiesHigh, "exact.greedy"),
        (DrawStrict, "exact.boundaries"),
        (SharedStream, "exact.rejection"),
        (SharedStream, "seeds.request_independence"),
        (GreedyRowsSampled, "exact.mixed_greedy_rows"),
        (Mutating, "bad_input.no_mutation"),
        (NanToV, "bad_input.unvalidated"),
    ],
)
def test_broken_backend_fails(cls: type, check: str) -> None:
    with registered(cls) as name, np.errstate(all="ignore"):
        result = run_check(check, name, quick=True)
    assert not result.passed, result.detail


@pytest.mark.parametrize(
    "check", ["exact.greedy", "exact.boundaries", "seeds.request_independence"]
)
def test_reference_passes_its_own_checks(check: str) -> None:
    assert run_check(check, "numpy", quick=True).passed


def _one_step(p_x: float, u: float, as_logits: bool) -> dict:
    """One request, K = 1, V = 2, deterministic draft 0, with ``p(x) = p_x``."""
    p = torch.tensor([[[p_x, 1 - p_x], [0.5, 0.5]]])
    kwargs = {"draft_token_ids": torch.tensor([[0]]), "uniforms": torch.tensor([[u, 0.3]])}
    if as_logits:
        kwargs["target_logits"] = torch.log(p)
    else:
        kwargs["target_probs"] = p
    return kwargs


def test_margins_flag_a_logits_near_tie() -> None:
    kwargs = _one_step(0.3, 0.3 * (1 + 1e-7), as_logits=True)
    assert near_boundary_rows(kwargs, "rejection").tolist() == [True]


def test_margins_leave_clear_decisions_alone() -> None:
    for as_logits in (True, False):
        kwargs = _one_step(0.3, 0.6, as_logits)
        assert near_boundary_rows(kwargs, "rejection").tolist() == [False]


def test_margins_never_excuse_exact_probability_ties() -> None:
    """Given probabilities, ``u * q == p`` is exact arithmetic: the ``<=`` rule must decide it."""
    kwargs = _one_step(0.375, 0.375, as_logits=False)
    assert near_boundary_rows(kwargs, "rejection").tolist() == [False]


def test_margins_skip_greedy_rows() -> None:
    kwargs = _one_step(0.3, 0.3 * (1 + 1e-7), as_logits=True)
    assert near_boundary_rows(kwargs, "greedy").tolist() == [False]


def test_quick_cases_reach_every_edge_of_the_rules() -> None:
    """The seeded cases exercise each documented edge at least once (coverage of the kit)."""
    stats = {**run_check("exact.rejection", "numpy", quick=True).stats,
             **run_check("exact.typical", "numpy", quick=True).stats}
    for event in ("accepted", "accepted_q0", "all_accepted", "empty_residual", "greedy_row",
                  "rejected", "rejected_p0", "typical_rejected"):
        assert stats.get(f"path.{event}", 0) > 0, event


LEAKY_SOAK = """
import sys
import torch
import portable_verify as pv
from portable_verify.backends.numpy.backend import NumpyReferenceBackend
from portable_verify.testing.checks.memory_soak import soak


class Leaky(NumpyReferenceBackend):
    \"\"\"Keeps 200 bytes of Python objects and 64 KiB of tensor memory per call.\"\"\"

    name = "_leaky"
    kept = []

    def run(self, inputs):
        self.kept.append((bytes(200), torch.ones(16384)))
        return super().run(inputs)


pv.register_backend("_leaky", lambda _device: Leaky())
result = soak("_leaky", 2_000)
print(result.passed)
print(result.detail)
"""


def test_soak_catches_a_leak() -> None:
    """Run in a fresh process: memory freed by earlier tests would hide RSS growth in this one."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LEAKY_SOAK], capture_output=True, text=True,
                         timeout=600, check=True).stdout.splitlines()
    passed, detail = out[-2], out[-1]
    assert passed == "False", detail
    assert "RSS grew" in detail and "heap grew" in detail, detail
