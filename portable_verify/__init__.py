"""portable_verify: exact, cheap verification of speculative-decoding drafts on any device.

>>> import portable_verify as pv
>>> pv.available_backends()  # doctest: +SKIP
['cpu', 'numpy', 'torch']
"""

from portable_verify.core.api import verify
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs, VerifyResult
from portable_verify.dispatch import (
    available_backends,
    backend_status,
    get_backend,
    register_backend,
)

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "VerifyInputs",
    "VerifyResult",
    "available_backends",
    "backend_status",
    "get_backend",
    "register_backend",
    "verify",
]
__version__ = "0.1.0"
