"""The vLLM commands' own logic, without vLLM: ``serve``'s command line and checks, and
``serve-check --seam``'s skip where vLLM is missing."""

from __future__ import annotations

import sys

import pytest

from portable_verify.cli import main as cli
from portable_verify.cli import serve
from portable_verify.integrations.vllm_v1 import plugin


def test_serve_execs_vllms_own_server_with_the_plugin_env(capsys, monkeypatch) -> None:
    monkeypatch.delenv(plugin.ENV_METHOD, raising=False)
    args = cli.build_parser().parse_args(
        ["serve", "--method", "typical", "--typical-alpha", "0.2", "/models/m", "--port", "8001",
         "--speculative-config", '{"method": "ngram"}'])
    argv, env = serve.server_command(args)
    assert argv == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                    "/models/m", "--port", "8001", "--speculative-config", '{"method": "ngram"}']
    assert env == {plugin.ENV_VAR: "1", plugin.ENV_METHOD: "typical",
                   plugin.ENV_TYPICAL_ALPHA: "0.2"}
    args.dry_run = True
    assert serve.run(args) == 0
    printed = capsys.readouterr().err
    assert "PORTABLE_VERIFY_VLLM=1" in printed and "vllm.entrypoints.openai.api_server" in printed


@pytest.mark.parametrize(("flags", "named"), [
    (["--typical-eps", "0.1"], plugin.ENV_TYPICAL_EPS),  # typical's option, method rejection
    (["--method", "typical", "--typical-eps", "-2"], plugin.ENV_TYPICAL_EPS),
])
def test_serve_refuses_bad_settings_before_starting_vllm(flags, named, monkeypatch) -> None:
    monkeypatch.delenv(plugin.ENV_METHOD, raising=False)
    args = cli.build_parser().parse_args(["serve", *flags, "--dry-run", "/models/m"])
    with pytest.raises(SystemExit, match=named):
        serve.run(args)


def test_seam_benchmark_skips_with_the_reason(capsys, monkeypatch, tmp_path) -> None:
    from portable_verify.bench import vllm_seam

    monkeypatch.setattr(vllm_seam, "vllm_missing_reason", lambda: "vLLM is not importable (x)")
    out = tmp_path / "seam.json"
    assert cli.main(["serve-check", "--seam", "--json", str(out)]) == 0
    assert "skipped: vLLM is not importable (x)" in capsys.readouterr().out
    assert "not importable" in out.read_text()
