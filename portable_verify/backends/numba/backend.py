"""The compiled CPU backend: one numba kernel per call (``backends/numba/chain.py``).

Why a backend of its own: on CPU the torch backend's cost at batch 1-8 is its many array calls
(docs/benchmarks.md); here the whole decision, its default-level checks and the uniforms are
one compiled call. It is what ``backend="auto"`` picks for CPU tensors when numba is
installed (the ``cpu`` extra). The kernel only flags an invalid value; the words of the error
come from the torch backend, rerun by dispatch on the same inputs (one source of messages).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from portable_verify.backends.base import Availability, Backend, ReadValueError
from portable_verify.backends.numba import readiness, rules
from portable_verify.backends.numba.host import (
    EMPTY_F32_1,
    EMPTY_F32_2,
    EMPTY_I64_1,
    EMPTY_I64_2,
    HALF,
    PARALLEL_MIN_VALUES,
    call_arrays,
    call_record,
    host_array,
    options_record,
    run_split,
    threads_for,
)
from portable_verify.backends.numba.rules import GREEDY
from portable_verify.core import methods
from portable_verify.core.arguments import request_seeds
from portable_verify.core.constants import FLOAT32_MAX, PROB_SUM_ATOL, PROB_SUM_ATOL_HALF
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import VerifyCall, VerifyInputs

try:  # numba is optional (the `cpu` extra): without it the backend reports itself unavailable
    import numba

    from portable_verify.backends.numba import chain as kernels
    from portable_verify.backends.numba import entries
except ImportError:
    kernels = entries = None

_CPU = torch.device("cpu")
_CHAIN = rules.CHAIN


def _outputs(b: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The result's arrays, filled by the kernel (token ids, accepted, emitted, counts)."""
    return (np.empty((b, k + 1), dtype=np.int64), np.empty(b, dtype=np.int64),
            np.empty(b, dtype=np.int64), np.empty(b, dtype=np.int64))


def decide_arrays(target: np.ndarray | torch.Tensor, is_logits: bool,
                  drafts: np.ndarray | torch.Tensor, *,
                  rows: np.ndarray = EMPTY_I64_2, counts: np.ndarray = EMPTY_I64_1,
                  q: np.ndarray = EMPTY_F32_2, qrows: np.ndarray = EMPTY_I64_2,
                  temps: np.ndarray = EMPTY_F32_1, uniforms: np.ndarray = EMPTY_F32_2,
                  seeds: np.ndarray = EMPTY_I64_1, offsets: np.ndarray = EMPTY_I64_1,
                  bonus: np.ndarray = EMPTY_I64_1, rule: str | None = "rejection",
                  **options: Any
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """``(token_ids, num_accepted, num_emitted, num_draft_tokens, ok)`` from host arrays whose
    layout the caller has checked (shapes index memory here: nothing is bounds-checked);
    ``rule``: the sampled rows' rule (a name of ``rules.CHAIN``); ``options`` are the fields of
    :func:`options_record` other than ``is_logits`` and ``rule``.

    ``target`` holds the flat rows ``[..., V]`` (C-contiguous); it and ``drafts`` may also be
    contiguous float32 / int64 CPU tensors, read in place.
    """
    code = rules.code(_CHAIN, rule, options.get("all_greedy", False))
    if code is None:
        raise methods.unknown_rule(rule, "numba:cpu", methods.CHAIN)
    arrays = call_arrays(rows, counts, q, qrows, temps, uniforms, seeds, offsets, bonus)
    out = _decide(target, drafts, arrays,
                  options_record(is_logits=is_logits, rule=code, **options))
    if out[4] == rules.ERROR_RULE:
        raise flagged(out[4], rule, methods.CHAIN)
    return (*out[:4], out[4] == 0)


def flagged(error: int, rule: str | None, layout: str) -> Exception:
    """The error of a kernel's flag: a rule code it has no branch for (``methods.unknown_rule``,
    as the host's own lookup), else a value it reads is invalid (worded by dispatch)."""
    if error == rules.ERROR_RULE:
        return methods.unknown_rule(rule, "numba:cpu", layout)
    return ReadValueError(f"a value the {layout} decision reads is invalid")


def _decide(target: Any, drafts: Any, arrays: tuple[np.ndarray, ...], record: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`decide_arrays` with the options already a record and the arrays a tuple
    (:func:`host.call_arrays`; positional: this runs on every call, and keyword dictionaries
    cost more than a small call's decision); the last item is the kernel's flag. A small call
    on tensors enters them by address (``entries.decide_at``): two numpy views cost more than
    its whole decision."""
    b, k = drafts.shape
    v = target.shape[-1]
    if v == 0 and b > 0:
        raise ValueError("the target has an empty vocabulary dimension")
    outs = _outputs(b, k)
    threads = 1 if b * k * v < PARALLEL_MIN_VALUES else threads_for(b * k * v, b)
    if threads == 1 and type(target) is torch.Tensor and type(drafts) is torch.Tensor:
        r = b * (k + 1) if arrays[0].shape[0] == 0 else target.shape[0]  # target is [R, V]
        error = entries.decide_at(target.data_ptr(), r, v, drafts.data_ptr(), b, k, arrays,
                                      record, *outs)
        return (*outs, error)
    before = (host_array(target, np.float32).reshape(-1, v), host_array(drafts, np.int64),
              arrays, record)
    return (*outs, run_split(entries.decide, b, threads, before, (outs,)))


def greedy_arrays(target: np.ndarray | torch.Tensor, is_logits: bool,
                  drafts: np.ndarray | torch.Tensor, counts: np.ndarray, bonus: np.ndarray,
                  check: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`_decide` for a padded call whose every row is greedy (the last item is the
    kernel's flag); ``target`` is ``[B, K+1, V]``. ``target`` and ``drafts`` may also be
    contiguous CPU tensors of the right dtype (read in place)."""
    b, k = drafts.shape
    v = target.shape[-1]
    r = b * (k + 1)
    outs = _outputs(b, k)
    threads = 1 if b * v < PARALLEL_MIN_VALUES else threads_for(b * v, b)
    if threads == 1 and type(target) is torch.Tensor and type(drafts) is torch.Tensor:
        error = kernels.greedy_at(target.data_ptr(), r, v, drafts.data_ptr(), b, k, counts,
                                  bonus, is_logits, check, *outs)
    else:
        before = (host_array(target, np.float32).reshape(r, v), host_array(drafts, np.int64),
                  counts, bonus, is_logits, check)
        error = run_split(kernels.greedy, b, threads, before, (outs,))
    return (*outs, error)


_AVAILABILITY = (
    Availability(False, "numba is not installed (pip install 'portable-verify[cpu]')")
    if kernels is None else Availability(True, f"numba {numba.__version__} on the CPU"))


class NumbaBackend(Backend):
    """The decision as one numba-compiled CPU kernel (``numba:cpu``)."""

    name = "numba"
    description = "one numba-compiled CPU kernel per call (the fast CPU path)"
    devices = ("cpu",)
    traits = readiness.TRAITS  # declared there: dispatch reads it before importing numba

    def availability(self) -> Availability:
        return _AVAILABILITY  # asked on every automatic selection: computed once

    def run_call(self, call: VerifyCall) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # Written flat, positional and without keyword dictionaries: at batch 1-8 the Python
        # around the kernel is most of a call's cost (docs/benchmarks.md, "The four doors").
        check = call.validate is True
        if call.target.shape[0] == 0 and call.drafts.shape[0] > 0:  # no row to clamp into
            raise ValueError("the target has no rows for its B > 0 requests")
        counts = EMPTY_I64_1 if call.counts is None else call.counts
        bonus = EMPTY_I64_1 if call.bonus is None else call.bonus
        options = call.options
        method = call.rule  # None: every row greedy (the parser decided it)
        all_greedy = method is None
        temps, temp_scalar = EMPTY_F32_1, 1.0
        t = call.temperature
        if not all_greedy and t is not None:
            if type(t) is float:  # checked by the parser, before this rounding
                temp_scalar = float(np.float32(t)) if t <= FLOAT32_MAX else math.inf
            else:
                temps = t
        if all_greedy and call.rows is None and call.uniforms is None:
            out = greedy_arrays(call.target, call.target_name == "target_logits", call.drafts,
                                counts, bonus, check)
        else:
            uniforms, seeds, offsets = EMPTY_F32_2, EMPTY_I64_1, EMPTY_I64_1
            seed_mode, seed_scalar, offset_scalar = 1, 0, 0
            if not all_greedy and call.uniforms is not None:  # the caller's own uniforms
                uniforms = call.uniforms
            elif not all_greedy:  # the counter-hash streams of seeds and offsets (in the kernel)
                seed = call.seed
                if seed is None:
                    seeds = request_seeds(None, call.drafts.shape[0], _CPU).numpy()
                elif type(seed) is int:
                    seed_scalar, seed_mode = seed, 2
                else:
                    seeds = seed
                offset = call.seed_offset
                if type(offset) is int:
                    offset_scalar = offset
                elif offset is not None:
                    offsets = offset
            code = _CHAIN.get(method, GREEDY)  # None: every row greedy
            if code == GREEDY and not all_greedy:
                raise methods.unknown_rule(method, "numba:cpu", methods.CHAIN)
            record = call_record(call.target_name == "target_logits", all_greedy, code,
                                 options.typical, check, seed_mode, seed_scalar,
                                 offset_scalar, temp_scalar, PROB_SUM_ATOL, PROB_SUM_ATOL)
            arrays = call_arrays(
                EMPTY_I64_2 if call.rows is None else call.rows, counts,
                EMPTY_F32_2 if call.draft_probs is None else call.draft_probs,
                EMPTY_I64_2 if call.draft_rows is None else call.draft_rows, temps, uniforms,
                seeds, offsets, bonus)
            out = _decide(call.target, call.drafts, arrays, record)
        if out[4]:
            raise flagged(out[4], method, methods.CHAIN)
        return out[:4]

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
            all_greedy=inputs.all_greedy, rule=inputs.sampled_method,
            typical=inputs.options.typical,
            uniforms=(EMPTY_F32_2 if inputs.uniforms is None
                      else host_array(inputs.uniforms, np.float32)),
            check=inputs.check_read_values, atol=atol, q_atol=q_atol,
        )
        if not ok:
            raise ReadValueError("a value the decision reads is invalid")
        return torch.from_numpy(tokens), torch.from_numpy(accepted)

    def run_tree(self, inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tree walk as one kernel (``backends/numba/tree.py``; traversal verification:
        ``backends/numba/traversal.py``)."""
        from portable_verify.backends.numba.entries import walk  # compile on first use
        from portable_verify.backends.numba.tree import tree_arrays

        rule = rules.code(rules.TREE, inputs.sampled_method, inputs.all_greedy)
        if rule is None:
            raise methods.unknown_rule(inputs.sampled_method, "numba:cpu", methods.TREE)
        tokens, nodes, accepted, error = tree_arrays(inputs, rule, walk)
        if error:
            raise flagged(error, inputs.sampled_method, methods.TREE)
        return torch.from_numpy(tokens), torch.from_numpy(nodes), torch.from_numpy(accepted)
