"""The numpy reference as a backend: the executable specification, chains and trees."""

from __future__ import annotations

import numpy as np

from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.backends.numpy.chain import verify_reference
from portable_verify.backends.numpy.tree import verify_tree_reference
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyInputs


class NumpyReferenceBackend(Backend):
    """The executable specification; slow, exact, always available."""

    name = "numpy"
    description = "numpy reference implementation (the executable specification)"
    array_kind = "numpy"
    # A Python loop per request: full conformance sizes would mostly compare it with itself.
    traits = BackendTraits(is_reference=True, full_conformance_sizes=False,
                           layouts=(methods.CHAIN, methods.TREE),
                           chain_rules=("rejection", "typical", "block"),
                           tree_rules=("rejection", "typical", "traversal"))

    def availability(self) -> Availability:
        return Availability(True, "numpy is a core dependency")

    def run(self, inputs: VerifyInputs) -> tuple[np.ndarray, np.ndarray]:
        return verify_reference(inputs)

    def run_tree(self, inputs: TreeInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return verify_tree_reference(inputs)
