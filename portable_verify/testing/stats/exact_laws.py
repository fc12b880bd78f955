"""Exact law of the emitted tokens under a (possibly wrong) verification rule.

Why: a statistical test is only as good as its power, and power needs the distribution the test
faces when a sampler is wrong. This module computes that distribution exactly, by enumerating
draft paths and accept/reject branches of the decoding loop of :mod:`toy_decoding`, for any
:class:`Rule`. For the correct rule it returns the target's law (the losslessness theorem, checked
numerically in tests/test_statistical_controls.py); for the negative controls it returns the
alternative that :func:`chi_square.power_against` turns into a power.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np

from portable_verify.testing.stats.toy_decoding import START, Scenario

BlockBug = Literal["none", "first_failure", "residual_late", "residual_unscaled",
                   "h_last_as_middle"]


@dataclass(frozen=True)
class Rule:
    """The three decisions of rejection sampling; the defaults are the exact algorithm.

    * ``accept``: ``"ratio"`` accepts with ``min(1, p/q)``; ``"inverse"`` with ``min(1, q/p)``.
    * ``recovered``: ``"residual"`` draws from ``max(0, p - q)``; ``"target"`` from ``p``.
    * ``bonus``: ``"target"`` draws from ``p_n``; ``"draft"`` from ``q_{n-1}``; ``"previous_row"``
      from ``p_{n-1}`` (an off-by-one row). With ``n = 0`` every bonus rule uses ``p_0``.
    """

    accept: Literal["ratio", "inverse"] = "ratio"
    recovered: Literal["residual", "target"] = "residual"
    bonus: Literal["target", "draft", "previous_row"] = "target"
    block: BlockBug | None = None
    """Block verification (docs/semantics.md) instead of token-wise rejection, with one bug:

    * ``"none"``: the exact rule;
    * ``"first_failure"``: ``a`` = the leading run of ``u_j <= h_j`` (stops at the first
      failure instead of taking the last success);
    * ``"residual_late"``: the residual at row ``a`` scaled by ``P_a`` (one row late) instead
      of ``P_{a-1}``;
    * ``"residual_unscaled"``: the residual at row ``a > 0`` drawn from ``max(p_a - q_a, 0)``
      (unscaled, as in token-wise rejection) instead of ``max(P_{a-1} p_a - q_a, 0)``;
    * ``"h_last_as_middle"``: at the last position ``h_{n-1} = Z / (Z + 1 - P_{n-1})`` as in
      the middle, with ``q_{n-1}`` standing in for the missing ``q_n``, instead of ``P_{n-1}``.
    """


EXACT = Rule()
EXACT_BLOCK = Rule(block="none")


def accept_probs(rule: Rule, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Probability that each token, proposed as the draft, is accepted (``[V]``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if rule.accept == "ratio":
            ratio = np.where(q > 0, p / q, np.inf)
        else:
            ratio = np.where(p > 0, q / p, 0.0)
    return np.where(p > 0, np.minimum(ratio, 1.0), 0.0)


def recovered_law(rule: Rule, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Law of the recovered token after a rejection."""
    w = np.maximum(p - q, 0.0) if rule.recovered == "residual" else p
    if not w.sum() > 0:
        w = p  # empty residual: drawn from p (docs/semantics.md)
    return w / w.sum()


def bonus_law(rule: Rule, p: np.ndarray, last: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Law of the bonus token; ``last`` is ``(p_{n-1}, q_{n-1})`` or None when ``n = 0``."""
    w = p
    if last is not None and rule.bonus == "draft":
        w = last[1]
    elif last is not None and rule.bonus == "previous_row":
        w = last[0]
    return w / w.sum()


def block_outcomes(rule: Rule, path: tuple[int, ...], p: list[np.ndarray],
                   q: list[np.ndarray]) -> list[tuple[float, np.ndarray]]:
    """For a block step on draft ``path`` (rows ``p_0..p_n``, ``q_0..q_{n-1}``): per accepted
    count ``a = 0..n``, its probability over the uniforms and the law of the emitted token."""
    n = len(path)
    chain, prev = [], 1.0
    for j, x in enumerate(path):
        px, qx = p[j][x], q[j][x]
        prev = 0.0 if prev == 0 or px == 0 else 1.0 if qx == 0 else min(prev * px / qx, 1.0)
        chain.append(prev)

    def ratio(z: float, big_p: float) -> float:
        return z / (z + 1.0 - big_p) if z > 0 else 0.0

    h = []
    for j in range(n):
        if j < n - 1:
            hj = ratio(np.maximum(chain[j] * p[j + 1] - q[j + 1], 0).sum(), chain[j])
        elif rule.block == "h_last_as_middle":
            hj = ratio(np.maximum(chain[j] * p[n] - q[n - 1], 0).sum(), chain[j])
        else:
            hj = chain[j]
        h.append(min(hj, chain[j]))
    if rule.block == "first_failure":
        probs = [float(np.prod(h[:a])) * (1.0 - h[a]) for a in range(n)] + [float(np.prod(h))]
    else:
        probs = [(1.0 if a == 0 else h[a - 1]) * float(np.prod([1.0 - t for t in h[a:]]))
                 for a in range(n)] + [h[n - 1]]
    out = []
    for a in range(n + 1):
        if a == n:
            w = p[n]
        else:
            scale = (chain[a] if rule.block == "residual_late"
                     else 1.0 if rule.block == "residual_unscaled" or not a else chain[a - 1])
            w = np.maximum(scale * p[a] - q[a], 0.0)
            if not w.sum() > 0:
                w = p[a]
        out.append((probs[a], w / w.sum()))
    return out


def sequence_law(scenario: Scenario, rule: Rule, need: int) -> np.ndarray:
    """Exact probabilities (shape ``(V,) * need``) of the first ``need`` emitted tokens."""
    s = scenario
    v = s.vocab
    p_tab = s.verifier_target()
    q_tab = s.draft_input()
    prop = s.proposal / s.proposal.sum(1, keepdims=True)

    def state(tok: int, pos: int) -> int:
        return int(s.state(np.array(tok), np.array(pos)))

    @cache
    def fresh(st: int, pos: int, need: int) -> np.ndarray:
        """A new decoding step from state ``st`` at sequence position ``pos``."""
        counts = range(s.num_drafts + 1) if s.ragged else [s.num_drafts]
        return np.mean([call(st, pos, m, need, None) for m in counts], axis=0)

    def then(w: np.ndarray, pos: int, need: int) -> np.ndarray:
        """Token ``y ~ w`` at ``pos``, followed by ``need - 1`` tokens from a fresh step."""
        if need == 1:
            return w
        out = np.zeros((v,) * need)
        for y in np.flatnonzero(w):
            out[y] = w[y] * fresh(state(int(y), pos + 1), pos + 1, need - 1)
        return out

    def emit(prefix: tuple[int, ...], w: np.ndarray, pos: int, need: int) -> np.ndarray:
        """Tokens ``prefix`` from ``pos`` on, then ``y ~ w`` and a fresh step (first ``need``)."""
        out = np.zeros((v,) * need)
        if len(prefix) >= need:
            out[prefix[:need]] = 1.0
            return out
        out[prefix] = then(w, pos + len(prefix), need - len(prefix))
        return out

    def block_call(st: int, pos: int, m: int, need: int) -> np.ndarray:
        """A block-verification step with ``m`` drafts: every draft path, then every ``a``."""
        out = np.zeros((v,) * need)
        for path, weight, states in draft_paths(st, pos, m):
            p_rows = [p_tab[c] for c in states]
            q_rows = [np.eye(v)[x] if s.deterministic_draft else q_tab[c]
                      for x, c in zip(path, states, strict=False)]
            for a, (prob_a, w) in enumerate(block_outcomes(rule, path, p_rows, q_rows)):
                if prob_a > 0:
                    out += weight * prob_a * emit(path[:a], w, pos, need)
        return out

    def draft_paths(st: int, pos: int, m: int) -> list[tuple[tuple[int, ...], float, list]]:
        """Every draft path of length ``m``: (tokens, probability, states of rows 0..m)."""
        paths = [((), 1.0, [st])]
        for j in range(m):
            paths = [((*path, int(x)), w * prop[states[-1], x],
                      [*states, state(int(x), pos + j + 1)])
                     for path, w, states in paths for x in np.flatnonzero(prop[states[-1]])]
        return paths

    def call(st: int, pos: int, m: int, need: int, last: tuple | None) -> np.ndarray:
        """Inside a step: ``m`` drafts left, state ``st``, next token at position ``pos``."""
        if need == 0:
            return np.array(1.0)
        if rule.block is not None:
            return block_call(st, pos, m, need) if m > 0 else then(
                p_tab[st] / p_tab[st].sum(), pos, need)
        p = p_tab[st]
        if m == 0:
            return then(bonus_law(rule, p, last), pos, need)
        if need == 1 and not s.deterministic_draft:  # vectorised over the proposed token
            a = accept_probs(rule, p, q_tab[st])
            return prop[st] * a + (prop[st] * (1 - a)).sum() * recovered_law(rule, p, q_tab[st])
        out = np.zeros((v,) * need)
        for x in np.flatnonzero(prop[st]):
            q = np.eye(v)[x] if s.deterministic_draft else q_tab[st]
            a = accept_probs(rule, p, q)[x]
            if a > 0:
                rest = call(state(int(x), pos + 1), pos + 1, m - 1, need - 1, (p, q))
                out[x] += prop[st, x] * a * rest
            if a < 1:
                out += prop[st, x] * (1 - a) * then(recovered_law(rule, p, q), pos, need)
        return out

    return fresh(state(START, 0), 0, need)


def law_of_view(
    scenario: Scenario, rule: Rule, view: tuple[int, ...]
) -> np.ndarray | None:
    """Exact law of the tokens at ``view`` under ``rule``; None when too costly to enumerate.

    Enumeration costs about ``V ** len`` per branch, so views beyond the first token are only
    computed for small vocabularies.
    """
    need = max(view) + 1
    if (need > 1 or rule.block is not None) and scenario.vocab > 64:
        return None  # block steps enumerate every draft path: V ** K
    law = sequence_law(scenario, rule, need)
    drop = tuple(i for i in range(need) if i not in view)
    return law.sum(axis=drop) if drop else law

