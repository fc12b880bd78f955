"""Tree speculative decoding, verified by ``pv.verify_tree``: transformers models at batch 1,
the OpenVINO runtime at any batch.

Why a second loop: a chain spends every scored position on one guess per depth; a tree spends
some of them on second guesses where the draft is unsure. The drafter (``draft_tree``) drafts
the chain's own path first, a *spine* of ``depth`` tokens (exactly the chain's drafts: argmax
when greedy, the chain's draws at ``T > 0``), then offers ``width - 1`` siblings per spine
position (the next-best tokens when greedy, draws without replacement at ``T > 0``) and keeps
the ``nodes`` candidates of highest estimated value (the probability that the verifier reaches
and accepts them). With ``depth == nodes`` the chain of ``k = nodes`` is one of the candidate
sets, so the tree only gives up a spine node where a sibling is judged worth more (why
EAGLE-2's beam over the raw draft probabilities lost here: docs/decisions.md, "Trees end to
end"). Other drafters plug in through ``tree_generate(drafter=...)``.

One step:

1. the draft reads its pending tokens and drafts the spine (``depth - 1`` one-token forwards,
   as the chain's ``k - 1``); siblings are leaves and cost no draft forward;
2. the target scores the root plus every kept node in ONE forward, with
   ``pv.tree_attention_mask`` as its 4-D mask and per-node positions;
3. ``pv.verify_tree`` picks the path (greedy: deterministic children; ``T > 0``: children
   drawn without replacement or iid, with the draft rows; the token-level rule or traversal
   verification); the step's single host sync reads it;
4. both caches keep the accepted nodes' KV entries (they are scattered over the tree, not a
   suffix) and drop the rest: a transformers cache by a gather, the OpenVINO runtime's by
   marking the rest dead per row (``SlotCache.keep``; compacted past a bound).

Batch > 1 (OpenVINO): rows accept different numbers of nodes, so each row's rejected nodes
become its own dead slots; positions come from each row's count of emitted tokens; the draft's
pending tokens (1 or 2 per row) are fed right-aligned with padding entries hidden and dropped.
Rows that stopped keep stepping (their tokens are ignored), as in the chain loop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from portable_verify import tree_attention_mask, verify_tree
from portable_verify.core import rng
from portable_verify.integrations import hf

TREE_METHODS: tuple[str, ...] = ("greedy", "rejection", "traversal")  # narrower: exact
"""``rejection``: the token-level tree rule (root down, token ratios); ``traversal``: traversal
verification (leaves up, sequence weights); both exact. ``greedy``: the greedy tree walk."""
SAMPLED_CHILDREN: tuple[str, ...] = ("without_replacement", "iid")
"""How siblings are drawn at ``T > 0``: without replacement (distinct, the default) or iid
from the spine's row (duplicates possible), each told to ``verify_tree`` as its ``children``."""
TREE_CHILDREN: tuple[str, ...] = (*SAMPLED_CHILDREN, "deterministic")
"""``children`` values of :func:`tree_generate`: ``"deterministic"`` drafts argmax trees (the
greedy drafts) at every temperature and verifies them with no ``draft_probs`` (point masses,
exact: docs/semantics.md)."""
GREEDY_RANK_TEMPERATURE = 0.5
"""Greedy: the draft's logits divided by this estimate P(target argmax = token) (chosen from
1, 0.5, 0.25, 0.1 on three held-out chat prompts: weak evidence, docs/decisions.md)."""
SAMPLED_REJECT_SCALE = 0.25
"""``T > 0``: P(spine draw rejected) is estimated as this times ``1 - max q`` (not tuned: 1.0
lost badly, since a close draft's draws are accepted nearly regardless of ``max q``)."""
SAMPLED_SIBLING_ACCEPT = 0.5
"""``T > 0``: P(a sibling draw accepted | the draws before it rejected), a guess (not tuned)."""
SIBLING_OFFSET = 1 << 41
"""Counter offset of the siblings' random numbers (the spine uses ``hf.DRAFT_OFFSET``)."""


@dataclass(frozen=True)
class TreeShape:
    """A spine of ``depth`` drafts, ``width`` candidate children per spine position (the spine
    child first), the ``nodes`` most valuable candidates kept.

    Scored target positions per step: ``nodes + 1`` (the root too), as a chain with
    ``k = nodes``.
    """

    width: int
    depth: int
    nodes: int

    def __post_init__(self) -> None:
        if self.width < 1 or self.depth < 1:
            raise ValueError(f"tree width and depth must be >= 1, got {self.width}x{self.depth}")
        most = self.width * self.depth
        if not 1 <= self.nodes <= most:
            raise ValueError(f"a {self.width}x{self.depth} tree has 1 to {most} candidate "
                             f"nodes to keep, got {self.nodes}")

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """``"WxD"`` (keeps ``D`` nodes) or ``"WxD:M"`` (keeps ``M``)."""
        match = re.fullmatch(r"\s*(\d+)x(\d+)(?::(\d+))?\s*", text)
        if not match:
            raise ValueError(f"a tree is WIDTHxDEPTH or WIDTHxDEPTH:NODES (e.g. 2x4, 3x8:4), "
                             f"got {text!r}")
        width, depth = int(match[1]), int(match[2])
        return cls(width, depth, int(match[3]) if match[3] else depth)

    @property
    def label(self) -> str:
        return f"{self.width}x{self.depth}" + ("" if self.nodes == self.depth else f":{self.nodes}")


@dataclass
class DraftTree:
    """One step's tree (root = node 0): what the target scores and the verifier reads."""

    tokens: torch.Tensor  # int64 [B, N]; node 0 is the root (the row's last emitted token)
    parents: torch.Tensor  # int64 [B, N]; -1 for the root; a parent precedes its children
    depths: torch.Tensor  # int64 [B, N]; the root's is 0
    draft_slots: torch.Tensor  # int64 [B, N]: the node's slot in the draft cache counted from
    # the draft cache's mark before drafting (tree_loop.cache_mark), -1 if never fed
    draft_probs: torch.Tensor | None = None  # [B, N, V] at T > 0: node i's children's law


@dataclass(frozen=True)
class Drafting:
    """How one step drafts: greedy (``temperature == 0``) or sampled, and its random streams."""

    temperature: float
    seeds: torch.Tensor
    step: int
    rank_temperature: float = GREEDY_RANK_TEMPERATURE
    children: str = "without_replacement"  # sampled siblings: SAMPLED_CHILDREN

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def uniforms(self, offset: int, cols: int) -> torch.Tensor:
        """``[B, cols]``: each row's own stream (its seed, this step, ``offset``), so a row
        draws the same numbers alone or in a batch."""
        offsets = torch.full(self.seeds.shape, self.step + offset, dtype=torch.int64)
        return rng.uniforms_torch(self.seeds, offsets, cols)


def cache_mark(cache: Any) -> int:
    """Where the next slot appended to ``cache`` goes: tree slots are counted from a mark.

    A cache with its own ``mark()`` (the OpenVINO runtime's, whose slots are physical and may
    include dead ones) answers itself; a transformers ``DynamicCache`` by its length."""
    mark = getattr(cache, "mark", None)
    return int(mark()) if mark is not None else int(cache.get_seq_length())


def tree_forward(model: hf.StepModel, cache: Any, mark: int, ids: torch.Tensor,
                 pos: torch.Tensor, visible: torch.Tensor, last_only: bool = False
                 ) -> torch.Tensor:
    """Logits ``[B, S, V]`` (``[B, V]`` with ``last_only``) of new tokens ``ids [B, S]`` at
    positions ``pos [B, S]``; appends their ``S`` slots to ``cache``.

    Each new token sees every slot of its row before ``mark`` (the row's history) and, of the
    ``T`` slots appended since ``mark`` plus the ``S`` new ones, those ``visible [B, S, T + S]``
    allows (a token must see itself). Why one function: a tree spends forwards over the
    frontier of several branches, each seeing only its own ancestors. A model with its own
    ``tree_logits`` (same arguments) runs it; a transformers module gets a 4-D additive mask
    (batch 1: rows with holes before ``mark`` are the OpenVINO runtime's).
    """
    own = getattr(model, "tree_logits", None)
    if own is not None:
        return own(ids, cache, pos, mark, visible, last_only)
    if ids.shape[0] != 1:
        raise ValueError("tree forwards over transformers modules run batch 1; got batch "
                         f"{ids.shape[0]} (the OpenVINO runtime runs batches)")
    mask = _tree_mask(visible[0], mark, torch.float32)
    return model.logits(ids, cache, pos, mask, last_only)


def _tree_mask(visible: torch.Tensor, cached: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive ``[1, 1, S, cached + T]`` mask: every cached slot, then the tree slots
    ``visible [S, T]`` allows (additive floats work for eager and SDPA attention alike)."""
    allowed = torch.cat([visible.new_ones(visible.shape[0], cached), visible], 1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def keep_slots(cache: Any, mark: int, slots: torch.Tensor) -> None:
    """Keep the tree slots ``mark + slots`` (``slots [B, n]`` or ``[n]``, in that order, ``-1``
    padding a row's tail) right after the row's history; drop every other slot since
    ``mark``. A cache with its own ``keep(mark, slots)`` does it itself; a ``DynamicCache``
    (batch 1) gathers in place, per layer, the copy made before the write."""
    own = getattr(cache, "keep", None)
    if own is not None:
        own(mark, slots)
        return
    flat = slots.reshape(-1)
    flat = flat[flat >= 0]
    n = int(flat.numel())
    index = flat + mark
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            t[..., mark: mark + n, :] = t.index_select(-2, index)
            setattr(layer, name, t[..., : mark + n, :])


def _spine(draft: hf.StepModel, cache: Any, root_logits: torch.Tensor,
           root_pos: torch.Tensor, depth: int, how: Drafting) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain's drafts ``[B, D]`` and the draft rows they were drawn from ``[B, D, V]``
    (logits when greedy, probabilities at ``T``): the same tokens the chain loop drafts from
    here. ``root_pos [B]``: each row's root position."""
    logits = root_logits.float()
    u = None if how.greedy else how.uniforms(hf.DRAFT_OFFSET, depth + 1)
    tokens, rows = [], []
    for j in range(depth):
        if how.greedy:
            row, x = logits, torch.argmax(logits, -1)
        else:
            row = torch.softmax(logits / how.temperature, -1)
            x = hf._draw(row, u[:, j])
        tokens.append(x)
        rows.append(row)
        if j < depth - 1:
            logits = draft.logits(x[:, None], cache, (root_pos + 1 + j)[:, None], None,
                                  True).float()
    return torch.stack(tokens, 1), torch.stack(rows, 1)


def _siblings(spine: torch.Tensor, rows: torch.Tensor, width: int,
              how: Drafting) -> torch.Tensor:
    """``[B, D, width - 1]`` further children per spine position, in sibling order: the
    next-best tokens (greedy), sequential draws without replacement from the row with the spine
    token removed, or iid draws from the whole row (one inverse-CDF uniform per draw, as the
    spine's)."""
    b, d, v = rows.shape
    flat, spine = rows.reshape(b * d, v), spine.reshape(b * d)
    if how.greedy:
        keys = flat.clone()
        keys.scatter_(1, spine[:, None], -float("inf"))
        return torch.topk(keys, width - 1, dim=-1).indices.reshape(b, d, width - 1)
    u = how.uniforms(SIBLING_OFFSET, d * (width - 1)).reshape(b * d, width - 1)
    if how.children == "iid":  # the spine's own law, each draw independent of the others
        picks = [hf._draw(flat, u[:, r]) for r in range(width - 1)]
    else:
        left = flat.clone()
        left.scatter_(1, spine[:, None], 0.0)
        picks = []
        for r in range(width - 1):  # sibling ranks (a few), vectorised over rows and positions
            x = hf._draw(left, u[:, r])
            picks.append(x)
            left.scatter_(1, x[:, None], 0.0)
    return torch.stack(picks, 1).reshape(b, d, width - 1)


def _values(spine: torch.Tensor, rows: torch.Tensor, siblings: torch.Tensor,
            how: Drafting) -> torch.Tensor:
    """Estimated P(reached and accepted) per candidate, ``[B, D, width]`` (column 0 the
    spine).

    Greedy: ``softmax(logits / rank_temperature)`` as P(target argmax = token). ``T > 0``: only
    the rows, never a candidate's own token, so that which nodes are kept does not depend on
    the draws (what makes the without-replacement rule exact): the spine draw at a row is
    accepted with ``1 - s * (1 - max q)``, each sibling after a rejection with ``b``; a sibling
    is capped at its spine brother's value, so it is never kept without him.
    """
    cands = torch.cat([spine[..., None], siblings], -1)
    ones = torch.ones(spine.shape[0], 1)
    if how.greedy:
        c = torch.softmax(rows / how.rank_temperature, -1).gather(2, cands)
        reach = torch.cat([ones, torch.cumprod(c[..., 0], 1)[:, :-1]], 1)
        return reach[..., None] * c
    accept = (1 - SAMPLED_REJECT_SCALE * (1 - rows.max(-1).values)).clamp(0, 1)
    reach = torch.cat([ones, torch.cumprod(accept, 1)[:, :-1]], 1)
    rank = torch.arange(1, cands.shape[-1])
    sib = (reach * (1 - accept))[..., None] * SAMPLED_SIBLING_ACCEPT ** rank
    spine_v = reach * accept
    return torch.cat([spine_v[..., None], torch.minimum(sib, spine_v[..., None])], -1)


def draft_tree(draft: hf.StepModel, cache: Any, root_logits: torch.Tensor, roots: Any,
               root_pos: Any, shape: TreeShape, how: Drafting) -> DraftTree:
    """Draft the spine and its siblings, keep the ``shape.nodes`` most valuable (module doc),
    for every row at once.

    ``root_logits [B, V]``: the draft's logits after each row's root (``roots [B]`` at
    ``root_pos [B]``; scalars for one row); ``cache`` holds everything up to and including the
    roots and receives the spine's first ``depth - 1`` tokens.
    """
    d, w = shape.depth, shape.width
    roots = torch.as_tensor(roots).reshape(-1)
    root_pos = torch.as_tensor(root_pos).reshape(-1).expand(roots.shape[0])
    spine, rows = _spine(draft, cache, root_logits, root_pos, d, how)
    b = spine.shape[0]
    siblings = _siblings(spine, rows, w, how) if w > 1 else spine.new_zeros(b, d, 0)
    values = _values(spine, rows, siblings, how).reshape(b, -1)
    # Candidates level by level, the spine child first: a parent precedes its children and
    # outranks them or ties (ties go to the earlier candidate), so the kept set is closed
    # under ancestors and, sorted by candidate index, lists parents before children.
    order = torch.sort(-values, dim=1, stable=True).indices[:, : shape.nodes]
    kept = torch.sort(order, dim=1).values
    level, rank = kept // w, kept % w
    tree_index = torch.full((b, d * w), -1, dtype=torch.int64)
    tree_index.scatter_(1, kept, torch.arange(1, kept.shape[1] + 1).expand(b, -1).contiguous())
    spine_parent = torch.where(level > 0, tree_index.gather(1, ((level - 1) * w).clamp(min=0)),
                               0)
    tokens = torch.cat([spine[..., None], siblings], -1).reshape(b, -1).gather(1, kept)
    slots = torch.where((rank == 0) & (level < d - 1), level, -1)
    minus_one = torch.full((b, 1), -1, dtype=torch.int64)
    probs = None
    if not how.greedy:  # row i: the law node i's children were drawn from (the root's: level
        # 0; a spine node's: the next level's; a sibling is a leaf, its row is never read)
        nxt = (level + 1).clamp(max=d - 1)
        probs = torch.cat([rows[:, :1], rows.gather(
            1, nxt[..., None].expand(-1, -1, rows.shape[-1]))], 1)
    return DraftTree(
        tokens=torch.cat([roots[:, None].to(torch.int64), tokens], 1),
        parents=torch.cat([minus_one, spine_parent], 1),
        depths=torch.cat([torch.zeros(b, 1, dtype=torch.int64), level + 1], 1),
        draft_slots=torch.cat([minus_one, slots], 1),
        draft_probs=probs,
    )


@dataclass
class TreeLoopMetrics(hf.LoopMetrics):
    """:class:`hf.LoopMetrics` plus how often the accepted nodes were not the tree's first
    ``a`` nodes (the steps where keeping a cache suffix would have been wrong) and, for caches
    with dead slots (the OpenVINO runtime), the target cache's dead slots at the end and at
    most (the most of any row) and how many compactions both caches made."""

    scattered_steps: int = 0
    dead_slots: int = 0
    max_dead_slots: int = 0
    compactions: int = 0

    def merge(self, other: hf.LoopMetrics) -> None:
        super().merge(other)
        self.scattered_steps += getattr(other, "scattered_steps", 0)
        self.dead_slots = max(self.dead_slots, getattr(other, "dead_slots", 0))
        self.max_dead_slots = max(self.max_dead_slots, getattr(other, "max_dead_slots", 0))
        self.compactions += getattr(other, "compactions", 0)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "scattered_steps": self.scattered_steps,
                "dead_slots": self.dead_slots, "max_dead_slots": self.max_dead_slots,
                "compactions": self.compactions}

    def note_caches(self, t_cache: Any, d_cache: Any) -> None:
        """Read the caches' dead-slot counters (zero for caches without dead slots)."""
        self.dead_slots = int(getattr(t_cache, "dead_slots", 0))
        self.max_dead_slots = int(getattr(t_cache, "most_dead", 0))
        self.compactions = sum(int(getattr(c, "compactions", 0)) for c in (t_cache, d_cache))


Drafter = Callable[..., DraftTree]
"""``drafter(draft, d_cache, root_logits [B, V], roots [B], root_pos [B], shape, how)``: one
step's :class:`DraftTree` for every row (``draft_tree`` by default)."""


def _check_arguments(input_ids: Any, max_new_tokens: Any, method: str, temperature: float,
                     children: str) -> None:
    """Bad arguments, each error naming its argument, before any model runs."""
    if method not in TREE_METHODS:
        raise ValueError(f"method must be one of {TREE_METHODS}, got {method!r}")
    if children not in TREE_CHILDREN:
        raise ValueError(f"children must be one of {TREE_CHILDREN}, got {children!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if method != "greedy" and not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 for method={method!r} (0: greedy rows), "
                         f"got {temperature}")


def _check_batch(b: int, target: Any, draft: Any) -> None:
    """Batches need per-row dead slots, which only models with ``tree_logits`` have."""
    if b > 1 and not all(hasattr(m, "tree_logits") for m in (target, draft)):
        raise ValueError(f"input_ids: the tree loop runs transformers models at batch 1, got "
                         f"batch {b} (the OpenVINO runtime runs any batch)")


def _prefill(model: hf.StepModel, cache: Any, ids: torch.Tensor, pos: torch.Tensor,
             mask: torch.Tensor, holes: bool) -> None:
    """Encode the prompts but their last tokens; a row's padding slots are then dropped
    (tree forwards see every slot of a row's history)."""
    model.prefill(ids, cache, pos, mask if holes else None)
    if holes:
        count = mask.sum(1, keepdim=True)
        real = torch.sort((mask == 0).long(), dim=1, stable=True).indices  # real slots first
        keep_slots(cache, 0, torch.where(torch.arange(ids.shape[1]) < count, real, -1))


def _feed_pending(draft: hf.StepModel, cache: Any, pending: torch.Tensor,
                  valid: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
    """The draft's logits after each row's pending tokens (right-aligned in ``pending``;
    ``valid`` None when every entry is real, else the padding entries are fed, hidden and
    dropped)."""
    if valid is None:
        return draft.logits(pending, cache, pos, None, True)
    mark = cache_mark(cache)
    s = pending.shape[1]
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
    visible = causal[None] & valid[:, None, :] | torch.eye(s, dtype=torch.bool)[None]
    logits = tree_forward(draft, cache, mark, pending, pos, visible, last_only=True)
    cols = torch.arange(s).expand_as(valid)
    keep_slots(cache, mark, _left_pack(torch.where(valid, cols, -1)))
    return logits


def _left_pack(slots: torch.Tensor) -> torch.Tensor:
    """Each row's non-negative entries first, in order, ``-1`` after them."""
    order = torch.sort((slots < 0).long(), dim=1, stable=True).indices
    return slots.gather(1, order)
def _step_keeps(result: Any, tree: DraftTree, depth: int) -> tuple[torch.Tensor, ...]:
    """From one step's verdict, without a host sync: the target's kept tree slots ``[B, D+1]``
    (the root and the accepted nodes), the draft's ``[B, D]`` (the accepted nodes it was fed:
    a prefix of the path, since a node with children was fed), how many those are ``[B]``, and
    whether the accepted nodes were not the tree's first ``a`` ``[B]``."""
    a = result.num_accepted
    cols = torch.arange(depth)
    on_path = cols < a[:, None]
    nodes = torch.where(on_path, result.node_ids[:, :depth], 0)
    root = torch.zeros_like(a)[:, None]
    t_keep = torch.where(torch.cat([root >= 0, on_path], 1), torch.cat([root, nodes], 1), -1)
    fed = torch.where(on_path, tree.draft_slots.gather(1, nodes), -1)
    scattered = (on_path & (nodes != cols + 1)).any(1)
    return t_keep, fed, (fed >= 0).sum(1), scattered


def _next_pending(tokens: torch.Tensor, a: torch.Tensor, n_fed: torch.Tensor, width: int,
                  padded: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's emitted tokens the draft has not seen (``tokens[n_fed : a + 1]``: the
    bonus, and an accepted leaf never fed), right-aligned in ``width`` columns; the validity
    mask, or None when no row needs padding (``padded``, known on the host)."""
    j = torch.arange(width)
    count = (a + 1 - n_fed)[:, None]
    index = (a[:, None] + 1 - width + j).clamp(min=0)
    valid = j >= width - count
    pending = torch.where(valid, tokens.gather(1, index), 0)
    return pending, valid if padded else None


def _book(rows: hf._Rows, metrics: TreeLoopMetrics, host: list[list[int]],
          active: list[bool], depth: int) -> None:
    """Host bookkeeping of B small lists (``host`` row: ``D + 1`` tokens, then ``a`` and the
    scattered flag); tensors stay batched."""
    for i, row in enumerate(host):
        if not active[i]:
            continue
        a = row[depth + 1]
        rows.add(i, row[: a + 1])
        metrics.row_steps += 1
        metrics.accepted_tokens += a
        for j in range(a):
            metrics.accepted_per_position[j] += 1
        metrics.scattered_steps += row[depth + 2]


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
    seed: int | Sequence[int] | torch.Tensor | None = 0,
    attention_mask: torch.Tensor | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    rank_temperature: float | None = None,
    children: str = "without_replacement",
    drafter: Drafter | None = None,
    verifier: Callable[..., Any] = verify_tree,
    clock: Callable[[], float] = time.perf_counter,
) -> hf.GenerateResult:
    """Generate up to ``max_new_tokens`` tokens per row of ``input_ids [B, P]`` (left-padded
    when ragged, with ``attention_mask`` as :func:`hf.speculative_generate` takes) with a draft
    tree of ``shape`` per step. ``method="greedy"`` in float32 reproduces target-only greedy
    decoding token for token (tested); ``"rejection"`` (the token-level rule) and
    ``"traversal"`` sample the target at ``temperature`` exactly (siblings drawn ``children``:
    without replacement or iid, kept by their rows only); at ``temperature == 0`` they decode
    greedily. ``seed``: int or ``[B]`` per request (a row's tokens do not depend on the other
    rows). Batch > 1 needs models with ``tree_logits`` (the OpenVINO runtime); transformers
    modules run batch 1. ``rank_temperature``: greedy ranking's (default
    :data:`GREEDY_RANK_TEMPERATURE`). ``drafter``: see :data:`Drafter` (default
    :func:`draft_tree`). ``verifier``: called as ``verify_tree`` (a
    :class:`~portable_verify.e2e.paired.ShadowVerifier` judges each step by a second rule).
    ``children="deterministic"``: argmax trees at ``T > 0`` (greedy drafting, point-mass
    children verified at ``temperature``)."""
    _check_arguments(input_ids, max_new_tokens, method, temperature, children)
    ids, mask = hf._check_prompt(input_ids, attention_mask)
    b, p = ids.shape
    target, draft = hf.as_step_model(target_model), hf.as_step_model(draft_model)
    _check_batch(b, target, draft)
    rank_t = GREEDY_RANK_TEMPERATURE if rank_temperature is None else rank_temperature
    if not rank_t > 0:
        raise ValueError(f"rank_temperature must be > 0, got {rank_temperature}")
    drafter = draft_tree if drafter is None else drafter
    greedy = method == "greedy" or temperature == 0
    verify_temp = 0.0 if greedy else float(temperature)
    seeds = hf._row_seeds(seed, b, ids.device)
    eos = hf._eos_ids(eos_token_id)
    rows = hf._Rows(b, max_new_tokens, eos)
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    metrics = TreeLoopMetrics(k=shape.depth, accepted_per_position=[0] * shape.depth)
    d = shape.depth

    start = clock()
    positions = (mask.cumsum(1) - 1).clamp_(min=0)
    holes = bool((mask == 0).any())  # one sync before the loop
    if p > 1:
        for model, cache in ((target, t_cache), (draft, d_cache)):
            _prefill(model, cache, ids[:, :-1], positions[:, :-1], mask[:, :-1], holes)
    pending, valid, root_pos = ids[:, -1:], None, positions[:, -1]
    metrics.prefill_time_s = clock() - start

    step = 0
    while not all(rows.done):
        t0 = clock()
        active = [not done for done in rows.done]
        pend_pos = (root_pos[:, None] - torch.arange(pending.shape[1] - 1, -1, -1)).clamp(min=0)
        root_logits = _feed_pending(draft, d_cache, pending, valid, pend_pos)
        d_base = cache_mark(d_cache)
        how = Drafting(0.0 if children == "deterministic" else verify_temp, seeds, step, rank_t,
                       children)  # argmax trees at T > 0 are the greedy drafts
        tree = drafter(draft, d_cache, root_logits, pending[:, -1], root_pos, shape, how)
        td = clock()
        metrics.draft_time_s += td - t0
        t_base = cache_mark(t_cache)
        logits = tree_forward(target, t_cache, t_base, tree.tokens, root_pos[:, None] +
                              tree.depths, tree_attention_mask(tree.parents))
        tv = clock()
        metrics.target_time_s += tv - td
        deepest = min(d, tree.tokens.shape[1] - 1)  # a drafter may return fewer nodes
        result = verifier(tree.tokens, tree.parents, target_logits=logits,
                          draft_probs=tree.draft_probs,
                          children="deterministic" if greedy else children,
                          method=method, temperature=verify_temp, seed=seeds,
                          seed_offset=step, max_depth=deepest, validate=False)
        metrics.verify_time_s += clock() - tv
        a = result.num_accepted
        t_keep, fed, n_fed, scattered = _step_keeps(result, tree, deepest)
        host = torch.cat([result.token_ids, a[:, None], scattered[:, None].long(),
                          (a - n_fed)[:, None]], 1).tolist()  # the step's one sync
        _book(rows, metrics, host, active, deepest)
        keep_slots(t_cache, t_base, t_keep)
        keep_slots(d_cache, d_base, fed)
        unseen = [row[-1] for row in host]
        pending, valid = _next_pending(result.token_ids, a, n_fed, 1 + max(unseen),
                                       min(unseen) != max(unseen))
        root_pos = root_pos + a + 1
        step += 1
        metrics.steps = step
        metrics.decode_time_s += clock() - t0

    metrics.new_tokens = sum(len(t) for t in rows.tokens)
    metrics.note_caches(t_cache, d_cache)
    return hf.GenerateResult(rows.sequences(ids, hf._pad_id(pad_token_id, eos)), rows.tokens,
                             metrics)
