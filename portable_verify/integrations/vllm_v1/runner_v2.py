"""portable_verify behind vLLM's "Model Runner V2" (GPUs with Triton), through ``custom_sampler``.

Why a second adapter: the V2 runner does not use ``vllm.v1.sample.rejection_sampler``; its own
``RejectionSampler`` applies the sampling parameters to ``[N+B, V]`` logits (every request's
draft rows, then its bonus row: portable_verify's ragged layout already) and calls a fused
kernel. The official seam is ``ModelState.custom_sampler``; the plugin wraps the base class's
method so every model state that keeps the default sampler returns a subclass whose ``_verify``
asks portable_verify instead of vLLM's kernel.

Written from vLLM 0.32's source. The decision function :func:`verify_v2_step` is tested without
an engine (tests/test_vllm_v1_sampler.py); the engine path needs a GPU with Triton and has not
been run by this project (docs/integrations.md).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from portable_verify import lean_calls, verify_call, verify_rows
from portable_verify.core import layout
from portable_verify.core.layout import FlatLayout
from portable_verify.core.types import DEFAULT_OPTIONS, VerifyCall, VerifyOptions

logger = logging.getLogger("vllm.plugins.portable_verify")

_V2_SAMPLER_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
_V2_STATE_MODULE = "vllm.v1.worker.gpu.model_states.interface"


def verify_v2_step(
    processed_logits: torch.Tensor,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_speculative_steps: int,
    backend: str = "auto",
    options: VerifyOptions = DEFAULT_OPTIONS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The V2 runner's ``rejection_sample`` contract: int64 ``[B, steps+1]``, int32 ``[B]``.

    Request ``i`` owns logits rows ``cu[i] .. cu[i+1]-1``; row ``cu[i]+j`` predicts the token
    after input ``draft_sampled[cu[i]+j]``, so its draft is ``draft_sampled[cu[i]+j+1]`` (``-1``
    = placeholder, no proposal). The logits arrive tempered; ``temperature`` (indexed by request
    state) only marks greedy rows. Randomness: the request's ``seed`` with the position of its
    first row as ``seed_offset``, counter-based like vLLM's own V2 kernel. ``options``: the
    sampled rows' rule and its parameters, as in the V1 seam.
    """
    k = num_speculative_steps
    if lean_calls(backend, processed_logits.device.type, options.sampled_method):
        # The kernels read the offsets, drafts (one row on), states and positions in place.
        b = cu_num_logits.shape[0] - 1
        call = VerifyCall(
            draft_sampled, None, processed_logits, "target_logits", None, None, None,
            temperature, seed, pos, None, None, options, options.sampled_method, False,
            backend, False, False,
            FlatLayout(cu_num_logits, "cu", b, k, bonus_rows=False, count_minus=1,
                       draft_shift=1, request_map=idx_mapping, temperature_marks=True,
                       offsets_at_first_row=True, emitted_dtype=torch.int32))
        result = verify_call(call)
        return result.token_ids, result.num_emitted
    cu = cu_num_logits.to(torch.int64)
    first = cu[:-1]
    counts = cu[1:] - first - 1
    last_row = processed_logits.shape[0] - 1
    rows = layout.position_rows(first, counts, k, processed_logits.shape[0])
    drafts, _ = layout.gather_drafts(draft_sampled, first + 1, counts, k)
    state = idx_mapping.to(torch.int64)
    temps = torch.where(temperature[state] == 0, 0.0, 1.0).to(torch.float32)
    result = verify_rows(drafts, target_rows=rows, target_logits=processed_logits,
                         num_draft_tokens=counts, temperature=temps,
                         seed=seed[state].to(torch.int64),
                         seed_offset=pos[first.clamp(max=last_row)].to(torch.int64),
                         options=options, backend=backend, validate=False)
    return result.token_ids, result.num_emitted.to(torch.int32)


def _handback_reason(sampler: Any, draft_logits: torch.Tensor | None) -> str | None:
    """Why vLLM's own kernel must decide this step, or None."""
    if draft_logits is not None:
        return "probabilistic draft sampling (draft logits) is not mapped yet"
    if sampler.synthetic_conditional_rates is not None:
        return "synthetic acceptance is vLLM's benchmarking rule, not verification"
    if sampler.use_block_verification:
        return "block verification is a different acceptance rule"
    if sampler.watermark_key is not None:
        return "watermarked sampling keys its randomness to vLLM's kernel"
    return None


def make_v2_rejection_sampler(base: type, backend: str,
                              options: VerifyOptions = DEFAULT_OPTIONS) -> type:
    """A subclass of vLLM's V2 ``RejectionSampler`` whose verification is portable_verify's."""

    class PortableVerifyRejectionSampler(base):  # type: ignore[misc, valid-type]
        _told: set[str] = set()  # noqa: RUF012 - one log line per reason and process

        def _verify(self, logits: torch.Tensor, draft_logits: torch.Tensor | None,
                    draft_sampled: torch.Tensor, pos: torch.Tensor,
                    cu_num_logits: torch.Tensor, idx_mapping: torch.Tensor,
                    idx_mapping_np: Any, expanded_idx_mapping: torch.Tensor,
                    expanded_local_pos: torch.Tensor, seq_lens_upper_bound_np: Any,
                    verify_draft_sampled: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            reason = _handback_reason(self, draft_logits)
            if reason is not None:
                if reason not in self._told:
                    logger.info("portable_verify: vLLM's V2 kernel decides (%s)", reason)
                    self._told.add(reason)
                return super()._verify(
                    logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping,
                    idx_mapping_np, expanded_idx_mapping, expanded_local_pos,
                    seq_lens_upper_bound_np, verify_draft_sampled)
            processed = self.sampler.apply_sampling_params(
                logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos,
                draft_sampled, expanded_local_pos, seq_lens_upper_bound_np)
            states = self.sampler.sampling_states
            sampled, num_sampled = verify_v2_step(
                processed, verify_draft_sampled, cu_num_logits, pos, idx_mapping,
                states.temperature.gpu, states.seeds.gpu, self.num_speculative_steps,
                backend, options)
            return processed, sampled, num_sampled

    return PortableVerifyRejectionSampler


def install_v2_hook(backend: str, options: VerifyOptions = DEFAULT_OPTIONS) -> bool:
    """Wrap ``ModelState.custom_sampler``; False (logged) where the V2 runner is not importable."""
    import importlib

    try:
        states = importlib.import_module(_V2_STATE_MODULE)
        samplers = importlib.import_module(_V2_SAMPLER_MODULE)
    except Exception as exc:  # the V2 runner needs Triton; CPU builds use the V1 runner
        logger.debug("portable_verify: V2 model runner not importable here (%s)", exc)
        return False
    model_state = states.ModelState
    original = model_state.custom_sampler
    if getattr(original, "portable_verify", False):
        return True
    sampler_class = make_v2_rejection_sampler(samplers.RejectionSampler, backend, options)

    def custom_sampler(self: Any, sampler: Any) -> tuple[Any, Any] | None:
        custom = original(self, sampler)
        config = self.vllm_config
        if custom is not None or config.speculative_config is None:
            return custom
        if getattr(config, "watermark_config", None) is not None:
            logger.info("portable_verify: watermarking is on; vLLM's V2 sampler kept")
            return None
        return sampler, sampler_class(sampler, config.speculative_config, self.device)

    custom_sampler.portable_verify = True  # type: ignore[attr-defined]
    model_state.custom_sampler = custom_sampler
    return True
