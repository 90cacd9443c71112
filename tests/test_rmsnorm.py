"""The RMSNorm oracle against the literature, naive loops, its own staged backward, finite
differences, complex step, mpmath, and the error cases (issue: the NumPy oracle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rmsref
from rmsref import _sumsq
from rmsref._rounding import round_to
from rmsref._shapes import bfloat16
from tests import naive

F64 = np.float64


def test_literature_numbers():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    _, rstd = rmsref.rms_norm_forward(x, 4, eps=0.0)               # the oracle's statistic
    assert 1.0 / float(rstd[0]) == pytest.approx(2.7386128, abs=1e-7)   # RMS = sqrt(7.5)
    _, mean, rstd_ln = rmsref.layer_norm_forward(x, 4, eps=0.0)    # RMS² = σ² + μ² = 1.25 + 6.25
    assert float(1.0 / rstd_ln[0] ** 2 + mean[0] ** 2) == pytest.approx(1.0 / float(rstd[0]) ** 2)
    np.testing.assert_allclose(
        rmsref.rms_norm(x, 4, eps=1e-5), [0.3651, 0.7303, 1.0954, 1.4606], atol=5e-5
    )
    np.testing.assert_allclose(
        rmsref.layer_norm(x, 4), [-1.3416, -0.4472, 0.4472, 1.3416], atol=5e-5
    )


def test_worked_example_backward():
    # x = (1, 2, 2), w = 1, eps = 0, dy = (1, 0, 0):
    # dx = (8, -2, -2) / (9 sqrt 3), dweight = (1/sqrt 3, 0, 0)
    g = rmsref.rms_norm_backward(
        np.array([1.0, 0, 0]), np.array([1.0, 2, 2]), 3, np.ones(3), eps=0.0
    )
    np.testing.assert_allclose(g.dx, np.array([8.0, -2, -2]) / (9 * math.sqrt(3)), rtol=1e-15)
    np.testing.assert_allclose(g.dweight, [1 / math.sqrt(3), 0, 0], rtol=1e-15)
    assert g.dbias is None


CASES = [
    # (shape, normalized_shape, options)
    ((1, 1), 1, {}),
    ((3, 7), 7, {}),
    ((2, 3, 5), (3, 5), {}),
    ((4, 16), 16, {"offset": 1.0}),
    ((4, 16), 16, {"partial": 0.25}),
    ((5, 9), 9, {"bias": True}),
    ((2, 2, 2, 3), (2, 3), {"offset": 0.5, "bias": True, "partial": 0.5}),
]


def _case(rng, shape, ns, opts):
    nshape = (ns,) if isinstance(ns, int) else ns
    x = rng.standard_normal(shape) * 3
    w = rng.standard_normal(nshape)
    kw = {k: v for k, v in opts.items() if k != "bias"}
    if opts.get("bias"):
        kw["bias"] = rng.standard_normal(nshape)
    return x, w, kw


@pytest.mark.parametrize(("shape", "ns", "opts"), CASES)
def test_forward_matches_naive_loops(rng, shape, ns, opts):
    x, w, kw = _case(rng, shape, ns, opts)
    n = int(np.prod(ns))
    k = None if "partial" not in kw else int(n * kw["partial"])
    expect = naive.rms_norm(x, n, w, 1e-3, kw.get("bias"), kw.get("offset", 0.0), k)
    got = rmsref.rms_norm_forward(x, ns, w, 1e-3, **kw)[0]
    np.testing.assert_allclose(got, expect, rtol=4e-15, atol=1e-15)


@pytest.mark.parametrize(("shape", "ns", "opts"), CASES)
def test_backward_matches_naive_jacobian(rng, shape, ns, opts):
    x, w, kw = _case(rng, shape, ns, opts)
    dy = rng.standard_normal(shape)
    n = int(np.prod(ns))
    k = None if "partial" not in kw else int(n * kw["partial"])
    dx, dw = naive.rms_norm_backward(dy, x, n, w, 1e-3, kw.get("offset", 0.0), k)
    g = rmsref.rms_norm_backward(dy, x, ns, w, 1e-3, **kw)
    # dx = rstd·(dxhat − xhat·c) cancels (badly at N = 1): measure the error against the size
    # of the terms, M = rstd·(|dxhat| + |xhat|·mean|dxhat·xhat|) (docs/tolerances.md),
    # not against |dx|.
    np.testing.assert_allclose(g.dx, dx, rtol=0, atol=1e-14 * _dx_terms(dy, x, n, w, 1e-3, kw))
    np.testing.assert_allclose(g.dweight.ravel(), dw, rtol=0, atol=1e-14 * np.max(np.abs(dw)))
    if "bias" in kw:
        np.testing.assert_allclose(g.dbias, dy.reshape(-1, n).sum(0).reshape(g.dbias.shape))


def _dx_terms(dy, x, n, w, eps, kw):
    """Largest magnitude of the two terms of eq. (7), the scale of dx's rounding error."""
    xr, dyr = x.reshape(-1, n), dy.reshape(-1, n)
    k = int(n * kw.get("partial", 1.0))
    rstd = 1 / np.sqrt(np.mean(xr[:, :k] ** 2, axis=-1, keepdims=True) + eps)
    dxhat = np.abs(dyr * (kw.get("offset", 0.0) + w.reshape(1, -1)))
    xhat = np.abs(xr * rstd)
    return np.max(rstd * (dxhat + xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True)))


@pytest.mark.parametrize(("shape", "ns", "opts"), CASES)
def test_staged_backward_agrees_with_closed_form(rng, shape, ns, opts):
    x, w, kw = _case(rng, shape, ns, opts)
    dy = rng.standard_normal(shape)
    closed = rmsref.rms_norm_backward(dy, x, ns, w, 1e-3, **kw)
    staged = rmsref.rms_norm_backward_staged(dy, x, ns, w, 1e-3, **kw)
    for a, b in zip(closed, staged, strict=True):
        if a is None:
            assert b is None
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.max(np.abs(a - b)) <= 4e-15 * max(
            1.0, np.max(np.abs(a)), _dx_terms(dy, x, int(np.prod(ns)), w, 1e-3, kw)
        )


@pytest.mark.parametrize(("shape", "ns", "opts"), CASES)
def test_backward_is_transpose_of_jvp(rng, shape, ns, opts):
    """<u, J v> = <J^T u, v>, for x, weight and bias tangents together."""
    x, w, kw = _case(rng, shape, ns, opts)
    u, v = rng.standard_normal(shape), rng.standard_normal(shape)
    vw = rng.standard_normal(w.shape)
    vb = rng.standard_normal(w.shape) if "bias" in kw else None
    jv = rmsref.rms_norm_jvp(x, v, ns, w, 1e-3, dweight_tan=vw, dbias_tan=vb, **kw)
    g = rmsref.rms_norm_backward(u, x, ns, w, 1e-3, **kw)
    lhs = np.sum(u * jv)
    rhs = (
        np.sum(g.dx * v) + np.sum(g.dweight * vw) + (np.sum(g.dbias * vb) if vb is not None else 0)
    )
    scale = np.sum(np.abs(u * jv))
    assert abs(lhs - rhs) <= 1e-14 * scale


def test_jvp_matches_complex_step(rng):
    x, w = rng.standard_normal((4, 33)), rng.standard_normal(33)
    v = rng.standard_normal((4, 33))
    h = 1e-30
    cs = rmsref.rms_norm(x + 1j * h * v, 33, w, 1e-4).imag / h
    jv = rmsref.rms_norm_jvp(x, v, 33, w, 1e-4)
    np.testing.assert_allclose(jv, cs, rtol=0, atol=1e-14 * np.max(np.abs(cs)))


def test_backward_matches_central_differences(rng):
    x, w, dy = rng.standard_normal((2, 6)), rng.standard_normal(6), rng.standard_normal((2, 6))
    g = rmsref.rms_norm_backward(dy, x, 6, w, 1e-2)
    h = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        num[idx] = np.sum(
            dy * (rmsref.rms_norm(x + e, 6, w, 1e-2) - rmsref.rms_norm(x - e, 6, w, 1e-2))
        )
        num[idx] /= 2 * h
    np.testing.assert_allclose(g.dx, num, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("opts", [{}, {"offset": 1.0}, {"partial": 0.5}])
def test_double_backward_matches_complex_step_through_backward(rng, opts):
    m, n = 3, 8
    x, w, dy = rng.standard_normal((m, n)), rng.standard_normal(n), rng.standard_normal((m, n))
    b = rng.standard_normal(n)
    ddx, ddw, ddb = rng.standard_normal((m, n)), rng.standard_normal(n), rng.standard_normal(n)
    dd = rmsref.rms_norm_double_backward(ddx, dy, x, n, w, 1e-3, ddweight=ddw, ddbias=ddb, **opts)

    def second(xx, ww, dyy):
        g = rmsref.rms_norm_backward(dyy, xx, n, ww, 1e-3, bias=b, **opts)
        return np.sum(ddx * g.dx) + np.sum(ddw * g.dweight) + np.sum(ddb * g.dbias)

    h = 1e-30
    vx, vw, vd = rng.standard_normal((m, n)), rng.standard_normal(n), rng.standard_normal((m, n))
    for tx, tw, td, got in (
        (vx, 0 * vw, 0 * vd, np.sum(dd.dx * vx)),
        (0 * vx, vw, 0 * vd, np.sum(dd.dweight * vw)),
        (0 * vx, 0 * vw, vd, np.sum(dd.ddy * vd)),
    ):
        cs = second(x + 1j * h * tx, w + 1j * h * tw, dy + 1j * h * td).imag / h
        assert got == pytest.approx(cs, rel=1e-12, abs=1e-12)


def test_dx_orthogonal_to_x_at_eps_zero(rng):
    x, dy = rng.standard_normal((5, 64)), rng.standard_normal((5, 64))
    dx = rmsref.rms_norm_backward(dy, x, 64, eps=0.0).dx
    dots = np.sum(dx * x, axis=-1) / (np.linalg.norm(dx, axis=-1) * np.linalg.norm(x, axis=-1))
    assert np.max(np.abs(dots)) < 1e-14


# ---------------------------------------------------------------- numerical policy


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (np.float16, 2.0**-23),
        (bfloat16, 2.0**-23),
        (np.float32, 2.0**-23),
        (np.float64, 2.0**-52),
    ],
)
def test_default_eps_is_opmath_machine_epsilon(dtype, expected):
    # A zero row with weight 1 and one entry 1: y = 1 / sqrt(1/N + eps); recover eps from it.
    x = np.zeros((1, 2), dtype)
    x[0, 0] = 1
    y, rstd = rmsref.rms_norm_forward(x, 2)
    assert 1.0 / float(rstd[0, 0]) ** 2 - 0.5 == pytest.approx(expected, rel=1e-6)


def test_output_rounded_once_to_bfloat16():
    # 1 + 2^-8 + 2^-40 must round up to 1 + 2^-7; ml_dtypes' float64 cast rounds twice (to 1).
    v = np.array([1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-8 + 2.0**-40), 1 + 2.0**-8, 1 + 3 * 2.0**-8])
    got = round_to(v, bfloat16).astype(F64)
    np.testing.assert_array_equal(got, [1 + 2.0**-7, -(1 + 2.0**-7), 1.0, 1 + 2.0**-6])


def test_bfloat16_rounding_against_exact_nearest(rng):
    v = rng.standard_normal(20000) * np.exp(rng.uniform(-60, 60, 20000))
    r = round_to(v, bfloat16)
    up = np.nextafter(r, np.full_like(r, np.inf)).astype(F64)
    down = np.nextafter(r, np.full_like(r, -np.inf)).astype(F64)
    rf = r.astype(F64)
    assert np.all(np.abs(v - rf) <= np.abs(v - up)) and np.all(np.abs(v - rf) <= np.abs(v - down))


@pytest.mark.parametrize("dtype", [np.float16, bfloat16, np.float32, np.float64])
def test_output_dtype_and_rounding(rng, dtype):
    x = rng.standard_normal((3, 40)).astype(dtype)
    w = rng.standard_normal(40).astype(dtype)
    y, rstd = rmsref.rms_norm_forward(x, 40, w)
    assert y.dtype == np.dtype(dtype) and rstd.dtype == F64 and rstd.shape == (3, 1)
    exact = (
        x.astype(F64)
        / np.sqrt(
            np.mean(x.astype(F64) ** 2, -1, keepdims=True) + rmsref._shapes.default_eps(dtype)
        )
        * w.astype(F64)
    )  # noqa: E501
    np.testing.assert_array_equal(y, round_to(exact, dtype))
    assert rmsref.rms_norm_forward(x, 40, w, out_dtype=np.float64)[0].dtype == F64


@pytest.mark.parametrize(
    ("scale", "dtype"),
    [
        (1e300, np.float64),
        (1e-300, np.float64),
        (5e-324, np.float64),
        (1e-310, np.float64),
        (3e38, np.float32),
        (1e-45, np.float32),
        (1e154, np.float64),
    ],
)
def test_overflow_and_underflow_rows_are_correct(rng, scale, dtype):
    base = rng.uniform(0.5, 1.0, (2, 64)) * rng.choice([-1.0, 1.0], (2, 64))
    if scale in (5e-324, 1e-45):
        base = np.sign(base)  # the smallest subnormal: only its ±1 multiples exist
    x = (base * scale).astype(dtype)
    assert np.all(np.isfinite(x)) and np.all(x != 0)
    y = rmsref.rms_norm(x, 64, eps=0.0)
    _, e = np.frexp(np.max(np.abs(x.astype(F64)), axis=-1, keepdims=True))
    xs = np.ldexp(x.astype(F64), -e)  # the same rows, scaled by a power of two: exact
    expect = round_to(xs / np.sqrt(np.mean(xs * xs, -1, keepdims=True)), dtype)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_equal(y, expect)


def test_tiny_row_with_eps_is_x_over_sqrt_eps():
    x = np.full((1, 8), 1e-300)
    y = rmsref.rms_norm(x, 8, eps=1e-5)
    np.testing.assert_allclose(y, 1e-300 / math.sqrt(1e-5), rtol=1e-15)
    g = rmsref.rms_norm_backward(np.ones((1, 8)), np.full((1, 8), 1e300), 8, eps=1e-5)
    assert np.all(np.isfinite(g.dx))


def test_huge_row_backward_is_finite_and_orthogonal():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 32)) * 1e300
    dy = rng.standard_normal((2, 32))
    g = rmsref.rms_norm_backward(dy, x, 32, eps=0.0)
    xs = x / 1e300
    ref = rmsref.rms_norm_backward(dy, xs, 32, eps=0.0).dx / 1e300
    np.testing.assert_allclose(g.dx, ref, rtol=1e-13)


def test_nan_and_inf_stay_in_their_row():
    x = np.ones((3, 4))
    x[0, 1] = np.nan
    x[1, 2] = np.inf
    y = rmsref.rms_norm(x, 4, eps=1e-6)
    assert np.all(np.isnan(y[0]))
    assert np.isnan(y[1, 2]) and np.all(y[1, [0, 1, 3]] == 0)  # as PyTorch: x * rsqrt(inf) = 0
    np.testing.assert_allclose(y[2], 1 / math.sqrt(1 + 1e-6))


def test_zero_rows_and_negative_eps():
    y = rmsref.rms_norm(np.zeros((2, 3)), 3, eps=1e-6)
    np.testing.assert_array_equal(y, 0.0)
    assert np.all(np.isnan(rmsref.rms_norm(np.zeros((1, 3)), 3, eps=0.0)))
    with pytest.raises(ValueError, match="eps must be a finite non-negative"):
        rmsref.rms_norm(np.array([[0.1, 0.1], [2.0, 2.0]]), 2, eps=-0.5)


def test_chunking_does_not_change_bits(rng, monkeypatch):
    x, w = rng.standard_normal((37, 50)), rng.standard_normal(50)
    dy = rng.standard_normal((37, 50))
    y0, r0 = rmsref.rms_norm_forward(x, 50, w)
    g0 = rmsref.rms_norm_backward(dy, x, 50, w)
    monkeypatch.setattr(_sumsq, "CHUNK_ELEMENTS", 150)  # 3 rows per chunk
    y1, r1 = rmsref.rms_norm_forward(x, 50, w)
    g1 = rmsref.rms_norm_backward(dy, x, 50, w)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(r0, r1)
    np.testing.assert_array_equal(g0.dx, g1.dx)
    # dweight sums over rows, so the chunk boundaries change its summation order: compare it
    # against the size of what is summed, Σ_rows |dy ⊙ xhat| (docs/tolerances.md).
    terms = np.sum(np.abs(dy * rmsref.rms_norm(x, 50)), axis=0)
    assert np.all(np.abs(g0.dweight - g1.dweight) <= 4e-16 * terms)


def test_memory_stays_bounded():
    import tracemalloc

    x = np.ones((4096, 4096), np.float32)  # 64 MiB in; an unchunked float64 copy alone is 128 MiB
    tracemalloc.start()
    y = rmsref.rms_norm(x, 4096)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    extra = peak - y.nbytes
    assert extra < 100 * 2**20, f"temporaries peaked at {extra / 2**20:.0f} MiB"


def test_error_vs_mpmath_is_a_few_ulps():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 200
    rng = np.random.default_rng(7)
    worst = 0.0
    for n in (1, 7, 100, 1000, 4096):
        for scale, eps in ((1.0, 1e-6), (1.0, 0.0), (1e-200, 0.0), (1e200, 0.0)):
            x = rng.standard_normal(n) * scale
            w = rng.standard_normal(n)
            y = rmsref.rms_norm(x, n, w, eps=eps)
            xm = [mpmath.mpf(float(v)) for v in x]
            ms = mpmath.fsum(v * v for v in xm) / n
            rstd = 1 / mpmath.sqrt(ms + mpmath.mpf(eps))
            exact = np.array(
                [float(v * rstd * mpmath.mpf(float(wi))) for v, wi in zip(xm, w, strict=True)]
            )
            ulps = np.abs(y - exact) / np.spacing(np.abs(exact))
            worst = max(worst, float(np.max(ulps)))
    assert worst <= 4, f"worst error {worst} ulps"


# ---------------------------------------------------------------- inputs and layouts


def test_zero_size_batch_and_n_equals_one(rng):
    y, rstd = rmsref.rms_norm_forward(np.zeros((0, 5), np.float32), 5)
    assert y.shape == (0, 5) and y.dtype == np.float32 and rstd.shape == (0, 1)
    g = rmsref.rms_norm_backward(np.zeros((0, 5)), np.zeros((0, 5)), 5, np.ones(5))
    assert g.dx.shape == (0, 5) and np.all(g.dweight == 0)
    x = rng.standard_normal((4, 1))
    np.testing.assert_allclose(rmsref.rms_norm(x, 1, eps=0.0), np.sign(x))


def test_non_contiguous_and_read_only_inputs_are_not_modified(rng):
    base = rng.standard_normal((6, 20))
    x = base[::2, ::2]  # strided view, (3, 10)
    x.flags.writeable = False
    copy = x.copy()
    y = rmsref.rms_norm(x, 10)
    np.testing.assert_array_equal(x, copy)
    np.testing.assert_array_equal(y, rmsref.rms_norm(np.ascontiguousarray(x), 10))
    xt = rng.standard_normal((5, 4, 3)).transpose(1, 0, 2)  # leading dims transposed
    np.testing.assert_array_equal(rmsref.rms_norm(xt, 3), rmsref.rms_norm(xt.copy(), 3))


def test_array_protocols(rng):
    x = rng.standard_normal((2, 3))

    class HasArray:
        def __array__(self, dtype=None, copy=None):
            return x

    class HasDlpack:
        def __dlpack__(self, **kw):
            return x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return x.__dlpack_device__()

    expect = rmsref.rms_norm(x, 3)
    np.testing.assert_array_equal(rmsref.rms_norm(HasArray(), 3), expect)
    np.testing.assert_array_equal(rmsref.rms_norm(HasDlpack(), 3), expect)


def test_complex_input_supports_complex_step(rng):
    x = rng.standard_normal((2, 5)) + 0j
    y, rstd = rmsref.rms_norm_forward(x, 5)
    assert y.dtype == np.complex128 and rstd.dtype == np.complex128


def test_a_complex_weight_alone_makes_the_computation_complex(rng):
    """The complex step along the weight: real x, w + i·h·v gives Im y = h·xhat·v exactly."""
    x, w, v = rng.standard_normal((3, 6)), rng.uniform(0.5, 1.5, 6), rng.standard_normal(6)
    h = 2.0**-40
    y, _ = rmsref.rms_norm_forward(x, 6, w + 1j * h * v)
    xhat, _ = rmsref.rms_norm_forward(x, 6)
    assert y.dtype == np.complex128
    np.testing.assert_allclose(y.imag / h, xhat * v, rtol=1e-14, atol=0)


def test_add_rms_norm_backward_is_complex_when_x_alone_is(rng):
    """The complex step along x through the fused backward: dx (= dresidual) is complex."""
    x, r = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    dy, w = rng.standard_normal((3, 6)), rng.uniform(0.5, 1.5, 6)
    h = 2.0**-40
    g = rmsref.add_rms_norm_backward(dy, None, x + 1j * h, r, 6, w)
    assert np.iscomplexobj(g.dx) and np.all(np.isfinite(g.dx))
    assert np.any(g.dx.imag != 0)


# ---------------------------------------------------------------- errors that name what they got


@pytest.mark.parametrize(
    ("call", "exc", "fragment"),
    [
        (lambda: rmsref.rms_norm(np.ones((2, 5)), 4), ValueError, "(2, 5)"),
        (lambda: rmsref.rms_norm(np.ones((2, 5)), (2, 5, 1)), ValueError, "(2, 5, 1)"),
        (lambda: rmsref.rms_norm(np.ones((2, 5)), 5, np.ones(4)), ValueError, "(4,)"),
        (
            lambda: rmsref.rms_norm_forward(np.ones((2, 5)), 5, bias=np.ones((5, 1))),
            ValueError,
            "(5, 1)",
        ),
        (lambda: rmsref.rms_norm(np.ones((2, 5), np.int64), 5), TypeError, "int64"),
        (lambda: rmsref.rms_norm(np.ones((2, 5), bool), 5), TypeError, "bool"),
        (lambda: rmsref.rms_norm(np.array([["a"]]), 1), TypeError, "<U1"),
        (lambda: rmsref.rms_norm(np.ones((2, 5), object), 5), TypeError, "object"),
        (lambda: rmsref.rms_norm(np.ones((2, 5)), 5, np.ones(5, np.int32)), TypeError, "int32"),
        (lambda: rmsref.rms_norm(np.ones((2, 5)), ()), ValueError, "empty"),
        (lambda: rmsref.rms_norm(np.ones((2, 0)), 0), ValueError, "<= 0"),
        (lambda: rmsref.rms_norm(np.ones((2, 5)), 5, eps=float("nan")), ValueError, "nan"),
        (lambda: rmsref.rms_norm(np.ones((2, 5)), 5, eps=float("inf")), ValueError, "inf"),
        (lambda: rmsref.rms_norm_forward(np.ones((2, 5)), 5, partial=0.0), ValueError, "0.0"),
        (lambda: rmsref.rms_norm_forward(np.ones((2, 5)), 5, partial=1.5), ValueError, "1.5"),
        (
            lambda: rmsref.rms_norm_forward(np.ones((2, 5)), 5, partial=0.1),
            ValueError,
            "floor(N*p)=0",
        ),
        (
            lambda: rmsref.rms_norm_backward(np.ones((2, 4)), np.ones((2, 5)), 5),
            ValueError,
            "(2, 4)",
        ),
        (
            lambda: rmsref.rms_norm_backward(np.ones((2, 5)), np.ones((2, 5)), 5, rstd=np.ones(3)),
            ValueError,
            "(3,)",
        ),
        (lambda: rmsref.rms_norm("abc", 3), TypeError, "str"),
        (lambda: rmsref.rms_norm(np.ones(3), 3.0), TypeError, "3.0"),
        (
            lambda: rmsref.add_rms_norm(np.ones((2, 3)), np.ones((2, 3)), 3, rounding="bf16"),
            ValueError,
            "bf16",
        ),
    ],
)
def test_bad_input_raises_named_error(call, exc, fragment):
    with pytest.raises(exc) as info:
        call()
    assert fragment in str(info.value)


def test_negative_eps_is_refused():
    """mean(x²) + eps could be zero or negative: a NaN, not a norm (PyTorch accepts it)."""
    with pytest.raises(ValueError, match="got -0.5"):
        rmsref.rms_norm(np.array([[3.0, 4.0]]), 2, eps=-0.5)


# ---------------------------------------------------------------- the module class


def test_module_class():
    m = rmsref.RMSNorm((2, 3), eps=1e-6)
    assert repr(m) == "RMSNorm((2, 3), eps=1e-06, elementwise_affine=True)"
    assert m.num_parameters == 6 and m.weight.dtype == np.float32
    m.weight[...] = 2.0
    sd = m.state_dict()
    m.reset_parameters()
    assert np.all(m.weight == 1.0)
    m.load_state_dict(sd)
    assert np.all(m.weight == 2.0)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        m.load_state_dict({"weight": np.ones(3)})
    with pytest.raises(KeyError, match="bias"):
        m.load_state_dict({"weight": np.ones((2, 3)), "bias": np.ones((2, 3))})
    x = np.arange(12.0).reshape(2, 2, 3) + 1
    np.testing.assert_array_equal(m(x), rmsref.rms_norm(x, (2, 3), m.weight, 1e-6))
    g = m.backward(np.ones_like(x), x)
    assert g.dx.shape == x.shape and g.dweight.shape == (2, 3) and g.dweight.dtype == np.float32
    gemma = rmsref.RMSNorm(4, offset=1.0, bias=True)
    assert np.all(gemma.weight == 0) and gemma.num_parameters == 8
    assert "offset=1.0" in repr(gemma) and "bias=True" in repr(gemma)
    no_affine = rmsref.RMSNorm(4, elementwise_affine=False)
    assert no_affine.weight is None and no_affine.num_parameters == 0


# ---------------------------------------------------------------- properties (hypothesis)

rows_strategy = st.integers(1, 6)
n_strategy = st.integers(1, 40)


@settings(max_examples=60, deadline=None)
@given(m=rows_strategy, n=n_strategy, seed=st.integers(0, 2**31), log_scale=st.floats(-30, 30))
def test_property_scale_invariance_and_unit_rms(m, n, seed, log_scale):
    """Curated domain: bounded magnitudes, rows bounded away from zero."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 2.0, (m, n)) * rng.choice([-1.0, 1.0], (m, n))
    alpha = 10.0**log_scale
    y = rmsref.rms_norm(x, n, eps=0.0)
    np.testing.assert_allclose(rmsref.rms_norm(x * alpha, n, eps=0.0), y, rtol=4e-16 * 8, atol=0)
    np.testing.assert_allclose(np.sqrt(np.mean(y * y, axis=-1)), 1.0, rtol=1e-15 * 4)


@settings(max_examples=40, deadline=None)
@given(m=rows_strategy, n=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_property_matches_naive(m, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-100, 100, (m, n))
    w = rng.uniform(-2, 2, n)
    np.testing.assert_allclose(
        rmsref.rms_norm(x, n, w, 1e-5), naive.rms_norm(x, n, w, 1e-5), rtol=4e-15, atol=1e-300
    )


# ---------------------------------------------------------------- every path of every function
#
# x of shape (2, 2, 3) normalised over (2, 3): M = 2 rows of N = 6, so a result left as (M, N)
# rows or a parameter gradient left flat is caught by its shape.

NS = (2, 3)


def _arrays(rng, names):
    """Real random arrays for the named arguments (parameters and their tangents: shape NS)."""
    per_feature = ("weight", "bias", "dweight_tan", "dbias_tan", "ddweight", "ddbias")
    return {k: rng.standard_normal(NS if k in per_feature else (2, *NS)) for k in names}


#: name -> (call on a dict of arrays and an offset, the array arguments). Each returns a tuple.
CALLS = {
    "forward": (lambda a, o: rmsref.rms_norm_forward(a["x"], NS, a["weight"], 1e-3,
                                                     bias=a["bias"], offset=o),
                ("x", "weight", "bias")),
    "backward": (lambda a, o: rmsref.rms_norm_backward(a["dy"], a["x"], NS, a["weight"], 1e-3,
                                                       offset=o),
                 ("dy", "x", "weight")),
    "staged": (lambda a, o: rmsref.rms_norm_backward_staged(a["dy"], a["x"], NS, a["weight"],
                                                            1e-3, offset=o),
               ("dy", "x", "weight")),
    "jvp": (lambda a, o: (rmsref.rms_norm_jvp(a["x"], a["dx_tan"], NS, a["weight"], 1e-3,
                                              dweight_tan=a.get("dweight_tan"), bias=a["bias"],
                                              dbias_tan=a.get("dbias_tan"), offset=o),),
            ("x", "dx_tan", "weight", "dweight_tan", "dbias_tan")),
    "double_backward": (lambda a, o: rmsref.rms_norm_double_backward(
        a["ddx"], a["dy"], a["x"], NS, a["weight"], 1e-3, ddweight=a.get("ddweight"),
        ddbias=a.get("ddbias"), offset=o),
        ("ddx", "dy", "x", "weight", "ddweight", "ddbias")),
    "add_forward": (lambda a, o: rmsref.add_rms_norm_forward(a["x"], a["residual"], NS,
                                                             a["weight"], 1e-3, offset=o),
                    ("x", "residual", "weight")),
    "add_backward": (lambda a, o: rmsref.add_rms_norm_backward(
        a["dy"], a["dresidual_out"], a["x"], a["residual"], NS, a["weight"], 1e-3, offset=o),
        ("dy", "dresidual_out", "x", "residual", "weight")),
}
CALL_ARGS = [(c, arg) for c, (_, args) in CALLS.items() for arg in args]


@pytest.mark.parametrize(("call", "arg"), CALL_ARGS)
def test_any_one_complex_argument_is_a_complex_step(rng, call, arg):
    """Complex-step differentiation along any one argument: with that argument alone complex,
    a + i·h·v, every result is complex, its real part is the real result and its imaginary
    part / h is the derivative along v, as central differences of the real function give it
    (the imaginary part is carried through every step, never dropped)."""
    f, names = CALLS[call]
    a = _arrays(rng, (*names, "bias"))
    v = rng.standard_normal(a[arg].shape)
    h, d = 1e-20, 1e-6
    step = f({**a, arg: a[arg] + 1j * h * v}, 0.5)
    real = f(a, 0.5)
    up, down = f({**a, arg: a[arg] + d * v}, 0.5), f({**a, arg: a[arg] - d * v}, 0.5)
    for got, r, u, w in zip(step, real, up, down, strict=True):
        if r is None:  # dbias without a bias
            assert got is None
            continue
        assert got.dtype.kind == "c", f"{call}: {arg} complex, a result is {got.dtype}"
        np.testing.assert_allclose(got.real, r, rtol=1e-14, atol=1e-14)
        fd = (u - w) / (2 * d)
        np.testing.assert_allclose(got.imag / h, fd, rtol=0, atol=1e-7 * max(1.0, np.max(abs(fd))))


@pytest.mark.parametrize("offset", [0.0, 0.5])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_no_weight_is_a_weight_of_ones(rng, call, offset):
    """Without a weight (and without the optional tangents and cotangents) every function uses
    the scale 1 + offset: its results equal those with a weight of ones and zero tangents, in
    x's shape; the gradient w.r.t. the absent weight is None."""
    f, names = CALLS[call]
    a = _arrays(rng, (*names, "bias"))
    optional = ("dweight_tan", "dbias_tan", "ddweight", "ddbias")
    none = {k: v for k, v in a.items() if k not in optional} | {"weight": None}
    ones = {k: (np.zeros(NS) if k in optional else v) for k, v in a.items()}
    ones["weight"] = np.ones(NS)
    for got, expect in zip(f(none, offset), f(ones, offset), strict=True):
        if expect is None:
            assert got is None
        elif expect.shape == NS:  # the weight's gradient: None without a weight
            assert got is None
        else:
            rstd_shape = (2, 1, 1)  # one statistic per row, broadcastable against x
            assert got.shape == expect.shape == (rstd_shape if expect.size == 2 else a["x"].shape)
            np.testing.assert_allclose(got, expect, rtol=1e-15, atol=1e-15)
    if call == "staged":  # the teaching backward is the closed form on this path too
        closed = rmsref.rms_norm_backward(a["dy"], a["x"], NS, None, 1e-3, offset=offset)
        np.testing.assert_allclose(f(none, offset).dx, closed.dx, rtol=1e-13, atol=1e-14)


#: The dtype of each argument in the mixed-dtype test, and of each call's results (the dtype of
#: the argument it is the gradient or image of; rstd is always float64).
MIXED = {"x": np.float32, "dy": np.float16, "weight": bfloat16, "residual": np.float64}
RESULT_OF = {
    "forward": ("x", None), "backward": ("x", "weight", None), "staged": ("x", "weight", None),
    "jvp": ("x",), "double_backward": ("x", "weight", "dy"), "add_forward": ("x", "residual", None),
    "add_backward": ("x", "residual", "weight"),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_each_result_is_the_float64_result_rounded_once_to_its_own_dtype(rng, call):
    """Arguments of four different dtypes: every result is the result of the same call on the
    float64 values of the arguments, rounded once to the dtype of the argument it belongs to
    (dx: x's, dweight: the weight's, ddy: dy's, dresidual and new_residual: the residual's)."""
    f, names = CALLS[call]
    a = {k: v.astype(MIXED.get(k, np.float32)) for k, v in _arrays(rng, (*names, "bias")).items()}
    exact = {k: v.astype(np.float64) for k, v in a.items()}
    for got, expect, owner in zip(f(a, 0.5), f(exact, 0.5), RESULT_OF[call], strict=True):
        if owner is None and expect is not None and expect.size == 2:  # rstd, kept in float64
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got, expect)
        elif owner is None:  # dbias without a bias
            assert got is None and expect is None
        else:
            assert got.dtype == np.dtype(MIXED.get(owner, np.float32)), (call, owner, got.dtype)
            np.testing.assert_array_equal(got, round_to(expect, got.dtype))


def test_backward_uses_the_given_rstd_as_is(rng):
    """A kernel's own saved statistic (here 1.5x the true one) is used, not recomputed:
    xhat = x·rstd and eqs. (5)-(9) written out; the fused backward does the same on h."""
    x, dy, w = rng.standard_normal((3, 8)), rng.standard_normal((3, 8)), rng.standard_normal(8)
    rstd = 1.5 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-3)  # (3, 1)
    xhat, dxhat = x * rstd, dy * w
    dx = rstd * (dxhat - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True))
    g = rmsref.rms_norm_backward(dy, x, 8, w, 1e-3, rstd=rstd, bias=w)
    np.testing.assert_allclose(g.dx, dx, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(g.dweight, np.sum(dy * xhat, axis=0), rtol=1e-13)
    np.testing.assert_allclose(g.dbias, np.sum(dy, axis=0), rtol=1e-13)
    r = rng.standard_normal((3, 8))
    h = x - r
    fused = rmsref.add_rms_norm_backward(dy, None, h, r, 8, w, 1e-3, rstd=rstd)
    np.testing.assert_allclose(fused.dx, dx, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(fused.dweight, np.sum(dy * xhat, axis=0), rtol=1e-12)


def test_a_complex_saved_rstd_keeps_its_imaginary_part(rng):
    """Complex step through a backward that is given the forward's (complex) rstd: the same
    gradients as when it recomputes rstd, imaginary parts included."""
    x = rng.standard_normal((3, 8)) + 1e-3j * rng.standard_normal((3, 8))
    r, dy, w = rng.standard_normal((3, 8)), rng.standard_normal((3, 8)), rng.standard_normal(8)
    rstd = rmsref.rms_norm_forward(x, 8, w, 1e-3)[1]
    for with_rstd, recomputed in (
        (rmsref.rms_norm_backward(dy, x, 8, w, 1e-3, rstd=rstd),
         rmsref.rms_norm_backward(dy, x, 8, w, 1e-3)),
        (rmsref.add_rms_norm_backward(dy, None, x, r, 8, w, 1e-3,
                                      rstd=rmsref.add_rms_norm_forward(x, r, 8, w, 1e-3)[2]),
         rmsref.add_rms_norm_backward(dy, None, x, r, 8, w, 1e-3)),
    ):
        for a, b in zip(with_rstd, recomputed, strict=True):
            if b is not None:
                np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)


def test_a_negative_zero_weight_gives_a_signed_zero(rng):
    """The weight is used as given, bit for bit: w_j = -0.0 gives y_j = -0.0 where x_j > 0."""
    x = rng.uniform(0.5, 1.5, (2, 4))
    w = np.array([1.0, -0.0, 2.0, 0.0])
    y = rmsref.rms_norm(x, 4, w, 1e-6)
    assert np.all(np.signbit(y[:, 1])) and not np.any(np.signbit(y[:, 3]))


def test_out_shares_no_memory_with_any_input_naming_which(rng):
    """out= overlapping an input is refused, naming that input."""
    buf = np.zeros((2, 4))
    x = rng.standard_normal((2, 4))
    with pytest.raises(ValueError, match="with x;"):
        rmsref.rms_norm_forward(buf, 4, out=buf)
    with pytest.raises(ValueError, match="with weight;"):
        rmsref.rms_norm_forward(x, 4, buf[0], out=buf)
    with pytest.raises(ValueError, match="with bias;"):
        rmsref.rms_norm_forward(x, 4, bias=buf[1], out=buf)
    with pytest.raises(ValueError, match="with x;"):
        rmsref.rms_norm_backward(x, buf, 4, out=buf)
    with pytest.raises(ValueError, match="with dy;"):
        rmsref.rms_norm_backward(buf, x, 4, out=buf)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda x, bad: rmsref.rms_norm_jvp(x, x, 4, dweight_tan=bad), "dweight_tan"),
        (lambda x, bad: rmsref.rms_norm_jvp(x, x, 4, dbias_tan=bad), "dbias_tan"),
        (lambda x, bad: rmsref.rms_norm_jvp(x, x, 4, bias=bad), "bias"),
        (lambda x, bad: rmsref.rms_norm_double_backward(x, x, x, 4, ddweight=bad), "ddweight"),
        (lambda x, bad: rmsref.rms_norm_double_backward(x, x, x, 4, ddbias=bad), "ddbias"),
    ],
)
def test_every_argument_is_checked_and_named(call, name):
    """A parameter, tangent or cotangent of the wrong shape is refused, naming it (the bias of
    the JVP too, although it adds no term)."""
    with pytest.raises(ValueError, match=f"^{name} has shape \\(3,\\)"):
        call(np.ones((2, 4)), np.ones(3))


@pytest.mark.parametrize("call", sorted(CALLS))
def test_non_finite_rows_need_no_floating_point_flags(rng, call):
    """A row with an inf and a row with a NaN give NaN/inf in their own rows even under
    np.errstate(all="raise"): the oracle sets its own floating-point error state."""
    f, names = CALLS[call]
    a = _arrays(rng, (*names, "bias"))
    a["x"][0, 0, 0], a["x"][1, 1, 2] = np.inf, np.nan
    with np.errstate(all="raise"):
        results = f(a, 0.5)
    assert any(r is not None and not np.all(np.isfinite(r)) for r in results)


def test_module_passes_every_option_on(rng):
    """RMSNorm(..., eps, bias=True, dtype, offset): forward and backward are the functions
    called with the module's eps, weight, bias and offset; the parameters have its dtype."""
    m = rmsref.RMSNorm(NS, eps=0.25, bias=True, dtype=np.float64, offset=0.5)
    assert m.weight.dtype == m.bias.dtype == np.float64
    m.weight[...] = rng.standard_normal(NS)
    m.bias[...] = rng.standard_normal(NS)
    x, dy = rng.standard_normal((2, *NS)), rng.standard_normal((2, *NS))
    kw = {"bias": m.bias, "offset": 0.5}
    np.testing.assert_array_equal(m(x), rmsref.rms_norm_forward(x, NS, m.weight, 0.25, **kw)[0])
    got, expect = m.backward(dy, x), rmsref.rms_norm_backward(dy, x, NS, m.weight, 0.25, **kw)
    for a, b in zip(got, expect, strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.dbias is not None


def test_an_empty_batch_has_zero_parameter_gradients(rng):
    """M = 0 rows: dweight and dbias are zeros of the parameter's shape (complex when the
    computation is), from the backward and from the double backward."""
    x = np.zeros((0, *NS)) + 0j
    w = rng.standard_normal(NS)
    dd = rmsref.rms_norm_double_backward(x, x, x, NS, w, 1e-3)
    g = rmsref.rms_norm_backward(x, x, NS, w, 1e-3, bias=w)
    for grad in (dd.dweight, g.dweight, g.dbias):
        assert grad.shape == NS and grad.dtype == np.complex128 and not np.any(grad)
