"""``-1`` drafts (no proposal) and the caller's ``bonus_token_ids``, on every backend, both
layouts (docs/semantics.md, "No proposal")."""

from __future__ import annotations

import pytest
import torch

import portable_verify as pv

B, K, V = 5, 3, 11


def _case(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=g) * 3
    drafts = torch.randint(0, V, (B, K), generator=g)
    drafts[:, 0] = logits[:, 0].argmax(-1)  # the first draft is often accepted
    return {"drafts": drafts, "logits": logits,
            "draft_probs": torch.softmax(torch.randn(B, K, V, generator=g), -1),
            "temperature": torch.tensor([0.0, 0.7, 1.0, 1.3, 0.0])}


def _ragged(drafts: torch.Tensor, target: torch.Tensor, counts: torch.Tensor):  # type: ignore
    """The padded case in the flat layout (each request's n drafts, then its bonus row)."""
    flat = torch.cat([drafts[i, : int(n)] for i, n in enumerate(counts)])
    rows = torch.cat([target[i, : int(n) + 1] for i, n in enumerate(counts)])
    return flat, rows


@pytest.fixture(params=pv.available_backends())
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
@pytest.mark.parametrize("with_q", [False, True])
def test_a_minus_one_draft_ends_the_drafts_there(backend: str, method: str,
                                                 with_q: bool) -> None:
    c = _case(1)
    cut = torch.tensor([0, 1, 2, 3, 1])  # where each row's first -1 stands (3: none)
    drafts = c["drafts"].clone()
    for i, j in enumerate(cut.tolist()):
        if j < K:
            drafts[i, j] = -1
            drafts[i, j + 1:] = torch.randint(-1, V, (K - j - 1,))  # never read
    kw = dict(target_logits=c["logits"], method=method, temperature=c["temperature"],
              seed=torch.arange(B), draft_probs=c["draft_probs"] if with_q else None,
              backend=backend)
    got = pv.verify(drafts, **kw)
    want = pv.verify(c["drafts"], num_draft_tokens=cut, **kw)
    assert torch.equal(got.token_ids, want.token_ids)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert got.num_draft_tokens.tolist() == cut.tolist()


def test_minus_one_in_the_ragged_layout(backend: str) -> None:
    c = _case(2)
    counts = torch.tensor([3, 0, 2, 3, 1])
    drafts = c["drafts"].clone()
    drafts[0, 1] = -1
    drafts[2, 0] = -1
    flat, rows = _ragged(drafts, c["logits"], counts)
    kw = dict(temperature=c["temperature"], seed=torch.arange(B), backend=backend)
    got = pv.verify_ragged(flat, num_draft_tokens=counts, target_logits=rows, **kw)
    want = pv.verify(drafts, target_logits=c["logits"], num_draft_tokens=counts, **kw)
    assert torch.equal(got.token_ids, want.token_ids)
    assert got.num_draft_tokens.tolist() == [1, 0, 0, 3, 1]


@pytest.mark.parametrize("layout", ["padded", "ragged"])
def test_bonus_tokens_replace_only_a_fully_accepted_rows_draw(backend: str, layout: str) -> None:
    c = _case(3)
    logits = c["logits"]
    drafts = logits[:, :K].argmax(-1)  # greedy rows accept everything
    drafts[1, 0] = -1  # cut: position 0 is not a bonus position
    counts = torch.tensor([3, 3, 2, 0, 1])
    bonus = torch.tensor([7, 8, 9, 10, 6])
    kw = dict(method="greedy", backend=backend)
    if layout == "padded":
        res = pv.verify(drafts, target_logits=logits, num_draft_tokens=counts,
                        bonus_token_ids=bonus, **kw)
        plain = pv.verify(drafts, target_logits=logits, num_draft_tokens=counts, **kw)
    else:
        flat, rows = _ragged(drafts, logits, counts)
        res = pv.verify_ragged(flat, num_draft_tokens=counts, target_logits=rows,
                               bonus_token_ids=bonus.unsqueeze(1), **kw)
        plain = pv.verify_ragged(flat, num_draft_tokens=counts, target_logits=rows, **kw)
    a = res.num_accepted
    assert a.tolist() == [3, 0, 2, 0, 1]
    last = res.token_ids.gather(1, a.unsqueeze(1)).squeeze(1)
    assert last.tolist() == [7, int(logits[1, 0].argmax()), 9, 10, 6]
    # everything else is what the call without bonus tokens emits
    keep = torch.arange(K + 1) != a.unsqueeze(1)
    assert torch.equal(res.token_ids[keep], plain.token_ids[keep])


def test_sampled_rows_take_the_bonus_only_when_all_accepted() -> None:
    c = _case(4)
    probs = torch.softmax(c["logits"], -1)
    drafts = c["drafts"]
    bonus = torch.full((B,), V - 1)
    kw = dict(target_probs=probs, seed=torch.arange(B), temperature=1.0)
    res = pv.verify(drafts, bonus_token_ids=bonus, **kw)
    plain = pv.verify(drafts, **kw)
    full = plain.num_accepted == K
    assert torch.equal(res.num_accepted, plain.num_accepted)
    last = res.token_ids.gather(1, res.num_accepted.unsqueeze(1)).squeeze(1)
    plain_last = plain.token_ids.gather(1, plain.num_accepted.unsqueeze(1)).squeeze(1)
    assert torch.equal(last, torch.where(full, bonus, plain_last))


def test_other_negative_ids_and_bad_bonus_tokens_are_named() -> None:
    c = _case(5)
    drafts = c["drafts"].clone()
    drafts[0, 1] = -2
    with pytest.raises(ValueError, match="draft_token_ids has ids outside"):
        pv.verify(drafts, target_logits=c["logits"], method="greedy")
    with pytest.raises(ValueError, match="bonus_token_ids has ids outside"):
        pv.verify(c["drafts"], target_logits=c["logits"], method="greedy",
                  bonus_token_ids=torch.full((B,), V))
    with pytest.raises(ValueError, match="bonus_token_ids has 2 entries"):
        pv.verify(c["drafts"], target_logits=c["logits"], bonus_token_ids=torch.zeros(2,
                  dtype=torch.int64))
    with pytest.raises(TypeError, match="bonus_token_ids must have an integer dtype"):
        pv.verify(c["drafts"], target_logits=c["logits"], bonus_token_ids=torch.zeros(B))
