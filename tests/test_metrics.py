"""Causal acceptance metrics: hand-worked values, causality, device tensors, accumulation."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.core import metrics
from portable_verify.core.types import VerifyResult


def _result(accepted: list[int], drafted: list[int], k: int) -> VerifyResult:
    a = torch.tensor(accepted, dtype=torch.int64)
    n = torch.tensor(drafted, dtype=torch.int64)
    return VerifyResult(torch.full((len(accepted), k + 1), -1), a, a + 1, n)


def test_hand_worked_example() -> None:
    # n = [3, 0, 2, 3], a = [1, 0, 2, 3]: worked out by hand.
    m = pv.metrics_to_python(pv.compute_metrics(_result([1, 0, 2, 3], [3, 0, 2, 3], k=3)))
    assert m["num_requests"] == 4
    assert m["num_drafts"] == 3  # the request with n = 0 is not a draft
    assert m["num_draft_tokens"] == 8
    assert m["num_accepted_tokens"] == 6
    assert m["num_emitted_tokens"] == 10  # 2 + 1 + 3 + 4
    assert m["num_accepted_per_position"] == [3, 2, 1]
    assert m["acceptance_rate"] == pytest.approx(6 / 8)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 6 / 3)
    assert m["system_efficiency"] == pytest.approx(9 / 11)  # (2 + 3 + 4) / (4 + 3 + 4)


def test_system_efficiency_is_vllm_v0_definition_for_uniform_k() -> None:
    # vLLM v0: emitted / (num_seqs * (k + 1)) with every sequence at k drafts.
    k, accepted = 4, [0, 4, 2, 1, 4]
    m = pv.metrics_to_python(pv.compute_metrics(_result(accepted, [k] * 5, k)))
    assert m["system_efficiency"] == pytest.approx(sum(a + 1 for a in accepted) / (5 * (k + 1)))


def test_accept_after_rejection_is_never_counted() -> None:
    # Greedy: the draft at position 1 matches the target, but position 0 was already rejected.
    logits = torch.tensor([[[0.0, 5.0], [0.0, 5.0], [5.0, 0.0]]])
    res = pv.verify(torch.tensor([[0, 1]]), target_logits=logits, method="greedy")
    m = pv.metrics_to_python(res.metrics())
    assert m["num_accepted_tokens"] == 0
    assert m["num_accepted_per_position"] == [0, 0]
    assert m["num_emitted_tokens"] == 1


def test_values_stay_on_device_as_tensors_and_numpy_gives_numpy() -> None:
    m = pv.compute_metrics(_result([1, 2], [2, 2], k=2))
    assert all(isinstance(v, torch.Tensor) for v in m.values())
    assert m["num_accepted_per_position"].shape == (2,)
    assert m["acceptance_rate"].dtype == torch.float32
    res = pv.verify(np.array([[1]]), target_logits=np.zeros((1, 2, 3), np.float32))
    assert all(isinstance(v, np.ndarray) for v in res.metrics().values())
    assert pv.metrics_to_python(res.metrics())["num_draft_tokens"] == 1


def test_empty_call_gives_nan_ratios() -> None:
    m = pv.metrics_to_python(pv.compute_metrics(_result([], [], k=2)))
    assert m["num_requests"] == 0 and m["num_accepted_per_position"] == [0, 0]
    assert all(math.isnan(m[key]) for key in ("acceptance_rate", "mean_acceptance_length",
                                               "system_efficiency"))
    t = pv.compute_metrics(_result([0], [0], k=0))  # drafts-free call: tensors, NaN, no error
    assert torch.isnan(t["acceptance_rate"]) and torch.isnan(t["system_efficiency"])


def test_metrics_agree_with_a_per_request_count_on_real_calls() -> None:
    g = torch.Generator().manual_seed(5)
    for _ in range(10):
        b, k, v = 6, 4, 5
        logits = torch.randn(b, k + 1, v, generator=g)
        drafts = torch.randint(0, v, (b, k), generator=g)
        n = torch.randint(0, k + 1, (b,), generator=g)
        res = pv.verify(drafts, target_logits=logits, num_draft_tokens=n, seed=1)
        m = pv.metrics_to_python(res.metrics())
        # Independent count from the emitted tokens: accepted = leading drafts kept.
        tokens, drafted = res.token_ids.tolist(), n.tolist()
        accepted = []
        for i in range(b):
            a = 0
            while a < drafted[i] and tokens[i][a] == drafts[i, a] and tokens[i][a + 1] != -1:
                a += 1
            accepted.append(a)
        assert m["num_accepted_tokens"] == sum(accepted)
        assert m["num_accepted_per_position"] == [sum(a > j for a in accepted) for j in range(k)]
        assert m["num_emitted_tokens"] == sum(t != -1 for row in tokens for t in row)


def test_accumulator_sums_calls_of_different_widths() -> None:
    acc = pv.MetricsAccumulator()
    assert acc.summary()["num_calls"] == 0 and math.isnan(acc.summary()["acceptance_rate"])
    calls = [_result([1, 0], [2, 1], k=2), _result([3], [3], k=3), _result([0], [0], k=0)]
    for res in calls:
        acc.update(res)
    acc.update(pv.compute_metrics(_result([1], [1], k=1)))  # a metrics dict is accepted too
    s = acc.summary()
    assert s["num_calls"] == 4
    assert s["num_requests"] == 5
    assert s["num_drafts"] == 4
    assert s["num_draft_tokens"] == 7
    assert s["num_accepted_tokens"] == 5
    assert s["num_accepted_per_position"] == [3, 1, 1]  # [1,0]+[1,1,1]+[]+[1]
    assert s["acceptance_rate"] == pytest.approx(5 / 7)
    assert isinstance(acc.totals()["num_accepted_tokens"], torch.Tensor)
    acc.reset()
    assert acc.summary()["num_requests"] == 0


def test_docstring_example() -> None:
    outcome = doctest.testmod(metrics)
    assert outcome.attempted > 0 and outcome.failed == 0
