"""The error model: how far a *correct* low-precision RMSNorm may be from the exact answer.

An implementation is judged on its own (already rounded) inputs: the reference ``y``, ``dx``,
``dweight`` are the oracle's float64 values for exactly the x, weight and dy the implementation saw,
so what remains is the implementation's own rounding error. This module bounds it element by element
(derived in docs/tolerances.md). Symbols:

    u_t      unit roundoff of dtype t: fp64 2^-53, fp32 2^-24, fp16 2^-11, bf16 2^-8
    γ(n)     accumulation error of an n-term sum of non-negative terms (relative):
               deterministic   n·u_acc                      (Higham's γ_n, first order)
               probabilistic   λ·√n·u_acc, λ = 6            (rounding errors as independent,
                                                             mean-zero: Higham & Mary 2019)
             with n replaced by the effective depth of the reduction:
               sequential  n;  blocked (T lanes / blocks)  ceil(n/T) + ceil(log2 T);
               pairwise    ceil(log2 n)
    ρ        relative error of rstd:  ρ = ½·γ(N) + 3·u_acc   (the sum, + eps, rsqrt)

    y     |ŷ_i − y_i| ≤ (k_out·u_out + ½·γ(N) + 5·u_acc)·|y_i| + atol           (eq. y)
    dx    |dx̂_i − dx_i| ≤ (3ρ + γ(N) + c·u_acc + 2(k_out−1)·u_out)·M_i
                          + k_out·u_out·|dx_i| + atol                                (eq. dx)
            M_i = rstd·(|w_i g_i| + |x̂_i|·Σ_j |x̂_j w_j g_j| / N)
    dw    |dŵ_j − dw_j| ≤ (γ(rows) + ρ + 2·u_acc + 2(k_out−1)·u_out)·Σ_rows |g·x̂|_j
                          + k_out·u_out·|dw_j| + atol                                (eq. dw)

k_out is the number of roundings to the output dtype (1 for torch, 2 for the ``llama`` order that
rounds x̂ before multiplying by the weight). ``atol`` covers underflow: half the smallest subnormal
spacing of the output dtype per rounding (2^-25 for float16).

Why M_i and not |dx_i|: dx = rstd·(w·g − x̂·c) is a *difference*; when g is nearly parallel to x̂/w
the two terms cancel and dx is tiny while each term (and each term's rounding error) is not. A
correct fp32 pipeline then shows a "relative error" of 100 % or more on dx. M_i is the size of the
terms before they cancel, which is what rounding errors scale with (tests/test_tolerance.py shows
it on a cancelling case).

How loose this is (measured by tests/test_tolerance.py, run with -s to print; a float32 pipeline
with *sequential* float32 sums, Gaussian rows, one seed). Observed/bound for y:

    N                    64      1024    4096    65536
    fp32 probabilistic   0.09    0.08    0.05    0.09
    fp32 deterministic   0.07    0.015   0.005   0.002
    bf16, fp16           0.92 - 0.99 (one output rounding dominates; the bound is that rounding)

The fp32 error itself grew from 2u (N = 64) to 74u (N = 65536), like √N; the deterministic form is
then ~40x looser than the probabilistic one, which is why the probabilistic one is the default.
torch's F.rms_norm (vectorised, blocked sums) sits further below the bound than this pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rmsref._shapes import bfloat16

Quantity = Literal["y", "dx", "dweight"]
Reduction = Literal["sequential", "blocked", "pairwise"]
Form = Literal["probabilistic", "deterministic"]

#: λ of the probabilistic bound: rounding errors treated as independent mean-zero variables, the
#: sum of n of them exceeds λ·√n·u with probability below ~2·exp(-λ²/2) ≈ 3e-8 for λ = 6.
LAMBDA = 6.0
#: c in eq. (dx): the elementwise operations of the backward (products w·g, x̂·c, the difference,
#: the scaling by rstd, the cast of g to the accumulation dtype) each contribute at most one u_acc.
C_DX = 8.0

_UNIT_ROUNDOFF = {
    np.dtype(np.float64): 2.0**-53,
    np.dtype(np.float32): 2.0**-24,
    np.dtype(np.float16): 2.0**-11,
    bfloat16: 2.0**-8,
    np.dtype(np.complex128): 2.0**-53,
    np.dtype(np.complex64): 2.0**-24,
}


def unit_roundoff(dtype) -> float:
    """u = half the spacing of the dtype's numbers at 1: 2^-24 for float32, 2^-8 for bfloat16."""
    dt = np.dtype(dtype)
    try:
        return _UNIT_ROUNDOFF[dt]
    except KeyError:
        raise TypeError(f"no unit roundoff for dtype {dt}; expected one of float16, bfloat16, "
                        "float32, float64") from None


def underflow_atol(dtype) -> float:
    """Half the smallest subnormal of ``dtype``: the largest error one rounding makes near 0."""
    dt = np.dtype(dtype)
    if dt == bfloat16:
        return 2.0**-134
    if dt.kind == "c":
        dt = np.dtype(np.float32) if dt == np.complex64 else np.dtype(np.float64)
    return float(np.finfo(dt).smallest_subnormal) / 2.0


def accumulation_dtype(dtype) -> np.dtype:
    """What a conventional implementation accumulates in: float32 for half types, else itself."""
    dt = np.dtype(dtype)
    if dt in (np.dtype(np.float16), bfloat16):
        return np.dtype(np.float32)
    return dt


def effective_length(n: int, reduction: Reduction = "sequential", block: int = 32) -> int:
    """The depth of the error-accumulation chain of an ``n``-term sum.

    sequential: ``n``; blocked over ``block`` partial accumulators (SIMD lanes, threads) combined
    by a tree: ``ceil(n/block) + ceil(log2 block)``; pairwise: ``ceil(log2 n)``.
    """
    n = max(int(n), 1)
    if reduction == "sequential":
        return n
    if reduction == "blocked":
        t = max(int(block), 1)
        return math.ceil(n / t) + math.ceil(math.log2(t)) if t > 1 else n
    if reduction == "pairwise":
        return max(math.ceil(math.log2(n)), 1)
    raise ValueError(f"reduction must be 'sequential', 'blocked' or 'pairwise', got {reduction!r}")


def gamma_k(k: float, dtype=np.float64) -> float:
    """Higham's γ_k = k·u/(1 − k·u): the relative error of k roundings in ``dtype`` (inf once
    k·u reaches 1/2, where the first-order bound stops meaning anything)."""
    ku = float(k) * unit_roundoff(dtype)
    return ku / (1.0 - ku) if ku < 0.5 else float("inf")


def gamma_acc(
    n: int,
    acc_dtype=np.float32,
    *,
    reduction: Reduction = "sequential",
    block: int = 32,
    form: Form = "probabilistic",
    lam: float = LAMBDA,
) -> float:
    """γ(n): relative error bound of an n-term sum of non-negative terms in ``acc_dtype``.

    deterministic: m·u (first order of Higham's γ_m = m·u/(1 − m·u)); probabilistic: λ·√m·u,
    where m is :func:`effective_length`.
    """
    m = effective_length(n, reduction, block)
    if form == "deterministic":
        return gamma_k(m, acc_dtype)
    u = unit_roundoff(acc_dtype)
    if form == "probabilistic":
        return float(lam) * math.sqrt(m) * u
    raise ValueError(f"form must be 'probabilistic' or 'deterministic', got {form!r}")


@dataclass(frozen=True)
class ErrorModel:
    """The parameters of one bound: dtypes, N, rows, reduction and form (see module docstring).

    ``out_dtype``: the dtype results are rounded to; ``acc_dtype``: the dtype sums run in
    (default: float32 for half inputs, else the output dtype); ``k_out``: roundings to the output
    dtype (1 single, 2 double as in ``llama``).
    """

    out_dtype: np.dtype
    n: int
    rows: int = 1
    acc_dtype: np.dtype | None = None
    k_out: int = 1
    reduction: Reduction = "sequential"
    block: int = 32
    form: Form = "probabilistic"
    lam: float = LAMBDA

    @property
    def u_out(self) -> float:
        return unit_roundoff(self.out_dtype)

    @property
    def u_acc(self) -> float:
        return unit_roundoff(self._acc())

    def _acc(self) -> np.dtype:
        return np.dtype(self.acc_dtype) if self.acc_dtype is not None else accumulation_dtype(
            self.out_dtype)

    def gamma(self, n: int) -> float:
        return gamma_acc(n, self._acc(), reduction=self.reduction, block=self.block,
                         form=self.form, lam=self.lam)

    @property
    def rho(self) -> float:
        """Relative error of rstd: ½·γ(N) + 3·u_acc (sum, + eps, rsqrt)."""
        return 0.5 * self.gamma(self.n) + 3.0 * self.u_acc

    @property
    def atol(self) -> float:
        return self.k_out * underflow_atol(self.out_dtype)

    def y_rel(self) -> float:
        """The relative factor of eq. (y): k_out·u_out + ½·γ(N) + 5·u_acc."""
        return self.k_out * self.u_out + 0.5 * self.gamma(self.n) + 5.0 * self.u_acc

    def dx_rel(self) -> float:
        """The factor multiplying M_i in eq. (dx): 3ρ + γ(N) + c·u_acc (+ 2(k_out − 1)·u_out).

        With k_out > 1 the extra roundings of the forward happen in the output dtype, and
        autograd replays them backwards: dy·w is then rounded to the output dtype before it
        enters the float32 graph, an error of u_out on each of the two terms of M_i.
        """
        extra = 2.0 * (self.k_out - 1) * self.u_out
        return 3.0 * self.rho + self.gamma(self.n) + C_DX * self.u_acc + extra

    def dw_rel(self) -> float:
        """The factor multiplying Σ_rows |g·x̂| in eq. (dw): γ(rows) + ρ + 2·u_acc.

        Plus 2(k_out − 1)·u_out: with double rounding the sum runs over dy·R(x̂) (x̂ already
        rounded once), each product itself rounded to the output dtype (the ``llama`` graph).
        """
        extra = 2.0 * (self.k_out - 1) * self.u_out
        return self.gamma(self.rows) + self.rho + 2.0 * self.u_acc + extra


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).reshape(-1, n)


def bound_y(y: np.ndarray, model: ErrorModel) -> np.ndarray:
    """Per-element bound of eq. (y), from the exact output ``y`` (any shape)."""
    y = np.asarray(y, dtype=np.float64)
    return model.y_rel() * np.abs(y) + model.atol


def dx_magnitude(
    dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, weight: np.ndarray | None, n: int
) -> np.ndarray:
    """M_i = rstd·(|w_i g_i| + |x̂_i|·Σ_j |x̂_j w_j g_j| / N), shape of dy.

    The size of the two terms of dx = rstd·(w·g − x̂·c) before they cancel. ``rstd`` has one
    value per row (any shape with that many elements); ``weight`` is the effective scale
    (offset + w) or None.
    """
    g = _rows(dy, n)                                           # (M, N)
    xh = _rows(xhat, n)                                        # (M, N)
    r = np.asarray(rstd, dtype=np.float64).reshape(-1, 1)      # (M, 1)
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64).reshape(n)
    wg = np.abs(w * g)                                         # (M, N)  |w_i g_i|
    s = np.sum(np.abs(xh) * wg, axis=1, keepdims=True) / n     # (M, 1)  Σ_j|x̂_j w_j g_j|/N
    return (r * (wg + np.abs(xh) * s)).reshape(np.shape(dy))


def bound_dx(
    dx: np.ndarray,
    dy: np.ndarray,
    xhat: np.ndarray,
    rstd: np.ndarray,
    weight: np.ndarray | None,
    model: ErrorModel,
) -> np.ndarray:
    """Per-element bound of eq. (dx); ``dx`` is the exact gradient (for the output rounding)."""
    return bound_dx_of_magnitude(dx, dx_magnitude(dy, xhat, rstd, weight, model.n), model)


def bound_dx_of_magnitude(dx: np.ndarray, m: np.ndarray, model: ErrorModel) -> np.ndarray:
    """Eq. (dx) from the terms' size ``m`` (M_i, :func:`dx_magnitude`) and the exact ``dx``."""
    return model.dx_rel() * m + model.k_out * model.u_out * np.abs(
        np.asarray(dx, dtype=np.float64)) + model.atol


def bound_dweight(
    dweight: np.ndarray, dy: np.ndarray, xhat: np.ndarray, model: ErrorModel
) -> np.ndarray:
    """Per-element bound of eq. (dw), shape of ``dweight``: (γ(rows) + ρ + 2u)·Σ_rows |g·x̂|."""
    n = model.n
    s = np.sum(np.abs(_rows(dy, n) * _rows(xhat, n)), axis=0)   # (N,)  Σ_rows |g·x̂|
    dw = np.asarray(dweight, dtype=np.float64).reshape(n)
    b = model.dw_rel() * s + model.k_out * model.u_out * np.abs(dw) + model.atol
    return b.reshape(np.shape(dweight))


def bound(
    quantity: Quantity,
    *,
    out_dtype,
    n: int,
    y: np.ndarray | None = None,
    dx: np.ndarray | None = None,
    dweight: np.ndarray | None = None,
    dy: np.ndarray | None = None,
    xhat: np.ndarray | None = None,
    rstd: np.ndarray | None = None,
    weight: np.ndarray | None = None,
    rows: int = 1,
    acc_dtype=None,
    k_out: int = 1,
    reduction: Reduction = "sequential",
    block: int = 32,
    form: Form = "probabilistic",
    lam: float = LAMBDA,
) -> np.ndarray:
    """Per-element error bound for ``quantity`` (docs/tolerances.md), as a float64 array.

    Parameters
    ----------
    quantity : {"y", "dx", "dweight"}
        What is bounded. "y" needs ``y``; "dx" needs ``dx, dy, xhat, rstd`` (and ``weight`` when
        there is one); "dweight" needs ``dweight, dy, xhat``. All are exact (float64) values.
    out_dtype : dtype
        The dtype the implementation rounds its result to.
    n : int
        Features per row (N); ``rows``: number of rows (the length of the dweight sum).
    acc_dtype, k_out, reduction, block, form, lam
        See :class:`ErrorModel` and :func:`gamma_acc`.

    Returns
    -------
    numpy.ndarray
        The bound, same shape as the quantity.
    """
    model = ErrorModel(np.dtype(out_dtype), int(n), int(rows), acc_dtype, int(k_out), reduction,
                       int(block), form, float(lam))
    if quantity == "y":
        if y is None:
            raise ValueError("bound('y', ...) needs the exact y")
        return bound_y(y, model)
    if quantity == "dx":
        if dx is None or dy is None or xhat is None or rstd is None:
            raise ValueError("bound('dx', ...) needs dx, dy, xhat and rstd")
        return bound_dx(dx, dy, xhat, rstd, weight, model)
    if quantity == "dweight":
        if dweight is None or dy is None or xhat is None:
            raise ValueError("bound('dweight', ...) needs dweight, dy and xhat")
        return bound_dweight(dweight, dy, xhat, model)
    raise ValueError(f"quantity must be 'y', 'dx' or 'dweight', got {quantity!r}")


def abs_error(actual: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|actual − ref| in float64; NaN where both are NaN and equal infinities count as 0, a lone
    non-finite value as inf (it is never within a bound)."""
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.abs(a - r)
    same = (np.isnan(a) & np.isnan(r)) | (np.isinf(a) & np.isinf(r) & (a == r))
    e = np.where(same, 0.0, e)
    return np.where(np.isnan(e), np.inf, e)


def ulp(v: np.ndarray, dtype) -> np.ndarray:
    """Spacing of ``dtype``'s numbers at |v| (v float64): the size of one ulp there.

    At 0 it is the smallest subnormal (the distance from 0 to the next number); ±inf and NaN have
    no spacing of their own and get the ulp at 1, a finite placeholder, so that an error counted
    in ulps stays finite.
    """
    dt = np.dtype(dtype)
    a = np.abs(np.asarray(v, dtype=np.float64))
    if dt == bfloat16:
        p, emin = 8, -126
    elif dt == np.float16:
        p, emin = 11, -14
    elif dt == np.float32:
        p, emin = 24, -126
    else:
        p, emin = 53, -1022
    _, e = np.frexp(np.where(np.isfinite(a), a, 1.0))              # a = m·2^e, m in [0.5, 1)
    e = np.maximum(e.astype(np.float64) - 1.0, emin)               # floor(log2 |v|), >= emin
    e = np.where(a == 0, emin, e)                                  # 0: the subnormal spacing
    return np.exp2(e - (p - 1))
