"""portable_verify: exact, cheap verification of speculative-decoding drafts on any device.

>>> import portable_verify as pv
>>> pv.available_backends()  # doctest: +SKIP
['numpy', 'openvino:CPU', 'torch:cpu', 'triton:interpreter']
"""

from portable_verify.api import ops as _ops  # noqa: F401 - the custom ops, for torch.compile
from portable_verify.api.call import decide as verify_call
from portable_verify.api.call import lean_calls
from portable_verify.api.padded import verify
from portable_verify.api.ragged import verify_ragged
from portable_verify.api.rows import verify_rows
from portable_verify.api.tree import verify_tree
from portable_verify.core.metrics import MetricsAccumulator, compute_metrics, metrics_to_python
from portable_verify.core.tree import TreeInputs, TreeResult, tree_attention_mask
from portable_verify.core.types import (
    INVALID_DRAFT_TOKEN_ID,
    PLACEHOLDER_TOKEN_ID,
    TypicalParams,
    VerifyCall,
    VerifyInputs,
    VerifyOptions,
    VerifyResult,
)
from portable_verify.dispatch import (
    available_backends,
    backend_status,
    get_backend,
    register_backend,
    unregister_backend,
)
from portable_verify.warmup import warm_up

__all__ = [
    "INVALID_DRAFT_TOKEN_ID",
    "PLACEHOLDER_TOKEN_ID",
    "MetricsAccumulator",
    "TreeInputs",
    "TreeResult",
    "TypicalParams",
    "VerifyCall",
    "VerifyInputs",
    "VerifyOptions",
    "VerifyResult",
    "available_backends",
    "backend_status",
    "compute_metrics",
    "get_backend",
    "lean_calls",
    "metrics_to_python",
    "register_backend",
    "tree_attention_mask",
    "unregister_backend",
    "verify",
    "verify_call",
    "verify_ragged",
    "verify_rows",
    "verify_tree",
    "warm_up",
]
__version__ = "0.1.0"
