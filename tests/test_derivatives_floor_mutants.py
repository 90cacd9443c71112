"""Tests written from the mutation survivors of rmsref/derivatives.py's cancellation floor
(``_Floor``), its small numerical helpers, ``_Worst`` and the second-order checks. Each pins a
number or a message of the gradient checker that a user can observe, from the formula its
docstring states or from a problem with a known answer (a linear map, a quadratic)."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

from rmsref.derivatives import (
    CheckResult,
    GradcheckResult,
    WorstEntry,
    _central,
    _complex_step,
    _fd_point,
    _Floor,
    _relative,
    _scale_of,
    _second_directional,
    _unit_roundoff,
    _Worst,
    gradcheck,
    oracle_problem,
)

U64 = 2.0**-53


def _fn(f):
    """f(*args) -> list of outputs, as the checker calls a forward (``complex_`` ignored)."""
    return lambda args, complex_=False: list(f(*args))


def _secant(F, inputs, k):
    """The floor's d for input k, from its docstring: |y(x) - y(x_k = 0)| per output."""
    at0 = list(inputs)
    at0[k] = np.zeros_like(inputs[k])
    return [np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
            for a, b in zip(F(inputs), F(at0), strict=True)]


def _clip(x):
    """|x| clipped below at 2^-26·max|x| (so that an exact zero cannot disable the check)."""
    a = np.abs(np.asarray(x, np.float64))
    return np.maximum(a, 2.0**-26 * np.max(a))


# ------------------------------------------------------------------------------------------------
# _Floor: the first-order floor Σ|u|·d·|v|/|x|
# ------------------------------------------------------------------------------------------------
# y = w·x + Σx + 1/4 with x = (1, -2, 1/2, 0): every value is a short binary fraction, so the
# secant d = |y - y(x = 0)| = |w·x + Σx| is exact; x_3 = 0 still moves y_3 (through Σx), so its
# clipped |x| = 2^-26·2 decides that entry.
X4 = np.array([1.0, -2.0, 0.5, 0.0])
W1 = np.array([3.0])
COUPLED = _fn(lambda x, w: (w * x + np.sum(x) + 0.25,))


def test_the_first_order_floor_is_the_secant_over_the_clipped_input():
    floor = _Floor(COUPLED, [X4, W1], COUPLED([X4, W1]), [0, 1])
    u = [np.array([1.0, -2.0, 0.5, 3.0])]
    v = np.array([0.5, 1.0, -1.0, 2.0**-20])
    d = np.abs(3.0 * X4 + np.sum(X4))  # [2.5, 6.5, 1.0, 0.5]
    assert np.array_equal(_secant(COUPLED, [X4, W1], 0)[0], d)
    expected = float(np.sum(np.abs(u[0]) * d * np.abs(v) / _clip(X4)))
    assert floor.first(0, u, v) == pytest.approx(expected, rel=1e-15)
    # the zero entry alone: |u_3|·d_3·|v_3| / (2^-26·max|x|) = 3 · 0.5 · 2^-20 · 2^25
    assert floor.first(0, u, v * (np.arange(4) == 3)) == pytest.approx(3 * 0.5 * 2.0**5)
    # the weight is shaped like no output: no floor of its own
    assert floor.first(1, u, np.array([1.0])) == 0.0


def test_a_secant_within_the_rounding_of_y_minus_y0_counts_as_zero():
    """y = x + 1: a step of 4 units of 2^-52 above 1 is within 4u·(|y| + |y(0)|) = 2^-50(1 + ..)
    of rounding and gives no floor; 5 units are above it and count."""
    F = _fn(lambda x: (x + 1.0,))
    x = np.array([4 * 2.0**-52, 5 * 2.0**-52])
    floor = _Floor(F, [x], F([x]), [0])
    u = [np.ones(2)]
    assert floor.first(0, u, np.array([1.0, 0.0])) == 0.0
    assert floor.first(0, u, np.array([0.0, 1.0])) == pytest.approx(1.0, rel=1e-15)


def test_the_rounding_of_a_float32_secant_is_float32_s():
    """In float32 the rounding of y - y(0) is 4·2^-24·(|y| + |y(0)|): a step of 2^-22 above 1
    is noise there (it would not be in float64)."""
    F = _fn(lambda x: (x + np.float32(1.0),))
    x = np.array([2.0**-22, 1.0], np.float32)
    floor = _Floor(F, [x], F([x]), [0])
    assert floor.first(0, [np.ones(2)], np.array([1.0, 0.0])) == 0.0
    assert floor.first(0, [np.ones(2)], np.array([0.0, 1.0])) == pytest.approx(1.0, rel=1e-15)


def test_a_float32_secant_and_input_are_taken_in_float64():
    """y = x + 2^-25 in float32 at x = 3 rounds to 3: the secant is 3 - 2^-25 (exact in float64,
    not in float32) and 1/|x| is 1/3 in float64."""
    F = _fn(lambda x: (x + np.float32(2.0**-25),))
    x = np.array([3.0], np.float32)
    floor = _Floor(F, [x], F([x]), [0])
    assert floor.first(0, [np.ones(1)], np.ones(1)) == pytest.approx((3 - 2.0**-25) / 3, rel=1e-16)


def test_a_float16_zero_entry_is_clipped_like_any_other():
    F = _fn(lambda x: (x + np.sum(x),))
    x = np.array([0.0, 1.0, -2.0], np.float16)  # y = x - 1, y(0) = 0: d = |x - 1|
    floor = _Floor(F, [x], F([x]), [0])
    assert floor.first(0, [np.ones(3)], np.array([1.0, 0.0, 0.0])) == pytest.approx(
        1.0 / (2.0**-26 * 2))


def test_a_secant_to_a_non_finite_y0_is_y_itself_and_raises_no_warning():
    """Unit normalisation with eps = 0: y(0) = 0/0. The secant there is |y| (the docstring) and
    building the floor, and its |1 - p| along a scale-invariant function (J·x = 0), warns of
    nothing: |1 - p| = 1."""
    F = _fn(lambda x: (x / np.sqrt(np.sum(x * x)),))
    x = np.array([3.0, -4.0])
    y = F([x])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        floor = _Floor(F, [x], y, [0])
        floor.set_radial(0, [np.zeros(2)])
    u = [np.array([1.0, 2.0])]
    a, b = np.array([1.0, 0.5]), np.array([2.0, 1.0])
    assert floor.first(0, u, a) == pytest.approx(
        float(np.sum(u[0] * np.abs(y[0]) * a / np.abs(x))), rel=1e-15)
    # second order: |u|·d·|1 - p|·|a|·|b|/x² with |1 - p| = 1
    assert floor.second(0, u, a, b) == pytest.approx(
        float(np.sum(u[0] * np.abs(y[0]) * a * b / x**2)), rel=1e-15)


# ------------------------------------------------------------------------------------------------
# _Floor: |1 - p| from the radial derivative, the gradients' magnitudes, second order
# ------------------------------------------------------------------------------------------------
# y = 3·x + 1000 is linear: p = (J·x)/d = 1 exactly in exact arithmetic, so |1 - p| = 0; in
# float64 d = |y - 1000| is off by up to half an ulp of 1000, which the reduction by d's own
# rounding must absorb ("a linear function seen through a large bias does not look nonlinear").
BIASED = _fn(lambda x, w: (w * x + 1000.0,))
XB = 1e-3 * np.random.default_rng(5).standard_normal(16)


def _biased_floor(radial=True):
    floor = _Floor(BIASED, [XB, W1], BIASED([XB, W1]), [0, 1])
    if radial:
        floor.set_radial(0, [3.0 * XB])
    return floor


def test_a_linear_function_seen_through_a_large_bias_has_no_second_order_floor():
    floor = _biased_floor()
    d = _secant(BIASED, [XB, W1], 0)[0]
    assert np.any(np.abs(1 - 3 * np.abs(XB) / d) > 0)  # the rounding the reduction absorbs
    u = [np.random.default_rng(1).standard_normal(16)]
    a, b = np.ones(16), np.full(16, 2.0)
    assert floor.second(0, u, a, b) == 0.0
    assert np.all(floor.grad_magnitude(0, u, None, nonlinear=True) == 0.0)
    # the whole gradient (not only its changing part) is Σ|u|·d/|x|, ~3|u| here
    full = floor.grad_magnitude(0, u, None)
    np.testing.assert_allclose(full, np.abs(u[0]) * d / _clip(XB), rtol=1e-15)
    np.testing.assert_allclose(full, 3 * np.abs(u[0]), rtol=1e-9)


def test_before_the_radial_derivative_every_output_counts_as_nonlinear():
    floor = _biased_floor(radial=False)
    u = [np.random.default_rng(1).standard_normal(16)]
    d = _secant(BIASED, [XB, W1], 0)[0]
    expected = np.abs(u[0]) * d / _clip(XB)
    np.testing.assert_allclose(floor.grad_magnitude(0, u, None, nonlinear=True), expected,
                               rtol=1e-15)
    a, b = np.full(16, 0.5), np.full(16, 0.25)
    assert floor.second(0, u, a, b) == pytest.approx(
        float(np.sum(np.abs(u[0]) * d * a * b / XB**2)), rel=1e-14)


def test_a_gradient_of_an_input_shaped_like_no_output_is_its_own_magnitude():
    floor = _biased_floor()
    u = [np.ones(16)]
    g = np.array([-5.0], np.float32)
    assert np.array_equal(floor.grad_magnitude(1, u, g), [5.0])
    # None: nothing there; it broadcasts against a cotangent of any shape
    none = floor.grad_magnitude(1, u, None)
    assert float(np.sum(np.abs(np.ones(3)) * none)) == 0.0
    assert floor.second(1, u, np.ones(1), np.ones(1)) == 0.0


def test_p_is_the_degree_of_homogeneity_of_each_output():
    """Two outputs shaped like x: x³ + 1/2 (degree 3, |1 - p| = 2) and 2x + 1/4 (linear, 0)."""
    F = _fn(lambda x: (x**3 + 0.5, 2.0 * x + 0.25))
    x = np.array([0.5, -1.5, 2.0])
    floor = _Floor(F, [x], F([x]), [0])
    floor.set_radial(0, [3 * x**3, 2 * x])
    u = [np.array([1.0, -2.0, 0.5]), np.array([3.0, 1.0, -1.0])]
    a, b = np.array([1.0, 2.0, -1.0]), np.array([0.5, 1.0, 2.0])
    expected = np.sum(np.abs(u[0]) * np.abs(x) ** 3 * 2 * np.abs(a) * np.abs(b) / x**2)
    assert floor.second(0, u, a, b) == pytest.approx(float(expected), rel=1e-12)


def test_an_undefined_p_counts_as_fully_nonlinear():
    """A radial derivative that overflowed says nothing about p: |1 - p| is taken as 1."""
    F = _fn(lambda x: (x**3 + 0.5,))
    x = np.array([0.5, 2.0])
    floor = _Floor(F, [x], F([x]), [0])
    floor.set_radial(0, [np.array([np.inf, 3 * 8.0])])
    u = [np.ones(2)]
    assert floor.second(0, u, np.array([1.0, 0.0]), np.ones(2)) == pytest.approx(
        abs(0.5**3) / 0.5**2, rel=1e-15)


def test_the_radial_step_and_the_second_order_floor_warn_of_nothing():
    """x_0 = 0 in an elementwise function: d_0 = 0 (divisions by zero in p), and a second-order
    floor that overflows (it makes the check skip, silently)."""
    F = _fn(lambda x: (x**3 + 0.5,))
    x = np.array([0.0, 1e-200])
    floor = _Floor(F, [x], F([x]), [0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        floor.set_radial(0, [3 * x**3])
        s = floor.second(0, [np.ones(2)], np.array([1.0, 1e200]), np.array([1.0, 1e200]))
    assert not math.isfinite(s)


# ------------------------------------------------------------------------------------------------
# _Floor.cross: how much gradient k moves along input m
# ------------------------------------------------------------------------------------------------
# Inputs: x (shaped like the output), w and c (shaped like none). The pairs counted are those
# k != m that involve x: (x, w), (x, c), (w, x), (c, x); never (w, c), (c, w) or k = m.
BIAS3 = _fn(lambda x, w, c: (w * x + c,))
C1 = np.array([7.0])


def _cross_floor():
    x = np.array([1.0, -2.0, 0.5, 4.0])
    return x, _Floor(BIAS3, [x, W1, C1], BIAS3([x, W1, C1]), [0, 1, 2])


def _cross_expected(floor, a, t, u, g, scales, pairs):
    gm = {k: floor.grad_magnitude(k, u, g.get(k), True) for k in a}
    return sum(float(np.sum(np.abs(a[k]) * gm[k])) * float(np.max(np.abs(t[m]))) / scales[m]
               for k, m in pairs)


def test_the_cross_floor_counts_the_pairs_that_involve_an_input_shaped_like_an_output():
    x, floor = _cross_floor()
    u = [np.array([1.0, 2.0, -1.0, 0.5])]
    g = {1: np.array([5.0]), 2: np.array([-0.5])}
    a = {0: np.array([0.5, 1.0, -1.0, 0.25]), 1: np.array([0.75]), 2: np.array([-0.5])}
    t = {0: np.array([0.25, -0.5, 0.125, 0.0]), 1: np.array([0.5]), 2: np.array([0.25])}
    scales = {0: 4.0, 1: 3.0, 2: 7.0}
    pairs = [(0, 1), (0, 2), (1, 0), (2, 0)]
    got = floor.cross(a, t, u, g, scales)
    assert got == pytest.approx(_cross_expected(floor, a, t, u, g, scales, pairs), rel=1e-15)
    # (w, x) alone: |a_w|·|g_w|·max|t_x|/max|x| = 0.75·5·0.5/4
    assert floor.cross({1: a[1]}, {0: t[0]}, u, g, scales) == pytest.approx(0.75 * 5 * 0.5 / 4)
    # a pair known not to depend is left out, and only that one
    floor.depends[(0, 1)] = False
    assert floor.cross(a, t, u, g, scales) == pytest.approx(
        _cross_expected(floor, a, t, u, g, scales, pairs[1:]), rel=1e-15)


def test_the_cross_floor_of_a_linear_output_is_zero():
    """After the radial derivative, gradient x of a linear output cannot change: its pairs
    add nothing, while (w, x) still does."""
    x = np.array([1.0, -2.0, 0.5, 4.0])
    floor = _Floor(BIAS3, [x, W1, C1], BIAS3([x, W1, C1]), [0, 1, 2])
    floor.set_radial(0, [3.0 * x])
    u = [np.ones(4)]
    a = {0: np.ones(4), 1: np.ones(1)}
    t = {0: np.ones(4), 1: np.ones(1)}
    g = {1: np.array([2.0])}
    assert floor.cross({0: a[0]}, {1: t[1]}, u, g, {0: 4.0, 1: 3.0}) == 0.0
    assert floor.cross(a, t, u, g, {0: 4.0, 1: 3.0}) == pytest.approx(2.0 * 1.0 / 4.0)


# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------


def test_unit_roundoffs():
    import ml_dtypes

    assert _unit_roundoff(np.dtype(ml_dtypes.bfloat16)) == 2.0**-8
    assert _unit_roundoff(np.float16) == 2.0**-11
    assert _unit_roundoff(np.float32) == 2.0**-24
    assert _unit_roundoff(np.float64) == 2.0**-53
    assert _unit_roundoff(np.complex64) == 2.0**-24
    assert _unit_roundoff(np.complex128) == 2.0**-53
    assert _unit_roundoff(np.int64) == 2.0**-53


def test_a_relative_direction_is_floored_at_2_to_the_minus_26_of_the_largest_element():
    v = np.array([1.0, -1.0, 0.5])
    x = np.array([0.0, 1.0, -2.0], np.float16)
    np.testing.assert_array_equal(_relative(v, x), v * [2.0**-26 * 2, 1.0, 2.0])
    # an all-zero input is moved on the scale of 1
    np.testing.assert_array_equal(_relative(v, np.zeros(3)), v * 2.0**-26)


def test_the_scale_of_arrays_is_their_largest_finite_magnitude_or_1():
    assert _scale_of([np.array([0.0, -3.0, np.inf]), np.array([2.0])]) == 3.0
    assert _scale_of([np.zeros(3)]) == 1.0


def test_the_central_difference_reports_the_step_it_took_and_its_rounding():
    """x = 1, h·v = 3·2^-52: both points are exact, the direction taken is v itself; the
    rounding estimate is 4u·(|f(x+hv)| + |f(x-hv)|)/(2h)."""
    F = _fn(lambda x: (1000.0 * x,))
    h = 3 * 2.0**-52
    _, v_eff, rnd = _central(F, [np.array([1.0])], {0: np.array([1.0])}, h)
    assert v_eff[0][0] == 1.0
    assert rnd[0][0] == 4 * U64 * (1000 * (1 + h) + 1000 * (1 - h)) / (2 * h)
    # float32 outputs: float32's unit roundoff
    F32 = _fn(lambda x: ((1000.0 * x).astype(np.float32),))
    h = 2.0**-10
    _, _, rnd = _central(F32, [np.array([1.0])], {0: np.array([1.0])}, h)
    p, m = np.float32(1000 * (1 + h)), np.float32(1000 * (1 - h))
    assert rnd[0][0] == 4 * 2.0**-24 * (float(p) + float(m)) / (2 * h)


def test_finite_difference_points_keep_the_input_dtype():
    x = np.array([1.0, 2.0], np.float32)
    new, taken = _fd_point([x], {0: np.array([1.0, -1.0])}, 2.0**-10)
    assert new[0].dtype == np.float32
    np.testing.assert_array_equal(taken[0], new[0].astype(np.float64) - x)
