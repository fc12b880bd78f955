"""What one chain launch pair reads, described instead of built: :class:`ChainSpec`.

Why: on a GPU every torch op the host runs before the kernels is a launch (the row maps, the
``-1`` cut, the seeds' hash cost ~150 of them per call). The kernels compute all of it from
what the caller passed, so the host only describes the call's layout here (shape arithmetic,
no device op) and :func:`portable_verify.backends.triton.chain.launch` allocates the outputs
and launches twice. The codes below are the kernels' constexpr switches, named once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from portable_verify.core import methods, rng
from portable_verify.core.arguments import FLOAT32_MAX, SEED_RANGE, to_tensor
from portable_verify.core.layout import FlatLayout
from portable_verify.core.types import VerifyCall, VerifyInputs, VerifyOptions, check_shapes

SIZE_CODES = {None: 0, "counts": 1, "cu": 2, "cu_inclusive": 3}
"""``_layout_kernel``'s ``SIZES``: K each, counts ``[B]``, offsets ``[B+1]`` from 0, inclusive
offsets ``[B]`` (vLLM v1)."""
TEMP_CODES = {"scalar": 0, "values": 1, "marks": 2}
"""``TEMP``: one float for the batch, float ``[B]`` values, or ``[B]`` values that only mark
greedy rows (0) in logits an engine has already tempered."""
U_CODES = {None: 0, "given": 1, "seeds": 2, "seed_int": 3}
"""``U_SRC``: no uniforms (every row greedy), the caller's, the hash of int64 ``[B]`` seeds, or
of the row seeds of one int seed."""
OFFSET_CODES = {"scalar": 0, "values": 1, "at_first_row": 2}
"""``OFFSETS``: one int, int ``[B]``, or ``[R]`` values read at each request's first row."""
RULE_CODES = {"rejection": 0, "typical": 1, "block": 2}
"""``_decide_kernel``'s ``RULE``: the sampled rows' rule (all-greedy calls pass 0, unread);
a code past the table is flagged by the kernel, never run as another rule. Its keys are the
backend's declared chain rules."""
TREE_RULE_CODES = {"rejection": 0, "typical": 1, "traversal": 2}
"""``_tree_kernel``'s ``RULE`` (triton/tree.py): its keys are the declared tree rules. Here,
beside the chain's, so the backend reads both without importing Triton."""

LAYOUT_BITS = (("SIZES", 2), ("FLAT", 1), ("COUNT_MINUS", 1), ("DRAFT_SHIFT", 1),
               ("BONUS_ROWS", 1), ("ROWS_GIVEN", 1), ("QROWS_GIVEN", 1))
"""``_layout_kernel``'s ``LAYOUT`` constexpr, low bits first (the kernel unpacks it)."""
SOURCE_BITS = (("TEMP", 2), ("U_SRC", 2), ("OFFSETS", 2), ("REQ_MAP", 1))
"""``_layout_kernel``'s ``SOURCES``: where temperatures, uniforms and offsets come from."""
STATS_BITS = (("NEED_ARGMAX", 1), ("NEED_SOFTMAX", 1), ("NEED_ENTROPY", 1), ("SPLIT", 1))
"""``_layout_kernel``'s ``STATS``: which row statistics the decision reads."""
DECIDE_BITS = (("IS_LOGITS", 1), ("HAS_Q", 1), ("HAS_U", 1), ("HAS_GREEDY", 1),
               ("HAS_BONUS", 1), ("SPLIT", 1), ("SPLIT_DRAW", 1))
"""``_decide_kernel``'s ``FLAGS``."""


def pack(bits: tuple[tuple[str, int], ...], **values: int | bool) -> int:
    """One constexpr from named fields (Triton compiles one variant per value)."""
    out, shift = 0, 0
    for name, width in bits:
        value = int(values.pop(name))
        assert 0 <= value < 1 << width, (name, value)
        out |= value << shift
        shift += width
    assert not values, values
    return out


def rule_code(rule: str | None, layout: str = methods.CHAIN, backend: str = "triton") -> int:
    """The kernel's code of a sampled rule of ``layout`` (the host's one lookup; a miss is
    ``methods.unknown_rule``, raised before any launch). ``None`` (every row greedy): 0."""
    if rule is None:
        return 0
    try:
        return (TREE_RULE_CODES if layout == methods.TREE else RULE_CODES)[rule]
    except KeyError:
        raise methods.unknown_rule(rule, backend, layout) from None


@dataclass(slots=True)
class ChainSpec:
    """One chain call as the two kernels read it (tensors as the caller gave them)."""

    b: int
    k: int
    target: torch.Tensor  # float [R, V], unit stride along V
    is_logits: bool
    drafts: torch.Tensor  # int [B, K] (padded) or [N] (flat)
    flat: bool
    sizes: torch.Tensor | None  # int counts [B] or offsets, per ``sizes_kind``
    sizes_kind: str | None
    options: VerifyOptions
    all_greedy: bool
    none_greedy: bool
    temperature: float | torch.Tensor = 1.0
    temp_kind: str = "scalar"
    count_minus: int = 0
    draft_shift: int = 0
    bonus_rows: bool = True
    rows: torch.Tensor | None = None  # int [B, K+1]: the caller's map (rows door)
    q: torch.Tensor | None = None  # float [Rq, V]
    q_rows: torch.Tensor | None = None  # int [B, K]: the caller's map (rows door)
    request_map: torch.Tensor | None = None  # int [B]: index into temperature and seed
    uniforms: torch.Tensor | None = None  # float [B, K+1]
    seeds: torch.Tensor | int | None = None
    offsets: torch.Tensor | int = 0
    offset_kind: str = "scalar"
    bonus: torch.Tensor | None = None  # int [B]
    tokens_dtype: torch.dtype = torch.int64
    emitted_dtype: torch.dtype = torch.int64

    def check_shapes(self) -> None:
        """The shapes the kernels index by, checked on the host (metadata only, no value read):
        with ``validate=False`` a mismatch would otherwise be a read out of bounds."""
        b, k = self.b, self.k
        per_request = [("temperature", self.temperature, self.request_map is None),
                       ("seed", self.seeds, self.request_map is None),
                       ("seed_offset", self.offsets, self.offset_kind == "values"),
                       ("bonus_token_ids", self.bonus, True),
                       ("request_map", self.request_map, True)]
        sizes_len = {"counts": b, "cu": b + 1, "cu_inclusive": b}.get(self.sizes_kind or "", 0)
        expected = [(name, x, (b,)) for name, x, exact in per_request
                    if exact and isinstance(x, torch.Tensor)]
        expected += [("uniforms", self.uniforms, (b, k + 1)), ("target_rows", self.rows,
                                                               (b, k + 1)),
                     ("draft_rows", self.q_rows, (b, k)),
                     ("num_draft_tokens", self.sizes, (sizes_len,))]
        if not self.flat:
            expected.append(("draft_token_ids", self.drafts, (b, k)))
        for name, x in (("temperature", self.temperature), ("seed", self.seeds),
                        ("seed_offset", self.offsets)):
            if isinstance(x, torch.Tensor) and (x.dim() != 1 or x.shape[0] == 0) and b > 0:
                raise ValueError(f"{name} must be a [B] tensor, got shape {tuple(x.shape)}")
        check_shapes([(name, (x, shape)) for name, x, shape in expected], b, k, self.target,
                     self.q)

    @property
    def u_kind(self) -> str | None:
        if self.all_greedy:
            return None
        if self.uniforms is not None:
            return "given"
        return "seed_int" if isinstance(self.seeds, int) else "seeds"


def _tensor(name: str, x: Any, device: torch.device) -> torch.Tensor | None:
    t = to_tensor(name, x)
    return None if t is None else t.to(device)  # no-op on the target's device


def _rows2d(x: torch.Tensor, v: int) -> torch.Tensor:
    x = x.reshape(-1, v)  # a view for the usual layouts
    return x if x.stride(-1) == 1 else x.contiguous()


def _temperature(temperature: Any, rule: str | None, device: torch.device
                 ) -> tuple[float | torch.Tensor, str, bool, bool]:
    """``(value, kind, all_greedy, none_greedy)`` as ``arguments.temperatures`` reads them."""
    if rule is None:
        return 0.0, "scalar", True, False
    if temperature is None or isinstance(temperature, (int, float, np.floating, np.integer)):
        t = 1.0 if temperature is None else float(temperature)
        t = float(np.float32(t)) if t <= FLOAT32_MAX else math.inf
        return t, "scalar", t == 0.0, t != 0.0
    return _tensor("temperature", temperature, device), "values", False, False


def _randomness(spec: ChainSpec, seed: Any, seed_offset: Any, device: torch.device) -> None:
    """The call's seeds and offsets: an unseeded call draws its seeds (one launch)."""
    if spec.all_greedy or spec.uniforms is not None:
        return
    if seed is None:
        spec.seeds = torch.randint(0, SEED_RANGE, (spec.b,), dtype=torch.int64, device=device)
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        spec.seeds = int(seed)
    else:
        spec.seeds = _tensor("seed", seed, device)
    if seed_offset is None or isinstance(seed_offset, (int, np.integer)):
        spec.offsets = int(seed_offset or 0)
    else:
        spec.offsets = _tensor("seed_offset", seed_offset, device)
        spec.offset_kind = "values"


def from_call(call: VerifyCall) -> ChainSpec:
    """The spec of a padded, rows or flat (``call.flat``) call, from the caller's arrays."""
    target = to_tensor(call.target_name, call.target)
    device = target.device
    v = target.shape[-1]
    drafts = _tensor("draft_token_ids", call.drafts, device)
    flat: FlatLayout | None = call.flat
    temp, temp_kind, all_greedy, none_greedy = _temperature(call.temperature, call.rule, device)
    if flat is not None:
        b, k = flat.batch, flat.width
        sizes, sizes_kind = _tensor("num_draft_tokens", flat.sizes, device), flat.kind
    else:
        b, k = drafts.shape
        sizes = _tensor("num_draft_tokens", call.counts, device)
        sizes_kind = None if sizes is None else "counts"
    q = None if call.draft_probs is None else _rows2d(
        to_tensor("draft_probs", call.draft_probs).to(device), v)
    bonus = _tensor("bonus_token_ids", call.bonus, device)
    if bonus is not None and bonus.dim() == 2:
        bonus = bonus[:, 0]
    spec = ChainSpec(
        b=b, k=k, target=_rows2d(target, v), is_logits=call.is_logits, drafts=drafts,
        flat=flat is not None, sizes=sizes, sizes_kind=sizes_kind, options=call.options,
        all_greedy=all_greedy, none_greedy=none_greedy, temperature=temp, temp_kind=temp_kind,
        rows=_tensor("target_rows", call.rows, device), q=q,
        q_rows=_tensor("draft_rows", call.draft_rows, device),
        uniforms=_tensor("uniforms", call.uniforms, device), bonus=bonus)
    if flat is not None:
        spec.count_minus, spec.draft_shift = flat.count_minus, flat.draft_shift
        spec.bonus_rows = flat.bonus_rows
        spec.request_map = _tensor("request_map", flat.request_map, device)
        if flat.temperature_marks and temp_kind == "values":
            spec.temp_kind = "marks"
        spec.tokens_dtype, spec.emitted_dtype = flat.tokens_dtype, flat.emitted_dtype
    _randomness(spec, call.seed, call.seed_offset, device)
    if flat is not None and flat.offsets_at_first_row and spec.offset_kind == "values":
        spec.offset_kind = "at_first_row"
    spec.check_shapes()
    return spec


def from_inputs(inputs: VerifyInputs) -> ChainSpec:
    """The spec of completed :class:`VerifyInputs` (the validated path): the rows door's."""
    b, k = inputs.draft_token_ids.shape
    return ChainSpec(
        b=b, k=k, target=_rows2d(inputs.target, inputs.target.shape[-1]),
        is_logits=inputs.target_is_logits, drafts=inputs.draft_token_ids, flat=False,
        sizes=inputs.num_draft_tokens, sizes_kind="counts", options=inputs.options,
        all_greedy=inputs.all_greedy, none_greedy=inputs.none_greedy,
        temperature=inputs.temperature, temp_kind="values", rows=inputs.target_rows,
        q=None if inputs.draft_probs is None else _rows2d(inputs.draft_probs,
                                                          inputs.target.shape[-1]),
        q_rows=inputs.draft_rows, uniforms=inputs.uniforms)


def row_seed_words(seed: int) -> tuple[int, int]:
    """The two 32-bit words ``_layout_kernel`` derives each row's seed from (``rng``)."""
    return rng.row_seed_key(seed), rng.row_seed_key(seed) ^ rng.COUNTER_SALT
