"""Traversal verification on the numba, torch, Triton (interpreted) and OpenVINO backends,
beyond the conformance kit.

Each backend is compared token for token with a readable float32 twin of the rule written
here from its statement (docs/semantics.md, "Traversal verification"), on random trees in every
children mode with explicit uniforms; a variant of the twin with one known error (the next
token drawn from the node's own row, not its residual) must disagree on the same trees, so the
comparison has the power to see such an error. Chains must give ``verify(method="block")``'s
answer on the same backend with the same seeds; greedy rows the greedy walk; a NaN in a row
the walk reads is refused with the argument named.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from helpers import TEST_DEVICE, on_test_device

import portable_verify as pv
from portable_verify.backends.numpy.chain import inverse_cdf_draw, softmax
from portable_verify.backends.numpy.tree import children_of
from portable_verify.testing.cases.tree_cases import MODES, random_tree_call

pytest.importorskip("numba")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

ON_HOST = TEST_DEVICE == "cpu"
BACKENDS = ("numba:cpu", "torch:cpu") if ON_HOST else (f"torch:{TEST_DEVICE}",
                                                       f"triton:{TEST_DEVICE}")
"""On ``PORTABLE_VERIFY_TEST_DEVICE`` (helpers.TEST_DEVICE): calls move there
(helpers.on_test_device); the twin and the numpy reference read the host copy."""
SLOW_BACKENDS = ("triton:interpreter", "openvino:CPU") if ON_HOST else ()
"""Compared on fewer cases: the Triton interpreter runs a program per request in numpy; the
OpenVINO walk pays a graph call per step."""
SLOW_CASES = 16


def _available(name: str) -> bool:
    try:
        return pv.get_backend(name).availability().available
    except Exception:  # a missing optional package
        return False


EXTRA = tuple(name for name in SLOW_BACKENDS if _available(name))
F32 = np.float32


def _weight(w: float, r: np.float32, s: np.float32) -> np.float32:
    if w == 0 or r == 0:
        return F32(0.0)
    if s == 0:
        return F32(1.0)
    return min(F32(w) * r / s, F32(1.0))


def _twin_one(call: dict[str, Any], b: int, row_draw: bool = False) -> tuple[list[int], int]:
    """``(accepted nodes, next token)`` of request ``b`` by the rule's statement; ``row_draw``:
    a known error (the next token drawn from the node's own row after its children were
    rejected, not from its residual)."""
    tokens = call["node_token_ids"][b].numpy()
    parents = call["parents"][b].numpy()
    logits = "target_logits" in call
    rows = (call["target_logits"] if logits else call["target_probs"])[b].numpy()
    n_slots, vocab = rows.shape
    n = int(call["num_nodes"][b]) if "num_nodes" in call else n_slots
    max_depth = call.get("max_depth", n_slots - 1)
    t = float(call["temperature"][b]) if "temperature" in call else 1.0
    mode = call["children"]
    q_rows = call["draft_probs"][b].numpy() if mode != "deterministic" else None
    u = call["uniforms"][b].numpy()
    kids = children_of(tokens, parents, n, vocab)

    def p(i: int) -> np.ndarray:
        return softmax(rows[i], t) if logits else rows[i].astype(F32)

    state: dict[int, dict[str, Any]] = {0: {"E": F32(1), "W": 1.0, "R": p(0), "D": p(0),
                                            "k": 0, "depth": 0}}
    state[0]["Q"] = None if q_rows is None else q_rows[0].astype(F32)
    c = 0
    while True:
        while True:  # enter the next children down to the first remaining leaf
            s = state[c]
            options = kids[c] if s["depth"] < max_depth else []
            if s["k"] >= len(options):
                break
            d = options[s["k"]]
            x = int(tokens[d])
            e = _weight(s["W"], s["R"][x], F32(1) if s["Q"] is None else s["Q"][x])
            state[d] = {"E": e, "W": float(e), "R": p(d), "D": p(d), "k": 0,
                        "depth": s["depth"] + 1,
                        "Q": None if q_rows is None else q_rows[d].astype(F32)}
            c = d
        if c == 0:
            d_root = p(0) if row_draw else state[0]["D"]
            return [], int(inverse_cdf_draw(d_root, float(u[n_slots - 1])))
        s = state[c]
        if F32(u[c - 1]) <= s["E"] and float(u[c - 1]) <= s["W"]:
            path = [c]
            while parents[path[0]] > 0:
                path.insert(0, int(parents[path[0]]))
            return path, int(inverse_cdf_draw(p(c) if row_draw else s["D"],
                                              float(u[n_slots - 1])))
        a = int(parents[c])
        x = int(tokens[c])
        sa = state[a]
        qk = sa["Q"] if sa["Q"] is not None else np.eye(vocab, dtype=F32)[x]
        r = np.maximum(F32(sa["W"]) * sa["R"] - qk, F32(0))
        total = float(r.sum(dtype=np.float64))
        if total > 0:
            sa["W"] = total / (total + (1.0 - sa["W"]))
            sa["R"] = (r / r.sum(dtype=F32)).astype(F32)
            sa["D"] = r
        else:
            sa["W"] = 0.0
        if mode == "without_replacement":
            q = sa["Q"].copy()
            q[x] = 0.0
            q_total = q.sum(dtype=F32)
            sa["Q"] = q / q_total if q_total > 0 else q
        sa["k"] += 1
        c = a


def _twin(call: dict[str, Any], row_draw: bool = False) -> np.ndarray:
    """``token_ids`` of the twin; greedy rows take the numpy greedy walk."""
    greedy = pv.verify_tree(**call, method="greedy", backend="numpy").token_ids.numpy()
    out = np.full_like(greedy, -1)
    for b in range(greedy.shape[0]):
        if "temperature" in call and float(call["temperature"][b]) == 0:
            out[b] = greedy[b]
            continue
        path, final = _twin_one(call, b, row_draw)
        ids = [int(call["node_token_ids"][b, c]) for c in path] + [final]
        out[b, :len(ids)] = ids
    return out


def _calls(mode: str, count: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [random_tree_call(rng, mode) for _ in range(count)]


@pytest.mark.parametrize("mode", MODES)
def test_backends_equal_the_rule_on_random_trees(mode: str) -> None:
    """Logits and probabilities, ragged ``num_nodes``, -1 nodes, ``max_depth``, greedy rows."""
    calls = _calls(mode, 80, seed=29)
    wrong_rule_caught = 0
    for index, call in enumerate(calls):
        expected = _twin(call)
        slow = EXTRA if index < SLOW_CASES else ()
        for backend in ("numpy", *BACKENDS, *slow):  # the numpy reference, then each backend
            args = call if backend == "numpy" else on_test_device(call)
            got = pv.verify_tree(**args, method="traversal", backend=backend).token_ids
            assert np.array_equal(got.cpu().numpy(), expected), (backend, call)
        wrong_rule_caught += not np.array_equal(_twin(call, row_draw=True), expected)
    # Negative control: the same comparison sees a known error (pitfall: the next token drawn
    # from the node's row after its children were rejected) on these trees.
    assert wrong_rule_caught >= 5


def test_node_ids_are_the_accepted_path() -> None:
    call = _calls("iid", 1, seed=3)[0]
    call.pop("max_depth", None)
    for backend in BACKENDS:
        res = pv.verify_tree(**on_test_device(call), method="traversal", backend=backend)
        for b in range(res.node_ids.shape[0]):
            a = int(res.num_accepted[b])
            nodes = res.node_ids[b, :a].tolist()
            assert res.node_ids[b, a:].eq(-1).all()
            assert [int(call["parents"][b, c]) for c in nodes] == [0, *nodes][:a]
            assert res.token_ids[b, :a].tolist() == [int(call["node_token_ids"][b, c])
                                                     for c in nodes]


def _chain_call(rng: np.random.Generator, logits: bool, with_q: bool) -> tuple[dict, dict]:
    """The same request as ``verify`` and as ``verify_tree`` on ``parents = [-1, 0, 1, ...]``."""
    b, k, v = int(rng.integers(1, 5)), int(rng.integers(1, 7)), int(rng.integers(2, 50))
    raw = rng.normal(size=(b, k + 1, v)) * rng.choice([0.5, 2.0, 6.0])
    raw[rng.random(raw.shape) < 0.1] = -np.inf
    raw[..., 0] = np.where(np.isinf(raw).all(-1), 0.0, raw[..., 0])
    target = torch.tensor(raw, dtype=torch.float32)
    drafts = torch.from_numpy(rng.integers(0, v, size=(b, k)))
    chain: dict[str, Any] = {"seed": int(rng.integers(1 << 30)), "seed_offset": 7}
    if logits:
        chain["target_logits"] = target
        chain["temperature"] = float(rng.choice([0.6, 1.0, 1.7]))
    else:
        chain["target_probs"] = torch.softmax(target, -1)
    tree = dict(chain)
    if with_q:
        q = rng.random((b, k, v)) ** 3
        q[rng.random(q.shape) < 0.2] = 0.0
        q[..., -1] += 1e-3
        chain["draft_probs"] = torch.tensor(q / q.sum(-1, keepdims=True), dtype=torch.float32)
        tree["draft_probs"] = torch.cat([chain["draft_probs"], torch.full((b, 1, v), 1.0 / v)],
                                        1)
    tree["node_token_ids"] = torch.cat([torch.zeros(b, 1, dtype=torch.int64), drafts], 1)
    tree["parents"] = torch.arange(-1, k).expand(b, k + 1).contiguous()
    chain["draft_token_ids"] = drafts
    return chain, tree


@pytest.mark.parametrize("backend", BACKENDS + EXTRA)
def test_a_chain_is_block_verification(backend: str) -> None:
    """Decision for decision with the same seeds: every chain, from logits and
    probabilities, with and without draft probabilities."""
    rng = np.random.default_rng(2505)
    trials = {"numba:cpu": 120, "triton:interpreter": 16}.get(backend, 40)
    for trial in range(trials):
        chain, tree = _chain_call(rng, logits=trial % 2 == 0, with_q=trial % 3 != 0)
        block = pv.verify(**on_test_device(chain), method="block", backend=backend)
        trav = pv.verify_tree(**on_test_device(tree), method="traversal", backend=backend)
        assert torch.equal(trav.token_ids, block.token_ids), trial
        assert torch.equal(trav.num_accepted, block.num_accepted), trial


@pytest.mark.parametrize("backend", BACKENDS + EXTRA)
def test_greedy_rows_take_the_greedy_walk(backend: str) -> None:
    call = _calls("iid", 1, seed=5)[0]
    call["target_logits"] = call.pop("target_probs", call.get("target_logits"))
    b = call["node_token_ids"].shape[0]
    call["temperature"] = torch.tensor([0.0 if i % 2 == 0 else 1.0 for i in range(b)])
    call = on_test_device(call)
    greedy = pv.verify_tree(**call, method="greedy", backend=backend).token_ids
    trav = pv.verify_tree(**call, method="traversal", backend=backend).token_ids
    assert torch.equal(trav[0::2], greedy[0::2])


def _rooted_pair() -> dict[str, Any]:
    """Root children 1 and 2 (deterministic). Child 1's token is the root row's only mass:
    its weight is 1, so it is always accepted and node 2 is never entered."""
    logits = torch.zeros(1, 3, 4)
    logits[0, 0] = torch.tensor([0.0, 80.0, 0.0, 0.0])
    return {"node_token_ids": torch.tensor([[0, 1, 2]]), "parents": torch.tensor([[-1, 0, 0]]),
            "target_logits": logits, "seed": 5, "method": "traversal"}


def test_validate_true_checks_the_rows_the_walk_enters() -> None:
    call = _rooted_pair()
    call["target_logits"][0, 2, 0] = float("nan")  # node 2: never entered
    if ON_HOST:
        assert pv.verify_tree(**call, backend="numba:cpu").node_ids[0, 0] == 1
        with pytest.raises(ValueError, match="target_logits"):  # torch checks every row first
            pv.verify_tree(**call, backend="torch:cpu")
    call["target_logits"][0, 1, 3] = float("nan")  # node 1: entered by every walk
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="target_logits contains NaN"):
            pv.verify_tree(**on_test_device(call), backend=backend)


def test_an_entered_draft_row_that_is_not_a_distribution_is_refused() -> None:
    call = _rooted_pair()
    q = torch.full((1, 3, 4), 0.25)
    q[0, 0, 3] = float("nan")  # the root's draft row: read by every walk
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="draft_probs"):
            pv.verify_tree(**on_test_device({**call, "draft_probs": q}), children="iid",
                           backend=backend)


def test_numba_answers_do_not_depend_on_the_thread_count(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from portable_verify.backends.numba import tree as numba_tree

    calls = _calls("without_replacement", 4, seed=11)
    answers = []
    for threads in (1, 3):
        monkeypatch.setattr(numba_tree, "threads_for", lambda _values, _b, t=threads: t)
        answers.append([pv.verify_tree(**c, method="traversal", backend="numba:cpu").token_ids
                        for c in calls])
    assert all(torch.equal(a, b) for a, b in zip(*answers, strict=True))
