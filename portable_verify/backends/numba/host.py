"""Host-side runtime of the numba kernels: worker threads, host views, the options record
and the array tuple a kernel takes.

Why a module of its own: the chain backend (``backend.py``) and the tree walk (``tree.py``)
both run their kernels through these, and the tree module must not import the backend (the
backend imports the tree module on a tree call).
"""

from __future__ import annotations

import itertools
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from portable_verify.backends.numba.rules import REJECTION, TYPICAL
from portable_verify.core.constants import PROB_SUM_ATOL
from portable_verify.core.types import DEFAULT_TYPICAL, TypicalParams

try:  # numba is optional (the `cpu` extra)
    from portable_verify.backends.numba import chain as kernels
except ImportError:
    kernels = None

HALF = (torch.float16, torch.bfloat16)

EMPTY_I64_1 = np.empty(0, dtype=np.int64)
EMPTY_I64_2 = np.empty((0, 0), dtype=np.int64)
EMPTY_F32_1 = np.empty(0, dtype=np.float32)
EMPTY_F32_2 = np.empty((0, 0), dtype=np.float32)

PARALLEL_MIN_VALUES = 1 << 21
"""Target values (``B*K*V``) below which a call stays on the calling thread: waking and
scheduling a worker costs more than such a call's whole decision, and far more on a loaded
machine (docs/benchmarks.md, "Threads at serving scale" and "numba family")."""

ENV_THREADS = "PORTABLE_VERIFY_NUM_THREADS"

NO_TYPICAL = (0.0,) * len(DEFAULT_TYPICAL.kernel_scalars())
"""The record's typical fields (``TypicalParams.kernel_scalars()``'s) in another rule's call."""


def threads_for(values: int, requests: int) -> int:
    """Threads for a call reading about ``values`` target values: 1 below
    :data:`PARALLEL_MIN_VALUES`, else ``PORTABLE_VERIFY_NUM_THREADS`` if set, else the caller's
    ``torch.get_num_threads()`` (what vLLM's CPU worker sets), at most one per request."""
    if values < PARALLEL_MIN_VALUES or requests < 2:
        return 1
    wanted = os.environ.get(ENV_THREADS)
    n = int(wanted) if wanted and wanted.strip().isdigit() else torch.get_num_threads()
    return max(1, min(n, requests))


_POOL: dict[str, Any] = {"size": 0, "executor": None}
# A forked child inherits the executor but not its threads: it would queue work nobody runs.
os.register_at_fork(after_in_child=lambda: _POOL.update(size=0, executor=None))


def _pool(workers: int) -> ThreadPoolExecutor:
    """The module's worker threads (grown on demand; idle workers sleep, never spin)."""
    if _POOL["size"] < workers:
        _POOL.update(size=workers, executor=ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="portable-verify-numba"))
    return _POOL["executor"]


CHUNKS_PER_THREAD = 4
"""A parallel call's requests are cut into this many ranges per thread, which the threads claim
in turn. Why not one range each: right after a torch op at N threads, torch's OpenMP workers
spin on their cores for a few milliseconds (libgomp's default wait policy), so one of our
workers can get half a core; with equal halves the call waits for it, with claimed ranges the
other thread takes more (docs/benchmarks.md, "Threads at serving scale")."""


def run_split(kernel: Any, b: int, threads: int, before: tuple, after: tuple) -> int:
    """``kernel(*before, lo, hi, *after)`` over disjoint ranges of the ``b`` requests on
    ``threads`` threads at once (the kernel releases the GIL), the calling thread one of them;
    returns the largest flag. A request's result depends only on its own inputs, so neither
    the ranges nor who runs them can change a result (bit-identical at any thread count)."""
    if threads <= 1:
        return kernel(*before, 0, b, *after)
    ranges = min(b, threads * CHUNKS_PER_THREAD)
    bounds = [b * r // ranges for r in range(ranges + 1)]
    claim = itertools.count().__next__  # atomic under the GIL: each range is run once

    def drain() -> int:
        error = 0
        while (r := claim()) < ranges:
            error = max(error, kernel(*before, bounds[r], bounds[r + 1], *after))
        return error

    futures = [_pool(threads - 1).submit(drain) for _ in range(threads - 1)]
    error = drain()
    return max([error] + [f.result() for f in futures])


def host_array(t: Any, dtype: Any) -> np.ndarray:
    """A C-contiguous numpy array of ``dtype`` viewing ``t`` where possible (a copy otherwise)."""
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else t
    return np.ascontiguousarray(a, dtype=dtype)


def call_record(is_logits: bool, all_greedy: bool, rule: int, typical: TypicalParams,
                check: bool, seed_mode: int = 1, seed_scalar: int = 0, offset_scalar: int = 0,
                temp_scalar: float = 1.0, atol: float = PROB_SUM_ATOL,
                q_atol: float = PROB_SUM_ATOL, children: int = 0, max_depth: int = 0
                ) -> np.ndarray:
    """A call's options and scalars as the kernels' one record (:data:`chain.OPTIONS`): the
    one place it is built, for chain, block and tree kernels alike. ``rule``: the code of the
    sampled rows' rule (``rules.py``); ``typical``: the call's parameters, packed for a typical
    call only (a record per distinct value). Positional on the hot path (keyword dictionaries
    cost more than a small call's decision)."""
    scalars = typical.kernel_scalars() if rule == TYPICAL else NO_TYPICAL
    return record_of((is_logits, all_greedy, check, rule, seed_mode, seed_scalar,
                      offset_scalar, temp_scalar, *scalars, atol, q_atol, children, max_depth))


def options_record(*, is_logits: bool, all_greedy: bool = False, rule: int = REJECTION,
                   typical: TypicalParams = DEFAULT_TYPICAL, check: bool = True,
                   seed_mode: int = 1, seed_scalar: int = 0, offset_scalar: int = 0,
                   temp_scalar: float = 1.0, atol: float = PROB_SUM_ATOL,
                   q_atol: float = PROB_SUM_ATOL) -> np.ndarray:
    """:func:`call_record` by keyword (host-array entry points, tests, benchmarks)."""
    return call_record(is_logits, all_greedy, rule, typical, check, seed_mode, seed_scalar,
                       offset_scalar, temp_scalar, atol, q_atol)


def call_arrays(rows: np.ndarray = EMPTY_I64_2, counts: np.ndarray = EMPTY_I64_1,
                q: np.ndarray = EMPTY_F32_2, qrows: np.ndarray = EMPTY_I64_2,
                temps: np.ndarray = EMPTY_F32_1, uniforms: np.ndarray = EMPTY_F32_2,
                seeds: np.ndarray = EMPTY_I64_1, offsets: np.ndarray = EMPTY_I64_1,
                bonus: np.ndarray = EMPTY_I64_1) -> tuple[np.ndarray, ...]:
    """The chain kernels' array tuple (:data:`chain.ARRAYS`' order), an array the call leaves
    out empty, so every call of one dtype combination has one kernel signature."""
    return rows, counts, q, qrows, temps, uniforms, seeds, offsets, bonus


def record_of(fields: tuple[Any, ...]) -> np.ndarray:
    """The record of ``fields`` (:data:`chain.OPTIONS`' fields in order), packed with
    :mod:`struct` and kept per distinct value: ``np.array`` of a tuple costs more than a whole
    small call's decision, and kernels only read records."""
    record = _RECORDS.get(fields)
    if record is None:
        if len(_RECORDS) >= 1024:
            _RECORDS.clear()
        record = _RECORDS[fields] = np.empty(1, dtype=kernels.OPTIONS)
        _RECORD.pack_into(record.data, 0, *fields)
    return record


def _record_struct(dtype: np.dtype) -> struct.Struct:
    """A :class:`struct.Struct` laying out ``dtype``'s fields at their offsets (native order)."""
    codes = {("b", 1): "?", ("i", 8): "q", ("f", 8): "d"}
    layout, end = "=", 0
    for name in dtype.names:
        field, offset = dtype.fields[name][:2]
        layout += "x" * (offset - end) + codes[(field.kind, field.itemsize)]
        end = offset + field.itemsize
    return struct.Struct(layout + "x" * (dtype.itemsize - end))


_RECORD = _record_struct(kernels.OPTIONS) if kernels is not None else None
_RECORDS: dict[tuple[Any, ...], np.ndarray] = {}
