"""The ``vllm.general_plugins`` entry point: opt-in, loaded in every vLLM process.

Why opt-in through an environment variable: vLLM loads every installed general plugin unless
``VLLM_PLUGINS`` restricts them, so merely installing portable_verify must change nothing.
``PORTABLE_VERIFY_VLLM`` (inherited by vLLM's engine and worker processes) decides:

* unset, ``0``, ``off``: nothing is touched (unless ``VLLM_PLUGINS`` names ``portable_verify``
  explicitly, which is an opt-in too and means ``on``);
* ``1``, ``on``, ``sampler``: portable_verify decides every verification step (V1 model runner:
  vLLM's ``rejection_sample``; V2 model runner: its rejection sampler), and the broken-expansion
  probe runs;
* ``fix``: only the probe (and the replacement of a broken expansion): vLLM's own sampler,
  repaired (and timed, as the replacement is), for side-by-side comparisons.
"""

from __future__ import annotations

import importlib
import logging
import os

from portable_verify.integrations.vllm_v1.expansion import install_checked_expansion
from portable_verify.integrations.vllm_v1.sampler import make_rejection_sample, timed

logger = logging.getLogger("vllm.plugins.portable_verify")

ENV_VAR = "PORTABLE_VERIFY_VLLM"
PLUGIN_NAME = "portable_verify"
ENV_BACKEND = "PORTABLE_VERIFY_VLLM_BACKEND"
_ON = ("1", "on", "true", "yes", "sampler")
_OFF = ("", "0", "off", "false", "no")
_V1_MODULE = "vllm.v1.sample.rejection_sampler"


def mode() -> str:
    """``"off"``, ``"sampler"`` or ``"fix"`` from the environment (see the module doc)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _ON:
        return "sampler"
    if value == "fix":
        return "fix"
    if value not in _OFF:
        raise ValueError(f"{ENV_VAR} must be one of 0/off, 1/on/sampler or fix; got {value!r}")
    allowed = [name.strip() for name in os.environ.get("VLLM_PLUGINS", "").split(",")]
    if value == "" and PLUGIN_NAME in allowed:
        return "sampler"
    return "off"


def register() -> None:
    """vLLM calls this in each of its processes; safe to call more than once."""
    chosen = mode()
    if chosen == "off":
        logger.debug("portable_verify plugin installed but not enabled (%s unset)", ENV_VAR)
        return
    module = importlib.import_module(_V1_MODULE)
    install_checked_expansion(module)
    current = module.rejection_sample
    original = getattr(current, "vllm_original", current)
    if chosen == "fix":
        if not getattr(current, "timed", False):
            module.rejection_sample = timed(original)
        logger.info("portable_verify: expansion probe only; vLLM's rejection sampler decides")
        return
    backend = os.environ.get(ENV_BACKEND, "auto")
    if not getattr(current, "portable_verify", False):
        module.rejection_sample = make_rejection_sample(original, backend)
    from portable_verify.integrations.vllm_v1.runner_v2 import install_v2_hook

    install_v2_hook(backend)
    logger.info("portable_verify decides speculative verification (backend %r)", backend)
