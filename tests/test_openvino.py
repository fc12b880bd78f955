"""The OpenVINO backend agrees with the numpy reference, reports devices, and caches graphs.

Cases are drawn so that drafts are often accepted (a draft is the target's argmax, or a sample
from the draft distribution, most of the time), rows are ragged, some rows are greedy inside a
sampled batch, and vocabularies cover V = 1, primes and sizes that use several argmax blocks.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openvino")

import portable_verify as pv
from portable_verify.backends.openvino.backend import OpenVINOBackend, argmax_block
from portable_verify.backends.openvino.chain_graphs import Variant
from portable_verify.dispatch import get_backend
from portable_verify.testing.cases.random_cases import INPUT_FORMS, CaseSpec, as_numpy, build_case

BACKEND = "openvino:CPU"
VOCABS = (1, 2, 7, 50, 257, 512, 1000)  # 512 and 1000 use 2 argmax blocks; 257 is prime


def _spec(rng: np.random.Generator, tie_heavy: bool) -> CaseSpec:
    """A random ragged batch (some greedy rows) whose drafts are accepted often enough to reach
    every branch; ``tie_heavy``: integer logits, so many exact ties in the argmax."""
    return CaseSpec(batch=int(rng.integers(1, 6)), positions=int(rng.integers(0, 5)),
                    vocab=int(rng.choice(VOCABS)), seed=int(rng.integers(2**31)), ties=tie_heavy,
                    ragged=True, temperature="vector")


def _call(spec: CaseSpec, form: str = "logits") -> tuple[np.ndarray, dict[str, Any]]:
    """The drafts and the other arguments of ``spec`` in ``form``, as numpy arrays."""
    kwargs = as_numpy(build_case(spec.in_form(form)))
    return kwargs.pop("draft_token_ids"), kwargs


def _compare(kwargs: dict[str, Any], drafts: np.ndarray) -> bool:
    ours = pv.verify(drafts, backend=BACKEND, **kwargs)
    ref = pv.verify(drafts, backend="numpy", **kwargs)
    return np.array_equal(ours.token_ids, ref.token_ids) and np.array_equal(
        ours.num_accepted, ref.num_accepted
    )


@pytest.mark.parametrize("tie_heavy", [True, False])
def test_greedy_matches_reference(tie_heavy: bool) -> None:
    rng = np.random.default_rng(11 + tie_heavy)
    for _ in range(40):
        spec = replace(_spec(rng, tie_heavy), temperature="none", uniforms=False)
        for form in ("logits", "probs"):
            drafts, kwargs = _call(spec, form)
            assert _compare(dict(kwargs, method="greedy"), drafts), kwargs


def test_greedy_ties_across_argmax_blocks() -> None:
    """The maximum appears in several blocks; the lowest index must win."""
    v = 32000
    block = argmax_block(v)
    logits = np.zeros((2, 2, v), np.float32)
    logits[0, 0, [5 * block + 3, 2 * block + 7, 9 * block]] = 4.0  # first: 2*block + 7
    logits[0, 1, [v - 1, block]] = 1.0  # first: block (start of the second block)
    logits[1, :, v - 1] = 2.0
    drafts = np.array([[2 * block + 7], [v - 1]])
    res = pv.verify(drafts, target_logits=logits, method="greedy", backend=BACKEND)
    np.testing.assert_array_equal(res.token_ids, [[2 * block + 7, block], [v - 1, v - 1]])
    np.testing.assert_array_equal(res.num_accepted, [1, 1])


ZEROS_Q_EQUALS_P = "zeros, draft_probs==target"


def _sampled_call(spec: CaseSpec, variant: str) -> tuple[np.ndarray, dict[str, Any]]:
    if variant != ZEROS_Q_EQUALS_P:
        return _call(spec, variant)
    # q == p with exact zeros: drafts the target gives probability 0 are rejected (p(x) = 0),
    # the residual max(0, p - q) is then empty, and the token must be drawn from p itself.
    drafts, kwargs = _call(spec, "probs")
    probs = kwargs["target_probs"]
    p = np.where(probs >= np.median(probs, axis=-1, keepdims=True), probs, 0)
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    return drafts, dict(kwargs, target_probs=p, draft_probs=p[:, : drafts.shape[1]].copy())


@pytest.mark.parametrize("method", ["rejection", "typical"])
@pytest.mark.parametrize("variant", [*INPUT_FORMS, ZEROS_Q_EQUALS_P])
def test_sampled_matches_reference(method: str, variant: str) -> None:
    """Same explicit uniforms, same answer; float-boundary disagreements are counted.

    Both sides compute in float32 but may sum in different orders, so a decision whose two
    sides are within a rounding error could in principle flip. None has been observed; the
    assertion allows none, so a real divergence cannot hide behind that allowance.
    """
    rng = np.random.default_rng([len(method), len(variant)])
    disagreements = []
    for trial in range(30):
        drafts, kwargs = _sampled_call(_spec(rng, tie_heavy=trial % 3 == 0), variant)
        if not _compare(dict(kwargs, method=method), drafts):
            disagreements.append(trial)
    assert disagreements == [], f"{len(disagreements)}/30 cases disagree: {disagreements}"


def test_decision_boundaries() -> None:
    """Equalities the random cases never hit: ``u*q == p`` accepts, ``p(x) == threshold``
    rejects (typical), and the draw at ``v = 1`` / ``v = 2**-24`` skips zero-probability
    tokens at either end of the row."""
    row = np.array([0, 0, 0.25, 0.25, 0.25, 0.25, 0, 0], np.float32)
    probs = np.tile(row, (2, 2, 1))
    drafts = np.array([[2], [2]])
    u = np.array([[1.0, 1.0], [1.0, 2.0**-24]], np.float32)
    kwargs = dict(target_probs=probs, draft_probs=probs[:, :1].copy(), uniforms=u)
    res = pv.verify(drafts, backend=BACKEND, **kwargs)
    np.testing.assert_array_equal(res.token_ids, [[2, 5], [2, 2]])  # accepted, then bonus
    assert _compare(kwargs, drafts)
    # Typical with alpha large enough that eps = 0.25 = p(x) is the threshold: not > -> reject,
    # recovered token argmax(p) = 2 (lowest of four ties).
    kwargs = dict(target_probs=probs, uniforms=u, method="typical", typical_eps=0.25,
                  typical_alpha=10.0)
    res = pv.verify(drafts, backend=BACKEND, **kwargs)
    np.testing.assert_array_equal(res.num_accepted, [0, 0])
    np.testing.assert_array_equal(res.token_ids, [[2, -1], [2, -1]])
    assert _compare(kwargs, drafts)


def test_edge_shapes_match_reference() -> None:
    """B = 0, K = 0 and V = 1, for every method."""
    rng = np.random.default_rng(3)
    for b, k, v in [(0, 2, 5), (3, 0, 5), (2, 3, 1), (0, 0, 1)]:
        logits = rng.standard_normal((b, k + 1, v)).astype(np.float32)
        drafts = rng.integers(0, v, (b, k))
        u = rng.uniform(0.1, 1.0, (b, k + 1)).astype(np.float32)
        for method in ("greedy", "rejection", "typical"):
            kwargs = dict(target_logits=logits, method=method, uniforms=u)
            ours = pv.verify(drafts, backend=BACKEND, **kwargs)
            assert ours.token_ids.shape == (b, k + 1)
            assert _compare(kwargs, drafts), (b, k, v, method)


def test_seeded_uniforms_match_reference() -> None:
    """Without explicit uniforms both backends draw the same numbers from the seeds."""
    rng = np.random.default_rng(5)
    spec = _spec(rng, tie_heavy=False)
    while spec.positions == 0:
        spec = _spec(rng, tie_heavy=False)
    drafts, kwargs = _call(replace(spec, uniforms=False))
    seeds = np.arange(spec.batch, dtype=np.int64) + 77
    assert _compare(dict(kwargs, seed=seeds, seed_offset=3), drafts)


def test_unvalidated_garbage_stays_in_range() -> None:
    """validate=False: NaN rows, ids outside [0, V), counts outside [0, K] and a negative
    temperature give unspecified tokens, but every emitted id is in [0, V) and shapes hold."""
    logits = np.random.default_rng(2).standard_normal((3, 3, 40)).astype(np.float32)
    logits[0] = np.nan
    drafts = np.array([[1, 2], [-5, 10**6], [3, 4]])
    garbage = dict(num_draft_tokens=np.array([2, 7, -1]), temperature=np.array([1.0, -1.0, 0.0],
                                                                                 np.float32))
    for method in ("greedy", "rejection", "typical"):
        res = pv.verify(drafts, target_logits=logits, method=method, backend=BACKEND,
                        validate=False, seed=1, **garbage)
        assert res.token_ids.shape == (3, 3)
        emitted = res.token_ids[res.token_ids >= 0]
        assert emitted.size >= 3 and ((emitted >= 0) & (emitted < 40)).all()


def test_unknown_device_is_reported_with_the_available_ones() -> None:
    status = OpenVINOBackend("NOSUCHDEVICE").availability()
    assert not status.available
    assert "NOSUCHDEVICE" in status.reason and "CPU" in status.reason
    with pytest.raises(RuntimeError, match="available devices"):
        pv.verify(np.zeros((1, 1), np.int64), target_logits=np.zeros((1, 2, 3), np.float32),
                  backend="openvino:NOSUCHDEVICE")


def test_missing_openvino_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` fail
    status = OpenVINOBackend().availability()
    assert not status.available and "openvino" in status.reason


def test_compiled_models_are_cached_across_shapes() -> None:
    backend = get_backend(BACKEND)
    rng = np.random.default_rng(9)
    for b, k, v in [(2, 3, 11), (5, 1, 64), (1, 4, 512)]:
        logits = rng.standard_normal((b, k + 1, v)).astype(np.float32)
        pv.verify(rng.integers(0, v, (b, k)), target_logits=logits, method="greedy",
                  backend=BACKEND)
        if (b, k, v) == (2, 3, 11):
            first = backend.compiled_model(Variant())
    assert backend.compiled_model(Variant()) is first
    assert sum(isinstance(key, Variant) and key.kind is None for key in backend._compiled) == 1


def test_block_and_tree_graphs_compile_once_across_shapes() -> None:
    """Every block and tree graph has dynamic shapes: new B, K, N or V reuse the compiled model
    (the first round compiles what the variants need, later rounds add nothing)."""
    backend = get_backend(BACKEND)
    rng = np.random.default_rng(11)
    counts = []
    for b, k, v in [(2, 3, 11), (5, 1, 64), (1, 6, 512)]:
        logits = rng.standard_normal((b, k + 1, v)).astype(np.float32)
        q = rng.dirichlet(np.ones(v), (b, k + 1)).astype(np.float32)
        pv.verify(rng.integers(0, v, (b, k)), target_logits=logits, draft_probs=q[:, :k],
                  method="block", seed=1, backend=BACKEND)
        parents = np.broadcast_to(np.arange(-1, k, dtype=np.int64), (b, k + 1)).copy()
        parents[:, 2:] = rng.integers(0, 2, (b, max(k - 1, 0)))  # some siblings
        nodes = rng.integers(0, v, (b, k + 1))
        for children in ("iid", "without_replacement"):
            pv.verify_tree(nodes, parents, target_logits=logits, draft_probs=q,
                           children=children, seed=2, backend=BACKEND)
        pv.verify_tree(nodes, parents, target_logits=logits, method="typical", seed=2,
                       backend=BACKEND)
        counts.append(len(backend._compiled))
    assert counts[0] == counts[1] == counts[2]


def test_concurrent_calls_share_one_backend_safely() -> None:
    """Dispatch hands every thread the same instance and its single infer request per graph."""
    rng = np.random.default_rng(21)
    calls = [_call(_spec(rng, tie_heavy=False)) for _ in range(8)]
    expected = [pv.verify(d, backend="numpy", **kw).token_ids for d, kw in calls]

    def run(call: tuple[np.ndarray, dict[str, Any]]) -> np.ndarray:
        return pv.verify(call[0], backend=BACKEND, **call[1]).token_ids

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(run, calls * 3))
    for i, tokens in enumerate(got):
        np.testing.assert_array_equal(tokens, expected[i % len(calls)])


def test_thread_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env var reaches the compiled model; a bad value is reported, not raised, so that
    ``portable-verify info`` still lists every backend."""
    monkeypatch.setenv("PORTABLE_VERIFY_OPENVINO_THREADS", "1")
    backend = OpenVINOBackend()
    assert backend.compiled_model(Variant()).get_property("INFERENCE_NUM_THREADS") == 1
    monkeypatch.setenv("PORTABLE_VERIFY_OPENVINO_THREADS", "two")
    status = OpenVINOBackend().availability()
    assert not status.available and "PORTABLE_VERIFY_OPENVINO_THREADS" in status.reason
    with pytest.raises(ValueError, match="num_threads"):
        OpenVINOBackend(num_threads=0)


def test_inference_precision_is_f32() -> None:
    import openvino as ov

    compiled = get_backend(BACKEND).compiled_model(Variant())
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


# (eps, alpha) -> is the draft (p = 0.3 under a row of entropy H ~ 1.168, exp(-H) ~ 0.311)
# accepted: eps binds in the first two, alpha in the last two.
TYPICAL_CASES = [((0.2, 10.0), True), ((0.4, 10.0), False), ((0.9, 0.5), True),
                 ((0.9, 1.2), False)]


@pytest.mark.parametrize("layout", ["chain", "tree"])
def test_typical_parameters_reach_every_graph_family(layout: str) -> None:
    """eps and alpha travel in the call's scalar record to the chain and the tree graphs: each
    of them alone flips the decision, and OpenVINO agrees with the expected answer (and the
    reference) in every case, so a graph that read a wrong entry or a default would fail."""
    p = np.array([0.5, 0.3, 0.1, 0.1], np.float32)
    for (eps, alpha), accepted in TYPICAL_CASES:
        kwargs = dict(method="typical", typical_eps=eps, typical_alpha=alpha, seed=0)
        got = []
        for backend in (BACKEND, "numpy"):
            if layout == "chain":
                res = pv.verify(np.array([[1]]), target_probs=np.tile(p, (1, 2, 1)),
                                backend=backend, **kwargs)
            else:
                res = pv.verify_tree(np.array([[0, 1]]), np.array([[-1, 0]]),
                                     target_probs=np.tile(p, (1, 2, 1)), backend=backend,
                                     **kwargs)
            got.append(int(np.asarray(res.num_accepted)[0]))
        assert got == [int(accepted)] * 2, (eps, alpha, got)


def test_the_scalar_record_carries_blocks_float32_cannot_hold() -> None:
    """The argmax block travels in a float32 record as two parts; the graph rebuilds it
    exactly even where float32 itself would round it (negative control: it does round)."""
    import openvino as ov
    import openvino.opset13 as ops

    from portable_verify.backends.openvino.chain_graphs import block_size
    from portable_verify.backends.openvino.record import argmax_block, call_scalars
    from portable_verify.core.types import DEFAULT_TYPICAL

    def build() -> ov.Model:
        scalars = ops.parameter(ov.PartialShape([-1]), ov.Type.f32, name="scalars")
        return ov.Model([ops.result(block_size(scalars))], [scalars], "block_size")

    backend = OpenVINOBackend()  # compiled as the backend compiles every graph
    prime = 16_777_259  # > 2**24 and prime: its argmax block is itself
    assert int(np.float32(prime)) != prime
    for vocab in (1, 257, 32000, 128256, prime):
        block = argmax_block(vocab)
        (got,) = backend.infer("test: block_size", [call_scalars(vocab, DEFAULT_TYPICAL)],
                               build=build)
        assert int(got) == block, (vocab, block, got)


def test_every_graph_takes_its_per_call_scalars_as_one_record() -> None:
    """No compiled chain or tree graph has a scalar (rank-0) input or more than one input
    named ``scalars``: the per-call scalars reach each graph as the one record."""
    backend = get_backend(BACKEND)
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((2, 3, 300)).astype(np.float32)
    drafts, nodes = rng.integers(0, 300, (2, 2)), rng.integers(0, 300, (2, 3))
    parents = np.array([[-1, 0, 0], [-1, 0, 1]])
    for method in ("greedy", "rejection", "typical", "block"):
        pv.verify(drafts, target_logits=logits, method=method, seed=1, backend=BACKEND)
    for method in ("greedy", "rejection", "typical"):
        pv.verify_tree(nodes, parents, target_logits=logits, method=method, seed=1,
                       backend=BACKEND)
    assert len(backend._compiled) >= 8
    for key, model in backend._compiled.items():
        inputs = model.inputs
        assert all(port.get_partial_shape().rank.get_length() > 0 for port in inputs), key
        assert sum("scalars" in port.get_names() for port in inputs) <= 1, key
