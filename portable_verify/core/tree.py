"""Token trees: the value types that cross the tree front door, and the target's attention mask.

A tree is ``node_token_ids [B, N]`` plus ``parents [B, N]`` (node 0 is the root, ``parents[b, 0]
= -1``, ``0 <= parents[b, i] < i``): parents precede children, so one pass in index order sees
every ancestor before its descendants. The rules are in docs/semantics.md ("Trees").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from portable_verify.core.types import DEFAULT_OPTIONS, TypicalParams, VerifyOptions

Children = Literal["deterministic", "iid", "without_replacement"]
CHILDREN_MODES: tuple[str, ...] = ("auto", "deterministic", "iid", "without_replacement")


@dataclass(frozen=True)
class TreeInputs:
    """Validated, canonical inputs of one tree call (torch tensors, or numpy for numpy backends).

    Rows of ``target`` and ``draft_probs`` are flat: node ``i`` of request ``b`` is row
    ``b * N + i``. ``uniforms`` column ``i - 1`` is node ``i``'s acceptance uniform and column
    ``N - 1`` the one draw; ``width`` is the result's ``W``.
    """

    node_token_ids: Any  # int64 [B, N]; node 0 not read, -1 = no proposal
    parents: Any  # int64 [B, N]
    num_nodes: Any  # int64 [B], 1 <= n <= N
    target: Any  # float [B*N, V] logits or probabilities
    target_is_logits: bool
    draft_probs: Any | None  # float [B*N, V] or None (deterministic children)
    children: Children
    temperature: Any  # float32 [B]; 0 marks a greedy row
    all_greedy: bool
    none_greedy: bool
    uniforms: Any | None  # float32 [B, N] in (0, 1]; None when all_greedy
    width: int  # W = N, or max_depth + 1
    options: VerifyOptions = DEFAULT_OPTIONS  # the caller's value, unchanged
    check_read_values: bool = False  # the backend checks the rows it reads (checks_tree_reads)

    @property
    def sampled_method(self) -> str | None:
        """The rule of the rows that sample (the method table's ``rule``)."""
        return self.options.sampled_method

    @property
    def typical(self) -> TypicalParams:
        return self.options.typical

    @property
    def batch_size(self) -> int:
        return int(self.node_token_ids.shape[0])

    @property
    def num_slots(self) -> int:
        """``N``: the padded number of nodes per request (the root included)."""
        return int(self.node_token_ids.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[-1])

    @property
    def max_depth(self) -> int:
        """The deepest accepted path a backend may walk (``W - 1``)."""
        return self.width - 1

    def check_layout(self) -> None:
        """Shapes every backend indexes by (host only; guards ``validate=False`` calls)."""
        b, n = self.batch_size, self.num_slots
        expected = {
            "parents": (self.parents, (b, n)),
            "num_nodes": (self.num_nodes, (b,)),
            "temperature": (self.temperature, (b,)),
            "uniforms": (self.uniforms, (b, n)),
            "target": (self.target, (b * n, self.vocab_size)),
            "draft_probs": (self.draft_probs, (b * n, self.vocab_size)),
        }
        for name, (array, shape) in expected.items():
            if array is not None and tuple(array.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(array.shape)}")
        if n < 1:
            raise ValueError("a tree has at least its root: N >= 1")
        if self.width < 1:
            raise ValueError(f"the result width must be >= 1, got {self.width}")


@dataclass(slots=True, eq=False)
class TreeCall:
    """One ``verify_tree`` call as the parser reads it (``api/parse.py``): the caller's arrays
    as tensors on the target's device, the resolved children mode and result width, and the
    options value unchanged. The tail (``api/call.py``) completes it into :class:`TreeInputs`
    with the same randomness and checks as a chain call."""

    node_token_ids: Any  # int64 [B, N]
    parents: Any  # int64 [B, N]
    num_nodes: Any  # int64 [B]
    target: Any  # float [B*N, V]
    target_name: str  # "target_logits" or "target_probs"
    draft_probs: Any | None  # float [B*N, V], or None (deterministic children)
    children: Children
    temperature: Any  # None (= 1), a float, or float [B]
    seed: Any
    seed_offset: Any
    uniforms: Any | None  # the caller's float [B, N], or None
    width: int  # W = max_depth + 1 (N by default)
    options: VerifyOptions
    rule: str | None  # the sampled rows' rule; None: every row is greedy (known on the host)
    validate: bool | str
    backend: str
    return_numpy: bool


@dataclass(frozen=True)
class TreeResult:
    """What one tree call decided, per request (arrays of the caller's type).

    ``token_ids [B, W]``: the accepted path's tokens, then the next token, then -1.
    ``node_ids [B, W]``: the accepted nodes (root excluded), then -1: the KV entries to keep.
    ``num_accepted [B]``: accepted nodes; ``num_emitted = num_accepted + 1``.
    """

    token_ids: Any
    node_ids: Any
    num_accepted: Any
    num_emitted: Any

    @classmethod
    def of(cls, token_ids: Any, node_ids: Any, num_accepted: Any,
           as_numpy: bool) -> TreeResult:
        """The result of a backend's tensors, as numpy arrays for a numpy caller."""
        out = (token_ids, node_ids, num_accepted, num_accepted + 1)
        if as_numpy:
            out = tuple(t.cpu().numpy() for t in out)
        return cls(*out)


def tree_attention_mask(parents: Any) -> Any:
    """bool ``[B, N, N]``: ``mask[b, i, j]`` is True when node ``j`` is node ``i`` or one of its
    ancestors: the target's attention pattern for scoring every node of the tree in one pass.

    ``parents`` is an int ``[B, N]`` torch tensor or numpy array (the result has its type and
    device). Entries that are not a valid parent (``< 0`` or ``>= i``) end the ancestor chain.
    Parents precede children, so row ``i`` is its parent's row plus ``i`` itself: a loop over
    nodes, vectorised over the batch.
    """
    is_numpy = isinstance(parents, np.ndarray)
    p = torch.from_numpy(np.asarray(parents)) if is_numpy else parents
    if p.dim() != 2:
        raise ValueError(f"parents must be [B, N] (rank 2), got shape {tuple(p.shape)}")
    b, n = p.shape
    p = p.to(torch.int64)
    eye = torch.eye(n, dtype=torch.bool, device=p.device)
    mask = eye.expand(b, n, n).clone()
    batch = torch.arange(b, device=p.device)
    for i in range(1, n):
        parent = p[:, i]
        has = (parent >= 0) & (parent < i)
        mask[:, i] |= mask[batch, parent.clamp(0, i - 1)] & has[:, None]
    return mask.numpy() if is_numpy else mask
