"""The numpy reference: docs/semantics.md written as code, for clarity rather than speed.

Every other backend is tested against this module. Loops over requests and positions are
deliberate: each line should be checkable against the prose of the semantics document.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from portable_verify.core import methods
from portable_verify.core.constants import FLOAT32_MAX, FLOAT32_TINY
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, TypicalParams, VerifyInputs


def first_argmax(row: np.ndarray) -> int:
    """Index of the maximum; the lowest index wins ties."""
    return int(np.argmax(row))


def effective_temperature(temperature: float) -> np.float32:
    """``T`` clamped into the normal float32 range: ``+inf`` acts as the largest float32 and a
    positive ``T`` below ``2**-126`` as ``2**-126``, so no device's flush-to-zero or overflow
    changes the answer (both give the limit law of docs/semantics.md)."""
    return np.clip(np.float32(temperature), np.float32(FLOAT32_TINY), np.float32(FLOAT32_MAX))


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """float32 softmax of ``(logits - max) / T`` (``-inf`` logits get probability 0).

    Subtracting the maximum *before* dividing keeps every ``z`` in ``[-inf, 0]``: ``logits / T``
    itself overflows for huge logits or tiny ``T``, and ``inf - inf`` is NaN.
    """
    x = logits.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        z = (x - x.max()) / effective_temperature(temperature)  # a difference may overflow: -inf
    e = np.exp(z)
    return (e / e.sum()).astype(np.float32)


def inverse_cdf_draw(weights: np.ndarray, v: float) -> int:
    """Smallest ``t`` with ``cumsum(w)[t] >= v * cumsum(w)[-1]``, accumulated in float64."""
    c = np.cumsum(weights.astype(np.float32), dtype=np.float64)
    threshold = np.float64(np.float32(v)) * c[-1]
    # The clamp only matters for NaN weights (validate=False): ids stay in [0, V).
    return min(int(np.searchsorted(c, threshold, side="left")), len(c) - 1)


def entropy(p: np.ndarray) -> float:
    """Natural-log entropy with ``0 log 0 = 0``."""
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def verify_one(
    drafts: np.ndarray,
    target: np.ndarray,
    draft_q: np.ndarray | None,
    n: int,
    greedy: bool,
    is_logits: bool,
    temperature: float,
    method: str,
    uniforms: np.ndarray | None,
    typical: TypicalParams,
) -> list[int]:
    """Emitted tokens of one request; ``target`` is [>= n+1, V], ``draft_q`` [>= n, V] or None."""
    if greedy:
        emitted: list[int] = []
        for j in range(n):
            g = first_argmax(target[j])
            if drafts[j] != g:
                return [*emitted, g]
            emitted.append(int(drafts[j]))
        return [*emitted, first_argmax(target[n])]

    def p(j: int) -> np.ndarray:
        return softmax(target[j], temperature) if is_logits else target[j].astype(np.float32)

    v = float(uniforms[-1])
    if method == "block":
        return block_one(drafts, p, draft_q, n, uniforms)
    if method not in ("rejection", "typical"):
        raise methods.unknown_rule(method, "numpy", methods.CHAIN)
    emitted = []
    for j in range(n):
        x = int(drafts[j])
        pj = p(j)
        # An id outside the vocabulary (only with validate=False) is a token of probability 0.
        in_vocab = 0 <= x < len(pj)
        px = pj[x] if in_vocab else np.float32(0.0)
        if method == "typical":
            threshold = typical.threshold(entropy(pj))
            if not (in_vocab and px > threshold):
                return [*emitted, first_argmax(pj)]
        else:
            qx = np.float32(draft_q[j, x]) if draft_q is not None and px > 0 else np.float32(1.0)
            accepted = px > 0 and np.float32(uniforms[j]) * qx <= px
            if not accepted:
                if draft_q is not None:
                    q = draft_q[j].astype(np.float32)
                else:
                    q = np.zeros_like(pj)
                    if in_vocab:
                        q[x] = 1.0
                residual = np.maximum(pj - q, np.float32(0))
                if not residual.any():
                    residual = pj  # empty residual: draw from the target itself
                return [*emitted, inverse_cdf_draw(residual, v)]
        emitted.append(x)
    return [*emitted, inverse_cdf_draw(p(n), v)]


def block_one(drafts: np.ndarray, p: Callable[[int], np.ndarray], draft_q: np.ndarray | None,
              n: int, uniforms: np.ndarray) -> list[int]:
    """Block verification of one sampled request (docs/semantics.md, Block verification)."""
    v_size = len(p(0))

    def q(j: int) -> np.ndarray:
        """Row ``j`` of the draft's distribution: one-hot at the draft without ``draft_probs``."""
        if draft_q is not None:
            return draft_q[j].astype(np.float32)
        row = np.zeros(v_size, dtype=np.float32)
        if 0 <= drafts[j] < v_size:
            row[drafts[j]] = 1.0
        return row

    # P_j, j < n: the chance the chain up to j survives, min(P_{j-1} p_j(x_j) / q_j(x_j), 1).
    chain = []
    prev = np.float32(1.0)
    for j in range(n):
        x = int(drafts[j])
        in_vocab = 0 <= x < v_size
        px = p(j)[x] if in_vocab else np.float32(0.0)
        qx = q(j)[x] if in_vocab else np.float32(0.0)
        if prev == 0 or px == 0:
            prev = np.float32(0.0)
        elif qx == 0:
            prev = np.float32(1.0)
        else:
            prev = min(prev * px / qx, np.float32(1.0))
        chain.append(prev)

    def residual(j: int) -> np.ndarray:
        """``max(P_{j-1} p_j - q_j, 0)`` in float32 (``P_{-1} = 1``)."""
        scale = chain[j - 1] if j > 0 else np.float32(1.0)
        return np.maximum(scale * p(j) - q(j), np.float32(0))

    # Backward scan: a = 1 + the last j with u_j <= P_j and u_j <= h_j (0 if none).
    a = 0
    for j in reversed(range(n)):
        u = np.float32(uniforms[j])
        if u > chain[j]:
            continue  # h_j <= P_j: this position cannot be the last accepted one
        if j == n - 1:  # h_{n-1} = P_{n-1}
            a = n
            break
        z = float(np.sum(residual(j + 1), dtype=np.float64))  # Z_j, from rows j+1
        h = z / (z + (1.0 - float(chain[j]))) if z > 0 else 0.0
        if float(u) <= h:
            a = j + 1
            break
    if a == n:
        weights = p(n)  # the bonus draw (the caller's bonus_token_ids replace it downstream)
    else:
        weights = residual(a)
        if not weights.any():
            weights = p(a)  # empty residual: as in rejection, draw from the target itself
    return [*(int(x) for x in drafts[:a]), inverse_cdf_draw(weights, float(uniforms[-1]))]


def verify_reference(inputs: VerifyInputs) -> tuple[np.ndarray, np.ndarray]:
    """``(token_ids [B, K+1], num_accepted [B])`` for numpy inputs."""
    b, k = inputs.batch_size, inputs.num_positions
    tokens = np.full((b, k + 1), PLACEHOLDER_TOKEN_ID, dtype=np.int64)
    accepted = np.zeros(b, dtype=np.int64)
    for i in range(b):
        n = min(max(int(inputs.num_draft_tokens[i]), 0), k)  # garbage (validate=False) clamped
        temperature = float(inputs.temperature[i])
        q = inputs.draft_probs[inputs.draft_rows[i]] if inputs.draft_probs is not None else None
        emitted = verify_one(
            drafts=inputs.draft_token_ids[i],
            target=inputs.target[inputs.target_rows[i]],
            draft_q=q,
            n=n,
            greedy=inputs.all_greedy or temperature == 0.0,
            is_logits=inputs.target_is_logits,
            temperature=temperature,
            method=inputs.sampled_method,
            uniforms=None if inputs.uniforms is None else inputs.uniforms[i],
            typical=inputs.options.typical,
        )
        tokens[i, : len(emitted)] = emitted
        accepted[i] = len(emitted) - 1
    return tokens, accepted


CHAIN_RULES = ("rejection", "typical", "block")
"""The sampled rules :func:`verify_one` implements (its switch; the backend's traits read it)."""
