"""An RMSNorm kernel written the way a float32 CUDA kernel is, in NumPy: upcast to float32,
reduce in float32, round once to the input dtype at the end. The example the README validates:

    python -m rmsref validate examples.float32_kernel:forward \\
        --backward examples.float32_kernel:backward --dtype float32 --dtype bfloat16

(run from the repository root: ``python -m`` puts the current directory on the import path).
"""

from __future__ import annotations

import numpy as np


def _axes(x: np.ndarray, normalized_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the normalised axes, the leading axes) of x."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    return tuple(range(x.ndim - k, x.ndim)), tuple(range(x.ndim - k))


def _rstd(xf: np.ndarray, axes: tuple[int, ...], eps) -> np.ndarray:
    """1/sqrt(mean(x²) + eps) in float32, eps defaulting to float32's machine epsilon."""
    eps = np.finfo(np.float32).eps if eps is None else eps
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(np.mean(xf * xf, axis=axes, keepdims=True) + np.float32(eps))


def forward(x, normalized_shape, weight=None, eps=None) -> np.ndarray:
    """y = x·rstd·w, computed in float32, rounded once to x's dtype."""
    x = np.asarray(x)
    axes, _ = _axes(x, normalized_shape)
    xf = x.astype(np.float32)
    with np.errstate(all="ignore"):  # inf and NaN inputs give inf and NaN, as on a GPU
        y = xf * _rstd(xf, axes, eps)
        if weight is not None:
            y = y * np.asarray(weight).astype(np.float32)
    return y.astype(x.dtype)


def backward(dy, x, normalized_shape, weight=None, eps=None):
    """(dx, dweight): dx = rstd·(dxhat − xhat·c), c = mean(dxhat·xhat), in float32."""
    x = np.asarray(x)
    axes, lead = _axes(x, normalized_shape)
    xf, g = x.astype(np.float32), np.asarray(dy).astype(np.float32)
    rstd = _rstd(xf, axes, eps)
    with np.errstate(all="ignore"):
        xhat = xf * rstd
        w = np.float32(1) if weight is None else np.asarray(weight).astype(np.float32)
        dxhat = g * w
        c = np.mean(dxhat * xhat, axis=axes, keepdims=True)
        dx = rstd * (dxhat - xhat * c)
        dw = None if weight is None else np.sum(g * xhat, axis=lead)
    return dx.astype(x.dtype), None if dw is None else dw.astype(np.asarray(weight).dtype)
