"""A per-rank record of every verification step's decision, for tensor-parallel checks.

Why: under tensor parallelism every rank runs the sampler and keeps its own copy of the emitted
tokens, so the ranks must decide alike at every step; a server's workers cannot be asked over
RPC, so each one writes what it decided to a file. Off unless ``PORTABLE_VERIFY_VLLM_DIGESTS``
names a folder (the plugin then wraps its sampler with :class:`DigestRecorder`); when on, each
step costs one host read of its output ``[B, K+1]`` and one short line of text.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ENV_DIGESTS = "PORTABLE_VERIFY_VLLM_DIGESTS"


def digest(tokens: Any) -> str:
    """A short digest of one step's output (its shape and values): equal decisions, equal text."""
    array = tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens
    h = hashlib.sha1(repr((array.shape, str(array.dtype))).encode())
    h.update(array.tobytes())
    return h.hexdigest()[:16]


def _tp_rank() -> int:
    """This worker's tensor-parallel rank (-1 outside an initialised vLLM worker)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not a vLLM worker (unit tests), or no parallel state yet
        return -1


class DigestRecorder:
    """``rejection_sample`` that also appends each step's digest to ``rank<r>.<pid>.txt``.

    The file's first line is a JSON header (rank, pid, whether portable_verify decided, its
    method); every further line is one step. Attributes are read from the wrapped function, so
    the plugin's markers and counters (``portable_verify``, ``calls``, ...) stay live.
    """

    def __init__(self, inner: Any, folder: str | Path) -> None:
        self.inner = inner
        self.folder = Path(folder)
        self._file: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        if self._file is None:  # the rank is known only once vLLM's workers are set up
            rank = _tp_rank()
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"rank{rank}.{os.getpid()}.txt"
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 (lives with the process)
            header = {"rank": rank, "pid": os.getpid(),
                      "portable_verify": bool(getattr(self.inner, "portable_verify", False)),
                      "method": getattr(self.inner, "method", None)}
            self._file.write(json.dumps(header) + "\n")
        self._file.write(digest(out) + "\n")
        return out


def read(folder: str | Path) -> list[tuple[dict[str, Any], list[str]]]:
    """Every ``(header, digests)`` written under ``folder``, ordered by rank."""
    found = []
    for path in sorted(Path(folder).glob("rank*.txt")):
        lines = path.read_text().splitlines()
        if lines:
            found.append((json.loads(lines[0]), lines[1:]))
    return sorted(found, key=lambda item: item[0]["rank"])


def disagreement(records: list[tuple[dict[str, Any], list[str]]], ranks: int) -> str | None:
    """What breaks "ranks ``0..ranks-1`` each decided every step, alike", or None."""
    seen = [header["rank"] for header, _ in records]
    if seen != list(range(ranks)):
        return f"records from ranks {seen}, expected one from each of 0..{ranks - 1}"
    for header, steps in records:
        if not header["portable_verify"]:
            return f"rank {header['rank']} (pid {header['pid']}): vLLM's sampler decided"
        if not steps:
            return f"rank {header['rank']} (pid {header['pid']}) recorded no step"
    first = records[0][1]
    for header, steps in records[1:]:
        if steps != first:
            pairs = enumerate(zip(first, steps, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(first), len(steps)))
            return (f"rank {header['rank']} differs from rank 0 at step {at} "
                    f"({len(steps)} vs {len(first)} steps)")
    return None
