"""The per-call scalars of the OpenVINO graphs as one float32 vector, built once per call.

Why one vector: every graph family (chain and tree) reads its per-call scalars from this one
``scalars`` input, so a new scalar option of a method changes :func:`call_scalars` (through
:meth:`TypicalParams.kernel_scalars`) and the graph helper that reads it, not each graph's
input list and each call site. Per-row data (temperatures, uniforms, rows) stays in its own
inputs: it is not a scalar.

Layout: ``[block_high, block_low, *typical.kernel_scalars()]``. The argmax block is an integer,
and float32 holds integers exactly only up to ``2**24``; splitting it as ``high * BLOCK_RADIX +
low`` keeps it exact for any block below ``2**36`` (the graph rebuilds it in int64).

Importing this module never imports ``openvino``: the backend builds the record on the host.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from portable_verify.core.types import TypicalParams

BLOCK_HIGH = 0
"""Index of ``block // BLOCK_RADIX`` in the record."""

BLOCK_LOW = 1
"""Index of ``block % BLOCK_RADIX`` in the record."""

TYPICAL = 2
"""Index of the first typical parameter, in :meth:`TypicalParams.kernel_scalars` order."""

BLOCK_RADIX = 4096
"""The split of the argmax block: both parts stay below ``2**24`` for any block below 2**36."""

_PREFERRED_BLOCK = 256
"""The smallest argmax block worth its ``ReduceMax`` pass (see :func:`argmax_block`)."""


@functools.lru_cache(maxsize=64)
def argmax_block(vocab: int) -> int:
    """The argmax block size for ``vocab``: its smallest divisor >= 256 (or ``vocab``).

    Blocks narrower than ~256 make the blocked ReduceMax slow; wider ones only grow the
    ``[R, block]`` second stage. A prime vocabulary gets one block: correct, but that stage then
    reads whole rows.
    """
    divisors = set()
    for d in range(1, math.isqrt(vocab) + 1):
        if vocab % d == 0:
            divisors.update((d, vocab // d))
    return min(d for d in divisors if d >= min(vocab, _PREFERRED_BLOCK))


def call_scalars(vocab: int, typical: TypicalParams) -> np.ndarray:
    """The ``scalars`` input of every chain and tree graph for one call (float32 ``[2 + P]``)."""
    block = argmax_block(vocab)
    return np.array([block // BLOCK_RADIX, block % BLOCK_RADIX, *typical.kernel_scalars()],
                    np.float32)
