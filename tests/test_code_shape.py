"""The code's shape, read from the source with :mod:`ast` (nothing is imported or compiled).

Three rules, each checked per area of the package so that a failure names where it lies:

(a) **No kernel takes more than 14 parameters.** A kernel is
    - a function decorated with a ``jit`` or ``njit`` decorator, bare or called and under any
      prefix (``@numba.njit(...)``, ``@njit``, ``@numba.jit``, ``@triton.jit``): numba and
      Triton kernels and the ``@njit`` helpers they call;
    - a function decorated with one of this package's jit wrappers, recognised by name: a
      function anywhere in the package whose body calls ``jit`` or ``njit`` (the Triton
      family's ``_kernel`` / ``_device``, which pick ``triton.jit`` or the interpreter);
    - any function in an OpenVINO graph module, ``portable_verify/backends/openvino/*_graphs.py``:
      those modules hold only graph-building code (each function there adds nodes to a graph or
      assembles a model), so every function in them counts, nested ones included.
    Every declared parameter counts: positional, keyword-only, ``*args`` and ``**kwargs`` (one
    each); Triton's ``tl.constexpr`` parameters too. Why: per-call scalars and options reach a
    kernel as one record or grouped arguments, built in one place; a long positional list is
    where a new option silently lands in the wrong slot.

(b) **No function over 80 lines of code** in ``portable_verify/api/``,
    ``portable_verify/backends/`` and ``portable_verify/dispatch.py``. A line of code is a
    line of the function (its ``def`` line to its last line, decorators excluded) that holds a
    token other than a comment, and is not part of a docstring (of the function or of a
    function or class nested in it). A nested function's lines count in the function holding
    it as well as in its own count.

(c) **No import of a private name between modules of different packages.** A private name
    starts with ``_`` and is not a dunder. For ``from X import _n`` (``X`` a module of this
    project, relative imports resolved) and ``import X._n``, the importing module's package
    (its folder) must be the package ``X`` lies in (``X`` itself when ``X`` is a package).
    Why: a family's private helpers stay inside its package; what crosses a package boundary
    is public and named so.

Each rule has a negative control: a small synthetic source that must be flagged (and a
compliant twin that must not), so a rule that flags nothing cannot pass unnoticed.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "portable_verify"

MAX_KERNEL_PARAMETERS = 14
MAX_FUNCTION_LINES = 80
KERNEL_DECORATORS = ("jit", "njit")
GRAPH_MODULES = "backends/openvino/*_graphs.py"

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _areas() -> dict[str, list[Path]]:
    """The package's files by area: each backend family, ``api``, ``dispatch.py``, the rest."""
    areas: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts[0] == "backends" and len(parts) > 2:
            area = f"backends/{parts[1]}"
        elif len(parts) > 1:
            area = parts[0]
        else:
            area = parts[0]
        areas.setdefault(area, []).append(path)
    return areas


AREAS = _areas()
LENGTH_AREAS = sorted(a for a in AREAS if a.startswith(("api", "backends")) or a == "dispatch.py")


def _functions(tree: ast.AST) -> list[FunctionNode]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _decorator_name(decorator: ast.expr) -> str:
    """The last name of a decorator (``numba.njit(cache=True)`` -> ``njit``)."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _parameter_count(fn: FunctionNode) -> int:
    a = fn.args
    return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
            + (a.kwarg is not None))


def jit_wrappers(source: str) -> set[str]:
    """Names of the functions in ``source`` whose body calls ``jit`` or ``njit``."""
    return {fn.name for fn in _functions(ast.parse(source))
            if any(isinstance(n, ast.Call) and _decorator_name(n) in KERNEL_DECORATORS
                   for n in ast.walk(fn))}


def kernel_violations(source: str, graph_module: bool, wrappers: frozenset[str] = frozenset()
                      ) -> list[tuple[str, int]]:
    """``(function, parameters)`` of each kernel over the limit in ``source`` (rule (a));
    ``wrappers``: the package's jit wrappers (this source's own are added)."""
    decorators = set(KERNEL_DECORATORS) | wrappers | jit_wrappers(source)
    found = []
    for fn in _functions(ast.parse(source)):
        kernel = graph_module or any(_decorator_name(d) in decorators
                                     for d in fn.decorator_list)
        if kernel and _parameter_count(fn) > MAX_KERNEL_PARAMETERS:
            found.append((fn.name, _parameter_count(fn)))
    return found


def _code_lines(source: str) -> set[int]:
    """Lines holding a token other than a comment, docstrings left out."""
    lines: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                lines.difference_update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def length_violations(source: str) -> list[tuple[str, int]]:
    """``(function, lines of code)`` of each function over the limit in ``source`` (rule (b))."""
    code = _code_lines(source)
    found = []
    for fn in _functions(ast.parse(source)):
        count = len(code & set(range(fn.lineno, fn.end_lineno + 1)))
        if count > MAX_FUNCTION_LINES:
            found.append((fn.name, count))
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(module: str) -> bool:
    return (ROOT / Path(*module.split(".")) / "__init__.py").exists()


def _package_of(module: str) -> str:
    """The package a module lies in (a package lies in itself)."""
    return module if _is_package(module) else module.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_import_violations(source: str, module: str, is_package: bool = False
                              ) -> list[tuple[str, str]]:
    """``(source module, name)`` of each private name ``module`` imports from a module of
    another package (rule (c)); ``is_package``: ``module`` is a package's ``__init__``."""
    here = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[str, str]] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            pairs = [(base, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                head, _, last = alias.name.rpartition(".")
                pairs.append((head, last))
        for origin, name in pairs:
            if not origin.startswith("portable_verify") or not _private(name):
                continue
            if _package_of(origin) != here:
                found.append((origin, name))
    return found


@functools.cache
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@functools.cache
def _package_wrappers() -> frozenset[str]:
    """The jit wrappers defined anywhere in the package (rule (a))."""
    return frozenset().union(*(jit_wrappers(_read(p)) for p in PACKAGE.rglob("*.py")))


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("area", sorted(AREAS))
def test_no_kernel_over_14_parameters(area: str) -> None:
    found = [f"{_where(p)}:{name}:{count}" for p in AREAS[area]
             for name, count in kernel_violations(_read(p), p.match(GRAPH_MODULES),
                                                  _package_wrappers())]
    assert not found, f"kernels with more than {MAX_KERNEL_PARAMETERS} parameters: {found}"


@pytest.mark.parametrize("area", LENGTH_AREAS)
def test_no_function_over_80_lines(area: str) -> None:
    found = [f"{_where(p)}:{name}:{count}" for p in AREAS[area]
             for name, count in length_violations(_read(p))]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines of code: {found}"


@pytest.mark.parametrize("area", sorted(AREAS))
def test_no_private_import_across_packages(area: str) -> None:
    found = [f"{_where(p)}:{origin}.{name}" for p in AREAS[area]
             for origin, name in private_import_violations(
                 _read(p), _module_name(p), p.name == "__init__.py")]
    assert not found, f"private names imported from another package: {found}"


def test_the_rules_see_the_whole_package() -> None:
    """The areas cover every family and the three length areas exist (a renamed folder must
    not leave a rule checking nothing)."""
    families = {p.name for p in (PACKAGE / "backends").iterdir()
                if (p / "__init__.py").exists()}
    assert {f"backends/{f}" for f in families} <= set(AREAS)
    assert {"api", "dispatch.py", "backends/numba", "backends/openvino"} <= set(LENGTH_AREAS)
    graphs = [p for p in AREAS["backends/openvino"] if p.match(GRAPH_MODULES)]
    assert len(graphs) >= 3, graphs


def _params(n: int) -> str:
    return ", ".join(f"a{i}" for i in range(n))


@pytest.mark.parametrize("decorator", ["@numba.njit(cache=True)", "@njit", "@numba.jit",
                                       "@triton.jit", "@njit(**JIT)"])
def test_negative_control_kernel_parameters(decorator: str) -> None:
    over = f"{decorator}\ndef k({_params(15)}):\n    return a0\n"
    at_limit = f"{decorator}\ndef k({_params(14)}):\n    return a0\n"
    assert kernel_violations(over, graph_module=False) == [("k", 15)]
    assert kernel_violations(at_limit, graph_module=False) == []
    nested = f"def outer():\n    {decorator}\n    def k(*a, {_params(13)}, **kw):\n        pass\n"
    assert kernel_violations(nested, graph_module=False) == [("k", 15)]


def test_negative_control_jit_wrappers() -> None:
    wrapper = "def _kernel(fn):\n    return InterpretedFunction(fn) if X else triton.jit(fn)\n"
    kernel = f"@_kernel\ndef k({_params(15)}):\n    pass\n"
    assert kernel_violations(wrapper + kernel, graph_module=False) == [("k", 15)]
    # defined in one module, aliased and used in another (the Triton tree module's way)
    assert kernel_violations(kernel, graph_module=False) == []
    assert kernel_violations(kernel, False, frozenset(jit_wrappers(wrapper))) == [("k", 15)]
    assert "_kernel" in jit_wrappers(_read(PACKAGE / "backends" / "triton" / "chain.py"))


def test_negative_control_graph_functions() -> None:
    source = f"def build({_params(15)}):\n    return a0\n"
    assert kernel_violations(source, graph_module=True) == [("build", 15)]
    assert kernel_violations(source, graph_module=False) == []  # undecorated elsewhere
    assert Path("portable_verify/backends/openvino/tree_graphs.py").match(GRAPH_MODULES)
    assert not Path("portable_verify/backends/openvino/tree.py").match(GRAPH_MODULES)


def test_negative_control_function_length() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(81))
    long = f"def f():\n    '''A docstring.\n\n    Two lines.'''\n{body}"
    assert length_violations(long) == [("f", 82)]  # the def line and 81 statements
    padded = ("def g():\n    '''A docstring\n" + "    more\n" * 40 + "    '''\n"
              + "    # a comment\n\n" * 40 + "".join(f"    y{i} = {i}\n" for i in range(79)))
    assert length_violations(padded) == []  # 80 lines of code: at the limit
    continued = "def h(\n    a,\n):\n" + "    z = (\n        1\n    )\n" * 26
    assert length_violations(continued) == [("h", 81)]  # continuation lines count


def test_negative_control_private_imports() -> None:
    module = "portable_verify.backends.numba.tree"
    same = "from portable_verify.backends.numba.chain import _x\nfrom .host import _y\n"
    assert private_import_violations(same, module) == []
    across = ("from portable_verify.core.tree import _walk\n"
              "from ..torch.ops import _clip\n"
              "import portable_verify.core._hidden\n"
              "from portable_verify.backends.numba.chain import __all__, public\n")
    assert private_import_violations(across, module) == [
        ("portable_verify.core.tree", "_walk"), ("portable_verify.backends.torch.ops", "_clip"),
        ("portable_verify.core", "_hidden")]
    assert private_import_violations("from portable_verify.core.types import _T\n",
                                     "portable_verify.api.call") == [
        ("portable_verify.core.types", "_T")]
    # a package's __init__ lies in its own package; third-party privates are not this rule's
    assert private_import_violations("from .chain import _x\n",
                                     "portable_verify.backends.numba", is_package=True) == []
    assert private_import_violations("from numba.core import _helpers\n", module) == []
