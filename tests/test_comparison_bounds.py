"""The bounds ``rmsref.comparison`` compares with are the documented formulas, factor by factor.

``Reference.bound`` builds on :mod:`rmsref.tolerance` for the options a kernel may have (a bias,
pRMSNorm's partial, the saved rstd, dbias, the fused add's dresidual_out); ``compare_rounded``
bounds a value that is only rounded. Each is written out here from its docstring and compared
exactly, and each is shown to separate a correct rounding from an error just beyond it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rmsref
from rmsref import tolerance as T
from rmsref.comparison import Reference, compare_rounded

M, N = 4, 16


@pytest.fixture
def ref(rng) -> Reference:
    x = rng.standard_normal((M, N))
    return Reference(x, (N,), rng.standard_normal(N), 1e-6, dy=rng.standard_normal((M, N)),
                     bias=rng.standard_normal(N))


def _model(**kw) -> T.ErrorModel:
    return T.ErrorModel(np.dtype(np.float32), N, M, **kw)


# ------------------------------------------------------------------------------------------------
# Reference.bound, option by option
# ------------------------------------------------------------------------------------------------
def test_rstd_is_bounded_by_rho_and_one_rounding_relative_to_itself(ref):
    model = _model()
    np.testing.assert_array_equal(ref.bound("rstd", model),
                                  (model.rho + model.u_acc) * ref.rstd)


def test_y_with_a_bias_is_bounded_by_its_terms_before_the_output_rounding(ref):
    model = _model()
    b = ref.bias.reshape(1, N)
    terms = np.abs(ref.y - b) + np.abs(b)
    want = (model.k_out * model.u_out * np.abs(ref.y)
            + (0.5 * model.gamma(N) + 5 * model.u_acc) * terms + model.atol)
    np.testing.assert_array_equal(ref.bound("y", model), want)


def test_partial_widens_the_dx_bound_by_n_over_k(ref):
    model = _model()
    p = dataclasses.replace(ref, partial=0.25, bias=None)
    plain = T.bound_dx(p.dx, p.as_rows(p.dy), p.xhat, p.rstd, p.w_eff, model)
    np.testing.assert_array_equal(p.bound("dx", model), plain * (N / 4))


def test_the_fused_add_dx_bound_adds_one_rounding_of_dh(ref, rng):
    model = _model()
    f = dataclasses.replace(ref, bias=None, dresidual_out=rng.standard_normal((M, N)))
    plain = T.bound_dx(f.dx, f.as_rows(f.dy), f.xhat, f.rstd, f.w_eff, model)
    np.testing.assert_array_equal(f.bound("dx", model), plain + model.u_acc * np.abs(f.dx))


@pytest.mark.parametrize("quantity", ["dweight", "dbias"])
def test_parameter_bounds_are_rows_of_n(ref, quantity):
    assert ref.bound(quantity, _model()).shape == (1, N)


# ------------------------------------------------------------------------------------------------
# compare_rounded
# ------------------------------------------------------------------------------------------------
def test_a_value_rounded_once_passes_and_one_off_by_an_ulp_fails():
    """1.5 rounded once is exact; one float32 ulp above it is 1/(1.5·2^-24) = 1.33 bounds off
    with one rounding and 0.67 with two (the default is one)."""
    exact = np.array([[1.5, -3.0]])
    c = compare_rounded("h", exact.astype(np.float32), exact, np.float32)
    assert c.ratio == 0.0 and c.passed
    got = np.array([[1.5 + 2.0**-23, -3.0]], np.float32)
    assert compare_rounded("h", got, exact, np.float32).ratio == pytest.approx(4 / 3, abs=0)
    assert compare_rounded("h", got, exact, np.float32, roundings=2).ratio == pytest.approx(
        2 / 3, abs=0)


def test_compare_rounded_records_its_name_reference_bound_and_ulps():
    exact = np.array([1.5, 0.0, 3.0], np.float32)  # float32 in: kept as float64 rows
    got = np.array([1.5 + 2.0**-23, 0.0, 4.0], np.float32)
    c = compare_rounded("new_residual", got, exact, np.float32)
    assert c.quantity == "new_residual"
    assert c.reference.dtype == c.bound.dtype == np.float64 and c.reference.shape == (1, 3)
    np.testing.assert_array_equal(c.bound, 2.0**-24 * np.abs(exact.astype(np.float64)).reshape(1, 3)
                                  + T.underflow_atol(np.float32))
    assert c.worst == (0, 2)  # an error of exactly 1 is an error
    assert c.ratio == pytest.approx(1.0 / (3.0 * 2.0**-24), rel=1e-12, abs=0)
    assert c.max_ulp == pytest.approx(1.0 / 2.0**-22, abs=0)  # one float32 ulp at 3 is 2^-22


def test_compare_rounded_near_zero_allows_half_the_smallest_subnormal():
    """2^-26 rounds to 0 in float16 (half its smallest subnormal 2^-24 is 2^-25): an error of
    2^-26 is within float16's bound, far beyond float64's."""
    exact = np.array([2.0**-26])
    assert compare_rounded("h", np.zeros(1), exact, np.float16).passed
    assert not compare_rounded("h", np.zeros(1), exact, np.float64).passed


def test_compare_rounded_takes_a_scalar():
    c = compare_rounded("h", np.float32(2.0), np.float64(2.0), np.float32)
    assert c.reference.shape == (1, 1) and c.passed


def test_compare_rounded_of_an_oracle_quantity():
    """The fused add's new residual h = x + r, rounded once to bfloat16, against h in float64."""
    rng = np.random.default_rng(1)
    x, r = (rng.standard_normal((3, 8)).astype(rmsref.bfloat16) for _ in range(2))
    h64 = x.astype(np.float64) + r.astype(np.float64)
    _, h, _ = rmsref.add_rms_norm_forward(x, r, 8)
    assert compare_rounded("new_residual", h, h64, rmsref.bfloat16).passed


def test_y_with_a_bias_where_every_term_is_zero_is_bounded_by_atol(ref):
    """A zero column of x with a zero bias entry: y is exactly 0 there, and only the output's
    underflow allowance is left (positive: a rounding near zero may give a subnormal)."""
    model = _model()
    x = ref.x.copy()
    x[:, 3] = 0.0
    b = ref.bias.copy()
    b[3] = 0.0
    z = dataclasses.replace(ref, x=x, bias=b)
    np.testing.assert_array_equal(z.bound("y", model)[:, 3], model.atol)
    assert model.atol > 0


def test_compare_rounded_reads_got_in_exact_s_order_whatever_its_shape():
    """got as a column of the same three values is the same three values (not broadcast)."""
    exact = np.array([1.0, 2.0, 3.0])
    got = np.array([[1.0], [2.0], [4.0]])
    c = compare_rounded("h", got, exact, np.float32)
    assert c.ratios.shape == (1, 3) and c.worst == (0, 2)
