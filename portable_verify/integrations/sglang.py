"""SGLang's tree layout in and out of ``pv.verify_tree``.

SGLang (sgl-kernel ``verify_tree_greedy`` / ``tree_speculative_sampling_target_only``) stores a
request's tree as first-child / next-sibling lists over its ``N`` draft slots: slot 0 is the
root (the last verified token), ``retrive_next_token[b, c]`` is slot ``c``'s first child and
``retrive_next_sibling[b, i]`` the next sibling of slot ``i`` (-1 ends a list),
``candidates[b, i]`` slot ``i``'s token and ``retrive_index[b, i]`` its flat index
(``b * N + i``) into the flat outputs. Sibling order is list order, not slot order.

:func:`from_sglang` renumbers the slots breadth first (parents before children, siblings in
list order, so ``verify_tree``'s index order is SGLang's sibling order) and returns the
permutation; :func:`permute_rows` puts their ``[B, N, V]`` target (and draft) rows in that order;
:func:`to_sglang` turns a :class:`~portable_verify.TreeResult` back into their flat
``accept_index`` (root first) and ``predicts``. Everything is vectorised over the batch: loops
run over list positions and depths only (pointer doubling, ``log2 N`` rounds, for the lists).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portable_verify.core.tree import TreeResult


@dataclass(frozen=True)
class SGLangTree:
    """A batch of SGLang trees renumbered for ``verify_tree``."""

    node_token_ids: torch.Tensor  # int64 [B, N]; slots no list reaches are -1 nodes
    parents: torch.Tensor  # int64 [B, N]
    permutation: torch.Tensor  # int64 [B, N]: permutation[b, new] = SGLang slot
    num_reached: torch.Tensor  # int64 [B]: slots the lists reach (the root included)


def _rounds(n: int) -> int:
    return max(1, (n - 1).bit_length())


def from_sglang(retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                retrive_next_sibling: torch.Tensor, candidates: torch.Tensor) -> SGLangTree:
    """SGLang's lists as ``verify_tree``'s ``(node_token_ids, parents)`` plus the permutation.

    ``retrive_index`` is not needed to renumber (it only addresses the flat outputs); it is
    taken so the four tensors travel together and checked for its shape.
    """
    b, n = candidates.shape
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        if tuple(t.shape) != (b, n):
            raise ValueError(f"{name} must have the shape of candidates {(b, n)}, got "
                             f"{tuple(t.shape)}")
    device = candidates.device
    first = retrive_next_token.to(torch.int64)
    sibling = retrive_next_sibling.to(torch.int64)
    slots = torch.arange(n, device=device).expand(b, n)
    # Each slot's left sibling (itself for a list head), and the parent of each first child;
    # writes for "none" go to a spare column N.
    spare = torch.full((b, 1), n, dtype=torch.int64, device=device)
    has_next = (sibling >= 0) & (sibling < n)
    left = torch.cat([slots, spare], 1).scatter_(1, torch.where(has_next, sibling, n), slots)
    left = left[:, :n]
    has_child = (first >= 0) & (first < n)
    first_parent = torch.full((b, n + 1), -1, dtype=torch.int64, device=device)
    first_parent = first_parent.scatter_(1, torch.where(has_child, first, n), slots)[:, :n]
    # List ranking by pointer doubling: each slot's rank among its siblings and its first
    # sibling, whose parent is every sibling's parent.
    rank = (left != slots).to(torch.int64)
    head = left
    for _ in range(_rounds(n)):
        rank = rank + rank.gather(1, head)
        head = head.gather(1, head)
    parent = first_parent.gather(1, head)
    parent[:, 0] = -1
    # Depths by doubling over parents; slots not reached from the root keep depth -1.
    up = torch.where(parent >= 0, parent, slots)
    depth = (parent >= 0).to(torch.int64)
    for _ in range(_rounds(n)):
        depth = depth + depth.gather(1, up)
        up = up.gather(1, up)
    reached = (up == 0) & ((parent >= 0) | (slots == 0))
    depth = torch.where(reached, depth, -1)
    # Breadth first: level by level, by (new position of the parent, sibling rank).
    pos = torch.full((b, n), -1, dtype=torch.int64, device=device)
    pos[:, 0] = 0
    placed = torch.ones(b, dtype=torch.int64, device=device)
    big = n * n + n
    for d in range(1, n):
        at = depth == d
        key = torch.where(at, pos.gather(1, parent.clamp(0, n - 1)) * n + rank, big)
        order_in_level = torch.argsort(torch.argsort(key, dim=1, stable=True), dim=1)
        pos = torch.where(at, placed[:, None] + order_in_level, pos)
        placed = placed + at.sum(1)
    rest = torch.argsort(torch.argsort(torch.where(reached, big, slots), dim=1, stable=True), 1)
    pos = torch.where(reached, pos, placed[:, None] + rest)
    permutation = torch.empty_like(pos).scatter_(1, pos, slots.clone())
    new_parent = torch.where(parent >= 0, pos.gather(1, parent.clamp(0, n - 1)), 0)
    new_parent = torch.where(reached, new_parent, 0)
    new_parent[:, 0] = -1
    tokens = torch.where(reached, candidates.to(torch.int64), -1)
    return SGLangTree(tokens.gather(1, permutation), new_parent.gather(1, permutation),
                      permutation, reached.sum(1))


def permute_rows(rows: torch.Tensor, permutation: torch.Tensor) -> torch.Tensor:
    """``[B, N, ...]`` rows (SGLang's target or draft probabilities) in the renumbered order."""
    index = permutation.reshape(*permutation.shape, *([1] * (rows.dim() - 2)))
    return rows.gather(1, index.expand(*permutation.shape, *rows.shape[2:]))


def to_sglang(result: TreeResult, tree: SGLangTree, retrive_index: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(predicts [B*N], accept_index [B, W], accept_token_num [B])`` in SGLang's layout.

    ``accept_index[b]`` lists the flat indices of the root and the accepted slots, then -1;
    ``predicts[accept_index[b, k]]`` is the token that follows the ``k``-th of them (the next
    accepted token, or the final one); entries off the path are -1.
    """
    nodes, tokens = result.node_ids, result.token_ids
    b, w = nodes.shape
    slots = tree.permutation.gather(1, nodes.clamp(min=0))
    flat = retrive_index.to(torch.int64).gather(1, slots)
    accepted = result.num_accepted
    col = torch.arange(w, device=nodes.device)[None, :]
    accept_index = torch.full((b, w), -1, dtype=torch.int64, device=nodes.device)
    accept_index[:, 0] = retrive_index[:, 0]
    accept_index[:, 1:] = torch.where(col[:, : w - 1] < accepted[:, None], flat[:, : w - 1], -1)
    # Off-path entries write to a spare last slot, dropped after: no boolean mask, no sync.
    size = retrive_index.numel()
    predicts = torch.full((size + 1,), -1, dtype=torch.int64, device=nodes.device)
    slot = torch.where(col <= accepted[:, None], accept_index, size)
    predicts.scatter_(0, slot.reshape(-1), tokens.to(torch.int64).reshape(-1))
    return predicts[:size], accept_index, accepted
