"""Every backend agrees with the numpy reference on randomised small cases, in every input form.

The conformance kit (tests/test_conformance.py) goes much further; this file is the fast
smoke check engineers run while changing a backend. Disagreements are excused only on rows the
margin analysis marks as within float rounding of a boundary (never for greedy decoding).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.testing.cases.random_cases import INPUT_FORMS, build_case, random_spec
from portable_verify.testing.checks.reference_comparison import Tally, compare


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_matches_reference_on_random_cases(available_backend: str, method: str) -> None:
    traits = pv.get_backend(available_backend).traits
    if traits.is_reference:
        pytest.skip("the reference is what the others are compared with")
    gen = np.random.default_rng(1234)
    tally = Tally()
    for _ in range(60 if traits.full_conformance_sizes else 4):
        spec = replace(random_spec(gen, max_vocab=7), temperature="vector", ragged=True)
        for form in INPUT_FORMS:
            compare(tally, available_backend, f"{spec.label}/{form}",
                    build_case(spec.in_form(form)), method, tolerate=method != "greedy")
    assert not tally.failures, tally.failures


def test_numpy_in_numpy_out() -> None:
    logits = torch.randn(3, 3, 5)
    drafts = torch.randint(0, 5, (3, 2))
    res = pv.verify(drafts.numpy(), target_logits=logits.numpy(), method="greedy")
    assert type(res.token_ids).__module__ == "numpy"
    assert res.token_ids.tolist() == pv.verify(drafts, target_logits=logits,
                                               method="greedy").token_ids.tolist()
