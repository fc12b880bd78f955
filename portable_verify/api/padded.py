"""The padded front door: ``verify`` on ``[B, K+1, V]`` targets."""

from __future__ import annotations

import numpy as np
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


def verify(
    draft_token_ids: ArrayLike,
    *,
    target_logits: ArrayLike | None = None,
    target_probs: ArrayLike | None = None,
    draft_probs: ArrayLike | None = None,
    method: str = "auto",
    temperature: float | ArrayLike | None = None,
    num_draft_tokens: ArrayLike | None = None,
    seed: int | ArrayLike | None = None,
    seed_offset: int | ArrayLike | None = None,
    uniforms: ArrayLike | None = None,
    typical_eps: float = DEFAULT_TYPICAL_EPS,
    typical_alpha: float = DEFAULT_TYPICAL_ALPHA,
    bonus_token_ids: ArrayLike | None = None,
    backend: str = "auto",
    validate: bool | str = True,
) -> VerifyResult:
    """Decide how many draft tokens survive and which token comes next, for a batch of requests.

    Args:
        draft_token_ids: int ``[B, K]`` proposed tokens; ``-1`` marks a slot with no proposal
            (the request's drafts end there; docs/semantics.md).
        target_logits: float ``[B, K+1, V]`` target scores; row ``K`` is the bonus position.
        target_probs: float ``[B, K+1, V]`` target probabilities (instead of logits).
        draft_probs: float ``[B, K, V]`` draft distributions, or None for a deterministic draft.
        method: ``"auto"``/``"rejection"`` (exact), ``"block"`` (exact, the chain judged at
            once), ``"typical"`` (Medusa, lossy) or ``"greedy"``.
        temperature: None (=1), a float, or float ``[B]``; rows at 0 are greedy.
        num_draft_tokens: int ``[B]``; row ``i`` uses its first ``n_i <= K`` drafts.
        seed: int ``[B]`` per-request seeds, one int for the batch, or None (torch's generator).
        seed_offset: int or int ``[B]``; advance it each decoding step (default 0).
        uniforms: float32 ``[B, K+1]`` explicit random numbers in (0, 1] (overrides ``seed``).
        typical_eps, typical_alpha: the typical-acceptance threshold options.
        backend: a name from :func:`portable_verify.available_backends`, or ``"auto"``.
        bonus_token_ids: int ``[B]``: the caller's own token for a request whose drafts were all
            accepted (e.g. a serving engine's bonus sample); None draws it from row ``n_i``.
        validate: ``True`` checks what the decision reads, ``"full"`` every row of every input
            (docs/semantics.md, Validation levels); False skips all checks.

    Returns:
        :class:`VerifyResult` with ``token_ids`` int64 ``[B, K+1]`` (-1 padded), ``num_accepted``,
        ``num_emitted`` and ``num_draft_tokens`` (int64 ``[B]``), as the caller's array type.

    The rules, and every edge case, are in docs/semantics.md.

    >>> import torch, portable_verify as pv
    >>> logits = torch.tensor([[[0., 5., 1.], [9., 0., 0.], [0., 0., 3.]]])
    >>> pv.verify(torch.tensor([[1, 2]]), target_logits=logits, method="greedy").token_ids
    tensor([[1, 0, -1]])
    """
    fast = host_path.try_verify(draft_token_ids, target_logits, target_probs, draft_probs,
                                method, temperature, num_draft_tokens, seed, seed_offset,
                                uniforms, typical_eps, typical_alpha, bonus_token_ids, backend,
                                validate)
    if fast is not None:
        return fast
    options = CallOptions(method, temperature, seed, seed_offset, uniforms,
                          TypicalParams(typical_eps, typical_alpha), bonus_token_ids, backend,
                          validate)
    check_options(options)
    return_numpy = not isinstance(draft_token_ids, torch.Tensor)
    drafts = to_tensor("draft_token_ids", draft_token_ids)
    target, target_name = target_argument(target_logits, target_probs)
    q = to_tensor("draft_probs", draft_probs)
    counts = to_tensor("num_draft_tokens", num_draft_tokens)
    if validate:
        _check_structure(drafts, target, target_name, q, counts,
                         to_tensor("uniforms", uniforms))
    b, k = drafts.shape
    v = target.shape[-1]
    device = target.device
    counts = None if counts is None else counts.to(device=device, dtype=torch.int64)
    counts, rows, draft_rows = _row_maps(b, k, counts, device, q is not None)
    layout = CallLayout(
        drafts=drafts.to(device=device, dtype=torch.int64),
        counts=counts,
        target=target.reshape(b * (k + 1), v),
        target_name=target_name,
        rows=rows,
        draft_probs=None if q is None else q.reshape(b * k, v),
        draft_rows=draft_rows,
    )
    return decide(layout, options, return_numpy)


def _row_maps(b: int, k: int, counts: torch.Tensor | None, device: torch.device,
              with_draft_rows: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(counts [B], rows [B, K+1], draft_rows [B, K] or None)``, int64 on ``device``.

    Row ``j`` of request ``i`` is flat row ``i*(K+1) + min(j, n_i)``. On CPU the maps are built
    with numpy: a handful of ``[B, K]`` ops is most of a small call's fixed cost in torch.
    """
    if counts is None:
        counts = torch.full((b,), k, dtype=torch.int64, device=device)
    if device.type == "cpu":
        n, pos, request = np.maximum(counts.numpy(), 0), np.arange(k + 1), np.arange(b)[:, None]
        rows = request * (k + 1) + np.minimum(pos[None, :], n[:, None])
        draft_rows = request * k + pos[None, :k] if with_draft_rows else None
        return (counts, torch.from_numpy(rows),
                None if draft_rows is None else torch.from_numpy(draft_rows))
    pos, request = torch.arange(k + 1, device=device), torch.arange(b, device=device)[:, None]
    rows = request * (k + 1) + torch.minimum(pos[None, :], counts.clamp(min=0)[:, None])
    return counts, rows, request * k + pos[None, :k] if with_draft_rows else None


def _check_structure(
    drafts: torch.Tensor,
    target: torch.Tensor,
    target_name: str,
    q: torch.Tensor | None,
    counts: torch.Tensor | None,
    explicit_u: torch.Tensor | None,
) -> None:
    """Host-only checks of the padded layout."""
    require_rank("draft_token_ids", drafts, 2, "[B, K]")
    require_int("draft_token_ids", drafts)
    require_rank(target_name, target, 3, "[B, K+1, V]")
    require_float(target_name, target)
    b, k = drafts.shape
    if target.shape[0] != b:
        raise ValueError(
            f"{target_name} has batch size {target.shape[0]}, draft_token_ids has {b}"
        )
    if target.shape[1] != k + 1:
        raise ValueError(
            f"{target_name} must have K+1 = {k + 1} rows per request (K drafts plus the bonus "
            f"position), got {target.shape[1]}"
        )
    if target.shape[2] < 1:
        raise ValueError(f"{target_name} has an empty vocabulary dimension")
    if q is not None:
        require_rank("draft_probs", q, 3, "[B, K, V]")
        require_float("draft_probs", q)
        if tuple(q.shape) != (b, k, target.shape[2]):
            raise ValueError(
                f"draft_probs must have shape (B, K, V) = {(b, k, target.shape[2])}, "
                f"got {tuple(q.shape)}"
            )
    if counts is not None:
        require_rank("num_draft_tokens", counts, 1, "[B]")
        require_int("num_draft_tokens", counts)
        if counts.shape[0] != b:
            raise ValueError(f"num_draft_tokens has {counts.shape[0]} entries, expected B = {b}")
    if explicit_u is not None:
        require_rank("uniforms", explicit_u, 2, "[B, K+1]")
        require_float("uniforms", explicit_u)
        if tuple(explicit_u.shape) != (b, k + 1):
            raise ValueError(
                f"uniforms must have shape (B, K+1) = {(b, k + 1)}, got {tuple(explicit_u.shape)}"
            )
    require_same_device(
        {
            "draft_token_ids": drafts,
            target_name: target,
            "draft_probs": q,
            "num_draft_tokens": counts,
            "uniforms": explicit_u,
        }
    )
