"""Fused residual add + RMSNorm: both rounding meanings, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest

import rmsref
from rmsref._rounding import round_to
from rmsref._shapes import bfloat16


def test_fp32_sum_normalises_the_unrounded_sum(rng):
    x = rng.standard_normal((4, 64)).astype(bfloat16)
    r = rng.standard_normal((4, 64)).astype(bfloat16)
    w = rng.standard_normal(64).astype(np.float32)
    h = x.astype(np.float64) + r.astype(np.float64)
    y, res = rmsref.add_rms_norm(x, r, 64, w, rounding="fp32-sum")
    np.testing.assert_array_equal(y, round_to(rmsref.rms_norm(h, 64, w, 2.0**-23), bfloat16))
    np.testing.assert_array_equal(res, round_to(h, bfloat16))


def test_rounded_sum_normalises_the_rounded_sum(rng):
    x = rng.standard_normal((4, 64)).astype(bfloat16)
    r = (rng.standard_normal((4, 64)) * 7).astype(bfloat16)
    h = round_to(x.astype(np.float64) + r.astype(np.float64), bfloat16)
    y, res = rmsref.add_rms_norm(x, r, 64, rounding="rounded-sum")
    np.testing.assert_array_equal(y, rmsref.rms_norm(h, 64))
    np.testing.assert_array_equal(res, h)
    y32, _ = rmsref.add_rms_norm(x, r, 64, rounding="fp32-sum")
    assert np.any(y32 != y), "the two meanings should differ somewhere on bf16 inputs"


def test_backward_is_rmsnorm_backward_of_the_sum_plus_residual_grad(rng):
    """float64: the sum is exact, so the two meanings of the rounding coincide (below)."""
    x, r = rng.standard_normal((3, 16)), rng.standard_normal((3, 16))
    w, dy, dres = (
        rng.standard_normal(16),
        rng.standard_normal((3, 16)),
        rng.standard_normal((3, 16)),
    )
    g = rmsref.add_rms_norm_backward(dy, dres, x, r, 16, w, 1e-5, rounding="fp32-sum")
    ref = rmsref.rms_norm_backward(dy, x + r, 16, w, 1e-5)
    np.testing.assert_allclose(g.dx, ref.dx + dres, rtol=1e-14)
    np.testing.assert_array_equal(g.dx, g.dresidual)
    np.testing.assert_allclose(g.dweight, ref.dweight, rtol=1e-14)
    _, _, rstd = rmsref.add_rms_norm_forward(x, r, 16, w, 1e-5)
    g2 = rmsref.add_rms_norm_backward(dy, None, x, r, 16, w, 1e-5, rstd=rstd)
    np.testing.assert_allclose(g2.dx, ref.dx, rtol=1e-13)


@pytest.mark.parametrize("rounding", ["fp32-sum", "rounded-sum"])
def test_backward_differentiates_at_the_sum_its_rounding_normalises(rng, rounding):
    """bfloat16: rounded-sum normalises h = R(x + r), fp32-sum the exact sum; the backward is
    RMSNorm's backward at that h plus the residual's gradient, rounded once."""
    def bf(a):
        return round_to(np.asarray(a, np.float64), bfloat16)

    x, r = bf(3 * rng.standard_normal((3, 16))), bf(7 * rng.standard_normal((3, 16)))
    w, dy, dres = (bf(1 + 0.3 * rng.standard_normal(16)), bf(rng.standard_normal((3, 16))),
                   bf(rng.standard_normal((3, 16))))
    f64 = np.float64
    g = rmsref.add_rms_norm_backward(dy, dres, x, r, 16, w, 1e-5, rounding=rounding)
    h = x.astype(f64) + r.astype(f64)
    if rounding == "rounded-sum":
        h = bf(h).astype(f64)
    ref = rmsref.rms_norm_backward(dy.astype(f64), h, 16, w.astype(f64), 1e-5)
    np.testing.assert_array_equal(g.dx, bf(ref.dx + dres.astype(f64)))
    np.testing.assert_array_equal(g.dweight, bf(ref.dweight))
    other = "rounded-sum" if rounding == "fp32-sum" else "fp32-sum"
    g_other = rmsref.add_rms_norm_backward(dy, dres, x, r, 16, w, 1e-5, rounding=other)
    assert np.any(g.dx.astype(f64) != g_other.dx.astype(f64)), "the meanings should differ"


def test_residual_shape_is_checked():
    with pytest.raises(ValueError, match=r"residual has shape \(2, 4\)"):
        rmsref.add_rms_norm(np.ones((2, 3)), np.ones((2, 4)), 3)


def test_forward_without_offset_uses_the_weight_as_is(rng):
    """add_rms_norm_forward's default offset is 0: y = rms_norm(x + residual, weight)."""
    x, r, w = rng.standard_normal((3, 8)), rng.standard_normal((3, 8)), rng.standard_normal(8)
    y, res, rstd = rmsref.add_rms_norm_forward(x, r, 8, w, 1e-3)
    expect_y, expect_rstd = rmsref.rms_norm_forward(x + r, 8, w, 1e-3)
    np.testing.assert_array_equal(y, expect_y)
    np.testing.assert_array_equal(rstd, expect_rstd)
    np.testing.assert_array_equal(res, x + r)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_the_two_meanings_coincide_where_the_sum_is_not_rounded(rng, dtype):
    """float64 and complex128 (complex step) inputs: rounding x + residual to x's dtype changes
    nothing, so "rounded-sum" gives "fp32-sum"'s results, imaginary parts included."""
    x, r = (rng.standard_normal((3, 8)).astype(dtype) for _ in range(2))
    if dtype == np.complex128:
        x = x + 1e-3j * rng.standard_normal((3, 8))
    w, dy = rng.standard_normal(8), rng.standard_normal((3, 8))
    for f in (
        lambda rounding: rmsref.add_rms_norm_forward(x, r, 8, w, 1e-3, rounding=rounding),
        lambda rounding: rmsref.add_rms_norm_backward(dy, dy, x, r, 8, w, 1e-3,
                                                      rounding=rounding),
    ):
        for a, b in zip(f("rounded-sum"), f("fp32-sum"), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_backward_uses_the_offset(rng):
    """With a weight offset (Gemma) the fused backward is RMSNorm's backward at h = x + residual
    with that offset, plus the residual's gradient."""
    x, r, dy, dres = (rng.standard_normal((3, 8)) for _ in range(4))
    w = rng.standard_normal(8)
    g = rmsref.add_rms_norm_backward(dy, dres, x, r, 8, w, 1e-3, offset=1.0)
    expect = rmsref.rms_norm_backward(dy, x + r, 8, w, 1e-3, offset=1.0)
    np.testing.assert_allclose(g.dx, expect.dx + dres, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(g.dweight, expect.dweight, rtol=1e-14)
