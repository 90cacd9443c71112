"""rmsref.comparison: the oracle on the implementation's own inputs, the bound, the worst ratio.

Reference: the oracle's functions called directly, and errors planted by hand (one element off
by a known amount), so every figure of a Comparison is known in advance.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rmsref
from rmsref import tolerance as T
from rmsref.comparison import Reference, compare

SHAPE = (2, 3)  # a 2-D normalized shape: N = 6
N = 6


@pytest.fixture
def ref(rng) -> Reference:
    x = rng.standard_normal((4, *SHAPE)).astype(np.float32)
    w = (1 + 0.5 * rng.standard_normal(SHAPE)).astype(np.float32)
    dy = rng.standard_normal((4, *SHAPE)).astype(np.float32)
    return Reference(x, SHAPE, w, 1e-6, dy=dy, offset=1.0)


def test_reference_is_the_oracle_on_the_given_inputs(ref):
    x64, w64, dy64 = (a.astype(np.float64) for a in (ref.x, ref.weight, ref.dy))
    y, rstd = rmsref.rms_norm_forward(x64, SHAPE, w64, 1e-6, offset=1.0)
    g = rmsref.rms_norm_backward(dy64, x64, SHAPE, w64, 1e-6, offset=1.0)
    assert (ref.n, ref.rows) == (N, 4)
    np.testing.assert_array_equal(ref.y, y.reshape(4, N))
    np.testing.assert_array_equal(ref.rstd, rstd.reshape(4, 1))
    np.testing.assert_array_equal(ref.xhat, x64.reshape(4, N) * rstd.reshape(4, 1))
    np.testing.assert_array_equal(ref.w_eff, 1.0 + w64.reshape(N))
    np.testing.assert_array_equal(ref.dx, g.dx.reshape(4, N))
    np.testing.assert_array_equal(ref.dweight, g.dweight.reshape(1, N))
    for q in ("y", "dx", "dweight"):
        assert ref.exact(q).dtype == np.float64


def test_reference_without_weight_scales_by_one_plus_offset(rng):
    x = rng.standard_normal((3, N))
    ref = Reference(x, (N,), None, 0.0, offset=0.5)
    np.testing.assert_array_equal(ref.w_eff, np.full(N, 1.5))
    y, _ = rmsref.rms_norm_forward(x, N, None, 0.0, offset=0.5)
    np.testing.assert_array_equal(ref.y, y)
    with pytest.raises(ValueError, match="needs the dy"):
        ref.dx  # noqa: B018


def test_reference_bound_is_the_tolerance_model(ref):
    model = T.ErrorModel(np.dtype(np.float32), N, ref.rows)
    g = ref.dy.astype(np.float64).reshape(4, N)
    np.testing.assert_array_equal(ref.bound("y", model), T.bound_y(ref.y, model))
    np.testing.assert_array_equal(ref.bound("dx", model),
                                  T.bound_dx(ref.dx, g, ref.xhat, ref.rstd, ref.w_eff, model))
    expect = T.bound_dweight(ref.dweight.reshape(N), g, ref.xhat, model).reshape(1, N)
    np.testing.assert_array_equal(ref.bound("dweight", model), expect)
    assert ref.bound("dweight", model).shape == (1, N)


@pytest.mark.parametrize("quantity", ["y", "dx", "dweight"])
def test_compare_finds_the_planted_error(ref, quantity):
    """The exact result, rounded to float32, passes; one element moved by 3 bounds is the worst,
    with ratio 3 and its absolute, relative and ulp error."""
    model = T.ErrorModel(np.dtype(np.float32), N, ref.rows)
    exact = ref.exact(quantity)
    got = exact.astype(np.float32)
    ok = compare(quantity, got, ref, model)
    assert ok.passed and 0 <= ok.ratio <= 1 and ok.quantity == quantity
    bound = ref.bound(quantity, model)
    # the element of smallest magnitude: its ulp is not the ulp at 1 (a separate check)
    row, col = np.unravel_index(np.argmin(np.abs(exact)), exact.shape)
    assert T.ulp(exact[row, col], np.float32) != T.ulp(1.0, np.float32)
    bad = exact.copy()  # float64: the planted error is exact
    bad[row, col] += 3.0 * bound[row, col]
    c = compare(quantity, bad, ref, model)
    assert not c.passed and c.worst == (row, col)
    assert c.ratio == pytest.approx(3.0, rel=1e-8, abs=0)
    assert c.max_abs == pytest.approx(3.0 * bound[row, col], rel=1e-8, abs=0)
    assert c.max_rel == pytest.approx(3.0 * bound[row, col] / abs(exact[row, col]), rel=1e-8, abs=0)
    ulp = T.ulp(exact[row, col], np.float32)
    assert c.max_ulp == pytest.approx(3.0 * bound[row, col] / ulp, rel=1e-8, abs=0)
    np.testing.assert_array_equal(c.reference, exact)
    np.testing.assert_array_equal(c.bound, bound)
    assert c.ratios.shape == exact.shape


def test_compare_masks_rows_and_scores_non_finite_values(ref):
    model = T.ErrorModel(np.dtype(np.float32), N, ref.rows)
    got = ref.y.copy()
    got[1, 2] = np.nan
    c = compare("y", got, ref, model)
    assert c.ratio == np.inf and c.worst == (1, 2) and not c.passed
    assert c.max_rel == np.inf and c.max_abs == np.inf
    keep = np.array([True, False, True, True])
    masked = compare("y", got, ref, model, mask_rows=keep)
    assert masked.passed and masked.ratio == 0.0 and masked.max_abs == 0.0
    got[3, 0] += 2.0 * ref.bound("y", model)[3, 0]  # a kept row's error still counts
    masked = compare("y", got, ref, model, mask_rows=keep)
    assert masked.worst == (3, 0) and masked.ratio == pytest.approx(2.0, rel=1e-8, abs=0)


def test_compare_of_an_exact_result_is_all_zeros(ref):
    c = compare("y", ref.y.reshape(ref.x.shape), ref, T.ErrorModel(np.dtype(np.float32), N, 4))
    assert (c.ratio, c.max_abs, c.max_rel, c.max_ulp) == (0.0, 0.0, 0.0, 0.0)
    assert c.worst == (0, 0) and c.passed


def test_compare_where_the_exact_value_is_zero_is_silent_and_finite(rng):
    """Exact zeros (a zero x gives y = 0; a float64 output's bound there is 0, its atol being
    below the smallest subnormal): an exact result scores 0 everywhere, not 0/0 = NaN, and a
    wrong one at such a zero scores inf, with no floating-point warning either way."""
    x = rng.standard_normal((3, N))
    x[1] = 0.0
    ref = Reference(x, (N,), None, 1e-6)
    model = T.ErrorModel(np.dtype(np.float64), N, 3)
    assert np.all(ref.bound("y", model)[1] == 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = compare("y", ref.y, ref, model)
        got = ref.y.copy()
        got[1, 3] = 1e-300
        bad = compare("y", got, ref, model)
    assert ok.passed and (ok.ratio, ok.max_rel, ok.max_ulp) == (0.0, 0.0, 0.0)
    assert bad.ratio == np.inf and bad.max_rel == np.inf and bad.worst == (1, 3)


def test_an_error_too_many_ulps_to_count_is_inf_with_no_warning():
    """An error of 1e300 where the exact value is 1e-300: error over bound and over the ulp
    overflow float64. The figures are inf (never within the bound), and no floating-point
    warning reaches the user (the planted bug ``torch_always_float32`` printed one)."""
    exact = np.array([[1e-300, 1.0]])
    got = np.array([[1e300, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = rmsref.comparison.compare_rounded("h", got, exact, np.float64)
    assert c.ratio == np.inf and c.max_ulp == np.inf and c.worst == (0, 0) and not c.passed
