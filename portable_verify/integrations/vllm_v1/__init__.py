"""portable_verify inside vLLM v1 engines, as an opt-in ``vllm.general_plugins`` plugin.

Enable with ``PORTABLE_VERIFY_VLLM=1`` in the environment of ``vllm serve`` or of the process
that builds ``vllm.LLM`` (docs/integrations.md). Modules, each with one job:

* :mod:`.sampler`: the replacement of vLLM's ``rejection_sample`` (V1 model runner, used on
  CPU and wherever the V2 runner is off);
* :mod:`.runner_v2`: the same decision behind the V2 runner's ``custom_sampler`` seam;
* :mod:`.expansion`: the probe for (and fix of) vLLM-CPU's broken per-token expansion;
* :mod:`.constraints`: the guard for vLLM-CPU's top-k mask on steps without draft rows;
* :mod:`.plugin`: the entry point that reads the environment and installs the above.

Importing this package does not import vLLM.
"""

from portable_verify.integrations.vllm_v1.expansion import expand_batch_to_tokens, probe
from portable_verify.integrations.vllm_v1.plugin import ENV_VAR, mode, register
from portable_verify.integrations.vllm_v1.runner_v2 import verify_v2_step
from portable_verify.integrations.vllm_v1.sampler import (
    make_rejection_sample,
    verify_spec_decode_step,
)

__all__ = [
    "ENV_VAR",
    "expand_batch_to_tokens",
    "make_rejection_sample",
    "mode",
    "probe",
    "register",
    "verify_spec_decode_step",
    "verify_v2_step",
]
