"""The statistical settings: toy target/draft tables, shapes, input forms and sample sizes.

Each :class:`~portable_verify.testing.stats.toy_decoding.Scenario` stresses one part of the
rejection rule (draft equal to or far from the target, zeros on either side, peaked or flat rows,
temperature, float16, a serving-size vocabulary). Tables come from fixed seeds, so every run tests
the same laws and the power figures in docs/testing.md stay true.
"""

from __future__ import annotations

import numpy as np
import torch

from portable_verify.testing.stats.toy_decoding import Scenario

SMALL_V = 6
LARGE_V = 4096


RESIDUAL_SCALE_P = np.array([[.38, .07, .55], [.44, .46, .10], [.49, .21, .30], [.43, .55, .02]])
RESIDUAL_SCALE_Q = np.array([[.05, .04, .91], [.35, .39, .26], [.40, .12, .48], [.01, .34, .65]])
"""V = 3 tables (start row, then one row per previous token) of ``block_residual_scale``: found
by a search maximising the law's distance under ``_wrong_block_residual_unscaled``."""


def _rows(rng: np.random.Generator, concentration: float, rows: int = SMALL_V + 1) -> np.ndarray:
    return rng.dirichlet(np.full(SMALL_V, concentration), size=rows)


def _normalise(t: np.ndarray) -> np.ndarray:
    return t / t.sum(1, keepdims=True)


def _dyadic(t: np.ndarray, bits: int = 10) -> np.ndarray:
    """Rows rounded to multiples of ``2**-bits`` that sum to exactly 1 (exact in float16)."""
    scale = 2**bits
    counts = np.floor(t * scale)
    short = (scale - counts.sum(1)).astype(np.int64)
    counts[np.arange(len(t)), np.argmax(t, 1)] += short
    return counts / scale


def _zipf_rows(rng: np.random.Generator, rows: int, exponent: float) -> np.ndarray:
    ranks = np.arange(1, LARGE_V + 1, dtype=np.float64) ** -exponent
    return _normalise(np.stack([ranks[rng.permutation(LARGE_V)] for _ in range(rows)]))


def _scenarios() -> dict[str, Scenario]:
    """Every statistical setting; tables come from fixed seeds so every run sees the same ones."""
    g = np.random.default_rng(20240601)
    p, q = _rows(g, 1.0), _rows(g, 0.5)
    far = _normalise((p.max(1, keepdims=True) - p + 1e-3) ** 4)
    q_zeros = q.copy()
    q_zeros[:, :2] = 0.0  # the draft never proposes tokens 0, 1; the target gives them mass
    p_zeros = p.copy()
    p_zeros[:, 4:] = 0.0  # the target forbids tokens 4, 5; the draft proposes them
    peaked = _normalise(np.eye(SMALL_V)[g.integers(0, SMALL_V, SMALL_V + 1)] * 30 + _rows(g, 1.0))
    flat = np.full((SMALL_V + 1, SMALL_V), 1.0 / SMALL_V)
    logits = g.normal(0.0, 1.5, size=(SMALL_V + 1, SMALL_V))
    zipf_p = _zipf_rows(g, 2, 1.1)
    zipf_q = _zipf_rows(g, 2, 1.0)
    markov = {"kind": "markov"}
    block = {"kind": "markov", "method": "block"}
    cases = [
        Scenario("sequence_joint", target=p, proposal=q, **markov),
        Scenario("draft_equals_target", target=p, proposal=p, num_drafts=3, ragged=False, **markov),
        Scenario("draft_far_from_target", target=p, proposal=far, **markov),
        Scenario("draft_zeros_where_target_has_mass", target=p, proposal=_normalise(q_zeros),
                 **markov),
        Scenario("target_zeros_where_draft_has_mass", target=_normalise(p_zeros),
                 proposal=_rows(g, 1.0), **markov),
        Scenario("peaked_target_flat_draft", target=peaked, proposal=flat, **markov),
        Scenario("flat_target_peaked_draft", target=_rows(g, 30.0), proposal=peaked, **markov),
        Scenario("temperature_from_logits", target=logits, proposal=q, logits=True,
                 temperature=0.7, **markov),
        Scenario("deterministic_draft", target=p, proposal=q, deterministic_draft=True, **markov),
        Scenario("float16_inputs", target=logits, proposal=_dyadic(q), logits=True,
                 dtype=torch.float16, **markov),
        Scenario("large_vocab_marginals", kind="positional", target=zipf_p, proposal=zipf_q,
                 trials=8_192, quick_trials=4_096, chunk=2_048, validate=False),
        # Block verification: the same law, a chain judged at once. K = 3 and three
        # tokens in the headline one, so a later success overriding an earlier failure reaches
        # the tested positions.
        Scenario("block_sequence_joint", target=p, proposal=q, num_drafts=3, length=3, **block),
        Scenario("block_draft_equals_target", target=p, proposal=p, num_drafts=3, ragged=False,
                 **block),
        Scenario("block_draft_far_from_target", target=p, proposal=far, **block),
        Scenario("block_draft_zeros_where_target_has_mass", target=p, proposal=_normalise(q_zeros),
                 **block),
        Scenario("block_target_zeros_where_draft_has_mass", target=_normalise(p_zeros),
                 proposal=_rows(g, 1.0), **block),
        Scenario("block_temperature_from_logits", target=logits, proposal=q, logits=True,
                 temperature=0.7, **block),
        Scenario("block_deterministic_draft", target=p, proposal=q, deterministic_draft=True,
                 **block),
        # Built so that the residual after a partial accept (a = 1 of K = 2) depends visibly on
        # its P_0 scale: P_0 = p/q of the first draft is small for the likely draft 2, and
        # max(P_0 p_1 - q_1, 0) differs from max(p_1 - q_1, 0) (TV ~0.076 over two tokens).
        Scenario("block_residual_scale", target=RESIDUAL_SCALE_P, proposal=RESIDUAL_SCALE_Q,
                 num_drafts=2, ragged=False, **block),
    ]
    return {c.name: c for c in cases}


SCENARIOS: dict[str, Scenario] = _scenarios()


def views(scenario: Scenario) -> list[tuple[int, ...]]:
    """What each scenario tests: the first token, and the joint (small V) or each position."""
    if scenario.kind == "positional":
        return [(j,) for j in range(scenario.length)]
    return [(0,), tuple(range(scenario.length))]
