"""Statistical conformance checks: emitted tokens must follow the target's law exactly.

Rejection sampling is lossless, so for any draft the sequence a backend emits must be distributed
as the target's autoregressive law. Each check decodes thousands of independent sequences of a
toy model through ``portable_verify.verify(..., backend=name)`` (one request per sequence, distinct
per-request seeds, constant shapes) and runs Pearson chi-square tests against that law. Each
check also reports its power against the negative controls of
:mod:`portable_verify.testing.stats.negative_controls`, computed exactly by
:mod:`portable_verify.testing.stats.exact_laws`; ``negative_controls_caught`` runs those controls
through the same checks and sample sizes. The settings are in
:mod:`portable_verify.testing.stats.scenarios`; hypotheses, sizes and error rates are documented
in docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import time
from functools import cache

import numpy as np

import portable_verify as pv
from portable_verify.testing.kit import CheckResult, check
from portable_verify.testing.stats.chi_square import FitResult, chi_square_fit, power_against
from portable_verify.testing.stats.exact_laws import law_of_view
from portable_verify.testing.stats.negative_controls import (
    CONTROLS,
    POSITIVE_CONTROLS,
    controls_registered,
)
from portable_verify.testing.stats.scenarios import SCENARIOS, views
from portable_verify.testing.stats.toy_decoding import (
    Scenario,
    observed_counts,
    simulate,
    target_law,
)

ALPHA = 1e-4
"""False-alarm rate of each check (Bonferroni-split across its views)."""

def _view_name(view: tuple[int, ...]) -> str:
    return f"t{view[0]}" if len(view) == 1 else "joint(" + ",".join(f"t{j}" for j in view) + ")"


def run_fits(scenario: Scenario, backend: str, quick: bool) -> list[FitResult]:
    """Decode through ``backend`` and test every view of ``scenario`` at level ALPHA/len(views)."""
    tokens = simulate(scenario, backend, quick)
    vs = views(scenario)
    return [
        chi_square_fit(
            _view_name(v),
            observed_counts(tokens, v, scenario.vocab),
            target_law(scenario, v),
            ALPHA / len(vs),
        )
        for v in vs
    ]


@cache
def _control_law(name: str, control: str, view: tuple[int, ...]) -> np.ndarray | None:
    """The law of ``view`` under a control in scenario ``name`` (shared by both sizes)."""
    return law_of_view(SCENARIOS[name], CONTROLS[control], view)


@cache
def powers(name: str, quick: bool) -> dict[str, float]:
    """Power of the check ``name`` against each negative control (a lower bound: best view)."""
    scenario = SCENARIOS[name]
    n = scenario.quick_trials if quick else scenario.trials
    vs = views(scenario)
    out = {}
    for control in CONTROLS:
        best = 0.0
        for v in vs:
            alt = _control_law(name, control, v)
            if alt is not None:
                best = max(best, power_against(target_law(scenario, v), alt, n, ALPHA / len(vs)))
        out[control] = best
    return out


def has_method(backend: str, method: str) -> bool:
    """Whether ``backend`` implements ``method`` (block checks skip the backends that do not)."""
    return pv.get_backend(backend).traits.implements("chain", method)


def _statistical_check(name: str) -> None:
    scenario = SCENARIOS[name]

    def fn(backend: str, quick: bool) -> CheckResult:
        if not has_method(backend, scenario.method):
            return CheckResult(f"stat.{name}", True, f"{backend} does not implement "
                               f"method={scenario.method!r}", skipped=True)
        start = time.perf_counter()
        fits = run_fits(scenario, backend, quick)
        pw = powers(name, quick)
        passed = all(f.passed for f in fits)
        n = fits[0].n
        detail = "; ".join(f.line() for f in fits)
        if not passed:
            detail = f"target law rejected at alpha={ALPHA:g} (N={n}): {detail}"
        return CheckResult(
            f"stat.{name}",
            passed,
            detail,
            stats={
                "N": n,
                "alpha": ALPHA,
                "tests": [dataclasses.asdict(f) for f in fits],
                "power": pw,
                "seconds": round(time.perf_counter() - start, 2),
                "summary": f"N={n} {'; '.join(f.line() for f in fits)} | power vs controls: "
                + " ".join(f"{c.removeprefix('_wrong_')} {v:.2f}" for c, v in pw.items()),
            },
        )

    fn.__doc__ = f"Emitted tokens follow the target's law: {name.replace('_', ' ')}."
    check(f"stat.{name}", quick=True)(fn)


for _name in SCENARIOS:
    _statistical_check(_name)


DESIGNED_POWER = 0.999
"""A control must be caught by every check whose power against it is at least this."""

RUN_POWER = 0.5
"""Controls are run only through checks with at least this power (the others cannot tell)."""


@cache
def control_outcomes(quick: bool) -> dict[str, dict[str, bool]]:
    """For each control: check -> whether the control *passed* it, over the checks it is run on.

    The positive controls (each correct rule in the same test double) run through every check.
    """
    out: dict[str, dict[str, bool]] = {}
    with controls_registered():
        for control in [*CONTROLS, *POSITIVE_CONTROLS]:
            out[control] = {
                name: all(f.passed for f in run_fits(sc, control, quick))
                for name, sc in SCENARIOS.items()
                if control in POSITIVE_CONTROLS or powers(name, quick)[control] >= RUN_POWER
            }
    return out


@check("stat.negative_controls_caught", quick=True)
def negative_controls_caught(backend: str, quick: bool) -> CheckResult:
    """Deliberately wrong samplers fail the same statistical checks at the same sample sizes.

    Passes when every control is caught by every check designed to catch it (power >= 0.999),
    and the correct rule, run by the same test double, passes every check. Independent of
    ``backend`` (the controls are their own backends), so it runs once per process.
    """
    start = time.perf_counter()
    outcomes = control_outcomes(quick)
    caught = {c: sorted(s for s, ok in outcomes[c].items() if not ok) for c in CONTROLS}
    designed = {
        c: sorted(s for s in SCENARIOS if powers(s, quick)[c] >= DESIGNED_POWER) for c in CONTROLS
    }
    missed = {c: sorted(set(designed[c]) - set(caught[c])) for c in CONTROLS}
    missed = {c: m for c, m in missed.items() if m or not caught[c]}
    exact_failures = [f"{c}: {s}" for c in POSITIVE_CONTROLS
                      for s, ok in outcomes[c].items() if not ok]
    passed = not missed and not exact_failures
    detail = ", ".join(
        f"{c.removeprefix('_wrong_')}: caught by {len(caught[c])} (designed {len(designed[c])})"
        for c in CONTROLS
    )
    if missed:
        detail = f"NOT caught where designed: {missed}; " + detail
    if exact_failures:
        detail = f"positive controls failed {exact_failures}; " + detail
    return CheckResult(
        "stat.negative_controls_caught",
        passed,
        detail,
        stats={
            "caught_by": caught,
            "designed_to_catch": designed,
            "positive_control_failures": exact_failures,
            "seconds": round(time.perf_counter() - start, 2),
            "summary": detail,
        },
    )
