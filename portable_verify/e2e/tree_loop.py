"""Tree speculative decoding over transformers models (batch 1), verified by ``pv.verify_tree``.

Why a second loop: a chain spends every scored position on one guess per depth; a tree spends
them where the draft is unsure. The drafter is EAGLE-2's dynamic tree on the draft model: a
beam of ``width`` nodes expanded level by level (each beam node's ``width`` best children, the
beam of the next level the ``width`` best of those by cumulative draft log-probability), then
the ``nodes`` best candidates overall kept. A child never scores above its parent, so the kept
set is closed under ancestors, and a chain of the same length is one of the sets it ranks.

One step:

1. the draft reads its pending tokens and expands ``depth`` levels (``depth - 1`` forwards of
   ``width`` tokens, each node attending to the committed prefix and its own ancestors through
   a 4-D mask, at position ``root + depth``);
2. the target scores the root plus every kept node in ONE forward, with
   ``pv.tree_attention_mask`` as its 4-D mask and per-node positions;
3. ``pv.verify_tree`` picks the path (deterministic children: top-k is a choice, not a draw);
   the step's single host synchronisation reads the verdict;
4. both caches keep the accepted nodes' KV entries by a gather (they are scattered over the
   tree, not a suffix) and drop the rest.

Batch 1 only: a batch would need per-row trees with holes, which the chain loop has and this
experiment does not need (its figure is accepted drafts per target forward).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from portable_verify import tree_attention_mask, verify_tree
from portable_verify.core import arguments
from portable_verify.integrations import hf

TREE_METHODS: tuple[str, ...] = ("greedy", "rejection")
GREEDY_RANK_TEMPERATURE = 1.0
"""Temperature of the draft log-probabilities that rank greedy candidates (see docs/e2e.md)."""


@dataclass(frozen=True)
class TreeShape:
    """A dynamic tree: beam ``width``, ``depth`` levels, the ``nodes`` best candidates kept.

    Scored target positions per step: ``nodes + 1`` (the root too), as a chain with
    ``k = nodes``.
    """

    width: int
    depth: int
    nodes: int

    def __post_init__(self) -> None:
        if self.width < 1 or self.depth < 1:
            raise ValueError(f"tree width and depth must be >= 1, got {self.width}x{self.depth}")
        most = self.width + (self.depth - 1) * self.width * self.width
        if not 1 <= self.nodes <= most:
            raise ValueError(f"a {self.width}x{self.depth} tree has 1 to {most} candidate "
                             f"nodes to keep, got {self.nodes}")

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """``"WxD"`` (keeps ``D`` nodes) or ``"WxD:M"`` (keeps ``M``)."""
        match = re.fullmatch(r"\s*(\d+)x(\d+)(?::(\d+))?\s*", text)
        if not match:
            raise ValueError(f"a tree is WIDTHxDEPTH or WIDTHxDEPTH:NODES (e.g. 2x4, 3x4:8), "
                             f"got {text!r}")
        width, depth = int(match[1]), int(match[2])
        return cls(width, depth, int(match[3]) if match[3] else depth)

    @property
    def label(self) -> str:
        return f"{self.width}x{self.depth}" + ("" if self.nodes == self.depth else f":{self.nodes}")


@dataclass
class DraftTree:
    """One step's tree (root = node 0): what the target scores and the verifier reads."""

    tokens: torch.Tensor  # int64 [1, N]
    parents: torch.Tensor  # int64 [1, N]
    depths: torch.Tensor  # int64 [N]
    draft_slots: torch.Tensor  # int64 [N]: the node's slot in the draft cache, -1 if not fed


def keep_slots(cache: Any, start: int, slots: torch.Tensor) -> None:
    """Keep cache slots ``start + slots`` (in that order) right after slot ``start - 1``; drop
    everything after them. In place, per layer; the copy is made before the write."""
    n = int(slots.numel())
    index = slots + start
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            t[..., start: start + n, :] = t.index_select(-2, index)
            setattr(layer, name, t[..., : start + n, :])


def _tree_mask(ancestors: torch.Tensor, cached: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive ``[1, 1, S, cached + T]`` mask: every cached slot, then the tree slots
    ``ancestors [S, T]`` allows (additive floats work for eager and SDPA attention alike)."""
    allowed = torch.cat([ancestors.new_ones(ancestors.shape[0], cached), ancestors], 1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def draft_tree(draft: hf.StepModel, cache: Any, root_logits: torch.Tensor, root: torch.Tensor,
               root_pos: int, shape: TreeShape, rank_temperature: float) -> DraftTree:
    """Expand the draft's beam and keep the best ``shape.nodes`` candidates (see module doc).

    ``root_logits [1, V]``: the draft's logits after the root; ``cache`` holds everything up to
    and including the root and receives the beam nodes of levels ``1 .. depth - 1``.
    """
    w, scale = shape.width, 1.0 / rank_temperature
    base = cache.get_seq_length()
    logp = torch.log_softmax(root_logits[0].float() * scale, -1)
    score, token = torch.topk(logp, w)
    parent = torch.full((w,), -1, dtype=torch.int64)  # candidate index; -1: the root
    scores, tokens, parents, depths, _slots = [score], [token], [parent], [torch.ones(w)], []
    beam = torch.arange(w)  # candidate indices of the current beam
    anc = torch.zeros(0, 0, dtype=torch.bool)  # fed-slot ancestor rows
    slot_of: dict[int, int] = {}  # host-known layout: beam candidate index -> draft slot
    offset = 0  # candidates before this level
    all_scores = score
    for level in range(1, shape.depth):
        fed = len(slot_of)
        beam_parents = torch.cat(parents)[beam]
        rows = torch.zeros(w, fed + w, dtype=torch.bool)
        for j, cand in enumerate(beam.tolist()):  # w <= a few; host-side layout only
            p = int(beam_parents[j])
            if p >= 0:
                rows[j, :fed] = anc[slot_of[p]]
            rows[j, fed + j] = True
            slot_of[cand] = fed + j
        anc = torch.cat([torch.cat([anc, anc.new_zeros(fed, w)], 1), rows], 0)
        ids = torch.cat(tokens)[beam][None]
        pos = torch.full((1, w), root_pos + level, dtype=torch.int64)
        logits = draft.logits(ids, cache, pos, _tree_mask(rows, base, torch.float32))
        child_logp = all_scores[beam, None] + torch.log_softmax(logits[0].float() * scale, -1)
        score, token = torch.topk(child_logp, w, dim=-1)  # [w, w]
        offset += tokens[-1].numel()
        scores.append(score.reshape(-1))
        tokens.append(token.reshape(-1))
        parents.append(beam.repeat_interleave(w))
        depths.append(torch.full((w * w,), level + 1.0))
        all_scores = torch.cat(scores)
        beam = offset + torch.topk(scores[-1], w).indices
    all_scores, all_tokens = torch.cat(scores), torch.cat(tokens)
    all_parents, all_depths = torch.cat(parents), torch.cat(depths).long()
    # Keep the best `nodes`; ties go to the earlier candidate, so a parent always precedes its
    # child, and the kept nodes sorted by candidate index list parents before children.
    order = torch.sort(-all_scores, stable=True).indices[: shape.nodes]
    kept = torch.sort(order).values
    tree_index = torch.full((all_scores.numel(),), -1, dtype=torch.int64)
    tree_index[kept] = torch.arange(1, kept.numel() + 1)
    kept_parents = all_parents[kept]
    tree_parents = torch.where(kept_parents < 0, 0, tree_index[kept_parents.clamp(min=0)])
    cand_slot = torch.full((all_scores.numel(),), -1, dtype=torch.int64)
    for cand, slot in slot_of.items():
        cand_slot[cand] = slot
    minus_one = torch.tensor([-1])
    return DraftTree(
        tokens=torch.cat([root.reshape(1), all_tokens[kept]])[None],
        parents=torch.cat([minus_one, tree_parents])[None],
        depths=torch.cat([torch.zeros(1, dtype=torch.int64), all_depths[kept]]),
        draft_slots=torch.cat([minus_one, cand_slot[kept]]),
    )


@dataclass
class TreeLoopMetrics(hf.LoopMetrics):
    """:class:`hf.LoopMetrics` plus how often the accepted nodes were not the tree's first
    ``a`` nodes, i.e. the steps where keeping a cache suffix would have been wrong."""

    scattered_steps: int = 0

    def merge(self, other: hf.LoopMetrics) -> None:
        super().merge(other)
        self.scattered_steps += getattr(other, "scattered_steps", 0)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "scattered_steps": self.scattered_steps}


@torch.inference_mode()
def tree_generate(
    target_model: Any,
    draft_model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    shape: TreeShape,
    method: str = "greedy",
    temperature: float = 1.0,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    rank_temperature: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> hf.GenerateResult:
    """Generate up to ``max_new_tokens`` tokens for one prompt ``input_ids [1, P]`` with a
    dynamic draft tree of ``shape`` per step. ``method="greedy"`` in float32 reproduces
    target-only greedy decoding token for token (tested); ``"rejection"`` samples the target
    at ``temperature`` exactly (deterministic children)."""
    if method not in TREE_METHODS:
        raise ValueError(f"method must be one of {TREE_METHODS}, got {method!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
            or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError("input_ids must be one prompt [1, P] (the tree loop runs batch 1), got "
                         f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    greedy = method == "greedy"
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 for method='rejection', got {temperature}")
    ids = input_ids.long()
    p = ids.shape[1]
    eos = hf._eos_ids(eos_token_id)
    rows = hf._Rows(1, max_new_tokens, eos)
    target, draft = hf.as_step_model(target_model), hf.as_step_model(draft_model)
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    metrics = TreeLoopMetrics(k=shape.depth, accepted_per_position=[0] * shape.depth)
    seeds = arguments.request_seeds(seed, 1, ids.device)
    verify_temp = 0.0 if greedy else float(temperature)
    rank_t = rank_temperature if rank_temperature is not None else \
        (GREEDY_RANK_TEMPERATURE if greedy else verify_temp)
    if not rank_t > 0:
        raise ValueError(f"rank_temperature must be > 0, got {rank_temperature}")

    start = clock()
    if p > 1:
        positions = torch.arange(p - 1)[None]
        target.prefill(ids[:, :-1], t_cache, positions, None)
        draft.prefill(ids[:, :-1], d_cache, positions, None)
    pending, root_pos = ids[:, -1:], p - 1
    metrics.prefill_time_s = clock() - start

    step = 0
    while not rows.done[0]:
        t0 = clock()
        n_pend = pending.shape[1]
        pend_pos = torch.arange(root_pos - n_pend + 1, root_pos + 1)[None]
        root_logits = draft.logits(pending, d_cache, pend_pos, None, True)
        d_base = d_cache.get_seq_length()
        tree = draft_tree(draft, d_cache, root_logits, pending[0, -1], root_pos, shape, rank_t)
        td = clock()
        metrics.draft_time_s += td - t0
        t_base = t_cache.get_seq_length()
        mask = _tree_mask(tree_attention_mask(tree.parents)[0], t_base, torch.float32)
        logits = target.logits(tree.tokens, t_cache, (root_pos + tree.depths)[None], mask)
        tv = clock()
        metrics.target_time_s += tv - td
        result = verify_tree(tree.tokens, tree.parents, target_logits=logits, method=method,
                             temperature=verify_temp, seed=seeds, seed_offset=step,
                             max_depth=shape.depth, validate=False)
        metrics.verify_time_s += clock() - tv
        host = torch.cat([result.token_ids[0], result.node_ids[0], result.num_accepted,
                          tree.draft_slots]).tolist()  # the step's one sync
        w = shape.depth + 1
        a = host[2 * w]
        nodes = host[w: w + a]
        slots = [host[2 * w + 1 + n] for n in nodes]
        rows.add(0, host[: a + 1])
        metrics.row_steps += 1
        metrics.accepted_tokens += a
        for j in range(a):
            metrics.accepted_per_position[j] += 1
        metrics.scattered_steps += int(nodes != list(range(1, a + 1)))
        # The target keeps the root and the accepted nodes; the draft the accepted nodes it
        # was fed (a prefix of the path: a fed node's ancestors were all fed).
        keep_slots(t_cache, t_base, torch.tensor([0, *nodes], dtype=torch.int64))
        fed = [s for s in slots if s >= 0]
        keep_slots(d_cache, d_base, torch.tensor(fed, dtype=torch.int64))
        tokens = host[: a + 1]
        pending = torch.tensor([tokens[len(fed):]], dtype=torch.int64)
        root_pos += a + 1
        step += 1
        metrics.steps = step
        metrics.decode_time_s += clock() - t0

    metrics.new_tokens = len(rows.tokens[0])
    return hf.GenerateResult(rows.sequences(ids, hf._pad_id(pad_token_id, eos)), rows.tokens,
                             metrics)
