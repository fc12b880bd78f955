"""Ahead-of-time compiles of the Triton kernels for the H200's target (issue 38 item 7 (c)),
without a GPU: a representative subset (scripts/bench/aot_compile.py compiles every variant)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia.compiler")
tl = pytest.importorskip("triton.language")

from portable_verify.testing import aot  # noqa: E402

F64_FREE = {"_row_stats_kernel", "_layout_kernel"}
"""Kernels claimed free of float64 arithmetic (the decision's inverse-CDF prefix sums still
accumulate in float64: docs/semantics.md)."""


@pytest.fixture(scope="module")
def variants() -> list[aot.CompiledVariant]:
    rejection = aot.chain_calls(full=False)[1]  # row statistics + the sampled decision
    return aot.compile_variants([rejection])


def test_the_subset_compiles_for_sm90_with_registers_reported(variants) -> None:
    names = sorted(v.kernel for v in variants)
    assert len(names) == 2 and "_decide_kernel" in names, names
    for v in variants:
        assert 0 < v.n_regs <= 255 and v.n_spills >= 0, v.describe()


def test_kernels_claimed_free_of_float64_have_none_in_their_ttir(variants) -> None:
    claimed = [v for v in variants if v.kernel in F64_FREE]
    assert claimed and [v.describe() for v in claimed if v.f64_in_ttir] == []


@triton.jit
def _f64_sum(x_ptr, out_ptr, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.store(out_ptr, tl.sum(x.to(tl.float64), 0).to(tl.float32))


def test_negative_control_float64_and_registers_are_seen() -> None:
    import torch
    from triton.backends.compiler import GPUTarget

    x = torch.ones(64)
    variant = aot._compile(_f64_sum, GPUTarget(*aot.H200), (x, x),
                            {"BLOCK": 64, "enable_fp_fusion": False})
    assert variant.f64_in_ttir and variant.n_regs > 0 and variant.float_pointers == "fp32"
