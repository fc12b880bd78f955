"""Tree drafters for the tree loop (``tree_loop.tree_generate(..., drafter=...)``), by name.

Why several: where a tree pays depends on the draft. A close draft's deep nodes are worth more
than second guesses (the spine drafter keeps the chain's path); a less sure draft gains from
a tree that follows its probability mass wherever it goes (the dynamic drafter, EAGLE-2's
expansion); a draft-free proposer can offer every continuation it has seen at no cost (the
n-gram tree). Each is called as :func:`tree_loop.draft_tree` is::

    drafter(draft, cache, root_logits [B, V], roots [B] (or a scalar), root_pos [B] (or an
            int), shape: TreeShape, how: Drafting) -> DraftTree with N = shape.nodes + 1

and returns every row with the same ``N`` (the budget: ``nodes + 1`` scored target positions,
as a chain with ``k = nodes``). At ``T > 0`` (``how.greedy`` false) which nodes are expanded
or kept depends on the draft rows only, never on a drawn token: what keeps the
``iid`` / ``without_replacement`` tree rules exact (docs/semantics.md; the reason is in
docs/decisions.md, "Tree drafters"). Argmax trees at ``T > 0`` (``children="deterministic"``)
reach the drafters as greedy drafting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from portable_verify.e2e.tree_loop import (
    SAMPLED_REJECT_SCALE,
    SAMPLED_SIBLING_ACCEPT,
    Drafter,
    Drafting,
    DraftTree,
    TreeShape,
    cache_mark,
    draft_tree,
    tree_forward,
)
from portable_verify.integrations import hf

DYNAMIC_OFFSET = 1 << 43
"""Counter offset of the dynamic drafter's draws (depth ``d`` adds ``d << 32``), apart from
the spine's (``hf.DRAFT_OFFSET``), the siblings' and the verifier's streams."""
DYNAMIC_FRONTIER = 2
"""Frontier nodes expanded per depth by default (chosen on held-out prompts: docs/decisions.md,
"Tree drafters")."""


def _rows(roots: Any, root_pos: Any, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Roots and their positions as int64 ``[B]`` (the batch-1 loop passes a scalar and an
    int)."""
    r = torch.as_tensor(roots, dtype=torch.int64).reshape(-1).expand(b)
    p = torch.as_tensor(root_pos, dtype=torch.int64).reshape(-1).expand(b)
    return r, p


def _draw_children(q: torch.Tensor, u: torch.Tensor, iid: bool) -> torch.Tensor:
    """``[..., w]`` children per row of ``q [..., V]``, one inverse-CDF uniform each
    (``u [..., w]``): iid from ``q``, or sequentially without replacement."""
    flat, uf = q.reshape(-1, q.shape[-1]), u.reshape(-1, u.shape[-1])
    left = flat if iid else flat.clone()
    picks = []
    for r in range(uf.shape[1]):  # sibling ranks (a few), vectorised over every row
        x = hf._draw(left, uf[:, r])
        picks.append(x)
        if not iid:
            left.scatter_(1, x[:, None], 0.0)
    return torch.stack(picks, 1).reshape(*q.shape[:-1], uf.shape[1])


def _row_values(q: torch.Tensor, w: int) -> torch.Tensor:
    """``[..., w]`` estimated P(the ``r``-th child drawn from ``q [..., V]`` is reached and
    accepted), from the row only: the first ``1 - s (1 - max q)``, later ones
    ``(1 - first) b^r`` capped at the first (the spine drafter's estimates, tree_loop)."""
    first = (1 - SAMPLED_REJECT_SCALE * (1 - q.max(-1).values)).clamp(0, 1)
    rank = torch.arange(1, w, dtype=q.dtype)
    later = ((1 - first)[..., None] * SAMPLED_SIBLING_ACCEPT ** rank).minimum(first[..., None])
    return torch.cat([first[..., None], later], -1)


def _children(logits: torch.Tensor, w: int, how: Drafting, depth: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Tokens ``[B, E, w]``, value factors ``[B, E, w]`` and (``T > 0``) the rows drawn from
    ``[B, E, V]``, for the ``E`` expanded nodes' draft logits ``[B, E, V]``."""
    logits = logits.float()
    if how.greedy:  # top-w, valued as P(target argmax = token) (tempered ranking)
        tokens = torch.topk(logits, w, dim=-1).indices
        factor = torch.softmax(logits / how.rank_temperature, -1).gather(-1, tokens)
        return tokens, factor, None
    q = torch.softmax(logits / how.temperature, -1)
    b, e = q.shape[:2]
    u = how.uniforms(DYNAMIC_OFFSET + (depth << 32), e * w).reshape(b, e, w)
    tokens = _draw_children(q, u, how.children == "iid")
    return tokens, _row_values(q, w).expand(b, e, w), q


def _top(values: torch.Tensor, n: int) -> torch.Tensor:
    """Indices ``[B, n]`` of the ``n`` largest values per row, ties toward the earlier index
    (a stable sort: a node never loses a tie to its descendants, which come later)."""
    return torch.sort(-values, dim=1, stable=True).indices[:, :n]


@dataclass
class _Candidates:
    """Every drafted node so far, depth by depth (a parent precedes its children)."""

    tokens: list[torch.Tensor]  # each [B, C_d]
    parents: list[torch.Tensor]  # candidate index of the parent, -1 for the root
    values: list[torch.Tensor]
    slots: list[torch.Tensor]  # draft slot since the mark, -1 if never fed
    depth_of: list[int]
    count: int = 0

    def add(self, tokens: torch.Tensor, parents: torch.Tensor, values: torch.Tensor,
            depth: int) -> torch.Tensor:
        """Append one depth; returns the new candidates' global indices ``[C_d]``."""
        c = tokens.shape[1]
        self.tokens.append(tokens)
        self.parents.append(parents)
        self.values.append(values)
        self.slots.append(torch.full_like(tokens, -1))
        self.depth_of.append(depth)
        self.count += c
        return torch.arange(self.count - c, self.count)

    def cat(self, name: str) -> torch.Tensor:
        return torch.cat(getattr(self, name), 1)


def _feed(draft: hf.StepModel, cache: Any, mark: int, ids: torch.Tensor, pos: torch.Tensor,
          parent_slot: torch.Tensor, paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft forward over the frontier ``ids [B, F]``: each node sees its ancestors' tree
    slots (``paths`` rows of its ``parent_slot``, ``-1``: the root, no tree slot) and itself,
    not its cousins. Returns the logits ``[B, F, V]`` and ``paths`` grown by the F slots."""
    b, f = ids.shape
    t = paths.shape[1]
    grown = torch.zeros(b, t + f, t + f, dtype=torch.bool)
    grown[:, :t, :t] = paths
    inherited = paths.gather(1, parent_slot.clamp(min=0)[..., None].expand(b, f, t))
    grown[:, t:, :t] = inherited & (parent_slot >= 0)[..., None]
    grown[:, t:, t:] = torch.eye(f, dtype=torch.bool)
    logits = tree_forward(draft, cache, mark, ids, pos, grown[:, t:])
    return logits, grown


def _assemble(c: _Candidates, roots: torch.Tensor, nodes: int, root_q: torch.Tensor | None,
              fed_q: torch.Tensor | None) -> DraftTree:
    """The ``nodes`` most valuable candidates as a :class:`DraftTree` (closed under ancestors:
    a child's value never exceeds its parent's, and ties go to the parent)."""
    values, parents, slots = c.cat("values"), c.cat("parents"), c.cat("slots")
    depths = torch.cat([torch.full_like(t, d) for t, d in zip(c.tokens, c.depth_of,
                                                              strict=True)], 1)
    kept = torch.sort(_top(values, nodes), dim=1).values  # candidate order: parents first
    b = kept.shape[0]
    tree_index = torch.full((b, c.count), -1, dtype=torch.int64)
    tree_index.scatter_(1, kept, torch.arange(1, nodes + 1).expand(b, nodes))
    par = parents.gather(1, kept)
    tree_par = torch.where(par < 0, 0, tree_index.gather(1, par.clamp(min=0)))
    minus_one = torch.full((b, 1), -1, dtype=torch.int64)
    node_slots = slots.gather(1, kept)
    probs = None
    if root_q is not None:
        v = root_q.shape[-1]
        rows = torch.zeros(b, nodes, v, dtype=root_q.dtype)
        if fed_q is not None:
            fed = node_slots >= 0
            got = fed_q.gather(1, node_slots.clamp(min=0)[..., None].expand(b, nodes, v))
            rows = torch.where(fed[..., None], got, rows)
        probs = torch.cat([root_q[:, None], rows], 1)
    return DraftTree(
        tokens=torch.cat([roots[:, None], c.cat("tokens").gather(1, kept)], 1),
        parents=torch.cat([minus_one, tree_par], 1),
        depths=torch.cat([torch.zeros_like(minus_one), depths.gather(1, kept)], 1),
        draft_slots=torch.cat([minus_one, node_slots], 1),
        draft_probs=probs,
    )


@dataclass(frozen=True)
class DynamicDrafter:
    """EAGLE-2's dynamic tree: per depth, ``width`` children of each expanded node, the
    ``frontier`` most valuable new nodes expanded by ONE draft forward, and at the end the
    ``nodes`` most valuable of all kept. A node's value is its path's product of per-child
    factors: greedy, the draft's ``softmax(logits / rank_temperature)`` at the child's token
    (``frontier = 1`` is then the spine drafter's tree); ``T > 0``, children drawn ``iid`` or
    ``without_replacement`` from the tempered row, factors from the row only
    (:func:`_row_values`), so nothing kept depends on a drawn token.
    """

    frontier: int = DYNAMIC_FRONTIER

    def __post_init__(self) -> None:
        if self.frontier < 1:
            raise ValueError(f"dynamic drafter: frontier must be >= 1, got {self.frontier}")

    def __call__(self, draft: hf.StepModel, cache: Any, root_logits: torch.Tensor,
                 roots: Any, root_pos: Any, shape: TreeShape, how: Drafting) -> DraftTree:
        b = root_logits.shape[0]
        roots_t, pos0 = _rows(roots, root_pos, b)
        mark = cache_mark(cache)
        w, f = shape.width, self.frontier
        cands = _Candidates([], [], [], [], [])
        tokens, factor, root_q = _children(root_logits[:, None], w, how, 0)
        index = cands.add(tokens[:, 0], torch.full((b, w), -1), factor[:, 0], 1)
        paths = torch.zeros(b, 0, 0, dtype=torch.bool)
        fed_q: list[torch.Tensor] = []
        for depth in range(1, shape.depth):
            last = cands.values[-1]
            pick = _top(last, min(f, last.shape[1]))  # [B, F] within this depth
            ids = cands.tokens[-1].gather(1, pick)
            parent = cands.parents[-1].gather(1, pick)
            parent_slot = torch.where(parent < 0, -1, cands.cat("slots").gather(
                1, parent.clamp(min=0)))
            t = paths.shape[1]
            cands.slots[-1].scatter_(1, pick, t + torch.arange(pick.shape[1]).expand_as(pick))
            logits, paths = _feed(draft, cache, mark, ids, (pos0 + depth)[:, None].expand_as(ids),
                                  parent_slot, paths)
            tokens, factor, q = _children(logits, w, how, depth)
            if q is not None:
                fed_q.append(q)
            e = pick.shape[1]
            values = cands.values[-1].gather(1, pick)[..., None] * factor
            parents = index[pick][..., None].expand(b, e, w)
            index = cands.add(tokens.reshape(b, -1), parents.reshape(b, -1),
                              values.reshape(b, -1), depth + 1)
        q0 = None if root_q is None else root_q[:, 0]
        fq = torch.cat(fed_q, 1) if fed_q else None
        return _assemble(cands, roots_t, shape.nodes, q0, fq)


def ngram_trie(seq: np.ndarray, depth: int, nodes: int, width: int, max_ngram: int = 3,
               max_matches: int = 64) -> tuple[list[int], list[int]]:
    """Tokens and parents (``-1``: the root, the last token of ``seq``) of at most ``nodes``
    trie nodes over the continuations of ``seq``'s earlier occurrences of its last ``n``
    tokens (``n = max_ngram .. 1``), each up to ``depth`` tokens, at most ``width`` children
    per node. Each continuation start counts once, with its longest ``n``; a node ranks by
    (longest ``n`` through it, occurrences through it, latest occurrence), so a child never
    outranks its parent. Parents precede children.

    >>> ngram_trie(np.array([1, 2, 3, 1, 2, 4, 1, 2]), depth=2, nodes=4, width=2)
    ([4, 3, 1, 1], [-1, -1, 0, 1])
    """
    starts = _continuation_starts(seq, max_ngram)[:max_matches]
    stats: dict[tuple[int, ...], list[int]] = {}  # path -> [longest n, count, latest, order]
    for d in range(1, depth + 1):
        for n, s in starts:
            if s + d > len(seq):
                continue
            path = tuple(int(t) for t in seq[s: s + d])
            st = stats.setdefault(path, [n, 0, s, len(stats)])
            st[0], st[1], st[2] = max(st[0], n), st[1] + 1, max(st[2], s)
    ranked = sorted(stats.items(), key=lambda kv: (-kv[1][0], -kv[1][1], -kv[1][2], kv[1][3]))
    kept: dict[tuple[int, ...], int] = {(): -1}
    kids: dict[tuple[int, ...], int] = {}
    for path, _ in ranked:  # parents rank before their children: one pass keeps closure
        if len(kept) > nodes:
            break
        parent = path[:-1]
        if parent in kept and kids.get(parent, 0) < width:
            kids[parent] = kids.get(parent, 0) + 1
            kept[path] = 0
    order = sorted((p for p in kept if p), key=lambda p: (len(p), stats[p][3]))
    where = {p: i for i, p in enumerate(order)}
    return [p[-1] for p in order], [where[p[:-1]] if len(p) > 1 else -1 for p in order]


def _continuation_starts(seq: np.ndarray, max_ngram: int) -> list[tuple[int, int]]:
    """``(n, s)`` per earlier position ``s`` that follows a match of ``seq``'s last ``n``
    tokens (the longest ``n`` per ``s``), longest ``n`` first, then latest."""
    best: dict[int, int] = {}
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        windows = sliding_window_view(seq[:-1], n)
        for j in np.flatnonzero((windows == seq[-n:]).all(axis=1)).tolist():
            best.setdefault(j + n, n)
    return sorted(((n, s) for s, n in best.items()), key=lambda t: (-t[0], -t[1]))


@dataclass(frozen=True)
class NgramTreeDrafter:
    """Prompt lookup as a tree: every distinct continuation of the context's earlier matches
    (:func:`ngram_trie`), deterministic children, no draft forward. The draft must be an
    :class:`~portable_verify.e2e.ngram.NgramDraft` (its cache is the token history). A row
    with fewer continuations than ``nodes`` is filled with leaves repeating its last token
    (the chain lookup's fallback; a repeated deterministic child is never accepted twice)."""

    max_ngram: int = 3
    max_matches: int = 64

    def __call__(self, draft: Any, cache: Any, root_logits: torch.Tensor, roots: Any,
                 root_pos: Any, shape: TreeShape, how: Drafting) -> DraftTree:
        if not how.greedy:
            raise ValueError("the n-gram tree's children are deterministic: pass "
                             "children='deterministic' at temperature > 0")
        if not hasattr(cache, "row"):
            raise ValueError(f"the n-gram tree reads an NgramDraft's token history, got a "
                             f"{type(cache).__name__} cache")
        b = root_logits.shape[0]
        n = shape.nodes + 1
        tokens = np.zeros((b, n), dtype=np.int64)
        parents = np.zeros((b, n), dtype=np.int64)
        depths = np.ones((b, n), dtype=np.int64)
        for i in range(b):  # host-side lookup per row, as the chain lookup's
            seq = cache.row(i)
            toks, pars = ngram_trie(seq, shape.depth, shape.nodes, shape.width, self.max_ngram,
                                    self.max_matches)
            tokens[i, :] = seq[-1]
            m = len(toks)
            tokens[i, 1: m + 1] = toks
            parents[i, 1: m + 1] = np.asarray(pars, dtype=np.int64) + 1
            for j in range(1, m + 1):
                depths[i, j] = depths[i, parents[i, j]] + 1 if parents[i, j] else 1
        parents[:, 0], depths[:, 0] = -1, 0
        tokens[:, 0] = _rows(roots, root_pos, b)[0].numpy()
        vocab = root_logits.shape[-1]
        return DraftTree(tokens=torch.from_numpy(np.minimum(tokens, vocab - 1)),
                         parents=torch.from_numpy(parents), depths=torch.from_numpy(depths),
                         draft_slots=torch.full((b, n), -1, dtype=torch.int64))


DRAFTERS: dict[str, Drafter] = {
    "spine": draft_tree,
    "dynamic": DynamicDrafter(),
    "ngram": NgramTreeDrafter(),
}
"""Tree drafters by name (``tree_generate(..., drafter=DRAFTERS[name])``):

* ``spine``: the chain's path plus leaf siblings (``tree_loop.draft_tree``, batched);
* ``dynamic``: EAGLE-2's expansion, the frontier's children per depth in one draft forward;
* ``ngram``: prompt lookup's continuations as a trie, no draft forward (an ``NgramDraft``
  draft; deterministic children, so ``children="deterministic"`` at ``T > 0``).
"""


def get_drafter(name: str) -> Drafter:
    """The drafter called ``name``, or ``dynamic:F`` (the dynamic drafter expanding ``F`` frontier
    nodes per depth: why a run may set it, the draft's cost per frontier node differs between
    drafts, docs/e2e.md); an unknown name is a ``ValueError`` listing the known."""
    match = re.fullmatch(r"dynamic:(\d+)", name)
    if match:
        return DynamicDrafter(int(match[1]))
    if name not in DRAFTERS:
        raise ValueError(f"drafter must be one of {sorted(DRAFTERS)} or dynamic:F (F frontier "
                         f"nodes, e.g. dynamic:3), got {name!r}")
    return DRAFTERS[name]
