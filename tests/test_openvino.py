"""The OpenVINO backend agrees with the numpy reference, reports devices, and caches graphs.

Cases are drawn so that drafts are often accepted (a draft is the target's argmax, or a sample
from the draft distribution, most of the time), rows are ragged, some rows are greedy inside a
sampled batch, and vocabularies cover V = 1, primes and sizes that use several argmax blocks.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openvino")

import portable_verify as pv
from portable_verify.backends.openvino import OpenVINOBackend, argmax_block
from portable_verify.backends.openvino_graphs import Variant
from portable_verify.dispatch import get_backend

VOCABS = (1, 2, 7, 50, 257, 512, 1000)  # 512 and 1000 use 2 argmax blocks; 257 is prime


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _case(rng: np.random.Generator, tie_heavy: bool) -> dict[str, Any]:
    """A random batch whose drafts are accepted often enough to reach every branch."""
    b = int(rng.integers(1, 6))
    k = int(rng.integers(0, 5))
    v = int(rng.choice(VOCABS))
    if tie_heavy:  # integer logits in a narrow range: many exact ties in the argmax
        logits = rng.integers(-2, 3, (b, k + 1, v)).astype(np.float32)
    else:
        logits = (rng.standard_normal((b, k + 1, v)) * 3).astype(np.float32)
    if rng.random() < 0.3:  # -inf logits (probability exactly 0), never a whole row
        banned = (rng.random(logits.shape) < 0.3) & (logits < logits.max(-1, keepdims=True))
        logits[banned] = -np.inf
    probs = _softmax(logits)
    draft_probs = _softmax(logits[:, :k] + rng.standard_normal((b, k, v)).astype(np.float32))
    sampled = np.array(
        [[rng.choice(v, p=draft_probs[i, j] / draft_probs[i, j].sum()) for j in range(k)]
         for i in range(b)], dtype=np.int64,
    ).reshape(b, k)
    argmax = logits[:, :k].argmax(-1)
    noise = rng.integers(0, v, (b, k))
    pick = rng.random((b, k))
    drafts = np.where(pick < 0.45, argmax, np.where(pick < 0.85, sampled, noise)).astype(np.int64)
    temperature = (rng.uniform(0.3, 2.0, b) * (rng.random(b) > 0.25)).astype(np.float32)
    return dict(
        drafts=drafts,
        logits=logits,
        probs=probs,
        draft_probs=draft_probs,
        n=rng.integers(0, k + 1, b).astype(np.int64),
        temperature=temperature,
        uniforms=rng.uniform(2**-24, 1.0, (b, k + 1)).astype(np.float32),
    )


def _compare(kwargs: dict[str, Any], drafts: np.ndarray) -> bool:
    ours = pv.verify(drafts, backend="openvino", **kwargs)
    ref = pv.verify(drafts, backend="numpy", **kwargs)
    return np.array_equal(ours.token_ids, ref.token_ids) and np.array_equal(
        ours.num_accepted, ref.num_accepted
    )


@pytest.mark.parametrize("tie_heavy", [True, False])
def test_greedy_matches_reference(tie_heavy: bool) -> None:
    rng = np.random.default_rng(11 + tie_heavy)
    for _ in range(40):
        c = _case(rng, tie_heavy)
        for target in ({"target_logits": c["logits"]}, {"target_probs": c["probs"]}):
            kwargs = dict(target, method="greedy", num_draft_tokens=c["n"])
            assert _compare(kwargs, c["drafts"]), kwargs


def test_greedy_ties_across_argmax_blocks() -> None:
    """The maximum appears in several blocks; the lowest index must win."""
    v = 32000
    block = argmax_block(v)
    logits = np.zeros((2, 2, v), np.float32)
    logits[0, 0, [5 * block + 3, 2 * block + 7, 9 * block]] = 4.0  # first: 2*block + 7
    logits[0, 1, [v - 1, block]] = 1.0  # first: block (start of the second block)
    logits[1, :, v - 1] = 2.0
    drafts = np.array([[2 * block + 7], [v - 1]])
    res = pv.verify(drafts, target_logits=logits, method="greedy", backend="openvino")
    np.testing.assert_array_equal(res.token_ids, [[2 * block + 7, block], [v - 1, v - 1]])
    np.testing.assert_array_equal(res.num_accepted, [1, 1])


_SAMPLED_VARIANTS = ("logits+temperature", "probs", "probs+draft_probs", "logits+draft_probs",
                     "zeros, draft_probs==target")


def _sampled_kwargs(c: dict[str, Any], variant: str) -> dict[str, Any]:
    common = dict(num_draft_tokens=c["n"], uniforms=c["uniforms"])
    k = c["drafts"].shape[1]
    if variant == "logits+temperature":
        return dict(common, target_logits=c["logits"], temperature=c["temperature"])
    if variant == "probs":
        return dict(common, target_probs=c["probs"])
    if variant == "probs+draft_probs":
        return dict(common, target_probs=c["probs"], draft_probs=c["draft_probs"])
    if variant == "logits+draft_probs":
        return dict(common, target_logits=c["logits"], draft_probs=c["draft_probs"],
                    temperature=c["temperature"])
    # q == p with exact zeros: drafts the target gives probability 0 are rejected (p(x) = 0),
    # the residual max(0, p - q) is then empty, and the token must be drawn from p itself.
    logits = c["logits"]
    p = np.where(logits >= np.median(logits, axis=-1, keepdims=True), c["probs"], 0)
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    return dict(common, target_probs=p, draft_probs=p[:, :k].copy())


@pytest.mark.parametrize("method", ["rejection", "typical"])
@pytest.mark.parametrize("variant", _SAMPLED_VARIANTS)
def test_sampled_matches_reference(method: str, variant: str) -> None:
    """Same explicit uniforms, same answer; float-boundary disagreements are counted.

    Both sides compute in float32 but may sum in different orders, so a decision whose two
    sides are within a rounding error could in principle flip. None has been observed; the
    assertion allows none, so a real divergence cannot hide behind that allowance.
    """
    rng = np.random.default_rng([len(method), _SAMPLED_VARIANTS.index(variant)])
    disagreements = []
    for trial in range(30):
        c = _case(rng, tie_heavy=trial % 3 == 0)
        kwargs = dict(_sampled_kwargs(c, variant), method=method)
        if not _compare(kwargs, c["drafts"]):
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
    res = pv.verify(drafts, backend="openvino", **kwargs)
    np.testing.assert_array_equal(res.token_ids, [[2, 5], [2, 2]])  # accepted, then bonus
    assert _compare(kwargs, drafts)
    # Typical with alpha large enough that eps = 0.25 = p(x) is the threshold: not > -> reject,
    # recovered token argmax(p) = 2 (lowest of four ties).
    kwargs = dict(target_probs=probs, uniforms=u, method="typical", typical_eps=0.25,
                  typical_alpha=10.0)
    res = pv.verify(drafts, backend="openvino", **kwargs)
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
            ours = pv.verify(drafts, backend="openvino", **kwargs)
            assert ours.token_ids.shape == (b, k + 1)
            assert _compare(kwargs, drafts), (b, k, v, method)


def test_seeded_uniforms_match_reference() -> None:
    """Without explicit uniforms both backends draw the same numbers from the seeds."""
    rng = np.random.default_rng(5)
    c = _case(rng, tie_heavy=False)
    while c["drafts"].shape[1] == 0:
        c = _case(rng, tie_heavy=False)
    seeds = np.arange(c["drafts"].shape[0], dtype=np.int64) + 77
    kwargs = dict(target_logits=c["logits"], seed=seeds, seed_offset=3)
    assert _compare(kwargs, c["drafts"])


def test_unvalidated_garbage_stays_in_range() -> None:
    """validate=False: NaN rows, ids outside [0, V), counts outside [0, K] and a negative
    temperature give unspecified tokens, but every emitted id is in [0, V) and shapes hold."""
    logits = np.random.default_rng(2).standard_normal((3, 3, 40)).astype(np.float32)
    logits[0] = np.nan
    drafts = np.array([[1, 2], [-5, 10**6], [3, 4]])
    garbage = dict(num_draft_tokens=np.array([2, 7, -1]), temperature=np.array([1.0, -1.0, 0.0],
                                                                                 np.float32))
    for method in ("greedy", "rejection", "typical"):
        res = pv.verify(drafts, target_logits=logits, method=method, backend="openvino",
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
    backend = get_backend("openvino")
    rng = np.random.default_rng(9)
    for b, k, v in [(2, 3, 11), (5, 1, 64), (1, 4, 512)]:
        logits = rng.standard_normal((b, k + 1, v)).astype(np.float32)
        pv.verify(rng.integers(0, v, (b, k)), target_logits=logits, method="greedy",
                  backend="openvino")
        if (b, k, v) == (2, 3, 11):
            first = backend.compiled_model(Variant("greedy"))
    assert backend.compiled_model(Variant("greedy")) is first
    assert sum(key.kind == "greedy" for key in backend._compiled) == 1


def test_concurrent_calls_share_one_backend_safely() -> None:
    """Dispatch hands every thread the same instance and its single infer request per graph."""
    rng = np.random.default_rng(21)
    cases = [_case(rng, tie_heavy=False) for _ in range(8)]
    calls = [(dict(target_logits=c["logits"], temperature=c["temperature"], uniforms=c["uniforms"],
                   num_draft_tokens=c["n"]), c["drafts"]) for c in cases]
    expected = [pv.verify(d, backend="numpy", **kw).token_ids for kw, d in calls]

    def run(call: tuple[dict[str, Any], np.ndarray]) -> np.ndarray:
        return pv.verify(call[1], backend="openvino", **call[0]).token_ids

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(run, calls * 3))
    for i, tokens in enumerate(got):
        np.testing.assert_array_equal(tokens, expected[i % len(calls)])


def test_thread_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env var reaches the compiled model; a bad value is reported, not raised, so that
    ``portable-verify info`` still lists every backend."""
    monkeypatch.setenv("PORTABLE_VERIFY_OPENVINO_THREADS", "1")
    backend = OpenVINOBackend()
    assert backend.compiled_model(Variant("greedy")).get_property("INFERENCE_NUM_THREADS") == 1
    monkeypatch.setenv("PORTABLE_VERIFY_OPENVINO_THREADS", "two")
    status = OpenVINOBackend().availability()
    assert not status.available and "PORTABLE_VERIFY_OPENVINO_THREADS" in status.reason
    with pytest.raises(ValueError, match="num_threads"):
        OpenVINOBackend(num_threads=0)


def test_inference_precision_is_f32() -> None:
    import openvino as ov

    compiled = get_backend("openvino").compiled_model(Variant("greedy"))
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
