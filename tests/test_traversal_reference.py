"""The numpy reference of traversal verification: chain = block decision for decision, the
method table's refusals, and the token-level rule's conventions (greedy rows, ``-1`` nodes,
``max_depth``, ragged ``num_nodes``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portable_verify as pv


def _chain_case(rng: np.random.Generator, k: int, zeros: bool) -> dict[str, torch.Tensor]:
    """A random batch of chains with ``k`` drafts: logits, probabilities with zeros (some rows
    half zero) and draft rows with zeros, drafts drawn anywhere (also where ``q`` or ``p`` is 0)."""
    b, v = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    logits = torch.tensor(rng.normal(size=(b, k + 1, v)) * 3, dtype=torch.float32)
    probs = torch.softmax(logits, -1)
    q = torch.softmax(torch.tensor(rng.normal(size=(b, k + 1, v)), dtype=torch.float32), -1)
    if zeros:
        probs = probs * torch.from_numpy(rng.random(probs.shape) > 0.4)
        probs[..., 0] += 1e-3
        probs = probs / probs.sum(-1, keepdim=True)
        q = q * torch.from_numpy(rng.random(q.shape) > 0.4)
        q[..., v - 1] += 1e-3
        q = q / q.sum(-1, keepdim=True)
    drafts = torch.from_numpy(rng.integers(0, v, size=(b, k)))
    return {"logits": logits, "probs": probs, "q": q, "drafts": drafts,
            "temperature": torch.tensor(rng.choice([0.0, 0.7, 1.0], size=b),
                                        dtype=torch.float32)}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_chain_equals_block(k: int) -> None:
    """On ``parents = [-1, 0, 1, ...]`` traversal returns block's tokens, counts and the path's
    nodes, in every children mode, from logits (greedy rows included) and from probabilities
    with zeros in ``p`` and ``q``."""
    rng = np.random.default_rng(100 + k)
    for case in range(40):
        c = _chain_case(rng, k, zeros=case % 2 == 1)
        b = c["drafts"].shape[0]
        nodes = torch.cat([torch.zeros(b, 1, dtype=torch.int64), c["drafts"]], 1)
        parents = torch.arange(-1, k).expand(b, k + 1).clone()
        target = ({"target_probs": c["probs"]} if case % 2 else
                  {"target_logits": c["logits"], "temperature": c["temperature"]})
        for mode in ("deterministic", "iid", "without_replacement"):
            q = None if mode == "deterministic" else c["q"]
            common = {**target, "seed": case, "seed_offset": k, "backend": "numpy"}
            block = pv.verify(c["drafts"], draft_probs=None if q is None else q[:, :k],
                              method="block", **common)
            tree = pv.verify_tree(nodes, parents, draft_probs=q, children=mode,
                                  method="traversal", **common)
            assert torch.equal(tree.token_ids, block.token_ids), (case, mode)
            assert torch.equal(tree.num_accepted, block.num_accepted), (case, mode)
            want_nodes = torch.where(torch.arange(k + 1) < block.num_accepted[:, None],
                                     torch.arange(1, k + 2), -1)
            assert torch.equal(tree.node_ids, want_nodes), (case, mode)


def test_chain_verify_refuses_traversal_and_names_block() -> None:
    with pytest.raises(ValueError, match="method='block'"):
        pv.verify(torch.zeros(1, 2, dtype=torch.int64), target_probs=torch.full((1, 3, 4), 0.25),
                  method="traversal", backend="numpy")


def test_tree_refuses_block_and_names_traversal() -> None:
    with pytest.raises(ValueError, match="method='traversal'"):
        pv.verify_tree(torch.zeros(1, 2, dtype=torch.int64), torch.tensor([[-1, 0]]),
                       target_probs=torch.full((1, 2, 4), 0.25), method="block",
                       backend="numpy")


def test_auto_on_trees_stays_token_level() -> None:
    """``auto`` is the token-level rule: same answers as ``rejection``, which differ from
    traversal's on this tree for some seed (a deep first leaf is tested first)."""
    rng = np.random.default_rng(7)
    b, v = 64, 4
    parents = torch.tensor([[-1, 0, 0, 1, 1]]).expand(b, 5).clone()
    nodes = torch.from_numpy(rng.integers(0, v, size=(b, 5)))
    probs = torch.softmax(torch.tensor(rng.normal(size=(b, 5, v)) * 2, dtype=torch.float32), -1)
    q = torch.softmax(torch.tensor(rng.normal(size=(b, 5, v)), dtype=torch.float32), -1)
    common = {"target_probs": probs, "draft_probs": q, "children": "iid", "seed": 3,
              "backend": "numpy"}
    auto = pv.verify_tree(nodes, parents, **common)
    token = pv.verify_tree(nodes, parents, method="rejection", **common)
    trav = pv.verify_tree(nodes, parents, method="traversal", **common)
    assert torch.equal(auto.token_ids, token.token_ids)
    assert not torch.equal(trav.token_ids, token.token_ids)


def _tree_call(rng: np.random.Generator, b: int = 32) -> dict[str, torch.Tensor]:
    v = 5
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3, 2]]).expand(b, 7).clone()
    return {
        "node_token_ids": torch.from_numpy(rng.integers(0, v, size=(b, 7))),
        "parents": parents,
        "target_logits": torch.tensor(rng.normal(size=(b, 7, v)) * 2, dtype=torch.float32),
        "draft_probs": torch.softmax(torch.tensor(rng.normal(size=(b, 7, v)),
                                                  dtype=torch.float32), -1),
        "children": "iid",
    }


def test_greedy_rows_take_the_greedy_walk() -> None:
    """Rows of temperature 0 give the greedy method's answer under traversal."""
    rng = np.random.default_rng(11)
    call = _tree_call(rng)
    temps = torch.tensor([0.0, 1.0] * 16)
    trav = pv.verify_tree(**call, temperature=temps, method="traversal", seed=1,
                          backend="numpy")
    greedy = pv.verify_tree(**call, method="greedy", backend="numpy")
    rows = temps == 0
    assert torch.equal(trav.token_ids[rows], greedy.token_ids[rows])
    assert torch.equal(trav.node_ids[rows], greedy.node_ids[rows])


def test_absent_nodes_and_their_subtrees_do_not_exist() -> None:
    """A ``-1`` node, the nodes at or above ``num_nodes`` and the nodes deeper than
    ``max_depth`` (``validate=False``) are never accepted and never change the answer: the same
    tree with them cut off (their slots hidden under a ``-1`` leaf) gives the same result."""
    rng = np.random.default_rng(12)
    call = _tree_call(rng)
    u = torch.from_numpy(rng.random((32, 7)).astype(np.float32)).clamp_min(2.0**-24)
    ids = call["node_token_ids"].clone()
    ids[:, 3] = -1  # node 3 and its child 5 do not exist
    cut = pv.verify_tree(**{**call, "node_token_ids": ids}, uniforms=u, method="traversal",
                         backend="numpy")
    assert not ((cut.node_ids == 3) | (cut.node_ids == 5)).any()
    ragged = pv.verify_tree(**call, num_nodes=torch.full((32,), 5), uniforms=u,
                            method="traversal", backend="numpy")
    tail = call["node_token_ids"].clone()
    tail[:, 5:] = -1
    same = pv.verify_tree(**{**call, "node_token_ids": tail}, uniforms=u, method="traversal",
                          backend="numpy")
    assert torch.equal(ragged.token_ids, same.token_ids)
    shallow = pv.verify_tree(**call, max_depth=1, uniforms=u, method="traversal",
                             backend="numpy", validate=False)  # validate=True refuses it
    deep = call["node_token_ids"].clone()
    deep[:, 3:] = -1  # nodes 3, 4, 5 and 6: every node deeper than 1
    flat = pv.verify_tree(**{**call, "node_token_ids": deep}, uniforms=u, method="traversal",
                          backend="numpy")
    assert shallow.token_ids.shape[1] == 2
    assert torch.equal(shallow.token_ids, flat.token_ids[:, :2])
    assert (flat.num_accepted <= 1).all()


def test_only_the_root_draws_from_its_row() -> None:
    """A tree of only the root emits one token drawn from the root's target row (the draw
    uniform decides): the same as the token-level rule."""
    rng = np.random.default_rng(13)
    probs = torch.softmax(torch.tensor(rng.normal(size=(16, 1, 6)), dtype=torch.float32), -1)
    ids = torch.zeros(16, 1, dtype=torch.int64)
    parents = torch.full((16, 1), -1)
    trav = pv.verify_tree(ids, parents, target_probs=probs, method="traversal", seed=5,
                          backend="numpy")
    token = pv.verify_tree(ids, parents, target_probs=probs, method="rejection", seed=5,
                           backend="numpy")
    assert torch.equal(trav.token_ids, token.token_ids)
    assert (trav.num_accepted == 0).all()
