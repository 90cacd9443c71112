r"""Unit-norm: x / sqrt(Σ x² + eps) ⊙ w, the "RoPE view" of RMSNorm.

The same math as RMSNorm with the *sum* of squares where RMSNorm has the *mean*, so that
RMSNorm(x; eps) = √N · UnitNorm(x; N·eps). For one row of N features:

Forward
    (1)  ss    = Σ_j x_j²                    sum of squares              (M, 1)
    (2)  rnorm = 1 / sqrt(ss + eps)          reciprocal norm             (M, 1)
    (3)  xhat  = x · rnorm                   unit vector (eps = 0)       (M, N)
    (4)  y     = xhat ⊙ w + b                                            (M, N)
Backward
    (5)  dxhat   = dy ⊙ w
    (6)  c       = Σ_j dxhat_j · xhat_j      the path through rnorm (no 1/N)
    (7)  dx      = rnorm · (dxhat − xhat · c)
    (8)  dweight = Σ_rows dy ⊙ xhat,   dbias = Σ_rows dy

The row kernels are RMSNorm's (``rmsref.rmsnorm``) with the divisor 1 in place of N; eps
defaults to 0 here, so a zero row gives NaN, as x / ‖x‖ does.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rmsref._module import NormModule
from rmsref._rounding import round_to
from rmsref._shapes import (
    ShapeLike,
    compute_dtype,
    param_as_row,
    prepare,
    result_dtype,
)
from rmsref.rmsnorm import _backward, _forward, _grad_out, _jvp

__all__ = [
    "UnitNorm",
    "UnitNormGrads",
    "unit_norm",
    "unit_norm_backward",
    "unit_norm_backward_staged",
    "unit_norm_forward",
    "unit_norm_jvp",
]


class UnitNormGrads(NamedTuple):
    """Gradients of unit-norm: ∂L/∂x, ∂L/∂weight, ∂L/∂bias (None where there is no parameter)."""

    dx: np.ndarray
    dweight: np.ndarray | None
    dbias: np.ndarray | None


def unit_norm(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float = 0.0,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``x / sqrt(sum(x**2) + eps) * weight`` over the trailing ``normalized_shape`` dims.

    ``out``: where to write y (x's shape and dtype exactly; as :func:`rmsref.rms_norm`).

    Examples
    --------
    >>> import numpy as np, rmsref
    >>> rmsref.unit_norm(np.array([3.0, 4.0]), 2)
    array([0.6, 0.8])
    """
    return unit_norm_forward(x, normalized_shape, weight, eps, out=out)[0]


def unit_norm_forward(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float = 0.0,
    *,
    bias: Any = None,
    out_dtype: Any = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm forward, eqs. (1)-(4): ``(y, rnorm)``, rnorm float64 with keepdims shape.
    ``out``: where to write y (as :func:`rmsref.rms_norm`)."""
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=0.0)
    return _forward(a, out_dtype, out, divisor=1)


def unit_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float = 0.0,
    *,
    rnorm: Any = None,
    bias: Any = None,
    out: np.ndarray | None = None,
) -> UnitNormGrads:
    """Unit-norm backward in closed form, eqs. (5)-(8); ``rnorm`` as saved by the forward.
    ``out``: where to write dx (as :func:`rmsref.rms_norm_backward`)."""
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=0.0,
                others={"dy": dy}, stats={"rnorm": rnorm})
    return UnitNormGrads(*_backward(a, "rnorm", out, divisor=1))


def unit_norm_backward_staged(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float = 0.0,
    *,
    rnorm: Any = None,
    bias: Any = None,
) -> UnitNormGrads:
    """Unit-norm backward, one line per forward node, reversed (teaching version; no scaling)."""
    del rnorm  # recomputed below, node by node
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=0.0,
                others={"dy": dy})
    x_in, shape, eps, n = a.x, a.shape, a.eps, a.n
    dy_in, weight_in, bias_in = a.others["dy"], a.weight, a.bias
    ctype = compute_dtype(x_in, dy_in, weight_in)
    x = a.rows.astype(ctype)  # (M, N)
    dy = dy_in.reshape(-1, n).astype(ctype)  # (M, N)
    w = param_as_row(weight_in, ctype)

    with np.errstate(all="ignore"):
        # forward, one node per line
        x2 = x * x  # (M, N)  node 1
        ss = np.sum(x2, axis=-1, keepdims=True)  # (M, 1)  node 2, eq. (1)
        v = ss + eps  # (M, 1)  node 3
        norm = np.sqrt(v)  # (M, 1)  node 4
        rnorm_ = 1.0 / norm  # (M, 1)  node 5, eq. (2)
        xhat = x * rnorm_  # (M, N)  node 6, eq. (3)
        wt = np.ones((1, n), ctype) if w is None else w  # (1, N)
        # node 7: y = xhat * wt + b

        # backward, nodes reversed
        dxhat = dy * wt  # (M, N)  node 7 -> xhat
        dweight = np.sum(dy * xhat, axis=0)  # (N,)  node 7 -> w
        dbias = np.sum(dy, axis=0)  # (N,)  node 7 -> b
        dx = dxhat * rnorm_  # (M, N)  node 6 -> x, the direct path
        drnorm = np.sum(dxhat * x, axis=-1, keepdims=True)  # (M, 1)  node 6 -> rnorm
        dnorm = -drnorm / (norm * norm)  # (M, 1)  node 5
        dv = dnorm / (2.0 * norm)  # (M, 1)  node 4
        dss = dv  # (M, 1)  node 3
        dx2 = np.broadcast_to(dss, x2.shape)  # (M, N)  node 2: d(sum)/dx2_j = 1
        dx += 2.0 * x * dx2  # (M, N)  node 1 -> x: += where x feeds two nodes

    return UnitNormGrads(
        round_to(dx, result_dtype(x_in.dtype, ctype)).reshape(x_in.shape),
        _grad_out(dweight, weight_in, shape),
        _grad_out(dbias, bias_in, shape),
    )


def unit_norm_jvp(
    x: Any,
    dx_tan: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float = 0.0,
    *,
    dweight_tan: Any = None,
    bias: Any = None,
    dbias_tan: Any = None,
) -> np.ndarray:
    """Forward-mode derivative: ``w ⊙ rnorm·(t − xhat·Σ xhat⊙t) + xhat ⊙ dweight_t + dbias_t``."""
    a = prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=0.0,
                others={"dx_tan": dx_tan})
    return _jvp(a, dweight_tan, dbias_tan, divisor=1)


class UnitNorm(NormModule):
    """A module computing :func:`unit_norm` with learnable weight (and optional bias).

    Examples
    --------
    >>> import rmsref
    >>> rmsref.UnitNorm(8)
    UnitNorm((8,), eps=0.0, elementwise_affine=True)
    """

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float = 0.0,
        elementwise_affine: bool = True,
        bias: bool = False,
        *,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, dtype=dtype)

    def forward(self, x: Any) -> np.ndarray:
        return unit_norm_forward(x, self.normalized_shape, self.weight, self.eps, bias=self.bias)[0]

    def backward(self, dy: Any, x: Any) -> UnitNormGrads:
        return unit_norm_backward(
            dy, x, self.normalized_shape, self.weight, self.eps, bias=self.bias
        )
