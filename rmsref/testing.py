"""Assertions for users' own test suites: ``assert_rms_norm_close``.

    from rmsref.testing import assert_rms_norm_close
    assert_rms_norm_close(my_kernel(x, w), x, 4096, w)            # y, torch convention
    assert_rms_norm_close(dx, x, 4096, w, quantity="dx", dy=dy)   # a gradient

The reference is the float64 oracle on *your* (already rounded) inputs; the tolerance is
:mod:`rmsref.tolerance`'s per-element bound for the convention, never a hand-picked atol. On failure
the AssertionError carries the worst element, the observed/bound ratio and, when the error's
shape matches a known mistake, the diagnosis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rmsref import conventions as conv_mod
from rmsref import tolerance as tol
from rmsref._shapes import as_array, check_input, normalize_shape


def assert_rms_norm_close(
    actual: Any,
    x: Any,
    normalized_shape: Any,
    weight: Any = None,
    eps: float | None = None,
    *,
    convention: str = "torch",
    quantity: str = "y",
    dy: Any = None,
    form: tol.Form = "probabilistic",
) -> None:
    """Raise AssertionError unless ``actual`` is within the rounding-error bound of RMSNorm.

    Parameters
    ----------
    actual : array
        The implementation's y (``quantity="y"``), dx or dweight, in its output dtype.
    x, normalized_shape, weight, eps
        The inputs the implementation got (x in its dtype: the dtype sets the bound).
    convention : str
        The convention claimed (:mod:`rmsref.conventions`): eps default, offset, roundings.
    quantity : {"y", "dx", "dweight"}
        What ``actual`` is; "dx" and "dweight" need ``dy``.
    dy : array, optional
        The upstream gradient the backward got.
    form : {"probabilistic", "deterministic"}
        The accumulation term of the bound.

    Raises
    ------
    AssertionError
        With the report's lines: worst element, ratio, error figures, diagnosis.
    """
    from rmsref import diagnosis
    from rmsref.rmsnorm import rms_norm_backward, rms_norm_forward
    from rmsref.validate import CaseResult, _measure, _rows2

    if quantity not in ("y", "dx", "dweight"):
        raise ValueError(f"quantity must be 'y', 'dx' or 'dweight', got {quantity!r}")
    conv = conv_mod.get(convention)
    xa = as_array(x, "x")
    shape = normalize_shape(normalized_shape)
    check_input(xa, shape, "x")
    w = None if weight is None else as_array(weight, "weight")
    a = as_array(actual, "actual")
    n = int(np.prod(shape))
    rows = int(np.prod(xa.shape[: xa.ndim - len(shape)]))
    dt = xa.dtype
    model = conv.error_model(dt, n, rows, form)
    eps_val = conv.default_eps(dt) if eps is None else float(eps)
    offset = conv.default_offset
    x64 = xa.astype(np.float64)
    w64 = None if w is None else w.astype(np.float64)
    w_eff = (np.ones(n) if w64 is None else w64.reshape(n)) + offset
    y_ref, rstd = rms_norm_forward(x64, shape, w64, eps_val, offset=offset, out_dtype=np.float64)
    rstd2 = np.asarray(rstd, np.float64).reshape(-1, 1)
    with np.errstate(invalid="ignore"):
        xhat2 = _rows2(x64, n) * rstd2
    if quantity != "y" and dy is None:
        raise ValueError(f"quantity={quantity!r} needs the dy the backward was given")
    g = None if dy is None else as_array(dy, "dy")
    res = CaseResult("assert", str(dt), quantity, tuple(a.shape), False)
    if quantity == "y":
        expected = _rows2(y_ref, n)
        if a.size != expected.size:
            raise AssertionError(f"y has shape {a.shape}, expected {xa.shape}")
        b = tol.bound_y(expected, model)
        got = _rows2(a, n)
        ratio = _measure(res, got, expected, b, dt)
    else:
        gr = rms_norm_backward(g.astype(np.float64), x64, shape, w64, eps_val, offset=offset)
        g2 = _rows2(g, n)
        if quantity == "dx":
            expected = _rows2(gr.dx, n)
            if a.size != expected.size:
                raise AssertionError(f"dx has shape {a.shape}, expected {xa.shape}")
            b = tol.bound_dx(expected, g2, xhat2, rstd2, w_eff, model)
            got = _rows2(a, n)
            ratio = _measure(res, got, expected, b, dt)
        else:
            if w is None:
                raise ValueError("quantity='dweight' needs the weight")
            expected = np.asarray(gr.dweight, np.float64).reshape(1, n)
            if a.size != n:
                raise AssertionError(f"dweight has shape {a.shape}, expected {w.shape}: summed "
                                     "over the wrong axis?")
            b = tol.bound_dweight(expected.reshape(n), g2, xhat2, model).reshape(1, n)
            got = np.asarray(a, np.float64).reshape(1, n)
            ratio = _measure(res, got, expected, b, dt)
    if res.passed:
        return
    n_bad = int(np.count_nonzero(ratio > 1.0))
    r, c = res.worst if res.worst is not None else (0, 0)
    lines = [
        f"RMSNorm {quantity} ({dt}, N={n}, convention '{convention}') is not within the "
        f"rmsref.tolerance bound: {n_bad} of {ratio.size} elements exceed it",
        f"  worst at (row {r}, col {c}): actual {float(got[r, c])!r}, expected "
        f"{float(expected[r, c])!r}, bound {float(b[r, c]):.3g}, ratio {res.ratio:.3g}",
        f"  max abs {res.max_abs:.3g}, max rel {res.max_rel:.3g}, max ulp {res.max_ulp:.3g}",
    ]
    obs = diagnosis.Observation("assert", quantity, xa, shape, w, g, eps, eps_val, offset, got,
                                model, res.ratio, False)
    lines.extend(d.line() for d in diagnosis.diagnose([obs]))
    raise AssertionError("\n".join(lines))
