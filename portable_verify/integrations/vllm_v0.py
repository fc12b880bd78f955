"""Drop-in replacements for vLLM's v0 speculative-decoding samplers, backed by portable_verify.

Why: vLLM's v0 ``RejectionSampler`` and ``TypicalAcceptanceSampler`` (removed from vLLM in 2025)
are still what many forks and research harnesses call. These classes take the same arguments
and return the same ``[B, K+1]`` int64 output (-1 padded), so they can replace the originals
without touching the caller, while verification runs on portable_verify's auto-selected
backend for the inputs' device. vLLM itself is not needed (nor imported).

Contract kept from vLLM: the *passed* ``bonus_token_ids`` is emitted when all ``K`` drafts are
accepted (vLLM samples it outside the sampler); the bonus row of ``target_with_bonus_probs``
therefore never decides anything. Deliberate differences (each one documented in
docs/integrations.md):

* empty residual at a rejection -> the recovered token is drawn from ``p`` (vLLM: uniform-ish
  over the vocabulary, through a ``tiny`` clamp); ``q(x) = 0 < p(x)`` -> accepted;
  ``p(x) = 0`` -> never accepted;
* ``strict_mode=True`` raises ``ValueError``/``TypeError`` naming the argument (vLLM: bare
  ``assert``) and also rejects NaN/inf/negative probabilities; ``strict_mode=False`` checks
  nothing and always returns ids in ``[0, V)``, even for NaN rows;
* counters are causal: ``num_accepted_tokens`` counts accepted *prefixes* only (vLLM v0
  counted a draft that passed its test after an earlier rejection);
* typical acceptance uses the exact entropy (``0 log 0 = 0``); vLLM used ``log(p + 1e-5)``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from portable_verify import verify
from portable_verify.core import methods
from portable_verify.core.metrics import MetricsAccumulator
from portable_verify.core.types import (
    DEFAULT_TYPICAL,
    PLACEHOLDER_TOKEN_ID,
    TypicalParams,
    VerifyOptions,
    VerifyResult,
)
from portable_verify.integrations.generator_seeds import seeds_from_generators

# vLLM v0's spec-decode worker passes ``seeded_seqs`` only to subclasses of this class of its own.
_V0_STOCHASTIC_BASE = ("vllm.model_executor.layers.spec_decode_base_sampler",
                       "SpecDecodeStochasticBaseSampler")


class _SpecDecodeSampler(torch.nn.Module):
    """Shared checks, bonus handling and counters of the two vLLM-compatible samplers."""

    _options: VerifyOptions  # the method and its parameters, set by each sampler once

    def __init__(self, strict_mode: bool = False, backend: str = "auto") -> None:
        super().__init__()
        self._strict_mode = bool(strict_mode)
        self.backend = backend
        self._num_bonus_tokens = 1
        # vLLM's counter attributes (read by its metrics collector); causal, see module doc.
        self.num_accepted_tokens: torch.Tensor | None = None
        self.num_emitted_tokens: torch.Tensor | None = None
        self.num_draft_tokens: int = 0
        self.metrics = MetricsAccumulator()

    @property
    def probs_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def token_id_dtype(self) -> torch.dtype:
        return torch.int64

    def init_gpu_tensors(self, device: int | str) -> None:
        """Create the counters on ``device`` (vLLM's name; an int means the current accelerator)."""
        if isinstance(device, int):
            device = f"{_accelerator_type()}:{device}"
        elif not isinstance(device, str):
            raise TypeError(f"device must be an int or str, got {type(device).__name__}")
        self._init_counters(torch.device(device))

    def init_tensors(self, device: int | str, device_type: torch.device | str = "cuda") -> None:
        """Create the counters on ``device`` of ``device_type`` (vLLM's later name)."""
        if isinstance(device_type, torch.device):
            device_type = device_type.type
        if isinstance(device, int):
            device = f"{device_type}:{device}"
        self._init_counters(torch.device(device))

    def _init_counters(self, device: torch.device) -> None:
        self.num_accepted_tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.num_emitted_tokens = torch.zeros((), dtype=torch.int64, device=device)

    def _check(
        self,
        target_with_bonus_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
    ) -> None:
        """vLLM's strict-mode checks (shapes, dtypes, devices, id ranges) as named errors."""
        named = {
            "target_with_bonus_probs": target_with_bonus_probs,
            "bonus_token_ids": bonus_token_ids,
            "draft_probs": draft_probs,
            "draft_token_ids": draft_token_ids,
        }
        for name, t in named.items():
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        ranks = {"target_with_bonus_probs": 3, "bonus_token_ids": 2, "draft_probs": 3,
                 "draft_token_ids": 2}
        for name, rank in ranks.items():
            t = named[name]
            if t is not None and t.dim() != rank:
                raise ValueError(f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
        b, k1, v = target_with_bonus_probs.shape
        expected = {
            "draft_token_ids": (b, k1 - 1),
            "bonus_token_ids": (b, self._num_bonus_tokens),
            "draft_probs": (b, k1 - 1, v),
        }
        for name, shape in expected.items():
            t = named[name]
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(
                    f"{name} must have shape {shape} to match target_with_bonus_probs "
                    f"{tuple(target_with_bonus_probs.shape)} = [B, K+1, V], got {tuple(t.shape)}"
                )
        for name in ("target_with_bonus_probs", "draft_probs"):
            t = named[name]
            if t is not None and t.dtype != self.probs_dtype:
                raise TypeError(f"{name} must be {self.probs_dtype}, got {t.dtype}")
        for name in ("draft_token_ids", "bonus_token_ids"):
            if named[name].dtype != self.token_id_dtype:
                raise TypeError(f"{name} must be {self.token_id_dtype}, got {named[name].dtype}")
        devices = {name: t.device for name, t in named.items() if t is not None}
        if len(set(devices.values())) > 1:
            listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
            raise ValueError(f"all inputs must be on one device; got {listing}")
        if bonus_token_ids.numel() > 0:  # draft ids are checked by verify(validate=True)
            lo, hi = torch.aminmax(bonus_token_ids)
            lo_hi = torch.stack([lo, hi]).tolist()
            if lo_hi[0] < 0 or lo_hi[1] >= v:
                raise ValueError(f"bonus_token_ids must lie in [0, {v}), got range {lo_hi}")

    def _decide(
        self,
        target_with_bonus_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        randomness: Callable[[int, int, torch.device], dict[str, Any]],
    ) -> torch.Tensor:
        """Both samplers' step: vLLM's checks, one ``verify`` call with this sampler's options
        and ``randomness(B, K, device)``'s arguments, then the caller's bonus tokens."""
        if self._strict_mode:
            self._check(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
        b, k = draft_token_ids.shape
        device = target_with_bonus_probs.device
        if b == 0:
            return torch.empty((0, k + 1), dtype=self.token_id_dtype, device=device)
        result = verify(
            draft_token_ids,
            target_probs=target_with_bonus_probs,
            draft_probs=(draft_probs if methods.reads_draft_probs(self._options.sampled_method)
                         else None),
            options=self._options,
            backend=self.backend,
            validate="full" if self._strict_mode else False,
            **randomness(b, k, device),
        )
        return self._finish(result, bonus_token_ids)

    def _finish(self, result: VerifyResult, bonus_token_ids: torch.Tensor) -> torch.Tensor:
        """Put the caller's bonus token where every draft was accepted; update the counters."""
        tokens = result.token_ids
        b, k1 = tokens.shape
        k = k1 - 1
        all_accepted = result.num_accepted == k
        tokens[:, k] = torch.where(
            all_accepted, bonus_token_ids.reshape(b).to(tokens.dtype), PLACEHOLDER_TOKEN_ID
        )
        if self.num_accepted_tokens is None or self.num_emitted_tokens is None:
            self._init_counters(tokens.device)
        counter_device = self.num_accepted_tokens.device
        self.num_accepted_tokens += result.num_accepted.sum().to(counter_device)
        self.num_emitted_tokens += result.num_emitted.sum().to(counter_device)
        self.num_draft_tokens += b * k
        self.metrics.update(result)
        return tokens


class RejectionSampler(_SpecDecodeSampler):
    """Exact rejection sampling (Leviathan et al. 2023; Chen et al. 2023) with vLLM v0's API.

    Args:
        strict_mode: check every input (shapes, dtypes, devices, ids, and NaN/inf/negative
            probabilities) and raise ``ValueError``/``TypeError`` naming it; costs two host
            syncs. False: no checks, no syncs.
        use_flashinfer: accepted for vLLM compatibility and ignored: ``backend`` decides.
        backend: a portable_verify backend name, or ``"auto"`` (chosen by the inputs' device).

    >>> import torch
    >>> from portable_verify.integrations.vllm_v0 import RejectionSampler
    >>> p = torch.tensor([[[0., 1., 0.], [0., 0., 1.]]])  # target (one-hot = greedy)
    >>> q = torch.tensor([[[0., 1., 0.]]])  # draft distribution
    >>> RejectionSampler()(p, torch.tensor([[0]]), q, torch.tensor([[1]]))
    tensor([[1, 0]])
    """

    def __init__(
        self, strict_mode: bool = False, use_flashinfer: bool | None = None, backend: str = "auto"
    ) -> None:
        super().__init__(strict_mode=strict_mode, backend=backend)
        self._options = VerifyOptions("rejection")
        self.use_flashinfer = False  # vLLM's attribute; portable_verify's backend decides
        _warn_if_seeds_will_be_dropped(self)

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        seeded_seqs: dict[int, torch.Generator] | None = None,
    ) -> torch.Tensor:
        """Accepted drafts then one recovered or bonus token per row: int64 ``[B, K+1]``.

        Args:
            target_with_bonus_probs: float32 ``[B, K+1, V]`` target probabilities; row ``K``
                (the bonus position) is not used, as in vLLM.
            bonus_token_ids: int64 ``[B, 1]``, emitted at column ``K`` when all drafts pass.
            draft_probs: float32 ``[B, K, V]``, the distributions the drafts were sampled from.
            draft_token_ids: int64 ``[B, K]``.
            seeded_seqs: ``{row: torch.Generator}`` for seeded requests (vLLM v0's worker
                sends them only to its own stochastic sampler subclasses: inside v0 this class
                never receives them and warns at construction). Each listed row draws
                one int64 seed from its generator (one tiny draw per seeded row, on the
                generator's device; no host sync), so equal generator states give equal
                outputs whatever the other rows are; other rows use fresh seeds from torch's
                global generator.
        """
        return self._decide(
            target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids,
            lambda b, _k, device: {"seed": seeds_from_generators(seeded_seqs, b, device)})


class TypicalAcceptanceSampler(_SpecDecodeSampler):
    """Medusa's typical acceptance (Cai et al. 2024; lossy) with vLLM v0's API.

    A draft ``x`` passes iff ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))``;
    the first failing position emits ``argmax p`` (lowest index on ties). Deterministic: no
    random numbers are used, as in vLLM.

    >>> import torch
    >>> from portable_verify.integrations.vllm_v0 import TypicalAcceptanceSampler
    >>> p = torch.tensor([[[0.1, 0.9, 0.0], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]]])
    >>> TypicalAcceptanceSampler()(p, torch.tensor([[2]]), None, torch.tensor([[1, 0]]))
    tensor([[1, 0, 2]])
    """

    def __init__(
        self,
        posterior_threshold: float = DEFAULT_TYPICAL.eps,
        posterior_alpha: float = DEFAULT_TYPICAL.alpha,
        strict_mode: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__(strict_mode=strict_mode, backend=backend)
        self._posterior_threshold = float(posterior_threshold)  # vLLM's attributes
        self._posterior_alpha = float(posterior_alpha)
        self._options = VerifyOptions(
            "typical", TypicalParams(self._posterior_threshold, self._posterior_alpha))

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        """int64 ``[B, K+1]`` as :meth:`RejectionSampler.forward`; ``draft_probs`` is unused."""
        # The only uniform typical acceptance reads is the bonus draw, which the caller's bonus
        # token replaces: fixed numbers keep the sampler deterministic.
        return self._decide(
            target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids,
            lambda b, k, device: {"uniforms": torch.ones((b, k + 1), dtype=torch.float32,
                                                         device=device)})


def _warn_if_seeds_will_be_dropped(sampler: torch.nn.Module) -> None:
    """Warn inside a vLLM v0 process, whose worker never hands this class ``seeded_seqs``.

    The check reads ``sys.modules`` only (a v0 worker has imported its sampler base already),
    so it costs nothing and never imports vLLM.
    """
    module = sys.modules.get(_V0_STOCHASTIC_BASE[0])
    base = getattr(module, _V0_STOCHASTIC_BASE[1], None)
    if isinstance(base, type) and not isinstance(sampler, base):
        warnings.warn(
            "vLLM v0's spec-decode worker passes seeded_seqs only to subclasses of "
            f"{'.'.join(_V0_STOCHASTIC_BASE)}; it will call this sampler without them, so "
            "seeded requests get fresh seeds and are not reproducible "
            "(docs/integrations.md, 'Seeded rows')",
            RuntimeWarning,
            stacklevel=3,
        )


def _accelerator_type() -> str:
    """Device type of the current accelerator (``"cuda"``, ``"xpu"``, ...), else ``"cpu"``."""
    accel = getattr(torch, "accelerator", None)
    if accel is not None and accel.is_available():
        current = accel.current_accelerator()
        if current is not None:
            return current.type
    return "cpu"
