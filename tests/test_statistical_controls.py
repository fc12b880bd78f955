"""The statistical checks can fail: their machinery is calibrated and the controls are caught.

* the exact law (``testing/stats/exact_laws.py``) reproduces the losslessness theorem for the
  correct rule, and differs from the target for every wrong rule in the scenarios designed to
  catch it;
* the chi-square test holds its false-alarm rate and its computed power matches simulation;
* every negative control fails the statistical checks designed for it, at the kit's own sample
  sizes, while the same test double with the correct rule passes them all.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import portable_verify as pv
from portable_verify.testing.checks.losslessness import negative_controls_caught
from portable_verify.testing.stats.chi_square import (
    MIN_EXPECTED,
    chi_square_fit,
    merge_bins,
    power_against,
)
from portable_verify.testing.stats.exact_laws import EXACT, EXACT_BLOCK, law_of_view
from portable_verify.testing.stats.negative_controls import (
    CONTROLS,
    controls_registered,
)
from portable_verify.testing.stats.scenarios import SCENARIOS, views
from portable_verify.testing.stats.toy_decoding import simulate, target_law

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = [name for name, s in SCENARIOS.items() if s.vocab <= 64]
BUILT_FOR = {"_wrong_block_residual_unscaled": "block_residual_scale"}
"""Controls whose bug barely moves the generic scenarios, and the scenario built to expose it."""


@pytest.mark.parametrize("name", SMALL)
def test_exact_rule_law_is_the_target_law(name: str) -> None:
    """Both exact rules (token-wise rejection and block verification) give the target's law."""
    scenario = SCENARIOS[name]
    for rule in (EXACT, EXACT_BLOCK):
        for view in views(scenario):
            np.testing.assert_allclose(
                law_of_view(scenario, rule, view), target_law(scenario, view), atol=1e-6
            )


def test_every_control_is_a_real_alternative_somewhere() -> None:
    """Each wrong rule moves the law by a visible amount in at least three scenarios, or (one
    whose bug is subtle everywhere else) in the scenario built for it."""
    for control, rule in CONTROLS.items():
        moved = [
            name
            for name in SMALL
            if np.abs(
                law_of_view(SCENARIOS[name], rule, (0, 1))
                - target_law(SCENARIOS[name], (0, 1))
            ).sum()
            > 0.02
        ]
        assert len(moved) >= 3 or BUILT_FOR.get(control) in moved, (control, moved)


def test_merged_bins_expect_at_least_five_and_skip_zero_cells() -> None:
    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.full(500, 0.3))
    probs[:10] = 0.0
    probs /= probs.sum()
    bins = merge_bins(probs, 2000)
    assert (bins.labels[:10] == -1).all() and (bins.labels[10:] >= 0).all()
    expected = bins.aggregate(probs) * 2000
    assert expected.min() >= MIN_EXPECTED
    assert bins.num_bins > 50  # common tokens keep their own bins


def test_impossible_token_fails_whatever_the_chi_square() -> None:
    probs = np.array([0.5, 0.5, 0.0])
    fit = chi_square_fit("t0", np.array([500, 499, 1]), probs, alpha=1e-4)
    assert fit.impossible == 1 and not fit.passed


def test_false_alarm_rate_and_power_match_simulation() -> None:
    """Null: rejections at alpha=0.05 occur ~5% of the time; alternative: at the computed power.

    2000 replicates; tolerance 4.5 binomial standard deviations (a false failure of this test
    has probability below 1e-5; fixed seed, so it is deterministic anyway) plus 0.02 for the
    asymptotic approximations (chi-square null, noncentral chi-square alternative).
    """
    rng = np.random.default_rng(11)
    null = rng.dirichlet(np.full(40, 0.5))
    alt = 0.96 * null + 0.04 * rng.dirichlet(np.full(40, 0.5))
    n, alpha, reps = 400, 0.05, 2000
    predicted = power_against(null, alt, n, alpha)
    assert 0.2 < predicted < 0.95  # an informative operating point
    for law, rate in ((null, alpha), (alt, predicted)):
        draws = rng.multinomial(n, law, size=reps)
        rejected = np.mean([not chi_square_fit("x", d, null, alpha).passed for d in draws])
        assert abs(rejected - rate) < 4.5 * np.sqrt(rate * (1 - rate) / reps) + 0.02, (
            rejected,
            rate,
        )


@pytest.mark.parametrize("name,control", [("sequence_joint", "_exact_rule"),
                                          ("block_sequence_joint", "_exact_block_rule")])
def test_exact_rule_double_matches_the_reference_token_for_token(name: str,
                                                                 control: str) -> None:
    """The controls' harness is the reference when its rule is right (so bugs are the rule's)."""
    scenario = dataclasses.replace(SCENARIOS[name], quick_trials=400)
    want = simulate(scenario, "numpy", quick=True)
    with controls_registered():
        got = simulate(scenario, control, quick=True)
    np.testing.assert_array_equal(got, want)


def test_negative_controls_are_caught_where_designed() -> None:
    result = negative_controls_caught("numpy", quick=True)
    assert result.passed, result.detail
    for control in CONTROLS:
        assert result.stats["caught_by"][control], control
        assert set(result.stats["designed_to_catch"][control]) <= set(
            result.stats["caught_by"][control]
        )
    assert not any(name.startswith("_") for name in pv.backend_status())  # cleaned up
    # The headline check of each method (or the one built for it) is designed for each control.
    for control, rule in CONTROLS.items():
        headline = BUILT_FOR.get(control, "sequence_joint" if rule.block is None
                                 else "block_sequence_joint")
        assert headline in result.stats["designed_to_catch"][control], control
