"""The oracle's overflow-safe row scaling (rmsref._sumsq), seen through the norms that use it.

Reference: the same rows at unit scale. Scaling a row by a power of two is exact, and RMSNorm,
LayerNorm and unit-norm (with eps = 0) are homogeneous of degree 0 in x, so a row at 2**997 or
2**-997 must give *the same bits* of y as the row at unit scale, and rstd exactly 2**-j times
the unit row's. No tolerance: any error in the scaling path (a row scaled by another row's
exponent, the imaginary part scaled differently from the real part) shows up as a changed bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import rmsref
from rmsref import _sumsq

F64 = np.float64

#: Power-of-two exponents of the rows stacked into one call: near overflow (squares would be
#: inf), ordinary, near underflow (squares would be 0), and in the subnormal range.
ROW_EXPONENTS = (997, 0, -997, 40, -1040)


def _unit_rows(rng: np.random.Generator, m: int, n: int, complex_: bool) -> np.ndarray:
    """(m, n) rows with entries in [0.5, 1) in magnitude, signs random; complex: both parts."""
    a = rng.uniform(0.5, 1.0, (m, n)) * rng.choice([-1.0, 1.0], (m, n))
    if complex_:
        a = a + 1j * rng.uniform(0.5, 1.0, (m, n)) * rng.choice([-1.0, 1.0], (m, n))
    return a


def _forward(norm: str, x: np.ndarray, n: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(y, rstd) of ``norm`` (rnorm for unit-norm: the same 1/scale role)."""
    if norm == "rms":
        return rmsref.rms_norm_forward(x, n, eps=eps)
    if norm == "layer":
        y, _, rstd = rmsref.layer_norm_forward(x, n, eps=eps)
        return y, rstd
    return rmsref.unit_norm_forward(x, n, eps=eps)


@pytest.mark.parametrize("complex_", [False, True], ids=["float64", "complex128"])
@pytest.mark.parametrize("norm", ["rms", "layer", "unit"])
def test_each_row_is_scaled_by_its_own_exponent(rng, norm, complex_):
    """Rows of wildly different magnitudes in one call: each as if it were alone at unit scale."""
    n = 24
    a = _unit_rows(rng, len(ROW_EXPONENTS), n, complex_)  # (M, N)  unit scale
    j = np.array(ROW_EXPONENTS).reshape(-1, 1)  # (M, 1)
    x = np.ldexp(a.real, j) + (1j * np.ldexp(a.imag, j) if complex_ else 0.0)
    # the subnormal row keeps only the bits it can hold: the reference is x scaled back (exact)
    a = np.ldexp(x.real, -j) + (1j * np.ldexp(x.imag, -j) if complex_ else 0.0)
    y, rstd = _forward(norm, x, n, eps=0.0)
    y_unit, rstd_unit = _forward(norm, a, n, eps=0.0)
    assert np.all(np.isfinite(y)) and y.dtype == a.dtype
    np.testing.assert_array_equal(y, y_unit)
    # rstd = 2^-j · the unit row's, where that is a float64 number (not for the subnormal row)
    fits = (j > -1020)[:, 0]
    rstd, rstd_unit, j = rstd.reshape(-1, 1)[fits], rstd_unit.reshape(-1, 1)[fits], j[fits]
    np.testing.assert_array_equal(rstd.real, np.ldexp(rstd_unit.real, -j))
    np.testing.assert_array_equal(rstd.imag, np.ldexp(rstd_unit.imag, -j))
    if complex_:  # a generic complex row has a complex mean of squares: both parts carry data
        assert np.all(rstd.imag != 0)


@pytest.mark.parametrize("exponent", [997, -997, 600, -600])
def test_layer_norm_rescales_the_centred_values_whatever_their_size(rng, exponent):
    """LayerNorm finds a second exponent for x − mu, in units of the first scale. A centred row
    whose largest |x − mu| lies in [0.5, 1) in those units has frexp exponent 0, the same as an
    all-zero row: it must still be shifted by the row's scale (it once was not: y was 0 at
    2**997 and inf at 2**-997). The pattern below has mu = 0 and max |x| = 0.75; the random rows
    hit the same case about as often as not."""
    pattern = np.array([[0.75, -0.75, 0.6, -0.6]])
    a = np.concatenate([np.tile(pattern, 4), rng.standard_normal((40, 16))])  # (41, 16)
    y, mu, rstd = rmsref.layer_norm_forward(np.ldexp(a, exponent), 16, eps=0.0)
    y_unit, mu_unit, rstd_unit = rmsref.layer_norm_forward(a, 16, eps=0.0)
    np.testing.assert_array_equal(y, y_unit)
    np.testing.assert_array_equal(mu, np.ldexp(mu_unit, exponent))
    np.testing.assert_array_equal(rstd, np.ldexp(rstd_unit, -exponent))


@pytest.mark.parametrize("part", ["real", "imag"])
def test_complex_rows_are_scaled_by_their_larger_part(rng, part):
    """A complex row whose real part is tiny and whose imaginary part is near overflow (and the
    reverse) must be scaled by the larger part's exponent, or x*x overflows."""
    n = 16
    big = np.ldexp(rng.uniform(0.5, 1.0, (1, n)), 1000)
    small = np.ldexp(rng.uniform(0.5, 1.0, (1, n)), -40)
    x = big + 1j * small if part == "real" else small + 1j * big
    y = rmsref.rms_norm(x, n, eps=0.0)
    y_unit = rmsref.rms_norm(np.ldexp(x.real, -1000) + 1j * np.ldexp(x.imag, -1000), n, eps=0.0)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(y_unit))
    np.testing.assert_array_equal(y, y_unit)


@pytest.mark.parametrize("exponent", [990, -990])
def test_complex_step_derivative_through_the_scaled_path(rng, exponent):
    """Complex step on rows near 1e298 and 1e-298 (eps = 0): Im f(x + ih·v)/h = J v, and
    <dy, J v> equals <dx, v> from the analytic backward. The step's imaginary part goes through
    the scaled path with the real part."""
    n = 32
    a = _unit_rows(rng, 3, n, complex_=False)
    x = np.ldexp(a, exponent)
    v = np.ldexp(_unit_rows(rng, 3, n, complex_=False), exponent)  # a direction at x's scale
    dy = rng.standard_normal((3, n))
    # h·v must stay a normal number at 2^-990 (2^-27·2^-991 ~ 1e-306); the step's own error is
    # O(h²) ~ 1e-16 relative
    h = 2.0**-27
    jv = rmsref.rms_norm(x + 1j * h * v, n, eps=0.0).imag / h  # (M, N)  J v
    dx = rmsref.rms_norm_backward(dy, x, n, eps=0.0).dx
    lhs, rhs = np.sum(dy * jv), np.sum(dx * v)
    scale = np.sum(np.abs(dy * jv))
    assert np.isfinite(lhs) and scale > 0
    assert abs(lhs - rhs) <= 1e-13 * scale
    # and J v itself is the unit-scale row's (degree-0 homogeneity: J(2^j a)(2^j w) = J(a) w)
    jv_unit = rmsref.rms_norm(a + 1j * h * np.ldexp(v, -exponent), n, eps=0.0).imag / h
    np.testing.assert_array_equal(jv, jv_unit)


def test_huge_rows_are_scaled_whatever_eps(rng):
    """eps != 0 only raises a row's exponent (so that eps·2^-2k stays finite); it never turns
    the scaling off. At 2**997, eps = 1e-5 is far below an ulp of ms: y is the eps = 0 row's."""
    n = 16
    a = _unit_rows(rng, 2, n, complex_=False)
    y = rmsref.rms_norm(np.ldexp(a, 997), n, eps=1e-5)
    np.testing.assert_array_equal(y, rmsref.rms_norm(a, n, eps=0.0))


@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_rows_in_the_safe_range_are_not_scaled(eps):
    """Rows whose largest |x| has a binary exponent within ±SAFE_EXPONENT keep k = 0 (the plain
    formulas, the bits the Numba kernels reproduce); one exponent further out they are scaled.
    frexp's exponent e of amax: amax = f·2^e with f in [0.5, 1)."""
    safe = _sumsq.SAFE_EXPONENT
    inside = np.array([[0.75 * 2.0**safe], [0.75 * 2.0**-safe], [1.0], [0.0]])  # e = ±450, 1, 0
    assert _sumsq.row_exponents(inside, eps) is None
    outside = np.array([[0.75 * 2.0 ** (safe + 1)], [0.75 * 2.0 ** -(safe + 1)], [1.0]])
    k = _sumsq.row_exponents(outside, eps)
    np.testing.assert_array_equal(k, [[safe + 1], [-(safe + 1)], [0]])


def test_subnormal_entries_of_an_ordinary_row_are_kept():
    """A row at unit scale is not scaled at all, so its subnormal entries reach xhat intact:
    y = x / rms is the plain formula's, bit for bit (a scale by 2^-1 would round 2^-1074 away)."""
    x = np.array([[1.0, 0.5, 5e-324, 3 * 5e-324]])  # (1, 4)
    y = rmsref.rms_norm(x, 4, eps=0.0)
    plain = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
    assert np.all(y[0, 2:] != 0)
    np.testing.assert_array_equal(y, plain)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "complex64"])
def test_narrow_dtypes_never_need_scaling(dtype):
    """Squares of every finite float32 (and narrower) value, largest and smallest, are normal
    or at least non-zero float64 numbers, and so are sums of up to 2**100 of them."""
    dt = rmsref.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    assert not _sumsq.needs_scaling(dt)
    fi = ml_dtypes.finfo(np.float32 if dt == np.complex64 else dt)
    largest, smallest = float(fi.max), float(fi.smallest_subnormal)
    assert np.isfinite(2.0**100 * largest * largest) and smallest * smallest > 0
    assert _sumsq.needs_scaling(np.float64) and _sumsq.needs_scaling(np.complex128)


def test_row_chunks_hold_chunk_elements(monkeypatch):
    """Chunks of CHUNK_ELEMENTS // N rows (the oracle's memory bound), at least one row; a row of
    one feature (or none) counts as one element."""
    monkeypatch.setattr(_sumsq, "CHUNK_ELEMENTS", 8)
    assert list(_sumsq.row_chunks(20, 1)) == [slice(0, 8), slice(8, 16), slice(16, 20)]
    assert list(_sumsq.row_chunks(5, 0)) == [slice(0, 5)]
    assert list(_sumsq.row_chunks(5, 3)) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert list(_sumsq.row_chunks(2, 100)) == [slice(0, 1), slice(1, 2)]


@pytest.mark.parametrize("exponent", [997, 0, -997])
def test_layer_norm_of_a_constant_row_is_its_bias(exponent):
    """x − mu = 0 exactly: var = 0, so rstd = 1/sqrt(eps), y = 0 and mu is the constant, at
    any scale (at 2**997 the centred row has no exponent of its own: it must not inherit x's,
    which would make eps·2^-2k underflow to 0 and give 0/0)."""
    c = np.ldexp(0.75, exponent)
    y, mu, rstd = rmsref.layer_norm_forward(np.full((2, 8), c), 8, eps=1e-5)
    np.testing.assert_array_equal(y, np.zeros((2, 8)))
    np.testing.assert_array_equal(mu, np.full((2, 1), c))
    np.testing.assert_array_equal(rstd, np.full((2, 1), 1 / np.sqrt(1e-5)))


def test_a_subnormal_xhat_costs_an_absolute_error_of_at_most_half_its_spacing():
    """Where the model ends (docs/tolerances.md): a row spanning more than 2^1022 has a subnormal
    x̂_j, computed to within 2^-1075 in absolute terms (not relatively): y_j = x̂_j·w_j with a huge
    w_j is then good to |w_j|·2^-1075, far worse than an ulp, and no worse. The exact value is
    computed with mpmath."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 300
    x = np.array([[4.1565806450390018e32, 1.4447410698870012e-282]])
    w = np.array([1.0, -5.101723510065042e260])
    y, rstd = rmsref.rms_norm_forward(x, 2, w, eps=0.0)
    r = 1 / mpmath.sqrt((mpmath.mpf(x[0, 0]) ** 2 + mpmath.mpf(x[0, 1]) ** 2) / 2)
    exact = [float(mpmath.mpf(x[0, j]) * r * mpmath.mpf(w[j])) for j in range(2)]
    assert abs(float(x[0, 1] * r)) < np.finfo(F64).tiny  # x̂_1 is subnormal
    assert abs(y[0, 0] - exact[0]) <= 2 * np.spacing(exact[0])  # the normal entry: 2 ulp
    err = abs(y[0, 1] - exact[1])
    assert err <= np.ldexp(abs(w[1]), -1075) + abs(exact[1]) * 2.0**-52  # 2**-1075 alone is 0
    assert err > 4 * np.spacing(abs(exact[1]))  # the loss is real: the model cannot bound it
