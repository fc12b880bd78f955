"""The lean Triton path: at most two launches per unvalidated chain call, no other device op,
no read of a device value, on every door and both vLLM seams; the kernels' own uniforms equal
``rng.uniforms_numpy`` bit for bit.

Counted on ``triton:interpreter`` (CPU tensors: the host code ``triton:cuda`` runs is the same,
because the path is chosen by the backend's traits, never by the tensors' device): every aten
op that would launch device work is recorded by a dispatch mode (allocations, views and
metadata ops excluded), and each kernel launch by a proxy around the interpreted kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import portable_verify as pv
from portable_verify.core import rng
from portable_verify.core.types import VerifyOptions

pytest.importorskip("triton")
BACKEND = "triton:interpreter"
FREE_OPS = {"empty", "empty_strided", "view", "as_strided", "slice", "select", "unsqueeze",
            "detach", "alias", "_reshape_alias", "lift_fresh", "_unsafe_view"}
"""Allocation, view and metadata ops: no device work."""
READS = {"_local_scalar_dense", "nonzero", "item", "equal", "is_nonzero"}
"""Ops that read a device value on the host."""


class _Counter(TorchDispatchMode):
    """Records every aten op that launches device work; raises on a read of a device value."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name in READS:
            raise AssertionError(f"read of a device value: aten.{name}")
        if name not in FREE_OPS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


class _CountedKernel:
    """A proxy for one interpreted kernel: records its launches and grids; the launch itself
    (the interpreter's numpy copies) runs outside the dispatch mode."""

    def __init__(self, kernel: Any, log: list[tuple[str, tuple[int, ...]]], name: str) -> None:
        self.kernel, self.log, self.name = kernel, log, name

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        launcher = self.kernel[grid]

        def launch(*args: Any, **kwargs: Any) -> Any:
            self.log.append((self.name, tuple(grid)))
            with _disable_current_modes():
                return launcher(*args, **kwargs)

        return launch


@contextlib.contextmanager
def counted() -> Iterator[tuple[_Counter, list[tuple[str, tuple[int, ...]]]]]:
    from portable_verify.backends.triton.interpreter import interpreted_kernels

    module = interpreted_kernels()
    launches: list[tuple[str, tuple[int, ...]]] = []
    names = ("_layout_kernel", "_decide_kernel")
    saved = {n: getattr(module, n) for n in names}
    for n in names:
        setattr(module, n, _CountedKernel(saved[n], launches, n))
    counter = _Counter()
    try:
        with counter:
            yield counter, launches
    finally:
        for n in names:
            setattr(module, n, saved[n])


def _padded(g: torch.Generator, b: int = 3, k: int = 3, v: int = 40) -> dict[str, Any]:
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, logits[:, :k].argmax(-1),
                         torch.randint(0, v, (b, k), generator=g))
    drafts[0, 1] = -1
    return dict(draft_token_ids=drafts, target_logits=logits,
                num_draft_tokens=torch.tensor([k, k - 1, 0][:b]))


METHODS = ["greedy", "rejection", "typical", "block"]


def _launch_budget(method: str) -> int:
    return 2  # typical and block need no third launch: the row statistics hold entropy too


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("door", ["padded", "ragged", "rows"])
def test_two_launches_and_no_other_device_op(method: str, door: str) -> None:
    g = torch.Generator().manual_seed(1)
    call = _padded(g)
    b, k, v = 3, 3, 40
    seed = torch.tensor([5, -7, 2**63 - 1])
    common = dict(method=method, temperature=torch.tensor([0.0, 0.7, 1.0]), seed=seed,
                  seed_offset=torch.tensor([0, 3, -(2**63)]), backend=BACKEND, validate=False)
    counts = call["num_draft_tokens"]
    if door == "padded":
        run = lambda: pv.verify(**call, **common)  # noqa: E731
    elif door == "ragged":
        flat = torch.cat([call["draft_token_ids"][i, :int(counts[i])] for i in range(b)])
        rows = torch.cat([call["target_logits"][i, :int(counts[i]) + 1] for i in range(b)])
        run = lambda: pv.verify_ragged(flat, num_draft_tokens=counts,  # noqa: E731
                                       target_logits=rows, max_num_draft_tokens=k, **common)
    else:
        target_rows = (torch.arange(b)[:, None] * (k + 1)
                       + torch.minimum(torch.arange(k + 1)[None, :], counts[:, None]))
        rows_common = {key: value for key, value in common.items() if key != "method"}
        rows_common["options"] = VerifyOptions(method)
        run = lambda: pv.verify_rows(  # noqa: E731
            call["draft_token_ids"], target_rows=target_rows,
            target_logits=call["target_logits"].reshape(-1, v), num_draft_tokens=counts,
            **rows_common)
    want = run()
    with counted() as (counter, launches):
        got = run()
    assert counter.ops == [], counter.ops
    assert len(launches) <= _launch_budget(method), launches
    assert [name for name, _ in launches] == ["_layout_kernel", "_decide_kernel"]
    assert torch.equal(got.token_ids, want.token_ids)
    reference = pv.verify(**call, **{**common, "method": method, "backend": "numpy",
                                     "validate": True})
    assert torch.equal(got.token_ids, reference.token_ids)
    assert torch.equal(got.num_draft_tokens, reference.num_draft_tokens)


def test_an_unseeded_call_adds_one_draw_and_an_int_seed_none() -> None:
    call = _padded(torch.Generator().manual_seed(2))
    for seed, extra in ((None, ["randint"]), (123, [])):
        with counted() as (counter, launches):
            pv.verify(**call, temperature=0.8, seed=seed, backend=BACKEND, validate=False)
        assert counter.ops == extra and len(launches) == 2


def test_the_counter_catches_an_added_op_and_an_added_read(monkeypatch) -> None:
    """Negative controls: a torch.where and an .item() slipped into the host path."""
    from portable_verify.backends.triton import spec

    call = _padded(torch.Generator().manual_seed(3))
    real = spec.from_call

    def with_where(c):  # type: ignore[no-untyped-def]
        out = real(c)
        out.temperature = torch.where(out.temperature > 0, out.temperature, 0.0)
        return out

    monkeypatch.setattr(spec, "from_call", with_where)
    with counted() as (counter, _):
        pv.verify(**call, temperature=torch.tensor([0.5, 0.0, 1.0]), seed=1, backend=BACKEND,
                  validate=False)
    assert "where" in counter.ops

    def with_read(c):  # type: ignore[no-untyped-def]
        out = real(c)
        out.k = int(torch.as_tensor(c.counts).max()) if c.counts is not None else out.k
        return out

    monkeypatch.setattr(spec, "from_call", with_read)
    with pytest.raises(AssertionError, match="read of a device value"), counted():
        pv.verify(**call, seed=1, backend=BACKEND, validate=False)


def test_vllm_seams_take_two_launches() -> None:
    from types import SimpleNamespace

    from portable_verify.integrations.vllm_v1 import runner_v2
    from portable_verify.integrations.vllm_v1.sampler import verify_spec_decode_step

    g = torch.Generator().manual_seed(4)
    counts = [2, 0, 3]
    n, v, k = sum(counts), 30, 3
    drafts = torch.randint(0, v, (n,), generator=g).to(torch.int32)
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    logits = torch.randn(n, v, generator=g)
    bonus = torch.randint(0, v, (3, 1), generator=g)
    for temperature in (None, torch.tensor([0.0, 1.0, 0.5])):
        md = SimpleNamespace(temperature=temperature, all_greedy=temperature is None,
                             all_random=False, generators={})
        args = (drafts, counts, k, cu, None, logits, bonus, md)
        torch.manual_seed(7)  # the unseeded rows' draws
        want = verify_spec_decode_step(*args, backend="numpy")
        torch.manual_seed(7)
        with counted() as (counter, launches):
            got = verify_spec_decode_step(*args, backend=BACKEND)
        assert len(launches) == 2
        assert counter.ops == ([] if temperature is None else ["randint"])
        assert got.dtype == torch.int32 and torch.equal(got, want)
    rows = torch.tensor([3, 1, 4])
    cu2 = torch.nn.functional.pad(rows.cumsum(0), (1, 0))
    inputs = torch.randint(0, v, (int(cu2[-1]),), generator=g)
    args2 = (torch.randn(int(cu2[-1]), v, generator=g), inputs, cu2,
             torch.arange(int(cu2[-1])) + 50, torch.tensor([4, 0, 2]),
             torch.tensor([0.0, 1.0, 0.3, 0.0, 0.7]), torch.arange(5) * 977 - 3, k)
    want2 = runner_v2.verify_v2_step(*args2, backend="numpy")
    with counted() as (counter, launches):
        got2 = runner_v2.verify_v2_step(*args2, backend=BACKEND)
    assert counter.ops == [] and len(launches) == 2
    assert torch.equal(got2[0], want2[0]) and torch.equal(got2[1], want2[1])
    assert got2[1].dtype == torch.int32


EXTREMES = np.array([0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, -(2**31), 2**62,
                     2**63 - 1, -(2**63), -(2**63) + 1, 0x0123456789ABCDEF], dtype=np.int64)


def kernel_uniforms(seeds: np.ndarray, offsets: np.ndarray, num_cols: int) -> np.ndarray:
    """The kernels' own uniforms (test-only probe kernel, same device functions)."""
    from portable_verify.backends.triton.interpreter import (
        _LAUNCH_LOCK,
        _interpreted_stdlib,
        interpreted_kernels,
    )

    module = interpreted_kernels()
    count = seeds.shape[0]
    out = torch.empty((count, num_cols), dtype=torch.float32)
    block = 4096
    with _LAUNCH_LOCK, _interpreted_stdlib():
        module._uniforms_probe_kernel[(-(-count // block),)](
            torch.from_numpy(seeds), torch.from_numpy(offsets), out, count, num_cols - 1,
            BLOCK=block, KB=max(2, 1 << (num_cols - 1).bit_length()))
    return out.numpy()


@pytest.mark.parametrize("num_cols", [1, 4, 9])
def test_kernel_uniforms_equal_the_reference_bit_for_bit(num_cols: int) -> None:
    """>= 10^5 (seed, offset, column) triples per column count (chains: K+1 columns; trees:
    N columns), extreme int64 values included."""
    gen = np.random.default_rng(num_cols)
    count = -(-100_000 // num_cols) + 1
    seeds = gen.integers(-(2**63), 2**63 - 1, count, dtype=np.int64, endpoint=True)
    offsets = gen.integers(-(2**63), 2**63 - 1, count, dtype=np.int64, endpoint=True)
    seeds[: EXTREMES.size**2] = np.repeat(EXTREMES, EXTREMES.size)
    offsets[: EXTREMES.size**2] = np.tile(EXTREMES, EXTREMES.size)
    got = kernel_uniforms(seeds, offsets, num_cols)
    want = rng.uniforms_numpy(seeds, offsets, num_cols)
    assert got.shape[0] * num_cols >= 100_000
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # Negative control: one bit of one offset changes the row.
    flipped = kernel_uniforms(seeds[:1], offsets[:1] ^ 1, num_cols)
    assert not np.array_equal(flipped, want[:1])


def test_int_seeds_hash_in_the_kernel_like_row_seeds() -> None:
    """One int seed: the kernel derives each row's seed (``rng.row_seeds``) itself."""
    call = _padded(torch.Generator().manual_seed(5), b=3, k=2, v=25)
    for seed in (0, -1, 2**63 - 1, -(2**63), 987654321):
        for offset in (0, -5, 2**40):
            got = pv.verify(**call, temperature=0.9, seed=seed, seed_offset=offset,
                            backend=BACKEND, validate=False)
            want = pv.verify(**call, temperature=0.9, seed=seed, seed_offset=offset,
                             backend="numpy")
            assert torch.equal(got.token_ids, want.token_ids), (seed, offset)


@pytest.mark.parametrize("b", [1, 16])
def test_small_batches_split_the_vocabulary_on_a_gpu(b: int) -> None:
    """The row-statistics launch of a (B, 4, 128256) call on a GPU has >= 128 programs."""
    from portable_verify.backends.triton.chain import vocabulary_split

    rows = b * 5
    for block in (1024, 2048, 4096):
        splits, chunk = vocabulary_split(rows, 128256, block, False, True)
        assert rows * splits >= 128 and chunk % block == 0 and (splits - 1) * chunk < 128256
    assert vocabulary_split(rows, 128256, 2048, False, False) == (1, 128256)  # no statistics


@pytest.mark.parametrize("method", METHODS)
def test_a_split_vocabulary_decides_as_one_program_per_row(method: str, monkeypatch) -> None:
    """Merged slice statistics (first argmax, online softmax, entropy) give the decisions of
    whole rows, ties and -inf slices included; the interpreter splits a row longer than its
    block in two, and the control runs unsplit."""
    from portable_verify.backends.triton import interpreter

    g = torch.Generator().manual_seed(6)
    b, k, v = 3, 2, 2100
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    logits[0, 0, 1500] = logits[0, 0, 40] = logits[0, 0].max() + 1  # a tie across slices
    logits[1, 1, :1100] = float("-inf")  # a whole slice of -inf
    drafts = logits[:, :k].argmax(-1)
    drafts[1, 0] = 3
    kw = dict(draft_token_ids=drafts, target_logits=logits, method=method,
              temperature=torch.tensor([0.0, 0.7, 1.2]), seed=9, backend=BACKEND,
              validate=False)
    with counted() as (_, launches):
        split = pv.verify(**kw)
    assert launches[0][1][2] == 2, launches
    monkeypatch.setattr(interpreter.interpreted_kernels(), "INTERPRETED_SPLITS", 1)
    whole = pv.verify(**kw)
    assert torch.equal(split.token_ids, whole.token_ids)
    assert torch.equal(split.token_ids,
                       pv.verify(**{**kw, "backend": "numpy"}).token_ids)


def test_the_split_draw_decides_as_the_reference() -> None:
    """Rejection's residual/bonus draw split among programs (one block each, the last program
    continues) gives the reference's tokens: picks in the first and the last block (extreme
    uniforms), an empty residual (``q = p``: the draw falls back to ``p``), one-hot and given
    ``q``, probabilities in, a greedy row, a NaN row; the launch really is split."""
    from portable_verify.testing.launches import count_launches

    g = torch.Generator().manual_seed(12)
    b, k, v = 6, 3, 3100  # 4 blocks of the interpreter's 1024
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    logits[2, :, :2500] = float("-inf")  # the mass lies in the last blocks
    logits[4, 1] = float("nan")
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
    q[3] = torch.softmax(logits[3, :k] / 0.8, -1)  # residual empty (up to rounding)
    drafts = torch.randint(0, v, (b, k), generator=g)
    u = torch.rand(b, k + 1, generator=g).clamp(min=2**-24)
    u[0, k], u[1, k], u[1, :k] = 1.0, 2**-24, 1.0
    temps = torch.tensor([0.8, 1.0, 0.5, 0.8, 1.3, 0.0])
    for form in ("logits", "logits+q", "probs+q"):
        kw = dict(draft_token_ids=drafts, temperature=temps, uniforms=u, method="rejection")
        if form.startswith("probs"):
            kw["target_probs"] = torch.softmax(logits / 0.9, -1).nan_to_num(0.0)
            kw.pop("temperature")
        else:
            kw["target_logits"] = logits
        if form.endswith("+q"):
            kw["draft_probs"] = q
        want = pv.verify(**kw, backend="numpy", validate=False)
        with count_launches(refuse_reads=False) as counter:
            got = pv.verify(**kw, backend=BACKEND, validate=False)
        assert torch.equal(got.token_ids, want.token_ids), form
        assert torch.equal(got.num_accepted, want.num_accepted), form
        assert counter.kernels[-1].grid == (b, 4), counter.kernels[-1].grid
