"""Fill numba's kernel cache: ``python -m portable_verify.backends.numba.build``.

Why a process of its own: a cold first ``backend="auto"`` call answers from a stand-in while
this runs beside it (:mod:`.readiness` starts it), so the compile holds no lock and shares no
GIL with the caller. It calls each entry kernel (:data:`.readiness.ENTRY_KERNELS`) once with
arrays of the canonical dtypes: every call of those dtypes has one kernel signature
(``host.call_arrays``), so what this compiles is what the front doors' calls load. One build at
a time per cache folder (a lock file there): a second waits, then finds the cache warm.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import numpy as np
import torch

from portable_verify.backends.numba import readiness

LOCK_FILE = "portable_verify.build.lock"
"""In the kernel cache folder: one build at a time fills it."""


def main() -> int:
    """Build at a lower priority than the caller, whose stand-in calls run meanwhile; 0 on
    success, :data:`.readiness.UNCACHED_EXIT` where numba has no writable cache location."""
    os.nice(10)
    torch.set_num_threads(1)
    if readiness.cache_state()["state"] == "uncached":
        return readiness.UNCACHED_EXIT  # a build here could never serve a later process
    with _build_lock():
        compile_entries()
    readiness.write_stamp()
    return 0


def compile_entries() -> None:
    """One tiny call per entry kernel: padded greedy (numpy arrays, then tensors entered by
    address), a sampled decision (the same two ways) and a sampled tree walk."""
    from portable_verify.backends.numba import entries, rules
    from portable_verify.backends.numba.backend import decide_arrays, greedy_arrays
    from portable_verify.backends.numba.tree import tree_arrays
    from portable_verify.core.tree import TreeInputs

    g = torch.Generator().manual_seed(0)
    b, k, v = 2, 2, 8
    target = torch.randn(b, k + 1, v, generator=g)
    drafts = torch.randint(0, v, (b, k), generator=g)
    empty = np.empty(0, dtype=np.int64)
    uniforms = torch.rand(b, k + 1, generator=g).numpy()
    temps = np.ones(b, dtype=np.float32)
    for as_host in (True, False):  # greedy, decide; then greedy_at, decide_at
        t, d = (target.numpy(), drafts.numpy()) if as_host else (target, drafts)
        greedy_arrays(t, True, d, empty, empty, False)
        decide_arrays(t.reshape(b * (k + 1), v), True, d, temps=temps, uniforms=uniforms,
                      check=False)
    parents = torch.tensor([[-1, 0, 0, 1]] * b)
    tree = TreeInputs(node_token_ids=torch.randint(0, v, (b, 4), generator=g), parents=parents,
                      num_nodes=torch.full((b,), 4), target=torch.randn(b * 4, v, generator=g),
                      target_is_logits=True, draft_probs=None, children="deterministic",
                      temperature=torch.ones(b), all_greedy=False, none_greedy=True,
                      uniforms=torch.rand(b, 4, generator=g), width=4)
    tree_arrays(tree, rules.TREE["rejection"], entries.walk)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """An exclusive lock file in the kernel cache folder (none when it has no folder)."""
    dirs = readiness.cache_state().get("cache_dirs") or []
    if not dirs:
        yield
        return
    import fcntl

    os.makedirs(dirs[0], exist_ok=True)
    with open(os.path.join(dirs[0], LOCK_FILE), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


if __name__ == "__main__":
    sys.exit(main())
