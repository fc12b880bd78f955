"""Goodness-of-fit machinery: Pearson chi-square with merged sparse bins, and its power.

Why a hand-rolled merge: the chi-square approximation needs every expected count >= 5, and at
V in the thousands most tokens are rarer than that. Cells the target gives probability exactly 0
are not binned at all: one observation there is a definite failure (an impossible token), so it
is reported as a *support violation* instead of being diluted into a bin.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

MIN_EXPECTED = 5.0


def scipy_stats() -> ModuleType:
    """scipy.stats, imported on first use: it is a test extra, not a core dependency."""
    try:
        from scipy import stats
    except ImportError as exc:
        raise ImportError(
            "the statistical checks need scipy: pip install 'portable-verify[test]'"
        ) from exc
    return stats


@dataclass(frozen=True)
class Bins:
    """A partition of the cells with positive expected mass into bins of expected count >= 5."""

    labels: np.ndarray  # int64 [cells]: bin of each cell, -1 for cells of probability 0
    num_bins: int

    def aggregate(self, weights: np.ndarray) -> np.ndarray:
        """Sum ``weights`` (one per cell) within each bin."""
        keep = self.labels >= 0
        return np.bincount(self.labels[keep], weights=weights[keep], minlength=self.num_bins)


def merge_bins(expected_probs: np.ndarray, n: int) -> Bins:
    """Merge cells, rarest first, until every bin expects at least ``MIN_EXPECTED`` of ``n``.

    Sorting by expected count and accumulating keeps common tokens in their own bins (where a
    sampler bug is most visible) and pools only the sparse tail; a short last run joins the
    previous bin (every bin but possibly a lone one then expects >= 5).
    """
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    labels = np.full(probs.shape, -1, dtype=np.int64)
    support = np.flatnonzero(probs > 0)
    order = support[np.argsort(probs[support], kind="stable")]
    counts = probs[order] * n
    bin_of = np.empty(order.size, dtype=np.int64)
    current, running = 0, 0.0
    for i, c in enumerate(counts):  # at most V cells, once per test: clarity over speed
        bin_of[i] = current
        running += c
        if running >= MIN_EXPECTED:
            current, running = current + 1, 0.0
    num_bins = current + (running > 0)
    if running > 0 and num_bins > 1:  # a short last bin joins its predecessor
        bin_of[bin_of == num_bins - 1] = num_bins - 2
        num_bins -= 1
    labels[order] = bin_of
    return Bins(labels, num_bins)


@dataclass(frozen=True)
class FitResult:
    """One goodness-of-fit test: the statistic, its null distribution and the verdict."""

    view: str
    n: int
    chi2: float
    df: int
    p_value: float
    alpha: float
    impossible: int  # observations in cells the target gives probability 0

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.p_value >= self.alpha

    def line(self) -> str:
        text = f"{self.view}: chi2={self.chi2:.1f} df={self.df} p={self.p_value:.3g}"
        return text + (f" IMPOSSIBLE={self.impossible}" if self.impossible else "")


def chi_square_fit(
    view: str, observed_counts: np.ndarray, expected_probs: np.ndarray, alpha: float
) -> FitResult:
    """Pearson chi-square of observed counts per cell against the expected probabilities."""
    observed = np.asarray(observed_counts, dtype=np.float64).ravel()
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    n = int(observed.sum())
    impossible = int(observed[probs <= 0].sum())
    bins = merge_bins(probs, n)
    obs_b = bins.aggregate(observed)
    exp_b = bins.aggregate(probs) / probs[probs > 0].sum() * n
    df = bins.num_bins - 1
    if df < 1:  # one bin: nothing to compare beyond the support
        return FitResult(view, n, 0.0, 0, 1.0, alpha, impossible)
    chi2 = float(((obs_b - exp_b) ** 2 / exp_b).sum())
    p_value = float(scipy_stats().chi2.sf(chi2, df))
    return FitResult(view, n, chi2, df, p_value, alpha, impossible)


def power_against(
    expected_probs: np.ndarray, alternative_probs: np.ndarray, n: int, alpha: float
) -> float:
    """Probability that :func:`chi_square_fit` rejects when the data follow ``alternative``.

    Pearson's statistic under a fixed alternative is approximately noncentral chi-square with
    ``df`` degrees of freedom and noncentrality ``n * sum((a - e)^2 / e)`` over the merged bins.
    Mass the alternative puts where the target has none is caught by the support check with
    probability ``1 - (1 - mass)^n``; the two routes are combined as if independent.
    """
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    alt = np.asarray(alternative_probs, dtype=np.float64).ravel()
    impossible_mass = float(alt[probs <= 0].sum())
    p_support = 1.0 - (1.0 - min(impossible_mass, 1.0)) ** n
    bins = merge_bins(probs, n)
    df = bins.num_bins - 1
    if df < 1:
        return p_support
    e = bins.aggregate(probs)
    a = bins.aggregate(alt)
    noncentrality = n * float(((a - e) ** 2 / e).sum())
    stats = scipy_stats()
    critical = stats.chi2.isf(alpha, df)
    p_chi2 = float(stats.ncx2.sf(critical, df, noncentrality)) if noncentrality > 0 else alpha
    return 1.0 - (1.0 - p_support) * (1.0 - p_chi2)
