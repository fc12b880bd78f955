"""The exact-law enumerator behind the traversal conformance checks: it must itself be right
(lossless for the rule, not for the wrong variants) and the scenario must be one that shows
the variants (pitfall: first-level weights all 0 or 1 hide a kept parent weight)."""

from __future__ import annotations

import numpy as np
import pytest

from portable_verify.testing.stats import traversal_scenario as ts
from portable_verify.testing.stats.traversal_law import VARIANTS

SCENARIO = ts.make_scenario()
TARGET = ts.target_sequence_law(SCENARIO)


@pytest.mark.parametrize("mode", ["iid", "without_replacement", "deterministic"])
def test_enumerated_rule_is_lossless(mode: str) -> None:
    law = ts.joint_law(SCENARIO, mode)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert np.abs(ts.sequence_law(law, SCENARIO) - TARGET).max() < 1e-13


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v])
def test_variants_are_lossy_and_visible(variant: str) -> None:
    mode = "iid"
    right, wrong = ts.joint_law(SCENARIO, mode), ts.joint_law(SCENARIO, mode, variant)
    tv = 0.5 * sum(abs(right.get(k, 0) - wrong.get(k, 0)) for k in set(right) | set(wrong))
    assert tv >= ts.MIN_CONTROL_TV
    assert np.abs(ts.sequence_law(wrong, SCENARIO) - TARGET).max() > 1e-3


def test_first_level_weights_strictly_inside() -> None:
    p, q = SCENARIO.p[()], SCENARIO.q[()]
    ratios = np.minimum(p / q, 1.0)
    assert ((ratios > 0) & (ratios < 1)).any()
