"""The tail every front door shares: a :class:`VerifyCall` in, a :class:`VerifyResult` out.

The parser (``api/parse.py``) reads a call's arguments; this module picks the backend and runs
it. A call in plain host form goes straight to a backend that decides such calls itself
(``traits.host_calls``: the compiled CPU kernel, which also checks what it reads and derives
the uniforms). Every other call is completed here into the :class:`VerifyInputs` every backend
reads: row maps, draft counts cut at ``-1``, temperatures, uniforms, value checks in one host
transfer, and the caller's bonus tokens afterwards. These rules exist once, for every layout.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from portable_verify import dispatch
from portable_verify.backends.base import Backend
from portable_verify.core import arguments, layout, methods, rng
from portable_verify.core.arguments import ArrayLike, to_tensor
from portable_verify.core.tree import TreeCall, TreeInputs, TreeResult
from portable_verify.core.tree_validation import check_tree_inputs
from portable_verify.core.types import (
    INVALID_DRAFT_TOKEN_ID,
    HostTensorResult,
    VerifyCall,
    VerifyInputs,
    VerifyResult,
)
from portable_verify.core.validation import (
    ValueChecks,
    check_ids,
    check_logits,
    check_probs,
    check_temperatures,
    check_uniforms,
    require_int,
    require_rank,
    rows_read,
)


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


def decide(call: VerifyCall) -> VerifyResult:
    """Pick the backend for ``call``, run it, and shape the result. Public as
    ``pv.verify_call``: engines' seams hand it the call they described (``lean_calls``)."""
    host = call.host
    backend = dispatch.select_backend(call.backend, "cpu" if host else call.target.device.type,
                                      call.rule)
    if call.validate is False and backend.traits.lean_calls:
        return _decide_lean(call, backend)
    if host and backend.traits.host_calls and call.validate != "full":
        out = dispatch.run_call(backend, call)
        if out is not None:
            if call.return_numpy:
                return VerifyResult._of(*out)
            return HostTensorResult.of_host(*out)
    return _decide_inputs(_tensors(call), backend)


def _decide_lean(call: VerifyCall, backend: Backend) -> VerifyResult:
    """An unvalidated call on a backend that computes the maps, cuts, temperatures and
    uniforms on its device from the caller's arrays (``traits.lean_calls``): no torch op here."""
    device_type = "cpu" if call.host else call.target.device.type
    if backend.torch_device_type() != device_type:
        raise ValueError(f"backend={backend.qualified_name!r} runs on "
                         f"{backend.torch_device_type()} tensors; the inputs are on "
                         f"{device_type}")
    out = backend.run_lean(call)
    if call.return_numpy:
        out = tuple(t.cpu().numpy() for t in out)
    return VerifyResult._of(*out)


def lean_backend(name: str, device_type: str, rule: str | None) -> Backend | None:
    """The backend ``name`` resolves to when it decides unvalidated calls from the caller's
    arrays (``traits.lean_calls``), else None: engines' seams and the flat door describe
    their layout for it (``core.layout.FlatLayout``) instead of building row maps."""
    backend = dispatch.select_backend(name, device_type, rule)
    return backend if backend.traits.lean_calls else None


def lean_calls(backend: str, device_type: str, rule: str | None) -> bool:
    """Public (``pv.lean_calls``): whether ``backend`` on ``device_type`` tensors decides
    unvalidated calls from the caller's arrays. An engine's seam then hands
    :func:`decide` (``pv.verify_call``) a ``VerifyCall`` whose ``FlatLayout`` describes its
    layout, instead of building row maps for ``pv.verify_rows``. One selector lookup: cheap
    enough for every engine step."""
    return lean_backend(backend, device_type, rule) is not None


def _tensors(call: VerifyCall) -> VerifyCall:
    """``call`` with torch tensors and explicit row maps (host arrays are viewed, not copied)."""
    if not call.host and call.rows is not None and call.counts is not None and (
            call.draft_probs is None or call.draft_rows is not None):
        return call  # complete already (an engine's call without counts gets them below)
    drafts = to_tensor("draft_token_ids", call.drafts)
    target = to_tensor(call.target_name, call.target)
    target = target.reshape(-1, target.shape[-1])  # flat rows (a view)
    device = target.device
    drafts = drafts.to(device=device, dtype=torch.int64)
    b, k = drafts.shape
    counts = to_tensor("num_draft_tokens", call.counts)
    if counts is None:
        counts = torch.full((b,), k, dtype=torch.int64, device=device)
    rows = to_tensor("target_rows", call.rows)
    if rows is None:
        rows = (torch.from_numpy(layout.padded_target_rows(counts.numpy(), k))
                if device.type == "cpu" else layout.padded_target_rows(counts, k))
    q = to_tensor("draft_probs", call.draft_probs)
    q_rows = to_tensor("draft_rows", call.draft_rows)
    if q is not None and q_rows is None:
        q_rows = (torch.from_numpy(layout.padded_draft_rows(b, k, counts.numpy()))
                  if device.type == "cpu" else layout.padded_draft_rows(b, k, counts))
    u = to_tensor("uniforms", call.uniforms)
    return dataclasses.replace(call, drafts=drafts, counts=counts, target=target, rows=rows,
                               draft_probs=q, draft_rows=q_rows, uniforms=u, host=False)


def _decide_inputs(call: VerifyCall, backend: Backend) -> VerifyResult:
    """The general path: complete the call into :class:`VerifyInputs`, check, run."""
    drafts, target, options = call.drafts, call.target, call.options
    counts = effective_counts(drafts, call.counts)
    b, k = drafts.shape
    device = target.device
    explicit_u = call.uniforms
    temps, all_greedy, none_greedy, u = randomness(call, b, k + 1, device)
    bonus = _bonus_argument(call.bonus, b, device, call.validate)
    # The default level rides on the passes of a backend that checks what it reads; "full"
    # (and any other backend) scans every row here first. A method whose rows read depend on the
    # data (block's backward scan) is checked here too (docs/semantics.md).
    rides = (call.validate is True and backend.traits.checks_what_it_reads
             and not methods.reads_rows_by_data(call.rule))
    if call.validate:
        _check_values(call, counts, temps, u if explicit_u is not None else None, bonus,
                      scan_rows=not rides)
    inputs = VerifyInputs(
        draft_token_ids=drafts,
        num_draft_tokens=counts,
        target=target,
        target_rows=call.rows,
        target_is_logits=call.is_logits,
        draft_probs=call.draft_probs,
        draft_rows=call.draft_rows,
        temperature=temps,
        all_greedy=all_greedy,
        none_greedy=none_greedy,
        uniforms=u,
        options=options,
        check_read_values=rides,
    )
    tokens, accepted = dispatch.run(backend, inputs)
    if bonus is not None:
        # The caller's own bonus draw replaces ours where every (valid) draft was accepted.
        at = accepted.unsqueeze(1)
        all_accepted = accepted.eq(call.counts)  # never true for a row cut by a -1
        tokens.scatter_(1, at, torch.where(all_accepted, bonus,
                                           tokens.gather(1, at).squeeze(1)).unsqueeze(1))
    result = VerifyResult(tokens, accepted, accepted + 1, counts)
    if call.return_numpy:
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


def _check_values(call: VerifyCall, read_counts: torch.Tensor, temps: torch.Tensor,
                  explicit_u: torch.Tensor | None, bonus: torch.Tensor | None,
                  scan_rows: bool = True) -> None:
    """Value checks, evaluated with one host transfer; see docs/semantics.md (Validation).

    ``scan_rows=False`` leaves out the scans of the target and draft rows: the backend checks
    what its decision reads on the way (``VerifyInputs.check_read_values``).
    """
    drafts, counts, target = call.drafts, call.counts, call.target
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
    check_temperatures(checks, temps, call.target_name)
    pos = (np.arange(k) if isinstance(drafts, np.ndarray)
           else torch.arange(k, device=drafts.device))
    used = read_counts[:, None] > pos[None, :]  # position j < n: its id is read
    check_ids(checks, "draft_token_ids", drafts, used, v)
    if scan_rows:
        # Rows at positions j <= n (n cut at the first -1): the bonus row, never those after.
        read = torch.arange(k + 1, device=target.device)[None, :] <= read_counts[:, None]
        used_rows = rows_read(target.shape[0], call.rows, read)
        if call.target_name == "target_logits":
            check_logits(checks, call.target_name, target, used_rows)
        else:
            check_probs(checks, call.target_name, target, used_rows)
        if call.draft_probs is not None and call.draft_rows is not None:
            used_q = rows_read(call.draft_probs.shape[0], call.draft_rows, used)
            check_probs(checks, "draft_probs", call.draft_probs, used_q)
    if explicit_u is not None:
        check_uniforms(checks, explicit_u)
    if bonus is not None:
        every = (np.ones(bonus.shape, dtype=bool) if isinstance(bonus, np.ndarray)
                 else torch.ones_like(bonus, dtype=torch.bool))
        check_ids(checks, "bonus_token_ids", bonus, every, v)
    checks.raise_first()


def randomness(call: VerifyCall | TreeCall, b: int, columns: int, device: torch.device
               ) -> tuple[torch.Tensor, bool, bool, torch.Tensor | None]:
    """``(temperatures [B], all_greedy, none_greedy, uniforms [B, columns] or None)`` of a call
    of either layout: the caller's uniforms, else the counter-hash streams of its seeds and
    offsets (docs/semantics.md, "Randomness")."""
    if call.options.sampled_method is None:  # every row greedy (the table's rule: none)
        return torch.zeros(b, dtype=torch.float32, device=device), True, False, None
    temps, all_greedy, none_greedy = arguments.temperatures(
        call.temperature, b, device, has_probs=call.target_name == "target_probs",
        validate=call.validate)
    if all_greedy:
        return temps, True, none_greedy, None
    if call.uniforms is not None:
        return temps, False, none_greedy, call.uniforms.to(device=device, dtype=torch.float32)
    seeds = arguments.request_seeds(call.seed, b, device, call.validate)
    offsets = arguments.request_offsets(call.seed_offset, b, device, call.validate)
    return temps, False, none_greedy, rng.uniforms_torch(seeds, offsets, columns)


def decide_tree(call: TreeCall) -> TreeResult:
    """The tree tail: the same selector, randomness, checks and error protocol as a chain call.

    ``validate=True`` rides on the walk of a backend that checks the rows it reads
    (``traits.checks_tree_reads``); any other backend, and ``validate="full"``, get every value
    check first, in one host transfer (docs/semantics.md, "Trees", validation).
    """
    b, n = call.node_token_ids.shape
    device = call.target.device
    backend = dispatch.select_backend(call.backend, device.type, call.rule, methods.TREE)
    temps, all_greedy, none_greedy, u = randomness(call, b, n, device)
    rides = call.validate is True and backend.traits.checks_tree_reads
    inputs = TreeInputs(
        node_token_ids=call.node_token_ids, parents=call.parents, num_nodes=call.num_nodes,
        target=call.target, target_is_logits=call.target_name == "target_logits",
        draft_probs=call.draft_probs, children=call.children, temperature=temps,
        all_greedy=all_greedy, none_greedy=none_greedy, uniforms=u, width=call.width,
        options=call.options, check_read_values=rides)
    if call.validate and not rides:
        check_tree_inputs(inputs, explicit_uniforms=call.uniforms is not None)
    token_ids, node_ids, accepted = dispatch.run_tree(backend, inputs)
    return TreeResult.of(token_ids, node_ids, accepted, call.return_numpy)
