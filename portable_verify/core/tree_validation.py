"""The checks behind ``verify_tree(validate=True)``: shapes on the host, values in one transfer.

Built from core/validation.py's pieces, so a tree's messages read like the chain's.
"""

from __future__ import annotations

import torch

from portable_verify.core.tree import TreeInputs
from portable_verify.core.validation import (
    ValueChecks,
    check_ids,
    check_logits,
    check_probs,
    check_temperatures,
    check_uniforms,
    require_float,
    require_int,
    require_rank,
    require_same_device,
)


def check_tree_structure(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                         target_name: str, q: torch.Tensor | None,
                         num_nodes: torch.Tensor | None, uniforms: torch.Tensor | None) -> None:
    """Host-only checks of ranks, dtypes, shapes and devices."""
    require_rank("node_token_ids", tokens, 2, "[B, N]")
    require_int("node_token_ids", tokens)
    require_rank("parents", parents, 2, "[B, N]")
    require_int("parents", parents)
    b, n = tokens.shape
    if n < 1:
        raise ValueError("node_token_ids must hold at least the root (N >= 1), got N = 0")
    if tuple(parents.shape) != (b, n):
        raise ValueError(f"parents must have the shape of node_token_ids {(b, n)}, got "
                         f"{tuple(parents.shape)}")
    require_rank(target_name, target, 3, "[B, N, V]")
    require_float(target_name, target)
    if tuple(target.shape[:2]) != (b, n):
        raise ValueError(f"{target_name} must have shape (B, N, V) with (B, N) = {(b, n)}, got "
                         f"{tuple(target.shape)}")
    if target.shape[2] < 1:
        raise ValueError(f"{target_name} has an empty vocabulary dimension")
    if q is not None:
        require_rank("draft_probs", q, 3, "[B, N, V]")
        require_float("draft_probs", q)
        if tuple(q.shape) != tuple(target.shape):
            raise ValueError(f"draft_probs must have the shape of {target_name} "
                             f"{tuple(target.shape)}, got {tuple(q.shape)}")
    if num_nodes is not None:
        require_rank("num_nodes", num_nodes, 1, "[B]")
        require_int("num_nodes", num_nodes)
        if num_nodes.shape[0] != b:
            raise ValueError(f"num_nodes has {num_nodes.shape[0]} entries, expected B = {b}")
    if uniforms is not None:
        require_rank("uniforms", uniforms, 2, "[B, N]")
        require_float("uniforms", uniforms)
        if tuple(uniforms.shape) != (b, n):
            raise ValueError(f"uniforms must have shape (B, N) = {(b, n)}, got "
                             f"{tuple(uniforms.shape)}")
    require_same_device({"node_token_ids": tokens, "parents": parents, target_name: target,
                         "draft_probs": q, "num_nodes": num_nodes, "uniforms": uniforms})


def node_depths(parents: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """int64 ``[B, N]`` depth of each node reached from the root through ``live`` nodes (root and
    unreachable nodes 0): a dead node's subtree is never walked. A loop over nodes, not requests."""
    b, n = parents.shape
    depth = torch.zeros(b, n, dtype=torch.int64, device=parents.device)
    reached = torch.zeros(b, n, dtype=torch.bool, device=parents.device)
    reached[:, 0] = True
    batch = torch.arange(b, device=parents.device)
    for i in range(1, n):
        parent = parents[:, i].clamp(0, i - 1)
        reached[:, i] = live[:, i] & reached[batch, parent]
        depth[:, i] = torch.where(reached[:, i], depth[batch, parent] + 1, 0)
    return depth


def check_tree_values(checks: ValueChecks, tokens: torch.Tensor, parents: torch.Tensor,
                      num_nodes: torch.Tensor, target: torch.Tensor, target_name: str,
                      q: torch.Tensor | None, max_depth: int | None) -> None:
    """Value checks of the tree arguments (added to ``checks``; raised by the caller).

    What is read: nodes ``1 <= i < num_nodes`` (their parents and ids), every target row below
    ``num_nodes``, and the draft rows of nodes that have a child.
    """
    b, n = tokens.shape
    v = target.shape[-1]
    checks.add(((num_nodes < 1) | (num_nodes > n)).any(),
               lambda: f"num_nodes must lie in [1, N={n}], got {num_nodes.tolist()}")
    index = torch.arange(n, device=tokens.device)
    below = index[None, :] < num_nodes[:, None]
    used = below & (index[None, :] >= 1)
    root_bad = parents[:, 0] != -1
    checks.add(root_bad.any(), lambda: "parents[b, 0] must be -1 (node 0 is the root); got "
               f"{parents[:, 0].tolist()}")
    bad_parent = used & ((parents < 0) | (parents >= index[None, :]))
    checks.add(bad_parent.any(), lambda: "parents must satisfy 0 <= parents[b, i] < i (parents "
               f"before children) for 1 <= i < num_nodes; {_first(bad_parent, parents)}")
    proposed = used & (tokens != -1)
    check_ids(checks, "node_token_ids", tokens, proposed, v)
    rows = below.reshape(-1)
    flat = target.reshape(b * n, v)
    if target_name == "target_logits":
        check_logits(checks, target_name, flat, rows)
    else:
        check_probs(checks, target_name, flat, rows)
    if q is not None:
        # Non-children write to a spare column N, so no True races a False on a real parent.
        child = proposed & ~bad_parent
        owner = torch.where(child, parents, n)
        has_child = torch.zeros(b, n + 1, dtype=torch.bool, device=tokens.device)
        has_child.scatter_(1, owner, child)
        check_probs(checks, "draft_probs", q.reshape(b * n, v),
                    (has_child[:, :n] & below).reshape(-1))
    if max_depth is not None:
        depth = node_depths(parents, proposed & ~bad_parent)  # -1 nodes' subtrees: unreachable
        deep = depth > max_depth
        checks.add(deep.any(), lambda: f"the tree is deeper than max_depth={max_depth}: "
                   f"{_first(deep, depth)} (depth)")


def _first(mask: torch.Tensor, values: torch.Tensor) -> str:
    b, i = (int(k) for k in torch.nonzero(mask)[0])
    return f"first at request {b}, node {i} (value {int(values[b, i])})"


def check_tree_inputs(inputs: TreeInputs, explicit_uniforms: bool = True) -> None:
    """Every value check of a tree call, raised as one worded error (one host transfer).

    This is ``validate="full"`` for trees, what the door runs for a backend that does not check
    the rows its walk reads, and what the torch backend runs to word a value a compiled walk
    only flagged: the structure of nodes below ``num_nodes``, every target row below
    ``num_nodes``, the draft row of every node with children, the temperatures and the caller's
    own uniforms.
    """
    b, n, v = inputs.batch_size, inputs.num_slots, inputs.vocab_size
    name = "target_logits" if inputs.target_is_logits else "target_probs"
    q = inputs.draft_probs
    checks = ValueChecks()
    check_tree_values(checks, inputs.node_token_ids, inputs.parents, inputs.num_nodes,
                      inputs.target.reshape(b, n, v), name,
                      None if q is None else q.reshape(b, n, v),
                      inputs.max_depth if inputs.width < n else None)
    check_temperatures(checks, inputs.temperature, name)
    if explicit_uniforms and inputs.uniforms is not None:
        check_uniforms(checks, inputs.uniforms)
    checks.raise_first()
