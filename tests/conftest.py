"""Fixtures shared by the test files.

``available_backend`` is parametrized over every backend that runs here (canonical names), so a
new backend is tested by registering it, with nothing to edit in tests/; a broken backend, and
one that ``PORTABLE_VERIFY_REQUIRE_BACKENDS`` names but that does not run here, is parametrized
too, and each of its tests fails with the reason (:func:`backends_under_test`). What a backend
is like (reference, fast enough for statistical sizes...) comes from
``pv.get_backend(name).traits``: tests choose sizes and skips from those, never from a backend's
name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from helpers import perturbed, tiny_llama

import portable_verify as pv
from portable_verify import dispatch

# The suite tests the backends themselves: ``auto`` on the CPU must be numba:cpu from the first
# call, not the interim answer a cold kernel cache gets (tests/test_first_call.py tests that
# path in subprocesses of its own, with the variable removed).
os.environ.setdefault("PORTABLE_VERIFY_INTERIM", "0")


def backends_under_test() -> dict[str, str | None]:
    """Each backend the tests run on, with why its tests must fail (None: it runs): the
    available ones, the broken ones and the required ones (``_``-prefixed doubles hidden)."""
    required = dispatch.unmet_requirements()
    return {n: required.get(n) or (None if s.available else f"{s.status}: {s.reason}")
            for n, s in pv.backend_status().items()
            if n[0] != "_" and (s.available or s.broken or n in required)}


_UNDER_TEST: dict[str, str | None] = {}  # backends_under_test(), read once per session


def _under_test() -> dict[str, str | None]:
    if not _UNDER_TEST:
        _UNDER_TEST.update(backends_under_test())
    return _UNDER_TEST


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "available_backend" in metafunc.fixturenames:
        metafunc.parametrize("available_backend", list(_under_test()))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of a broken or required-but-missing backend fails here, naming why."""
    name = getattr(getattr(item, "callspec", None), "params", {}).get("available_backend")
    why = _under_test().get(name) if name is not None else None
    if why is not None:
        pytest.fail(f"backend {name!r} must run here but does not: {why}", pytrace=False)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small tensors: extra intra-op threads only oversubscribe CI's 2 cores.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)



@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny Llama target (random weights, vocabulary 64) and a perturbed copy as its draft:
    right often, not always (the e2e tests; they skip without transformers)."""
    pytest.importorskip("transformers")
    target = tiny_llama(0)
    return target, perturbed(target, 0.3, 1)
