"""Compare a result with the oracle within the tolerance model's bound: the one place that does it.

Every verdict in rmsref (``validate``, ``assert_rms_norm_close``, ``rmsref check``) is this
comparison: the oracle computed in float64 on *the implementation's own* (already rounded)
inputs, the per-element bound of :mod:`rmsref.tolerance` for the quantity, and the worst
error/bound ratio::

    ref = Reference(x, normalized_shape, weight, eps, dy=dy)     # the oracle, computed lazily
    model = conventions.get("torch").error_model(x.dtype, ref.n, ref.rows)
    c = compare("dx", dx, ref, model)                            # c.ratio <= 1: within the bound

A kernel's other outputs and options go through the same engine: ``bias``, pRMSNorm's
``partial``, the saved ``rstd``, ``dbias``, and the fused residual add's backward
(``dresidual_out``; its forward is the norm of h = x + residual, so its reference is
``Reference(h, ...)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np

from rmsref import tolerance as tol

Quantity = Literal["y", "dx", "dweight", "rstd", "dbias"]


@dataclass
class Reference:
    """The oracle's y, rstd, x̂, dx and dweight (float64 rows) on the given inputs, each computed
    when first asked for.

    ``eps`` is the value the oracle uses (already resolved from the convention's default);
    ``offset`` is added to the weight (1 for the Gemma-style 1 + w); ``bias`` is added to y;
    ``partial`` is pRMSNorm's p (the statistic comes from the first K = floor(N·p) features);
    ``dresidual_out`` is the fused residual add's ∂L/∂new_residual: h = x + residual feeds both
    y and new_residual, so the gradient compared as "dx" is dh = dx_RMSNorm + dresidual_out.
    """

    x: np.ndarray
    normalized_shape: tuple[int, ...]
    weight: np.ndarray | None
    eps: float
    dy: np.ndarray | None = None
    offset: float = 0.0
    bias: np.ndarray | None = None
    partial: float | None = None
    dresidual_out: np.ndarray | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return int(np.prod(self.normalized_shape))

    @property
    def rows(self) -> int:
        return int(np.prod(np.shape(self.x)[: np.ndim(self.x) - len(self.normalized_shape)]))

    @property
    def k_feat(self) -> int:
        """K: the features the statistic is computed from (N unless ``partial``)."""
        return self.n if self.partial is None else int(np.floor(self.n * self.partial))

    def as_rows(self, a: Any) -> np.ndarray:
        """Any array of x's shape as float64 rows (rows, N)."""
        return np.asarray(a, dtype=np.float64).reshape(-1, self.n)

    @cached_property
    def _forward(self) -> tuple[np.ndarray, np.ndarray]:
        from rmsref.rmsnorm import rms_norm_forward

        y, rstd = rms_norm_forward(self._x64, self.normalized_shape, self._w64, self.eps,
                                   bias=self._b64, offset=self.offset, partial=self.partial,
                                   out_dtype=np.float64)
        return self.as_rows(y), np.asarray(rstd, np.float64).reshape(-1, 1)

    @cached_property
    def _backward(self):
        from rmsref.rmsnorm import rms_norm_backward

        if self.dy is None:
            raise ValueError("the reference of a gradient needs the dy the backward was given")
        return rms_norm_backward(np.asarray(self.dy, np.float64), self._x64, self.normalized_shape,
                                 self._w64, self.eps, bias=self._b64, offset=self.offset,
                                 partial=self.partial)

    @cached_property
    def _x64(self) -> np.ndarray:
        return np.asarray(self.x).astype(np.float64)

    @cached_property
    def _w64(self) -> np.ndarray | None:
        return None if self.weight is None else np.asarray(self.weight).astype(np.float64)

    @cached_property
    def _b64(self) -> np.ndarray | None:
        return None if self.bias is None else np.asarray(self.bias).astype(np.float64)

    @property
    def y(self) -> np.ndarray:
        """(rows, N) exact y."""
        return self._forward[0]

    @property
    def rstd(self) -> np.ndarray:
        """(rows, 1) exact rstd."""
        return self._forward[1]

    @cached_property
    def xhat(self) -> np.ndarray:
        """(rows, N) exact x̂ = x·rstd."""
        with np.errstate(invalid="ignore"):
            return self.as_rows(self._x64) * self.rstd

    @cached_property
    def w_eff(self) -> np.ndarray:
        """(N,) the scale the weight stands for: offset + w (ones when there is no weight)."""
        w = np.ones(self.n) if self._w64 is None else self._w64.reshape(self.n)
        return w + self.offset

    @property
    def dx_norm(self) -> np.ndarray:
        """(rows, N) exact dx of the norm alone."""
        return self.as_rows(self._backward.dx)

    @property
    def dx(self) -> np.ndarray:
        """(rows, N) exact dx (dh = dx_norm + dresidual_out for the fused residual add)."""
        if self.dresidual_out is None:
            return self.dx_norm
        return self.dx_norm + self.as_rows(self.dresidual_out)

    @property
    def dweight(self) -> np.ndarray:
        """(1, N) exact dweight."""
        return np.asarray(self._backward.dweight, np.float64).reshape(1, self.n)

    @property
    def dbias(self) -> np.ndarray:
        """(1, N) exact dbias = Σ_rows dy."""
        return np.sum(self.as_rows(self.dy), axis=0, keepdims=True)

    def exact(self, quantity: Quantity) -> np.ndarray:
        return {"y": lambda: self.y, "dx": lambda: self.dx, "dweight": lambda: self.dweight,
                "rstd": lambda: self.rstd, "dbias": lambda: self.dbias}[quantity]()

    def bound(self, quantity: Quantity, model: tol.ErrorModel) -> np.ndarray:
        """The tolerance model's per-element bound for ``quantity`` (the shape of its rows).

        ``model.n`` is N, the row length; the sums of squares behind rstd have K terms
        (``partial``), so y and rstd are bounded with γ(K).
        """
        stat_model = replace(model, n=self.k_feat)
        if quantity == "y":
            return self._bound_y(stat_model)
        if quantity == "rstd":
            # rstd kept in the accumulation dtype: its error ρ, then one rounding to that dtype
            return (stat_model.rho + stat_model.u_acc) * self.rstd
        dyrows = self.as_rows(self.dy)
        if quantity == "dx":
            return self._bound_dx(dyrows, model)
        if quantity == "dbias":  # the dweight column sum with x̂ = 1: Σ_rows dy alone
            return tol.bound_dweight(self.dbias.reshape(self.n), dyrows, np.ones_like(dyrows),
                                     model).reshape(1, self.n)
        return tol.bound_dweight(self.dweight.reshape(self.n), dyrows, self.xhat, model).reshape(
            1, self.n)

    def _bound_y(self, model: tol.ErrorModel) -> np.ndarray:
        if self.bias is None:
            return tol.bound_y(self.y, model)
        # y = x̂·w + b can cancel: the errors made before the output rounding scale with the
        # terms |x̂·w| + |b|, not with |y| (the reason for M_i in eq. dx)
        b = self._b64.reshape(1, self.n)
        terms = np.abs(self.y - b) + np.abs(b)
        before_rounding = 0.5 * model.gamma(model.n) + 5.0 * model.u_acc
        return model.k_out * model.u_out * np.abs(self.y) + before_rounding * terms + model.atol

    def _bound_dx(self, dyrows: np.ndarray, model: tol.ErrorModel) -> np.ndarray:
        b = tol.bound_dx(self.dx, dyrows, self.xhat, self.rstd, self.w_eff, model)
        if self.k_feat < self.n:
            # pRMSNorm: every feature reaches rstd through y, but c = Σ_j dx̂_j·x̂_j / K, so the
            # projection term is N/K times the one M_i measures (Σ/N)
            b = b * (self.n / self.k_feat)
        if self.dresidual_out is not None:
            b = b + model.u_acc * np.abs(self.dx)  # dh = dx_norm + dresidual_out, rounded once
        return b


@dataclass
class Comparison:
    """How far a result is from the oracle, element by element, against the bound."""

    quantity: str
    ratio: float = 0.0                   # max over elements of |error| / bound (<= 1: passes)
    worst: tuple[int, int] | None = None  # (row, column) of that element in the (rows, N) view
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: float = 0.0
    ratios: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    reference: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    bound: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)

    @property
    def passed(self) -> bool:
        return bool(self.ratio <= 1.0)


def _measure(c: Comparison, err: np.ndarray, out_dtype: Any) -> Comparison:
    """Fill ``c``'s figures from the (rows, N) errors and ratios."""
    exact, ratios = c.reference, c.ratios
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf: beyond count
        rel = np.where(err == 0, 0.0, err / np.abs(exact))
        ulps = np.where(err == 0, 0.0, err / tol.ulp(exact, out_dtype))
    if ratios.size:
        k = int(np.argmax(ratios))
        c.ratio = float(ratios.flat[k])
        c.worst = (int(k // ratios.shape[1]), int(k % ratios.shape[1]))
        c.max_abs = float(np.max(err))
        c.max_rel = float(np.max(np.where(np.isfinite(rel), rel, np.inf)))
        c.max_ulp = float(np.max(ulps))
    return c


def compare(quantity: Quantity, got: Any, ref: Reference, model: tol.ErrorModel, *,
            mask_rows: np.ndarray | None = None) -> Comparison:
    """``got`` (rows of the quantity, any shape with that many elements) against the oracle.

    ``mask_rows`` (bool per row) leaves rows out (rows whose input holds NaN/Inf may be anything).
    Errors are in float64: a NaN where the oracle has NaN is no error, a lone non-finite value is
    an infinite one (never within a bound).
    """
    exact = ref.exact(quantity)
    bound = ref.bound(quantity, model)
    actual = np.asarray(got, dtype=np.float64).reshape(exact.shape)
    err = tol.abs_error(actual, exact)
    if mask_rows is not None:
        err = np.where(mask_rows[:, None], err, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf: beyond count
        ratios = np.where(err == 0, 0.0, err / bound)
    c = Comparison(quantity, ratios=ratios, reference=exact, bound=bound)
    return _measure(c, err, model.out_dtype)


def compare_rounded(name: str, got: Any, exact: Any, dtype: Any, roundings: int = 1) -> Comparison:
    """``got`` against ``exact`` rounded at most ``roundings`` times to ``dtype``: a value that
    is only rounded, no norm computed (the fused add's new_residual is h itself, rounded).

    Each rounding errs by at most u·|v|, or half the smallest subnormal near zero.
    """
    exact = np.asarray(exact, dtype=np.float64)
    exact = exact.reshape(-1, exact.shape[-1] if exact.ndim else 1)
    actual = np.asarray(got, dtype=np.float64).reshape(exact.shape)
    bound = roundings * (tol.unit_roundoff(dtype) * np.abs(exact) + tol.underflow_atol(dtype))
    err = tol.abs_error(actual, exact)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf: beyond count
        ratios = np.where(err == 0, 0.0, err / bound)
    c = Comparison(name, ratios=ratios, reference=exact, bound=bound)
    return _measure(c, err, dtype)
