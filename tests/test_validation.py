"""Front-door validation: every documented bad input is refused with a message naming it.

The cases are the table the conformance kit uses (portable_verify/testing/cases/bad_inputs.py), so a
new bad input is added once and checked everywhere. Validation happens before dispatch, so these
tests run on the reference backend only; the kit repeats them per backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.core.validation import require_same_device
from portable_verify.testing.cases.bad_inputs import ACCEPTED, BAD_CASES, probs_call, valid_call
from portable_verify.testing.checks.reference_comparison import check_shapes


@pytest.mark.parametrize("case", BAD_CASES, ids=[c.label for c in BAD_CASES])
def test_bad_input_raises_naming_the_argument(case) -> None:  # type: ignore[no-untyped-def]
    call = {"backend": "numpy", **case.build()}
    with pytest.raises((ValueError, TypeError)) as info:
        pv.verify(**call)
    assert type(info.value) is case.error, info.value
    assert case.argument in str(info.value)


@pytest.mark.parametrize("label,build", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_borderline_input_is_accepted(label: str, build) -> None:  # type: ignore[no-untyped-def]
    call = build()
    res = pv.verify(**call, backend="numpy")
    b, k = np.asarray(call["draft_token_ids"]).shape
    assert res.token_ids.shape == (b, k + 1)


def test_device_message_lists_both_devices() -> None:
    cpu, meta = torch.zeros(1), torch.zeros(1, device="meta")
    with pytest.raises(ValueError, match="one device") as info:
        require_same_device({"draft_token_ids": cpu, "target_logits": meta})
    assert "target_logits on meta" in str(info.value) and "cpu" in str(info.value)


def test_meta_tensors_are_refused_naming_the_argument() -> None:
    call = valid_call()
    call["target_logits"] = call["target_logits"].to("meta")
    with pytest.raises(ValueError, match="target_logits is a meta tensor"):
        pv.verify(**call)


def test_first_bad_entry_is_located() -> None:
    call = probs_call()
    call["target_probs"][1, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"index \(4,\)"):  # flat row 1 * (K+1) + 1
        pv.verify(**call, validate="full")  # the default level may not read that row


def test_validation_reads_only_used_positions() -> None:
    """A NaN row after a request's bonus row is never read, so it is not an error."""
    call = valid_call()  # request 2 has n = 0: only its row 0 is read
    call["target_logits"][2, 1:] = float("nan")
    pv.verify(**call)
    call["target_logits"][2, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="target_logits"):
        pv.verify(**call)


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
@pytest.mark.parametrize("build", [valid_call, probs_call])
def test_inputs_are_not_mutated(method: str, build) -> None:  # type: ignore[no-untyped-def]
    call = build()
    before = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}
    pv.verify(**call, method=method)
    for key, value in before.items():
        assert torch.equal(value, call[key]), key


def test_failed_call_leaves_inputs_untouched() -> None:
    call = valid_call()
    call["num_draft_tokens"] = torch.tensor([2, 1, 5])
    before = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match="num_draft_tokens"):
        pv.verify(**call)
    for key, value in before.items():
        assert torch.equal(value, call[key]), key


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_unvalidated_nan_gives_well_formed_output(method: str, backend: str) -> None:
    call = valid_call()
    call["target_logits"][:, 0] = float("nan")  # every request's first row
    call["draft_probs"][0] = float("nan")
    with np.errstate(all="ignore"):
        res = pv.verify(**call, method=method, backend=backend, validate=False)
    assert check_shapes(res, 3, 2, 5) is None


def test_unvalidated_call_skips_checks() -> None:
    call = probs_call()
    call["target_probs"] = call["target_probs"] * 0.5
    with pytest.raises(ValueError, match="sum to 1"):
        pv.verify(**call)
    res = pv.verify(**call, validate=False)
    assert check_shapes(res, 3, 2, 5) is None
