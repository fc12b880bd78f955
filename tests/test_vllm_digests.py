"""The per-rank decision record (``PORTABLE_VERIFY_VLLM_DIGESTS``) and the check that reads it.

tests/test_vllm_tp.py reads what a tensor-parallel server's ranks wrote; here the recorder and
the agreement check are held to what they claim without an engine, each with a negative control
(a one-token difference, a rank that vLLM's own sampler served, a missing rank).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from portable_verify.integrations.vllm_v1 import digests


def _deciding(outputs: list[torch.Tensor], portable_verify: bool = True):  # type: ignore[no-untyped-def]
    """A stand-in for the plugin's ``rejection_sample``: returns ``outputs`` in turn."""
    steps = iter(outputs)

    def rejection_sample(*args, **kwargs):  # type: ignore[no-untyped-def]
        rejection_sample.calls += 1
        return next(steps)

    rejection_sample.calls = 0
    rejection_sample.portable_verify = portable_verify
    rejection_sample.method = "rejection"
    return rejection_sample


def _run_rank(monkeypatch: pytest.MonkeyPatch, folder: Path, rank: int,
              outputs: list[torch.Tensor], portable_verify: bool = True) -> None:
    monkeypatch.setattr(digests, "_tp_rank", lambda: rank)
    recorder = digests.DigestRecorder(_deciding(outputs, portable_verify), folder)
    for _ in outputs:
        recorder("step arguments")
    assert recorder.calls == len(outputs)  # the wrapped function's counters stay live
    assert recorder.portable_verify is portable_verify


STEPS = [torch.tensor([[5, 7, -1, -1], [2, 2, 2, 9]], dtype=torch.int32),
         torch.tensor([[1, -1, -1, -1]], dtype=torch.int32)]


def test_ranks_that_decided_alike_agree(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for rank in (1, 0):
        _run_rank(monkeypatch, tmp_path, rank, STEPS)
    records = digests.read(tmp_path)
    assert [h["rank"] for h, _ in records] == [0, 1]
    assert all(h["portable_verify"] and h["method"] == "rejection" for h, _ in records)
    assert len(records[0][1]) == len(STEPS) and records[0][1] == records[1][1]
    assert records[0][1][0] != records[0][1][1]
    assert digests.disagreement(records, ranks=2) is None


def test_one_token_difference_is_caught(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: rank 1 emits one other token at the second step."""
    changed = [STEPS[0], STEPS[1].clone()]
    changed[1][0, 0] = 3
    _run_rank(monkeypatch, tmp_path, 0, STEPS)
    _run_rank(monkeypatch, tmp_path, 1, changed)
    problem = digests.disagreement(digests.read(tmp_path), ranks=2)
    assert problem is not None and "rank 1 differs from rank 0 at step 1" in problem


def test_a_missing_rank_or_vllms_own_sampler_is_caught(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _run_rank(monkeypatch, tmp_path / "one", 0, STEPS)
    assert "expected one from each of 0..1" in digests.disagreement(
        digests.read(tmp_path / "one"), ranks=2)
    _run_rank(monkeypatch, tmp_path / "own", 0, STEPS)
    _run_rank(monkeypatch, tmp_path / "own", 1, STEPS, portable_verify=False)
    assert "rank 1" in digests.disagreement(digests.read(tmp_path / "own"), ranks=2)


def test_equal_values_of_another_shape_differ() -> None:
    assert digests.digest(STEPS[0]) != digests.digest(STEPS[0].reshape(4, 2))
    assert digests.digest(STEPS[0]) == digests.digest(STEPS[0].clone())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_plugin_records_only_when_asked(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.sample.rejection_sampler as module

    from portable_verify.integrations.vllm_v1 import plugin

    current = module.rejection_sample
    original = getattr(current, "vllm_original", current)
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    for folder in ("", str(tmp_path)):
        monkeypatch.setattr(module, "rejection_sample", original)
        monkeypatch.setenv(digests.ENV_DIGESTS, folder)
        plugin.register()
        installed = module.rejection_sample
        assert installed.portable_verify and installed.vllm_original is original
        assert isinstance(installed, digests.DigestRecorder) is bool(folder), folder
