"""The cold-build profiler (``bench/numba_runtime.compile_profile``) on two small functions."""

from __future__ import annotations

import pytest

numba = pytest.importorskip("numba")

from portable_verify.bench.numba_runtime import compile_profile  # noqa: E402


def test_the_profile_names_each_compiled_function_and_counts_inlined_sites() -> None:
    """A caller with two call sites of an inlined helper and one of a compiled callee: both
    compiled functions appear with their own time, the helper's two sites are counted, and
    numba's library methods are restored afterwards (a second compile is not profiled)."""

    @numba.njit(inline="always")
    def helper(x):
        return x + 1

    @numba.njit
    def callee(x):
        return x * 2

    @numba.njit
    def caller(x):
        return helper(x) + helper(callee(x))

    before = numba.core.codegen.CPUCodeLibrary._optimize_final_module
    profile = compile_profile(lambda: caller(3))
    names = set(profile["functions"])
    assert any(n.endswith(".caller") for n in names) and any(n.endswith(".callee") for n in names)
    assert not any(n.endswith(".helper") for n in names)  # inlined: never compiled alone
    assert profile["inline_sites"] == {"helper": 2}
    assert profile["stages"]["llvm_final_module"] > 0 and profile["cpu_s"] > 0
    assert numba.core.codegen.CPUCodeLibrary._optimize_final_module is before
