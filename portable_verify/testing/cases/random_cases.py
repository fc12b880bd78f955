"""Seeded random verification cases: the one case builder of the tests, the kit and the GPU check.

A :class:`CaseSpec` is a small, hashable description (sizes, input form, flags, a seed);
:func:`build_case` turns it into keyword arguments for :func:`portable_verify.verify`. Every
number of a case is drawn from ``seed`` in the same order whatever the flags, so the forms of one
spec (``spec.in_form("probs+q")``, ``replace(spec, ragged=False)``...) share their drafts,
logits and uniforms: callers compare input forms on the same case. Checks draw specs from a
seeded numpy generator (:func:`random_specs`) so they need no test dependency; hypothesis
strategies in tests/ draw the same specs, so both explore one case space.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

UNIFORM_SCALE = 2.0**-24

TargetKind = Literal["logits", "probs"]
TemperatureKind = Literal["none", "scalar", "vector", "zero"]

INPUT_FORMS: tuple[str, ...] = ("logits", "probs", "logits+q", "probs+q")
"""The target given as logits or probabilities, each without or with draft probabilities."""


@dataclass(frozen=True)
class CaseSpec:
    """Sizes and flags of one random case; ``seed`` fixes every number inside it."""

    batch: int
    positions: int  # K
    vocab: int
    seed: int
    target: TargetKind = "logits"
    ties: bool = False  # integer-valued logits: many exact ties in argmax and probabilities
    draft_probs: bool = False
    temperature: TemperatureKind = "none"  # "vector": per-row, about 30% greedy (T = 0) rows
    ragged: bool = False  # num_draft_tokens drawn in [0, K]
    coarse_uniforms: bool = False  # uniforms on a 1/8 grid: hits exact decision boundaries
    uniforms: bool = True  # explicit ``uniforms``; False leaves the draws to ``seed``

    @property
    def label(self) -> str:
        flags = [self.target, self.temperature]
        optional = (("ties", self.ties), ("q", self.draft_probs), ("ragged", self.ragged),
                    ("coarse-u", self.coarse_uniforms), ("seeded", not self.uniforms))
        flags += [f for f, on in optional if on]
        return f"B{self.batch}K{self.positions}V{self.vocab}/{'+'.join(flags)}/s{self.seed}"

    def in_form(self, form: str) -> CaseSpec:
        """The same case in one of :data:`INPUT_FORMS` (same drafts, logits and uniforms)."""
        if form not in INPUT_FORMS:
            raise ValueError(f"form must be one of {INPUT_FORMS}, got {form!r}")
        target, _, q = form.partition("+")
        return replace(self, target=target, draft_probs=bool(q))  # type: ignore[arg-type]


def _softmax64(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def random_uniforms(gen: np.random.Generator, shape: tuple[int, ...], coarse: bool) -> np.ndarray:
    """float32 uniforms in (0, 1]: the 24-bit grid of core.rng, or a 1/8 grid (exact ties)."""
    if coarse:
        return (gen.integers(1, 9, shape) / 8).astype(np.float32)
    return ((gen.integers(0, 2**24, shape) + 1) * UNIFORM_SCALE).astype(np.float32)


@dataclass(frozen=True)
class _Numbers:
    """Every number of a case, drawn in one fixed order (host float64 / int64 / float32)."""

    logits: np.ndarray  # [B, K+1, V], some -inf, never a whole row
    draft_probs: np.ndarray  # [B, K, V], some zeros; about 20% of rows equal to softmax(logits)
    draft_token_ids: np.ndarray  # [B, K]
    num_draft_tokens: np.ndarray  # [B]
    temperature: np.ndarray  # float32 [B]: T in [0.25, 2), about 30% exactly 0
    uniforms: np.ndarray  # float32 [B, K+1]


def _draw(spec: CaseSpec) -> _Numbers:
    gen = np.random.default_rng(spec.seed)
    b, k, v = spec.batch, spec.positions, spec.vocab
    if spec.ties:
        logits = gen.integers(-3, 4, (b, k + 1, v)).astype(np.float64)
    else:
        logits = gen.normal(0.0, 2.0, (b, k + 1, v))
    if v > 1:  # some -inf logits (probability exactly 0), never a whole row
        holes = gen.random((b, k + 1, v)) < 0.15
        holes[..., int(gen.integers(v))] = False
        logits[holes] = -np.inf

    q = _softmax64(gen.normal(0.0, 2.0, (b, k, v)))
    if v > 1:  # q(x) = 0 for some tokens, so q = 0 < p happens
        zero = gen.random((b, k, v)) < 0.15
        zero[..., int(gen.integers(v))] = False
        q = np.where(zero, 0.0, q)
        q = q / q.sum(-1, keepdims=True)
    same = gen.random((b, k)) < 0.2  # q == p: the residual is empty on rejection
    q = np.where(same[..., None], _softmax64(logits[:, :k]), q)

    greedy_ids = np.argmax(logits[:, :k], axis=-1)
    sampled_ids = np.minimum((np.cumsum(q, -1) < gen.random((b, k, 1))).sum(-1), v - 1)
    # A token the target forbids (p(x) = 0) where the row has one, else any token: on q == p
    # rows its rejection leaves an empty residual.
    noise = gen.random((b, k, v)) + np.isneginf(logits[:, :k])
    forbidden_ids = np.argmax(noise, axis=-1)
    # Mostly the target's argmax (long accepted prefixes), else the draft's own sample, and
    # sometimes a token the target forbids.
    pick = gen.random((b, k))
    ids = np.where(pick < 0.6, greedy_ids, sampled_ids)
    ids = np.where(pick > 0.85, forbidden_ids, ids).astype(np.int64)

    counts = gen.integers(0, k + 1, b).astype(np.int64)
    temperature = gen.uniform(0.25, 2.0, b).astype(np.float32)
    temperature[gen.random(b) < 0.3] = 0.0
    uniforms = random_uniforms(gen, (b, k + 1), spec.coarse_uniforms)
    return _Numbers(logits, q, ids, counts, temperature, uniforms)


def build_case(
    spec: CaseSpec, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """Keyword arguments for ``verify``: torch tensors on ``device``, floats in ``dtype``.

    The target is ``spec.target``; ``draft_probs``, ``num_draft_tokens``, ``temperature`` and
    ``uniforms`` are present as the spec's flags say.
    """
    nums = _draw(spec)
    b = spec.batch

    def floats(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=dtype)

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(device)

    kwargs: dict[str, Any] = {"draft_token_ids": tensor(nums.draft_token_ids)}
    if spec.target == "logits":
        kwargs["target_logits"] = floats(nums.logits)
    else:
        kwargs["target_probs"] = floats(_softmax64(nums.logits))
    if spec.draft_probs:
        kwargs["draft_probs"] = floats(nums.draft_probs)
    if spec.ragged:
        kwargs["num_draft_tokens"] = tensor(nums.num_draft_tokens)
    if spec.temperature != "none":
        # Logits take any T >= 0; probabilities only 0 (greedy) or 1: the same rows are greedy.
        values = nums.temperature if spec.target == "logits" else (
            (nums.temperature > 0).astype(np.float32))
        if spec.temperature == "zero":
            kwargs["temperature"] = 0.0
        elif spec.temperature == "scalar":
            kwargs["temperature"] = float(values[0]) if b else 1.0
        else:
            kwargs["temperature"] = tensor(values)
    if spec.uniforms:
        kwargs["uniforms"] = tensor(nums.uniforms)
    return kwargs


def on_device(kwargs: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """The same call with every tensor on ``device`` (the backend's: ``dispatch.torch_device``);
    ``on_device(call, "cpu")`` is the host copy the numpy reference is handed."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def as_numpy(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The same call with every tensor as a numpy array (host copies where needed)."""
    return {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


EDGE_SPECS: tuple[CaseSpec, ...] = (
    CaseSpec(batch=0, positions=2, vocab=5, seed=1),
    CaseSpec(batch=3, positions=0, vocab=5, seed=2),
    CaseSpec(batch=3, positions=2, vocab=1, seed=3),
    CaseSpec(batch=3, positions=0, vocab=1, seed=4, target="probs"),
    # seed 9: a q == p row rejects a draft the target forbids, so its residual is empty
    CaseSpec(batch=4, positions=3, vocab=6, seed=9, ragged=True, draft_probs=True,
             target="probs", coarse_uniforms=True),
)
"""Cases every exact check includes whatever the random draw: B=0, K=0, V=1, ragged, and an
empty residual (tests/test_kit_exact.py checks the quick cases reach every edge)."""


def random_spec(
    gen: np.random.Generator, max_batch: int = 5, max_positions: int = 4, max_vocab: int = 12
) -> CaseSpec:
    """One random spec: random sizes (B, K from 0, V from 1) and every flag drawn."""
    target = "logits" if gen.random() < 0.6 else "probs"
    return CaseSpec(
        batch=int(gen.integers(0, max_batch + 1)),
        positions=int(gen.integers(0, max_positions + 1)),
        vocab=int(gen.integers(1, max_vocab + 1)),
        seed=int(gen.integers(2**31)),
        target=target,  # type: ignore[arg-type]
        ties=bool(gen.random() < 0.4),
        draft_probs=bool(gen.random() < 0.5),
        temperature=str(gen.choice(["none", "scalar", "vector", "vector"])),  # type: ignore[arg-type]
        ragged=bool(gen.random() < 0.5),
        coarse_uniforms=bool(gen.random() < 0.2),
    )


def random_specs(
    gen: np.random.Generator, count: int, max_batch: int = 5, max_positions: int = 4,
    max_vocab: int = 12,
) -> list[CaseSpec]:
    """``count`` random specs plus :data:`EDGE_SPECS`, reproducible from ``gen``."""
    return list(EDGE_SPECS) + [
        random_spec(gen, max_batch, max_positions, max_vocab) for _ in range(count)
    ]
