"""Counter-based uniforms shared by every backend.

Why a hand-written hash: backends run on numpy, torch (any device), OpenVINO graphs and Triton
kernels; they must draw *bit-identical* random numbers from a request's seed without a host sync
and without a Python loop over the batch. A counter-based hash written only with ``^ >> << & * +``
on int64 arrays runs unchanged on numpy arrays and torch tensors. See docs/semantics.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF  # an int64 seed's two's-complement bits as a Python int
UNIFORM_BITS = 24
UNIFORM_SCALE = 2.0**-UNIFORM_BITS
DRAW_COUNTER = 1  # the recovered/bonus draw; acceptance uniforms use even counters 2j

SEED_SALT = 0x243F6A88
COUNTER_SALT = 0x85A308D3
MIX_C1 = 0x7FEB352D
MIX_C2 = 0x846CA68B


def mul32(x: Any, c: int) -> Any:
    """``(x * c) mod 2**32`` for ``0 <= x < 2**32`` without int64 overflow (16-bit split)."""
    lo = c & 0xFFFF
    hi = c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mul32_wide(x: Any, c: int) -> Any:
    """``(x * c) mod 2**32`` where the array type is uint64: the product cannot overflow."""
    return (x * c) & MASK32


def mul32_native(x: Any, c: int) -> Any:
    """``(x * c) mod 2**32`` for numpy uint32 arrays, which wrap by themselves."""
    import numpy as np

    return x * np.uint32(c)


def mix32(x: Any, mul: Callable[[Any, int], Any] = mul32) -> Any:
    """A 32-bit avalanche finaliser (xorshift-multiply); input and output in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = mul(x, MIX_C1)
    x = x ^ (x >> 15)
    x = mul(x, MIX_C2)
    return x ^ (x >> 16)


def request_keys(seeds: Any, offsets: Any, mul: Callable[[Any, int], Any] = mul32) -> Any:
    """Per-request 32-bit keys from 64-bit seeds and offsets (arrays of the same shape)."""
    k = mix32(((seeds >> 32) & MASK32) ^ SEED_SALT, mul)
    k = mix32((seeds & MASK32) ^ k, mul)
    k = mix32(((offsets >> 32) & MASK32) ^ k, mul)
    return mix32((offsets & MASK32) ^ k, mul)


def uniform_bits(keys: Any, counters: Any, mul: Callable[[Any, int], Any] = mul32) -> Any:
    """24-bit integers for (key, counter) pairs; broadcasting follows the array library."""
    return mix32(mix32(keys ^ counters, mul) ^ COUNTER_SALT, mul) >> (32 - UNIFORM_BITS)


def row_seed_key(seed: int) -> int:
    """The 32-bit key :func:`row_seeds` derives every row's seed from (kernels take it)."""
    s = int(seed)
    return mix32(mix32(((s >> 32) & MASK32) ^ SEED_SALT) ^ (s & MASK32))


def row_seeds(seed: int, rows: Any) -> Any:
    """Per-row int64 seeds (63-bit) from one Python int seed and the row indices (int64 array)."""
    k = row_seed_key(seed)
    return (mix32(rows ^ k) << 31) ^ mix32(rows ^ (k ^ COUNTER_SALT))


def counters_for(num_cols: int, arange: Any) -> Any:
    """Counters of the ``K+1`` uniform columns: ``2j`` for acceptance columns, then the draw."""
    k = num_cols - 1
    return arange * 2 * (arange < k) + DRAW_COUNTER * (arange == k)


def uniforms_numpy(seeds: Any, offsets: Any, num_cols: int) -> Any:
    """float32 ``[B, num_cols]`` uniforms in (0, 1] (numpy); the reference for every backend."""
    import numpy as np

    if np.size(seeds) == 1:  # one request: Python ints cost far less than 1-element arrays
        key = request_keys(int(np.ravel(seeds)[0]) & MASK64, int(np.ravel(offsets)[0]) & MASK64,
                           mul32_wide)
        bits = [uniform_bits(key, counters_for(num_cols, j), mul32_wide) for j in range(num_cols)]
        return ((np.array(bits, dtype=np.uint32) + 1).astype(np.float32)
                * np.float32(UNIFORM_SCALE)).reshape(1, num_cols)
    # The 32-bit halves of the int64 seeds and offsets as uint32 words, whose products wrap
    # mod 2**32 by themselves: no masks, a third fewer array ops than request_keys on uint64
    # (this runs on every sampled CPU call). Same numbers as request_keys / uniform_bits.
    lo, hi = (0, 1) if sys.byteorder == "little" else (1, 0)
    s = np.ascontiguousarray(seeds, dtype=np.int64).view(np.uint32).reshape(-1, 2)
    o = np.ascontiguousarray(offsets, dtype=np.int64).view(np.uint32).reshape(-1, 2)
    keys = mix32(s[:, hi] ^ np.uint32(SEED_SALT), mul32_native)
    for word in (s[:, lo], o[:, hi], o[:, lo]):
        keys = mix32(word ^ keys, mul32_native)
    ctr = counters_for(num_cols, np.arange(num_cols, dtype=np.int64)).astype(np.uint32)
    bits = mix32(mix32(keys[:, None] ^ ctr, mul32_native) ^ np.uint32(COUNTER_SALT),
                 mul32_native) >> (32 - UNIFORM_BITS)
    return (bits + 1).astype(np.float32) * np.float32(UNIFORM_SCALE)


def uniforms_torch(seeds: Any, offsets: Any, num_cols: int) -> Any:
    """Same numbers as :func:`uniforms_numpy`, computed on the seeds' device (no host sync)."""
    import torch

    if seeds.device.type == "cpu":  # numpy's per-op overhead is lower for these tiny arrays
        return torch.from_numpy(uniforms_numpy(seeds.numpy(), offsets.numpy(), num_cols))
    keys = request_keys(seeds.to(torch.int64), offsets.to(torch.int64))
    ctr = counters_for(num_cols, torch.arange(num_cols, dtype=torch.int64, device=seeds.device))
    bits = uniform_bits(keys[:, None], ctr[None, :])
    return (bits + 1).to(torch.float32) * UNIFORM_SCALE
