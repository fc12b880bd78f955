"""The public verification call: normalise and validate inputs, dispatch, shape the result."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from portable_verify.core import rng
from portable_verify.core.types import (
    DEFAULT_TYPICAL_ALPHA,
    DEFAULT_TYPICAL_EPS,
    METHODS,
    VerifyInputs,
    VerifyResult,
)
from portable_verify.core.validation import (
    ValueChecks,
    check_ids,
    check_logits,
    check_probs,
    require_float,
    require_int,
    require_rank,
    require_same_device,
)

ArrayLike = Any  # torch.Tensor | np.ndarray


def _to_tensor(name: str, x: ArrayLike | None) -> torch.Tensor | None:
    if x is None or isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _target_argument(
    target_logits: ArrayLike | None, target_probs: ArrayLike | None
) -> tuple[torch.Tensor, str]:
    """The one target tensor given, and the name of the argument that carried it."""
    logits = _to_tensor("target_logits", target_logits)
    probs = _to_tensor("target_probs", target_probs)
    if (logits is None) == (probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    if logits is not None:
        return logits, "target_logits"
    return probs, "target_probs"


def verify(
    draft_token_ids: ArrayLike,
    *,
    target_logits: ArrayLike | None = None,
    target_probs: ArrayLike | None = None,
    draft_probs: ArrayLike | None = None,
    method: str = "auto",
    temperature: float | ArrayLike | None = None,
    num_draft_tokens: ArrayLike | None = None,
    seed: int | ArrayLike | None = None,
    seed_offset: int | ArrayLike | None = None,
    uniforms: ArrayLike | None = None,
    typical_eps: float = DEFAULT_TYPICAL_EPS,
    typical_alpha: float = DEFAULT_TYPICAL_ALPHA,
    backend: str = "auto",
    validate: bool = True,
) -> VerifyResult:
    """Decide how many draft tokens survive and which token comes next, for a batch of requests.

    Args:
        draft_token_ids: int ``[B, K]`` proposed tokens.
        target_logits: float ``[B, K+1, V]`` target scores; row ``K`` is the bonus position.
        target_probs: float ``[B, K+1, V]`` target probabilities (instead of logits).
        draft_probs: float ``[B, K, V]`` draft distributions, or None for a deterministic draft.
        method: ``"auto"``/``"rejection"`` (exact), ``"typical"`` (Medusa, lossy) or ``"greedy"``.
        temperature: None (=1), a float, or float ``[B]``; rows at 0 are greedy.
        num_draft_tokens: int ``[B]``; row ``i`` uses its first ``n_i <= K`` drafts.
        seed: int ``[B]`` per-request seeds, one int for the batch, or None (torch's generator).
        seed_offset: int or int ``[B]``; advance it each decoding step (default 0).
        uniforms: float32 ``[B, K+1]`` explicit random numbers in (0, 1] (overrides ``seed``).
        typical_eps, typical_alpha: the typical-acceptance threshold options.
        backend: a name from :func:`portable_verify.available_backends`, or ``"auto"``.
        validate: check every input first (one device sync); False skips all checks.

    Returns:
        :class:`VerifyResult` with ``token_ids`` int64 ``[B, K+1]`` (-1 padded), ``num_accepted``,
        ``num_emitted`` and ``num_draft_tokens`` (int64 ``[B]``), as the caller's array type.

    The rules, and every edge case, are in docs/semantics.md.

    >>> import torch, portable_verify as pv
    >>> logits = torch.tensor([[[0., 5., 1.], [9., 0., 0.], [0., 0., 3.]]])
    >>> pv.verify(torch.tensor([[1, 2]]), target_logits=logits, method="greedy").token_ids
    tensor([[1, 0, -1]])
    """
    return_numpy = not isinstance(draft_token_ids, torch.Tensor)
    drafts = _to_tensor("draft_token_ids", draft_token_ids)
    target, target_name = _target_argument(target_logits, target_probs)
    q = _to_tensor("draft_probs", draft_probs)
    counts = _to_tensor("num_draft_tokens", num_draft_tokens)
    explicit_u = _to_tensor("uniforms", uniforms)

    if validate:
        _check_structure(drafts, target, target_name, q, counts, explicit_u)
    b, k = drafts.shape
    v = target.shape[-1]
    device = target.device
    drafts = drafts.to(torch.int64)
    counts = (
        torch.full((b,), k, dtype=torch.int64, device=device)
        if counts is None
        else counts.to(torch.int64)
    )
    pos = torch.arange(k + 1, device=device)
    rows = torch.arange(b, device=device).unsqueeze(1) * (k + 1) + torch.minimum(
        pos.unsqueeze(0), counts.unsqueeze(1)
    )
    draft_rows = None
    if q is not None:
        draft_rows = torch.arange(b, device=device).unsqueeze(1) * k + pos[:k].unsqueeze(0)
    return _run(
        drafts=drafts,
        counts=counts,
        target=target.reshape(b * (k + 1), v),
        target_name=target_name,
        rows=rows,
        draft_probs=None if q is None else q.reshape(b * k, v),
        draft_rows=draft_rows,
        method=method,
        temperature=temperature,
        seed=seed,
        seed_offset=seed_offset,
        explicit_u=explicit_u,
        typical_eps=typical_eps,
        typical_alpha=typical_alpha,
        backend=backend,
        validate=validate,
        return_numpy=return_numpy,
    )


def _check_structure(
    drafts: torch.Tensor,
    target: torch.Tensor,
    target_name: str,
    q: torch.Tensor | None,
    counts: torch.Tensor | None,
    explicit_u: torch.Tensor | None,
) -> None:
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
    if target.shape[2] < 1:
        raise ValueError(f"{target_name} has an empty vocabulary dimension")
    if q is not None:
        require_rank("draft_probs", q, 3, "[B, K, V]")
        require_float("draft_probs", q)
        if tuple(q.shape) != (b, k, target.shape[2]):
            raise ValueError(
                f"draft_probs must have shape (B, K, V) = {(b, k, target.shape[2])}, "
                f"got {tuple(q.shape)}"
            )
    if counts is not None:
        require_rank("num_draft_tokens", counts, 1, "[B]")
        require_int("num_draft_tokens", counts)
        if counts.shape[0] != b:
            raise ValueError(f"num_draft_tokens has {counts.shape[0]} entries, expected B = {b}")
    if explicit_u is not None:
        require_rank("uniforms", explicit_u, 2, "[B, K+1]")
        require_float("uniforms", explicit_u)
        if tuple(explicit_u.shape) != (b, k + 1):
            raise ValueError(
                f"uniforms must have shape (B, K+1) = {(b, k + 1)}, got {tuple(explicit_u.shape)}"
            )
    require_same_device(
        {
            "draft_token_ids": drafts,
            target_name: target,
            "draft_probs": q,
            "num_draft_tokens": counts,
            "uniforms": explicit_u,
        }
    )


def _temperature_vector(
    temperature: float | ArrayLike | None,
    method: str,
    has_probs: bool,
    b: int,
    device: torch.device,
    validate: bool,
) -> tuple[torch.Tensor, bool, bool]:
    """float32 ``[B]`` temperatures, plus host-known ``(all_greedy, none_greedy)``."""
    if method == "greedy":
        return torch.zeros(b, dtype=torch.float32, device=device), True, False
    if temperature is None or isinstance(temperature, (int, float, np.integer, np.floating)):
        t = 1.0 if temperature is None else float(temperature)
        if validate and not t >= 0:
            raise ValueError(f"temperature must be >= 0 and not NaN, got {t}")
        if validate and has_probs and t not in (0.0, 1.0):
            raise ValueError(
                f"temperature={t} cannot be applied to target_probs; pass target_logits, or "
                "temperature 0 (greedy) / 1 / None"
            )
        return torch.full((b,), t, dtype=torch.float32, device=device), t == 0.0, t != 0.0
    tt = _to_tensor("temperature", temperature)
    if validate:
        require_rank("temperature", tt, 1, "[B]")
        require_float("temperature", tt)
        if tt.shape[0] != b:
            raise ValueError(f"temperature has {tt.shape[0]} entries, expected B = {b}")
        require_same_device({"temperature": tt, "target": torch.empty(0, device=device)})
    return tt.to(device=device, dtype=torch.float32), False, False


def _uniforms(
    seed: int | ArrayLike | None,
    seed_offset: int | ArrayLike | None,
    explicit_u: torch.Tensor | None,
    b: int,
    k: int,
    device: torch.device,
    validate: bool,
) -> torch.Tensor:
    if explicit_u is not None:
        return explicit_u.to(torch.float32)
    if seed is None:
        seeds = torch.randint(0, 2**62, (b,), dtype=torch.int64, device=device)
    elif isinstance(seed, (int, np.integer)):
        seeds = rng.row_seeds(int(seed), torch.arange(b, dtype=torch.int64, device=device))
    else:
        seeds = _to_tensor("seed", seed)
        if validate:
            require_int("seed", seeds)
            require_rank("seed", seeds, 1, "[B]")
            if seeds.shape[0] != b:
                raise ValueError(f"seed has {seeds.shape[0]} entries, expected B = {b}")
            require_same_device({"seed": seeds, "target": torch.empty(0, device=device)})
        seeds = seeds.to(device=device, dtype=torch.int64)
    if seed_offset is None or isinstance(seed_offset, (int, np.integer)):
        offsets = torch.full((b,), int(seed_offset or 0), dtype=torch.int64, device=device)
    else:
        offsets = _to_tensor("seed_offset", seed_offset)
        if validate:
            require_int("seed_offset", offsets)
            require_rank("seed_offset", offsets, 1, "[B]")
            if offsets.shape[0] != b:
                raise ValueError(f"seed_offset has {offsets.shape[0]} entries, expected B = {b}")
            require_same_device({"seed_offset": offsets, "target": torch.empty(0, device=device)})
        offsets = offsets.to(device=device, dtype=torch.int64)
    return rng.uniforms_torch(seeds, offsets, k + 1)


def _run(
    *,
    drafts: torch.Tensor,
    counts: torch.Tensor,
    target: torch.Tensor,
    target_name: str,
    rows: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_rows: torch.Tensor | None,
    method: str,
    temperature: float | ArrayLike | None,
    seed: int | ArrayLike | None,
    seed_offset: int | ArrayLike | None,
    explicit_u: torch.Tensor | None,
    typical_eps: float,
    typical_alpha: float,
    backend: str,
    validate: bool,
    return_numpy: bool,
) -> VerifyResult:
    """Shared tail of the padded and ragged calls: flat rows + row maps in, result out."""
    from portable_verify.dispatch import select_backend

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    b, k = drafts.shape
    device = target.device
    temps, all_greedy, none_greedy = _temperature_vector(
        temperature, method, target_name == "target_probs", b, device, validate
    )
    u = None if all_greedy else _uniforms(seed, seed_offset, explicit_u, b, k, device, validate)
    if validate:
        _check_values(drafts, counts, target, target_name, rows, draft_probs, draft_rows, temps, u,
                      explicit_u is not None)
    inputs = VerifyInputs(
        draft_token_ids=drafts,
        num_draft_tokens=counts,
        target=target,
        target_rows=rows,
        target_is_logits=target_name == "target_logits",
        draft_probs=draft_probs,
        draft_rows=draft_rows,
        temperature=temps,
        all_greedy=all_greedy,
        none_greedy=none_greedy,
        sampled_method="typical" if method == "typical" else "rejection",
        uniforms=u,
        typical_eps=float(typical_eps),
        typical_alpha=float(typical_alpha),
    )
    chosen = select_backend(backend, device.type)
    if chosen.array_kind == "numpy":
        tokens, accepted = chosen.run(inputs.numpy())
        tokens = torch.from_numpy(np.asarray(tokens))
        accepted = torch.from_numpy(np.asarray(accepted))
    else:
        tokens, accepted = chosen.run(inputs)
    tokens = tokens.to(device=device, dtype=torch.int64)
    accepted = accepted.to(device=device, dtype=torch.int64)
    result = VerifyResult(tokens, accepted, accepted + 1, counts)
    if return_numpy:
        result = VerifyResult(*(t.cpu().numpy() for t in (tokens, accepted, accepted + 1, counts)))
    return result


def _check_values(
    drafts: torch.Tensor,
    counts: torch.Tensor,
    target: torch.Tensor,
    target_name: str,
    rows: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_rows: torch.Tensor | None,
    temps: torch.Tensor,
    u: torch.Tensor | None,
    explicit_u: bool,
) -> None:
    """Value checks, evaluated with one host transfer; see docs/semantics.md (Validation)."""
    k = drafts.shape[1]
    v = target.shape[-1]
    checks = ValueChecks()
    checks.add(
        ((counts < 0) | (counts > k)).any(),
        lambda: f"num_draft_tokens must lie in [0, K={k}], got {counts.tolist()}",
    )
    bad_t = torch.isnan(temps) | (temps < 0)
    checks.add(bad_t.any(), lambda: f"temperature must be >= 0 and not NaN, got {temps.tolist()}")
    safe_counts = counts.clamp(0, k)
    used = torch.arange(k, device=drafts.device).unsqueeze(0) < safe_counts.unsqueeze(1)
    check_ids(checks, "draft_token_ids", drafts, used, v)
    used_rows = torch.zeros(target.shape[0], dtype=torch.bool, device=target.device)
    used_rows[rows.clamp(0, target.shape[0] - 1).reshape(-1)] = True
    if target_name == "target_logits":
        check_logits(checks, target_name, target, used_rows)
    else:
        check_probs(checks, target_name, target, used_rows)
    if draft_probs is not None and draft_rows is not None:
        used_q = torch.zeros(draft_probs.shape[0], dtype=torch.bool, device=target.device)
        used_q[draft_rows[used]] = True
        check_probs(checks, "draft_probs", draft_probs, used_q)
    if u is not None and explicit_u:
        bad_u = ~((u > 0) & (u <= 1))
        checks.add(bad_u.any(), lambda: "uniforms must lie in (0, 1] (and not be NaN)")
    checks.raise_first()
