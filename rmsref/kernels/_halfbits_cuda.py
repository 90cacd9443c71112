"""float16 / bfloat16 <-> float32 on uint16 bit patterns, as numba.cuda device functions.

Numba has no bfloat16 array type (and the CUDA array interface has no bfloat16 typestr), so the
CUDA kernels read and write half-precision data as ``uint16`` bit patterns and convert in
registers. The CPU kernels' helpers (``_halfbits.py``) are ``@njit`` functions, which a CUDA
kernel cannot call; these are their device-side twins, written in integer arithmetic so that the
*same* rounding code runs in Numba's CUDA simulator (plain Python) and on a GPU.

Only the two bit casts differ between the targets:

* on a GPU, ``__float_as_int`` / ``__int_as_float`` from libdevice (a register reinterpretation);
* in the simulator, NumPy scalar views (the simulator has no libdevice).

Everything else (rounding to nearest-even, subnormals, overflow to inf, NaN) is shared, so the
simulator tests exercise the rounding logic the GPU runs.

Bit layouts::

    float32   s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   (bias 127)
    bfloat16  s eeeeeeee mmmmmmm                   (the top 16 bits of a float32)
    float16   s eeeee mmmmmmmmmm                   (bias 15, subnormals below 2^-14)
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.core import config as _cuda_config

#: True when Numba's CUDA simulator is active (NUMBA_ENABLE_CUDASIM=1 before numba was imported).
SIMULATOR = bool(_cuda_config.ENABLE_CUDASIM)

if SIMULATOR:

    def f32_bits(f):  # noqa: ANN001, ANN201 - simulator twin of the device function below
        """The 32 bits of float32 ``f`` as a non-negative int64 in [0, 2^32)."""
        return np.int64(np.float32(f).view(np.uint32))

    def f32_from_bits(u):  # noqa: ANN001, ANN201
        """The float32 whose bits are the low 32 bits of ``u``."""
        return np.uint32(np.int64(u) & 0xFFFFFFFF).view(np.float32)

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def f32_bits(f):  # noqa: ANN001, ANN201
        """The 32 bits of float32 ``f`` as a non-negative int64 in [0, 2^32)."""
        return np.int64(libdevice.float_as_int(np.float32(f))) & 0xFFFFFFFF

    @cuda.jit(device=True)
    def f32_from_bits(u):  # noqa: ANN001, ANN201
        """The float32 whose bits are the low 32 bits of ``u``."""
        return libdevice.int_as_float(np.int32(np.int64(u) & 0xFFFFFFFF))


# --------------------------------------------------------------------------------------------
# bfloat16: the top half of a float32
# --------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def bf16_to_f32(b):  # noqa: ANN001, ANN201
    """bfloat16 bits -> float32: exact (append 16 zero bits)."""
    return f32_from_bits(np.int64(b) << 16)


@cuda.jit(device=True)
def f32_to_bf16(f):  # noqa: ANN001, ANN201
    """float32 -> bfloat16 bits, rounded to nearest, ties to even (as ml_dtypes and CUDA do).

    Adding 0x7FFF plus the lowest kept bit, then truncating, rounds the dropped 16 bits to
    nearest-even; a carry out of the mantissa bumps the exponent, and overflow lands on inf.
    NaN is kept quiet (the carry could otherwise turn a NaN into inf).
    """
    u = f32_bits(f)
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep sign and top payload bits, force quiet
        return np.uint16(((u >> 16) | 0x0040) & 0xFFFF)
    lsb = (u >> 16) & 1
    return np.uint16(((u + 0x7FFF + lsb) >> 16) & 0xFFFF)


# --------------------------------------------------------------------------------------------
# float16: different exponent range, so rebias and handle subnormals
# --------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def f16_to_f32(h):  # noqa: ANN001, ANN201
    """float16 bits -> float32: exact (every float16 is a float32)."""
    hb = np.int64(h)
    sign = (hb & 0x8000) << 16
    e = (hb >> 10) & 0x1F
    m = hb & 0x3FF
    if e == 0:
        # zero or subnormal: m · 2^-24, exact in float32 (m < 2^10); the sign is applied after,
        # so -0 stays -0.
        mag = np.float32(m) * np.float32(5.9604644775390625e-08)  # 2^-24
        return -mag if sign else mag
    if e == 31:  # inf (m == 0) or NaN: all-ones float32 exponent, payload shifted up
        return f32_from_bits(sign | 0x7F800000 | (m << 13))
    # normal: rebias the exponent from 15 to 127 (add 112) and widen the mantissa
    return f32_from_bits(sign | ((e + 112) << 23) | (m << 13))


@cuda.jit(device=True)
def f32_to_f16(f):  # noqa: ANN001, ANN201
    """float32 -> float16 bits, rounded to nearest, ties to even; overflow -> inf; NaN kept.

    Thresholds on |f|'s bits a:
      a > 0x7F800000             NaN
      a >= 0x477FF000            |f| >= 65520: the tie above the largest half (65504) rounds to
                                 even, i.e. up, so everything from there on is inf
      a >= 0x38800000            |f| >= 2^-14: normal half; round the 13 dropped bits to
                                 nearest-even, then rebias the exponent by 112
      a <= 0x33000000            |f| <= 2^-25: half the smallest subnormal (a tie goes to the
                                 even value, zero)
      otherwise                  subnormal half: the 24-bit significand shifted right, RNE
    """
    u = f32_bits(f)
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return np.uint16(sign | 0x7E00)
    if a >= 0x477FF000:
        return np.uint16(sign | 0x7C00)
    if a >= 0x38800000:
        lsb = (a >> 13) & 1
        return np.uint16(sign | (((a + 0xFFF + lsb) - 0x38000000) >> 13))
    if a <= 0x33000000:
        return np.uint16(sign)
    e = a >> 23  # 102 <= e <= 112
    m = (a & 0x7FFFFF) | 0x800000  # 24-bit significand with the implicit one
    s = 126 - e  # 14 <= s <= 24: |f| / 2^-24 = m / 2^s
    q = m >> s
    r = m & ((np.int64(1) << s) - 1)
    half = np.int64(1) << (s - 1)
    if r > half or (r == half and (q & 1) == 1):
        q += 1  # may carry into the exponent field: 0x400 is the smallest normal, as it should
    return np.uint16(sign | q)
