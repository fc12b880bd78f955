"""The torch family as a backend: eager torch on the inputs' device, chains and trees."""

from __future__ import annotations

import torch

from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.backends.torch.chain import CHAIN_RULES, verify_torch
from portable_verify.backends.torch.tree import TREE_RULES, verify_tree_torch
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyInputs


class TorchBackend(Backend):
    """Eager torch on the device the inputs live on (``torch:cpu``, ``torch:cuda``, ...)."""

    name = "torch"
    traits = BackendTraits(checks_what_it_reads=True,  # validate=True rides on its passes
                           layouts=(methods.CHAIN, methods.TREE),
                           chain_rules=tuple(CHAIN_RULES), tree_rules=tuple(TREE_RULES))
    description = "device-generic eager torch (numpy argmax fast path on CPU float32)"
    devices = ("cpu", "cuda", "xpu")

    @classmethod
    def device_for(cls, torch_device_type: str) -> str:
        return torch_device_type

    def torch_device_type(self) -> str:
        return self.device or "cpu"

    def availability(self) -> Availability:
        module = getattr(torch, self.torch_device_type(), None)
        try:
            present = self.device == "cpu" or bool(module is not None and module.is_available())
        except Exception:  # a broken driver install must not break backend listing
            present = False
        if not present:
            return Availability(False, f"torch.{self.device}.is_available() is False "
                                       f"(torch {torch.__version__})")
        return Availability(True, f"torch {torch.__version__} on {self.device}")

    def run(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return verify_torch(inputs)

    def run_tree(self, inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return verify_tree_torch(inputs)
