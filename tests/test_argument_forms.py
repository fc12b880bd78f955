"""Argument forms on every backend: options that must be checked, tensors that carry gradients or
lazy bits, seeds at the int64 bounds, strided, big-endian, object and meta arrays, results that
must not alias the inputs, and ragged layouts too large or inconsistent to index.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from helpers import contract_problem, random_logits

import portable_verify as pv

BACKENDS = pv.available_backends()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", ["typical_eps", "typical_alpha"])
@pytest.mark.parametrize(("value", "error"), [(-0.1, ValueError), (float("nan"), ValueError),
                                              (None, TypeError), ("0.1", TypeError)])
def test_typical_options_are_validated(
    backend: str, option: str, value: Any, error: type[Exception]
) -> None:
    probs = torch.softmax(random_logits(2, 2, 5), -1)
    with pytest.raises(error, match=option):
        pv.verify(torch.tensor([[1, 2], [0, 4]]), target_probs=probs, method="typical",
                  seed=1, backend=backend, **{option: value})


# --- 4. inputs that carry gradients -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["auto", "typical", "greedy"])
def test_inputs_that_require_grad(backend: str, method: str) -> None:
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



@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("argument", "value"), [
    ("seed", 2**64 + 5), ("seed", 2**63), ("seed", -(2**63) - 1),
    ("seed_offset", 2**63), ("seed_offset", -(2**63) - 1),
])
def test_seeds_outside_int64_raise(backend: str, argument: str, value: int) -> None:
    call = {"seed": 1, argument: value}
    with pytest.raises(ValueError, match=argument):
        pv.verify(torch.tensor([[1, 2]]), target_logits=random_logits(1, 2, 5), **call,
                  backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_bounds_are_accepted(backend: str) -> None:
    """The negative control: the extreme int64 values themselves are valid seeds/offsets."""
    for seed, offset in [(2**63 - 1, -(2**63)), (-(2**63), 2**63 - 1)]:
        result = pv.verify(torch.tensor([[1, 2]]), target_logits=random_logits(1, 2, 5), seed=seed,
                           seed_offset=offset, backend=backend)
        assert contract_problem(result, 1, 2, 5) is None


# --- 9. argument types: backend, numpy layouts and dtypes, meta tensors -------------------------


@pytest.mark.parametrize("value", [None, 3])
def test_backend_argument_must_be_a_name(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="backend"):
        pv.verify(torch.tensor([[1, 2]]), target_logits=random_logits(1, 2, 5), backend=value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_strides_and_big_endian_arrays_work(backend: str) -> None:
    logits = random_logits(3, 2, 5).numpy()
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
def test_object_arrays_and_meta_tensors_name_the_argument(backend: str) -> None:
    logits = random_logits(1, 2, 5)
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
def test_results_do_not_alias_inputs(backend: str) -> None:
    logits = random_logits(2, 2, 5)
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


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_counts_beyond_the_drafts_are_refused_before_any_read(backend: str) -> None:
    """5aed259: SIGSEGV (the layout read ``flat[start + j]`` before checking the counts)."""
    out = _child(f"""
        import numpy as np, torch, portable_verify as pv
        cases = [
            dict(num_draft_tokens=torch.tensor([10**7])),
            dict(num_draft_tokens=np.array([10**7])),
            dict(cu_num_draft_tokens=torch.tensor([0, 2**21])),
            dict(cu_num_draft_tokens=np.array([0, 2**21])),
        ]
        for kw in cases:
            flat = torch.tensor([1, 2]) if "torch" in repr(next(iter(kw.values())).__class__) \\
                else np.array([1, 2])
            target = torch.randn(3, 8) if isinstance(flat, torch.Tensor) else np.random.rand(3, 8)
            try:
                pv.verify_ragged(flat, target_logits=target.astype(np.float32)
                                 if isinstance(target, np.ndarray) else target, seed=1,
                                 backend={backend!r}, **kw)
            except ValueError as e:
                name = next(iter(kw))
                assert name in str(e) and "N = 2" in str(e), str(e)
            else:
                raise AssertionError("accepted " + repr(kw))
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lazily_negated_tensor_is_read_by_its_values(backend: str) -> None:
    """5aed259: ``torch._neg_view`` memory was read as if positive (wrong tokens)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 3, 32, generator=g) * 3
    drafts = torch.randint(0, 32, (4, 2), generator=g)
    negated = torch._neg_view(-logits)
    assert negated.is_neg() and torch.equal(negated, logits)
    for kwargs in ({"method": "greedy"}, {"temperature": 0.8, "seed": 5}):
        want = pv.verify(drafts, target_logits=logits, backend="numpy", **kwargs)
        got = pv.verify(drafts, target_logits=negated, backend=backend, **kwargs)
        assert torch.equal(got.token_ids, want.token_ids), kwargs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("kwargs", "name"), [
    ({"num_draft_tokens": torch.tensor([1, 1]), "max_num_draft_tokens": 2**40},
     "max_num_draft_tokens"),
    ({"cu_num_draft_tokens": torch.tensor([0, 2**62, -2**63 + 5, 2])}, "cu_num_draft_tokens"),
    ({"cu_num_draft_tokens": np.array([0, 2**62, -2**63 + 5, 2])}, "cu_num_draft_tokens"),
    ({"num_draft_tokens": torch.tensor([2**31 - 2, 2 - 2**31 + 2])}, "num_draft_tokens"),
])
def test_huge_layouts_are_refused_by_name_before_allocation(backend: str, kwargs: dict,
                                                            name: str) -> None:
    """5aed259: ``MemoryError`` / "array is too big", or tens of GB allocated first."""
    b = len(next(iter(kwargs.values()))) - (1 if "cu_num_draft_tokens" in kwargs else 0)
    flat = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=name):
        pv.verify_ragged(flat, target_logits=torch.randn(2 + b, 8), seed=1, backend=backend,
                         **kwargs)

