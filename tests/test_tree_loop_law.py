"""The sampled tree step's output law: the target's, for every drafter mode and tree rule.

One tree step runs as the tree loop runs it (draft root forward, the drafter, one target
``tree_forward`` over the tree, ``verify_tree``), batched over 2000 requests of one prompt with
per-request seeds (the loop itself is batch 1 over transformers modules; the drafters are
batched, and a model with ``tree_logits`` runs the batch). Rows whose first step emitted one
token take a second step from the prompt plus that token (the loop's next step: a fresh step
counter, fresh uniforms). The first two tokens' empirical law is tested against the target's
exact joint law by chi-square.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("scipy")

from helpers import perturbed, tiny_llama  # noqa: E402

from portable_verify import verify_tree  # noqa: E402
from portable_verify.core import arguments  # noqa: E402
from portable_verify.e2e import tree_drafters, tree_loop  # noqa: E402
from portable_verify.e2e.tree_loop import Drafting, TreeShape, tree_forward  # noqa: E402
from portable_verify.integrations import hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, T, N = 8, 0.8, 2000
SHAPE = TreeShape(3, 2, 4)  # up to 3 children per expanded node, 4 of up to 9 kept


class Batched:
    """A transformers module that runs ``tree_forward`` for a batch whose rows share one
    history length (every row of one prompt at its first steps: no holes)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.step = hf.as_step_model(model)

    def new_cache(self):
        return self.step.new_cache()

    def prefill(self, ids, cache, pos, mask):
        self.step.prefill(ids, cache, pos, mask)

    def logits(self, ids, cache, pos, mask, last_only=False):
        return self.step.logits(ids, cache, pos, mask, last_only)

    def tree_logits(self, ids, cache, pos, mark, visible, last_only):
        allowed = torch.cat([visible.new_ones(*visible.shape[:2], mark), visible], 2)
        mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
        return self.step.logits(ids, cache, pos, mask[:, None], last_only)


SEEN: dict[str, int] = {"bushy": 0, "deep": 0}
"""Trees seen with a node of 2+ children, and with a depth-2 node (the test needs both)."""


def _step(target: Batched, draft: Batched, ids: torch.Tensor, seeds: torch.Tensor, step: int,
          drafter, children: str, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One tree step for ``ids [B, P]``: ``token_ids [B, D + 1]`` and ``num_accepted [B]``."""
    b, p = ids.shape
    pos = torch.arange(p - 1)[None].expand(b, -1)
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    target.prefill(ids[:, :-1], t_cache, pos, None)
    draft.prefill(ids[:, :-1], d_cache, pos, None)
    root_pos = torch.full((b,), p - 1)
    root_logits = draft.logits(ids[:, -1:], d_cache, root_pos[:, None], None, True)
    how = Drafting(0.0 if children == "deterministic" else T, seeds, step,
                   tree_loop.GREEDY_RANK_TEMPERATURE, children)
    tree = drafter(draft, d_cache, root_logits, ids[:, -1], root_pos, SHAPE, how)
    kids = torch.zeros(b, tree.parents.shape[1] + 1, dtype=torch.int64).scatter_add_(
        1, tree.parents + 1, torch.ones_like(tree.parents))[:, 1:]
    SEEN["bushy"] += int((kids >= 2).any(1).sum())
    SEEN["deep"] += int((tree.depths == 2).any(1).sum())
    mark = tree_loop.cache_mark(t_cache)
    logits = tree_forward(target, t_cache, mark, tree.tokens, root_pos[:, None] + tree.depths,
                          _visible(tree.parents))
    out = verify_tree(tree.tokens, tree.parents, target_logits=logits,
                      draft_probs=tree.draft_probs, children=children, method=method,
                      temperature=T, seed=seeds, seed_offset=step, max_depth=SHAPE.depth)
    return out.token_ids, out.num_accepted


def _visible(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]``: node ``j`` visible to node ``i`` when ``j`` is ``i`` or an ancestor."""
    from portable_verify import tree_attention_mask

    return torch.stack([tree_attention_mask(row[None])[0] for row in parents]).bool()


def _two_tokens(target, draft, prompt, drafter, children, method) -> torch.Tensor:
    """``[N, 2]``: each request's first two generated tokens (a second step where needed)."""
    seeds = torch.arange(N, dtype=torch.int64) * 7919 + 17
    seeds = arguments.request_seeds(seeds, N, torch.device("cpu"))
    ids = prompt.expand(N, -1)
    with torch.inference_mode():
        tokens, accepted = _step(target, draft, ids, seeds, 0, drafter, children, method)
        out = tokens[:, :2].clone()
        short = accepted == 0
        if bool(short.any()):
            more = torch.cat([ids[short], tokens[short, :1]], 1)
            again, _ = _step(target, draft, more, seeds[short], 1, drafter, children, method)
            out[short, 1] = again[:, 0]
    return out


def _exact(target: torch.nn.Module, prompt: torch.Tensor) -> torch.Tensor:
    """``P(t1, t2 | prompt)`` under the target at ``T`` (``[V, V]``), by enumeration."""
    with torch.inference_mode():
        p1 = torch.softmax(target(prompt).logits[0, -1].double() / T, -1)
        both = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = torch.softmax(target(both).logits[:, -1].double() / T, -1)
    return p1[:, None] * p2


def _pvalue(pairs: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson goodness of fit over the ``V x V`` cells, cells expecting < 5 merged."""
    from scipy.stats import chi2

    counts = torch.zeros(V, V, dtype=torch.float64).index_put_(
        (pairs[:, 0], pairs[:, 1]), torch.ones(len(pairs), dtype=torch.float64), accumulate=True)
    expected, obs = probs.flatten() * len(pairs), counts.flatten()
    small = expected < 5
    e = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    o = torch.cat([obs[~small], obs[small].sum().reshape(1)])
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


@pytest.fixture(scope="module")
def law_pair():
    target = tiny_llama(4, vocab=V, head_scale=12.0)
    return target, perturbed(target, 0.8, 5)


def _own_probability_children(logits, w, how, depth):
    """Negative control: sampled children valued by their own drawn token's draft probability
    (EAGLE-2's ranking applied to draws), so which draws are kept depends on the draws."""
    tokens, factor, q = _DRAFTED_CHILDREN(logits, w, how, depth)
    return (tokens, factor, q) if q is None else (tokens, q.gather(-1, tokens), q)


_DRAFTED_CHILDREN = tree_drafters._children


def test_sampled_tree_steps_follow_the_target_law(law_pair, monkeypatch):
    """Design: V = 8, 2000 requests, chi-square over the 64 joint cells of the first two
    tokens, each exact configuration accepted at p > 1e-3 (a 0.1% false-alarm rate each, 8
    configurations: ~0.8% for the test). Configurations: the dynamic drafter with children
    drawn without replacement and iid (draft rows passed) and argmax children at T > 0
    (``children="deterministic"``, no draft rows), each under the token-level rule and
    traversal; the spine drafter's batched path, without replacement under the token-level
    rule and iid under traversal. Power: the negative control (sampled children kept by their
    own drawn token's draft probability) runs through the same test and must be rejected at
    p < 1e-6 (measured: ~1e-98)."""
    target, draft = law_pair
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact(target, prompt)
    bt, bd = Batched(target), Batched(draft)
    drafter = tree_drafters.DynamicDrafter(frontier=2)
    pvalues = {}
    for children in ("without_replacement", "iid", "deterministic"):
        for method in ("rejection", "traversal"):
            pairs = _two_tokens(bt, bd, prompt, drafter, children, method)
            pvalues[("dynamic", children, method)] = _pvalue(pairs, exact)
    spine = tree_drafters.DRAFTERS["spine"]  # batched: its per-row path
    for children, method in (("without_replacement", "rejection"), ("iid", "traversal")):
        pairs = _two_tokens(bt, bd, prompt, spine, children, method)
        pvalues[("spine", children, method)] = _pvalue(pairs, exact)
    assert all(p > 1e-3 for p in pvalues.values()), pvalues
    assert SEEN["bushy"] > N and SEEN["deep"] > N, SEEN  # siblings and depth both exercised
    monkeypatch.setattr(tree_drafters, "_children", _own_probability_children)
    pairs = _two_tokens(bt, bd, prompt, drafter, "without_replacement", "rejection")
    control = _pvalue(pairs, exact)
    assert control < 1e-6, (control, pvalues)
