"""Device-generic torch backend: one vectorised code path for CPU, CUDA and XPU tensors.

Costs, per call (B requests, K drafts, V vocabulary):
* greedy: one argmax pass over the target rows; no softmax, no random numbers;
* rejection: from probabilities, only ``p(x)``/``q(x)`` at the draft ids plus one target row (and
  one draft row) per request: the row where the request rejected, or its bonus row; from logits,
  additionally one log-sum-exp pass over the ``B*K`` draft rows (not the bonus rows);
* typical: the log-sum-exp and entropy in the same single pass over the draft rows, then the
  same single row per request;
* the one draw per request is a two-level inverse-CDF search (block sums, then one block), not a
  full cumulative sum.
The code is written once against :class:`ArrayOps`: on CPU it runs on numpy views of the
tensors (no copy), elsewhere on torch. There is no loop over requests and no host-device
synchronisation. On CPU the row passes run over cache-sized tiles of the target
(:func:`per_row`): a loop over fixed-size memory blocks that keeps each tile's temporaries in
cache; figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs
from portable_verify.core.validation import PROB_SUM_ATOL, PROB_SUM_ATOL_HALF, in_float32_note

Array = Any  # np.ndarray on the host path, torch.Tensor on devices

HOST_ARRAYS = True
"""Run CPU calls on numpy views of the tensors. Tests switch it off to run the device (torch)
code path on CPU, since CI has no accelerator."""

FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


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


def emit(ops: ArrayOps, drafts: Array, final: Array, accepted: Array) -> Array:
    """``[B, K+1]``: accepted drafts, the final token at position ``a``, then placeholders."""
    col = ops.arange(drafts.shape[1] + 1)[None, :]
    a = accepted[:, None]
    out = ops.xp.where(col == a, final[:, None], ops.concat([drafts, final[:, None]], 1))
    return ops.xp.where(col > a, PLACEHOLDER_TOKEN_ID, out)


def _place(index: tuple[int, ...]) -> str:
    """``(i,)`` -> "request i"; ``(i, j)`` -> "request i, position j"."""
    return ", ".join(f"{what} {i}" for what, i in zip(("request", "position"), index,
                                                     strict=False))


class ReadChecks:
    """The default level of validation, riding on the passes the decision makes anyway.

    Each check covers exactly what the decision reads (docs/semantics.md, Validation): the
    argmax the greedy decision takes, the maximum of every logits row the softmax normalises,
    ``p(x)`` and ``q(x)`` where they are compared, and the one row per request a draw reads in
    full. Flags are collected as arrays and inspected once, after the decision (one host
    transfer on a device), so a call with good inputs pays a few reductions over rows that
    are already in cache.
    """

    def __init__(self, ops: ArrayOps, inputs: VerifyInputs) -> None:
        self.ops = ops
        self.target_name = "target_logits" if inputs.target_is_logits else "target_probs"
        half = (torch.float16, torch.bfloat16)
        self.atol = {name: PROB_SUM_ATOL_HALF if t.dtype in half else PROB_SUM_ATOL
                     for name, t in (("target_probs", inputs.target),
                                     ("draft_probs", inputs.draft_probs)) if t is not None}
        self._flags: list[tuple[Array, Callable[[tuple[int, ...]], str]]] = []
        self.note = in_float32_note(inputs.target.dtype)  # rows are read as float32

    def add(self, bad: Array, message: Callable[[tuple[int, ...]], str]) -> None:
        """``bad``: True where a value the decision read is invalid (``[B]`` per request or
        ``[B, K+1]`` per position); ``message(first bad index)`` words the error."""
        self._flags.append((bad, message))

    def maxima(self, top: Array, read: Array) -> None:
        """Row maxima of logits rows: NaN or +inf anywhere lands in the maximum (so does a
        NaN in the argmax of numpy and torch); -inf means the row has no finite logit."""
        xp, name = self.ops.xp, self.target_name
        if name == "target_probs":
            self.add((xp.isnan(top) | xp.isinf(top) | (top < 0)) & read,
                     lambda i: f"{name} contains NaN, inf or negative entries{self.note} (first "
                               f"in the row of {_place(i)})")
            return
        self.add((xp.isnan(top) | xp.isposinf(top)) & read,
                 lambda i: f"{name} contains NaN or +inf{self.note} (first in the row of "
                           f"{_place(i)})")
        self.add(xp.isneginf(top) & read,
                 lambda i: f"{name} has a row of only -inf (first: the row of {_place(i)})")

    def values(self, name: str, vals: Array, read: Array) -> None:
        """Probabilities the decision compares (``p(x)``, ``q(x)``) or an entropy: finite
        and non-negative (NaN fails ``>= 0``)."""
        self.add(~((vals >= 0) & self.ops.xp.isfinite(vals)) & read,
                 lambda i: f"{name} contains NaN, inf or negative entries (first in the row of "
                           f"{_place(i)})")

    def distribution(self, name: str, low: Array, total: Array, read: Array) -> None:
        """A row a draw reads in full: non-negative entries summing to 1 within tolerance."""
        xp, atol = self.ops.xp, self.atol[name]
        bad_value = ~((low >= 0) & xp.isfinite(total)) & read
        self.add(bad_value, lambda i: f"{name} contains NaN, inf or negative entries (first "
                                      f"in the row {_place(i)} draws from)")
        self.add((xp.abs(total - 1) > atol) & read & ~bad_value,
                 lambda i: f"{name} rows must sum to 1 within {atol}; the row {_place(i)} "
                           f"draws from sums to {float(total[i]):.6g}")

    def raise_first(self) -> None:
        if not self._flags:
            return
        if self.ops.host:
            hits = [bool(bad.any()) for bad, _ in self._flags]
        else:  # one host transfer for every flag
            hits = torch.stack([bad.any() for bad, _ in self._flags]).tolist()
        for (bad, message), hit in zip(self._flags, hits, strict=True):
            if hit:
                raise ValueError(message(self.ops.first(bad)))


def verify_torch(inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised semantics of docs/semantics.md for torch tensors on any device.

    With ``inputs.check_read_values`` the default level of validation runs on the way
    (:class:`ReadChecks`) and raises ``ValueError`` before anything is returned.
    """
    if inputs.target.requires_grad or getattr(inputs.draft_probs, "requires_grad", False):
        inputs = dataclasses.replace(inputs, target=inputs.target.detach(), draft_probs=(
            None if inputs.draft_probs is None else inputs.draft_probs.detach()))
    ops = ArrayOps(inputs.target.device)
    with np.errstate(all="ignore"):  # -inf - -inf and overflow only arise for garbage inputs
        token_ids, accepted = _verify(ops, inputs)
    return ops.tensor(token_ids), ops.tensor(accepted)


def _verify(ops: ArrayOps, inputs: VerifyInputs) -> tuple[Array, Array]:
    checks = ReadChecks(ops, inputs) if getattr(inputs, "check_read_values", False) else None
    a, final, drafts = _decide(ops, inputs, checks)
    if checks is not None:
        checks.raise_first()
    return emit(ops, drafts, final, a), a


def _row_map(ops: ArrayOps, rows: Any, num_rows: int) -> Array:
    """A row map as the backend indexes it; on accelerators clamped into the tensor, because
    there an index from garbage (``validate=False``) is a device-side assert that poisons the
    process, where the host raises ``IndexError`` for that one call."""
    rows = ops.array(rows)
    return rows if ops.host else rows.clamp(0, max(num_rows - 1, 0))


def _decide(ops: ArrayOps, inputs: VerifyInputs,
            checks: ReadChecks | None) -> tuple[Array, Array, Array]:
    """``(accepted, final token, drafts)`` per request."""
    drafts = ops.array(inputs.draft_token_ids)
    n = ops.array(inputs.num_draft_tokens)
    rows = _row_map(ops, inputs.target_rows, inputs.target.shape[0])
    k = drafts.shape[1]
    v_size = inputs.vocab_size
    # An id outside the vocabulary (only with validate=False) has probability 0: never accepted.
    valid = (ops.arange(k)[None, :] < n[:, None]) & (drafts >= 0) & (drafts < v_size)
    if inputs.all_greedy:
        return (*_greedy(ops, inputs.target, drafts, valid, rows, checks, None), drafts)
    greedy_row = None if inputs.none_greedy else ops.array(inputs.temperature) == 0
    x = ops.clip(drafts, 0, v_size - 1)  # gathers stay in range even for garbage (validate=False)
    sampled = _block if _method(inputs) == "block" else _sampled
    a, final = sampled(ops, inputs, x, valid, ops.clip(n, 0, k), rows, checks, greedy_row)
    if greedy_row is not None:
        greedy_a, greedy_final = _greedy(ops, inputs.target, drafts, valid, rows, checks,
                                         greedy_row)
        a = ops.xp.where(greedy_row, greedy_a, a)
        final = ops.xp.where(greedy_row, greedy_final, final)
    return a, final, drafts


def _method(inputs: VerifyInputs) -> str:
    """The rule of the sampled rows (the one place this backend reads it)."""
    return inputs.sampled_method


def _greedy(ops: ArrayOps, target: torch.Tensor, drafts: Array, valid: Array, rows: Array,
            checks: ReadChecks | None, greedy_row: Array | None) -> tuple[Array, Array]:
    """Greedy decisions; ``greedy_row`` (None: all) marks the requests they apply to."""
    g = ops.target_argmax(target)[rows]  # [B, K+1]
    a = leading_true((drafts == g[:, : drafts.shape[1]]) & valid)
    if checks is not None:  # the decision read the argmax of rows 0..a
        read = ops.arange(g.shape[1])[None, :] <= a[:, None]
        checks.maxima(ops.values(target, rows, g), read if greedy_row is None
                      else read & greedy_row[:, None])
    return a, ops.pick(g, a)


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


DRAW_BLOCK = 256
"""Block length of the two-level inverse-CDF draw (used when ``V > 4 * DRAW_BLOCK``)."""


def _count_below(c: Array, threshold: Array) -> Array:
    """Per row, the smallest ``t`` with ``c[t] >= threshold`` for a non-decreasing ``c`` (a
    batched ``searchsorted``; numpy's is one-dimensional)."""
    return (c < threshold[:, None]).sum(1)


def _draw(ops: ArrayOps, weights: Array, v: Array) -> tuple[Array, Array]:
    """``(t, total)``: per row the smallest ``t`` with ``cumsum(w)[t] >= v * sum(w)``.

    Why two levels: a cumulative sum is a sequential scan (the dearest step of a rejection at
    V = 128k on one CPU core), but the draw only needs the crossing point.
    Block sums (a vectorised float32 reduction) locate the crossing block; one
    ``DRAW_BLOCK``-long scan inside it finds the token. Prefixes are accumulated and compared in
    float64 as docs/semantics.md prescribes, so the pick differs from the reference's sequential
    scan only where a threshold lies within rounding of a prefix sum (the conformance check
    ``exact.large_vocab_draws`` counts such rows). The pick always has ``w[t] > 0`` when the
    total is positive. Small vocabularies take the full scan.
    """
    b, v_size = weights.shape
    v64 = ops.f64(v)
    if v_size <= 4 * DRAW_BLOCK or b == 0:
        c = ops.cumsum64(weights)
        total = c[:, -1]
        # The clamp: NaN rows (validate=False) still give an id in range.
        return ops.clip(_count_below(c, v64 * total), high=v_size - 1), total
    n_full = v_size // DRAW_BLOCK
    # Block sums in float32: a 256-term vectorised sum errs by far less than the drift of a
    # 128k-long float32 scan, and float64 reductions are far slower on CPU.
    blocks = weights[:, : n_full * DRAW_BLOCK].reshape(b, n_full, DRAW_BLOCK)
    sums = ops.rowsum(blocks)
    if n_full * DRAW_BLOCK < v_size:
        sums = ops.concat([sums, ops.rowsum(weights[:, n_full * DRAW_BLOCK:])[:, None]], 1)
    cb = ops.cumsum64(sums)
    total = cb[:, -1]
    threshold = v64 * total
    blk = ops.clip(_count_below(cb, threshold), high=cb.shape[1] - 1)
    prefix = ops.xp.where(blk > 0, ops.pick(cb, ops.clip(blk - 1, low=0)), 0.0)
    inner = ops.arange(DRAW_BLOCK)
    idx = blk[:, None] * DRAW_BLOCK + inner[None, :]
    block = ops.take(weights, ops.clip(idx, high=v_size - 1)) * (idx < v_size)
    t_in = _count_below(prefix[:, None] + ops.cumsum64(block), threshold)
    # Rounding can leave the block's last partial sum a hair under the threshold the block sums
    # crossed; then the block's last positive weight is the crossing token.
    last_pos = ops.rowmax(inner[None, :] * (block > 0))
    t = blk * DRAW_BLOCK + ops.xp.where(t_in < DRAW_BLOCK, t_in, last_pos)
    return ops.clip(t, high=v_size - 1), total


def draw(weights: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_draw` for torch tensors (``weights`` float32 ``[B, V]`` >= 0, ``v`` in (0, 1])."""
    ops = ArrayOps(weights.device)
    t, total = _draw(ops, ops.array(weights), ops.array(v))
    return ops.tensor(t), ops.tensor(total)


def inverse_cdf_draw(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per row, the smallest ``t`` with ``cumsum(w)[t] >= v * cumsum(w)[-1]``, by a full float64
    cumulative sum (what :func:`draw` does in two levels)."""
    c = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    t = torch.searchsorted(c, (v.double() * c[:, -1]).unsqueeze(1)).squeeze(1)
    return t.clamp_(max=weights.shape[-1] - 1)


def _draw_from_residual(ops: ArrayOps, p: Array, q: Array, rejected: Array,
                        v: Array) -> Array:
    """Draw from ``max(0, p - q)`` on rejected rows (``p`` when that is empty) and ``p`` otherwise.

    Both draws are made and the right one picked per row: a second two-level draw costs one
    vectorised block-sum pass, less than testing the residual for emptiness and selecting rows.
    ``q`` is consumed (overwritten) to avoid another row-sized temporary.
    """
    ops.xp.subtract(p, q, out=q)
    from_residual, total = _draw(ops, ops.relu_(q), v)
    return ops.xp.where(rejected & (total > 0), from_residual, _draw(ops, p, v)[0])


def _draw_without_draft(ops: ArrayOps, p: Array, x_a: Array, rejected: Array,
                        v: Array) -> Array:
    """The same draw for a one-hot draft: the residual is ``p`` with ``x`` zeroed.

    ``p`` is consumed. When that residual is empty, ``p`` has no mass outside ``x``, so the
    draw from ``p`` the semantics prescribe is ``x`` itself (for any ``v`` in (0, 1]).
    """
    at = ops.arange(p.shape[0])
    p[at, x_a] = ops.xp.where(rejected, 0.0, p[at, x_a])
    t, total = _draw(ops, p, v)
    return ops.xp.where(rejected & ~(total > 0), x_a, t)


def _sampled(ops: ArrayOps, inputs: VerifyInputs, x: Array, valid: Array, n: Array, rows: Array,
             checks: ReadChecks | None, greedy_row: Array | None) -> tuple[Array, Array]:
    """Accepted counts and final tokens of sampled rows (rejection or typical)."""
    xp = ops.xp
    b, k = x.shape
    target, v_size = inputs.target, inputs.vocab_size
    typical = _method(inputs) == "typical"
    u = ops.array(inputs.uniforms)
    read = rows[:, :k]  # the rows a decision reads: draft positions, never the bonus row
    flat = read.reshape(-1)

    t = None
    if inputs.target_is_logits:
        t = _temperatures(ops, ops.array(inputs.temperature))
        t_read = ops.repeat(t, k)
        m, s, *ey = per_row(ops, _logits_sums(ops, target, typical), flat, t_read, width=v_size,
                            scratch=2 if typical else 1)
        m, s = m.reshape(b, k), s.reshape(b, k)
        e_x = ops.values(target, read, x) - m
        e_x /= t[:, None]
        px = ops.exp_(e_x) / s  # the reference's e(x) / sum(e)
        entropy = ops.log(s) - ey[0].reshape(b, k) / s if typical else None
    else:
        px = ops.values(target, read, x)
        entropy = (per_row(ops, _probs_entropy(ops, target), flat, width=v_size, scratch=2)[0]
                   .reshape(b, k) if typical else None)

    if typical:
        accept = px > inputs.options.typical.threshold(entropy, xp)
    else:
        accept = px > 0
        if inputs.draft_probs is not None:
            q_map = _row_map(ops, inputs.draft_rows, inputs.draft_probs.shape[0])
            qx = ops.values(inputs.draft_probs, q_map, x)
            accept &= u[:, :k] * qx <= px
        else:
            accept &= u[:, :k] <= px
    a = leading_true(accept & valid)
    sampled = True if greedy_row is None else ~greedy_row
    if checks is not None:  # what the acceptance tests read: positions j <= a, j < n
        pos = ops.arange(k)[None, :]
        read_d = (pos <= a[:, None]) & (pos < n[:, None]) & (
            True if greedy_row is None else sampled[:, None])
        if inputs.target_is_logits:
            checks.maxima(m, read_d)
        else:
            checks.values("target_probs", px, read_d)
            if typical:  # a non-finite entropy: NaN, inf or a negative entry in the row
                checks.values("target_probs", xp.where(xp.isfinite(entropy), 0.0, entropy),
                              read_d)
        if inputs.draft_probs is not None and not typical:
            checks.values("draft_probs", qx, read_d)

    # One target row per request: where it rejected, or its bonus row.
    row_a = ops.pick(rows, a)
    a_draft = ops.clip(a, high=max(k - 1, 0))
    x_a = ops.pick(x, a_draft) if k > 0 else a_draft
    q_rows = (ops.pick(_row_map(ops, inputs.draft_rows, inputs.draft_probs.shape[0]), a_draft)
              if inputs.draft_probs is not None and k > 0 else row_a)
    t_a = t if t is not None else u[:, k]  # (unused for probabilities)
    rejected = a < n
    token, *stats = per_row(ops, _final_token(ops, inputs, k, checks is not None), row_a, x_a,
                            q_rows, rejected, u[:, k], t_a, width=v_size, scratch=2,
                            tile=CPU_FINAL_TILE_ELEMENTS)
    if checks is not None:  # the row each request's draw (or argmax) read in full
        if inputs.target_is_logits:
            checks.maxima(stats[0], sampled)
        else:
            drawn = sampled & ~rejected if typical else sampled
            checks.distribution("target_probs", stats[0], stats[1], drawn)
        if inputs.draft_probs is not None and not typical and k > 0:
            checks.distribution("draft_probs", stats[-2], stats[-1], sampled & rejected)
    return a, token


def _final_token(ops: ArrayOps, inputs: VerifyInputs, k: int,
                 with_stats: bool) -> Callable[..., tuple[Array, ...]]:
    """The recovered-or-bonus token of requests from their one target row (and draft row).

    From logits the row becomes ``e = exp((l - max) / T)``: the draws need no normalisation,
    so the bonus row never needs a log-sum-exp; only a residual against ``q`` divides by
    ``sum(e)``. ``with_stats`` adds what :class:`ReadChecks` inspects, computed while the rows
    are in cache: the logits row's maximum, or the minimum and sum of the ``p`` (and ``q``) row.
    """
    target, draft_probs = inputs.target, inputs.draft_probs
    typical = _method(inputs) == "typical"
    logits = inputs.target_is_logits

    def final(row_a: Array, x_a: Array, q_rows: Array, rejected: Array, v: Array, t: Array,
              bufs: list[torch.Tensor]) -> tuple[Array, ...]:
        p = ops.load(target, row_a, bufs[0])
        stats: tuple[Array, ...] = ()
        if logits:
            top = ops.rowmax(p)
            stats = (top,) if with_stats else ()
            p -= top[:, None]
            p /= t[:, None]
            ops.exp_(p)
        elif with_stats:
            stats = (ops.rowmin(p), ops.rowsum(p))
        if typical:
            return (ops.xp.where(rejected, ops.argmax(p), _draw(ops, p, v)[0]), *stats)
        if k == 0:
            return (_draw(ops, p, v)[0], *stats)
        if draft_probs is not None:
            if logits:
                p /= ops.rowsum(p)[:, None]
            q = ops.load(draft_probs, q_rows, bufs[1])
            if with_stats:
                stats = (*stats, ops.rowmin(q), ops.rowsum(q))
            return (_draw_from_residual(ops, p, q, rejected, v), *stats)
        return (_draw_without_draft(ops, p, x_a, rejected, v), *stats)

    return final


def _rowsum64(ops: ArrayOps, w: Array) -> Array:
    """Per-row sum of float32 values as float64, for the block rule's ``Z_j``.

    The reference sums in float64; here torch's float32 cascade sum (~4x faster than a float64
    one on CPU; relative error ~1e-7 at V = 128k) is widened afterwards, as docs/semantics.md
    allows: the two only disagree where ``u_j`` lies within that rounding of ``h_j``."""
    return ops.f64(ops.rowsum(w))


def _block(ops: ArrayOps, inputs: VerifyInputs, x: Array, valid: Array, n: Array, rows: Array,
           checks: ReadChecks | None, greedy_row: Array | None) -> tuple[Array, Array]:
    """Accepted counts and final tokens of block verification (docs/semantics.md).

    Costs: ``p(x)``, ``q(x)`` at every draft (from logits with the log-sum-exp pass over the
    ``B*K`` draft rows, as rejection), then a backward scan over positions, vectorised over the
    batch: ``Z_j`` (one pass over rows ``j+1`` of ``p`` and ``q``) only for requests the scan
    reaches with ``u_j <= P_j``; on the host only those rows are read, on devices every row is
    computed and masked (no data-dependent indexing, so no synchronisation). Then one row per
    request for the draw, as rejection. ``validate=True`` is checked at the front door for this
    method (the rows read depend on the scan), so ``checks`` is not used here.
    """
    del checks, greedy_row  # greedy rows are replaced by the caller
    xp = ops.xp
    b, k = x.shape
    target, draft_probs, v_size = inputs.target, inputs.draft_probs, inputs.vocab_size
    logits = inputs.target_is_logits
    u = ops.array(inputs.uniforms)
    read = rows[:, :k]
    t = _temperatures(ops, ops.array(inputs.temperature)) if logits else None
    m = s = None
    if logits:
        m, s = per_row(ops, _logits_sums(ops, target, False), read.reshape(-1), ops.repeat(t, k),
                       width=v_size, scratch=1)
        m, s = m.reshape(b, k), s.reshape(b, k)
        e_x = ops.values(target, read, x) - m
        e_x /= t[:, None]
        px = ops.exp_(e_x) / s
    else:
        px = ops.values(target, read, x)
    q_map = _row_map(ops, inputs.draft_rows, draft_probs.shape[0]) if draft_probs is not None \
        else None
    qx = ops.values(draft_probs, q_map, x) if q_map is not None else xp.ones_like(px)
    px = xp.where(valid, px, 0.0)
    # P_j: a loop over positions (vectorised over the batch), float32 as the reference.
    one = xp.ones_like(px[:, 0]) if k > 0 else None
    chain = []
    prev = one
    for j in range(k):
        ratio = ops.clip(prev * px[:, j] / qx[:, j], high=1.0)
        prev = xp.where((prev == 0) | (px[:, j] == 0), 0.0, xp.where(qx[:, j] == 0, 1.0, ratio))
        chain.append(prev)
    mass = _block_mass(ops, inputs)
    a = xp.zeros_like(n)
    searching = n > 0
    for j in reversed(range(k)):
        cand = searching & (j < n) & (u[:, j] <= chain[j])
        last = cand & (n == j + 1)
        a = xp.where(last, n, a)
        mid = cand & (n > j + 1)
        searching = searching & ~last
        if j + 1 >= k:
            continue
        row_args = (rows[:, j + 1], q_map[:, j + 1] if q_map is not None else rows[:, j + 1],
                    x[:, j + 1], chain[j], m[:, j + 1] if logits else chain[j],
                    s[:, j + 1] if logits else chain[j], t if logits else chain[j])
        if ops.host:  # only the rows the scan needs
            idx = np.flatnonzero(mid)
            z = np.zeros(b, dtype=np.float64)
            if idx.size:
                z[idx] = per_row(ops, mass, *(arg[idx] for arg in row_args), width=v_size,
                                 scratch=2 if draft_probs is not None else 1)[0]
        else:
            z = per_row(ops, mass, *row_args, width=v_size,
                        scratch=2 if draft_probs is not None else 1)[0]
        p_j = ops.f64(chain[j])
        h = xp.where(z > 0, z / (z + (1.0 - p_j)), 0.0)
        hit = mid & (ops.f64(u[:, j]) <= h)
        a = xp.where(hit, j + 1, a)
        searching = searching & ~hit

    row_a = ops.pick(rows, a)
    a_draft = ops.clip(a, high=max(k - 1, 0))
    x_a = ops.pick(x, a_draft) if k > 0 else a_draft
    q_rows = ops.pick(q_map, a_draft) if q_map is not None and k > 0 else row_a
    if k > 0:
        scale = xp.where(a > 0, ops.pick(xp.stack(chain, 1), ops.clip(a - 1, low=0)), 1.0)
    else:
        scale = ops.clip(u[:, 0], 1.0, 1.0)  # all ones
    t_a = t if t is not None else u[:, k]  # (unused for probabilities)
    (token,) = per_row(ops, _block_final(ops, inputs, k), row_a, x_a, q_rows, a < n, scale,
                       u[:, k], t_a, width=v_size, scratch=2, tile=CPU_FINAL_TILE_ELEMENTS)
    return a, token


def _block_mass(ops: ArrayOps, inputs: VerifyInputs) -> Callable[..., tuple[Array]]:
    """Per request, ``Z_j = sum max(P_j * p_{j+1} - q_{j+1}, 0)`` from its row ``j+1``."""
    target, draft_probs = inputs.target, inputs.draft_probs
    logits = inputs.target_is_logits

    def mass(p_rows: Array, q_rows: Array, x_next: Array, scale: Array, m: Array, s: Array,
             t: Array, bufs: list[torch.Tensor]) -> tuple[Array]:
        w = ops.load(target, p_rows, bufs[0])
        if logits:
            w -= m[:, None]
            w /= t[:, None]
            ops.exp_(w)
            w /= s[:, None]
        w *= scale[:, None]
        if draft_probs is not None:
            w -= ops.load(draft_probs, q_rows, bufs[1])
        else:
            w[ops.arange(w.shape[0]), x_next] -= 1.0
        return (_rowsum64(ops, ops.relu_(w)),)

    return mass


def _block_final(ops: ArrayOps, inputs: VerifyInputs, k: int) -> Callable[..., tuple[Array]]:
    """The draw of block verification: from ``max(P_{a-1} p_a - q_a, 0)`` at row ``a < n``
    (``p_a`` when that is empty), from ``p_n`` when ``a = n``."""
    target, draft_probs = inputs.target, inputs.draft_probs
    logits = inputs.target_is_logits

    def final(row_a: Array, x_a: Array, q_rows: Array, rejected: Array, scale: Array,
              v: Array, t: Array, bufs: list[torch.Tensor]) -> tuple[Array]:
        p = ops.load(target, row_a, bufs[0])
        if logits:
            p -= ops.rowmax(p)[:, None]
            p /= t[:, None]
            ops.exp_(p)
            p /= ops.rowsum(p)[:, None]
        plain = _draw(ops, p, v)[0]
        if k == 0:
            return (plain,)
        p *= scale[:, None]  # p is not needed unscaled any more: no row-sized temporary
        if draft_probs is not None:
            w = ops.load(draft_probs, q_rows, bufs[1])
            ops.xp.subtract(p, w, out=w)
        else:
            w = p
            w[ops.arange(w.shape[0]), x_a] -= 1.0
        residual, total = _draw(ops, ops.relu_(w), v)
        return (ops.xp.where(rejected & (total > 0), residual, plain),)

    return final


class TorchBackend(Backend):
    """Eager torch on the device the inputs live on (``torch:cpu``, ``torch:cuda``, ...)."""

    name = "torch"
    traits = BackendTraits(checks_what_it_reads=True,  # validate=True rides on its passes
                           sampled_methods=("rejection", "typical", "block"))
    description = "device-generic eager torch (numpy argmax fast path on CPU float32)"
    devices = ("cpu", "cuda", "xpu")

    @classmethod
    def device_for(cls, torch_device_type: str) -> str:
        return torch_device_type

    def torch_device_type(self) -> str:
        return self.device or "cpu"

    def availability(self) -> Availability:
        module = getattr(torch, self.torch_device_type(), None)
        try:
            present = self.device == "cpu" or bool(module is not None and module.is_available())
        except Exception:  # a broken driver install must not break backend listing
            present = False
        if not present:
            return Availability(False, f"torch.{self.device}.is_available() is False "
                                       f"(torch {torch.__version__})")
        return Availability(True, f"torch {torch.__version__} on {self.device}")

    def run(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return verify_torch(inputs)
