"""The package's layering, read from its own imports (docs/architecture.md).

Every import of a ``portable_verify`` module, at module level or inside a function, is an edge.
The edges must only look down the layers, backends must not import one another, and the graph
must have no cycle: an import placed inside a function to dodge a loop would still close one
here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import portable_verify

ROOT = Path(portable_verify.__file__).parent
PACKAGE = "portable_verify"

LAYERS: dict[str, int] = {
    "core": 0,
    "backends": 1,
    "dispatch": 2,
    "api": 3,
    "": 4,  # the package itself: the public names
    "warmup": 4,  # portable_verify.warm_up, a public name, over the front doors
    "integrations": 5,
    "testing": 5,
    "bench": 5,
    "e2e": 5,
    "cli": 6,
}

BACKEND_FAMILIES = ("numpy", "torch", "numba", "triton", "openvino")
"""The backend families today: one package each under ``backends/``; a family's modules may
import each other and ``backends.base``, never another family's (any package under
``backends/`` is a family: a new one needs no edit here)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """The package modules ``name`` imports, wherever the import statement stands."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")} - {name}


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return LAYERS[top]


def test_every_subpackage_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)  # KeyError names a subpackage missing from LAYERS (and the doc)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_look_down(module: str) -> None:
    upward = [m for m in GRAPH[module] if _layer(m) > _layer(module)]
    assert not upward, f"{module} (layer {_layer(module)}) imports upward: {upward}"


def test_every_backend_module_lives_in_a_family() -> None:
    """``backends/`` holds the protocol and the family packages, nothing else."""
    loose = [m for m in MODULES if m.startswith(f"{PACKAGE}.backends.")
             and len(m.split(".")) == 3 and m.split(".")[2] not in (*BACKEND_FAMILIES, "base")]
    assert not loose, f"backend modules outside a family package: {loose}"


def test_backends_do_not_import_one_another() -> None:
    def family(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 else None

    for module, imported in GRAPH.items():
        if not module.startswith(f"{PACKAGE}.backends.") or family(module) is None:
            continue
        for other in imported:
            if other.startswith(f"{PACKAGE}.backends."):
                assert family(other) in (family(module), None), f"{module} imports {other}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == PACKAGE:
                continue  # `import portable_verify` from above is checked by the layer test
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if state.get(nxt) is None and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if state.get(module) is None and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_finds_the_loop_this_layout_removed() -> None:
    """Negative control: the old front door imported dispatch inside a function, and dispatch
    reached it back through a backend; the checker must see that loop and the upward edge."""
    old = {
        f"{PACKAGE}.core.api": {f"{PACKAGE}.dispatch"},  # the function-local import
        f"{PACKAGE}.dispatch": {f"{PACKAGE}.backends.torch.backend"},
        f"{PACKAGE}.backends.torch.backend": {f"{PACKAGE}.core.api"},
    }
    assert find_cycle(old) is not None
    assert _layer(f"{PACKAGE}.dispatch") > _layer(f"{PACKAGE}.core.api")
    tree = ast.parse("def f():\n    from portable_verify import dispatch\n")
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))  # function bodies are read


USERS = ("integrations", "bench", "e2e", "cli")
"""Layers that use the library as its users do: through the public names (``portable_verify``,
``core/``, ``dispatch``), never the front doors' or backends' modules themselves."""


def private_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges from a user layer into ``api/`` or ``backends/``."""
    found = []
    for module, imported in graph.items():
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in USERS:
            continue
        found += [(module, m) for m in sorted(imported)
                  if m.split(".")[1:2] in (["api"], ["backends"])]
    return found


def test_users_import_only_public_names() -> None:
    assert private_imports(GRAPH) == []


def test_the_public_names_rule_sees_an_adapter_reaching_into_the_tail() -> None:
    """Negative control: the vLLM adapter of the previous release built ``api.call`` values."""
    old = {f"{PACKAGE}.integrations.vllm_v1.sampler": {f"{PACKAGE}.api.call"}}
    assert private_imports(old) == [(f"{PACKAGE}.integrations.vllm_v1.sampler",
                                     f"{PACKAGE}.api.call")]
