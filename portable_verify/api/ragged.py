"""The flattened ("ragged") entry point serving engines use, e.g. vLLM v1's rejection sampler.

Why a second front door: a serving engine packs every request's drafts back to back. Padding
them to ``[B, K+1, V]`` would copy the whole target (the largest tensor of the step). Instead the
ragged call builds the same row maps the padded call builds (``rows [B, K+1]``, ``draft_rows
[B, K]``) pointing into the flat tensors, and hands both to the shared tail
:func:`portable_verify.api.call.decide`, so every backend sees the ragged layout without a copy.
"""

from __future__ import annotations

import numbers

import torch

from portable_verify.api import host_path
from portable_verify.api.call import (
    CallLayout,
    CallOptions,
    check_options,
    decide,
    target_argument,
)
from portable_verify.core.arguments import ArrayLike, to_tensor
from portable_verify.core.types import (
    DEFAULT_TYPICAL_ALPHA,
    DEFAULT_TYPICAL_EPS,
    TypicalParams,
    VerifyResult,
)
from portable_verify.core.validation import (
    require_float,
    require_int,
    require_rank,
    require_same_device,
)


def verify_ragged(
    draft_token_ids: ArrayLike,
    *,
    num_draft_tokens: ArrayLike | None = None,
    cu_num_draft_tokens: ArrayLike | None = None,
    target_logits: ArrayLike | None = None,
    target_probs: ArrayLike | None = None,
    draft_probs: ArrayLike | None = None,
    method: str = "auto",
    temperature: float | ArrayLike | None = None,
    seed: int | ArrayLike | None = None,
    seed_offset: int | ArrayLike | None = None,
    uniforms: ArrayLike | None = None,
    max_num_draft_tokens: int | None = None,
    typical_eps: float = DEFAULT_TYPICAL_EPS,
    typical_alpha: float = DEFAULT_TYPICAL_ALPHA,
    bonus_token_ids: ArrayLike | None = None,
    backend: str = "auto",
    validate: bool | str = True,
) -> VerifyResult:
    """Verify drafts given in the flattened layout of serving engines (vLLM v1).

    Request ``i`` owns ``n_i`` drafts. Its drafts are ``draft_token_ids[c_i : c_i + n_i]`` with
    ``c_i = n_0 + .. + n_{i-1}``, and its ``n_i + 1`` target rows (drafts, then the bonus
    position) are ``target[c_i + i : c_i + i + n_i + 1]``. The semantics are exactly those of
    :func:`portable_verify.verify` with ``K = max_k`` (docs/semantics.md).

    Args:
        draft_token_ids: int ``[N]``, every request's drafts back to back; ``-1`` marks a slot
            with no proposal (the request's drafts end there).
        num_draft_tokens: int ``[B]`` drafts per request (``n_i >= 0``, summing to ``N``).
        cu_num_draft_tokens: int ``[B+1]`` cumulative offsets starting at 0 (instead of counts).
        target_logits: float ``[N+B, V]``; each request's bonus row follows its draft rows.
        target_probs: float ``[N+B, V]`` probabilities (instead of logits).
        draft_probs: float ``[N, V]`` draft distributions, or None for a deterministic draft.
        method, temperature, seed, seed_offset, typical_eps, typical_alpha, backend: as in
            :func:`portable_verify.verify` (per-request ``[B]`` tensors where they are tensors).
        uniforms: float32 ``[B, max_k+1]`` in (0, 1], the padded call's layout: column ``j <
            max_k`` is position ``j``'s acceptance uniform, column ``max_k`` the draw uniform.
        bonus_token_ids: int ``[B]`` (or ``[B, 1]``): the caller's own token for a request whose
            drafts were all accepted (vLLM samples its bonus tokens itself).
        max_num_draft_tokens: ``max_k``, an upper bound of every ``n_i``. Give it to avoid the
            one host sync that ``max(num_draft_tokens)`` costs (e.g. vLLM's ``max_spec_len``).
        validate: ``True`` checks what the decision reads, ``"full"`` every row of every input
            (docs/semantics.md, Validation levels; the layout costs one more device sync);
            False skips every check.

    Returns:
        :class:`VerifyResult` with ``token_ids`` int64 ``[B, max_k+1]`` (-1 padded) and int64
        ``[B]`` counters, as the caller's array type (numpy in, numpy out).

    >>> import torch, portable_verify as pv
    >>> logits = torch.tensor([[0., 5., 1.], [9., 0., 0.], [0., 0., 3.], [0., 0., 7.]])
    >>> res = pv.verify_ragged(torch.tensor([1, 2]), num_draft_tokens=torch.tensor([2, 0]),
    ...                        target_logits=logits, method="greedy")
    >>> res.token_ids
    tensor([[ 1,  0, -1],
            [ 2, -1, -1]])
    """
    fast = host_path.try_verify_ragged(
        draft_token_ids, num_draft_tokens, cu_num_draft_tokens, target_logits, target_probs,
        draft_probs, method, temperature, seed, seed_offset, uniforms, max_num_draft_tokens,
        typical_eps, typical_alpha, bonus_token_ids, backend, validate)
    if fast is not None:
        return fast
    options = CallOptions(method, temperature, seed, seed_offset, uniforms,
                          TypicalParams(typical_eps, typical_alpha), bonus_token_ids, backend,
                          validate)
    check_options(options)
    return_numpy = not isinstance(draft_token_ids, torch.Tensor)
    flat = to_tensor("draft_token_ids", draft_token_ids)
    target, target_name = target_argument(target_logits, target_probs)
    q = to_tensor("draft_probs", draft_probs)
    counts_in = to_tensor("num_draft_tokens", num_draft_tokens)
    cu_in = to_tensor("cu_num_draft_tokens", cu_num_draft_tokens)
    if (counts_in is None) == (cu_in is None):
        raise ValueError("give exactly one of num_draft_tokens and cu_num_draft_tokens")
    explicit_u = to_tensor("uniforms", uniforms)
    max_num_draft_tokens = _max_k_argument(max_num_draft_tokens)
    if validate:
        _check_structure(flat, counts_in, cu_in, target, target_name, q, explicit_u)

    device = target.device
    if counts_in is not None:
        cu = None
        counts = counts_in.to(device=device, dtype=torch.int64)
        starts = torch.cumsum(counts, 0) - counts
    else:
        cu = cu_in.to(device=device, dtype=torch.int64)
        counts = cu[1:] - cu[:-1]
        starts = cu[:-1]
    b = counts.shape[0]
    n_total = flat.shape[0]
    max_k = _max_draft_count(counts, cu, n_total, target.shape[0], max_num_draft_tokens, validate)
    if validate and explicit_u is not None:
        _check_uniforms_shape(explicit_u, b, max_k)

    rows, drafts, draft_rows = _row_maps(flat.to(device), counts, starts, max_k)
    has_q = q is not None and n_total > 0  # with no drafts at all, q is never read
    layout = CallLayout(
        drafts=drafts,
        counts=counts,
        target=target,
        target_name=target_name,
        rows=rows,
        draft_probs=q if has_q else None,
        draft_rows=draft_rows if has_q else None,
    )
    return decide(layout, options, return_numpy)


def _max_k_argument(max_k: int | None) -> int | None:
    if max_k is None:
        return None
    if isinstance(max_k, bool) or not isinstance(max_k, numbers.Integral):
        raise TypeError(f"max_num_draft_tokens must be an int, got {type(max_k).__name__}")
    if max_k < 0:
        raise ValueError(f"max_num_draft_tokens must be >= 0, got {max_k}")
    return int(max_k)


def _row_maps(
    flat: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows [B, K+1]``, padded ``drafts [B, K]`` and ``draft_rows [B, K]`` (all int64).

    Positions ``j > n_i`` map to row ``n_i`` (the bonus row) as the backends expect; unread
    draft slots hold token 0 and a clamped, in-range draft row.
    """
    b = counts.shape[0]
    device = counts.device
    pos = torch.arange(k + 1, device=device)
    first_row = (starts + torch.arange(b, device=device)).unsqueeze(1)
    rows = first_row + torch.minimum(pos.unsqueeze(0), counts.unsqueeze(1))
    n_total = flat.shape[0]
    dpos = pos[:k].unsqueeze(0)
    idx = starts.unsqueeze(1) + dpos  # [B, K]
    used = dpos < counts.unsqueeze(1)
    if n_total == 0:
        drafts = torch.zeros((b, k), dtype=torch.int64, device=device)
        return rows, drafts, torch.zeros((b, k), dtype=torch.int64, device=device)
    safe_idx = idx.clamp(0, n_total - 1)
    drafts = torch.where(used, flat.to(torch.int64)[safe_idx], 0)
    return rows, drafts, safe_idx


def _check_structure(
    flat: torch.Tensor,
    counts: torch.Tensor | None,
    cu: torch.Tensor | None,
    target: torch.Tensor,
    target_name: str,
    q: torch.Tensor | None,
    explicit_u: torch.Tensor | None,
) -> None:
    """Host-only checks of the flattened layout (ranks, dtypes, sizes, devices)."""
    require_rank("draft_token_ids", flat, 1, "[N] (flattened drafts)")
    require_int("draft_token_ids", flat)
    if counts is not None:
        require_rank("num_draft_tokens", counts, 1, "[B]")
        require_int("num_draft_tokens", counts)
        b = counts.shape[0]
    else:
        require_rank("cu_num_draft_tokens", cu, 1, "[B+1]")
        require_int("cu_num_draft_tokens", cu)
        if cu.shape[0] < 1:
            raise ValueError("cu_num_draft_tokens must have B+1 >= 1 entries (it starts at 0)")
        b = cu.shape[0] - 1
    n = flat.shape[0]
    require_rank(target_name, target, 2, "[N+B, V] (flattened rows)")
    require_float(target_name, target)
    if target.shape[0] != n + b:
        raise ValueError(
            f"{target_name} must have N+B = {n}+{b} = {n + b} rows (each request's drafts plus "
            f"its bonus row), got {target.shape[0]}"
        )
    if target.shape[1] < 1:
        raise ValueError(f"{target_name} has an empty vocabulary dimension")
    if q is not None:
        require_rank("draft_probs", q, 2, "[N, V] (flattened)")
        require_float("draft_probs", q)
        if tuple(q.shape) != (n, target.shape[1]):
            raise ValueError(
                f"draft_probs must have shape (N, V) = {(n, target.shape[1])}, got {tuple(q.shape)}"
            )
    require_same_device(
        {
            "draft_token_ids": flat,
            "num_draft_tokens": counts,
            "cu_num_draft_tokens": cu,
            target_name: target,
            "draft_probs": q,
            "uniforms": explicit_u,
        }
    )


def _max_draft_count(
    counts: torch.Tensor,
    cu: torch.Tensor | None,
    n_total: int,
    n_rows: int,
    max_k: int | None,
    validate: bool,
) -> int:
    """``max_k``, with the layout's value checks folded into the same (single) host transfer."""
    b = counts.shape[0]
    if not validate:
        if max_k is not None:
            return max_k
        return int(counts.max()) if b > 0 else 0  # the one documented host sync
    from_cu = cu is not None
    name = "cu_num_draft_tokens" if from_cu else "num_draft_tokens"
    zero = torch.zeros((), dtype=torch.int64, device=counts.device)
    observed = counts.max() if b > 0 else zero
    flags = [
        (counts < 0).any() if b > 0 else zero.bool(),
        counts.sum() != n_total,
        (cu[0] != 0) if from_cu else zero.bool(),
    ]
    host = torch.stack([observed, *(f.to(torch.int64) for f in flags)]).tolist()
    observed_max, negative, bad_total, bad_start = host
    if from_cu and bad_start:
        raise ValueError(f"cu_num_draft_tokens must start at 0, got {_preview(cu)}")
    if negative:
        what = "be non-decreasing" if from_cu else "be >= 0"
        raise ValueError(f"{name} must {what}; got {_preview(cu if from_cu else counts)}")
    if bad_total:
        raise ValueError(
            f"{name} accounts for {int(counts.sum())} drafts but draft_token_ids has N = "
            f"{n_total} (and the target {n_rows} = N+B rows)"
        )
    if max_k is not None and observed_max > max_k:
        raise ValueError(
            f"max_num_draft_tokens={max_k} is smaller than the largest draft count "
            f"{observed_max} in {name}"
        )
    return max_k if max_k is not None else int(observed_max)


def _check_uniforms_shape(u: torch.Tensor, b: int, k: int) -> None:
    require_rank("uniforms", u, 2, "[B, max_k+1]")
    require_float("uniforms", u)
    if tuple(u.shape) != (b, k + 1):
        raise ValueError(
            f"uniforms must have shape (B, max_k+1) = {(b, k + 1)}, got {tuple(u.shape)}"
        )


def _preview(t: torch.Tensor, limit: int = 16) -> str:
    values = t[:limit].tolist()
    return f"{values}{' ...' if t.shape[0] > limit else ''}"
