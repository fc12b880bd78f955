"""The ragged (flattened) entry point gives exactly the padded call's answers, on every backend.

Each randomised padded case is flattened the way vLLM v1 lays it out (drafts back to back,
each request's bonus row right after its draft rows) and both calls must agree bit for bit.
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.core import ragged
from portable_verify.core.types import VerifyInputs

# Slow or still-young backends get fewer random cases; every backend sees every variant.
_TRIALS = {"numpy": 30, "cpu": 30, "torch": 30}
_OTHER_TRIALS = 6
_BACKENDS = sorted(set(pv.available_backends()) | {"numpy", "cpu"})


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


def _case(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, dict, torch.Tensor]:
    b = int(torch.randint(0, 5, (1,), generator=g))
    k = int(torch.randint(0, 4, (1,), generator=g))
    v = int(torch.randint(1, 7, (1,), generator=g))
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    probs = torch.softmax(logits, -1)
    drafts = torch.randint(0, v, (b, k), generator=g)
    n = torch.randint(0, k + 1, (b,), generator=g)
    temp = torch.rand(b, generator=g) * 2 * (torch.rand(b, generator=g) > 0.3)  # some 0s
    dq = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    variants = {
        "logits+temperature": dict(target_logits=logits, temperature=temp),
        "probs": dict(target_probs=probs),
        "probs+draft_probs": dict(target_probs=probs, draft_probs=dq),
        "logits+draft_probs": dict(target_logits=logits, draft_probs=dq, temperature=temp),
    }
    u = torch.randint(1, 2**24 + 1, (b, k + 1), generator=g).float() * 2.0**-24
    return drafts, n, variants, u


def _ragged_kwargs(kw: dict, drafts: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, dict]:
    target_name = "target_logits" if "target_logits" in kw else "target_probs"
    flat, rows, fq = _flatten(drafts, n, kw[target_name], kw.get("draft_probs"))
    out = {key: value for key, value in kw.items() if key not in (target_name, "draft_probs")}
    out[target_name] = rows
    if fq is not None:
        out["draft_probs"] = fq
    return flat, out


def _skip_if_padded_call_fails(backend: str, method: str) -> None:
    """A backend that cannot run the padded call is the conformance suite's finding, not ours."""
    if backend in _TRIALS:
        return
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    try:
        pv.verify(torch.tensor([[1, 2], [3, 4]]), target_logits=logits, method=method, seed=0,
                  backend=backend)
    except Exception as exc:
        pytest.skip(f"backend {backend!r} fails the padded call too: {exc!r:.200}")


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_ragged_equals_padded(backend: str, method: str) -> None:
    _skip_if_padded_call_fails(backend, method)
    g = torch.Generator().manual_seed(7 + len(method))
    for trial in range(_TRIALS.get(backend, _OTHER_TRIALS)):
        drafts, n, variants, u = _case(g)
        b, k = drafts.shape
        seeds = torch.arange(b) * 31 + trial
        for label, kw in variants.items():
            flat, rkw = _ragged_kwargs(kw, drafts, n)
            for rng in (dict(seed=seeds, seed_offset=trial), dict(uniforms=u)):
                want = pv.verify(drafts, num_draft_tokens=n, method=method, backend="numpy",
                                 **rng, **kw)
                got = pv.verify_ragged(flat, num_draft_tokens=n, max_num_draft_tokens=k,
                                       method=method, backend=backend, **rng, **rkw)
                where = (trial, label, list(rng))
                assert torch.equal(got.token_ids, want.token_ids), where
                assert torch.equal(got.num_accepted, want.num_accepted), where
                assert torch.equal(got.num_draft_tokens, n), where


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_cu_offsets_and_inferred_width(backend: str) -> None:
    """Offsets give the counts' answers; without max_k the width is max(n)+1 (seeded numbers
    do not depend on the width)."""
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        drafts, n, variants, _ = _case(g)
        kw = variants["logits+draft_probs"]
        flat, rkw = _ragged_kwargs(kw, drafts, n)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
        seeds = torch.arange(drafts.shape[0]) + 100 * trial
        want = pv.verify(drafts, num_draft_tokens=n, seed=seeds, backend="numpy", **kw)
        got = pv.verify_ragged(flat, cu_num_draft_tokens=cu, seed=seeds, backend=backend, **rkw)
        width = int(n.max()) + 1 if n.numel() else 1
        assert got.token_ids.shape == (drafts.shape[0], width)
        assert torch.equal(got.token_ids, want.token_ids[:, :width]), trial
        assert torch.equal(got.num_accepted, want.num_accepted), trial


def test_int_seed_and_numpy_in_numpy_out() -> None:
    g = torch.Generator().manual_seed(11)
    drafts, n, variants, _ = _case(g)
    while drafts.shape[0] == 0:
        drafts, n, variants, _ = _case(g)
    kw = variants["probs+draft_probs"]
    flat, rkw = _ragged_kwargs(kw, drafts, n)
    want = pv.verify(drafts, num_draft_tokens=n, seed=5, **kw)
    got = pv.verify_ragged(flat.numpy(), num_draft_tokens=n.numpy(),
                           max_num_draft_tokens=drafts.shape[1], seed=5,
                           **{key: v.numpy() for key, v in rkw.items()})
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

    monkeypatch.setattr(dispatch, "select_backend", lambda name, device: Spy())
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


def test_docstring_example() -> None:
    outcome = doctest.testmod(ragged)
    assert outcome.attempted > 0 and outcome.failed == 0
