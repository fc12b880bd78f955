"""The dispatch layer: registry, availability reasons, auto selection and the env override."""

from __future__ import annotations

import pytest
import torch

import portable_verify as pv
from portable_verify import dispatch
from portable_verify.backends.base import Availability


def test_cpu_and_numpy_are_available() -> None:
    names = pv.available_backends()
    assert "cpu" in names and "numpy" in names


def test_every_backend_reports_a_reason() -> None:
    for name, status in pv.backend_status().items():
        assert isinstance(status.available, bool), name
        assert status.reason, f"{name} gives no reason"


def test_auto_picks_cpu_for_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dispatch.ENV_BACKEND, raising=False)
    assert dispatch.select_backend("auto", "cpu").name == "cpu"


def test_env_override_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.ENV_BACKEND, "numpy")
    assert dispatch.select_backend("auto", "cpu").name == "numpy"
    calls = []

    class Spy(pv.get_backend("numpy").__class__):
        name = "_spy"

        def run(self, inputs):  # type: ignore[no-untyped-def]
            calls.append(inputs.batch_size)
            return super().run(inputs)

    pv.register_backend("_spy", lambda suffix: Spy(), auto=False)
    try:
        monkeypatch.setenv(dispatch.ENV_BACKEND, "_spy")
        pv.verify(torch.tensor([[0]]), target_logits=torch.zeros(1, 2, 3), method="greedy")
    finally:
        pv.unregister_backend("_spy")
    assert calls == [1]


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match="'no-such'"):
        pv.get_backend("no-such")


def test_unavailable_backend_says_why_and_lists_available() -> None:
    class Never(pv.get_backend("numpy").__class__):
        name = "never"

        def availability(self) -> Availability:
            return Availability(False, "needs hardware this machine lacks")

    pv.register_backend("never", lambda suffix: Never(), auto=False)
    try:
        with pytest.raises(RuntimeError) as err:
            pv.verify(torch.tensor([[0]]), target_logits=torch.zeros(1, 2, 3), backend="never")
    finally:
        pv.unregister_backend("never")
    message = str(err.value)
    assert "'never'" in message and "lacks" in message and "'cpu'" in message
