"""Block verification on the compiled CPU kernel (``backends/numba/block.py``).

The joint law, the acceptance closed forms and the small-vocabulary comparison with the reference
are conformance checks (``stat.block_*``, ``exact.block``, tests/test_conformance.py). Here: the
tokens at serving vocabularies equal the reference's over many requests (the kit's near-boundary
rule excuses a row only where a comparison lies within float rounding), every call stays on
the kernel (no silent fallback), ``validate=True`` catches bad values in rows the backward scan
may skip, and results are bit-identical at any thread count.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch
from portable_verify.api import call as api_call
from portable_verify.testing.checks.reference_comparison import Tally, compare
from tests.test_numba_defects import _child

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _case(b: int, k: int, v: int, *, logits: bool, with_q: bool, seed: int) -> dict:
    """Drafts sampled from a draft close to the target (the scan then stops at every kind of
    position), greedy rows, ragged counts and caller bonus ids in one call, with explicit
    uniforms (the near-boundary rule needs them; ``-1`` cuts: tests/test_block.py)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(b, k + 1, v, generator=g) * 3
    temps = torch.rand(b, generator=g) * 1.2 + 0.2 if logits else torch.ones(b)
    temps[::9] = 0.0
    p = torch.softmax(raw / temps.clamp(min=1e-3)[:, None, None], -1)
    q = torch.softmax(raw[:, :k] / temps.clamp(min=1e-3)[:, None, None]
                      + torch.randn(b, k, v, generator=g) * 0.7, -1)
    drafts = torch.multinomial(q.reshape(b * k, v), 1, generator=g).reshape(b, k)
    kw = {"draft_token_ids": drafts,
          "num_draft_tokens": torch.randint(0, k + 1, (b,), generator=g),
          "uniforms": (torch.randint(0, 2**24, (b, k + 1), generator=g) + 1) * 2.0**-24,
          "bonus_token_ids": torch.randint(0, v, (b,), generator=g)}
    if logits:
        kw.update(target_logits=raw, temperature=temps)
    else:
        kw["target_probs"] = p
    if with_q:
        kw["draft_probs"] = q
    return kw


@pytest.mark.parametrize("v", [32000, 128256])
def test_tokens_equal_the_reference_at_serving_vocabularies(v: int) -> None:
    """Every input form, over many requests: a row may differ from the reference only where
    the kit's near-boundary rule finds a comparison within float rounding; the scan must have
    stopped at every kind of position (a = 0, in the middle, a = n) for the test to mean much."""
    b, k = (48, 4) if v == 32000 else (16, 5)
    tally = Tally()
    for i, (logits, with_q) in enumerate([(True, True), (False, True), (True, False),
                                          (False, False)]):
        kwargs = _case(b, k, v, logits=logits, with_q=with_q, seed=11 * i + v % 7)
        compare(tally, "numba:cpu", f"V={v} logits={logits} q={with_q}", kwargs, "block")
    assert not tally.failures, tally.failures[:5]
    assert tally.excused_near_boundary <= tally.rows // 50, vars(tally)
    for path in ("block_a_0", "block_a_mid", "block_a_n"):
        assert tally.events[path] > 0, dict(tally.events)


def test_valid_block_calls_stay_on_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``validate=True`` on valid inputs never flags (a flag would rerun the call on torch)."""
    def no_fallback(name: str):
        raise AssertionError(f"numba flagged a valid block call (rerun on {name})")

    monkeypatch.setattr(api_call.dispatch, "get_backend", no_fallback)
    for logits in (True, False):
        for with_q in (True, False):
            kw = _case(12, 3, 3000, logits=logits, with_q=with_q, seed=5)
            pv.verify(**kw, method="block", backend="numba:cpu")


@pytest.mark.parametrize("where", ["target_mid", "target_last", "draft_mid"])
@pytest.mark.parametrize("inputs", ["logits", "probs"])
def test_validate_checks_rows_the_scan_may_skip(where: str, inputs: str) -> None:
    """A NaN in target row 1 or row n, or in draft row 1: an error naming the argument under
    ``validate=True`` whatever the uniforms (docs/semantics.md: block calls are checked as
    ``validate="full"``); ``validate=False`` still returns ids in range."""
    g = torch.Generator().manual_seed(2)
    b, k, v = 4, 3, 50
    raw = torch.randn(b, k + 1, v, generator=g)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    target = raw if inputs == "logits" else torch.softmax(raw, -1)
    name = "target_logits" if inputs == "logits" else "target_probs"
    if where == "draft_mid":
        q[2, 1, 5] = float("nan")
        name = "draft_probs"
    else:
        target[2, 1 if where == "target_mid" else k, 5] = float("nan")
    kw = {"target_" + inputs: target, "draft_probs": q, "method": "block",
          "backend": "numba:cpu", "uniforms": torch.full((b, k + 1), 0.999)}
    drafts = torch.randint(0, v, (b, k), generator=g)
    with pytest.raises(ValueError, match=name):
        pv.verify(drafts, **kw)
    res = pv.verify(drafts, **kw, validate=False)
    emitted = np.arange(k + 1)[None, :] <= res.num_accepted.numpy()[:, None]
    assert ((res.token_ids.numpy() >= 0) & (res.token_ids.numpy() < v))[emitted].all()


def test_block_results_identical_at_1_2_and_3_threads() -> None:
    """Parallel over requests (calls above the one-thread crossover): bit-identical tokens at
    1, 2 and 3 threads, from logits and from probabilities (in a child: the override cannot
    leak into other tests)."""
    code = """
        import os
        import torch, portable_verify as pv
        g = torch.Generator().manual_seed(5)
        b, k, v = 24, 3, 32768  # 2.4M values: above the one-thread threshold
        logits = torch.randn(b, k + 1, v, generator=g) * 3
        q = torch.softmax(logits[:, :k] + torch.randn(b, k, v, generator=g), -1)
        drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
        temps = torch.rand(b, generator=g) * 1.5
        temps[::5] = 0.0
        calls = {"logits": dict(target_logits=logits, temperature=temps, draft_probs=q),
                 "probs": dict(target_probs=torch.softmax(logits, -1), draft_probs=q)}
        for name, kw in calls.items():
            out = []
            for n in ("1", "2", "3"):
                os.environ["PORTABLE_VERIFY_NUM_THREADS"] = n
                out.append(pv.verify(drafts, seed=7, backend="numba:cpu", method="block",
                                     **kw).token_ids)
            print(name, all(torch.equal(o, out[0]) for o in out))
    """
    out = _child(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["logits", "True", "probs", "True"], out.stdout


def test_auto_gives_cpu_block_calls_to_numba() -> None:
    """With the kernel in place ``auto`` no longer falls back to torch for block on CPU."""
    assert dispatch.select_backend("auto", "cpu", "block").qualified_name == "numba:cpu"


def test_rows_of_only_minus_inf_unvalidated_return_ids_in_range() -> None:
    """A logits row without a finite value has normaliser 0: no zero division (numba raises
    ``ZeroDivisionError`` on scalars), its ``p(x)`` is 0, and the ids stay in ``[0, V)``."""
    logits = torch.randn(2, 3, 6)
    logits[0, 0] = -float("inf")
    logits[1, 1] = float("nan")
    res = pv.verify(torch.tensor([[1, 2], [3, 4]]), target_logits=logits, method="block",
                    seed=1, backend="numba:cpu", validate=False)
    assert res.num_accepted[0] == 0
    emitted = np.arange(3)[None, :] <= res.num_accepted.numpy()[:, None]
    assert ((res.token_ids.numpy() >= 0) & (res.token_ids.numpy() < 6))[emitted].all()
