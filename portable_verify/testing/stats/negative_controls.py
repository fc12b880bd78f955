"""Negative controls: deliberately wrong verifiers that the statistical checks must catch.

Each control is a small vectorised torch :class:`Backend` whose one wrong decision is named by a
:class:`Rule`. Only while they run are they registered, under private names (``_wrong_*``;
``available_backends`` never lists names starting with ``_``), and they are driven through the
public ``verify`` exactly like a real backend, so the statistical checks cannot tell them apart
from one. ``_exact_rule`` runs the same code with the correct rule: it must *pass*, which shows
the controls fail because of their bug and not because of this harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

import portable_verify as pv
from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs
from portable_verify.testing.stats.exact_laws import EXACT, EXACT_BLOCK, Rule

CONTROLS: dict[str, Rule] = {
    "_wrong_recovered_from_p": Rule(recovered="target"),
    "_wrong_accept_q_over_p": Rule(accept="inverse"),
    "_wrong_bonus_from_q": Rule(bonus="draft"),
    "_wrong_bonus_row": Rule(bonus="previous_row"),
    "_wrong_block_first_failure": Rule(block="first_failure"),
    "_wrong_block_residual_late": Rule(block="residual_late"),
    "_wrong_block_residual_unscaled": Rule(block="residual_unscaled"),
    "_wrong_block_h_last_as_middle": Rule(block="h_last_as_middle"),
}
"""Each wrong verifier and the bug it carries (see :class:`Rule`). A control runs its own rule
whatever ``method`` the call names (block controls in token-wise scenarios too: both methods
must give the target's law, so either kind of scenario can catch either kind of bug)."""

POSITIVE_CONTROL = "_exact_rule"
POSITIVE_CONTROLS: dict[str, Rule] = {POSITIVE_CONTROL: EXACT, "_exact_block_rule": EXACT_BLOCK}
"""The same test double with each correct rule: it must pass every check."""


class ControlBackend(Backend):
    """A test double registered under its own name, deciding by a (deliberately wrong) rule."""

    def __init__(self, name: str, rule: object) -> None:
        super().__init__()
        self.name = name  # type: ignore[misc]
        self.rule = rule

    def availability(self) -> Availability:
        return Availability(True, "test double")


class RuleBackend(ControlBackend):
    """Rejection sampling with dense ``p`` and ``q`` rows and a configurable (wrong) rule.

    Sampled rows only (these backends never see greedy rows in the statistical scenarios).
    """

    array_kind = "torch"
    description = "a statistical negative control (not a real backend)"
    traits = BackendTraits(chain_rules=("rejection", "typical", "block"))  # narrower: a double
    rule: Rule

    def run(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        x = inputs.draft_token_ids
        b, k = x.shape
        n = inputs.num_draft_tokens
        ar = torch.arange(b)
        p = _target_probs(inputs)  # [B, K+1, V]
        if inputs.draft_probs is not None:
            q = inputs.draft_probs[inputs.draft_rows].float()
        else:
            q = torch.nn.functional.one_hot(x, p.shape[-1]).float()
        u = inputs.uniforms
        px = p[:, :k].gather(2, x.unsqueeze(2)).squeeze(2)
        qx = q.gather(2, x.unsqueeze(2)).squeeze(2)
        if self.rule.block is not None:
            return self._block(x, n, p, q, px, qx, u)
        if self.rule.accept == "ratio":
            accept = (px > 0) & (u[:, :k] * qx <= px)
        else:
            accept = (px > 0) & (u[:, :k] * px <= qx)
        accept &= torch.arange(k).unsqueeze(0) < n.unsqueeze(1)
        a = torch.cumprod(accept.long(), dim=1).sum(1)
        p_a = p[ar, a]
        last = (n - 1).clamp(min=0)
        if k > 0:
            q_a = q[ar, a.clamp(max=k - 1)]
            residual = (p_a - q_a).clamp(min=0) if self.rule.recovered == "residual" else p_a
            residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p_a)
            bonus = {
                "target": p_a,
                "draft": q[ar, last.clamp(max=k - 1)],
                "previous_row": p[ar, last],
            }
            bonus_w = torch.where((n > 0).unsqueeze(1), bonus[self.rule.bonus], p_a)
        else:
            residual = bonus_w = p_a
        weights = torch.where((a < n).unsqueeze(1), residual, bonus_w)
        return _draw_and_emit(x, a, weights, u[:, k])


    def _block(self, x: torch.Tensor, n: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
               px: torch.Tensor, qx: torch.Tensor,
               u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block verification from dense rows, with the rule's one bug (or none)."""
        bug = self.rule.block
        b, k = x.shape
        ar, pos = torch.arange(b), torch.arange(k)
        prev, chain = torch.ones(b), []
        for j in range(k):
            ratio = torch.clamp(prev * px[:, j] / qx[:, j], max=1.0)
            prev = torch.where((prev == 0) | (px[:, j] == 0), 0.0,
                               torch.where(qx[:, j] == 0, 1.0, ratio))
            chain.append(prev)

        def ratio_h(z: torch.Tensor, big_p: torch.Tensor) -> torch.Tensor:
            return torch.where(z > 0, z / (z + 1 - big_p.double()), 0.0)

        h = torch.zeros(b, k, dtype=torch.float64)
        for j in range(k):
            big_p = chain[j]
            mid = (ratio_h((big_p[:, None] * p[:, j + 1] - q[:, j + 1]).clamp(min=0)
                           .sum(1, dtype=torch.float64), big_p) if j + 1 < k
                   else torch.zeros(b, dtype=torch.float64))
            last = big_p.double()
            if bug == "h_last_as_middle":
                last = ratio_h((big_p[:, None] * p[:, j + 1] - q[:, j]).clamp(min=0)
                               .sum(1, dtype=torch.float64), big_p)
            h[:, j] = torch.minimum(torch.where(n == j + 1, last, mid), big_p.double())
        ok = (u[:, :k].double() <= h) & (pos < n.unsqueeze(1))
        if bug == "first_failure":
            a = torch.cumprod(ok.long(), dim=1).sum(1)
        else:
            a = (ok.long() * (pos + 1)).amax(1) if k > 0 else n.clone()
        p_a = p[ar, a]
        if k > 0:
            chain_t = torch.stack(chain, 1)
            scale = (chain_t[ar, a.clamp(max=k - 1)] if bug == "residual_late"
                     else torch.ones(b) if bug == "residual_unscaled"
                     else torch.where(a > 0, chain_t[ar, (a - 1).clamp(min=0)], 1.0))
            residual = (scale[:, None] * p_a - q[ar, a.clamp(max=k - 1)]).clamp(min=0)
            residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p_a)
            weights = torch.where((a < n).unsqueeze(1), residual, p_a)
        else:
            weights = p_a
        return _draw_and_emit(x, a, weights, u[:, k])


def _draw_and_emit(x: torch.Tensor, a: torch.Tensor, weights: torch.Tensor,
                   v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_ids, a)``: each row's ``a`` accepted drafts, then the inverse-CDF draw at ``v``
    from its ``weights`` (a plain float32 cumulative sum: a control's law is judged
    statistically, not token for token), then placeholders."""
    b, k = x.shape
    c = torch.cumsum(weights, 1)
    final = torch.searchsorted(c, (v * c[:, -1]).unsqueeze(1)).squeeze(1)
    final = final.clamp(max=weights.shape[-1] - 1)
    pos = torch.arange(k + 1)
    padded = torch.cat([x, x.new_zeros(b, 1)], 1)
    tokens = torch.where(pos < a.unsqueeze(1), padded, final.unsqueeze(1))
    return tokens.masked_fill(pos > a.unsqueeze(1), PLACEHOLDER_TOKEN_ID), a


def _target_probs(inputs: VerifyInputs) -> torch.Tensor:
    rows = inputs.target[inputs.target_rows].float()
    if not inputs.target_is_logits:
        return rows
    return torch.softmax(rows / inputs.temperature.view(-1, 1, 1), dim=-1)


@contextmanager
def controls_registered() -> Iterator[list[str]]:
    """Register every control and the positive control for the duration of a block.

    Unregistered afterwards so no later ``backend_status()`` in the same process lists them.
    """
    rules = {**CONTROLS, **POSITIVE_CONTROLS}
    for name, rule in rules.items():
        pv.register_backend(name, lambda _device, n=name, r=rule: RuleBackend(n, r))
    try:
        yield list(CONTROLS)
    finally:
        for name in rules:
            pv.unregister_backend(name)
