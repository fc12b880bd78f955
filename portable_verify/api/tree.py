"""The tree front door: ``verify_tree`` on ``[B, N]`` token trees scored as ``[B, N, V]``."""

from __future__ import annotations

from portable_verify.api.call import decide_tree
from portable_verify.api.parse import parse_tree, read_options
from portable_verify.core.arguments import ArrayLike
from portable_verify.core.methods import TREE
from portable_verify.core.tree import TreeResult
from portable_verify.core.types import DEFAULT_TYPICAL, VerifyOptions


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
    validate: bool | str = True,
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
        method: ``"auto"``/``"rejection"`` (exact, token by token from the root),
            ``"typical"`` (Medusa, lossy) or ``"greedy"`` (docs/semantics.md, "Trees").
        temperature, seed, seed_offset: as for :func:`portable_verify.verify`.
        uniforms: float32 ``[B, N]`` in (0, 1]: node ``i``'s in column ``i - 1``, the final
            draw's in column ``N - 1`` (overrides ``seed``).
        num_nodes: int ``[B]`` in ``[1, N]`` (default N): nodes at or beyond it are not read.
        max_depth: the deepest path (default ``N - 1``): the result has ``W = max_depth + 1``
            columns, known without reading the tree.
        typical_eps, typical_alpha, options: the typical-acceptance options, or the method and
            its parameters as one :class:`VerifyOptions`, as for ``verify``.
        validate: True checks every argument (one host transfer, or on the walk of a backend
            that checks the rows it reads); ``"full"`` checks every row below ``num_nodes``
            whatever the backend; False skips the checks.
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
    opts = read_options(method, typical_eps, typical_alpha, options, backend, validate, TREE)
    return decide_tree(parse_tree(node_token_ids, parents, target_logits, target_probs,
                                  draft_probs, children, num_nodes, max_depth, temperature, seed,
                                  seed_offset, uniforms, opts, backend, validate))
