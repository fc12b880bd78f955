"""Row maps: where each request's positions live in flat target and draft rows.

Why one module: the padded front door, the ragged one, the public rows door and the engine
adapters (vLLM v1 packs drafts back to back, its Model Runner V2 offsets them by one) all point
``[B, K+1]`` positions into flat ``[R, V]`` rows. The arithmetic is written here once, for numpy
(host calls: far below torch's per-op cost at small sizes, docs/benchmarks.md) and for torch
(any device).

Row ``j`` of request ``i`` is ``first_row[i] + min(j, n_i)``: positions past the request's drafts
repeat its final row, which backends read as the bonus position. Indices are clamped into the
arrays they point into, so garbage counts (``validate=False``) can never read out of bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Array = Any  # np.ndarray or torch.Tensor


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """A flat call's layout described, not built: for a backend that computes the row maps
    on its device from the caller's counts or offsets (``traits.lean_calls``), instead of the
    :func:`ragged_maps` arrays, whose torch ops are each a launch on a GPU.

    Request ``i`` has ``n_i`` drafts from ``sizes`` (``kind``: ``"counts"`` ``[B]``; ``"cu"``
    ``[B+1]`` offsets from 0, less ``count_minus`` per request; ``"cu_inclusive"`` ``[B]``,
    vLLM v1's), starting at ``s_i`` (the prefix sum or offset); its drafts are
    ``flat[s_i + draft_shift + j]``, its draft rows ``s_i + j`` and its target rows
    ``s_i (+ i with bonus_rows) + min(j, n_i)``, clamped into the target.
    """

    sizes: Any
    kind: str
    batch: int
    width: int  # K: the padded width of the result
    bonus_rows: bool = True
    count_minus: int = 0
    draft_shift: int = 0
    request_map: Any = None  # int [B]: each request's index into temperature and seed
    temperature_marks: bool = False  # the logits come tempered: only t == 0 matters
    offsets_at_first_row: bool = False  # seed_offset [R] is read at each first row
    tokens_dtype: Any = torch.int64
    emitted_dtype: Any = torch.int64


def _xp(a: Array) -> Any:
    return np if isinstance(a, np.ndarray) else torch


def padded_target_rows(counts: Array, k: int) -> Array:
    """``[B, K+1]`` rows of a padded ``[B, K+1, V]`` target seen as ``[B*(K+1), V]``."""
    xp = _xp(counts)
    b = counts.shape[0]
    first = _arange(xp, b, counts) * (k + 1)
    return position_rows(first, counts, k, b * (k + 1))


def padded_draft_rows(b: int, k: int, like: Array) -> Array:
    """``[B, K]`` rows of a padded ``[B, K, V]`` draft tensor seen as ``[B*K, V]``."""
    xp = _xp(like)
    return _arange(xp, b, like)[:, None] * k + _arange(xp, k, like)[None, :]


def position_rows(first_row: Array, counts: Array, k: int, n_rows: int) -> Array:
    """``first_row[i] + min(j, max(n_i, 0))`` for ``j in [0, K]``, clamped into ``[0, n_rows)``."""
    xp = _xp(counts)
    pos = _arange(xp, k + 1, counts)
    n = counts.clip(0, None) if xp is np else counts.clamp(min=0)
    rows = first_row[:, None] + xp.minimum(pos[None, :], n[:, None])
    return _clamp(rows, n_rows)


def gather_drafts(flat: Array, first_draft: Array, counts: Array, k: int
                  ) -> tuple[Array, Array]:
    """``(drafts [B, K], draft_rows [B, K])`` of flat drafts: request ``i``'s slot ``j`` is
    ``flat[first_draft[i] + j]``; slots at ``j >= n_i`` hold 0 (never read) and every index is
    clamped into ``flat``."""
    xp = _xp(counts)
    pos = _arange(xp, k, counts)
    draft_rows = _clamp(first_draft[:, None] + pos[None, :], flat.shape[0])
    used = pos[None, :] < counts[:, None]
    if flat.shape[0] == 0:
        zeros = xp.zeros(draft_rows.shape, dtype=draft_rows.dtype)
        if xp is torch:
            zeros = zeros.to(counts.device)
        return zeros, draft_rows
    flat = flat if xp is np else flat.to(torch.int64)
    return xp.where(used, flat[draft_rows], 0), draft_rows


def ragged_maps(flat: Array, counts: Array, starts: Array, k: int, *, bonus_rows: bool = True
                ) -> tuple[Array, Array, Array]:
    """``(drafts [B, K], rows [B, K+1], draft_rows [B, K])`` of the ragged layout.

    Request ``i``'s drafts start at ``starts[i]`` in ``flat``. With ``bonus_rows`` (the
    :func:`~portable_verify.verify_ragged` layout) its ``n_i + 1`` target rows start at
    ``starts[i] + i``; without (vLLM v1: one target row per draft) at ``starts[i]``, and its
    bonus position repeats a row the caller's bonus token overrides.
    """
    xp = _xp(counts)
    b = counts.shape[0]
    n_total = flat.shape[0]
    first_row = starts + _arange(xp, b, counts) if bonus_rows else starts
    rows = position_rows(first_row, counts, k, n_total + b if bonus_rows else n_total)
    drafts, draft_rows = gather_drafts(flat, starts, counts, k)
    return drafts, rows, draft_rows


def _arange(xp: Any, n: int, like: Array) -> Array:
    if xp is np:
        return np.arange(n, dtype=np.int64)
    return torch.arange(n, dtype=torch.int64, device=like.device)


def _clamp(a: Array, size: int) -> Array:
    high = max(size - 1, 0)
    return a.clip(0, high) if isinstance(a, np.ndarray) else a.clamp(0, high)
