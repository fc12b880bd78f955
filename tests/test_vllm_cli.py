"""The vLLM commands' own logic, without vLLM: ``serve``'s command line and checks, and
``serve-check --seam``'s skip where vLLM is missing."""

from __future__ import annotations

import shlex
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


SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
SPEC = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'


@pytest.mark.parametrize("line", [
    ["--method", "typical", "--typical-alpha", "0.2", "/m", "--port", "8001"],
    ["/m", "--port", "8001", "--method", "typical", "--typical-alpha", "0.2"],
    ["/m", "--method=typical", "--port", "8001", "--typical-alpha=0.2"],
    ["--typical-alpha", "0.2", "/m", "--port", "8001", "--method", "typical", "--dry-run"],
    ["--method", "block", "/m", "--typical-alpha", "0.2", "--port", "8001", "--method",
     "typical"],  # given twice: the later wins, as for any option
])
def test_serve_reads_its_options_before_or_after_the_model(line, monkeypatch) -> None:
    monkeypatch.delenv(plugin.ENV_METHOD, raising=False)
    argv, env = serve.server_command(cli.build_parser().parse_args(["serve", *line]))
    assert argv == [*SERVER, "--model", "/m", "--port", "8001"]  # none of ours reach vLLM
    assert env == {plugin.ENV_VAR: "1", plugin.ENV_METHOD: "typical",
                   plugin.ENV_TYPICAL_ALPHA: "0.2"}


@pytest.mark.parametrize(("line", "named"), [
    (["/m", "--port", "8001", "--method", "nosuch"], "--method"),
    (["/m", "--typical-eps"], "--typical-eps"),  # its value missing at the end of the line
])
def test_serve_refuses_a_bad_option_after_the_model_naming_it(line, named, capsys) -> None:
    args = cli.build_parser().parse_args(["serve", *line])
    with pytest.raises(SystemExit) as stopped:
        serve.server_command(args)
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err


@pytest.fixture
def converted(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The default model's folder, without converting it."""
    from portable_verify.integrations import models

    monkeypatch.setattr(models, "converted_default_dir", lambda: tmp_path / "smollm2")
    monkeypatch.delenv(plugin.ENV_METHOD, raising=False)
    return tmp_path / "smollm2"


def test_default_is_served_as_default_and_the_address_is_printed(converted, capsys) -> None:
    """The README's line, ``--method`` last: served as ``default``, the URL printed."""
    assert cli.main(["serve", "default", "--host", "127.0.0.1", "--port", "8001",
                     "--speculative-config", SPEC, "--method", "typical", "--dry-run"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert shlex.split(err[0]) == [
        f"{plugin.ENV_VAR}=1", f"{plugin.ENV_METHOD}=typical", *SERVER, "--model",
        str(converted), "--host", "127.0.0.1", "--port", "8001", "--speculative-config", SPEC,
        "--served-model-name", "default"]
    assert err[1].startswith("portable-verify serve: model 'default' at "
                             "http://127.0.0.1:8001/v1 once vLLM has started")


@pytest.mark.parametrize(("line", "names", "address"), [
    (["default", "--served-model-name", "mine"], "'mine'", "http://localhost:8000/v1"),
    (["default", "--served_model_name=a", "--host", "0.0.0.0"], "'a'",
     "http://localhost:8000/v1"),
    (["default", "--served-model-name", "a", "b", "--port", "9000"], "'a' / 'b'",
     "http://localhost:9000/v1"),
    (["/m", "--host", "::1", "--port=8002"], "'/m'", "http://[::1]:8002/v1"),
    (["/m", "--uds", "/tmp/v.sock"], "'/m'", "the unix socket /tmp/v.sock"),
])
def test_serve_prints_the_names_and_address_vllm_will_use(converted, capsys, line, names,
                                                          address) -> None:
    assert cli.main(["serve", "--dry-run", *line]) == 0
    command, said = capsys.readouterr().err.splitlines()
    assert said.startswith(f"portable-verify serve: model {names} at {address} once"), said
    assert command.count("-model-name") + command.count("_model_name") == (line[0] == "default")


def test_seam_benchmark_skips_with_the_reason(capsys, monkeypatch, tmp_path) -> None:
    from portable_verify.bench import vllm_seam

    monkeypatch.setattr(vllm_seam, "vllm_missing_reason", lambda: "vLLM is not importable (x)")
    out = tmp_path / "seam.json"
    assert cli.main(["serve-check", "--seam", "--json", str(out)]) == 0
    assert "skipped: vLLM is not importable (x)" in capsys.readouterr().out
    assert "not importable" in out.read_text()
