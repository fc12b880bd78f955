"""The numba tree walk (backends/numba/tree.py) beyond the conformance kit: it is what ``auto``
picks on CPU, its ``validate=True`` checks ride on the rows it reads (so a bad row it never
reads passes, a bad row it reads is refused with the argument named), and its answers do not
depend on the thread count. The kit's tree checks run on it through ``available_backend``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch
from portable_verify.testing.cases.tree_cases import random_tree_call

pytest.importorskip("numba")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAN = float("nan")


def _rooted_pair() -> dict[str, torch.Tensor]:
    """Root children 1 and 2 (deterministic). Child 1's token is the root row's only mass, so
    it is always accepted and node 2's row is never read."""
    logits = torch.zeros(1, 3, 4)
    logits[0, 0] = torch.tensor([0.0, 80.0, 0.0, 0.0])  # p(1) = 1 in float32
    return {"node_token_ids": torch.tensor([[0, 1, 2]]), "parents": torch.tensor([[-1, 0, 0]]),
            "target_logits": logits, "seed": 5}


def test_auto_picks_numba_for_trees_on_cpu() -> None:
    assert dispatch.select_backend("auto", "cpu", "rejection", "tree").qualified_name == "numba:cpu"


def test_validate_true_checks_the_rows_the_walk_reads() -> None:
    call = _rooted_pair()
    call["target_logits"][0, 2, 0] = NAN  # node 2: never entered
    res = pv.verify_tree(**call, backend="numba:cpu")
    assert res.node_ids[0].tolist()[:1] == [1]
    with pytest.raises(ValueError, match="target_logits"):  # the full scan still sees it
        pv.verify_tree(**call, backend="torch:cpu")
    call["target_logits"][0, 1, 3] = NAN  # node 1: entered by every walk
    with pytest.raises(ValueError, match="target_logits contains NaN"):
        pv.verify_tree(**call, backend="numba:cpu")


def test_a_read_draft_row_that_is_not_a_distribution_is_refused() -> None:
    call = _rooted_pair()
    q = torch.full((1, 3, 4), 0.25)
    q[0, 0, 3] = 0.5  # the root's draft row sums to 1.25
    with pytest.raises(ValueError, match="draft_probs rows must sum to 1"):
        pv.verify_tree(**call, draft_probs=q, children="iid", backend="numba:cpu")


def test_a_read_probability_row_that_is_not_a_distribution_is_refused() -> None:
    call = _rooted_pair()
    p = torch.softmax(call.pop("target_logits"), -1)
    p[0, 0] *= 0.9  # sums to 0.9
    with pytest.raises(ValueError, match="target_probs rows must sum to 1"):
        pv.verify_tree(**call, target_probs=p, backend="numba:cpu")


@pytest.mark.parametrize("mode", ["deterministic", "iid", "without_replacement"])
def test_answers_do_not_depend_on_the_thread_count(mode: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_verify.backends.numba import tree as numba_tree

    rng = np.random.default_rng(11)
    calls = [random_tree_call(rng, mode) for _ in range(4)]
    answers = []
    for threads in (1, 3):
        monkeypatch.setattr(numba_tree, "threads_for", lambda _values, _b, t=threads: t)
        answers.append([pv.verify_tree(**c, method=m, backend="numba:cpu").token_ids
                        for c in calls for m in ("greedy", "rejection")])
    assert all(torch.equal(a, b) for a, b in zip(*answers, strict=True))
