"""Property tests: the torch:cpu backend against the numpy reference, and contract invariants.

Hypothesis draws :class:`CaseSpec` values (sizes, flags, a seed for the numbers) from the case
space the conformance kit samples; runs are derandomized and bounded so the suite stays fast and
reproducible. Reference comparisons excuse only rows the margin analysis
(portable_verify/testing/checks/near_boundary.py) marks as within float rounding of a boundary;
the invariants need no reference.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_verify as pv
from portable_verify.core.arguments import SEED_RANGE
from portable_verify.testing.cases.random_cases import CaseSpec, build_case
from portable_verify.testing.checks.reference_comparison import Tally, check_shapes, compare

BACKEND = "torch:cpu"
SETTINGS = settings(max_examples=120, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

specs = st.builds(
    CaseSpec,
    batch=st.integers(0, 5),
    positions=st.integers(0, 4),
    vocab=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    target=st.sampled_from(["logits", "probs"]),
    ties=st.booleans(),
    draft_probs=st.booleans(),
    temperature=st.sampled_from(["none", "scalar", "vector"]),
    ragged=st.booleans(),
    coarse_uniforms=st.booleans(),
)


def _assert_agrees(kwargs: dict, method: str, tolerate: bool = True) -> None:
    tally = Tally()
    compare(tally, BACKEND, "hypothesis", kwargs, method, tolerate=tolerate)
    assert not tally.failures, tally.failures


@SETTINGS
@given(specs)
def test_greedy_matches_reference_exactly(spec: CaseSpec) -> None:
    _assert_agrees(build_case(spec), "greedy", tolerate=False)


@SETTINGS
@given(specs)
def test_rejection_matches_reference(spec: CaseSpec) -> None:
    _assert_agrees(build_case(spec), "rejection")


@SETTINGS
@given(specs)
def test_typical_matches_reference(spec: CaseSpec) -> None:
    _assert_agrees(build_case(spec), "typical")


def test_typical_with_minus_inf_logits() -> None:
    """Regression: the entropy of a softmax with a -inf logit is finite (0 * -inf is not NaN)."""
    logits = torch.tensor([[[0.0, 1.0, -float("inf")], [2.0, 0.0, 1.0]]])
    kwargs = {"draft_token_ids": torch.tensor([[1]]), "target_logits": logits,
              "uniforms": torch.full((1, 2), 0.5)}
    _assert_agrees(kwargs, "typical", tolerate=False)


def _target_probs(kwargs: dict) -> np.ndarray:
    """float32 target probabilities at temperature T (T = 1 where a row is greedy)."""
    if "target_probs" in kwargs:
        return kwargs["target_probs"].numpy()
    b = kwargs["target_logits"].shape[0]
    t = kwargs.get("temperature")
    t = torch.ones(b) if t is None else torch.as_tensor(t, dtype=torch.float32).expand(b)
    t = torch.where(t > 0, t, torch.ones_like(t))
    return torch.softmax(kwargs["target_logits"] / t[:, None, None], -1).numpy()


@SETTINGS
@given(specs, st.sampled_from(["greedy", "rejection", "typical"]))
def test_output_contract(spec: CaseSpec, method: str) -> None:
    """Shapes, the accepted prefix, and: a token the target gives probability 0 is never emitted."""
    kwargs = build_case(spec)
    if method == "typical":
        kwargs.pop("draft_probs", None)
    res = pv.verify(**kwargs, method=method, backend=BACKEND)
    drafts = kwargs["draft_token_ids"].numpy()
    b, k = drafts.shape
    assert check_shapes(res, b, k, spec.vocab) is None
    n = kwargs.get("num_draft_tokens", torch.full((b,), k)).numpy()
    a = res.num_accepted.numpy()
    tokens = res.token_ids.numpy()
    assert (a <= n).all()
    p = _target_probs(kwargs)
    for i in range(b):
        assert (tokens[i, : a[i]] == drafts[i, : a[i]]).all()
        emitted = tokens[i, : a[i] + 1]
        assert (p[i, np.arange(a[i] + 1), emitted] > 0).all(), (i, emitted)


@SETTINGS
@given(specs)
def test_rows_do_not_interact(spec: CaseSpec) -> None:
    """With explicit uniforms, each request alone gives its row of the batched result."""
    kwargs = build_case(spec)
    whole = pv.verify(**kwargs, backend=BACKEND).token_ids
    for i in range(spec.batch):
        one = {key: val[i : i + 1] if isinstance(val, torch.Tensor) else val
               for key, val in kwargs.items()}  # every tensor argument is batch-major
        assert torch.equal(pv.verify(**one, backend=BACKEND).token_ids[0], whole[i])


@SETTINGS
@given(specs, st.integers(0, SEED_RANGE - 1), st.integers(0, SEED_RANGE - 1))
def test_greedy_ignores_seed(spec: CaseSpec, seed_a: int, seed_b: int) -> None:
    kwargs = build_case(replace(spec, uniforms=False))
    a = pv.verify(**kwargs, method="greedy", seed=seed_a, backend=BACKEND).token_ids
    b = pv.verify(**kwargs, method="greedy", seed=seed_b, backend=BACKEND).token_ids
    assert torch.equal(a, b)
