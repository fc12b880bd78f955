"""The forms one verification call can take: the case drawn, then how a caller sends it.

Used by the fuzzing checks (:mod:`portable_verify.testing.checks.fuzz`) and the long run. A
:class:`FuzzCase` is a random case (:mod:`.random_cases`) plus its form: padded or ragged
(:func:`to_ragged`), torch or numpy, float and id dtypes, memory layout, ``requires_grad``,
extreme values, one broken input (validation must refuse it) or one kind of garbage (for
``validate=False``). :func:`reference_call` gives the values, :func:`caller_form` the layout,
so the reference always runs on the plain padded torch call with the same values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from portable_verify.testing.cases.random_cases import CaseSpec, build_case, on_device

FLOATS = ("float32", "float16", "bfloat16")
IDS = ("int64", "int32", "int16", "uint8")
STRIDES = ("contiguous", "strided", "transposed", "expanded", "negative")
EXTREMES = ("none", "huge_logits", "tiny_T", "subnormal_T", "huge_T")
BROKEN = ("none", "nan_logit", "id_out_of_range", "float_ids", "count_above_k",
          "negative_temperature", "typical_eps_negative", "seed_too_big")
GARBAGE = ("ids_anywhere", "counts_out_of_range", "counts_wrong_length", "nan_inf_target",
           "negative_probs", "uniforms_outside", "temperature_garbage", "ragged_max_k_low",
           "ragged_rows_missing", "typical_options")


@dataclass(frozen=True)
class FuzzCase:
    """One drawn call: a random case plus the form it is sent in (printed on failure)."""

    spec: CaseSpec
    method: str
    ragged: bool = False
    numpy: bool = False
    float_dtype: str = "float32"
    id_dtype: str = "int64"
    stride: str = "contiguous"
    requires_grad: bool = False
    extreme: str = "none"
    broken: str = "none"
    garbage: str = "none"
    salt: int = 0


def reference_call(case: FuzzCase) -> dict[str, Any]:
    """The padded torch call with the case's *values* (dtype rounding, extremes, breakage)."""
    spec = case.spec
    if case.extreme in ("tiny_T", "subnormal_T", "huge_T") and spec.target == "probs":
        spec = replace(spec, target="logits")
    kwargs = build_case(spec)
    target_name = "target_logits" if "target_logits" in kwargs else "target_probs"
    dtype = getattr(torch, case.float_dtype)
    if case.extreme == "huge_logits" and target_name == "target_logits":
        # Near the top of the dtype's range (float16 ends at 65504).
        kwargs[target_name] = kwargs[target_name] * (1e36 if dtype != torch.float16 else 1e3)
    # Rounded probability rows still sum to 1 within the half-precision tolerance.
    for key in (target_name, "draft_probs"):
        if key in kwargs:
            kwargs[key] = kwargs[key].to(dtype)
            if case.numpy and dtype == torch.bfloat16:  # numpy has none: the rounded float32
                kwargs[key] = kwargs[key].float()
    if case.stride == "expanded" and kwargs["draft_token_ids"].shape[0] > 0:
        # Stride 0 along B: every request shares request 0's rows (the values change for
        # the reference too).
        for key in (target_name, "draft_probs", "draft_token_ids", "uniforms"):
            if isinstance(kwargs.get(key), torch.Tensor):
                kwargs[key] = kwargs[key][:1].expand_as(kwargs[key])
    extreme_t = {"tiny_T": 1e-30, "subnormal_T": 1e-40, "huge_T": 1e30}.get(case.extreme)
    if extreme_t is not None:
        kwargs["temperature"] = extreme_t
    _break(case, kwargs, target_name)
    return kwargs


def _break(case: FuzzCase, kwargs: dict[str, Any], target_name: str) -> None:
    """Apply ``case.broken`` (an input validation must refuse, or that ends up unread)."""
    b, k = kwargs["draft_token_ids"].shape
    gen = np.random.default_rng(case.salt)
    if case.broken == "nan_logit" and b > 0 and target_name == "target_logits":
        t = kwargs[target_name].clone()
        t[int(gen.integers(b)), int(gen.integers(k + 1)), 0] = float("nan")
        kwargs[target_name] = t
    elif case.broken == "id_out_of_range" and b > 0 and k > 0:
        d = kwargs["draft_token_ids"].clone()
        d[int(gen.integers(b)), int(gen.integers(k))] = case.spec.vocab + int(gen.integers(3))
        kwargs["draft_token_ids"] = d
    elif case.broken == "float_ids":
        kwargs["draft_token_ids"] = kwargs["draft_token_ids"].float()
    elif case.broken == "count_above_k" and b > 0:
        kwargs["num_draft_tokens"] = torch.full((b,), k + 1, dtype=torch.int64)
    elif case.broken == "negative_temperature" and b > 0:
        kwargs["temperature"] = -0.5
    elif case.broken == "typical_eps_negative":
        kwargs["typical_eps"] = -0.01
    elif case.broken == "seed_too_big":
        kwargs.pop("uniforms", None)
        kwargs["seed"] = 2**64 + int(gen.integers(100))


def garbage_call(case: FuzzCase, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Apply ``case.garbage``: inputs validate=False lets through (values, not Python types)."""
    gen = np.random.default_rng(case.salt)
    target_name = "target_logits" if "target_logits" in kwargs else "target_probs"
    b, k = kwargs["draft_token_ids"].shape
    v = kwargs[target_name].shape[-1]
    out = dict(kwargs)
    g = case.garbage
    if g == "ids_anywhere":
        out["draft_token_ids"] = torch.from_numpy(gen.integers(-2 * v - 3, 2 * v + 3, (b, k)))
    elif g == "counts_out_of_range":
        out["num_draft_tokens"] = torch.from_numpy(gen.integers(-3, k + 4, b))
    elif g == "counts_wrong_length":
        out["num_draft_tokens"] = torch.from_numpy(gen.integers(0, k + 1, 1))
    elif g == "nan_inf_target":
        t = out[target_name].float().clone()
        mask = torch.from_numpy(gen.random(tuple(t.shape)) < 0.3)
        t[mask] = float(gen.choice([np.nan, np.inf, -np.inf]))
        out[target_name] = t
    elif g == "negative_probs" and target_name == "target_probs":
        out[target_name] = out[target_name] - 0.5
    elif g == "uniforms_outside":
        out["uniforms"] = torch.from_numpy(
            gen.choice([0.0, -1.0, 2.0, np.nan, np.inf], (b, k + 1)).astype(np.float32))
    elif g == "temperature_garbage":
        out["temperature"] = torch.from_numpy(
            gen.choice([np.nan, -1.0, np.inf, 0.0, 1e-45], b).astype(np.float32))
    elif g == "typical_options":
        out["typical_eps"] = float(gen.choice([np.nan, -1.0, np.inf]))
        out["typical_alpha"] = float(gen.choice([np.nan, -1.0, 0.0]))
    return out


def to_ragged(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The same call in the flattened layout (``max_num_draft_tokens = K`` keeps the uniforms'
    ``[B, K+1]`` layout, so the result equals the padded call's)."""
    drafts = kwargs["draft_token_ids"]
    b, k = drafts.shape
    target_name = "target_logits" if "target_logits" in kwargs else "target_probs"
    target = kwargs[target_name]
    counts = kwargs.get("num_draft_tokens")
    given = [k] * b if counts is None else counts.tolist()
    # Slices are clamped; the counts themselves are passed as given (a broken count stays
    # broken, and validation must name it).
    n = [min(max(int(given[i]), 0), k) if i < len(given) else k for i in range(b)]
    out = {key: val for key, val in kwargs.items()
           if key not in ("draft_token_ids", target_name, "draft_probs", "num_draft_tokens")}
    out["draft_token_ids"] = torch.cat(
        [drafts[i, : n[i]] for i in range(b)] + [drafts.new_zeros(0)])
    out[target_name] = torch.cat(
        [target[i, : n[i] + 1] for i in range(b)] + [target.new_zeros(0, target.shape[-1])])
    if kwargs.get("draft_probs") is not None:
        q = kwargs["draft_probs"]
        out["draft_probs"] = torch.cat(
            [q[i, : n[i]] for i in range(b)] + [q.new_zeros(0, q.shape[-1])])
    out["num_draft_tokens"] = (torch.tensor(n, dtype=torch.int64, device=drafts.device)
                               if counts is None else counts)
    out["max_num_draft_tokens"] = k
    return out


def _restride(x: torch.Tensor, how: str) -> torch.Tensor:
    """The same values behind another memory layout (a view where the layout allows)."""
    if x.dim() == 0 or x.numel() == 0:
        return x
    if how == "strided":
        return torch.stack([x, torch.zeros_like(x)], dim=-1)[..., 0]
    if how == "transposed" and x.dim() >= 2:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x  # "expanded" is made in reference_call (it changes values)


def caller_form(case: FuzzCase, kwargs: dict[str, Any],
                device: torch.device | str = "cpu") -> dict[str, Any]:
    """``kwargs`` in the case's layout: on ``device`` (the backend's; numpy forms stay on the
    host), ragged, numpy, id dtype, strides, requires_grad."""
    kwargs = kwargs if case.numpy else on_device(kwargs, device)
    out = to_ragged(kwargs) if case.ragged else dict(kwargs)
    id_dtype = getattr(torch, case.id_dtype)
    for key in ("draft_token_ids", "num_draft_tokens"):
        t = out.get(key)
        if isinstance(t, torch.Tensor) and not t.is_floating_point():
            fits = t.numel() == 0 or (int(t.min()) >= torch.iinfo(id_dtype).min
                                      and int(t.max()) <= torch.iinfo(id_dtype).max)
            if fits:
                out[key] = t.to(id_dtype)
    for key, val in out.items():
        if isinstance(val, torch.Tensor):
            val = _restride(val, case.stride)
            if case.requires_grad and val.is_floating_point() and not case.numpy:
                val = val.detach().requires_grad_(True)
            out[key] = val
    if case.numpy:
        out = {key: _to_numpy(val, case.stride) for key, val in out.items()}
    return out


def _to_numpy(val: Any, stride: str) -> Any:
    if not isinstance(val, torch.Tensor):
        return val
    if val.dtype == torch.bfloat16:
        val = val.float()  # numpy has no bfloat16
    arr = val.detach().numpy()
    if stride == "negative" and arr.ndim >= 1 and arr.size > 0:
        arr = np.flip(np.flip(arr, 0).copy(), 0)  # same values, negative stride on axis 0
    return arr
