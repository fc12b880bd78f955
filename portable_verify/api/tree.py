"""The tree front door: ``verify_tree`` on ``[B, N]`` token trees scored as ``[B, N, V]``."""

from __future__ import annotations

from typing import Any

import torch

from portable_verify import dispatch
from portable_verify.api.parse import read_options, target_tensor
from portable_verify.backends.base import Backend, ReadValueError
from portable_verify.core import arguments, rng
from portable_verify.core.arguments import ArrayLike, optional_count, to_tensor
from portable_verify.core.tree import CHILDREN_MODES, Children, TreeInputs, TreeResult
from portable_verify.core.tree_validation import check_tree_structure, check_tree_values
from portable_verify.core.types import DEFAULT_TYPICAL, VerifyOptions
from portable_verify.core.validation import ValueChecks, require_at_most


def verify_tree(
    node_token_ids: ArrayLike,
    parents: ArrayLike,
    *,
    target_logits: ArrayLike | None = None,
    target_probs: ArrayLike | None = None,
    draft_probs: ArrayLike | None = None,
    children: str = "auto",
    method: str = "auto",
    temperature: float | ArrayLike | None = None,
    seed: int | ArrayLike | None = None,
    seed_offset: int | ArrayLike | None = None,
    uniforms: ArrayLike | None = None,
    num_nodes: ArrayLike | None = None,
    max_depth: int | None = None,
    typical_eps: float = DEFAULT_TYPICAL.eps,
    typical_alpha: float = DEFAULT_TYPICAL.alpha,
    validate: bool = True,
    backend: str = "auto",
    options: VerifyOptions | None = None,
) -> TreeResult:
    """Pick the accepted path through a token tree and the token that follows it.

    Args:
        node_token_ids: int ``[B, N]``; node 0 is the root (not read), node ``i > 0`` proposes
            ``node_token_ids[b, i]``; ``-1``: no proposal (never accepted).
        parents: int ``[B, N]``; ``parents[b, 0] = -1`` and ``0 <= parents[b, i] < i``.
        target_logits / target_probs: float ``[B, N, V]``; row ``i`` is the target's
            distribution of the token after node ``i``'s path.
        draft_probs: float ``[B, N, V]``; row ``i`` is the distribution node ``i``'s children
            were drawn from (leaf rows are not read). None for deterministic children.
        children: ``"deterministic"``, ``"iid"``, ``"without_replacement"`` or ``"auto"``
            (deterministic without ``draft_probs``, iid with them). "auto" cannot tell a top-k
            drafter's children from sampled ones: for top-k (deterministic) children pass no
            ``draft_probs``; passing them means the children were drawn iid from those rows.
        method: ``"auto"``/``"rejection"`` (exact), ``"typical"`` or ``"greedy"``.
        temperature, seed, seed_offset: as for :func:`portable_verify.verify`.
        uniforms: float32 ``[B, N]`` in (0, 1]: node ``i``'s in column ``i - 1``, the final
            draw's in column ``N - 1`` (overrides ``seed``).
        num_nodes: int ``[B]`` in ``[1, N]`` (default N): nodes at or beyond it are not read.
        max_depth: the deepest path (default ``N - 1``): the result has ``W = max_depth + 1``
            columns, known without reading the tree.
        typical_eps, typical_alpha, options: the typical-acceptance options, or the method and
            its parameters as one :class:`VerifyOptions`, as for ``verify``.
        validate: True checks every argument (one host transfer); False skips the checks.
        backend: a backend that verifies trees, or ``"auto"``.

    Returns:
        :class:`TreeResult` (``token_ids``, ``node_ids`` int64 ``[B, W]``; ``num_accepted``,
        ``num_emitted`` int64 ``[B]``) as the caller's array type. Rules: docs/semantics.md.

    >>> import torch, portable_verify as pv
    >>> logits = torch.tensor([[[0., 5., 1.], [9., 0., 0.], [0., 0., 3.]]])
    >>> pv.verify_tree(torch.tensor([[0, 2, 1]]), torch.tensor([[-1, 0, 0]]),
    ...                target_logits=logits, method="greedy").token_ids
    tensor([[ 1,  2, -1]])
    """
    opts = read_options(method, typical_eps, typical_alpha, options, backend, validate)
    method, typical = opts.method, opts.typical
    _check_tree_options(method, children, validate)
    return_numpy = not isinstance(node_token_ids, torch.Tensor)
    tokens = to_tensor("node_token_ids", node_token_ids)
    tree_parents = to_tensor("parents", parents)
    target, target_name = target_tensor(target_logits, target_probs)
    q = to_tensor("draft_probs", draft_probs)
    counts = to_tensor("num_nodes", num_nodes)
    explicit_u = to_tensor("uniforms", uniforms)
    mode = _children_mode(children, q)
    if validate:
        check_tree_structure(tokens, tree_parents, target, target_name, q, counts, explicit_u)
    b, n = tokens.shape
    v = target.shape[-1]
    device = target.device
    width = _width(max_depth, n)
    tokens, tree_parents, counts = _on_device(tokens, tree_parents, counts, device)
    temps, all_greedy, none_greedy, u = _randomness(
        method, temperature, seed, seed_offset, explicit_u, b, n, device,
        target_name == "target_probs", validate)
    chosen = dispatch.select_tree_backend(backend, device.type)
    rides = validate and chosen.traits.checks_tree_reads  # the walk does the value checks
    checked = (tokens, tree_parents, counts, target, target_name, q, max_depth, temps, u,
               explicit_u is not None)
    inputs = TreeInputs(
        node_token_ids=tokens, parents=tree_parents, num_nodes=counts,
        target=target.reshape(b * n, v), target_is_logits=target_name == "target_logits",
        draft_probs=None if q is None else q.reshape(b * n, v), children=mode,
        temperature=temps, all_greedy=all_greedy, none_greedy=none_greedy,
        sampled_method="typical" if method == "typical" else "rejection",
        uniforms=u, width=width, typical=typical, check_read_values=rides,
    )
    token_ids, node_ids, accepted = _walk(chosen, inputs, checked, validate)
    return TreeResult.of(token_ids, node_ids, accepted, return_numpy)


def _walk(chosen: Backend, inputs: TreeInputs, checked: tuple[Any, ...],
          validate: bool) -> tuple[Any, Any, Any]:
    """Run the backend's walk. Under ``validate`` every value is checked first in one host
    transfer, unless the backend checks the rows its walk reads; a value it flags is then
    worded by the full checks."""
    if validate and not inputs.check_read_values:
        _check_values(*checked)
    try:
        return dispatch.run_tree(chosen, inputs)
    except ReadValueError:
        _check_values(*checked)
        raise ValueError("a target or draft_probs row the tree walk reads holds NaN/inf or is "
                         "not a distribution") from None


def _randomness(method: str, temperature: Any, seed: Any, seed_offset: Any,
                explicit_u: torch.Tensor | None, b: int, n: int, device: torch.device,
                has_probs: bool, validate: bool
                ) -> tuple[torch.Tensor, bool, bool, torch.Tensor | None]:
    """``(temperatures [B], all_greedy, none_greedy, uniforms [B, N] or None)``, as
    ``verify`` derives them (node ``i``'s test on counter ``2(i-1)``, the draw on counter 1)."""
    if method == "greedy":
        return torch.zeros(b, dtype=torch.float32, device=device), True, False, None
    temps, all_greedy, none_greedy = arguments.temperatures(
        temperature, b, device, has_probs=has_probs, validate=validate)
    if all_greedy:
        return temps, all_greedy, none_greedy, None
    if explicit_u is not None:
        return temps, all_greedy, none_greedy, explicit_u.to(device=device, dtype=torch.float32)
    seeds = arguments.request_seeds(seed, b, device, validate)
    offsets = arguments.request_offsets(seed_offset, b, device, validate)
    return temps, all_greedy, none_greedy, rng.uniforms_torch(seeds, offsets, n)


def _on_device(tokens: torch.Tensor, parents: torch.Tensor, counts: torch.Tensor | None,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree's int64 tensors on the target's device (``num_nodes`` defaults to N)."""
    b, n = tokens.shape
    counts = (torch.full((b,), n, dtype=torch.int64, device=device) if counts is None
              else counts.to(device=device, dtype=torch.int64))
    return (tokens.to(device=device, dtype=torch.int64),
            parents.to(device=device, dtype=torch.int64), counts)


def _check_values(tokens: torch.Tensor, parents: torch.Tensor, counts: torch.Tensor,
                  target: torch.Tensor, target_name: str, q: torch.Tensor | None,
                  max_depth: int | None, temps: torch.Tensor, u: torch.Tensor | None,
                  explicit_u: bool) -> None:
    checks = ValueChecks()
    check_tree_values(checks, tokens, parents, counts, target, target_name, q, max_depth)
    _check_temperatures_and_uniforms(checks, temps, target_name, u, explicit_u)
    checks.raise_first()


def _check_tree_options(method: str, children: str, validate: Any) -> None:
    if method == "block":
        raise ValueError("method='block' verifies chains only (pv.verify); trees take 'auto', "
                         "'rejection', 'typical' or 'greedy'")
    if children not in CHILDREN_MODES:
        raise ValueError(f"children must be one of {CHILDREN_MODES}, got {children!r}")
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be True or False, got {validate!r}")


def _children_mode(children: str, q: torch.Tensor | None) -> Children:
    """``children`` resolved against ``draft_probs``; a mismatch names both arguments."""
    if children == "auto":
        return "deterministic" if q is None else "iid"
    if children == "deterministic" and q is not None:
        raise ValueError("children='deterministic' reads no draft_probs: pass draft_probs=None, "
                         "or say how the children were drawn ('iid', 'without_replacement')")
    if children != "deterministic" and q is None:
        raise ValueError(f"children={children!r} needs draft_probs (the rows the children were "
                         "drawn from); without them the children are 'deterministic'")
    return children  # type: ignore[return-value]


def _width(max_depth: int | None, n: int) -> int:
    depth = optional_count("max_depth", max_depth)
    require_at_most("max_depth", depth, max(n - 1, 0),
                    f"no path through N = {n} nodes is deeper than N - 1")
    return n if depth is None else depth + 1


def _check_temperatures_and_uniforms(checks: ValueChecks, temps: torch.Tensor, target_name: str,
                                     u: torch.Tensor | None, explicit: bool) -> None:
    bad_t = ~((temps >= 0) & (temps < float("inf")))
    checks.add(bad_t.any(), lambda: f"temperature must be finite and >= 0, got {temps.tolist()}")
    if target_name == "target_probs":
        rescaled = (temps != 0) & (temps != 1)
        checks.add(rescaled.any(), lambda: "temperature cannot be applied to target_probs (only "
                   f"0 = greedy or 1 per row); pass target_logits. Got {temps.tolist()}")
    if explicit and u is not None:
        bad_u = ~((u > 0) & (u <= 1))
        checks.add(bad_u.any(), lambda: "uniforms must lie in (0, 1] (and not be NaN)")
