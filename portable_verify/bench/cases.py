"""The benchmark grid: shapes, method/input variants, and input generation on a device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portable_verify.core import methods

Shape = tuple[int, int, int]  # (B, K, V)

FIXED_COST_SHAPE: Shape = (1, 2, 64)
"""A call whose input costs nothing to read: its time is the fixed per-call cost."""
FULL_SHAPES: tuple[Shape, ...] = (FIXED_COST_SHAPE, (1, 2, 32000), (8, 4, 32000), (32, 4, 32000),
                                  (64, 5, 128256))
QUICK_SHAPES: tuple[Shape, ...] = (FIXED_COST_SHAPE, (1, 2, 32000), (8, 4, 32000), (32, 4, 32000))
DEFAULT_SHAPES: tuple[Shape, ...] = QUICK_SHAPES
"""``bench`` without ``--full``: every shape but the largest (B=64 at V=128256, whose dense
baseline alone takes minutes on a small CPU), so a first run ends in a few minutes; the
repetitions tell the default run from ``--quick``."""
SAMPLING_TEMPERATURE = 0.7
DRAFT_CORRUPTION = 0.3  # share of drafts replaced by random ids, so rows reject at varied places
BLOCK_DRAFT_NOISE = 1.0
"""Block variants: the draft's logits are the target's plus N(0, this) noise, and drafts are
sampled from the draft (block verification's gain needs a real draft distribution)."""


@dataclass(frozen=True)
class Variant:
    """One way of calling the verifier: a method plus the kind of inputs it receives."""

    method: str  # greedy | rejection | typical | block
    inputs: str  # logits | probs (probs, and every block variant, come with draft_probs)

    @property
    def label(self) -> str:
        return f"{self.method}/{self.inputs}"

    @property
    def temperature(self) -> float | None:
        """Sampled methods on logits use a non-trivial temperature (the costly path)."""
        if methods.greedy_only(self.method):
            return 0.0
        return SAMPLING_TEMPERATURE if self.inputs == "logits" else None


VARIANTS: tuple[Variant, ...] = tuple(
    Variant(name, inputs)
    for name in methods.distinct(methods.CHAIN)  # auto is rejection
    for inputs in (("logits", "probs") if methods.TABLE[name].draft_probs == "uses"
                   else ("logits",)))
"""Every chain method of the method table, from logits, and from probabilities (with the
draft's own) where the method reads ``draft_probs``."""


@dataclass
class CaseInputs:
    """Tensors of one benchmark cell, already on the benchmark device."""

    drafts: torch.Tensor  # int64 [B, K]
    target: torch.Tensor  # [B, K+1, V] logits or probabilities
    draft_probs: torch.Tensor | None  # [B, K, V] or None
    seeds: torch.Tensor  # int64 [B]
    acceptance: list[float] | None = None  # block variants: mean min(1, p/q) per position

    def verify_kwargs(self, variant: Variant) -> dict:
        """Keyword arguments shared by ``verify`` and ``dense_verify`` for this variant."""
        key = "target_logits" if variant.inputs == "logits" else "target_probs"
        kw: dict = {key: self.target, "method": variant.method}
        if variant.inputs == "probs" or variant.method in OWN_INPUTS:
            kw["draft_probs"] = self.draft_probs
        if variant.inputs == "logits":
            kw["temperature"] = variant.temperature
        return kw


def make_inputs(shape: Shape, variant: Variant, dtype: torch.dtype, device: torch.device,
                seed: int = 0) -> CaseInputs:
    """Random but realistic-looking inputs: peaked logits, drafts that often match the target."""
    b, k, v = shape
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    own = OWN_INPUTS.get(variant.method)
    if own is not None:
        return own(logits, variant, dtype, device, g)
    drafts = logits[:, :k].argmax(-1)
    noise = torch.rand(b, k, generator=g) < DRAFT_CORRUPTION
    drafts = torch.where(noise, torch.randint(0, v, (b, k), generator=g), drafts)
    draft_probs = None
    if variant.inputs == "probs":
        target = torch.softmax(logits, -1)
        draft_logits = logits[:, :k] + torch.randn(b, k, v, generator=g)
        draft_probs = torch.softmax(draft_logits, -1).to(device=device, dtype=dtype)
        del draft_logits
    else:
        target = logits
    return CaseInputs(
        drafts=drafts.to(device),
        target=target.to(device=device, dtype=dtype),
        draft_probs=draft_probs,
        seeds=torch.arange(b, dtype=torch.int64).to(device),
    )


def _block_inputs(logits: torch.Tensor, variant: Variant, dtype: torch.dtype,
                  device: torch.device, g: torch.Generator) -> CaseInputs:
    """Drafts sampled from a draft distribution close to the target (tempered as the target
    is), and each position's token-wise acceptance ``E min(1, p(x)/q(x))`` for the output."""
    b, k1, v = logits.shape
    k = k1 - 1
    t = variant.temperature or 1.0
    p = torch.softmax(logits / t, -1)
    q = torch.softmax((logits[:, :k] + torch.randn(b, k, v, generator=g) * BLOCK_DRAFT_NOISE)
                      / t, -1)
    drafts = (torch.multinomial(q.reshape(b * k, v), 1, generator=g).reshape(b, k) if k
              else torch.zeros(b, 0, dtype=torch.int64))
    px = p[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2)
    qx = q.gather(2, drafts.unsqueeze(2)).squeeze(2)
    acceptance = torch.clamp(px / qx, max=1.0).mean(0).tolist()
    target = logits if variant.inputs == "logits" else p
    return CaseInputs(drafts=drafts.to(device), target=target.to(device=device, dtype=dtype),
                      draft_probs=q.to(device=device, dtype=dtype),
                      seeds=torch.arange(b, dtype=torch.int64).to(device),
                      acceptance=[round(a, 3) for a in acceptance])


def input_bytes(shape: Shape) -> int:
    """Bytes of one cell's float32 inputs at most: the target ``[B, K+1, V]`` and the draft's
    distributions ``[B, K, V]`` (what ``bench --shapes`` is bounded by)."""
    b, k, v = shape
    return 4 * b * (2 * k + 1) * v


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """``"1,2,32000;8,4,32000"`` -> ((1, 2, 32000), (8, 4, 32000))."""
    shapes = []
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        dims = part.split(",")
        if len(dims) != 3 or not all(d.isdigit() for d in dims):
            raise ValueError(f"--shapes: each shape is 'B,K,V' (integers), got {part!r}")
        b, k, v = (int(d) for d in dims)
        if b < 1 or v < 1:
            raise ValueError(f"--shapes: B and V must be >= 1, got {part!r}")
        shapes.append((b, k, v))
    if not shapes:
        raise ValueError("--shapes: no shape given")
    return tuple(shapes)


OWN_INPUTS = {"block": _block_inputs}
"""Methods timed on inputs of their own, with ``draft_probs`` (block: drafts drawn from a draft
distribution, so that its acceptance is a real one)."""
