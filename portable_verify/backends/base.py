"""The one small protocol every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from portable_verify.core.types import VerifyInputs


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and the reason either way (shown by ``info``)."""

    available: bool
    reason: str

    def __bool__(self) -> bool:
        return self.available


class Backend(ABC):
    """A verifier implementation. Backends never import one another; dispatch composes them."""

    name: ClassVar[str]
    description: ClassVar[str]
    array_kind: ClassVar[Literal["torch", "numpy"]] = "torch"
    device_types: ClassVar[tuple[str, ...]] = ()
    """Torch device types this backend is the automatic choice for."""

    @abstractmethod
    def availability(self) -> Availability:
        """Cheap check (imports, drivers); must not raise."""

    @abstractmethod
    def run(self, inputs: VerifyInputs) -> tuple[Any, Any]:
        """``(token_ids int64 [B, K+1], num_accepted int64 [B])`` for validated inputs.

        ``inputs`` holds torch tensors for ``array_kind == "torch"`` and numpy arrays otherwise.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
