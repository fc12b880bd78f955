"""The serving path: the torch backend's device code on CPU, and inputs a decision never reads.

The torch backend runs CPU calls on numpy views and accelerator calls on torch; CI has no
accelerator, so the device code path is exercised here on CPU tensors (``HOST_ARRAYS`` off) and
must make the reference's decisions. Validation at the default level reads only what the
decision reads, so values the decision never reads must change neither the result nor whether
the call is accepted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.backends.torch import draw as torch_draw
from portable_verify.backends.torch import ops as torch_ops
from portable_verify.testing.cases.random_cases import INPUT_FORMS, build_case, random_spec
from portable_verify.testing.checks.reference_comparison import Tally, compare

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_device_code_path_matches_reference(monkeypatch: pytest.MonkeyPatch,
                                            method: str) -> None:
    monkeypatch.setattr(torch_ops, "HOST_ARRAYS", False)
    gen = np.random.default_rng(77)
    tally = Tally()
    for _ in range(40):
        spec = replace(random_spec(gen, max_vocab=7), temperature="vector", ragged=True)
        for form in INPUT_FORMS:
            compare(tally, "torch:cpu", f"{spec.label}/{form}", build_case(spec.in_form(form)),
                    method, tolerate=method != "greedy")
    assert not tally.failures, tally.failures


@pytest.mark.parametrize("host", [True, False])
def test_draw_over_blocks_matches_the_full_scan(monkeypatch: pytest.MonkeyPatch,
                                                host: bool) -> None:
    """Both code paths of the two-level draw pick what one float64 cumulative sum picks (up to
    rounding at a boundary), including a ragged tail block, and never a zero weight."""
    monkeypatch.setattr(torch_ops, "HOST_ARRAYS", host)
    g = torch.Generator().manual_seed(9)
    v_size = 5 * torch_draw.DRAW_BLOCK + 13
    w = torch.softmax(torch.randn(3000, v_size, generator=g) * 3, -1)
    w[w < w.median()] = 0.0
    v = (torch.randint(0, 2**24, (3000,), generator=g) + 1).float() * 2**-24
    picked, total = torch_draw.draw(w.clone(), v)
    plain = torch_draw.inverse_cdf_draw(w, v)
    assert (total > 0).all()
    assert (w.gather(1, picked.unsqueeze(1)) > 0).all()
    assert (picked != plain).float().mean() < 2e-3
    assert (picked == plain).float().mean() > 0.99  # negative control below: a shifted pick
    assert (picked.clamp(max=v_size - 2) + 1 == plain).float().mean() < 0.1


def _unread_nan_case(form: str) -> tuple[dict, dict]:
    """Clean arguments, and the same arguments with NaN where no decision reads."""
    g = torch.Generator().manual_seed(4)
    b, k, v = 4, 3, 50
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    drafts = logits[:, :k].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % v  # request 1 rejects at position 1
    n = torch.tensor([3, 3, 1, 0])
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    clean = {"num_draft_tokens": n, "seed": 5}
    if form == "logits":
        clean.update(target_logits=logits, temperature=0.8)
    else:
        clean.update(target_probs=torch.softmax(logits, -1), draft_probs=q)
    dirty = {key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in clean.items()}
    target = dirty["target_logits" if form == "logits" else "target_probs"]
    target[2, 2:] = float("nan")  # beyond n = 1: rows 2 and 3 of request 2 are never read
    target[3, 1:] = float("nan")  # n = 0: only row 0 is read
    if form == "probs":
        dirty["draft_probs"][2, 1:] = float("nan")  # draft rows beyond n
        dirty["draft_probs"][3] = float("nan")
    return clean, dirty


@pytest.mark.parametrize("form", ["logits", "probs"])
@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
@pytest.mark.parametrize("validate", [True, False])
def test_unread_values_do_not_change_the_result(available_backend: str, form: str, method: str,
                                                validate: bool) -> None:
    clean, dirty = _unread_nan_case(form)
    drafts = clean["target_logits" if form == "logits" else "target_probs"][:, :3].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % 50
    want = pv.verify(drafts, method=method, backend=available_backend, **clean)
    got = pv.verify(drafts, method=method, backend=available_backend, validate=validate, **dirty)
    assert torch.equal(want.token_ids, got.token_ids)
    assert torch.equal(want.num_accepted, got.num_accepted)
    # Negative control: the same NaN in a row that is read is refused at the default level.
    dirty_key = "target_logits" if form == "logits" else "target_probs"
    dirty[dirty_key][2, 0] = float("nan")
    with pytest.raises(ValueError, match=dirty_key):
        pv.verify(drafts, method=method, backend=available_backend, **dirty)


def test_full_only_cases_are_refused_at_the_full_level(available_backend: str) -> None:
    """Bad values the default level may not read are still refused by ``validate="full"``."""
    from portable_verify.testing.cases.bad_inputs import FULL_ONLY_CASES

    assert FULL_ONLY_CASES
    for case in FULL_ONLY_CASES:
        with pytest.raises(case.error, match=case.argument):
            pv.verify(**case.build(), validate="full", backend=available_backend)


def test_validate_takes_three_levels() -> None:
    logits = torch.randn(1, 2, 5)
    with pytest.raises(TypeError, match="validate"):
        pv.verify(torch.tensor([[1]]), target_logits=logits, validate="strict")
    for level in (True, False, "full"):
        pv.verify(torch.tensor([[1]]), target_logits=logits, validate=level)


def test_vllm_v0_typical_contender_is_a_typical_sampler() -> None:
    """The benchmark's rebuilt vLLM v0 sampler makes the reference's typical decisions (its
    ``log(p + 1e-5)`` moves thresholds only slightly): same accepted counts on nearly every
    row, and the same recovered token wherever a request rejected."""
    from portable_verify.bench.cases import Variant, make_inputs
    from portable_verify.bench.peers import vllm_v0_typical_callable
    from portable_verify.core.types import DEFAULT_TYPICAL

    variant = Variant("typical", "logits")
    inputs = make_inputs((256, 3, 40), variant, torch.float32, torch.device("cpu"), seed=3)
    theirs = vllm_v0_typical_callable(inputs, variant, DEFAULT_TYPICAL.eps,
                                      DEFAULT_TYPICAL.alpha)()
    ours = pv.verify(inputs.drafts, seed=1, backend="numpy", **inputs.verify_kwargs(variant))
    their_a = (theirs >= 0).sum(1) - 1
    same = their_a == ours.num_accepted
    assert same.float().mean() > 0.95
    rejected = same & (ours.num_accepted < 3)
    assert rejected.sum() > 20
    assert torch.equal(theirs[rejected], ours.token_ids[rejected])


def test_device_code_path_refuses_the_bad_input_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks that ride on the decision (torch path, as on an accelerator) refuse every
    documented bad input, naming the argument, with one host transfer."""
    from portable_verify.testing.cases.bad_inputs import BAD_CASES
    from portable_verify.testing.checks.bad_input_errors import expect_error

    monkeypatch.setattr(torch_ops, "HOST_ARRAYS", False)
    problems = [f"{case.label}: {problem}" for case in BAD_CASES
                if (problem := expect_error(case.build(), "torch:cpu", case.argument,
                                            case.error))]
    assert not problems, problems
