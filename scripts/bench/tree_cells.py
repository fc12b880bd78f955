"""Tree verification cells: ``pv.verify_tree`` against the memory-read
floor of the rows the numpy reference reads, and against a torch contender written from
SGLang's published target-only rule.

Run (CPU, float32, one thread):  python scripts/bench/tree_cells.py [--quick] [--reps 5]

Each cell (B, N, V) is a random tree per request (each node's parent is the previous node with
probability 1/2, else uniform over the earlier nodes, so paths run a few levels deep) whose
tokens are the parent row's argmax with probability 0.6 (so paths get accepted), random
otherwise; target logits N(0, 3^2). Greedy and sampled (T = 1, deterministic children) calls.

* floor: the rows the reference walk reads (one target row per visited node: ``a + 1`` per
  request), in bytes, over this machine's read bandwidth measured in the same run (numpy max
  over a 256 MiB float32 array, best of 5);
* ``numba:cpu`` (the CPU default) with ``validate=False`` and with the default
  ``validate=True``, and ``torch:cpu`` with ``validate=False``, over the floor;
* contender (SGLang's ``tree_speculative_sampling_target_only`` / ``verify_tree_greedy`` rule
  in torch): softmax (or argmax) over all B*N rows, a loop over depth only, thresholds 1; its
  time over numba's (both validation settings).

Every time is the calling thread's CPU time (``time.thread_time``: all four run on it, one
thread each), the minimum over ``--reps`` interleaved repetitions (the four see the same
machine state; on a shared machine the minimum is the repetition least disturbed by other
jobs, where a median mostly measures the contention). Before each timed call a 64 MiB buffer
is read, so the cell's rows come from memory as the floor assumes (a repeated call on the
same inputs would otherwise find a small cell's rows in the last-level cache). Both backends
and, on greedy cells, the contender must agree token for token (asserted).
Only ratios measured side by side in this one run are reported.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import portable_verify as pv

CELLS = [(b, n, v) for v in (32000, 128256) for n in (8, 32, 64) for b in (1, 8, 64)]
QUICK = [(1, 8, 32000), (8, 32, 32000), (64, 32, 32000), (8, 64, 128256)]
MAX_BYTES = 1 << 30  # cells over ~1 GB stay out (and out of CI)


def make_cell(b: int, n: int, v: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = np.random.default_rng(seed)
    parents = np.full((b, n), -1, dtype=np.int64)
    for i in range(1, n):
        chain = gen.random(b) < 0.5
        parents[:, i] = np.where(chain, i - 1, gen.integers(0, i, size=b))
    logits = torch.from_numpy(gen.standard_normal((b, n, v), dtype=np.float32) * 3)
    argmax = logits.argmax(-1).numpy()
    tokens = np.where(gen.random((b, n)) < 0.6,
                      np.take_along_axis(argmax, parents.clip(0), 1),
                      gen.integers(0, v, size=(b, n)))
    tokens[:, 0] = 0
    return {"node_token_ids": torch.from_numpy(tokens), "parents": torch.from_numpy(parents),
            "target_logits": logits}


def sglang_contender(cell: dict[str, torch.Tensor], greedy: bool,
                     u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's target-only rule at thresholds 1, vectorised over the batch in torch: the
    probabilities (argmax for greedy) of all B*N rows, then a loop over depth; at each node
    one coin (the node's uniform) against the running sum of its children's target
    probabilities in sibling order; none accepted: a draw from the row with the children
    zeroed. Returns (accepted counts, final tokens)."""
    tokens, parents, logits = cell["node_token_ids"], cell["parents"], cell["target_logits"]
    b, n, _ = logits.shape
    rows = torch.arange(b)
    if greedy:
        predict = logits.argmax(-1)
    else:
        probs = torch.softmax(logits, -1)
    cur = torch.zeros(b, dtype=torch.int64)
    accepted = torch.zeros(b, dtype=torch.int64)
    done = torch.zeros(b, dtype=torch.bool)
    index = torch.arange(n)
    for _ in range(n - 1):
        is_child = (parents == cur[:, None]) & (index[None, :] > 0)
        if greedy:
            match = is_child & (tokens == predict[rows, cur][:, None])
        else:
            p_child = torch.where(is_child, probs[rows[:, None], cur[:, None], tokens], 0.0)
            match = is_child & (u[rows, cur][:, None] <= p_child.cumsum(1))
        hit = match.any(1) & ~done
        nxt = torch.where(match, index[None, :], n).amin(1)
        cur = torch.where(hit, nxt, cur)
        accepted += hit
        done |= ~hit
    if greedy:
        return accepted, predict[rows, cur]
    row = probs[rows, cur].clone()
    rejected = (parents == cur[:, None]) & (index[None, :] > 0)
    row[rows[:, None].expand(b, n)[rejected], tokens[rejected]] = 0.0
    c = row.cumsum(-1)
    final = torch.searchsorted(c, (u[:, -1] * c[:, -1])[:, None]).squeeze(1)
    return accepted, final.clamp(max=row.shape[-1] - 1)


_EVICT = np.ones(1 << 24, dtype=np.float32)
"""64 MiB, twice this machine's L3: read before each timed call."""


def read_bandwidth() -> float:
    """Bytes per CPU second one core reads here (numpy max over 256 MiB, best of 5)."""
    buf = np.ones((1 << 26,), dtype=np.float32)
    best = min(_timed(buf.max) for _ in range(5))
    return buf.nbytes / best


def _timed(fn, *args, **kwargs) -> float:  # type: ignore[no-untyped-def]
    """The calling thread's CPU time for one call (every contestant runs on this one thread):
    on a shared machine wall time also counts the time other jobs hold the core, which
    inflates long calls far more than short ones."""
    start = time.thread_time()
    fn(*args, **kwargs)
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bandwidth = read_bandwidth()
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (numpy max, one core)")
    print("| B | N | V | method | rows read | floor | numba/floor (validate=False) | "
          "numba/floor (validate=True) | torch/floor (validate=False) | "
          "contender/numba (False / True) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, n, v in QUICK if args.quick else CELLS:
        if b * n * v * 4 > MAX_BYTES:
            continue
        cell = make_cell(b, n, v)
        u = torch.rand(b, n, generator=torch.Generator().manual_seed(2)).clamp_min(2**-24)
        for method in ("greedy", "rejection"):
            print(bench_cell(cell, method, u, bandwidth, args.reps), flush=True)


def bench_cell(cell: dict[str, torch.Tensor], method: str, u: torch.Tensor, bandwidth: float,
               reps: int) -> str:
    """One table row: the backends' answers compared, then their interleaved times."""
    b, n, v = cell["target_logits"].shape
    greedy = method == "greedy"
    call = {**cell, "method": method, "uniforms": u}
    res = pv.verify_tree(**call, backend="numba:cpu")  # also the warm-up (compiles once)
    assert torch.equal(res.token_ids, pv.verify_tree(**call, backend="torch:cpu").token_ids)
    if greedy:  # the same rule: the contender must agree token for token
        accepted, final = sglang_contender(cell, True, u)
        assert torch.equal(accepted, res.num_accepted)
        assert torch.equal(final, res.token_ids.gather(1, accepted[:, None])[:, 0])
    rows_read = int((res.num_accepted + 1).sum())
    floor = rows_read * v * 4 / bandwidth
    runs = {
        "fast": lambda: pv.verify_tree(**call, backend="numba:cpu", validate=False),
        "checked": lambda: pv.verify_tree(**call, backend="numba:cpu"),
        "torch": lambda: pv.verify_tree(**call, backend="torch:cpu", validate=False),
        "contender": lambda: sglang_contender(cell, greedy, u),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):  # interleaved: the four see the same machine state
        for key, run in runs.items():
            _EVICT.max()  # the rows leave the caches, so every call reads them from memory
            times[key].append(_timed(run))
    best = {k: min(t) for k, t in times.items()}
    return (f"| {b} | {n} | {v} | {method} | {rows_read} | {floor * 1e3:.2f} ms | "
            f"{best['fast'] / floor:.1f} | {best['checked'] / floor:.1f} | "
            f"{best['torch'] / floor:.1f} | {_ratio(best['contender'] / best['fast'])} / "
            f"{_ratio(best['contender'] / best['checked'])} |")


def _ratio(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


if __name__ == "__main__":
    main()
