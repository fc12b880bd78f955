"""Block verification: hand-worked decisions, dispatch by method, and the controls of
``stat.block_acceptance``. The joint law and the comparison with the reference on every backend
are conformance checks (``stat.block_*``, ``exact.block``, tests/test_conformance.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch
from portable_verify.backends.torch.backend import TorchBackend
from portable_verify.testing.checks.block_verification import block_acceptance
from portable_verify.testing.stats.negative_controls import controls_registered

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK_BACKENDS = ["numpy", "torch", "numba:cpu", "openvino"]

# V = 2, K = 2. p_0 = (1/2, 1/2), q_0 = (1, 0); p_1 = (1/2, 1/2), q_1 = (1/4, 3/4).
# Drafts x = (0, 1): P_0 = 1/2, P_1 = min(1/2 * (1/2) / (3/4), 1) = 1/3.
# Z_0 = max(1/4 - 1/4, 0) + max(1/4 - 3/4, 0) = 0, so h_0 = 0; h_1 = P_1 = 1/3.
P = torch.tensor([[[0.5, 0.5], [0.5, 0.5], [0.25, 0.75]]])
Q = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
X = torch.tensor([[0, 1]])


def _block(uniforms: list[float], backend: str, **kw) -> list[int]:
    res = pv.verify(X, target_probs=P, draft_probs=Q, uniforms=torch.tensor([uniforms]),
                    method="block", backend=backend, **kw)
    return res.token_ids[0].tolist()


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
def test_a_later_success_overrides_an_earlier_failure(backend: str) -> None:
    """u_0 = 0.9 > P_0 fails position 0, u_1 = 0.25 <= h_1 = 1/3: both drafts are accepted
    (token-wise rejection stops at position 0); the bonus comes from p_2 = (1/4, 3/4)."""
    assert _block([0.9, 0.25, 0.5], backend) == [0, 1, 1]
    rejection = pv.verify(X, target_probs=P, draft_probs=Q, method="rejection", backend=backend,
                          uniforms=torch.tensor([[0.9, 0.25, 0.5]]))
    assert rejection.num_accepted.item() == 0


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
def test_no_success_draws_from_the_first_residual(backend: str) -> None:
    """u_1 = 0.5 > h_1 and h_0 = 0: a = 0, drawn from max(p_0 - q_0, 0) = (0, 1/2): token 1."""
    assert _block([0.1, 0.5, 0.01], backend) == [1, -1, -1]


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
def test_caller_bonus_replaces_the_bonus_draw_only(backend: str) -> None:
    bonus = torch.tensor([0])
    assert _block([0.9, 0.25, 0.99], backend, bonus_token_ids=bonus) == [0, 1, 0]
    assert _block([0.1, 0.5, 0.01], backend, bonus_token_ids=bonus) == [1, -1, -1]


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
def test_draft_equal_to_target_accepts_everything(backend: str) -> None:
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(64, 4, 7, generator=gen), -1)
    drafts = torch.randint(0, 7, (64, 3), generator=gen)
    res = pv.verify(drafts, target_probs=p, draft_probs=p[:, :3], method="block", seed=1,
                    backend=backend)
    assert (res.num_accepted == 3).all()


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
def test_minus_one_drafts_act_as_shorter_counts(backend: str) -> None:
    gen = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(16, 4, 6, generator=gen), -1)
    q = torch.softmax(torch.randn(16, 3, 6, generator=gen), -1)
    drafts = torch.randint(0, 6, (16, 3), generator=gen)
    cut = drafts.clone()
    cut[:, 2] = -1
    kw = {"target_probs": p, "draft_probs": q, "method": "block", "seed": 9, "backend": backend}
    with_cut = pv.verify(cut, **kw)
    shorter = pv.verify(drafts, num_draft_tokens=torch.full((16,), 2), **kw)
    assert torch.equal(torch.as_tensor(with_cut.token_ids), torch.as_tensor(shorter.token_ids))


class _TorchWithoutBlock(TorchBackend):
    """A test double: the torch backend declaring no block rule (every real backend has one)."""

    name = "noblock"
    traits = dataclasses.replace(TorchBackend.traits, chain_rules=("rejection", "typical"))


@pytest.fixture
def backend_without_block(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    dispatch.register_backend("noblock", _TorchWithoutBlock)
    monkeypatch.setitem(dispatch.AUTO_PREFERENCE, "cpu", ("noblock:cpu", "torch:cpu"))
    yield "noblock"
    dispatch.unregister_backend("noblock")


def test_auto_takes_a_backend_with_block_and_an_explicit_one_without_is_refused(
        backend_without_block: str) -> None:
    # auto skips the first preference (it has no block) for the next one that has it ...
    assert dispatch.select_backend("auto", "cpu", "block").name == "torch"
    assert dispatch.select_backend("auto", "cpu", "rejection").name == "noblock"
    auto = pv.verify(X, target_probs=P, draft_probs=Q, method="block", seed=2)
    ref = pv.verify(X, target_probs=P, draft_probs=Q, method="block", seed=2, backend="numpy")
    assert torch.equal(auto.token_ids, ref.token_ids)
    # ... and an explicit backend without it is refused by name.
    with pytest.raises(ValueError, match=r"method='block'.*noblock"):
        pv.verify(X, target_probs=P, draft_probs=Q, method="block", backend="noblock")
    # Greedy calls never need the method: any backend takes them.
    pv.verify(X, target_probs=P, method="block", temperature=0.0, backend="noblock")


def test_numpy_inputs_through_the_lean_path_are_decided_by_block() -> None:
    """The lean CPU path does not know block: numpy inputs reach the full front door."""
    args = {"target_probs": P.numpy(), "draft_probs": Q.numpy(), "method": "block"}
    res = pv.verify(X.numpy(), uniforms=np.array([[0.9, 0.25, 0.5]], np.float32), **args)
    assert res.token_ids.tolist() == [[0, 1, 1]]


def test_wrong_block_rules_fail_the_acceptance_check() -> None:
    """Negative controls of ``stat.block_acceptance``: a rule that stops at the first failure
    or takes ``h`` at the last position as in the middle moves the mean accepted count far
    outside the closed form; ``method="block"`` running token-wise rejection (``_exact_rule``:
    lossless, so only acceptance can show it) misses the per-case closed forms. The correct rule
    in the same test double passes the block tests (its paired rejection mean fails only because
    a control runs block for every method)."""
    with controls_registered():
        exact = block_acceptance("_exact_block_rule", quick=True)
        wrong = {c: block_acceptance(c, quick=True) for c in
                 ("_wrong_block_first_failure", "_wrong_block_h_last_as_middle", "_exact_rule")}
    z_two = exact.stats["z_two_sided"]
    assert all(abs(z) <= z_two for z in exact.stats["case_z"]), exact.stats
    assert abs(exact.stats["paired_z"]["block"]) <= z_two, exact.stats
    token_wise = wrong.pop("_exact_rule")
    assert not token_wise.passed
    assert any(abs(z) > z_two for z in token_wise.stats["case_z"]), token_wise.stats
    for control, result in wrong.items():
        assert not result.passed, (control, result.detail)
        assert abs(result.stats["paired_z"]["block"]) > z_two, (control, result.stats)


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
def test_ragged_door_equals_the_padded_door(backend: str) -> None:
    """verify_ragged with method="block" decides as verify on the padded layout."""
    gen = torch.Generator().manual_seed(5)
    counts = torch.tensor([2, 0, 3, 1])
    b, k, v = 4, 3, 6
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen), -1)
    q = torch.softmax(torch.randn(b, k, v, generator=gen), -1)
    drafts = torch.randint(0, v, (b, k), generator=gen)
    kw = {"method": "block", "seed": torch.arange(b), "backend": backend}
    padded = pv.verify(drafts, target_probs=p, draft_probs=q, num_draft_tokens=counts, **kw)
    flat_d = torch.cat([drafts[i, :n] for i, n in enumerate(counts.tolist())])
    flat_p = torch.cat([p[i, : n + 1] for i, n in enumerate(counts.tolist())])
    flat_q = torch.cat([q[i, :n] for i, n in enumerate(counts.tolist())])
    ragged = pv.verify_ragged(flat_d, num_draft_tokens=counts, target_probs=flat_p,
                              draft_probs=flat_q, max_num_draft_tokens=k, **kw)
    assert torch.equal(ragged.token_ids, padded.token_ids)


def test_without_draft_probs_block_accepts_as_many_as_rejection() -> None:
    """One-hot q: the closed forms of E[a] agree path by path (docs/semantics.md)."""
    from portable_verify.testing.checks.block_verification import expected_accepted
    from portable_verify.testing.stats.exact_laws import EXACT, EXACT_BLOCK

    gen = np.random.default_rng(0)
    for _ in range(20):
        p = gen.dirichlet(np.ones(5), 4)
        drafts = tuple(int(x) for x in gen.integers(0, 5, 3))
        one_hot = np.eye(5)[list(drafts)]
        block = expected_accepted(EXACT_BLOCK, drafts, p, one_hot)[0]
        assert block == pytest.approx(expected_accepted(EXACT, drafts, p, one_hot)[0], abs=1e-12)
    # With real draft probabilities they differ (the gain of stat.block_acceptance).
    q = gen.dirichlet(np.ones(5), 3)
    assert expected_accepted(EXACT_BLOCK, drafts, p, q)[0] != pytest.approx(
        expected_accepted(EXACT, drafts, p, q)[0], abs=1e-6)
