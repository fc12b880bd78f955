"""Fixtures shared by the test files.

``available_backend`` is parametrized over every backend that runs here (canonical names), so a
new backend is tested by registering it, with nothing to edit in tests/. What a backend is like
(reference, fast enough for statistical sizes...) comes from ``pv.get_backend(name).traits``:
tests choose sizes and skips from those, never from a backend's name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from helpers import perturbed, tiny_llama

import portable_verify as pv

# The suite tests the backends themselves: ``auto`` on the CPU must be numba:cpu from the first
# call, not the interim answer a cold kernel cache gets (tests/test_first_call.py tests that
# path in subprocesses of its own, with the variable removed).
os.environ.setdefault("PORTABLE_VERIFY_INTERIM", "0")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "available_backend" in metafunc.fixturenames:
        metafunc.parametrize("available_backend", pv.available_backends())


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
