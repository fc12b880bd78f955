"""The budget sweep: each method's best budget chosen on some prompts, reported on the others.

Why held out: picking the fastest of many budgets on the same trials it is reported on favours
whichever budget had lucky trials (the winner's curse), so the report would overstate the gain.
Here the prompt batches are split once: the first half (at least one batch) *selects*, by the
mean per-trial speed-up over target-only; the rest *report*: tokens/s, tokens per target
forward, and paired ratios per (round, prompt batch) trial of the best configuration of each
method against target-only and against the best chain, with 95% Student-t intervals over the
report trials (never over steps).

Everything here reads the plain data :func:`~portable_verify.e2e.runner.run_e2e` returns (its
``results`` with their ``per_trial`` lists and ``trial_batches``), so it is tested on
hand-made figures.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from portable_verify.e2e.paired import mean_interval


def selection_batches(n_batches: int) -> set[int]:
    """The prompt batches that select: the first half (at least one; the rest report)."""
    if n_batches < 2:
        raise ValueError(f"a sweep needs at least 2 prompt batches, got {n_batches}")
    return set(range(max(1, n_batches // 2)))


def method_label(result: dict[str, Any], modes: int) -> str:
    """What a budget is chosen for: chain or tree, the rule, the verifier and the draft mode."""
    kind = "tree" if result.get("tree") else "chain"
    label = f"{kind} {result['method']}"
    if result.get("verifier") == "dense":
        label += " dense"
    return label + (f" {result['draft_mode']}" if modes > 1 else "")


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _config_row(r: dict[str, Any], label: str, sel: list[int], rep: list[int]) -> dict[str, Any]:
    trial = r["per_trial"]
    decode = r["decode_time_s"]
    return {"name": r["name"], "method": label, "scored_positions": r["scored_nodes"],
            "tokens_per_s": r["tokens_per_s"],
            "tokens_per_target_forward": r["tokens_per_target_forward"],
            "draft_share": r["draft_time_s"] / decode if decode else None,
            "selection_speedup": _mean([trial["speedup"][t] for t in sel]),
            "report_tokens_per_s": _mean([trial["tokens_per_s"][t] for t in rep])}


def sweep_report(data: dict[str, Any], selection: set[int]) -> dict[str, Any]:
    """Per configuration its figures; per method its best budget (chosen on the ``selection``
    batches' trials) with figures and paired ratios on the other trials."""
    batches = data["trial_batches"]
    sel = [t for t, b in enumerate(batches) if b in selection]
    rep = [t for t, b in enumerate(batches) if b not in selection]
    if not sel or not rep:
        raise ValueError("the selection batches must leave some trials to select on and some "
                         f"to report on; got batches {sorted(selection)} of {sorted(set(batches))}")
    base = next(r for r in data["results"] if r["k"] == 0)
    modes = len(data["config"].get("draft_modes", ["sampled"]))
    spec = [r for r in data["results"] if r["k"]]
    configs = [_config_row(r, method_label(r, modes), sel, rep) for r in spec]
    by_name = {r["name"]: r for r in spec}
    best: dict[str, dict[str, Any]] = {}
    for row in configs:
        if row["method"] not in best or row["selection_speedup"] > \
                best[row["method"]]["selection_speedup"]:
            best[row["method"]] = row
    chains = [row for label, row in best.items()  # the dense verifier is a baseline, not a
              if label.startswith("chain") and " dense" not in label]  # contender
    best_chain = max(chains, key=lambda row: row["selection_speedup"]) if chains else None
    methods = [_method_row(label, row, by_name, base, best_chain, rep)
               for label, row in best.items()]
    return {"selection_batches": sorted(selection),
            "report_batches": sorted(set(batches) - selection),
            "selection_trials": len(sel), "report_trials": len(rep),
            "criterion": "mean per-trial speed-up over target-only on the selection trials",
            "configs": configs, "methods": methods,
            "best_chain": None if best_chain is None else best_chain["name"]}


def _method_row(label: str, row: dict[str, Any], by_name: dict[str, dict[str, Any]],
                base: dict[str, Any], best_chain: dict[str, Any] | None,
                rep: list[int]) -> dict[str, Any]:
    """One method at its chosen budget, on the report trials only."""
    trial = by_name[row["name"]]["per_trial"]
    tps = [trial["tokens_per_s"][t] for t in rep]
    base_tps = [base["per_trial"]["tokens_per_s"][t] for t in rep]
    out = {"method": label, "best": row["name"], "scored_positions": row["scored_positions"],
           "selection_speedup": row["selection_speedup"], "tokens_per_s": _mean(tps),
           "tokens_per_target_forward": _mean([trial["accepted_per_forward"][t] + 1
                                               for t in rep]),
           "draft_share_all_trials": row["draft_share"],
           "vs_target_only": mean_interval([a / b for a, b in zip(tps, base_tps, strict=True)]),
           "vs_best_chain": None}
    if best_chain is not None and best_chain["name"] != row["name"]:
        chain = [by_name[best_chain["name"]]["per_trial"]["tokens_per_s"][t] for t in rep]
        out["vs_best_chain"] = mean_interval([a / b for a, b in zip(tps, chain, strict=True)])
    return out


def plot(path: str | Path, data: dict[str, Any]) -> None:
    """Tokens/s against scored positions per method (target-only as a line), and beside it the
    target forward's cost relative to one position (the flatness curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = data["sweep"]["configs"]
    base = next(r for r in data["results"] if r["k"] == 0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for label in dict.fromkeys(c["method"] for c in configs):
        sel = [c for c in configs if c["method"] == label]
        dots = left.scatter([c["scored_positions"] for c in sel],
                            [c["tokens_per_s"] for c in sel], s=18, alpha=0.6)
        best: dict[int, float] = {}  # several shapes may score as many positions: the line
        for c in sel:  # joins each count's best, the dots show every configuration
            best[c["scored_positions"]] = max(best.get(c["scored_positions"], 0.0),
                                              c["tokens_per_s"])
        xs = sorted(best)
        left.plot(xs, [best[x] for x in xs], "-", color=dots.get_facecolor()[0], label=label)
    left.axhline(base["tokens_per_s"], color="gray", linestyle="--", label="target-only")
    left.set_xlabel("scored positions per target forward")
    left.set_ylabel("tokens/s (all trials)")
    left.legend(fontsize=7)
    curve = data.get("flatness") or []
    right.plot([c["positions"] for c in curve], [c["relative"] for c in curve], "s-")
    right.set_xlabel("positions in one target forward")
    right.set_ylabel("forward time / one-position forward (median)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    ctx = data["context"]
    fig.suptitle(f"{ctx['runtime']} runtime, {ctx['machine']['cpu']}, {ctx['threads']} "
                 f"thread(s), {ctx['clock']} clock", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
