"""The README's server with the plugin under tensor parallelism (TP=2), next to a TP=1 server.

The model is a tiny Llama (random weights, fixed seed, 4 attention heads and 2 KV heads, so two
ranks split it; SmolLM2's tokenizer from the project's converted default model). Each server is
``portable-verify serve`` with ``--enforce-eager`` and n-gram drafts, started on 127.0.0.1 at a
free port in its own process group and stopped by its process id (the group is killed after, so
no engine or worker outlives a failure). The official ``openai`` client sends 4 greedy prompts
and 4 seeded sampled ones, twice (16 tokens each, EOS ignored). The TP=2 server's ranks write a
digest of every step's decision (``PORTABLE_VERIFY_VLLM_DIGESTS``, vllm_v1/digests.py).

Pass: both ranks decided every step with portable_verify, alike; seeded texts repeat; greedy
tokens equal the TP=1 server's up to the first position where TP=1's top-2 logit gap is at most
``NEAR_TIE`` (a different all-reduce order may flip a near-tie there, and everything after it
follows). Full greedy equality is printed. Skips without vLLM, the default model or ``openai``
unless ``PORTABLE_VERIFY_REQUIRE_VLLM=1`` (CI), which turns the skip into a failure.

Two server starts take minutes on a 2-core machine, so the test runs only with
``PORTABLE_VERIFY_TP_STEP=1``: ``.ci/run`` runs it alone, after the suite, interrupted (SIGINT:
the servers are stopped, pytest prints what it saw) at 8 minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import openai_server_missing, tiny_llama_checkpoint

from portable_verify.integrations import models
from portable_verify.integrations.vllm_v1 import digests
from portable_verify.integrations.vllm_v1.engine import DEFAULT_PROMPTS

_missing = openai_server_missing("SmolLM2's tokenizer")
STEP_VAR = "PORTABLE_VERIFY_TP_STEP"
if _missing is None and os.environ.get(STEP_VAR) != "1":
    _missing = (f"runs as its own step of .ci/run, killed at 8 minutes: {STEP_VAR}=1 "
                "python -m pytest -q -s tests/test_vllm_tp.py")
pytestmark = [pytest.mark.skipif(_missing is not None, reason=_missing or ""), pytest.mark.slow]

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}
PROMPTS = DEFAULT_PROMPTS[:4]
MAX_TOKENS = 16
SEEDS = [100, 101, 102, 103]
NEAR_TIE = 1e-3
SERVED_NAME = "tiny"
START_TIMEOUT_S = 360
REQUEST_TIMEOUT_S = 120
_PLUGIN_LINE = "portable_verify decides speculative verification in process"
_ERROR_LINE = re.compile(r"\bERROR\b|Traceback \(most recent call last\)")
_SHUTDOWN_LINE = "[shutdown] API server: shutdown triggered"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


def _wait_up(proc: subprocess.Popen, base: str, log_path: Path, started: float) -> None:
    while not _up(base):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n"
                               f"{log_path.read_text()[-6000:]}")
        if time.perf_counter() - started > START_TIMEOUT_S:
            raise TimeoutError(f"server not up after {START_TIMEOUT_S} s:\n"
                               f"{log_path.read_text()[-6000:]}")
        time.sleep(1)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Each server by its own pid (serve execs vLLM's server), then whatever of its process
    group is left (its engine core and workers): within about a minute in all."""
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    deadline = time.perf_counter() + 40
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    time.sleep(2)  # the engine cores and workers exit just after their servers
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def _servers(model: Path, envs: dict[int, dict[str, str]], logs: Path) -> Iterator[dict]:
    """``portable-verify serve`` at each tensor-parallel size of ``envs``, started together
    (their start-ups are mostly one-threaded imports); yields base URLs; always stops them."""
    procs: dict[int, tuple[subprocess.Popen, str]] = {}
    started = time.perf_counter()
    try:
        for tp, env in envs.items():
            port = _free_port()
            argv = [sys.executable, "-m", "portable_verify.cli.main", "serve", str(model),
                    "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                    "--enforce-eager", "--max-model-len", "256", "--seed", "0",
                    "--served-model-name", SERVED_NAME, "--tensor-parallel-size", str(tp),
                    "--speculative-config", json.dumps(SPEC)]
            with open(logs / f"tp{tp}.log", "w") as log:
                procs[tp] = (subprocess.Popen(argv, env=env, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True),  # a group of its own
                             f"http://127.0.0.1:{port}")
        for tp, (proc, base) in procs.items():
            _wait_up(proc, base, logs / f"tp{tp}.log", started)
            print(f"TP={tp} server up after {time.perf_counter() - started:.0f} s", flush=True)
        yield {tp: base for tp, (_, base) in procs.items()}
    except KeyboardInterrupt:  # .ci/run's time limit: show where each server got to
        for tp in procs:
            tail = (logs / f"tp{tp}.log").read_text().splitlines()[-5:]
            print(f"interrupted; TP={tp} server log ends:", *tail, sep="\n  ", flush=True)
        raise
    finally:
        _stop([proc for proc, _ in procs.values()])


def _tokens(choice) -> list[int]:  # type: ignore[no-untyped-def]
    return list(choice.token_ids)  # vLLM's ``return_token_ids`` field


def _gaps(choice) -> list[float]:  # type: ignore[no-untyped-def]
    """Top-2 logprob (= logit) gap at each emitted position; 0 where fewer than 2 came back."""
    out = []
    for top in choice.logprobs.top_logprobs:
        values = sorted(top.values(), reverse=True)
        out.append(values[0] - values[1] if len(values) > 1 else 0.0)
    return out


def _requests(base: str) -> dict:
    """Greedy (with top-2 logprobs) and seeded sampled completions, twice each, 4 at a time."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S,
                    max_retries=0)
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True, "ignore_eos": True}

    def complete(prompt: str, seed: int | None):  # type: ignore[no-untyped-def]
        return client.completions.create(
            model=SERVED_NAME, prompt=prompt, max_tokens=MAX_TOKENS, seed=seed,
            temperature=0.0 if seed is None else 0.8, logprobs=2 if seed is None else None,
            extra_body=extra).choices[0]

    def batch(seeds: list[int | None]) -> list:
        pool = ThreadPoolExecutor(max_workers=len(PROMPTS))
        try:
            return list(pool.map(complete, PROMPTS, seeds))
        finally:  # interrupted: do not wait here for requests the servers' stop will end
            pool.shutdown(wait=False, cancel_futures=True)

    greedy = batch([None] * len(PROMPTS))
    seeded = [batch(list(SEEDS)) for _ in range(2)]
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    drafted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("vllm:spec_decode_num_draft_tokens_total"))
    return {"greedy": [_tokens(c) for c in greedy], "gaps": [_gaps(c) for c in greedy],
            "seeded": [[_tokens(c) for c in run] for run in seeded],
            "greedy_text": [c.text for c in greedy], "draft_tokens": drafted}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vllm-tp")
    model = tiny_llama_checkpoint(root / "tiny-llama", models.converted_default_dir())
    here = str(Path(__file__).parents[1])  # spawned workers import this tree's plugin
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    for name in ("PORTABLE_VERIFY_VLLM_METHOD", "PORTABLE_VERIFY_VLLM_TYPICAL_EPS",
                 "PORTABLE_VERIFY_VLLM_TYPICAL_ALPHA", "VLLM_PLUGINS", digests.ENV_DIGESTS):
        base_env.pop(name, None)
    # Two ranks on a 2-core machine: one core each, none reserved for the engine's front end.
    envs = {1: base_env, 2: {**base_env, "VLLM_CPU_OMP_THREADS_BIND": "0|1",
                             "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                             digests.ENV_DIGESTS: str(root / "digests")}}
    out: dict = {}
    with _servers(model, envs, root) as bases:
        for tp, base in bases.items():
            out[tp] = _requests(base)
            print(f"TP={tp}: greedy texts {out[tp]['greedy_text']}", flush=True)
    for tp in envs:
        out[tp]["log"] = (root / f"tp{tp}.log").read_text()
    out["records"] = digests.read(root / "digests")
    return out


def test_every_rank_decided_every_step_alike(runs: dict) -> None:
    records = runs["records"]
    steps = [len(s) for _, s in records]
    print(f"TP=2 ranks {[h['rank'] for h, _ in records]}, steps recorded {steps}, "
          f"draft tokens {runs[2]['draft_tokens']:.0f}")
    assert digests.disagreement(records, ranks=2) is None, digests.disagreement(records, 2)
    assert runs[2]["draft_tokens"] > 0  # n-gram drafts were verified, not only bonus steps
    log = runs[2]["log"]
    workers = set(re.findall(rf"\(([^)]*?) pid=(\d+)\)[^\n]*{_PLUGIN_LINE}", log))
    assert {int(pid) for _, pid in workers} >= {h["pid"] for h, _ in records}, workers
    serving = log.split(_SHUTDOWN_LINE, 1)[0]
    errors = [line for line in serving.splitlines() if _ERROR_LINE.search(line)]
    assert not errors, errors[:20]


def test_seeded_texts_repeat(runs: dict) -> None:
    first, again = runs[2]["seeded"]
    assert first == again
    assert all(len(t) == MAX_TOKENS for t in first)
    assert len({tuple(t) for t in first}) == len(PROMPTS)  # real, distinct texts


def test_greedy_equals_tp1_before_any_near_tie(runs: dict) -> None:
    tp1, tp2, gaps = runs[1]["greedy"], runs[2]["greedy"], runs[1]["gaps"]
    equal = sum(a == b for a, b in zip(tp1, tp2, strict=True))
    stable = [next((j for j, gap in enumerate(g) if gap <= NEAR_TIE), len(g)) for g in gaps]
    print(f"greedy TP=2 equal to TP=1 on {equal}/{len(PROMPTS)} prompts; tokens before TP=1's "
          f"first near-tie, required equal: {stable} of {MAX_TOKENS}")
    for i, (a, b, g) in enumerate(zip(tp1, tp2, gaps, strict=True)):
        assert len(a) == len(b) == len(g) == MAX_TOKENS, i
        assert a[:stable[i]] == b[:stable[i]], (i, stable[i], a, b)
