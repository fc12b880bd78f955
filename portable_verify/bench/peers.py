"""Peer implementations timed beside ours, where they are installed.

Only Hugging Face transformers' ``_speculative_sampling`` is importable here (vLLM, FlashInfer
and SGLang need CUDA builds). It is a private, batch-1 function: it takes the draft's *logits*
``[1, K, V]`` and the target's processed logits ``[1, K+1, V]``, softmaxes both, and syncs with
the host to branch on the number of matches. We feed it what its interface needs:
``log(draft_probs)`` / ``log(target_probs)`` for probability inputs (softmax of a log is the
distribution itself; the logs are taken outside the timed call), and ``target_logits / T`` plus
a one-hot draft (as ``log``) for logit inputs (the division is inside the timed call, as it is
in our call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from portable_verify.bench.cases import CaseInputs, Variant


@dataclass(frozen=True)
class PeerStatus:
    name: str
    available: bool
    detail: str


def hf_status() -> PeerStatus:
    """Whether transformers' ``_speculative_sampling`` exists in the installed version."""
    name = "transformers._speculative_sampling"
    try:
        import transformers
        from transformers.generation.utils import _speculative_sampling  # noqa: F401
    except ImportError as exc:
        return PeerStatus(name, False, f"not importable: {exc}")
    return PeerStatus(name, True, f"transformers {transformers.__version__}, batch 1 only")


def hf_callable(inputs: CaseInputs, variant: Variant) -> Callable[[], object] | None:
    """A zero-argument call of HF's verifier on this cell, or None where it does not apply."""
    b, k = inputs.drafts.shape
    if variant.method != "rejection" or b != 1 or k == 0:
        return None
    from transformers.generation.utils import _speculative_sampling

    drafts = inputs.drafts
    if variant.inputs == "probs":
        draft_logits = torch.log(inputs.draft_probs)
        target_logits = torch.log(inputs.target)
        temperature = None
    else:
        v = inputs.target.shape[-1]
        one_hot = torch.zeros(b, k, v, device=drafts.device, dtype=inputs.target.dtype)
        draft_logits = torch.log(one_hot.scatter_(-1, drafts.unsqueeze(-1), 1.0))
        target_logits = inputs.target
        temperature = variant.temperature

    def call() -> object:
        new_logits = target_logits if temperature is None else target_logits / temperature
        return _speculative_sampling(drafts, draft_logits, k, new_logits)

    return call
