"""Plain calls (contiguous CPU arrays of the canonical dtypes) and the compiled backend behind them.

The conformance kit already compares ``numba:cpu`` with the reference through the public call
(so through this path); these tests pin what the path itself promises: it is taken for plain
calls, it steps aside for everything else (same answers, same error messages), and a value the
kernel only flags is worded by the torch backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch

pytest.importorskip("numba")

B, K, V = 3, 2, 16


def _case(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=g) * 3
    drafts = torch.randint(0, V, (B, K), generator=g)
    drafts[0] = logits[0, :K].argmax(-1)  # one request accepts its drafts
    return {"draft_token_ids": drafts, "target_logits": logits}


@pytest.fixture
def full_door_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the backends the full front door ran (dispatch.run is its only way out)."""
    seen: list[str] = []
    original = dispatch.run

    def spy(backend: Any, inputs: Any) -> Any:
        seen.append(getattr(backend, "qualified_name", backend))
        return original(backend, inputs)

    monkeypatch.setattr(dispatch, "run", spy)
    monkeypatch.delenv(dispatch.ENV_BACKEND, raising=False)
    return seen


@pytest.mark.parametrize("kwargs", [
    {"method": "greedy"},
    {"temperature": 0.0},
    {"temperature": 0.7, "seed": 3},
    {"temperature": 0.7, "seed": 3, "seed_offset": 5},
    {"method": "typical", "temperature": 0.7, "seed": 3},
    {"temperature": torch.tensor([0.0, 0.5, 1.5]), "seed": torch.tensor([1, 2, 3])},
    {"num_draft_tokens": torch.tensor([2, 0, 1]), "seed": 1},
    {"bonus_token_ids": torch.tensor([[5], [6], [7]]), "seed": 1},
])
def test_plain_calls_go_straight_to_the_kernel_and_agree_with_the_reference(
        kwargs: dict, full_door_calls: list[str]) -> None:
    case = _case()
    got = pv.verify(**case, **kwargs)
    assert full_door_calls == [], "a plain CPU call went through the full front door"
    want = pv.verify(**case, **kwargs, backend="numpy")
    for field in ("token_ids", "num_accepted", "num_emitted", "num_draft_tokens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("change", [
    lambda c: {**c, "draft_token_ids": c["draft_token_ids"].int()},  # int32 ids
    lambda c: {**c, "target_logits": c["target_logits"].double()},  # float64 target
    lambda c: {**c, "target_logits": c["target_logits"].transpose(0, 1).contiguous()
               .transpose(0, 1)},  # a strided view
])
def test_other_forms_take_the_full_front_door_with_the_same_answer(
        change: Callable[[dict], dict], full_door_calls: list[str]) -> None:
    case = _case(1)
    want = pv.verify(**case, temperature=0.8, seed=9)
    assert full_door_calls == []
    got = pv.verify(**change(case), temperature=0.8, seed=9)
    assert full_door_calls, "a non-plain form was not handed to the full front door"
    assert torch.equal(got.token_ids, want.token_ids)


def test_array_kinds_mix_and_the_result_follows_the_drafts() -> None:
    case = _case(2)
    drafts, logits = case["draft_token_ids"], case["target_logits"]
    want = pv.verify(drafts, target_logits=logits, method="greedy", backend="numpy")
    got_np = pv.verify(drafts.numpy(), target_logits=logits, method="greedy")
    got_t = pv.verify(drafts, target_logits=logits.numpy(), method="greedy")
    assert isinstance(got_np.token_ids, np.ndarray) and isinstance(got_t.token_ids, torch.Tensor)
    assert np.array_equal(got_np.token_ids, want.token_ids.numpy())
    assert torch.equal(got_t.token_ids, want.token_ids)


def test_grad_carrying_logits_are_read_without_a_copy_or_an_error() -> None:
    case = _case(3)
    logits = case["target_logits"].clone().requires_grad_(True)
    for kwargs in ({"method": "greedy"}, {"temperature": 0.5, "seed": 1}):
        got = pv.verify(case["draft_token_ids"], target_logits=logits, **kwargs)
        want = pv.verify(case["draft_token_ids"], target_logits=logits.detach(), **kwargs,
                         backend="numpy")
        assert torch.equal(got.token_ids, want.token_ids)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"method": "greedy", "nan_at": (1, 0, 3)}, "target_logits contains NaN"),
    ({"temperature": 0.7, "seed": 1, "nan_at": (0, 0, 3)}, "target_logits contains NaN"),
    ({"temperature": -1.0}, "temperature must be finite and >= 0"),
    ({"seed": 1, "draft_id": V}, "draft_token_ids"),
])
def test_a_flagged_value_is_worded_by_the_full_front_door(kwargs: dict, message: str) -> None:
    case = _case(4)
    logits, drafts = case["target_logits"].clone(), case["draft_token_ids"].clone()
    if (at := kwargs.pop("nan_at", None)) is not None:
        logits[at] = float("nan")
    if (bad_id := kwargs.pop("draft_id", None)) is not None:
        drafts[2, 0] = bad_id
    with pytest.raises(ValueError, match=message):
        pv.verify(drafts, target_logits=logits, **kwargs)
    # The same error as the torch backend gives, word for word.
    with pytest.raises(ValueError) as ours:
        pv.verify(drafts, target_logits=logits, **kwargs)
    with pytest.raises(ValueError) as torch_backend:
        pv.verify(drafts, target_logits=logits, **kwargs, backend="torch:cpu")
    assert str(ours.value) == str(torch_backend.value)


def test_the_backend_alone_rewords_through_dispatch() -> None:
    """``NumbaBackend.run`` raises ``ReadValueError``; dispatch reruns on torch for the words."""
    from portable_verify.backends.base import ReadValueError

    case = _case(5)
    logits = case["target_logits"].clone()
    logits[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or \\+inf") as caught:
        pv.verify(case["draft_token_ids"], target_logits=logits, seed=1, backend="numba:cpu",
                  validate=True, num_draft_tokens=torch.tensor([2, 2, 2], dtype=torch.int32))
    assert not isinstance(caught.value, ReadValueError)


def test_unvalidated_garbage_stays_in_range() -> None:
    case = _case(6)
    logits = case["target_logits"].clone()
    logits[:, :, :4] = float("nan")
    drafts = case["draft_token_ids"].clone()
    drafts[1, 0] = 10**9
    for kwargs in ({"method": "greedy"}, {"temperature": float("nan"), "seed": 1},
                   {"method": "typical", "seed": 2},
                   {"num_draft_tokens": torch.tensor([9, -4, 1])}):
        out = pv.verify(drafts, target_logits=logits, validate=False, **kwargs).token_ids
        emitted = out[out >= 0]
        assert ((emitted >= 0) & (emitted < V)).all(), (kwargs, out)


def _ragged(seed: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([2, 0, 3, 1])
    n, b = int(counts.sum()), counts.shape[0]
    return {"draft_token_ids": torch.randint(0, V, (n,), generator=g),
            "num_draft_tokens": counts,
            "target_logits": torch.randn(n + b, V, generator=g) * 3}


@pytest.mark.parametrize("kwargs", [
    {"method": "greedy"},
    {"temperature": 0.9, "seed": 4},
    {"method": "typical", "seed": 4, "max_num_draft_tokens": 5},
    {"temperature": torch.tensor([0.0, 1.0, 0.5, 2.0]), "seed": torch.tensor([1, 2, 3, 4]),
     "bonus_token_ids": torch.tensor([[1], [2], [3], [4]])},
])
@pytest.mark.parametrize("form", ["counts", "cu"])
def test_plain_ragged_calls_go_straight_to_the_kernel_and_agree_with_the_reference(
        kwargs: dict, form: str, full_door_calls: list[str]) -> None:
    case = _ragged()
    if form == "cu":
        counts = case.pop("num_draft_tokens")
        case["cu_num_draft_tokens"] = torch.cat([torch.zeros(1, dtype=torch.int64),
                                                 counts.cumsum(0)])
    got = pv.verify_ragged(**case, **kwargs)
    assert full_door_calls == [], "a plain ragged call went through the full front door"
    want = pv.verify_ragged(**case, **kwargs, backend="numpy")
    for field in ("token_ids", "num_accepted", "num_emitted", "num_draft_tokens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: {**c, "num_draft_tokens": torch.tensor([2, 0, 3, 2])}, "accounts for 7 drafts"),
    (lambda c: {**c, "num_draft_tokens": torch.tensor([3, -1, 3, 1])}, "must be >= 0"),
    (lambda c: {**c, "max_num_draft_tokens": 2}, "smaller than the largest draft count"),
    (lambda c: {**c, "target_logits": c["target_logits"][:-1]}, "must have N\\+B"),
])
def test_a_bad_ragged_layout_is_worded_by_the_full_front_door(change: Callable[[dict], dict],
                                                             message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pv.verify_ragged(**change(_ragged()), seed=1)


def test_per_row_temperatures_take_no_whole_target_argmax(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """5aed259: any temperature array ran ``np.argmax`` over the whole target (1.4-1.5x the
    call), although only greedy rows read an argmax, and only of the rows they reach. The
    kernel now takes those itself."""
    from portable_verify.backends.numba import backend as numba_cpu

    calls: list[tuple[int, ...]] = []
    real = np.argmax

    def spy(a: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(np.shape(a))
        return real(a, *args, **kwargs)

    monkeypatch.setattr(numba_cpu.np, "argmax", spy)
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 3, 8192, generator=g)  # above the size numba once handed to numpy
    drafts = torch.randint(0, 8192, (4, 2), generator=g)
    for temps in ([0.5, 1.0, 0.7, 2.0], [0.0, 1.0, 0.7, 2.0]):
        got = pv.verify(drafts, target_logits=logits, temperature=torch.tensor(temps), seed=1)
        want = pv.verify(drafts, target_logits=logits, temperature=torch.tensor(temps), seed=1,
                         backend="numpy")
        assert torch.equal(got.token_ids, want.token_ids)
    assert [c for c in calls if len(c) == 2 and c[0] >= 12] == [], "a whole-target argmax ran"
