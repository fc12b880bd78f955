"""The engines' front door: flat target rows plus row maps, in whatever order the engine keeps.

Why: a serving engine already holds the target as flat rows in its own order (vLLM v1 hands
over one row per draft and samples its bonus tokens itself; its Model Runner V2 offsets drafts
by one). Rather than re-packing them into one of the two user layouts, the engine says where
each request's positions live (``core/layout.py`` builds the usual maps) and the call takes the
same route as :func:`~portable_verify.verify`: on CPU, plain arrays go straight to the compiled
kernel.
"""

from __future__ import annotations

from portable_verify.api.call import decide
from portable_verify.api.parse import parse_rows, read_options
from portable_verify.core.arguments import ArrayLike
from portable_verify.core.types import (
    DEFAULT_OPTIONS,
    DEFAULT_TYPICAL,
    VerifyOptions,
    VerifyResult,
)


def verify_rows(
    draft_token_ids: ArrayLike,
    *,
    target_rows: ArrayLike,
    target_logits: ArrayLike | None = None,
    target_probs: ArrayLike | None = None,
    num_draft_tokens: ArrayLike | None = None,
    draft_probs: ArrayLike | None = None,
    draft_rows: ArrayLike | None = None,
    options: VerifyOptions = DEFAULT_OPTIONS,
    temperature: float | ArrayLike | None = None,
    seed: int | ArrayLike | None = None,
    seed_offset: int | ArrayLike | None = None,
    uniforms: ArrayLike | None = None,
    bonus_token_ids: ArrayLike | None = None,
    backend: str = "auto",
    validate: bool | str = True,
) -> VerifyResult:
    """Verify drafts whose target rows sit in a flat ``[R, V]`` tensor at given rows.

    Args:
        draft_token_ids: int ``[B, K]`` drafts (slots at ``j >= n_i`` are not read; ``-1``
            ends a request's drafts).
        target_rows: int ``[B, K+1]``: row of the target holding request ``i``'s position ``j``
            (``j = n_i`` is its bonus position; with ``bonus_token_ids`` that row's draw is
            replaced when every draft is accepted, so it may repeat any row).
        target_logits, target_probs: float ``[R, V]`` flat target rows (exactly one).
        num_draft_tokens: int ``[B]`` (default ``K`` each).
        draft_probs: float ``[Rq, V]`` draft distributions, with ``draft_rows`` int ``[B, K]``.
        options: the method and its parameters as one :class:`VerifyOptions` (an engine builds
            it once, at start-up).
        temperature, seed, seed_offset, uniforms, bonus_token_ids, backend, validate: as in
            :func:`~portable_verify.verify`; ``validate`` also checks that the row maps index
            existing rows.

    Returns:
        :class:`VerifyResult`, as :func:`~portable_verify.verify` returns it.

    >>> import torch, portable_verify as pv
    >>> rows = torch.tensor([[0., 5., 1.], [9., 0., 0.], [0., 0., 3.]])
    >>> pv.verify_rows(torch.tensor([[1, 2]]), target_rows=torch.tensor([[2, 0, 1]]),
    ...                target_logits=rows, options=pv.VerifyOptions("greedy")).token_ids
    tensor([[ 2, -1, -1]])
    """
    opts = read_options("auto", DEFAULT_TYPICAL.eps, DEFAULT_TYPICAL.alpha, options, backend,
                        validate)
    return decide(parse_rows(draft_token_ids, target_rows, target_logits, target_probs,
                             num_draft_tokens, draft_probs, draft_rows, temperature, seed,
                             seed_offset, uniforms, bonus_token_ids, opts, backend, validate))
