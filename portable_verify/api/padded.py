"""The padded front door: ``verify`` on ``[B, K+1, V]`` targets."""

from __future__ import annotations

from portable_verify.api.call import decide
from portable_verify.api.parse import parse_padded, read_options
from portable_verify.core.arguments import ArrayLike
from portable_verify.core.types import DEFAULT_TYPICAL, VerifyOptions, VerifyResult


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
    typical_eps: float = DEFAULT_TYPICAL.eps,
    typical_alpha: float = DEFAULT_TYPICAL.alpha,
    bonus_token_ids: ArrayLike | None = None,
    backend: str = "auto",
    validate: bool | str = True,
    options: VerifyOptions | None = None,
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
        options: the method and its parameters as one :class:`VerifyOptions` value (engines
            build it once), instead of ``method`` / ``typical_eps`` / ``typical_alpha``.
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
    tensor([[ 1,  0, -1]])
    """
    opts = read_options(method, typical_eps, typical_alpha, options, backend, validate)
    return decide(parse_padded(draft_token_ids, target_logits, target_probs, draft_probs,
                               num_draft_tokens, temperature, seed, seed_offset, uniforms,
                               bonus_token_ids, opts, backend, validate))
