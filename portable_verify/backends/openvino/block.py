"""Block verification (docs/semantics.md, "Block verification") on the OpenVINO backend.

Why this split: the rule's heavy work is per row (the normalisers behind ``p_j(x_j)``, the
residual masses ``Z_j``, the final draw's weights), and that runs as three compiled OpenVINO
graphs; what remains is a few ``[B, K]`` float32 operations per draft position: the chain
``P_j``, a cumulative product clamped at 1, and the backward scan for the accepted count. Those
run on the host as numpy, one loop over positions vectorised over the batch, in the reference's
own float32/float64 arithmetic.

The three graphs (each compiled once per variant, with dynamic shapes):

* ``values``: ``p_j(x_j)`` and ``q_j(x_j)`` at every draft position;
* ``masses``: ``sum_v max(P_{j-1} p_j(v) - q_j(v), 0)`` for every position ``j``: ``Z_j`` is the
  mass at ``j + 1``. Every row is computed (no data-dependent row sets, so one call), where the
  reference reads rows ``j + 1`` only when its scan reaches ``j``;
* ``final``: the one draw per request from ``max(P_{a-1} p_a - q_a, 0)`` (``p_a`` when that is
  empty, and ``p_n`` when every draft is accepted).

Uniforms are the call's own (``u_j`` in column ``j``, the draw in the last column), drawn by the
front door from the same counter streams as rejection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs

Stage = Literal["values", "masses", "final"]


@dataclass(frozen=True)
class BlockGraph:
    """The key of one compiled block graph."""

    stage: Stage
    is_logits: bool
    has_draft_probs: bool

    def build(self) -> Any:
        from portable_verify.backends.openvino.block_graphs import build_block

        return build_block(self.stage, self.is_logits, self.has_draft_probs)


def verify_block(backend: Any, inputs: VerifyInputs,
                 arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(token_ids [B, K+1], num_accepted [B])`` of block verification; ``arrays`` are the
    backend's graph arrays (``K = 0`` padded to one unused position)."""
    logits, has_q = inputs.target_is_logits, "draft_probs" in arrays
    drafts, u = arrays["draft_token_ids"], arrays["uniforms"]
    b, k = drafts.shape
    vocab = int(arrays["target"].shape[1])
    n = np.clip(arrays["num_draft_tokens"], 0, inputs.num_positions)
    rows = np.clip(arrays["target_rows"], 0, arrays["target"].shape[0] - 1)
    temp = [arrays["temperature"]] if logits else []
    draft = [arrays["draft_probs"], arrays["draft_rows"]] if has_q else []
    common = [arrays["target"], rows, drafts, *temp, *draft]

    def run(stage: Stage, extra: list[np.ndarray]) -> list[np.ndarray]:
        graph = BlockGraph(stage, logits, has_q)
        return backend.infer(graph, [*common, *extra] if stage != "final" else extra,
                             build=graph.build)

    with np.errstate(all="ignore"):  # NaN or inf only arise for garbage (validate=False)
        px, qx, *row_stats = run("values", [])
        valid = (np.arange(k)[None, :] < n[:, None]) & (drafts >= 0) & (drafts < vocab)
        chain = chain_probabilities(np.where(valid, px, np.float32(0)), qx)
        scale = np.concatenate([np.ones((b, 1), np.float32), chain[:, :-1]], 1)
        (mass,) = run("masses", [np.ascontiguousarray(scale), *row_stats])
        a = backward_scan(chain, mass.astype(np.float64), u, n)
        final = _final_draw(run, arrays, rows, drafts, chain, a, n, logits, has_q)
    tokens = emit(drafts, final, a)
    if not inputs.none_greedy:
        tokens, a = _greedy_rows(backend, arrays, inputs.temperature, tokens, a)
    return tokens, a


def chain_probabilities(px: np.ndarray, qx: np.ndarray) -> np.ndarray:
    """``P_j = min(P_{j-1} p_j(x_j) / q_j(x_j), 1)`` as float32 ``[B, K]`` (``P_{-1} = 1``;
    0 once ``P_{j-1}`` or ``p_j(x_j)`` is 0; 1 when ``q_j(x_j) = 0 < p_j(x_j)``)."""
    chain = np.empty_like(px, dtype=np.float32)
    prev = np.ones(px.shape[0], np.float32)
    for j in range(px.shape[1]):
        ratio = np.minimum(prev * px[:, j] / qx[:, j], np.float32(1.0))
        prev = np.where((prev == 0) | (px[:, j] == 0), np.float32(0.0),
                        np.where(qx[:, j] == 0, np.float32(1.0), ratio)).astype(np.float32)
        chain[:, j] = prev
    return chain


def backward_scan(chain: np.ndarray, mass: np.ndarray, u: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Accepted counts: 1 + the last ``j`` with ``u_j <= h_j`` (0 if none), scanning back from
    ``n - 1`` and skipping every ``j`` with ``u_j > P_j`` (``h_j <= P_j``). ``mass[:, j + 1]``
    is ``Z_j``; ``h_j = Z_j / (Z_j + 1 - P_j)`` in float64, ``h_{n-1} = P_{n-1}``."""
    b, k = chain.shape
    a = np.zeros(b, np.int64)
    searching = n > 0
    for j in reversed(range(k)):
        candidate = searching & (j < n) & (u[:, j] <= chain[:, j])
        last = candidate & (n == j + 1)
        a = np.where(last, n, a)
        searching &= ~last
        if j + 1 >= k:
            continue
        z = mass[:, j + 1]
        h = np.where(z > 0, z / (z + (1.0 - chain[:, j].astype(np.float64))), 0.0)
        hit = candidate & (n > j + 1) & (u[:, j].astype(np.float64) <= h)
        a = np.where(hit, j + 1, a)
        searching &= ~hit
    return a


def _final_draw(run: Any, arrays: dict[str, np.ndarray], rows: np.ndarray, drafts: np.ndarray,
                chain: np.ndarray, a: np.ndarray, n: np.ndarray, logits: bool,
                has_q: bool) -> np.ndarray:
    """The next token of every request: the ``final`` graph on its row ``a``."""
    b, k = drafts.shape
    at = np.arange(b)
    a_draft = np.minimum(a, k - 1)
    scale = np.where(a > 0, chain[at, np.maximum(a - 1, 0)], np.float32(1.0)).astype(np.float32)
    if has_q:
        q_rows = np.clip(arrays["draft_rows"][at, a_draft], 0, arrays["draft_probs"].shape[0] - 1)
        draft = [arrays["draft_probs"], q_rows]
    else:
        draft = [np.ascontiguousarray(drafts[at, a_draft])]  # q_a = one-hot(x_a)
    extra = [arrays["target"], np.ascontiguousarray(rows[at, a]),
             *([arrays["temperature"]] if logits else []), scale, a < n,
             np.ascontiguousarray(arrays["uniforms"][:, -1]), *draft]
    return run("final", extra)[0]


def emit(drafts: np.ndarray, final: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``[B, K+1]``: the accepted drafts, the final token at column ``a``, then -1."""
    col = np.arange(drafts.shape[1] + 1)[None, :]
    padded = np.concatenate([drafts, np.zeros((drafts.shape[0], 1), np.int64)], 1)
    out = np.where(col < a[:, None], padded, final[:, None])
    return np.where(col > a[:, None], PLACEHOLDER_TOKEN_ID, out).astype(np.int64)


def _greedy_rows(backend: Any, arrays: dict[str, np.ndarray], temperature: np.ndarray,
                 tokens: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows with temperature 0 take the greedy graph's answer."""
    from portable_verify.backends.openvino.chain_graphs import Variant, input_names

    greedy = Variant()  # the argmax graph
    g_tokens, g_a = backend.infer(greedy, [arrays[name] for name in input_names(greedy)])
    row = np.asarray(temperature) == 0
    return np.where(row[:, None], g_tokens, tokens), np.where(row, g_a, a)
