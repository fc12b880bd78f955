"""Peer implementations timed beside ours: installed ones, and one rebuilt from its algorithm.

Of the installed peers only Hugging Face transformers' ``_speculative_sampling`` is importable
here (vLLM, FlashInfer and SGLang need CUDA builds). It is a private, batch-1 function: it
takes the draft's *logits* ``[1, K, V]`` and the target's processed logits ``[1, K+1, V]``,
softmaxes both, and syncs with the host to branch on the number of matches. We feed it what
its interface needs: ``log(draft_probs)`` / ``log(target_probs)`` for probability inputs
(softmax of a log is the distribution itself; the logs are taken outside the timed call), and
``target_logits / T`` plus a one-hot draft (as ``log``) for logit inputs (the division is
inside the timed call, as it is in our call). Its extra arguments changed between releases
(``last_assistant_token_is_eos, max_matches``; ``is_done_candidate``; none required), so the
adapter reads the signature (:func:`hf_extra_arguments`) instead of pinning a version. vLLM v0's
typical-acceptance sampler is rebuilt from its published algorithm
(:func:`vllm_v0_typical_callable`).

A peer is a guest: :func:`guarded` turns an adapter that raises into a reason recorded in the
cell, so one broken peer never stops the run.
"""

from __future__ import annotations

import inspect
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


HF_METHODS = frozenset({"rejection"})
"""What HF's ``_speculative_sampling`` implements."""
VLLM_V0_METHODS = frozenset({"typical"})
"""What vLLM v0's typical-acceptance sampler implements."""


def hf_callable(inputs: CaseInputs, variant: Variant) -> Callable[[], object] | None:
    """A zero-argument call of HF's verifier on this cell, or None where it does not apply."""
    b, k = inputs.drafts.shape
    if variant.method not in HF_METHODS or b != 1 or k == 0:
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

    extra = hf_extra_arguments(_speculative_sampling, k)

    def call() -> object:
        new_logits = target_logits if temperature is None else target_logits / temperature
        return _speculative_sampling(drafts, draft_logits, k, new_logits, **extra)

    return call


HF_EXTRA_ARGUMENTS = {
    "is_done_candidate": lambda k: False,  # the draft did not end in EOS or at max length
    "last_assistant_token_is_eos": lambda k: False,  # the same, in older releases
    "max_matches": lambda k: k,  # every draft may be accepted
}
"""Values for the required arguments ``_speculative_sampling`` has had after its first four
(read in transformers' own source): each lets the verifier decide exactly as algorithm 1."""


def hf_extra_arguments(fn: Callable[..., object], k: int) -> dict[str, object]:
    """Keyword arguments for ``fn``'s required parameters after the first four (candidates,
    draft logits, candidate length, target logits); a required one we do not know raises, with
    its name, so the cell says why it was not timed."""
    params = list(inspect.signature(fn).parameters.values())[4:]
    extra: dict[str, object] = {}
    for param in params:
        if param.default is not inspect.Parameter.empty or param.kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.name not in HF_EXTRA_ARGUMENTS:
            raise TypeError(f"_speculative_sampling has a required argument {param.name!r} "
                            "this adapter does not know (a transformers release it was not "
                            "written for)")
        extra[param.name] = HF_EXTRA_ARGUMENTS[param.name](k)
    return extra


def guarded(build: Callable[[], Callable[[], object] | None]
            ) -> tuple[Callable[[], object] | None, str | None]:
    """``(call, None)`` for a peer that builds and runs once, ``(None, reason)`` for one that
    raises (the reason goes in the cell), ``(None, None)`` where it does not apply. The one
    call is the peer's first warm-up; the harness warms it up again."""
    try:
        call = build()
        if call is not None:
            call()
    except Exception as exc:  # a peer is another project's code: any failure is its reason
        return None, f"{type(exc).__name__}: {exc}"[:500]
    return call, None


def vllm_v0_typical_callable(inputs: CaseInputs, variant: Variant, eps: float,
                             alpha: float) -> Callable[[], object] | None:
    """vLLM v0's typical-acceptance sampler, rebuilt from its published algorithm (vLLM needs
    a CUDA build here), or None where it does not apply.

    Why this contender: it is the typical sampler serving users ran, so typical acceptance is
    compared with practice, not only with the dense textbook baseline. The engine's sampler
    handed it softmax probabilities of every row, so the timed call starts with the softmax
    of ``logits / T`` (our call starts from the same logits). It computes
    ``-(p * log(p + 1e-5)).sum(-1)`` over every draft row, the threshold
    ``min(eps, alpha * exp(-H))``, ``p(x)`` and the recovered ``argmax(p)`` at every draft
    position, and no residual rows; the bonus token is the engine's own draw, made beforehand
    (outside the timing), which favours the contender.
    """
    if variant.method not in VLLM_V0_METHODS:
        return None
    drafts = inputs.drafts
    b, k = drafts.shape
    v = inputs.target.shape[-1]
    bonus = torch.randint(0, v, (b, 1), generator=torch.Generator().manual_seed(0))
    bonus = bonus.to(drafts.device)
    temperature = variant.temperature if variant.inputs == "logits" else None
    target = inputs.target
    column = torch.arange(k + 1, device=drafts.device)

    def call() -> object:
        scaled = target if temperature is None else target / temperature
        probs = torch.softmax(scaled.float(), dim=-1)[:, :k]
        px = probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        entropy = -(probs * torch.log(probs + 1e-5)).sum(dim=-1)
        threshold = torch.minimum(torch.full_like(entropy, eps), alpha * torch.exp(-entropy))
        accepted = torch.cumprod((px > threshold).to(torch.int64), dim=1).sum(dim=1, keepdim=True)
        recovered = probs.argmax(dim=-1)
        final = torch.cat([recovered, bonus], dim=1).gather(1, accepted)
        out = torch.where(column < accepted, torch.cat([drafts, bonus], dim=1), final)
        return out.masked_fill_(column > accepted, -1)

    return call
