"""Behaviours that mutation testing (bench/mutation.py) found unchecked, each pinned here.

Each test names the behaviour, not the mutant: a mutant is one way of breaking it.
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsref
from rmsref import tolerance as T
from rmsref._shapes import bfloat16


def test_ulp_in_every_dtype_down_to_the_subnormals():
    """One ulp at 1 and at the smallest subnormals: p and emin of each dtype."""
    for dtype, p, emin in ((np.float64, 53, -1022), (np.float32, 24, -126), (bfloat16, 8, -126),
                           (np.float16, 11, -14)):
        tiny = np.ldexp(1.0, emin - 5)                        # below the normal range
        got = T.ulp(np.array([1.0, -3.0, tiny, 2.0**emin]), dtype)
        np.testing.assert_array_equal(got, np.ldexp(1.0, [1 - p, 2 - p, emin - p + 1,
                                                          emin - p + 1]), err_msg=str(dtype))


def test_ulp_of_zero_is_the_smallest_subnormal_and_of_non_finite_the_ulp_at_one():
    """0's spacing is the distance to the next number, the smallest subnormal (so an output of
    one subnormal where the exact value is 0 is 1 ulp off); inf and nan have no spacing of their
    own: ulp() reports the ulp at 1 for them (a finite placeholder, so that an error counted in
    ulps stays finite)."""
    for dtype, p, emin in ((np.float64, 53, -1022), (np.float32, 24, -126), (bfloat16, 8, -126),
                           (np.float16, 11, -14)):
        got = T.ulp(np.array([0.0, -0.0, np.inf, -np.inf, np.nan]), dtype)
        np.testing.assert_array_equal(got, np.ldexp(1.0, [emin - p + 1] * 2 + [1 - p] * 3),
                                      err_msg=str(dtype))


def test_full_jacobian_worst_entries_carry_their_tolerance():
    """Each localised disagreement of the full Jacobian says how far it is beyond its own
    tolerance: error > tolerance > 0, both finite, ratio = error / tolerance."""
    from rmsref.derivatives import gradcheck
    from tests.test_gradcheck import _problem_with_bug

    r = gradcheck(*_problem_with_bug("single_entry_1e-6", (1, 1024)), full=True,
                  second_order=False, names=("x", "weight", "bias"))
    worst = r.check("jacobian", "x").worst
    assert worst
    for w in worst:
        assert 0 < w.tolerance < w.error < np.inf, w
        assert w.ratio == w.error / w.tolerance


def test_identity_default_seed_is_zero():
    """run_one without a seed draws the inputs of seed 0 (what `rmsref identities` reports)."""
    from rmsref import identities

    name = identities.names()[0]
    a, b = identities.run_one(name, quick=True), identities.run_one(name, seed=0, quick=True)
    c = identities.run_one(name, seed=1, quick=True)
    assert a.residual == b.residual and a.bound == b.bound
    assert a.residual != c.residual


def test_gradcheck_report_leaves_a_skipped_checks_numbers_blank():
    """A skipped check has no observed error, tolerance or ratio: its row says so and prints no
    number or placeholder in those columns."""
    from rmsref.derivatives import CheckResult, GradcheckResult

    skipped = CheckResult("second_order", "x", None, note="no double backward given")
    report = GradcheckResult([skipped], "complex-step", [], {}, {}).report()
    row = next(line for line in report.splitlines() if line.lstrip().startswith("second_order"))
    assert row.split() == ["second_order", "x", "skipped:", "no", "double", "backward", "given"]


def test_fused_add_passes_offset_on():
    """add_rms_norm and conventions.emulate_add normalise with offset + w when given an offset."""
    import rmsref
    from rmsref import conventions

    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((3, 16)), rng.standard_normal((3, 16))
    w = rng.standard_normal(16)
    y, _ = rmsref.add_rms_norm(x, r, 16, w, 1e-6, offset=1.0)
    np.testing.assert_array_equal(y, rmsref.rms_norm_forward(x + r, 16, w, 1e-6, offset=1.0)[0])
    x32, r32, w32 = (a.astype(np.float32) for a in (x, r, w))
    y, _ = conventions.emulate_add("torch", x32, r32, w32, 1e-6, offset=1.0)
    np.testing.assert_array_equal(y, conventions.emulate("torch", x32 + r32, w32, 1e-6, offset=1.0))
    assert not np.array_equal(y, conventions.emulate("torch", x32 + r32, w32, 1e-6))


def test_jvp_is_complex_linear_in_the_tangent():
    """For complex inputs (complex-step) the JVP is linear over the complex numbers: the tangent's
    imaginary part is carried, not dropped: jvp(x, i·t) = i·jvp(x, t)."""
    import rmsref

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8)) + 1e-20j
    t = rng.standard_normal((2, 8))
    j = rmsref.rms_norm_jvp(x, t, 8, eps=1e-6)
    np.testing.assert_allclose(rmsref.rms_norm_jvp(x, 1j * t, 8, eps=1e-6), 1j * j, rtol=1e-15)


def test_unit_norm_backward_checks_dy_and_bias_by_name():
    import pytest

    import rmsref

    x = np.ones((2, 4))
    with pytest.raises(TypeError, match="^dy "):
        rmsref.unit_norm_backward(np.ones((2, 4), np.int32), x, 4)
    with pytest.raises(ValueError, match="bias"):
        rmsref.unit_norm_backward(x, x, 4, np.ones(4), bias=np.ones(3))


def test_unit_norm_staged_backward_without_weight():
    """The teaching (staged) backward agrees with the closed form when there is no weight."""
    import rmsref

    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    staged = rmsref.unit_norm_backward_staged(dy, x, 8)
    np.testing.assert_allclose(staged.dx, rmsref.unit_norm_backward(dy, x, 8).dx, rtol=1e-13,
                               atol=1e-15)


def test_bound_passes_every_parameter_to_the_error_model():
    """tolerance.bound(...) is the ErrorModel of its arguments: rows defaults to 1, and
    acc_dtype, k_out, reduction, block, form and lam reach the model."""
    rng = np.random.default_rng(3)
    n = 64
    dy, xhat = rng.standard_normal((4, n)), rng.standard_normal((4, n))
    dw = np.sum(dy * xhat, axis=0)
    f16 = np.dtype(np.float16)
    plain = T.bound("dweight", out_dtype=f16, n=n, dweight=dw, dy=dy, xhat=xhat)
    np.testing.assert_array_equal(plain, T.bound_dweight(dw, dy, xhat, T.ErrorModel(f16, n, 1)))
    options = dict(rows=4, acc_dtype=f16, k_out=2, reduction="blocked", block=8,
                   form="deterministic", lam=3.0)
    model = T.ErrorModel(f16, n, **options)
    got = T.bound("dweight", out_dtype=f16, n=n, dweight=dw, dy=dy, xhat=xhat, **options)
    np.testing.assert_array_equal(got, T.bound_dweight(dw, dy, xhat, model))
    def bound(**kw):
        return T.bound("dweight", out_dtype=f16, n=n, dweight=dw, dy=dy, xhat=xhat, **kw)

    for key, value in options.items():       # each one changes the bound on its own
        base = {"reduction": "blocked"} if key == "block" else {}
        assert not np.array_equal(bound(**base, **{key: value}), bound(**base)), key


def test_underflow_atol_is_half_the_smallest_subnormal_of_each_dtype():
    for dtype, half_subnormal in ((np.float64, 2.0**-1075), (np.float32, 2.0**-150),
                                  (bfloat16, 2.0**-134), (np.float16, 2.0**-25),
                                  (np.complex64, 2.0**-150), (np.complex128, 2.0**-1075)):
        assert T.underflow_atol(dtype) == half_subnormal, dtype


def _complex_step_matches_central_differences(f, x, v):
    """Im f(x + i·h·v)/h (complex step, exact to rounding) against central differences."""
    h, e = 1e-20, 1e-6
    c, p, m = f(x + 1j * h * v), f(x + e * v), f(x - e * v)
    for field in c._fields:
        a = getattr(c, field)
        if a is None:
            continue
        fd = (getattr(p, field) - getattr(m, field)) / (2 * e)
        assert np.max(np.abs(a.imag)) > 0, f"{field}: the imaginary part was dropped"
        np.testing.assert_allclose(a.imag / h, fd, rtol=1e-6, atol=1e-8, err_msg=field)


def test_double_backward_and_staged_unit_norm_keep_the_complex_step():
    """The second-order and staged functions compute in complex128 for complex inputs (a
    real cast would drop the imaginary part the complex step needs)."""
    from rmsref import unitnorm

    rng = np.random.default_rng(11)
    x, v, dy, ddx = (rng.standard_normal((3, 8)) for _ in range(4))
    w = 1 + 0.3 * rng.standard_normal(8)
    _complex_step_matches_central_differences(
        lambda xx: rmsref.rms_norm_double_backward(ddx, dy, xx, 8, w, 1e-5), x, v)
    _complex_step_matches_central_differences(
        lambda xx: unitnorm.unit_norm_backward_staged(dy, xx, 8, w), x, v)


def test_identify_ranks_a_float32_only_implementation():
    """No half dtype runs: identify falls back to float32 and still reports rates per case."""
    from rmsref.conventions import emulate, identify

    def float32_only(x, shape, w=None, eps=None):
        if np.asarray(x).dtype != np.float32:
            raise TypeError("float32 only")
        return emulate("torch", x, w, eps, normalized_shape=shape)

    ranking = identify(float32_only, shape=(8, 64))
    assert ranking[0].rate == 1.0
    assert ranking[0].rates and all(case.startswith("float32") for case in ranking[0].rates)


def test_double_backward_names_a_bad_ddbias():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="ddbias"):
        rmsref.rms_norm_double_backward(x, x, x, 4, np.ones(4), 1e-5, ddbias=np.ones(5))


def test_staged_unit_norm_backward_takes_eps_none_as_zero_like_the_closed_form():
    from rmsref import unitnorm

    rng = np.random.default_rng(12)
    # rows small enough (Σx² ~ 1e-16) that any default eps (2^-52 for float64) would show
    x, dy = 1e-8 * rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    staged = unitnorm.unit_norm_backward_staged(dy, x, 8, eps=None)
    closed = unitnorm.unit_norm_backward(dy, x, 8, eps=None)
    np.testing.assert_allclose(staged.dx, closed.dx, rtol=1e-13, atol=0)
    np.testing.assert_allclose(staged.dx, unitnorm.unit_norm_backward(dy, x, 8, eps=0.0).dx,
                               rtol=1e-13, atol=0)
