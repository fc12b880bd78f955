"""Pay a backend's first-call cost (a JIT compile, or a load from its cache) before serving.

Why: a compiled backend (``numba:cpu``) compiles, or loads from its on-disk cache, on the first
call of each kernel; inside a serving engine that first call would land in the first request's
step. :func:`warm_up` makes tiny calls through the public front doors that reach every kernel
(chain: every chain method, padded and ragged, tensors and numpy arrays; block; tree: every tree
method the backend implements, each children mode), so it warms exactly what real calls reach,
whatever the backend's internals are. ``portable-verify warm-up`` runs it; a cold
``backend="auto"`` call builds the kernels in a subprocess of the backend's own
(docs/decisions.md, "The first call").

Call it from the process that will serve, in its main thread: a compile holds numba's compiler
lock, and a process forked while another thread holds it inherits a lock no one will release
(its first compile then hangs). A child forked after :func:`warm_up` returned inherits the
compiled kernels and compiles nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from portable_verify import dispatch
from portable_verify.api.padded import verify
from portable_verify.api.ragged import verify_ragged
from portable_verify.api.tree import verify_tree
from portable_verify.core import methods as table
from portable_verify.core.tree import CHILDREN_MODES

WARM_METHODS: tuple[str, ...] = tuple(m for m in table.names(table.CHAIN) if m != "auto")
"""The chain methods :func:`warm_up` warms by default: every chain method of the method table."""
TREE_METHODS: tuple[str, ...] = tuple(m for m in table.names(table.TREE) if m != "auto")
"""The tree methods it warms where the backend implements them."""


def warm_up(backend: str = "auto", methods: tuple[str, ...] | None = None,
            device: str = "cpu", trees: bool = True) -> dict[str, float]:
    """Tiny calls that reach every kernel of ``backend`` on ``device``; ``"auto"`` means what
    ``auto`` takes once every kernel is ready (``numba:cpu`` where numba is installed).

    Returns the seconds each method's calls took (the first-call cost, then near zero on a
    second warm-up), and ``"tree"``'s. Sampled methods run with and without draft
    probabilities, with a greedy row beside a sampled one, and with ``validate=False`` and
    caller bonus tokens, as the vLLM plugin calls.
    """
    chosen = WARM_METHODS if methods is None else methods
    unknown = [m for m in chosen if m not in WARM_METHODS]
    if unknown:
        raise ValueError(f"methods must be among {WARM_METHODS}, got {unknown}")
    name = dispatch.settled_auto(device).qualified_name if backend == "auto" else backend
    seconds = {m: _timed(lambda m=m: _chain_calls(name, m, device)) for m in chosen}
    if trees:
        seconds["tree"] = _timed(lambda: _tree_calls(name, device))
    warms = dispatch.warming_of(name)
    if warms is not None and methods is None and trees:
        warms.warmed()  # every kernel is loaded here: auto takes it from now on
    return seconds


def _timed(calls: Callable[[], None]) -> float:
    start = time.perf_counter()
    calls()
    return time.perf_counter() - start


def _chain_calls(backend: str, method: str, device: str) -> None:
    """Ragged calls (row maps: the engines' layout) and padded ones (tensors and numpy arrays:
    the compiled backend enters tensors by address), each as the front doors pass them."""
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
    padded = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64, device=device)
    target = torch.randn(2, 3, v, generator=g).to(device)
    q = torch.softmax(torch.randn(2, 2, v, generator=g), -1).to(device)
    if method == "greedy":
        verify_ragged(drafts, method="greedy", **common)
        for as_array in (_same, _numpy):
            verify(as_array(padded), target_logits=as_array(target), method="greedy",
                   backend=backend)
        return
    for draft_probs in (None, probs):
        for temps in (1.0, temperature):
            verify_ragged(drafts, draft_probs=draft_probs, method=method, temperature=temps,
                          seed=0, **common)
    for as_array in (_same, _numpy):
        verify(as_array(padded), target_logits=as_array(target), draft_probs=as_array(q),
               method=method, temperature=as_array(temperature), seed=0, backend=backend)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _numpy(t: torch.Tensor) -> Any:
    return t.cpu().numpy() if t.device.type == "cpu" else t


def _tree_calls(backend: str, device: str) -> None:
    """A two-level tree per tree method the backend implements, per children mode."""
    resolved = dispatch.get_backend(backend)
    if table.TREE not in resolved.traits.layouts:
        return
    g = torch.Generator().manual_seed(0)
    v = 8
    tokens = torch.tensor([[0, 1, 2, 3]], dtype=torch.int64, device=device)
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int64, device=device)
    logits = torch.randn(1, 4, v, generator=g).to(device)
    q = torch.softmax(torch.randn(1, 4, v, generator=g), -1).to(device)
    for method in TREE_METHODS:
        if not resolved.traits.implements(table.TREE, table.TABLE[method].rule):
            continue
        for children in [c for c in CHILDREN_MODES if c != "auto"]:
            draft_probs = None if children == "deterministic" else q
            verify_tree(tokens, parents, target_logits=logits, draft_probs=draft_probs,
                        children=children, method=method, temperature=1.0, seed=0,
                        backend=backend)
