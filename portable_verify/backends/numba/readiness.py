"""Whether the numba kernels are ready, and their build in the background while they are not.

Why: a cold kernel cache made the first ``backend="auto"`` call on CPU compile for tens of
seconds with nothing on screen. Now, while the kernels are neither cached nor loaded, ``auto``
answers from the next backend of its preference list (``torch:cpu``: the same tokens, from the
same counter-hash uniforms), and one build fills numba's disk cache in a subprocess (no compiler
lock is held in this process, no GIL is shared with the caller), after which a thread loads the
cached kernels here and dispatch switches to ``numba:cpu`` (docs/decisions.md, "The first
call"). Dispatch's side of it is generic: :data:`WARMING` is what the numba backend declares
at registration (``backends.base.Warming``). ``PORTABLE_VERIFY_INTERIM=0`` turns this off: the
first call then compiles in the calling thread, as a server that wants the compiled kernel or
nothing asks.

Nothing here imports numba at module import, and the first look does not either where it
can tell from a stamp file (:func:`stamp_warm`): dispatch asks before it builds the numba
backend, so a cold first call costs the stand-in's call plus a file lookup, and numba is
imported in the build thread. A stamped (warm) cache is answered the same way for about a
second, while the thread loads the cached kernels (loading them in the first call made it 7-9x
the stand-in's). numba's loader internals are private; any surprise reads as "not cached".
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import threading
from typing import Any

from portable_verify.backends.base import ENV_INTERIM, BackendTraits
from portable_verify.backends.numba import rules
from portable_verify.core import methods

KERNEL_MODULES = ("portable_verify.backends.numba.chain", "portable_verify.backends.numba.rows",
                  "portable_verify.backends.numba.block", "portable_verify.backends.numba.tree",
                  "portable_verify.backends.numba.traversal",
                  "portable_verify.backends.numba.entries")
"""Every module holding cached kernels (the chain, block and tree kernels, row passes and the
families' entry kernels)."""

ENTRY_KERNELS = ("chain.greedy", "chain.greedy_at", "entries.decide",
                 "entries.decide_at", "entries.walk")
"""The kernels the backend calls: the cache is warm when each has a signature for this CPU."""

TRAITS = BackendTraits(checks_what_it_reads=True, host_calls=True, checks_tree_reads=True,
                       layouts=(methods.CHAIN, methods.TREE), chain_rules=tuple(rules.CHAIN),
                       tree_rules=tuple(rules.TREE))
"""``numba:cpu``'s traits, here so that dispatch can ask what it implements before importing
it (and numba); its rules are ``rules.py``'s table."""

STAMP_PREFIX = "portable_verify.ready."
"""A build that left every kernel cached writes ``STAMP_PREFIX + key`` (:func:`stamp_key`)."""

UNCACHED_EXIT = 3
"""The build subprocess's exit status when numba has no writable cache location."""

LOAD_AFTER_S = 0.5
"""A warm cache's loading starts this long after the first look (see :func:`_build`)."""

POLL_S = 0.2
"""How often the build thread looks at the subprocess and at the stop flag."""

BUILD_MODULE = f"{__package__}.build"
"""The build subprocess's entry point (``python -m``; it lowers its own priority)."""

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
"""The folder that holds the ``portable_verify`` package (the subprocess's import path)."""

READY = False
"""True once the kernels are loaded here, or the interim path is off: a plain read."""

_LOCK = threading.Lock()  # the state below; never held while waiting for numba or a process
_LOADING = threading.Lock()  # held around each in-process kernel load; fork waits for it
_STOP = threading.Event()  # interpreter exit: the build thread ends at its next look
_state: dict[str, Any] = {"status": "new", "thread": None, "process": None, "said": set()}


def interim_enabled() -> bool:
    """Whether ``auto`` may answer from a stand-in while the kernels build."""
    return os.environ.get(ENV_INTERIM, "1").strip().lower() not in ("0", "off", "false", "no")


def ready() -> bool:
    """True: ``auto`` may take ``numba:cpu`` now. False: answer from the stand-in (the build
    has been started, or cannot run here and said why once)."""
    if READY:
        return True
    with _LOCK:
        if _state["status"] == "new" and not READY:
            _decide()
        return READY


def _decide() -> None:
    """The first look (under ``_LOCK``): warm, cold with the interim path on or off, or no
    cache at all. Without numba imported yet, the stamp decides (no numba import here: the
    build thread reads numba's own index)."""
    global READY
    if interim_enabled() and "numba" not in sys.modules:
        if stamp_warm():  # cached: loaded in the background (about a second), said nowhere
            _start(status="loading")
            return
        _announce_cold(stamp_folder())
        _start(cold=True)
        return
    cache = cache_state()
    if not interim_enabled():
        if cache["state"] != "warm":
            where = _where(cache.get("cache_dirs"))
            _say("cold", f"compiling the numba:cpu kernels in this call (tens of seconds; "
                         f"{ENV_INTERIM}=0){where}; pre-build them with `portable-verify warm-up`")
        _state["status"] = "off"
        READY = True
        return
    if cache["state"] == "warm":
        _state["status"] = "warm"
        READY = True  # each kernel loads from the cache on its first call (about a second)
        return
    if cache["state"] == "uncached":
        _state["status"] = "failed"
        _say_uncached(cache["detail"])
        return
    _announce_cold((cache.get("cache_dirs") or [None])[0])
    _start()


def _where(dirs: list[str] | None) -> str:
    return f" (cache: {dirs[0]})" if dirs else ""


def _announce_cold(folder: str | None) -> None:
    where = _where([folder] if folder else None)
    _say("cold", f"the numba:cpu kernels are not compiled yet{where}: building them in "
                 "the background and answering from torch:cpu meanwhile (same tokens); "
                 "pre-build them with `portable-verify warm-up`")


def _say_uncached(detail: str) -> None:
    _say("uncached", f"numba cannot cache its kernels here ({detail}): answering "
                     "from torch:cpu (same tokens); set NUMBA_CACHE_DIR to a writable "
                     f"folder, or {ENV_INTERIM}=0 to compile in this process")


def _say(what: str, message: str) -> None:
    """One line on stderr, once per process and topic (what is happening, and what to do)."""
    if what not in _state["said"]:
        _state["said"].add(what)
        print(f"portable_verify: {message}", file=sys.stderr, flush=True)


def _start(cold: bool = False, status: str = "building") -> None:
    _STOP.clear()
    thread = threading.Thread(target=_build, args=(cold, status == "loading"),
                              name="portable-verify-numba-build", daemon=True)
    _state.update(status=status, thread=thread)
    thread.start()


def _build(cold: bool, later: bool) -> None:
    """Fill the disk cache in a subprocess unless it is warm, then load it here. ``cold``: the
    stamp said so; the subprocess starts at once and numba is imported here only after it, not
    beside the caller's first calls. ``later``: a warm cache; the loading starts
    :data:`LOAD_AFTER_S` after the first call (which then runs on the stand-in alone, without
    a thread importing numba beside it; a script that exits before never imports numba)."""
    if later and _STOP.wait(LOAD_AFTER_S):
        _finish("warm")
        return
    try:
        if cold or _cache_state_locked()["state"] != "warm":
            failure = _run_builder()
            if failure is None and _cache_state_locked()["state"] != "warm":
                failure = "the build ended but numba's cache holds no kernels for this CPU"
            if failure is not None:
                _fail(failure)
                return
        if not _load():
            return  # stopped: the interpreter is exiting
    except Exception as exc:  # a private numba API changed: stay on the stand-in, say why
        _fail(f"{type(exc).__name__}: {exc}")
        return
    _finish("ready")


def _run_builder() -> str | None:
    """Run the build subprocess to its end (None) or say why it failed; reaped here."""
    env = dict(os.environ, **{ENV_INTERIM: "0"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen([sys.executable, "-m", BUILD_MODULE], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=err, env=env,
                                   start_new_session=True)
        with _LOCK:
            _state["process"] = process
        while process.poll() is None:
            if _STOP.wait(POLL_S):
                return "stopped"  # left to finish on its own: it fills the cache for next time
        with _LOCK:
            _state["process"] = None
        if process.returncode == 0:
            return None
        if process.returncode == UNCACHED_EXIT:
            _say_uncached("no writable cache location")
            return "stopped"  # said: nothing more to say
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
        return f"the kernel build exited with {process.returncode}: {(lines or ['?'])[-1]}"


def _cache_state_locked() -> dict[str, Any]:
    """:func:`cache_state` from the build thread: it calls into LLVM, whose bindings hold a
    lock a forked child would inherit held, so a fork waits for it (:data:`_LOADING`)."""
    with _LOADING:
        return cache_state()


def _load() -> bool:
    """Load every cached signature of every kernel here, one at a time (a fork in between
    finds no load half done, nor numba's or LLVM's locks held); False when stopped."""
    with _LOADING:
        cached = _cached_signatures()
    for dispatcher, signatures in cached:
        for signature in signatures:
            with _LOADING:
                if _STOP.is_set():
                    return False
                dispatcher.compile(signature)  # a load: the subprocess compiled it
    return True


def _fail(reason: str) -> None:
    if reason != "stopped":
        _say("failed", f"the numba:cpu kernels could not be built in the background ({reason}); "
                       "answering from torch:cpu (same tokens)")
    _finish("failed")


def _finish(status: str) -> None:
    global READY
    with _LOCK:
        _state.update(status=status, thread=None, process=None)
        READY = status == "ready"


def loaded() -> None:
    """Every kernel is loaded in this process (a warm-up through ``numba:cpu`` ran here):
    ``auto`` takes ``numba:cpu`` from the next selection on."""
    global READY
    with _LOCK:
        if _state["status"] not in BUSY:  # a running build ends by itself, ready
            _state["status"] = "ready"
        READY = True


def wait(timeout: float | None = None) -> bool:
    """Wait for a background build to end (tests, benchmarks); True when the kernels are
    ready."""
    thread = _state["thread"]
    if thread is not None:
        thread.join(timeout)
    return READY


BUSY = ("building", "loading")
"""The statuses with a thread at work: building (and loading) or loading only (a warm cache)."""


def status() -> str:
    """``new``, ``building``, ``loading``, ``ready``, ``warm``, ``off`` or ``failed``."""
    return _state["status"]


def _stop_at_exit() -> None:
    """At exit the build thread ends within :data:`POLL_S` (a subprocess still compiling
    finishes on its own, filling the cache for the next process)."""
    _STOP.set()
    thread = _state["thread"]
    if thread is not None:
        thread.join()


def _before_fork() -> None:
    _LOCK.acquire()
    _LOADING.acquire()


def _after_fork_in_parent() -> None:
    _LOADING.release()
    _LOCK.release()


def _after_fork_in_child() -> None:
    """The child has no build thread and does not own the subprocess: it decides afresh on its
    next call (a build it starts waits for the parent's on the cache's lock file)."""
    global READY
    _LOADING.release()
    _LOCK.release()
    if _state["status"] in BUSY:
        _state.update(status="new", thread=None, process=None)
        READY = False


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
atexit.register(_stop_at_exit)


def cached_dispatchers(module: Any) -> dict[str, Any]:
    """The module's own cached, separately compiled kernels (``inline="always"`` ones are
    compiled into their callers and never cached on their own)."""
    from numba.core.dispatcher import Dispatcher

    found = {}
    for name, obj in vars(module).items():
        if not isinstance(obj, Dispatcher) or getattr(obj, "__module__", None) != module.__name__:
            continue
        if obj.targetoptions.get("inline", "never") == "always":
            continue
        if type(obj._cache).__name__ == "NullCache":
            continue
        found[name] = obj
    return found


def signatures_for_here(dispatcher: Any) -> list[Any]:
    """The cached signatures of ``dispatcher`` numba would load on this machine."""
    cache = dispatcher._cache
    _, here_machine, here_code = cache._index_key(None, dispatcher.targetctx.codegen())
    index = cache._cache_file._load_index()  # {} when absent, another version or stale
    return [key[0] for key in index if key[1] == here_machine and key[2] == here_code]


def _cached_signatures() -> list[tuple[Any, list[Any]]]:
    """The entry kernels' cached signatures (a helper's code is linked into its callers: its
    own cache entry need not be loaded)."""
    found = []
    for entry in ENTRY_KERNELS:
        module, _, kernel = entry.partition(".")
        dispatchers = cached_dispatchers(importlib.import_module(f"{__package__}.{module}"))
        found.append((dispatchers[kernel], signatures_for_here(dispatchers[kernel])))
    return found


def cache_state() -> dict[str, Any]:
    """``state``: ``warm`` (every entry kernel cached for this CPU), ``cold``, ``uncached`` (no
    writable cache location) or ``unknown``; ``cache_dirs``; ``detail``."""
    try:
        rows = importlib.import_module("portable_verify.backends.numba.rows")
        if not rows.JIT["cache"]:
            return {"state": "uncached", "detail": "no writable cache location"}
        counts: dict[str, int] = {}
        dirs: set[str] = set()
        for name in KERNEL_MODULES:
            for kernel, dispatcher in cached_dispatchers(importlib.import_module(name)).items():
                counts[f"{name.rpartition('.')[2]}.{kernel}"] = len(signatures_for_here(dispatcher))
                dirs.add(dispatcher._cache.cache_path)
    except Exception as exc:  # private numba API: read as not cached
        return {"state": "unknown", "detail": f"{type(exc).__name__}: {exc}"}
    warm = all(counts.get(k, 0) > 0 for k in ENTRY_KERNELS)
    return {"state": "warm" if warm else "cold", "cache_dirs": sorted(dirs),
            "detail": f"{sum(counts.get(k, 0) > 0 for k in ENTRY_KERNELS)} of "
                      f"{len(ENTRY_KERNELS)} entry kernels cached", "kernels": counts}


def installed() -> bool:
    """numba can be imported (found on the path; not imported here)."""
    if "numba" not in _FOUND:
        _FOUND["numba"] = importlib.util.find_spec("numba") is not None
    return _FOUND["numba"]


_FOUND: dict[str, bool] = {}


def stamp_key() -> str:
    """What numba's cache index is keyed by, read with plain file I/O: numba's files (its
    version), the kernel sources' stamps (numba keys each index by its source file's
    modification time and size), Python, and the CPU (model and feature flags)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.find_spec("numba")
    files = [spec.origin if spec is not None else "none"]
    files += [os.path.join(here, f"{name.rpartition('.')[2]}.py") for name in KERNEL_MODULES]
    parts = [sys.version, platform.machine(), _cpu_identity()]
    for path in files:
        st = os.stat(path) if os.path.exists(path) else None
        parts.append(f"{path}:{st.st_mtime_ns if st else 0}:{st.st_size if st else 0}")
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:20]


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux ``/proc/cpuinfo``), else the platform's
    processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.read(65536).split("\n\n", 1)[0].splitlines()
    except OSError:
        return platform.processor()
    keep = ("model name", "flags", "Features", "CPU part", "cpu model")
    return "|".join(line for line in lines if line.split(":", 1)[0].strip() in keep)


def stamp_folder() -> str:
    """Where the stamp lives: ``NUMBA_CACHE_DIR`` when set, else the ``__pycache__`` beside the
    kernel sources (numba's in-tree cache folder)."""
    provided = os.environ.get("NUMBA_CACHE_DIR", "").strip()
    if provided:
        return provided
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")


def stamp_warm() -> bool:
    """A build left every kernel cached for this numba, these sources and this CPU (a
    missing stamp only means "not known": numba's own index is read next, in the build
    thread)."""
    return os.path.exists(os.path.join(stamp_folder(), STAMP_PREFIX + stamp_key()))


def write_stamp() -> bool:
    """After a build: write the stamp where :func:`stamp_warm` looks, if numba's own index
    says every entry kernel is cached here; True when written."""
    if cache_state()["state"] != "warm":
        return False
    try:
        os.makedirs(stamp_folder(), exist_ok=True)
        with open(os.path.join(stamp_folder(), STAMP_PREFIX + stamp_key()), "w") as handle:
            handle.write("every numba:cpu kernel of portable_verify is cached here\n")
    except OSError:
        return False
    return True


def kernel_cache() -> dict[str, Any]:
    """``state`` (warm: every kernel the backend calls is cached; partial / cold / unavailable
    / unknown), the cache folder and, per kernel, how many signatures are cached for this
    numba version and CPU (a helper compiled into its callers only may have none)."""
    try:
        import numba
    except ImportError as exc:
        return {"state": "unavailable", "detail": f"numba not importable: {exc}", "kernels": {}}
    kernels: dict[str, int] = {}
    where: set[str] = set()
    try:
        for module_name in KERNEL_MODULES:
            module = importlib.import_module(module_name)
            for name, dispatcher in cached_dispatchers(module).items():
                key = f"{module_name.partition('backends.')[2]}.{name}"
                kernels[key] = len(signatures_for_here(dispatcher))
                where.add(dispatcher._cache.cache_path)
    except Exception as exc:  # private numba API, or no cache locator (read-only install)
        return {"state": "unknown", "detail": f"{type(exc).__name__}: {exc}",
                "numba": numba.__version__, "kernels": kernels}
    warm = sum(1 for n in kernels.values() if n > 0)
    entries = all(kernels.get(f"numba.{k}", 0) > 0 for k in ENTRY_KERNELS)
    state = "warm" if entries else "cold" if warm == 0 else "partial"  # readiness's rule
    return {"state": state, "numba": numba.__version__, "cache_dirs": sorted(where),
            "detail": f"{warm} of {len(kernels)} kernels cached for numba "
                      f"{numba.__version__} on this CPU", "kernels": kernels}


def warmed() -> None:
    """A warm-up through ``numba:cpu`` ran here: :func:`loaded`, and the stamp written so that
    a later process knows it without importing numba."""
    loaded()
    write_stamp()


class NumbaWarming:
    """``numba:cpu``'s side of dispatch's warming protocol (``backends.base.Warming``): this
    module's functions, declared at registration."""

    installed = staticmethod(installed)
    ready = staticmethod(ready)
    status = staticmethod(status)
    wait = staticmethod(wait)
    warmed = staticmethod(warmed)
    kernel_cache = staticmethod(kernel_cache)


WARMING = NumbaWarming()
"""What the numba backend declares as its warming (``register_backend(..., warming=...)``)."""
