"""The dense textbook verifier behind :func:`portable_verify.verify`'s signature.

Why: the seed preset compares our verifier with the dense one inside the same decoding loop, so
the loop must be able to swap it in unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from portable_verify.bench.dense import dense_verify
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyOptions, VerifyResult


def dense_verifier(seed: int) -> Any:
    """A callable like ``verify`` running :func:`~portable_verify.bench.dense.dense_verify`.

    Its random numbers come from one ``torch.Generator`` per device, seeded once: the dense
    verifier cannot reproduce the project's per-request streams, so only distributions (not
    single tokens) of sampled runs are comparable.
    """
    generators: dict[torch.device, torch.Generator] = {}

    def verifier(draft_token_ids: torch.Tensor, *, target_logits: torch.Tensor | None = None,
                 target_probs: torch.Tensor | None = None,
                 draft_probs: torch.Tensor | None = None, method: str = "rejection",
                 temperature: Any = None, options: VerifyOptions | None = None,
                 **_: Any) -> VerifyResult:
        if options is None:
            options = VerifyOptions(method)
        method = options.method
        target = target_logits if target_logits is not None else target_probs
        if target is None:
            raise ValueError("give target_logits or target_probs")
        if target.device not in generators:
            generators[target.device] = torch.Generator(device=target.device).manual_seed(seed)
        tokens = dense_verify(
            draft_token_ids, target_logits=target_logits, target_probs=target_probs,
            draft_probs=draft_probs, method="rejection" if method == "auto" else method,
            temperature=temperature, typical=options.typical,
            generator=generators[target.device],
        )
        emitted = (tokens != PLACEHOLDER_TOKEN_ID).sum(1)
        drafted = torch.full_like(emitted, draft_token_ids.shape[1])
        return VerifyResult(tokens, emitted - 1, emitted, drafted)

    return verifier
