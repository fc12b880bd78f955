"""Temperatures at their edges, on every backend: probabilities (only 0 or 1 apply), tiny and
infinite values (the softmax's limit laws), and values invalid before any rounding.

Expectations come from docs/semantics.md and the limit laws, never from a backend's output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import random_logits

import portable_verify as pv

BACKENDS = pv.available_backends()
SAMPLED = ("rejection", "typical")

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_numpy", [False, True])
def test_temperature_tensor_with_target_probs_raises(backend: str, as_numpy: bool) -> None:
    probs = torch.softmax(random_logits(2, 2, 5), -1)
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
def test_zero_one_temperature_tensor_with_probs_allowed(backend: str) -> None:
    """The negative control: a tensor of 0s and 1s is the documented greedy/T=1 mix."""
    probs = torch.softmax(random_logits(2, 2, 5), -1)
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
    logits = 0.1 * random_logits(b, 1, v, seed=3)  # a 0.5 lead: far from one-hot at T = 1
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
def test_tiny_temperature_or_huge_logits_give_the_argmax(
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
def test_temperature_below_float32_is_greedy(backend: str) -> None:
    """1e-46 rounds to float32 0: the row is greedy (the limit law is the argmax too)."""
    logits, drafts, argmax = _peaked_case(8, 6, huge=False)
    wrong = drafts.clone()
    wrong[:, 0] = (drafts[:, 0] % 5) + 1  # a different finite token: greedy rejects it
    result = pv.verify(wrong, target_logits=logits, temperature=1e-46, seed=7, backend=backend)
    assert result.num_accepted.tolist() == [0] * 8
    assert result.token_ids[:, 0].tolist() == argmax[:, 0].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", SAMPLED)
def test_infinite_temperature_is_uniform_over_finiterandom_logits(
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
def test_infinite_temperature_is_refused_by_validation(backend: str) -> None:
    logits = random_logits(1, 0, 5)
    with pytest.raises(ValueError, match="temperature"):
        pv.verify(torch.zeros(1, 0, dtype=torch.int64), target_logits=logits,
                  temperature=float("inf"), seed=1, backend=backend)


# --- 3. typical options -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [-1e-50, np.float64(-1e-50),
                                         np.array([0.5, -1e-50, 1.0])])
def test_a_tiny_negative_temperature_is_refused(backend: str, temperature: object) -> None:
    """5aed259: rounded to float32 (``-0.0``) before its check, so taken as greedy."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 3, 16, generator=g)
    drafts = torch.randint(0, 16, (3, 2), generator=g)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        pv.verify(drafts, target_logits=logits, temperature=temperature, seed=1, backend=backend)
    flat_logits = logits.reshape(9, 16)[:8]
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        pv.verify_ragged(drafts.reshape(-1)[:5], num_draft_tokens=torch.tensor([2, 2, 1]),
                         target_logits=flat_logits, temperature=temperature, seed=1,
                         backend=backend)
