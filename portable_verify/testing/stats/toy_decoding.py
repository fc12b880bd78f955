"""Toy language models and the speculative-decoding loop that drives a backend through them.

A scenario is a pair of conditional tables: the target's next-token distribution and the draft's
proposal distribution, each a function of a small *state*. In a ``markov`` scenario the state is
the previous token (so the conditional at position 1 depends on token 0); in a ``positional``
scenario it is the position in the sequence. Because rows of ``target_*`` are per request, each
request carries the conditionals of its own sampled draft path, and one ``verify`` call gives
thousands of independent trials.

Why a decoding *loop*: a call that rejects at position 0 emits only one token, so "the first two
emitted tokens" exist only if the next step is run too. Conditioning on calls that emitted two
tokens would bias the sample; running the real loop (next call at ``seed_offset + 1``, started
from the emitted prefix) is the claim losslessness makes: sequences have the target's law.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core.arguments import SEED_RANGE
from portable_verify.dispatch import torch_device

START = -1  # the "previous token" of position 0


@dataclass(frozen=True)
class Scenario:
    """One statistical setting: tables, shapes, input forms and sample sizes."""

    name: str
    kind: Literal["markov", "positional"]
    target: np.ndarray  # float64 [S, V] probabilities, or logits when ``logits`` is True
    proposal: np.ndarray  # float64 [S, V] the draft's sampling distribution
    num_drafts: int = 2  # K
    length: int = 2  # L: tokens per sequence that the test looks at
    ragged: bool = True  # num_draft_tokens ~ uniform{0..K} per request and step
    logits: bool = False
    temperature: float | None = None
    deterministic_draft: bool = False  # draft_probs=None: the verifier sees one-hot q
    dtype: torch.dtype = torch.float32
    trials: int = 20_000
    quick_trials: int = 6_000
    chunk: int = 0  # requests per verify call (0: all at once); fixed so shapes stay constant
    validate: bool = True  # False where input validation would cost more than the sampling
    seed: int = 0
    method: str = "rejection"  # the verify method under test (rejection or block: both exact)

    @property
    def vocab(self) -> int:
        return int(self.target.shape[1])

    def state(self, prev: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Row of the tables for (previous token, position)."""
        if self.kind == "markov":
            return np.asarray(prev, dtype=np.int64) + 1
        return np.minimum(np.asarray(pos, dtype=np.int64), self.target.shape[0] - 1)

    def target_input(self) -> np.ndarray:
        """The target table exactly as the verifier receives it (rounded to ``dtype``)."""
        return _round(self.target, self.dtype)

    def draft_input(self) -> np.ndarray:
        """The draft table exactly as the verifier receives it (rounded to ``dtype``)."""
        return _round(self.proposal, self.dtype)

    def verifier_target(self) -> np.ndarray:
        """float64 ``[S, V]`` p as the verifier computes it from the inputs as given."""
        t = self.target_input()
        if not self.logits:
            return t
        z = t / (1.0 if self.temperature is None else self.temperature)
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def target_probs(self) -> np.ndarray:
        """float64 ``[S, V]``: the target's law (the verifier's p, normalised)."""
        p = self.verifier_target()
        return p / p.sum(1, keepdims=True)


def _round(table: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(table).to(dtype).double().numpy()


def draw_from_table(table: np.ndarray, states: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Token ``~ table[states[i]]`` per request, by inverse CDF with ``u`` [B] in [0, 1).

    Loops over the few distinct table rows (at most V+1), never over requests.
    """
    cdf = np.cumsum(table, axis=1)
    cdf /= cdf[:, -1:]
    out = np.empty(states.shape, dtype=np.int64)
    for st in np.unique(states):
        sel = states == st
        out[sel] = np.searchsorted(cdf[st], u[sel], side="right")
    return np.minimum(out, table.shape[1] - 1)


def simulate(scenario: Scenario, backend: str, quick: bool) -> np.ndarray:
    """int64 ``[N, L]``: the first ``L`` tokens of ``N`` independent speculative decodes."""
    n = scenario.quick_trials if quick else scenario.trials
    chunk = scenario.chunk or n
    if n % chunk:
        raise ValueError(f"scenario {scenario.name}: trials {n} must be a multiple of {chunk}")
    parts = [
        _decode_chunk(scenario, backend, chunk, np.random.default_rng([scenario.seed, i]))
        for i in range(n // chunk)
    ]
    return np.concatenate(parts)


def _decode_chunk(s: Scenario, backend: str, b: int, rng: np.random.Generator) -> np.ndarray:
    k, length = s.num_drafts, s.length
    device = torch_device(backend)  # the tables live there; each step's ids move to it
    target_in = torch.from_numpy(s.target_input()).to(device, s.dtype)
    draft_in = torch.from_numpy(s.draft_input()).to(device, s.dtype)
    seeds = torch.from_numpy(rng.integers(0, SEED_RANGE, size=b, dtype=np.int64)).to(device)
    out = np.full((b, length), START, dtype=np.int64)
    have = np.zeros(b, dtype=np.int64)
    rows = np.arange(b)
    step = 0
    while (have < length).any():
        prev = np.where(have > 0, out[rows, np.maximum(have - 1, 0)], START)
        states = np.empty((b, k + 1), dtype=np.int64)
        drafts = np.empty((b, k), dtype=np.int64)
        state = s.state(prev, have)
        for j in range(k):  # a loop over draft positions, never over requests
            states[:, j] = state
            drafts[:, j] = draw_from_table(s.proposal, state, rng.random(b))
            state = s.state(drafts[:, j], have + j + 1)
        states[:, k] = state
        counts = (torch.from_numpy(rng.integers(0, k + 1, size=b)).to(device) if s.ragged
                  else None)
        index = torch.from_numpy(states).to(device)
        kwargs = {"target_logits" if s.logits else "target_probs": target_in[index]}
        if not s.deterministic_draft:
            kwargs["draft_probs"] = draft_in[index[:, :k]]
        result = pv.verify(
            torch.from_numpy(drafts).to(device),
            num_draft_tokens=counts,
            temperature=s.temperature,
            seed=seeds,
            seed_offset=step,
            backend=backend,
            method=s.method,
            validate=s.validate,
            **kwargs,
        )
        tokens = result.token_ids.cpu().numpy()
        take = np.minimum(result.num_emitted.cpu().numpy(), length - have)
        for c in range(min(k + 1, length)):  # positions of the emitted prefix
            sel = c < take
            out[rows[sel], have[sel] + c] = tokens[sel, c]
        have = have + take
        step += 1
    return out


def target_law(scenario: Scenario, view: tuple[int, ...]) -> np.ndarray:
    """Probabilities of the target's autoregressive law over the tokens at positions ``view``.

    ``(j,)``: the marginal at position ``j``; ``(0, 1)``: the joint of the first two tokens.
    """
    p = scenario.target_probs()
    if scenario.kind == "positional":
        marginals = [p[scenario.state(np.array(START), np.array(j))] for j in view]
        law = marginals[0]
        for m in marginals[1:]:
            law = np.multiply.outer(law, m)
        return law
    # markov: propagate the joint of positions 0..max(view), then marginalise.
    joint = p[scenario.state(np.array(START), np.array(0))]
    for _ in range(max(view)):
        joint = joint[..., None] * p[1:]  # [..., prev] x [prev, next]: rows 1.. are per token
    keep = tuple(view)
    drop = tuple(i for i in range(joint.ndim) if i not in keep)
    return joint.sum(axis=drop) if drop else joint


def observed_counts(tokens: np.ndarray, view: tuple[int, ...], vocab: int) -> np.ndarray:
    """Counts of each value of the tokens at positions ``view`` (a ``V ** len(view)`` array)."""
    flat = np.zeros(tokens.shape[0], dtype=np.int64)
    for j in view:
        flat = flat * vocab + tokens[:, j]
    return np.bincount(flat, minlength=vocab ** len(view)).reshape((vocab,) * len(view))
