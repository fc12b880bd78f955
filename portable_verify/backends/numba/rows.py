"""Vectorizable float32 row primitives for numba host kernels: max, min/NaN/sum checks,
exp-and-sum, entropy terms.

Why this exists: the llvmlite wheels are built without Intel SVML, so ``math.exp`` / ``np.exp``
inside a numba loop is a scalar libm call per element, and a float ``if x > m`` max
reduction does not vectorize without no-NaN fast-math (which would also delete the NaN checks
the verifier relies on). These functions are written so that LLVM auto-vectorizes them
(AVX2/AVX-512): the maximum is an integer reduction over order-preserving keys of the float
bits, and ``exp`` is a branch-free range reduction plus polynomial in float32 (16 lanes per
AVX-512 vector, where a float64 version has 8; docs/benchmarks.md, "numba family").
``y = (x - m) / t`` is numpy's float32 arithmetic; over all float32 ``y`` in [-110, 0],
``exp(y)`` is within 1 ulp of the correctly rounded float32 (0.5% of inputs are 1 ulp off),
subnormals, ``-inf -> 0`` and NaN included, and is 0 exactly where the correctly rounded value
is. (numpy's own SIMD float32 ``np.exp`` is up to 2.52 ulp off; the two differ by <= 3 ulp.)

Only the fast-math flags ``reassoc`` and ``contract`` are used (never ``nnan``/``ninf``, which
would optimise the NaN handling away, nor ``arcp``, which would turn ``/ t`` into ``* (1 / t)``).
Callable from other ``@njit`` code; call them on contiguous 1-D float32 rows.
"""

from __future__ import annotations

import logging

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from portable_verify.core.constants import FLOAT32_TINY

__all__ = ["copy_row", "entropy", "exp_sum", "exp_sum_dot", "log_row", "residual", "residual_stats",
           "row_argmax", "row_max", "row_stats"]



def _probe() -> None:
    """A function for :func:`_cache_usable` to decorate."""


def _cache_usable() -> bool:
    """Whether numba finds a writable cache location for this package's kernels.

    Without one (read-only package directory and HOME, ``NUMBA_CACHE_DIR`` unset or read-only:
    a container image) ``cache=True`` raises at decoration, which made the backend unusable.
    Then every kernel compiles uncached, on each process's first call, and one line says so.
    """
    try:
        njit(cache=True)(_probe)
    except RuntimeError as error:
        logging.getLogger("portable_verify").warning(
            "numba kernels compile uncached (no writable cache location: %s)", error)
        return False
    return True


JIT = {"nogil": True, "cache": _cache_usable()}
"""The options of every kernel of the numba backend (``**JIT``)."""

INNER = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}
"""Added to ``JIT`` for a compiled function that only other compiled functions call (``**JIT,
**INNER``): numba then builds no Python or C entry for it. Why: those wrappers (unboxing every
tuple, record and array argument) were about a tenth of a cold build's CPU time, and only the
entry kernels and the row passes the tests call are entered from Python."""


_INF_BITS = np.int32(0x7F800000)  # abs(bits) above this is NaN
_NEG_INF_KEY = np.int32(-2139095041)  # key of -inf: 0xff800000 ^ 0x7fffffff = 0x807fffff
_POS_INF_KEY = np.int32(0x7F800000)  # key of +inf (non-negative floats are their own key)
_NEG_ZERO_BITS = np.int32(-(2**31))  # bits of -0.0 as int32

# All float32 (a float64 constant would promote the whole computation to float64).
_LOG2E = np.float32(1.4426950408889634)
_ROUND = np.float32(12582912.0)  # 1.5 * 2**23: (x + _ROUND) - _ROUND rounds x to an integer
_ROUND_BITS = 0x4B400000  # bits of _ROUND: bits(x + _ROUND) - _ROUND_BITS is that integer
# Cody-Waite split of ln2: _LN2_HI has 9 significant bits, so k * _LN2_HI is exact for |k| < 2**15
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_Y_MIN = np.float32(-104.0)  # exp(-104) = 6.8e-46 < 2**-150: rounds to 0 (as does all below)
_Y_MAX = np.float32(89.0)  # exp(89) overflows float32 (inf); keeps 2**k in range for y > 0
# exp(r) ~ 1 + r + r**2 * Q(r), Q of degree 4 fitted for relative error (Lawson-weighted least
# squares) on |r| <= 1.02 ln2 / 2, rounded to float32: max rel. error 4.6e-9 (0.08 ulp)
_Q1 = np.float32(0.0013871424598619342)
_Q2 = np.float32(0.008370121009647846)
_Q3 = np.float32(0.04166742041707039)
_Q4 = np.float32(0.16666509211063385)
_Q5 = np.float32(0.4999999701976776)
_ONE = np.float32(1.0)


def _key_ir(builder, i):
    """IR for ``i ^ ((i >> 31) & 0x7fffffff)`` on int32 (numba's own integer ops widen to int64)."""
    sign = builder.ashr(i, ir.Constant(i.type, 31))
    return builder.xor(i, builder.and_(sign, ir.Constant(i.type, 0x7FFFFFFF)))


@intrinsic
def _f32_key(typingctx, x):
    """Order-preserving int32 key of a float32: ``key(a) < key(b)`` iff ``a < b`` (non-NaN,
    with ``-0.0 < +0.0``); NaN keys lie above ``key(+inf)`` or below ``key(-inf)``."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return _key_ir(builder, builder.bitcast(args[0], ir.IntType(32)))

    return types.int32(types.float32), codegen


@intrinsic
def _f32_abs_bits(typingctx, x):
    """``bits(x) & 0x7fffffff`` as int32: above ``0x7f800000`` exactly when ``x`` is NaN."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i = builder.bitcast(args[0], ir.IntType(32))
        return builder.and_(i, ir.Constant(ir.IntType(32), 0x7FFFFFFF))

    return types.int32(types.float32), codegen


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of a float32 as int32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _key_f32(typingctx, k):
    """Inverse of :func:`_f32_key` (the key map is an involution)."""
    if k != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_key_ir(builder, args[0]), ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _scale_pow2(typingctx, p, kt):
    """``p * 2**k * 2**(k - k // 2)`` in float32, ``k = bits(kt) - bits(_ROUND)`` the integer
    that ``kt = k + _ROUND`` holds, ``|k| <= 150``. ``2**k`` is split into two normal factors
    (``2**-150`` and ``2**128`` are not float32 normals); ``p * 2**(k // 2)`` is exact, so the
    second product is the only rounding, subnormal results included. Plain IR (int32 ops, no
    fast-math flags), which numba's int64-widening integer arithmetic would not vectorize as well.
    """
    if p != types.float32 or kt != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        p, kt = args
        k = builder.sub(builder.bitcast(kt, i32), ir.Constant(i32, _ROUND_BITS))
        k1 = builder.ashr(k, ir.Constant(i32, 1))
        k2 = builder.sub(k, k1)

        def pow2(n):  # biased exponent n + 127 in [52, 191]
            e = builder.add(n, ir.Constant(i32, 127))
            return builder.bitcast(builder.shl(e, ir.Constant(i32, 23)), ir.FloatType())

        return builder.fmul(builder.fmul(p, pow2(k1)), pow2(k2))

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _add_reassoc(typingctx, a, b):
    """``a + b`` (float32 or float64) carrying only the ``reassoc`` flag, for a running sum: the
    loop vectorizer may then split the sum into lanes, while every other float op in the loop
    keeps its order (a loop-wide ``reassoc`` would fold the ``(x + M) - M`` rounding of
    :func:`_exp32`). numba's fastmath pass leaves instructions that already carry flags alone."""
    if a != b or a not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        instr = builder.fadd(args[0], args[1])
        instr.flags.append("reassoc")
        return instr

    return a(a, a), codegen


@njit(**JIT)
def row_max(row):
    """``(max, has_nan)`` of a float32 row; NaN is skipped by the max (all NaN or empty: -inf).

    The key ``i ^ ((i >> 31) & 0x7fffffff)`` of the int32 bits ``i`` is ordered like the floats
    (``-0.0`` just below ``+0.0``), so the max is an integer reduction, which vectorizes.
    """
    best = _NEG_INF_KEY
    max_abs = np.int32(0)
    for j in range(row.shape[0]):
        a = _f32_abs_bits(row[j])
        k = _f32_key(row[j])
        k = _NEG_INF_KEY if a > _INF_BITS else k  # NaN of either sign: ignored by the max
        best = max(best, k)
        max_abs = max(max_abs, a)
    return _key_f32(best), max_abs > _INF_BITS


_CHUNK = 1024  # row_argmax: the max of each chunk vectorizes; one chunk is scanned at the end


@njit(**JIT)
def _chunk_max(block):
    """``(max key, max abs bits)`` of a float32 block: the key of ``+-0.0`` is 0 (numpy's
    argmax sees the two zeros as equal), a NaN's is ignored and shows in the abs bits."""
    best = np.int32(-(2**31))
    max_abs = np.int32(0)
    for j in range(block.shape[0]):
        a = _f32_abs_bits(block[j])
        k = _f32_key(block[j])
        k = np.int32(0) if a == 0 else k
        k = _NEG_INF_KEY if a > _INF_BITS else k
        best = max(best, k)
        max_abs = max(max_abs, a)
    return best, max_abs


@njit(**JIT)
def row_argmax(row):
    """First index of the maximum of a float32 row, as ``np.argmax`` (the first NaN wins,
    ``-0.0 == +0.0``): one vectorized pass of chunk maxima, then a scan of the first chunk
    holding the maximum (a scalar ``if x > best`` loop does not vectorize)."""
    n = row.shape[0]
    best = np.int32(-(2**31))
    where = 0
    for c0 in range(0, n, _CHUNK):
        k, a = _chunk_max(row[c0:min(n, c0 + _CHUNK)])
        if a > _INF_BITS:
            for j in range(c0, n):
                if row[j] != row[j]:
                    return j
        if k > best:
            best = k
            where = c0
    for j in range(where, min(n, where + _CHUNK)):
        x = row[j]
        k = np.int32(0) if _f32_abs_bits(x) == 0 else _f32_key(x)
        if k == best:
            return j
    return 0


@njit(**JIT)
def row_stats(row):
    """``(low, has_nan, total)`` of a float32 row, for checking probability rows.

    ``low``: float32 minimum over the non-NaN entries (all NaN or empty: +inf; ``-0.0`` below
    ``+0.0``); ``has_nan``: any NaN, either sign; ``total``: float64 sum of all entries, in
    vectorized (reassociated) order, NaN if any entry is NaN (or +inf and -inf both occur), inf if
    any is inf. One pass: integer min/max over keys as in :func:`row_max`, plus the sum.
    """
    low = _POS_INF_KEY
    max_abs = np.int32(0)
    total = 0.0
    for j in range(row.shape[0]):
        a = _f32_abs_bits(row[j])
        k = _f32_key(row[j])
        k = _POS_INF_KEY if a > _INF_BITS else k  # NaN of either sign: ignored by the min
        low = min(low, k)
        max_abs = max(max_abs, a)
        total = _add_reassoc(total, np.float64(row[j]))
    return _key_f32(low), max_abs > _INF_BITS, total


@njit(nogil=True, inline="always")
def _exp32(y):
    """``exp(y)`` for a float32 ``y <= 0`` (also -inf -> 0, NaN -> NaN), branch-free, in float32.

    ``y = k ln2 + r`` with ``|r| <~ ln2 / 2`` (``k`` rounded by the 1.5 * 2**23 trick, which
    also leaves ``k`` in the low bits of ``kt``; ``ln2`` split in two, Cody-Waite), a degree-6
    polynomial for ``exp(r)``, then times ``2**k`` (:func:`_scale_pow2`, which rounds
    once, subnormals included). At most 1 ulp from the correctly rounded float32 over all float32
    in [-110, 0]. Needs FMA contraction and no reassociation (``(x + M) - M`` must not fold).
    """
    yc = _Y_MIN if y < _Y_MIN else y  # -inf clamps to a value giving 0; NaN stays NaN
    yc = _Y_MAX if yc > _Y_MAX else yc  # only for y > 0 (not a row max): inf, not garbage
    kt = yc * _LOG2E + _ROUND  # k = round(y / ln2) in the low mantissa bits of kt
    kf = kt - _ROUND
    r = yc - kf * _LN2_HI
    r = r - kf * _LN2_LO
    q = _Q1
    q = q * r + _Q2
    q = q * r + _Q3
    q = q * r + _Q4
    q = q * r + _Q5
    q = q * r + _ONE
    q = q * r + _ONE
    return _scale_pow2(q, kt)  # NaN: q is NaN, and so is the product


@njit(**JIT, fastmath={"contract"})
def _exp_row(row, m, t, out):
    """The exp pass, vectorized without reassociation (see :func:`_exp32`)."""
    for j in range(row.shape[0]):
        out[j] = _exp32((row[j] - m) / t)


@njit(**JIT, fastmath={"reassoc"})
def _sum64(out):
    """float64 sum of a float32 row (reassociated, so it vectorizes)."""
    s = 0.0
    for j in range(out.shape[0]):
        s += np.float64(out[j])
    return s


_BLOCK = 512  # exp_sum_dot's float32 partial sums: 8 terms per vector lane, then a lane tree


@njit(**JIT, fastmath={"contract"})
def _exp_sum_dot_block(row, m, t, out):
    """exp, float32 sum and float32 dot of one block in one loop. float32 partial sums keep the
    loop at 16 float32 lanes (any float64 value in it halves the vector width, which costs more
    than a second pass); only the two sums' additions are reassociated (:func:`_add_reassoc`)."""
    s = np.float32(0.0)
    d = np.float32(0.0)
    for j in range(row.shape[0]):
        y = (row[j] - m) / t
        e = _exp32(y)
        out[j] = e
        s = _add_reassoc(s, e)
        d = _add_reassoc(d, e * y if e != 0 else np.float32(0.0))
    return s, d


@njit(**JIT)
def exp_sum(row, m, t, out):
    """``out[j] = float32(exp((row[j] - m) / t))`` (float32 subtract and divide, as numpy);
    returns the float64 sum of ``out``. ``m`` is the row max, ``t > 0`` a normal float32."""
    _exp_row(row, np.float32(m), np.float32(t), out)
    return _sum64(out)


@njit(**JIT)
def exp_sum_dot(row, m, t, out):
    """Like :func:`exp_sum`, also ``d = sum(out[j] * y[j])`` with ``y = (row - m) / t`` and
    zero terms where ``out[j] == 0`` (so ``0 * -inf`` is 0); entropy is ``log(s) - d / s``."""
    m32 = np.float32(m)
    t32 = np.float32(t)
    n = row.shape[0]
    s = 0.0
    d = 0.0
    for b0 in range(0, n, _BLOCK):  # views, not offsets: an offset index loop does not vectorize
        b1 = min(n, b0 + _BLOCK)
        bs, bd = _exp_sum_dot_block(row[b0:b1], m32, t32, out[b0:b1])
        s += np.float64(bs)
        d += np.float64(bd)
    return s, d


@intrinsic
def _mantissa(typingctx, x):
    """The significand of a positive normal float32 as a float32 in ``[1, 2)``."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        i = builder.and_(builder.bitcast(args[0], i32), ir.Constant(i32, 0x007FFFFF))
        return builder.bitcast(builder.or_(i, ir.Constant(i32, 0x3F800000)), ir.FloatType())

    return types.float32(types.float32), codegen


@intrinsic
def _exponent(typingctx, x):
    """The unbiased binary exponent of a positive normal float32, as a float32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        e = builder.lshr(builder.bitcast(args[0], i32), ir.Constant(i32, 23))
        return builder.sitofp(builder.sub(e, ir.Constant(i32, 127)), ir.FloatType())

    return types.float32(types.float32), codegen


_TINY = np.float32(FLOAT32_TINY)  # below it (subnormals) the argument is scaled by 2**24 first
_TWO24 = np.float32(2.0**24)
_SQRT2 = np.float32(1.4142135623730951)
_HALF = np.float32(0.5)
_NAN = np.float32(np.nan)
_INF = np.float32(np.inf)
# log(1 + f) ~ f - f**2 / 2 + f**3 P(f) on sqrt(1/2) - 1 <= f <= sqrt(2) - 1 (Cephes logf)
_L = tuple(np.float32(c) for c in (
    7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
    -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1))


@njit(nogil=True, inline="always")
def _log32(x):
    """``log(x)`` for a float32 ``x``, branch-free: ``x = 2**e * m`` with ``m`` in ``[sqrt(1/2),
    sqrt(2))`` (subnormals scaled by ``2**24`` first), a polynomial in ``f = m - 1`` (exact),
    plus ``e ln2`` split in two (Cody-Waite). ``log(0) = -inf``, ``log(1) = 0``, ``log(inf) =
    inf``, NaN and negative: NaN. Within 1 ulp of the correctly rounded float32 on every
    positive finite float32 (tests/test_numba_math.py checks all of them)."""
    small = x < _TINY
    xs = x * _TWO24 if small else x
    m = _mantissa(xs)
    e = _exponent(xs) - (np.float32(24.0) if small else np.float32(0.0))
    big = m > _SQRT2
    m = m * _HALF if big else m
    e = e + (_ONE if big else np.float32(0.0))
    f = m - _ONE
    z = f * f
    p = _L[0]
    p = p * f + _L[1]
    p = p * f + _L[2]
    p = p * f + _L[3]
    p = p * f + _L[4]
    p = p * f + _L[5]
    p = p * f + _L[6]
    p = p * f + _L[7]
    p = p * f + _L[8]
    y = f * z * p + e * _LN2_LO - _HALF * z
    r = (f + y) + e * _LN2_HI
    r = -_INF if x == np.float32(0.0) else r
    r = _INF if x == _INF else r
    return r if x > np.float32(0.0) or x == np.float32(0.0) else _NAN


@njit(**JIT, fastmath={"contract"})
def log_row(row, out):
    """``out[j] = log(row[j])`` in float32 (:func:`_log32`), vectorized."""
    for j in range(row.shape[0]):
        out[j] = _log32(row[j])


@njit(**JIT, fastmath={"contract"})
def _entropy_block(p):
    """``-sum(p * log(p))`` over one block with ``0 log 0 = 0``, in float32 lanes; and whether
    the block holds a NaN or negative entry (``p >= 0`` fails)."""
    h = np.float32(0.0)
    bad = np.int32(0)
    for j in range(p.shape[0]):
        x = p[j]
        term = x * _log32(x) if x > np.float32(0.0) else np.float32(0.0)
        h = _add_reassoc(h, term)
        bad = max(bad, np.int32(0) if x >= np.float32(0.0) else np.int32(1))
    return -h, bad > 0


@njit(**JIT)
def entropy(p):
    """``(H, finite)``: the natural-log entropy of a float32 probability row (``0 log 0 = 0``),
    float32 terms summed in 512-term float32 blocks and float64 across them (the partition is
    fixed, so the value does not depend on how the blocks are scheduled); ``finite``: no NaN or
    negative entry and ``H`` finite."""
    n = p.shape[0]
    h = 0.0
    ok = True
    for b0 in range(0, n, _BLOCK):
        hb, bad = _entropy_block(p[b0:min(n, b0 + _BLOCK)])
        h += np.float64(hb)
        ok = ok and not bad
    return h, ok and abs(h) < np.inf


@njit(**JIT)
def residual_stats(p, q, out):
    """``out = max(p - q, 0)`` (a NaN difference gives 0), plus, from the same pass, what the
    default validation asks of both rows as distributions: ``(bad_p, total_p, bad_q,
    total_q)``, where ``bad`` means a negative or NaN entry and ``total`` is the row's sum.

    Why one pass, and why float32 totals: a rejected request's residual draw reads its target
    and draft rows once, and separate checking passes cost more than the decision. The totals
    are only compared with 1 within ``1e-3``; summed in float32 lanes (16 per AVX-512 vector)
    their error is ~1e-6, and they stay 16 lanes wide where float64 sums would halve that.
    """
    # Sign and NaN from the bits as int32 min/max reductions (they vectorize where float
    # compares folded into a flag do not): any entry below zero (-0.0 aside) makes the minimum
    # negative, a NaN of either sign lands below zero or above the bits of +inf.
    low_p = np.int32(0)
    low_q = np.int32(0)
    high_p = np.int32(0)
    high_q = np.int32(0)
    total_p = np.float32(0.0)
    total_q = np.float32(0.0)
    for j in range(p.shape[0]):
        x = p[j]
        y = q[j]
        d = x - y
        out[j] = d if d > 0 else np.float32(0.0)
        bx = _f32_bits(x)
        by = _f32_bits(y)
        low_p = min(low_p, np.int32(0) if bx == _NEG_ZERO_BITS else bx)
        low_q = min(low_q, np.int32(0) if by == _NEG_ZERO_BITS else by)
        high_p = max(high_p, bx)
        high_q = max(high_q, by)
        total_p = _add_reassoc(total_p, x)
        total_q = _add_reassoc(total_q, y)
    return (low_p < 0 or high_p > _INF_BITS, np.float64(total_p),
            low_q < 0 or high_q > _INF_BITS, np.float64(total_q))


@njit(**JIT)
def residual(p, scale, q, out):
    """``out = max(p / scale - q, 0)`` in float32 (``scale`` 1 for probabilities, the
    exponentials' sum for logits; a NaN difference gives 0): a loop of its own so that it
    vectorizes."""
    s = np.float32(scale)
    for j in range(p.shape[0]):
        d = p[j] / s - q[j]
        out[j] = d if d > 0 else np.float32(0.0)



@njit(**JIT)
def copy_row(src, dst):
    """``dst[:] = src`` for two rows of one length. Why not the slice assignment: numba's
    broadcast check behind it compiles its error message's string formatting (about a second of
    cold compile, each module that assigns)."""
    for j in range(dst.shape[0]):
        dst[j] = src[j]
