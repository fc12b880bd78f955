"""Statistical tree conformance: the emitted sequence follows the target's law in every
``children`` mode, and deliberately wrong tree rules are caught.

Scenario (testing/stats/tree_laws.py): V = 4, trees of depth 3 with 3, 3 and 1 children per
node at depths 0, 1, 2 (N = 22 nodes), redrawn from the draft every trial; each sequence is
completed by target samples to 4 tokens and binned over the 4^4 = 256 sequences.

Sizes and error rates: 20,000 trials per mode (6,000 under ``quick``), one request per trial in
one ``verify_tree`` call. ``stat.tree_law`` has ``alpha = 1e-4`` split over its three modes,
so a correct backend fails it with probability <= 1e-4 over the choice of the fixed seeds (and,
the seeds being fixed, never flakes). Power is shown by ``stat.tree_negative_controls``: each
wrong rule must be rejected at that ``alpha``; its stats give the estimated power
(:func:`estimated_power`: the chance the test rejects data like the control's at that size).
The controls run at the law check's own size and per-mode ``alpha`` (so a control caught here is
one the law check would catch); per-mode figures are in docs/testing.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import portable_verify as pv
from portable_verify.dispatch import torch_device
from portable_verify.testing.checks.reference_comparison import host
from portable_verify.testing.checks.tree_exact import tree_check
from portable_verify.testing.kit import CheckResult, check
from portable_verify.testing.stats.chi_square import FitResult, chi_square_fit, scipy_stats
from portable_verify.testing.stats.tree_controls import TREE_CONTROLS, TREE_POSITIVE, registered
from portable_verify.testing.stats.tree_laws import (
    complete,
    draw_trees,
    expected_law,
    make_scenario,
    shared_sibling_uniforms,
)

ALPHA = 1e-4
FULL_TRIALS, QUICK_TRIALS = 20_000, 6_000
SEED = 20261203
MODES = ("deterministic", "iid", "without_replacement")


def _fit(view: str, backend: str, mode: str, trials: int, alpha: float, seed: int,
         children: str | None = None, **extra: Any) -> tuple[FitResult, np.ndarray]:
    """Run one scenario; the fit and the observed frequencies per sequence."""
    scenario = make_scenario()
    call = draw_trees(scenario, mode, trials, seed, torch_device(backend))
    if children is not None:
        call["children"] = children
    res = pv.verify_tree(**call, seed=seed, backend=backend, **extra)
    index = complete(scenario, host(res.token_ids), host(res.num_emitted), seed + 1)
    law = expected_law(scenario)
    observed = np.bincount(index, minlength=law.size)
    return chi_square_fit(view, observed, law, alpha), observed / trials


def estimated_power(fit: FitResult) -> float:
    """The chance the test rejects data like these at ``fit.n`` trials: Pearson's statistic
    is about noncentral chi-square with ``E[X^2] = df + lambda``, so ``lambda`` is estimated by
    ``max(X^2 - df, 0)`` (bias-corrected; a correct rule gets a power near ``alpha``)."""
    if fit.impossible:
        return 1.0
    stats = scipy_stats()
    noncentrality = max(fit.chi2 - fit.df, 0.0)
    critical = stats.chi2.isf(fit.alpha, fit.df)
    return float(stats.ncx2.sf(critical, fit.df, noncentrality)) if noncentrality else fit.alpha


@tree_check("stat.tree_law")
def tree_law(backend: str, quick: bool) -> CheckResult:
    """verify_tree's emitted sequences follow the target's law for each children mode."""
    name = "stat.tree_law"
    trials = QUICK_TRIALS if quick else FULL_TRIALS
    fits = [_fit(mode, backend, mode, trials, ALPHA / len(MODES), SEED + i)[0]
            for i, mode in enumerate(MODES)]
    passed = all(f.passed for f in fits)
    return CheckResult(name, passed, "; ".join(f.line() for f in fits),
                       {"trials": trials, "alpha": ALPHA, **{f.view: f.p_value for f in fits}})


@check("stat.tree_negative_controls")
def tree_negative_controls(backend: str, quick: bool) -> CheckResult:
    """Wrong tree rules are caught by the tree-law test; the right ones (two) pass."""
    name = "stat.tree_negative_controls"
    if not pv.get_backend(backend).traits.is_reference:
        return CheckResult(name, True, "independent of the backend: runs under the reference",
                           skipped=True)
    n = QUICK_TRIALS if quick else FULL_TRIALS
    alpha = ALPHA / len(MODES)  # the law check's level per mode
    runs = {
        "iid rule on children drawn without replacement":
            dict(backend=backend, mode="without_replacement", children="iid"),
        "removal before the subtraction":
            dict(backend="_tree_removal_first", mode="without_replacement"),
        "one uniform shared by the siblings":
            dict(backend=backend, mode="deterministic",
                 uniforms=shared_sibling_uniforms(make_scenario(), n, SEED + 10,
                                                  torch_device(backend))),
        "SGLang thresholds 0.7/0.7":
            dict(backend="_tree_sglang_thresholds", mode="deterministic"),
        # The mode the old tables hid it in; docs/testing.md has its power per mode.
        "later siblings against an un-renormalised residual":
            dict(backend="_tree_unnormalised_residual", mode="iid"),
    }
    positives = {
        "the same walk, right rule": dict(backend="_tree_exact_rule", mode="without_replacement"),
        "SGLang thresholds 1/1": dict(backend="_tree_sglang_exact", mode="deterministic"),
    }
    lines, stats, failures = [], {}, []
    with registered({**TREE_CONTROLS, **TREE_POSITIVE}):
        for label, spec in {**runs, **positives}.items():
            spec = dict(spec)
            fit, _ = _fit(label, spec.pop("backend"), spec.pop("mode"), n, alpha, SEED + 10,
                             **spec)
            power = estimated_power(fit)
            is_control = label in runs
            stats[label] = {"p_value": fit.p_value, "impossible": fit.impossible,
                            "estimated_power": power}
            lines.append(f"{fit.line()} power={power:.3f}")
            if is_control == fit.passed:
                failures.append(f"{label}: {'not caught' if is_control else 'rejected'} "
                                f"({fit.line()})")
    detail = "; ".join(failures) if failures else "; ".join(lines)
    return CheckResult(name, not failures, detail, {"trials": n, "alpha": alpha, **stats})
