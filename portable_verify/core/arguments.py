"""Caller arguments in canonical form: arrays as torch tensors, seeds, offsets, temperatures.

Why one module: the front doors, the Hugging Face loop and the dense baseline all take the same
``seed`` / ``temperature`` forms; normalising them in one place keeps their meaning (and their
error messages) identical everywhere.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from portable_verify.core import rng
from portable_verify.core.validation import require_float, require_int, require_rank

ArrayLike = Any  # torch.Tensor | np.ndarray

SEED_RANGE = 2**62
"""Seeds drawn for the caller (``seed=None``) lie in ``[0, SEED_RANGE)``: non-negative int64 on
every device and every array library."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def to_tensor(name: str, x: ArrayLike | None) -> torch.Tensor | None:
    """``x`` as a torch tensor that shares memory where it can, detached from autograd.

    numpy arrays that torch cannot view (negative strides, non-native byte order) are copied;
    object or string arrays and meta tensors are refused with the argument's name.
    """
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.is_meta:
            raise ValueError(f"{name} is a meta tensor (shape only, no data); pass real values")
        x = x.detach()  # results never need gradients; detaching is free
        if x.is_neg() or x.is_conj():  # lazy views: their memory does not hold their values
            x = x.resolve_neg().resolve_conj()
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biuf":
            raise TypeError(f"{name} must hold numbers, got a numpy array of dtype {x.dtype}")
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        if any(s < 0 for s in x.strides):
            x = x.copy()  # not ascontiguousarray: it keeps a negative stride on a length-1 axis
        return torch.from_numpy(x)
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def optional_count(name: str, value: Any) -> int | None:
    """A non-negative Python int option (``max_num_draft_tokens``, ``max_depth``), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def is_int_scalar(x: Any) -> bool:
    return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, bool)


def _int64_scalar(name: str, x: Any) -> int:
    value = int(x)
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} must fit in int64 [-2**63, 2**63), got {value}")
    return value


def _per_request(name: str, x: ArrayLike, b: int, device: torch.device,
                 validate: bool) -> torch.Tensor:
    t = to_tensor(name, x)
    if validate:
        require_int(name, t)
        require_rank(name, t, 1, "[B]")
        if t.shape[0] != b:
            raise ValueError(f"{name} has {t.shape[0]} entries, expected B = {b}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the target on {device}")
    return t.to(device=device, dtype=torch.int64)


def request_seeds(seed: int | ArrayLike | None, b: int, device: torch.device,
                  validate: bool = True) -> torch.Tensor:
    """int64 ``[B]`` per-request seeds.

    ``None`` draws them from torch's generator; one int seeds the batch (each row gets its own
    seed derived from it and the row index); an int ``[B]`` array gives one seed per request.
    """
    if seed is None:
        return torch.randint(0, SEED_RANGE, (b,), dtype=torch.int64, device=device)
    if is_int_scalar(seed):
        if device.type == "cpu":  # a dozen tiny ops: numpy's per-op cost is far below torch's
            return torch.from_numpy(rng.row_seeds(_int64_scalar("seed", seed),
                                                  np.arange(b, dtype=np.int64)))
        rows = torch.arange(b, dtype=torch.int64, device=device)
        return rng.row_seeds(_int64_scalar("seed", seed), rows)
    if isinstance(seed, (bool, float, str)):
        raise TypeError(f"seed must be an int, an int [B] array or None, got {seed!r}")
    return _per_request("seed", seed, b, device, validate)


def request_offsets(seed_offset: int | ArrayLike | None, b: int, device: torch.device,
                    validate: bool = True) -> torch.Tensor:
    """int64 ``[B]`` per-request offsets (advance them each decoding step; default 0)."""
    if seed_offset is None or is_int_scalar(seed_offset):
        value = _int64_scalar("seed_offset", seed_offset or 0)
        return torch.full((b,), value, dtype=torch.int64, device=device)
    if isinstance(seed_offset, (bool, float, str)):
        raise TypeError(f"seed_offset must be an int or an int [B] array, got {seed_offset!r}")
    return _per_request("seed_offset", seed_offset, b, device, validate)


def check_temperature_scalar(temperature: Any, validate: Any = True,
                             has_probs: bool = False) -> float:
    """A scalar temperature as a float, checked (finite, ``>= 0``; only 0 or 1 with
    probabilities, which carry no logits to rescale) *before* any rounding: rounded to float32
    first, ``-1e-50`` would become ``-0.0`` and pass."""
    if isinstance(temperature, bool):
        raise TypeError(f"temperature must be a number or a float [B] array, got {temperature}")
    try:
        t = float(temperature)
    except OverflowError:  # an int beyond float's range
        t = math.inf if temperature > 0 else -math.inf
    if validate and not (0 <= t < math.inf):
        raise ValueError(f"temperature must be finite and >= 0, got {t}")
    if validate and has_probs and t not in (0.0, 1.0):
        raise ValueError(
            f"temperature={t} cannot be applied to target_probs; pass target_logits, or "
            "temperature 0 (greedy) / 1 / None"
        )
    return t


def temperatures(temperature: float | ArrayLike | None, b: int, device: torch.device,
                 *, has_probs: bool = False, validate: bool = True
                 ) -> tuple[torch.Tensor, bool, bool]:
    """float32 ``[B]`` temperatures, plus host-known ``(all_greedy, none_greedy)``.

    A scalar is checked here (finite, ``>= 0``; only 0 or 1 with probabilities, which carry no
    logits to rescale); a tensor's values are checked with the other value checks, on device.
    """
    if temperature is None or isinstance(temperature, (numbers.Real, np.floating)):
        t = 1.0 if temperature is None else check_temperature_scalar(temperature, validate,
                                                                     has_probs)
        t = float(np.float32(t)) if t <= FLOAT32_MAX else math.inf  # a T rounding to 0 is greedy
        return torch.full((b,), t, dtype=torch.float32, device=device), t == 0.0, t != 0.0
    tt = to_tensor("temperature", temperature)
    if validate:
        require_rank("temperature", tt, 1, "[B]")
        require_float("temperature", tt)
        if tt.shape[0] != b:
            raise ValueError(f"temperature has {tt.shape[0]} entries, expected B = {b}")
        if tt.device != device:
            raise ValueError(f"temperature is on {tt.device}, the target on {device}")
    t32 = tt.to(device=device, dtype=torch.float32)
    if tt.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        # A negative value too small for float32 would round to -0.0 and pass its check:
        # it stays negative (the smallest normal float32), so the value check refuses it.
        t32 = torch.where(tt.to(device) < 0, -FLOAT32_TINY, t32)
    return t32, False, False

