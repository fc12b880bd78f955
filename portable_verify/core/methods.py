"""The method table: every verification method and its facts, in one place every layer reads.

Why one table: a method's facts (which layouts it serves, which rule its sampled rows take,
whether it reads ``draft_probs``, what options it has) used to be written in several layers,
each ending in "else rejection". A missed place then ran another rule silently. Now the doors,
dispatch's capability filter, the backends' switches (:func:`unknown_rule`), the kit, the bench,
the CLI and ``portable-verify info`` all read these rows, and a method a backend lacks is refused
by name (docs/architecture.md, "Where each change goes").

Greedy rows (temperature 0) take the greedy rule under every method: it is the target's own
argmax, so no method changes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CHAIN = "chain"
"""The chain layouts: ``verify``, ``verify_ragged``, ``verify_rows``."""
TREE = "tree"
"""Token trees: ``verify_tree``."""
LAYOUTS: tuple[str, ...] = (CHAIN, TREE)

DOORS = {CHAIN: "pv.verify", TREE: "pv.verify_tree"}


@dataclass(frozen=True)
class Method:
    """One row of the table.

    ``rule``: the rule a backend runs for the sampled rows (``None``: every row is greedy);
    ``auto`` names the rule it stands for. ``draft_probs``: ``"uses"`` (read when given, else
    every draft is a point mass), ``"ignores"`` (never read). ``options``: the name of its
    options field in :class:`~portable_verify.core.types.VerifyOptions`, or ``None``.
    ``instead``: per layout it does not serve, the method that does the same job there.
    ``rows``: which rows its decision reads, ``"prefix"`` (those up to the first rejection)
    or ``"data"`` (a set that depends on the uniforms: the default validation level checks
    every row of such a call, as ``validate="full"`` does).
    """

    name: str
    rule: str | None
    exact: bool
    layouts: tuple[str, ...]
    draft_probs: Literal["uses", "ignores"]
    options: str | None
    summary: str
    instead: tuple[tuple[str, str], ...] = ()
    rows: Literal["prefix", "data"] = "prefix"

    def serves(self, layout: str) -> bool:
        return layout in self.layouts


TABLE: dict[str, Method] = {}


def _add(method: Method) -> Method:
    TABLE[method.name] = method
    return method


_add(Method("auto", "rejection", True, (CHAIN, TREE), "uses", None,
            "the default: rejection sampling for sampled rows"))
_add(Method("greedy", None, True, (CHAIN, TREE), "ignores", None,
            "every row greedy: the longest prefix equal to the target's argmax"))
_add(Method("rejection", "rejection", True, (CHAIN, TREE), "uses", None,
            "rejection sampling (Leviathan et al.; SpecInfer's token-level rule on trees)"))
_add(Method("typical", "typical", False, (CHAIN, TREE), "ignores", "typical",
            "typical acceptance (Medusa): lossy by design, opt-in"))
_add(Method("block", "block", True, (CHAIN,), "uses", None,
            "block verification (Sun et al.): the chain judged at once",
            instead=((TREE, "traversal"),), rows="data"))
_add(Method("traversal", "traversal", True, (TREE,), "uses", None,
            "traversal verification (Weng et al.): the tree judged from the leaves up",
            instead=((CHAIN, "block"),), rows="data"))


def names(layout: str | None = None) -> tuple[str, ...]:
    """Every method's name (those serving ``layout`` when given), in table order."""
    return tuple(m.name for m in TABLE.values() if layout is None or m.serves(layout))


def distinct(layout: str | None = None) -> tuple[str, ...]:
    """Each method once: :func:`names` less those that only stand for another's rule
    (``auto``), what a list of methods to run or to test covers."""
    return tuple(m.name for m in TABLE.values()
                 if (layout is None or m.serves(layout)) and m.rule in (None, m.name))


def sampled(layout: str | None = None) -> tuple[str, ...]:
    """The rules of sampled rows (:func:`distinct` less ``greedy``)."""
    return tuple(m for m in distinct(layout) if TABLE[m].rule is not None)


def greedy_only(name: str) -> bool:
    """Whether method ``name`` takes every row greedy (its table row has no sampled rule)."""
    method = TABLE.get(name)
    return method is not None and method.rule is None


def reads_draft_probs(rule: str | None) -> bool:
    """Whether rows of ``rule`` (a rule is named by its own method's row) read
    ``draft_probs``: a backend that routes by it gives a rule that ignores them none."""
    method = TABLE.get(rule)  # type: ignore[arg-type]
    return method is not None and method.draft_probs == "uses"


def reads_rows_by_data(rule: str | None) -> bool:
    """Whether the rows ``rule``'s decision reads depend on the data (``Method.rows``)."""
    method = TABLE.get(rule)  # type: ignore[arg-type]
    return method is not None and method.rows == "data"


def lookup(name: object, layout: str) -> Method:
    """The row of ``name`` for a call of ``layout``; a clear ``ValueError`` otherwise (an
    unknown name, or a method that does not serve the layout, with the one that does)."""
    method = TABLE.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"method must be one of {names(layout)}, got {name!r}")
    if not method.serves(layout):
        other = dict(method.instead).get(layout)
        hint = f"; for {layout}s use method={other!r}" if other else ""
        raise ValueError(f"method={name!r} does not verify {layout}s ({DOORS[layout]} takes "
                         f"{names(layout)}){hint}")
    return method


def unknown_rule(rule: object, backend: str, layout: str) -> NotImplementedError:
    """The error every backend's method switch ends in: never another method's rule."""
    return NotImplementedError(f"backend {backend!r} does not implement the {layout} rule "
                               f"{rule!r}")


def register(method: Method) -> None:
    """Add a row (tests: a method no backend implements must be refused everywhere).

    Not a public extension point: a method needs a rule in every backend that claims it and
    conformance checks of its own (docs/decisions.md, "The method table").
    """
    if method.name in TABLE:
        raise ValueError(f"method {method.name!r} is already in the table")
    _add(method)


def unregister(name: str) -> None:
    """Remove a row that :func:`register` added (built-in methods stay)."""
    if name in _BUILT_IN:
        raise ValueError(f"method {name!r} is built in")
    TABLE.pop(name, None)


_BUILT_IN = frozenset(TABLE)
