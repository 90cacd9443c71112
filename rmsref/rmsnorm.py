r"""RMSNorm: forward, analytic backward, forward mode and double backward, in float64 NumPy.

This is the file to read to learn how RMSNorm's backward pass is derived. For one row x of N
features (``normalized_shape`` flattened), weight w, optional bias b, and K = N features used for
the statistic (K = floor(N·p) for pRMSNorm, the "partial" RMSNorm of the original paper):

Forward
    (1)  ms   = (1/K) Σ_{j<K} x_j²                  mean of squares          (M, 1)
    (2)  rstd = 1 / sqrt(ms + eps)                   reciprocal RMS           (M, 1)
    (3)  xhat = x · rstd                             normalised input         (M, N)
    (4)  y    = xhat ⊙ (offset + w) + b              affine output            (M, N)

Backward (dX means ∂L/∂X). Let m_j = [j < K] mark the features that feed the statistic.
    (5)  dxhat   = dy ⊙ (offset + w)                                          (M, N)
    (6)  c       = (1/K) Σ_j dxhat_j · xhat_j        the path through rstd    (M, 1)
    (7)  dx      = rstd · (dxhat − m ⊙ xhat · c)     direct term − projection (M, N)
    (8)  dweight = Σ_rows dy ⊙ xhat                                           (N,)
    (9)  dbias   = Σ_rows dy                                                  (N,)

Equation (7) comes from the two paths by which x reaches y: directly in (3) (the term
rstd·dxhat) and through the statistic (1)-(2), since ∂rstd/∂x_j = −rstd³·m_j·x_j/K. With
eps = 0 and K = N, dx is orthogonal to x: the Jacobian rstd·(I − xhat·xhatᵀ/N) projects out
the radial direction, because scaling x does not change y.

Forward mode (JVP) along a tangent dx_t (and dweight_t, dbias_t):
    (10) s    = (1/K) Σ_{j<K} xhat_j · dx_t_j                                 (M, 1)
    (11) dy_t = (offset + w) ⊙ rstd · (dx_t − xhat · s) + xhat ⊙ dweight_t + dbias_t

Numerical policy: everything is computed in float64 (complex128 for complex inputs, so
that complex-step differentiation works: only ``x*x`` and ``np.sqrt``, never ``abs``); results are
rounded once to the output dtype; rows are scaled by powers of two so that squaring cannot
overflow or underflow (see ``rmsref._sumsq``); rows are processed in chunks so float64 temporaries
stay near 64 MiB whatever the input size.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rmsref import _sumsq
from rmsref._module import NormModule
from rmsref._rounding import round_to
from rmsref._shapes import (
    NormInputs,
    ShapeLike,
    check_out,
    check_param,
    compute_dtype,
    into_out,
    param_as_row,
    prepare,
    resolve_offset,
    resolve_out_dtype,
    resolve_rounding,
    result_dtype,
    rows_into,
    stat_shape,
)

__all__ = [
    "AddRMSNormGrads",
    "RMSNorm",
    "RMSNormDoubleGrads",
    "RMSNormGrads",
    "add_rms_norm",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_backward_staged",
    "rms_norm_double_backward",
    "rms_norm_forward",
    "rms_norm_jvp",
]


class RMSNormGrads(NamedTuple):
    """Gradients of RMSNorm: ∂L/∂x, ∂L/∂weight, ∂L/∂bias (None where there is no parameter)."""

    dx: np.ndarray
    dweight: np.ndarray | None
    dbias: np.ndarray | None


class RMSNormDoubleGrads(NamedTuple):
    """Second-order gradients: of a scalar of the backward's outputs w.r.t. x, weight, dy."""

    dx: np.ndarray
    dweight: np.ndarray | None
    ddy: np.ndarray


class AddRMSNormGrads(NamedTuple):
    """Gradients of the fused residual add + RMSNorm w.r.t. x, residual and weight."""

    dx: np.ndarray
    dresidual: np.ndarray
    dweight: np.ndarray | None


# --------------------------------------------------------------------------------------------
# Row kernels: (M, N) float64/complex128 rows in, float64 results out. The public functions
# below validate, flatten, chunk and round; these hold the math.
# --------------------------------------------------------------------------------------------


def _stats_rows(
    xr: np.ndarray, eps: float, k_feat: int, divisor: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """xhat (M, N) and rstd (M, 1) of rows ``xr``, overflow-safe. Eqs. (1)-(3).

    ``divisor`` replaces K in eq. (1): 1 turns the mean of squares into the sum of squares
    (unit-norm, :mod:`rmsref.unitnorm`).
    """
    divisor = k_feat if divisor is None else divisor
    # the scale comes from the K features that feed the statistic (pRMSNorm: not the rest)
    k = _sumsq.row_exponents(xr[:, :k_feat], eps) if _sumsq.needs_scaling(xr.dtype) else None
    xs = _sumsq.scale_rows(xr, k)  # (M, N)  x · 2^-k, exact
    ms = _sumsq.sum_of_squares(xs[:, :k_feat]) / divisor  # (M, 1)  eq. (1), scaled units
    denom = np.sqrt(ms + _sumsq.scale_eps(eps, k))  # (M, 1)  sqrt(ms + eps), scaled units
    xhat = xs / denom  # (M, N)  eq. (3): the scale cancels
    rstd = _sumsq.unscale(1.0 / denom, k, -1)  # (M, 1)  eq. (2)
    return xhat, rstd


def _dx_rows(
    dxhat: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, k_feat: int, divisor: int | None = None
) -> np.ndarray:
    """Eqs. (6)-(7): dx = rstd · (dxhat − m ⊙ xhat · c); ``divisor`` as in ``_stats_rows``."""
    divisor = k_feat if divisor is None else divisor
    c = np.sum(dxhat * xhat, axis=-1, keepdims=True) / divisor  # (M, 1)  eq. (6)
    proj = xhat * c  # (M, N)  the path through rstd
    if k_feat < xhat.shape[-1]:
        proj[:, k_feat:] = 0.0  # features past K do not feed the statistic (m_j = 0)
    return rstd * (dxhat - proj)  # (M, N)  eq. (7)


def _row_sum(a: np.ndarray) -> np.ndarray:
    """Sum over rows (axis 0) by pairwise halving: error ~log2(M)·u, not M·u as a running sum."""
    while a.shape[0] > 1:
        half = a.shape[0] // 2
        head = a[:half] + a[half : 2 * half]
        a = np.concatenate([head, a[2 * half :]]) if a.shape[0] % 2 else head
    return a[0] if a.shape[0] else np.zeros(a.shape[1:], a.dtype)


class _ColumnSum:
    """Compensated running sum of per-chunk column sums (TwoSum), for dweight and dbias.

    A column whose running sum is not finite (it overflowed, or met an inf or NaN term) is
    that sum, as plain IEEE addition gives it: there the error term holds inf − inf = NaN,
    which added back would turn an overflow to ±inf into NaN."""

    def __init__(self, n: int, dtype: np.dtype) -> None:
        self.total = np.zeros(n, dtype)
        self.err = np.zeros(n, dtype)

    def add(self, rows: np.ndarray) -> None:
        part = _row_sum(rows)
        s = self.total + part
        bb = s - self.total
        self.err += (self.total - (s - bb)) + (part - bb)  # TwoSum: exact rounding error of s
        self.total = s

    def value(self) -> np.ndarray:
        return np.where(np.isfinite(self.total), self.total + self.err, self.total)


def _scale_offset(weight: np.ndarray | None, offset: Any, n: int, ctype: np.dtype) -> np.ndarray:
    """The weight as used, (1, N): offset + w, or ones when there is no weight."""
    offset = resolve_offset(offset)
    if weight is None:
        return np.full((1, n), 1.0 + offset, ctype) if offset else np.ones((1, n), ctype)
    return weight + offset if offset else weight


def _grad_out(g: np.ndarray | None, like: np.ndarray | None, shape: tuple[int, ...]) -> Any:
    """A parameter gradient rounded to its parameter's dtype and shape (None without one)."""
    if like is None or g is None:
        return None
    return round_to(g, result_dtype(like.dtype, g.dtype)).reshape(shape)


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


def rms_norm(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """RMSNorm with ``torch.nn.functional.rms_norm`` semantics, computed in float64.

    Parameters
    ----------
    x : array_like
        Input of any leading shape whose trailing dims are ``normalized_shape``. float16,
        bfloat16 (ml_dtypes), float32, float64, complex64 or complex128. The same rules hold
        for every array argument of every function and backend: other dtypes (integers, bool)
        are a ``TypeError`` naming the argument; masked arrays (``numpy.ma``) are refused with a
        ``TypeError`` (a norm over a row with holes has no single meaning: pass
        ``x.filled(value)`` or ``x.data``); ``numpy.matrix`` and other ndarray subclasses are
        used as the plain ndarray they hold; big-endian arrays are converted to native byte
        order (same values).
    normalized_shape : int or tuple of int
        The trailing dims that form one row (normalised together).
    weight : array_like, optional
        Per-feature scale of shape ``normalized_shape``.
    eps : float, optional
        Added to the mean of squares: a finite, non-negative real Python or NumPy scalar
        (bool, str, complex, arrays: ``TypeError``; NaN, ±inf, negative: ``ValueError``).
        ``None`` means ``finfo(float32).eps`` for float16, bfloat16 and float32 inputs and
        ``finfo(float64).eps`` for float64 (current PyTorch).
    out : numpy.ndarray, optional
        Where to write the result: a plain ``numpy.ndarray`` (not a matrix or masked array) of
        x's shape and the result's dtype exactly, writeable, not overlapping any input (every
        backend takes it; the Numba kernels then skip allocating and first-touching a new
        output, which is most of a call's overhead on large inputs).

    Returns
    -------
    numpy.ndarray
        ``x / sqrt(mean(x**2) + eps) * weight``, rounded once to the dtype of ``x`` (``out``
        when given).

    Examples
    --------
    >>> import numpy as np, rmsref
    >>> rmsref.rms_norm(np.array([1.0, 2.0, 3.0, 4.0]), 4, eps=1e-5).round(4)
    array([0.3651, 0.7303, 1.0954, 1.4606])
    """
    return rms_norm_forward(x, normalized_shape, weight, eps, out=out)[0]


def rms_norm_forward(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
    out_dtype: Any = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm forward, returning what the backward needs: ``(y, rstd)``.

    Only rstd, O(rows), is saved for the backward; x̂ (O(rows·N)) is recomputed there from x.
    That is the memory/compute trade every kernel makes.

    Parameters
    ----------
    x, normalized_shape, weight, eps
        As in :func:`rms_norm`.
    bias : array_like, optional
        Per-feature shift of shape ``normalized_shape`` (flash-attn, Equinox).
    offset : float, default 0.0
        The weight is used as ``offset + weight`` (Gemma's zero-centred weight uses 1.0). A
        finite real Python or NumPy scalar, else an error naming ``offset``.
    partial : float in (0, 1], optional
        pRMSNorm: the RMS is estimated from the first ``floor(N * partial)`` features of each
        row (in flattened order); all features are normalised.
    out_dtype : dtype, optional
        Dtype of ``y``; default the dtype of ``x``.
    out : numpy.ndarray, optional
        Where to write ``y`` (as in :func:`rms_norm`).

    Returns
    -------
    y : numpy.ndarray
        Same shape as ``x``, dtype ``out_dtype`` (default ``x.dtype``), rounded once; ``out``
        when given.
    rstd : numpy.ndarray
        ``1 / sqrt(ms + eps)`` per row, float64 (complex128 for complex ``x``), shape
        ``x.shape[:-k] + (1,) * k`` for ``k = len(normalized_shape)`` so that it broadcasts.
    """
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                partial=partial)
    return _forward(a, out_dtype, out)


def _forward(
    a: NormInputs, out_dtype: Any, out: np.ndarray | None, divisor: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. (1)-(4) on checked inputs: ``(y, rstd)``; ``divisor`` as in ``_stats_rows``."""
    x, shape, xrows, k_feat, m, n = a.x, a.shape, a.rows, a.k_feat, a.m, a.n
    ctype = compute_dtype(x, a.weight, a.bias)
    dtype = result_dtype(resolve_out_dtype(out_dtype, x), ctype)
    wt = _scale_offset(param_as_row(a.weight, ctype), a.offset, n, ctype)
    b = param_as_row(a.bias, ctype)
    out = check_out(out, x.shape, dtype, {"x": x, "weight": a.weight, "bias": a.bias})

    y = rows_into(out, m, n, dtype)  # (M, N)
    rstd = np.empty((m, 1), ctype)
    with np.errstate(all="ignore"):  # NaN/Inf rows propagate as PyTorch's do
        for rows in _sumsq.row_chunks(m, n):
            xhat, rstd[rows] = _stats_rows(xrows[rows].astype(ctype), a.eps, k_feat, divisor)
            yr = xhat * wt  # (m, N)  eq. (4)
            if b is not None:
                yr += b
            y[rows] = round_to(yr, dtype)
    return into_out(y, out, x.shape), rstd.reshape(stat_shape(x, shape))


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


def rms_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rstd: Any = None,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
    out: np.ndarray | None = None,
) -> RMSNormGrads:
    """RMSNorm backward in closed form, eqs. (5)-(9).

    Parameters
    ----------
    dy : array_like
        ∂L/∂y, same shape as ``x``.
    x, normalized_shape, weight, eps, bias, offset, partial
        As in :func:`rms_norm_forward`.
    rstd : array_like, optional
        The statistic saved by the forward (shape ``lead`` or ``lead + (1,)*k``; a real floating
        dtype, complex only for complex ``x``). When given it is used as is (as a kernel would
        use its own saved statistic); else it is recomputed. Errors name it (as ``mean`` and
        ``rnorm`` are named in the LayerNorm and unit-norm backwards).
    out : numpy.ndarray, optional
        Where to write ``dx`` (x's shape and dx's dtype; as in :func:`rms_norm`).

    Returns
    -------
    RMSNormGrads
        ``(dx, dweight, dbias)``: ``dx`` in ``x``'s dtype (``out`` when given); ``dweight`` /
        ``dbias`` in the parameter's dtype, or None when that parameter is None. Gradients are
        returned, never accumulated.
    """
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                partial=partial, others={"dy": dy}, stats={"rstd": rstd})
    return RMSNormGrads(*_backward(a, "rstd", out))


def _backward(
    a: NormInputs, stat: str, out: np.ndarray | None, divisor: int | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Eqs. (5)-(9) on checked inputs: ``(dx, dweight, dbias)``; ``stat`` names the saved
    statistic in ``a.stats``; ``divisor`` as in ``_stats_rows``."""
    x, shape, xrows, k_feat, m, n, eps = a.x, a.shape, a.rows, a.k_feat, a.m, a.n, a.eps
    dy_arr, weight_arr, bias_arr = a.others["dy"], a.weight, a.bias  # the bias enters no result
    ctype = compute_dtype(x, dy_arr, weight_arr)
    wt = _scale_offset(param_as_row(weight_arr, ctype), a.offset, n, ctype)
    saved = a.stats[stat]
    dyrows = dy_arr.reshape(m, n)
    dx_dtype = result_dtype(x.dtype, ctype)
    out = check_out(out, x.shape, dx_dtype, {"dy": dy_arr, "x": x, "weight": weight_arr,
                                             stat: saved})

    dx = rows_into(out, m, n, dx_dtype)  # (M, N)
    dweight = _ColumnSum(n, ctype)
    dbias = _ColumnSum(n, ctype)
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            xr = xrows[rows].astype(ctype)
            if saved is None:
                xhat, rstd_r = _stats_rows(xr, eps, k_feat, divisor)
            else:
                rstd_r = saved[rows].astype(ctype)
                xhat = xr * rstd_r  # eq. (3) with the kernel's own statistic
            dyr = dyrows[rows].astype(ctype)
            dxhat = dyr * wt  # (m, N)  eq. (5)
            dx[rows] = round_to(_dx_rows(dxhat, xhat, rstd_r, k_feat, divisor),  # eqs. (6)-(7)
                                dx.dtype)
            if weight_arr is not None:
                dweight.add(dyr * xhat)  # eq. (8)
            if bias_arr is not None:
                dbias.add(dyr)  # eq. (9)
    return (into_out(dx, out, x.shape), _grad_out(dweight.value(), weight_arr, shape),
            _grad_out(dbias.value(), bias_arr, shape))


def rms_norm_backward_staged(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rstd: Any = None,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
) -> RMSNormGrads:
    """RMSNorm backward, one line per node of the forward graph, reversed (the teaching version).

    Each backward line sits under the chain rule of the forward node it undoes; ``+=`` marks where
    x feeds two nodes (``x * x`` and ``x * rstd``), so its gradient is the sum of both paths. It
    agrees with :func:`rms_norm_backward` to ~1e-15 but is written for reading, not for speed or
    overflow safety (no row scaling, no chunking). ``rstd`` is accepted for signature parity and
    ignored: every intermediate is recomputed here.
    """
    del rstd  # recomputed below, node by node
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                partial=partial, others={"dy": dy})  # the bias is validated; b only shifts y
    x_in, shape, eps, n, k_feat = a.x, a.shape, a.eps, a.n, a.k_feat
    dy_in, weight_in, bias_in = a.others["dy"], a.weight, a.bias
    ctype = compute_dtype(x_in, dy_in, weight_in)
    x = a.rows.astype(ctype)  # (M, N)
    dy = dy_in.reshape(-1, n).astype(ctype)  # (M, N)
    w = param_as_row(weight_in, ctype)  # (1, N) or None

    with np.errstate(all="ignore"):
        # forward, one node per line
        x2 = x * x  # (M, N)  node 1
        ms = np.sum(x2[:, :k_feat], axis=-1, keepdims=True) / k_feat  # (M, 1)  node 2, eq. (1)
        v = ms + eps  # (M, 1)  node 3
        std = np.sqrt(v)  # (M, 1)  node 4
        rstd_ = 1.0 / std  # (M, 1)  node 5, eq. (2)
        xhat = x * rstd_  # (M, N)  node 6, eq. (3)
        wt = (np.ones((1, n), ctype) if w is None else w) + a.offset  # (1, N)  node 7
        # node 8: y = xhat * wt + b

        # backward, nodes reversed
        dxhat = dy * wt  # (M, N)  node 8 -> xhat, eq. (5)
        # node 8 -> wt, eq. (8); node 7 passes it on unchanged: d(offset + w)/dw = 1
        dweight = np.sum(dy * xhat, axis=0)  # (N,)
        dbias = np.sum(dy, axis=0)  # (N,)  node 8 -> b, eq. (9)
        dx = dxhat * rstd_  # (M, N)  node 6 -> x: the direct path
        drstd = np.sum(dxhat * x, axis=-1, keepdims=True)  # (M, 1)  node 6 -> rstd
        dstd = -drstd / (std * std)  # (M, 1)  node 5: d(1/s)/ds = -1/s^2
        dv = dstd / (2.0 * std)  # (M, 1)  node 4: d sqrt(v)/dv = 1/(2 sqrt(v))
        dms = dv  # (M, 1)  node 3: d(ms + eps)/dms = 1
        dx2 = np.zeros_like(x2)  # (M, N)  node 2: ms averages the first K squares
        dx2[:, :k_feat] = dms / k_feat
        dx += 2.0 * x * dx2  # (M, N)  node 1 -> x, the second path: += where x feeds two nodes

    return RMSNormGrads(
        round_to(dx, result_dtype(x_in.dtype, ctype)).reshape(x_in.shape),
        _grad_out(dweight, weight_in, shape),
        _grad_out(dbias, bias_in, shape),
    )


# --------------------------------------------------------------------------------------------
# Forward mode and second order
# --------------------------------------------------------------------------------------------


def rms_norm_jvp(
    x: Any,
    dx_tan: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    dweight_tan: Any = None,
    bias: Any = None,
    dbias_tan: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
) -> np.ndarray:
    """Forward-mode derivative of RMSNorm, eqs. (10)-(11): the directional derivative J·t.

    Parameters
    ----------
    x, normalized_shape, weight, eps, bias, offset, partial
        As in :func:`rms_norm_forward`.
    dx_tan : array_like
        Tangent of ``x`` (same shape).
    dweight_tan, dbias_tan : array_like, optional
        Tangents of the weight and bias (shape ``normalized_shape``); zero when omitted.

    Returns
    -------
    numpy.ndarray
        The tangent of ``y``, same shape as ``x``, in ``x``'s dtype.
    """
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                partial=partial, others={"dx_tan": dx_tan})
    return _jvp(a, dweight_tan, dbias_tan)


def _jvp(a: NormInputs, dweight_tan: Any, dbias_tan: Any, divisor: int | None = None
         ) -> np.ndarray:
    """Eqs. (10)-(11) on checked inputs; ``divisor`` as in ``_stats_rows``."""
    x, shape, xrows, eps, m, n, k_feat = a.x, a.shape, a.rows, a.eps, a.m, a.n, a.k_feat
    t = a.others["dx_tan"]
    divisor = k_feat if divisor is None else divisor
    dw_t = check_param(dweight_tan, "dweight_tan", shape)
    db_t = check_param(dbias_tan, "dbias_tan", shape)
    ctype = compute_dtype(x, t, a.weight, dw_t, db_t)
    wt = _scale_offset(param_as_row(a.weight, ctype), a.offset, n, ctype)
    dw_t, db_t = param_as_row(dw_t, ctype), param_as_row(db_t, ctype)  # (1, N) or None
    trows = t.reshape(m, n)

    dy_t = np.empty((m, n), result_dtype(x.dtype, ctype))
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            xhat, rstd = _stats_rows(xrows[rows].astype(ctype), eps, k_feat, divisor)
            tr = trows[rows].astype(ctype)
            s = np.sum(xhat[:, :k_feat] * tr[:, :k_feat], axis=-1, keepdims=True) / divisor  # (10)
            dxhat_t = rstd * (tr - xhat * s)  # (m, N)  tangent of xhat
            out = dxhat_t * wt  # (m, N)  eq. (11)
            if dw_t is not None:
                out += xhat * dw_t
            if db_t is not None:
                out += db_t
            dy_t[rows] = round_to(out, dy_t.dtype)
    return dy_t.reshape(x.shape)


def rms_norm_double_backward(
    ddx: Any,
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    ddweight: Any = None,
    ddbias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
) -> RMSNormDoubleGrads:
    r"""The VJP of :func:`rms_norm_backward`: second-order gradients.

    The backward maps (x, weight, dy) to (dx, dweight, dbias). Given cotangents ``ddx``,
    ``ddweight``, ``ddbias`` of those outputs, that is a scalar
    L₂ = ⟨ddx, dx⟩ + ⟨ddweight, dweight⟩ + ⟨ddbias, dbias⟩, this returns ∂L₂/∂x, ∂L₂/∂weight and
    ∂L₂/∂dy (what autograd computes for a Hessian-vector product or a gradient penalty).

    Per row, with r = rstd, g = dxhat = dy ⊙ (offset + w), c as in eq. (6), m_j = [j < K] and::

        a = (1/K) Σ_j m_j·ddx_j·xhat_j,   P = Σ_j ddx_j·g_j,   Q = Σ_j ddweight_j·dy_j·xhat_j,

    L₂ per row is r·P − r³·A·B/K + Q (A = K·a/r, B = K·c/r), and differentiating it gives
    (derivation in docs/derivation/rmsnorm.md)::

        (12) ∂L₂/∂dy_j = (offset + w_j) · r · (ddx_j − xhat_j·a) + ddweight_j·xhat_j + ddbias_j
        (13) ∂L₂/∂w_j  = Σ_rows dy_j · r · (ddx_j − xhat_j·a)
        (14) ∂L₂/∂x_l  = −r² m_l xhat_l (P + Q/r)/K + 3 r² m_l xhat_l a c
                         − r² (m_l ddx_l c + a g_l) + r ddweight_l dy_l

    Not overflow-safe (no row scaling): meant for moderate inputs, such as a gradient check.

    Parameters
    ----------
    ddx : array_like
        Cotangent of the backward's ``dx`` (shape of ``x``).
    dy, x, normalized_shape, weight, eps, offset, partial
        As in :func:`rms_norm_backward`.
    ddweight, ddbias : array_like, optional
        Cotangents of ``dweight`` and ``dbias`` (shape ``normalized_shape``); zero when omitted.

    Returns
    -------
    RMSNormDoubleGrads
        ``(dx, dweight, ddy)`` in the dtypes of ``x``, ``weight`` (None without weight), ``dy``.
    """
    a = prepare(x, normalized_shape, weight=weight, eps=eps, offset=offset, partial=partial,
                others={"dy": dy, "ddx": ddx})
    x_in, shape, xrows, eps, m, n, k_feat = a.x, a.shape, a.rows, a.eps, a.m, a.n, a.k_feat
    dy_in, ddx_in, weight_in = a.others["dy"], a.others["ddx"], a.weight
    ddw = check_param(ddweight, "ddweight", shape)
    ddb = check_param(ddbias, "ddbias", shape)
    ctype = compute_dtype(x_in, dy_in, ddx_in, weight_in, ddw, ddb)
    wt = _scale_offset(param_as_row(weight_in, ctype), a.offset, n, ctype)
    ddw, ddb = param_as_row(ddw, ctype), param_as_row(ddb, ctype)  # (1, N) or None
    mask = np.zeros((1, n), ctype)
    mask[:, :k_feat] = 1.0

    with np.errstate(all="ignore"):
        xhat, r = _stats_rows(xrows.astype(ctype), eps, k_feat)  # (M, N), (M, 1)
        dyr = dy_in.reshape(m, n).astype(ctype)  # (M, N)
        ddxr = ddx_in.reshape(m, n).astype(ctype)  # (M, N)
        g = dyr * wt  # (M, N)  eq. (5)
        c = np.sum(g * xhat, axis=-1, keepdims=True) / k_feat  # (M, 1)  eq. (6)
        a = np.sum(mask * ddxr * xhat, axis=-1, keepdims=True) / k_feat  # (M, 1)
        p = np.sum(ddxr * g, axis=-1, keepdims=True)  # (M, 1)
        q = np.zeros_like(p) if ddw is None else np.sum(ddw * dyr * xhat, axis=-1, keepdims=True)
        dg = r * (ddxr - xhat * a)  # (M, N)  ∂L₂/∂g
        ddy = dg * wt  # (M, N)  eq. (12)
        if ddw is not None:
            ddy = ddy + ddw * xhat
        if ddb is not None:
            ddy = ddy + ddb
        dweight = _row_sum(dyr * dg)  # (N,)  eq. (13)
        dx = (  # (M, N)  eq. (14)
            -r * r * mask * xhat * (p + q / r) / k_feat
            + 3.0 * r * r * mask * xhat * a * c
            - r * r * (mask * ddxr * c + a * g)
        )
        if ddw is not None:
            dx = dx + r * ddw * dyr
    return RMSNormDoubleGrads(
        round_to(dx, result_dtype(x_in.dtype, ctype)).reshape(x_in.shape),
        _grad_out(dweight, weight_in, shape),
        round_to(ddy, result_dtype(dy_in.dtype, ctype)).reshape(x_in.shape),
    )


# --------------------------------------------------------------------------------------------
# Fused residual add + RMSNorm
# --------------------------------------------------------------------------------------------


def _residual_sum(
    x: np.ndarray, residual: np.ndarray, rounding: str, ctype: np.dtype
) -> np.ndarray:
    """h = x + residual, in the compute dtype; rounded to x's dtype first for "rounded-sum"."""
    resolve_rounding(rounding)
    h = x.astype(ctype) + residual.astype(ctype)
    if rounding == "rounded-sum":
        h = round_to(h, x.dtype).astype(ctype)
    return h


def _prepare_residual(x: Any, residual: Any, normalized_shape: ShapeLike, rounding: Any,
                      **kwargs: Any) -> NormInputs:
    """The checked arguments of a fused call (``residual`` and any ``others`` x-shaped)."""
    resolve_rounding(rounding)
    others = {"residual": residual, **kwargs.pop("others", {})}
    return prepare(x, normalized_shape, others=others, **kwargs)


def add_rms_norm(
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    offset: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Fused residual add + RMSNorm as inference engines run it: ``(y, new_residual)``.

    ``h = x + residual``; ``new_residual`` is h rounded to the residual's dtype, ``y`` is RMSNorm
    of h rounded to x's dtype. The two meanings real systems use (docs/semantics.md):

    - ``"fp32-sum"`` (flash-attn, quack, vLLM native): normalise the unrounded sum; only the
      stored residual is rounded.
    - ``"rounded-sum"`` (HF eager, Liger fused-add, llm.c): round x + residual to x's dtype first,
      then normalise that.
    """
    y, new_residual, _ = add_rms_norm_forward(
        x, residual, normalized_shape, weight, eps, rounding=rounding, offset=offset
    )
    return y, new_residual


def add_rms_norm_forward(
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    offset: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`add_rms_norm` that also returns rstd: ``(y, new_residual, rstd)``."""
    a = _prepare_residual(x, residual, normalized_shape, rounding, weight=weight, eps=eps,
                          offset=offset)
    x_arr, shape, xrows, m, n, eps = a.x, a.shape, a.rows, a.m, a.n, a.eps
    res = a.others["residual"]
    rrows = res.reshape(xrows.shape)
    ctype = compute_dtype(x_arr, res, a.weight)
    wt = _scale_offset(param_as_row(a.weight, ctype), a.offset, n, ctype)

    y = np.empty((m, n), result_dtype(x_arr.dtype, ctype))
    new_res = np.empty((m, n), result_dtype(res.dtype, ctype))
    rstd = np.empty((m, 1), ctype)
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            h = _residual_sum(xrows[rows], rrows[rows], rounding, ctype)
            new_res[rows] = round_to(h, new_res.dtype)
            xhat, rstd[rows] = _stats_rows(h, eps, n)
            y[rows] = round_to(xhat * wt, y.dtype)
    return (
        y.reshape(x_arr.shape),
        new_res.reshape(x_arr.shape),
        rstd.reshape(stat_shape(x_arr, shape)),
    )


def add_rms_norm_backward(
    dy: Any,
    dresidual_out: Any,
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    rstd: Any = None,
    offset: float = 0.0,
) -> AddRMSNormGrads:
    """Backward of :func:`add_rms_norm`: h = x + residual feeds both y and new_residual, so
    ``dh = dx_RMSNorm(dy) + dresidual_out`` and ``dx = dresidual = dh``. The "rounded-sum"
    rounding is treated as the identity (its derivative almost everywhere).

    ``dresidual_out`` (∂L/∂new_residual) may be None (the residual stream is not used later).
    """
    others = {"dy": dy} if dresidual_out is None else {"dy": dy, "dresidual_out": dresidual_out}
    a = _prepare_residual(x, residual, normalized_shape, rounding, weight=weight, eps=eps,
                          offset=offset, others=others, stats={"rstd": rstd})
    x_arr, shape, xrows, m, n, eps = a.x, a.shape, a.rows, a.m, a.n, a.eps
    res = a.others["residual"]
    rrows = res.reshape(xrows.shape)
    dy_arr, dres_out, weight_arr = a.others["dy"], a.others.get("dresidual_out"), a.weight
    ctype = compute_dtype(x_arr, res, dy_arr, dres_out, weight_arr)
    wt = _scale_offset(param_as_row(weight_arr, ctype), a.offset, n, ctype)
    saved = a.stats["rstd"]
    dyrows = dy_arr.reshape(m, n)

    dx = np.empty((m, n), result_dtype(x_arr.dtype, ctype))
    dresidual = np.empty((m, n), result_dtype(res.dtype, ctype))
    dweight = _ColumnSum(n, ctype)
    with np.errstate(all="ignore"):
        for rows in _sumsq.row_chunks(m, n):
            h = _residual_sum(xrows[rows], rrows[rows], rounding, ctype)
            if saved is None:
                xhat, rstd_r = _stats_rows(h, eps, n)
            else:
                rstd_r = saved[rows].astype(ctype)
                xhat = h * rstd_r
            dyr = dyrows[rows].astype(ctype)
            dh = _dx_rows(dyr * wt, xhat, rstd_r, n)  # eqs. (5)-(7) on h
            if dres_out is not None:
                dh += dres_out.reshape(m, n)[rows].astype(ctype)  # h also feeds new_residual
            dx[rows] = round_to(dh, dx.dtype)
            dresidual[rows] = round_to(dh, dresidual.dtype)
            if weight_arr is not None:
                dweight.add(dyr * xhat)  # eq. (8)
    return AddRMSNormGrads(
        dx.reshape(x_arr.shape),
        dresidual.reshape(x_arr.shape),
        _grad_out(dweight.value(), weight_arr, shape),
    )


# --------------------------------------------------------------------------------------------
# The module class
# --------------------------------------------------------------------------------------------


class RMSNorm(NormModule):
    """A torch-like RMSNorm module on NumPy arrays (``torch.nn.RMSNorm`` semantics).

    Parameters
    ----------
    normalized_shape : int or tuple of int
        Trailing dims normalised together.
    eps : float, optional
        As in :func:`rms_norm` (``None``: the opmath dtype's machine epsilon).
    elementwise_affine : bool, default True
        Learn a per-feature weight (initialised to ones, or zeros when ``offset`` is set so
        that ``offset + weight`` starts at 1).
    bias : bool, default False
        Also learn a per-feature bias (initialised to zeros).
    dtype : dtype, default float32
        Dtype of the parameters (torch's default).
    offset : float, default 0.0
        Weight used as ``offset + weight`` (Gemma: 1.0).

    Examples
    --------
    >>> import numpy as np, rmsref
    >>> m = rmsref.RMSNorm(4)
    >>> m
    RMSNorm((4,), eps=None, elementwise_affine=True)
    >>> m(np.array([[1.0, 2.0, 3.0, 4.0]])).round(4)
    array([[0.3651, 0.7303, 1.0954, 1.4606]])
    """

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float | None = None,
        elementwise_affine: bool = True,
        bias: bool = False,
        *,
        dtype: Any = np.float32,
        offset: float = 0.0,
    ) -> None:
        super().__init__(
            normalized_shape, eps, elementwise_affine, bias, dtype=dtype, offset=offset
        )

    def forward(self, x: Any) -> np.ndarray:
        """``rms_norm_forward(x, ...)[0]`` with this module's parameters."""
        return rms_norm_forward(
            x, self.normalized_shape, self.weight, self.eps, bias=self.bias, offset=self.offset
        )[0]

    def backward(self, dy: Any, x: Any) -> RMSNormGrads:
        """Gradients (dx, dweight, dbias) for upstream gradient ``dy`` at input ``x``."""
        return rms_norm_backward(
            dy, x, self.normalized_shape, self.weight, self.eps, bias=self.bias, offset=self.offset
        )
