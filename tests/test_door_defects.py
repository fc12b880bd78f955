"""Regression tests of the engine and tree doors: each runs every available backend (Triton under
its interpreter, ``triton:interpreter``) and every validation level the rule names.

Each test is deterministic (fixed tensors and seeds) and carries its own negative control: a
case the same code must refuse or answer differently, so a check switched off fails the test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import portable_verify as pv

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 6
LEVELS: tuple[bool | str, ...] = (True, False, "full")
BACKENDS = pv.available_backends()
TREE_BACKENDS = [b for b in BACKENDS if "tree" in pv.get_backend(b).traits.layouts]
SEMANTICS = Path(__file__).resolve().parents[1] / "docs" / "semantics.md"


def _same(got: Any, want: Any) -> bool:
    return all(torch.equal(torch.as_tensor(getattr(got, f)), torch.as_tensor(getattr(want, f)))
               for f in ("token_ids", "num_accepted", "num_draft_tokens"))


# ------------------------------------------------- engine calls without num_draft_tokens


def _engine_case() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    b, k = 3, 2
    return {"drafts": torch.randint(0, V, (b, k), generator=g),
            "target": torch.randn(b, k + 1, V, generator=g) * 2,
            "q": torch.softmax(torch.randn(b, k, V, generator=g), -1),
            "rows": torch.arange(b * (k + 1)).reshape(b, k + 1),
            "q_rows": torch.arange(b * k).reshape(b, k)}


def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values behind a non-contiguous view."""
    return torch.stack([x, torch.zeros_like(x)], dim=-1)[..., 0]


ENGINE_FORMS: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "float16 target": lambda c: {**c, "target": c["target"].half()},
    "bfloat16 target": lambda c: {**c, "target": c["target"].bfloat16()},
    "float64 target": lambda c: {**c, "target": c["target"].double()},
    "strided row map": lambda c: {**c, "rows": _strided(c["rows"])},
    "int32 drafts": lambda c: {**c, "drafts": c["drafts"].int()},
    "int32 row maps": lambda c: {**c, "rows": c["rows"].int(), "q_rows": c["q_rows"].int()},
    "float64 draft_probs": lambda c: {**c, "q": c["q"].double()},
}


@pytest.mark.parametrize("form", list(ENGINE_FORMS))
def test_engine_rows_without_counts_answer_as_the_padded_layout(form: str) -> None:
    """No ``num_draft_tokens`` means K drafts each, in every input form (not only the plain)."""
    c = ENGINE_FORMS[form](_engine_case())
    b, k = c["drafts"].shape
    opts = pv.VerifyOptions("rejection")
    for backend in BACKENDS:
        for level in LEVELS:
            kw = {"seed": torch.tensor([1, 2, 3]), "backend": backend, "validate": level}
            want = pv.verify(c["drafts"], target_logits=c["target"], draft_probs=c["q"],
                             options=opts, **kw)
            got = pv.verify_rows(c["drafts"], target_rows=c["rows"],
                                 target_logits=c["target"].reshape(b * (k + 1), V),
                                 draft_probs=c["q"].reshape(b * k, V), draft_rows=c["q_rows"],
                                 options=opts, **kw)
            assert _same(got, want), (form, backend, level)
            assert torch.equal(torch.as_tensor(got.num_draft_tokens), torch.full((b,), k))


# ------------------------------------------------------------ rows after a -1 cut


def _cut_case(method: str, kind: str) -> dict[str, Any]:
    """Three requests cut by ``-1`` at 1, 2 and 0; every target row after the cut and every
    draft row from the cut on holds NaN; the expected answer is the clean call with the cut
    counts on the reference backend."""
    g = torch.Generator().manual_seed(5)
    drafts = torch.tensor([[1, -1, 2], [3, 1, -1], [-1, 2, 2]])
    logits = torch.randn(3, 4, V, generator=g) * 2
    logits[0, 0, 1] = logits[1, 0, 3] = logits[1, 1, 1] = 9.0  # accepted before the cut
    target = logits if kind == "target_logits" else torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(3, 3, V, generator=g), -1) if method in ("rejection",
                                                                            "block") else None
    temps = None if method == "greedy" else torch.tensor(
        [0.0, 1.0, 1.0 if kind == "target_logits" else 0.0])
    kw = {"method": method, "seed": torch.tensor([3, 4, 5]), "temperature": temps}
    want = pv.verify(drafts.clamp(min=0), **{kind: target}, draft_probs=q,
                     num_draft_tokens=torch.tensor([1, 2, 0]), backend="numpy", **kw)
    poisoned = target.clone()
    poisoned[0, 2:] = poisoned[1, 3:] = poisoned[2, 1:] = float("nan")
    if q is not None:
        q = q.clone()
        q[0, 1:] = q[1, 2:] = q[2, :] = float("nan")
    return {"drafts": drafts, "target": poisoned, "q": q, "kw": kw, "want": want}


def _call_in(layout: str, c: dict[str, Any], kind: str, **kw: Any) -> Any:
    """The cut case through the padded, ragged or engine door (or padded in float64: the
    general path on every backend, the compiled kernel's included)."""
    drafts, target, q = c["drafts"], c["target"], c["q"]
    b, k = drafts.shape
    kw = {**c["kw"], **kw}
    if layout in ("padded", "padded float64"):
        target = target.double() if layout == "padded float64" else target
        return pv.verify(drafts, **{kind: target}, draft_probs=q, **kw)
    flat_q = None if q is None else q.reshape(b * k, V)
    if layout == "ragged":
        return pv.verify_ragged(drafts.reshape(-1), num_draft_tokens=torch.full((b,), k),
                                **{kind: target.reshape(-1, V)}, draft_probs=flat_q, **kw)
    return pv.verify_rows(drafts, target_rows=torch.arange(b * (k + 1)).reshape(b, k + 1),
                          **{kind: target.reshape(-1, V)}, draft_probs=flat_q,
                          draft_rows=None if q is None else torch.arange(b * k).reshape(b, k),
                          options=pv.VerifyOptions(kw.pop("method")), **kw)


@pytest.mark.parametrize("kind", ["target_logits", "target_probs"])
@pytest.mark.parametrize("method", ["greedy", "rejection", "typical", "block"])
def test_rows_after_a_minus_one_cut_are_neither_read_nor_checked(method: str, kind: str) -> None:
    c = _cut_case(method, kind)
    for layout in ("padded", "padded float64", "ragged", "rows"):
        for backend in BACKENDS:
            for level in LEVELS:
                got = _call_in(layout, c, kind, backend=backend, validate=level)
                assert _same(got, c["want"]), (layout, backend, level)


@pytest.mark.parametrize("kind", ["target_logits", "target_probs"])
def test_the_row_at_a_minus_one_cut_is_still_checked(kind: str) -> None:
    """Negative control of the test above: the row at the cut is the bonus row, read and
    checked at both checking levels on every backend."""
    c = _cut_case("rejection", kind)
    c["target"][0, 1] = float("nan")
    for backend in BACKENDS:
        for level in (True, "full"):
            with pytest.raises(ValueError, match=kind):
                _call_in("padded", c, kind, backend=backend, validate=level)


# ------------------------------------------------------------ typical options cache


@pytest.mark.parametrize(("valid", "invalid"), [({"typical_eps": 1}, {"typical_eps": True}),
                                                ({"typical_alpha": 0}, {"typical_alpha": False})])
def test_a_bool_typical_option_is_refused_after_its_int_twin(valid: dict[str, int],
                                                             invalid: dict[str, bool]) -> None:
    """``True == 1`` and they hash alike: the options cache must not let the bool through."""
    chain = {"draft_token_ids": torch.tensor([[1]]), "target_logits": torch.randn(1, 2, V),
             "method": "typical", "seed": 0}
    tree = {"node_token_ids": torch.tensor([[0, 1]]), "parents": torch.tensor([[-1, 0]]),
            "target_logits": torch.randn(1, 2, V), "method": "typical", "seed": 0}
    for door, call in ((pv.verify, chain), (pv.verify_tree, tree)):
        for backend in BACKENDS if door is pv.verify else TREE_BACKENDS:
            for level in LEVELS if door is pv.verify else (True, False):
                door(**call, **valid, backend=backend, validate=level)  # cached now
                with pytest.raises(TypeError, match=next(iter(invalid))):
                    door(**call, **invalid, backend=backend, validate=level)


# ------------------------------------------------------------ size options


def _tree(**kw: Any) -> Any:
    return pv.verify_tree(torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 1]]),
                          target_logits=torch.randn(1, 3, V, generator=torch.Generator()
                                                    .manual_seed(0)), seed=0, **kw)


def test_max_depth_beyond_n_minus_one_is_refused_at_every_level() -> None:
    for backend in TREE_BACKENDS:
        for level in (True, False):
            for depth in (3, 10**8, 2**40):  # N = 3: at most 2
                with pytest.raises(ValueError, match="max_depth"):
                    _tree(max_depth=depth, backend=backend, validate=level)
            # control: the deepest allowed depth keeps the full answer and width
            assert tuple(_tree(max_depth=2, backend=backend, validate=level).token_ids.shape) \
                == (1, 3)


def _ragged(**kw: Any) -> Any:
    g = torch.Generator().manual_seed(0)
    return pv.verify_ragged(torch.tensor([1, 2, 3]), num_draft_tokens=torch.tensor([1, 2]),
                            target_logits=torch.randn(5, V, generator=g), seed=0, **kw)


def test_max_num_draft_tokens_beyond_its_bound_is_refused_at_every_level() -> None:
    """At most N, or a padded width of ``MAX_PADDED_WIDTH`` positions (docs/semantics.md)."""
    from portable_verify.api.parse import MAX_PADDED_WIDTH

    for backend in BACKENDS:
        for level in LEVELS:
            for max_k in (MAX_PADDED_WIDTH + 1, 10**8, 2**40):
                with pytest.raises(ValueError, match="max_num_draft_tokens"):
                    _ragged(max_num_draft_tokens=max_k, backend=backend, validate=level)
            # controls: N itself, and a padded width beyond N (an engine's static K)
            assert _ragged(max_num_draft_tokens=3, backend=backend,
                           validate=level).token_ids.shape[1] == 4
            assert _ragged(max_num_draft_tokens=8, backend=backend,
                           validate=level).token_ids.shape[1] == 9


# ------------------------------------------------------------ draft_rows without draft_probs


def _rows_call(form: str, **kw: Any) -> Any:
    g = torch.Generator().manual_seed(2)
    drafts, rows = torch.tensor([[1, 2]]), torch.tensor([[0, 1, 2]])
    target, q = torch.randn(3, V, generator=g), torch.softmax(torch.randn(2, V, generator=g), -1)
    q_rows = torch.tensor([[0, 1]])
    if form == "float64":
        target, q = target.double(), q.double()
    elif form == "numpy":
        drafts, rows, target, q, q_rows = (x.numpy() for x in (drafts, rows, target, q, q_rows))
    pick = {"draft_probs": q, "draft_rows": q_rows}
    return pv.verify_rows(drafts, target_rows=rows, target_logits=target, seed=0,
                          **{name: pick[name] for name in kw.pop("given")}, **kw)


@pytest.mark.parametrize("form", ["plain", "float64", "numpy"])
def test_draft_rows_and_draft_probs_are_refused_apart_in_every_form(form: str) -> None:
    for backend in BACKENDS:
        for level in LEVELS:
            for given in (["draft_rows"], ["draft_probs"]):
                with pytest.raises(ValueError, match="draft_probs and draft_rows come together"):
                    _rows_call(form, given=given, backend=backend, validate=level)
            # control: the pair, and neither, are answered
            _rows_call(form, given=["draft_probs", "draft_rows"], backend=backend,
                       validate=level)
            _rows_call(form, given=[], backend=backend, validate=level)


# ------------------------------------------------------------ typical parameters


def test_a_typical_option_beyond_float_range_is_a_value_error_naming_it() -> None:
    for name, args in (("typical_eps", (10**400, 0.3)), ("typical_alpha", (0.09, -(10**400)))):
        with pytest.raises(ValueError, match=name):
            pv.TypicalParams(*args)
    for backend in BACKENDS:
        for level in LEVELS:
            with pytest.raises(ValueError, match="typical_eps"):
                pv.verify(torch.tensor([[1]]), target_logits=torch.randn(1, 2, V),
                          method="typical", typical_eps=10**400, backend=backend,
                          validate=level)
    assert pv.TypicalParams(10**30, 0.3).eps == 1e30  # control: a large int within range


# ------------------------------------------------------------ the caller's bonus ids


def _accepting_call(method: str, **kw: Any) -> Any:
    """Every draft accepted (the target puts all its mass on them); bonus ids 11 and -7 lie
    outside [0, V)."""
    drafts = torch.tensor([[1, 2], [3, 4]])
    logits = torch.full((2, 3, V), -30.0)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[1, 0, 3] = logits[1, 1, 4] = 30.0
    q = torch.nn.functional.one_hot(drafts, V).float() if method == "block" else None
    return pv.verify(drafts, target_logits=logits, draft_probs=q, method=method, seed=0,
                     bonus_token_ids=torch.tensor([11, -7]), **kw)


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical", "block"])
def test_caller_bonus_ids_pass_through_unchecked_when_unvalidated(method: str) -> None:
    for backend in BACKENDS:
        got = _accepting_call(method, backend=backend, validate=False)
        assert got.token_ids.tolist() == [[1, 2, 11], [3, 4, -7]], backend
        for level in (True, "full"):
            with pytest.raises(ValueError, match="bonus_token_ids"):
                _accepting_call(method, backend=backend, validate=level)


def test_the_unvalidated_guarantee_names_the_callers_bonus_ids() -> None:
    """The pass-through is the documented exception to "emitted ids in [0, V)"."""
    text = SEMANTICS.read_text()
    section = re.search(r"### What `validate=False` guarantees\n(.*?)\n## ", text, re.S)
    assert section is not None
    assert "bonus_token_ids" in section.group(1)


# ------------------------------------------------------------ out-of-range parents


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
def test_an_out_of_range_parent_means_absent_on_every_tree_backend(method: str) -> None:
    """Node 1 (parent out of range, in any bit width) is absent, so its subtree is unreachable
    and only the root's token is emitted. The target's mass is all on token 3."""
    logits = torch.full((1, 4, V), -30.0)
    logits[..., 3] = 30.0
    tokens = torch.tensor([[0, 3, 3, 3]])
    absent = [2**32, 2**32 + 1, 2**31, 2**63 - 1, -(2**63), -(2**32) + 1, -5, 1, 3]
    for backend in TREE_BACKENDS:
        kw = {"target_logits": logits, "method": method, "seed": 0, "validate": False,
              "backend": backend}
        for parent in absent:
            got = pv.verify_tree(tokens, torch.tensor([[-1, parent, 1, 2]]), **kw)
            assert got.node_ids.tolist() == [[-1, -1, -1, -1]], (backend, parent)
            assert got.token_ids.tolist() == [[3, -1, -1, -1]], (backend, parent)
        wide_id = pv.verify_tree(torch.tensor([[0, 2**32 + 3, 3, 3]]),
                                 torch.tensor([[-1, 0, 1, 2]]), **kw)
        assert wide_id.node_ids.tolist() == [[-1, -1, -1, -1]], backend
        # control: a valid parent makes node 1 (and its chain) accepted
        got = pv.verify_tree(tokens, torch.tensor([[-1, 0, 1, 2]]), **kw)
        assert got.node_ids.tolist() == [[1, 2, 3, -1]], backend


def test_numpy_inputs_take_the_same_cut() -> None:
    """The -1 cut through numpy arrays (the plain host form on the compiled kernel)."""
    c = _cut_case("rejection", "target_logits")
    kw = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in c["kw"].items()}
    for backend in BACKENDS:
        for level in LEVELS:
            got = pv.verify(c["drafts"].numpy(), target_logits=c["target"].numpy(),
                            draft_probs=c["q"].numpy(), backend=backend, validate=level, **kw)
            assert np.array_equal(got.token_ids, c["want"].token_ids.numpy()), (backend, level)
