"""The data that crosses the front door: canonical inputs for backends and the result."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from portable_verify.core import methods
from portable_verify.core.metrics import compute_metrics

PLACEHOLDER_TOKEN_ID = -1
"""Fills ``token_ids`` after a row's emitted tokens."""

INVALID_DRAFT_TOKEN_ID = -1
"""A draft slot with no proposal (serving engines pad with it): it ends the request's drafts."""

METHODS: tuple[str, ...] = methods.names()
"""Every method's name (the table in :mod:`portable_verify.core.methods` says what each does)."""


@dataclass(frozen=True)
class TypicalParams:
    """Medusa's typical-acceptance threshold ``min(eps, alpha * exp(-H(p)))``.

    The defaults are vLLM's (``posterior_threshold``, ``posterior_alpha``). Both must be finite
    and ``>= 0``: a negative threshold would accept tokens the target gives probability 0.
    """

    eps: float = 0.09
    alpha: float = 0.3

    def __post_init__(self) -> None:
        for field_name, argument in (("eps", "typical_eps"), ("alpha", "typical_alpha")):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{argument} must be a real number, got {value!r}")
            try:
                number = float(value)
            except OverflowError:  # an int beyond float range: not finite
                number = math.inf
            if not (math.isfinite(number) and number >= 0):
                raise ValueError(f"{argument} must be finite and >= 0, got {value!r:.40}")
            object.__setattr__(self, field_name, number)

    def threshold(self, entropy: Any, xp: Any = np) -> Any:
        """``min(eps, alpha * exp(-entropy))`` elementwise, for numpy (``xp=np``: arrays or
        scalars) or torch (``xp=torch``) entropies, in their dtype.

        Why here: the rule is written once per array family, so a backend asks the value for
        its threshold instead of reading its fields (a new option changes this method only).
        """
        scaled = xp.exp(-entropy) * self.alpha
        return np.minimum(scaled, self.eps) if xp is np else scaled.clamp(max=self.eps)

    def kernel_scalars(self) -> tuple[float, float]:
        """``(eps, alpha)``: the order in which compiled kernels take the parameters (numba's
        options record, Triton's scalar arguments, OpenVINO's ``scalars`` graph record), whose
        own code then applies :meth:`threshold`'s rule."""
        return self.eps, self.alpha

    def __str__(self) -> str:
        return f"eps={self.eps:g} alpha={self.alpha:g}"


DEFAULT_TYPICAL = TypicalParams()


@dataclass(frozen=True)
class VerifyOptions:
    """How sampled rows are decided: the method and its parameters, as one value.

    Why one value: it travels unchanged from the front door through dispatch into every
    backend (and, packed, into compiled kernels), so a new method or option is a field here and
    a branch where it is read, not a parameter threaded through every layer. Engines build it
    once (the vLLM plugin at start-up) and pass it on every step.
    """

    method: str = "auto"
    typical: TypicalParams = DEFAULT_TYPICAL
    sampled_method: str | None = field(init=False, repr=False, compare=False)
    """The rule of the rows that sample (the table's ``rule``: ``auto`` names rejection;
    ``greedy``, whose rows never sample, None), read from the table once: it is read on
    every call."""

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in methods.TABLE:
            raise ValueError(f"method must be one of {methods.names()}, got {self.method!r}")
        if not isinstance(self.typical, TypicalParams):
            raise TypeError(f"typical must be a TypicalParams, got {self.typical!r}")
        object.__setattr__(self, "sampled_method", methods.TABLE[self.method].rule)


DEFAULT_OPTIONS = VerifyOptions()


def options_alone(options: Any, method: Any, typical_eps: Any, typical_alpha: Any,
                  default_method: str = "auto") -> VerifyOptions:
    """``options``, checked to be a :class:`VerifyOptions` given without the keywords it
    stands for (a caller passing both would have one of them silently ignored)."""
    if not isinstance(options, VerifyOptions):
        raise TypeError(f"options must be a VerifyOptions, got {type(options).__name__}")
    if (method != default_method or typical_eps is not DEFAULT_TYPICAL.eps
            or typical_alpha is not DEFAULT_TYPICAL.alpha):
        raise ValueError("give the method and typical parameters either as options= or as "
                         "method= / typical_eps= / typical_alpha=, not both")
    return options


@dataclass(frozen=True)
class VerifyInputs:
    """Validated, canonical inputs handed to a backend (torch tensors, or numpy via :meth:`numpy`).

    The target is stored as flat rows plus a row map so the padded layout ``[B, K+1, V]`` and the
    ragged layout ``[N+B, V]`` serving engines use reach backends without a copy.
    """

    draft_token_ids: Any  # int64 [B, K]; entries at j >= n are never read
    num_draft_tokens: Any  # int64 [B], 0 <= n <= K
    target: Any  # float [R, V] logits or probabilities
    target_rows: Any  # int64 [B, K+1]: row of `target` for (request, position); j > n -> row of n
    target_is_logits: bool
    draft_probs: Any | None  # float [Rq, V] or None (one-hot draft)
    draft_rows: Any | None  # int64 [B, K] row of `draft_probs`, or None
    temperature: Any  # float32 [B]; 0 marks a greedy row
    all_greedy: bool  # known on the host: every row is greedy (no softmax, no randomness)
    none_greedy: bool  # known on the host: no row is greedy (skip the argmax pass)
    uniforms: Any | None  # float32 [B, K+1] in (0, 1]; None when all_greedy
    options: VerifyOptions = DEFAULT_OPTIONS
    # The default level of validation rides on the backend's own passes (docs/semantics.md,
    # Validation): set for backends whose ``traits.checks_what_it_reads`` is True.
    check_read_values: bool = False

    @property
    def sampled_method(self) -> str | None:
        """The rule of the rows that sample (see :attr:`VerifyOptions.sampled_method`)."""
        return self.options.sampled_method

    @property
    def batch_size(self) -> int:
        return int(self.draft_token_ids.shape[0])

    @property
    def num_positions(self) -> int:
        """``K``: the padded number of draft positions."""
        return int(self.draft_token_ids.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[-1])

    def check_layout(self) -> None:
        """Shapes every backend indexes by, checked on the host (free: no values are read).

        The front door guarantees them when it validates; with ``validate=False`` a mismatch
        would otherwise be an out-of-bounds read inside a kernel or a compiled graph.
        """
        b, k = self.batch_size, self.num_positions
        expected = {
            "num_draft_tokens": (self.num_draft_tokens, (b,)),
            "temperature": (self.temperature, (b,)),
            "target_rows": (self.target_rows, (b, k + 1)),
            "uniforms": (self.uniforms, (b, k + 1)),
            "draft_rows": (self.draft_rows, (b, k)),
        }
        check_shapes(list(expected.items()), b, k, self.target, self.draft_probs)


def check_shapes(expected: list[tuple[str, tuple[Any, tuple[int, ...]]]], b: int, k: int,
                 target: Any, q: Any) -> None:
    """Each named array's shape, then the rows the target and ``q`` must hold, on the host
    (metadata only): a mismatch would otherwise be an out-of-bounds read in a kernel."""
    for name, (array, shape) in expected:
        if array is not None and tuple(array.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(array.shape)}")
    if b > 0 and target.shape[0] == 0:
        raise ValueError("the target has no rows for its B > 0 requests")
    if q is not None and b * k > 0 and q.shape[0] == 0:
        raise ValueError("draft_probs has no rows for the drafts of its B > 0 requests")
    if q is not None and q.shape[-1] != target.shape[-1]:
        raise ValueError(f"draft_probs must have V = {target.shape[-1]} columns, got "
                         f"{q.shape[-1]}")


@dataclass(slots=True, eq=False)
class VerifyCall:
    """One call as the front doors read it: the caller's arrays in one layout, and its options.

    This is what the parser (``api/parse.py``) hands on: flat target rows plus row maps, with
    the padded layout's maps left implicit (``None``) so that a plain call builds no array it
    does not need. ``host`` says every array is a C-contiguous host numpy array of the canonical
    dtype (int64 ids, float32 values): a backend that declares ``traits.host_calls`` decides such
    a call directly (``Backend.run_call``); every other call is completed into
    :class:`VerifyInputs` first (``api/call.py``). Not frozen: it is built on every call, and a
    frozen dataclass sets each field through ``object.__setattr__``.
    """

    drafts: Any  # int64 [B, K]; slots j >= n_i are never read
    counts: Any | None  # int64 [B] the caller's draft counts, or None (K each)
    target: Any  # float [R, V] flat rows; a padded call's may stay [B, K+1, V] (rows None)
    target_name: str  # "target_logits" or "target_probs": the caller's argument
    rows: Any | None  # int64 [B, K+1], or None: row (i, j) = i*(K+1) + min(j, n_i)
    draft_probs: Any | None  # float [Rq, V], or None (one-hot drafts)
    draft_rows: Any | None  # int64 [B, K], or None with draft_probs: row (i, j) = i*K + j
    temperature: Any  # None (= 1), a float (checked, >= 0), or float [B]
    seed: Any  # None, an int, or int [B]
    seed_offset: Any  # None, an int, or int [B]
    uniforms: Any | None  # float32 [B, K+1]
    bonus: Any | None  # int64 [B]
    options: VerifyOptions
    rule: str | None  # the sampled rows' rule; None: every row is greedy (known on the host)
    validate: bool | str
    backend: str
    host: bool
    return_numpy: bool
    flat: Any = None  # core.layout.FlatLayout: drafts flat [N], maps left to a lean backend

    @property
    def is_logits(self) -> bool:
        return self.target_name == "target_logits"


@dataclass(frozen=True)
class VerifyResult:
    """What one verification call decided, per request.

    ``token_ids`` holds the ``num_emitted`` tokens of each row (accepted drafts, then one
    recovered or bonus token) followed by ``PLACEHOLDER_TOKEN_ID``. Arrays have the caller's
    type (torch tensor on the inputs' device, or numpy array).
    """

    token_ids: Any  # int64 [B, K+1]
    num_accepted: Any  # int64 [B]
    num_emitted: Any  # int64 [B]
    num_draft_tokens: Any  # int64 [B]

    @classmethod
    def _of(cls, token_ids: Any, num_accepted: Any, num_emitted: Any,
            num_draft_tokens: Any) -> VerifyResult:
        """The same object as the constructor builds, at half its cost (a frozen dataclass sets
        each field through ``object.__setattr__``): for plain host calls, where a whole call
        costs a few microseconds."""
        result = object.__new__(cls)
        result.__dict__.update(token_ids=token_ids, num_accepted=num_accepted,
                               num_emitted=num_emitted, num_draft_tokens=num_draft_tokens)
        return result

    def metrics(self) -> dict[str, Any]:
        """Causal acceptance counters of this call (see :mod:`portable_verify.core.metrics`)."""
        return compute_metrics(self)


def _host_field(name: str) -> property:
    def read(self: HostTensorResult) -> Any:
        cache = self.__dict__
        tensor = cache.get(name)
        if tensor is None:
            import torch  # core/types itself needs no torch until a host result is read

            tensor = cache[name] = torch.from_numpy(cache["_host"][name])
        return tensor

    def write(self: HostTensorResult, value: Any) -> None:  # the dataclass __init__ (replace)
        self.__dict__[name] = value

    return property(read, write, doc=f"``{name}`` as a torch tensor (made on first read)")


class HostTensorResult(VerifyResult):
    """A :class:`VerifyResult` for torch callers whose arrays the host kernel filled: each field
    becomes a tensor (``torch.from_numpy``, no copy) when it is first read.

    Why: four ``from_numpy`` calls cost more than a bare ``torch.argmax`` at (1, 2, 64), and a
    caller usually reads two of the fields. It is a ``VerifyResult`` in every other way
    (equality, ``repr``, ``metrics``).
    """

    token_ids = _host_field("token_ids")
    num_accepted = _host_field("num_accepted")
    num_emitted = _host_field("num_emitted")
    num_draft_tokens = _host_field("num_draft_tokens")

    @classmethod
    def of_host(cls, token_ids: Any, num_accepted: Any, num_emitted: Any,
                num_draft_tokens: Any) -> HostTensorResult:
        result = object.__new__(cls)
        result.__dict__["_host"] = {"token_ids": token_ids, "num_accepted": num_accepted,
                                    "num_emitted": num_emitted,
                                    "num_draft_tokens": num_draft_tokens}
        return result
