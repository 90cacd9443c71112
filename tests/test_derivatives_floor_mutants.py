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
    assert floor.first(0, u, v) == pytest.approx(expected, rel=1e-15, abs=0)
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
    assert floor.first(0, u, np.array([0.0, 1.0])) == pytest.approx(1.0, rel=1e-15, abs=0)


def test_the_rounding_of_a_float32_secant_is_float32_s():
    """In float32 the rounding of y - y(0) is 4·2^-24·(|y| + |y(0)|): a step of 2^-22 above 1
    is noise there (it would not be in float64)."""
    F = _fn(lambda x: (x + np.float32(1.0),))
    x = np.array([2.0**-22, 1.0], np.float32)
    floor = _Floor(F, [x], F([x]), [0])
    assert floor.first(0, [np.ones(2)], np.array([1.0, 0.0])) == 0.0
    assert floor.first(0, [np.ones(2)], np.array([0.0, 1.0])) == pytest.approx(1.0, rel=1e-15,
                                                                               abs=0)


def test_a_float32_secant_and_input_are_taken_in_float64():
    """y = x + 2^-25 in float32 at x = 3 rounds to 3: the secant is 3 - 2^-25 (exact in float64,
    not in float32) and 1/|x| is 1/3 in float64."""
    F = _fn(lambda x: (x + np.float32(2.0**-25),))
    x = np.array([3.0], np.float32)
    floor = _Floor(F, [x], F([x]), [0])
    assert floor.first(0, [np.ones(1)], np.ones(1)) == pytest.approx((3 - 2.0**-25) / 3, rel=1e-15,
                                                                        abs=0)


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
        float(np.sum(u[0] * np.abs(y[0]) * a / np.abs(x))), rel=1e-15, abs=0)
    # second order: |u|·d·|1 - p|·|a|·|b|/x² with |1 - p| = 1
    assert floor.second(0, u, a, b) == pytest.approx(
        float(np.sum(u[0] * np.abs(y[0]) * a * b / x**2)), rel=1e-15, abs=0)


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
        float(np.sum(np.abs(u[0]) * d * a * b / XB**2)), rel=1e-14, abs=0)


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
    assert floor.second(0, u, a, b) == pytest.approx(float(expected), rel=1e-12, abs=0)


def test_an_undefined_p_counts_as_fully_nonlinear():
    """A radial derivative that overflowed says nothing about p: |1 - p| is taken as 1."""
    F = _fn(lambda x: (x**3 + 0.5,))
    x = np.array([0.5, 2.0])
    floor = _Floor(F, [x], F([x]), [0])
    floor.set_radial(0, [np.array([np.inf, 3 * 8.0])])
    u = [np.ones(2)]
    assert floor.second(0, u, np.array([1.0, 0.0]), np.ones(2)) == pytest.approx(
        abs(0.5**3) / 0.5**2, rel=1e-15, abs=0)


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
    assert got == pytest.approx(_cross_expected(floor, a, t, u, g, scales, pairs), rel=1e-15, abs=0)
    # (w, x) alone: |a_w|·|g_w|·max|t_x|/max|x| = 0.75·5·0.5/4
    assert floor.cross({1: a[1]}, {0: t[0]}, u, g, scales) == pytest.approx(0.75 * 5 * 0.5 / 4)
    # a pair known not to depend is left out, and only that one
    floor.depends[(0, 1)] = False
    assert floor.cross(a, t, u, g, scales) == pytest.approx(
        _cross_expected(floor, a, t, u, g, scales, pairs[1:]), rel=1e-15, abs=0)


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


# ------------------------------------------------------------------------------------------------
# the complex step
# ------------------------------------------------------------------------------------------------


def test_a_forward_that_warns_of_something_else_is_still_complex_stepped():
    def forward(x):
        warnings.warn("an unrelated notice", UserWarning, stacklevel=1)
        return x * x

    with pytest.warns(UserWarning):
        r = gradcheck(forward, lambda dy, x: (2 * x * dy,), [np.linspace(0.5, 2.0, 8)],
                      second_order=False)
    assert r and r.method == "complex", r.report()


def test_why_the_complex_step_is_unusable_names_the_forward_s_error_or_dtype():
    def raises(x):
        if np.iscomplexobj(x):
            raise ValueError("real input only")
        return x * x

    def real_out(x):
        return np.real(x * x)

    backward = lambda dy, x: (2 * x * dy,)  # noqa: E731
    x = [np.linspace(0.5, 2.0, 8)]
    r = gradcheck(raises, backward, x, second_order=False)
    assert r.method == "richardson" and "it raised ValueError: real input only" in r.notes[0]
    r = gradcheck(real_out, backward, x, second_order=False)
    assert r.method == "richardson"
    assert "it returned dtype float64 for complex input" in r.notes[0]


def test_a_complex_step_beyond_float64_is_inf_and_silent():
    F = _fn(lambda x: (1e308 * x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jv = _complex_step(F, [np.array([1.0])], {0: np.array([4.0])})
    assert jv[0][0] == np.inf


# ------------------------------------------------------------------------------------------------
# _Worst: the worst comparison of a check
# ------------------------------------------------------------------------------------------------


def test_a_check_with_no_comparison_is_skipped_and_says_why():
    c = _Worst().result("vjp", "x")
    assert (c.name, c.input, c.passed) == ("vjp", "x", None)
    assert c.note == ("skipped: its scale overflows or underflows float64 at this point "
                      "(rescale the inputs)")


def test_the_worst_reports_error_and_tolerance_relative_to_its_scale():
    w = _Worst()
    w.add(1.0, 4.0, 2.0, index=0)
    w.add(3.0, 8.0, 2.0, index=1)  # ratio 1.5: the worst
    w.add(0.5, 1.0, 1.0, index=2)
    assert w.index == 1
    c = w.result("jvp", "w")
    assert (c.passed, c.ratio, c.observed, c.tolerance) == (False, 1.5, 3.0 / 8, 2.0 / 8)


def test_of_equally_bad_comparisons_the_first_is_reported():
    w = _Worst()
    w.add(1.0, 1.0, 2.0, index=0)
    w.add(2.0, 1.0, 4.0, index=1)
    assert w.index == 0 and w.result("vjp", None).observed == 1.0


def test_a_zero_scale_reports_the_error_as_it_is():
    w = _Worst()
    w.add(0.5, 0.0, 1.0)
    c = w.result("vjp", None)
    assert (c.observed, c.tolerance, c.ratio) == (0.5, 1.0, 0.5)


def test_a_ratio_of_exactly_one_passes_and_one_and_a_half_fails():
    w = _Worst()
    w.add(1.0, 1.0, 1.0)
    assert w.result("vjp", None).passed is True
    w.add(1.5, 1.0, 1.0)
    assert w.result("vjp", None).passed is False


def test_comparisons_on_a_subnormal_scale_are_counted_apart():
    sub = 2.0**-1022 / 2.0**-53  # below it, the terms of the comparison are subnormal
    w = _Worst()
    w.add(0.0, 1e-300, 1e-310)
    w.add(0.0, 1e-300, 1e-300)
    assert w.result("vjp", None).passed is None
    w.add(0.0, sub, sub)  # at the boundary the terms are normal: judged
    c = w.result("vjp", None)
    assert c.passed is True
    assert c.note == "2 comparison(s) skipped: scale out of float64's normal range"


# ------------------------------------------------------------------------------------------------
# GradcheckResult.max_ratio, WorstEntry.to_dict
# ------------------------------------------------------------------------------------------------


def test_max_ratio_is_over_the_checks_that_ran_of_the_name_given():
    checks = [CheckResult("vjp", "x", True, ratio=0.5), CheckResult("vjp", "w", False, ratio=3.0),
              CheckResult("jvp", "x", True, ratio=0.25),
              CheckResult("second_order", None, None, ratio=7.0)]
    r = GradcheckResult(checks, "complex", [], {}, {})
    assert r.max_ratio() == 3.0
    assert r.max_ratio("jvp") == 0.25
    assert r.max_ratio("second_order") == 0.0  # skipped: nothing ran
    assert GradcheckResult([], "complex", [], {}, {}).max_ratio() == 0.0


def test_a_jacobian_entry_s_dict_names_its_output_index():
    w = WorstEntry((3,), (1, 2), 1.0, 2.0, 1.0, 0.5)
    assert w.to_dict()["output_index"] == [1, 2]
    assert WorstEntry((3,), None, 1.0, 2.0, 1.0, 0.5).to_dict()["output_index"] is None


# ------------------------------------------------------------------------------------------------
# the checker: method, notes, localisation, reentrancy
# ------------------------------------------------------------------------------------------------
SQUARE_BACKWARD = lambda dy, x: (2 * x * dy,)  # noqa: E731
XS = np.linspace(0.5, 2.0, 8)


def test_a_requested_finite_difference_method_is_kept_without_a_holomorphy_test():
    """abs is not holomorphic, but central differences were asked for: nothing is complex."""
    r = gradcheck(lambda x: np.abs(x) * x, SQUARE_BACKWARD, [XS], method="central",
                  second_order=False)
    assert r and r.method == "central" and not r.notes, r.report()
    assert r.evaluations.get("forward_complex", 0) == 0


def test_the_fallback_note_says_where_it_falls_back_to():
    r = gradcheck(lambda x: np.abs(x) * x, SQUARE_BACKWARD, [XS], second_order=False)
    assert r.method == "richardson"
    assert r.notes[0].endswith("; falling back to Richardson extrapolation")


def test_a_none_gradient_is_checked_and_the_check_says_so():
    def backward(dy, x, w):
        return 2 * dy, None

    r = gradcheck(lambda x, w: 2 * x, backward, [XS, XS.copy()], n_directions=1,
                  second_order=False)
    assert r, r.report()
    assert r.check("vjp", "input1").note == ("backward returned None: checked that the output "
                                             "does not depend on it")
    assert r.check("vjp", "input0").note == ""


# dx off by δ in every entry of 64: each entry alone is within atol = 2δ, their sum is not.
DELTA = 1e-3


def test_an_error_spread_thinly_is_not_localised_and_the_note_says_so():
    r = gradcheck(lambda x: x, lambda dy, x: (dy + DELTA,), [np.ones(64)], atol=2 * DELTA,
                  second_order=False)
    c = r.check("vjp", "input0")
    assert c.passed is False and not c.worst
    assert re.fullmatch(r"not localised in \d+ evaluations: the error is spread thinly", c.note)


def test_a_none_gradient_s_thin_error_keeps_both_notes():
    r = gradcheck(lambda x, w: x + DELTA * w, lambda dy, x, w: (dy, None),
                  [np.ones(64), np.ones(64)], atol=5 * DELTA, second_order=False, seed=1)
    c = r.check("vjp", "input1")
    assert c.passed is False and not c.worst, r.report()
    assert re.fullmatch(r"backward returned None: checked that the output does not depend on "
                        r"it; not localised in \d+ evaluations: the error is spread thinly",
                        c.note)


class _WrongOnCall:
    """3·dy, except on call number ``bad`` (0-based), where dx[5] is off by 1."""

    def __init__(self, bad: int) -> None:
        self.calls, self.bad = 0, bad

    def __call__(self, dy, x):
        g = 3.0 * dy
        if self.calls == self.bad:
            g[5] += 1.0
        self.calls += 1
        return (g,)


def test_the_failing_direction_pair_is_the_one_localised():
    """Only the third cotangent's gradient is wrong: the search runs along that pair (along the
    first one it would find nothing)."""
    x = np.linspace(-1.0, 1.0, 16)
    r = gradcheck(lambda x: 3.0 * x, _WrongOnCall(2), [x], second_order=False,
                  jvp=lambda inputs, tangents: 3.0 * tangents[0])
    for name in ("vjp", "jvp"):
        c = r.check(name, "input0")
        assert c.passed is False and [w.input_index for w in c.worst] == [(5,)], r.report()


def test_the_jvp_gets_tangents_of_the_inputs_dtype():
    seen = []

    def jvp(inputs, tangents):
        seen.append(tangents[0].dtype)
        return 2 * inputs[0] * tangents[0]

    x = np.linspace(0.5, 2.0, 8).astype(np.float32)
    r = gradcheck(lambda x: x * x, lambda dy, x: ((2 * x * dy).astype(x.dtype),), [x], jvp=jvp,
                  second_order=False)
    assert r, r.report()
    assert seen and set(seen) == {np.dtype(np.float32)}


def test_the_same_nan_bits_twice_are_reentrant():
    """A NaN gradient fails the comparisons but is the same both times; so is a constant input
    holding a NaN that nobody touches."""
    def backward(dy, x, c):
        g = 2 * x * dy
        g[0] = np.nan
        return g, None

    c = np.array([np.nan, 1.0])
    r = gradcheck(lambda x, c: x * x, backward, [XS, c], wrt=[0], second_order=False)
    assert r.check("reentrancy").passed is True, r.report()
    assert r.check("vjp").passed is False


def test_each_reentrancy_problem_is_counted_and_named():
    def backward(dy, x, c):
        dy[0] += 1.0
        c[0] += 1.0
        return 2 * x * dy, None

    r = gradcheck(lambda x, c: x * x, backward, [XS, np.zeros(2)], wrt=[0],
                  second_order=False, names=["x", "c"])
    c = r.check("reentrancy")
    assert (c.passed, c.observed, c.tolerance, c.ratio) == (False, 2.0, 0.0, math.inf)
    assert c.note == "the backward modified its dy in place; c: the input was modified in place"


def test_the_holomorphy_probe_moves_each_element_relative_to_itself():
    """RMSNorm rows at 1 and at 1e-8 (eps = 1e-30): a probe step on the scale of the largest
    element would carry the small row far across itself and the holomorphic forward would be
    taken for a non-holomorphic one."""
    p = oracle_problem("rms_norm", (2, 16), eps=1e-30)
    x = p.inputs[0].copy()
    x[1] *= 1e-8
    r = gradcheck(p.forward, p.backward, [x, *p.inputs[1:]], names=p.names, second_order=False)
    assert r and r.method == "complex" and not r.notes, r.report()



# ------------------------------------------------------------------------------------------------
# second order
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "D"), [(4096, 1), (4095, 3), (4096, 5)])
def test_second_order_evaluation_counts_follow_the_module_docstring(n, D):
    """K = 1 input (x, shaped like the output), D directions, P = ceil(D/2) pairs, T = 3 draws
    of the dependence probe below 4096 elements and 1 from 4096 on."""
    p = oracle_problem("rms_norm", (1, n), weight=False)
    r = p.check(n_directions=D)
    assert r, r.report()
    K, P, T = 1, math.ceil(D / 2), (3 if n < 4096 else 1)
    c = r.evaluations
    assert c["backward"] == (D + 1) + (1 + 4 + 2 * K * T)
    assert c["backward_complex"] == 1 + 2 * P + (K + 1) * P
    assert c["forward_complex"] == 1 + K * D + (1 + 6 * P)
    assert c["double_backward"] == (K + 1) * P


def _abs_weight_backward(dy, x, w):
    """The gradients of w·x², dx through |w| (equal at w > 0, not holomorphic in w)."""
    return 2 * x * np.abs(w) * dy, x * x * dy


def test_a_backward_not_holomorphic_in_its_second_input_skips_the_second_order_checks():
    inputs = [XS, np.linspace(1.0, 2.0, 8)]
    r = gradcheck(lambda x, w: w * x * x, _abs_weight_backward, inputs)
    assert r, r.report()
    c = r.check("second_order")
    assert c.passed is None and c.note.startswith("the backward cannot be complex-stepped: ")
    assert r.notes == [f"second-order checks skipped: {c.note}"]
    asked = gradcheck(lambda x, w: w * x * x, _abs_weight_backward, inputs, second_order=True)
    c = asked.check("second_order")
    assert (c.passed, c.observed, c.tolerance, c.ratio) == (False, math.inf, 0.0, math.inf)


def test_second_order_checks_name_what_they_compared():
    r = oracle_problem("rms_norm", (2, 8)).check()
    c = r.check("second_order")
    assert c.passed and c.input is None
    assert c.note == "⟨v1, H v2⟩ from the backward vs d/ds of the forward's JVP"
    fd = oracle_problem("rms_norm", (2, 8)).check(method="central")
    c = fd.check("second_order")
    assert c.passed is None and c.input is None
    assert c.note == "needs a complex-step forward (the nested finite difference is too coarse)"
    assert fd.check("hessian_symmetry").passed


def test_atol_widens_every_second_order_comparison():
    r = oracle_problem("rms_norm", (2, 8)).check(atol=1.0)
    for name in ("hessian_symmetry", "second_order", "double_backward"):
        assert r.check(name).passed and r.max_ratio(name) < 1e-3, r.report()


# A Hessian error S that a constant direction cannot see: skew, and every row and column sums
# to 0 (⟨1, S v⟩ = ⟨Sᵀ1, v⟩ = 0). With |x| = 1 everywhere, a relative direction c·|x| is constant
# too; only directions drawn elementwise catch it.
SKEW = np.array([[0.0, 1, 0, -1], [-1, 0, 1, 0], [0, -1, 0, 1], [1, 0, -1, 0]])
XPM = np.array([1.0, -1.0, 1.0, -1.0])


def test_an_asymmetric_hessian_invisible_along_constant_directions_is_caught():
    def forward(x):
        return np.atleast_1d(0.5 * x @ x)

    def backward(dy, x):
        return (dy * (x + SKEW @ x),)

    r = gradcheck(forward, backward, [XPM])
    assert r.check("hessian_symmetry").passed is False, r.report()
    assert r.check("second_order").passed is False


def test_a_double_backward_wrong_only_off_the_constant_direction_is_caught():
    def forward(x):
        return np.atleast_1d(0.5 * x @ x)

    def backward(dy, x):
        return (dy * x,)

    def double_backward(dd, dy, x):
        (ddx,) = dd
        return np.atleast_1d(np.sum(ddx * x)), dy * (ddx + SKEW @ ddx)

    r = gradcheck(forward, backward, [XPM], double_backward=double_backward)
    assert r.check("double_backward", "input0").passed is False, r.report()
    assert r.check("double_backward", "dy").passed


def test_a_none_from_the_double_backward_for_an_unused_output_counts_as_zero():
    """The second output is a constant: no gradient depends on its cotangent."""
    c = np.array([1.0, 2.0])

    def forward(x):
        return x * x, c

    def backward(dys, x):
        return (2 * x * dys[0],)

    def double_backward(dd, dys, x):
        (ddx,) = dd
        return (2 * x * ddx, None), 2 * dys[0] * ddx

    r = gradcheck(forward, backward, [XS], double_backward=double_backward)
    assert r and r.check("double_backward", "dy").passed, r.report()


def test_the_dependence_probe_raises_no_warning_from_the_user_s_overflows():
    """The probe evaluates the backward at values up to ~2^62 in float32, where x³ overflows;
    those are the probe's business, not the user's."""
    x = np.linspace(0.5, 2.0, 8).astype(np.float32)

    def backward(dy, x):
        return ((x * x * x * dy).astype(x.dtype),)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = gradcheck(lambda x: x**4 / 4, backward, [x])
    assert r, r.report()


def test_the_second_directional_derivative_and_its_rounding_estimate():
    """φ(s) = ⟨u, J(x + s·v2)·v1⟩ for F = (x², 3x) is linear in s, with every value a short
    binary fraction: d/ds = Σ 2·u₁·v1·v2 exactly, the Romberg entries agree, and the estimate is
    its rounding part alone, 2·16·u·mag/(s0/4) with s0 = 2^-8 and mag the largest
    Σ|u₁|·max(|φ terms at ±s|) -- the linear output 3x does not move with s and is left out."""
    F = _fn(lambda x: (x * x, 3.0 * x))
    x = np.array([1.0, 2.0])
    v1, v2 = {0: np.array([1.0, -1.0])}, {0: np.array([0.5, 1.0])}
    u = [np.array([2.0**-4, 2.0**-6]), np.array([1.0, 1.0])]
    T2, est = _second_directional(F, [x], [0], u, v1, v2, U64)
    assert T2 == 2 * (2.0**-4 * 0.5 - 2.0**-6 * 1.0)
    s0 = 2.0**-8
    mag = 2.0**-4 * 2 * (1 + s0 * 0.5) + 2.0**-6 * 2 * (2 + s0 * 1.0)
    assert est == pytest.approx(2 * 16 * U64 * mag / (s0 / 4), rel=1e-12, abs=0)


def test_gradients_that_depend_on_no_input_get_no_second_order_floor():
    """y = x + c: dx = dy and dc = Σdy depend on neither input (the dependence probe sees the
    same bits at every point) and y is linear in x (|1 - p| = 0): the floor is exactly 0, and so
    is every second-order tolerance (the Hessian is exactly 0 too)."""
    def backward(dy, x, c):
        return dy, np.atleast_1d(np.sum(dy))

    r = gradcheck(lambda x, c: x + c, backward, [np.linspace(-1.0, 1.0, 8), np.array([0.5])])
    for name in ("hessian_symmetry", "second_order"):
        c = r.check(name)
        assert (c.passed, c.observed, c.tolerance) == (True, 0.0, 0.0), r.report()


def test_the_dependence_probe_calls_the_backward_with_the_inputs_dtypes():
    import ml_dtypes

    for dtype in (np.float32, ml_dtypes.bfloat16):
        seen = set()

        def backward(dy, x, dtype=dtype, seen=seen):
            if np.iscomplexobj(x):
                return (2 * x * dy,)
            seen.add(x.dtype)
            return ((2 * x.astype(np.float32) * dy).astype(dtype),)

        x = np.linspace(0.5, 2.0, 8).astype(dtype)
        # bfloat16 is checked only with an explicit rtol (8 bits: the default 1024 u is 4)
        rtol = None if dtype == np.float32 else 2.0**-5
        r = gradcheck(lambda x: x * x, backward, [x], rtol=rtol)
        assert r and r.check("second_order").passed, r.report()
        assert seen == {np.dtype(dtype)}


def test_the_backward_s_holomorphy_probe_moves_each_element_relative_to_itself():
    """The rows at 1 and 1e-8 of the forward's probe, for the backward: the second-order checks
    run (a probe on the scale of the largest element would call the backward non-holomorphic)."""
    p = oracle_problem("rms_norm", (2, 16), eps=1e-30)
    x = p.inputs[0].copy()
    x[1] *= 1e-8
    r = gradcheck(p.forward, p.backward, [x, *p.inputs[1:]], names=p.names)
    assert r and r.check("hessian_symmetry").passed, r.report()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_dependence_probe_spans_the_range_its_comment_gives(dtype):
    """The probe draws values elementwise, of either sign, from 2^-200 to 2^200 in float64; in
    float32 up to 2^(128/2 - 2), so that a square stays finite. (The point itself is > 0.)"""
    seen = []

    def backward(dy, x):
        if np.iscomplexobj(x):
            return (2 * x * dy,)
        seen.append(x.astype(np.float64))
        return ((2 * x * dy).astype(x.dtype),)

    r = gradcheck(lambda x: x * x, backward, [np.linspace(0.5, 2.0, 8).astype(dtype)])
    assert r, r.report()
    assert any(np.any(a > 0) and np.any(a < 0) for a in seen)
    seen = [np.abs(a) for a in seen]
    top = np.log2(np.max(np.concatenate(seen)))
    if dtype == np.float64:
        assert top > 150 and np.log2(np.min(np.concatenate(seen))) < -150
    else:
        assert 50 < top < 64



def test_the_floor_of_a_cubic_is_a_third_of_its_second_derivative():
    """y = x³ at one element: the floor models |∂²y/∂x²| as d/x²·|1 - p| = |x|³/x²·2 = 2|x|
    against the true 6|x|, and along dy the gradient's size |u|·d/|x| = |u|·x² times
    |t|/|u| against the true 3x²·|t|. Every second-order comparison is then a single term whose
    floor is a third of it: tolerance = rtol·(1 + 1/3)."""
    def backward(dy, x):
        return (3 * x * x * dy,)

    def double_backward(dd, dy, x):
        (ddx,) = dd
        return 3 * x * x * ddx, 6 * x * dy * ddx

    r = gradcheck(lambda x: x**3, backward, [np.array([1.5])], double_backward=double_backward)
    assert r, r.report()
    rtol = r.settings["rtol"]
    for name, input in (("hessian_symmetry", None), ("double_backward", "dy"),
                        ("double_backward", "input0")):
        assert r.check(name, input).tolerance == pytest.approx(rtol * 4 / 3, rel=1e-9, abs=0)


def test_along_dy_a_gradient_shaped_like_no_output_is_floored_by_its_own_size():
    """x of shape () and y = (x³,): x is shaped like no output, so its gradient's size is
    |g| = 3x²·|u| itself, times |t|/|u| along dy -- exactly the one term compared: the tolerance
    of the double backward along dy is rtol·(1 + 1)."""
    def forward(x):
        return np.atleast_1d(x**3)

    def backward(dy, x):
        return (np.asarray(3 * x * x * dy[0]),)

    def double_backward(dd, dy, x):
        (ddx,) = dd
        return np.atleast_1d(3 * x * x * ddx), np.asarray(6 * x * dy[0] * ddx)

    r = gradcheck(forward, backward, [np.array(1.5)], double_backward=double_backward)
    assert r, r.report()
    tol = r.check("double_backward", "dy").tolerance
    assert tol == pytest.approx(2 * r.settings["rtol"], rel=1e-9, abs=0)


def test_a_gradient_that_moves_with_another_input_gets_the_cross_floor():
    """y = w·x with x of shape (1,) (shaped like y, linear in it: no floor of its own) and w of
    shape (): dw = u·x moves with x (the probe sees it), so ⟨v, H v'⟩ = u·(v_x v'_w + v_w v'_x)
    gets the cross floor |u|·(|v_w|·|v'_x| + |v'_w|·|v_x|), half the scale of the two sums."""
    def backward(dy, x, w):
        return w * dy, np.asarray(np.sum(dy * x))

    r = gradcheck(lambda x, w: w * x, backward, [np.array([1.5]), np.array(0.75)])
    assert r, r.report()
    tol = r.check("hessian_symmetry").tolerance
    assert tol == pytest.approx(1.5 * r.settings["rtol"], rel=1e-9, abs=0)


def test_the_radial_step_of_a_tiny_float32_input_is_taken_in_float64():
    """y = x + c in float32 at 1e-16: the step along x itself, h·x ~ 1e-46, exists in float64
    but not in float32; taken in float64 it shows y linear in x (no floor, tolerances 0)."""
    def backward(dy, x, c):
        if np.iscomplexobj(x):
            return dy, np.atleast_1d(np.sum(dy))
        return dy.astype(x.dtype), np.atleast_1d(np.sum(dy)).astype(x.dtype)

    x = (1e-16 * np.linspace(-1.0, 1.0, 8)).astype(np.float32)
    c = np.array([1e-16], np.float32)
    r = gradcheck(lambda x, c: x + c, backward, [x, c])
    for name in ("hessian_symmetry", "second_order"):
        assert r.check(name).tolerance == 0.0, r.report()


def test_a_gradient_that_is_nan_at_the_same_probe_points_has_not_moved():
    """y = x + c again (no floor, Hessian 0), with dc computed as Σdy·c⁸/c⁸: 1 at the point,
    NaN wherever the probe puts c beyond 2^±128 -- at both values of x alike. Same NaNs, same
    bits: dc does not depend on x, and the tolerances stay exactly 0."""
    def backward(dy, x, c):
        return dy, np.atleast_1d(np.sum(dy)) * c**8 / c**8

    r = gradcheck(lambda x, c: x + c, backward, [np.linspace(-1.0, 1.0, 8), np.array([0.5])])
    for name in ("hessian_symmetry", "second_order"):
        c = r.check(name)
        assert (c.passed, c.observed, c.tolerance) == (True, 0.0, 0.0), r.report()


def test_tiny_inputs_get_a_normal_imaginary_step_or_none():
    """y = 3x near float64's smallest normals: 1e-30 of x would be a subnormal (or zero) step.
    At 1e-285 the step is kept normal and the complex step is exact; at 1e-296 no step is both
    normal and small next to x: the forward falls back to Richardson saying why (and the
    comparison, whose terms are subnormal there, is skipped rather than passed or crashed)."""
    def backward(dy, x):
        return (3 * dy,)

    r = gradcheck(lambda x: 3 * x, backward, [1e-285 * XS])
    assert r and r.method == "complex" and not r.notes, r.report()
    assert r.max_ratio() < 1e-2
    r = gradcheck(lambda x: 3 * x, backward, [1e-296 * XS])
    assert r.method == "richardson" and not r.failures(), r.report()
    assert "an input's largest element, 2e-296, is below 2^-952 = 2.63e-287" in r.notes[0]


def test_the_complex_step_holds_down_to_an_input_of_exactly_its_smallest_scale():
    """The complex step is refused only *below* 2^-952 (_MIN_COMPLEX_SCALE): an input whose
    largest element is exactly 2^-952 still takes it (its step 2^-992 is normal and 2^-40 of x),
    the next float64 below falls back to Richardson, and the note gives the whole reason."""
    from rmsref.derivatives import _MIN_COMPLEX_SCALE

    def backward(dy, x):
        return (3 * dy,)

    at = XS / np.max(np.abs(XS)) * _MIN_COMPLEX_SCALE  # largest |element| exactly 2^-952
    assert _MIN_COMPLEX_SCALE == 2.0**-952 and np.max(np.abs(at)) == _MIN_COMPLEX_SCALE
    r = gradcheck(lambda x: 3 * x, backward, [at])
    assert r and r.method == "complex" and not r.notes, r.report()
    # the second-order check's points x ± s·v2 fall below 2^-952: skipped, saying why (it used
    # to raise NotComplexCapable out of gradcheck)
    c = r.check("second_order")
    assert c.passed is None and c.note.startswith(
        "skipped: the forward cannot be complex-stepped near the point (an input's largest "
        "element, 2.6"), c.note
    assert "is below 2^-952 = 2.63e-287" in c.note
    below = at * (1 - 2.0**-53)  # largest |element| the float64 just below 2^-952
    assert np.max(np.abs(below)) == np.nextafter(_MIN_COMPLEX_SCALE, 0)
    r = gradcheck(lambda x: 3 * x, backward, [below])
    assert r.method == "richardson", r.report()
    assert ("an input's largest element, 2.63e-287, is below 2^-952 = 2.63e-287: no imaginary "
            "step there is both a normal float64 and small next to it") in r.notes[0], r.notes


def test_a_subnormal_input_is_not_checked_and_warns_of_nothing():
    """x ~ 1e-310 (subnormal): below the complex step's range, so every comparison is skipped
    (NOT CHECKED, saying why); building the floor's 1/|x| (inf there) raises no RuntimeWarning
    (it printed 'overflow encountered in divide')."""
    import warnings

    def backward(dy, x):
        return (3 * dy,)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = gradcheck(lambda x: 3 * x, backward, [1e-310 * XS])
    assert not r and not r.compared(), r.report()
    assert r.report().startswith("gradcheck: NOT CHECKED")
    assert "is below 2^-952 = 2.63e-287" in r.notes[0]


THIRD = 1.0 / 3.0


def _third_x_one_row(x):
    """y = x/3 for one row only: the full Jacobian then takes one forward call per column."""
    if x.ndim != 1:
        raise ValueError(f"one row only, got shape {x.shape}")
    return THIRD * x


@pytest.mark.parametrize("forward", [lambda x: THIRD * x, _third_x_one_row],
                         ids=["batched columns", "one call per column"])
def test_every_full_jacobian_column_of_a_tiny_input_takes_a_normal_step(forward):
    """The full Jacobian's complex-step columns after the first (batched, or one call each when
    the forward does not broadcast) take the first column's step: ~1e-30 of the input, never
    below 2^-992. At x up to 3e-286 a step of 1e-30 of x is 2^-1048, and Im(x/3 + i·h/3) =
    h/3 is then a subnormal that keeps about 25 of 1/3's 53 bits: the full check failed this
    correct backward (both ways of computing the columns). With a normal power-of-two step the
    columns are 1/3 exactly, and the analytic dx = dy/3 matches them bit for bit."""
    def backward(dy, x):
        return (THIRD * dy,)

    r = gradcheck(forward, backward, [1.5e-286 * XS], full=True, second_order=False)
    c = r.check("jacobian", "input0")
    assert r and r.method == "complex" and not r.notes, r.report()
    assert c.passed and c.observed == 0.0, r.report()
