"""vLLM V1's rejection sampler rebuilt from its published algorithm in torch ops: a contender.

Why: the seam's speed target is vLLM's own sampler on the same arguments, and the lent GPU has
no vLLM (its wheels exceed what can be carried there). So the algorithm of vLLM 0.32's
``vllm/v1/sample/rejection_sampler.py`` is rebuilt here (read, not copied), as
:func:`portable_verify.bench.peers.vllm_v0_typical_callable` rebuilt v0's typical sampler:

1. float64 uniforms for every draft from torch's generator (rows of seeded requests redrawn
   from theirs), before anything else, as vLLM draws them;
2. greedy requests: ``argmax`` of the target rows, then the greedy pass (accept while the draft
   is the argmax; the argmax at the first miss, the bonus token after a full match);
3. sampled requests: a float32 softmax, one float32 exponential row ``E`` per request (seeded
   rows redrawn), the recovered token of every draft row ``argmax(max(p - q, 0) / E)`` (``q``
   a one-hot of the draft without draft probabilities), then the decision: accept while
   ``q(x) > 0 and p(x) / q(x) >= u`` (a draft id ``-1`` is rejected).

vLLM's recovered-token kernel scans the vocabulary in 8192-wide chunks, keeping a chunk's
maximum only when it is strictly greater (lowest index within a chunk): that is the lowest index
of the row's maximum, which one ``torch.argmax`` over the row returns. With the same generator
state the tokens are vLLM's: the draws are taken in its order and the float arithmetic is the
same. The arguments and the int32 ``[B, max_spec_len + 1]`` output (``-1`` placeholders) are
vLLM's ``rejection_sample``'s, so it is timed on the arguments the seam
(:func:`portable_verify.integrations.vllm_v1.sampler.verify_spec_decode_step`) is given.
Launches differ from vLLM's Triton kernels; gpu-check calibrates its eager time against vLLM's
measured figures before any target is claimed against it.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = 0.0
RECOVERED_CHUNK = 8192
"""vLLM's chunk width over the vocabulary in its recovered-token kernel (see the docstring)."""


class _Maps(NamedTuple):
    """The step's ragged layout as padded ``[B, K]`` maps (built on the host, one copy)."""

    rows: torch.Tensor  # int64 [B, K]: flat draft row of (request, position); 0 where padded
    valid: torch.Tensor  # bool [B, K]
    counts: torch.Tensor  # int64 [B, 1]
    request: torch.Tensor  # int64 [num_tokens]: the request of each draft row
    positions: torch.Tensor  # int64 [K + 1]


@functools.lru_cache(maxsize=64)
def _maps(num_draft_tokens: tuple[int, ...], k: int, device: torch.device) -> _Maps:
    """Cached per step shape (as the plugin's host maps are): a timed loop copies nothing, and
    a call captured in a CUDA graph after one eager call reads tensors that outlive it."""
    counts = np.asarray(num_draft_tokens, dtype=np.int64)
    b = counts.size
    positions = np.arange(k + 1)
    valid = positions[:k] < counts[:, None]
    rows = np.where(valid, (np.cumsum(counts) - counts)[:, None] + positions[:k], 0)
    request = np.repeat(np.arange(b), counts)
    packed = torch.from_numpy(np.concatenate(
        [rows.ravel(), valid.ravel(), counts, request, positions])).to(device)
    cut = np.cumsum([b * k, b * k, b, request.size])
    return _Maps(packed[: cut[0]].view(b, k), packed[cut[0]: cut[1]].view(b, k).bool(),
                 packed[cut[1]: cut[2]].view(b, 1), packed[cut[2]: cut[3]], packed[cut[3]:])


def _uniforms(num_draft_tokens: list[int], generators: dict[int, torch.Generator],
              n: int, device: torch.device) -> torch.Tensor:
    """float64 uniforms, one per draft; a seeded request's rows from its generator (a request
    without drafts never touches its generator, as in vLLM)."""
    uniforms = torch.rand((n,), dtype=torch.float64, device=device)
    start = 0
    for i, count in enumerate(num_draft_tokens):
        if count and generators.get(i) is not None:
            uniforms[start: start + count].uniform_(generator=generators[i])
        start += count
    return uniforms


def _recovered(probs: torch.Tensor, draft_probs: torch.Tensor | None, drafts: torch.Tensor,
               num_draft_tokens: list[int], generators: dict[int, torch.Generator],
               request: torch.Tensor) -> torch.Tensor:
    """Each draft row's recovered token: ``argmax(max(p - q, 0) / E)`` with one exponential
    row ``E`` per request."""
    exponential = torch.empty((len(num_draft_tokens), probs.shape[-1]), dtype=torch.float32,
                              device=probs.device).exponential_()
    for i, generator in generators.items():
        if num_draft_tokens[i] > 0:
            exponential[i].exponential_(generator=generator)
    inv = exponential.reciprocal()[request]
    if draft_probs is None:  # q is the draft's one-hot: its own entry leaves the residual
        score = probs * inv
        column = drafts.clamp(min=0).unsqueeze(1)
        score.scatter_(1, column, torch.where(drafts.unsqueeze(1) >= 0, 0.0,
                                              score.gather(1, column)))
    else:
        score = (probs - draft_probs).clamp_(min=0.0).mul_(inv)
    return score.argmax(dim=-1)


def _accepted(probs: torch.Tensor, draft_probs: torch.Tensor | None, drafts: torch.Tensor,
              uniforms: torch.Tensor) -> torch.Tensor:
    """Each draft row's ratio test ``q(x) > 0 and p(x) / q(x) >= u`` (``q(x) = 1`` without
    draft probabilities); a draft id ``-1`` is rejected."""
    column = drafts.clamp(min=0).unsqueeze(1)
    p = probs.gather(1, column).squeeze(1)
    if draft_probs is None:
        return (p >= uniforms) & (drafts >= 0)
    q = draft_probs.gather(1, column).squeeze(1)
    return (q > 0) & (p / q >= uniforms) & (drafts >= 0)


def _decide(maps: _Maps, drafts: torch.Tensor, accepted: torch.Tensor,
            replacement: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """Accepted drafts, then the replacement at the first rejection or the bonus token after
    a full match, then ``-1``: int32 ``[B, K + 1]``."""
    k = maps.rows.shape[1]
    kept = (accepted[maps.rows] & maps.valid).cumprod(dim=1).sum(dim=1, keepdim=True)
    at_miss = replacement[maps.rows].gather(1, kept.clamp(max=max(k - 1, 0)))
    last = torch.where(kept < maps.counts, at_miss, bonus.reshape(-1, 1))
    prefix = torch.nn.functional.pad(drafts[maps.rows], (0, 1))
    positions = maps.positions
    tokens = torch.where(positions < kept, prefix,
                         torch.where(positions == kept, last, PLACEHOLDER_TOKEN_ID))
    return tokens.to(torch.int32)


def vllm_v1_rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int],
                             max_spec_len: int, cu_num_draft_tokens: torch.Tensor,
                             draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                             bonus_token_ids: torch.Tensor, sampling_metadata: Any
                             ) -> torch.Tensor:
    """vLLM 0.32's ``rejection_sample`` rebuilt in torch ops (see the module docstring).

    Arguments are vLLM's, in its order: ``draft_token_ids`` int ``[num_tokens]`` (``-1``: no
    proposal); ``num_draft_tokens`` a host list ``[B]``; ``cu_num_draft_tokens`` inclusive
    ``[B]`` (the layout is read from ``num_draft_tokens``, which vLLM passes beside it);
    ``draft_probs`` ``[num_tokens, V]`` or None; ``target_logits`` ``[num_tokens, V]``, one row
    per draft, already tempered; ``bonus_token_ids`` ``[B, 1]``; from ``sampling_metadata``
    ``temperature`` ``[B]`` (0: greedy), ``all_greedy``, ``all_random`` and ``generators``
    (request index -> ``torch.Generator``). Returns int32 ``[B, max_spec_len + 1]``.
    """
    del cu_num_draft_tokens  # the same layout as num_draft_tokens
    device = target_logits.device
    b, n = len(num_draft_tokens), draft_token_ids.shape[0]
    if n == 0:  # nothing to verify: every request emits its bonus token
        out = torch.full((b, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
                         device=device)
        out[:, 0] = bonus_token_ids.reshape(-1)
        return out
    md = sampling_metadata
    generators = md.generators or {}
    uniforms = (None if md.all_greedy else
                _uniforms(num_draft_tokens, generators, n, device))
    maps = _maps(tuple(num_draft_tokens), max_spec_len, device)
    drafts = draft_token_ids.to(torch.int64)
    bonus = bonus_token_ids.to(torch.int64)
    if not md.all_random:
        argmax = target_logits.argmax(dim=-1)
        if md.all_greedy:
            return _decide(maps, drafts, drafts == argmax, argmax, bonus)
    probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    recovered = _recovered(probs, draft_probs, drafts, num_draft_tokens, generators,
                           maps.request)
    accepted = _accepted(probs, draft_probs, drafts, uniforms)
    if not md.all_random:
        greedy = (md.temperature == GREEDY_TEMPERATURE)[maps.request]
        accepted = torch.where(greedy, drafts == argmax, accepted)
        recovered = torch.where(greedy, argmax, recovered)
    return _decide(maps, drafts, accepted, recovered, bonus)
