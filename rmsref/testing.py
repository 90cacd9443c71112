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
    from rmsref.comparison import Reference, compare

    if quantity not in ("y", "dx", "dweight"):
        raise ValueError(f"quantity must be 'y', 'dx' or 'dweight', got {quantity!r}")
    conv = conv_mod.get(convention)
    xa = as_array(x, "x")
    shape = normalize_shape(normalized_shape)
    check_input(xa, shape, "x")
    w = None if weight is None else as_array(weight, "weight")
    a = as_array(actual, "actual")
    if quantity != "y" and dy is None:
        raise ValueError(f"quantity={quantity!r} needs the dy the backward was given")
    if quantity == "dweight" and w is None:
        raise ValueError("quantity='dweight' needs the weight")
    g = None if dy is None else as_array(dy, "dy")
    dt = xa.dtype
    eps_val = conv.default_eps(dt) if eps is None else float(eps)
    ref = Reference(xa, shape, w, eps_val, dy=g, offset=conv.default_offset)
    model = conv.error_model(dt, ref.n, ref.rows, form)
    expected = ref.exact(quantity)
    if a.size != expected.size:
        like = "the weight " + str(w.shape) + ": summed over the wrong axis?" \
            if quantity == "dweight" else f"x {xa.shape}"
        raise AssertionError(f"{quantity} has shape {a.shape}, expected that of {like}")
    got = np.asarray(a, np.float64).reshape(expected.shape)
    c = compare(quantity, got, ref, model)
    if c.passed:
        return
    n_bad = int(np.count_nonzero(c.ratios > 1.0))
    r, col = c.worst if c.worst is not None else (0, 0)
    lines = [
        f"RMSNorm {quantity} ({dt}, N={ref.n}, convention '{convention}') is not within the "
        f"rmsref.tolerance bound: {n_bad} of {c.ratios.size} elements exceed it",
        f"  worst at (row {r}, col {col}): actual {float(got[r, col])!r}, expected "
        f"{float(expected[r, col])!r}, bound {float(c.bound[r, col]):.3g}, ratio {c.ratio:.3g}",
        f"  max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}, max ulp {c.max_ulp:.3g}",
    ]
    obs = diagnosis.Observation("assert", quantity, xa, shape, w, g, eps, eps_val,
                                conv.default_offset, got, model, c.ratio, False)
    lines.extend(d.line() for d in diagnosis.diagnose([obs]))
    raise AssertionError("\n".join(lines))
