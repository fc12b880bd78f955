"""The method table is what every layer reads: docs/semantics.md's list matches it, and a
method that no backend implements is refused clearly at every door and by every backend's own
switch (never run as another method)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyInputs, VerifyOptions

DOCS = Path(__file__).resolve().parents[1] / "docs" / "semantics.md"
FAKE = "_fake"


def _documented() -> dict[str, tuple[str, ...]]:
    """The rows of docs/semantics.md's "Methods" table: name -> (exact, layouts, draft_probs,
    rule)."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Methods", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| ([\w, ]+) \| (\w+) \| ([^|]+) \|$", section,
                      re.MULTILINE)
    return {name: (exact, layouts, probs, rule.strip()) for name, exact, layouts, probs, rule
            in rows}


def test_the_documented_list_is_the_table() -> None:
    documented = _documented()
    assert list(documented) == list(methods.names())
    for name, (exact, layouts, probs, rule) in documented.items():
        m = methods.TABLE[name]
        assert exact == ("yes" if m.exact else "lossy"), name
        assert tuple(layouts.split(", ")) == m.layouts, name
        assert probs == {"uses": "used", "ignores": "ignored"}[m.draft_probs], name
        assert rule == (m.rule or "(every row greedy)"), name


def test_the_documented_list_check_sees_a_missing_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a table with one more row no longer matches the page."""
    monkeypatch.setitem(methods.TABLE, FAKE, methods.Method(
        FAKE, FAKE, True, (methods.CHAIN,), "uses", None, "a test double"))
    with pytest.raises(AssertionError):
        test_the_documented_list_is_the_table()


@pytest.fixture
def fake_method() -> Iterator[str]:
    """A method in the table, serving both layouts, that no backend implements."""
    methods.register(methods.Method(FAKE, FAKE, True, (methods.CHAIN, methods.TREE), "uses",
                                    None, "a method no backend implements"))
    dispatch._SELECTED.clear()
    try:
        yield FAKE
    finally:
        methods.unregister(FAKE)
        dispatch._SELECTED.clear()


def _door_calls(method: str, backend: str) -> dict[str, dict]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    drafts = torch.tensor([[1, 2], [3, 4]])
    return {
        "verify": dict(fn=pv.verify, args=(drafts,), kwargs=dict(
            target_logits=logits, method=method, backend=backend, seed=0)),
        "verify_ragged": dict(fn=pv.verify_ragged, args=(drafts.reshape(-1),), kwargs=dict(
            num_draft_tokens=torch.tensor([2, 2]), target_logits=logits.reshape(6, 5),
            method=method, backend=backend, seed=0)),
        "verify_rows": dict(fn=pv.verify_rows, args=(drafts,), kwargs=dict(
            target_rows=torch.arange(6).reshape(2, 3), target_logits=logits.reshape(6, 5),
            options=VerifyOptions(method), backend=backend, seed=0)),
        "verify_tree": dict(fn=pv.verify_tree, args=(torch.tensor([[0, 1, 2]] * 2),
                                                     torch.tensor([[-1, 0, 0]] * 2)),
                            kwargs=dict(target_logits=logits, method=method, backend=backend,
                                        seed=0)),
    }


@pytest.mark.parametrize("door", ["verify", "verify_ragged", "verify_rows", "verify_tree"])
def test_every_door_refuses_a_method_no_backend_has(fake_method: str, door: str) -> None:
    call = _door_calls(fake_method, "auto")[door]
    with pytest.raises(ValueError, match=f"no backend implements method='{fake_method}'"):
        call["fn"](*call["args"], **call["kwargs"])


@pytest.mark.parametrize("backend", pv.available_backends())
@pytest.mark.parametrize("door", ["verify", "verify_ragged", "verify_rows", "verify_tree"])
def test_every_named_backend_refuses_it_by_name(fake_method: str, backend: str,
                                                door: str) -> None:
    call = _door_calls(fake_method, backend)[door]
    with pytest.raises(ValueError, match=f"method='{fake_method}' for chains is not implemented"
                       if door != "verify_tree" else
                       f"method='{fake_method}' for trees is not implemented"):
        call["fn"](*call["args"], **call["kwargs"])


def _chain_inputs(method: str) -> VerifyInputs:
    g = torch.Generator().manual_seed(1)
    return VerifyInputs(
        draft_token_ids=torch.tensor([[1, 2], [3, 4]]), num_draft_tokens=torch.tensor([2, 2]),
        target=torch.randn(6, 5, generator=g), target_rows=torch.arange(6).reshape(2, 3),
        target_is_logits=True, draft_probs=None, draft_rows=None,
        temperature=torch.ones(2), all_greedy=False, none_greedy=True,
        uniforms=torch.full((2, 3), 0.5), options=VerifyOptions(method))


def _tree_inputs(method: str) -> TreeInputs:
    g = torch.Generator().manual_seed(2)
    return TreeInputs(
        node_token_ids=torch.tensor([[0, 1, 2]]), parents=torch.tensor([[-1, 0, 0]]),
        num_nodes=torch.tensor([3]), target=torch.randn(3, 5, generator=g),
        target_is_logits=True, draft_probs=None, children="deterministic",
        temperature=torch.ones(1), all_greedy=False, none_greedy=True,
        uniforms=torch.full((1, 3), 0.5), width=3, options=VerifyOptions(method))


def _own(backend: pv.Backend, inputs: VerifyInputs | TreeInputs) -> VerifyInputs | TreeInputs:
    return dispatch.numpy_inputs(inputs) if backend.array_kind == "numpy" else inputs


@pytest.mark.parametrize("backend", pv.available_backends())
def test_every_backend_switch_ends_in_a_clear_error(fake_method: str, backend: str) -> None:
    """Called past dispatch (as a missed filter would), each backend's own switch refuses the
    rule by name instead of running rejection sampling."""
    chosen = pv.get_backend(backend)
    with pytest.raises(NotImplementedError, match=fake_method):
        chosen.run(_own(chosen, _chain_inputs(fake_method)))
    with pytest.raises(NotImplementedError, match=fake_method):
        chosen.run_tree(_own(chosen, _tree_inputs(fake_method)))


def test_a_chain_method_is_refused_for_trees_with_its_counterpart() -> None:
    call = _door_calls("block", "auto")["verify_tree"]
    with pytest.raises(ValueError, match=r"method='block' does not verify trees.*'traversal'"):
        call["fn"](*call["args"], **call["kwargs"])
    call = _door_calls("traversal", "auto")["verify"]
    with pytest.raises(ValueError, match=r"method='traversal' does not verify chains.*'block'"):
        call["fn"](*call["args"], **call["kwargs"])


def test_an_unknown_method_names_the_choices() -> None:
    with pytest.raises(ValueError, match="method must be one of"):
        pv.verify(torch.tensor([[1]]), target_logits=torch.zeros(1, 2, 3), method="nosuch")
    with pytest.raises(ValueError, match="method must be one of"):
        VerifyOptions("nosuch")


def test_built_in_methods_cannot_be_removed_or_registered_twice() -> None:
    with pytest.raises(ValueError, match="built in"):
        methods.unregister("rejection")
    with pytest.raises(ValueError, match="already"):
        methods.register(methods.TABLE["block"])


def test_a_rule_declared_without_an_implementation_fails_loudly_numba(
        fake_method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A code in numba's rule table that the entry kernels have no branch for: each entry
    kernel flags it and the host names the rule, on the plain host call, the general path and
    the tree walk (never rejection sampling under the new name)."""
    if not pv.get_backend("numba").availability().available:
        pytest.skip("numba is not installed")
    from portable_verify.backends.numba import backend as numba_backend
    from portable_verify.backends.numba import rules

    monkeypatch.setitem(rules.CHAIN, fake_method, 99)
    monkeypatch.setitem(rules.TREE, fake_method, 99)
    chosen = pv.get_backend("numba")
    with pytest.raises(NotImplementedError, match=fake_method):
        chosen.run(_chain_inputs(fake_method))
    with pytest.raises(NotImplementedError, match=fake_method):
        chosen.run_tree(_tree_inputs(fake_method))
    traits = numba_backend.NumbaBackend.traits
    monkeypatch.setattr(numba_backend.NumbaBackend, "traits",
                        dataclasses.replace(traits, chain_rules=tuple(rules.CHAIN)))
    call = _door_calls(fake_method, "numba")["verify"]
    with pytest.raises(NotImplementedError, match=fake_method):
        call["fn"](*call["args"], **call["kwargs"])


def test_a_rule_declared_without_an_implementation_fails_loudly_openvino(
        fake_method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO's tables: a chain rule routed to the token-wise graphs without a graph builder
    (``chain_graphs.SAMPLED``), a tree rule declared without a walk (``tree.WALKS``)."""
    if not pv.get_backend("openvino").availability().available:
        pytest.skip("openvino is not installed")
    from portable_verify.backends.openvino import backend as ov_backend
    from portable_verify.backends.openvino import tree as ov_tree

    assert tuple(ov_tree.WALKS) == ov_backend.TREE_RULES  # declared = implemented
    monkeypatch.setitem(ov_backend.CHAIN_RULES, fake_method, ov_backend._token_wise)
    monkeypatch.setattr(ov_backend, "TREE_RULES", (*ov_backend.TREE_RULES, fake_method))
    chosen = pv.get_backend("openvino")
    with pytest.raises(NotImplementedError, match=fake_method):
        chosen.run(_own(chosen, _chain_inputs(fake_method)))
    with pytest.raises(NotImplementedError, match=fake_method):
        chosen.run_tree(_own(chosen, _tree_inputs(fake_method)))


def test_a_rule_declared_without_an_implementation_is_flagged_triton(
        fake_method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's tables (``triton/spec.py``): a code declared there that the chain and tree
    kernels have no branch for is flagged on the device (``num_accepted = -1``, a row of
    placeholders), never decided as rejection under the new name (the GPU path reads no
    device value, so the flag is the kernel's answer)."""
    if not pv.get_backend("triton:interpreter").availability().available:
        pytest.skip("Triton's interpreter is not available")
    from portable_verify.backends.triton import spec

    monkeypatch.setitem(spec.RULE_CODES, fake_method, len(spec.RULE_CODES))
    monkeypatch.setitem(spec.TREE_RULE_CODES, fake_method, len(spec.TREE_RULE_CODES))
    chosen = pv.get_backend("triton:interpreter")
    tokens, accepted = chosen.run(_chain_inputs(fake_method))
    assert accepted.tolist() == [-1] * accepted.shape[0]
    assert (tokens == -1).all()
    _tokens, _nodes, tree_accepted = chosen.run_tree(_tree_inputs(fake_method))
    assert tree_accepted.tolist() == [-1] * tree_accepted.shape[0]
    # The control: the same inputs under rejection's code are decided (accepted >= 0).
    _tokens, accepted = chosen.run(_chain_inputs("rejection"))
    assert (accepted >= 0).all()
