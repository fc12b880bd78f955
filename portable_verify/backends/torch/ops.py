"""The array layer of the torch backend: :class:`ArrayOps` and the row passes written once for
numpy views (CPU) and torch tensors (devices).

Why its own module: the rules (``backend``, ``block``, ``tree`` of this family) are
written against these operations; keeping them apart lets a rule module read as the rule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from portable_verify.core.constants import FLOAT32_MAX, FLOAT32_TINY

Array = Any  # np.ndarray on the host path, torch.Tensor on devices

HOST_ARRAYS = True
"""Run CPU calls on numpy views of the tensors. Tests switch it off to run the device (torch)
code path on CPU, since CI has no accelerator."""



class ArrayOps:
    """The array operations whose spelling differs between numpy (CPU) and torch (devices).

    Why numpy on CPU: a numpy call on a ``[B, K]``-sized array costs a fraction of a torch op's,
    and those calls are most of a small call; and on one core numpy's float32 ``exp`` and
    ``log`` are faster than torch's (docs/benchmarks.md). Where torch is the
    faster one (sums, clamps, row copies) the host path calls it on the same memory through
    ``torch.from_numpy``. Nothing is copied between the two. Everything else is written once
    and runs with torch on accelerators (no host synchronisation there).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.host = device.type == "cpu" and HOST_ARRAYS
        self.xp: Any = np if self.host else torch

    def array(self, t: torch.Tensor | np.ndarray) -> Array:
        return t.numpy() if self.host and isinstance(t, torch.Tensor) else t

    def tensor(self, a: Array) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)) if self.host else a

    def arange(self, n: int) -> Array:
        return np.arange(n) if self.host else torch.arange(n, device=self.device)

    def rowmax(self, x: Array) -> Array:
        return x.max(-1) if self.host else x.amax(-1)

    def rowmin(self, x: Array) -> Array:
        return x.min(-1) if self.host else x.amin(-1)

    def first(self, mask: Array) -> tuple[int, ...]:
        """Index of the first True entry (only called to word an error)."""
        found = np.argwhere(mask) if self.host else torch.nonzero(mask).cpu()
        return tuple(int(i) for i in found[0])


    def rowsum(self, x: Array) -> Array:
        """Sums over the last dim (on the host torch's vectorised sum, faster than numpy's per
        element, except for small arrays, where numpy's call is cheaper)."""
        if self.host and x.size >= SMALL_SCRATCH:
            return torch.from_numpy(x).sum(-1).numpy()
        return x.sum(-1)

    def rowdot(self, a: Array, b: Array) -> Array:
        """Per-row ``sum(a * b)`` in one pass (a batched BLAS dot on the host)."""
        if self.host:
            return (a[:, None, :] @ b[:, :, None])[:, 0, 0]
        return torch.linalg.vecdot(a, b)

    def f64(self, x: Array) -> Array:
        return x.astype(np.float64) if self.host else x.double()

    def cumsum64(self, x: Array) -> Array:
        if self.host:
            return np.cumsum(x, axis=1, dtype=np.float64)
        return torch.cumsum(x, 1, dtype=torch.float64)

    def concat(self, parts: list[Array], axis: int = 0) -> Array:
        return np.concatenate(parts, axis) if self.host else torch.cat(parts, axis)

    def clip(self, x: Array, low: float | None = None, high: float | None = None) -> Array:
        """``x`` clamped; on the host by ufuncs (``ndarray.clip`` has a far larger fixed cost)."""
        if not self.host:
            return x.clamp(low, high)
        if low is not None:
            x = np.maximum(x, low)
        return x if high is None else np.minimum(x, high)

    def repeat(self, x: Array, times: int) -> Array:
        """Each entry of a 1-d array ``times`` times in a row."""
        return np.repeat(x, times) if self.host else x.repeat_interleave(times)

    def pick(self, x: Array, idx: Array) -> Array:
        """``x[i, idx[i]]`` for every row ``i``."""
        if self.host:
            return x[np.arange(idx.shape[0]), idx]
        return x.gather(1, idx.unsqueeze(1)).squeeze(1)

    def take(self, x: Array, idx: Array) -> Array:
        """``x[i, idx[i, j]]``: ``idx`` is ``[rows, m]``."""
        return x[np.arange(idx.shape[0])[:, None], idx] if self.host else x.gather(1, idx)

    def relu_(self, x: Array) -> Array:
        """``max(x, 0)`` in place (on the host torch's, faster than numpy's ``maximum`` per
        element, except for small arrays)."""
        if self.host and x.size < SMALL_SCRATCH:
            return np.maximum(x, 0.0, out=x)
        (torch.from_numpy(x) if self.host else x).clamp_min_(0.0)
        return x

    def exp_(self, x: Array) -> Array:
        return np.exp(x, out=x) if self.host else x.exp_()

    def log(self, x: Array) -> Array:
        return np.log(x) if self.host else torch.log(x)

    def argmax(self, x: Array) -> Array:
        """Per-row argmax, lowest index on ties, int64."""
        return x.argmax(-1)

    def load(self, source: torch.Tensor, rows: Array, out: torch.Tensor | np.ndarray) -> Array:
        """``source[rows]`` as float32 in the scratch buffer ``out`` (an index copy, any dtype)."""
        if isinstance(out, np.ndarray):  # a small host buffer (see _scratch_buffers)
            if source.dtype == torch.float32:
                return np.take(source.numpy(), rows, axis=0, out=out)
            out[...] = source[torch.from_numpy(rows)].float().numpy()
            return out
        idx = torch.from_numpy(rows) if self.host else rows
        if source.dtype == torch.float32:
            torch.index_select(source, 0, idx, out=out)
        else:
            out.copy_(source.index_select(0, idx))
        return self.array(out)

    def values(self, source: torch.Tensor, rows: Array, cols: Array) -> Array:
        """float32 ``source[rows, cols]`` (a few values)."""
        if self.host and source.dtype == torch.float32:
            return source.numpy()[rows, cols]
        if self.host:
            return source[torch.from_numpy(rows), torch.from_numpy(cols)].float().numpy()
        return source[rows, cols].float()

    def target_argmax(self, target: torch.Tensor) -> Array:
        """Row argmax of the whole target. numpy's argmax reads memory several times faster than
        ``torch.argmax`` on CPU (docs/benchmarks.md) and also returns the first maximal index."""
        if self.host and target.dtype == torch.float32:
            return np.argmax(target.numpy(), axis=-1)
        return self.array(torch.argmax(target, dim=-1))


def leading_true(mask: Array) -> Array:
    """Length of the all-True prefix of each row of a bool ``[B, K]`` array (int64 ``[B]``)."""
    return mask.cumprod(1).sum(1)


def _row_map(ops: ArrayOps, rows: Any, num_rows: int) -> Array:
    """A row map as the backend indexes it; on accelerators clamped into the tensor, because
    there an index from garbage (``validate=False``) is a device-side assert that poisons the
    process, where the host raises ``IndexError`` for that one call."""
    rows = ops.array(rows)
    return rows if ops.host else rows.clamp(0, max(num_rows - 1, 0))


def _temperatures(ops: ArrayOps, t: Array) -> Array:
    """Per-request T clamped into the normal float32 range as the reference does (+inf -> the
    largest float); 1 on greedy rows, whose sampled answer is discarded."""
    return ops.xp.where(t > 0, ops.clip(t, FLOAT32_TINY, FLOAT32_MAX), 1.0)


CPU_TILE_ELEMENTS = 1 << 17
"""Row-pass tile on CPU (512 KiB of float32): small enough that every intermediate of a tile
stays in the core's L2 cache, so the target is read from memory once instead of once per op."""

CPU_FINAL_TILE_ELEMENTS = 1 << 20
"""Tile of the one-row-per-request stage on CPU (4 MiB): that stage runs dozens of small ops per
tile (the draw), so fewer, larger tiles win over L2 residency."""

_scratch = threading.local()
SMALL_SCRATCH = 1 << 14
"""Below this many elements (64 KiB) a fresh buffer is cheaper than the per-thread pool."""


def _scratch_buffers(count: int, rows: int, width: int,
                     ops: ArrayOps) -> list[torch.Tensor | np.ndarray]:
    """``count`` float32 ``[rows, width]`` work buffers.

    On CPU they are kept per thread and reused across calls: a fresh multi-MiB buffer costs a
    page fault per 4 KiB on first touch, which at B = 64, V = 128k was as dear as the work
    itself (docs/benchmarks.md). Per-thread buffers keep concurrent callers apart. Small
    ones are fresh, and plain numpy arrays on the host path (the cheapest to make and fill).
    """
    need = rows * width
    if ops.host and need < SMALL_SCRATCH:
        return [np.empty((rows, width), dtype=np.float32) for _ in range(count)]
    if ops.device.type != "cpu" or need < SMALL_SCRATCH:
        return [torch.empty(rows, width, dtype=torch.float32, device=ops.device)
                for _ in range(count)]
    pool: list[torch.Tensor] = getattr(_scratch, "pool", [])
    pool += [torch.empty(0) for _ in range(count - len(pool))]
    for i in range(count):
        if pool[i].numel() < need:
            pool[i] = torch.empty(need, dtype=torch.float32)
    _scratch.pool = pool
    return [pool[i][:need].view(rows, width) for i in range(count)]


def per_row(ops: ArrayOps, fn: Callable[..., tuple[Array, ...]], *row_args: Array, width: int,
            scratch: int = 0, tile: int | None = None) -> tuple[Array, ...]:
    """``fn(*row_args, bufs)`` -> per-row results, computed over cache-sized row tiles on CPU.

    ``row_args`` share their first dimension (the rows); each row stands for ``width`` float32
    values of work. Why tiles: each array op streams its whole input through memory, so a chain
    of full-size ops (load, max, subtract, exp, sum) costs several memory passes plus page
    faults for the full-size temporaries. On CPU the chain
    runs tile by tile (a loop over fixed-size memory blocks, not over requests), and ``scratch``
    float32 ``[tile rows, width]`` buffers (:func:`_scratch_buffers`) are handed to ``fn`` (as
    ``bufs``, sliced to the tile), so temporaries stay in cache and nothing large is allocated.
    ``tile`` is the tile size in elements (default :data:`CPU_TILE_ELEMENTS`).
    Other devices get one full-size call: their memory is fast and a loop of small kernels
    would only add launches.
    """
    r = row_args[0].shape[0]
    tile = CPU_TILE_ELEMENTS if tile is None else tile
    step = max(1, tile // max(width, 1)) if ops.device.type == "cpu" else r
    step = min(step, r)
    bufs = _scratch_buffers(scratch, step, width, ops)
    if step >= r:
        return fn(*row_args, bufs)
    parts = [fn(*(a[i:i + step] for a in row_args), [buf[: min(step, r - i)] for buf in bufs])
             for i in range(0, r, step)]
    return tuple(ops.concat(list(column)) for column in zip(*parts, strict=True))


def _finite_rowdot(ops: ArrayOps, e: Array, y: Array) -> Array:
    """Per-row ``sum(e * y)`` with ``0 * -inf = 0`` (``y = -inf`` where ``e = 0``).

    On the host one BLAS pass, redone with ``-inf -> 0`` only for the (rare) rows it left NaN;
    on devices the replacement pass always runs (no host branch, so no synchronisation).
    """
    if not ops.host:
        return ops.rowdot(e, y.nan_to_num_(neginf=0.0))
    out = ops.rowdot(e, y)
    bad = np.isnan(out)
    if bad.any():
        out[bad] = ops.rowdot(e[bad], np.nan_to_num(y[bad], neginf=0.0))
    return out


def _logits_sums(ops: ArrayOps, target: torch.Tensor,
                 typical: bool) -> Callable[..., tuple[Array, ...]]:
    """Per read row: ``m = max l``, ``s = sum e`` (and ``sum e y`` for typical), where
    ``y = (l - m) / T`` and ``e = exp(y)``: one chain of in-place ops on a cache-resident tile.

    The maximum is subtracted before dividing: ``l / T`` alone overflows for huge logits or
    tiny ``T``. ``y`` lies in ``[-inf, 0]``; ``-inf`` logits get probability 0.
    """

    def sums(rows: Array, t: Array, bufs: list[torch.Tensor]) -> tuple[Array, ...]:
        y = ops.load(target, rows, bufs[0])
        m = ops.rowmax(y)
        y -= m[:, None]
        y /= t[:, None]
        if not typical:
            return m, ops.rowsum(ops.exp_(y))
        e = ops.array(bufs[1])
        ops.xp.exp(y, out=e)
        return m, ops.rowsum(e), _finite_rowdot(ops, e, y)

    return sums


def _probs_entropy(ops: ArrayOps, target: torch.Tensor) -> Callable[..., tuple[Array]]:
    """Per read row, ``H = -sum p log p`` with ``0 log 0 = 0``: ``log(p + tiny)`` is ``log p``
    for every ``p`` that matters and finite at 0, so one ``log`` and one dot suffice (``xlogy``
    is slower on CPU)."""

    def entropy(rows: Array, bufs: list[torch.Tensor]) -> tuple[Array]:
        p = ops.load(target, rows, bufs[0])
        log_p = ops.array(bufs[1])
        ops.xp.add(p, FLOAT32_TINY, out=log_p)
        ops.xp.log(log_p, out=log_p)
        return (-ops.rowdot(p, log_p),)

    return entropy
