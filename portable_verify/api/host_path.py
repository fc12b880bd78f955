"""The lean front door for CPU calls: plain arguments straight to a compiled host kernel.

Why: at batch 1-8 a call is mostly fixed cost, and the full front door (argument
normalisation into torch tensors, row maps, option objects) costs ~50-100 us before any value
is read. When every argument already has its plain form (CPU tensors or numpy arrays of the
canonical dtype, contiguous, with consistent shapes) and the backend ``auto`` or the named one
selects has a host kernel (``numba``), this path hands the arrays to it directly.

It never raises for the caller's mistakes and never decides what is valid: anything it does
not recognise, and every call whose kernel flags an invalid value, returns None, and
:func:`portable_verify.verify` runs the full front door, which gives the answer or the error.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from portable_verify import dispatch
from portable_verify.core.arguments import INT64_MAX, INT64_MIN, SEED_RANGE
from portable_verify.core.types import DEFAULT_TYPICAL, VerifyResult

_METHODS = ("auto", "rejection", "typical", "greedy")
_EMPTY_I64 = np.empty(0, dtype=np.int64)
_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)
_F32_MAX = float(np.finfo(np.float32).max)


def _plain(x: Any, dtype: np.dtype, torch_dtype: torch.dtype) -> Any:
    """``x`` itself when it is a contiguous CPU tensor or C-ordered numpy array of ``dtype``
    (kernels read it in place), else None."""
    if type(x) is torch.Tensor:
        return x if x.is_cpu and x.dtype is torch_dtype and x.is_contiguous() else None
    if type(x) is np.ndarray and x.dtype == dtype and x.flags.c_contiguous:
        return x
    return None


def _host(x: Any) -> np.ndarray | None:
    """A CPU tensor's or a numpy array's values as numpy (no copy); None for anything else."""
    if type(x) is torch.Tensor:
        if not x.is_cpu:
            return None
        try:
            return (x.detach() if x.requires_grad else x).numpy()
        except (TypeError, RuntimeError):  # sparse, conjugate-view, ...: the full front door
            return None
    return x if type(x) is np.ndarray else None


def _c(a: np.ndarray | None, dtype: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` if it has exactly this dtype, shape and a C layout (the kernel's contract)."""
    if a is None or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
        return None
    return a


def _int_scalar(x: Any) -> int | None:
    """A Python or numpy integer (not a bool) that fits int64, else None."""
    if type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool)):
        value = int(x)
        return value if INT64_MIN <= value <= INT64_MAX else None
    return None


def try_verify(draft_token_ids: Any, target_logits: Any, target_probs: Any, draft_probs: Any,
               method: str, temperature: Any, num_draft_tokens: Any, seed: Any,
               seed_offset: Any, uniforms: Any, typical_eps: float, typical_alpha: float,
               bonus_token_ids: Any, backend: Any, validate: Any) -> VerifyResult | None:
    """The result of :func:`portable_verify.verify` for a call in plain form, else None."""
    if not _plain_options(method, backend, validate, typical_eps, typical_alpha):
        return None
    kernel = dispatch.host_kernel(backend)
    if kernel is None:
        return None
    drafts = _plain(draft_token_ids, _I64, torch.int64)
    is_logits = target_probs is None
    target = _plain(target_logits if is_logits else target_probs, _F32, torch.float32)
    if drafts is None or target is None or (not is_logits and target_logits is not None):
        return None
    shape = drafts.shape
    target_shape = target.shape
    if len(shape) != 2 or len(target_shape) != 3:
        return None
    b, k = shape
    v = target_shape[2]
    if target_shape[0] != b or target_shape[1] != k + 1 or v < 1:
        return None
    counts = bonus = _EMPTY_I64
    if num_draft_tokens is not None:
        counts = _c(_host(num_draft_tokens), np.int64, (b,))
    if bonus_token_ids is not None:
        bonus = _host(bonus_token_ids)
        bonus = _c(bonus.reshape(-1) if bonus is not None and bonus.shape == (b, 1) else bonus,
                   np.int64, (b,))
    if counts is None or bonus is None:
        return None
    greedy = method == "greedy" or (type(temperature) in (float, int) and temperature == 0)
    if greedy and uniforms is None:
        if draft_probs is not None and _c(_host(draft_probs), _F32, (b, k, v)) is None:
            return None  # unread, but its layout is still the caller's contract
        out = kernel.greedy(target, is_logits, drafts, counts, bonus, validate)
        return _result(out, draft_token_ids)
    options: dict[str, Any] = {"check": validate, "counts": counts, "bonus": bonus}
    if draft_probs is not None:
        q = _c(_host(draft_probs), _F32, (b, k, v))
        if q is None:
            return None
        options["q"] = q.reshape(b * k, v)
    return _decide(kernel, target, is_logits, drafts, options, greedy, method, temperature,
                   seed, seed_offset, uniforms, typical_eps, typical_alpha, draft_token_ids)


def try_verify_ragged(draft_token_ids: Any, num_draft_tokens: Any, cu_num_draft_tokens: Any,
                      target_logits: Any, target_probs: Any, draft_probs: Any, method: str,
                      temperature: Any, seed: Any, seed_offset: Any, uniforms: Any,
                      max_num_draft_tokens: Any, typical_eps: float, typical_alpha: float,
                      bonus_token_ids: Any, backend: Any, validate: Any) -> VerifyResult | None:
    """The result of :func:`portable_verify.verify_ragged` for a call in plain form, else None.

    The flat layout's counts are checked (non-negative, summing to ``N``, ``N+B`` target rows,
    within ``max_num_draft_tokens``) while the row maps are built, in one compiled call; any
    doubt hands the call to the full front door, which words the error.
    """
    if not _plain_options(method, backend, validate, typical_eps, typical_alpha):
        return None
    kernel = dispatch.host_kernel(backend)
    if kernel is None:
        return None
    flat = _host(draft_token_ids)
    is_logits = target_probs is None
    target = _plain(target_logits if is_logits else target_probs, _F32, torch.float32)
    if (flat is None or target is None or (not is_logits and target_logits is not None)
            or flat.dtype != _I64 or flat.ndim != 1 or len(target.shape) != 2):
        return None
    from_cu = cu_num_draft_tokens is not None
    if from_cu == (num_draft_tokens is not None):
        return None
    layout = _host(cu_num_draft_tokens if from_cu else num_draft_tokens)
    if layout is None or layout.dtype != _I64 or layout.ndim != 1 or (from_cu and layout.size < 1):
        return None
    b = layout.shape[0] - 1 if from_cu else layout.shape[0]
    n, v = flat.shape[0], target.shape[1]
    if v < 1 or not (max_num_draft_tokens is None or type(max_num_draft_tokens) is int):
        return None
    maps = kernel.ragged_layout(flat, layout, from_cu, target.shape[0], max_num_draft_tokens)
    if maps is None:
        return None
    drafts, counts, rows, draft_rows = maps
    bonus = _EMPTY_I64
    if bonus_token_ids is not None:
        bonus = _host(bonus_token_ids)
        bonus = _c(bonus.reshape(-1) if bonus is not None and bonus.shape == (b, 1) else bonus,
                   _I64, (b,))
        if bonus is None:
            return None
    options: dict[str, Any] = {"check": validate, "counts": counts, "bonus": bonus,
                               "rows": rows}
    if draft_probs is not None and n > 0:  # with no drafts at all, q is never read
        q = _c(_host(draft_probs), _F32, (n, v))
        if q is None:
            return None
        options.update(q=q, qrows=draft_rows)
    elif draft_probs is not None and _c(_host(draft_probs), _F32, (0, v)) is None:
        return None
    greedy = method == "greedy" or (type(temperature) in (float, int) and temperature == 0)
    return _decide(kernel, target, is_logits, drafts, options, greedy, method, temperature,
                   seed, seed_offset, uniforms, typical_eps, typical_alpha, draft_token_ids)


def _decide(kernel: Any, target: Any, is_logits: bool, drafts: Any, options: dict[str, Any],
            greedy: bool, method: str, temperature: Any, seed: Any, seed_offset: Any,
            uniforms: Any, typical_eps: float, typical_alpha: float,
            caller_drafts: Any) -> VerifyResult | None:
    """The options both layouts share (greedy rows, temperatures, uniforms, typical), then the
    kernel and the result."""
    b, k = drafts.shape
    if greedy:  # uniforms, if any, are checked for their layout; their values are never read
        if uniforms is not None and _c(_host(uniforms), _F32, (b, k + 1)) is None:
            return None
        options.update(all_greedy=True, temp_scalar=0.0)
    elif not _sampling_options(options, temperature, seed, seed_offset, uniforms, b, k):
        return None
    if method == "typical":
        options.update(typical=True, eps=float(typical_eps), alpha=float(typical_alpha))
    return _result(kernel.decide(target, is_logits, drafts, **options), caller_drafts)


def _plain_options(method: str, backend: Any, validate: Any, typical_eps: Any,
                   typical_alpha: Any) -> bool:
    """The options every plain call has: a known method, a backend name, validate True or
    False, and typical parameters the full front door would accept (it checks them on every
    call, whatever the method)."""
    if (validate is not True and validate is not False) or type(backend) is not str:
        return False
    if method not in _METHODS:
        return False
    if typical_eps is DEFAULT_TYPICAL.eps and typical_alpha is DEFAULT_TYPICAL.alpha:
        return True
    return all(type(x) in (float, int) and math.isfinite(x) and x >= 0
               for x in (typical_eps, typical_alpha))


def _result(out: tuple[Any, ...], caller_drafts: Any) -> VerifyResult | None:
    """The kernel's arrays as the caller's array type (numpy in, numpy out), or None when the
    kernel flagged an invalid value."""
    tokens, accepted, emitted, counts_out, ok = out
    if not ok:
        return None
    if type(caller_drafts) is np.ndarray:
        return VerifyResult._of(tokens, accepted, emitted, counts_out)
    return VerifyResult._of(torch.from_numpy(tokens), torch.from_numpy(accepted),
                            torch.from_numpy(emitted), torch.from_numpy(counts_out))


def _sampling_options(options: dict[str, Any], temperature: Any, seed: Any, seed_offset: Any,
                      uniforms: Any, b: int, k: int) -> bool:
    """Temperatures and the source of the uniforms, in the kernel's terms; False: not plain."""
    if temperature is None:
        options["temp_scalar"] = 1.0
    elif type(temperature) in (float, int) or (isinstance(temperature, numbers.Real)
                                               and not isinstance(temperature, bool)):
        t = float(np.float32(temperature)) if temperature <= _F32_MAX else math.inf
        options["temp_scalar"] = t  # the kernel checks it (finite, >= 0) with the rest
        if t == 0.0:
            options["all_greedy"] = True
            return True
    else:
        temps = _host(temperature)
        if temps is None or temps.shape != (b,) or temps.dtype.kind != "f":
            return False
        options["temps"] = np.ascontiguousarray(temps, dtype=np.float32)
    if uniforms is not None:
        u = _c(_host(uniforms), np.float32, (b, k + 1))
        if u is None:
            return False
        options["uniforms"] = u
        return True
    if seed is None:
        options["seeds"] = torch.randint(0, SEED_RANGE, (b,), dtype=torch.int64).numpy()
    elif (s := _int_scalar(seed)) is not None:
        options["seed_scalar"], options["seed_mode"] = s, 2
    else:
        seeds = _c(_host(seed), np.int64, (b,))
        if seeds is None:
            return False
        options["seeds"] = seeds
    if seed_offset is not None:
        if (o := _int_scalar(seed_offset)) is not None:
            options["offset_scalar"] = o
        else:
            offsets = _c(_host(seed_offset), np.int64, (b,))
            if offsets is None:
                return False
            options["offsets"] = offsets
    return True
