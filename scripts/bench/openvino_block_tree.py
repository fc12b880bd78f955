"""OpenVINO block verification and trees, side by side.

Run (CPU, float32, one thread per runtime):  python scripts/bench/openvino_block_tree.py

* block vs token-wise rejection on the same inputs, both on ``openvino:CPU`` with one thread
  (drafts sampled from a draft whose logits are the target's plus N(0, 0.5^2) noise; both get
  ``draft_probs``), from logits and from probabilities;
* ``verify_tree`` on ``openvino:CPU`` against ``torch:cpu`` on the same trees (random parents,
  tokens among the parent row's top 4), greedy and sampled with i.i.d. children.

Interleaved repetitions, ``validate=False`` (the decision alone), median wall time; only the
ratios measured side by side in this one run are meant to be quoted.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

import portable_verify as pv
from portable_verify.backends.openvino.backend import OpenVINOBackend
from portable_verify.dispatch import register_backend
from portable_verify.testing.cases.tree_cases import random_parents

OPENVINO_1T = "openvino-1t"


def medians(calls: dict[str, Callable[..., object]], reps: int) -> dict[str, float]:
    """Median ms of each call (given ``seed=rep``) over ``reps`` interleaved repetitions (two
    warm-ups dropped)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps + 2):
        for name, call in calls.items():
            start = time.perf_counter()
            call(seed=rep)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(ts[2:])) * 1e3 for name, ts in times.items()}


def block_cells(reps: int) -> None:
    torch.manual_seed(0)
    for b, k, v in ((8, 4, 32000), (32, 4, 32000)):
        logits = torch.randn(b, k + 1, v) * 2
        q = torch.softmax(logits[:, :k] + 0.5 * torch.randn(b, k, v), -1)
        x = torch.multinomial(q.reshape(-1, v), 1).reshape(b, k)
        for form in ("logits", "probs"):
            target = ({"target_logits": logits} if form == "logits"
                      else {"target_probs": torch.softmax(logits, -1)})
            calls = {m: partial(pv.verify, x, **target, draft_probs=q, method=m,
                                backend=OPENVINO_1T, validate=False)
                     for m in ("rejection", "block")}
            med = medians(calls, reps)
            print(f"block ({b},{k},{v}) {form}: rejection {med['rejection']:.1f} ms, block "
                  f"{med['block']:.1f} ms, block x rejection {med['block'] / med['rejection']:.2f}")


def tree_cells(reps: int) -> None:
    rng = np.random.default_rng(0)
    for b, n, v in ((8, 32, 32000), (64, 32, 32000)):
        parents = torch.from_numpy(random_parents(rng, b, n))
        logits = torch.randn(b, n, v) * 2
        q = torch.softmax(logits + 0.5 * torch.randn(b, n, v), -1)
        top = logits.argsort(-1, descending=True)[..., :4]
        rank = torch.from_numpy(rng.integers(0, 4, size=(b, n)))[..., None]
        tokens = torch.gather(top[torch.arange(b)[:, None], parents.clamp(min=0)], 2, rank)[..., 0]
        for name, extra in (("greedy", {"method": "greedy"}),
                            ("iid", {"draft_probs": q, "children": "iid"})):
            calls = {be: partial(pv.verify_tree, tokens, parents, target_logits=logits,
                                 backend=be, validate=False, **extra)
                     for be in ("torch:cpu", OPENVINO_1T)}
            med = medians(calls, reps)
            print(f"tree ({b},{n},{v}) {name}: torch:cpu {med['torch:cpu']:.1f} ms, openvino "
                  f"{med[OPENVINO_1T]:.1f} ms, openvino x torch "
                  f"{med[OPENVINO_1T] / med['torch:cpu']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    register_backend(OPENVINO_1T, lambda device: OpenVINOBackend(device, num_threads=1))
    block_cells(args.reps)
    tree_cells(args.reps)


if __name__ == "__main__":
    main()
