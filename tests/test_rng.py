"""The counter-based uniforms: identical bits on numpy (uint64) and torch (int64, split multiply).

On CPU ``uniforms_torch`` takes the numpy route for speed; GPUs run the torch expression. This
file checks both expressions against each other and pins the values of the documented hash, so a
change to the stream (which would change every seeded result) cannot go unnoticed.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from portable_verify.core import rng


def _torch_expression(seeds: torch.Tensor, offsets: torch.Tensor, cols: int) -> torch.Tensor:
    keys = rng.request_keys(seeds, offsets)
    ctr = rng.counters_for(cols, torch.arange(cols, dtype=torch.int64))
    bits = rng.uniform_bits(keys[:, None], ctr[None, :])
    return (bits + 1).to(torch.float32) * rng.UNIFORM_SCALE


def test_numpy_and_torch_expressions_agree_bit_for_bit() -> None:
    g = np.random.default_rng(7)
    seeds = g.integers(-(2**63), 2**63 - 1, size=4096, dtype=np.int64)
    offsets = g.integers(0, 2**40, size=4096, dtype=np.int64)
    want = rng.uniforms_numpy(seeds, offsets, 6)
    got = _torch_expression(torch.from_numpy(seeds), torch.from_numpy(offsets), 6).numpy()
    assert np.array_equal(want, got)
    assert np.array_equal(want, rng.uniforms_torch(torch.from_numpy(seeds),
                                                   torch.from_numpy(offsets), 6).numpy())


def test_values_are_in_the_documented_range_and_grid() -> None:
    u = rng.uniforms_numpy(np.arange(20000), np.zeros(20000, np.int64), 3)
    assert u.dtype == np.float32
    assert (u > 0).all() and (u <= 1).all()
    m = u.astype(np.float64) * 2**24
    assert np.array_equal(m, np.round(m))  # multiples of 2**-24


def test_columns_depend_only_on_position_not_on_width() -> None:
    seeds = np.arange(50, dtype=np.int64)
    narrow = rng.uniforms_numpy(seeds, np.zeros(50, np.int64), 3)  # K = 2
    wide = rng.uniforms_numpy(seeds, np.zeros(50, np.int64), 6)  # K = 5
    assert np.array_equal(narrow[:, :2], wide[:, :2])  # acceptance uniforms of positions 0, 1
    assert np.array_equal(narrow[:, -1], wide[:, -1])  # the draw uniform


def test_uniformity_and_independence() -> None:
    """KS test per column (alpha 1e-4 each) and near-zero correlation between columns."""
    u = rng.uniforms_numpy(np.arange(200000), np.full(200000, 3, np.int64), 4).astype(np.float64)
    for col in range(4):
        assert stats.kstest(u[:, col], "uniform").pvalue > 1e-4
    corr = np.corrcoef(u.T)[np.triu_indices(4, 1)]
    assert np.abs(corr).max() < 0.02  # sd of a null correlation at n=2e5 is 0.0022


def test_pinned_values() -> None:
    """Golden values of the documented hash: changing them changes every seeded result."""
    u = rng.uniforms_numpy(np.array([0, 12345], np.int64), np.array([0, 7], np.int64), 3)
    assert u.tolist() == GOLDEN


GOLDEN = [
    [0.6545661091804504, 0.9075663685798645, 0.8607754707336426],
    [0.1284160017967224, 0.9349429607391357, 0.7760733366012573],
]
