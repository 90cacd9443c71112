"""Unit-norm oracle, property by property: x/‖x‖ written out, every option of the backward,
the JVP against a complex step of the forward, exact power-of-two scaling, result dtypes,
errors by name."""

from __future__ import annotations

import numpy as np
import pytest

import rmsref
from rmsref._rounding import round_to
from rmsref._shapes import bfloat16
from tests.norm_checks import assert_grads_close, assert_linear, inputs, pick

PARAMS = [(False, False), (True, False), (False, True), (True, True)]
SHAPES = [(9, (4, 9)), ((3, 4), (2, 3, 3, 4))]


@pytest.mark.parametrize(("has_w", "has_b"), PARAMS)
@pytest.mark.parametrize(("ns", "xshape"), SHAPES)
@pytest.mark.parametrize("eps", [None, 0.0, 3.0])
def test_forward_is_x_over_its_norm(rng, has_w, has_b, ns, xshape, eps):
    """y = x / sqrt(Σ x² + eps) ⊙ w + b over the normalised dims (eps 0 when not passed),
    rnorm = 1 / sqrt(Σ x² + eps) with keepdims shape, written out with NumPy."""
    x, _, w, b = inputs(rng, ns, xshape, has_w, has_b)
    kw = {} if eps is None else {"eps": eps}
    y, rnorm = rmsref.unit_norm_forward(x, ns, w, bias=b, **kw)
    nd = 1 if isinstance(ns, int) else len(ns)
    axes = tuple(range(x.ndim - nd, x.ndim))
    ref_rnorm = 1 / np.sqrt(np.sum(x * x, axis=axes, keepdims=True) + (eps or 0.0))
    ref = x * ref_rnorm * (1 if w is None else w) + (0 if b is None else b)
    assert rnorm.shape == ref_rnorm.shape and rnorm.dtype == np.float64
    np.testing.assert_allclose(rnorm, ref_rnorm, rtol=1e-14)
    np.testing.assert_allclose(y, ref, rtol=1e-13, atol=1e-14)
    if b is None:
        np.testing.assert_array_equal(rmsref.unit_norm(x, ns, w, **kw), y)


@pytest.mark.parametrize(("has_w", "has_b"), PARAMS)
@pytest.mark.parametrize(("ns", "xshape"), SHAPES)
@pytest.mark.parametrize("eps", [None, 0.0, 3.0])
def test_staged_and_saved_rnorm_backward_equal_the_closed_form(rng, has_w, has_b, ns, xshape,
                                                               eps):
    """Staged, closed form and closed form given the saved rnorm: the same gradients (dweight /
    dbias exactly where there is a weight / bias), and dx is the independent formula
    rnorm · (dxhat − xhat · Σ dxhat ⊙ xhat)."""
    x, dy, w, b = inputs(rng, ns, xshape, has_w, has_b)
    kw = {} if eps is None else {"eps": eps}
    closed = rmsref.unit_norm_backward(dy, x, ns, w, bias=b, **kw)
    _, rnorm = rmsref.unit_norm_forward(x, ns, w, bias=b, **kw)
    saved = rmsref.unit_norm_backward(dy, x, ns, w, rnorm=rnorm, bias=b, **kw)
    staged = rmsref.unit_norm_backward_staged(dy, x, ns, w, rnorm=rnorm, bias=b, **kw)
    assert (closed.dweight is None) == (not has_w) and (closed.dbias is None) == (not has_b)
    assert_grads_close(saved, closed)
    assert_grads_close(staged, closed)
    n = x.size // rnorm.size
    xr, dyr, r = x.reshape(-1, n), dy.reshape(-1, n), rnorm.reshape(-1, 1)
    xhat = xr * r
    dxhat = dyr * (1 if w is None else w.reshape(1, n))
    dx = r * (dxhat - xhat * np.sum(dxhat * xhat, -1, keepdims=True))
    np.testing.assert_allclose(closed.dx.reshape(-1, n), dx, rtol=0, atol=1e-13 * np.max(abs(dx)))
    if has_w:
        np.testing.assert_allclose(closed.dweight.ravel(), np.sum(dyr * xhat, 0), rtol=1e-12)
    if has_b:
        np.testing.assert_allclose(closed.dbias.ravel(), np.sum(dyr, 0), rtol=1e-13)


def test_backward_uses_the_saved_rnorm_as_given(rng):
    x, dy, w, _ = inputs(rng, 9, (4, 9), True, False)
    _, rnorm = rmsref.unit_norm_forward(x, 9, w)
    g = rmsref.unit_norm_backward(dy, x, 9, w, rnorm=2 * rnorm)
    np.testing.assert_allclose(g.dweight, np.sum(dy * x * 2 * rnorm, 0), rtol=1e-13)


@pytest.mark.parametrize(("has_w", "has_b"), PARAMS)
@pytest.mark.parametrize("tangents", ["x", "all"])
@pytest.mark.parametrize("eps", [None, 0.0, 0.5])
def test_jvp_is_the_complex_step_of_the_forward(rng, has_w, has_b, tangents, eps):
    """unit_norm_jvp equals the complex-step derivative of unit_norm_forward, with and without
    the parameters' tangents, at the default eps (None: not passed) too."""
    x, _, w, b = inputs(rng, 9, (4, 9), has_w, has_b, scale=0.3)
    t = rng.standard_normal(x.shape)
    tw = rng.standard_normal(9) if has_w and tangents == "all" else None
    tb = rng.standard_normal(9) if has_b and tangents == "all" else None
    kw = {} if eps is None else {"eps": eps}
    h = 1e-30
    wc = None if w is None else w + 1j * h * (0 if tw is None else tw)
    bc = None if b is None else b + 1j * h * (0 if tb is None else tb)
    y, rnorm = rmsref.unit_norm_forward(x + 1j * h * t, 9, wc, bias=bc, **kw)
    assert y.dtype == rnorm.dtype == np.complex128
    cs = y.imag / h
    jv = rmsref.unit_norm_jvp(x, t, 9, w, dweight_tan=tw, bias=b, dbias_tan=tb, **kw)
    assert jv.dtype == np.float64 and jv.shape == x.shape
    np.testing.assert_allclose(jv, cs, rtol=0, atol=1e-13 * np.max(np.abs(cs)))


@pytest.mark.parametrize("e", [-990, 990])
def test_rows_near_the_ends_of_the_range_scale_exactly(rng, e):
    """x·2^e gives the unit-scale rows' y, rnorm·2^-e, dx·2^-e, dweight, and the JVP of
    (x·2^e, t·2^e) is the unit one; one row of each size in the batch."""
    a, dy, w, b = inputs(rng, 16, (3, 16), True, True)
    t = rng.standard_normal(a.shape)
    ex = np.array([[e], [0], [-e]])
    x = np.ldexp(a, ex)
    y, rnorm = rmsref.unit_norm_forward(x, 16, w, bias=b)
    y1, rnorm1 = rmsref.unit_norm_forward(a, 16, w, bias=b)
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(rnorm, np.ldexp(rnorm1, -ex))
    g = rmsref.unit_norm_backward(dy, x, 16, w, bias=b)
    g1 = rmsref.unit_norm_backward(dy, a, 16, w, bias=b)
    np.testing.assert_array_equal(g.dx, np.ldexp(g1.dx, -ex))
    np.testing.assert_array_equal(g.dweight, g1.dweight)
    np.testing.assert_array_equal(g.dbias, g1.dbias)
    jv = rmsref.unit_norm_jvp(x, np.ldexp(t, ex), 16, w, bias=b)
    np.testing.assert_array_equal(jv, rmsref.unit_norm_jvp(a, t, 16, w, bias=b))


def test_zero_row_is_nan_at_the_default_eps_and_finite_with_eps():
    """eps defaults to 0: x / ‖x‖ of a zero row is 0/0 = NaN, as documented; eps > 0 gives 0."""
    x = np.zeros((1, 4))
    assert np.all(np.isnan(rmsref.unit_norm(x, 4)))
    assert np.all(np.isnan(rmsref.unit_norm_backward(np.ones((1, 4)), x, 4).dx))
    np.testing.assert_array_equal(rmsref.unit_norm(x, 4, eps=1.0), x)


@pytest.mark.parametrize("dtype", [np.float16, bfloat16, np.float32, np.float64])
def test_results_take_the_input_dtype_and_rnorm_is_float64(rng, dtype):
    """y, dx, the parameter gradients (closed and staged) and the JVP come back in the inputs'
    dtype, each the float64 result rounded once; rnorm stays float64."""
    x, dy, w, b = (v.astype(dtype) for v in inputs(rng, 8, (3, 8), True, True))
    x64, dy64, w64, b64 = (v.astype(np.float64) for v in (x, dy, w, b))
    y, rnorm = rmsref.unit_norm_forward(x, 8, w, bias=b)
    y64, rnorm64 = rmsref.unit_norm_forward(x64, 8, w64, bias=b64)
    assert y.dtype == dtype and rnorm.dtype == np.float64
    np.testing.assert_array_equal(y, round_to(y64, np.dtype(dtype)))
    np.testing.assert_array_equal(rnorm, rnorm64)
    for fn in (rmsref.unit_norm_backward, rmsref.unit_norm_backward_staged):
        g, g64 = fn(dy, x, 8, w, bias=b), fn(dy64, x64, 8, w64, bias=b64)
        for got, ref in zip(g, g64, strict=True):
            assert got.dtype == dtype, fn.__name__
            np.testing.assert_array_equal(got, round_to(ref, np.dtype(dtype)), err_msg=fn.__name__)
    jv = rmsref.unit_norm_jvp(x, dy, 8, w, bias=b)
    assert jv.dtype == dtype
    np.testing.assert_array_equal(jv, round_to(rmsref.unit_norm_jvp(x64, dy64, 8, w64, bias=b64),
                                                np.dtype(dtype)))
    y16 = rmsref.unit_norm_forward(x64, 8, w64, out_dtype=np.float16)[0]
    assert y16.dtype == np.float16
    ref16 = round_to(rmsref.unit_norm(x64, 8, w64), np.dtype(np.float16))
    np.testing.assert_array_equal(y16, ref16)


def test_complex_dy_gives_a_complex_dx_of_a_real_x(rng):
    x, dy, w, b = inputs(rng, 8, (3, 8), True, True)
    dy2 = rng.standard_normal(x.shape)
    for fn in (rmsref.unit_norm_backward, rmsref.unit_norm_backward_staged):
        g = fn(dy + 1j * dy2, x, 8, w, bias=b)
        assert g.dx.dtype == np.complex128, fn.__name__
        np.testing.assert_allclose(g.dx.real, fn(dy, x, 8, w, bias=b).dx, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(g.dx.imag, fn(dy2, x, 8, w, bias=b).dx, rtol=1e-13, atol=1e-14)


def test_errors_name_the_argument():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="dy"):
        rmsref.unit_norm_backward(np.ones((2, 5)), x, 4)
    with pytest.raises(ValueError, match="dy"):
        rmsref.unit_norm_backward_staged(np.ones((2, 5)), x, 4)
    with pytest.raises(ValueError, match="rnorm"):
        rmsref.unit_norm_backward(x, x, 4, rnorm=np.ones((3, 1)))
    with pytest.raises(ValueError, match="dx_tan"):
        rmsref.unit_norm_jvp(x, np.ones((2, 5)), 4)
    with pytest.raises(ValueError, match="dweight_tan"):
        rmsref.unit_norm_jvp(x, x, 4, np.ones(4), dweight_tan=np.ones(3))
    with pytest.raises(ValueError, match="dbias_tan"):
        rmsref.unit_norm_jvp(x, x, 4, bias=np.ones(4), dbias_tan=np.ones(3))
    for fn in (rmsref.unit_norm_forward, rmsref.unit_norm_jvp):
        args = (x, 4) if fn is rmsref.unit_norm_forward else (x, x, 4)
        with pytest.raises(ValueError, match="bias"):
            fn(*args, bias=np.ones(3))
        with pytest.raises(ValueError, match="weight"):
            fn(*args, np.ones(3))
    with pytest.raises(ValueError, match="eps"):
        rmsref.unit_norm_backward_staged(x, x, 4, eps=-1.0)


def test_unit_norm_module(rng):
    """UnitNorm(shape): float32 weight of ones, eps 0, no bias unless asked; forward and
    backward are the functions with its parameters."""
    un = rmsref.UnitNorm(8)
    assert un.eps == 0.0 and un.bias is None and un.weight.dtype == np.float32
    np.testing.assert_array_equal(un.weight, np.ones(8))
    ub = rmsref.UnitNorm(8, 0.5, bias=True, dtype=np.float64)
    assert ub.eps == 0.5 and ub.bias.dtype == np.float64
    ub.weight[:] = rng.standard_normal(8)
    ub.bias[:] = rng.standard_normal(8)
    assert rmsref.UnitNorm(8, elementwise_affine=False).weight is None
    x, dy = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    np.testing.assert_array_equal(ub(x), rmsref.unit_norm_forward(x, 8, ub.weight, 0.5,
                                                                  bias=ub.bias)[0])
    g = ub.backward(dy, x)
    ref = rmsref.unit_norm_backward(dy, x, 8, ub.weight, 0.5, bias=ub.bias)
    for a, r in zip(g, ref, strict=True):
        np.testing.assert_array_equal(a, r)


def test_eps_none_means_0(rng):
    """eps=None is unit-norm's default 0 (x / ‖x‖), in every function."""
    x, dy, w, b = inputs(rng, 8, (3, 8), True, True, scale=0.1)
    t = rng.standard_normal(x.shape)
    for fn, args, kw in ((rmsref.unit_norm_forward, (x, 8, w), {"bias": b}),
                         (rmsref.unit_norm_backward, (dy, x, 8, w), {"bias": b}),
                         (rmsref.unit_norm_backward_staged, (dy, x, 8, w), {"bias": b}),
                         (rmsref.unit_norm_jvp, (x, t, 8, w), {"bias": b})):
        got, ref, other = (fn(*args, eps=eps, **kw) for eps in (None, 0.0, 1e-3))
        if isinstance(got, np.ndarray):
            got, ref, other = (got,), (ref,), (other,)
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_array_equal(g, r, err_msg=fn.__name__)
        assert not np.array_equal(got[0], other[0]), fn.__name__


def test_a_zero_row_gives_nan_without_a_warning():
    """0/0 of a zero row at eps = 0 is NaN, silently: forward, both backwards and the JVP."""
    import warnings

    x = np.zeros((2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calls = {
            "forward": lambda: rmsref.unit_norm_forward(x, 4)[0],
            "backward": lambda: rmsref.unit_norm_backward(x + 1, x, 4).dx,
            "staged": lambda: rmsref.unit_norm_backward_staged(x + 1, x, 4).dx,
            "jvp": lambda: rmsref.unit_norm_jvp(x, x + 1, 4),
        }
        for name, call in calls.items():
            assert np.all(np.isnan(call())), name


def test_results_are_linear_in_the_arguments_they_are_linear_in(rng):
    """A complex value in an argument the result is linear in gives the complex combination of
    the real results: y in the weight, dx (closed and staged) in dy and in the weight, the JVP
    in (t, dweight_t) and in the weight."""
    x, dy, w, _ = inputs(rng, 9, (2, 3, 9), True, False)
    dy2, w2 = rng.standard_normal(dy.shape), rng.standard_normal(9)
    t, t2, tw, tw2 = (rng.standard_normal(s) for s in (x.shape, x.shape, 9, 9))
    assert_linear(lambda z: rmsref.unit_norm_forward(x, 9, pick(z, w, w2))[:1])
    for fn in (rmsref.unit_norm_backward, rmsref.unit_norm_backward_staged):
        assert_linear(lambda z, fn=fn: fn(pick(z, dy, dy2), x, 9, w)[:1])
        assert_linear(lambda z, fn=fn: fn(dy, x, 9, pick(z, w, w2))[:1])
    assert_linear(lambda z: (rmsref.unit_norm_jvp(x, pick(z, t, t2), 9, w,
                                                   dweight_tan=pick(z, tw, tw2)),))
    assert_linear(lambda z: (rmsref.unit_norm_jvp(x, t, 9, pick(z, w, w2)),))


def test_a_complex_bias_or_parameter_tangent_alone_is_not_discarded(rng):
    import warnings

    x, _, w, b = inputs(rng, 9, (4, 9), True, True)
    b2, tw2 = rng.standard_normal(9), rng.standard_normal(9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = rmsref.unit_norm_forward(x, 9, w, bias=b + 1j * b2)[0]
        np.testing.assert_array_equal(y.imag, np.broadcast_to(b2, x.shape))
        jv = rmsref.unit_norm_jvp(x, np.zeros_like(x), 9, w, dweight_tan=1j * tw2)
        np.testing.assert_allclose(jv.imag, rmsref.unit_norm(x, 9, tw2), rtol=1e-14)
