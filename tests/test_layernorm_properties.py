"""LayerNorm oracle, property by property: every option of the backward, the JVP against a
complex step of the forward, exact power-of-two scaling, result dtypes, errors by name."""

from __future__ import annotations

import numpy as np
import pytest

import rmsref
from rmsref._rounding import round_to
from rmsref._shapes import bfloat16
from tests.norm_checks import assert_grads_close, assert_linear, inputs, pick

#: (weight, bias) present or not: every combination the backward distinguishes
PARAMS = [(False, False), (True, False), (False, True), (True, True)]
#: normalized_shape and the shape of x
SHAPES = [(9, (4, 9)), ((3, 4), (2, 3, 3, 4))]


@pytest.mark.parametrize(("has_w", "has_b"), PARAMS)
@pytest.mark.parametrize(("ns", "xshape"), SHAPES)
@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_staged_and_saved_statistics_backward_equal_the_closed_form(rng, has_w, has_b, ns,
                                                                    xshape, eps):
    """The teaching backward (node by node), the closed form recomputing mean and rstd, and
    the closed form given the forward's saved mean and rstd: the same gradients, with a
    dweight / dbias exactly where there is a weight / bias."""
    x, dy, w, b = inputs(rng, ns, xshape, has_w, has_b, shift=0.5)
    closed = rmsref.layer_norm_backward(dy, x, ns, w, b, eps)
    _, mean, rstd = rmsref.layer_norm_forward(x, ns, w, b, eps)
    saved = rmsref.layer_norm_backward(dy, x, ns, w, b, eps, mean=mean, rstd=rstd)
    staged = rmsref.layer_norm_backward_staged(dy, x, ns, w, b, eps, mean=mean, rstd=rstd)
    assert closed.dx.shape == x.shape
    assert (closed.dweight is None) == (not has_w) and (closed.dbias is None) == (not has_b)
    assert_grads_close(saved, closed)
    assert_grads_close(staged, closed)
    # dbias = Σ_rows dy, dweight = Σ_rows dy ⊙ xhat: independent formulas
    nshape = w.shape if has_w else b.shape if has_b else None
    if has_b:
        np.testing.assert_allclose(closed.dbias, dy.reshape(-1, *nshape).sum(0), rtol=1e-13)
    if has_w:
        xr = x.reshape(-1, w.size)
        xhat = (xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + eps)
        np.testing.assert_allclose(closed.dweight.ravel(), (dy.reshape(xr.shape) * xhat).sum(0),
                                   rtol=1e-12)


def test_backward_uses_the_saved_statistics_as_given(rng):
    """Saved mean and rstd are used as they are, not recomputed: other statistics give the
    gradient of the LayerNorm they describe."""
    x, dy, w, b = inputs(rng, 9, (4, 9), True, True, shift=0.5)
    _, mean, rstd = rmsref.layer_norm_forward(x, 9, w, b)
    g = rmsref.layer_norm_backward(dy, x, 9, w, b, mean=mean + 0.25, rstd=2 * rstd)
    xhat = (x - (mean + 0.25)) * (2 * rstd)
    np.testing.assert_allclose(g.dweight, np.sum(dy * xhat, axis=0), rtol=1e-13)
    dxhat = dy * w
    dx = 2 * rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                     - xhat * np.mean(dxhat * xhat, -1, keepdims=True))
    np.testing.assert_allclose(g.dx, dx, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("has_w", "has_b"), PARAMS)
@pytest.mark.parametrize("tangents", ["x", "all"])
@pytest.mark.parametrize("eps", [None, 0.0, 0.5])
def test_jvp_is_the_complex_step_of_the_forward(rng, has_w, has_b, tangents, eps):
    """layer_norm_jvp equals the complex-step derivative of layer_norm_forward (to rounding),
    with and without the parameters' tangents, at the default eps (None: not passed) too; rows
    of spread 0.01 make the default eps 1e-5 matter."""
    x, _, w, b = inputs(rng, 9, (2, 2, 9), has_w, has_b, scale=0.01, shift=0.5)
    t = rng.standard_normal(x.shape)
    tw = rng.standard_normal(9) if has_w and tangents == "all" else None
    tb = rng.standard_normal(9) if has_b and tangents == "all" else None
    kw = {} if eps is None else {"eps": eps}
    h = 1e-30
    xc = x + 1j * h * t
    wc = None if w is None else w + 1j * h * (0 if tw is None else tw)
    bc = None if b is None else b + 1j * h * (0 if tb is None else tb)
    y, mean, rstd = rmsref.layer_norm_forward(xc, 9, wc, bc, **kw)
    assert y.dtype == mean.dtype == rstd.dtype == np.complex128
    cs = y.imag / h
    jv = rmsref.layer_norm_jvp(x, t, 9, w, b, dweight_tan=tw, dbias_tan=tb, **kw)
    assert jv.dtype == np.float64 and jv.shape == x.shape
    np.testing.assert_allclose(jv, cs, rtol=0, atol=1e-13 * np.max(np.abs(cs)))


@pytest.mark.parametrize("e", [-990, -600, 600, 990])
def test_rows_near_the_ends_of_the_range_scale_exactly(rng, e):
    """x·2^e gives the unit-scale rows' y, mean·2^e, rstd·2^-e, dx·2^-e, dweight and dbias,
    and the JVP of (x·2^e, t·2^e) is the unit one: the oracle scales each row by a power of
    two, which is exact. One row of each size in the same batch (the exponent is per row)."""
    a, dy, w, b = inputs(rng, 16, (3, 16), True, True, shift=0.5)
    t = rng.standard_normal(a.shape)
    ex = np.array([[e], [0], [-e]])
    x = np.ldexp(a, ex)
    y, mean, rstd = rmsref.layer_norm_forward(x, 16, w, b, eps=0.0)
    y1, mean1, rstd1 = rmsref.layer_norm_forward(a, 16, w, b, eps=0.0)
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(mean, np.ldexp(mean1, ex))
    np.testing.assert_array_equal(rstd, np.ldexp(rstd1, -ex))
    g = rmsref.layer_norm_backward(dy, x, 16, w, b, eps=0.0)
    g1 = rmsref.layer_norm_backward(dy, a, 16, w, b, eps=0.0)
    np.testing.assert_array_equal(g.dx, np.ldexp(g1.dx, -ex))
    np.testing.assert_array_equal(g.dweight, g1.dweight)
    np.testing.assert_array_equal(g.dbias, g1.dbias)
    jv = rmsref.layer_norm_jvp(x, np.ldexp(t, ex), 16, w, b, eps=0.0)
    np.testing.assert_array_equal(jv, rmsref.layer_norm_jvp(a, t, 16, w, b, eps=0.0))


@pytest.mark.parametrize("e", [-530, 505])
def test_eps_is_scaled_with_the_row(rng, e):
    """With eps > 0, a row at 2^e (squares subnormal, or near overflow): eps is scaled with
    the row, so rstd = 1/sqrt(var + eps) of the exact variance, written out at unit scale."""
    a = rng.standard_normal((2, 8))
    x = np.ldexp(a, e)
    eps = 2.0 ** (2 * e + 3)  # comparable to var(x): both terms count
    _, _, rstd = rmsref.layer_norm_forward(x, 8, eps=eps)
    var = np.var(a, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.ldexp(rstd, e), 1 / np.sqrt(var + 8.0), rtol=1e-14)


DTYPES = [np.float16, bfloat16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_take_the_input_dtype_and_statistics_are_float64(rng, dtype):
    """y, dx, the parameter gradients and the JVP come back in the inputs' dtype (each the
    float64 result rounded once); mean and rstd stay float64."""
    x, dy, w, b = (v.astype(dtype) for v in inputs(rng, 8, (3, 8), True, True, shift=0.5))
    x64, dy64, w64, b64 = (v.astype(np.float64) for v in (x, dy, w, b))
    y, mean, rstd = rmsref.layer_norm_forward(x, 8, w, b)
    y64, mean64, rstd64 = rmsref.layer_norm_forward(x64, 8, w64, b64)
    assert y.dtype == dtype and mean.dtype == rstd.dtype == np.float64
    np.testing.assert_array_equal(y, round_to(y64, np.dtype(dtype)))
    np.testing.assert_array_equal(mean, mean64)
    np.testing.assert_array_equal(rstd, rstd64)
    for fn in (rmsref.layer_norm_backward, rmsref.layer_norm_backward_staged):
        g, g64 = fn(dy, x, 8, w, b), fn(dy64, x64, 8, w64, b64)
        for got, ref in zip(g, g64, strict=True):
            assert got.dtype == dtype, fn.__name__
            np.testing.assert_array_equal(got, round_to(ref, np.dtype(dtype)), err_msg=fn.__name__)
    jv = rmsref.layer_norm_jvp(x, dy, 8, w, b)
    assert jv.dtype == dtype
    np.testing.assert_array_equal(jv, round_to(rmsref.layer_norm_jvp(x64, dy64, 8, w64, b64),
                                                np.dtype(dtype)))


def test_out_dtype_rounds_the_float64_result_once(rng):
    x, _, w, b = inputs(rng, 8, (3, 8), True, True, shift=0.5)
    y = rmsref.layer_norm_forward(x, 8, w, b, out_dtype=np.float16)[0]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, round_to(rmsref.layer_norm(x, 8, w, b), np.dtype(np.float16)))


def test_complex_dy_gives_a_complex_dx_of_a_real_x(rng):
    """Complex-step through the backward: a real x with a complex dy gives the complex dx
    whose real and imaginary parts are the backward of dy's parts."""
    x, dy, w, b = inputs(rng, 8, (3, 8), True, True, shift=0.5)
    dy2 = rng.standard_normal(x.shape)
    for fn in (rmsref.layer_norm_backward, rmsref.layer_norm_backward_staged):
        g = fn(dy + 1j * dy2, x, 8, w, b)
        assert g.dx.dtype == np.complex128, fn.__name__
        np.testing.assert_allclose(g.dx.real, fn(dy, x, 8, w, b).dx, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(g.dx.imag, fn(dy2, x, 8, w, b).dx, rtol=1e-13, atol=1e-14)


def test_errors_name_the_argument():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="dy"):
        rmsref.layer_norm_backward(np.ones((2, 5)), x, 4)
    with pytest.raises(ValueError, match="both mean and rstd"):
        rmsref.layer_norm_backward(x, x, 4, mean=np.zeros((2, 1)))
    with pytest.raises(ValueError, match="dx_tan"):
        rmsref.layer_norm_jvp(x, np.ones((2, 5)), 4)
    with pytest.raises(ValueError, match="dweight_tan"):
        rmsref.layer_norm_jvp(x, x, 4, np.ones(4), dweight_tan=np.ones(3))
    with pytest.raises(ValueError, match="dbias_tan"):
        rmsref.layer_norm_jvp(x, x, 4, bias=np.ones(4), dbias_tan=np.ones(3))
    with pytest.raises(ValueError, match="bias"):
        rmsref.layer_norm_backward_staged(x, x, 4, bias=np.ones(3))


def test_layer_norm_module_is_torch_like(rng):
    """LayerNorm(shape): float32 weight of ones and bias of zeros, eps 1e-5, and forward /
    backward are the functions with those parameters; bias=False and elementwise_affine=False
    drop them."""
    ln = rmsref.LayerNorm(8)
    assert ln.eps == 1e-5 and ln.weight.dtype == ln.bias.dtype == np.float32
    np.testing.assert_array_equal(ln.weight, np.ones(8))
    np.testing.assert_array_equal(ln.bias, np.zeros(8))
    assert rmsref.LayerNorm(8, bias=False).bias is None
    wide = rmsref.LayerNorm(8, dtype=np.float64)
    assert wide.weight.dtype == wide.bias.dtype == np.float64
    plain = rmsref.LayerNorm(8, 0.25, elementwise_affine=False, dtype=np.float64)
    assert plain.weight is None and plain.bias is None and plain.eps == 0.25
    ln.weight[:] = rng.standard_normal(8)
    ln.bias[:] = rng.standard_normal(8)
    x = 0.003 * rng.standard_normal((3, 8)).astype(np.float32)
    dy = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(ln(x), rmsref.layer_norm(x, 8, ln.weight, ln.bias, 1e-5))
    g = ln.backward(dy, x)
    ref = rmsref.layer_norm_backward(dy, x, 8, ln.weight, ln.bias, 1e-5)
    for a, r in zip(g, ref, strict=True):
        np.testing.assert_array_equal(a, r)
    np.testing.assert_array_equal(plain(x), rmsref.layer_norm(x, 8, eps=0.25))
    np.testing.assert_array_equal(plain.backward(dy, x).dx,
                                  rmsref.layer_norm_backward(dy, x, 8, eps=0.25).dx)


def test_mean_is_the_correctly_rounded_mean_of_the_row(rng):
    """The refined mean of rows at 1e8 + noise is the exact mean rounded once (exact rational
    arithmetic): the first pass alone is off by up to an ulp, a wrong-signed correction by two."""
    from fractions import Fraction

    x = 1e8 + rng.standard_normal((16, 256))
    _, mean, _ = rmsref.layer_norm_forward(x, 256, eps=0.0)
    exact = [float(sum(map(Fraction, row)) / 256) for row in x]
    np.testing.assert_array_equal(mean.ravel(), exact)


def test_a_constant_row_gives_nan_at_eps_0_without_a_warning():
    """0/0 of a zero-variance row at eps = 0 is NaN, silently (NumPy's floating-point warnings
    are the oracle's business, not the caller's): forward, both backwards and the JVP."""
    import warnings

    x = np.ones((2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calls = {
            "forward": lambda: rmsref.layer_norm_forward(x, 4, eps=0.0)[0],
            "backward": lambda: rmsref.layer_norm_backward(x, x, 4, eps=0.0).dx,
            "staged": lambda: rmsref.layer_norm_backward_staged(x, x, 4, eps=0.0).dx,
            "jvp": lambda: rmsref.layer_norm_jvp(x, x, 4, eps=0.0),
        }
        for name, call in calls.items():
            assert np.all(np.isnan(call())), name


def test_eps_none_means_the_default_1e_5(rng):
    """eps=None is LayerNorm's own default 1e-5 (torch's), in every function; rows of spread
    1e-3 make the difference from any other default visible."""
    x, dy, w, b = inputs(rng, 8, (3, 8), True, True, scale=1e-3, shift=0.5)
    t = rng.standard_normal(x.shape)
    for fn, args in ((rmsref.layer_norm_forward, (x, 8, w, b)),
                     (rmsref.layer_norm_backward, (dy, x, 8, w, b)),
                     (rmsref.layer_norm_backward_staged, (dy, x, 8, w, b)),
                     (rmsref.layer_norm_jvp, (x, t, 8, w, b))):
        got, ref, other = (fn(*args, eps=eps) for eps in (None, 1e-5, 1e-6))
        if isinstance(got, np.ndarray):
            got, ref, other = (got,), (ref,), (other,)
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_array_equal(g, r, err_msg=fn.__name__)
        assert not np.array_equal(got[0], other[0]), fn.__name__


def test_results_are_linear_in_the_arguments_they_are_linear_in(rng):
    """Complex values in an argument the result is linear in give the complex combination of
    the real results (the complex step through any one argument): y in (weight, bias); dx in dy
    and in the weight; the JVP in (t, dweight_t, dbias_t) and in the weight. A complex bias
    alone, or a complex tangent of a parameter alone, is not discarded either."""
    x, dy, w, b = inputs(rng, 9, (2, 3, 9), True, True, shift=0.5)
    dy2, w2, b2 = rng.standard_normal(dy.shape), rng.standard_normal(9), rng.standard_normal(9)
    t, t2 = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    tw, tw2, tb, tb2 = (rng.standard_normal(9) for _ in range(4))
    assert_linear(lambda z: rmsref.layer_norm_forward(x, 9, pick(z, w, w2), pick(z, b, b2))[:1])
    for fn in (rmsref.layer_norm_backward, rmsref.layer_norm_backward_staged):
        assert_linear(lambda z, fn=fn: fn(pick(z, dy, dy2), x, 9, w, b)[:1])
        assert_linear(lambda z, fn=fn: fn(dy, x, 9, pick(z, w, w2))[:1])
    assert_linear(lambda z: (rmsref.layer_norm_jvp(
        x, pick(z, t, t2), 9, w, b, dweight_tan=pick(z, tw, tw2), dbias_tan=pick(z, tb, tb2)),))
    assert_linear(lambda z: (rmsref.layer_norm_jvp(x, t, 9, pick(z, w, w2)),))
    y = rmsref.layer_norm(x, 9, w, b + 1j * b2)
    np.testing.assert_array_equal(y.imag, np.broadcast_to(b2, x.shape))
    y = rmsref.layer_norm(x, 9, w + 1j * w2, b)
    np.testing.assert_allclose(y.imag, rmsref.layer_norm(x, 9, w2), rtol=1e-14, atol=1e-15)
    jv = rmsref.layer_norm_jvp(x, t + 1j * t2, 9, w, b)
    np.testing.assert_allclose(jv.imag, rmsref.layer_norm_jvp(x, t2, 9, w, b), rtol=1e-14,
                               atol=1e-15)
    zero = np.zeros_like(t)
    for kw, kw2 in (({"dweight_tan": tw + 1j * tw2}, {"dweight_tan": tw2}),
                    ({"dbias_tan": tb + 1j * tb2}, {"dbias_tan": tb2})):
        got = rmsref.layer_norm_jvp(x, t, 9, w, b, **kw)
        np.testing.assert_allclose(got.imag, rmsref.layer_norm_jvp(x, zero, 9, w, b, **kw2),
                                   rtol=1e-14, atol=0)


def test_a_complex_x_reaches_every_path(rng):
    """At a complex x (the complex step through the backward): the closed form, the closed form
    given the complex saved statistics, and the staged backward agree, and the JVP is the
    transpose of the backward, <dy, J t> = <J^T dy, t> (bilinear, no conjugate)."""
    a, dy, w, b = inputs(rng, 9, (4, 9), True, True, shift=0.5)
    x = a + 1e-3j * rng.standard_normal(a.shape)
    t = rng.standard_normal(a.shape)
    _, mean, rstd = rmsref.layer_norm_forward(x, 9, w, b)
    closed = rmsref.layer_norm_backward(dy, x, 9, w, b)
    saved = rmsref.layer_norm_backward(dy, x, 9, w, b, mean=mean, rstd=rstd)
    staged = rmsref.layer_norm_backward_staged(dy, x, 9, w, b)
    for got in (saved, staged):
        for g, r in zip(got, closed, strict=True):
            assert g.dtype == np.complex128
            np.testing.assert_allclose(g.imag, r.imag, rtol=0, atol=1e-12 * np.max(abs(r.imag)))
            np.testing.assert_allclose(g.real, r.real, rtol=0, atol=1e-13 * np.max(abs(r.real)))
    jv = rmsref.layer_norm_jvp(x, t, 9, w, b)
    lhs, rhs = np.sum(dy * jv), np.sum(closed.dx * t)
    assert abs(lhs.imag - rhs.imag) <= 1e-12 * abs(rhs.imag), (lhs, rhs)
    assert abs(lhs.real - rhs.real) <= 1e-13 * np.sum(np.abs(dy * jv)), (lhs, rhs)


def test_bfloat16_results_are_rounded_once(rng):
    """dx and the JVP in bfloat16 are the float64 results rounded once to nearest even, not
    through float32 (double rounding); the data holds values where the two differ."""
    x, dy = (rng.standard_normal((256, 512)).astype(bfloat16) for _ in range(2))
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    for name, got, ref in (
        ("dx", rmsref.layer_norm_backward(dy, x, 512).dx,
         rmsref.layer_norm_backward(dy64, x64, 512).dx),
        ("jvp", rmsref.layer_norm_jvp(x, dy, 512), rmsref.layer_norm_jvp(x64, dy64, 512)),
    ):
        once = round_to(ref, np.dtype(bfloat16))
        assert np.any(once != ref.astype(np.float32).astype(bfloat16)), name
        np.testing.assert_array_equal(got, once, err_msg=name)


def test_out_refused_when_it_shares_memory_naming_the_input():
    """out= overlapping an input is refused with that input's name, for the forward (x,
    weight, bias) and the backward (dy, x, weight, mean, rstd)."""
    def refused(call, name):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith(f"out shares memory with {name};"), str(info.value)

    out = np.zeros((2, 4))
    x, p = np.arange(8.0).reshape(2, 4), np.ones(4)
    refused(lambda: rmsref.layer_norm_forward(out, 4, out=out), "x")
    refused(lambda: rmsref.layer_norm_forward(x, 4, out[0], p, out=out), "weight")
    refused(lambda: rmsref.layer_norm_forward(x, 4, p, out[1], out=out), "bias")
    _, mean, rstd = rmsref.layer_norm_forward(x, 4)
    refused(lambda: rmsref.layer_norm_backward(out, x, 4, out=out), "dy")
    refused(lambda: rmsref.layer_norm_backward(x, out, 4, out=out), "x")
    refused(lambda: rmsref.layer_norm_backward(x, x, 4, out[0], out=out), "weight")
    out[:, :1] = mean
    refused(lambda: rmsref.layer_norm_backward(x, x, 4, mean=out[:, :1], rstd=rstd, out=out),
            "mean")
    out[:, :1] = rstd
    refused(lambda: rmsref.layer_norm_backward(x, x, 4, mean=mean, rstd=out[:, :1], out=out),
            "rstd")


def test_jvp_checks_its_parameters_by_name():
    x = np.ones((2, 4))
    for kw, msg in (({"bias": np.ones(3)}, "bias"),
                    ({"dweight_tan": np.ones(3)}, "dweight_tan"),
                    ({"dbias_tan": np.ones(3)}, "dbias_tan")):
        with pytest.raises(ValueError) as info:
            rmsref.layer_norm_jvp(x, x, 4, **kw)
        assert str(info.value) == f"{msg} has shape (3,) but normalized_shape is (4,)"
