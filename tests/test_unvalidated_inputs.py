"""``validate=False`` with garbage, on every backend: never a crash (child processes), never a
poisoned later call, the output contract kept, out-of-vocabulary drafts never accepted.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import contract_problem, random_logits

import portable_verify as pv
from portable_verify.testing.isolation import run_isolated

BACKENDS = pv.available_backends()
HERE = str(Path(__file__).resolve())
SAMPLED = ("rejection", "typical")

def _garbage_calls(v: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """Malformed calls a caller may send with validate=False (the contract: any exception or a
    result with the documented shapes and in-range ids; never a crash or a poisoned process)."""
    g = torch.Generator().manual_seed(9)
    flat = torch.randn(6, v, generator=g)
    drafts3 = torch.tensor([1, 2, 3])
    counts = torch.tensor([2, 1])
    logits = torch.randn(2, 3, v, generator=g)
    probs = torch.softmax(logits, -1)
    padded = torch.tensor([[1, 2], [3, 4]])
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ragged: too few target rows", dict(
            ragged=True, draft_token_ids=drafts3, num_draft_tokens=counts,
            target_logits=flat[:3])),
        ("ragged: max_num_draft_tokens=0 below the real maximum", dict(
            ragged=True, draft_token_ids=drafts3, num_draft_tokens=counts,
            target_logits=flat[:5], max_num_draft_tokens=0)),
        ("ragged: max_num_draft_tokens=1 below the real maximum", dict(
            ragged=True, draft_token_ids=drafts3, num_draft_tokens=counts,
            target_logits=flat[:5], max_num_draft_tokens=1)),
        ("ragged: counts summing past N", dict(
            ragged=True, draft_token_ids=drafts3, num_draft_tokens=torch.tensor([5, 7]),
            target_logits=flat[:5])),
        ("ragged: negative count", dict(
            ragged=True, draft_token_ids=drafts3, num_draft_tokens=torch.tensor([-1, 4]),
            target_logits=flat[:5])),
        ("ragged: no target rows at all", dict(
            ragged=True, draft_token_ids=torch.zeros(0, dtype=torch.int64),
            num_draft_tokens=torch.tensor([0]), target_logits=flat[:0])),
        ("padded: n > K", dict(draft_token_ids=padded, target_logits=logits,
                               num_draft_tokens=torch.tensor([5, 2]))),
        ("padded: n < 0", dict(draft_token_ids=padded, target_logits=logits,
                               num_draft_tokens=torch.tensor([-3, 1]))),
        ("padded: num_draft_tokens of length 1", dict(
            draft_token_ids=padded, target_logits=logits, num_draft_tokens=torch.tensor([2]))),
        ("padded: ids outside [0, V)", dict(draft_token_ids=torch.tensor([[7, -3], [-1, 9]]),
                                            target_logits=logits)),
        ("padded: ids outside [0, V), probs", dict(
            draft_token_ids=torch.tensor([[7, -3], [-1, 9]]), target_probs=probs,
            draft_probs=probs[:, :2])),
        ("padded: NaN and +inf logits", dict(
            draft_token_ids=padded,
            target_logits=logits.index_put((torch.tensor([0]),), torch.tensor(float("nan")))
            .index_put((torch.tensor([1]), torch.tensor([0])), torch.tensor(float("inf"))))),
        ("padded: negative probabilities", dict(draft_token_ids=padded, target_probs=-probs)),
        ("padded: uniforms of the wrong shape", dict(
            draft_token_ids=padded, target_logits=logits, uniforms=torch.full((2, 2), 0.5))),
        ("padded: uniforms outside (0, 1]", dict(
            draft_token_ids=padded, target_logits=logits,
            uniforms=torch.tensor([[0.0, -1.0, 2.0], [float("nan"), 1.0, 0.0]]))),
        ("padded: temperature of length 1", dict(
            draft_token_ids=padded, target_logits=logits, temperature=torch.tensor([0.5]))),
        ("padded: NaN and negative temperatures", dict(
            draft_token_ids=padded, target_logits=logits,
            temperature=torch.tensor([float("nan"), -2.0]))),
    ]
    return calls


def _call(kwargs: dict[str, Any], backend: str, method: str) -> Any:
    kwargs = dict(kwargs)
    ragged = kwargs.pop("ragged", False)
    fn = pv.verify_ragged if ragged else pv.verify
    return fn(**kwargs, method=method, seed=5, validate=False, backend=backend)


def _valid_result(backend: str, method: str, ragged: bool) -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    flat = torch.randn(5, 5, generator=g)
    logits = torch.randn(2, 3, 5, generator=g)
    if ragged:
        r = pv.verify_ragged(torch.tensor([1, 2, 3]), num_draft_tokens=torch.tensor([2, 1]),
                             target_logits=flat, method=method, seed=1, backend=backend)
    else:
        r = pv.verify(torch.tensor([[1, 2], [3, 4]]), target_logits=logits, method=method,
                      seed=1, backend=backend)
    return r.token_ids.tolist()


def _valid_results(backend: str) -> list[list[list[int]]]:
    return [_valid_result(backend, m, r) for m in ("greedy", *SAMPLED) for r in (True, False)]


def child_garbage_then_valid(backend: str) -> list[str]:
    """In a child process: every garbage call, each followed by valid calls that must give the
    answers they gave before any garbage. Returns the problems found."""
    before = _valid_results(backend)
    problems = []
    for label, kwargs in _garbage_calls():
        for method in ("greedy", *SAMPLED):
            # The same method and layout just before: a backend may keep per-shape state.
            _valid_result(backend, method, kwargs.get("ragged", False))
            with contextlib.suppress(Exception):  # it may raise; not crash, hang or poison
                _call(kwargs, backend, method)
            if _valid_results(backend) != before:
                problems.append(f"{label} [{method}] changed the results of later valid calls")
    return problems


def child_garbage_results(backend: str) -> list[str]:
    """In a child process: every garbage call either raises or keeps the output contract."""
    problems = []
    for label, kwargs in _garbage_calls():
        ragged = kwargs.get("ragged", False)
        for method in ("greedy", *SAMPLED):
            try:
                result = _call(kwargs, backend, method)
            except Exception:
                continue
            b = int(torch.as_tensor(result.num_accepted).shape[0])
            k = int(torch.as_tensor(result.token_ids).shape[1]) - 1
            expected_k = (kwargs.get("max_num_draft_tokens", k) if ragged
                          else kwargs["draft_token_ids"].shape[1])
            problem = contract_problem(result, b, expected_k, 5)
            if problem:
                problems.append(f"{label} [{method}]: {problem}")
    return problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_failed_unvalidated_call_does_not_poison_later_calls(backend: str) -> None:
    outcome = run_isolated(f"{HERE}:child_garbage_then_valid", backend, timeout=900)
    assert outcome.ok, f"the child process died: {outcome.describe()}"
    assert outcome.value == [], outcome.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_unvalidated_garbage_never_crashes_and_keeps_the_contract(backend: str) -> None:
    outcome = run_isolated(f"{HERE}:child_garbage_results", backend, timeout=900)
    assert outcome.ok, f"the child process died: {outcome.describe()}"
    assert outcome.value == [], outcome.value


# --- 8. seeds and offsets outside int64 -------------------------------------------------------



@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["greedy", *SAMPLED])
@pytest.mark.parametrize("with_q", [False, True])
def test_out_of_vocabulary_drafts_are_never_accepted(
    backend: str, method: str, with_q: bool
) -> None:
    """docs/semantics.md: with validate=False an id outside [0, V) is a token of probability 0,
    so it is rejected and every emitted id stays in [0, V) (also for vLLM's strict_mode=False)."""
    logits = random_logits(4, 2, 5, seed=6)
    logits[..., 0] = float("-inf")  # a token of probability 0 the draw must never pick
    logits[:, 0, 4] = 10.0  # clamping an id >= V to V - 1 = 4 would (wrongly) accept it
    q = torch.softmax(random_logits(4, 1, 5, seed=8), -1) if with_q else None
    drafts = torch.tensor([[7, 1], [-3, 2], [5, 5], [2**40, 3]])
    result = pv.verify(drafts, target_logits=logits, draft_probs=q, method=method, seed=4,
                       validate=False, backend=backend)
    assert result.num_accepted.tolist() == [0, 0, 0, 0]
    first = result.token_ids[:, 0]
    assert ((first >= 1) & (first < 5)).all(), result.token_ids.tolist()


# --- 7. the long run, and the machinery behind 5/6: isolation and fuzzing ---------------------



@pytest.mark.parametrize("backend", BACKENDS)
def test_counts_that_claim_rows_the_target_lacks_raise_before_any_read(backend: str) -> None:
    """Found by the kit's fuzzing on an H200: a ragged call of no drafts whose counts say one
    request, with an empty target and ``validate=False``. A backend behind dispatch must refuse
    it from the shapes alone (a ValueError naming the target) before reading a row: on a GPU
    the out-of-range read is a device-side assert that ends the process, where the CPU raised
    an IndexError from deep inside (the negative control, dispatch's shape check bypassed), and
    numba's host kernel read a row before the empty target (a token that changed run to run)."""
    call = dict(num_draft_tokens=torch.tensor([1]), target_probs=torch.zeros(0, 21),
                method="rejection", validate=False, seed=1, backend=backend)
    with pytest.raises(ValueError, match="the target has no rows"):
        pv.verify_ragged(torch.zeros(0, dtype=torch.int64), **call)
    if backend != "torch:cpu":
        return
    from portable_verify.core.types import VerifyInputs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VerifyInputs, "check_layout", lambda self: None)
        with pytest.raises(IndexError):
            pv.verify_ragged(torch.zeros(0, dtype=torch.int64), **call)
