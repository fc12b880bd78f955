"""The compiled CPU backend: one numba kernel per call (``backends/numba_kernels.py``).

Why a backend of its own: on CPU the torch backend's cost at batch 1-8 is its ~100 array calls
(docs/benchmarks.md); here the whole decision, its default-level checks and the uniforms are
one compiled call. It is what ``backend="auto"`` picks for CPU tensors when numba is
installed (the ``cpu`` extra). The kernel only flags an invalid value; the words of the error
come from the torch backend, rerun by dispatch on the same inputs (one source of messages).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from portable_verify.backends.base import (
    Availability,
    Backend,
    BackendTraits,
    HostKernel,
    ReadValueError,
)
from portable_verify.core.types import VerifyInputs
from portable_verify.core.validation import PROB_SUM_ATOL, PROB_SUM_ATOL_HALF

HALF = (torch.float16, torch.bfloat16)

try:  # numba is optional (the `cpu` extra): without it the backend reports itself unavailable
    import numba

    from portable_verify.backends import numba_kernels as kernels
except ImportError:
    kernels = None

EMPTY_I64_1 = np.empty(0, dtype=np.int64)
EMPTY_I64_2 = np.empty((0, 0), dtype=np.int64)
EMPTY_F32_1 = np.empty(0, dtype=np.float32)
EMPTY_F32_2 = np.empty((0, 0), dtype=np.float32)

ARGMAX_IN_NUMPY = 4096
"""Greedy rows above this many target values take numpy's argmax (SIMD, ~6x a scalar loop)
before the kernel; below it the kernel's own loop is cheaper than one more call."""


def host_array(t: Any, dtype: Any) -> np.ndarray:
    """A C-contiguous numpy array of ``dtype`` viewing ``t`` where possible (a copy otherwise)."""
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else t
    return np.ascontiguousarray(a, dtype=dtype)


def _outputs(b: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The result's arrays, filled by the kernel (token ids, accepted, emitted, counts)."""
    return (np.empty((b, k + 1), dtype=np.int64), np.empty(b, dtype=np.int64),
            np.empty(b, dtype=np.int64), np.empty(b, dtype=np.int64))


def decide_arrays(target: np.ndarray | torch.Tensor, is_logits: bool,
                  drafts: np.ndarray | torch.Tensor, *,
                  rows: np.ndarray = EMPTY_I64_2, counts: np.ndarray = EMPTY_I64_1,
                  q: np.ndarray = EMPTY_F32_2, qrows: np.ndarray = EMPTY_I64_2,
                  temps: np.ndarray = EMPTY_F32_1, temp_scalar: float = 1.0,
                  all_greedy: bool = False, typical: bool = False, eps: float = 0.0,
                  alpha: float = 0.0, uniforms: np.ndarray = EMPTY_F32_2,
                  seeds: np.ndarray = EMPTY_I64_1, seed_scalar: int = 0, seed_mode: int = 1,
                  offsets: np.ndarray = EMPTY_I64_1, offset_scalar: int = 0,
                  bonus: np.ndarray = EMPTY_I64_1, check: bool = True,
                  atol: float = PROB_SUM_ATOL, q_atol: float = PROB_SUM_ATOL
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """``(token_ids, num_accepted, num_emitted, num_draft_tokens, ok)`` from host arrays whose
    layout the caller has checked (shapes index memory here: nothing is bounds-checked).

    ``target`` holds the flat rows ``[..., V]`` (C-contiguous); it and ``drafts`` may also be
    contiguous float32 / int64 CPU tensors, read in place by address.
    """
    b, k = drafts.shape
    v = target.shape[-1]
    if v == 0 and b > 0:
        raise ValueError("the target has an empty vocabulary dimension")
    r = b * (k + 1) if rows.shape[0] == 0 else target.shape[0]  # rows: target is [R, V]
    greedy_possible = all_greedy or temps.shape[0] > 0 or temp_scalar == 0.0
    tokens, accepted, emitted, out_counts = _outputs(b, k)
    by_address = type(target) is torch.Tensor and type(drafts) is torch.Tensor
    if by_address and not (greedy_possible and r * v > ARGMAX_IN_NUMPY):
        error = kernels.decide_at(
            target.data_ptr(), r, v, is_logits, rows, drafts.data_ptr(), b, k, counts, q,
            qrows, temps, temp_scalar, all_greedy, typical, eps, alpha, uniforms, seeds,
            seed_scalar, seed_mode, offsets, offset_scalar, bonus, check, atol, q_atol,
            tokens, accepted, emitted, out_counts)
        return tokens, accepted, emitted, out_counts, error == 0
    target = host_array(target, np.float32)
    target = target.reshape(-1, v)
    drafts = host_array(drafts, np.int64)
    argmax = (np.argmax(target, axis=1) if greedy_possible and target.size > ARGMAX_IN_NUMPY
              else EMPTY_I64_1)
    error = kernels.decide(target, is_logits, rows, drafts, counts, q, qrows, temps, temp_scalar,
                           all_greedy, typical, eps, alpha, uniforms, seeds, seed_scalar,
                           seed_mode, offsets, offset_scalar, argmax, bonus, check, atol,
                           q_atol, tokens, accepted, emitted, out_counts)
    return tokens, accepted, emitted, out_counts, error == 0


def greedy_arrays(target: np.ndarray | torch.Tensor, is_logits: bool,
                  drafts: np.ndarray | torch.Tensor, counts: np.ndarray, bonus: np.ndarray,
                  check: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """:func:`decide_arrays` for a padded call whose every row is greedy; ``target`` is
    ``[B, K+1, V]``. ``target`` and ``drafts`` may also be contiguous CPU tensors of the
    right dtype (read in place)."""
    b, k = drafts.shape
    v = target.shape[-1]
    r = b * (k + 1)
    tokens, accepted, emitted, out_counts = _outputs(b, k)
    if type(target) is torch.Tensor and type(drafts) is torch.Tensor and r * v <= ARGMAX_IN_NUMPY:
        error = kernels.greedy_at(target.data_ptr(), r, v, is_logits,
                                  drafts.data_ptr(), b, k, counts, bonus, check, tokens,
                                  accepted, emitted, out_counts)
    else:
        target = host_array(target, np.float32).reshape(r, v)
        drafts = host_array(drafts, np.int64)
        argmax = np.argmax(target, axis=1) if r * v > ARGMAX_IN_NUMPY else EMPTY_I64_1
        error = kernels.greedy(target, is_logits, drafts, counts, argmax, bonus, check, tokens,
                               accepted, emitted, out_counts)
    return tokens, accepted, emitted, out_counts, error == 0


MAX_PADDING = 1 << 24
"""Padding slots past the largest count (``max_num_draft_tokens``) the lean path allocates;
a call asking for more is left to the full front door, which words its limit."""


def ragged_arrays(flat: np.ndarray, layout: np.ndarray, from_cu: bool, n_target_rows: int,
                  max_k: int | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(drafts [B, K], counts [B], rows [B, K+1], draft_rows [B, K])`` of a flat call with
    ``K = max_k`` (default: the largest count), or None when its counts do not fit it.

    The counts are checked against ``N`` before anything is read through them or allocated
    from them (a count past ``N`` once read outside ``flat``); None hands the call to the full
    front door, which words the error.
    """
    if flat.dtype != np.int64 or layout.dtype != np.int64 or layout.ndim != 1:
        return None
    if from_cu and layout.shape[0] == 0:
        return None
    flat = np.ascontiguousarray(flat)
    layout = np.ascontiguousarray(layout)
    largest = kernels.ragged_max_count(layout, from_cu, flat.shape[0], n_target_rows)
    b = layout.shape[0] - 1 if from_cu else layout.shape[0]
    if largest < 0 or (max_k is not None and not (
            largest <= max_k and (max_k - largest) * b <= MAX_PADDING)):
        return None
    k = largest if max_k is None else max_k
    drafts = np.empty((b, k), dtype=np.int64)
    counts = np.empty(b, dtype=np.int64)
    rows = np.empty((b, k + 1), dtype=np.int64)
    draft_rows = np.empty((b, k), dtype=np.int64)
    kernels.ragged_layout(flat, layout, from_cu, k, drafts, counts, rows, draft_rows)
    return drafts, counts, rows, draft_rows


HOST_KERNEL = HostKernel(decide=decide_arrays, greedy=greedy_arrays, ragged_layout=ragged_arrays)


_AVAILABILITY = (
    Availability(False, "numba is not installed (pip install 'portable-verify[cpu]')")
    if kernels is None else Availability(True, f"numba {numba.__version__} on the CPU"))


class NumbaBackend(Backend):
    """The decision as one numba-compiled CPU kernel (``numba:cpu``)."""

    name = "numba"
    description = "one numba-compiled CPU kernel per call (the fast CPU path)"
    devices = ("cpu",)
    traits = BackendTraits(checks_what_it_reads=True)

    def availability(self) -> Availability:
        return _AVAILABILITY  # asked on every automatic selection: computed once

    def host_kernel(self) -> HostKernel:
        return HOST_KERNEL

    def run(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        inputs.check_layout()
        if inputs.uniforms is None and not inputs.all_greedy:
            raise ValueError("uniforms are required unless every row is greedy")
        target, q = inputs.target, inputs.draft_probs
        atol, q_atol = (PROB_SUM_ATOL_HALF if t is not None and t.dtype in HALF else PROB_SUM_ATOL
                        for t in (target, q))
        if target.dtype != torch.float32:
            target = target.float()  # half inputs: upcast once (the kernel reads float32)
        if q is not None and q.dtype != torch.float32:
            q = q.float()
        tokens, accepted, _, _, ok = decide_arrays(
            host_array(target, np.float32), inputs.target_is_logits,
            host_array(inputs.draft_token_ids, np.int64),
            rows=host_array(inputs.target_rows, np.int64),
            counts=host_array(inputs.num_draft_tokens, np.int64),
            q=EMPTY_F32_2 if q is None else host_array(q, np.float32),
            qrows=(EMPTY_I64_2 if inputs.draft_rows is None
                   else host_array(inputs.draft_rows, np.int64)),
            temps=host_array(inputs.temperature, np.float32),
            all_greedy=inputs.all_greedy,
            typical=inputs.sampled_method == "typical",
            eps=inputs.typical_eps, alpha=inputs.typical_alpha,
            uniforms=(EMPTY_F32_2 if inputs.uniforms is None
                      else host_array(inputs.uniforms, np.float32)),
            check=inputs.check_read_values, atol=atol, q_atol=q_atol,
        )
        if not ok:
            raise ReadValueError("a value the decision reads is invalid")
        return torch.from_numpy(tokens), torch.from_numpy(accepted)
