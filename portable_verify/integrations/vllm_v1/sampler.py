"""portable_verify in the place of vLLM v1's ``rejection_sample`` (the decision, nothing else).

Why this seam: vLLM's ``RejectionSampler.forward`` first applies the logits processors,
penalties, temperature, top-k/top-p and samples the bonus tokens with its regular sampler, then
hands everything to the module function ``rejection_sample``. Replacing only that function keeps
every one of vLLM's sampling features (and its logprobs) while portable_verify decides accept,
reject, recover and where the bonus token goes. Nothing here imports vLLM: the function is
called with vLLM's arguments, and the sampling metadata is read by attribute.

What vLLM hands over: ``target_logits`` ``[N, V]`` float32, already divided by the temperature
(greedy rows divided by 1) and masked (``-inf``) by top-k/top-p: the draft rows only, no bonus
rows. portable_verify reads them in place through a row map (no copy): each request's bonus
position points at an existing row whose content is never decisive, because the caller's bonus
token (``bonus_token_ids``) replaces whatever is drawn there.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from portable_verify import lean_calls, verify_call, verify_rows
from portable_verify.core import layout
from portable_verify.core.layout import FlatLayout
from portable_verify.core.types import (
    DEFAULT_OPTIONS,
    PLACEHOLDER_TOKEN_ID,
    VerifyCall,
    VerifyOptions,
)
from portable_verify.integrations.generator_seeds import seeds_from_generators

logger = logging.getLogger("vllm.plugins.portable_verify")

RejectionSampleFn = Callable[..., torch.Tensor]


def verify_spec_decode_step(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: Any,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
    *,
    backend: str = "auto",
    options: VerifyOptions = DEFAULT_OPTIONS,
    unseeded: torch.Generator | Callable[[torch.device], torch.Generator] | None = None,
) -> torch.Tensor:
    """One vLLM v1 verification step decided by portable_verify: int32 ``[B, max_spec_len+1]``.

    The positional arguments are vLLM's ``rejection_sample``'s, in its order (this is the one
    copy of its signature: the replacement passes its arguments on as vLLM gave them):
    ``cu_num_draft_tokens`` inclusive, no leading 0; ``num_draft_tokens`` a host list; draft
    id ``-1`` = no proposal. From ``sampling_metadata`` only ``temperature`` (compared with 0:
    the logits arrive already tempered), ``all_greedy``, ``all_random`` and ``generators`` are
    read; the synthetic mode's arguments and ``use_fp64_gumbel`` are not (synthetic mode is
    vLLM's own, see :func:`make_rejection_sample`). Seeded requests with drafts this step draw
    one seed each from their generator; requests without drafts never touch theirs, as in
    vLLM, so a request's stream does not depend on its neighbours. ``options`` holds the rule
    of the sampled rows (``rejection``, ``typical``, ``block``; greedy rows are always greedy)
    and its parameters; unseeded rows draw their seeds from ``unseeded`` (a generator, or a
    function of the device giving one; torch's global generator if None).
    """
    if synthetic_mode:
        raise NotImplementedError("synthetic acceptance is vLLM's rule: its rejection_sample "
                                  "decides it")
    del synthetic_conditional_rates, use_fp64_gumbel  # synthetic mode / vLLM's own draws only
    temperature = sampling_metadata.temperature
    all_greedy, all_random = sampling_metadata.all_greedy, sampling_metadata.all_random
    b = len(num_draft_tokens)
    n = draft_token_ids.shape[0]
    k = max_spec_len
    device = target_logits.device
    if b == 0 or n == 0:  # nothing to verify: every request emits its bonus token
        out = torch.full((b, k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
        out[:, 0] = bonus_token_ids.reshape(-1).to(torch.int32)
        return out
    options = _greedy(options) if all_greedy else options
    if lean_calls(backend, device.type, options.sampled_method):
        return _lean_step(draft_token_ids, cu_num_draft_tokens, k, draft_probs, target_logits,
                          bonus_token_ids, sampling_metadata, num_draft_tokens, backend,
                          options, unseeded)
    host = device.type == "cpu"
    if host:  # numpy, and maps cached per step shape: a step is a few small array ops
        counts, rows, draft_rows, used = _host_maps(tuple(num_draft_tokens), k)
        flat = draft_token_ids.numpy()
        drafts = (flat.reshape(b, k).astype(np.int64) if used is None  # every request has k
                  else np.where(used, flat[draft_rows], 0).astype(np.int64))
        bonus = bonus_token_ids.numpy().reshape(-1)
    else:
        cu = cu_num_draft_tokens.to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        # vLLM's target has one row per draft and no bonus rows: the bonus position repeats a
        # row, only read when every draft passed, and then the caller's bonus token replaces it.
        drafts, rows, draft_rows = layout.ragged_maps(draft_token_ids, counts, cu - counts, k,
                                                      bonus_rows=False)
        bonus = bonus_token_ids.reshape(-1)
    temps: float | Any = 1.0
    seeds: Any = None
    if not all_greedy:
        skip = frozenset(i for i, m in enumerate(num_draft_tokens) if m == 0)
        seeds = seeds_from_generators(sampling_metadata.generators, b, device, skip_rows=skip,
                                      check=False,
                                      fallback=unseeded(device) if callable(unseeded) else unseeded)
        seeds = seeds.numpy() if host else seeds
        if not all_random:
            assert temperature is not None, "vLLM gives per-request temperatures when mixed"
            greedy = temperature[:b] == 0
            temps = (np.where(greedy.numpy(), 0.0, 1.0).astype(np.float32) if host
                     else torch.where(greedy, 0.0, 1.0).to(torch.float32))
    result = verify_rows(
        drafts, target_rows=rows, target_logits=target_logits,
        num_draft_tokens=counts, draft_probs=draft_probs,
        draft_rows=draft_rows if draft_probs is not None else None,
        temperature=temps, seed=seeds, bonus_token_ids=bonus,
        options=options, backend=backend, validate=False)
    tokens = result.token_ids
    return torch.from_numpy(tokens.astype(np.int32)) if host else tokens.to(torch.int32)


def _lean_step(drafts: torch.Tensor, cu: torch.Tensor, k: int, draft_probs: Any,
               target_logits: torch.Tensor, bonus: torch.Tensor, metadata: Any,
               num_draft_tokens: list[int], backend: str, options: VerifyOptions,
               unseeded: Any) -> torch.Tensor:
    """The step on a backend that builds the maps on its device (``traits.lean_calls``): the
    layout is described (inclusive offsets, no bonus rows) and the kernels write vLLM's int32
    rows; the only other device work is the seeds' draw."""
    b = len(num_draft_tokens)
    temps: Any = 1.0
    seeds: Any = None
    greedy_only = options.sampled_method is None
    if not greedy_only:
        skip = frozenset(i for i, m in enumerate(num_draft_tokens) if m == 0)
        seeds = seeds_from_generators(metadata.generators, b, target_logits.device,
                                      skip_rows=skip, check=False,
                                      fallback=unseeded(target_logits.device)
                                      if callable(unseeded) else unseeded)
        if not metadata.all_random:
            assert metadata.temperature is not None, "vLLM gives temperatures when mixed"
            temps = metadata.temperature[:b]
    call = VerifyCall(drafts, None, target_logits, "target_logits", None, draft_probs, None,
                      temps, seeds, None, None, bonus, options,
                      None if greedy_only else options.sampled_method, False, backend, False,
                      False, FlatLayout(cu, "cu_inclusive", b, k, bonus_rows=False,
                                        temperature_marks=True, tokens_dtype=torch.int32))
    return verify_call(call).token_ids


@functools.lru_cache(maxsize=256)
def _host_maps(counts: tuple[int, ...], k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """``(counts [B], rows [B, K+1], draft_rows [B, K], used [B, K] or None when every request
    has ``k`` drafts)`` of a vLLM v1 step on the
    host (``core/layout.py``, no bonus rows), per step shape: engines repeat a few shapes, and
    the maps depend on nothing else. Callers must not write to them."""
    sizes = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    flat = np.zeros(int(sizes.sum()), dtype=np.int64)
    _, rows, draft_rows = layout.ragged_maps(flat, sizes, starts, k, bonus_rows=False)
    used = None if (sizes == k).all() else np.arange(k)[None, :] < sizes[:, None]
    return sizes, rows, draft_rows, used


@functools.lru_cache(maxsize=8)
def _greedy(options: VerifyOptions) -> VerifyOptions:
    """``options`` for an all-greedy step (built once: a VerifyOptions checks its fields)."""
    return VerifyOptions("greedy", options.typical)


def make_rejection_sample(
    vllm_rejection_sample: RejectionSampleFn | None, backend: str = "auto",
    options: VerifyOptions = DEFAULT_OPTIONS,
) -> RejectionSampleFn:
    """A drop-in for ``vllm.v1.sample.rejection_sampler.rejection_sample``.

    Synthetic acceptance (a benchmarking mode that accepts drafts with fixed per-position
    rates, ignoring the target) is handed back to ``vllm_rejection_sample`` with a logged
    reason: it is not verification, and vLLM's own version is the definition.

    Unseeded requests draw their seeds from a generator of this function's own, seeded on the
    first call from ``torch.initial_seed()`` (vLLM seeds every worker with the engine's
    ``seed``) and advanced only here: the tensor-parallel ranks, which run the same steps,
    then agree on every unseeded draw whatever else consumes torch's global generator.
    """
    told = False
    unseeded: dict[torch.device, torch.Generator] = {}

    def rank_shared_generator(device: torch.device) -> torch.Generator:
        gen = unseeded.get(device)
        if gen is None:
            gen = unseeded[device] = torch.Generator(device=device)
            gen.manual_seed(torch.initial_seed())
        return gen

    def rejection_sample(*step: Any, synthetic_mode: bool = False, **named: Any
                         ) -> torch.Tensor:
        """vLLM's ``rejection_sample``: its arguments, passed on as given."""
        nonlocal told
        rejection_sample.calls += 1  # type: ignore[attr-defined]
        # vLLM passes its step positionally; draft_probs is its fifth argument.
        draft_probs = step[4] if len(step) > 4 else named.get("draft_probs")
        rejection_sample.calls_with_draft_probs += draft_probs is not None  # type: ignore
        start = time.perf_counter()
        if synthetic_mode:
            if vllm_rejection_sample is None:
                raise NotImplementedError("synthetic acceptance needs vLLM's rejection_sample")
            if not told:
                logger.info("portable_verify: synthetic acceptance mode is vLLM's benchmarking "
                            "rule, not verification; vLLM's own rejection_sample decides it")
                told = True
            out = vllm_rejection_sample(*step, synthetic_mode=True, **named)
        else:
            out = verify_spec_decode_step(*step, backend=backend, options=options,
                                          unseeded=rank_shared_generator, **named)
        # Host time per call (on accelerators: launch time), for serve-check's report.
        rejection_sample.seconds += time.perf_counter() - start  # type: ignore[attr-defined]
        return out

    # Markers for the plugin (install once), tests and serve-check (was it really used?).
    rejection_sample.calls_with_draft_probs = 0  # type: ignore[attr-defined]
    rejection_sample.method = options.method  # type: ignore[attr-defined]
    return _counted(rejection_sample, vllm_rejection_sample, portable_verify=True)


def timed(vllm_rejection_sample: RejectionSampleFn) -> RejectionSampleFn:
    """vLLM's own function with the same call and host-time counters as the replacement.

    Why: ``PORTABLE_VERIFY_VLLM=fix`` keeps vLLM's decision, and serve-check compares the time
    each decision takes inside a running engine, where the machine's load is shared alike.
    """

    def rejection_sample(*args: Any, **kwargs: Any) -> torch.Tensor:
        rejection_sample.calls += 1  # type: ignore[attr-defined]
        start = time.perf_counter()
        out = vllm_rejection_sample(*args, **kwargs)
        rejection_sample.seconds += time.perf_counter() - start  # type: ignore[attr-defined]
        return out

    return _counted(rejection_sample, vllm_rejection_sample, timed=True)


def _counted(fn: Any, vllm_rejection_sample: RejectionSampleFn, **markers: bool) -> Any:
    """``fn`` with zeroed call/time counters, the function it stands in for, and ``markers``."""
    fn.vllm_original = vllm_rejection_sample
    fn.calls = 0
    fn.seconds = 0.0
    for name, value in markers.items():
        setattr(fn, name, value)
    return fn
