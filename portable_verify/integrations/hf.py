"""Speculative decoding over Hugging Face causal LMs, verified by :func:`portable_verify.verify`.

Why a loop of our own: transformers' assisted generation is batch-1 only and nobody tests it for
exactness. This loop runs any batch size, every verification method, per-request
temperatures and seeds, and keeps both KV caches in place.

One step, for every row at once:

1. the draft reads its pending tokens (1, or 2 after a fully accepted step) and proposes ``k``
   tokens one forward at a time (argmax for greedy rows, an inverse-CDF draw from its tempered
   softmax for sampled rows; those probabilities become ``draft_probs``);
2. the target scores the last emitted token plus the ``k`` drafts in one ``k+1``-token forward;
3. the verifier decides; the step's single host synchronisation reads its result;
4. both caches drop the slots every row rejected (``DynamicCache.crop(-n)``, in place).

Rows advance by different amounts. Instead of re-packing caches, a row's rejected slots stay
in the cache as *holes*: a 2-D attention mask hides them and per-row ``position_ids`` count only
real tokens, so every row sees exactly its own sequence (the same mechanism that serves
left-padded prompts). Only the suffix that every row rejected is cropped; batch 1 never has
holes and never passes a mask.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from portable_verify import verify
from portable_verify.core import arguments, methods, rng
from portable_verify.core.types import (
    DEFAULT_TYPICAL,
    TypicalParams,
    VerifyOptions,
    VerifyResult,
    options_alone,
)

LOOP_METHODS: tuple[str, ...] = methods.distinct(methods.CHAIN)
"""The chain methods of the method table (``auto`` is ``rejection``)."""
PROB_METHODS: frozenset[str] = frozenset(m for m in LOOP_METHODS
                                         if methods.TABLE[m].draft_probs == "uses")
"""Methods whose verifier reads the draft's distributions (``draft_probs``)."""
DRAFT_MODES: tuple[str, ...] = ("sampled", "argmax")
"""How sampled rows draft: draws from the draft's tempered softmax, whose rows then reach the
verifier as ``draft_probs``; or the draft's argmax, passed as point masses (no ``draft_probs``).
Both are exact; which pays more, and where block verification gains, is measured side by
side in docs/e2e.md ("Sampled against argmax drafts")."""
DRAFT_OFFSET = 1 << 40
"""Added to the step counter for the draft's own uniforms, so they never reuse the verifier's."""
PLAIN_HEAD_MODEL_TYPES: frozenset[str] = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Architectures whose logits are exactly ``lm_head(decoder(x))`` (no scaling or soft-capping)."""

Verifier = Callable[..., VerifyResult]


@dataclass
class LoopMetrics:
    """What one decoding run measured. Times are seconds on the loop's clock (the host's wall
    clock unless given); a speculative step splits into draft, target and verify time, the rest
    of ``decode_time_s`` is the loop's own bookkeeping.

    ``tokens_per_s`` counts new tokens over the decode steps (prefill excluded, for speculative
    and target-only runs alike). Acceptance counts only rows still generating at that step.
    """

    new_tokens: int = 0
    steps: int = 0
    row_steps: int = 0
    k: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    accepted_tokens: int = 0
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    verify_time_s: float = 0.0
    draft_time_s: float = 0.0
    target_time_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_time_s if self.decode_time_s > 0 else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens emitted per row and step: accepted drafts + the recovered/bonus token."""
        return 1.0 + self.accepted_tokens / self.row_steps if self.row_steps else float("nan")

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Fraction of row-steps whose accepted prefix reached draft position ``j``."""
        return [c / self.row_steps if self.row_steps else float("nan")
                for c in self.accepted_per_position]

    @property
    def verify_share(self) -> float:
        """Verification time as a share of decode-step time."""
        return self.verify_time_s / self.decode_time_s if self.decode_time_s > 0 else float("nan")

    @property
    def mean_step_time_s(self) -> float:
        return self.decode_time_s / self.steps if self.steps else float("nan")

    def merge(self, other: LoopMetrics) -> None:
        """Add ``other``'s counts and times to this one (same ``k``)."""
        if other.k != self.k:
            raise ValueError(f"cannot merge metrics of k={other.k} into k={self.k}")
        self.new_tokens += other.new_tokens
        self.steps += other.steps
        self.row_steps += other.row_steps
        self.accepted_tokens += other.accepted_tokens
        self.accepted_per_position = [
            a + b for a, b in zip(self.accepted_per_position or [0] * self.k,
                                  other.accepted_per_position or [0] * self.k, strict=True)
        ]
        self.prefill_time_s += other.prefill_time_s
        self.decode_time_s += other.decode_time_s
        self.verify_time_s += other.verify_time_s
        self.draft_time_s += other.draft_time_s
        self.target_time_s += other.target_time_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "k": self.k,
            "tokens_per_s": self.tokens_per_s,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_rate_per_position": self.acceptance_rate_per_position,
            "prefill_time_s": self.prefill_time_s,
            "decode_time_s": self.decode_time_s,
            "mean_step_time_s": self.mean_step_time_s,
            "verify_time_s": self.verify_time_s,
            "draft_time_s": self.draft_time_s,
            "target_time_s": self.target_time_s,
            "verify_share": self.verify_share,
        }


@dataclass
class GenerateResult:
    """``sequences``: int64 ``[B, P + N]``, the prompts as given then the new tokens, padded with
    ``pad_token_id`` after a row stops (the layout of ``generate()``); ``new_tokens``: each row's
    new tokens as a list; ``metrics``: :class:`LoopMetrics`."""

    sequences: torch.Tensor
    new_tokens: list[list[int]]
    metrics: LoopMetrics


@runtime_checkable
class StepModel(Protocol):
    """What the loop needs from a model: a cache, a prefill, and logits of a few new tokens.

    Why a protocol: the same loop (and so the same verification and bookkeeping) drives
    transformers modules, compiled OpenVINO models and draft-free proposers. ``mask`` is
    ``None`` or the 2-D ``[B, cached + S]`` mask of every cache slot plus the new tokens; the
    cache object must support ``crop(-n)`` (drop the last ``n`` slots).
    """

    def new_cache(self) -> Any: ...

    def prefill(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
                mask: torch.Tensor | None) -> None: ...

    def logits(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
               mask: torch.Tensor | None, last_only: bool = False) -> torch.Tensor: ...


def as_step_model(model: Any, fast_head: bool = False) -> StepModel:
    """``model`` itself when it speaks :class:`StepModel`, else a transformers module wrapped."""
    return model if isinstance(model, StepModel) else _Forward(model, fast_head)


class _Forward:
    """A causal LM split into decoder and LM head: logits only where needed, optional ``W @ h.T``.

    Why the split: the draft and the prefill need at most the last position's logits. Why the
    option: some torch/BLAS builds run ``h @ W.T`` with a few rows much slower than one row,
    and ``W @ h.T`` avoids it; others show the opposite (measurements in docs/e2e.md), so it
    is off by default. Used only for architectures whose logits are a plain, bias-free head.
    """

    def __init__(self, model: Any, fast_head: bool) -> None:
        self.model = model
        head = model.get_output_embeddings()
        plain = getattr(model.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
        self.decoder = model.get_decoder() if plain and head is not None else None
        self.head = head
        usable = fast_head and type(head) is torch.nn.Linear and head.bias is None
        self.weight = head.weight if self.decoder is not None and usable else None
        self._cache_kw = _cache_keyword(self.decoder if self.decoder is not None else model)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def _hidden(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        return self.decoder(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                            **{self._cache_kw: cache}).last_hidden_state

    def prefill(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
                mask: torch.Tensor | None) -> None:
        """Fill ``cache``; no logits are needed."""
        if self.decoder is not None:
            self._hidden(ids, cache, pos, mask)
        else:
            self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                       logits_to_keep=1, **{self._cache_kw: cache})

    def logits(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
               mask: torch.Tensor | None, last_only: bool = False) -> torch.Tensor:
        """``[B, S, V]`` logits (``[B, V]`` with ``last_only``)."""
        if self.decoder is None:
            out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask,
                             use_cache=True, logits_to_keep=1 if last_only else 0,
                             **{self._cache_kw: cache}).logits
            return out[:, -1] if last_only else out
        h = self._hidden(ids, cache, pos, mask)
        if last_only:
            h = h[:, -1:]
        b, s, d = h.shape
        if self.weight is not None:
            logits = (self.weight @ h.reshape(b * s, d).T).T.reshape(b, s, -1)
        else:
            logits = self.head(h)
        return logits[:, -1] if last_only else logits


def _cache_keyword(module: Any) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; use what ``forward`` takes."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def _check_prompt(input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [B, P] with B, P >= 1, got {tuple(input_ids.shape)}")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must have an integer dtype, got {input_ids.dtype}")
    if attention_mask is None:
        return input_ids.long(), torch.ones_like(input_ids, dtype=torch.int64)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must be a tensor shaped like input_ids "
                         f"{tuple(input_ids.shape)}")
    mask = attention_mask.to(device=input_ids.device, dtype=torch.int64)
    if not bool(mask[:, -1].all()):
        raise ValueError("attention_mask: prompts must be left-padded (last column all ones)")
    return input_ids.long(), mask


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def _row_temperatures(temperature: Any, method: str, b: int,
                      device: torch.device) -> torch.Tensor | None:
    """float32 ``[B]`` (0 = greedy row), or None for an all-greedy run."""
    if methods.greedy_only(method):
        return None
    if isinstance(temperature, (list, tuple)):
        temperature = torch.tensor(temperature, dtype=torch.float32, device=device)
    temps, _, _ = arguments.temperatures(temperature, b, device)
    if isinstance(temperature, torch.Tensor) and not bool(((temps >= 0) & ~temps.isnan()).all()):
        raise ValueError("temperature must be >= 0 and not NaN in every row")
    return temps


def _row_seeds(seed: int | Sequence[int] | torch.Tensor | None, b: int,
               device: torch.device) -> torch.Tensor:
    """int64 ``[B]`` per-request seeds (``None``: drawn from torch's global generator)."""
    if isinstance(seed, (list, tuple)):
        seed = torch.tensor(seed, dtype=torch.int64, device=device)
    return arguments.request_seeds(seed, b, device)


def _eos_ids(eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(int(e) for e in eos_token_id)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row: smallest ``t`` with ``cumsum[t] >= u * total`` (no host sync)."""
    c = torch.cumsum(probs, dim=-1)
    t = torch.searchsorted(c, (u * c[:, -1]).unsqueeze(1)).squeeze(1)
    return t.clamp_(max=probs.shape[-1] - 1)


def _propose(logits: torch.Tensor, temps: torch.Tensor | None,
             u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft token ``[B]`` and its distribution ``[B, V]`` (None for an all-greedy run)."""
    greedy = torch.argmax(logits, dim=-1)
    if temps is None or u is None:
        return greedy, None
    safe = torch.where(temps > 0, temps, torch.ones_like(temps)).unsqueeze(1)
    q = torch.softmax(logits.float() / safe, dim=-1)
    return torch.where(temps > 0, _draw(q, u), greedy), q


class _Rows:
    """Host-side bookkeeping of each row's output; stopping rules live here."""

    def __init__(self, b: int, max_new_tokens: int, eos: frozenset[int]) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(b)]
        self.done = [False] * b
        self.max_new_tokens = max_new_tokens
        self.eos = eos

    def add(self, i: int, emitted: list[int]) -> None:
        out = self.tokens[i]
        for tok in emitted:
            out.append(tok)
            if tok in self.eos or len(out) >= self.max_new_tokens:
                self.done[i] = True
                return

    def sequences(self, prompt: torch.Tensor, pad_token_id: int) -> torch.Tensor:
        width = max(len(t) for t in self.tokens)
        new = torch.full((len(self.tokens), width), pad_token_id, dtype=torch.int64)
        for i, toks in enumerate(self.tokens):
            new[i, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
        return torch.cat([prompt.cpu(), new], dim=1)


def _pad_id(pad_token_id: int | None, eos: frozenset[int]) -> int:
    if pad_token_id is not None:
        return int(pad_token_id)
    return min(eos) if eos else 0


def _loop_options(method: str, typical_eps: float, typical_alpha: float,
                  options: VerifyOptions | None) -> VerifyOptions:
    """The loop's one options value: ``options`` itself, or the keywords' (never both)."""
    if options is None:
        if method not in LOOP_METHODS:
            raise ValueError(f"method must be one of {LOOP_METHODS}, got {method!r}")
        return VerifyOptions(method, TypicalParams(typical_eps, typical_alpha))
    options = options_alone(options, method, typical_eps, typical_alpha, default_method="greedy")
    if options.method not in LOOP_METHODS:
        raise ValueError(f"options.method must be one of {LOOP_METHODS}, got "
                         f"{options.method!r}")
    return options


@torch.inference_mode()
def speculative_generate(
    target_model: Any,
    draft_model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    k: int,
    method: str = "greedy",
    temperature: float | Sequence[float] | torch.Tensor | None = None,
    seed: int | Sequence[int] | torch.Tensor | None = 0,
    attention_mask: torch.Tensor | None = None,
    verifier: Verifier | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    typical_eps: float = DEFAULT_TYPICAL.eps,
    typical_alpha: float = DEFAULT_TYPICAL.alpha,
    validate: bool = False,
    fast_head: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    options: VerifyOptions | None = None,
    draft_mode: str = "sampled",
) -> GenerateResult:
    """Generate up to ``max_new_tokens`` per row with ``k`` draft tokens per step.

    Args:
        target_model, draft_model: causal LMs with the same vocabulary (transformers 5.x
            modules, or any :class:`StepModel`).
        input_ids: int ``[B, P]`` prompts, left-padded when ragged (with ``attention_mask``).
        max_new_tokens: new tokens per row; a row also stops after emitting an EOS id.
        k: draft tokens per step (>= 1).
        method: ``"greedy"``, ``"rejection"`` (exact sampling), ``"block"`` (exact, the whole
            chain judged at once; the draft's distributions reach it as ``draft_probs``) or
            ``"typical"`` (Medusa, lossy).
        temperature: float or ``[B]``; rows at 0 decode greedily; ignored for ``"greedy"``.
        seed: int, ``[B]`` ints (per request) or None (torch's generator); step ``s`` passes
            ``seed_offset=s`` to the verifier, so every step draws fresh numbers.
        typical_eps, typical_alpha: typical acceptance's options (kept for compatibility).
        options: the method and its parameters as one :class:`VerifyOptions` value, instead
            of ``method`` / ``typical_eps`` / ``typical_alpha``.
        verifier: a callable with :func:`portable_verify.verify`'s signature (default); it
            receives the options as ``options=``.
        validate: forwarded to the verifier (False: trusted inputs, no extra host sync).
        fast_head: compute LM heads as ``W @ h.T`` where the architecture allows (see
            :class:`_Forward`; off by default).
        clock: what the metrics' times read (``time.process_time`` on a shared CPU: it leaves
            out the time spent waiting for a core, so one-thread runs stay comparable).
        draft_mode: ``"sampled"`` (sampled rows draw their drafts from the draft's tempered
            softmax and methods that use them get those rows as ``draft_probs``) or
            ``"argmax"`` (every row proposes the draft's argmax and no ``draft_probs`` is
            passed: the verifier takes each draft as a point mass, which is exact because an
            argmax draft is a deterministic function of the context). Greedy rows draft the
            argmax either way.

    Returns:
        :class:`GenerateResult`. With ``method="greedy"`` in float32, ``sequences`` equals
        ``target_model.generate(input_ids, do_sample=False, ...)`` token for token (up to
        argmax near-ties that differently shaped matmuls round apart; tested).
    """
    options = _loop_options(method, typical_eps, typical_alpha, options)
    method = options.method
    k = _check_int("k", k, 1)
    max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 1)
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}, got {draft_mode!r}")
    ids, mask = _check_prompt(input_ids, attention_mask)
    verifier = verify if verifier is None else verifier
    device = ids.device
    b, p = ids.shape
    temps = _row_temperatures(temperature, method, b, device)
    sampled_drafts = temps is not None and draft_mode == "sampled"  # else argmax proposals
    pass_probs = method in PROB_METHODS and draft_mode == "sampled"
    # A scalar stays a scalar for the verifier: it then knows on the host whether any row is
    # greedy and skips the unused argmax or sampling pass.
    verify_temp = temps if temps is None or not isinstance(temperature, (int, float)) \
        else float(temperature)
    seeds = _row_seeds(seed, b, device)
    eos = _eos_ids(eos_token_id)
    rows = _Rows(b, max_new_tokens, eos)
    target, draft = as_step_model(target_model, fast_head), as_step_model(draft_model, fast_head)
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    metrics = LoopMetrics(k=k, accepted_per_position=[0] * k)
    ones = torch.ones(b, 1, dtype=torch.int64, device=device)
    steps_k1 = torch.arange(k + 1, device=device)

    start = clock()
    positions = (mask.cumsum(1) - 1).clamp_(min=0)
    holes = bool((mask == 0).any())  # padding counts as holes; one sync before the loop
    t_mask = d_mask = mask[:, :-1]
    if p > 1:
        target.prefill(ids[:, :-1], t_cache, positions[:, :-1], t_mask if holes else None)
        draft.prefill(ids[:, :-1], d_cache, positions[:, :-1], d_mask if holes else None)
    pending, pend_mask, pend_pos = ids[:, -1:], ones, positions[:, -1:]
    last_pos = positions[:, -1]  # position of each row's last emitted token
    metrics.prefill_time_s = clock() - start

    step = 0
    while not all(rows.done):
        t0 = clock()
        active = [not d for d in rows.done]
        u_draft = None
        if sampled_drafts:
            offsets = torch.full((b,), step + DRAFT_OFFSET, dtype=torch.int64, device=device)
            u_draft = rng.uniforms_torch(seeds, offsets, k + 1)
        # 1. draft k tokens
        d_mask = torch.cat([d_mask, pend_mask], 1)
        logits = draft.logits(pending, d_cache, pend_pos, d_mask if holes else None, True)
        drafts, qs = [], []
        for j in range(k):
            x, q = _propose(logits, temps if sampled_drafts else None,
                            None if u_draft is None else u_draft[:, j])
            drafts.append(x)
            qs.append(q)
            if j < k - 1:
                d_mask = torch.cat([d_mask, ones], 1)
                logits = draft.logits(x.unsqueeze(1), d_cache, (last_pos + 1 + j).unsqueeze(1),
                                      d_mask if holes else None, True)
        draft_ids = torch.stack(drafts, 1)
        td = clock()
        metrics.draft_time_s += td - t0
        # 2. score the last emitted token + k drafts in one target forward
        t_in = torch.cat([pending[:, -1:], draft_ids], 1)
        t_full = torch.cat([t_mask, ones.expand(b, k + 1)], 1)
        t_logits = target.logits(t_in, t_cache, last_pos.unsqueeze(1) + steps_k1,
                                 t_full if holes else None)
        metrics.target_time_s += clock() - td
        if t_logits.shape[-1] != logits.shape[-1]:
            raise ValueError(f"target_model has vocabulary {t_logits.shape[-1]}, draft_model "
                             f"{logits.shape[-1]}: they must share one tokenizer")
        # 3. verify
        tv = clock()
        result = verifier(
            draft_ids,
            target_logits=t_logits,
            draft_probs=torch.stack(qs, 1) if pass_probs else None,
            options=options,
            temperature=verify_temp,
            seed=seeds,
            seed_offset=step,
            validate=validate,
        )
        metrics.verify_time_s += clock() - tv
        a = result.num_accepted
        host = torch.cat([result.token_ids, a.unsqueeze(1)], 1).tolist()  # the step's one sync
        a_host = [row[-1] for row in host]
        for i in range(b):  # host bookkeeping of B small lists; tensors stay batched
            if active[i]:
                rows.add(i, host[i][: a_host[i] + 1])
                metrics.row_steps += 1
                metrics.accepted_tokens += a_host[i]
                for j in range(a_host[i]):
                    metrics.accepted_per_position[j] += 1
        # 4. cut both caches back: keep what each row accepted, crop what every row rejected
        a_max = max(a_host)
        holes = holes or a_max != min(a_host)
        t_mask = torch.cat([t_mask, (steps_k1 <= a.unsqueeze(1)).long()], 1)
        if k - a_max > 0:
            t_cache.crop(-(k - a_max))
            t_mask = t_mask[:, : t_mask.shape[1] - (k - a_max)]
        if k > 1:
            kept = (steps_k1[: k - 1] < a.unsqueeze(1)).long()
            d_mask = torch.cat([d_mask[:, : d_mask.shape[1] - (k - 1)], kept], 1)
            d_drop = (k - 1) - min(a_max, k - 1)
            if d_drop > 0:
                d_cache.crop(-d_drop)
                d_mask = d_mask[:, : d_mask.shape[1] - d_drop]
        bonus = result.token_ids.gather(1, a.unsqueeze(1))
        last_pos = last_pos + a + 1
        if a_max == k:  # rows that accepted everything still owe the draft its last draft
            full = (a == k).unsqueeze(1)
            pending = torch.cat([torch.where(full, draft_ids[:, -1:], bonus), bonus], 1)
            pend_mask = torch.cat([full.long(), ones], 1)
            pend_pos = torch.stack([last_pos - 1, last_pos], 1)
        else:
            pending, pend_mask, pend_pos = bonus, ones, last_pos.unsqueeze(1)
        step += 1
        metrics.steps = step
        metrics.decode_time_s += clock() - t0

    metrics.new_tokens = sum(len(t) for t in rows.tokens)
    return GenerateResult(rows.sequences(ids, _pad_id(pad_token_id, eos)), rows.tokens, metrics)


@torch.inference_mode()
def target_only_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    attention_mask: torch.Tensor | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    fast_head: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> GenerateResult:
    """Greedy decoding with a KV cache, one token per forward: the baseline speculative decoding
    must beat, measured with the same forward code, the same one sync per step and ``clock``."""
    max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 1)
    ids, mask = _check_prompt(input_ids, attention_mask)
    b, p = ids.shape
    fwd = as_step_model(model, fast_head)
    cache = fwd.new_cache()
    eos = _eos_ids(eos_token_id)
    rows = _Rows(b, max_new_tokens, eos)
    metrics = LoopMetrics(k=0)
    ones = torch.ones(b, 1, dtype=torch.int64, device=ids.device)

    start = clock()
    positions = (mask.cumsum(1) - 1).clamp_(min=0)
    holes = bool((mask == 0).any())
    cur_mask = mask[:, :-1]
    if p > 1:
        fwd.prefill(ids[:, :-1], cache, positions[:, :-1], cur_mask if holes else None)
    token, pos = ids[:, -1:], positions[:, -1:]
    metrics.prefill_time_s = clock() - start
    while not all(rows.done):
        t0 = clock()
        active = [not d for d in rows.done]
        cur_mask = torch.cat([cur_mask, ones], 1)
        logits = fwd.logits(token, cache, pos, cur_mask if holes else None, True)
        token = torch.argmax(logits, dim=-1, keepdim=True)
        for i, tok in enumerate(token[:, 0].tolist()):  # the step's one sync
            if active[i]:
                rows.add(i, [tok])
        pos = pos + 1
        metrics.steps += 1
        metrics.row_steps += sum(active)
        metrics.decode_time_s += clock() - t0
    metrics.new_tokens = sum(len(t) for t in rows.tokens)
    return GenerateResult(rows.sequences(ids, _pad_id(pad_token_id, eos)), rows.tokens, metrics)
