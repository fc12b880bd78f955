"""Which reference decisions sit within float rounding of a boundary.

Why: two correct float32 implementations may compute ``softmax``, entropies and cumulative sums
in different orders, so a decision that is a near-tie in exact arithmetic may go either way.
The exact checks excuse a disagreement only on a row whose *reference path* (every decision the
reference made for that row) contains such a near-tie; if every decision on the path has a
margin larger than the rounding bound, a conforming backend makes the same decisions and must
emit the same tokens. Inputs given as probabilities are used as-is, so their acceptance and
argmax decisions get no tolerance at all; only cumulative sums (summation order) do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from portable_verify.backends.numpy.chain import entropy, softmax
from portable_verify.core import methods
from portable_verify.core.types import DEFAULT_TYPICAL

VALUE_RTOL = 1e-5
"""Relative error allowed in a probability or threshold computed from logits (~80 float32 ulps)."""

_EPS32 = float(np.finfo(np.float32).eps)


def _host(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.is_floating_point() else x).numpy()
    return np.asarray(x)


def _temperatures(temperature: Any, b: int, method: str) -> np.ndarray:
    if methods.greedy_only(method):
        return np.zeros(b, np.float32)
    if temperature is None:
        return np.ones(b, np.float32)
    if isinstance(temperature, (int, float)):
        return np.full(b, temperature, np.float32)
    return _host(temperature).astype(np.float32)


def near_boundary_rows(
    kwargs: dict[str, Any], method: str, events: Counter[str] | None = None
) -> np.ndarray:
    """bool ``[B]``: rows whose reference path has a decision within rounding of its boundary.

    ``kwargs`` are the arguments of a ``verify`` call with explicit ``uniforms``. ``events``, if
    given, counts the edge cases the reference paths went through (coverage of the cases).
    """
    events = Counter() if events is None else events
    drafts = _host(kwargs["draft_token_ids"])
    b, k = drafts.shape
    is_logits = "target_logits" in kwargs
    target = _host(kwargs["target_logits"] if is_logits else kwargs["target_probs"])
    q = kwargs.get("draft_probs")
    q = None if q is None else _host(q)
    counts = kwargs.get("num_draft_tokens")
    counts = np.full(b, k) if counts is None else _host(counts)
    temps = _temperatures(kwargs.get("temperature"), b, method)
    u = _host(kwargs["uniforms"]) if b else np.zeros((0, k + 1), np.float32)
    eps = float(kwargs.get("typical_eps", DEFAULT_TYPICAL.eps))
    alpha = float(kwargs.get("typical_alpha", DEFAULT_TYPICAL.alpha))
    flags = np.zeros(b, dtype=bool)
    for i in range(b):
        if temps[i] == 0:
            events["greedy_row"] += 1
            continue  # greedy: an argmax of the inputs as given, no rounding anywhere
        flags[i] = _ROWS[methods.TABLE[method].rule](
            drafts[i], target[i], None if q is None else q[i], int(counts[i]), float(temps[i]),
            is_logits, u[i], events, (eps, alpha),
        )
    return flags


def _close(a: float, b: float, rtol: float) -> bool:
    """Within ``rtol`` of each other; with ``rtol = 0`` nothing is (exact inputs, exact rule)."""
    return rtol > 0 and abs(a - b) <= rtol * max(abs(a), abs(b))


def _argmax_ambiguous(p: np.ndarray, rtol: float) -> bool:
    """A runner-up within rounding of the top (exact ties are not ambiguous: lowest index wins)."""
    top = p.max()
    others = p[p != top]
    return bool(others.size) and _close(float(top), float(others.max()), rtol)


def _draw_ambiguous(w: np.ndarray, v: float, abs_err: float) -> bool:
    """The inverse-CDF pick would change if the cumsum moved by ``abs_err``."""
    c = np.cumsum(w.astype(np.float32), dtype=np.float64)
    threshold = v * c[-1]
    # Summation order: a float32 two-level scan (blocks of 256) errs by ~(V/256 + 256) ulps;
    # the bound allows that, not the ~V ulps of one sequential float32 scan.
    bound = abs_err + (2 * np.sqrt(len(w)) + 64) * _EPS32 * c[-1]
    return bool((np.abs(c - threshold) <= bound).any())


BLOCK_SUM_RTOL = 1e-5
"""Relative error allowed in ``h_j`` from inputs given as probabilities: the float32 terms of
``Z_j`` are the same in every backend, but a backend may sum them in float32 blocks before
widening (docs/semantics.md), ~1e-7 relative at V = 128k; the bound leaves a wide margin."""


def _block_row_near_boundary(
    drafts: np.ndarray, target: np.ndarray, q: np.ndarray | None, n: int, temperature: float,
    is_logits: bool, u: np.ndarray, events: Counter[str],
) -> bool:
    """The reference's block path (docs/semantics.md) with every comparison's margin: a
    ``u_j`` against ``P_j`` or ``h_j``, an empty-looking residual, the final draw."""
    rtol = VALUE_RTOL if is_logits else 0.0
    if n == 0:
        events["block_no_drafts"] += 1
        p0 = softmax(target[0], temperature) if is_logits else target[0].astype(np.float32)
        return _draw_ambiguous(p0, float(u[-1]), rtol * float(p0.sum()))
    p = [softmax(target[j], temperature) if is_logits else target[j].astype(np.float32)
         for j in range(n + 1)]
    v_size = len(p[0])
    qs = []
    for j in range(n):
        row = np.zeros(v_size, np.float32) if q is None else q[j].astype(np.float32)
        if q is None and 0 <= drafts[j] < v_size:
            row[drafts[j]] = 1.0
        qs.append(row)
    chain, prev = [], np.float32(1.0)
    for j in range(n):
        x = int(drafts[j])
        px = p[j][x] if 0 <= x < v_size else np.float32(0)
        qx = qs[j][x] if 0 <= x < v_size else np.float32(0)
        if is_logits and px == 0.0 and 0 <= x < v_size and np.isfinite(target[j][x]):
            return True  # underflow: another softmax may give a tiny positive p(x)
        prev = (np.float32(0) if prev == 0 or px == 0 else np.float32(1) if qx == 0
                else min(prev * px / qx, np.float32(1)))
        chain.append(prev)
    # P_j carries the relative error of up to j + 1 probabilities from logits.
    a = 0
    for j in reversed(range(n)):
        uj = float(u[j])
        if _close(uj, float(chain[j]), (j + 2) * rtol):
            return True
        if uj > chain[j]:
            continue
        if j == n - 1:
            a = n
            break
        terms = chain[j] * p[j + 1] - qs[j + 1]
        z = float(np.maximum(terms, 0).sum(dtype=np.float64))
        # Terms within rounding of 0 may be kept or clipped by another backend.
        noise = float(np.abs(terms[np.abs(terms) <= 4 * (j + 3) * rtol * p[j + 1]]).sum())
        if is_logits and z <= noise + 4 * v_size * _EPS32:
            return True
        h = z / (z + (1.0 - float(chain[j]))) if z > 0 else 0.0
        if _close(uj, h, (j + 3) * rtol + BLOCK_SUM_RTOL):
            return True
        if uj <= h:
            a = j + 1
            break
    events[f"block_a_{'n' if a == n else 'mid' if a else '0'}"] += 1
    if a == n:
        return _draw_ambiguous(p[n], float(u[-1]), rtol * float(p[n].sum()))
    scale = chain[a - 1] if a > 0 else np.float32(1)
    w = np.maximum(scale * p[a] - qs[a], np.float32(0))
    widest = float(np.maximum(scale * p[a].astype(np.float64) * (1 + (a + 2) * rtol)
                              - qs[a], 0).sum())
    if is_logits and widest <= 4 * (a + 2) * rtol + 4 * v_size * _EPS32:
        return True
    if not w.any():
        events["block_empty_residual"] += 1
        w = p[a]
    return _draw_ambiguous(w, float(u[-1]), 2 * (a + 2) * rtol * float(p[a].sum()))


def _token_row_near_boundary(
    drafts: np.ndarray, target: np.ndarray, q: np.ndarray | None, n: int, temperature: float,
    is_logits: bool, u: np.ndarray, events: Counter[str], typical: tuple[float, float] | None,
) -> bool:
    """The token-wise paths: rejection sampling, or typical acceptance with ``typical``'s
    ``(eps, alpha)``."""
    rtol = VALUE_RTOL if is_logits else 0.0
    v = float(u[-1])
    for j in range(n + 1):
        p = softmax(target[j], temperature) if is_logits else target[j].astype(np.float32)
        # Entries' absolute error from computing p; the cumsum's own error is added later.
        p_err = rtol * float(p.sum())
        if j == n:
            events["all_accepted"] += 1
            return _draw_ambiguous(p, v, p_err)
        x = int(drafts[j])
        if typical is not None:
            eps, alpha = typical
            threshold = min(eps, alpha * np.exp(-entropy(p)))
            if _close(float(p[x]), threshold, VALUE_RTOL):  # entropy is always computed
                return True
            if not p[x] > threshold:
                events["typical_rejected"] += 1
                return _argmax_ambiguous(p, rtol)
            continue
        qj = np.zeros_like(p) if q is None else q[j].astype(np.float32)
        if q is None:
            qj[x] = 1.0
        px, qx = float(p[x]), float(qj[x])
        if is_logits and px == 0.0 and np.isfinite(target[j][x]):
            return True  # underflow: another softmax may give a tiny positive p(x)
        if px > 0 and _close(float(np.float32(u[j]) * np.float32(qx)), px, rtol):
            return True
        if px > 0 and np.float32(u[j]) * np.float32(qx) <= px:
            events["accepted_q0" if qx == 0 else "accepted"] += 1
            continue
        events["rejected_p0" if px == 0 else "rejected"] += 1
        residual = np.maximum(p - qj, np.float32(0))
        # Largest residual mass rounding of p could produce; if tiny, the backend's residual
        # may be empty where ours is not (or the reverse), or be pure rounding noise.
        widest = float(np.maximum(p.astype(np.float64) * (1 + rtol) - qj, 0).sum())
        if is_logits and widest <= 4 * p_err + 4 * len(p) * _EPS32:
            return True
        if not residual.any():
            events["empty_residual"] += 1
        w = residual if residual.any() else p
        return _draw_ambiguous(w, v, 2 * p_err)
    return False


_ROWS: dict[str, Callable[..., bool]] = {
    "rejection": lambda *row: _token_row_near_boundary(*row[:-1], None),
    "typical": _token_row_near_boundary,
    "block": lambda *row: _block_row_near_boundary(*row[:-1]),
}
"""Each rule's margins by its name (the last argument: the typical parameters)."""
