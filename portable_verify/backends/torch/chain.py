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
The code is written once against :class:`~portable_verify.backends.torch.ops.ArrayOps`: on CPU
it runs on numpy views of the tensors (no copy), elsewhere on torch. This module holds the
token-wise rules (greedy, rejection, typical); block verification is ``torch/block.py``, the
draws ``torch/draw.py``, the default validation ``torch/checks.py``. There is no loop over
requests and no host-device synchronisation. On CPU the row passes run over cache-sized tiles of
the target (``torch_ops.per_row``): a loop over fixed-size memory blocks that keeps each tile's
temporaries in cache; figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import torch

from portable_verify.backends.torch import ops as torch_ops
from portable_verify.backends.torch.block import _block
from portable_verify.backends.torch.checks import ReadChecks
from portable_verify.backends.torch.draw import _draw, _draw_from_residual, _draw_without_draft
from portable_verify.backends.torch.ops import (
    Array,
    ArrayOps,
    _logits_sums,
    _probs_entropy,
    _row_map,
    _temperatures,
    leading_true,
    per_row,
)
from portable_verify.core import methods
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs


def emit(ops: ArrayOps, drafts: Array, final: Array, accepted: Array) -> Array:
    """``[B, K+1]``: accepted drafts, the final token at position ``a``, then placeholders."""
    col = ops.arange(drafts.shape[1] + 1)[None, :]
    a = accepted[:, None]
    out = ops.xp.where(col == a, final[:, None], ops.concat([drafts, final[:, None]], 1))
    return ops.xp.where(col > a, PLACEHOLDER_TOKEN_ID, out)


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
    rule = inputs.sampled_method
    sampled = CHAIN_RULES.get(rule)  # type: ignore[arg-type]
    if sampled is None:
        raise methods.unknown_rule(rule, f"torch:{inputs.target.device.type}", methods.CHAIN)
    a, final = sampled(ops, inputs, x, valid, ops.clip(n, 0, k), rows, checks, greedy_row)
    if greedy_row is not None:
        greedy_a, greedy_final = _greedy(ops, inputs.target, drafts, valid, rows, checks,
                                         greedy_row)
        a = ops.xp.where(greedy_row, greedy_a, a)
        final = ops.xp.where(greedy_row, greedy_final, final)
    return a, final, drafts


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


def _sampled(ops: ArrayOps, inputs: VerifyInputs, x: Array, valid: Array, n: Array, rows: Array,
             checks: ReadChecks | None, greedy_row: Array | None,
             typical: bool = False) -> tuple[Array, Array]:
    """Accepted counts and final tokens of sampled rows: rejection sampling, or with
    ``typical`` typical acceptance (:data:`CHAIN_RULES` binds it)."""
    xp = ops.xp
    b, k = x.shape
    target, v_size = inputs.target, inputs.vocab_size
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
    final = _final_token(ops, inputs, k, checks is not None, typical)
    token, *stats = per_row(ops, final, row_a, x_a, q_rows, rejected, u[:, k], t_a,
                            width=v_size, scratch=2, tile=torch_ops.CPU_FINAL_TILE_ELEMENTS)
    if checks is not None:  # the row each request's draw (or argmax) read in full
        if inputs.target_is_logits:
            checks.maxima(stats[0], sampled)
        else:
            drawn = sampled & ~rejected if typical else sampled
            checks.distribution("target_probs", stats[0], stats[1], drawn)
        if inputs.draft_probs is not None and not typical and k > 0:
            checks.distribution("draft_probs", stats[-2], stats[-1], sampled & rejected)
    return a, token


def _final_token(ops: ArrayOps, inputs: VerifyInputs, k: int, with_stats: bool,
                 typical: bool) -> Callable[..., tuple[Array, ...]]:
    """The recovered-or-bonus token of requests from their one target row (and draft row).

    From logits the row becomes ``e = exp((l - max) / T)``: the draws need no normalisation,
    so the bonus row never needs a log-sum-exp; only a residual against ``q`` divides by
    ``sum(e)``. ``with_stats`` adds what :class:`ReadChecks` inspects, computed while the rows
    are in cache: the logits row's maximum, or the minimum and sum of the ``p`` (and ``q``) row.
    """
    target, draft_probs = inputs.target, inputs.draft_probs
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


CHAIN_RULES: dict[str, Callable[..., tuple[Array, Array]]] = {
    "rejection": _sampled, "typical": functools.partial(_sampled, typical=True),
    "block": _block}
"""The sampled rules this backend implements for chains (its traits read the keys)."""
