"""Deliberately naive reference implementations: loops anyone can check by eye.

They check the vectorised oracle, which checks everything else. Rows are the flattened leading
dims, features the flattened normalised dims; every sum is a plain Python loop in float64.
"""

from __future__ import annotations

import math

import numpy as np


def _rows(x: np.ndarray, n: int) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1, n)


def rms_norm(x, n, weight=None, eps=0.0, bias=None, offset=0.0, k=None):
    """y[i, j] = x[i, j] / sqrt(mean_{l<k} x[i, l]^2 + eps) * (offset + w[j]) + b[j]."""
    k = n if k is None else k
    xr = _rows(x, n)
    y = np.zeros_like(xr)
    for i in range(xr.shape[0]):
        ms = 0.0
        for j in range(k):
            ms += xr[i, j] * xr[i, j]
        ms /= k
        rstd = 1.0 / math.sqrt(ms + eps)
        for j in range(n):
            w = 1.0 if weight is None else float(np.ravel(weight)[j])
            b = 0.0 if bias is None else float(np.ravel(bias)[j])
            y[i, j] = xr[i, j] * rstd * (offset + w) + b
    return y.reshape(np.shape(x))


def rms_norm_backward(dy, x, n, weight=None, eps=0.0, offset=0.0, k=None):
    """dx by the full Jacobian, J[j, l] = ∂y_j/∂x_l, then dx_l = Σ_j dy_j J[j, l]; dw by loops."""
    k = n if k is None else k
    xr, dyr = _rows(x, n), _rows(dy, n)
    dx = np.zeros_like(xr)
    dw = np.zeros(n)
    for i in range(xr.shape[0]):
        ms = sum(xr[i, j] ** 2 for j in range(k)) / k
        rstd = 1.0 / math.sqrt(ms + eps)
        for j in range(n):
            w = offset + (1.0 if weight is None else float(np.ravel(weight)[j]))
            dw[j] += dyr[i, j] * xr[i, j] * rstd
            for l in range(n):
                # ∂(x_j rstd)/∂x_l = δ_jl rstd + x_j ∂rstd/∂x_l, ∂rstd/∂x_l = -rstd^3 x_l / k [l<k]
                d_rstd = -(rstd**3) * xr[i, l] / k if l < k else 0.0
                jac = w * ((rstd if j == l else 0.0) + xr[i, j] * d_rstd)
                dx[i, l] += dyr[i, j] * jac
    return dx.reshape(np.shape(x)), dw


def layer_norm(x, n, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * w + b, biased variance, by loops."""
    xr = _rows(x, n)
    y = np.zeros_like(xr)
    for i in range(xr.shape[0]):
        mu = sum(xr[i, j] for j in range(n)) / n
        var = sum((xr[i, j] - mu) ** 2 for j in range(n)) / n
        for j in range(n):
            w = 1.0 if weight is None else float(np.ravel(weight)[j])
            b = 0.0 if bias is None else float(np.ravel(bias)[j])
            y[i, j] = (xr[i, j] - mu) / math.sqrt(var + eps) * w + b
    return y.reshape(np.shape(x))


def unit_norm(x, n, weight=None, eps=0.0):
    """y = x / sqrt(sum x^2 + eps) * w, by loops."""
    xr = _rows(x, n)
    y = np.zeros_like(xr)
    for i in range(xr.shape[0]):
        ss = sum(xr[i, j] ** 2 for j in range(n))
        for j in range(n):
            w = 1.0 if weight is None else float(np.ravel(weight)[j])
            y[i, j] = xr[i, j] / math.sqrt(ss + eps) * w
    return y.reshape(np.shape(x))
