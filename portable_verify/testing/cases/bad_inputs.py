"""Bad and borderline inputs for ``verify``, as a table shared by the kit and tests/.

Each :class:`BadCase` is a valid call (:func:`valid_call`) with one thing broken, the argument
whose name the error message must contain, and the documented exception type (``ValueError`` for
bad values or shapes, ``TypeError`` for bad dtypes or types; docs/semantics.md, Validation).
:data:`ACCEPTED` lists borderline inputs the contract allows, so validation cannot pass the bad
cases simply by refusing everything. Every builder takes the ``device`` of the backend under
test (``dispatch.torch_device``); values are drawn on the CPU and moved, so every device sees the
same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from portable_verify.testing.cases.random_cases import on_device

B, K, V = 3, 2, 5
Call = dict[str, Any]


def valid_call(device: torch.device | str = "cpu") -> Call:
    """A small valid call using every optional input (fixed numbers, on ``device``)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, K + 1, V, generator=g)
    return on_device({
        "draft_token_ids": torch.tensor([[1, 2], [0, 4], [3, 3]]),
        "target_logits": logits,
        "draft_probs": torch.softmax(torch.randn(B, K, V, generator=g), -1),
        "num_draft_tokens": torch.tensor([2, 1, 0]),
        "temperature": torch.tensor([1.0, 0.0, 0.7]),
        "seed": torch.tensor([11, 12, 13]),
        "seed_offset": torch.tensor([0, 1, 2]),
    }, device)


def probs_call(device: torch.device | str = "cpu") -> Call:
    """:func:`valid_call` with probabilities as the target (temperature must then be 0/1)."""
    call = valid_call(device)
    call["target_probs"] = torch.softmax(call.pop("target_logits"), -1)
    call["temperature"] = None
    return call


Builder = Callable[..., Call]
"""``build(device="cpu") -> Call``."""


def _with(base: Builder, **changes: Any) -> Builder:
    """``base`` with ``changes``: a value, or a function of the call (its tensors are then on the
    call's device already); a tensor value is moved to the call's device."""

    def build(device: torch.device | str = "cpu") -> Call:
        call = base(device)
        for key, value in changes.items():
            if callable(value):
                value = value(call)
            elif isinstance(value, torch.Tensor):
                value = value.to(device)
            if value is _DROP:
                call.pop(key, None)
            else:
                call[key] = value
        return call

    return build


_DROP = object()
"""Marker: remove this argument from the call."""


def _elsewhere(name: str) -> Callable[[Call], torch.Tensor]:
    """Argument ``name`` moved to another device than the call's (meta; cpu for a meta call)."""
    return lambda call: call[name].to(_other(call[name].device))


def _other(device: torch.device) -> str:
    return "cpu" if device.type == "meta" else "meta"


def _set(name: str, index: tuple[int, ...], value: float) -> Callable[[Call], torch.Tensor]:
    """A copy of argument ``name`` with one entry replaced."""

    def edit(call: Call) -> torch.Tensor:
        t = call[name].clone()
        t[index] = value
        return t

    return edit


@dataclass(frozen=True)
class BadCase:
    label: str
    build: Builder
    argument: str  # must appear in the message
    error: type[Exception]


_nan, _inf = float("nan"), float("inf")
_logits = _with(valid_call)
_probs = probs_call
# Request 0 rejects its first draft for sure (p(x) = 0), so its draft row 0 is read in full.
_rejects = _with(_logits, target_logits=_set("target_logits", (0, 0, 1), -_inf))

BAD_CASES: tuple[BadCase, ...] = (
    # ranks and sizes
    BadCase("drafts rank 1", _with(_logits, draft_token_ids=torch.tensor([1, 2])),
            "draft_token_ids", ValueError),
    BadCase("logits rank 2", _with(_logits, target_logits=torch.zeros(B, V)),
            "target_logits", ValueError),
    BadCase("probs rank 4", _with(_probs, target_probs=torch.full((B, K + 1, V, 1), 1 / V)),
            "target_probs", ValueError),
    BadCase("draft_probs rank 2", _with(_logits, draft_probs=torch.full((B, V), 1 / V)),
            "draft_probs", ValueError),
    BadCase("batch mismatch", _with(_logits, target_logits=torch.zeros(B + 1, K + 1, V)),
            "target_logits", ValueError),
    BadCase("bonus row missing", _with(_logits, target_logits=torch.zeros(B, K, V)),
            "target_logits", ValueError),
    BadCase("draft_probs vocab mismatch",
            _with(_logits, draft_probs=torch.full((B, K, V - 1), 1 / (V - 1))),
            "draft_probs", ValueError),
    BadCase("draft_probs K mismatch",
            _with(_logits, draft_probs=torch.full((B, K + 1, V), 1 / V)), "draft_probs",
            ValueError),
    BadCase("num_draft_tokens length", _with(_logits, num_draft_tokens=torch.tensor([1, 1])),
            "num_draft_tokens", ValueError),
    BadCase("num_draft_tokens rank 2",
            _with(_logits, num_draft_tokens=torch.ones(B, 1, dtype=torch.int64)),
            "num_draft_tokens", ValueError),
    BadCase("temperature length", _with(_logits, temperature=torch.ones(B + 1)),
            "temperature", ValueError),
    BadCase("seed length", _with(_logits, seed=torch.tensor([1, 2])), "seed", ValueError),
    BadCase("seed_offset length", _with(_logits, seed_offset=torch.tensor([1, 2])),
            "seed_offset", ValueError),
    BadCase("uniforms shape", _with(_logits, uniforms=torch.full((B, K), 0.5)),
            "uniforms", ValueError),
    # dtypes and types
    BadCase("float ids", _with(_logits, draft_token_ids=torch.tensor([[1.0, 2], [0, 4], [3, 3]])),
            "draft_token_ids", TypeError),
    BadCase("bool ids", _with(_logits, draft_token_ids=torch.ones(B, K, dtype=torch.bool)),
            "draft_token_ids", TypeError),
    BadCase("int logits", _with(_logits, target_logits=torch.zeros(B, K + 1, V, dtype=torch.int64)),
            "target_logits", TypeError),
    BadCase("float counts", _with(_logits, num_draft_tokens=torch.tensor([1.0, 1, 1])),
            "num_draft_tokens", TypeError),
    BadCase("int temperature", _with(_logits, temperature=torch.tensor([1, 1, 1])),
            "temperature", TypeError),
    BadCase("float seed", _with(_logits, seed=torch.tensor([1.0, 2, 3])), "seed", TypeError),
    BadCase("float seed_offset", _with(_logits, seed_offset=torch.tensor([1.0, 2, 3])),
            "seed_offset", TypeError),
    BadCase("list ids", _with(_logits, draft_token_ids=[[1, 2], [0, 4], [3, 3]]),
            "draft_token_ids", TypeError),
    BadCase("list logits", _with(_logits, target_logits=lambda c: c["target_logits"].tolist()),
            "target_logits", TypeError),
    BadCase("int uniforms", _with(_logits, uniforms=torch.ones(B, K + 1, dtype=torch.int64)),
            "uniforms", TypeError),
    # values
    BadCase("id negative", _with(_logits, draft_token_ids=_set("draft_token_ids", (0, 0), -2)),
            "draft_token_ids", ValueError),
    BadCase("id == V", _with(_logits, draft_token_ids=_set("draft_token_ids", (0, 1), V)),
            "draft_token_ids", ValueError),
    BadCase("probs NaN", _with(_probs, target_probs=_set("target_probs", (1, 0, 2), _nan)),
            "target_probs", ValueError),
    BadCase("probs inf", _with(_probs, target_probs=_set("target_probs", (0, 2, 0), _inf)),
            "target_probs", ValueError),
    BadCase("probs negative", _with(_probs, target_probs=_set("target_probs", (2, 0, 0), -0.1)),
            "target_probs", ValueError),
    BadCase("probs sum 0.99", _with(_probs, target_probs=lambda c: c["target_probs"] * 0.99),
            "target_probs", ValueError),
    BadCase("draft_probs sum 1.01", _with(_rejects, draft_probs=lambda c: c["draft_probs"] * 1.01),
            "draft_probs", ValueError),
    BadCase("draft_probs NaN", _with(_rejects, draft_probs=_set("draft_probs", (0, 0, 3), _nan)),
            "draft_probs", ValueError),
    BadCase("logits NaN", _with(_logits, target_logits=_set("target_logits", (2, 0, 1), _nan)),
            "target_logits", ValueError),
    BadCase("logits +inf", _with(_logits, target_logits=_set("target_logits", (0, 2, 4), _inf)),
            "target_logits", ValueError),
    BadCase("logits row all -inf",
            _with(_logits, target_logits=lambda c: c["target_logits"].index_fill(1, torch.tensor(
                [0], device=c["target_logits"].device), -_inf)), "target_logits", ValueError),
    BadCase("temperature < 0 (scalar)", _with(_logits, temperature=-0.5), "temperature",
            ValueError),
    BadCase("temperature NaN (scalar)", _with(_logits, temperature=_nan), "temperature",
            ValueError),
    BadCase("temperature < 0 (tensor)", _with(_logits, temperature=torch.tensor([1.0, -1, 1])),
            "temperature", ValueError),
    BadCase("temperature NaN (tensor)", _with(_logits, temperature=torch.tensor([1.0, 1, _nan])),
            "temperature", ValueError),
    BadCase("num_draft_tokens < 0", _with(_logits, num_draft_tokens=torch.tensor([0, -1, 0])),
            "num_draft_tokens", ValueError),
    BadCase("num_draft_tokens > K", _with(_logits, num_draft_tokens=torch.tensor([0, K + 1, 0])),
            "num_draft_tokens", ValueError),
    BadCase("uniforms 0", _with(_logits, uniforms=torch.zeros(B, K + 1)), "uniforms", ValueError),
    BadCase("uniforms > 1", _with(_logits, uniforms=torch.full((B, K + 1), 1.5)), "uniforms",
            ValueError),
    BadCase("uniforms NaN", _with(_logits, uniforms=torch.full((B, K + 1), _nan)), "uniforms",
            ValueError),
    # combinations and names
    BadCase("both targets", _with(_logits, target_probs=lambda c: torch.softmax(
        c["target_logits"], -1)), "target_probs", ValueError),
    BadCase("neither target", _with(_logits, target_logits=_DROP), "target_logits", ValueError),
    BadCase("temperature with probs", _with(_probs, temperature=0.5), "temperature", ValueError),
    BadCase("bad method", _with(_logits, method="beam"), "method", ValueError),
    BadCase("unknown backend", _with(_logits, backend="no-such-backend"), "backend", ValueError),
    # devices (the meta device stands in for a second device on a CPU-only machine)
    BadCase("logits on another device", _with(_logits, target_logits=_elsewhere(
        "target_logits")), "target_logits", ValueError),
    BadCase("draft_probs on another device", _with(_logits, draft_probs=_elsewhere(
        "draft_probs")), "draft_probs", ValueError),
    BadCase("counts on another device", _with(_logits, num_draft_tokens=_elsewhere(
        "num_draft_tokens")), "num_draft_tokens", ValueError),
    BadCase("temperature on another device", _with(_logits, temperature=_elsewhere(
        "temperature")), "temperature", ValueError),
    BadCase("seed on another device", _with(_logits, seed=_elsewhere("seed")), "seed",
            ValueError),
    BadCase("seed_offset on another device", _with(_logits, seed_offset=_elsewhere(
        "seed_offset")), "seed_offset", ValueError),
    BadCase("uniforms on another device", _with(_logits, uniforms=lambda c: torch.full(
        (B, K + 1), 0.5, device=_other(c["target_logits"].device))), "uniforms", ValueError),
)


FULL_ONLY_CASES: tuple[BadCase, ...] = (
    BadCase("probs negative, read only at p(x)",
            _with(_probs, target_probs=_set("target_probs", (0, 1, 0), -0.1)), "target_probs",
            ValueError),
    BadCase("probs sum 0.99 in a greedy row",
            _with(_probs, target_probs=lambda c: c["target_probs"] * 0.99, temperature=0.0),
            "target_probs", ValueError),
    BadCase("logits NaN after the first rejection",
            _with(_rejects, target_logits=_set("target_logits", (0, 2, 4), _nan)),
            "target_logits", ValueError),
    BadCase("draft_probs sum 1.01, nothing rejected",
            _with(_logits, draft_probs=lambda c: c["draft_probs"] * 1.01, temperature=0.0),
            "draft_probs", ValueError),
    BadCase("draft_probs NaN in an unread row",
            _with(_rejects, draft_probs=_set("draft_probs", (0, 1, 3), _nan)), "draft_probs",
            ValueError),
)
"""Bad values the default level does not read (docs/semantics.md, Validation levels): only
``validate="full"`` must refuse them."""


ACCEPTED: tuple[tuple[str, Builder], ...] = (
    ("valid logits call", valid_call),
    ("valid probs call", probs_call),
    ("-1 padding beyond num_draft_tokens",
     _with(_logits, draft_token_ids=torch.tensor([[1, 2], [0, -1], [-1, -1]]))),
    ("ids >= V beyond num_draft_tokens",
     _with(_logits, draft_token_ids=torch.tensor([[1, 2], [0, V], [V + 7, V]]))),
    ("-inf logits (not a whole row)",
     _with(_logits, target_logits=_set("target_logits", (0, 0, 1), -_inf))),
    ("probs sum within 1e-3", _with(_probs, target_probs=lambda c: c["target_probs"] * 1.0009)),
    ("half probs sum within 1e-2",
     _with(_probs, target_probs=lambda c: (c["target_probs"] * 1.008).half())),
    ("temperature 1 with probs", _with(_probs, temperature=1.0)),
    ("temperature 0 with probs", _with(_probs, temperature=0.0)),
    ("numpy scalar temperature", _with(_logits, temperature=np.float32(0.7))),
    ("uniforms exactly 1", _with(_logits, uniforms=torch.ones(B, K + 1))),
    ("bfloat16 logits", _with(_logits, target_logits=lambda c: c["target_logits"].bfloat16())),
    ("numpy inputs", lambda device="cpu": {k: v.numpy() if isinstance(v, torch.Tensor) else v
                                           for k, v in valid_call().items()}),
)
"""Borderline inputs the contract allows: each must verify without raising (the numpy inputs
are host arrays on every device: only host backends are handed them)."""
