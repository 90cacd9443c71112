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
