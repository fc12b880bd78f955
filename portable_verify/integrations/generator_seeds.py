"""Per-request ``torch.Generator`` objects (how vLLM carries seeded requests) as int64 seeds.

Why: portable_verify draws its random numbers from ``(seed, seed_offset)`` through a
counter-based hash; serving engines hand over one ``torch.Generator`` per seeded request. One
int64 draw from each generator is the seed of that request's step: equal generator states give
equal decisions, whatever else is in the batch, and the generator advances, so the next step
gets fresh numbers. Each draw is a tiny op on the generator's own device: no host sync.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from portable_verify.core.arguments import SEED_RANGE


def seeds_from_generators(
    generators: Mapping[int, torch.Generator] | None,
    batch_size: int,
    device: torch.device,
    skip_rows: frozenset[int] = frozenset(),
    check: bool = True,
    fallback: torch.Generator | None = None,
) -> torch.Tensor:
    """int64 ``[batch_size]`` seeds: one draw from each listed row's generator.

    Rows without a generator (and ``skip_rows``: rows whose generator must not advance, e.g.
    requests without drafts this step) get fresh seeds from ``fallback`` (a generator on
    ``device``), or from torch's global generator, so ``torch.manual_seed`` governs them.
    ``check`` validates keys and values, naming ``seeded_seqs``/``generators`` entries that are
    not row indices or generators.
    """
    seeds = torch.randint(0, SEED_RANGE, (batch_size,), dtype=torch.int64, device=device,
                          generator=fallback)
    if not generators:
        return seeds
    rows = [row for row in generators if row not in skip_rows]
    if check:
        for row in rows:
            gen = generators[row]
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < batch_size:
                raise ValueError(
                    f"seeded_seqs keys must be row indices in [0, {batch_size}), got {row!r}"
                )
            if not isinstance(gen, torch.Generator):
                raise TypeError(
                    f"seeded_seqs[{row}] must be a torch.Generator, got {type(gen).__name__}"
                )
    if not rows:
        return seeds
    # The engine's interface is a dict of generators, so it is walked once; each draw stays
    # on the generator's device (no transfer to the host).
    drawn = torch.cat([
        torch.randint(0, SEED_RANGE, (1,), dtype=torch.int64, generator=generators[row],
                      device=generators[row].device).to(device)
        for row in rows
    ])
    seeds[torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)] = drawn
    return seeds
