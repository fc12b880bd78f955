"""Triton kernels for all three verification methods, and the ``triton`` (interpreter) backend.

Design (docs/backends.md, "CUDA, XPU and Triton"): at most two launches per call, no host sync.

1. ``_row_stats_kernel``, grid ``(B, K+1)``: one program per (request, position) reads its target
   row once, in ``BLOCK``-sized chunks, and keeps what the decision needs: the first argmax (for
   greedy rows), the online max and sum of ``exp(z - max)`` (logits), the entropy (typical).
   Positions past a request's ``n`` exit at once. Skipped entirely when nothing needs it
   (probabilities in, no greedy row, rejection).
2. ``_decide_kernel``, grid ``(B,)``: one program per request tests its ``n`` positions at once
   (gathers of ``p(x)``, ``q(x)``, uniforms), takes the accepted prefix ``a``, then reads the ONE
   row it needs: the argmax of ``p_a`` (typical rejection), or the residual/target row for the
   inverse-CDF draw (two chunked passes: the total, then a scan that stops at the pick). It
   writes the ``[K+1]`` output row (-1 padded) and ``a``.

Everything is decided on the device from tensors; the launcher only reads shapes and host flags,
so a call can be captured in a CUDA graph (after one warm-up call has compiled the kernels).

Interpreter: Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` *decorates* a function, not
at launch. Rather than set that process-wide variable (which would turn a real GPU session's
kernels into interpreted ones), :func:`interpreted` executes this file a second time as a private
module with ``_INTERPRET = True`` injected, so its kernels are wrapped in Triton's
``InterpretedFunction`` directly; the compiled kernels of this module are untouched.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch
import triton
import triton.language as tl

from portable_verify.backends.base import Availability, Backend
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs

_INTERPRET: bool = bool(globals().get("_INTERPRET", False))  # injected by interpreted()
PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN_ID)
_TL_CORE = tl.core  # in the globals so the interpreter patches it at launch (see _device)


class _InterpretedDevice:
    """A device function for interpreted kernels: the interpreter's rewritten Python function,
    called directly. (Triton's ``InterpretedFunction`` re-patches ``triton.language`` on every
    device-function call, which made small launches take seconds; the kernel launch has already
    patched it, including ``tl.core`` through ``_TL_CORE``.)"""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        from triton.runtime.interpreter import InterpretedFunction

        self.fn = fn
        self._rewritten = InterpretedFunction(fn).rewrite()

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._rewritten(*args, **kwargs)


def _kernel(fn):  # type: ignore[no-untyped-def]
    """``triton.jit`` for a kernel, or Triton's interpreter in the private interpreted copy."""
    if _INTERPRET:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    return triton.jit(fn)


def _device(fn):  # type: ignore[no-untyped-def]
    """``triton.jit`` for a device function (inlined into kernels), or its interpreted form."""
    return _InterpretedDevice(fn) if _INTERPRET else triton.jit(fn)


@_device
def _chunk_first_argmax(x, offs, best, best_idx, V):
    """Fold one chunk into a running (max, first index); strict ``>`` keeps the lowest index."""
    cmax = tl.max(x, 0)
    cidx = tl.min(tl.where(x == cmax, offs, V), 0)
    better = cmax > best
    return tl.where(better, cmax, best), tl.where(better, cidx, best_idx)


@_device
def _last_of_cumsum(w, BLOCK: tl.constexpr):
    """``cumsum(w)[-1]`` taken from the scan itself, so totals and scans round identically."""
    lane = tl.arange(0, BLOCK)
    return tl.sum(tl.where(lane == BLOCK - 1, tl.cumsum(w, 0), 0.0), 0)


@_device
def _p_chunk(base, offs, V, t, m, s, IS_LOGITS: tl.constexpr):
    """``p`` over one chunk (0 outside the row): ``exp(z - max) / sum`` or the given probs."""
    valid = offs < V
    if IS_LOGITS:
        z = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32) / t
        p = tl.where(z > float("-inf"), tl.exp(z - m) / s, 0.0)
    else:
        p = tl.load(base + offs, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, p, 0.0)


@_kernel
def _row_stats_kernel(
    target_ptr, target_stride, rows_ptr, counts_ptr, temp_ptr,
    argmax_ptr, max_ptr, sum_ptr, ent_ptr,
    V, K1,
    IS_LOGITS: tl.constexpr, NEED_ARGMAX: tl.constexpr, NEED_SOFTMAX: tl.constexpr,
    NEED_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    j = tl.program_id(1)
    n = tl.load(counts_ptr + b)
    if j <= n:
        row = tl.load(rows_ptr + b * K1 + j)
        base = target_ptr + row * target_stride
        t = tl.load(temp_ptr + b)
        t_safe = tl.where(t > 0, t, 1.0)
        lane = tl.arange(0, BLOCK)
        best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
        best_idx = tl.min(tl.zeros([BLOCK], tl.int32), 0)
        m = best
        s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
        w = s  # sum of exp(z - m) * (z - m) (logits) or -sum p log p (probs)
        for start in range(0, V, BLOCK):
            offs = start + lane
            valid = offs < V
            x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
            if NEED_ARGMAX:
                best, best_idx = _chunk_first_argmax(x, offs, best, best_idx, V)
            if NEED_SOFTMAX:
                z = x / t_safe
                finite = z > float("-inf")
                m_new = tl.maximum(m, tl.max(z, 0))
                seen = m > float("-inf")
                scale = tl.where(seen, tl.exp(m - m_new), 0.0)
                e = tl.where(finite, tl.exp(z - m_new), 0.0)
                if NEED_ENTROPY:
                    shift = (tl.where(seen, m, m_new) - m_new) * s
                    centred = tl.where(finite, z - m_new, 0.0)
                    w = scale * (w + shift) + tl.sum(e * centred, 0)
                s = s * scale + tl.sum(e, 0)
                m = m_new
            elif NEED_ENTROPY:
                px = tl.where(valid & (x > 0), x, 1.0)  # 1 log 1 = 0 stands in for 0 log 0
                w += tl.sum(-px * tl.log(px), 0)
        out = b * K1 + j
        if NEED_ARGMAX:
            tl.store(argmax_ptr + out, best_idx)
        if NEED_SOFTMAX:
            tl.store(max_ptr + out, m)
            tl.store(sum_ptr + out, s)
            if NEED_ENTROPY:
                tl.store(ent_ptr + out, tl.log(s) - w / s)
        elif NEED_ENTROPY:
            tl.store(ent_ptr + out, w)


@_kernel
def _decide_kernel(
    target_ptr, target_stride, rows_ptr, drafts_ptr, counts_ptr, temp_ptr, u_ptr,
    q_ptr, q_stride, qrows_ptr,
    argmax_ptr, max_ptr, sum_ptr, ent_ptr,
    tokens_ptr, accepted_ptr,
    V, K, eps, alpha,
    IS_LOGITS: tl.constexpr, HAS_Q: tl.constexpr, HAS_U: tl.constexpr,
    HAS_GREEDY: tl.constexpr, TYPICAL: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    K1 = K + 1
    n = tl.load(counts_ptr + b)
    t = tl.load(temp_ptr + b)
    t_safe = tl.where(t > 0, t, 1.0)
    if HAS_GREEDY:  # noqa: SIM108 - kernel code: constexpr branches, not Python ternaries
        greedy = t == 0
    else:
        greedy = t != t  # all False; written as a tensor so both branches share a type
    if not HAS_U:
        greedy = t == t  # no uniforms: every row is greedy

    # Accepted prefix: every position's test at once (K is small), then the first failure.
    lanes = tl.arange(0, KB)
    # Row-kind masks as lane bounds (n for this row's kind, else 0): a scalar condition is
    # never broadcast into a vector mask, which Triton's interpreter mishandles.
    has_draft = lanes < n
    greedy_draft = lanes < tl.where(greedy, n, 0)
    sampled = lanes < tl.where(greedy, 0, n)
    x = tl.load(drafts_ptr + b * K + lanes, mask=has_draft, other=0)
    x = tl.minimum(tl.maximum(x, 0), V - 1)
    stat = b * K1 + lanes
    if HAS_GREEDY:
        g = tl.load(argmax_ptr + stat, mask=greedy_draft, other=-1)
        ok_g = x == g
    else:
        ok_g = x != x  # all False
    row = tl.load(rows_ptr + b * K1 + lanes, mask=sampled, other=0)
    val = tl.load(target_ptr + row * target_stride + x, mask=sampled, other=0.0).to(tl.float32)
    if IS_LOGITS:
        m = tl.load(max_ptr + stat, mask=sampled, other=0.0)
        s = tl.load(sum_ptr + stat, mask=sampled, other=1.0)
        z = val / t_safe
        px = tl.where(z > float("-inf"), tl.exp(z - m) / s, 0.0)
    else:
        px = val
    if TYPICAL:
        h = tl.load(ent_ptr + stat, mask=sampled, other=0.0)
        ok_s = px > tl.minimum(eps, alpha * tl.exp(-h))
    else:
        if HAS_U:  # noqa: SIM108
            u = tl.load(u_ptr + b * K1 + lanes, mask=sampled, other=1.0)
        else:
            u = 1.0
        if HAS_Q:
            qrow = tl.load(qrows_ptr + b * K + lanes, mask=sampled, other=0)
            qx = tl.load(q_ptr + qrow * q_stride + x, mask=sampled, other=0.0).to(tl.float32)
        else:
            qx = 1.0
        ok_s = (px > 0) & (u * qx <= px)
    ok = (greedy_draft & ok_g) | (sampled & ok_s)
    a = tl.min(tl.where(ok, KB, lanes), 0).to(n.dtype)  # lanes >= n are never ok, so a <= n

    rejected = a < n
    stat_a = b * K1 + a
    final = n * 0
    if HAS_GREEDY:
        final = tl.load(argmax_ptr + stat_a, mask=greedy, other=0).to(final.dtype)
    if greedy == 0:
        row_a = tl.load(rows_ptr + b * K1 + a)
        base = target_ptr + row_a * target_stride
        if IS_LOGITS:
            m_a = tl.load(max_ptr + stat_a)
            s_a = tl.load(sum_ptr + stat_a)
        else:
            m_a = 0.0
            s_a = 1.0
        lane = tl.arange(0, BLOCK)
        zero = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
        do_draw = rejected == 0
        if not TYPICAL:
            do_draw = rejected == rejected
        if TYPICAL:  # noqa: SIM102 - a constexpr test around a run-time one
            if rejected:  # recovered token: argmax of p_a, lowest index on ties
                best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
                best_idx = tl.min(tl.zeros([BLOCK], tl.int32), 0)
                for start in range(0, V, BLOCK):
                    offs = start + lane
                    p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
                    p = tl.where(offs < V, p, float("-inf"))
                    best, best_idx = _chunk_first_argmax(p, offs, best, best_idx, V)
                final = best_idx.to(final.dtype)
        if do_draw:
            # Weights: residual max(0, p - q) at a rejection, else (bonus / empty residual) p.
            x_a = tl.load(drafts_ptr + b * K + a, mask=rejected, other=0)
            x_a = tl.minimum(tl.maximum(x_a, 0), V - 1)
            if HAS_Q:
                qrow_a = tl.load(qrows_ptr + b * K + a, mask=rejected, other=0)
                qbase = q_ptr + qrow_a * q_stride
            q_len = tl.where(rejected, V, 0)  # q is read only at a rejection
            # Prefix sums accumulate in float64 (docs/semantics.md, inverse-CDF draw).
            total_r = zero.to(tl.float64)
            total_p = zero.to(tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + lane
                p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
                if HAS_Q:
                    q = tl.load(qbase + offs, mask=offs < q_len, other=0.0)
                    q = q.to(tl.float32)
                else:
                    q = tl.where(offs == x_a, 1.0, 0.0)
                r = tl.where(rejected, tl.maximum(p - q, 0.0), 0.0)
                total_r += _last_of_cumsum(r.to(tl.float64), BLOCK)
                total_p += _last_of_cumsum(p.to(tl.float64), BLOCK)
            use_r = rejected & (total_r > 0)
            q_len = tl.where(use_r, V, 0)
            v_draw = tl.load(u_ptr + b * K1 + K).to(tl.float64)
            threshold = v_draw * tl.where(use_r, total_r, total_p)
            # Smallest t with cumsum[t] >= threshold and w[t] > 0; the w > 0 guard and the
            # last-positive fallback keep the pick valid whatever the scan's rounding.
            carry = zero.to(tl.float64)
            pick = tl.min(tl.full([BLOCK], -1, tl.int32), 0)
            last_pos = pick * 0
            start = pick * 0
            while (start < V) & (pick < 0):
                offs = start + lane
                p = _p_chunk(base, offs, V, t_safe, m_a, s_a, IS_LOGITS)
                if HAS_Q:
                    q = tl.load(qbase + offs, mask=offs < q_len, other=0.0)
                    q = q.to(tl.float32)
                else:
                    q = tl.where(offs == x_a, 1.0, 0.0)
                wgt = tl.where(use_r, tl.maximum(p - q, 0.0), p)
                c = carry + tl.cumsum(wgt.to(tl.float64), 0)
                positive = wgt > 0
                hit = positive & (c >= threshold)
                first = tl.min(tl.where(hit, offs, V), 0)
                pick = tl.where(first < V, first, pick)
                last_pos = tl.maximum(last_pos, tl.max(tl.where(positive, offs, 0), 0))
                carry += _last_of_cumsum(wgt.to(tl.float64), BLOCK)
                start += BLOCK
            final = tl.where(pick >= 0, pick, last_pos).to(final.dtype)

    final = tl.minimum(tl.maximum(final, 0), V - 1)
    d = tl.load(drafts_ptr + b * K + lanes, mask=lanes < a, other=0)
    d = tl.minimum(tl.maximum(d, 0), V - 1)
    tok = tl.where(lanes < a, d, tl.where(lanes == a, final, PLACEHOLDER))
    tl.store(tokens_ptr + b * K1 + lanes, tok, mask=lanes < K1)
    tl.store(accepted_ptr + b, a)


KERNELS_INTERPRETED: bool = not isinstance(_decide_kernel, triton.runtime.jit.JITFunction)
"""True when TRITON_INTERPRET=1 was set as this module loaded: even GPU launches interpret."""


_COMPILE_OPTIONS = {"enable_fp_fusion": False}
"""No fused multiply-adds: float32 results round like the reference's separate operations."""


def _block(v: int, cap: int) -> int:
    return max(16, min(triton.next_power_of_2(v), cap))


def verify_triton(inputs: VerifyInputs, *, interpreted_kernels: bool = False) -> tuple[
    torch.Tensor, torch.Tensor
]:
    """Run the kernels on ``inputs`` (torch tensors on a Triton device, or CPU when interpreted).

    Host work is shape arithmetic and buffer allocation only, so the call is CUDA-graph
    capturable once compiled.
    """
    if interpreted_kernels and not _INTERPRET:
        with _INTERPRETER_LOCK, _interpreted_stdlib():
            return interpreted().verify_triton(inputs, interpreted_kernels=True)
    mod = sys.modules[__name__]
    drafts = inputs.draft_token_ids
    b, k = drafts.shape
    device = drafts.device
    tokens = torch.empty((b, k + 1), dtype=torch.int64, device=device)
    accepted = torch.empty((b,), dtype=torch.int64, device=device)
    if b == 0:
        return tokens, accepted
    target = _rows_contiguous(inputs.target, interpreted_kernels)
    v = target.shape[1]
    q = None if inputs.draft_probs is None else _rows_contiguous(inputs.draft_probs,
                                                                  interpreted_kernels)
    typical = inputs.sampled_method == "typical" and not inputs.all_greedy
    has_greedy = not inputs.none_greedy
    need_softmax = inputs.target_is_logits and not inputs.all_greedy
    need_entropy = typical
    temps = inputs.temperature.to(torch.float32).contiguous()
    counts = inputs.num_draft_tokens.contiguous()
    rows = inputs.target_rows.contiguous()
    stats = torch.empty((4, b * (k + 1)), dtype=torch.float32, device=device)
    argmax = torch.empty((b * (k + 1),), dtype=torch.int32, device=device)
    if has_greedy or need_softmax or need_entropy:
        cap = 1024 if interpreted_kernels else 4096
        mod._row_stats_kernel[(b, k + 1)](
            target, target.stride(0), rows, counts, temps,
            argmax, stats[0], stats[1], stats[2],
            v, k + 1,
            IS_LOGITS=inputs.target_is_logits, NEED_ARGMAX=has_greedy,
            NEED_SOFTMAX=need_softmax, NEED_ENTROPY=need_entropy, BLOCK=_block(v, cap),
            **({} if interpreted_kernels else {"num_warps": 8, **_COMPILE_OPTIONS}),
        )  # fmt: skip
    u = inputs.uniforms.contiguous() if inputs.uniforms is not None else temps
    mod._decide_kernel[(b,)](
        target, target.stride(0), rows, drafts.contiguous(), counts, temps, u,
        q if q is not None else temps, q.stride(0) if q is not None else 0,
        inputs.draft_rows.contiguous() if q is not None else counts,
        argmax, stats[0], stats[1], stats[2],
        tokens, accepted,
        v, k, float(inputs.typical_eps), float(inputs.typical_alpha),
        IS_LOGITS=inputs.target_is_logits, HAS_Q=q is not None,
        HAS_U=inputs.uniforms is not None, HAS_GREEDY=has_greedy, TYPICAL=typical,
        BLOCK=_block(v, 1024 if interpreted_kernels else 2048),
        KB=max(2, triton.next_power_of_2(k + 1)),
        **({} if interpreted_kernels else {"num_warps": 4, **_COMPILE_OPTIONS}),
    )  # fmt: skip
    return tokens, accepted


def _rows_contiguous(x: torch.Tensor, interpreted_kernels: bool) -> torch.Tensor:
    """Rows with unit stride along V; the interpreter (numpy) gets float32 (exact upcast)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if interpreted_kernels and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x


_COPY_LOCK = threading.Lock()
_COPY: ModuleType | None = None
_INTERPRETER_LOCK = threading.Lock()
_STDLIB_SWAPS: dict[int, object] = {}


def _import_lazy_triton_modules() -> None:
    """Import now what Triton imports lazily at the first launch: Gluon asserts, at import, that
    the standard library is made of JIT functions, so it must not first load mid-swap."""
    with contextlib.suppress(ImportError):  # older Triton has no Gluon
        importlib.import_module("triton.experimental.gluon")


@contextmanager
def _interpreted_stdlib() -> Iterator[None]:
    """Swap ``tl.max``/``tl.sum``/... for interpreted versions for the duration of a launch.

    Triton's standard-library functions (``tl.max``, ``tl.cumsum``, ...) are themselves
    ``@jit`` functions, decorated when ``triton.language`` is imported; unless TRITON_INTERPRET
    was set at that moment they cannot be called from interpreted code. Triton's interpreter
    already patches ``triton.language`` for the duration of each launch; this does the same for
    the standard library, and restores it afterwards.
    """
    from triton.runtime.jit import JITFunction

    _import_lazy_triton_modules()
    swapped: list[tuple[ModuleType, str, object]] = []
    try:
        for module in (tl, tl.standard):
            for name, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    if id(value) not in _STDLIB_SWAPS:
                        _STDLIB_SWAPS[id(value)] = _InterpretedDevice(value.fn)
                    wrapper = _STDLIB_SWAPS[id(value)]
                    setattr(module, name, wrapper)
                    swapped.append((module, name, value))
        yield
    finally:
        for module, name, value in reversed(swapped):
            setattr(module, name, value)


def interpreted() -> ModuleType:
    """A private copy of this module whose kernels run in Triton's interpreter (CPU tensors)."""
    global _COPY
    if _INTERPRET:
        return sys.modules[__name__]
    with _COPY_LOCK:
        if _COPY is None:
            name = f"{__name__}_interpreted"
            spec = importlib.util.spec_from_file_location(name, __file__)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            module.__dict__["_INTERPRET"] = True
            sys.modules[name] = module  # the interpreter reads the kernels' source via inspect
            spec.loader.exec_module(module)
            _COPY = module
    return _COPY


class TritonInterpreterBackend(Backend):
    """The CUDA/XPU kernels run by Triton's interpreter on CPU tensors: CI coverage, not speed."""

    name = "triton"
    description = "Triton kernels through Triton's interpreter on CPU tensors (for CI; slow)"

    def availability(self) -> Availability:
        try:
            interpreted()
        except Exception as exc:  # pragma: no cover - depends on the triton build
            return Availability(False, f"Triton {triton.__version__} interpreter failed: {exc}")
        return Availability(
            True,
            f"Triton {triton.__version__} interpreter (the CUDA/XPU kernels executed in numpy on "
            "CPU tensors; independent of TRITON_INTERPRET; slow, meant for tests)",
        )

    def run(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs.target.device.type != "cpu":
            raise ValueError(
                "backend='triton' runs the kernels in Triton's interpreter on CPU tensors; got "
                f"target on {inputs.target.device} (use backend='cuda' or 'xpu' on a GPU)"
            )
        return verify_triton(inputs, interpreted_kernels=True)
