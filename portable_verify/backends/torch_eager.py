"""Device-generic torch backend: the same vectorised code serves CPU, CUDA and XPU tensors.

Costs, per call (B requests, K drafts, V vocabulary):
* greedy: one argmax pass over the target rows; no softmax, no random numbers;
* rejection: from probabilities, only ``p(x)``/``q(x)`` at the draft ids plus one target row (and
  one draft row) per request: the row where the request rejected, or its bonus row; from logits,
  additionally one log-sum-exp pass over the target rows;
* typical: one entropy pass over the target rows, then the same single row per request.
There is no loop over the batch and no host-device synchronisation.
"""

from __future__ import annotations

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
    c = torch.cumsum(weights, dim=-1)
    threshold = (v * c[:, -1]).unsqueeze(1)
    t = torch.searchsorted(c, threshold, right=False).squeeze(1)
    return t.clamp_(max=weights.shape[-1] - 1)  # only NaN rows (validate=False) need the clamp


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
    b, k = drafts.shape
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
    per_row = torch.ones(inputs.target.shape[0], dtype=torch.float32, device=t.device)
    rows = inputs.target_rows
    per_row.index_put_((rows.reshape(-1),), safe.unsqueeze(1).expand_as(rows).reshape(-1))
    return per_row.unsqueeze(1)


def _verify_sampled(
    inputs: VerifyInputs, x: torch.Tensor, valid: torch.Tensor, n: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts and final tokens of sampled rows (rejection or typical)."""
    b, k = x.shape
    rows = inputs.target_rows
    target = inputs.target
    typical = inputs.sampled_method == "typical"
    u = inputs.uniforms

    if inputs.target_is_logits:
        row_t = _row_temperature(inputs)
        z = target.float() / row_t  # [R, V]
        lse = torch.logsumexp(z, dim=-1)  # [R]
        px = torch.exp(z[rows[:, :k], x] - lse[rows[:, :k]])
        if typical:
            entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    else:
        z = lse = None
        px = target[rows[:, :k], x].float()
        if typical:
            pf = target.float()
            entropy = -torch.xlogy(pf, pf).sum(-1)

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
    if z is not None:
        p_a = torch.exp(z[row_a] - lse[row_a].unsqueeze(1))
    else:
        p_a = target[row_a].float()
    rejected = a < n
    if typical:
        drawn = inverse_cdf_draw(p_a, u[:, k])
        return a, torch.where(rejected, first_argmax(p_a), drawn)

    a_draft = a.clamp(max=max(k - 1, 0))
    if inputs.draft_probs is not None and k > 0:
        q_a = inputs.draft_probs[inputs.draft_rows.gather(1, a_draft.unsqueeze(1)).squeeze(1)]
        residual = torch.clamp(p_a - q_a.float(), min=0)
    elif k > 0:
        x_a = x.gather(1, a_draft.unsqueeze(1))
        residual = p_a.scatter(1, x_a, 0.0)  # max(0, p - onehot(x)) = p with x zeroed
    else:
        residual = p_a
    empty = ~(residual > 0).any(dim=1, keepdim=True)
    use_residual = rejected.unsqueeze(1) & ~empty
    weights = torch.where(use_residual, residual, p_a)
    return a, inverse_cdf_draw(weights, u[:, k])


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
