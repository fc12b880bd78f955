"""The expected gain of traversal verification over the token-level rule on synthetic rows.

Per configuration, ``trees`` draft trees are sampled; on each, both rules' expected accepted
drafts are computed exactly (the verifier's uniforms integrated out:
testing/stats/traversal_law.py), so the comparison is paired tree by tree and its only noise is
the choice of trees. Rows: V = 32; for every prefix (a fresh row per distinct prefix, shared by
duplicate siblings), target logits ``z ~ N(0, 2^2)`` per entry and draft logits
``z + sigma N(0, 1)``, temperature 1; children drawn from their parent's draft row, i.i.d. or
without replacement. The gain per call counts the emitted token too (accepted + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from portable_verify.testing.stats.traversal_law import (
    FixedTree,
    prefix_of,
    token_level_accepted,
    traversal_accepted,
)

VOCAB = 32
SHAPES: dict[str, tuple[int, ...]] = {
    "chain4": (-1, 0, 1, 2, 3),
    "eagle7": (-1, 0, 0, 0, 1, 1, 2, 4),
    "binary14": (-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6),
}
SIGMAS = (0.5, 1.0, 2.0)
SEED = 20261231
Z = 1.959964  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Gain:
    """One configuration: mean accepted drafts of each rule and the paired gains with 95%
    intervals (relative ones by the delta method of a ratio of paired means)."""

    shape: str
    mode: str
    sigma: float
    trees: int
    token_level: float
    traversal: float
    drafts_gain: tuple[float, float, float]  # relative gain in accepted drafts: mean, lo, hi
    call_gain: tuple[float, float, float]  # relative gain in tokens per call: mean, lo, hi


def sample_tree(gen: np.random.Generator, parents: tuple[int, ...], mode: str,
                sigma: float) -> FixedTree:
    """One drafted tree with its rows, drawn node by node."""
    rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
    tokens = [0]
    for i in range(1, len(parents)):
        parent_q = _rows(gen, rows, prefix_of(parents, tuple(tokens), parents[i]), sigma)[1]
        q = parent_q.copy()
        if mode == "without_replacement":
            q[[tokens[j] for j in range(1, i) if parents[j] == parents[i]]] = 0.0
        tokens.append(int(gen.choice(VOCAB, p=q / q.sum())))
    prefixes = [prefix_of(parents, tuple(tokens), i) for i in range(len(parents))]
    pairs = [_rows(gen, rows, x, sigma) for x in prefixes]
    return FixedTree(parents, tuple(tokens), np.stack([p for p, _ in pairs]),
                     np.stack([q for _, q in pairs]), mode)


def _rows(gen: np.random.Generator, rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]],
          prefix: tuple[int, ...], sigma: float) -> tuple[np.ndarray, np.ndarray]:
    if prefix not in rows:
        z = gen.normal(0.0, 2.0, VOCAB)
        rows[prefix] = (_softmax(z), _softmax(z + sigma * gen.normal(size=VOCAB)))
    return rows[prefix]


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def measure(shape: str, mode: str, sigma: float, trees: int, seed: int = SEED) -> Gain:
    gen = np.random.default_rng([seed, list(SHAPES).index(shape), SIGMAS.index(sigma),
                                 mode == "without_replacement"])
    tok, trav = np.zeros(trees), np.zeros(trees)
    for t in range(trees):
        tree = sample_tree(gen, SHAPES[shape], mode, sigma)
        tok[t], trav[t] = token_level_accepted(tree), traversal_accepted(tree)
    return Gain(shape, mode, sigma, trees, float(tok.mean()), float(trav.mean()),
                ratio_interval(trav, tok), ratio_interval(trav + 1.0, tok + 1.0))


def ratio_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """``mean(a) / mean(b) - 1`` with a 95% interval: the paired delta method."""
    r = a.mean() / b.mean()
    z = (a - r * b) / b.mean()
    half = Z * z.std(ddof=1) / np.sqrt(len(a))
    return float(r - 1.0), float(r - 1.0 - half), float(r - 1.0 + half)


def configurations() -> list[tuple[str, str, float]]:
    """Every (shape, mode, sigma); a chain has one child per node, so one mode for it."""
    return [(shape, mode, sigma) for sigma in SIGMAS for shape in SHAPES
            for mode in (("iid",) if shape == "chain4" else ("iid", "without_replacement"))]


def table(gains: list[Gain]) -> list[str]:
    """The gains as text lines (percentages, 95% intervals)."""
    lines = [f"{'shape':9} {'children':20} {'sigma':>5} {'trees':>5} {'token-level':>11} "
             f"{'traversal':>9}  {'drafts gain [95% CI]':24} {'per call gain [95% CI]'}"]
    for g in gains:
        lines.append(f"{g.shape:9} {g.mode:20} {g.sigma:5.1f} {g.trees:5d} {g.token_level:11.3f} "
                     f"{g.traversal:9.3f}  {_pct(g.drafts_gain):24} {_pct(g.call_gain)}")
    return lines


def _pct(v: tuple[float, float, float]) -> str:
    return f"{100 * v[0]:+.1f}% [{100 * v[1]:+.1f}, {100 * v[2]:+.1f}]"
