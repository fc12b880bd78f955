"""The target forward's cost against the number of positions it scores: the flatness curve.

Why: a speculative step scores ``k + 1`` positions (a tree's nodes + 1) in one target forward;
it pays only where that forward costs little more than a one-position forward. Timed after a
prefill, every size once per repetition in a rotated order (so slow phases of a shared machine
hit every size alike), each repetition on a fresh cache, and the OpenVINO cache compacted after
each crop, so cropped (dead) slots never pile up. Batch 1, whatever the run's batch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from portable_verify.integrations import hf

CONTEXT = 100
"""Prefill length before the timed forwards: a typical prompt plus some generated tokens."""
REPETITIONS = 7


@torch.inference_mode()
def forward_cost(model: Any, max_positions: int, *, context: int = CONTEXT,
                 repetitions: int = REPETITIONS, vocab: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> list[dict[str, float]]:
    """Median time of one forward of ``S`` new tokens after ``context`` cached ones, for
    ``S = 1 .. max_positions``, each also as a ratio to ``S = 1``.

    ``model``: a transformers causal LM or any :class:`~portable_verify.integrations.hf.StepModel`;
    ``vocab``: token ids are drawn below it (default: the model's vocabulary, capped at 1000).
    Returns one ``{"positions", "median_s", "relative"}`` per ``S``.
    """
    if max_positions < 1 or repetitions < 1 or context < 1:
        raise ValueError(f"max_positions, repetitions and context must be >= 1, got "
                         f"{max_positions}, {repetitions}, {context}")
    step = hf.as_step_model(model)
    high = vocab or min(_vocab(model), 1000)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, high, (1, context), generator=g)
    sizes = list(range(1, max_positions + 1))
    times: dict[int, list[float]] = {s: [] for s in sizes}
    for rep in range(repetitions + 1):  # repetition 0 warms up and is not kept
        cache = step.new_cache()
        step.prefill(prompt, cache, torch.arange(context)[None], None)
        for s in sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]:
            ids = torch.randint(0, high, (1, s), generator=g)
            t0 = clock()
            step.logits(ids, cache, torch.arange(context, context + s)[None], None)
            elapsed = clock() - t0
            cache.crop(-s)
            compact = getattr(cache, "compact", None)  # OpenVINO: cropped slots are dead ones;
            if compact is not None:  # removed before the next size, outside the timed call
                compact()
            if rep:
                times[s].append(elapsed)
    one = statistics.median(times[1])
    return [{"positions": s, "median_s": statistics.median(times[s]),
             "relative": statistics.median(times[s]) / one if one > 0 else float("nan")}
            for s in sizes]


def _vocab(model: Any) -> int:
    """The vocabulary size of a transformers module or of an OpenVINO model wrapper."""
    size = getattr(model, "vocab_size", None)
    return int(size if size is not None else model.config.vocab_size)
