"""The dense textbook verifier: what engines commonly ran before this project (vLLM v0 style).

It is the *baseline* the benchmark divides by, so it is deliberately written the way those
samplers were: greedy rows go through the full sampler as one-hot distributions, the softmax
covers every row, a residual row is built for every draft position (``B*K`` rows, though at most
one per request is used), and every sample is an exponential race ``argmax(p / E)`` over
``B*K*V`` fresh exponentials. It is slow by design, but it is correct: rejection sampling is an
exact sampler of the target, greedy makes the same decisions as docs/semantics.md, and typical
acceptance applies the same threshold rule. It does not reproduce the project's random numbers,
so only distributions (not individual tokens) are comparable for sampled rows.
"""

from __future__ import annotations

import torch

from portable_verify.core import arguments, methods
from portable_verify.core.types import (
    DEFAULT_TYPICAL,
    PLACEHOLDER_TOKEN_ID,
    TypicalParams,
)


def _temperatures(temperature: float | torch.Tensor | None, method: str, b: int,
                  device: torch.device) -> torch.Tensor:
    """float32 ``[B]``; 0 marks a greedy row (the front door's normaliser, unchecked)."""
    if methods.greedy_only(method):
        return torch.zeros(b, device=device)
    return arguments.temperatures(temperature, b, device, validate=False)[0]


def _exponential_race(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One exact draw per row from ``weights >= 0``: ``argmax(w / E)`` with ``E ~ Exp(1)``."""
    e = torch.empty_like(weights).exponential_(1.0, generator=generator)
    # exponential_ may return exactly 0; a tiny floor keeps w / E finite without biasing draws.
    return torch.argmax(weights / e.clamp_(min=torch.finfo(torch.float32).tiny), dim=-1)


def _target_probs(target: torch.Tensor, is_logits: bool, temps: torch.Tensor) -> torch.Tensor:
    """``[B, K+1, V]`` float32 probabilities; greedy rows become one-hot at their argmax."""
    target = target.float()
    greedy = (temps == 0).view(-1, 1, 1)
    if is_logits:
        safe_t = torch.where(temps > 0, temps, torch.ones_like(temps)).view(-1, 1, 1)
        probs = torch.softmax(target / safe_t, dim=-1)
    else:
        probs = target
    one_hot = torch.zeros_like(probs).scatter_(-1, target.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, probs)


def _emit(drafts: torch.Tensor, accept: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """``[B, K+1]`` output from per-position accepts and per-position final tokens ``[B, K+1]``."""
    b, k = drafts.shape
    a = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1, keepdim=True)
    pos = torch.arange(k + 1, device=drafts.device)
    padded = torch.cat([drafts, drafts.new_zeros(b, 1)], dim=1)
    out = torch.where(pos < a, padded, final.gather(1, a))
    return out.masked_fill_(pos > a, PLACEHOLDER_TOKEN_ID)


def dense_verify(
    draft_token_ids: torch.Tensor,
    *,
    target_logits: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    method: str = "rejection",
    temperature: float | torch.Tensor | None = 1.0,
    typical: TypicalParams = DEFAULT_TYPICAL,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Verify drafts the dense way; returns ``token_ids`` int64 ``[B, K+1]`` (-1 padded).

    Args mirror :func:`portable_verify.verify` (padded layout, every request uses all ``K``
    drafts). ``generator`` drives every random number; None uses torch's global generator.

    >>> logits = torch.tensor([[[0., 5., 1.], [9., 0., 0.], [0., 0., 3.]]])
    >>> dense_verify(torch.tensor([[1, 2]]), target_logits=logits, method="greedy").tolist()
    [[1, 0, -1]]
    """
    if method not in DENSE_METHODS:
        raise ValueError(f"method must be one of {DENSE_METHODS}, got {method!r}")
    if (target_logits is None) == (target_probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    target = target_logits if target_logits is not None else target_probs
    drafts = draft_token_ids.to(torch.int64)
    b, k = drafts.shape
    temps = _temperatures(temperature, method, b, target.device)
    p = _target_probs(target, target_logits is not None, temps)  # [B, K+1, V]
    x = drafts.unsqueeze(-1)
    px = p[:, :k].gather(-1, x).squeeze(-1)  # [B, K]
    return _RULES[method](drafts, p, px, temps, draft_probs, typical, generator)


def _typical(drafts: torch.Tensor, p: torch.Tensor, px: torch.Tensor, temps: torch.Tensor,
             draft_probs: torch.Tensor | None, typical: TypicalParams,
             generator: torch.Generator | None) -> torch.Tensor:
    k = drafts.shape[1]
    entropy = -torch.xlogy(p, p).sum(-1)  # [B, K+1]: every row, used or not
    accept = px > typical.threshold(entropy[:, :k], torch)
    final = p.argmax(-1)  # recovered token at every position
    bonus = _exponential_race(p[:, k], generator)  # a fully sampled bonus for every row
    final[:, k] = bonus
    return _emit(drafts, accept, final)


def _rejection(drafts: torch.Tensor, p: torch.Tensor, px: torch.Tensor, temps: torch.Tensor,
               draft_probs: torch.Tensor | None, typical: TypicalParams,
               generator: torch.Generator | None) -> torch.Tensor:
    """One-hot draft distributions when the draft is deterministic (or greedy rows)."""
    (b, k), v, x = drafts.shape, p.shape[-1], drafts.unsqueeze(-1)
    one_hot_q = torch.zeros(b, k, v, device=p.device).scatter_(-1, x, 1.0)
    if draft_probs is None:
        q = one_hot_q
    else:
        q = torch.where((temps == 0).view(-1, 1, 1), one_hot_q, draft_probs.float())
    qx = q.gather(-1, x).squeeze(-1)
    u = torch.rand(b, k, generator=generator, device=p.device)
    accept = (px > 0) & (u * qx <= px)
    residual = torch.clamp(p[:, :k] - q, min=0)  # B*K residual rows
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p[:, :k], residual)
    residual = residual / residual.sum(-1, keepdim=True)
    recovered = _exponential_race(residual, generator)  # B*K*V exponentials
    bonus = _exponential_race(p[:, k], generator)
    return _emit(drafts, accept, torch.cat([recovered, bonus.unsqueeze(1)], dim=1))


_RULES = {"greedy": _rejection, "rejection": _rejection, "typical": _typical}
"""The dense loop's rules (greedy rows: rejection's one-hot path at temperature 0)."""
DENSE_METHODS = tuple(_RULES)
