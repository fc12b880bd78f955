"""Thread counts of a benchmark cell: parse a sweep, and give every CPU pool the same count.

Why every pool: the torch backend and ``torch.amax`` use torch's OpenMP pool
(``torch.set_num_threads``); the numba backend follows torch's count unless
``PORTABLE_VERIFY_NUM_THREADS`` overrides it, and runs in numba's own pool. Setting only one of
them would time a cell at a count the other pools ignore.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch

from portable_verify.bench.numba_runtime import THREADS_ENV


def parse_counts(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4): distinct, ascending, each >= 1 (the first is the base)."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"--threads: a comma list of thread counts, e.g. 1,2,4; got {text!r}")
    counts = sorted({int(p) for p in parts})
    if counts[0] < 1:
        raise ValueError(f"--threads: every count must be >= 1, got {text!r}")
    return tuple(counts)


def apply(count: int) -> None:
    """Run what follows on ``count`` threads in torch, the numba backend and numba's pool."""
    torch.set_num_threads(count)
    os.environ[THREADS_ENV] = str(count)
    numba = sys.modules.get("numba")  # only a pool that is already loaded needs telling
    if numba is not None and count <= numba.config.NUMBA_NUM_THREADS:
        numba.set_num_threads(count)


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Put torch's count and the override variable back afterwards (a bench run in-process, as
    in the tests, must not leave later calls on another count)."""
    torch_count, env = torch.get_num_threads(), os.environ.get(THREADS_ENV)
    numba = sys.modules.get("numba")
    numba_count = numba.get_num_threads() if numba is not None else None
    try:
        yield
    finally:
        torch.set_num_threads(torch_count)
        if env is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = env
        if numba_count is not None:
            numba.set_num_threads(numba_count)
