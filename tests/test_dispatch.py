"""The dispatch layer: registry, names and aliases, availability reasons, auto selection and the
env override."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch
from portable_verify.backends.base import Availability, Backend, BackendTraits

LOGITS = torch.tensor([[[0.0, 5.0, 1.0], [9.0, 0.0, 0.0], [0.0, 0.0, 3.0]]])


def test_auto_on_cpu_takes_the_compiled_backend_when_numba_is_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dispatch.ENV_BACKEND, raising=False)
    want = "numba:cpu" if importlib.util.find_spec("numba") else "torch:cpu"
    assert dispatch.select_backend("auto", "cpu").qualified_name == want


def test_backends_are_named_by_implementation_and_device() -> None:
    names = pv.available_backends()
    assert "torch:cpu" in names and "numpy" in names
    assert all(":" in n for n in names if n != "numpy"), names
    assert set(pv.backend_status()) >= {"torch:cuda", "torch:xpu", "triton:cuda", "triton:xpu",
                                        "triton:interpreter", "openvino:CPU", "openvino:GPU"}


@pytest.mark.parametrize(("alias", "canonical"), [
    ("cpu", "torch:cpu"), ("torch", "torch:cpu"), ("triton", "triton:interpreter"),
    ("openvino", "openvino:CPU"), ("auto", "numba:cpu"), ("numba", "numba:cpu"),
])
def test_old_and_bare_names_resolve_for_cpu_inputs(
    alias: str, canonical: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(dispatch.ENV_BACKEND, raising=False)
    if canonical not in pv.available_backends():
        pytest.skip(f"{canonical} does not run here")
    assert dispatch.select_backend(alias, "cpu").qualified_name == canonical
    got = pv.verify(torch.tensor([[1, 2]]), target_logits=LOGITS, seed=1, backend=alias)
    want = pv.verify(torch.tensor([[1, 2]]), target_logits=LOGITS, seed=1, backend="numpy")
    assert torch.equal(got.token_ids, want.token_ids)


def test_every_backend_reports_a_reason() -> None:
    for name, status in pv.backend_status().items():
        assert isinstance(status.available, bool), name
        assert status.reason, f"{name} gives no reason"


def test_traits_describe_the_reference_and_slow_backends() -> None:
    assert pv.get_backend("numpy").traits.is_reference
    assert not pv.get_backend("torch:cpu").traits.is_reference
    assert pv.get_backend("torch:cpu").traits.statistical_sizes
    if "triton:interpreter" in pv.available_backends():
        assert not pv.get_backend("triton:interpreter").traits.statistical_sizes


def test_env_override_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.ENV_BACKEND, "numpy")
    assert dispatch.select_backend("auto", "cpu").name == "numpy"
    calls = []

    class Spy(pv.get_backend("numpy").__class__):
        name = "_spy"

        def run(self, inputs):  # type: ignore[no-untyped-def]
            calls.append(inputs.batch_size)
            return super().run(inputs)

    pv.register_backend("_spy", lambda device: Spy(device))
    try:
        monkeypatch.setenv(dispatch.ENV_BACKEND, "_spy")
        pv.verify(torch.tensor([[0]]), target_logits=torch.zeros(1, 2, 3), method="greedy")
    finally:
        pv.unregister_backend("_spy")
    assert calls == [1]
    assert "_spy" not in pv.backend_status()


def test_unknown_backend_and_device_are_named() -> None:
    with pytest.raises(ValueError, match="'no-such'"):
        pv.get_backend("no-such")
    with pytest.raises(ValueError, match="'tpu'"):
        pv.get_backend("torch:tpu")


@pytest.mark.parametrize("bad", [None, 3, ["cpu"]])
def test_backend_argument_must_be_a_name(bad: object) -> None:
    with pytest.raises(TypeError, match="backend"):
        pv.verify(torch.tensor([[1, 2]]), target_logits=LOGITS, backend=bad)  # type: ignore


def test_inputs_on_another_device_than_the_backend_are_refused(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend for CUDA tensors given CPU tensors says so, naming both devices."""

    class PretendCuda(Backend):
        name = "_cudaonly"
        description = "test double"
        traits = BackendTraits(chain_rules=("rejection",))

        def torch_device_type(self) -> str:
            return "cuda"

        def availability(self) -> Availability:
            return Availability(True, "pretend")

        def run(self, inputs):  # type: ignore[no-untyped-def]
            raise AssertionError("must not run")

    pv.register_backend("_cudaonly", PretendCuda)
    try:
        with pytest.raises(ValueError, match="cuda tensors; the inputs are on cpu"):
            pv.verify(torch.tensor([[1, 2]]), target_logits=LOGITS, backend="_cudaonly")
    finally:
        pv.unregister_backend("_cudaonly")


def test_unavailable_backend_says_why_and_lists_available() -> None:
    class Never(pv.get_backend("numpy").__class__):
        name = "never"

        def availability(self) -> Availability:
            return Availability(False, "needs hardware this machine lacks")

    pv.register_backend("never", lambda device: Never())
    try:
        with pytest.raises(RuntimeError) as err:
            pv.verify(torch.tensor([[0]]), target_logits=torch.zeros(1, 2, 3), backend="never")
    finally:
        pv.unregister_backend("never")
    message = str(err.value)
    assert "'never'" in message and "lacks" in message and "'torch:cpu'" in message


def test_numpy_kind_backends_get_numpy_and_callers_get_their_type() -> None:
    seen: list[type] = []

    class Probe(pv.get_backend("numpy").__class__):
        name = "_probe"

        def run(self, inputs):  # type: ignore[no-untyped-def]
            seen.append(type(inputs.target))
            return super().run(inputs)

    pv.register_backend("_probe", lambda device: Probe())
    try:
        res = pv.verify(np.array([[1, 2]]), target_logits=LOGITS.numpy(), backend="_probe")
    finally:
        pv.unregister_backend("_probe")
    assert seen == [np.ndarray] and isinstance(res.token_ids, np.ndarray)


def _raises(exc: BaseException):  # type: ignore[no-untyped-def]
    def factory(device: str | None) -> Backend:
        raise exc

    return factory


@pytest.fixture()
def registered(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``register(name, factory, **declared)``, unregistered at the end; ``auto`` unset."""
    monkeypatch.delenv(dispatch.ENV_BACKEND, raising=False)
    names: list[str] = []

    def register(name: str, factory, **declared) -> None:  # type: ignore[no-untyped-def]
        names.append(name)
        pv.register_backend(name, factory, **declared)

    yield register
    for name in names:
        pv.unregister_backend(name)


def test_a_factory_that_raises_is_broken_never_picked_and_fails_its_tests(
        registered, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A project backend whose factory raises (not an ImportError of a dependency) is
    ``broken``: listed with the error, never picked by ``auto``, and every test parametrized
    over it fails with the error (the suite's setup hook, as each conformance test meets it)."""
    import conftest

    registered("brokendemo", _raises(RuntimeError("kernel table corrupt")))
    status = pv.backend_status()["brokendemo"]
    assert (status.status, status.available, status.broken) == ("broken", False, True)
    assert "RuntimeError: kernel table corrupt" in status.reason
    with pytest.raises(RuntimeError, match="kernel table corrupt"):
        pv.get_backend("brokendemo")
    monkeypatch.setitem(dispatch.AUTO_PREFERENCE, "cpu", ("brokendemo", "torch:cpu"))
    assert dispatch.select_backend("auto", "cpu").qualified_name == "torch:cpu"
    assert "kernel table corrupt" in conftest.backends_under_test()["brokendemo"]
    monkeypatch.setattr(conftest, "_UNDER_TEST", {})  # the session's list, read afresh
    item = SimpleNamespace(callspec=SimpleNamespace(params={"available_backend": "brokendemo"}))
    with pytest.raises(pytest.fail.Exception, match=r"'brokendemo'.*kernel table corrupt"):
        conftest.pytest_runtest_setup(item)  # type: ignore[arg-type]
    item.callspec.params["available_backend"] = "torch:cpu"  # the control: a backend that runs
    conftest.pytest_runtest_setup(item)  # type: ignore[arg-type]


def test_a_missing_optional_dependency_stays_unavailable(registered) -> None:  # type: ignore
    """An ImportError of a dependency is "unavailable" (left out of the tests); one of this
    package's own modules is a bug: broken."""
    import conftest

    registered("nodepdemo", _raises(ModuleNotFoundError("No module named 'x'", name="x")))
    registered("badimportdemo", _raises(ImportError("cannot import name 'y'",
                                                    name="portable_verify.backends.nope")))
    status = pv.backend_status()
    assert status["nodepdemo"].status == "unavailable" and "x" in status["nodepdemo"].reason
    assert status["badimportdemo"].status == "broken"
    under_test = conftest.backends_under_test()
    assert "nodepdemo" not in under_test and "badimportdemo" in under_test


def test_every_required_backend_runs_here() -> None:
    """``PORTABLE_VERIFY_REQUIRE_BACKENDS`` (CI sets it to what it installs): each name it
    lists must run here; one that does not fails this test by name, with its reason."""
    unmet = dispatch.unmet_requirements()
    assert not unmet, "required backends that do not run here:\n" + "\n".join(
        f"  {name}: {why}" for name, why in unmet.items())


def test_a_required_backend_that_does_not_run_is_unmet(
        registered, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The negative control of the test above: an unavailable backend the variable names is
    unmet and parametrized into the tests (which then fail); unnamed, it is left out."""
    import conftest

    class Never(pv.get_backend("numpy").__class__):
        name = "neverdemo"

        def availability(self) -> Availability:
            return Availability(False, "needs hardware this machine lacks")

    registered("neverdemo", lambda device: Never())
    assert "neverdemo" not in conftest.backends_under_test()
    monkeypatch.setenv(dispatch.ENV_REQUIRE, " numpy, neverdemo ,no-such")
    unmet = dispatch.unmet_requirements()
    assert list(unmet) == ["neverdemo", "no-such"]
    assert unmet["neverdemo"] == "unavailable: needs hardware this machine lacks"
    assert "not a registered backend" in unmet["no-such"]
    assert "lacks" in (conftest.backends_under_test()["neverdemo"] or "")
    assert dispatch.unmet_requirements(["numpy", "torch:cpu"]) == {}


def test_auto_filters_on_declared_traits_without_building_the_backend(
        registered, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A registration's declared traits answer which backends implement a call: one that
    lacks the rule is never built; the one that has it is (negative control)."""
    built: list[str | None] = []

    def factory(device: str | None) -> Backend:
        built.append(device)
        return pv.get_backend("numpy")

    registered("declareddemo", factory,
               traits=BackendTraits(layouts=("chain",), chain_rules=("rejection",)))
    monkeypatch.setitem(dispatch.AUTO_PREFERENCE, "cpu", ("declareddemo", "torch:cpu"))
    assert dispatch.select_backend("auto", "cpu", "typical").qualified_name == "torch:cpu"
    assert built == []
    dispatch.select_backend("auto", "cpu", "rejection")
    assert built == [None]  # built, then found to differ from its declaration: broken
    assert pv.backend_status()["declareddemo"].status == "broken"


class _Warming:
    """A warming double: not ready until told; counts the looks."""

    def __init__(self, installed: bool = True) -> None:
        self.is_installed, self.is_ready, self.looks = installed, False, 0

    def installed(self) -> bool:
        return self.is_installed

    def ready(self) -> bool:
        self.looks += 1
        return self.is_ready


def test_a_warming_backend_is_stood_in_for_until_ready(
        registered, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The stand-in policy is the registration's, not a family's: while a declared warming
    is not ready, ``auto`` answers from the next choice and caches nothing; once ready it takes
    the backend (and caches it). Not installed: it is never stood in for (control)."""
    warms = _Warming()

    class Slow(pv.get_backend("numpy").__class__):
        name = "slowdemo"

    registered("slowdemo", lambda device: Slow(), warming=warms)
    monkeypatch.setitem(dispatch.AUTO_PREFERENCE, "cpu", ("slowdemo", "torch:cpu"))
    assert dispatch.warming_of("slowdemo") is warms
    picks = [dispatch.select_backend("auto", "cpu").qualified_name for _ in range(2)]
    assert picks == ["torch:cpu", "torch:cpu"] and warms.looks == 2  # never cached
    warms.is_ready = True
    picks = [dispatch.select_backend("auto", "cpu").qualified_name for _ in range(2)]
    assert picks == ["slowdemo", "slowdemo"] and warms.looks == 3  # cached once ready
    other = _Warming(installed=False)
    registered("slowdemo", lambda device: Slow(), warming=other)
    assert dispatch.select_backend("auto", "cpu").qualified_name == "slowdemo"
    assert other.looks == 0


def _module_level_imports(source: str) -> list[str]:
    """The modules a file imports at module level (conditional and ``try`` imports included)."""
    found: list[str] = []
    pending = list(ast.parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, (ast.If, ast.Try)):
            pending += [*node.body, *node.orelse, *getattr(node, "handlers", []),
                        *getattr(node, "finalbody", [])]
        elif isinstance(node, ast.ExceptHandler):
            pending += node.body
    return found


def _family_imports(source: str) -> list[str]:
    return [m for m in _module_level_imports(source)
            if m.startswith("portable_verify.backends.") and m.split(".")[2] != "base"]


def test_dispatch_imports_no_backend_family() -> None:
    """Dispatch knows the families by module-name strings only (lazy factories and
    declarations); the negative control is the import it used to have."""
    assert _family_imports(Path(dispatch.__file__).read_text(encoding="utf-8")) == []
    old = "from portable_verify.backends.numba import readiness as numba_readiness\n"
    assert _family_imports(old) == ["portable_verify.backends.numba.readiness"]
