"""Negative controls for traversal verification: the numpy reference with one deliberately
wrong rule, each a subclass of its walk that changes one method (pitfalls of the rule in
docs/semantics.md, "Traversal verification"). Registered under a private name while a check
runs and driven through the public ``verify_tree`` like a real backend. The fifth control, a
without-replacement tree verified as i.i.d., needs no patch: it is the wrong ``children``
argument.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np

import portable_verify as pv
from portable_verify.backends.base import BackendTraits
from portable_verify.backends.numpy import tree as numpy_tree
from portable_verify.backends.numpy.traversal import F32_ONE, Entered, TraversalWalk, weight
from portable_verify.core.tree import TreeInputs
from portable_verify.testing.stats.negative_controls import ControlBackend


class BonusFromRow(TraversalWalk):
    """The next token from the node's target row after its children were rejected."""

    def next_token(self, node: Entered) -> int:
        return super().next_token(self.state(node.node, node.entered))


class KeepWeight(TraversalWalk):
    """The parent's weight kept instead of ``S / (S + 1 - W)``."""

    def new_weight(self, parent: Entered, total: float, x: int) -> float:
        return float(parent.weight)


class SOverQ(TraversalWalk):
    """The parent's weight set to ``min(S / (1 - Q(x)), 1)``."""

    def new_weight(self, parent: Entered, total: float, x: int) -> float:
        qx = float(self.drawn_from(parent, x)[x])
        return min(total / (1.0 - qx), 1.0) if qx < 1 else 1.0


class TokenRatio(TraversalWalk):
    """Token ratios in traversal order: a child's weight leaves out its parent's weight."""

    def enter(self, parent: Entered, child: int) -> Entered:
        x = int(self.tokens[child])
        s = F32_ONE if parent.q is None else np.float32(parent.q[x])
        w = F32_ONE if parent.weight > 0 else parent.weight
        return self.state(child, weight(w, parent.law[x], s))


WALKS: dict[str, type[TraversalWalk]] = {
    "_traversal_bonus_from_row": BonusFromRow,
    "_traversal_keep_weight": KeepWeight,
    "_traversal_s_over_q": SOverQ,
    "_traversal_token_ratio": TokenRatio,
}
VARIANT_OF = {"_traversal_bonus_from_row": "bonus_from_row",
              "_traversal_keep_weight": "keep_weight", "_traversal_s_over_q": "s_over_q",
              "_traversal_token_ratio": "token_ratio"}


class PatchedReference(ControlBackend):
    """The numpy reference with its traversal walk replaced by a wrong variant."""

    array_kind = "numpy"
    description = "a statistical negative control for traversal (not a real backend)"
    traits = BackendTraits(layouts=("chain", "tree"), tree_rules=("traversal",))
    rule: type[TraversalWalk]

    def run(self, inputs):  # type: ignore[no-untyped-def]
        raise NotImplementedError("a traversal control verifies trees only")

    def run_tree(self, inputs: TreeInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with mock.patch.object(numpy_tree, "TraversalWalk", self.rule):
            return numpy_tree.verify_tree_reference(inputs)


@contextmanager
def registered() -> Iterator[None]:
    """The control backends, registered only while the block runs."""
    for name, walk in WALKS.items():
        pv.register_backend(name, lambda _device, n=name, w=walk: PatchedReference(n, w))
    try:
        yield
    finally:
        for name in WALKS:
            pv.unregister_backend(name)
