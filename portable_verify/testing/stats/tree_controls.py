"""Negative controls for trees: tree verifiers with one deliberately wrong rule.

Each is a small per-request walk (probabilities only, sampled rows only: what the tree
scenario feeds it) registered under a private name while it runs, and driven through the public
``verify_tree`` like a real backend. Two more controls need no backend: the i.i.d. rule on
children drawn without replacement (the wrong ``children`` argument) and one uniform shared by
the siblings of a level (explicit uniforms, testing/stats/tree_laws.py). ``_tree_exact_rule``
runs the same walk with the right rule and ``_tree_sglang_exact`` SGLang's target-only rule at
thresholds 1: both must *pass*, which shows the controls fail for their bug, not the harness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

import portable_verify as pv
from portable_verify.backends.base import BackendTraits
from portable_verify.core.tree import TreeInputs
from portable_verify.testing.stats.negative_controls import ControlBackend


@dataclasses.dataclass(frozen=True)
class TreeRule:
    """Which rule a control walk follows.

    ``removal_first``: without replacement, ``q`` loses the rejected child *before* the
    residual ``r - q`` is formed (the right order subtracts the ``q`` the child was drawn from).
    ``sglang``: SGLang's target-only rule (one coin per node shared by its children, accept
    while ``coin <= sum p(x_1..x_k) / threshold_acc`` or ``p(x_k) >= threshold_single``) with
    the thresholds ``(single, acc)``; exact only at ``(1, 1)``.
    ``unnormalised_residual``: later siblings are tested against ``max(r - q, 0)`` as it is,
    not renormalised to sum to 1 (too few of them are accepted).
    """

    removal_first: bool = False
    unnormalised_residual: bool = False
    sglang: tuple[float, float] | None = None


class TreeRuleBackend(ControlBackend):
    array_kind = "numpy"
    description = "a statistical negative control for trees (not a real backend)"
    traits = BackendTraits(layouts=("chain", "tree"),  # narrower: a test double's rules
                           chain_rules=("rejection", "typical"),  # narrower: a test double
                           tree_rules=("rejection", "typical"))  # narrower: a test double
    rule: TreeRule

    def run(self, inputs):  # type: ignore[no-untyped-def]
        raise NotImplementedError("a tree control verifies trees only")

    def run_tree(self, inputs: TreeInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        b, w = inputs.batch_size, inputs.width
        tokens = np.full((b, w), -1, dtype=np.int64)
        nodes = np.full((b, w), -1, dtype=np.int64)
        accepted = np.zeros(b, dtype=np.int64)
        for i in range(b):
            path, final = self._walk(inputs, i)
            tokens[i, : len(path) + 1] = [*(int(inputs.node_token_ids[i, c]) for c in path),
                                          final]
            nodes[i, : len(path)] = path
            accepted[i] = len(path)
        return tokens, nodes, accepted

    def _walk(self, inputs: TreeInputs, b: int) -> tuple[list[int], int]:
        n = inputs.num_slots
        parents, tok = inputs.parents[b].tolist(), inputs.node_token_ids[b]
        children: dict[int, list[int]] = {}
        for c in range(1, n):
            children.setdefault(parents[c], []).append(c)
        u = inputs.uniforms[b]
        # SGLang's walk reads one coin per node, independent of the node's own test: drawn
        # from a generator seeded by the request's uniforms (fresh per trial, reproducible).
        coins = (np.random.default_rng((u * 2**24).astype(np.int64).tolist()).random(n)
                 if self.rule.sglang else None)
        path: list[int] = []
        node = 0
        while True:
            kids = children.get(node, [])
            p = inputs.target[b * n + node].astype(np.float64)
            q = None if inputs.draft_probs is None else inputs.draft_probs[b * n + node].astype(
                np.float64)
            chosen, weights = (self._sglang(p, kids, tok, coins[node])
                               if self.rule.sglang else self._test(p, q, kids, tok, u, inputs))
            if chosen is None:
                c = np.cumsum(weights)
                return path, int(min(np.searchsorted(c, u[n - 1] * c[-1]), len(c) - 1))
            path.append(chosen)
            node = chosen

    def _test(self, p: np.ndarray, q: np.ndarray | None, kids: list[int], tok: np.ndarray,
              u: np.ndarray, inputs: TreeInputs) -> tuple[int | None, np.ndarray]:
        r = p / p.sum()
        for child in kids:
            x = int(tok[child])
            if q is None:
                qk = np.zeros(len(p))
                qk[x] = 1.0
            else:
                qk = q
            if r[x] > 0 and u[child - 1] * qk[x] <= r[x]:
                return child, r
            if inputs.children == "without_replacement" and self.rule.removal_first:
                q = _without(q, x)
                qk = q
            residual = np.maximum(r - qk, 0.0)
            if residual.sum() > 0:
                r = residual if self.rule.unnormalised_residual else residual / residual.sum()
            if inputs.children == "without_replacement" and not self.rule.removal_first:
                q = _without(q, x)
        return None, r

    def _sglang(self, p: np.ndarray, kids: list[int], tok: np.ndarray,
                coin: float) -> tuple[int | None, np.ndarray]:
        single, acc = self.rule.sglang
        residual = p.copy()
        prob_acc = 0.0
        for child in kids:
            x = int(tok[child])
            prob_acc += p[x]
            if coin <= prob_acc / acc or p[x] >= single:
                return child, p
            residual[x] = 0.0
        return None, residual if residual.sum() > 0 else p


def _without(q: np.ndarray, x: int) -> np.ndarray:
    q = q.copy()
    q[x] = 0.0
    total = q.sum()
    return q / total if total > 0 else q


TREE_CONTROLS: dict[str, TreeRule] = {
    "_tree_removal_first": TreeRule(removal_first=True),
    "_tree_sglang_thresholds": TreeRule(sglang=(0.7, 0.7)),
    "_tree_unnormalised_residual": TreeRule(unnormalised_residual=True),
}
TREE_POSITIVE: dict[str, TreeRule] = {
    "_tree_exact_rule": TreeRule(),
    "_tree_sglang_exact": TreeRule(sglang=(1.0, 1.0)),
}


@contextmanager
def registered(names: dict[str, TreeRule]) -> Iterator[None]:
    """The control backends, registered only while the block runs."""
    for name, rule in names.items():
        pv.register_backend(name, lambda _device, n=name, r=rule: TreeRuleBackend(n, r))
    try:
        yield
    finally:
        for name in names:
            pv.unregister_backend(name)
