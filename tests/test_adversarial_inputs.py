"""Regressions for the argument forms adversarial inputs broke (issue 20), on every backend.

Each case failed on commit 5aed259 with the backend ``auto`` picks on CPU (``numba:cpu``):
a process crash, a silently accepted invalid value, a wrong token, or an error that did not
name the argument. Crash cases run in a child process so that a regression fails one test
instead of killing the run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import portable_verify as pv

BACKENDS = pv.available_backends()


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
