"""The sampled tree loop's output law: the target's, for every drafter, children mode and rule.

The real loop, ``tree_loop.tree_generate``, runs on tiny Llama models converted to OpenVINO
(the runtime that runs trees at any batch, each row with its own live cache slots): one call
per configuration over 4000 rows of one prompt with per-row seeds, three new tokens each. A
row whose first step accepts fewer than two nodes takes its later tokens from a second (or
third) step, after both caches kept the accepted path and dropped the rest: the test checks
that such rows, and rows whose kept node was a sibling rather than the first child, are
common. The three tokens' empirical law is tested against the target's exact joint law,
enumerated in float64 from the target alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openvino")
pytest.importorskip("scipy")

from helpers import perturbed, tiny_llama

from portable_verify import verify_tree
from portable_verify.e2e import openvino_model, tree_drafters
from portable_verify.e2e.tree_loop import TreeShape, tree_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, T, B, K = 8, 0.8, 4000, 3
SHAPE = TreeShape(3, 2, 4)  # 3 children per expanded node, depth 2, 4 nodes kept
PROMPT = torch.tensor([[1, 5, 2]])
ALPHA = 1e-3
"""False-alarm rate per configuration (12 configurations: at most 1.2% for the test)."""
CONTROL_P = 1e-6
"""A negative control must be rejected at least this strongly."""


@pytest.fixture(scope="module")
def law_models(tmp_path_factory) -> dict[str, Any]:
    """The target (non-uniform at ``T``: head scale 12), a perturbed copy as its draft, both
    converted to OpenVINO, and the target's exact law of its first ``K`` tokens at ``T`` and
    at 0.9 (the alternative the fit's power is computed against)."""
    target = tiny_llama(4, vocab=V, head_scale=12.0)
    out: dict[str, Any] = {"exact": _exact(target), "hotter": _exact(target, 0.9)}
    for name, model in (("target", target), ("draft", perturbed(target, 0.8, 5))):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        out[name] = openvino_model.OpenVINOCausalLM(
            openvino_model.export(str(folder), True, "f32"))
    return out


def _exact(target: torch.nn.Module, temperature: float = T) -> torch.Tensor:
    """``P(t1, ..., tK | PROMPT)`` at ``temperature``, flattened to ``[V ** K]`` (index
    ``t1 V^(K-1) + ...``), by enumerating every prefix through the transformers target in
    float64."""
    ids, law = PROMPT, torch.ones(1, dtype=torch.float64)
    with torch.inference_mode():
        for _ in range(K):
            p = torch.softmax(target(ids).logits[:, -1].double() / temperature, -1)
            law = (law[:, None] * p).reshape(-1)
            nxt = torch.arange(V).repeat(ids.shape[0])[:, None]
            ids = torch.cat([ids.repeat_interleave(V, 0), nxt], 1)
    return law


def _bins(values: torch.Tensor, law: torch.Tensor) -> torch.Tensor:
    """``values`` over the ``V ** K`` cells, the cells where ``law`` expects < 5 of ``B`` rows
    merged into one bin (last)."""
    small = law * B < 5
    return torch.cat([values[~small], values[small].sum().reshape(1)])


def _pvalue(tokens: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson goodness of fit of ``tokens [B, K]`` to ``law`` over the merged bins."""
    from scipy.stats import chi2

    cell = (tokens * V ** torch.arange(K - 1, -1, -1)).sum(1)
    obs = _bins(torch.bincount(cell, minlength=V ** K).double(), law)
    e = _bins(law, law) * len(tokens)
    stat = float(((obs - e) ** 2 / e).sum())
    return float(chi2.sf(stat, len(e) - 1))


def _power(law: torch.Tensor, other: torch.Tensor) -> float:
    """P(the fit to ``law`` rejects at ``ALPHA``) when the rows follow ``other``: the
    noncentral chi-square with ``lambda = B sum (other - law)^2 / law`` over the bins."""
    from scipy.stats import chi2, ncx2

    p, q = _bins(law, law), _bins(other, law)
    df = len(p) - 1
    return float(ncx2.sf(chi2.isf(ALPHA, df), df, float(B * ((q - p) ** 2 / p).sum())))


class Recorder:
    """A ``verify_tree`` stand-in that records each step's trees and verdicts (what the loop
    kept), optionally through a wrong rule ``via``."""

    def __init__(self, via: Callable[..., Any] = verify_tree) -> None:
        self.via = via
        self.steps: list[dict[str, torch.Tensor]] = []

    def __call__(self, tokens: torch.Tensor, parents: torch.Tensor, **kwargs: Any) -> Any:
        out = self.via(tokens, parents, **kwargs)
        self.steps.append({"parents": parents.clone(), "accepted": out.num_accepted.clone(),
                           "nodes": out.node_ids.clone()})
        return out


def _run(models: dict[str, Any], drafter: str, children: str, method: str,
         verifier: Recorder) -> torch.Tensor:
    """``[B, K]``: the loop's tokens for ``B`` copies of the prompt, row ``i`` seeded ``i``."""
    out = tree_generate(models["target"], models["draft"], PROMPT.expand(B, -1),
                        max_new_tokens=K, shape=SHAPE, method=method, temperature=T,
                        seed=torch.arange(B), children=children,
                        drafter=tree_drafters.DRAFTERS[drafter], verifier=verifier)
    return torch.tensor(out.new_tokens)


def _later_steps(rec: Recorder) -> dict[str, int]:
    """Rows whose first step left tokens to a later step (``a < K - 1``), kept one accepted
    node (``a = 1``), or kept accepted nodes that are not the tree's first ``a`` (a sibling:
    not a cache suffix); first trees with a node of two or more children, and of depth 2."""
    first = rec.steps[0]
    a, parents, nodes = first["accepted"], first["parents"], first["nodes"]
    kids = torch.zeros(B, parents.shape[1] + 1, dtype=torch.int64).scatter_add_(
        1, parents + 1, torch.ones_like(parents))[:, 1:]
    cols = torch.arange(SHAPE.depth)
    scattered = ((cols < a[:, None]) & (nodes[:, : SHAPE.depth] != cols + 1)).any(1)
    return {"later": int((a < K - 1).sum()), "kept_one": int((a == 1).sum()),
            "scattered": int(scattered.sum()), "bushy": int((kids >= 2).any(1).sum()),
            "deep": int((parents > 0).any(1).sum())}


def _untempered(tokens: torch.Tensor, parents: torch.Tensor, **kwargs: Any) -> Any:
    """Negative control: a loop that verifies at temperature 1 instead of its own."""
    return verify_tree(tokens, parents, **{**kwargs, "temperature": 1.0})


_DRAFTED_CHILDREN = tree_drafters._children


def _own_probability_children(logits: torch.Tensor, w: int, how: Any, depth: int
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Negative control: sampled children valued by their own drawn token's draft probability
    (EAGLE-2's ranking applied to draws), so which draws are kept depends on the draws."""
    tokens, factor, q = _DRAFTED_CHILDREN(logits, w, how, depth)
    return (tokens, factor, q) if q is None else (tokens, q.gather(-1, tokens), q)


CONFIGS = [(drafter, children, method) for drafter in ("spine", "dynamic")
           for children in ("without_replacement", "iid", "deterministic")
           for method in ("rejection", "traversal")]


def test_the_sampled_tree_loop_follows_the_target_law(law_models, monkeypatch):
    """Design: V = 8, T = 0.8, 4000 rows per configuration with seeds 0..3999, chi-square over
    the 512 joint cells of the first three tokens (cells expecting < 5 merged: 79 bins), each
    configuration accepted at p > 1e-3. False-alarm rate: 0.1% per configuration, at most 1.2%
    over the 12 (drafters spine and dynamic x children without replacement, iid and argmax at
    T > 0 x the token-level rule and traversal; Bonferroni); the seeds are fixed, so the
    outcome is too. Power, computed: against the target's law at T = 0.9 (total variation
    0.084 from the law at 0.8), the fit rejects with probability > 0.9999 (asserted > 0.99;
    against T = 0.85, TV 0.044: 0.57). Negative controls, through the same fit, must be
    rejected at p < 1e-6: a loop that verifies at temperature 1, and the dynamic drafter
    keeping sampled children by their own drawn token's draft probability (which nodes are
    kept then depends on the draws; measured p ~ 1e-90 and 1e-210)."""
    exact = law_models["exact"]
    assert _power(exact, law_models["hotter"]) > 0.99
    pvalues, seen = {}, {}
    for drafter, children, method in CONFIGS:
        rec = Recorder()
        pvalues[drafter, children, method] = _pvalue(
            _run(law_models, drafter, children, method, rec), exact)
        seen[drafter, children, method] = _later_steps(rec)
    assert all(p > ALPHA for p in pvalues.values()), pvalues
    for config, count in seen.items():  # the keep and the tree's shape are exercised
        assert count["later"] > B // 10 and count["kept_one"] > B // 20, (config, count)
        assert count["scattered"] > B // 50, (config, count)
        assert count["bushy"] == B and count["deep"] == B, (config, count)
    controls = {"untempered": _pvalue(_run(law_models, "dynamic", "without_replacement",
                                           "rejection", Recorder(_untempered)), exact)}
    monkeypatch.setattr(tree_drafters, "_children", _own_probability_children)
    controls["own probability"] = _pvalue(
        _run(law_models, "dynamic", "without_replacement", "rejection", Recorder()), exact)
    assert all(p < CONTROL_P for p in controls.values()), (controls, pvalues)
