"""The torch backends agree exactly with the numpy reference on randomised small cases.

The conformance kit (tests/test_conformance.py) goes much further; this file is the fast
smoke check engineers run while changing a backend.
"""

from __future__ import annotations

import pytest
import torch

import portable_verify as pv


def _case(g: torch.Generator) -> tuple[dict, torch.Tensor, torch.Tensor]:
    b = int(torch.randint(0, 6, (1,), generator=g))
    k = int(torch.randint(0, 4, (1,), generator=g))
    v = int(torch.randint(1, 8, (1,), generator=g))
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    drafts = torch.randint(0, v, (b, k), generator=g)
    n = torch.randint(0, k + 1, (b,), generator=g)
    temp = torch.rand(b, generator=g) * 2 * (torch.rand(b, generator=g) > 0.3)
    dq = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    probs = torch.softmax(logits, -1)
    variants = {
        "logits+temperature": dict(target_logits=logits, temperature=temp),
        "probs": dict(target_probs=probs),
        "probs+draft_probs": dict(target_probs=probs, draft_probs=dq),
        "logits+draft_probs": dict(target_logits=logits, draft_probs=dq, temperature=temp),
    }
    return variants, drafts, n


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_matches_reference_on_random_cases(backend: str, method: str) -> None:
    g = torch.Generator().manual_seed(1234)
    for trial in range(60):
        variants, drafts, n = _case(g)
        seeds = torch.arange(drafts.shape[0]) + 1000 * trial
        for label, kw in variants.items():
            want = pv.verify(drafts, num_draft_tokens=n, method=method, seed=seeds,
                             backend="numpy", **kw)
            got = pv.verify(drafts, num_draft_tokens=n, method=method, seed=seeds,
                            backend=backend, **kw)
            assert torch.equal(want.token_ids, got.token_ids), (trial, label)
            assert torch.equal(want.num_accepted, got.num_accepted), (trial, label)


def test_numpy_in_numpy_out() -> None:
    logits = torch.randn(3, 3, 5)
    drafts = torch.randint(0, 5, (3, 2))
    res = pv.verify(drafts.numpy(), target_logits=logits.numpy(), method="greedy")
    assert type(res.token_ids).__module__ == "numpy"
    assert res.token_ids.tolist() == pv.verify(drafts, target_logits=logits,
                                               method="greedy").token_ids.tolist()
