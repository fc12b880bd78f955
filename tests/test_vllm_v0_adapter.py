"""The vLLM-compatible samplers, called exactly as vLLM v0 calls its own (vLLM not installed)."""

from __future__ import annotations

import doctest

import pytest
import torch
from scipy import stats

import portable_verify as pv
from portable_verify.integrations import vllm_v0 as pv_vllm
from portable_verify.integrations.vllm_v0 import RejectionSampler, TypicalAcceptanceSampler


def _one_hot(ids: torch.Tensor, v: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(ids, v).float()


def _random_case(g: torch.Generator, b: int, k: int, v: int) -> tuple[torch.Tensor, ...]:
    target = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2, -1)
    draft_probs = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    drafts = torch.multinomial(draft_probs.reshape(-1, v), 1, generator=g).reshape(b, k)
    bonus = torch.randint(0, v, (b, 1), generator=g)
    return target, bonus, draft_probs, drafts


def test_docstring_examples() -> None:
    outcome = doctest.testmod(pv_vllm)
    assert outcome.attempted > 0 and outcome.failed == 0


@pytest.mark.parametrize("sampler", [RejectionSampler(strict_mode=True),
                                     TypicalAcceptanceSampler(0.0, 0.0, strict_mode=True)])
def test_all_accepted_emits_the_given_bonus(sampler: torch.nn.Module) -> None:
    b, k, v = 5, 3, 7
    g = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, v, (b, k), generator=g)
    bonus = torch.randint(0, v, (b, 1), generator=g)
    # The target puts all mass on the drafts (rejection: q = p, so every test passes); the
    # bonus row points elsewhere, proving the passed bonus token is the one emitted.
    target = torch.cat([_one_hot(drafts, v), _one_hot((bonus + 1) % v, v)], dim=1)
    out = sampler(target, bonus, _one_hot(drafts, v), drafts)
    assert out.dtype == torch.int64 and out.shape == (b, k + 1)
    assert torch.equal(out, torch.cat([drafts, bonus], dim=1))


def test_none_accepted_emits_one_recovered_token() -> None:
    b, k, v = 4, 3, 6
    drafts = torch.tensor([[0, 1, 2], [3, 3, 3], [5, 0, 1], [2, 2, 2]])
    # Position 0 is uniform over every token but the draft (p(x_0) = 0): it always rejects.
    target = torch.full((b, k + 1, v), 1.0 / v)
    target[:, 0] = 1.0 / (v - 1)
    target[torch.arange(b), 0, drafts[:, 0]] = 0.0
    q = _one_hot(drafts, v)
    out = RejectionSampler(strict_mode=True)(target, torch.zeros(b, 1, dtype=torch.int64), q,
                                             drafts)
    assert (out[:, 1:] == -1).all()
    assert (out[:, 0] != drafts[:, 0]).all()  # drawn from max(0, p - q): never the draft
    no_bonus = torch.zeros(b, 1, dtype=torch.int64)
    typical = TypicalAcceptanceSampler(strict_mode=True)(target, no_bonus, None, drafts)
    # argmax of a row with ties: the lowest index other than the zeroed draft.
    want = torch.where(drafts[:, 0] == 0, 1, 0)
    assert torch.equal(typical[:, 0], want) and (typical[:, 1:] == -1).all()


def test_mixed_batch_matches_the_reference_with_the_bonus_substituted() -> None:
    b, k, v = 8, 3, 5
    g = torch.Generator().manual_seed(1)
    target, bonus, q, drafts = _random_case(g, b, k, v)
    gens = {i: torch.Generator().manual_seed(100 + i) for i in range(b)}
    copies = {i: torch.Generator().manual_seed(100 + i) for i in range(b)}
    out = RejectionSampler(strict_mode=True)(target, bonus, q, drafts, seeded_seqs=gens)
    seeds = torch.cat([torch.randint(0, 2**62, (1,), generator=copies[i]) for i in range(b)])
    ref = pv.verify(drafts, target_probs=target, draft_probs=q, seed=seeds, backend="numpy")
    want = ref.token_ids.clone()
    want[:, k] = torch.where(ref.num_accepted == k, bonus[:, 0], -1)
    assert torch.equal(out, want)
    assert 0 < int(ref.num_accepted.sum()) < b * k  # the case really is mixed


def test_seeded_rows_repeat_and_ignore_their_neighbours() -> None:
    b, k, v = 6, 4, 8
    g = torch.Generator().manual_seed(2)
    sampler = RejectionSampler()
    target, bonus, q, drafts = _random_case(g, b, k, v)
    row = 2
    runs = []
    for _ in range(3):
        # Different neighbours and a different position in the batch each time.
        other_t, other_b, other_q, other_d = _random_case(g, b, k, v)
        perm = torch.randperm(b, generator=g)
        pos = int((perm == 0).nonzero())
        t, bo, qq, d = (x.clone() for x in (other_t, other_b, other_q, other_d))
        t[pos], bo[pos], qq[pos], d[pos] = target[row], bonus[row], q[row], drafts[row]
        out = sampler(t, bo, qq, d, seeded_seqs={pos: torch.Generator().manual_seed(77)})
        runs.append(out[pos])
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    # A generator that advanced gives fresh numbers: over several steps the row's output varies.
    gen = torch.Generator().manual_seed(77)
    outs = {tuple(sampler(target, bonus, q, drafts, seeded_seqs={row: gen})[row].tolist())
            for _ in range(12)}
    assert len(outs) > 1


def test_unseeded_rows_follow_torch_global_seed() -> None:
    g = torch.Generator().manual_seed(3)
    args = _random_case(g, 16, 3, 6)
    torch.manual_seed(9)
    a = RejectionSampler()(*args)
    torch.manual_seed(9)
    assert torch.equal(a, RejectionSampler()(*args))


def test_first_token_has_the_target_distribution() -> None:
    """Exactness through the adapter, with a negative control.

    K = 1, V = 4, 20000 rows sharing one (p, q): the first emitted token must follow p.
    Chi-square goodness of fit, df = 3, false-alarm rate 1e-4 per run (fixed seed, so the
    outcome is deterministic). Power: the draft tokens themselves follow q (here far from p,
    total variation 0.45); with 20000 samples their statistic exceeds the threshold by orders
    of magnitude, and the same test must reject them.
    """
    b, v = 20000, 4
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.55, 0.25, 0.15, 0.05])
    g = torch.Generator().manual_seed(4)
    drafts = torch.multinomial(q, b, replacement=True, generator=g).reshape(b, 1)
    target = p.expand(b, 2, v).contiguous()
    torch.manual_seed(4)
    out = RejectionSampler()(target, torch.zeros(b, 1, dtype=torch.int64),
                             q.expand(b, 1, v).contiguous(), drafts)
    threshold = stats.chi2.ppf(1 - 1e-4, df=v - 1)

    def chi2(tokens: torch.Tensor) -> float:
        observed = torch.bincount(tokens, minlength=v).double()
        expected = p.double() * b
        return float(((observed - expected) ** 2 / expected).sum())

    assert chi2(out[:, 0]) < threshold
    assert chi2(drafts[:, 0]) > threshold  # negative control: the test has power


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ("target_rank", ValueError, "target_with_bonus_probs"),
        ("draft_ids_shape", ValueError, "draft_token_ids"),
        ("bonus_shape", ValueError, "bonus_token_ids"),
        ("draft_probs_vocab", ValueError, "draft_probs"),
        ("target_float64", TypeError, "target_with_bonus_probs"),
        ("draft_ids_int32", TypeError, "draft_token_ids"),
        ("bonus_int32", TypeError, "bonus_token_ids"),
        ("draft_id_range", ValueError, "draft_token_ids"),
        ("bonus_range", ValueError, "bonus_token_ids"),
        ("nan_target", ValueError, "target_probs"),
        ("seeded_key", ValueError, "seeded_seqs"),
        ("seeded_value", TypeError, "seeded_seqs"),
    ],
)
def test_strict_mode_names_the_bad_argument(change: str, error: type, match: str) -> None:
    g = torch.Generator().manual_seed(5)
    target, bonus, q, drafts = _random_case(g, 3, 2, 5)
    seeded: dict = {}
    if change == "target_rank":
        target = target[0]
    elif change == "draft_ids_shape":
        drafts = drafts[:, :1]
    elif change == "bonus_shape":
        bonus = bonus[:, 0]
    elif change == "draft_probs_vocab":
        q = q[..., :4]
    elif change == "target_float64":
        target = target.double()
    elif change == "draft_ids_int32":
        drafts = drafts.int()
    elif change == "bonus_int32":
        bonus = bonus.int()
    elif change == "draft_id_range":
        drafts[1, 1] = 5
    elif change == "bonus_range":
        bonus[0, 0] = -3
    elif change == "nan_target":
        target[2, 0, 1] = float("nan")
    elif change == "seeded_key":
        seeded = {3: torch.Generator()}
    elif change == "seeded_value":
        seeded = {0: 1234}
    with pytest.raises(error, match=match):
        RejectionSampler(strict_mode=True)(target, bonus, q, drafts, seeded_seqs=seeded)


def test_non_strict_nan_rows_still_give_valid_ids() -> None:
    g = torch.Generator().manual_seed(6)
    target, bonus, q, drafts = _random_case(g, 4, 3, 5)
    target[1] = float("nan")
    q[2] = float("nan")
    for sampler in (RejectionSampler(), TypicalAcceptanceSampler()):
        out = sampler(target, bonus, q, drafts)
        assert out.shape == (4, 4)
        assert ((out >= 0) & (out < 5) | (out == -1)).all()
        assert (out[:, 0] >= 0).all()  # every row emits at least one token


def test_empty_batch() -> None:
    ids = torch.zeros(0, 2, dtype=torch.int64)
    out = RejectionSampler(strict_mode=True)(torch.zeros(0, 3, 5), ids[:, :1], torch.zeros(0, 2, 5),
                                             ids)
    assert out.shape == (0, 3) and out.dtype == torch.int64


def test_counters_are_causal_and_match_vllm_names() -> None:
    v = 4
    # Row 0: draft 0 rejected, draft 1 would pass (vLLM v0 counted it); row 1: all accepted.
    drafts = torch.tensor([[0, 1], [2, 3]])
    target = _one_hot(torch.tensor([[1, 1, 0], [2, 3, 0]]), v)
    bonus = torch.tensor([[3], [1]])
    sampler = TypicalAcceptanceSampler(strict_mode=True)
    sampler.init_gpu_tensors("cpu")
    for _ in range(2):
        out = sampler(target, bonus, None, drafts)
    assert out.tolist() == [[1, -1, -1], [2, 3, 1]]
    assert int(sampler.num_accepted_tokens) == 2 * 2  # 0 + 2 per call, not 1 + 2
    assert int(sampler.num_emitted_tokens) == 2 * int((out != -1).sum())
    assert sampler.num_draft_tokens == 2 * 4
    assert sampler.metrics.summary()["num_accepted_per_position"] == [2, 2]
    fresh = RejectionSampler()
    fresh.init_tensors(0, device_type="cpu")
    assert fresh.num_accepted_tokens.device.type == "cpu" and int(fresh.num_emitted_tokens) == 0


def test_constructors_accept_vllm_call_forms() -> None:
    rs = RejectionSampler(True, use_flashinfer=False)  # vLLM: (strict_mode, use_flashinfer)
    assert rs._strict_mode and rs.probs_dtype == torch.float32
    ts = TypicalAcceptanceSampler(0.03, 0.9, False)  # vLLM: (threshold, alpha, strict_mode)
    assert (ts._posterior_threshold, ts._posterior_alpha, ts._strict_mode) == (0.03, 0.9, False)
    ts.init_gpu_tensors(0)  # vLLM passes its rank; here the current accelerator, else the CPU
    assert int(ts.num_accepted_tokens) == 0
    with pytest.raises(TypeError, match="device"):
        rs.init_gpu_tensors(1.5)  # type: ignore[arg-type]


def test_typical_mixed_batch_matches_the_reference_and_is_deterministic() -> None:
    b, k, v = 8, 3, 5
    target, bonus, q, drafts = _random_case(torch.Generator().manual_seed(8), b, k, v)
    sampler = TypicalAcceptanceSampler(0.2, 0.5, strict_mode=True)
    out = sampler(target, bonus, q, drafts)
    ref = pv.verify(drafts, target_probs=target, method="typical", typical_eps=0.2,
                    typical_alpha=0.5, seed=0, backend="numpy")
    want = ref.token_ids.clone()
    want[:, k] = torch.where(ref.num_accepted == k, bonus[:, 0], -1)
    assert torch.equal(out, want)
    assert torch.equal(out, sampler(target, bonus, None, drafts))  # no randomness, q unused
    assert 0 < int(ref.num_accepted.sum()) < b * k


def test_warns_inside_vllm_v0_where_seeds_would_be_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM v0's worker passes ``seeded_seqs`` only to subclasses of its stochastic base
    sampler; constructing the adapter in such a process must say that seeds will be lost."""
    import sys
    import types
    import warnings

    class SpecDecodeStochasticBaseSampler(torch.nn.Module):  # stand-in for vLLM v0's class
        pass

    fake = types.ModuleType("vllm.model_executor.layers.spec_decode_base_sampler")
    fake.SpecDecodeStochasticBaseSampler = SpecDecodeStochasticBaseSampler
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RejectionSampler()  # no v0 worker in this process: silent
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    with pytest.warns(RuntimeWarning, match="seeded_seqs"):
        RejectionSampler()
