"""The tail every front door shares: flat rows plus row maps in, a :class:`VerifyResult` out.

A front door (padded :func:`~portable_verify.verify`, ragged
:func:`~portable_verify.verify_ragged`) only turns its layout into a :class:`CallLayout`; the
rules that are the same for both (methods, temperatures, seeds, value checks, ``-1`` drafts,
caller bonus tokens, the result's array type) live here once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from portable_verify import dispatch
from portable_verify.core import arguments, rng
from portable_verify.core.arguments import ArrayLike, to_tensor
from portable_verify.core.types import (
    DEFAULT_TYPICAL,
    INVALID_DRAFT_TOKEN_ID,
    METHODS,
    TypicalParams,
    VerifyInputs,
    VerifyResult,
)
from portable_verify.core.validation import (
    ValueChecks,
    check_ids,
    check_logits,
    check_probs,
    require_int,
    require_rank,
)


@dataclass(frozen=True)
class CallLayout:
    """One call's tensors as every backend reads them: flat target rows plus row maps.

    ``counts`` and ``rows`` follow the caller's draft counts; a ``-1`` draft shortens a count
    afterwards (:func:`effective_counts`) without changing the row maps: the rows of positions up
    to the caller's count are already the right ones.
    """

    drafts: torch.Tensor  # int64 [B, K]
    counts: torch.Tensor  # int64 [B]: the caller's draft counts
    target: torch.Tensor  # float [R, V]
    target_name: str  # the caller's argument, for messages: target_logits / target_probs
    rows: torch.Tensor  # int64 [B, K+1]
    draft_probs: torch.Tensor | None  # float [Rq, V]
    draft_rows: torch.Tensor | None  # int64 [B, K]


@dataclass(frozen=True)
class CallOptions:
    """The keyword arguments both front doors take, as given by the caller."""

    method: str = "auto"
    temperature: float | ArrayLike | None = None
    seed: int | ArrayLike | None = None
    seed_offset: int | ArrayLike | None = None
    uniforms: ArrayLike | None = None
    typical: TypicalParams = DEFAULT_TYPICAL
    bonus_token_ids: ArrayLike | None = None
    backend: str = "auto"
    validate: bool | str = True  # True, False or "full"


def target_argument(
    target_logits: ArrayLike | None, target_probs: ArrayLike | None
) -> tuple[torch.Tensor, str]:
    """The one target tensor given, and the name of the argument that carried it."""
    logits = to_tensor("target_logits", target_logits)
    probs = to_tensor("target_probs", target_probs)
    if (logits is None) == (probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    if logits is not None:
        return logits, "target_logits"
    return probs, "target_probs"


def check_options(options: CallOptions) -> None:
    """Host-only checks of the options both front doors share (before any tensor work)."""
    if options.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {options.method!r}")
    if not isinstance(options.backend, str):
        raise TypeError(f"backend must be a backend name (str), got {options.backend!r}")
    if not (isinstance(options.validate, bool) or options.validate == "full"):
        raise TypeError(f"validate must be True, False or \"full\", got {options.validate!r}")


def sampled_method(method: str) -> str:
    """The rule sampled rows follow: ``auto`` (and ``greedy``, whose rows never sample) mean
    rejection sampling."""
    return method if method in ("typical", "block") else "rejection"


def effective_counts(drafts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each request's draft count cut at its first ``-1`` (no proposal): a fresh int64 ``[B]``.

    The position of the first ``-1`` then plays the bonus position's part: its token is drawn
    from the target there (argmax for greedy rows), exactly as if the drafts had ended there.
    """
    k = drafts.shape[1]
    if drafts.device.type == "cpu" and k > 0:  # numpy: a fifth of torch's per-op cost
        d, c, at = drafts.numpy(), counts.numpy(), np.arange(k)
        invalid = (d == INVALID_DRAFT_TOKEN_ID) & (at < c[:, None])
        return torch.from_numpy(np.minimum(c, np.where(invalid, at, k).min(1, initial=k)))
    pos = torch.arange(k, device=drafts.device)
    invalid = (drafts == INVALID_DRAFT_TOKEN_ID) & (pos < counts.unsqueeze(1))
    first_invalid = torch.where(invalid, pos, k).amin(dim=1) if k > 0 else counts
    return torch.minimum(counts, first_invalid)


def decide(layout: CallLayout, options: CallOptions, return_numpy: bool) -> VerifyResult:
    """Check values, pick the backend, run it, and shape the result."""
    drafts, target = layout.drafts, layout.target
    counts = effective_counts(drafts, layout.counts)
    b, k = drafts.shape
    device = target.device
    if options.method == "greedy":
        temps = torch.zeros(b, dtype=torch.float32, device=device)
        all_greedy, none_greedy = True, False
    else:
        temps, all_greedy, none_greedy = arguments.temperatures(
            options.temperature, b, device,
            has_probs=layout.target_name == "target_probs", validate=options.validate)
    explicit_u = to_tensor("uniforms", options.uniforms)
    u = None
    if not all_greedy:
        if explicit_u is not None:
            u = explicit_u.to(torch.float32)
        else:
            seeds = arguments.request_seeds(options.seed, b, device, options.validate)
            offsets = arguments.request_offsets(options.seed_offset, b, device, options.validate)
            u = rng.uniforms_torch(seeds, offsets, k + 1)
    bonus = _bonus_argument(options.bonus_token_ids, b, device, options.validate)
    method = sampled_method(options.method)
    backend = dispatch.select_backend(options.backend, device.type,
                                      None if all_greedy else method)
    # The default level rides on the passes of a backend that checks what it reads; "full"
    # (and any other backend) scans every row here first. Block verification's backward scan
    # reads a data-dependent set of rows: it is checked here too (docs/semantics.md).
    rides = (options.validate is True and backend.traits.checks_what_it_reads
             and method != "block")
    if options.validate:
        _check_values(layout, counts, temps, u if explicit_u is not None else None, bonus,
                      scan_rows=not rides)
    inputs = VerifyInputs(
        draft_token_ids=drafts,
        num_draft_tokens=counts,
        target=target,
        target_rows=layout.rows,
        target_is_logits=layout.target_name == "target_logits",
        draft_probs=layout.draft_probs,
        draft_rows=layout.draft_rows,
        temperature=temps,
        all_greedy=all_greedy,
        none_greedy=none_greedy,
        sampled_method=method,
        uniforms=u,
        typical=options.typical,
        check_read_values=rides,
    )
    tokens, accepted = dispatch.run(backend, inputs)
    if bonus is not None:
        # The caller's own bonus draw replaces ours where every (valid) draft was accepted.
        at = accepted.unsqueeze(1)
        all_accepted = accepted.eq(layout.counts)  # never true for a row cut by a -1
        tokens.scatter_(1, at, torch.where(all_accepted, bonus,
                                           tokens.gather(1, at).squeeze(1)).unsqueeze(1))
    result = VerifyResult(tokens, accepted, accepted + 1, counts)
    if return_numpy:
        result = VerifyResult(*(t.cpu().numpy() for t in (tokens, accepted, accepted + 1, counts)))
    return result


def _bonus_argument(bonus: ArrayLike | None, b: int, device: torch.device,
                    validate: bool) -> torch.Tensor | None:
    t = to_tensor("bonus_token_ids", bonus)
    if t is None:
        return None
    if t.dim() == 2 and t.shape[1:] == (1,):  # vLLM's [B, 1] layout
        t = t[:, 0]
    if validate:
        require_int("bonus_token_ids", t)
        require_rank("bonus_token_ids", t, 1, "[B] (or [B, 1])")
        if t.shape[0] != b:
            raise ValueError(f"bonus_token_ids has {t.shape[0]} entries, expected B = {b}")
        if t.device != device:
            raise ValueError(f"bonus_token_ids is on {t.device}, the target on {device}")
    return t.to(device=device, dtype=torch.int64)


def _check_values(layout: CallLayout, read_counts: torch.Tensor, temps: torch.Tensor,
                  explicit_u: torch.Tensor | None, bonus: torch.Tensor | None,
                  scan_rows: bool = True) -> None:
    """Value checks, evaluated with one host transfer; see docs/semantics.md (Validation).

    ``scan_rows=False`` leaves out the scans of the target and draft rows: the backend checks
    what its decision reads on the way (``VerifyInputs.check_read_values``).
    """
    drafts, counts, target = layout.drafts, layout.counts, layout.target
    k = drafts.shape[1]
    v = target.shape[-1]
    checks = ValueChecks()
    if not scan_rows and target.device.type == "cpu":
        # Only [B, K]-sized checks are left: numpy's per-op cost is a fifth of torch's.
        drafts, counts, temps, read_counts = (t.numpy() for t in (drafts, counts, temps,
                                                                  read_counts))
        explicit_u = None if explicit_u is None else explicit_u.numpy()
        bonus = None if bonus is None else bonus.numpy()
    checks.add(
        ((counts < 0) | (counts > k)).any(),
        lambda: f"num_draft_tokens must lie in [0, K={k}], got {counts.tolist()}",
    )
    bad_t = ~((temps >= 0) & (temps < float("inf")))
    checks.add(bad_t.any(),
               lambda: f"temperature must be finite and >= 0, got {temps.tolist()}")
    if layout.target_name == "target_probs":
        rescaled = (temps != 0) & (temps != 1)
        checks.add(rescaled.any(), lambda: "temperature cannot be applied to target_probs (only "
                   f"0 = greedy or 1 per row); pass target_logits. Got {temps.tolist()}")
    pos = (np.arange(k) if isinstance(drafts, np.ndarray)
           else torch.arange(k, device=drafts.device))
    used = read_counts[:, None] > pos[None, :]  # position j < n: its id is read
    check_ids(checks, "draft_token_ids", drafts, used, v)
    if scan_rows:
        used_rows = torch.zeros(target.shape[0], dtype=torch.bool, device=target.device)
        used_rows[layout.rows.clamp(0, target.shape[0] - 1).reshape(-1)] = True
        if layout.target_name == "target_logits":
            check_logits(checks, layout.target_name, target, used_rows)
        else:
            check_probs(checks, layout.target_name, target, used_rows)
        if layout.draft_probs is not None and layout.draft_rows is not None:
            used_q = torch.zeros(layout.draft_probs.shape[0], dtype=torch.bool,
                                 device=target.device)
            used_q[layout.draft_rows[used]] = True
            check_probs(checks, "draft_probs", layout.draft_probs, used_q)
    if explicit_u is not None:
        bad_u = ~((explicit_u > 0) & (explicit_u <= 1))
        checks.add(bad_u.any(), lambda: "uniforms must lie in (0, 1] (and not be NaN)")
    if bonus is not None:
        every = (np.ones(bonus.shape, dtype=bool) if isinstance(bonus, np.ndarray)
                 else torch.ones_like(bonus, dtype=torch.bool))
        check_ids(checks, "bonus_token_ids", bonus, every, v)
    checks.raise_first()
