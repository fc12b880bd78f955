"""Seeded random verification cases shared by the exact checks, the soak and the property tests.

A :class:`CaseSpec` is a small, hashable description (sizes, flags, a seed); :func:`build_case`
turns it into keyword arguments for :func:`portable_verify.verify`. Checks draw specs from a
seeded numpy generator (:func:`random_specs`) so they need no test dependency; hypothesis
strategies in tests/ draw the same specs, so both explore one case space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

UNIFORM_SCALE = 2.0**-24

TargetKind = Literal["logits", "probs"]
TemperatureKind = Literal["none", "scalar", "vector", "zero"]


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
    temperature: TemperatureKind = "none"
    ragged: bool = False
    coarse_uniforms: bool = False  # uniforms on a 1/8 grid: hits exact decision boundaries

    @property
    def label(self) -> str:
        flags = [self.target, self.temperature]
        optional = (("ties", self.ties), ("q", self.draft_probs), ("ragged", self.ragged),
                    ("coarse-u", self.coarse_uniforms))
        flags += [f for f, on in optional if on]
        return f"B{self.batch}K{self.positions}V{self.vocab}/{'+'.join(flags)}/s{self.seed}"


def _softmax64(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def random_uniforms(gen: np.random.Generator, shape: tuple[int, ...], coarse: bool) -> np.ndarray:
    """float32 uniforms in (0, 1]: the 24-bit grid of core.rng, or a 1/8 grid (exact ties)."""
    if coarse:
        return (gen.integers(1, 9, shape) / 8).astype(np.float32)
    return ((gen.integers(0, 2**24, shape) + 1) * UNIFORM_SCALE).astype(np.float32)


def build_case(spec: CaseSpec) -> dict[str, Any]:
    """Keyword arguments for ``verify`` (torch CPU tensors), including explicit ``uniforms``."""
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
    target = logits if spec.target == "logits" else _softmax64(logits)
    kwargs: dict[str, Any] = {}
    if spec.target == "logits":
        kwargs["target_logits"] = torch.from_numpy(target.astype(np.float32))
    else:
        kwargs["target_probs"] = torch.from_numpy(target.astype(np.float32))

    q = None
    if spec.draft_probs:
        q = _softmax64(gen.normal(0.0, 2.0, (b, k, v)))
        if v > 1:  # q(x) = 0 for some tokens, so q = 0 < p happens
            zero = gen.random((b, k, v)) < 0.15
            zero[..., int(gen.integers(v))] = False
            q = np.where(zero, 0.0, q)
            q = q / q.sum(-1, keepdims=True)
        same = gen.random((b, k)) < 0.2  # q == p: the residual is empty on rejection
        q = np.where(same[..., None], _softmax64(logits[:, :k]), q)
        kwargs["draft_probs"] = torch.from_numpy(q.astype(np.float32))

    greedy_ids = np.argmax(logits[:, :k], axis=-1) if k else np.zeros((b, 0), np.int64)
    random_ids = gen.integers(0, v, (b, k))
    if q is not None and k:  # a draft that really samples from q
        c = np.cumsum(q, -1)
        random_ids = np.minimum((c < gen.random((b, k, 1))).sum(-1), v - 1)
    # Mostly the target's argmax (long accepted prefixes), else the draft's own sample, and
    # sometimes any token at all (p(x) = 0 = q(x) rejections, empty residuals).
    pick = gen.random((b, k))
    ids = np.where(pick < 0.6, greedy_ids, random_ids)
    ids = np.where(pick > 0.9, gen.integers(0, v, (b, k)), ids)
    kwargs["draft_token_ids"] = torch.from_numpy(ids)

    if spec.ragged:
        kwargs["num_draft_tokens"] = torch.from_numpy(gen.integers(0, k + 1, b))
    kwargs.update(_temperature(spec, gen, b))
    kwargs["uniforms"] = torch.from_numpy(random_uniforms(gen, (b, k + 1), spec.coarse_uniforms))
    return kwargs


def _temperature(spec: CaseSpec, gen: np.random.Generator, b: int) -> dict[str, Any]:
    """Temperatures allowed for the target kind: any ``T >= 0`` for logits, 0/1 for probs."""
    if spec.temperature == "none":
        return {}
    if spec.temperature == "zero":
        return {"temperature": 0.0}
    if spec.target == "probs":
        values = (gen.random(b) < 0.5).astype(np.float32)  # 0 (greedy) or 1
    else:
        values = gen.uniform(0.25, 2.0, b).astype(np.float32)
        values[gen.random(b) < 0.3] = 0.0
    if spec.temperature == "scalar":
        return {"temperature": float(values[0]) if b else 1.0}
    return {"temperature": torch.from_numpy(values)}


EDGE_SPECS: tuple[CaseSpec, ...] = (
    CaseSpec(batch=0, positions=2, vocab=5, seed=1),
    CaseSpec(batch=3, positions=0, vocab=5, seed=2),
    CaseSpec(batch=3, positions=2, vocab=1, seed=3),
    CaseSpec(batch=3, positions=0, vocab=1, seed=4, target="probs"),
    CaseSpec(batch=4, positions=3, vocab=6, seed=5, ragged=True, draft_probs=True,
             target="probs", coarse_uniforms=True),
)
"""Cases every exact check includes whatever the random draw: B=0, K=0, V=1, ragged."""


def random_specs(
    gen: np.random.Generator, count: int, max_batch: int = 5, max_positions: int = 4,
    max_vocab: int = 12,
) -> list[CaseSpec]:
    """``count`` random specs plus :data:`EDGE_SPECS`, reproducible from ``gen``."""
    specs = list(EDGE_SPECS)
    for _ in range(count):
        target = "logits" if gen.random() < 0.6 else "probs"
        specs.append(
            CaseSpec(
                batch=int(gen.integers(0, max_batch + 1)),
                positions=int(gen.integers(0, max_positions + 1)),
                vocab=int(gen.integers(1, max_vocab + 1)),
                seed=int(gen.integers(2**31)),
                target=target,
                ties=bool(gen.random() < 0.4),
                draft_probs=bool(gen.random() < 0.5),
                temperature=str(gen.choice(["none", "scalar", "vector", "vector"])),  # type: ignore[arg-type]
                ragged=bool(gen.random() < 0.5),
                coarse_uniforms=bool(gen.random() < 0.2),
            )
        )
    return specs
