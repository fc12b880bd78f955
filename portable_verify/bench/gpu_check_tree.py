"""The GPU check's tree cells: ``pv.verify_tree`` on the Triton kernel against the numpy
reference, and its speed beside the torch backend, on the device.

Trees are drawn as in ``scripts/bench/tree_cells.py`` (paths a few levels deep, children that
are often the parent row's argmax, so paths get accepted) with a greedy row in every batch;
sampled calls use per-request seeds, so the kernels draw the reference's uniforms. Exactness is
reported per (shape, children mode, method) as rows equal to the reference; above the
check's small vocabulary float32 sums in another order may flip near-ties, as for chains.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import portable_verify as pv

TREE_EXACT_SHAPES = ((5, 8, 37), (4, 16, 1000), (2, 16, 128256))
DRY_TREE_EXACT_SHAPES = ((3, 6, 37),)
MODES_AND_METHODS = (  # narrower: typical walks deterministic children only
    ("deterministic", "greedy"), ("deterministic", "rejection"), ("deterministic", "typical"),
    ("iid", "rejection"), ("without_replacement", "rejection"), ("iid", "traversal"),
    ("without_replacement", "traversal"))


def tree_call(b: int, n: int, v: int, mode: str, seed: int,
              device: torch.device | str = "cpu") -> dict[str, Any]:
    """``verify_tree`` keyword arguments of one random tree batch on ``device``."""
    gen = np.random.default_rng(seed)
    parents = np.full((b, n), -1, dtype=np.int64)
    for i in range(1, n):
        parents[:, i] = np.where(gen.random(b) < 0.5, i - 1, gen.integers(0, i, size=b))
    logits = torch.from_numpy(gen.standard_normal((b, n, v), dtype=np.float32) * 3)
    argmax = logits.argmax(-1).numpy()
    tokens = np.where(gen.random((b, n)) < 0.6, np.take_along_axis(argmax, parents.clip(0), 1),
                      gen.integers(0, v, size=(b, n)))
    temps = torch.tensor(gen.choice([0.7, 1.0], size=b), dtype=torch.float32)
    temps[0] = 0.0  # one greedy row in every batch
    call: dict[str, Any] = {
        "node_token_ids": torch.from_numpy(tokens), "parents": torch.from_numpy(parents),
        "target_logits": logits, "temperature": temps, "children": mode,
        "seed": torch.arange(b) + seed}
    if mode != "deterministic":
        noise = torch.from_numpy(gen.standard_normal((b, n, v), dtype=np.float32))
        call["draft_probs"] = torch.softmax(logits + noise, -1)
    return {k: (x.to(device) if isinstance(x, torch.Tensor) else x) for k, x in call.items()}


def _rows_equal(want: pv.TreeResult, got: pv.TreeResult) -> dict[str, int]:
    same = (got.token_ids.cpu() == want.token_ids).all(1) & (
        got.node_ids.cpu() == want.node_ids).all(1)
    return {"rows": int(want.token_ids.shape[0]), "rows_equal": int(same.sum()),
            "accepted_equal": int((got.num_accepted.cpu() == want.num_accepted).sum())}


def tree_exactness(check: Any, small_vocab: int) -> dict[str, Any]:
    """Per (shape, mode, method): rows of the kernels and of torch equal to the reference
    (all of them required at ``V <= small_vocab``)."""
    rows: list[dict[str, Any]] = []
    seed = 20261201
    for b, n, v in DRY_TREE_EXACT_SHAPES if check.dry_run else TREE_EXACT_SHAPES:
        for mode, method in MODES_AND_METHODS:
            if check.left() < 3:
                return _summary(check, rows, small_vocab, stopped_early=True)
            seed += 1
            want = pv.verify_tree(**tree_call(b, n, v, mode, seed), method=method,
                                  backend="numpy")
            entry: dict[str, Any] = {"B": b, "N": n, "V": v, "children": mode, "method": method}
            for backend in (check.kernels, check.torch_backend):
                try:
                    got = pv.verify_tree(**tree_call(b, n, v, mode, seed, check.device),
                                         method=method, backend=backend)
                    entry[backend] = _rows_equal(want, got)
                except Exception as exc:  # the other backend still counts
                    entry[backend] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            rows.append(entry)
    return _summary(check, rows, small_vocab)


def _summary(check: Any, rows: list[dict[str, Any]], small_vocab: int,
             stopped_early: bool = False) -> dict[str, Any]:
    small = [r[check.kernels] for r in rows if r["V"] <= small_vocab]
    errors = [f"{b} {r['children']}/{r['method']} {r['B']},{r['N']},{r['V']}: "
              f"{r[b]['error']}"[:300]
              for r in rows for b in (check.kernels, check.torch_backend) if "error" in r[b]]
    return {"rows": rows, "errors": errors, "stopped_early": stopped_early,
            "small_v_all_exact": bool(small) and all(r.get("rows_equal") == r.get("rows")
                                                     for r in small),
            "all_accepted_counts_equal": all(r[check.kernels].get("accepted_equal")
                                             == r[check.kernels].get("rows") for r in rows)}
