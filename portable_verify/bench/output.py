"""Result output: the rich table, JSON and CSV files, and the time-versus-batch plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

TIME_KEYS = ("verify", "dense", "floor", "argmax", "hf", "vllm_v0_typical", "verify_validated",
             "verify_validated_full", "rejection_same_inputs")
RATIO_KEYS = ("speedup_vs_dense", "x_floor", "x_argmax", "speedup_vs_argmax", "speedup_vs_hf",
              "speedup_vs_vllm_typical", "validation_overhead", "validation_full_overhead",
              "x_rejection")


def write_json(path: str | Path, meta: dict[str, Any], cells: list[dict[str, Any]]) -> None:
    data = {"meta": meta, "cells": cells, "targets": target_summary(cells)}
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def flat_row(cell: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: identifying columns, times, ratios, targets, and the run's context."""
    row = {k: cell[k] for k in ("device", "backend", "dtype", "B", "K", "V", "variant",
                                "temperature", "floor_impl", "floor_bytes", "floor_GBps")}
    row.update({f"{k}_ms": cell["times_ms"].get(k) for k in TIME_KEYS})
    row.update({k: cell["ratios"].get(k) for k in RATIO_KEYS})
    row["targets"] = "; ".join(f"{t['target']}: {'met' if t['met'] else 'MISSED'}"
                               for t in cell["targets"])
    row["threads"] = meta["threads"]
    row["cpu"] = meta["machine"]["cpu"]
    row["cpu_flags"] = " ".join(meta["machine"].get("cpu_flags", []))
    row["versions"] = " ".join(f"{k}={v}" for k, v in meta["versions"].items() if v)
    return row


def write_csv(path: str | Path, meta: dict[str, Any], cells: list[dict[str, Any]]) -> None:
    rows = [flat_row(c, meta) for c in cells]
    with open(path, "w", newline="", encoding="utf-8") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def target_summary(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(t, backend=c["backend"]) for c in cells for t in c["targets"]]


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def write_markdown(path: str | Path, meta: dict[str, Any], cells: list[dict[str, Any]]) -> None:
    """The cells as a Markdown table of ratios (what docs/benchmarks.md quotes)."""
    other = "CPU" if meta["clock"] == "wall" else "wall"
    flags = ", ".join(meta["machine"].get("cpu_flags", [])) or "no SIMD flags read"
    lines = [
        f"`{meta['command']}` on {meta['machine']['cpu']} ({flags}), {meta['threads']} "
        f"thread(s), torch {meta['versions']['torch']}, {meta['timestamp']}; medians of "
        f"{meta['repetitions']} interleaved repetitions, {meta['clock']} clock.",
        "",
        "| backend | dtype | B,K,V | variant | ours ms | spread ms | x faster than dense "
        "| x floor | x argmax | x faster than HF | x faster than vLLM v0 typical "
        "| validation cost | full validation cost | x rejection (same inputs) "
        "| acceptance per position | targets "
        f"| {other} clock: x dense, x floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        t, r, o = c["times_ms"], c["ratios"], c["other_clock_times_ms"]
        marks = "; ".join(f"{'met' if x['met'] else '**missed**'} ({x['op']}{x['threshold']:g})"
                          for x in c["targets"]) or "-"
        spread = c.get("spread_ms", {})
        lines.append(
            f"| {c['device']}/{c['backend']} | {c['dtype']} | {c['B']},{c['K']},{c['V']} "
            f"| {c['variant']} | {_fmt(t['verify'], '.3f')} "
            f"| {_fmt(spread.get('min'), '.3f')}-{_fmt(spread.get('max'), '.3f')} "
            f"| {_fmt(r['speedup_vs_dense'], '.1f')} | {_fmt(r['x_floor'], '.2f')} "
            f"| {_fmt(r.get('x_argmax'), '.2f')} | {_fmt(r['speedup_vs_hf'], '.2f')} "
            f"| {_fmt(r.get('speedup_vs_vllm_typical'), '.2f')} "
            f"| {_fmt(r['validation_overhead'], '.2f')} "
            f"| {_fmt(r.get('validation_full_overhead'), '.2f')} "
            f"| {_fmt(r.get('x_rejection'), '.2f')} | {_acceptance(c)} "
            f"| {marks} | {o['dense'] / o['verify']:.1f}, {o['verify'] / o['floor']:.2f} |"
        )
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _acceptance(cell: dict[str, Any]) -> str:
    """Block variants' per-position token-wise acceptance of their drafts ("-" otherwise)."""
    acc = cell.get("acceptance_per_position")
    return "/".join(f"{a:.2f}" for a in acc) if acc else "-"


def render_table(cells: list[dict[str, Any]], meta: dict[str, Any]) -> Any:
    """A rich Table of the cells (imported lazily: rich is an optional extra)."""
    from rich.table import Table

    title = (f"portable-verify bench: {meta['machine']['cpu']}, {meta['threads']} thread(s), "
             f"medians of {meta['repetitions']} interleaved repetitions "
             f"({meta['clock']} clock, ms per call)")
    table = Table(title=title, title_justify="left")
    for col in ("device/backend", "dtype", "B,K,V", "variant", "ours", "dense", "floor",
                "vs dense", "x floor", "x argmax", "vs HF", "vs vLLM typ", "valid.", "full v.",
                "x rej.", "accept/pos", "targets"):
        table.add_column(col, justify="right" if col not in ("variant", "targets") else "left")
    for c in cells:
        t, r = c["times_ms"], c["ratios"]
        marks = " ".join("[green]met[/]" if x["met"] else "[red]MISSED[/]" for x in c["targets"])
        table.add_row(
            f"{c['device']}/{c['backend']}", c["dtype"], f"{c['B']},{c['K']},{c['V']}",
            c["variant"], _fmt(t["verify"], ".3f"), _fmt(t["dense"], ".2f"),
            _fmt(t["floor"], ".3f"), _fmt(r["speedup_vs_dense"], ".1f") + "x",
            _fmt(r["x_floor"], ".2f"), _fmt(r.get("x_argmax"), ".2f"),
            _fmt(r["speedup_vs_hf"], ".1f"), _fmt(r.get("speedup_vs_vllm_typical"), ".2f"),
            _fmt(r["validation_overhead"], ".2f"), _fmt(r.get("validation_full_overhead"), ".2f"),
            _fmt(r.get("x_rejection"), ".2f"), _acceptance(c), marks,
        )
    return table


def plot(path: str | Path, cells: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Time per call against batch size: ours and dense per variant, and the floor (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({c["variant"] for c in cells})
    series = sorted({(c["device"], c["backend"], c["dtype"]) for c in cells})
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 4.2),
                             squeeze=False, sharey=True)
    for ax, variant in zip(axes[0], variants, strict=True):
        for device, backend, dtype in series:
            sel = sorted((c for c in cells if c["variant"] == variant and c["device"] == device
                          and c["backend"] == backend and c["dtype"] == dtype),
                         key=lambda c: (c["B"], c["V"]))
            if not sel:
                continue
            xs = [c["B"] for c in sel]
            tag = f"{device}/{backend} {dtype}"
            ax.plot(xs, [c["times_ms"]["verify"] for c in sel], "o-", label=f"ours {tag}")
            ax.plot(xs, [c["times_ms"]["dense"] for c in sel], "s--", label=f"dense {tag}")
            ax.plot(xs, [c["times_ms"]["floor"] for c in sel], ":", color="gray",
                    label=f"memory floor {tag}")
            for c in sel:
                ax.annotate(f"K={c['K']},V={c['V'] // 1000}k", (c["B"], c["times_ms"]["floor"]),
                            fontsize=6, color="gray", textcoords="offset points", xytext=(2, -8))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(variant)
        ax.set_xlabel("batch size B")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("ms per call (median)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"{meta['machine']['cpu']}, {meta['threads']} thread(s), medians of "
                 f"{meta['repetitions']} interleaved repetitions, {meta['clock']} clock",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
