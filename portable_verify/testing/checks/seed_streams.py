"""Seed conformance: reproducible streams that belong to a request, not to its batch.

docs/semantics.md (Random numbers) promises: the same seed gives the same tokens; a request's
numbers depend only on its own seed, offset and position (not on K, the batch size, the other
requests or their order); ``seed_offset`` moves to a fresh stream; ``seed=None`` draws fresh
seeds from torch's global generator, so ``torch.manual_seed`` reproduces it.

"Streams differ" claims are tested on a flat target (``V = 64`` equal logits, ``K = 0``), where
each call emits one token drawn with the request's draw uniform. With independent streams the
64 tokens are i.i.d. uniform over 64 values: the number of distinct values has mean 40.6 and
standard deviation 2.5, so requiring at least 20 has a false-alarm rate of 8e-19 (exact
occupancy distribution), while any stream collapse (seeds ignored, offsets ignored, one stream
shared by the batch) gives 1 distinct value and fails with certainty. Two independent calls
agree on all 64 rows with probability ``64**-64``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core import rng
from portable_verify.core.arguments import SEED_RANGE
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.random_cases import CaseSpec, build_case, on_device
from portable_verify.testing.checks.reference_comparison import Tally, compare, host
from portable_verify.testing.kit import CheckResult, check, summarize

FLAT_VOCAB = 64
MIN_DISTINCT = 20
SEED_BASE = 7_000_000_000  # beyond 32 bits: the high half of the seed must matter too


def _tokens(res: pv.VerifyResult) -> np.ndarray:
    return host(res.token_ids)


def _verify(backend: str, **call: Any) -> pv.VerifyResult:
    """``pv.verify`` with the call on the backend's device (its cases are drawn on the host, so
    index arithmetic on them stays there; the call moves once)."""
    return pv.verify(**on_device(call, torch_device(backend)), backend=backend)


def _flat(backend: str, rows: int, **kw: Any) -> np.ndarray:
    """One draw per row from a uniform target over ``FLAT_VOCAB`` tokens."""
    logits = torch.zeros(rows, 1, FLAT_VOCAB)
    drafts = torch.zeros(rows, 0, dtype=torch.int64)
    return _tokens(_verify(backend, draft_token_ids=drafts, target_logits=logits, **kw))[:, 0]


def _sampled_case(seed: int) -> dict[str, Any]:
    """A ragged, mixed batch of 6 sampled requests (explicit uniforms removed)."""
    spec = CaseSpec(batch=6, positions=3, vocab=9, seed=seed, draft_probs=seed % 2 == 0,
                    ragged=True, temperature="vector", target="logits", uniforms=False)
    return build_case(spec)


def _take(kwargs: dict[str, Any], idx: torch.Tensor) -> dict[str, Any]:
    """The requests ``idx`` of a batch, in that order (scalars kept)."""
    return {k: v[idx] if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@check("seeds.repeatable")
def repeatable(backend: str, quick: bool) -> CheckResult:
    """Same seed, same tokens; seed=None differs per call but follows torch.manual_seed."""
    failures: list[str] = []
    batches = 3 if quick else 20
    for case_seed in range(batches):
        kwargs = _sampled_case(case_seed)
        b = kwargs["draft_token_ids"].shape[0]
        for seed in (torch.arange(b) + SEED_BASE * case_seed, 12345 + case_seed):
            runs = [_tokens(_verify(backend, **kwargs, seed=seed, seed_offset=3))
                    for _ in range(3)]
            if not all(np.array_equal(runs[0], r) for r in runs[1:]):
                failures.append(f"case {case_seed}: seed {type(seed).__name__} not repeatable")
    first, second = _flat(backend, 64), _flat(backend, 64)
    if np.array_equal(first, second):
        failures.append("seed=None gave identical tokens on two calls")
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(2024)
        a = _flat(backend, 64)
        torch.manual_seed(2024)
        b = _flat(backend, 64)
    finally:
        torch.random.set_rng_state(state)
    if not np.array_equal(a, b):
        failures.append("seed=None does not follow torch.manual_seed")
    detail = summarize(failures) or (
        f"{batches} batches x (tensor, int) seeds x 3 calls identical; seed=None varies per call "
        "and follows torch.manual_seed"
    )
    return CheckResult("seeds.repeatable", not failures, detail, {"batches": batches})


@check("seeds.request_independence")
def request_independence(backend: str, quick: bool) -> CheckResult:
    """A request's tokens ignore the rest of the batch (subset, order, additions) and K padding."""
    failures: list[str] = []
    gen = np.random.default_rng(99)
    trials = 4 if quick else 30
    for case_seed in range(trials):
        kwargs = _sampled_case(100 + case_seed)
        b = kwargs["draft_token_ids"].shape[0]
        seeds = torch.from_numpy(gen.integers(0, SEED_RANGE, b))
        offsets = torch.from_numpy(gen.integers(0, 2**40, b))
        full = _tokens(_verify(backend, **kwargs, seed=seeds, seed_offset=offsets))
        others = _sampled_case(1000 + case_seed)
        views = {
            "reversed": torch.arange(b).flip(0),
            "subset": torch.from_numpy(np.sort(gen.choice(b, b // 2, replace=False))),
            "shuffled": torch.from_numpy(gen.permutation(b)),
        }
        for label, idx in views.items():
            part = _tokens(_verify(backend, **_take(kwargs, idx), seed=seeds[idx],
                                   seed_offset=offsets[idx]))
            if not np.array_equal(part, full[idx.numpy()]):
                failures.append(f"case {case_seed}: tokens change when the batch is {label}")
        merged = {k: torch.cat([v, others[k]]) if isinstance(v, torch.Tensor) else v
                  for k, v in kwargs.items()}
        grown = _tokens(_verify(backend, **merged, seed=torch.cat([seeds, seeds + 1]),
                                seed_offset=torch.cat([offsets, offsets])))
        if not np.array_equal(grown[:b], full):
            failures.append(f"case {case_seed}: tokens change when requests are added")
        padded = _pad_positions(kwargs, extra=2, gen=gen)
        wide = _tokens(_verify(backend, **padded, seed=seeds, seed_offset=offsets))
        if not np.array_equal(wide[:, : full.shape[1]], full):
            failures.append(f"case {case_seed}: tokens change when K is padded")
    detail = summarize(failures) or f"{trials} batches: per-request streams"
    return CheckResult("seeds.request_independence", not failures, detail, {"batches": trials})


def _pad_positions(kwargs: dict[str, Any], extra: int, gen: np.random.Generator) -> dict[str, Any]:
    """The same requests with ``K + extra`` padded positions (counts default to the old ``K``).

    Each request keeps its target rows ``0..n`` (``n`` = its count); the rows after it are noise
    the verifier must never read.
    """
    drafts = kwargs["draft_token_ids"]
    b, k = drafts.shape
    logits = kwargs["target_logits"]
    v = logits.shape[-1]
    n = kwargs.get("num_draft_tokens", torch.full((b,), k))
    noise = torch.from_numpy(gen.normal(0, 3, (b, k + 1 + extra, v)).astype(np.float32))
    pos = torch.arange(k + 1 + extra)
    keep = (pos[None, :] <= n[:, None]).unsqueeze(-1)
    base = torch.cat([logits, noise[:, k + 1:]], dim=1)
    out = dict(kwargs)
    out["target_logits"] = torch.where(keep, base, noise)
    junk_ids = torch.from_numpy(gen.integers(0, v, (b, extra)))
    out["draft_token_ids"] = torch.cat([drafts, junk_ids], 1)
    out["num_draft_tokens"] = n
    if kwargs.get("draft_probs") is not None:
        q = kwargs["draft_probs"]
        out["draft_probs"] = torch.cat([q, torch.full((b, extra, v), 1.0 / v)], dim=1)
    return out


@check("seeds.streams_differ")
def streams_differ(backend: str, quick: bool) -> CheckResult:
    """Different seeds, offsets and rows draw different numbers (see the module docstring)."""
    failures: list[str] = []
    stats: dict[str, int] = {}
    rows = torch.arange(64, dtype=torch.int64)
    probes = {
        "per-request seeds": lambda: _flat(backend, 64, seed=rows + SEED_BASE),
        "seeds differing only above bit 32": lambda: _flat(backend, 64, seed=(rows << 33) + 5),
        "one int seed (per-row streams)": lambda: _flat(backend, 64, seed=31337),
        "offsets of one seed": lambda: _flat(backend, 64, seed=torch.full((64,), 4),
                                             seed_offset=rows),
        "offsets differing only above bit 32": lambda: _flat(
            backend, 64, seed=torch.full((64,), 4), seed_offset=rows << 32),
    }
    for label, probe in probes.items():
        distinct = len(np.unique(probe()))
        stats[label] = distinct
        if distinct < MIN_DISTINCT:
            failures.append(f"{label}: only {distinct} distinct tokens of {FLAT_VOCAB} rows")
    # Acceptance uniforms: p(x) = 1/2 with a one-hot draft accepts iff u_0 <= 1/2.
    probs = torch.zeros(64, 2, 2)
    probs[:, 0] = 0.5
    probs[:, 1, 0] = 1.0
    drafts = torch.zeros(64, 1, dtype=torch.int64)
    res = _verify(backend, draft_token_ids=drafts, target_probs=probs,
                  seed=torch.full((64,), 9), seed_offset=rows)
    accepted = int(host(res.num_accepted).sum())
    stats["accepted of 64 at p=1/2"] = accepted
    if not 12 <= accepted <= 52:  # Binomial(64, 1/2): outside [12, 52] with prob 1.0e-7
        failures.append(f"acceptance over 64 offsets: {accepted} accepted, expected about 32")
    distinct = [stats[label] for label in probes]
    detail = summarize(failures) or (
        f"distinct tokens of 64 flat draws: {min(distinct)}-{max(distinct)} "
        f"(>= {MIN_DISTINCT} required); {accepted}/64 accepted at p=1/2"
    )
    return CheckResult("seeds.streams_differ", not failures, detail, stats)


@check("seeds.hash")
def seed_hash(backend: str, quick: bool) -> CheckResult:
    """Seeds give the tokens of the documented uniforms (core.rng, numpy), same as the reference."""
    tally = Tally()
    failures = tally.failures
    gen = np.random.default_rng(5)
    for case_seed in range(4 if quick else 40):
        kwargs = _sampled_case(200 + case_seed)
        b, k = kwargs["draft_token_ids"].shape
        seeds = gen.integers(-SEED_RANGE, SEED_RANGE, b)
        offsets = gen.integers(0, SEED_RANGE, b)
        via_seed = _verify(backend, **kwargs, seed=torch.from_numpy(seeds),
                           seed_offset=torch.from_numpy(offsets))
        u = torch.from_numpy(rng.uniforms_numpy(seeds, offsets, k + 1))
        via_u = _verify(backend, **kwargs, uniforms=u)
        if not np.array_equal(_tokens(via_seed), _tokens(via_u)):
            failures.append(f"case {case_seed}: seeded tokens differ from the documented uniforms")
        compare(tally, backend, f"seeded#{case_seed}",
                on_device({**kwargs, "uniforms": u}, torch_device(backend)), "rejection")
    return tally.result("seeds.hash")
