"""The dispatch layer: registry, names and aliases, availability reasons, auto selection and the
env override."""

from __future__ import annotations

import importlib.util

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
