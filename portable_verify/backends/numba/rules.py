"""The numba family's rule table: each rule it implements and the code its kernels switch on.

Why one table, without numba: the rules the family declares (readiness' traits, read by
dispatch before numba is imported), the code the host puts in the options record and the
branches of the entry kernels (``entries.decide``, ``entries.walk``) are this one table. A name
missing here is refused on the host (``methods.unknown_rule``); a code the kernels have no
branch for makes them return :data:`ERROR_RULE`, which the host words the same way, so no
switch can fall into another rule.

The codes are compiled into the cached kernels, and numba's cache does not see a change to
this file: a new rule appends a code and comes with its branch in ``entries.py`` (which the
cache does see); an existing code never changes.
"""

from __future__ import annotations

GREEDY = 0
"""Every row greedy: no sampled rule is read."""
REJECTION = 1
TYPICAL = 2
BLOCK = 3
TRAVERSAL = 4

CHAIN: dict[str, int] = {"rejection": REJECTION, "typical": TYPICAL, "block": BLOCK}
"""The sampled chain rules ``entries.decide`` implements."""
TREE: dict[str, int] = {"rejection": REJECTION, "typical": TYPICAL, "traversal": TRAVERSAL}
"""The sampled tree rules ``entries.walk`` implements."""

ERROR_RULE = 2
"""An entry kernel's flag for a rule code it has no branch for (``chain.ERROR_VALUE`` is 1)."""


def code(table: dict[str, int], rule: str | None, all_greedy: bool) -> int | None:
    """The code of ``rule`` in ``table``; :data:`GREEDY` when every row is greedy and the rule
    is not there (its rule is never read); None: the family does not implement it."""
    return table.get(rule, GREEDY if all_greedy else None)  # type: ignore[arg-type]
