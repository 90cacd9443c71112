"""Tests that kill mutants of rmsref/rmsnorm.py (each says which behaviour it pins)."""

from __future__ import annotations

import numpy as np

import rmsref


def test_double_backward_keeps_a_non_finite_row_to_itself():
    """rms_norm_double_backward without ddweight: a row holding inf has rstd = 0 and gives NaN
    in that row only, as torch's autograd does; the finite row is the one-row call's bits.
    (With the Q term built from a Python-object zero, 0 / rstd of that row raised
    ZeroDivisionError instead.)"""
    x = np.array([[1.0, 2.0, 3.0], [np.inf, 1.0, 2.0]])     # (2, 3)
    ones = np.ones_like(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        g = rmsref.rms_norm_double_backward(ones, ones, x, 3, eps=1e-6)
    one_row = rmsref.rms_norm_double_backward(ones[:1], ones[:1], x[:1], 3, eps=1e-6)
    assert g.dweight is None
    for name in ("dx", "ddy"):
        got = getattr(g, name)
        assert got.dtype == np.float64, name
        assert np.isnan(got[1]).all(), f"{name}: the inf row is {got[1]}"
        assert np.array_equal(got[:1], getattr(one_row, name)), name
        assert np.isfinite(got[0]).all(), name


def test_the_fused_adds_dresidual_takes_the_residuals_dtype():
    """dresidual is rounded to the residual's dtype (bfloat16 here, beside a float32 x), dx to
    x's: each is the float64 dh rounded once to its own dtype."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    r = rng.standard_normal((3, 8)).astype(rmsref.bfloat16)
    dy = rng.standard_normal((3, 8)).astype(np.float32)
    g = rmsref.add_rms_norm_backward(dy, None, x, r, 8)
    assert g.dx.dtype == np.float32 and g.dresidual.dtype == rmsref.bfloat16
    dh = rmsref.add_rms_norm_backward(dy.astype(np.float64), None, x.astype(np.float64),
                                      r.astype(np.float64), 8, rounding="fp32-sum").dx
    assert np.array_equal(g.dresidual, dh.astype(rmsref.bfloat16)), "dresidual rounded once"


def test_the_staged_backward_without_a_weight_is_the_backwards():
    """The node-by-node backward with no weight (its scale is a (1, N) row of ones) gives
    rms_norm_backward's dx."""
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((2, 5, 6))
    staged = rmsref.rms_norm_backward_staged(dy, x, 6)
    direct = rmsref.rms_norm_backward(dy, x, 6)
    assert staged.dx.shape == (5, 6) and staged.dweight is None
    np.testing.assert_allclose(staged.dx, direct.dx, rtol=1e-13, atol=1e-15)
