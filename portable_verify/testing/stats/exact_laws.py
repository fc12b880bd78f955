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


EXACT = Rule()


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

    def call(st: int, pos: int, m: int, need: int, last: tuple | None) -> np.ndarray:
        """Inside a step: ``m`` drafts left, state ``st``, next token at position ``pos``."""
        if need == 0:
            return np.array(1.0)
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
    if need > 1 and scenario.vocab > 64:
        return None
    law = sequence_law(scenario, rule, need)
    drop = tuple(i for i in range(need) if i not in view)
    return law.sum(axis=drop) if drop else law

