"""``portable-verify info``: devices, backends with the reason for each, versions, and whether
the numba kernels are compiled yet (a server's first step pays the compile otherwise)."""

from __future__ import annotations

import argparse
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("info", help="show devices, backends, library versions and "
                              "whether the numba kernel cache is warm")
    add_json_option(p, "everything shown ('-' prints it instead of the tables)")
    checks.register(p, run, check)


def check(args: argparse.Namespace) -> None:
    checks.writable_file("--json", args.json, stdout_ok=True)


def collect() -> dict[str, Any]:
    """Everything ``info`` shows, as plain data."""
    import portable_verify as pv
    from portable_verify.bench import environment, numba_runtime
    from portable_verify.dispatch import select_backend

    status = pv.backend_status()
    return {
        "methods": method_matrix([n for n, s in status.items() if s.available]),
        "machine": environment.machine(),
        "devices": environment.devices(),
        "auto_backend": {"cpu": select_backend("auto", "cpu").qualified_name},
        "backends": {name: {"available": s.available, "status": s.status, "reason": s.reason}
                     for name, s in status.items()},
        "versions": environment.library_versions(),
        "numba": {"kernel_cache": numba_runtime.kernel_cache(),
                  "threading": numba_runtime.threading()},
    }


def method_matrix(backends: list[str]) -> dict[str, Any]:
    """Each method of the method table with its facts and, per available backend, the layouts
    it verifies with it (read from the table and the backends' traits, never written here)."""
    import portable_verify as pv
    from portable_verify.core import methods

    out: dict[str, Any] = {}
    for name in methods.names():
        m = methods.TABLE[name]
        served = {b: [lay for lay in m.layouts
                      if pv.get_backend(b).traits.implements(lay, m.rule)] for b in backends}
        out[name] = {"exact": m.exact, "layouts": list(m.layouts), "draft_probs": m.draft_probs,
                     "summary": m.summary, "backends": served}
    return out


def run(args: argparse.Namespace) -> int:
    data = collect()
    if args.json:
        write_json(args.json, data)
    if to_stdout(args):
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    m = data["machine"]
    console.print(f"[bold]machine[/]: {m['cpu']} ({m['cpu_count']} CPUs), {m['platform']}, "
                  f"Python {m['python']}")
    devices = Table(title="devices", title_justify="left")
    for col in ("device", "name", "available"):
        devices.add_column(col)
    for d in data["devices"]:
        devices.add_row(d["device"], d["name"] or "-", "yes" if d["available"] else "no")
    console.print(devices)
    backends = Table(title=f"backends (auto on cpu: {data['auto_backend']['cpu']})",
                     title_justify="left")
    for col in ("backend", "available", "reason"):
        backends.add_column(col)
    for name, s in data["backends"].items():
        ok = {"available": "[green]yes[/]", "broken": "[bold red]BROKEN[/]"}.get(
            s["status"], "[red]no[/]")
        backends.add_row(name, ok, s["reason"])
    console.print(backends)
    console.print(_method_table(data["methods"]))
    versions = Table(title="libraries", title_justify="left")
    versions.add_column("library")
    versions.add_column("version")
    for name, v in data["versions"].items():
        versions.add_row(name, v or "not installed")
    console.print(versions)
    _print_numba(console, data["numba"])
    return 0


def _method_table(matrix: dict[str, Any]) -> Any:
    """Available backends down, methods across (lossy ones marked); a cell names the layouts
    the backend verifies with the method: chain, tree, both or -."""
    from rich.table import Table

    table = Table(title="methods x backends (the layouts each verifies)", title_justify="left")
    backends = list(next(iter(matrix.values()))["backends"]) if matrix else []
    table.add_column("backend")
    for name, row in matrix.items():
        table.add_column(name if row["exact"] else f"{name} (lossy)")
    for b in backends:
        cells = []
        for row in matrix.values():
            served = row["backends"][b]
            cells.append("both" if len(served) == 2 else served[0] if served else "-")
        table.add_row(b, *cells)
    return table


def _print_numba(console: Any, numba: dict[str, Any]) -> None:
    cache, threads = numba["kernel_cache"], numba["threading"]
    colour = {"warm": "green", "partial": "yellow", "cold": "red"}.get(cache["state"], "red")
    where = ", ".join(cache.get("cache_dirs", [])) or "-"
    console.print(f"[bold]numba kernel cache[/]: [{colour}]{cache['state']}[/] "
                  f"({cache['detail']}; {where})")
    if cache["state"] in ("cold", "partial"):
        console.print("  the first call answers from torch:cpu while the missing kernels build "
                      "in the background; `portable-verify warm-up` builds them now")
    if threads.get("available"):
        env = ", ".join(f"{k}={v}" for k, v in threads["env"].items() if v is not None) or "none"
        console.print(f"[bold]numba threading[/]: layer {threads.get('layer') or '-'} "
                      f"(requested {threads['layer_requested']}), numba threads "
                      f"{threads.get('numba_threads', '-')} of {threads['numba_num_threads']}, "
                      f"torch threads {threads['torch_threads']}; environment: {env}")
