r"""LayerNorm, written as a diff against RMSNorm: LN(x) = RMSNorm(x − mean(x)) ⊙ w + b.

For one row of N features (torch semantics: eps defaults to 1e-5, biased variance):

Forward
    (1)  mu   = (1/N) Σ_j x_j                 mean (refined once, see below)          (M, 1)
    (2)  xc   = x − mu                        centred input                            (M, N)
    (3)  var  = (1/N) Σ_j xc_j²               biased variance                          (M, 1)
    (4)  rstd = 1 / sqrt(var + eps)                                                    (M, 1)
    (5)  xhat = xc · rstd                                                              (M, N)
    (6)  y    = xhat ⊙ w + b                                                           (M, N)
Backward — RMSNorm's two paths plus one more, through the mean:
    (7)  dxhat   = dy ⊙ w
    (8)  c1      = (1/N) Σ_j dxhat_j              the path through mu
    (9)  c2      = (1/N) Σ_j dxhat_j · xhat_j     the path through rstd (RMSNorm's c)
    (10) dx      = rstd · (dxhat − c1 − xhat · c2)
    (11) dweight = Σ_rows dy ⊙ xhat,   dbias = Σ_rows dy
Since Σ_j xhat_j = 0, summing (10) over the row gives Σ_j dx_j = rstd·(N·c1 − N·c1 − 0) = 0:
LayerNorm's input gradient has zero mean, RMSNorm's does not.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rmsref import _sumsq
from rmsref._module import NormModule
from rmsref._rounding import round_to
from rmsref._shapes import (
    ShapeLike,
    check_out,
    check_param,
    check_stat_pair,
    compute_dtype,
    into_out,
    param_as_row,
    prepare,
    resolve_out_dtype,
    result_dtype,
    rows_into,
    stat_shape,
)
from rmsref.rmsnorm import _ColumnSum, _grad_out, _scale_offset

__all__ = [
    "LayerNorm",
    "LayerNormGrads",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_backward_staged",
    "layer_norm_forward",
    "layer_norm_jvp",
]

#: torch.nn.functional.layer_norm's default eps.
DEFAULT_EPS = 1e-5


class LayerNormGrads(NamedTuple):
    """Gradients of LayerNorm: ∂L/∂x, ∂L/∂weight, ∂L/∂bias (None where there is no parameter)."""

    dx: np.ndarray
    dweight: np.ndarray | None
    dbias: np.ndarray | None


def _ln_stats_rows(xr: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """xhat (M, N), mean (M, 1), rstd (M, 1), overflow-safe. Eqs. (1)-(5)."""
    k = _sumsq.row_exponents(xr, eps) if _sumsq.needs_scaling(xr.dtype) else None
    xs = _sumsq.scale_rows(xr, k)  # (M, N)  x · 2^-k, exact
    mu = np.mean(xs, axis=-1, keepdims=True)  # (M, 1)  eq. (1)
    xc = xs - mu  # (M, N)  eq. (2)
    # One refinement step, applied in the centred domain: for x = 1e8 + noise the first mean is
    # off by up to an ulp of 1e8 (1.5e-8), which mu itself cannot represent any better, but the
    # centred values can absorb the correction exactly enough (measured: 3e-9 -> 4e-16 in xhat).
    correction = np.mean(xc, axis=-1, keepdims=True)  # (M, 1)
    xc = xc - correction
    mu = mu + correction
    # The variance needs the scale of the centred values, not of x: a constant row at 1e300 has
    # xc = 0, and in x's scale eps (2^-2k·eps) underflows to 0, giving 0/0 for xhat.
    kc = None
    if k is not None:
        kc = _sumsq.row_exponents(xc, eps, k)
        kc = np.zeros_like(k) if kc is None else kc
        xc = _sumsq.scale_rows(xc, kc - k)  # (M, N)  x − mu in units of 2^kc, exact
    var = _sumsq.sum_of_squares(xc) / xs.shape[-1]  # (M, 1)  eq. (3)
    denom = np.sqrt(var + _sumsq.scale_eps(eps, kc))  # (M, 1)
    xhat = xc / denom  # (M, N)  eq. (5)
    return xhat, _sumsq.unscale(mu, k, 1), _sumsq.unscale(1.0 / denom, kc, -1)


def _ln_dx_rows(dxhat: np.ndarray, xhat: np.ndarray, rstd: np.ndarray) -> np.ndarray:
    """Eqs. (8)-(10): dx = rstd · (dxhat − c1 − xhat · c2)."""
    c1 = np.mean(dxhat, axis=-1, keepdims=True)  # (M, 1)  eq. (8)
    c2 = np.mean(dxhat * xhat, axis=-1, keepdims=True)  # (M, 1)  eq. (9)
    return rstd * (dxhat - c1 - xhat * c2)  # (M, N)  eq. (10)


def layer_norm(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = DEFAULT_EPS,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """LayerNorm with ``torch.nn.functional.layer_norm`` semantics, computed in float64.

    ``out``: where to write y (x's shape and dtype exactly; as :func:`rmsref.rms_norm`).

    Examples
    --------
    >>> import numpy as np, rmsref
    >>> rmsref.layer_norm(np.array([1.0, 2.0, 3.0, 4.0]), 4).round(4)
    array([-1.3416, -0.4472,  0.4472,  1.3416])
    """
    return layer_norm_forward(x, normalized_shape, weight, bias, eps, out=out)[0]


def layer_norm_forward(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = DEFAULT_EPS,
    *,
    out_dtype: Any = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm forward, eqs. (1)-(6): ``(y, mean, rstd)``.

    ``mean`` and ``rstd`` are float64 (complex128 for complex input) with shape
    ``x.shape[:-k] + (1,) * k``: O(rows) statistics, all the backward needs besides x.
    ``out``: where to write y (as :func:`rmsref.rms_norm`).
    """
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=DEFAULT_EPS)
    x, shape, xrows, m, n, eps, weight_arr = a.x, a.shape, a.rows, a.m, a.n, a.eps, a.weight
    ctype = compute_dtype(x, weight_arr, a.bias)  # complex if any of them is (complex step)
    dtype = result_dtype(resolve_out_dtype(out_dtype, x), ctype)
    wt = _scale_offset(param_as_row(weight_arr, ctype), 0.0, n, ctype)
    b = param_as_row(a.bias, ctype)
    out = check_out(out, x.shape, dtype, {"x": x, "weight": weight_arr, "bias": a.bias})

    y = rows_into(out, m, n, dtype)  # (M, N)
    mean = np.empty((m, 1), ctype)
    rstd = np.empty((m, 1), ctype)
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            xhat, mean[rows], rstd[rows] = _ln_stats_rows(xrows[rows].astype(ctype), eps)
            yr = xhat * wt  # (m, N)  eq. (6)
            if b is not None:
                yr += b
            y[rows] = round_to(yr, dtype)
    stat = stat_shape(x, shape)
    return into_out(y, out, x.shape), mean.reshape(stat), rstd.reshape(stat)


def layer_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = DEFAULT_EPS,
    *,
    mean: Any = None,
    rstd: Any = None,
    out: np.ndarray | None = None,
) -> LayerNormGrads:
    """LayerNorm backward in closed form, eqs. (7)-(11).

    ``mean`` and ``rstd``, when given (both), are the forward's saved statistics and are used as
    they are; otherwise they are recomputed from ``x``. ``out``: where to write dx (as
    :func:`rmsref.rms_norm_backward`).
    """
    check_stat_pair(mean, rstd)
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=DEFAULT_EPS,
                others={"dy": dy}, stats={"mean": mean, "rstd": rstd})
    x, shape, xrows, m, n, eps = a.x, a.shape, a.rows, a.m, a.n, a.eps
    dy_arr, weight_arr, bias_arr = a.others["dy"], a.weight, a.bias
    ctype = compute_dtype(x, dy_arr, weight_arr)
    wt = _scale_offset(param_as_row(weight_arr, ctype), 0.0, n, ctype)
    saved_mean, saved_rstd = a.stats["mean"], a.stats["rstd"]
    dyrows = dy_arr.reshape(m, n)
    dx_dtype = result_dtype(x.dtype, ctype)
    out = check_out(out, x.shape, dx_dtype, {"dy": dy_arr, "x": x, "weight": weight_arr,
                                             "mean": mean, "rstd": rstd})

    dx = rows_into(out, m, n, dx_dtype)  # (M, N)
    dweight = _ColumnSum(n, ctype)
    dbias = _ColumnSum(n, ctype)
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            xr = xrows[rows].astype(ctype)
            if saved_rstd is None:
                xhat, _, rstd_r = _ln_stats_rows(xr, eps)
            else:
                rstd_r = saved_rstd[rows].astype(ctype)
                xhat = (xr - saved_mean[rows].astype(ctype)) * rstd_r  # eq. (5)
            dyr = dyrows[rows].astype(ctype)
            dx[rows] = round_to(_ln_dx_rows(dyr * wt, xhat, rstd_r), dx.dtype)  # eqs. (7)-(10)
            if weight_arr is not None:
                dweight.add(dyr * xhat)  # eq. (11)
            if bias_arr is not None:
                dbias.add(dyr)
    return LayerNormGrads(
        into_out(dx, out, x.shape),
        _grad_out(dweight.value(), weight_arr, shape),
        _grad_out(dbias.value(), bias_arr, shape),
    )


def layer_norm_backward_staged(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = DEFAULT_EPS,
    *,
    mean: Any = None,
    rstd: Any = None,
) -> LayerNormGrads:
    """LayerNorm backward, one line per forward node, reversed (teaching version; no scaling).

    Compared with RMSNorm's staged backward there are two more nodes (mu and xc = x − mu) and so
    two ``+=``: x feeds both mu and xc, and xc feeds both xc² and xhat.
    """
    del mean, rstd  # recomputed below, node by node
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=DEFAULT_EPS,
                others={"dy": dy})
    x_in, shape, eps, n = a.x, a.shape, a.eps, a.n
    dy_in, weight_in, bias_in = a.others["dy"], a.weight, a.bias
    ctype = compute_dtype(x_in, dy_in, weight_in)
    x = a.rows.astype(ctype)  # (M, N)
    dy = dy_in.reshape(-1, n).astype(ctype)  # (M, N)
    w = param_as_row(weight_in, ctype)

    with np.errstate(all="ignore"):
        # forward, one node per line
        mu = np.sum(x, axis=-1, keepdims=True) / n  # (M, 1)  node 1, eq. (1)
        xc = x - mu  # (M, N)  node 2, eq. (2)
        xc2 = xc * xc  # (M, N)  node 3
        var = np.sum(xc2, axis=-1, keepdims=True) / n  # (M, 1)  node 4, eq. (3)
        v = var + eps  # (M, 1)  node 5
        std = np.sqrt(v)  # (M, 1)  node 6
        rstd_ = 1.0 / std  # (M, 1)  node 7, eq. (4)
        xhat = xc * rstd_  # (M, N)  node 8, eq. (5)
        wt = np.ones((1, n), ctype) if w is None else w  # (1, N)
        # node 9: y = xhat * wt + b

        # backward, nodes reversed
        dxhat = dy * wt  # (M, N)  node 9 -> xhat, eq. (7)
        dweight = np.sum(dy * xhat, axis=0)  # (N,)  node 9 -> w
        dbias = np.sum(dy, axis=0)  # (N,)  node 9 -> b
        dxc = dxhat * rstd_  # (M, N)  node 8 -> xc, first path
        drstd = np.sum(dxhat * xc, axis=-1, keepdims=True)  # (M, 1)  node 8 -> rstd
        dstd = -drstd / (std * std)  # (M, 1)  node 7
        dv = dstd / (2.0 * std)  # (M, 1)  node 6
        dvar = dv  # (M, 1)  node 5
        dxc2 = np.broadcast_to(dvar / n, xc2.shape)  # (M, N)  node 4
        dxc += 2.0 * xc * dxc2  # (M, N)  node 3 -> xc, second path (+=)
        dx = dxc.copy()  # (M, N)  node 2 -> x, first path
        dmu = -np.sum(dxc, axis=-1, keepdims=True)  # (M, 1)  node 2 -> mu
        dx += dmu / n  # (M, N)  node 1 -> x, second path (+=)

    return LayerNormGrads(
        round_to(dx, result_dtype(x_in.dtype, ctype)).reshape(x_in.shape),
        _grad_out(dweight, weight_in, shape),
        _grad_out(dbias, bias_in, shape),
    )


def layer_norm_jvp(
    x: Any,
    dx_tan: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = DEFAULT_EPS,
    *,
    dweight_tan: Any = None,
    dbias_tan: Any = None,
) -> np.ndarray:
    """Forward-mode derivative.

    ``dy_t = w ⊙ rstd·(t − mean(t) − xhat·mean(xhat⊙t)) + xhat ⊙ dweight_t + dbias_t``.
    """
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=DEFAULT_EPS,
                others={"dx_tan": dx_tan})
    x, shape, xrows, eps, m, n, t = a.x, a.shape, a.rows, a.eps, a.m, a.n, a.others["dx_tan"]
    dw_t = check_param(dweight_tan, "dweight_tan", shape)
    db_t = check_param(dbias_tan, "dbias_tan", shape)
    ctype = compute_dtype(x, t, a.weight, dw_t, db_t)  # complex if any of them is
    wt = _scale_offset(param_as_row(a.weight, ctype), 0.0, n, ctype)
    dw_t, db_t = param_as_row(dw_t, ctype), param_as_row(db_t, ctype)  # (1, N)
    trows = t.reshape(m, n)

    dy_t = np.empty((m, n), result_dtype(x.dtype, ctype))
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            xhat, _, rstd = _ln_stats_rows(xrows[rows].astype(ctype), eps)
            tr = trows[rows].astype(ctype)
            tc = tr - np.mean(tr, axis=-1, keepdims=True)  # tangent of xc
            s = np.mean(xhat * tc, axis=-1, keepdims=True)  # (m, 1)
            out = rstd * (tc - xhat * s) * wt  # (m, N)
            if dw_t is not None:
                out += xhat * dw_t
            if db_t is not None:
                out += db_t
            dy_t[rows] = round_to(out, dy_t.dtype)
    return dy_t.reshape(x.shape)


class LayerNorm(NormModule):
    """A torch-like LayerNorm module on NumPy arrays (weight and bias, eps = 1e-5).

    Examples
    --------
    >>> import rmsref
    >>> ln = rmsref.LayerNorm(8)
    >>> ln, ln.num_parameters
    (LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True), 16)
    """

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float = DEFAULT_EPS,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, dtype=dtype)

    def forward(self, x: Any) -> np.ndarray:
        return layer_norm_forward(x, self.normalized_shape, self.weight, self.bias, self.eps)[0]

    def backward(self, dy: Any, x: Any) -> LayerNormGrads:
        return layer_norm_backward(dy, x, self.normalized_shape, self.weight, self.bias, self.eps)
