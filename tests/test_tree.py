"""Tree verification beyond the conformance kit: the attention mask, the SGLang layout round
trip, dispatch of tree backends, and worked examples whose answers are derived by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify.integrations import sglang
from portable_verify.testing.cases.tree_cases import random_parents, random_tree_call

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def brute_force_mask(parents: np.ndarray) -> np.ndarray:
    b, n = parents.shape
    mask = np.zeros((b, n, n), dtype=bool)
    for r in range(b):
        for i in range(n):
            j = i
            while j >= 0:
                mask[r, i, j] = True
                j = int(parents[r, j])
    return mask


def test_attention_mask_is_self_and_ancestors() -> None:
    parents = random_parents(np.random.default_rng(0), 5, 9)
    want = brute_force_mask(parents)
    assert np.array_equal(pv.tree_attention_mask(parents), want)
    got = pv.tree_attention_mask(torch.from_numpy(parents))
    assert isinstance(got, torch.Tensor) and torch.equal(got, torch.from_numpy(want))


def test_attention_mask_of_a_chain_is_causal() -> None:
    parents = np.arange(-1, 5)[None, :]
    assert np.array_equal(pv.tree_attention_mask(parents)[0], np.tril(np.ones((6, 6), bool)))


def test_deterministic_siblings_worked_example() -> None:
    """Root row p = (0.5, 0.3, 0.2); children 0 then 1 (deterministic). Child 0 passes iff
    u <= 0.5. Else the residual is (0, 0.6, 0.4) and child 1 passes iff u' <= 0.6; else the
    next token is drawn from (0, 0, 1): token 2."""
    p = torch.tensor([[[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    tokens, parents = torch.tensor([[9, 0, 1]]), torch.tensor([[-1, 0, 0]])
    tokens[0, 0] = 0  # the root's id is never read; any valid id

    def run(u1: float, u2: float) -> list[int]:
        u = torch.tensor([[u1, u2, 0.5]])
        return pv.verify_tree(tokens, parents, target_probs=p, uniforms=u).token_ids[0].tolist()

    assert run(0.5, 1.0) == [0, 0, -1]  # child 0 accepted, then node 1's row: token 0
    assert run(0.51, 0.6) == [1, 1, -1]  # child 1 accepted at u' = 0.6 (<= 0.6)
    assert run(0.51, 0.61) == [2, -1, -1]  # both rejected: drawn from the residual


def test_auto_backend_verifies_trees_on_cpu() -> None:
    assert pv.get_backend("numpy").traits.implements("tree", "rejection")
    from portable_verify import dispatch
    assert dispatch.select_backend("auto", "cpu", "rejection", "tree").traits.implements(
        "tree", "rejection")


def test_a_backend_without_trees_is_refused_by_name() -> None:
    reference = type(pv.get_backend("numpy"))

    class NoTrees(reference):  # the reference, serving chains only
        name = "_no_trees"
        traits = dataclasses.replace(reference.traits, layouts=("chain",))

    pv.register_backend("_no_trees", lambda _device: NoTrees())
    try:
        with pytest.raises(ValueError, match="does not verify trees"):
            pv.verify_tree(torch.tensor([[0, 1]]), torch.tensor([[-1, 0]]),
                           target_logits=torch.zeros(1, 2, 3), backend="_no_trees")
    finally:
        pv.unregister_backend("_no_trees")


def to_sglang_lists(tokens: np.ndarray, parents: np.ndarray, rng: np.random.Generator
                    ) -> tuple[np.ndarray, ...]:
    """Our tree as SGLang's lists, with the slots shuffled (root kept at 0) so that their
    sibling order is not slot order. Returns (retrive_index, next_token, next_sibling,
    candidates, slot_of_node)."""
    b, n = tokens.shape
    first = np.full((b, n), -1)
    sibling = np.full((b, n), -1)
    candidates = np.zeros((b, n), dtype=np.int64)
    slot_of = np.zeros((b, n), dtype=np.int64)
    for r in range(b):
        slot_of[r] = np.concatenate([[0], 1 + rng.permutation(n - 1)])
        candidates[r, slot_of[r]] = tokens[r]
        last_child: dict[int, int] = {}
        for i in range(1, n):  # siblings in index order: our sibling order
            p = int(parents[r, i])
            if p in last_child:
                sibling[r, slot_of[r, last_child[p]]] = slot_of[r, i]
            else:
                first[r, slot_of[r, p]] = slot_of[r, i]
            last_child[p] = i
    index = np.arange(b * n).reshape(b, n)
    return index, first, sibling, candidates, slot_of


def sglang_greedy(index, first, sibling, candidates, target_predict, steps):
    """SGLang's published greedy rule (verify_tree_greedy) on their lists, per request."""
    b, n = candidates.shape
    predicts = np.full(b * n, -1)
    accept_index = np.full((b, steps), -1)
    accepted = np.zeros(b, dtype=np.int64)
    for r in range(b):
        last = index[r, 0]
        accept_index[r, 0] = last
        cur = 0
        for _ in range(1, steps):
            cur = first[r, cur]
            while cur != -1:
                if candidates[r, cur] == target_predict[last]:
                    predicts[last] = candidates[r, cur]
                    accepted[r] += 1
                    accept_index[r, accepted[r]] = index[r, cur]
                    last = index[r, cur]
                    break
                cur = sibling[r, cur]
            if cur == -1:
                break
        predicts[last] = target_predict[last]
    return predicts, accept_index, accepted


@pytest.mark.parametrize("seed", range(6))
def test_sglang_round_trip(seed: int) -> None:
    rng = np.random.default_rng(seed)
    call = random_tree_call(rng, "deterministic", greedy_rows=False)
    call.pop("num_nodes", None)
    call.pop("max_depth", None)
    tokens = call["node_token_ids"].numpy().copy()
    tokens[tokens < 0] = 0  # SGLang's candidates hold ids only
    parents = call["parents"].numpy()
    index, first, sibling, candidates, slot_of = to_sglang_lists(tokens, parents, rng)
    tree = sglang.from_sglang(*(torch.from_numpy(a) for a in (index, first, sibling,
                                                              candidates)))
    b, n = tokens.shape
    assert torch.equal(tree.num_reached, torch.full((b,), n))
    # Parents precede children and the renumbered tree is ours up to relabelling.
    new = tree.parents.numpy()
    assert (new[:, 0] == -1).all() and (new[:, 1:] < np.arange(1, n)).all()
    slot_tokens = np.take_along_axis(candidates, tree.permutation.numpy(), 1)
    assert np.array_equal(tree.node_token_ids.numpy(), slot_tokens)
    key = "target_logits" if "target_logits" in call else "target_probs"
    target_ours = call[key]
    target_slots = torch.zeros_like(target_ours)
    for r in range(b):
        target_slots[r, slot_of[r]] = target_ours[r]
    target_new = sglang.permute_rows(target_slots, tree.permutation)
    # Explicit uniforms follow the nodes: node j of the new numbering reads our node's column.
    u_ours = call["uniforms"]
    node_of_slot = np.argsort(slot_of, axis=1)
    ours_of_new = np.take_along_axis(node_of_slot, tree.permutation.numpy(), 1)
    u_new = u_ours.clone()
    u_new[:, : n - 1] = torch.gather(u_ours, 1, torch.from_numpy(ours_of_new[:, 1:] - 1))
    for method in ("greedy", "rejection"):
        ours = pv.verify_tree(torch.from_numpy(tokens), torch.from_numpy(parents),
                              **{key: target_ours}, method=method, uniforms=u_ours)
        theirs = pv.verify_tree(tree.node_token_ids, tree.parents, **{key: target_new},
                                method=method, uniforms=u_new)
        assert torch.equal(ours.token_ids, theirs.token_ids)
        slots_theirs = tree.permutation.gather(1, theirs.node_ids.clamp(min=0))
        slots_ours = torch.from_numpy(slot_of).gather(1, ours.node_ids.clamp(min=0))
        accepted = ours.node_ids >= 0
        assert torch.equal(accepted, theirs.node_ids >= 0)
        assert torch.equal(slots_theirs[accepted], slots_ours[accepted])
        if method == "greedy":  # SGLang's own greedy rule on their lists agrees
            predicts, accept_index, count = sglang.to_sglang(theirs, tree,
                                                             torch.from_numpy(index))
            argmax = target_slots.argmax(-1).reshape(-1).numpy()
            want = sglang_greedy(index, first, sibling, candidates, argmax, n)
            assert np.array_equal(count.numpy(), want[2])
            assert np.array_equal(accept_index.numpy(), want[1])
            on = want[1][want[1] >= 0]
            assert np.array_equal(predicts.numpy()[on], want[0][on])


def test_sglang_lists_from_their_kernel_test() -> None:
    """The layout of sgl-kernel's own greedy test: two requests of 6 slots."""
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    index = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    first = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    tree = sglang.from_sglang(index, first, sibling, candidates)
    # Request 0: 0 -> {1, 3}; 1 -> 2; 3 -> 4 -> 5. Request 1: 0 -> {4, 1}; 4 -> 5; 1 -> 2 -> 3.
    assert tree.permutation[0].tolist() == [0, 1, 3, 2, 4, 5]
    assert tree.parents[0].tolist() == [-1, 0, 0, 1, 2, 4]
    assert tree.permutation[1].tolist() == [0, 4, 1, 5, 2, 3]
    assert tree.parents[1].tolist() == [-1, 0, 0, 1, 2, 4]


@pytest.mark.parametrize("name", ["tree.exact", "tree.chain_equals_verify",
                                  "tree.greedy_brute_force", "tree.unvalidated_garbage"])
def test_torch_device_code_path_on_cpu(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI has no accelerator: run the torch tree backend's device path (torch ops, masks
    instead of index arrays) on CPU tensors through the same checks."""
    from portable_verify.backends.torch import ops as torch_ops
    from portable_verify.testing import kit

    monkeypatch.setattr(torch_ops, "HOST_ARRAYS", False)
    result = kit.run_check(name, "torch:cpu", quick=True)
    assert result.passed, result.detail


def test_typical_takes_the_first_passing_child_not_the_longest_path() -> None:
    """Both root children pass the typical test; the second leads to a longer passing path.
    The tree rule takes the first (Medusa's would take the longer one): docs/semantics.md."""
    p = torch.tensor([[[0.45, 0.45, 0.05, 0.05],   # root: tokens 0 and 1 both pass
                       [0.25, 0.25, 0.25, 0.25],   # node 1 (token 0), a leaf
                       [0.02, 0.02, 0.94, 0.02],   # node 2 (token 1): its child token 2 passes
                       [0.25, 0.25, 0.25, 0.25]]])
    tokens, parents = torch.tensor([[0, 0, 1, 2]]), torch.tensor([[-1, 0, 0, 2]])
    for backend in ("numpy", "torch:cpu", "openvino"):
        res = pv.verify_tree(tokens, parents, target_probs=p, method="typical", seed=0,
                             backend=backend)
        assert res.node_ids[0].tolist()[:2] == [1, -1]
        assert res.num_accepted.tolist() == [1]


def test_max_depth_counts_only_nodes_a_walk_can_reach() -> None:
    """A -1 node's subtree is unreachable, so it cannot make the tree too deep; the same chain
    with the node proposed is one level too deep."""
    parents = torch.tensor([[-1, 0, 1, 2]])
    call = {"target_logits": torch.zeros(1, 4, 3), "max_depth": 1, "method": "greedy"}
    res = pv.verify_tree(torch.tensor([[0, 1, -1, 2]]), parents, **call)
    assert res.token_ids.shape == (1, 2)
    with pytest.raises(ValueError, match="max_depth=1"):
        pv.verify_tree(torch.tensor([[0, 1, 2, 2]]), parents, **call)
