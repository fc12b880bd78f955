"""Tree verification cells: ``pv.verify_tree`` against the memory-read
floor of the rows the numpy reference reads, and against a torch contender written from
SGLang's published target-only rule.

Run (CPU, float32, one thread):  python scripts/bench/tree_cells.py [--quick] [--reps 5]
                                  python scripts/bench/tree_cells.py --traversal [--quick]

``--traversal``: traversal verification against the token-level rule (``rejection``) on the
same inputs on ``numba:cpu``, sampled children (iid and without replacement, with
``draft_probs``), both validation settings; per cell the ratio of target rows read and of
passes over V (counted by a float64 walk of each rule, section 4 of the rule's cost), the
time ratio, and traversal's time over the memory-read floor of the rows it reads.

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
from typing import Any

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
    parser.add_argument("--traversal", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bandwidth = read_bandwidth()
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (numpy max, one core)")
    if args.traversal:
        traversal_table(args, bandwidth)
        return
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


def sampled_cell(b: int, n: int, v: int, mode: str, seed: int = 0) -> dict[str, Any]:
    """A cell with sampled children: each child's token drawn from its parent's draft row
    (draft logits = target logits + N(0, 1)), iid or without replacement in sibling order."""
    cell: dict[str, Any] = dict(make_cell(b, n, v, seed))
    gen = np.random.default_rng(seed + 1)
    logits = cell["target_logits"]
    q = torch.softmax(logits + torch.from_numpy(gen.standard_normal((b, n, v),
                                                                   dtype=np.float32)), -1)
    tokens, parents = cell["node_token_ids"].numpy().copy(), cell["parents"].numpy()
    for r in range(b):
        taken: dict[int, set[int]] = {}
        for i in range(1, n):
            a = int(parents[r, i])
            row = q[r, a].double().numpy().copy()
            if mode == "without_replacement":
                row[list(taken.get(a, ()))] = 0.0
            tokens[r, i] = int(gen.choice(v, p=row / row.sum()))
            taken.setdefault(a, set()).add(int(tokens[r, i]))
    cell.update(node_token_ids=torch.from_numpy(tokens), draft_probs=q, children=mode)
    return cell


def walk_counts(cell: dict[str, Any], u: np.ndarray, traversal: bool) -> tuple[int, int]:
    """``(target rows read, passes over V)`` of one rule's walk over the cell, in float64
    (the reference's walk, up to rounding at the boundaries): the token-level rule reads the
    rows on its accepted path and makes one pass per rejection; traversal reads the rows of
    the entered nodes with children plus the final node's, one pass per rejection; both one
    draw. Rows read are summed over requests."""
    tokens, parents = cell["node_token_ids"].numpy(), cell["parents"].numpy()
    p_all = torch.softmax(cell["target_logits"].double(), -1).numpy()
    q_all = cell["draft_probs"].double().numpy()
    wr = cell["children"] == "without_replacement"
    rows = passes = 0
    for r in range(tokens.shape[0]):
        kids: dict[int, list[int]] = {}
        for i in range(1, tokens.shape[1]):
            kids.setdefault(int(parents[r, i]), []).append(i)
        counts = _traversal_walk if traversal else _token_walk
        got = counts(kids, tokens[r], parents[r], p_all[r], q_all[r], u[r], wr)
        rows, passes = rows + got[0], passes + got[1]
    return rows, passes


def _token_walk(kids, tokens, parents, p, q, u, wr):  # type: ignore[no-untyped-def]
    node, rows, passes = 0, 1, 1  # the root's row; the final draw
    while kids.get(node):
        res, qq = p[node].copy(), q[node].copy()
        for c in kids[node]:
            x = tokens[c]
            if res[x] > 0 and u[c - 1] * qq[x] <= res[x]:
                node, rows = c, rows + 1
                break
            passes += 1
            nxt = np.maximum(res - qq, 0)
            res = nxt / nxt.sum() if nxt.sum() > 0 else res
            if wr:
                qq[x] = 0
                qq = qq / qq.sum() if qq.sum() > 0 else qq
        else:
            return rows, passes
    return rows, passes


def _traversal_walk(kids, tokens, parents, p, q, u, wr):  # type: ignore[no-untyped-def]
    st = {0: [1.0, p[0].copy(), q[0].copy(), 0]}  # W, R, Q, next child
    rows, passes, c = (1 if kids.get(0) else 0), 1, 0  # entered nodes with children
    while True:
        while st[c][3] < len(kids.get(c, ())):
            w, r, qq, k = st[c]
            d = kids[c][k]
            x = tokens[d]
            e = 0.0 if w == 0 or r[x] == 0 else (1.0 if qq[x] == 0 else min(w * r[x] / qq[x], 1))
            st[d] = [e, p[d].copy(), q[d].copy(), 0]
            rows += 1 if kids.get(d) else 0
            c = d
        if c == 0 or u[c - 1] <= st[c][0]:
            return rows + (0 if kids.get(c) else 1), passes  # a final leaf's row: the draw
        a = int(parents[c])
        w, r, qq, k = st[a]
        res = np.maximum(w * r - qq, 0)
        s = res.sum()
        passes += 1
        if s > 0:
            st[a][0], st[a][1] = s / (s + 1 - w), res / s
        else:
            st[a][0] = 0.0
        if wr:
            qq[tokens[c]] = 0
            st[a][2] = qq / qq.sum() if qq.sum() > 0 else qq
        st[a][3] += 1
        c = a


def traversal_table(args: argparse.Namespace, bandwidth: float) -> None:
    print("| B | N | V | children | rows ratio | passes ratio | trav/token (validate=False) |"
          " trav/token (validate=True) | trav/floor (validate=False) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b, n, v in QUICK if args.quick else CELLS:
        if b * n * v * 4 * 2 > MAX_BYTES:
            continue
        for mode in ("iid", "without_replacement"):
            cell = sampled_cell(b, n, v, mode)
            u = torch.rand(b, n, generator=torch.Generator().manual_seed(2)).clamp_min(2**-24)
            print(traversal_row(cell, u, bandwidth, args.reps), flush=True)


def traversal_row(cell: dict[str, Any], u: torch.Tensor, bandwidth: float, reps: int) -> str:
    """One row: rows and passes ratios from the walks, then interleaved times."""
    b, n, v = cell["target_logits"].shape
    rows_t, passes_t = walk_counts(cell, u.numpy(), traversal=True)
    rows_k, passes_k = walk_counts(cell, u.numpy(), traversal=False)
    floor = rows_t * v * 4 / bandwidth
    runs = {(m, val): (lambda m=m, val=val: pv.verify_tree(
        **cell, method=m, uniforms=u, backend="numba:cpu", validate=val))
        for m in ("traversal", "rejection") for val in (False, True)}
    for run in runs.values():
        run()  # warm-up (compiles once)
    times: dict[Any, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for key, run in runs.items():
            _EVICT.max()
            times[key].append(_timed(run))
    best = {k: min(t) for k, t in times.items()}
    return (f"| {b} | {n} | {v} | {cell['children']} | {rows_t / rows_k:.2f} | "
            f"{passes_t / passes_k:.2f} | "
            f"{best[('traversal', False)] / best[('rejection', False)]:.2f} | "
            f"{best[('traversal', True)] / best[('rejection', True)]:.2f} | "
            f"{best[('traversal', False)] / floor:.1f} |")


def _ratio(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


if __name__ == "__main__":
    main()
