"""The first call on ``backend="auto"`` with a cold numba cache answers at once, and right.

While numba's kernels are not cached, ``auto`` answers from ``torch:cpu`` and one build fills
the cache in a subprocess; then ``auto`` takes ``numba:cpu`` (docs/decisions.md, "The first
call"). Each case runs in a fresh Python with its own ``NUMBA_CACHE_DIR``; one cold build
(module fixture) serves every case that needs a warm cache, so the file compiles the kernels
once. The fork case forks repeatedly while a build loads kernels: before the fork hook held the
loader's lock, a child could inherit numba's compiler lock held and hang on its first call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANNOUNCED = "the numba:cpu kernels are not compiled yet"

PRELUDE = """
import json, os, sys, threading, time
import numpy as np, torch
import portable_verify as pv
from portable_verify import dispatch
from portable_verify.backends.numba import readiness
from portable_verify.testing.cases.random_cases import build_case, random_specs

def readme_call(backend="auto"):
    g = torch.Generator().manual_seed(0)
    B, K, V = 4, 3, 32000
    draft_ids = torch.randint(0, V, (B, K), generator=g)
    logits = torch.randn(B, K + 1, V, generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    t = torch.tensor([0.0, 0.7, 1.0, 1.0])
    r = pv.verify(draft_ids, target_logits=logits, draft_probs=q, temperature=t,
                  seed=torch.arange(B), backend=backend)
    return [r.token_ids.tolist(), r.num_accepted.tolist()]

def kit_calls(backend="auto"):
    out = []
    specs = random_specs(np.random.default_rng(20260102), 8)
    for method in ("greedy", "rejection", "typical", "block"):
        for spec in specs:
            kwargs = build_case(spec)
            r = pv.verify(**kwargs, method=method, backend=backend)
            out.append([method, spec.label, r.token_ids.tolist()])
    return out

def auto_now():
    return dispatch.select_backend("auto", "cpu", "rejection").qualified_name
"""

COLD = PRELUDE + """
first = {"readme": readme_call(), "numba_imported": "numba" in sys.modules}
first.update(kit=kit_calls(), auto=auto_now())
ready = readiness.wait(timeout=1200)
after = {"readme": readme_call(), "kit": kit_calls(), "auto": auto_now()}
compiled = {"readme": readme_call("numba:cpu"), "kit": kit_calls("numba:cpu")}
import importlib
pv.warm_up(backend="numba:cpu")  # every entry kernel, through the front doors
signatures = {}
for entry in readiness.ENTRY_KERNELS:
    module, _, kernel = entry.partition(".")
    found = readiness.cached_dispatchers(
        importlib.import_module("portable_verify.backends.numba." + module))
    signatures[entry] = len(found[kernel].signatures)
try:
    os.waitpid(-1, os.WNOHANG)
    children = "some"
except ChildProcessError:
    children = "none"
print(json.dumps({"first": first, "after": after, "compiled": compiled, "ready": ready,
                  "signatures": signatures,
                  "status": readiness.status(), "threads": threading.active_count(),
                  "children": children}))
"""


def _run(script: str, cache: Path, timeout: float = 1500, **env: str) -> tuple[Any, str]:
    """Run ``script`` in a fresh Python with ``cache`` as numba's cache; (its JSON, stderr)."""
    environ = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    environ.pop("PORTABLE_VERIFY_BACKEND", None)
    environ.pop("PORTABLE_VERIFY_INTERIM", None)  # the suite's own setting (conftest.py)
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environ, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """One cold start: calls answered during the build, after it, and on numba:cpu."""
    cache = tmp_path_factory.mktemp("numba_cache")
    out, err = _run(COLD, cache)
    return out, err, cache


def test_interim_answers_with_the_compiled_kernels_tokens(cold: Any) -> None:
    out, _, _ = cold
    assert out["first"]["auto"] == "torch:cpu"  # answered while the build ran
    assert not out["first"]["numba_imported"]  # the first look read a stamp, not numba
    assert out["first"]["readme"] == out["compiled"]["readme"]
    differ = [a[:2] for a, b in zip(out["first"]["kit"], out["compiled"]["kit"], strict=True)
              if a != b]
    assert differ == [], f"{len(differ)} kit cases differ between the interim and numba"
    assert len(out["first"]["kit"]) > 40


def test_numba_takes_over_and_nothing_is_left_running(cold: Any) -> None:
    out, _, _ = cold
    assert out["ready"] and out["status"] == "ready"
    assert out["after"]["auto"] == "numba:cpu"
    assert out["after"]["readme"] == out["compiled"]["readme"]
    assert out["after"]["kit"] == out["compiled"]["kit"]
    assert out["threads"] == 1  # the build thread ended
    assert out["children"] == "none"  # the build process was reaped


def test_the_build_compiles_what_the_front_doors_call(cold: Any) -> None:
    """The build subprocess (``python -m portable_verify.backends.numba.build``) calls each entry
    kernel once, by itself; the front doors' calls after it (the README's, the kit's and a
    ``warm_up``, which reaches every entry kernel) added no signature to the one it built and
    this process loaded: a second signature would be a compile in a caller's thread (a build
    passing ``check=0`` for ``False`` fails here)."""
    out, _, _ = cold
    assert out["signatures"] == {k: 1 for k in out["signatures"]}
    assert len(out["signatures"]) == 5


def test_a_cold_cache_is_announced_once(cold: Any) -> None:
    _, err, cache = cold
    assert err.count(ANNOUNCED) == 1, err
    line = next(x for x in err.splitlines() if ANNOUNCED in x)
    assert str(cache) in line and "portable-verify warm-up" in line


WARM = PRELUDE + """
first = auto_now()
imported = "numba" in sys.modules
status = readiness.status()
interim = readme_call()
ready = readiness.wait(600)
print(json.dumps({"first": first, "imported": imported, "status": status, "interim": interim,
                  "ready": ready, "auto": auto_now(), "readme": readme_call(),
                  "threads": threading.active_count()}))
"""


def test_a_warm_cache_is_silent_and_loads_in_the_background(cold: Any) -> None:
    """The build left a stamp; a new process reads it (no numba import on the caller's path),
    answers from torch:cpu while a thread loads the cached kernels, then takes numba:cpu."""
    _, _, cache = cold
    assert any(p.name.startswith("portable_verify.ready.") for p in cache.iterdir())
    out, err = _run(WARM, cache)
    assert out["first"] == "torch:cpu" and not out["imported"] and out["status"] == "loading"
    assert out["ready"] and out["auto"] == "numba:cpu" and out["threads"] == 1
    assert "portable_verify:" not in err, err
    assert out["interim"] == out["readme"] == cold[0]["compiled"]["readme"]


FORK = PRELUDE + """
readiness.stamp_warm = lambda: False  # the cache is warm: look past its stamp, so a build runs
assert auto_now() == "torch:cpu" and readiness.status() == "building"
forks, hung = 0, 0
while readiness.status() == "building" and forks < 6:
    pid = os.fork()
    if pid == 0:
        ok = readme_call() is not None and readme_call("numba:cpu") is not None
        os._exit(0 if ok else 1)
    forks += 1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.05)
    else:
        hung += 1
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    time.sleep(0.3)
print(json.dumps({"forks": forks, "hung": hung, "ready": readiness.wait(600),
                  "auto": auto_now()}))
"""


def test_fork_during_a_build_does_not_hang_the_child(cold: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(cold[2], cache)
    out, _ = _run(FORK, cache)
    assert out["forks"] >= 1 and out["hung"] == 0
    assert out["ready"] and out["auto"] == "numba:cpu"


SELECT = PRELUDE + """
first = auto_now()
r = readme_call() if os.environ.get("CALL") else None
print(json.dumps({"auto": first, "status": readiness.status(), "readme": r,
                  "threads": threading.active_count(), "again": auto_now()}))
"""


def test_the_switch_off_variable_compiles_in_place(tmp_path: Path) -> None:
    """``PORTABLE_VERIFY_INTERIM=0``: auto takes numba:cpu at once (its first call would
    compile in the calling thread), no build starts, and the cold cache is said once."""
    out, err = _run(SELECT, tmp_path, PORTABLE_VERIFY_INTERIM="0")
    assert out["auto"] == "numba:cpu" and out["status"] == "off" and out["threads"] == 1
    assert err.count("compiling the numba:cpu kernels in this call") == 1, err


def test_no_cache_location_answers_and_says_why_once(tmp_path: Path) -> None:
    """Where numba finds no writable cache location (read-only package folder and HOME, and
    ``NUMBA_CACHE_DIR`` unusable: ``rows.JIT["cache"]`` is then False and the kernels compile
    uncached), auto stays on torch:cpu, with the same tokens, and says so once. As root every
    folder is writable and numba falls back from a bad ``NUMBA_CACHE_DIR`` to the package's own
    ``__pycache__``, so the child sets numba's verdict itself (the seam this module reads)."""
    seam = "from portable_verify.backends.numba import rows\nrows.JIT['cache'] = False\n"
    out, err = _run(seam + SELECT, tmp_path, CALL="1")
    assert out["auto"] == out["again"] == "torch:cpu" and out["status"] == "failed"
    assert out["threads"] == 1
    assert err.count("numba cannot cache its kernels here") == 1, err
    reference, _ = _run(PRELUDE + "print(json.dumps(readme_call('torch:cpu')))", tmp_path)
    assert out["readme"] == reference


def test_the_stamp_is_keyed_by_what_numbas_index_is_keyed_by(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stamp names this numba, these kernel sources and this CPU: written for one CPU, it
    does not read as warm on another (negative control), nor after a kernel source changes."""
    from portable_verify.backends.numba import readiness

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert readiness.stamp_folder() == str(tmp_path) and not readiness.stamp_warm()
    (tmp_path / (readiness.STAMP_PREFIX + readiness.stamp_key())).write_text("")
    assert readiness.stamp_warm()
    monkeypatch.setattr(readiness, "_cpu_identity", lambda: "another CPU")
    assert not readiness.stamp_warm()
    monkeypatch.undo()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert readiness.stamp_warm()  # the control: only the CPU made it read cold
    real_stat = os.stat
    edited = tmp_path / "chain.py"  # the kernel source as an edit would leave it
    edited.write_text("x")

    def touched(path: Any, *args: Any, **kwargs: Any) -> Any:
        return real_stat(edited if str(path).endswith("chain.py") else path, *args, **kwargs)

    monkeypatch.setattr(readiness.os, "stat", touched)
    assert not readiness.stamp_warm()


def test_no_stamp_is_written_over_a_cold_cache(tmp_path: Path) -> None:
    """The stamp says what numba's own index says: over an empty cache it is not written."""
    script = ("import json\nfrom portable_verify.backends.numba import readiness\n"
              "print(json.dumps([readiness.write_stamp(), readiness.stamp_warm()]))")
    out, _ = _run(script, tmp_path)
    assert out == [False, False]
    assert not any(p.name.startswith("portable_verify.ready.") for p in tmp_path.iterdir())
