"""The one reading of a call's arguments, for every front door.

Every front door (padded ``verify``, ragged ``verify_ragged``, the engines' ``verify_rows``)
turns its arguments into one :class:`~portable_verify.core.types.VerifyCall` here. The normal
path is the cheap one: arguments already in plain form (contiguous CPU tensors or numpy arrays
of the canonical dtypes, consistent shapes) are taken as they are, scalars stay scalars, and no
torch op runs, because at batch 1-8 a call is mostly this fixed cost. Anything else is converted
(``core.arguments.to_tensor``: views where possible) and, under ``validate``, checked, with the
error naming the argument. The options (method, typical parameters, backend, validation level)
are read once, into one :class:`~portable_verify.core.types.VerifyOptions` value.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from portable_verify.core import layout, methods
from portable_verify.core.arguments import (
    ArrayLike,
    check_temperature_scalar,
    optional_count,
    to_tensor,
)
from portable_verify.core.methods import CHAIN
from portable_verify.core.tree import CHILDREN_MODES, Children, TreeCall
from portable_verify.core.tree_validation import check_tree_structure
from portable_verify.core.types import (
    DEFAULT_OPTIONS,
    DEFAULT_TYPICAL,
    TypicalParams,
    VerifyCall,
    VerifyOptions,
    options_alone,
)
from portable_verify.core.validation import (
    require_at_most,
    require_float,
    require_int,
    require_rank,
    require_same_device,
    require_together,
)

_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)
_OPTIONS_CACHE: dict[tuple[Any, ...], VerifyOptions] = {}
_ZERO32 = 2.0**-150
"""The largest magnitude that rounds to 0 in float32 (ties to even at half the smallest
subnormal): such a temperature is greedy."""


# ---------------------------------------------------------------------------------- options


def read_options(method: Any, typical_eps: Any, typical_alpha: Any, options: Any,
                 backend: Any, validate: Any, layout: str = CHAIN) -> VerifyOptions:
    """The call's :class:`VerifyOptions` (cached: building one checks its fields), after the
    host-only check of ``validate``; a method that does not serve ``layout`` is refused with
    the one that does (the method table). ``backend`` is checked where it is resolved
    (``dispatch.select_backend``)."""
    if validate is not True and validate is not False and validate != "full":
        raise TypeError(f"validate must be True, False or \"full\", got {validate!r}")
    if options is not None:
        value = options_alone(options, method, typical_eps, typical_alpha)
        if layout not in methods.TABLE[value.method].layouts:
            methods.lookup(value.method, layout)  # raises, naming the method that serves it
        return value
    if (method == DEFAULT_OPTIONS.method and typical_eps is DEFAULT_TYPICAL.eps
            and typical_alpha is DEFAULT_TYPICAL.alpha):
        return DEFAULT_OPTIONS
    try:  # types in the key: True == 1 and hash alike, but only 1 is a valid typical_eps
        key = (method, type(typical_eps), typical_eps, type(typical_alpha), typical_alpha,
               layout)
        cached = _OPTIONS_CACHE.get(key)
    except TypeError:  # unhashable: let the constructors say what is wrong
        key, cached = None, None
    if cached is not None:
        return cached  # checked for this layout when it was cached
    value = VerifyOptions(method, TypicalParams(typical_eps, typical_alpha))
    if layout not in methods.TABLE[value.method].layouts:
        methods.lookup(value.method, layout)
    if key is not None:
        if len(_OPTIONS_CACHE) > 256:
            _OPTIONS_CACHE.clear()
        _OPTIONS_CACHE[key] = value
    return value


def _rule(options: VerifyOptions, temperature: Any) -> str | None:
    """The rule of the call's sampled rows, None when every row is known to be greedy on the
    host (the greedy method, or a scalar temperature that rounds to 0 in float32): the one place
    this is decided."""
    if (type(temperature) is float or type(temperature) is int) and abs(temperature) <= _ZERO32:
        return None
    return options.sampled_method


def _call(*, drafts: Any, counts: Any, target: Any, target_name: str, rows: Any, q: Any,
          q_rows: Any, temperature: Any, seed: Any, seed_offset: Any, uniforms: Any, bonus: Any,
          options: VerifyOptions, rule: str | None, validate: Any, backend: str, host: bool,
          return_numpy: bool, flat: layout.FlatLayout | None = None) -> VerifyCall:
    """A :class:`VerifyCall` of a general-form call, by keyword (the plain host form builds
    its own in :func:`_host_call`, on the hot path); ``rule`` is :func:`_rule`'s answer."""
    return VerifyCall(drafts, counts, target, target_name, rows, q, q_rows, temperature, seed,
                      seed_offset, uniforms, bonus, options, rule, validate, backend, host,
                      return_numpy, flat)


# ------------------------------------------------------------------------- plain host form


def _plain(x: Any, dtype: np.dtype, torch_dtype: torch.dtype) -> Any:
    """``x`` itself when it is a contiguous CPU tensor or C-ordered numpy array of ``dtype``
    (read in place by address), else None. Tensors with a lazy negation or conjugation bit are
    not plain: their memory does not hold their values."""
    if type(x) is torch.Tensor:
        try:  # a sparse tensor has no is_contiguous(): not plain
            if x.is_cpu and x.dtype is torch_dtype and x.is_contiguous() and not x.is_neg():
                return x
        except RuntimeError:
            pass
        return None
    if type(x) is np.ndarray and x.dtype == dtype and x.flags.c_contiguous:
        return x
    return None


def _host(x: Any) -> np.ndarray | None:
    """A CPU tensor's or a numpy array's values as numpy (no copy); None for anything else."""
    if type(x) is torch.Tensor:
        if not x.is_cpu or x.is_neg() or x.is_conj() or x.layout is not torch.strided:
            return None
        return (x.detach() if x.requires_grad else x).numpy()
    return x if type(x) is np.ndarray else None


def _exact(x: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
    """``x`` as a C-ordered host array of exactly this dtype and shape, else None."""
    a = _host(x)
    if a is None or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
        return None
    return a


def _plain_ints(x: Any, b: int) -> Any:
    """An int scalar or a plain int64 ``[B]`` host array (seeds, offsets); False if neither."""
    if x is None:
        return None
    kind = type(x)
    if kind is not torch.Tensor and kind is not np.ndarray and (
            kind is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))):
        return int(x) if -(2**63) <= int(x) < 2**63 else False  # (an ABC check is slow: last)
    a = _exact(x, _I64, (b,))
    return False if a is None else a


def _plain_temperature(t: Any, b: int, validate: Any, has_probs: bool) -> Any:
    """A checked float scalar, a plain float32 ``[B]`` host array, None, or False (not plain).

    A float64 array is not plain: rounded to float32 first, a tiny negative value would become
    ``-0.0`` and pass its check (its values are checked in their own dtype on the full path).
    """
    if t is None:
        return None
    if type(t) in (float, int) or (isinstance(t, numbers.Real) and not isinstance(t, bool)):
        return check_temperature_scalar(t, validate, has_probs)
    a = _exact(t, _F32, (b,))
    return False if a is None else a


def _host_call(drafts: Any, counts: Any, target: Any, target_name: str, rows: Any, q: Any,
               qrows: Any, b: int, k: int, temperature: Any, seed: Any, seed_offset: Any,
               uniforms: Any, bonus: Any, options: VerifyOptions, validate: Any, backend: str,
               return_numpy: bool) -> VerifyCall | None:
    """The plain-form call, or None when an option is not in plain form."""
    temps = temperature
    if not (type(temperature) is float and 0.0 <= temperature < math.inf and (
            temperature in (0.0, 1.0) or target_name == "target_logits")):  # (valid: as is)
        temps = _plain_temperature(temperature, b, validate, target_name == "target_probs")
    if temps is False:
        return None
    seeds = offsets = None
    rule = _rule(options, temps)
    if rule is not None:  # (an all-greedy call reads no seed)
        seeds = _plain_ints(seed, b)
        offsets = _plain_ints(seed_offset, b)
        if seeds is False or offsets is False:
            return None
    u = None
    if uniforms is not None and (u := _exact(uniforms, _F32, (b, k + 1))) is None:
        return None
    bonus_ids = None
    if bonus is not None:
        a = _host(bonus)
        if a is not None and a.shape == (b, 1):  # vLLM's [B, 1]
            a = a.reshape(b)
        if (bonus_ids := _exact(a, _I64, (b,))) is None:
            return None
    # The hot path builds the record positionally (keywords cost as much as the rest of this
    # function); :func:`_call` is the other builder, by keyword, for every general form.
    return VerifyCall(drafts, counts, target, target_name, rows, q, qrows, temps, seeds, offsets,
                      u, bonus_ids, options, rule, validate, backend, True, return_numpy)


def _target(target_logits: Any, target_probs: Any) -> tuple[Any, str]:
    if target_probs is None:
        return target_logits, "target_logits"
    return target_probs, "target_probs"


# ------------------------------------------------------------------------------ padded


def parse_padded(draft_token_ids: ArrayLike, target_logits: ArrayLike | None,
                 target_probs: ArrayLike | None, draft_probs: ArrayLike | None,
                 num_draft_tokens: ArrayLike | None, temperature: Any, seed: Any,
                 seed_offset: Any, uniforms: ArrayLike | None, bonus_token_ids: ArrayLike | None,
                 options: VerifyOptions, backend: str, validate: Any) -> VerifyCall:
    """A padded ``[B, K+1, V]`` call."""
    target_in, target_name = _target(target_logits, target_probs)
    return_numpy = type(draft_token_ids) is not torch.Tensor
    drafts = _plain(draft_token_ids, _I64, torch.int64)
    target = _plain(target_in, _F32, torch.float32)
    if (drafts is not None and target is not None
            and (target_probs is None or target_logits is None)):
        shape = drafts.shape
        b, k = shape if len(shape) == 2 else (-1, -1)
        shape = target.shape
        if len(shape) == 3 and shape[0] == b and shape[1] == k + 1 and shape[2] >= 1:
            v = shape[2]
            counts = q = None
            plain = True
            if num_draft_tokens is not None:
                plain = (counts := _exact(num_draft_tokens, _I64, (b,))) is not None
            if plain and draft_probs is not None:
                q = _exact(draft_probs, _F32, (b, k, v))
                plain = q is not None
            if plain:
                call = _host_call(drafts, counts, target, target_name,
                                  None, None if q is None else q.reshape(b * k, v), None, b, k,
                                  temperature, seed, seed_offset, uniforms, bonus_token_ids,
                                  options, validate, backend, return_numpy)
                if call is not None:
                    return call
    return _general_padded(draft_token_ids, target_logits, target_probs, draft_probs,
                           num_draft_tokens, temperature, seed, seed_offset, uniforms,
                           bonus_token_ids, options, backend, validate, return_numpy)


def _general_padded(draft_token_ids: Any, target_logits: Any, target_probs: Any,
                    draft_probs: Any, num_draft_tokens: Any, temperature: Any, seed: Any,
                    seed_offset: Any, uniforms: Any, bonus_token_ids: Any,
                    options: VerifyOptions, backend: str, validate: Any,
                    return_numpy: bool) -> VerifyCall:
    drafts = to_tensor("draft_token_ids", draft_token_ids)
    target, target_name = target_tensor(target_logits, target_probs)
    q = to_tensor("draft_probs", draft_probs)
    counts = to_tensor("num_draft_tokens", num_draft_tokens)
    u = to_tensor("uniforms", uniforms)
    if drafts is None:
        raise TypeError("draft_token_ids must be a torch.Tensor or numpy.ndarray, got None")
    if validate:
        check_padded(drafts, target, target_name, q, counts, u)
    b, k = drafts.shape
    v = target.shape[-1]
    device = target.device
    return _call(drafts=drafts.to(device=device, dtype=torch.int64),
                 counts=None if counts is None else counts.to(device=device, dtype=torch.int64),
                 target=target.reshape(b * (k + 1), v), target_name=target_name, rows=None,
                 q=None if q is None else q.reshape(b * k, v), q_rows=None,
                 temperature=temperature, seed=seed, seed_offset=seed_offset, uniforms=u,
                 bonus=bonus_token_ids, options=options,
                 rule=_rule(options, temperature), validate=validate, backend=backend,
                 host=False, return_numpy=return_numpy)


def target_tensor(target_logits: Any, target_probs: Any) -> tuple[torch.Tensor, str]:
    """The one target tensor given, and the name of the argument that carried it."""
    logits = to_tensor("target_logits", target_logits)
    probs = to_tensor("target_probs", target_probs)
    if (logits is None) == (probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    if logits is not None:
        return logits, "target_logits"
    return probs, "target_probs"


def _check_vocab_and_draft_probs(target_name: str, target: torch.Tensor,
                                 q: torch.Tensor | None, q_lead: tuple[int, ...], dims: str,
                                 q_layout: str) -> None:
    """The target's vocabulary is not empty; ``draft_probs``, when given, is float of shape
    ``q_lead + (V,)`` (the layout's ``dims``, e.g. ``"B, K, V"``)."""
    v = target.shape[-1]
    if v < 1:
        raise ValueError(f"{target_name} has an empty vocabulary dimension")
    if q is None:
        return
    require_rank("draft_probs", q, len(q_lead) + 1, q_layout)
    require_float("draft_probs", q)
    if tuple(q.shape) != (*q_lead, v):
        raise ValueError(f"draft_probs must have shape ({dims}) = {(*q_lead, v)}, "
                         f"got {tuple(q.shape)}")


def check_padded(drafts: torch.Tensor, target: torch.Tensor, target_name: str,
                 q: torch.Tensor | None, counts: torch.Tensor | None,
                 explicit_u: torch.Tensor | None) -> None:
    """Host-only checks of the padded layout."""
    require_rank("draft_token_ids", drafts, 2, "[B, K]")
    require_int("draft_token_ids", drafts)
    require_rank(target_name, target, 3, "[B, K+1, V]")
    require_float(target_name, target)
    b, k = drafts.shape
    if target.shape[0] != b:
        raise ValueError(
            f"{target_name} has batch size {target.shape[0]}, draft_token_ids has {b}"
        )
    if target.shape[1] != k + 1:
        raise ValueError(
            f"{target_name} must have K+1 = {k + 1} rows per request (K drafts plus the bonus "
            f"position), got {target.shape[1]}"
        )
    _check_vocab_and_draft_probs(target_name, target, q, (b, k), "B, K, V", "[B, K, V]")
    _check_counts(counts, b)
    _check_uniforms_shape(explicit_u, b, k, "K+1")
    require_same_device({"draft_token_ids": drafts, target_name: target, "draft_probs": q,
                         "num_draft_tokens": counts, "uniforms": explicit_u})


def _check_counts(counts: torch.Tensor | None, b: int) -> None:
    if counts is not None:
        require_rank("num_draft_tokens", counts, 1, "[B]")
        require_int("num_draft_tokens", counts)
        if counts.shape[0] != b:
            raise ValueError(f"num_draft_tokens has {counts.shape[0]} entries, expected B = {b}")


def _check_uniforms_shape(u: torch.Tensor | None, b: int, k: int, width: str) -> None:
    if u is None:
        return
    require_rank("uniforms", u, 2, f"[B, {width}]")
    require_float("uniforms", u)
    if tuple(u.shape) != (b, k + 1):
        raise ValueError(
            f"uniforms must have shape (B, {width}) = {(b, k + 1)}, got {tuple(u.shape)}"
        )


# ------------------------------------------------------------------------------ ragged


MAX_OUTPUT_ELEMENTS = 2**31
"""A call's ``[B, K+1]`` outputs above this many entries are refused before allocation: such a
``K`` is a corrupted argument, not a batch."""

MAX_PADDED_WIDTH = 1024
"""``max_num_draft_tokens`` may exceed ``N`` (no request has more drafts: the extra columns are
padding, e.g. an engine's static ``K``) up to this many positions, at every level."""


def parse_ragged(draft_token_ids: ArrayLike, num_draft_tokens: ArrayLike | None,
                 cu_num_draft_tokens: ArrayLike | None, target_logits: ArrayLike | None,
                 target_probs: ArrayLike | None, draft_probs: ArrayLike | None,
                 temperature: Any, seed: Any, seed_offset: Any, uniforms: ArrayLike | None,
                 max_num_draft_tokens: Any, bonus_token_ids: ArrayLike | None,
                 options: VerifyOptions, backend: str, validate: Any) -> VerifyCall:
    """A flat call: every request's drafts back to back, ``N+B`` target rows."""
    return_numpy = type(draft_token_ids) is not torch.Tensor
    max_k = optional_count("max_num_draft_tokens", max_num_draft_tokens)
    if validate is False:
        call = _lean_ragged(draft_token_ids, num_draft_tokens, cu_num_draft_tokens,
                            target_logits, target_probs, draft_probs, temperature, seed,
                            seed_offset, uniforms, max_k, bonus_token_ids, options, backend,
                            return_numpy)
        if call is not None:
            return call
    target_in, target_name = _target(target_logits, target_probs)
    flat = _host(draft_token_ids)
    target = _plain(target_in, _F32, torch.float32)
    from_cu = cu_num_draft_tokens is not None
    sizes = _host(cu_num_draft_tokens if from_cu else num_draft_tokens)
    if (flat is not None and target is not None and sizes is not None
            and (target_probs is None or target_logits is None)
            and (num_draft_tokens is None or not from_cu) and flat.dtype == _I64
            and flat.ndim == 1 and target.ndim == 2 and target.shape[1] >= 1
            and sizes.dtype == _I64 and sizes.ndim == 1 and (sizes.shape[0] >= 1 or not from_cu)):
        n, v = flat.shape[0], target.shape[1]
        b = sizes.shape[0] - 1 if from_cu else sizes.shape[0]
        q = None
        if draft_probs is not None and (q := _exact(draft_probs, _F32, (n, v))) is None:
            q = False
        if q is not False and (not validate or target.shape[0] == n + b):
            counts, starts, k = ragged_counts(sizes, from_cu, n, target.shape[0], max_k,
                                              validate)
            drafts, rows, draft_rows = layout.ragged_maps(flat, counts, starts, k)
            has_q = q is not None and n > 0  # with no drafts at all, q is never read
            call = _host_call(drafts, counts, target, target_name, rows,
                              q if has_q else None, draft_rows if has_q else None, b, k,
                              temperature, seed, seed_offset, uniforms, bonus_token_ids,
                              options, validate, backend, return_numpy)
            if call is not None:
                return call
    return _general_ragged(draft_token_ids, num_draft_tokens, cu_num_draft_tokens,
                           target_logits, target_probs, draft_probs, temperature, seed,
                           seed_offset, uniforms, max_k, bonus_token_ids, options, backend,
                           validate, return_numpy)


def _lean(backend: str, target: Any, options: VerifyOptions, temperature: Any) -> bool:
    """Whether ``backend`` decides unvalidated calls on ``target``'s device from the caller's
    arrays (``traits.lean_calls``): the doors then skip their host paths."""
    from portable_verify.api.call import lean_backend

    device_type = target.device.type if type(target) is torch.Tensor else "cpu"
    return lean_backend(backend, device_type, _rule(options, temperature)) is not None


def _lean_ragged(draft_token_ids: Any, num_draft_tokens: Any, cu_num_draft_tokens: Any,
                 target_logits: Any, target_probs: Any, draft_probs: Any, temperature: Any,
                 seed: Any, seed_offset: Any, uniforms: Any, max_k: int | None,
                 bonus_token_ids: Any, options: VerifyOptions, backend: str,
                 return_numpy: bool) -> VerifyCall | None:
    """An unvalidated flat call for a backend that computes the row maps itself
    (``traits.lean_calls``): the layout described (``layout.FlatLayout``), no map built; None
    for any other backend. ``K`` without ``max_num_draft_tokens`` costs the documented sync."""
    rule = _rule(options, temperature)
    if not _lean(backend, target_logits if target_probs is None else target_probs, options,
                 temperature):
        return None  # (cheap: the CPU host path runs right after)
    target, target_name = target_tensor(target_logits, target_probs)
    flat = to_tensor("draft_token_ids", draft_token_ids)
    from_cu = cu_num_draft_tokens is not None
    sizes = to_tensor("cu_num_draft_tokens" if from_cu else "num_draft_tokens",
                      cu_num_draft_tokens if from_cu else num_draft_tokens)
    if flat is None or sizes is None:
        return None  # the general path words the error
    n = flat.shape[0]
    b = sizes.shape[0] - 1 if from_cu else sizes.shape[0]
    if max_k is not None:
        require_at_most("max_num_draft_tokens", max_k, max(n, MAX_PADDED_WIDTH),
                        f"no request has more than the call's N = {n} drafts, and a "
                        f"result padded beyond N is at most {MAX_PADDED_WIDTH} positions wide")
        k = max_k
    else:  # the one documented sync; a garbage count must not size the result
        counts = sizes[1:] - sizes[:-1] if from_cu else sizes
        k = min(max(int(counts.max()), 0), n) if b > 0 else 0
    has_q = draft_probs is not None and n > 0
    return _call(drafts=flat, counts=None, target=target, target_name=target_name, rows=None,
                 q=to_tensor("draft_probs", draft_probs) if has_q else None, q_rows=None,
                 temperature=temperature, seed=seed, seed_offset=seed_offset,
                 uniforms=to_tensor("uniforms", uniforms), bonus=bonus_token_ids,
                 options=options, rule=rule, validate=False, backend=backend, host=False,
                 return_numpy=return_numpy,
                 flat=layout.FlatLayout(sizes, "cu" if from_cu else "counts", b, k))


def _general_ragged(draft_token_ids: Any, num_draft_tokens: Any, cu_num_draft_tokens: Any,
                    target_logits: Any, target_probs: Any, draft_probs: Any,
                    temperature: Any, seed: Any, seed_offset: Any, uniforms: Any,
                    max_k: int | None, bonus_token_ids: Any, options: VerifyOptions,
                    backend: str, validate: Any, return_numpy: bool) -> VerifyCall:
    flat = to_tensor("draft_token_ids", draft_token_ids)
    target, target_name = target_tensor(target_logits, target_probs)
    q = to_tensor("draft_probs", draft_probs)
    counts_in = to_tensor("num_draft_tokens", num_draft_tokens)
    cu_in = to_tensor("cu_num_draft_tokens", cu_num_draft_tokens)
    if (counts_in is None) == (cu_in is None):
        raise ValueError("give exactly one of num_draft_tokens and cu_num_draft_tokens")
    if flat is None:
        raise TypeError("draft_token_ids must be a torch.Tensor or numpy.ndarray, got None")
    u = to_tensor("uniforms", uniforms)
    if validate:
        check_ragged(flat, counts_in, cu_in, target, target_name, q, u)
    device = target.device
    from_cu = cu_in is not None
    sizes = (cu_in if from_cu else counts_in).to(device=device, dtype=torch.int64)
    n = flat.shape[0]
    counts, starts, k = ragged_counts(sizes, from_cu, n, target.shape[0], max_k, validate)
    if validate:
        _check_uniforms_shape(u, counts.shape[0], k, "max_k+1")
    drafts, rows, draft_rows = layout.ragged_maps(flat.to(device), counts, starts, k)
    has_q = q is not None and n > 0
    return _call(drafts=drafts, counts=counts, target=target, target_name=target_name, rows=rows,
                 q=q if has_q else None, q_rows=draft_rows if has_q else None,
                 temperature=temperature, seed=seed, seed_offset=seed_offset, uniforms=u,
                 bonus=bonus_token_ids, options=options,
                 rule=_rule(options, temperature), validate=validate, backend=backend,
                 host=False, return_numpy=return_numpy)


def check_ragged(flat: torch.Tensor, counts: torch.Tensor | None, cu: torch.Tensor | None,
                 target: torch.Tensor, target_name: str, q: torch.Tensor | None,
                 explicit_u: torch.Tensor | None) -> None:
    """Host-only checks of the flattened layout (ranks, dtypes, sizes, devices)."""
    require_rank("draft_token_ids", flat, 1, "[N] (flattened drafts)")
    require_int("draft_token_ids", flat)
    if counts is not None:
        require_rank("num_draft_tokens", counts, 1, "[B]")
        require_int("num_draft_tokens", counts)
        b = counts.shape[0]
    else:
        require_rank("cu_num_draft_tokens", cu, 1, "[B+1]")
        require_int("cu_num_draft_tokens", cu)
        if cu.shape[0] < 1:
            raise ValueError("cu_num_draft_tokens must have B+1 >= 1 entries (it starts at 0)")
        b = cu.shape[0] - 1
    n = flat.shape[0]
    require_rank(target_name, target, 2, "[N+B, V] (flattened rows)")
    require_float(target_name, target)
    if target.shape[0] != n + b:
        raise ValueError(
            f"{target_name} must have N+B = {n}+{b} = {n + b} rows (each request's drafts plus "
            f"its bonus row), got {target.shape[0]}"
        )
    _check_vocab_and_draft_probs(target_name, target, q, (n,), "N, V", "[N, V] (flattened)")
    require_same_device({"draft_token_ids": flat, "num_draft_tokens": counts,
                         "cu_num_draft_tokens": cu, target_name: target, "draft_probs": q,
                         "uniforms": explicit_u})


def ragged_counts(sizes: Any, from_cu: bool, n_total: int, n_rows: int, max_k: int | None,
                  validate: Any) -> tuple[Any, Any, int]:
    """``(counts [B], starts [B], K)`` of a flat call, from counts or inclusive-of-0 offsets.

    Under ``validate`` the layout is checked before anything is indexed or allocated: counts
    non-negative (offsets starting at 0 and non-decreasing, compared, never subtracted, so
    int64 extremes cannot wrap), accounting for exactly ``N`` drafts, within
    ``max_num_draft_tokens``; on devices the flags come back in one host transfer.
    """
    if max_k is not None:
        require_at_most("max_num_draft_tokens", max_k, max(n_total, MAX_PADDED_WIDTH),
                        f"no request has more than the call's N = {n_total} drafts, and a "
                        f"result padded beyond N is at most {MAX_PADDED_WIDTH} positions wide")
    name = "cu_num_draft_tokens" if from_cu else "num_draft_tokens"
    xp = np if isinstance(sizes, np.ndarray) else torch
    b = sizes.shape[0] - 1 if from_cu else sizes.shape[0]
    if validate:
        if from_cu:
            flags = [sizes[0] != 0, (sizes[1:] < sizes[:-1]).any(), sizes[-1] != n_total]
        else:
            negative = (sizes < 0).any()
            # A count above N fails the total; tested apart so that a wrapped sum cannot pass.
            flags = [negative, negative, ((sizes > n_total).any() | (sizes.sum() != n_total))]
        if xp is np:
            bad_start, bad_order, bad_total = (bool(f) for f in flags)
        else:
            bad_start, bad_order, bad_total = torch.stack(
                [torch.as_tensor(f, device=sizes.device) for f in flags]).tolist()
        if from_cu and bad_start:
            raise ValueError(f"cu_num_draft_tokens must start at 0, got {_preview(sizes)}")
        if bad_order:
            what = "be non-decreasing" if from_cu else "be >= 0"
            raise ValueError(f"{name} must {what}; got {_preview(sizes)}")
        if bad_total:
            accounted = int(sizes[-1]) if from_cu else sum(int(c) for c in sizes.tolist())
            raise ValueError(
                f"{name} accounts for {accounted} drafts but draft_token_ids has N = "
                f"{n_total} (and the target {n_rows} = N+B rows)")
    if from_cu:
        starts = sizes[:-1]
        counts = sizes[1:] - starts
    else:
        counts = sizes
        starts = (np.cumsum(counts) - counts) if xp is np else torch.cumsum(counts, 0) - counts
    if not validate:
        if max_k is not None:
            return counts, starts, max_k
        # The one documented sync. No valid count exceeds N: a garbage one must not size the
        # [B, K] arrays (a count near 2**31 would allocate tens of GB before anything is read).
        return counts, starts, min(max(int(counts.max()), 0), n_total) if b > 0 else 0
    observed = int(counts.max()) if b > 0 else 0
    if max_k is not None and observed > max_k:
        raise ValueError(
            f"max_num_draft_tokens={max_k} is smaller than the largest draft count "
            f"{observed} in {name}")
    k = observed if max_k is None else max_k
    if b * (k + 1) > MAX_OUTPUT_ELEMENTS:
        raise ValueError(
            f"max_num_draft_tokens={k} makes the [B, K+1] = [{b}, {k + 1}] result too large; "
            f"no request has more than its N = {n_total} drafts")
    return counts, starts, k


def _preview(t: Any, limit: int = 16) -> str:
    values = t[:limit].tolist()
    return f"{values}{' ...' if t.shape[0] > limit else ''}"



# -------------------------------------------------------------------------------- rows


def parse_rows(draft_token_ids: ArrayLike, target_rows: ArrayLike,
               target_logits: ArrayLike | None, target_probs: ArrayLike | None,
               num_draft_tokens: ArrayLike | None, draft_probs: ArrayLike | None,
               draft_rows: ArrayLike | None, temperature: Any, seed: Any, seed_offset: Any,
               uniforms: ArrayLike | None, bonus_token_ids: ArrayLike | None,
               options: VerifyOptions, backend: str, validate: Any) -> VerifyCall:
    """An engine's call: padded drafts, flat target rows and the row maps into them."""
    require_together("draft_probs", draft_probs, "draft_rows", draft_rows)  # in every form
    return_numpy = type(draft_token_ids) is not torch.Tensor
    target_in, target_name = _target(target_logits, target_probs)
    # The backend picks the path: one that decides unvalidated calls from the caller's tensors
    # gets them as given, never converted to numpy on the host (a device read per tensor).
    lean = (validate is False and type(target_in) is torch.Tensor
            and _lean(backend, target_in, options, temperature))
    drafts = None if lean else _plain(draft_token_ids, _I64, torch.int64)
    target = None if lean else _plain(target_in, _F32, torch.float32)
    if (drafts is not None and target is not None and drafts.ndim == 2 and target.ndim == 2
            and target.shape[1] >= 1 and (target_probs is None or target_logits is None)):
        b, k = drafts.shape
        v = target.shape[1]
        rows = _exact(target_rows, _I64, (b, k + 1))
        counts = q = q_rows = None
        plain = rows is not None
        if plain and num_draft_tokens is not None:
            plain = (counts := _exact(num_draft_tokens, _I64, (b,))) is not None
        if plain and draft_probs is not None:
            q = _exact(draft_probs, _F32, (_rows_of(draft_probs), v))
            q_rows = _exact(draft_rows, _I64, (b, k))
            plain = q is not None and q_rows is not None
        if plain:
            if validate:
                _check_row_range("target_rows", rows, target.shape[0])
                if q is not None:
                    _check_row_range("draft_rows", q_rows, q.shape[0])
            call = _host_call(drafts, counts, target, target_name, rows, q, q_rows, b, k,
                              temperature, seed, seed_offset, uniforms, bonus_token_ids,
                              options, validate, backend, return_numpy)
            if call is not None:
                return call
    drafts_t = to_tensor("draft_token_ids", draft_token_ids)
    target_t, target_name = target_tensor(target_logits, target_probs)
    rows_t = to_tensor("target_rows", target_rows)
    counts_t = to_tensor("num_draft_tokens", num_draft_tokens)
    q_t = to_tensor("draft_probs", draft_probs)
    q_rows_t = to_tensor("draft_rows", draft_rows)
    u = to_tensor("uniforms", uniforms)
    if drafts_t is None or rows_t is None:
        raise TypeError("draft_token_ids and target_rows must be a torch.Tensor or "
                        "numpy.ndarray, got None")
    if validate:
        check_rows(drafts_t, target_t, target_name, rows_t, counts_t, q_t, q_rows_t, u)
    device = target_t.device
    return _call(
        drafts=drafts_t.to(device=device, dtype=torch.int64),
        counts=None if counts_t is None else counts_t.to(device=device, dtype=torch.int64),
        target=target_t, target_name=target_name,
        rows=rows_t.to(device=device, dtype=torch.int64), q=q_t,
        q_rows=None if q_rows_t is None else q_rows_t.to(device=device, dtype=torch.int64),
        temperature=temperature, seed=seed, seed_offset=seed_offset, uniforms=u,
        bonus=bonus_token_ids, options=options, rule=_rule(options, temperature),
        validate=validate, backend=backend, host=False, return_numpy=return_numpy)


def _rows_of(x: Any) -> int:
    shape = getattr(x, "shape", ())
    return int(shape[0]) if len(shape) == 2 else -1


def _check_row_range(name: str, rows: Any, n_rows: int) -> None:
    """Row indices inside the array they point into (one device sync on accelerators)."""
    if rows.numel() if isinstance(rows, torch.Tensor) else rows.size:
        low, high = int(rows.min()), int(rows.max())
        if low < 0 or high >= n_rows:
            raise ValueError(f"{name} must index rows in [0, {n_rows}), got values in "
                             f"[{low}, {high}]")


def check_rows(drafts: torch.Tensor, target: torch.Tensor, target_name: str,
               rows: torch.Tensor, counts: torch.Tensor | None, q: torch.Tensor | None,
               q_rows: torch.Tensor | None, explicit_u: torch.Tensor | None) -> None:
    """Checks of the rows layout: shapes, dtypes, devices, and the maps' ranges."""
    require_rank("draft_token_ids", drafts, 2, "[B, K]")
    require_int("draft_token_ids", drafts)
    require_rank(target_name, target, 2, "[R, V] (flat rows)")
    require_float(target_name, target)
    if target.shape[1] < 1:
        raise ValueError(f"{target_name} has an empty vocabulary dimension")
    b, k = drafts.shape
    require_rank("target_rows", rows, 2, "[B, K+1]")
    require_int("target_rows", rows)
    if tuple(rows.shape) != (b, k + 1):
        raise ValueError(f"target_rows must have shape (B, K+1) = {(b, k + 1)}, got "
                         f"{tuple(rows.shape)}")
    _check_counts(counts, b)
    if q is not None:
        require_rank("draft_probs", q, 2, "[Rq, V] (flat rows)")
        require_float("draft_probs", q)
        if q.shape[1] != target.shape[1]:
            raise ValueError(f"draft_probs must have V = {target.shape[1]} columns, got "
                             f"{q.shape[1]}")
        require_rank("draft_rows", q_rows, 2, "[B, K]")
        require_int("draft_rows", q_rows)
        if tuple(q_rows.shape) != (b, k):
            raise ValueError(f"draft_rows must have shape (B, K) = {(b, k)}, got "
                             f"{tuple(q_rows.shape)}")
    _check_uniforms_shape(explicit_u, b, k, "K+1")
    require_same_device({"draft_token_ids": drafts, target_name: target, "target_rows": rows,
                         "num_draft_tokens": counts, "draft_probs": q, "draft_rows": q_rows,
                         "uniforms": explicit_u})
    _check_row_range("target_rows", rows, target.shape[0])
    if q is not None:
        _check_row_range("draft_rows", q_rows, q.shape[0])


# -------------------------------------------------------------------------------- tree


def parse_tree(node_token_ids: ArrayLike, parents: ArrayLike, target_logits: ArrayLike | None,
               target_probs: ArrayLike | None, draft_probs: ArrayLike | None, children: Any,
               num_nodes: ArrayLike | None, max_depth: Any, temperature: Any, seed: Any,
               seed_offset: Any, uniforms: ArrayLike | None, options: VerifyOptions,
               backend: str, validate: Any) -> TreeCall:
    """A token tree: ``[B, N]`` nodes and parents scored as ``[B, N, V]``.

    Arrays are taken as tensors (plain host arrays are viewed, not copied) on the target's
    device; under ``validate`` their structure is checked with the error naming the argument.
    ``max_depth`` and the children mode are host facts, checked at every level.
    """
    if children not in CHILDREN_MODES:
        raise ValueError(f"children must be one of {CHILDREN_MODES}, got {children!r}")
    tokens = to_tensor("node_token_ids", node_token_ids)
    tree_parents = to_tensor("parents", parents)
    target, target_name = target_tensor(target_logits, target_probs)
    q = to_tensor("draft_probs", draft_probs)
    counts = to_tensor("num_nodes", num_nodes)
    u = to_tensor("uniforms", uniforms)
    if tokens is None or tree_parents is None:
        raise TypeError("node_token_ids and parents must be a torch.Tensor or numpy.ndarray, "
                        "got None")
    mode = _children_mode(children, q)
    if validate:
        check_tree_structure(tokens, tree_parents, target, target_name, q, counts, u)
    b, n = tokens.shape
    v = target.shape[-1]
    device = target.device
    counts = (torch.full((b,), n, dtype=torch.int64, device=device) if counts is None
              else counts.to(device=device, dtype=torch.int64))
    return TreeCall(
        tokens.to(device=device, dtype=torch.int64),
        tree_parents.to(device=device, dtype=torch.int64), counts, target.reshape(b * n, v),
        target_name, None if q is None else q.reshape(b * n, v), mode, temperature, seed,
        seed_offset, u, _tree_width(max_depth, n), options, _rule(options, temperature),
        validate, backend, type(node_token_ids) is not torch.Tensor)


def _children_mode(children: str, q: torch.Tensor | None) -> Children:
    """``children`` resolved against ``draft_probs``; a mismatch names both arguments."""
    if children == "auto":  # not a method: the children mode
        return "deterministic" if q is None else "iid"
    if children == "deterministic" and q is not None:
        raise ValueError("children='deterministic' reads no draft_probs: pass draft_probs=None, "
                         "or say how the children were drawn ('iid', 'without_replacement')")
    if children != "deterministic" and q is None:
        raise ValueError(f"children={children!r} needs draft_probs (the rows the children were "
                         "drawn from); without them the children are 'deterministic'")
    return children  # type: ignore[return-value]


def _tree_width(max_depth: Any, n: int) -> int:
    """``W = max_depth + 1`` (``N`` by default). A free host check at every level: no path is
    deeper than ``N - 1``, and a larger value would only size the result (a corrupted argument
    would allocate ``[B, max_depth + 1]`` arrays)."""
    depth = optional_count("max_depth", max_depth)
    require_at_most("max_depth", depth, n - 1,
                    f"no path of a tree of N = {n} nodes is deeper than N - 1")
    return n if depth is None else depth + 1
