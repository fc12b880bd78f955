"""Block verification (docs/semantics.md): exact tokens and expected acceptance.

The joint-law checks of block verification are the ``stat.block_*`` scenarios of
:mod:`portable_verify.testing.checks.losslessness`. This module adds what a law cannot show:

* ``exact.block``: tokens equal the reference's on the random and dyadic cases (near-ties
  excused as in ``exact.rejection``), and greedy rows equal a ``method="greedy"`` call;
* ``stat.block_acceptance``: the mean number of accepted drafts equals its closed form (an
  enumeration over uniforms and draft paths) on small dyadic tables, and is at least token-wise
  rejection's on the same drafts and seeds (paired). Sizes, power and false-alarm rate are in
  docs/testing.md.

A backend without the method (``traits.implements("chain", "block")`` False) gets a skipped result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core.arguments import SEED_RANGE
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.dyadic_cases import dyadic_case
from portable_verify.testing.cases.random_cases import (
    CaseSpec,
    build_case,
    on_device,
    random_specs,
)
from portable_verify.testing.checks.reference_comparison import Tally, compare, host
from portable_verify.testing.kit import CheckResult, check
from portable_verify.testing.stats.exact_laws import EXACT, EXACT_BLOCK, Rule, block_outcomes

CASE_SEED = 20261221
ALPHA = 1e-4
"""False-alarm rate of ``stat.block_acceptance`` (Bonferroni-split across its tests)."""


def _lacks_block(name: str, backend: str) -> CheckResult | None:
    if pv.get_backend(backend).traits.implements("chain", "block"):
        return None
    return CheckResult(name, True, f"{backend} does not implement method='block'", skipped=True)


@check("exact.block")
def block_exact(backend: str, quick: bool) -> CheckResult:
    """Block verification with explicit uniforms equals the reference; greedy rows are greedy."""
    if (skipped := _lacks_block("exact.block", backend)) is not None:
        return skipped
    tally = Tally()
    gen = np.random.default_rng(CASE_SEED)
    device = torch_device(backend)
    for spec in random_specs(gen, 60 if quick else 400):
        kwargs = build_case(spec, device=device)
        got = compare(tally, backend, spec.label, kwargs, "block")
        temperature = kwargs.get("temperature")
        if isinstance(temperature, torch.Tensor) and (temperature == 0).any() and spec.batch:
            _greedy_rows_alone(tally, backend, spec, kwargs, got)
    for i in range(20 if quick else 150):
        kwargs = dyadic_case(gen, b=8, k=int(gen.integers(0, 4)), v=int(gen.integers(1, 7)),
                             device=device)
        compare(tally, backend, f"dyadic#{i}", kwargs, "block")
    return tally.result("exact.block")


def _greedy_rows_alone(tally: Tally, backend: str, spec: CaseSpec, kwargs: dict,
                       mixed: pv.VerifyResult) -> None:
    """The temperature-0 rows of a block call equal the same rows verified greedily."""
    idx = torch.nonzero(kwargs["temperature"] == 0).flatten()
    sub = {key: val[idx] if isinstance(val, torch.Tensor) else val
           for key, val in kwargs.items() if key not in ("temperature", "uniforms")}
    alone = pv.verify(**sub, method="greedy", backend=backend)
    if not np.array_equal(host(mixed.token_ids)[host(idx)], host(alone.token_ids)):
        tally.failures.append(f"{spec.label} block: greedy rows differ from method='greedy'")


@dataclass(frozen=True)
class AcceptanceCase:
    """One request repeated under many seeds: fixed drafts, dyadic target and draft rows."""

    drafts: np.ndarray  # int64 [K]
    p: np.ndarray  # float64 [K+1, V] on a 1/8 grid
    q: np.ndarray  # float64 [K, V] on a 1/8 grid; each draft has q(x) > 0


def expected_accepted(rule: Rule, drafts: tuple[int, ...], p: np.ndarray,
                      q: np.ndarray) -> tuple[float, float]:
    """Closed form ``(E[a], Var[a])`` over the uniforms for fixed drafts, under ``rule``."""
    if rule.block is None:  # token-wise rejection: P(a >= i) = prod_{j < i} min(1, p/q)
        keep = [min(1.0, p[j][x] / q[j][x]) if q[j][x] > 0 else float(p[j][x] > 0)
                for j, x in enumerate(drafts)]
        at_least = np.cumprod([1.0, *keep])
        probs = np.append(at_least[:-1] - at_least[1:], at_least[-1])
    else:
        probs = np.array([pa for pa, _ in block_outcomes(rule, drafts, list(p), list(q))])
    counts = np.arange(len(probs))
    mean = float((probs * counts).sum())
    return mean, float((probs * counts**2).sum()) - mean**2


def mean_over_drafts(rule: Rule, p: np.ndarray, q: np.ndarray) -> float:
    """``E[a]`` with drafts drawn from ``q`` (positional rows) as well: every draft path."""
    k, v = q.shape
    total = 0.0
    for path in itertools.product(range(v), repeat=k):
        weight = float(np.prod([q[j][x] for j, x in enumerate(path)]))
        if weight > 0:
            total += weight * expected_accepted(rule, path, p, q)[0]
    return total


def _grid_rows(gen: np.random.Generator, rows: int, v: int) -> np.ndarray:
    cuts = np.sort(gen.integers(0, 9, (rows, v - 1)), axis=-1)
    edges = np.concatenate([np.zeros((rows, 1)), cuts, np.full((rows, 1), 8)], -1)
    return np.diff(edges, axis=-1) / 8


def acceptance_cases(count: int, k: int = 3, v: int = 4) -> list[AcceptanceCase]:
    """Dyadic cases (exact in float32) whose drafts the draft could have proposed."""
    gen = np.random.default_rng(CASE_SEED + 1)
    out = []
    while len(out) < count:
        p, q = _grid_rows(gen, k + 1, v), _grid_rows(gen, k, v)
        drafts = np.array([gen.choice(v, p=row) for row in q])
        _, var = expected_accepted(EXACT_BLOCK, tuple(drafts), p, q)
        if var > 0.1:  # informative: the count really depends on the uniforms
            out.append(AcceptanceCase(drafts, p, q))
    return out


def _power(shift: float, z: float) -> float:
    """Power of a two-sided z-test at critical value ``z`` against a mean ``shift`` s.e. away."""
    from scipy import stats

    return float(stats.norm.sf(z - abs(shift)) + stats.norm.cdf(-z - abs(shift)))


def _accepted(backend: str, method: str, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
              seeds: np.ndarray) -> np.ndarray:
    call = on_device({"draft_token_ids": torch.from_numpy(drafts),
                      "target_probs": torch.from_numpy(p).float(),
                      "draft_probs": torch.from_numpy(q).float(),
                      "seed": torch.from_numpy(seeds)}, torch_device(backend))
    result = pv.verify(**call, method=method, backend=backend)
    return host(result.num_accepted).astype(np.float64)


PAIRED_P = np.array([[0.5, 0.25, 0.125, 0.125, 0.0], [0.25, 0.25, 0.25, 0.125, 0.125],
                     [0.375, 0.125, 0.25, 0.125, 0.125]])
PAIRED_Q = np.array([[0.25, 0.25, 0.25, 0.25, 0.0], [0.5, 0.125, 0.125, 0.125, 0.125]])
"""The paired setting: V = 5, K = 2, positional dyadic rows with drafts drawn from ``q``."""


CONTROL_RULES: dict[str, Rule] = {
    "first_failure": Rule(block="first_failure"),
    "h_last_as_middle": Rule(block="h_last_as_middle"),
    "token_wise": EXACT,
}
"""Wrong rules whose acceptance differs (the residual bugs only change the emitted token).
``token_wise``: ``method="block"`` running token-wise rejection, lossless, so no law check can
see it; only the closed forms here can (its test double is ``_exact_rule``)."""


def z_critical(alpha: float, two_sided: bool = True) -> float:
    from scipy import stats

    return float(stats.norm.isf(alpha / 2 if two_sided else alpha))


@check("stat.block_acceptance")
def block_acceptance(backend: str, quick: bool) -> CheckResult:
    """Mean accepted drafts of block: its closed form, and >= rejection's on the same drafts."""
    if (skipped := _lacks_block("stat.block_acceptance", backend)) is not None:
        return skipped
    cases = acceptance_cases(6)
    reps = 2_000 if quick else 8_000
    trials = 6_000 if quick else 20_000
    tests = len(cases) + 3  # closed forms per case; paired means of block and rejection; gain
    z_two, z_one = z_critical(ALPHA / tests), z_critical(ALPHA / tests, two_sided=False)
    gen = np.random.default_rng(CASE_SEED + 2)
    failures, lines = [], []
    power = dict.fromkeys(CONTROL_RULES, 0.0)  # best single test, against each wrong rule
    case_z, paired_z = [], {}
    for i, case in enumerate(cases):
        seeds = gen.integers(0, SEED_RANGE, reps)
        drafts = np.repeat(case.drafts[None], reps, 0)
        got = _accepted(backend, "block", drafts, np.repeat(case.p[None], reps, 0),
                        np.repeat(case.q[None], reps, 0), seeds)
        mean, var = expected_accepted(EXACT_BLOCK, tuple(case.drafts), case.p, case.q)
        se = np.sqrt(var / reps)
        z = (got.mean() - mean) / se
        case_z.append(float(z))
        for bug, rule in CONTROL_RULES.items():
            wrong = expected_accepted(rule, tuple(case.drafts), case.p, case.q)[0]
            power[bug] = max(power[bug], _power((wrong - mean) / se, z_two))
        lines.append(f"case{i}: {got.mean():.4f} vs {mean:.4f} (z={z:+.2f})")
        if abs(z) > z_two:
            failures.append(lines[-1])
    # Paired: drafts from q, the same drafts and seeds for both methods.
    v = PAIRED_Q.shape[1]
    drafts = np.stack([gen.choice(v, trials, p=row) for row in PAIRED_Q], 1)
    seeds = gen.integers(0, SEED_RANGE, trials)
    p = np.repeat(PAIRED_P[None], trials, 0)
    q = np.repeat(PAIRED_Q[None], trials, 0)
    block = _accepted(backend, "block", drafts, p, q, seeds)
    token = _accepted(backend, "rejection", drafts, p, q, seeds)
    closed = {m: mean_over_drafts(rule, PAIRED_P, PAIRED_Q)
              for m, rule in (("block", EXACT_BLOCK), ("rejection", Rule()))}
    for method, got in (("block", block), ("rejection", token)):
        z = (got.mean() - closed[method]) / (got.std() / np.sqrt(trials))
        paired_z[method] = float(z)
        lines.append(f"paired {method}: {got.mean():.4f} vs {closed[method]:.4f} (z={z:+.2f})")
        if abs(z) > z_two:
            failures.append(lines[-1])
    diff = block - token
    gain_se = diff.std() / np.sqrt(trials)
    lines.append(f"gain {diff.mean():+.4f} +- {gain_se:.4f} (closed form "
                 f"{closed['block'] - closed['rejection']:+.4f})")
    if diff.mean() < -z_one * gain_se:
        failures.append(lines[-1])
    return CheckResult("stat.block_acceptance", not failures,
                       "; ".join(failures) if failures else "; ".join(lines),
                       stats={"reps_per_case": reps, "paired_trials": trials, "alpha": ALPHA,
                              "z_two_sided": z_two, "z_one_sided": z_one,
                              "closed_forms": closed, "power": power, "case_z": case_z,
                              "paired_z": paired_z, "gain": float(diff.mean()),
                              "gain_se": float(gain_se),
                              "summary": "; ".join(lines)})
