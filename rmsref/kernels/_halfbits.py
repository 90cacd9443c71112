"""bfloat16 / float16 <-> float32 / float64 on 16-bit integer views, inside Numba code.

Numba has no half-precision CPU arrays, so the kernels receive a half array as a 16-bit *integer
view* of the same memory (``x.view(np.uint16)``: no copy) and convert each element in registers.
Which half format the bits are in is carried by the view's type, so that Numba compiles one
specialisation per format and the choice costs nothing at run time:

    float16  -> viewed as np.uint16   (``F16_BITS``)
    bfloat16 -> viewed as np.int16    (``BF16_BITS``; the sign of the integer type is only a tag)

(A closure over a per-format decoder would read better, but Numba's on-disk cache keys closures by
a per-process id, so ``cache=True`` would never hit.)

Formats (sign, exponent, stored mantissa bits; bias):
    float32  1, 8, 23; 127      bfloat16 1, 8, 7; 127      float16 1, 5, 10; 15

Conversions:
- half -> float32 is exact (every half value is a float32). Payloads of NaNs are kept bit for bit
  (as NumPy and ml_dtypes do). ``to_f64`` then widens to float64 in hardware, which quiets a
  signalling NaN (sets its top payload bit): NaN stays NaN with its sign. For float16,
  ``to_f64`` uses the CPU's conversion instruction (x86 F16C: ``f16_bits_to_f32_hw``) when
  Numba's target has it: the same values, a few times fewer instructions than the integer
  route, which stays for other targets and for ``decode_to_f32`` (payloads bit for bit).
- float32 -> half rounds to nearest, ties to even (RNE). Overflow gives +-inf, tiny values give
  subnormals or +-0. ``store_lanes`` rounds 64 float32 values to bfloat16 at once by the CPU's
  instruction, where it has one (x86 AVX512-BF16: ``BF16_HW``), which takes a subnormal as
  zero: its caller keeps to ±0 and normal values (``numba_cpu._y_normal``), or stores by
  ``store_lanes_flushed``, which reports a subnormal among them, and writes that row again.
  NaN: float16 keeps the top 10 payload bits (0x7c01 if they are all zero),
  as NumPy does; bfloat16 gives the canonical quiet NaN with the input's sign, as ml_dtypes does.
- float64 -> half rounds *once* (RNE of the exact float64 value). Going through float32 with RNE
  would round twice, which can differ when float32 rounding lands exactly on a half-way point of
  the half format: 1 + 2^-8 + 2^-30 must give bfloat16 1 + 2^-7, but float32 first rounds it to
  the tie 1 + 2^-8, which then goes to even, 1. We go through float32 with *round to odd*
  (truncate, then set the last bit when inexact), which makes the second rounding correct because
  float32 carries at least two more bits than either half format (Boldo & Melquiond, 2008).
  The kernels use a faster route with the same bits: ``f64_to_bf16_bits`` and
  ``f64_to_f16_bits`` round in float64 by adding and subtracting a magic constant
  (``_round_in_f64``) and then encode the rounded value exactly, branch-free, so that loops
  over them vectorise; the round-to-odd route stays as ``f64_to_bf16_bits_via_odd`` and
  ``f64_to_f16_bits_via_odd``, and the tests check both against each other.
  A bfloat16 output computed in float64 (from float64 inputs) takes a shorter route still:
  ``f64_to_bf16_bits_normal`` rounds by integer arithmetic on the float64 bits, exact for ±0
  and bfloat16's normal range (2^-126 <= |v| < 2^128), and ``bf16_outside_normal`` flags
  every other value so that the kernel writes that row again with ``from_f64``
  (``from_f64_normal`` / ``outside_normal`` below dispatch on the element type). Half outputs
  of half or float32 inputs take float32 for the last step instead (``to_work``,
  ``from_work``: "The working precision" below).
  Note: ``ml_dtypes`` ``float64 -> bfloat16`` casts round twice (through float32); NumPy's
  ``float64 -> float16`` rounds once. NaN: as the float32 -> half rules, payload taken from the
  float64's top payload bits for float16.

``to_f64(v)`` and ``from_f64(v, out)`` are Numba overloads dispatching on the element type
(float32, float64, F16_BITS, BF16_BITS), so one kernel source serves every dtype.

Caveat of ``cache=True``: Numba checks the timestamp of the cached function's own file only. After
editing this file, delete ``rmsref/kernels/__pycache__/*.nbi`` / ``*.nbc`` so the kernels rebuild.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.core import config
from numba.extending import intrinsic, overload

F16_BITS = np.dtype(np.uint16)
BF16_BITS = np.dtype(np.int16)

_jit = njit(cache=True, nogil=True)


# --------------------------------------------------------------------------------------------
# half -> float32 (exact)
# --------------------------------------------------------------------------------------------
@intrinsic
def bf16_bits_to_f32(typingctx, b):
    """bfloat16 bits (a 16-bit integer) -> float32: the bits are the top half of a float32.
    LLVM IR (a shift), not a Numba function: each Numba helper a kernel calls adds to its
    first call's compile time (bench/compile.py)."""
    from llvmlite import ir

    if not (isinstance(b, types.Integer) and b.bitwidth == 16):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        u = builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16))
        return builder.bitcast(u, ir.FloatType())

    return types.float32(b), codegen


@_jit
def f16_bits_to_f32(b):
    """float16 bits -> float32, exactly (subnormals normalised, inf/NaN payload kept).

    Branch-free, so that loops over it vectorise: the exponent and mantissa moved up 13 bits
    are a float32 whose value is the float16's times 2^-112 (a float16 subnormal becomes a
    float32 subnormal with the same mantissa), so one exact multiplication by 2^112 rebiases
    every finite value; inf/NaN (exponent all ones) take the all-ones float32 exponent instead.
    """
    h = np.int32(np.uint16(b))
    sign = np.int32((h & np.int32(0x8000)) << np.int32(16))
    em = np.int32(np.int32(h & np.int32(0x7FFF)) << np.int32(13))  # exponent and mantissa
    finite = np.float32(np.int32(em).view(np.float32) * np.float32(2.0**112))  # exact
    special = np.int32(em | np.int32(0x7F800000))  # inf, or NaN with its payload
    u = special if em >= np.int32(0x7C00 << 13) else np.int32(finite.view(np.int32))
    return np.int32(sign | u).view(np.float32)


def _target_has(feature: str) -> bool:
    """Whether the CPU Numba compiles for has LLVM feature ``feature`` ("f16c": float16
    conversions; "avx512bf16": float32 -> bfloat16 rounding, x86 ``vcvtneps2bf16``).

    Without it LLVM lowers such a conversion to a runtime-library call that Numba's JIT may
    not resolve, so the kernels then keep the integer route. A target set through
    NUMBA_CPU_NAME (a portable cache) counts only with an explicit ``+feature`` in
    NUMBA_CPU_FEATURES.
    """
    if config.CPU_NAME or config.CPU_FEATURES:
        return "+" + feature in (config.CPU_FEATURES or "").split(",")
    import llvmlite.binding as llvm

    return bool(llvm.get_host_cpu_features().get(feature, False))


#: Whether ``to_f64`` widens float16 with the hardware conversion (one vcvtph2ps per 8 or 16
#: elements in a vectorised loop, against about ten integer instructions).
F16C = _target_has("f16c")


@intrinsic
def f16_bits_to_f32_hw(typingctx, b):
    """float16 bits -> float32 by LLVM's ``fpext half to float`` (F16C only: see ``F16C``).

    Exact; a signalling NaN comes back quiet (its top payload bit set), as ``to_f64``'s
    widening makes it anyway.
    """
    from llvmlite import ir

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


# --------------------------------------------------------------------------------------------
# float32 -> half (round to nearest, ties to even)
# --------------------------------------------------------------------------------------------
@_jit
def f32_to_bf16_bits(v):
    """float32 -> bfloat16 bits, RNE; NaN -> sign | 0x7fc0 (ml_dtypes' canonical NaN).

    Branch-free (the NaN case is a select) in int32 arithmetic, so that loops over it
    vectorise; only the low 16 bits of the shifted sums are kept.
    """
    u = np.int32(np.float32(v).view(np.int32))
    # Add just under half an ulp of bfloat16, plus one when the kept lsb is odd (ties to even);
    # the carry ripples into the exponent, and past the largest finite value into inf.
    lsb = (u >> np.int32(16)) & np.int32(1)
    rounded = np.uint16(np.int32(u + np.int32(0x7FFF) + lsb) >> np.int32(16))
    nan = np.uint16(((u >> np.int32(16)) & np.int32(0x8000)) | np.int32(0x7FC0))
    return nan if (u & np.int32(0x7FFFFFFF)) > np.int32(0x7F800000) else rounded


@_jit
def f32_to_f16_bits(v):
    """float32 -> float16 bits, RNE, with float16 subnormals, overflow to inf, NumPy's NaNs."""
    u = np.float32(v).view(np.uint32)
    sign = np.uint16((u >> np.uint32(16)) & np.uint32(0x8000))
    a = u & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000):  # NaN: keep the top payload bits, never turn it into inf
        m = (a >> np.uint32(13)) & np.uint32(0x3FF)
        if m == np.uint32(0):
            m = np.uint32(1)
        return np.uint16(sign | np.uint16(np.uint32(0x7C00) | m))
    if a >= np.uint32(0x477FF000):  # >= 65520 = 65504 + half an ulp: the tie goes to even = inf
        return np.uint16(sign | np.uint16(0x7C00))
    if a < np.uint32(0x38800000):  # below 2^-14: float16 subnormal or zero, quantum 2^-24
        r = np.uint32(a).view(np.float32) * np.float32(16777216.0)  # |v| * 2^24, exact, < 1024
        # rint is RNE; a result of 1024 is exactly the smallest normal's bit pattern
        return np.uint16(sign | np.uint16(np.rint(r)))
    # normal: rebias 127 -> 15, then drop 13 bits with RNE (carry may reach the exponent)
    lsb = (a >> np.uint32(13)) & np.uint32(1)
    a = a - np.uint32(112 << 23)
    return np.uint16(sign | np.uint16((a + np.uint32(0xFFF) + lsb) >> np.uint32(13)))


# --------------------------------------------------------------------------------------------
# float64 -> half (one rounding, via float32 with round-to-odd)
# --------------------------------------------------------------------------------------------
@_jit
def f64_to_f32_round_odd(v):
    """float64 -> float32 rounded to odd: truncate towards zero, set the last bit if inexact.

    Overflow gives the largest finite float32 with its last bit set, which the half conversions
    then round to inf, as they should; NaN stays NaN. Branch-free int32 arithmetic, so that
    loops over it vectorise.
    """
    t = np.float32(v)  # RNE
    back = np.float64(t)
    u = np.int32(t.view(np.int32))
    u = np.int32(u - np.int32(abs(back) > abs(v)))  # RNE went away from zero: one ulp back
    return np.int32(u | np.int32(back != v)).view(np.float32)  # the last bit is sticky


@_jit
def f64_to_bf16_bits_via_odd(v):
    """float64 -> bfloat16 bits, rounded once (RNE), through float32 rounded to odd (the
    reference construction; ``f64_to_bf16_bits`` gives the same bits faster)."""
    return f32_to_bf16_bits(f64_to_f32_round_odd(v))  # NaN -> canonical NaN, sign kept


@_jit
def _round_in_f64(v, p_min, c_scale):
    """|v| rounded once (RNE) to a precision of ``c_scale`` bits below its binade, in float64.

    The classic "add and subtract a magic constant": for 2^e <= |v| < 2^(e+1), c = c_scale·2^e
    with c_scale = 1.5·2^(52 - q) has float64 ulp 2^(e-q), and |v| + c stays in c's binade, so
    the hardware addition rounds |v| to a multiple of 2^(e-q) with RNE (c is an even multiple
    of that ulp, so "even" is the half format's even), and subtracting c is exact. 2^e is
    clamped to [p_min, 2^200]: below the half format's smallest normal p_min its quantum is
    fixed (subnormals), and above 2^200 the result overflows the half format anyway. Returns
    the magnitude; NaN stays NaN.
    """
    a = abs(v)
    # 2^e as a float64: a's exponent field alone (0 for zero and float64 subnormals, inf for
    # inf/NaN), then clamped
    p = np.int64(np.float64(a).view(np.int64) & np.int64(0x7FF0000000000000)).view(np.float64)
    p = min(max(p, p_min), 2.0**200)
    c = p * c_scale
    return (a + c) - c


@_jit
def f64_to_bf16_bits(v):
    """float64 -> bfloat16 bits, rounded once (RNE), in float64 arithmetic.

    ``_round_in_f64`` rounds |v| to bfloat16's 8 significant bits (quantum 2^(e-7), clamped at
    the subnormal quantum 2^-133); everything rounded to 2^128 or more becomes inf through
    float32. The rounded value has 8 significant bits, so float32 holds it exactly and its top
    16 bits are the bfloat16. The sign is put back with copysign (so -0 stays -0); NaN gives
    ml_dtypes' canonical sign | 0x7fc0. Only float64 operations and one select: the loop
    vectoriser handles it (about 2-3x faster than the round-to-odd route, whose int32
    arithmetic Numba widens to int64 lanes). Tested bit for bit against an exact reference.
    """
    r = math.copysign(_round_in_f64(v, 2.0**-126, 1.5 * 2.0**45), v)
    bits = np.int16(np.float32(r).view(np.int32) >> np.int32(16))
    nan = np.int16(-32768 | 0x7FC0) if math.copysign(1.0, v) < 0.0 else np.int16(0x7FC0)
    return nan if v != v else bits


@_jit
def f64_to_f16_bits(v):
    """float64 -> float16 bits, rounded once (RNE); NaN payload as NumPy's double -> half.

    ``_round_in_f64`` rounds |v| to float16's 11 significant bits (quantum 2^(e-10), clamped
    at the subnormal quantum 2^-24); the rounded magnitude r (capped at 65536) is then encoded
    exactly, the inverse of ``f16_bits_to_f32``: r·2^-112 in float32 is exact (a float16
    subnormal r = k·2^-24 becomes the float32 subnormal k·2^13·2^-149) and its bits moved down
    13 places are the float16's, with r >= 65536 (everything from 65520 = 65504 + half its ulp
    up, rounded) landing on the all-ones exponent: inf. Branch-free (selects), so loops over
    it vectorise, unlike ``f64_to_f16_bits_via_odd`` (same bits, tested on every rounding
    boundary).
    """
    r = min(_round_in_f64(v, 2.0**-14, 1.5 * 2.0**42), 65536.0)
    scaled = np.float32(np.float32(r) * np.float32(2.0**-112))  # exact
    bits = np.int32(scaled.view(np.int32) >> np.int32(13))
    u = np.float64(v).view(np.int64)
    sign = np.int32((u >> np.int64(48)) & np.int64(0x8000))
    m = np.int32((u >> np.int64(42)) & np.int64(0x3FF))  # NaN: NumPy's top payload bits
    nan = np.int32(0x7C00) | (m if m != np.int32(0) else np.int32(1))
    return np.uint16(sign | (nan if v != v else bits))


@_jit
def f64_to_f16_bits_via_odd(v):
    """float64 -> float16 bits through float32 rounded to odd (the reference construction;
    ``f64_to_f16_bits`` gives the same bits faster)."""
    if v != v:
        u = np.float64(v).view(np.uint64)
        s = np.uint16(0x8000) if u >> np.uint64(63) else np.uint16(0)
        m = np.uint16((u >> np.uint64(42)) & np.uint64(0x3FF))
        if m == np.uint16(0):
            m = np.uint16(1)
        return np.uint16(s | np.uint16(0x7C00) | m)
    return f32_to_f16_bits(f64_to_f32_round_odd(v))


# --------------------------------------------------------------------------------------------
# float64 -> bfloat16 for the normal range only (one rounding, integer arithmetic on the bits)
# --------------------------------------------------------------------------------------------
#: |v|'s float64 bits in [BF16_NORMAL_LO, BF16_NORMAL_HI): 2^-126 <= |v| < 2^128, the values
#: whose bfloat16 is normal or (rounded up past the largest finite value) inf.
BF16_NORMAL_LO = (1023 - 126) << 52
BF16_NORMAL_HI = (1023 + 128) << 52


@_jit
def f64_to_bf16_bits_normal(v):
    """float64 -> bfloat16 bits rounded once (RNE), exact for ±0 and for 2^-126 <= |v| < 2^128
    (``bf16_outside_normal`` is False); other values give wrong bits.

    Integer arithmetic on v's bits, which hold exponent and mantissa side by side: adding
    2^44 - 1, plus one when the kept lsb (bit 45) is odd (ties to even), then shifting 45 bits
    out rounds the 52-bit mantissa to bfloat16's 7; a carry ripples into the exponent, and past
    the largest finite value into the all-ones exponent, inf. The exponent is rebiased from
    1023 to 127 in the same addition (a multiple of 2^45, so it commutes with the shift). About
    half the vector instructions of ``f64_to_bf16_bits``, whose clamps serve only the rare
    subnormal, overflowing and NaN values.
    """
    u = np.float64(v).view(np.int64)
    a = u & np.int64(0x7FFFFFFFFFFFFFFF)  # |v|
    lsb = (a >> np.int64(45)) & np.int64(1)
    r = (a + np.int64((1 << 44) - 1 - ((1023 - 127) << 52)) + lsb) >> np.int64(45)
    sign = (u >> np.int64(48)) & np.int64(0x8000)
    return np.int16(sign | (r if a != np.int64(0) else np.int64(0)))


@_jit
def bf16_outside_normal(v):
    """Whether ``f64_to_bf16_bits_normal(v)`` may be wrong: v is not ±0 and |v| < 2^-126
    (a bfloat16 subnormal) or |v| >= 2^128 (overflow, inf, NaN)."""
    a = np.float64(v).view(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)
    return (a < np.int64(BF16_NORMAL_LO) or a >= np.int64(BF16_NORMAL_HI)) and a != np.int64(0)


# --------------------------------------------------------------------------------------------
# Type-dispatched helpers used by the kernels
# --------------------------------------------------------------------------------------------
def to_f64(v):
    """An element (float32, float64, or half bits tagged by the view type) as float64."""
    raise NotImplementedError("to_f64 is only callable from Numba-compiled code")


def from_f64(v, out):
    """float64 ``v`` rounded once to the element type of array ``out`` (half: its bits)."""
    raise NotImplementedError("from_f64 is only callable from Numba-compiled code")


@overload(to_f64, jit_options={"nogil": True})
def _to_f64_impl(v):
    if isinstance(v, types.Float):
        return lambda v: np.float64(v)
    if v == types.uint16:
        if F16C:
            return lambda v: np.float64(f16_bits_to_f32_hw(v))
        return lambda v: np.float64(f16_bits_to_f32(v))
    if v == types.int16:
        return lambda v: np.float64(bf16_bits_to_f32(v))
    return None


@overload(from_f64, jit_options={"nogil": True})
def _from_f64_impl(v, out):
    dt = out.dtype
    if dt == types.float64:
        return lambda v, out: np.float64(v)
    if dt == types.float32:
        return lambda v, out: np.float32(v)  # LLVM fptrunc: RNE, one rounding
    if dt == types.uint16:
        return lambda v, out: f64_to_f16_bits(v)
    if dt == types.int16:
        return lambda v, out: f64_to_bf16_bits(v)
    return None


def from_f64_normal(v, out):
    """As ``from_f64``, but exact only where ``outside_normal(v, out)`` is False (always, for
    float16, float32 and float64 outputs). A kernel writes a row with it and, if any element
    was outside, writes that row again with ``from_f64``."""
    raise NotImplementedError("from_f64_normal is only callable from Numba-compiled code")


def outside_normal(v, out):
    """Whether ``from_f64_normal(v, out)`` may differ from ``from_f64(v, out)``."""
    raise NotImplementedError("outside_normal is only callable from Numba-compiled code")


@overload(from_f64_normal, jit_options={"nogil": True})
def _from_f64_normal_impl(v, out):
    if out.dtype == types.int16:
        return lambda v, out: f64_to_bf16_bits_normal(v)
    # float16: a float16 result is subnormal (|y| < 2^-14) far more often than a bfloat16 one
    # (x·w with standard normal x and weight: 73 % of rows of 4096 hold one), so most rows
    # would be written twice; its branch-free from_f64 handles every value in one pass.
    return lambda v, out: from_f64(v, out)


@overload(outside_normal, jit_options={"nogil": True})
def _outside_normal_impl(v, out):
    if out.dtype == types.int16:
        return lambda v, out: bf16_outside_normal(v)
    return lambda v, out: False


# --------------------------------------------------------------------------------------------
# The working precision of the element-wise arithmetic (y, dx): float32 for half outputs
# --------------------------------------------------------------------------------------------
# A half output (bfloat16/float16) from half or float32 inputs takes float32 for the last step,
# like torch's opmath: either the arithmetic itself (RMSNorm's y, the fused add's, LayerNorm's
# without a bias: ``to_work`` gives the inputs as float32, exactly, and ``as_work``/``work_row``
# the row's rstd and weight) or a float64 result rounded to float32 first (``as_work``: dx,
# whose terms can cancel); ``from_work`` then rounds the float32 value to the half format (RNE),
# and a vector of float32 holds twice the elements of a vector of float64. Every other output
# (float32, float64, or a half output of float64 inputs) is computed in float64 and rounded
# once, as the oracle's.
#
# The contract this gives for half outputs (rmsref.kernels.numba_cpu, tested on every bit
# pattern in tests/test_numba_cpu_half.py): >= 99.9 % of elements bit-equal to the oracle's
# float64 value rounded once, the rest one ulp away; ``outside_work`` flags a value that
# rounds to inf (which may be one that rounded once is finite) and NaN,
# ``lost_in_row`` an x·rstd that underflowed float32 (RMSNorm's y), and ``work_in_range``
# rows whose rstd would make float32 products overflow or lose bits, and the kernels write
# those rows again in float64, rounded once (the oracle's bits).


def _f32_route(v, out) -> bool:
    """Whether elements of Numba type ``v`` written into array ``out`` are computed in float32."""
    return out.dtype in (types.int16, types.uint16) and v != types.float64


def to_work(v, out):
    """Element ``v`` (float32, float64, or half bits) in the working precision of ``out``."""
    raise NotImplementedError("to_work is only callable from Numba-compiled code")


def as_work(v, x, out):
    """A float64 value (a row's rstd, or a dx computed in float64) in the working precision of
    array ``x``'s elements written into ``out``: float32 (RNE) on the float32 route, else
    itself; ``from_work`` then rounds a result to the half format (twice rounded: see the note
    above)."""
    raise NotImplementedError("as_work is only callable from Numba-compiled code")


def work_row(w, x, out):
    """The float64 row ``w`` in that working precision: ``w`` itself, or a float32 copy."""
    raise NotImplementedError("work_row is only callable from Numba-compiled code")


def work_in_range(rstd_s, x, out):
    """Whether a row with this rstd may take the float32 route: 2^-100 <= rstd_s <= 2^100, so
    that x·rstd and its products stay clear of float32's overflow and underflow (always True
    for float64 work)."""
    raise NotImplementedError("work_in_range is only callable from Numba-compiled code")


def from_work(v, out):
    """A working-precision value rounded to ``out``'s element type; exact where
    ``outside_work(v, out)`` is False (a kernel writes a flagged row again in float64)."""
    raise NotImplementedError("from_work is only callable from Numba-compiled code")


def outside_work(v, out):
    """Whether ``from_work(v, out)`` may differ from the row's float64 route: for a float32
    ``v``, one that rounds to inf or is NaN (``F32_BITS_TO_INF``)."""
    raise NotImplementedError("outside_work is only callable from Numba-compiled code")


def note_magnitude(key, xw, x, out):
    """A row's running key of its smallest nonzero |xw| with one more element taken in:
    max(key, ``magnitude_key(xw)``) where ``lost_in_row`` applies to a row of array ``x``
    written into ``out`` (a half output computed in float32 from bfloat16 or float32 x), else
    ``key`` itself (the call compiles to nothing). ``xw`` is an element of ``x`` (its bits:
    a uint16 key for bfloat16) or a float32 value (the fused add's h: a uint32 key); a key of
    the other width is a typing error, not a silent truncation."""
    raise NotImplementedError("note_magnitude is only callable from Numba-compiled code")


def lost_in_row(key, rstd_w, x, out):
    """Whether an xhat = xw·rstd_w of a nonzero xw of the row whose keys ``note_magnitude``
    kept (``key``, their maximum: the smallest nonzero |xw|, m) fell below float32's normal
    range (2^-126), where it keeps fewer than 24 bits or none: y = xhat·w' can still be a
    normal half value (a tiny x beside a large one, times a large weight), so such a row is
    written again in float64. Rounding is monotonic, so fl(m·rstd_w) is the smallest
    |xhat| of the row's nonzero xw: one test per row gives the test of every element. Always
    False for float64 work, and for float16 x: its smallest nonzero magnitude is 2^-24 (and a
    fused add's h = x + r is a multiple of it), and the float32 route takes rows with
    rstd >= 2^-100 only (``work_in_range``), so |xhat| >= 2^-124."""
    raise NotImplementedError("lost_in_row is only callable from Numba-compiled code")


def rounded_sum(a, b, like):
    """h = a + b of two elements (float32, float64, or half bits tagged by their view type),
    exact in float64 where it is representable there, rounded once (RNE) to the type of the
    scalar ``like`` (a zero of an array's element type, ``numba_cpu._rounding_tag``) and
    back to float64, exactly; the float64 sum itself when ``like`` is None. Which of the two
    is chosen when the kernel is compiled (None and a scalar are different types), not by a
    branch: a branch on a constant flag kept the fused add's element loops from vectorising,
    and so did an array for ``like`` (a reference count update per element).

    Where a, b and ``like`` are one half format the sum is formed in float32 and rounded to
    the half format from there, as ``sum_to`` rounds the new residual: the same bits as one
    rounding (the theorem in ``sum_to``), in float32 lanes, by the CPU for float16 (F16C) and
    for bfloat16 by ``f32_to_bf16_bits_rne``, exact for every finite value and inf. A NaN sum
    stays a NaN there too: its float32 payload is a bfloat16 input's (or the default NaN's),
    whose low 16 bits are zero, so the rounding carries nothing into its exponent or sign.
    ``f32_to_bf16_bits``, whose NaN select needs no such argument, made the fused add's
    "rounded-sum" bfloat16 rows 40-60 % slower in cache on an AVX-512 CPU (bench/halfrow.py's
    rows, N = 4096: backward 1.14 against 0.82 ns per element, forward 0.83 against 0.51)."""
    raise NotImplementedError("rounded_sum is only callable from Numba-compiled code")


def sum_to(h, a, b, out):
    """The exact float64 sum h = a_j + b_k of an element of array ``a`` and one of array
    ``b``, rounded to the element type of array ``out``: through float32 when ``a``, ``b`` and
    ``out`` hold the same half format, else once from float64 (``from_f64``).

    The float32 route rounds twice (RNE to float32, then ``from_work``'s RNE to the half type),
    and that gives the once-rounded bits for a sum of two half values: double rounding of
    a + b for p-bit a and b through a format of p' >= 2p + 2 bits is innocuous (Figueroa,
    1995), and float32's 24 bits are at least 2·8 + 2 (bfloat16) and 2·11 + 2 (float16).
    Subnormal sums are exact in float32. It is not so for a float32 operand (the rounding of
    1 + (2^-8 + 2^-30) in the module note), hence the same-format condition. A non-finite h may
    not keep the oracle's NaN bits: the kernel writes such a row again with ``from_f64``.
    """
    raise NotImplementedError("sum_to is only callable from Numba-compiled code")


@overload(rounded_sum, jit_options={"nogil": True})
def _rounded_sum_impl(a, b, like):
    if isinstance(like, types.NoneType) or like == types.float64:
        return lambda a, b, like: to_f64(a) + to_f64(b)
    if like == types.float32:  # LLVM fptrunc: RNE, one rounding
        return lambda a, b, like: np.float64(np.float32(to_f64(a) + to_f64(b)))
    if a == b == like == types.int16:  # bfloat16 throughout: through float32
        return lambda a, b, like: np.float64(bf16_bits_to_f32(f32_to_bf16_bits_rne(
            bf16_bits_to_f32(a) + bf16_bits_to_f32(b))))
    if a == b == like == types.uint16 and F16C:  # float16 throughout: by the CPU
        return lambda a, b, like: np.float64(f16_bits_to_f32_hw(f32_to_f16_bits_hw(
            f16_bits_to_f32_hw(a) + f16_bits_to_f32_hw(b))))
    if like == types.uint16:
        return lambda a, b, like: to_f64(f64_to_f16_bits(to_f64(a) + to_f64(b)))
    if like == types.int16:
        return lambda a, b, like: to_f64(f64_to_bf16_bits(to_f64(a) + to_f64(b)))
    return None


@overload(sum_to, jit_options={"nogil": True})
def _sum_to_impl(h, a, b, out):
    if out.dtype in (types.int16, types.uint16) and a.dtype == out.dtype == b.dtype:
        return lambda h, a, b, out: from_work(np.float32(h), out)
    return lambda h, a, b, out: from_f64(h, out)


@overload(to_work, jit_options={"nogil": True})
def _to_work_impl(v, out):
    if not _f32_route(v, out):
        return lambda v, out: to_f64(v)
    if v == types.uint16:
        if F16C:
            return lambda v, out: f16_bits_to_f32_hw(v)
        return lambda v, out: f16_bits_to_f32(v)
    if v == types.int16:
        return lambda v, out: bf16_bits_to_f32(v)
    return lambda v, out: np.float32(v)


@overload(as_work, jit_options={"nogil": True})
def _as_work_impl(v, x, out):
    if _f32_route(x.dtype, out):
        return lambda v, x, out: np.float32(v)
    return lambda v, x, out: v


@overload(work_row, jit_options={"nogil": True})
def _work_row_impl(w, x, out):
    if _f32_route(x.dtype, out):
        return lambda w, x, out: w.astype(np.float32)
    return lambda w, x, out: w


@overload(work_in_range, jit_options={"nogil": True})
def _work_in_range_impl(rstd_s, x, out):
    if _f32_route(x.dtype, out):
        return lambda rstd_s, x, out: 2.0**-100 <= rstd_s <= 2.0**100
    return lambda rstd_s, x, out: True


@intrinsic
def f32_to_f16_bits_hw(typingctx, v):
    """float32 -> float16 bits by LLVM's ``fptrunc float to half`` (F16C only: see ``F16C``):
    the hardware's RNE, with subnormals, overflow to inf and quiet NaNs."""
    from llvmlite import ir

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def f32_to_bf16_bits_rne(typingctx, v):
    """float32 -> bfloat16 bits, RNE, exact for every finite value and ±inf (subnormals too:
    a bfloat16 subnormal is the top half of a float32 subnormal); a NaN may come out wrong
    (a payload carried into the sign), which is why ``outside_work`` flags it. The
    ``f32_to_bf16_bits`` rounding without its NaN select, which kept loops from vectorising,
    written as LLVM IR (integer arithmetic on the float32 bits; a Numba function adds to a
    kernel's first call, bench/compile.py)."""
    from llvmlite import ir

    if v != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        u = builder.bitcast(args[0], i32)
        # just under half an ulp of bfloat16, plus one when the kept lsb is odd (ties to even)
        lsb = builder.and_(builder.lshr(u, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = builder.add(builder.add(u, ir.Constant(i32, 0x7FFF)), lsb)
        return builder.trunc(builder.lshr(rounded, ir.Constant(i32, 16)), ir.IntType(16))

    return types.int16(v), codegen


def _bfloat_type():
    """LLVM's ``bfloat`` type, which llvmlite has no class for (None where this llvmlite's
    float types cannot be extended: the kernels then keep the integer rounding)."""
    try:
        from llvmlite.ir import types as irt

        class BFloatType(irt._BaseFloatType):
            null = "0.0"
            intrinsic_name = "bf16"

            def __str__(self):
                return "bfloat"

        BFloatType._create_instance()
        return BFloatType()
    except (AttributeError, TypeError):  # pragma: no cover (another llvmlite)
        return None


_BFLOAT = _bfloat_type()

#: Whether the CPU Numba compiles for rounds float32 to bfloat16 in hardware, which
#: ``store_lanes`` needs: LLVM's ``fptrunc`` to ``bfloat`` on a vector of 16, which x86 with
#: AVX512-BF16 does in one ``vcvtneps2bf16`` (RNE, as ``f32_to_bf16_bits_rne``, but it takes a
#: subnormal input as zero and gives zero for a subnormal result). LLVM vectorises no loop of
#: scalar bfloat conversions, hence the explicit vector.
BF16_HW = _target_has("avx512bf16") and _BFLOAT is not None

#: Whether ``store_lanes_flushed`` can also tell which lanes the CPU flushes (x86
#: ``vfpclassps``, AVX512-DQ, which every CPU with AVX512-BF16 has).
BF16_HW_FLUSHED = BF16_HW and _target_has("avx512dq")


@intrinsic
def store_lanes(typingctx, lanes, out, idx):
    """out[b, i, j0 .. j0 + 63] (``idx`` = (b, i, j0)) = the 64 float32 ``lanes`` (a C array)
    rounded (RNE) to bfloat16 bits by the CPU (``BF16_HW``), ``out`` a C-contiguous bfloat16
    view: four vector ``fptrunc`` to ``bfloat`` and stores. The same bits as
    ``f32_to_bf16_bits_rne`` where every lane is ±0 or a normal float32 below the tie that
    rounds to inf; a caller keeps to that (``numba_cpu._y_normal``) or writes the row again.
    No such function on other CPUs or layouts (a typing error): a lane-by-lane integer
    rounding here was twice as slow as the kernels' element loop, which LLVM vectorises.
    (LLVM IR written here, not Numba code: every helper Numba compiles adds to the kernel's
    first call, bench/compile.py.)"""
    if not (BF16_HW and _bf16_c_view(out)):
        return None

    def codegen(context, builder, signature, args):
        _emit_store_lanes(context, builder, signature, args)
        return context.get_dummy_value()

    return types.none(lanes, out, idx), codegen


@intrinsic
def store_lanes_flushed(typingctx, lanes, out, idx):
    """``store_lanes``, returning whether a lane is a nonzero float32 below the normal range
    (subnormal), which the CPU rounds to ±0 where the integer rounding keeps a bfloat16
    subnormal: a caller writes such a row again (``numba_cpu._bwd_row_and_dot_f32``). One
    ``vfpclassps`` per 16 lanes (``BF16_HW_FLUSHED``), where a test of each element in the
    caller's loop took three instructions and 5 % of the backward in cache."""
    if not (BF16_HW_FLUSHED and _bf16_c_view(out)):
        return None

    def codegen(context, builder, signature, args):
        return _emit_store_lanes(context, builder, signature, args, flushed=True)

    return types.boolean(lanes, out, idx), codegen


def _bf16_c_view(out) -> bool:
    """Whether Numba type ``out`` is a C-contiguous 3-D bfloat16 view (int16)."""
    return (isinstance(out, types.Array) and out.dtype == types.int16 and out.ndim == 3
            and out.layout == "C")


def _emit_store_lanes(context, builder, signature, args, flushed=False):
    """The IR of ``store_lanes`` (and, with ``flushed``, of ``store_lanes_flushed``'s flag,
    returned as an i1)."""
    from llvmlite import ir
    from numba.core import cgutils

    lty, oty = signature.args[0], signature.args[1]
    src = context.make_array(lty)(context, builder, args[0]).data
    arr = context.make_array(oty)(context, builder, args[1])
    b, i, j0 = cgutils.unpack_tuple(builder, args[2])
    i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
    v16f = ir.VectorType(ir.FloatType(), 16)
    v16i = ir.VectorType(i16, 16)
    v16b = ir.VectorType(ir.IntType(1), 16)
    fpclass = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v16b, [v16f, i32]), "llvm.x86.avx512.fpclass.ps.512")
    any_flushed = ir.Constant(v16b, None)
    for q in range(0, 64, 16):
        at = builder.bitcast(builder.gep(src, [ir.Constant(i64, q)]), v16f.as_pointer())
        lane = builder.load(at, align=4)
        v = builder.fptrunc(lane, ir.VectorType(_BFLOAT, 16))
        j = builder.add(j0, ir.Constant(j0.type, q))
        dst = cgutils.get_item_pointer(context, builder, oty, arr, [b, i, j])
        builder.store(builder.bitcast(v, v16i), builder.bitcast(dst, v16i.as_pointer()),
                      align=2)
        if flushed:  # 0x20: the denormal class
            any_flushed = builder.or_(any_flushed,
                                      builder.call(fpclass, [lane, ir.Constant(i32, 0x20)]))
    return builder.icmp_unsigned("!=", builder.bitcast(any_flushed, i16), ir.Constant(i16, 0))


@intrinsic
def magnitude_key(typingctx, e):
    """A key of element ``e`` (half bits or float32) whose maximum over a row gives the row's
    smallest nonzero |x| (``smallest_magnitude``): 0 for ±0, else 2^w − |bits| in w-bit
    unsigned arithmetic (w = 16 or 32), so a smaller magnitude has a larger key (the bits of
    a nonnegative float order as its value). A maximum of 16-bit keys is one instruction per
    32 elements."""
    from llvmlite import ir

    if e in (types.int16, types.uint16):
        key, mask = types.uint16, 0x7FFF
    elif e == types.float32:
        key, mask = types.uint32, 0x7FFFFFFF
    else:
        return None

    def codegen(context, builder, signature, args):
        it = ir.IntType(key.bitwidth)
        bits = builder.bitcast(args[0], it)
        return builder.sub(ir.Constant(it, 0), builder.and_(bits, ir.Constant(it, mask)))

    return key(e), codegen


def _umax(builder, a, b):
    """The unsigned maximum of two integer vectors (LLVM recognises the select as one)."""
    return builder.select(builder.icmp_unsigned(">", a, b), a, b)


def emit_block_keys(context, builder, g_ty, g, x_ty, x, idx, lo, hi):
    """LLVM IR (for an intrinsic's codegen): running maxima over a row's 64-element blocks of
    two 3-d arrays of 16-bit half bits ``g``, ``x`` (Numba types ``g_ty``, ``x_ty``), lane by
    lane: for j = j0 + l (``idx`` = (b, i, j0)), lo[l] = max(lo[l], ``magnitude_key`` of g_j
    and of x_j) and hi[l] = max(hi[l], |g_j| and |x_j| as bits, the sign cleared), with
    ``lo``, ``hi`` pointers to 64 uint16 (``numba_cpu._key_lanes``). So the maximum of lo
    gives the smallest nonzero magnitude among both rows' elements (``smallest_magnitude``)
    and that of hi the largest. Vector code, 32 lanes to an instruction; contiguous rows are
    read as vectors, strided ones element by element."""
    from llvmlite import ir
    from numba.core import cgutils

    b, i, j0 = cgutils.unpack_tuple(builder, idx)
    v32 = ir.VectorType(ir.IntType(16), 32)

    def block(aryty, ary, q):  # 32 elements from j0 + q, as a <32 x i16>
        arr = context.make_array(aryty)(context, builder, ary)
        if aryty.layout == "C":
            j = builder.add(j0, ir.Constant(j0.type, q))
            at = cgutils.get_item_pointer(context, builder, aryty, arr, [b, i, j])
            return builder.load(builder.bitcast(at, v32.as_pointer()), align=2)
        v = ir.Constant(v32, ir.Undefined)
        for lane in range(32):
            j = builder.add(j0, ir.Constant(j0.type, q + lane))
            at = cgutils.get_item_pointer(context, builder, aryty, arr, [b, i, j])
            v = builder.insert_element(v, builder.load(at), ir.Constant(ir.IntType(32), lane))
        return v

    mask, zero = ir.Constant(v32, [0x7FFF] * 32), ir.Constant(v32, [0] * 32)
    for q in (0, 32):
        mg, mx = builder.and_(block(g_ty, g, q), mask), builder.and_(block(x_ty, x, q), mask)
        key = _umax(builder, builder.sub(zero, mg), builder.sub(zero, mx))
        for ptr, new in ((lo, key), (hi, _umax(builder, mg, mx))):
            at = builder.bitcast(builder.gep(ptr, [ir.Constant(ir.IntType(64), q)]),
                                 v32.as_pointer())
            builder.store(_umax(builder, builder.load(at, align=2), new), at, align=2)


def emit_lanes_max(builder, keys):
    """LLVM IR: the largest of 64 uint16 keys at pointer ``keys``, by one vector reduction."""
    from llvmlite import ir
    from numba.core import cgutils

    v64 = ir.VectorType(ir.IntType(16), 64)
    reduce = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.IntType(16), [v64]), "llvm.vector.reduce.umax.v64i16")
    return builder.call(reduce, [builder.load(builder.bitcast(keys, v64.as_pointer()), align=2)])


@intrinsic
def smallest_magnitude(typingctx, key, x):
    """The float32 value of the smallest nonzero |x_j| from the maximum ``key`` of
    ``magnitude_key`` over a row of array ``x`` (bfloat16 or float16 bits, or float32), or
    over values of the scalar type of ``x`` (a float32 zero for float32 values); inf
    when every x_j is ±0 (key 0). For float16 the magnitude's bits moved up 13 places, times
    2^112 (exact: ``f16_bits_to_f32``), so finite values only: a row with an inf or NaN never
    takes the bound (its rstd leaves the float32 route's range)."""
    from llvmlite import ir

    fmt = x.dtype if isinstance(x, types.Array) else x
    if fmt not in (types.int16, types.uint16, types.float32) or key.bitwidth != fmt.bitwidth:
        return None

    def codegen(context, builder, signature, args):
        it, i32, f32 = ir.IntType(key.bitwidth), ir.IntType(32), ir.FloatType()
        mask = 0x7FFF if key.bitwidth == 16 else 0x7FFFFFFF
        bits = builder.and_(builder.sub(ir.Constant(it, 0), args[0]), ir.Constant(it, mask))
        if fmt == types.float32:
            value = builder.bitcast(bits, f32)
        else:
            shift = 16 if fmt == types.int16 else 13
            value = builder.bitcast(builder.shl(builder.zext(bits, i32), ir.Constant(i32, shift)),
                                    f32)
            if fmt == types.uint16:
                value = builder.fmul(value, ir.Constant(f32, 2.0**112))
        none = builder.icmp_unsigned("==", args[0], ir.Constant(it, 0))
        return builder.select(none, ir.Constant(f32, float("inf")), value)

    return types.float32(key, x), codegen


@overload(from_work, jit_options={"nogil": True})
def _from_work_impl(v, out):
    if v != types.float32 or out.dtype not in (types.int16, types.uint16):
        return lambda v, out: from_f64_normal(v, out)
    if out.dtype == types.int16:
        return lambda v, out: f32_to_bf16_bits_rne(v)
    if F16C:
        return lambda v, out: f32_to_f16_bits_hw(v)
    return lambda v, out: f32_to_f16_bits(v)


#: The bits of the smallest float32 that rounds to inf in each half format: the tie between
#: its largest finite value and inf, (2 - 2^-8)·2^127 for bfloat16, 65520 for float16.
#: A float32 value there or above (inf and NaN included) may not be the float64 route's:
#: rounded to float32 first, a value just below the tie becomes the tie and goes to inf
#: (even), where rounded once it is the largest finite value.
F32_BITS_TO_INF = {BF16_BITS: 0x7F7F8000, F16_BITS: 0x477FF000}


@overload(outside_work, jit_options={"nogil": True})
def _outside_work_impl(v, out):
    if v != types.float32 or out.dtype not in (types.int16, types.uint16):
        return lambda v, out: outside_normal(v, out)
    to_inf = np.int32(F32_BITS_TO_INF[np.dtype(out.dtype.name)])  # int16/uint16: the views
    # bits of |v| at or above those of the tie that rounds to inf (inf and NaN above it)
    return lambda v, out: (np.float32(v).view(np.int32) & np.int32(0x7FFFFFFF)) >= to_inf


#: float32's smallest normal value, 2^-126.
TINY32 = np.float32(2.0**-126)


def _may_lose(x, out) -> bool:
    """Whether a row of array type ``x`` written into ``out`` can lose an xhat to float32's
    underflow (``lost_in_row``): a half output computed in float32 from bfloat16 or float32
    elements."""
    return out.dtype in (types.int16, types.uint16) and x.dtype in (types.int16, types.float32)


@overload(note_magnitude, jit_options={"nogil": True})
def _note_magnitude_impl(key, xw, x, out):
    if not _may_lose(x, out):
        return lambda key, xw, x, out: key
    if key.bitwidth != (32 if xw == types.float32 else 16):
        return None

    def impl(key, xw, x, out):
        k = magnitude_key(xw)
        return k if k > key else key

    return impl


@overload(lost_in_row, jit_options={"nogil": True})
def _lost_in_row_impl(key, rstd_w, x, out):
    if not _may_lose(x, out):
        return lambda key, rstd_w, x, out: False
    if key.bitwidth == 32:  # keys of float32 values, whatever x holds
        return lambda key, rstd_w, x, out: (
            np.float32(smallest_magnitude(key, np.float32(0.0)) * rstd_w) < TINY32)
    return lambda key, rstd_w, x, out: np.float32(smallest_magnitude(key, x) * rstd_w) < TINY32


def add_square(acc, v, x):
    """acc + v², v = ``to_f64`` of an element of array ``x``, with the bits of ``acc + v * v``.

    For float32 and half elements v² is exact in float64 (at most 2·24 significant bits, and
    the exponent range of a square fits), so a fused multiply-add, which rounds once, gives
    the bits of the separate product and sum, in one instruction instead of two. float64
    elements keep the separate product and sum (their square rounds)."""
    raise NotImplementedError("add_square is only callable from Numba-compiled code")


@intrinsic
def _fma(typingctx, a, b, c):
    """a·b + c rounded once, in the operands' type (all float32 or all float64): LLVM's
    ``llvm.fma`` (a vector FMA in vectorised loops)."""
    from llvmlite import ir

    if not (a == b == c and a in (types.float32, types.float64)):
        return None  # no such signature: Numba reports a typing error naming the types

    def codegen(context, builder, signature, args):
        t = context.get_value_type(signature.return_type)
        fma = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t] * 3))
        return builder.call(fma, args)

    return a(a, a, a), codegen


@overload(add_square, jit_options={"nogil": True})
def _add_square_impl(acc, v, x):
    if x.dtype == types.float64:
        return lambda acc, v, x: acc + v * v
    return lambda acc, v, x: _fma(v, v, acc)


# --------------------------------------------------------------------------------------------
# Array helpers (for tests and for callers outside Numba)
# --------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _decode_array(bits, out):
    for i in range(bits.size):
        out[i] = to_f64(bits[i])


@njit(cache=True, nogil=True)
def _encode_array(values, out):
    for i in range(values.size):
        out[i] = from_f64(values[i], out)


def decode(bits: np.ndarray) -> np.ndarray:
    """A 1-D array of float32/float64/F16_BITS/BF16_BITS elements as float64, via ``to_f64``."""
    out = np.empty(bits.shape, np.float64)
    _decode_array(np.ascontiguousarray(bits).reshape(-1), out.reshape(-1))
    return out


def encode(values: np.ndarray, bits_dtype: np.dtype) -> np.ndarray:
    """Round float32/float64 ``values`` once to ``bits_dtype`` via ``from_f64`` (1-D)."""
    out = np.empty(values.shape, bits_dtype)
    _encode_array(np.ascontiguousarray(values).reshape(-1), out.reshape(-1))
    return out


@njit(cache=True, nogil=True)
def _half_to_f32_array(bits, out, bf16):
    for i in range(bits.size):
        if bf16:
            out[i] = bf16_bits_to_f32(bits[i])
        else:
            out[i] = f16_bits_to_f32(bits[i])


def decode_to_f32(bits: np.ndarray, fmt: str) -> np.ndarray:
    """``fmt`` ('bfloat16' or 'float16') bits -> float32, exactly (NaN payloads kept)."""
    out = np.empty(bits.shape, np.float32)
    b = np.ascontiguousarray(bits).view(np.uint16).reshape(-1)
    _half_to_f32_array(b, out.reshape(-1), fmt == "bfloat16")
    return out


@njit(cache=True, nogil=True)
def _f32_to_half_array(values, out, bf16):
    for i in range(values.size):
        if bf16:
            out[i] = f32_to_bf16_bits(values[i])
        else:
            out[i] = f32_to_f16_bits(values[i])


def encode_from_f32(values: np.ndarray, fmt: str) -> np.ndarray:
    """float32 ``values`` -> ``fmt`` ('bfloat16' or 'float16') bits as uint16, via the f32 path."""
    out = np.empty(values.shape, np.uint16)
    v = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    _f32_to_half_array(v, out.reshape(-1), fmt == "bfloat16")
    return out
