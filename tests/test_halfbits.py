"""rmsref.kernels._halfbits: half <-> float conversions inside Numba, checked bit for bit.

References: NumPy's float16 casts and ml_dtypes' bfloat16 casts for every one of the 65536 bit
patterns, and for float64 -> half (one rounding) an independent NumPy reference built from
``frexp``/``rint`` below (ml_dtypes rounds float64 -> bfloat16 twice, through float32).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("numba", reason="the Numba kernels need numba (pip install 'rmsref[numba]')")

import ml_dtypes  # noqa: E402

from rmsref.kernels import _halfbits as hb  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every 16-bit pattern
FORMATS = {
    # name: (NumPy dtype, kernel view dtype, significand bits p, min normal exponent, max finite)
    "float16": (np.dtype(np.float16), hb.F16_BITS, 11, -14, 65504.0),
    "bfloat16": (BF16, hb.BF16_BITS, 8, -126, float(ml_dtypes.finfo(BF16).max)),
}


def _bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = got.view(np.uint16)
    want = want.view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{what}: {bad.size} mismatches, first at index {bad[0]}: got {got[bad[0]]:#06x}, "
        f"want {want[bad[0]]:#06x}"
    )


def _round_f64_reference(v: np.ndarray, fmt: str) -> np.ndarray:
    """float64 -> ``fmt`` rounded once (RNE), in float64 arithmetic that is exact here.

    For a finite v, q = 2^(e - p) is the quantum of the format at v's binade (clamped at the
    subnormal quantum); v / q is exact (a power-of-two scaling) and np.rint rounds it to the
    nearest integer, ties to even; the result times q is the rounded value, inf past the
    largest finite value's half-way point.
    """
    _, _, p, emin, fmax = FORMATS[fmt]
    dtype = FORMATS[fmt][0]
    _, e = np.frexp(np.abs(v))  # |v| = f·2^e, f in [0.5, 1)
    exp = np.maximum(e - 1, emin)  # binade exponent, clamped to the subnormal range
    q = np.ldexp(1.0, exp - (p - 1))
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.rint(v / q) * q
        r = np.where(np.abs(r) > fmax, np.copysign(np.inf, v), r)
        out = r.astype(np.float32).astype(dtype)  # exact: r has <= p significant bits
        return np.where(np.isfinite(v), out, v.astype(dtype))


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_every_pattern(fmt):
    """half -> float32 equals NumPy / ml_dtypes for all 65536 patterns, NaN payloads included
    (compared as float32 bits); the kernels' to_f64 equals it widened to float64 (NaN: NaN
    with the same sign, as hardware widening quiets signalling NaNs)."""
    dtype, view, *_ = FORMATS[fmt]
    want = ALL.view(dtype).astype(np.float32)
    got = hb.decode_to_f32(ALL, fmt)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{fmt} pattern {ALL[bad[0]]:#06x}: {got[bad[0]]!r} vs {want[bad[0]]!r}"
    wide = hb.decode(ALL.view(view))
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(wide), nan)
    assert np.array_equal(np.signbit(wide), np.signbit(want))
    assert np.array_equal(wide[~nan], want[~nan].astype(np.float64))


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_pattern(fmt):
    """float32(h) -> half gives h back for every pattern (NaNs as NumPy / ml_dtypes make them)."""
    dtype, view, *_ = FORMATS[fmt]
    f32 = ALL.view(dtype).astype(np.float32)
    with np.errstate(invalid="ignore"):
        want = f32.astype(dtype)
    _bits_equal(hb.encode_from_f32(f32, fmt), want, f"{fmt} float32 -> half")
    with np.errstate(invalid="ignore"):
        f64 = f32.astype(np.float64)  # widening quiets signalling NaNs: compare with NumPy's
        _bits_equal(hb.encode(f64, view), f64.astype(dtype), f"{fmt} float64 -> half")


def _float32_probes(fmt: str) -> np.ndarray:
    """float32 values at and around every rounding boundary of ``fmt``: for each finite
    non-negative half value h and its successor, the midpoint, the midpoint ± one float32 ulp,
    and h ± one float32 ulp; both signs; plus random float32 bit patterns."""
    dtype = FORMATS[fmt][0]
    pos = ALL[: 0x7C00 if fmt == "float16" else 0x7F80].view(dtype).astype(np.float64)
    nxt = np.append(pos[1:], 2 * pos[-1] - pos[-2])  # successor (the first value past max)
    mid = ((pos + nxt) / 2).astype(np.float32)  # exact in float32
    h32 = pos.astype(np.float32)
    up, down = np.float32(np.inf), np.float32(0)
    vals = [mid, np.nextafter(mid, up), np.nextafter(mid, down), np.nextafter(h32, up),
            np.nextafter(h32, down), h32]
    rnd = np.random.default_rng(5).integers(0, 1 << 32, 1 << 18, dtype=np.uint64)
    vals.append(rnd.astype(np.uint32).view(np.float32))
    v = np.concatenate(vals)
    return np.concatenate([v, -v])


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_rounding_boundaries(fmt):
    """float32 -> half: RNE at every midpoint (ties to even), next to it, overflow to inf,
    subnormals; equal to NumPy (float16) / ml_dtypes (bfloat16) bit for bit."""
    dtype = FORMATS[fmt][0]
    v = _float32_probes(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        want = v.astype(dtype)
    _bits_equal(hb.encode_from_f32(v, fmt), want, f"{fmt} float32 -> half")


@pytest.mark.parametrize("fmt", FORMATS)
def test_float64_rounds_once(fmt):
    """float64 -> half is one rounding: equal to the exact frexp/rint reference at midpoints
    nudged by less than a float32 ulp (where rounding through float32 first goes wrong)."""
    dtype, view, *_ = FORMATS[fmt]
    pos = ALL[: 0x7C00 if fmt == "float16" else 0x7F80].view(dtype).astype(np.float64)
    nxt = np.append(pos[1:], 2 * pos[-1] - pos[-2])
    mid = (pos + nxt) / 2
    tiny = np.abs(mid) * 2.0**-40 + 2.0**-1074
    v = np.concatenate([mid, mid + tiny, mid - tiny, pos, np.nextafter(pos, np.inf)])
    v = np.concatenate([v, -v, [0.0, -0.0, np.inf, -np.inf, 1e300, -1e300, 1e-300, 5e-324]])
    want = _round_f64_reference(v, fmt)
    _bits_equal(hb.encode(v, view), want, f"{fmt} float64 -> half")
    if fmt == "float16":  # NumPy's double -> half also rounds once: a second, independent check
        with np.errstate(over="ignore"):
            _bits_equal(hb.encode(v, view), v.astype(np.float16), "float16 vs NumPy")


def test_double_rounding_example():
    """1 + 2^-8 + 2^-30 is just above the bfloat16 midpoint between 1 and 1 + 2^-7: one
    rounding gives 1 + 2^-7 (0x3f81); float32 first would tie and go to even, 1 (0x3f80)."""
    v = np.array([1 + 2.0**-8 + 2.0**-30])
    assert hb.encode(v, hb.BF16_BITS).view(np.uint16)[0] == 0x3F81
    assert hb.encode_from_f32(v.astype(np.float32), "bfloat16")[0] == 0x3F80


@pytest.mark.parametrize("fmt", FORMATS)
def test_float64_nan_and_inf(fmt):
    """NaN stays NaN with its sign, inf stays inf, overflow rounds to inf."""
    dtype, view, *_ = FORMATS[fmt]
    v = np.array([np.nan, -np.nan, np.inf, -np.inf, 1e300, -1e300])
    got = hb.encode(v, view).view(dtype).astype(np.float64)
    assert np.isnan(got[:2]).all() and np.signbit(got[1]) and not np.signbit(got[0])
    assert list(got[2:]) == [np.inf, -np.inf, np.inf, -np.inf]


@pytest.mark.parametrize("fmt", FORMATS)
def test_float64_fast_route_equals_round_to_odd(fmt):
    """The magic-constant route (what the kernels use) gives the bits of the round-to-odd
    construction on random float64 values spread over the format's range and beyond,
    including float64 subnormals, the format's subnormals and overflow."""
    from numba import njit

    fast, odd = ((hb.f64_to_f16_bits, hb.f64_to_f16_bits_via_odd) if fmt == "float16"
                 else (hb.f64_to_bf16_bits, hb.f64_to_bf16_bits_via_odd))

    @njit
    def both(v, a, b):
        for i in range(v.size):
            a[i] = fast(v[i])
            b[i] = odd(v[i])

    rng = np.random.default_rng(11)
    lo, hi = (-30, 20) if fmt == "float16" else (-140, 140)
    v = rng.uniform(1, 2, 1 << 17) * np.exp2(rng.integers(lo, hi, 1 << 17))
    raw = rng.integers(0, 1 << 63, 1 << 15, dtype=np.int64).view(np.float64)  # any bits
    v = np.concatenate([v, -v, raw[np.isfinite(raw)], [2.0**-1074, -(2.0**-1074)]])
    a = np.empty(v.size, np.uint16)
    b = np.empty(v.size, np.uint16)
    both(v, a, b)
    _bits_equal(a, b, f"{fmt} float64 -> half, fast route vs round to odd")


def _float64_probes(fmt: str) -> np.ndarray:
    """float64 values at every rounding boundary of ``fmt`` (midpoints, midpoints nudged by
    far less than a float32 ulp, the format's values and their float64 successors), random
    values spread over the format's range and beyond, any float64 bit patterns, both signs."""
    dtype = FORMATS[fmt][0]
    pos = ALL[: 0x7C00 if fmt == "float16" else 0x7F80].view(dtype).astype(np.float64)
    nxt = np.append(pos[1:], 2 * pos[-1] - pos[-2])
    mid = (pos + nxt) / 2
    tiny = np.abs(mid) * 2.0**-40 + 2.0**-1074
    rng = np.random.default_rng(13)
    spread = rng.uniform(1, 2, 1 << 16) * np.exp2(rng.integers(-150, 140, 1 << 16))
    raw = rng.integers(0, 1 << 63, 1 << 14, dtype=np.int64).view(np.float64)  # any bits
    v = np.concatenate([mid, mid + tiny, mid - tiny, pos, np.nextafter(pos, np.inf), spread,
                        raw, [0.0, np.inf, np.nan, 2.0**-1074, 2.0**-126, 2.0**128]])
    return np.concatenate([v, -v])


def test_bfloat16_normal_route_where_it_claims_to_be_exact():
    """``f64_to_bf16_bits_normal`` (the kernels' fast write) equals the exact one-rounding
    reference wherever ``bf16_outside_normal`` is False, and that flag is False exactly for
    ±0 and 2^-126 <= |v| < 2^128 (so a kernel rewrites every other row with ``from_f64``)."""
    from numba import njit

    @njit
    def route(v, bits, outside):
        for i in range(v.size):
            bits[i] = hb.f64_to_bf16_bits_normal(v[i])
            outside[i] = hb.bf16_outside_normal(v[i])

    v = _float64_probes("bfloat16")
    bits = np.empty(v.size, np.int16)
    outside = np.empty(v.size, np.bool_)
    route(v, bits, outside)
    with np.errstate(invalid="ignore"):
        a = np.abs(v)
        want_outside = ~((a == 0) | ((a >= 2.0**-126) & (a < 2.0**128)))
    assert np.array_equal(outside, want_outside)
    inside = ~outside
    assert inside.sum() > v.size // 2  # the probes mostly test the route, not the flag
    _bits_equal(bits[inside], _round_f64_reference(v[inside], "bfloat16"),
                "bfloat16 normal route")
    assert np.array_equal(np.signbit(bits[v == 0].view(BF16)), np.signbit(v[v == 0]))


@pytest.mark.skipif(not hb.F16C, reason="the CPU Numba compiles for has no F16C")
def test_float16_hardware_decode_every_pattern():
    """F16C's float16 -> float32 (what ``to_f64`` uses when available) equals NumPy for every
    non-NaN pattern bit for bit; a NaN stays a NaN with its sign (signalling ones come back
    quiet, as float64 widening makes them in ``to_f64`` anyway)."""
    from numba import njit

    @njit
    def decode_hw(b, out):
        for i in range(b.size):
            out[i] = hb.f16_bits_to_f32_hw(b[i])

    got = np.empty(ALL.size, np.float32)
    decode_hw(ALL, got)
    want = ALL.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))


def _from_work_f32(values: np.ndarray, fmt: str) -> np.ndarray:
    """float32 ``values`` through ``from_work`` into a ``fmt`` array, and ``outside_work``."""
    from numba import njit

    @njit
    def run(v, out, flag):
        for i in range(v.size):
            out[i] = hb.from_work(v[i], out)
            flag[i] = hb.outside_work(v[i], out)

    out = np.empty(values.size, FORMATS[fmt][1])
    flag = np.empty(values.size, np.bool_)
    run(values, out, flag)
    return out, flag


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_write_at_every_boundary(fmt):
    """The kernels' float32 -> half write (``from_work``: bfloat16 by integer RNE without the
    NaN select, float16 by F16C where present) equals NumPy / ml_dtypes bit for bit at every
    rounding boundary, subnormals and overflow to inf included, and flags exactly the values
    it does not promise to give the float64 route's bits: those that round to inf (from the
    tie between the largest finite value and inf up: a float64 value just below the tie may
    round to it in float32) and NaN (their rows are written again in float64)."""
    dtype = FORMATS[fmt][0]
    v = _float32_probes(fmt)
    v = np.concatenate([v, np.float32([np.inf, -np.inf, np.nan, -np.nan])])
    got, flag = _from_work_f32(v, fmt)
    tie = np.array([hb.F32_BITS_TO_INF[FORMATS[fmt][1]]], np.uint32)
    tie = tie.view(np.float32)[0]
    assert tie == ((2.0 - 2.0**-8) * 2.0**127 if fmt == "bfloat16" else 65520.0)
    with np.errstate(invalid="ignore", over="ignore"):
        want = v.astype(dtype)
        assert np.array_equal(flag, ~(np.abs(v) < tie))
        assert np.isinf(np.float32(tie).astype(dtype))  # the tie itself goes to inf
    finite = np.isfinite(v)
    _bits_equal(got[finite], want[finite], f"{fmt} from_work")
    # a finite float32 that overflows the half format is written as inf, and flagged
    overflow = finite & np.isinf(got.view(dtype).astype(np.float32))
    assert overflow.any() and flag[overflow].all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_write_round_trips_every_pattern(fmt):
    """Every finite half value widened to float32 comes back with its own bits from
    ``from_work`` (all 65536 patterns; the non-finite ones are flagged)."""
    dtype = FORMATS[fmt][0]
    f32 = ALL.view(dtype).astype(np.float32)
    got, flag = _from_work_f32(f32, fmt)
    finite = np.isfinite(f32)
    assert np.array_equal(flag, ~finite)
    _bits_equal(got[finite], ALL[finite], f"{fmt} half -> float32 -> half")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_add_square_has_the_bits_of_a_product_then_a_sum(rng, dtype):
    """``add_square(acc, v, x)`` (Σx²'s step in the kernels) equals acc + v·v rounded twice,
    as NumPy computes it, for every element dtype: an FMA for float32 and half elements (their
    squares are exact in float64, extremes of the range included), the separate product and
    sum for float64 elements, where an FMA would differ (checked: it does on these values)."""
    from numba import njit

    @njit
    def run(acc, x, out):
        for i in range(x.size):
            out[i] = hb.add_square(acc[i], hb.to_f64(x[i]), x)

    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    span = 10 if dtype == "float16" else 60  # binary exponents of x, within the range
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-span, span, 4096))).astype(dt)
    info = ml_dtypes.finfo(dt)  # (NumPy 1.x has no finfo for bfloat16)
    top = 2.0**511 if dtype == "float64" else info.max  # a float64 square that stays finite
    x[:4] = np.array([top, -info.smallest_subnormal, info.tiny, 1 + info.eps]).astype(dt)
    acc = rng.standard_normal(x.size) * np.exp2(rng.integers(-120, 120, x.size))
    bits = x if dt.itemsize > 2 else x.view(FORMATS["bfloat16" if dt == BF16 else "float16"][1])
    out = np.empty(x.size)
    run(acc, bits, out)
    v = x.astype(np.float64)
    np.testing.assert_array_equal(out, acc + v * v)
    if dtype == "float64":  # the operation the test tells apart from the float64 branch
        fused = np.array([float(Fraction(a) + Fraction(b) ** 2)
                          for a, b in zip(acc, v, strict=True)])
        assert (fused != acc + v * v).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fma_rounds_once_in_its_operands_type(dtype):
    """``_fma(a, b, c)`` is a·b + c rounded once in the operands' type (float32 for the
    compensated difference bench/halfbwd.py measures, float64 for Σx²): (1 + u)(1 − u) − 1 is
    −u² exactly, which a rounded product (1 − u² -> 1) would lose. Mixed types are refused."""
    from numba import njit
    from numba.core.errors import TypingError

    @njit
    def fma(a, b, c):
        return hb._fma(a, b, c)

    u = dtype(np.finfo(dtype).eps)
    a, b, c = dtype(1) + u, dtype(1) - u, dtype(-1)
    assert a * b + c == 0  # the product rounded first: the -u² is lost
    assert fma(a, b, c) == -(u * u) != 0
    with pytest.raises(TypingError):
        fma(np.float32(1), 1.0, 1.0)
