"""Regression tests for adversarial inputs found by trying the public API, on every backend.

Each ``test_itemN_*`` pins one finding: silent wrong answers (temperature ignored or overflowing,
unvalidated options), crashes and poisoning under ``validate=False`` (run in a child process, so
a segfault fails the test instead of ending the run), unclear errors and aliasing. Expectations
come from docs/semantics.md and from the limit laws of the softmax, never from a backend's
output. The Triton interpreter gets the same cases: they are small.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.backends.base import Availability, Backend
from portable_verify.testing.isolation import run_isolated

BACKENDS = pv.available_backends()
HERE = str(Path(__file__).resolve())
SAMPLED = ("rejection", "typical")


def _ids_problem(result: Any, b: int, k: int, v: int) -> str | None:
    """What breaks the output contract (shapes, counts, ids in [0, V) then -1), or None."""
    tokens = np.asarray(torch.as_tensor(result.token_ids).cpu())
    accepted = np.asarray(torch.as_tensor(result.num_accepted).cpu())
    emitted = np.asarray(torch.as_tensor(result.num_emitted).cpu())
    if tokens.shape != (b, k + 1) or accepted.shape != (b,):
        return f"shapes {tokens.shape}, {accepted.shape}, expected {(b, k + 1)}, {(b,)}"
    if ((accepted < 0) | (accepted > k)).any():
        return f"num_accepted {accepted.tolist()} outside [0, K={k}]"
    if not (emitted == accepted + 1).all():
        return f"num_emitted {emitted.tolist()} != num_accepted + 1"
    for row, a in zip(tokens, accepted, strict=True):
        head, tail = row[: a + 1], row[a + 1:]
        if ((head < 0) | (head >= v)).any() or (tail != -1).any():
            return f"row {row.tolist()} (a={a}) has ids outside [0, {v}) or bad padding"
    return None


def _logits(b: int, k: int, v: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, k + 1, v, generator=torch.Generator().manual_seed(seed))


# --- 1. temperature tensors with target_probs -------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_numpy", [False, True])
def test_item1_temperature_tensor_with_target_probs_raises(backend: str, as_numpy: bool) -> None:
    probs = torch.softmax(_logits(2, 2, 5), -1)
    temperature = torch.tensor([0.5, 1.0])
    t_arg = temperature.numpy() if as_numpy else temperature
    with pytest.raises(ValueError, match="temperature"):
        pv.verify(torch.tensor([[1, 2], [0, 4]]), target_probs=probs, temperature=t_arg,
                  seed=1, backend=backend)
    with pytest.raises(ValueError, match="temperature"):
        pv.verify_ragged(torch.tensor([1, 2, 0]), num_draft_tokens=torch.tensor([2, 1]),
                         target_probs=probs.reshape(-1, 5)[:5], temperature=t_arg, seed=1,
                         backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_item1_zero_one_temperature_tensor_with_probs_allowed(backend: str) -> None:
    """The negative control: a tensor of 0s and 1s is the documented greedy/T=1 mix."""
    probs = torch.softmax(_logits(2, 2, 5), -1)
    drafts = torch.tensor([[1, 2], [0, 4]])
    mixed = pv.verify(drafts, target_probs=probs, temperature=torch.tensor([1.0, 0.0]), seed=1,
                      backend=backend)
    greedy = pv.verify(drafts, target_probs=probs, method="greedy", backend=backend)
    assert mixed.token_ids[1].tolist() == greedy.token_ids[1].tolist()


# --- 2. extreme temperatures and logits ---------------------------------------------------------


def _peaked_case(b: int, v: int, huge: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[b, 2, v]`` logits with token 0 at -inf and one distinct maximum per row; the draft is
    row 0's argmax. ``huge``: the maximum is 3e38 and the runner-up 2.9e38, so ``logits / T``
    overflows float32 for T < 1 while ``(logits - max) / T`` does not."""
    logits = 0.1 * _logits(b, 1, v, seed=3)  # a 0.5 lead: far from one-hot at T = 1
    logits[..., 0] = float("-inf")
    top = 1 + torch.stack([torch.randperm(v - 1, generator=torch.Generator().manual_seed(i))
                           for i in range(2 * b)]).reshape(b, 2, v - 1)
    if huge:
        logits.scatter_(2, top[..., :1], 3e38)
        logits.scatter_(2, top[..., 1:2], 2.9e38)
        logits.scatter_(2, top[..., 2:3], -3e38)
    else:
        logits.scatter_(2, top[..., :1], 0.5)
    return logits, top[:, 0, :1], top[:, :, 0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("temperature", "huge"), [(1e-40, False), (0.5, True), (1e-30, True)])
@pytest.mark.parametrize("method", SAMPLED)
def test_item2_tiny_temperature_or_huge_logits_give_the_argmax(
    backend: str, temperature: float, huge: bool, method: str
) -> None:
    """As T -> 0 (or when the runner-up is 1e37 below the max) softmax is one-hot at the
    argmax: the argmax draft is accepted and the bonus is the next argmax, for every seed."""
    logits, drafts, argmax = _peaked_case(8, 6, huge)
    result = pv.verify(drafts, target_logits=logits, temperature=temperature, method=method,
                       seed=7, backend=backend)
    assert result.num_accepted.tolist() == [1] * 8
    assert result.token_ids.tolist() == argmax.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_item2_temperature_below_float32_is_greedy(backend: str) -> None:
    """1e-46 rounds to float32 0: the row is greedy (the limit law is the argmax too)."""
    logits, drafts, argmax = _peaked_case(8, 6, huge=False)
    wrong = drafts.clone()
    wrong[:, 0] = (drafts[:, 0] % 5) + 1  # a different finite token: greedy rejects it
    result = pv.verify(wrong, target_logits=logits, temperature=1e-46, seed=7, backend=backend)
    assert result.num_accepted.tolist() == [0] * 8
    assert result.token_ids[:, 0].tolist() == argmax[:, 0].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", SAMPLED)
def test_item2_infinite_temperature_is_uniform_over_finite_logits(
    backend: str, method: str
) -> None:
    """Unvalidated T = +inf acts as the limit law, uniform over the tokens with finite logits:
    token 0 (logit -inf) is never emitted and the other 4 all appear (a uniform law misses one
    of 4 tokens in 48 draws with probability 4 * 0.75**48 < 1e-5)."""
    b, v = 48, 5
    logits = torch.randn(b, 1, v, generator=torch.Generator().manual_seed(5))
    logits[..., 0] = float("-inf")
    result = pv.verify(torch.zeros(b, 0, dtype=torch.int64), target_logits=logits,
                       temperature=float("inf"), method=method, seed=11, validate=False,
                       backend=backend)
    first = set(result.token_ids[:, 0].tolist())
    assert first == {1, 2, 3, 4}


@pytest.mark.parametrize("backend", BACKENDS)
def test_item2_infinite_temperature_is_refused_by_validation(backend: str) -> None:
    logits = _logits(1, 0, 5)
    with pytest.raises(ValueError, match="temperature"):
        pv.verify(torch.zeros(1, 0, dtype=torch.int64), target_logits=logits,
                  temperature=float("inf"), seed=1, backend=backend)


# --- 3. typical options -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", ["typical_eps", "typical_alpha"])
@pytest.mark.parametrize(("value", "error"), [(-0.1, ValueError), (float("nan"), ValueError),
                                              (None, TypeError), ("0.1", TypeError)])
def test_item3_typical_options_are_validated(
    backend: str, option: str, value: Any, error: type[Exception]
) -> None:
    probs = torch.softmax(_logits(2, 2, 5), -1)
    with pytest.raises(error, match=option):
        pv.verify(torch.tensor([[1, 2], [0, 4]]), target_probs=probs, method="typical",
                  seed=1, backend=backend, **{option: value})


# --- 4. inputs that carry gradients -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["auto", "typical", "greedy"])
def test_item4_inputs_that_require_grad(backend: str, method: str) -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 3, 6, generator=g)
    q = torch.softmax(torch.randn(3, 2, 6, generator=g), -1)
    temps = torch.tensor([0.7, 0.0, 1.3])
    drafts = torch.tensor([[1, 2], [0, 4], [5, 5]])
    plain = pv.verify(drafts, target_logits=logits, draft_probs=q, temperature=temps,
                      method=method, seed=3, backend=backend)
    grads = [t.clone().requires_grad_(True) for t in (logits, q, temps)]
    result = pv.verify(drafts, target_logits=grads[0], draft_probs=grads[1],
                       temperature=grads[2], method=method, seed=3, backend=backend)
    assert result.token_ids.tolist() == plain.token_ids.tolist()
    assert not result.token_ids.requires_grad and not result.num_accepted.requires_grad
    assert all(t.grad is None for t in grads)


# --- 5 and 6. unvalidated garbage: no crash, no poisoning -------------------------------------


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
            problem = _ids_problem(result, b, expected_k, 5)
            if problem:
                problems.append(f"{label} [{method}]: {problem}")
    return problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_item5_failed_unvalidated_call_does_not_poison_later_calls(backend: str) -> None:
    outcome = run_isolated(f"{HERE}:child_garbage_then_valid", backend, timeout=900)
    assert outcome.ok, f"the child process died: {outcome.describe()}"
    assert outcome.value == [], outcome.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_item6_unvalidated_garbage_never_crashes_and_keeps_the_contract(backend: str) -> None:
    outcome = run_isolated(f"{HERE}:child_garbage_results", backend, timeout=900)
    assert outcome.ok, f"the child process died: {outcome.describe()}"
    assert outcome.value == [], outcome.value


# --- 8. seeds and offsets outside int64 -------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("argument", "value"), [
    ("seed", 2**64 + 5), ("seed", 2**63), ("seed", -(2**63) - 1),
    ("seed_offset", 2**63), ("seed_offset", -(2**63) - 1),
])
def test_item8_seeds_outside_int64_raise(backend: str, argument: str, value: int) -> None:
    call = {"seed": 1, argument: value}
    with pytest.raises(ValueError, match=argument):
        pv.verify(torch.tensor([[1, 2]]), target_logits=_logits(1, 2, 5), **call,
                  backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_item8_int64_bounds_are_accepted(backend: str) -> None:
    """The negative control: the extreme int64 values themselves are valid seeds/offsets."""
    for seed, offset in [(2**63 - 1, -(2**63)), (-(2**63), 2**63 - 1)]:
        result = pv.verify(torch.tensor([[1, 2]]), target_logits=_logits(1, 2, 5), seed=seed,
                           seed_offset=offset, backend=backend)
        assert _ids_problem(result, 1, 2, 5) is None


# --- 9. argument types: backend, numpy layouts and dtypes, meta tensors -------------------------


@pytest.mark.parametrize("value", [None, 3])
def test_item9_backend_argument_must_be_a_name(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="backend"):
        pv.verify(torch.tensor([[1, 2]]), target_logits=_logits(1, 2, 5), backend=value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_item9_negative_strides_and_big_endian_arrays_work(backend: str) -> None:
    logits = _logits(3, 2, 5).numpy()
    drafts = np.array([[1, 2], [0, 4], [3, 3]])
    expected = pv.verify(drafts[::-1].copy(), target_logits=logits[::-1].copy(), seed=2,
                         backend=backend)
    flipped = pv.verify(drafts[::-1], target_logits=logits[::-1], seed=2, backend=backend)
    swapped = pv.verify(drafts[::-1].astype(">i8"), target_logits=logits[::-1].astype(">f4"),
                        seed=2, backend=backend)
    assert flipped.token_ids.tolist() == expected.token_ids.tolist()
    assert swapped.token_ids.tolist() == expected.token_ids.tolist()
    # A negative stride on a length-1 axis: numpy calls such an array contiguous already.
    one = pv.verify(drafts[:1][::-1], target_logits=logits[:1][::-1], seed=2, backend=backend)
    assert one.token_ids.tolist() == pv.verify(drafts[:1], target_logits=logits[:1], seed=2,
                                               backend=backend).token_ids.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_item9_object_arrays_and_meta_tensors_name_the_argument(backend: str) -> None:
    logits = _logits(1, 2, 5)
    with pytest.raises(TypeError, match="draft_token_ids"):
        pv.verify(np.array([[1, 2]], dtype=object), target_logits=logits.numpy(),
                  backend=backend)
    with pytest.raises(TypeError, match="target_logits"):
        pv.verify(np.array([[1, 2]]), target_logits=logits.numpy().astype(object),
                  backend=backend)
    with pytest.raises(ValueError, match="meta"):
        pv.verify(torch.tensor([[1, 2]], device="meta"), target_logits=logits.to("meta"),
                  backend=backend)
    with pytest.raises(ValueError, match="target_logits"):
        pv.verify(torch.tensor([[1, 2]]), target_logits=logits.to("meta"), backend=backend)


# --- 10. results never alias inputs ---------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_item10_results_do_not_alias_inputs(backend: str) -> None:
    logits = _logits(2, 2, 5)
    drafts = torch.tensor([[1, 2], [0, 4]])
    counts = torch.tensor([2, 1])
    res = pv.verify(drafts, target_logits=logits, num_draft_tokens=counts, seed=1,
                    backend=backend)
    res.num_draft_tokens[0] = 99
    assert counts.tolist() == [2, 1]
    ragged = pv.verify_ragged(torch.tensor([1, 2, 0]), num_draft_tokens=counts,
                              target_logits=logits.reshape(-1, 5)[:5], seed=1, backend=backend)
    ragged.num_draft_tokens[1] = 99
    assert counts.tolist() == [2, 1]
    np_counts = counts.numpy().copy()
    np_res = pv.verify(drafts.numpy(), target_logits=logits.numpy(), num_draft_tokens=np_counts,
                       seed=1, backend=backend)
    np_res.num_draft_tokens[0] = 99
    assert np_counts.tolist() == [2, 1]


# --- Also: out-of-vocabulary drafts under validate=False --------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["greedy", *SAMPLED])
@pytest.mark.parametrize("with_q", [False, True])
def test_also_out_of_vocabulary_drafts_are_never_accepted(
    backend: str, method: str, with_q: bool
) -> None:
    """docs/semantics.md: with validate=False an id outside [0, V) is a token of probability 0,
    so it is rejected and every emitted id stays in [0, V) (also for vLLM's strict_mode=False)."""
    logits = _logits(4, 2, 5, seed=6)
    logits[..., 0] = float("-inf")  # a token of probability 0 the draw must never pick
    logits[:, 0, 4] = 10.0  # clamping an id >= V to V - 1 = 4 would (wrongly) accept it
    q = torch.softmax(_logits(4, 1, 5, seed=8), -1) if with_q else None
    drafts = torch.tensor([[7, 1], [-3, 2], [5, 5], [2**40, 3]])
    result = pv.verify(drafts, target_logits=logits, draft_probs=q, method=method, seed=4,
                       validate=False, backend=backend)
    assert result.num_accepted.tolist() == [0, 0, 0, 0]
    first = result.token_ids[:, 0]
    assert ((first >= 1) & (first < 5)).all(), result.token_ids.tolist()


# --- 7. the long run, and the machinery behind 5/6: isolation and fuzzing ---------------------


def _openvino() -> str | None:
    return next((b for b in BACKENDS if b.split(":")[0] == "openvino"), None)


@pytest.mark.slow
@pytest.mark.skipif(_openvino() is None, reason="openvino is not available")
def test_item7_mixed_method_long_run_on_openvino() -> None:
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
    bug = ""

    def availability(self) -> Availability:
        return Availability(True, "test double")

    def run(self, inputs: Any) -> tuple[Any, Any]:
        from portable_verify.backends.numpy_ref import verify_reference
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
