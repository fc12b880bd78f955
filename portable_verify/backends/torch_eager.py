"""Device-generic torch backend: the same vectorised code serves CPU, CUDA and XPU tensors.

Costs, per call (B requests, K drafts, V vocabulary):
* greedy: one argmax pass over the target rows; no softmax, no random numbers;
* rejection: from probabilities, only ``p(x)``/``q(x)`` at the draft ids plus one target row (and
  one draft row) per request: the row where the request rejected, or its bonus row; from logits,
  additionally one log-sum-exp pass over the target rows;
* typical: one entropy pass over the target rows, then the same single row per request;
* the one draw per request is a two-level inverse-CDF search (block sums, then one block), not a
  full cumulative sum.
There is no loop over requests and no host-device synchronisation. On CPU the row passes run
over cache-sized tiles of the target (:func:`per_row`): a loop over fixed-size memory blocks
that keeps each tile's temporaries in cache; figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from portable_verify.backends.base import Availability, Backend
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim, lowest index on ties, as int64.

    On CPU float32, numpy's argmax reads memory ~6x faster than ``torch.argmax`` (measured in
    docs/benchmarks.md); both return the first maximal index, so the semantics are identical.
    """
    if x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad:
        return torch.from_numpy(np.argmax(x.numpy(), axis=-1).astype(np.int64, copy=False))
    return torch.argmax(x, dim=-1)


def leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row of a bool ``[B, K]`` tensor (int64 ``[B]``)."""
    return torch.cumprod(mask.to(torch.int64), dim=1).sum(dim=1)


def inverse_cdf_draw(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per row, the smallest ``t`` with ``cumsum(w)[t] >= v * cumsum(w)[-1]`` (``v`` in (0, 1])."""
    return _scan_draw(weights, v)[0]


def _scan_draw(weights: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`inverse_cdf_draw` by a full cumulative sum; also returns each row's total."""
    c = torch.cumsum(weights, dim=-1, dtype=torch.float64)  # float64 per docs/semantics.md
    total = c[:, -1]
    t = torch.searchsorted(c, (v.double() * total).unsqueeze(1), right=False).squeeze(1)
    return t.clamp_(max=weights.shape[-1] - 1), total  # the clamp: NaN rows (validate=False)


def emit(drafts: torch.Tensor, final: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """``[B, K+1]``: accepted drafts, the final token at position ``a``, then placeholders."""
    b, k = drafts.shape
    pos = torch.arange(k + 1, device=drafts.device)
    padded = torch.cat([drafts, drafts.new_zeros(b, 1)], dim=1)
    a = accepted.unsqueeze(1)
    out = torch.where(pos < a, padded, final.unsqueeze(1))
    return out.masked_fill_(pos > a, PLACEHOLDER_TOKEN_ID)


def verify_torch(inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised semantics of docs/semantics.md for torch tensors on any device."""
    drafts = inputs.draft_token_ids
    k = drafts.shape[1]
    v_size = inputs.vocab_size
    device = drafts.device
    n = inputs.num_draft_tokens
    pos = torch.arange(k, device=device)
    valid = pos.unsqueeze(0) < n.unsqueeze(1)
    rows = inputs.target_rows
    x = drafts.clamp(0, v_size - 1)  # gathers stay in range even for garbage (validate=False)

    greedy_a = greedy_final = None
    if not inputs.none_greedy:
        g = first_argmax(inputs.target).to(device)[rows]  # [B, K+1]
        greedy_a = leading_true((drafts == g[:, :k]) & valid)
        greedy_final = g.gather(1, greedy_a.unsqueeze(1)).squeeze(1)
        if inputs.all_greedy:
            return emit(drafts, greedy_final, greedy_a), greedy_a

    sampled_a, sampled_final = _verify_sampled(inputs, x, valid, n)
    if greedy_a is None:
        return emit(drafts, sampled_final, sampled_a), sampled_a
    greedy_row = inputs.temperature == 0
    a = torch.where(greedy_row, greedy_a, sampled_a)
    final = torch.where(greedy_row, greedy_final, sampled_final)
    return emit(drafts, final, a), a


def _row_temperature(inputs: VerifyInputs) -> torch.Tensor:
    """``[R, 1]`` float32 temperature of each flat target row (1 where unused or greedy)."""
    t = inputs.temperature
    safe = torch.where(t > 0, t, torch.ones_like(t))
    row_t = torch.ones(inputs.target.shape[0], dtype=torch.float32, device=t.device)
    rows = inputs.target_rows
    row_t.index_put_((rows.reshape(-1),), safe.unsqueeze(1).expand_as(rows).reshape(-1))
    return row_t.unsqueeze(1)


CPU_TILE_ELEMENTS = 1 << 17
"""Row-pass tile on CPU (512 KiB of float32): small enough that every intermediate of a tile
stays in the core's L2 cache, so the target is read from memory once instead of once per op."""

CPU_FINAL_TILE_ELEMENTS = 1 << 20
"""Tile of the one-row-per-request stage on CPU (4 MiB): that stage runs ~40 small ops per tile
(the draw), so fewer, larger tiles win over L2 residency."""

_scratch = threading.local()


def _scratch_buffers(count: int, rows: int, width: int, device: torch.device) -> list[torch.Tensor]:
    """``count`` float32 ``[rows, width]`` work buffers.

    On CPU they are kept per thread and reused across calls: a fresh multi-MiB buffer costs a
    page fault per 4 KiB on first touch (~3.5 us each on this VM), which at B = 64, V = 128k
    was as dear as the work itself. Per-thread buffers keep concurrent callers apart.
    """
    if device.type != "cpu":
        return [torch.empty(rows, width, dtype=torch.float32, device=device)
                for _ in range(count)]
    need = rows * width
    pool: list[torch.Tensor] = getattr(_scratch, "pool", [])
    pool += [torch.empty(0) for _ in range(count - len(pool))]
    for i in range(count):
        if pool[i].numel() < need:
            pool[i] = torch.empty(need, dtype=torch.float32)
    _scratch.pool = pool
    return [pool[i][:need].view(rows, width) for i in range(count)]


def per_row(fn: Callable[..., tuple[torch.Tensor, ...]], *row_args: torch.Tensor, width: int,
            scratch: int = 0, tile: int | None = None) -> tuple[torch.Tensor, ...]:
    """``fn(*row_args, bufs)`` -> per-row results, computed over cache-sized row tiles on CPU.

    ``row_args`` share their first dimension (the rows); each row stands for ``width`` float32
    values of work. Why tiles: each torch op streams its whole input through memory, so a chain
    of full-size ops (scale, max, subtract, exp, sum) costs several memory passes plus page
    faults for the full-size temporaries (~3.5 us per 4 KiB page on this VM). On CPU the chain
    runs tile by tile (a loop over fixed-size memory blocks, not over requests), and ``scratch``
    float32 ``[tile rows, width]`` buffers (:func:`_scratch_buffers`) are handed to ``fn`` (as
    ``bufs``, sliced to the tile), so temporaries stay in cache and nothing large is allocated.
    ``tile`` is the tile size in elements (default :data:`CPU_TILE_ELEMENTS`).
    Other devices get one full-size call: their memory is fast and a loop of small kernels
    would only add launches.
    """
    r = row_args[0].shape[0]
    device = row_args[0].device
    tile = CPU_TILE_ELEMENTS if tile is None else tile
    step = max(1, tile // max(width, 1)) if device.type == "cpu" else r
    step = min(step, r)
    bufs = _scratch_buffers(scratch, step, width, device)
    if step >= r:
        return fn(*row_args, bufs)
    parts = [fn(*(a[i:i + step] for a in row_args), [buf[: min(step, r - i)] for buf in bufs])
             for i in range(0, r, step)]
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))


def _logits_sums(typical: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Per-row ``m = max z``, ``s = sum e`` (and ``sum e (z - m)`` for typical), ``e = exp(z - m)``.

    ``z = logits / T``. A short chain of in-place ops on scratch buffers (``torch.logsumexp``
    adds several more passes and checks), so a CPU tile stays in cache throughout; the per-row
    finishing (logs, division) happens once for all rows in :func:`logits_stats`.
    """

    def sums(logits: torch.Tensor, row_t: torch.Tensor,
             bufs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        y = torch.div(logits, row_t, out=bufs[0])  # (torch.addcdiv would fuse two passes
        m = y.amax(dim=-1, keepdim=True)  # but runs ~5x slower than div + sub on CPU)
        y.sub_(m)  # <= 0; -inf logits stay -inf and get probability 0
        if not typical:
            return m.squeeze(-1), y.exp_().sum(dim=-1)
        e = torch.exp(y, out=bufs[1])
        s = e.sum(dim=-1)
        e_y = e.mul_(y.nan_to_num_(neginf=0.0)).sum(dim=-1)  # -inf logits: 0 * -inf -> 0
        return m.squeeze(-1), s, e_y

    return sums


def logits_stats(target: torch.Tensor, row_t: torch.Tensor,
                 typical: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(lse, entropy)`` per row of ``softmax(target / T)``; entropy only for typical."""
    m, s, *e_y = per_row(_logits_sums(typical), target, row_t, width=target.shape[1],
                         scratch=2 if typical else 1)
    log_s = torch.log(s)
    entropy = log_s - e_y[0] / s if typical else None  # H = log s - E_p[z - m]
    return log_s.add_(m), entropy


def _probs_entropy(probs: torch.Tensor, bufs: list[torch.Tensor]) -> tuple[torch.Tensor]:
    """Per-row entropy of given probabilities (``0 log 0 = 0``); ``bufs`` is unused."""
    pf = probs.float()
    return (-torch.xlogy(pf, pf).sum(-1),)


DRAW_BLOCK = 256
"""Block length of the two-level inverse-CDF draw (used when ``V > 4 * DRAW_BLOCK``)."""


def draw(weights: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t, total)``: the inverse-CDF draw of :func:`inverse_cdf_draw` and each row's total.

    Why two levels: a cumulative sum is a sequential scan (~2 ns per element on one CPU core,
    the dearest step of a rejection at V = 128k), but the draw only needs the crossing point.
    Block sums (a vectorised float32 reduction) locate the crossing block; one
    ``DRAW_BLOCK``-long scan inside it finds the token. Prefixes are accumulated and compared in
    float64 as docs/semantics.md prescribes, so the pick differs from the reference's sequential
    scan only where a threshold lies within rounding of a prefix sum (the conformance check
    ``exact.large_vocab_draws`` counts such rows). The pick always has ``w[t] > 0`` when the
    total is positive. Small vocabularies take the full scan.
    """
    b, v_size = weights.shape
    if v_size <= 4 * DRAW_BLOCK or b == 0:
        return _scan_draw(weights, v)
    n_full = v_size // DRAW_BLOCK
    # Block sums in float32: a 256-term vectorised sum errs by far less than the ~1e-5 drift of a
    # 128k-long float32 scan, and float64 reductions run ~30x slower on CPU.
    sums = weights[:, : n_full * DRAW_BLOCK].reshape(b, n_full, DRAW_BLOCK).sum(-1)
    if n_full * DRAW_BLOCK < v_size:
        sums = torch.cat([sums, weights[:, n_full * DRAW_BLOCK:].sum(-1, keepdim=True)], dim=1)
    cb = sums.double().cumsum_(dim=1)
    total = cb[:, -1]
    threshold = (v.double() * total).unsqueeze(1)
    blk = torch.searchsorted(cb, threshold).clamp_(max=cb.shape[1] - 1)
    prefix = torch.where(blk > 0, cb.gather(1, (blk - 1).clamp_(min=0)), 0.0)
    idx = blk * DRAW_BLOCK + torch.arange(DRAW_BLOCK, device=weights.device)
    inside = idx < v_size
    block = weights.gather(1, idx.clamp(max=v_size - 1)) * inside
    c = prefix + block.double().cumsum_(dim=1)
    t_in = torch.searchsorted(c, threshold).squeeze(1)
    # Rounding can leave the block's last partial sum a hair under the threshold the block sums
    # crossed; then the block's last positive weight is the crossing token.
    last_pos = DRAW_BLOCK - 1 - torch.argmax((block > 0).flip(1).to(torch.uint8), dim=1)
    t = blk.squeeze(1) * DRAW_BLOCK + torch.where(t_in < DRAW_BLOCK, t_in, last_pos)
    return t.clamp_(max=v_size - 1), total


def draw_from_residual(p_a: torch.Tensor, q_a: torch.Tensor, rejected: torch.Tensor,
                       v: torch.Tensor) -> torch.Tensor:
    """Draw from ``max(0, p - q)`` on rejected rows (``p`` when that is empty) and ``p`` otherwise.

    Both draws are made and the right one picked per row: a second two-level draw costs one
    vectorised block-sum pass, less than testing the residual for emptiness and selecting rows.
    ``q_a`` is consumed (overwritten) to avoid another row-sized temporary.
    """
    from_residual, total = draw(torch.sub(p_a, q_a, out=q_a).clamp_min_(0.0), v)
    return torch.where(rejected & (total > 0), from_residual, draw(p_a, v)[0])


def draw_without_draft(p_a: torch.Tensor, x_a: torch.Tensor, rejected: torch.Tensor,
                       v: torch.Tensor) -> torch.Tensor:
    """The same draw for a one-hot draft: the residual is ``p`` with ``x`` zeroed.

    ``p_a`` is consumed. When that residual is empty, ``p`` has no mass outside ``x``, so the
    draw from ``p`` the semantics prescribe is ``x`` itself (for any ``v`` in (0, 1]).
    """
    kept = torch.where(rejected.unsqueeze(1), 0.0, p_a.gather(1, x_a))
    t, total = draw(p_a.scatter_(1, x_a, kept), v)
    return torch.where(rejected & ~(total > 0), x_a.squeeze(1), t)


def _verify_sampled(
    inputs: VerifyInputs, x: torch.Tensor, valid: torch.Tensor, n: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts and final tokens of sampled rows (rejection or typical)."""
    k = x.shape[1]
    rows = inputs.target_rows
    target = inputs.target
    typical = inputs.sampled_method == "typical"
    u = inputs.uniforms

    if inputs.target_is_logits:
        row_t = _row_temperature(inputs)
        lse, entropy = logits_stats(target, row_t, typical)
        px = torch.exp(target[rows[:, :k], x].float() / row_t[rows[:, :k], 0] - lse[rows[:, :k]])
    else:
        lse = row_t = None
        px = target[rows[:, :k], x].float()
        entropy = per_row(_probs_entropy, target, width=target.shape[1])[0] if typical else None

    if typical:
        h = entropy[rows[:, :k]]
        threshold = torch.clamp(inputs.typical_alpha * torch.exp(-h), max=inputs.typical_eps)
        accept = px > threshold
    else:
        if inputs.draft_probs is not None:
            qx = inputs.draft_probs[inputs.draft_rows, x].float()
        else:
            qx = torch.ones_like(px)
        accept = (px > 0) & (u[:, :k] * qx <= px)
    a = leading_true(accept & valid)

    # One target row per request: where it rejected, or its bonus row.
    row_a = rows.gather(1, a.unsqueeze(1)).squeeze(1)
    a_draft = a.clamp(max=max(k - 1, 0)).unsqueeze(1)
    x_a = x.gather(1, a_draft) if k > 0 else a_draft
    q_rows = (inputs.draft_rows.gather(1, a_draft).squeeze(1)
              if inputs.draft_probs is not None and k > 0 else row_a)
    final = _final_token(inputs, k, None if lse is None else (lse, row_t))
    (token,) = per_row(final, row_a, x_a, q_rows, a < n, u[:, k], width=inputs.vocab_size,
                       scratch=2, tile=CPU_FINAL_TILE_ELEMENTS)
    return a, token


def _final_token(inputs: VerifyInputs, k: int,
                 scaling: tuple[torch.Tensor, torch.Tensor] | None
                 ) -> Callable[..., tuple[torch.Tensor]]:
    """The recovered-or-bonus token of requests from their one target row (and draft row).

    ``scaling`` is ``(lse, row_t)`` for logits (``p = exp(z / T - lse)``), None for probabilities.
    """
    target, draft_probs = inputs.target, inputs.draft_probs
    typical = inputs.sampled_method == "typical"

    def final(row_a: torch.Tensor, x_a: torch.Tensor, q_rows: torch.Tensor,
              rejected: torch.Tensor, v: torch.Tensor,
              bufs: list[torch.Tensor]) -> tuple[torch.Tensor]:
        p_a = _gather_rows(target, row_a, bufs[0])
        if scaling is not None:
            lse, row_t = scaling
            p_a.div_(row_t[row_a]).sub_(lse[row_a].unsqueeze(1)).exp_()
        if typical:
            recovered = first_argmax(p_a).to(p_a.device)
            return (torch.where(rejected, recovered, draw(p_a, v)[0]),)
        if k == 0:
            return (draw(p_a, v)[0],)
        if draft_probs is not None:
            q_a = _gather_rows(draft_probs, q_rows, bufs[1])
            return (draw_from_residual(p_a, q_a, rejected, v),)
        return (draw_without_draft(p_a, x_a, rejected, v),)

    return final


def _gather_rows(source: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``source[rows]`` as float32 in ``out`` (a scratch buffer the caller may overwrite)."""
    if source.dtype == torch.float32:
        return torch.index_select(source, 0, rows, out=out)
    return out.copy_(source.index_select(0, rows))


class TorchBackend(Backend):
    """Eager torch on whatever device the tensors live on."""

    name = "torch"
    description = "device-generic torch (eager); CPU, CUDA and XPU tensors"

    def availability(self) -> Availability:
        return Availability(True, f"torch {torch.__version__}")

    def run(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return verify_torch(inputs)


class CpuBackend(TorchBackend):
    """The torch backend, chosen automatically for CPU tensors and numpy arrays."""

    name = "cpu"
    description = "torch on the CPU (numpy argmax fast path for float32)"
    device_types = ("cpu",)
