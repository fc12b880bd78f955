"""Result output: the rich table, JSON and CSV files, and the time-versus-batch (or, for a
thread sweep, time-versus-threads) plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

TIME_KEYS = ("verify", "dense", "floor", "argmax", "amax", "hf", "vllm_v0_typical",
             "verify_validated", "verify_validated_full", "rejection_same_inputs")
RATIO_KEYS = ("speedup_vs_dense", "x_floor", "x_argmax", "speedup_vs_argmax", "speedup_vs_hf",
              "speedup_vs_vllm_typical", "validation_overhead", "validation_full_overhead",
              "x_rejection", "x_amax", "thread_speedup", "amax_thread_speedup",
              "thread_scaling_vs_amax", "speedup_vs_torch_backend")


def write_json(path: str | Path, meta: dict[str, Any], cells: list[dict[str, Any]]) -> None:
    data = {"meta": meta, "cells": cells, "targets": target_summary(cells)}
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def flat_row(cell: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: identifying columns, times, ratios, targets, and the run's context."""
    row = {k: cell[k] for k in ("device", "backend", "dtype", "B", "K", "V", "variant",
                                "temperature", "floor_impl", "floor_bytes", "floor_GBps")}
    row.update({f"{k}_ms": cell["times_ms"].get(k) for k in TIME_KEYS})
    row.update({k: cell["ratios"].get(k) for k in RATIO_KEYS})
    if "graph" in cell["times_ms"]:  # a CUDA run: device time by graph replay
        row["graph_ms"] = cell["times_ms"]["graph"]
        row["graph_x_floor"] = cell["ratios"]["graph_x_floor"]
    row["targets"] = "; ".join(f"{t['target']}: {'met' if t['met'] else 'MISSED'}"
                               for t in cell["targets"])
    row["threads"] = cell.get("threads", meta["threads"])
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
        "| backend | threads | dtype | B,K,V | variant | ours ms | spread ms "
        "| x faster than dense "
        "| x floor | x argmax | x faster than HF | x faster than vLLM v0 typical "
        "| validation cost | full validation cost | x rejection (same inputs) "
        "| acceptance per position | targets "
        f"| {other} clock: x dense, x floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        t, r, o = c["times_ms"], c["ratios"], c["other_clock_times_ms"]
        marks = "; ".join(f"{'met' if x['met'] else '**missed**'} ({x['op']}{x['threshold']:g})"
                          for x in c["targets"]) or "-"
        spread = c.get("spread_ms", {})
        lines.append(
            f"| {c['device']}/{c['backend']} | {c.get('threads', meta['threads'])} "
            f"| {c['dtype']} | {c['B']},{c['K']},{c['V']} "
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
    if len(meta.get("thread_counts", [1])) > 1:
        lines += ["", *_sweep_markdown(cells, meta)]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _acceptance(cell: dict[str, Any]) -> str:
    """Block variants' per-position token-wise acceptance of their drafts ("-" otherwise)."""
    acc = cell.get("acceptance_per_position")
    return "/".join(f"{a:.2f}" for a in acc) if acc else "-"


def _sweep_markdown(cells: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The thread sweep: each cell's speed-up over the first count beside torch.amax's."""
    base = meta["thread_counts"][0]
    lines = [
        f"| backend | dtype | B,K,V | variant | threads | ours ms | x faster than at {base} "
        f"| torch.amax x faster than at {base} | our speed-up / amax's "
        "| x faster than the torch backend |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(cells, key=_sweep_order):
        r = c["ratios"]
        lines.append(
            f"| {c['device']}/{c['backend']} | {c['dtype']} | {c['B']},{c['K']},{c['V']} "
            f"| {c['variant']} | {c['threads']} | {_fmt(c['times_ms']['verify'], '.3f')} "
            f"| {_fmt(r.get('thread_speedup'), '.2f')} "
            f"| {_fmt(r.get('amax_thread_speedup'), '.2f')} "
            f"| {_fmt(r.get('thread_scaling_vs_amax'), '.2f')} "
            f"| {_fmt(r.get('speedup_vs_torch_backend'), '.2f')} |")
    return lines


def _sweep_order(c: dict[str, Any]) -> tuple[Any, ...]:
    return (c["device"], c["backend"], c["dtype"], c["B"], c["K"], c["V"], c["variant"],
            c["threads"])


def render_table(cells: list[dict[str, Any]], meta: dict[str, Any]) -> Any:
    """A rich Table of the cells (imported lazily: rich is an optional extra); columns this run
    did not measure (only "-") are left out, so a sweep's columns fit."""
    from rich.table import Table

    title = (f"portable-verify bench: {meta['machine']['cpu']}, {meta['threads']} thread(s), "
             f"medians of {meta['repetitions']} interleaved repetitions "
             f"({meta['clock']} clock, ms per call)")
    sweep = len(meta.get("thread_counts", [1])) > 1
    columns = ["device/backend", "thr", "dtype", "B,K,V", "variant", "ours", "graph", "dense",
               "floor",
               "vs dense", "x floor", "x argmax", "vs HF", "vs vLLM typ", "valid.", "full v.",
               "x rej.", "accept/pos",
               *(("x 1st thr", "amax x 1st", "/ amax", "vs torch") if sweep else ()), "targets"]
    rows = []
    for c in sorted(cells, key=_sweep_order) if sweep else cells:
        t, r = c["times_ms"], c["ratios"]
        marks = " ".join("[green]met[/]" if x["met"] else "[red]MISSED[/]" for x in c["targets"])
        sweep_values = tuple(_fmt(r.get(key), ".2f") for key in (
            "thread_speedup", "amax_thread_speedup", "thread_scaling_vs_amax",
            "speedup_vs_torch_backend")) if sweep else ()
        rows.append((
            f"{c['device']}/{c['backend']}", str(c.get("threads", meta["threads"])), c["dtype"],
            f"{c['B']},{c['K']},{c['V']}",
            c["variant"], _fmt(t["verify"], ".3f"), _fmt(t.get("graph"), ".3f"),
            _fmt(t["dense"], ".2f"),
            _fmt(t["floor"], ".3f"), _fmt(r["speedup_vs_dense"], ".1f") + "x",
            _fmt(r["x_floor"], ".2f"), _fmt(r.get("x_argmax"), ".2f"),
            _fmt(r["speedup_vs_hf"], ".1f"), _fmt(r.get("speedup_vs_vllm_typical"), ".2f"),
            _fmt(r["validation_overhead"], ".2f"), _fmt(r.get("validation_full_overhead"), ".2f"),
            _fmt(r.get("x_rejection"), ".2f"), _acceptance(c), *sweep_values, marks or "-",
        ))
    keep = [i for i, col in enumerate(columns)
            if col in ("ours", "targets") or any(row[i] != "-" for row in rows)]
    table = Table(title=title, title_justify="left")
    for i in keep:
        table.add_column(columns[i], justify="left" if columns[i] in ("variant", "targets")
                         else "right")
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


COMPACT_COLUMNS = ("method", "input", "B,K,V", "ms/call", "x floor", "x dense", "verdict")
GRAPH_COLUMNS = ("method", "input", "B,K,V", "eager ms", "graph ms", "x floor", "x dense",
                 "verdict")
"""A CUDA run's compact table: eager wall per call and device time by graph replay side by
side; ``x floor`` there is the graph time over the copy-bandwidth floor (the device's own
bound), ``x dense`` eager over eager."""


def _series(cell: dict[str, Any], meta: dict[str, Any]) -> tuple[str, str, int]:
    return f"{cell['device']}/{cell['backend']}", cell["dtype"], cell.get("threads",
                                                                          meta["threads"])


def _cell_verdict(cell: dict[str, Any]) -> str:
    """"met", "MISSED n of m", or "-" where no target applies to the cell."""
    missed = sum(not t["met"] for t in cell["targets"])
    if not cell["targets"]:
        return "-"
    return f"MISSED {missed} of {len(cell['targets'])}" if missed else "met"


def compact_tables(cells: list[dict[str, Any]], meta: dict[str, Any]) -> list[Any]:
    """One narrow table per series (device/backend, dtype, threads): method, input kind,
    shape, time per call, x floor, x dense and the cell's verdict (fits 100 columns)."""
    from rich.table import Table

    series: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for c in cells:
        series.setdefault(_series(c, meta), []).append(c)
    tables = []
    for (backend, dtype, count), group in series.items():
        graph = any("graph" in c["times_ms"] for c in group)
        title = (_graph_title(backend, dtype, group[0], meta) if graph else
                 f"{backend}, {dtype}, {count} thread(s): medians of {meta['repetitions']} "
                 f"interleaved repetitions, {meta['clock']} clock ({meta['machine']['cpu']})")
        table = Table(title=title, title_justify="left")
        for col in GRAPH_COLUMNS if graph else COMPACT_COLUMNS:
            table.add_column(col, justify="left" if col in ("method", "input", "verdict")
                             else "right", no_wrap=True)
        for c in sorted(group, key=lambda c: (c["B"], c["K"], c["V"])):
            t, r = c["times_ms"], c["ratios"]
            verdict = _cell_verdict(c)
            times = ((_fmt(t["verify"], ".3f"), _fmt(t["graph"], ".3f"),
                      _fmt(r["graph_x_floor"], ".2f")) if graph else
                     (_fmt(t["verify"], ".3f"), _fmt(r["x_floor"], ".2f")))
            table.add_row(c["method"], c["inputs"], f"{c['B']},{c['K']},{c['V']}", *times,
                          _fmt(r["speedup_vs_dense"], ".1f"),
                          f"[red]{verdict}[/]" if verdict.startswith("MISSED") else verdict)
        tables.append(table)
    return tables


def _device_name(device: str, meta: dict[str, Any]) -> str:
    """The accelerator's name from the run's device list (``cuda`` is its first ``cuda:i``)."""
    for d in meta.get("device_names", []):
        if d["device"] == device or d["device"] == f"{device}:0":
            return d["name"] or device
    return device


def _graph_title(backend: str, dtype: str, cell: dict[str, Any], meta: dict[str, Any]) -> str:
    bandwidth = meta.get("copy_bandwidth_GBps", {}).get(cell["device"])
    floor = f"{bandwidth:.0f} GB/s copy bandwidth" if bandwidth else "the copy bandwidth"
    return (f"{backend}, {dtype} on {_device_name(cell['device'], meta)}: eager ms = wall per "
            f"call, a sync after each, median of {meta['repetitions']} interleaved "
            f"repetitions; graph ms = device time of one CUDA-graph replay, L2 flushed, median "
            f"of {meta.get('graph_reps', '?')} replays; x floor = graph ms over the bytes a "
            f"call must read at {floor}")


def target_groups(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Targets grouped by (target, backend): a target for every shape is one entry, met only
    where every shape met it, with the worst value."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for c in cells:
        for t in c["targets"]:
            g = groups.setdefault((t["target"], c["backend"]), {
                "target": t["target"], "backend": c["backend"], "op": t["op"],
                "threshold": t["threshold"], "values": [], "met": True})
            g["values"].append(t["value"])
            g["met"] = g["met"] and t["met"]
    for g in groups.values():
        g["worst"] = max(g["values"]) if g["op"] == "<=" else min(g["values"])
    return list(groups.values())


def target_lines(groups: list[dict[str, Any]]) -> list[str]:
    """One line per target (and backend, named first where the run timed several): verdict
    first, then the target and its figure (the worst over its shapes)."""
    several = len({g["backend"] for g in groups}) > 1
    lines = []
    for g in groups:
        n = len(g["values"])
        value = f"{g['worst']:.2f}" + (f" (worst, {n} shapes)" if n > 1 else "")
        backend = f"{g['backend']}: " if several else ""
        lines.append(f"{'met   ' if g['met'] else 'MISSED'} {backend}{g['target']}: {value}")
    return lines


def verdict_text(groups: list[dict[str, Any]], cells: list[dict[str, Any]],
                 meta: dict[str, Any]) -> str:
    """``14 of 15 targets met (numba:cpu, 1 thread)``: the run's one-line verdict."""
    backends = ", ".join(dict.fromkeys(c["backend"] for c in cells)) or "no backend"
    counts = meta.get("thread_counts", [1])
    where = f"{backends}, {counts[0]} thread" + ("s" if counts[0] != 1 else "")
    if cells and all(c.get("device", "cpu") != "cpu" for c in cells):  # threads mean nothing
        devices = ", ".join(dict.fromkeys(_device_name(c["device"], meta) for c in cells))
        where = f"{backends} on {devices}"
    if len(counts) > 1:
        where = f"{backends}, threads {','.join(map(str, counts))}"
    if not groups:
        return f"{len(cells)} cells timed, no target applies ({where})"
    met = sum(g["met"] for g in groups)
    return f"{met} of {len(groups)} targets met ({where})"


def plot(path: str | Path, cells: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Time per call against batch size: ours and dense per variant, and the floor (log-log);
    for a thread sweep, time per call against threads instead (:func:`plot_threads`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(meta.get("thread_counts", [1])) > 1:
        plot_threads(path, cells, meta)
        return
    cells = [c for c in cells if c.get("threads", 1) == meta.get("thread_counts", [1])[0]]

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


def plot_threads(path: str | Path, cells: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Time per call against threads, one panel per shape: every backend and variant, and
    ``torch.amax`` over the same target (dotted: how a memory-bound reduction scales)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(c["B"], c["K"], c["V"]) for c in cells})
    counts = meta["thread_counts"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.6 * len(shapes), 4.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        here = [c for c in cells if (c["B"], c["K"], c["V"]) == shape]
        for series in sorted({(c["device"], c["backend"], c["dtype"], c["variant"])
                              for c in here}):
            sel = sorted((c for c in here if (c["device"], c["backend"], c["dtype"],
                                              c["variant"]) == series),
                         key=lambda c: c["threads"])
            ax.plot([c["threads"] for c in sel], [c["times_ms"]["verify"] for c in sel], "o-",
                    label=f"{series[1]} {series[3]}" + ("" if series[2] == "float32"
                                                          else f" {series[2]}"))
        amax = sorted((c for c in here if c["variant"] == here[0]["variant"]
                       and c["backend"] == here[0]["backend"]), key=lambda c: c["threads"])
        ax.plot([c["threads"] for c in amax], [c["times_ms"]["amax"] for c in amax], "k:",
                label="torch.amax (same target)")
        ax.set_xticks(counts)
        ax.set_yscale("log")
        ax.set_title(f"B={shape[0]}, K={shape[1]}, V={shape[2]}", fontsize=9)
        ax.set_xlabel("threads")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("ms per call (median)")
    fig.suptitle(f"{meta['machine']['cpu']}, threads {counts} interleaved, medians of "
                 f"{meta['repetitions']} repetitions, {meta['clock']} clock", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
