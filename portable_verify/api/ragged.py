"""The flattened ("ragged") entry point serving engines use, e.g. vLLM v1's rejection sampler.

Why a second front door: a serving engine packs every request's drafts back to back. Padding
them to ``[B, K+1, V]`` would copy the whole target (the largest tensor of the step). Instead the
ragged call builds the same row maps the padded call builds (``rows [B, K+1]``, ``draft_rows
[B, K]``, ``core/layout.py``) pointing into the flat tensors, and hands them to the shared
tail :func:`portable_verify.api.call.decide`, so every backend sees the ragged layout without
a copy.
"""

from __future__ import annotations

from portable_verify.api.call import decide
from portable_verify.api.parse import parse_ragged, read_options
from portable_verify.core.arguments import ArrayLike
from portable_verify.core.types import DEFAULT_TYPICAL, VerifyOptions, VerifyResult


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
    typical_eps: float = DEFAULT_TYPICAL.eps,
    typical_alpha: float = DEFAULT_TYPICAL.alpha,
    bonus_token_ids: ArrayLike | None = None,
    backend: str = "auto",
    validate: bool | str = True,
    options: VerifyOptions | None = None,
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
    opts = read_options(method, typical_eps, typical_alpha, options, backend, validate)
    return decide(parse_ragged(draft_token_ids, num_draft_tokens, cu_num_draft_tokens,
                               target_logits, target_probs, draft_probs, temperature, seed,
                               seed_offset, uniforms, max_num_draft_tokens, bonus_token_ids,
                               opts, backend, validate))
