"""The oracle's overflow-safe row statistics.

Squaring overflows float64 for |x| > 1.3e154 and underflows below 1.5e-154, long before x itself
does. Each row whose largest entry lies outside [2**-450, 2**450] is therefore scaled by a power of
two, 2**-k, which is exact: ``xs = x * 2**-k``. Statistics are computed on ``xs`` and eps is
scaled to match, ``eps_s = eps * 2**-2k``, so that

    ms + eps = 2**2k * (ms_s + eps_s),   rstd = 2**-k / sqrt(ms_s + eps_s),   xhat = xs / sqrt(...)

and x̂ never sees the scale at all. Rows inside the safe range get k = 0 and the plain formulas.
Float32 and half-precision inputs never need scaling in float64 (3.4e38**2 and 1.4e-45**2 are
both representable), which skips the work entirely.

Accuracy: every squared term is non-negative, so the row sum has no cancellation and NumPy's
pairwise summation already gives a relative error of order u*log2(N) in the worst case (and about
u in practice); the tests measure the oracle against mpmath.
"""

from __future__ import annotations

import numpy as np

#: Rows whose max |x| lies in [2**-SAFE, 2**SAFE] are not scaled: their squares (and sums of up to
#: 2**100 of them) stay normal float64 numbers.
SAFE_EXPONENT = 450

#: Number of elements per float64 temporary when the oracle walks rows in chunks: 2**21 elements
#: (16 MiB); with the few temporaries alive at once the oracle stays near 64 MiB whatever the input.
CHUNK_ELEMENTS = 1 << 21


def row_chunks(m: int, n: int):
    """Yield slices of rows so that each chunk holds about ``CHUNK_ELEMENTS`` elements."""
    step = max(1, CHUNK_ELEMENTS // max(n, 1))
    for start in range(0, m, step):
        yield slice(start, min(m, start + step))


def needs_scaling(dtype: np.dtype) -> bool:
    """Only float64/complex128 inputs can overflow or underflow a float64 sum of squares."""
    return np.dtype(dtype) in (np.dtype(np.float64), np.dtype(np.complex128))


def row_exponents(
    x: np.ndarray, eps: float, scaled_by: np.ndarray | None = None
) -> np.ndarray | None:
    """Per-row k (M, 1) so that ``x * 2**-k`` is safe to square, or None when no row needs it.

    k is the binary exponent of the row's largest |x| (real and imaginary parts alike; the scale is
    a constant for complex-step purposes). With eps != 0 it is raised so that eps * 2**-2k stays
    finite: such rows are dominated by eps and need no scaling anyway. ``scaled_by``: ``x`` is
    already scaled by 2**-scaled_by (its values are ``x * 2**scaled_by``); k is then in the units
    of those values, as if ``x`` had not been scaled.
    """
    mag = np.abs(x.real)
    if x.dtype.kind == "c":
        mag = np.maximum(mag, np.abs(x.imag))
    amax = np.max(mag, axis=-1, keepdims=True)  # (M, 1)
    _, e = np.frexp(amax)  # amax = f * 2**e, f in [0.5, 1); e = 0 for 0, inf, nan
    if scaled_by is not None:
        # e = 0 also for amax in [0.5, 1): shift by the rows' scale unless amax is 0, inf or nan
        e = np.where((amax != 0) & np.isfinite(amax), e + scaled_by, 0)
    k = np.where(np.abs(e) > SAFE_EXPONENT, e, 0)
    if eps != 0.0:
        k = np.maximum(k, int(np.ceil((np.log2(abs(eps)) - 1000) / 2)))
    if not np.any(k):
        return None
    return k


def scale_rows(x: np.ndarray, k: np.ndarray | None) -> np.ndarray:
    """``x * 2**-k`` per row, exactly (``ldexp``; complex parts scaled separately)."""
    if k is None:
        return x
    if x.dtype.kind == "c":
        return np.ldexp(x.real, -k) + 1j * np.ldexp(x.imag, -k)
    return np.ldexp(x, -k)


def scale_eps(eps: float, k: np.ndarray | None) -> float | np.ndarray:
    """eps in the units of the scaled rows: ``eps * 2**-2k``."""
    if k is None:
        return eps
    return np.ldexp(eps, -2 * k)


def unscale(v: np.ndarray, k: np.ndarray | None, power: int) -> np.ndarray:
    """``v * 2**(power*k)``: back from scaled units (power 1 for mean, -1 for rstd)."""
    if k is None:
        return v
    if v.dtype.kind == "c":
        return np.ldexp(v.real, power * k) + 1j * np.ldexp(v.imag, power * k)
    return np.ldexp(v, power * k)


def sum_of_squares(xs: np.ndarray) -> np.ndarray:
    """Row sums of ``xs * xs`` (M, 1), pairwise summation. ``x*x``, not ``abs(x)**2``:
    holomorphic, so complex-step differentiation sees the right derivative."""
    return np.sum(xs * xs, axis=-1, keepdims=True)
