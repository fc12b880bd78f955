"""Pay a backend's first-call cost (a JIT compile, or a load from its cache) before serving.

Why: a compiled backend (``numba:cpu``) compiles, or loads from its on-disk cache, on the first
call of each specialisation; inside a serving engine that first call would land in the first
request's step. :func:`warm_up` makes one tiny call per method (with and without draft
probabilities) through the public front door, so it warms exactly what real calls reach,
whatever the backend's internals are.

Call it from the process that will serve, in its main thread: a compile holds numba's compiler
lock, and a process forked while another thread holds it inherits a lock no one will release
(its first compile then hangs). A child forked after :func:`warm_up` returned inherits the
compiled kernels and compiles nothing.
"""

from __future__ import annotations

import time

import torch

from portable_verify.api.ragged import verify_ragged
from portable_verify.core import methods as table

WARM_METHODS: tuple[str, ...] = tuple(m for m in table.names(table.CHAIN) if m != "auto")
"""The methods :func:`warm_up` warms by default: every chain method of the method table."""


def warm_up(backend: str = "auto", methods: tuple[str, ...] | None = None,
            device: str = "cpu") -> dict[str, float]:
    """One tiny ragged call per method (float32 logits, two requests), on ``device``.

    Returns the seconds each method's calls took (the first-call cost, then near zero on a
    second warm-up). Sampled methods run with and without draft probabilities, and with a
    greedy row beside a sampled one, the combinations an engine's steps hand over; with
    ``validate=False`` and caller bonus tokens, as the vLLM plugin calls.
    """
    chosen = WARM_METHODS if methods is None else methods
    unknown = [m for m in chosen if m not in WARM_METHODS]
    if unknown:
        raise ValueError(f"methods must be among {WARM_METHODS}, got {unknown}")
    g = torch.Generator().manual_seed(0)
    v = 8
    drafts = torch.tensor([1, 2, 3], dtype=torch.int64, device=device)
    counts = torch.tensor([2, 1], dtype=torch.int64, device=device)
    logits = torch.randn(5, v, generator=g).to(device)
    probs = torch.softmax(torch.randn(3, v, generator=g), -1).to(device)
    temperature = torch.tensor([0.0, 1.0], device=device)
    bonus = torch.tensor([4, 5], dtype=torch.int64, device=device)
    common = {"num_draft_tokens": counts, "target_logits": logits, "bonus_token_ids": bonus,
              "backend": backend, "validate": False}
    seconds: dict[str, float] = {}
    for method in chosen:
        start = time.perf_counter()
        if method == "greedy":
            verify_ragged(drafts, method="greedy", **common)
        else:
            for draft_probs in (None, probs):
                for temps in (1.0, temperature):
                    verify_ragged(drafts, draft_probs=draft_probs, method=method,
                                  temperature=temps, seed=0, **common)
        seconds[method] = time.perf_counter() - start
    return seconds
