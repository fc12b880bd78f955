"""This tree's ``verify`` against another commit's, interleaved in one process, on the bench grid.

Why: "no slower than before" needs both versions measured side by side on the same shared
machine, not against a figure from another day. The other commit is imported under another
package name (a copy of its ``portable_verify/`` renamed ``portable_verify_old``):

    git worktree add /tmp/old 5aed259
    mkdir -p /tmp/oldpkg && cp -r /tmp/old/portable_verify /tmp/oldpkg/portable_verify_old
    find /tmp/oldpkg -name '*.py' -exec sed -i 's/portable_verify\\b/portable_verify_old/g' {} +
    PYTHONPATH=/tmp/oldpkg python scripts/bench/against_commit.py --threads 1 [--quick]

Each cell alternates the two versions in rounds of ~20 ms, in AB-BA order (whoever runs first
after the round's ``torch.argmax`` finds a colder cache: up to 30% at 36 MB of inputs), and
reports the median new/old ratio of the AB-BA pairs with its 25-75% spread, beside the
fixed-cost ratios to a bare ``torch.argmax`` timed in the same rounds (the
serving operating point's targets).
``--kernel`` times the compiled kernel alone instead: both trees' ``numba_cpu.decide_arrays``
on the same host arrays (no front door), which separates a kernel's row passes from the
per-call cost around it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import statistics
import time

# Compile in place: with a cold cache the interim path would time the torch stand-in.
os.environ.setdefault("PORTABLE_VERIFY_INTERIM", "0")

import torch

import portable_verify as new
from portable_verify.bench.cases import FULL_SHAPES, QUICK_SHAPES, VARIANTS, make_inputs
from portable_verify.bench.environment import cpu_flags
from portable_verify.core.types import DEFAULT_TYPICAL

CLOCK = time.perf_counter


def _time(fn: object, repeat: int) -> float:
    start = CLOCK()
    for _ in range(repeat):
        fn()  # type: ignore[operator]
    return (CLOCK() - start) / repeat


def _front_doors(old: object, inputs: object, variant: object, door: str = "verify") -> tuple:
    """The door ``door`` of each tree on the cell's inputs, returning the token ids: ``verify``
    (padded), ``ragged`` (the same drafts flattened), ``rows`` (flat target rows and their
    maps, as an engine holds them) or ``tree`` (the drafts as a chain-shaped tree plus one
    sibling per node, scored by the same rows)."""
    kwargs = inputs.verify_kwargs(variant)  # type: ignore[attr-defined]
    kwargs["seed"] = inputs.seeds  # type: ignore[attr-defined]
    drafts = inputs.drafts  # type: ignore[attr-defined]
    b, k = drafts.shape
    target_key = "target_logits" if "target_logits" in kwargs else "target_probs"
    target = kwargs.pop(target_key)
    q = kwargs.pop("draft_probs", None)
    if door == "verify":
        call = (drafts,), {target_key: target, "draft_probs": q, **kwargs}
    elif door == "ragged":
        call = (drafts.reshape(-1),), {
            "num_draft_tokens": torch.full((b,), k), target_key: target.reshape(b * (k + 1), -1),
            "draft_probs": None if q is None else q.reshape(b * k, -1), **kwargs}
    elif door == "rows":
        options = new.VerifyOptions(kwargs.pop("method"))
        call = (drafts,), {
            "target_rows": torch.arange(b * (k + 1)).reshape(b, k + 1),
            target_key: target.reshape(b * (k + 1), -1), "options": options,
            "draft_probs": None if q is None else q.reshape(b * k, -1),
            "draft_rows": None if q is None else torch.arange(b * k).reshape(b, k), **kwargs}
    else:  # tree: node j+1 is draft j (a chain), the rows are the target's own
        parents = torch.arange(-1, k).expand(b, k + 1).contiguous()
        tokens = torch.cat([torch.zeros(b, 1, dtype=torch.int64), drafts], 1)
        tree_q = None if q is None else torch.cat([q, q[:, -1:]], 1)
        call = (tokens, parents), {target_key: target, "draft_probs": tree_q, **kwargs}
    fn = {"verify": "verify", "ragged": "verify_ragged", "rows": "verify_rows",
          "tree": "verify_tree"}[door]
    args, kw = call
    old_kw = dict(kw)
    if door == "rows":  # the other tree's own options value
        old_kw["options"] = old.VerifyOptions(kw["options"].method)  # type: ignore[attr-defined]
    return (lambda: getattr(new, fn)(*args, **kw).token_ids,
            lambda: getattr(old, fn)(*args, **old_kw).token_ids)


def _kernels(inputs: object, variant: object) -> tuple:
    """Each tree's ``numba_cpu.decide_arrays`` (the kernel and its host glue) on the same
    host arrays; both take these keywords."""
    ours = importlib.import_module("portable_verify.backends.numba.backend").decide_arrays
    theirs = importlib.import_module("portable_verify_old.backends.numba_cpu").decide_arrays
    target = inputs.target.numpy().reshape(-1, inputs.target.shape[-1])  # type: ignore
    logits = variant.inputs == "logits"  # type: ignore[attr-defined]
    kwargs = {"seeds": inputs.seeds.numpy(),  # type: ignore[attr-defined]
              "all_greedy": variant.method == "greedy",  # type: ignore[attr-defined]
              "temp_scalar": variant.temperature if logits else 1.0}  # type: ignore
    if not logits:
        kwargs["q"] = inputs.draft_probs.numpy().reshape(-1, target.shape[1])  # type: ignore
    old_kwargs = dict(kwargs)
    kwargs["rule"] = variant.method  # type: ignore[attr-defined]  (a name of numba's rules.CHAIN)
    if variant.method == "typical":  # type: ignore[attr-defined]
        kwargs["typical"] = DEFAULT_TYPICAL  # one value now; 5aed259 took the fields
        old_kwargs.update(typical=True, **dataclasses.asdict(DEFAULT_TYPICAL))
    drafts = inputs.drafts.numpy()  # type: ignore[attr-defined]
    return (lambda: torch.from_numpy(ours(target, logits, drafts, **kwargs)[0]),
            lambda: torch.from_numpy(theirs(target, logits, drafts, **old_kwargs)[0]))


def _cell(old: object, shape: tuple[int, int, int], variant: object, rounds: int,
          kernel: bool = False, door: str = "verify") -> dict:
    inputs = make_inputs(shape, variant, torch.float32, torch.device("cpu"))
    ours, theirs = (_kernels(inputs, variant) if kernel
                    else _front_doors(old, inputs, variant, door))
    assert torch.equal(ours(), theirs()), "the two versions disagree"
    one = max(_time(ours, 3), 1e-7)
    repeat = max(1, int(0.02 / one))
    ratios, new_t, old_t, argmax = [], [], [], []
    for r in range(rounds):  # the argmax in the same rounds: its cost moves with the machine's
        if r % 2:  # who goes first alternates: the first after the argmax finds a colder cache
            t_old = _time(theirs, repeat)
            t_new = _time(ours, repeat)
        else:
            t_new = _time(ours, repeat)
            t_old = _time(theirs, repeat)
        argmax.append(_time(lambda: inputs.target.argmax(-1), repeat))
        new_t.append(t_new)
        old_t.append(t_old)
        if r % 2:  # one ratio per AB-BA pair of rounds: the order's effect cancels
            ratios.append((new_t[-1] + new_t[-2]) / (old_t[-1] + old_t[-2]))
    q = statistics.quantiles(ratios, n=4)
    return {"new_x_argmax": statistics.median(new_t) / statistics.median(argmax),
            "old_x_argmax": statistics.median(old_t) / statistics.median(argmax),
            "shape": list(shape), "variant": variant.label,  # type: ignore[attr-defined]
            "new_over_old": statistics.median(ratios), "q25": q[0], "q75": q[2],
            "new_ms": statistics.median(new_t) * 1e3, "old_ms": statistics.median(old_t) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=12, help="an even count: AB-BA pairs")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--kernel", action="store_true",
                        help="time numba_cpu.decide_arrays of both trees (no front door)")
    parser.add_argument("--shapes", default=None, help="override the grid: 'B,K,V;B,K,V'")
    parser.add_argument("--door", choices=("verify", "ragged", "rows", "tree"),
                        default="verify", help="the front door both trees are timed through")
    parser.add_argument("--variants", default=None, help="comma list, e.g. typical/logits")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time (less sensitive to a shared machine; "
                        "1 thread only)")
    args = parser.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.thread_time
    torch.set_num_threads(args.threads)
    import portable_verify_old as old  # type: ignore[import-not-found]

    old_methods = importlib.import_module("portable_verify_old.core.types").METHODS
    rows = []
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";"))
    wanted = args.variants.split(",") if args.variants else None
    for shape in shapes:
        for variant in (v for v in VARIANTS if v.method in old_methods
                        and (wanted is None or v.label in wanted)):
            if args.door == "tree" and variant.method == "block":
                continue  # block verifies chains; the tree door takes traversal
            row = _cell(old, shape, variant, args.rounds, args.kernel, args.door)
            row["door"] = args.door
            rows.append(row)
            print(f"{tuple(shape)!s:>18} {row['variant']:<16} new/old "
                  f"{row['new_over_old']:.3f} [{row['q25']:.3f}, {row['q75']:.3f}]", flush=True)
    print(f"threads={args.threads} clock={args.clock} cpu flags: {cpu_flags()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"threads": args.threads, "kernel": args.kernel, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
