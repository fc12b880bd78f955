"""The memory-read floor: the time of one reduction over exactly the bytes a method must read.

No verifier can beat reading its inputs once, so ``verify time / floor`` says how much of the
time is *not* spent streaming memory. On the CPU the floor is the fastest of ``torch.amax``,
``torch.sum`` and (CPU float32) numpy's ``max``: reductions read memory at different speeds, and
the floor should be the best any of them reaches. The pick is made once per cell by a short
calibration. On an accelerator a reduction over a few MB is one launch, timed mostly as
overhead, so the floor is the bytes over the device's copy bandwidth (:func:`copy_bandwidth`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch

from portable_verify.bench.cases import CaseInputs, Variant
from portable_verify.bench.harness import synchronize
from portable_verify.core import methods


def must_read(inputs: CaseInputs, variant: Variant) -> list[torch.Tensor]:
    """Flat views of the input bytes a variant cannot avoid reading.

    Greedy, typical and logits inputs need every target row (argmax, entropy, softmax
    normaliser). Rejection from probabilities needs only ``p(x)``, ``q(x)`` and one target and
    one draft row per request: ``B*V`` elements of each.
    """
    target = inputs.target.reshape(-1)
    rule = variant.method  # a token-wise rule reading draft_probs: rejection
    if (variant.inputs == "probs" and methods.reads_draft_probs(rule)
            and not methods.reads_rows_by_data(rule)):
        b, v = inputs.target.shape[0], inputs.target.shape[-1]
        parts = [target[: b * v]]
        if inputs.draft_probs is not None and inputs.draft_probs.numel():
            parts.append(inputs.draft_probs.reshape(-1)[: b * v])
        return parts
    return [target]


def _torch_floor(parts: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: [torch.amax(p) for p in parts if p.numel()]


def _torch_sum_floor(parts: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: [torch.sum(p) for p in parts]


def _numpy_floor(parts: list[torch.Tensor]) -> Callable[[], object]:
    arrays = [p.numpy() for p in parts]
    return lambda: [a.max() for a in arrays if a.size]


def floor_callable(parts: list[torch.Tensor]) -> tuple[str, Callable[[], object]]:
    """``(name, fn)``: the fastest reduction available for these tensors on their device."""
    candidates = {"torch.amax": _torch_floor(parts), "torch.sum": _torch_sum_floor(parts)}
    if all(p.device.type == "cpu" and p.dtype == torch.float32 for p in parts):
        candidates["numpy.max"] = _numpy_floor(parts)
    device = parts[0].device if parts else torch.device("cpu")
    best: dict[str, float] = {}
    for name, fn in candidates.items():
        fn()  # warm caches and lazy initialisation
        times = []
        for _ in range(3):
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    name = min(best, key=best.__getitem__)
    return name, candidates[name]


def num_bytes(parts: list[torch.Tensor]) -> int:
    return int(sum(p.numel() * p.element_size() for p in parts))



COPY_BYTES = 512 * 2**20
"""The buffer :func:`copy_bandwidth` copies: far larger than any L2, small for any GPU."""


@functools.cache
def copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES, reps: int = 5,
                   copies: int = 4) -> float:
    """Bytes per second a device-to-device copy of ``nbytes`` reads and writes: ``2 * nbytes``
    per copy over the median of ``reps`` synchronised blocks of ``copies`` copies (several per
    block, so the sync is a small part of the time): the rate a memory-bound kernel can reach
    on this device. Measured once per device and process."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: allocation, first touch
    times = []
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(copies):
            dst.copy_(src)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes * copies / statistics.median(times)


def bandwidth_floor_ms(num_bytes_read: int, bandwidth: float) -> float:
    """Milliseconds to read ``num_bytes_read`` at ``bandwidth`` bytes per second."""
    return num_bytes_read / bandwidth * 1e3
