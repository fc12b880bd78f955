"""The ragged (flattened) entry point gives exactly the padded call's answers, on every backend.

Each randomised padded case is flattened the way vLLM v1 lays it out (drafts back to back,
each request's bonus row right after its draft rows) and both calls must agree bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.core.types import VerifyInputs
from portable_verify.testing.cases.random_cases import (
    INPUT_FORMS,
    as_numpy,
    build_case,
    random_spec,
)


def _flatten(
    drafts: torch.Tensor, n: torch.Tensor, target: torch.Tensor, q: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Padded ``[B, K]``/``[B, K+1, V]``/``[B, K, V]`` -> flat ``[N]``/``[N+B, V]``/``[N, V]``."""
    v = target.shape[-1]
    counts = n.tolist()
    flat = torch.cat([drafts[i, :c] for i, c in enumerate(counts)] + [drafts.new_zeros(0)])
    rows = torch.cat([target[i, : c + 1] for i, c in enumerate(counts)] + [target.new_zeros(0, v)])
    fq = None
    if q is not None:
        fq = torch.cat([q[i, :c] for i, c in enumerate(counts)] + [q.new_zeros(0, v)])
    return flat, rows, fq


def _padded_forms(gen: np.random.Generator) -> dict[str, dict]:
    """One random ragged case (B <= 4, K <= 3, V <= 6) in each input form, as padded calls."""
    spec = replace(random_spec(gen, max_batch=4, max_positions=3, max_vocab=6), ragged=True,
                   temperature="vector")
    return {form: build_case(spec.in_form(form)) for form in INPUT_FORMS}


def _ragged_call(padded: dict) -> dict:
    """The flat (vLLM v1) layout of a padded call; ``max_num_draft_tokens`` = its K."""
    kw = dict(padded)
    drafts, n = kw.pop("draft_token_ids"), kw["num_draft_tokens"]
    target_name = "target_logits" if "target_logits" in kw else "target_probs"
    flat, rows, fq = _flatten(drafts, n, kw[target_name], kw.pop("draft_probs", None))
    kw[target_name] = rows
    if fq is not None:
        kw["draft_probs"] = fq
    return dict(kw, draft_token_ids=flat, max_num_draft_tokens=drafts.shape[1])


def _skip_if_method_missing(backend: str, method: str) -> None:
    """A backend that does not implement ``method`` refuses the padded call too: nothing to
    compare. Only that refusal skips; any other error in the padded call fails the test."""
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    try:
        pv.verify(torch.tensor([[1, 2], [3, 4]]), target_logits=logits, method=method, seed=0,
                  backend=backend)
    except (ValueError, NotImplementedError) as exc:
        if "not implemented" not in str(exc):
            raise
        pytest.skip(f"backend {backend!r} does not implement method={method!r}")


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_ragged_equals_padded(available_backend: str, method: str) -> None:
    _skip_if_method_missing(available_backend, method)
    traits = pv.get_backend(available_backend).traits
    gen = np.random.default_rng(7 + len(method))
    trials = 30 if traits.full_conformance_sizes or traits.is_reference else 6
    for trial in range(trials):
        for label, padded in _padded_forms(gen).items():
            b = padded["draft_token_ids"].shape[0]
            seeded = {k: v for k, v in padded.items() if k != "uniforms"}
            seeded |= dict(seed=torch.arange(b) * 31 + trial, seed_offset=trial)
            for call in (seeded, padded):  # seeds, then explicit uniforms
                want = pv.verify(**call, method=method, backend="numpy")
                got = pv.verify_ragged(**_ragged_call(call), method=method,
                                       backend=available_backend)
                where = (trial, label, "uniforms" in call)
                assert torch.equal(got.token_ids, want.token_ids), where
                assert torch.equal(got.num_accepted, want.num_accepted), where
                assert torch.equal(got.num_draft_tokens, call["num_draft_tokens"]), where


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
def test_cu_offsets_and_inferred_width(backend: str) -> None:
    """Offsets give the counts' answers; without max_k the width is max(n)+1 (seeded numbers
    do not depend on the width)."""
    gen = np.random.default_rng(3)
    for trial in range(20):
        padded = _padded_forms(gen)["logits+q"]
        padded.pop("uniforms")
        n = padded["num_draft_tokens"]
        padded["seed"] = torch.arange(n.shape[0]) + 100 * trial
        want = pv.verify(**padded, backend="numpy")
        call = _ragged_call(padded)
        del call["num_draft_tokens"], call["max_num_draft_tokens"]
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
        got = pv.verify_ragged(**call, cu_num_draft_tokens=cu, backend=backend)
        width = int(n.max()) + 1 if n.numel() else 1
        assert got.token_ids.shape == (n.shape[0], width)
        assert torch.equal(got.token_ids, want.token_ids[:, :width]), trial
        assert torch.equal(got.num_accepted, want.num_accepted), trial


def test_int_seed_and_numpy_in_numpy_out() -> None:
    padded = {"draft_token_ids": torch.zeros(0, 0)}
    gen = np.random.default_rng(11)
    while padded["draft_token_ids"].shape[0] == 0:
        padded = _padded_forms(gen)["probs+q"]
    del padded["uniforms"]
    want = pv.verify(**padded, seed=5)
    got = pv.verify_ragged(**as_numpy(_ragged_call(padded)), seed=5)
    assert isinstance(got.token_ids, np.ndarray)
    np.testing.assert_array_equal(got.token_ids, want.token_ids.numpy())


def test_empty_batch_and_no_drafts() -> None:
    empty = pv.verify_ragged(torch.zeros(0, dtype=torch.int64),
                             num_draft_tokens=torch.zeros(0, dtype=torch.int64),
                             target_logits=torch.zeros(0, 5))
    assert empty.token_ids.shape == (0, 1)
    # Every request without drafts: one token each, from its single (bonus) row.
    rows = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]])
    got = pv.verify_ragged(torch.zeros(0, dtype=torch.int64),
                           cu_num_draft_tokens=torch.tensor([0, 0, 0]), target_logits=rows,
                           draft_probs=torch.zeros(0, 3), method="greedy",
                           max_num_draft_tokens=2)
    assert got.token_ids.tolist() == [[1, -1, -1], [0, -1, -1]]
    assert got.num_accepted.tolist() == [0, 0]


def test_target_is_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backends receive the caller's flat target itself, indexed through the row map."""
    import portable_verify.dispatch as dispatch

    seen: list[VerifyInputs] = []
    real = dispatch.get_backend("cpu")

    class Spy(type(real)):  # type: ignore[misc]
        def run(self, inputs: VerifyInputs):  # type: ignore[no-untyped-def]
            seen.append(inputs)
            return super().run(inputs)

    monkeypatch.setattr(dispatch, "select_backend", lambda name, device, method=None: Spy())
    target = torch.randn(2 + 3 + 2, 6)  # n = [2, 3]: N = 5, B = 2
    pv.verify_ragged(torch.tensor([1, 2, 3, 4, 5]), num_draft_tokens=torch.tensor([2, 3]),
                     target_logits=target, seed=0)
    assert seen[0].target.data_ptr() == target.data_ptr()
    assert seen[0].target_rows.tolist() == [[0, 1, 2, 2], [3, 4, 5, 6]]


def _valid() -> dict:
    return dict(
        draft_token_ids=torch.tensor([1, 2, 0]),
        num_draft_tokens=torch.tensor([2, 1]),
        target_probs=torch.full((5, 4), 0.25),
        draft_probs=torch.full((3, 4), 0.25),
    )


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(draft_token_ids=torch.tensor([[1, 2, 0]])), ValueError, "draft_token_ids"),
        (dict(draft_token_ids=torch.tensor([1.0, 2.0, 0.0])), TypeError, "draft_token_ids"),
        (dict(draft_token_ids=torch.tensor([1, 9, 0])), ValueError, "draft_token_ids"),
        (dict(num_draft_tokens=torch.tensor([2, 2])), ValueError, "num_draft_tokens"),
        (dict(num_draft_tokens=torch.tensor([4, -1])), ValueError, "num_draft_tokens"),
        (dict(num_draft_tokens=torch.tensor([2.0, 1.0])), TypeError, "num_draft_tokens"),
        (dict(num_draft_tokens=torch.tensor([3])), ValueError, "target_probs"),
        (dict(num_draft_tokens=None), ValueError, "cu_num_draft_tokens"),
        (dict(cu_num_draft_tokens=torch.tensor([0, 2, 3])), ValueError, "exactly one"),
        (dict(num_draft_tokens=None, cu_num_draft_tokens=torch.tensor([1, 2, 3])),
         ValueError, "start at 0"),
        (dict(num_draft_tokens=None, cu_num_draft_tokens=torch.tensor([0, 4, 3])),
         ValueError, "non-decreasing"),
        (dict(num_draft_tokens=None, cu_num_draft_tokens=torch.tensor([0, 2])),
         ValueError, "target_probs"),
        (dict(num_draft_tokens=None, cu_num_draft_tokens=torch.tensor([], dtype=torch.int64)),
         ValueError, "cu_num_draft_tokens"),
        (dict(target_probs=torch.full((4, 4), 0.25)), ValueError, "N\\+B"),
        (dict(target_probs=torch.full((5, 4, 1), 0.25)), ValueError, "target_probs"),
        (dict(target_probs=torch.full((5, 4), 0.3)), ValueError, "sum to 1"),
        (dict(draft_probs=torch.full((2, 4), 0.25)), ValueError, "draft_probs"),
        (dict(max_num_draft_tokens=1), ValueError, "max_num_draft_tokens"),
        (dict(max_num_draft_tokens=2.0), TypeError, "max_num_draft_tokens"),
        (dict(uniforms=torch.full((2, 4), 0.5)), ValueError, "uniforms"),
        (dict(uniforms=torch.full((2, 3), 0.0)), ValueError, "uniforms"),
        (dict(temperature=torch.ones(3)), ValueError, "temperature"),
    ],
)
def test_bad_input_names_the_argument(change: dict, error: type, match: str) -> None:
    kw = {**_valid(), **change}
    with pytest.raises(error, match=match):
        pv.verify_ragged(kw.pop("draft_token_ids"), **kw)


def test_validate_false_skips_checks_but_keeps_answers() -> None:
    kw = _valid()
    on = pv.verify_ragged(kw.pop("draft_token_ids"), seed=1, **kw)
    kw = _valid()
    off = pv.verify_ragged(kw.pop("draft_token_ids"), seed=1, validate=False,
                           max_num_draft_tokens=2, **kw)
    assert torch.equal(on.token_ids, off.token_ids)

