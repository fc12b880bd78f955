"""Regression tests for the defects adversarial inputs found in the numba path.

Crash cases run in a child process: a segfault there fails the test instead of the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import portable_verify as pv

BACKENDS = ["auto", "numba:cpu", "torch:cpu", "numpy"]


def _child(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=900, env=env)


RAGGED_OVERRUNS = [
    ("num_draft_tokens", "torch.tensor([10**7])"),
    ("num_draft_tokens", "torch.tensor([2**40])"),
    ("num_draft_tokens", "torch.tensor([2**62, 2**62, -2**63 + 2])"),  # the sum wraps to 2
    ("cu_num_draft_tokens", "torch.tensor([0, 2**21])"),
    ("cu_num_draft_tokens", "np.array([0, 2**21])"),
    ("cu_num_draft_tokens", "np.array([0, 2**62, -2**63 + 5, 2])"),
    ("cu_num_draft_tokens", "torch.tensor([0, 3])"),  # a small overrun: read silently before
]


def test_ragged_counts_past_n_are_an_error_not_a_crash() -> None:
    """Counts or offsets that do not fit ``N`` drafts: ``ValueError`` naming the counts (or
    the target's rows) on every backend, never a read outside ``draft_token_ids`` (one child
    process for all cases: a crash fails this test, not the suite)."""
    code = f"""
        import numpy as np, torch, portable_verify as pv
        for argument, value in {RAGGED_OVERRUNS!r}:
            for backend in {BACKENDS!r}:
                try:
                    pv.verify_ragged(torch.tensor([1, 2]), **{{argument: eval(value)}},
                                     target_logits=torch.randn(3, 8), seed=1, backend=backend)
                except ValueError as error:
                    print(argument, backend, "ValueError", error, flush=True)
                else:
                    print(argument, backend, "no error", flush=True)
    """
    out = _child(code)
    assert out.returncode == 0, f"child died ({out.returncode}): {out.stdout[-2000:]}"
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(BACKENDS) * len(RAGGED_OVERRUNS), out.stdout
    for line in lines:
        argument = line.split()[0]
        assert "ValueError" in line and (argument in line.split(None, 2)[2]
                                         or "target_logits" in line), line


def test_ragged_counts_that_fit_still_decide() -> None:
    """The checks refuse only what does not fit (a negative control for the test above)."""
    flat = torch.tensor([1, 2, 3])
    target = torch.randn(5, 8)
    results = [pv.verify_ragged(flat, num_draft_tokens=torch.tensor([1, 2]),
                                target_logits=target, seed=3, backend=b,
                                max_num_draft_tokens=4).token_ids for b in BACKENDS]
    for r in results[1:]:
        assert torch.equal(r, results[0])


def _wide_logits() -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(2, 3, 8, dtype=torch.float64)
    logits[0, 0, 2] = 1e39  # finite in float64, +inf in float32 (the computation dtype)
    return torch.tensor([[1, 5], [2, 3]]), logits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("validate", [True, "full"])
@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_float64_logits_beyond_float32_are_refused_in_float32_words(
        backend: str, validate: bool | str, method: str) -> None:
    """docs/semantics.md: float64 inputs are read as float32, where 1e39 is +inf: refused at
    both levels with words that say so (before: token V-1 under "full", "NaN or +inf" for a
    finite input at the default level)."""
    ids, logits = _wide_logits()
    with pytest.raises(ValueError, match=r"target_logits contains NaN or \+inf in float32"):
        pv.verify(ids, target_logits=logits, seed=1, method=method, backend=backend,
                  validate=validate)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_logits_within_float32_decide_as_float32(backend: str) -> None:
    """The control: float64 logits in range give what their float32 rounding gives."""
    ids, logits = _wide_logits()
    logits[0, 0, 2] = 3e38
    wide = pv.verify(ids, target_logits=logits, seed=1, backend=backend, validate="full")
    narrow = pv.verify(ids, target_logits=logits.float(), seed=1, backend=backend)
    assert torch.equal(wide.token_ids, narrow.token_ids)


def test_numba_works_without_a_writable_cache() -> None:
    """No cache locator (read-only package directory and HOME, no NUMBA_CACHE_DIR): the
    kernels compile uncached and say so in one log line, instead of failing at import."""
    code = """
        import numba.core.caching as caching
        caching.CacheImpl._locator_classes = []  # what a read-only image leaves numba
        import torch, portable_verify as pv
        r = pv.verify(torch.tensor([[1, 2]]), target_logits=torch.randn(1, 3, 8),
                      method="greedy", backend="numba:cpu")  # greedy: the smallest compile
        print("tokens", r.token_ids.shape[1])
    """
    out = _child(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tokens 3" in out.stdout
    assert out.stderr.count("compile uncached") == 1, out.stderr


def test_results_identical_at_1_2_and_3_threads() -> None:
    """Parallel over requests, every method: bit-identical tokens at 1, 2 and 3 threads (in a
    child, so the thread override cannot leak; the calls are above the one-thread crossover),
    and the same tokens as the torch backend."""
    code = """
        import os
        import numpy as np, torch, portable_verify as pv
        g = torch.Generator().manual_seed(5)
        b, k, v = 24, 3, 32768  # 2.4M values: above the one-thread threshold
        logits = torch.randn(b, k + 1, v, generator=g) * 3
        probs = torch.softmax(logits, -1)
        q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
        drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, logits[:, :k].argmax(-1),
                             torch.randint(0, v, (b, k), generator=g))
        temps = torch.rand(b, generator=g) * 1.5
        temps[::5] = 0.0
        calls = {
            "greedy": dict(target_logits=logits, method="greedy"),
            "rejection/logits": dict(target_logits=logits, temperature=temps),
            "rejection/probs": dict(target_probs=probs, draft_probs=q),
            "typical/logits": dict(target_logits=logits, method="typical"),
            "typical/probs": dict(target_probs=probs, method="typical"),
        }
        for name, kw in calls.items():
            out = []
            for n in ("1", "2", "3"):
                os.environ["PORTABLE_VERIFY_NUM_THREADS"] = n
                out.append(pv.verify(drafts, seed=7, backend="numba:cpu", **kw).token_ids)
            same = all(torch.equal(o, out[0]) for o in out)
            ref = pv.verify(drafts, seed=7, backend="torch:cpu", **kw).token_ids
            print(name, same, int((ref != out[0]).any(-1).sum()))
    """
    out = _child(code)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 5, out.stdout
    for line in lines:
        _name, same, differing = line.split()
        assert same == "True", line
        assert int(differing) == 0, line  # and the same tokens as the torch backend


@pytest.mark.parametrize("bad_request", [0, 13, 23])
def test_invalid_value_in_any_claimed_range_is_reported(monkeypatch: pytest.MonkeyPatch,
                                                        bad_request: int) -> None:
    """The threads claim request ranges in turn: a NaN in the first, a middle or the last
    range's request still fails the call with the torch backend's words (the largest flag of
    every range is kept), at 3 threads."""
    monkeypatch.setenv("PORTABLE_VERIFY_NUM_THREADS", "3")
    g = torch.Generator().manual_seed(2)
    b, k, v = 24, 3, 32768  # above the one-thread threshold: 12 claimed ranges
    logits = torch.randn(b, k + 1, v, generator=g)
    drafts = logits[:, :k].argmax(-1)
    logits[bad_request, 0, 5] = float("nan")  # the first row: every request reads it
    with pytest.raises(ValueError, match="target_logits"):
        pv.verify(drafts, target_logits=logits, seed=3, backend="numba:cpu")


def test_worker_threads_survive_fork() -> None:
    """A child forked after a parallel call gets fresh workers (an inherited executor has no
    threads and would never run the work: the child would hang past the timeout)."""
    code = """
        import os, torch, portable_verify as pv
        os.environ["PORTABLE_VERIFY_NUM_THREADS"] = "2"
        logits, drafts = torch.randn(8, 4, 100000), torch.randint(0, 100000, (8, 3))
        first = pv.verify(drafts, target_logits=logits, seed=1, backend="numba:cpu").token_ids
        pid = os.fork()
        if pid == 0:
            again = pv.verify(drafts, target_logits=logits, seed=1, backend="numba:cpu")
            os._exit(0 if torch.equal(first, again.token_ids) else 3)
        print("child", os.waitpid(pid, 0)[1])
    """
    out = _child(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "child 0" in out.stdout
