"""Tree drafters (``e2e/tree_drafters.py``): greedy output equal to target-only greedy with
each drafter, the dynamic tree's draft forwards (each frontier node sees its own ancestors
only), batch rows drafted as alone, shapes that never depend on a drawn token, the n-gram trie,
argmax trees at T > 0. Tiny random Llama pairs (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import Batched  # noqa: E402

from portable_verify.e2e import ngram, tree_drafters, tree_loop  # noqa: E402
from portable_verify.e2e.tree_drafters import (  # noqa: E402
    DRAFTERS,
    DynamicDrafter,
    NgramTreeDrafter,
    get_drafter,
    ngram_trie,
)
from portable_verify.e2e.tree_loop import Drafting, TreeShape, tree_generate  # noqa: E402
from portable_verify.integrations import hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 64


def _prompt(seed: int, length: int = 6) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def _reference(target: torch.nn.Module, ids: torch.Tensor, n: int) -> torch.Tensor:
    with torch.inference_mode():
        return target.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)


def _draft(step_model, ids: torch.Tensor, drafter, shape: TreeShape, how: Drafting):
    """Prefill-free drafting from ``ids [B, P]``: the root forward, then ``drafter``."""
    with torch.inference_mode():
        cache = step_model.new_cache()
        p = ids.shape[1]
        logits = step_model.logits(ids, cache, torch.arange(p)[None].expand(ids.shape[0], -1),
                                   None, True)
        tree = drafter(step_model, cache, logits, ids[:, -1], torch.full((ids.shape[0],), p - 1),
                       shape, how)
    return tree, logits, cache


def _how(temperature: float, seeds=(7,), step: int = 0, children: str = "without_replacement"
         ) -> Drafting:
    return Drafting(temperature, torch.tensor(seeds), step, 0.5, children)


@pytest.mark.parametrize("frontier", [1, 3])
@pytest.mark.parametrize("spec", ["2x3", "3x4:8"])
def test_dynamic_tree_greedy_equals_target_only_greedy(pair, spec, frontier):
    target, draft = pair
    scattered = accepted = 0
    for seed in range(3):
        ids = _prompt(seed)
        out = tree_generate(target, draft, ids, max_new_tokens=32, shape=TreeShape.parse(spec),
                            pad_token_id=0, drafter=DynamicDrafter(frontier))
        assert torch.equal(out.sequences, _reference(target, ids, 32)), (spec, seed)
        scattered += out.metrics.scattered_steps
        accepted += out.metrics.accepted_tokens
    assert accepted > 0 and scattered > 0


def test_a_one_node_frontier_is_the_spine_drafter(pair):
    """Greedy, frontier 1: the expanded node at each depth is the most valuable one, the
    argmax child of the last: the spine; the kept set is the same top-N of the same values."""
    _, draft = pair
    step_model = hf.as_step_model(draft)
    for shape in (TreeShape(1, 3, 3), TreeShape(3, 4, 6), TreeShape(2, 3, 5)):
        ids = _prompt(shape.nodes)
        dyn, _, _ = _draft(step_model, ids, DynamicDrafter(1), shape, _how(0.0))
        spine, _, _ = _draft(step_model, ids, DRAFTERS["spine"], shape, _how(0.0))
        for name in ("tokens", "parents", "depths", "draft_slots"):
            assert torch.equal(getattr(dyn, name), getattr(spine, name)), (shape, name)


def _path_logits(step_model, ids: torch.Tensor, tree, i: int) -> torch.Tensor:
    """The draft's logits after node ``i``'s path, from a fresh cache (no tree mask)."""
    path, j = [], i
    while j > 0:
        path.append(int(tree.tokens[0, j]))
        j = int(tree.parents[0, j])
    full = torch.cat([ids[0], torch.tensor(path[::-1], dtype=torch.int64)])[None]
    with torch.inference_mode():
        return step_model.logits(full, step_model.new_cache(),
                                 torch.arange(full.shape[1])[None], None, True)[0].float()


@pytest.mark.parametrize("temperature", [0.0, 1.2])
def test_dynamic_trees_are_well_formed(pair, temperature):
    """Parents first, depths follow parents, at most ``width`` children, fed nodes' parents
    fed, the draft cache grown by the fed nodes only; each fed node's children come from the
    draft's row after its own path (a fresh forward: the frontier mask hides cousins), at
    T > 0 that row is its ``draft_probs`` row."""
    _, draft = pair
    step_model = hf.as_step_model(draft)
    for shape in (TreeShape(2, 3, 4), TreeShape(3, 4, 8), TreeShape(4, 2, 6)):
        ids = _prompt(shape.nodes + 10)
        tree, root_logits, cache = _draft(step_model, ids, DynamicDrafter(3), shape,
                                          _how(temperature))
        n = shape.nodes + 1
        parents, depths, slots = tree.parents[0], tree.depths[0], tree.draft_slots[0]
        assert tree.tokens.shape == (1, n) and int(parents[0]) == -1
        fed = int((slots >= 0).sum())
        assert cache.get_seq_length() >= ids.shape[1] + fed
        for i in range(1, n):
            p = int(parents[i])
            assert 0 <= p < i and int(depths[i]) == int(depths[p]) + 1 <= shape.depth
            assert p == 0 or int(slots[p]) >= 0
            assert int((parents == i).sum()) <= shape.width
        for i in range(n):
            kids = tree.tokens[0][parents == i]
            if not kids.numel():
                continue
            row = root_logits[0].float() if i == 0 else _path_logits(step_model, ids, tree, i)
            if temperature == 0:
                top = set(torch.topk(row, shape.width).indices.tolist())
                assert set(kids.tolist()) <= top, i
            else:
                assert torch.allclose(tree.draft_probs[0, i], torch.softmax(row / temperature,
                                                                            -1), atol=1e-5)
                assert kids.unique().numel() == kids.numel()  # without replacement


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_batched_rows_draft_as_alone(pair, temperature):
    """Three prompts at once (a model with ``tree_logits``) give each row the tree it gets
    alone: the frontier forwards, the top-k choices and the draws are per row."""
    _, draft = pair
    batched = Batched(draft)
    ids = torch.cat([_prompt(s) for s in (1, 2, 3)])
    shape = TreeShape(3, 3, 6)
    seeds = (11, 12, 13)
    both, _, _ = _draft(batched, ids, DynamicDrafter(2), shape, _how(temperature, seeds))
    for r in range(3):
        alone, _, _ = _draft(hf.as_step_model(draft), ids[r: r + 1], DynamicDrafter(2), shape,
                             _how(temperature, seeds[r:r + 1]))
        for name in ("tokens", "parents", "depths", "draft_slots"):
            assert torch.equal(getattr(both, name)[r], getattr(alone, name)[0]), (r, name)
        if temperature:
            assert torch.allclose(both.draft_probs[r], alone.draft_probs[0], atol=1e-5)


@pytest.mark.parametrize("children", ["greedy", "without_replacement", "iid"])
def test_the_batched_spine_is_draft_tree_per_row(pair, children):
    """The spine drafter on three rows at once (its batched path) gives each row what
    ``tree_loop.draft_tree`` (its batch-1 path) gives it alone: same tokens, shape, slots and
    draft rows."""
    _, draft = pair
    ids = torch.cat([_prompt(s) for s in (4, 5, 6)])
    seeds = (21, 22, 23)
    temperature = 0.0 if children == "greedy" else 1.0
    kind = "without_replacement" if children == "greedy" else children
    for shape in (TreeShape(3, 4, 8), TreeShape(2, 3, 3), TreeShape(1, 3, 3)):
        both, _, _ = _draft(Batched(draft), ids, DRAFTERS["spine"], shape,
                            _how(temperature, seeds, 3, kind))
        for r in range(3):
            alone, _, _ = _draft(hf.as_step_model(draft), ids[r: r + 1], DRAFTERS["spine"],
                                 shape, _how(temperature, seeds[r:r + 1], 3, kind))
            for name in ("tokens", "parents", "depths", "draft_slots"):
                assert torch.equal(getattr(both, name)[r], getattr(alone, name)[0]), (r, name)
            if temperature:
                assert torch.allclose(both.draft_probs[r], alone.draft_probs[0], atol=1e-5)


class _PositionalDraft:
    """A draft whose rows depend on the position only, never on the tokens: a tree shape
    chosen from the rows alone must then be the same whatever the children drew."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(5)
        self.table = 2.0 * torch.randn(64, VOCAB, generator=g)

    def new_cache(self):
        return _Count()

    def logits(self, ids, cache, pos, mask, last_only=False):
        cache.n += ids.shape[1]
        out = self.table[pos]
        return out[:, -1] if last_only else out

    def tree_logits(self, ids, cache, pos, mark, visible, last_only):
        return self.logits(ids, cache, pos, None, last_only)


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def mark(self) -> int:
        return self.n


def _own_probability(logits, w, how, depth):
    """Negative control: children valued by their own drawn token's probability."""
    tokens, factor, q = _ORIGINAL_CHILDREN(logits, w, how, depth)
    return (tokens, factor, q) if q is None else (tokens, q.gather(-1, tokens), q)


_ORIGINAL_CHILDREN = tree_drafters._children


@pytest.mark.parametrize("children", ["without_replacement", "iid"])
def test_sampled_shapes_never_depend_on_the_draws(monkeypatch, children):
    """With rows fixed (a positional draft), redrawing every child from other uniforms must
    change tokens but not the kept shape (parents, depths, draft slots). The negative control
    values children by their own drawn probability and must change the shape."""
    draft = _PositionalDraft()
    shape = TreeShape(3, 4, 7)
    ids = torch.tensor([[3, 4, 5]])

    def drafted(offset: int):
        monkeypatch.setattr(tree_drafters, "DYNAMIC_OFFSET", offset)
        return _draft(draft, ids, DynamicDrafter(2), shape, _how(1.0, children=children))[0]

    def shapes_moved() -> tuple[int, int]:
        moved = changed = 0
        for seed in range(6):
            a, b = drafted((1 << 43) + 97 * seed), drafted((1 << 44) + 97 * seed)
            moved += int(not (torch.equal(a.parents, b.parents)
                              and torch.equal(a.depths, b.depths)
                              and torch.equal(a.draft_slots, b.draft_slots)))
            changed += int(not torch.equal(a.tokens, b.tokens))
        return moved, changed

    moved, changed = shapes_moved()
    assert moved == 0 and changed == 6
    monkeypatch.setattr(tree_drafters, "_children", _own_probability)
    moved, _ = shapes_moved()
    assert moved > 0


def test_redrawing_the_deepest_children_keeps_the_shape(pair, monkeypatch):
    """On a real draft (rows depend on the path): redrawing only the last depth's children
    keeps the kept shape and every shallower token (their values come from the rows above)."""
    _, draft = pair
    step_model = hf.as_step_model(draft)
    shape = TreeShape(3, 3, 6)
    original = tree_drafters._children

    def deepest_redrawn(logits, w, how, depth):
        if depth == shape.depth - 1:
            how = Drafting(how.temperature, how.seeds + 1, how.step, how.rank_temperature,
                           how.children)
        return original(logits, w, how, depth)

    for seed in range(4):
        ids = _prompt(seed + 20)
        a, _, _ = _draft(step_model, ids, DynamicDrafter(2), shape, _how(1.0))
        monkeypatch.setattr(tree_drafters, "_children", deepest_redrawn)
        b, _, _ = _draft(step_model, ids, DynamicDrafter(2), shape, _how(1.0))
        monkeypatch.setattr(tree_drafters, "_children", original)
        assert torch.equal(a.parents, b.parents) and torch.equal(a.depths, b.depths)
        shallow = a.depths[0] < shape.depth
        assert torch.equal(a.tokens[0][shallow], b.tokens[0][shallow])


@pytest.mark.parametrize("children", ["without_replacement", "iid", "deterministic"])
def test_sampled_dynamic_runs_are_valid_and_reproducible(pair, children):
    """Sampled trees (and argmax trees at T > 0: ``children="deterministic"``, verified with no
    draft rows) run, reproduce per seed and differ across seeds. The law: test_tree_loop_law."""
    target, draft = pair
    seen = []

    def spy(*args, **kwargs):
        seen.append((kwargs["children"], kwargs["draft_probs"] is None))
        return tree_loop.verify_tree(*args, **kwargs)

    kw = dict(max_new_tokens=24, shape=TreeShape(3, 3, 5), method="traversal", temperature=0.9,
              children=children, drafter=DRAFTERS["dynamic"])
    a = tree_generate(target, draft, _prompt(1), seed=5, verifier=spy, **kw)
    b = tree_generate(target, draft, _prompt(1), seed=5, **kw)
    c = tree_generate(target, draft, _prompt(1), seed=6, **kw)
    assert a.new_tokens == b.new_tokens and a.new_tokens != c.new_tokens
    assert a.metrics.accepted_tokens > 0 and len(a.new_tokens[0]) == 24
    assert set(seen) == {(children, children == "deterministic")}


def test_ngram_trie_on_hand_made_histories():
    """Every distinct continuation becomes a branch, longest match first, then most frequent."""
    # the last 3 tokens (7 8 9) occur twice before, followed by 1 7 and 2 7
    seq = np.array([7, 8, 7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 2, 3, 7, 8, 9])
    tokens, parents = ngram_trie(seq, depth=2, nodes=10, width=4)
    branches = {(t,) if p < 0 else (tokens[p], t) for t, p in zip(tokens, parents, strict=True)}
    # n = 2 (8 9) and n = 1 (9) match at the same starts: two continuations, not six
    assert branches == {(1,), (2,), (1, 7), (2, 7)}
    assert all(p < i for i, p in enumerate(parents))
    # the latest of equally long, equally frequent matches first
    assert tokens[:2] == [2, 1]
    # frequency: only "4" matches (n = 1); 5 follows it three times, 9 once
    seq = np.array([4, 5, 6, 4, 9, 4, 5, 6, 4, 5, 0, 4])
    assert ngram_trie(seq, depth=1, nodes=1, width=4) == ([5], [-1])
    assert ngram_trie(seq, depth=2, nodes=2, width=4) == ([5, 6], [-1, 0])
    # width caps children per node; no match at all gives no node
    assert len(ngram_trie(seq, depth=1, nodes=5, width=1)[0]) == 1
    assert ngram_trie(np.array([1, 2, 3]), depth=3, nodes=4, width=2) == ([], [])


def test_ngram_tree_in_the_loop(pair):
    """The n-gram tree over the prompt-lookup draft: greedy output equal to target-only
    decoding, some drafts accepted, no draft forward; the history keeps only real tokens."""
    target, _ = pair
    accepted = 0
    for seed in range(3):
        base = _prompt(seed, 5)[0]
        ids = torch.cat([base, base, base[:3]])[None]  # repeats for the lookup to find
        out = tree_generate(target, ngram.NgramDraft(VOCAB), ids, max_new_tokens=24,
                            shape=TreeShape(3, 4, 8), pad_token_id=0, drafter=DRAFTERS["ngram"])
        assert torch.equal(out.sequences, _reference(target, ids, 24)), seed
        accepted += out.metrics.accepted_tokens
    assert accepted > 0
    with pytest.raises(ValueError, match="deterministic"):
        tree_generate(target, ngram.NgramDraft(VOCAB), ids, max_new_tokens=4,
                      shape=TreeShape(2, 2, 2), method="rejection", temperature=0.8,
                      drafter=DRAFTERS["ngram"])
    out = tree_generate(target, ngram.NgramDraft(VOCAB), ids, max_new_tokens=12,
                        shape=TreeShape(2, 3, 4), method="rejection", temperature=0.8,
                        children="deterministic", drafter=DRAFTERS["ngram"])
    assert len(out.new_tokens[0]) == 12


def test_ngram_tree_rows_have_the_budget():
    """Every row has ``nodes + 1`` nodes (fillers repeat the last token under the root)."""
    history = ngram.TokenHistory()
    history.append(torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2], [5, 5, 5, 5, 5, 5, 5, 6]]), None)
    shape = TreeShape(2, 3, 5)
    tree = NgramTreeDrafter()(None, history, torch.zeros(2, 8), torch.tensor([2, 6]),
                              torch.tensor([7, 7]), shape, _how(0.0))
    assert tree.tokens.shape == (2, 6) and tree.draft_probs is None
    assert tree.tokens[0, 1:3].tolist() == [4, 3] and tree.parents[0, :3].tolist() == [-1, 0, 0]
    assert tree.tokens[1].tolist() == [6] * 6  # no match: fillers only
    assert (tree.draft_slots == -1).all()


def test_token_history_keeps_tree_slots():
    history = ngram.TokenHistory()
    history.append(torch.tensor([[1, 2, 3, 4, 5, 6]]), None)
    history.keep(2, torch.tensor([3, 1]))
    assert history.row(0).tolist() == [1, 2, 6, 4] and history.mark() == 4
    history.keep(4, torch.tensor([], dtype=torch.int64))
    assert history.row(0).tolist() == [1, 2, 6, 4]


def test_drafter_names_and_arguments():
    assert set(DRAFTERS) == {"spine", "dynamic", "ngram"}
    assert get_drafter("dynamic") is DRAFTERS["dynamic"]
    with pytest.raises(ValueError, match="drafter must be one of"):
        get_drafter("beam")
    assert get_drafter("dynamic:3") == DynamicDrafter(3)
    assert get_drafter("dynamic:1").frontier == 1
    for bad in ("dynamic:0", "dynamic:", "dynamic:x", "spine:2"):
        with pytest.raises(ValueError, match="drafter"):
            get_drafter(bad)
    with pytest.raises(ValueError, match="frontier"):
        DynamicDrafter(0)
    with pytest.raises(ValueError, match="token history"):
        DRAFTERS["ngram"](None, object(), torch.zeros(1, 4), torch.tensor([1]), 3,
                          TreeShape(2, 2, 2), _how(0.0))


def test_the_ngram_history_drops_the_slots_no_row_keeps():
    """``TokenHistory.keep`` left-packs each row's kept slots and drops the rest: a dropped slot
    left as a dead column would be scanned by every later lookup (the history would grow by the
    tree's size every step)."""
    from portable_verify.e2e.ngram import TokenHistory

    history = TokenHistory()
    history.append(torch.tensor([[1, 2, 3], [4, 5, 6]]), None)
    mark = history.mark()
    history.append(torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]]), None)
    history.keep(mark, torch.tensor([[2, 0, -1, -1], [-1, -1, -1, -1]]))
    assert history.mark() == mark + 2  # the widest row's two kept slots, nothing more
    assert history.row(0).tolist() == [1, 2, 3, 9, 7]
    assert history.row(1).tolist() == [4, 5, 6]
    history.keep(history.mark(), torch.full((2, 3), -1))
    assert history.mark() == mark + 2
