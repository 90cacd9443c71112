r"""Executable identities: what the literature says about RMSNorm, checked with a measured residual.

Each identity is a property of the *mathematics* (RMSNorm(αx) = RMSNorm(x), ⟨dx, x⟩ = 0 at eps = 0,
...). An implementation computes both sides in floating point, so the two sides differ by a
*residual*; the identity holds when the residual is within a *bound* derived from the error model
below. The ratio residual/bound is reported, not only pass/fail: a correct float64 implementation
shows ratios far below 1, a broken one (LayerNorm with ``ddof=1``, eps outside the square root, a
backward without its projection term) shows ratios of 1e10 and more on the float64 identities it
breaks (``tests/test_identities.py`` breaks each of these on purpose and checks that exactly the
right identities flag it). Usage::

    import rmsref
    results = rmsref.identities.run()                # all 14, on the NumPy oracle
    assert all(r.passed for r in results)
    for r in results:
        print(r.name, r.residual, r.bound, r.ratio, r.detail)
    rmsref.identities.run(["shift"], impl={"layer_norm_forward": my_layer_norm_forward})

The float64 error model (every bound is derived from it, never fitted)
-----------------------------------------------------------------------
u = 2⁻⁵³ is float64's unit roundoff and γ(k) = k·u / (1 − k·u) (Higham, *Accuracy and Stability
of Numerical Algorithms*, ch. 3). An implementation is assumed to compute in float64 with correctly
rounded +, −, ×, /, sqrt, so that a result obtained through k roundings carries a relative error of
at most γ(k) (Higham's Lemma 3.1), and a sum of n non-negative terms, *in any order*, has a relative
error of at most γ(n − 1) (Higham, ch. 4). Counting roundings along each data path gives:

    ms    = Σ x_j² / N           N + 2 roundings (squares, N − 1 additions, the division by N
                                 or a multiplication by a rounded 1/N)
    rstd  = 1/sqrt(ms + eps)     the sum with eps adds 1 (so N + 3); the square root halves a
                                 relative error and adds 1; the reciprocal adds 1; one more covers
                                 the second-order terms:     k_rstd(N) = ⌈(N + 3)/2⌉ + 3
    x̂     = x · rstd             k_xhat(N) = k_rstd(N) + 1
    y     = x̂ · w                k_y(N)    = k_rstd(N) + 2

For LayerNorm the mean carries an absolute error |δμ| ≤ γ(N + 1)·mean|x|. Since Σ(x − μ) = 0 it
enters the variance only squared: var̃ = (var + δμ²)(1 + θ) with |θ| ≤ γ(N + 3), so rstd has the
extra relative error η = ½·δμ²/(var + eps), computed per row (it matters only for rows whose mean
dwarfs their spread). The centred value x − μ̃ is off by |δμ| + u·|x − μ|, so the natural scale of
LayerNorm's x̂_i is a_i = |x̂_i| + rstd·mean|x|, and

    k_rstd_ln(N) = ⌈(N + 4)/2⌉ + 3,   k_xhat_ln(N) = (N + 1) + k_rstd_ln(N) + 2,
    k_y_ln(N) = k_xhat_ln(N) + 2  (× w, + b)                   relative to |w_i|·a_i + |b_i|.

The closed-form backward dx = rstd·(dx̂ − x̂·c), c = mean(dx̂ ⊙ x̂), has an error of at most
γ(k_dx(N))·M_i with M_i = rstd·(|dx̂_i| + |x̂_i|·mean|dx̂ ⊙ x̂|), the size of the two terms before
they cancel (as in ``rmsref.tolerance``): k_dx(N) = 2·k_rstd(N) + N + 6 (x̂: k_xhat; the products
and the mean: N + 2; x̂_i·c and the difference: 2; × rstd: k_rstd + 1). LayerNorm's adds the
c1 = mean(dx̂) path: k_dx_ln(N) = k_xhat_ln(N) + N + k_rstd_ln(N) + 6, relative to
M_i = rstd·(|dx̂_i| + mean|dx̂| + a_i·mean(|dx̂|·a)).

Each identity's docstring says which of these enter its bound and how. These are worst-case
bounds: rounding errors rarely align, and the observed ratios are typically 1e-3 to 1e-1. The
statistical identities (attention scale, Xavier) are not about rounding: their bound is the
half-width of a confidence interval from ``scipy.stats`` at level ``CONFIDENCE``; rounding errors
(~1e-14) are negligible against it (~1e-2). The parameter count is an exact integer (bound 0), and
so is row independence, which must hold bit for bit (same inputs, same bits, whatever the batch;
docs/kernels.md).

Running against another implementation
--------------------------------------
``run(..., impl=...)`` evaluates the identities with other functions. ``impl`` may be a backend
name (``"numba_cpu"``), a module or object exposing the oracle's function names and signatures
(identities needing a function it lacks are skipped, with the reason), or a dict mapping some of
those names to replacements (the others come from the oracle: the way to break one function and
see which identities notice). The names used are those in each identity's ``uses``:
``rms_norm_forward``, ``rms_norm_backward``, ``rms_norm_jvp``, ``unit_norm_forward``,
``layer_norm_forward``, ``layer_norm_backward``, ``RMSNorm``, ``LayerNorm``.
"""

from __future__ import annotations

import inspect
import math
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from rmsref import tolerance as tol

__all__ = [
    "CONFIDENCE",
    "Identity",
    "IdentityResult",
    "Implementation",
    "MissingFunction",
    "Part",
    "REGISTRY",
    "gamma",
    "get",
    "names",
    "run",
    "to_markdown",
]

#: float64 unit roundoff.
U = tol.unit_roundoff(np.float64)
#: Confidence level of the statistical identities' intervals (two-sided). With a fixed seed the
#: outcome is reproducible; over random seeds each statistical part fails with probability ~1e-4.
CONFIDENCE = 0.9999


def gamma(k: float) -> float:
    """Higham's γ(k) = k·u/(1 − k·u) for float64: the relative error of k roundings
    (:func:`rmsref.tolerance.gamma_k`, where the error model keeps it)."""
    return tol.gamma_k(k, np.float64)


def k_rstd(n: int) -> int:
    """Roundings in rstd = 1/sqrt(mean(x²) + eps) for N = n features (module docstring)."""
    return math.ceil((n + 3) / 2) + 3


def k_y(n: int) -> int:
    """Roundings in y = x · rstd · w."""
    return k_rstd(n) + 2


def k_dx(n: int) -> int:
    """Roundings (relative to M_i) in the closed-form RMSNorm dx."""
    return 2 * k_rstd(n) + n + 6


def k_rstd_ln(n: int) -> int:
    """Roundings in LayerNorm's rstd, besides the η term of the mean's error."""
    return math.ceil((n + 4) / 2) + 3


def k_xhat_ln(n: int) -> int:
    """Roundings in LayerNorm's x̂, relative to a_i = |x̂_i| + rstd·mean|x|."""
    return (n + 1) + k_rstd_ln(n) + 2


def k_y_ln(n: int) -> int:
    """Roundings in LayerNorm's y = x̂·w + b, relative to |w_i|·a_i + |b_i|."""
    return k_xhat_ln(n) + 2


def k_dx_ln(n: int) -> int:
    """Roundings in LayerNorm's dx, relative to its M_i (module docstring)."""
    return k_xhat_ln(n) + n + k_rstd_ln(n) + 6


# ----------------------------------------------------------------------------------------------
# results and the registry
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One measured comparison inside an identity: residual against its bound.

    ``residual`` and ``bound`` are in the same units (usually relative to a stated scale); the
    part holds when ``residual <= bound``. A bound of 0 means "bit for bit".
    """

    label: str
    residual: float
    bound: float
    note: str = ""

    @property
    def ratio(self) -> float:
        return _ratio(self.residual, self.bound)

    @property
    def passed(self) -> bool:
        return bool(self.ratio <= 1.0)


@dataclass(frozen=True)
class IdentityResult:
    """The outcome of one identity.

    ``residual``, ``bound`` and ``ratio`` are those of the identity's worst part (largest ratio);
    ``passed`` is True when every part holds, False when one does not (or the implementation
    raised), and None when the identity was skipped (``detail`` says why). ``parts`` holds every
    comparison made; ``detail`` summarises them and any measured non-identity (e.g. how far
    RMSNorm moves under a shift).
    """

    name: str
    residual: float
    bound: float
    ratio: float
    passed: bool | None
    detail: str
    parts: tuple[Part, ...] = ()
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return {True: "pass", False: "FAIL", None: "skip"}[self.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "residual": self.residual,
            "bound": self.bound,
            "ratio": self.ratio,
            "passed": self.passed,
            "detail": self.detail,
            "seconds": self.seconds,
            "parts": [
                {"label": p.label, "residual": p.residual, "bound": p.bound, "ratio": p.ratio,
                 "note": p.note}
                for p in self.parts
            ],
        }


IdentityFn = Callable[["Implementation", np.random.Generator, bool], list[Part]]


@dataclass(frozen=True)
class Identity:
    """A registered identity: what it states, where it comes from, and how it is checked.

    ``func(impl, rng, quick)`` draws its inputs from ``rng``, evaluates both sides with ``impl``
    and returns its parts; its docstring derives the bound. ``kind`` is "float64" (bound from the
    error model), "statistical" (confidence interval) or "exact" (bit for bit, or an integer).
    """

    name: str
    title: str
    statement: str
    latex: str
    source: str
    kind: str
    uses: tuple[str, ...]
    func: IdentityFn = field(repr=False)

    @property
    def derivation(self) -> str:
        """How the bound is derived (the check function's docstring)."""
        return inspect.cleandoc(self.func.__doc__ or "")


#: name -> Identity, in the order they run.
REGISTRY: dict[str, Identity] = {}


def _identity(
    name: str, *, title: str, statement: str, latex: str, source: str, uses: tuple[str, ...],
    kind: str = "float64",
) -> Callable[[IdentityFn], IdentityFn]:
    def register(func: IdentityFn) -> IdentityFn:
        if name in REGISTRY:
            raise ValueError(f"identity {name!r} registered twice")
        REGISTRY[name] = Identity(name, title, statement, latex, source, kind, uses, func)
        return func

    return register


def names() -> list[str]:
    """The registered identity names, in run order."""
    return list(REGISTRY)


def get(name: str) -> Identity:
    """The identity called ``name`` (ValueError listing the known names otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown identity {name!r}; known identities: {', '.join(REGISTRY)}"
        ) from None


# ----------------------------------------------------------------------------------------------
# the implementation under test
# ----------------------------------------------------------------------------------------------


class MissingFunction(AttributeError):
    """The implementation under test does not provide a function an identity needs."""


class Implementation:
    """The functions an identity calls, looked up by the oracle's names.

    Parameters
    ----------
    impl : None, str, mapping, module or object
        None: the NumPy oracle (looked up on the ``rmsref`` package at call time). A string: the
        backend of that name (``rmsref.backend(name)``). A mapping: replacements for some of the
        oracle's functions, the rest coming from the oracle. Anything else: an object whose
        attributes are the functions; a missing one raises :class:`MissingFunction`, which skips
        the identity.
    """

    def __init__(self, impl: Any = None) -> None:
        import rmsref

        self._oracle = rmsref
        self._overrides: Mapping[str, Any] = {}
        self._target: Any = None
        if impl is None:
            self.label = "numpy oracle"
        elif isinstance(impl, str):
            self._target = rmsref.backend(impl)
            self.label = f"backend {impl}"
        elif isinstance(impl, Mapping):
            self._overrides = dict(impl)
            self.label = f"oracle with {', '.join(sorted(self._overrides))} replaced"
        else:
            self._target = impl
            self.label = getattr(impl, "__name__", type(impl).__name__)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._overrides:
            return self._overrides[name]
        if self._target is not None:
            try:
                return getattr(self._target, name)
            except AttributeError:
                raise MissingFunction(f"{self.label} has no {name}") from None
        return getattr(self._oracle, name)


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------


def _ratio(residual: float, bound: float) -> float:
    if residual == 0.0:
        return 0.0
    if bound <= 0.0 or not np.isfinite(residual):
        return math.inf
    return residual / bound


def _worst(label: str, err: Any, scale: Any, bound: Any, note: str = "") -> Part:
    """The part for elementwise errors: residual err/scale against ``bound`` (broadcastable).

    Reports residual and bound at the element with the largest ratio. An error where the scale is
    0 counts as an infinite residual; NaN anywhere is a failure.
    """
    err = np.abs(np.asarray(err, dtype=np.float64))
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), err.shape)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), err.shape)
    if err.size == 0:
        return Part(label, 0.0, float(np.max(bound, initial=0.0)), note)
    if not np.all(np.isfinite(err)):
        note = (note + "; non-finite values").lstrip("; ")
        return Part(label, math.inf, float(np.max(bound)), note)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0.0, 0.0, err / scale)
        ratio = np.where(rel == 0.0, 0.0, rel / bound)
    k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return Part(label, float(rel[k]), float(bound[k]), note)


def _noted(parts: list[Part], note: str) -> list[Part]:
    """``parts`` with ``note`` (a measured non-identity, e.g. how far a shift moves RMSNorm)
    attached to the last part, where the identity's detail line picks it up."""
    last = parts[-1]
    return parts[:-1] + [Part(last.label, last.residual, last.bound, note)]


def _rows(rng: np.random.Generator, m: int, n: int, offsets=(0.0, 0.5, 3.0, -20.0)) -> np.ndarray:
    """(m, n) float64 rows: Gaussian noise plus a per-row offset (mean/spread up to 20, so rows
    with a large mean are always present), times a per-row power of two in [2⁻⁴, 2⁴]."""
    scale = np.ldexp(1.0, rng.integers(-4, 5, size=(m, 1)))
    off = np.asarray(offsets, dtype=np.float64)[np.arange(m) % len(offsets)].reshape(m, 1)
    return scale * (rng.standard_normal((m, n)) + off)


def _weight(rng: np.random.Generator, n: int) -> np.ndarray:
    """A weight of mixed signs and magnitudes in [0.5, 2]."""
    return rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)


def _sizes(quick: bool) -> tuple[int, ...]:
    """Row lengths N each float64 identity is checked at: odd, a power of two, and a large one."""
    return (8, 64) if quick else (7, 64, 1000)


def _ms(x: np.ndarray) -> np.ndarray:
    """mean(x²) per row (M, 1), our own float64 (relative error ≤ γ(N + 2))."""
    return np.mean(x * x, axis=-1, keepdims=True)


def _col(a: Any, m: int) -> np.ndarray:
    """A per-row statistic as float64 (m, 1), whatever its keepdims convention."""
    return np.asarray(a, dtype=np.float64).reshape(m, 1)


def _eta(x: np.ndarray, eps: float) -> np.ndarray:
    """η per row: the relative error of LayerNorm's rstd caused by the mean's error (second order):
    ½·(γ(N + 1)·mean|x|)² / (var + eps)."""
    n = x.shape[-1]
    var = np.var(x, axis=-1, keepdims=True)
    dmu = gamma(n + 1) * np.mean(np.abs(x), axis=-1, keepdims=True)
    return 0.5 * dmu * dmu / (var + eps)


def _rms_dx_scale(dxhat: np.ndarray, xhat: np.ndarray, rstd: np.ndarray) -> np.ndarray:
    """M_i = rstd·(|dx̂_i| + |x̂_i|·mean|dx̂ ⊙ x̂|): the size of dx's terms before they cancel."""
    s = np.mean(np.abs(dxhat * xhat), axis=-1, keepdims=True)
    return rstd * (np.abs(dxhat) + np.abs(xhat) * s)


# ----------------------------------------------------------------------------------------------
# the identities
# ----------------------------------------------------------------------------------------------

ZS19 = "Zhang & Sennrich, Root Mean Square Layer Normalization, NeurIPS 2019"


@_identity(
    "rms2_var_mean2",
    title="RMS² = variance + mean²",
    statement="RMS(x)² = σ(x)² + μ(x)² per row (biased variance), read from the statistics the "
    "implementation saves: 1/rstd_RMS² = 1/rstd_LN² + μ² for the same eps.",
    latex=r"\mathrm{RMS}(x)^2 = \sigma(x)^2 + \mu(x)^2",
    source="elementary (E[x²] = Var x + (E x)²); " + ZS19 + " (RMSNorm drops the re-centring)",
    uses=("rms_norm_forward", "layer_norm_forward"),
)
def _rms2_var_mean2(impl: Implementation, rng: np.random.Generator, quick: bool) -> list[Part]:
    """Bound, relative to ms + eps = 1/rstd_RMS².

    1/rstd_RMS²: rstd carries γ(k_rstd); squaring doubles it, our square and reciprocal add 2:
    γ(2·k_rstd + 2). 1/rstd_LN²: γ(2·k_rstd_ln + 2) + 2η relative to var + eps ≤ ms + eps.
    μ²: |δμ| ≤ γ(N + 1)·mean|x| and |μ|, mean|x| ≤ sqrt(ms), so |δ(μ²)| ≤ γ(2N + 4)·ms with the
    rounding of the square. The final addition: 1. Total γ(2k_rstd + 2k_rstd_ln + 2N + 10) + 2η.
    """
    parts = []
    eps = 1e-5
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        _, rstd_r = impl.rms_norm_forward(x, n, None, eps)
        _, mu, rstd_l = impl.layer_norm_forward(x, n, None, None, eps)
        rstd_r, mu, rstd_l = _col(rstd_r, m), _col(mu, m), _col(rstd_l, m)
        lhs = 1.0 / (rstd_r * rstd_r)  # ms + eps
        rhs = 1.0 / (rstd_l * rstd_l) + mu * mu  # var + eps + mu²
        bound = gamma(2 * k_rstd(n) + 2 * k_rstd_ln(n) + 2 * n + 10) + 2 * _eta(x, eps)
        parts.append(_worst(f"N={n}", lhs - rhs, lhs, bound))
    return parts


@_identity(
    "rms_is_scaled_unit_norm",
    title="RMSNorm = √N · UnitNorm",
    statement="RMSNorm(x; w, eps) = √N · UnitNorm(x; w, N·eps): RMSNorm puts x on the sphere of "
    "radius √N (before the weight), unit-norm on the unit sphere.",
    latex=r"\mathrm{RMSNorm}(x; w, \epsilon) = \sqrt{N}\,\mathrm{UnitNorm}(x; w, N\epsilon)",
    source=ZS19 + " (RMSNorm forces the summed inputs into a √n-scaled unit sphere)",
    uses=("rms_norm_forward", "unit_norm_forward"),
)
def _rms_is_scaled_unit_norm(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound, relative to |y_i| = |x_i·w_i|/sqrt(ms + eps) (our float64).

    RMSNorm's y: γ(k_y(N)). UnitNorm's: Σx² (N roundings), + N·eps (our product 1, the sum 1),
    square root, reciprocal, × x, × w: ⌈(N + 2)/2⌉ + 5; × √N (rounded, then a product): 2.
    Our scale: 1 (second order). Total γ(k_y(N) + ⌈(N + 2)/2⌉ + 8).
    """
    parts = []
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        w = _weight(rng, n)
        for eps in (0.0, 1e-3):
            y_r, _ = impl.rms_norm_forward(x, n, w, eps)
            y_u, _ = impl.unit_norm_forward(x, n, w, n * eps)
            rhs = math.sqrt(n) * np.asarray(y_u, np.float64)
            scale = np.abs(x * w) / np.sqrt(_ms(x) + eps)
            bound = gamma(k_y(n) + math.ceil((n + 2) / 2) + 8)
            parts.append(_worst(f"N={n} eps={eps:g}", np.asarray(y_r) - rhs, scale, bound))
    return parts


@_identity(
    "layernorm_is_centred_rmsnorm",
    title="LayerNorm = RMSNorm of the centred input + b",
    statement="LayerNorm(x; w, b, eps) = RMSNorm(x − mean(x); w, eps) + b; on rows with mean 0, "
    "RMSNorm(x; w, eps) = LayerNorm(x; w, no bias, eps).",
    latex=r"\mathrm{LN}(x; w, b, \epsilon) = \mathrm{RMSNorm}(x - \mu(x); w, \epsilon) + b",
    source=ZS19 + " (RMSNorm equals LayerNorm when the mean of the inputs is zero)",
    uses=("rms_norm_forward", "layer_norm_forward"),
)
def _layernorm_is_centred_rmsnorm(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound, relative to s_i = |w_i|·rstd·(|x_i − μ| + mean|x|) + |b_i| (rstd = 1/sqrt(var+eps)).

    LayerNorm's y: γ(k_y_ln(N)) + η. The right side: our centring x − μ̃ errs by
    γ(N + 1)·mean|x| + u·|x − μ|, i.e. γ(N + 2) relative to the scale; RMSNorm of it adds
    γ(k_y(N)) and the same η (its mean of squares is var + δμ²); adding b: 1.
    Total γ(k_y_ln(N) + N + 2 + k_y(N) + 1) + 2η. The zero-mean rows ([v, −v]) use the same bound.
    """
    parts = []
    eps = 1e-5
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        w, b = _weight(rng, n), rng.standard_normal(n)
        y_ln, _, _ = impl.layer_norm_forward(x, n, w, b, eps)
        xc = x - np.mean(x, axis=-1, keepdims=True)
        y_rms, _ = impl.rms_norm_forward(xc, n, w, eps)
        rhs = np.asarray(y_rms, np.float64) + b
        rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
        scale = np.abs(w) * rstd * (np.abs(xc) + np.mean(np.abs(x), axis=-1, keepdims=True))
        scale = scale + np.abs(b)
        bound = gamma(k_y_ln(n) + n + 3 + k_y(n)) + 2 * _eta(x, eps)
        parts.append(_worst(f"N={n}", np.asarray(y_ln) - rhs, scale, bound))

        if n % 2 == 0:  # rows with mean exactly 0: [v, -v]
            v = _rows(rng, m, n // 2, offsets=(0.0, 2.0))
            z = np.concatenate([v, -v], axis=-1)
            y_rms0, _ = impl.rms_norm_forward(z, n, w, eps)
            y_ln0, _, _ = impl.layer_norm_forward(z, n, w, None, eps)
            rstd0 = 1.0 / np.sqrt(_ms(z) + eps)
            scale0 = np.abs(w) * rstd0 * (np.abs(z) + np.mean(np.abs(z), axis=-1, keepdims=True))
            parts.append(_worst(f"N={n} mean-zero rows", np.asarray(y_rms0) - np.asarray(y_ln0),
                                scale0, bound))
    return parts


@_identity(
    "scale_invariance",
    title="Scale invariance and its eps deviation",
    statement="RMSNorm(αx) = RMSNorm(x) for α > 0 at eps = 0; RMSNorm(−x) = −RMSNorm(x); with "
    "eps > 0 the deviation is exactly RMSNorm(αx) = RMSNorm(x)·sqrt((ms + eps)/(ms + eps/α²)).",
    latex=r"\mathrm{RMSNorm}(\alpha x;\epsilon) = \mathrm{RMSNorm}(x;\epsilon)"
    r"\sqrt{\frac{\overline{x^2}+\epsilon}{\overline{x^2}+\epsilon/\alpha^2}}",
    source=ZS19 + ", invariance analysis (re-scaling invariance)",
    uses=("rms_norm_forward",),
)
def _scale_invariance(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound, relative to |y_i| (our float64).

    Rounding αx perturbs each input by u relatively; through the Jacobian
    w·rstd·(I − x̂x̂ᵀ/N) that moves y_i by at most 2u·|y_i| (mean(x̂²) ≤ 1). Each side: γ(k_y).
    eps = 0 and −x: γ(2·k_y + 3). eps > 0, predicted factor f: our ms (γ(N + 2)) enters both
    ms + eps and ms + eps/α², so the quotient has ≤ 2γ(N + 2) + 5 roundings' error; the square
    root halves it and adds 2; the product f·y adds 1: γ(2·k_y + N + 11).
    """
    parts = []
    deviation = 0.0
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        w = _weight(rng, n)
        y0, _ = impl.rms_norm_forward(x, n, w, 0.0)
        y0 = np.asarray(y0, np.float64)
        scale = np.abs(x * w) / np.sqrt(_ms(x))
        for alpha in (1e-3, 0.37, 3.0, 2.0**40):
            ya, _ = impl.rms_norm_forward(alpha * x, n, w, 0.0)
            parts.append(_worst(f"N={n} alpha={alpha:g} eps=0", np.asarray(ya) - y0, scale,
                                gamma(2 * k_y(n) + 3)))
        for eps in (0.0, 1e-2):
            yp, _ = impl.rms_norm_forward(x, n, w, eps)
            yn, _ = impl.rms_norm_forward(-x, n, w, eps)
            sc = np.abs(x * w) / np.sqrt(_ms(x) + eps)
            parts.append(_worst(f"N={n} -x eps={eps:g}", np.asarray(yn) + np.asarray(yp), sc,
                                gamma(2 * k_y(n) + 3)))
        eps = 1e-2
        ye, _ = impl.rms_norm_forward(x, n, w, eps)
        ye = np.asarray(ye, np.float64)
        sc = np.abs(x * w) / np.sqrt(_ms(x) + eps)
        for alpha in (0.1, 0.5, 3.0):
            ms = _ms(x)
            f = np.sqrt((ms + eps) / (ms + eps / (alpha * alpha)))  # (M, 1) predicted factor
            deviation = max(deviation, float(np.max(np.abs(f - 1.0))))
            ya, _ = impl.rms_norm_forward(alpha * x, n, w, eps)
            parts.append(_worst(f"N={n} alpha={alpha:g} eps={eps:g} predicted",
                                np.asarray(ya) - f * ye, sc, gamma(2 * k_y(n) + n + 11)))
    return _noted(parts, f"with eps=1e-2, RMSNorm(αx)/RMSNorm(x) departs from 1 by up to "
                  f"{deviation:.3g}, as predicted")


@_identity(
    "shift",
    title="Shift: LayerNorm invariant, RMSNorm not",
    statement="LayerNorm(x + c) = LayerNorm(x) for a constant c; RMSNorm(x + c) ≠ RMSNorm(x): it "
    "equals (x + c)·w / sqrt(σ² + (μ + c)² + eps), which is checked, and how far it moves is "
    "reported (the limitation for inputs with a large non-zero mean).",
    latex=r"\mathrm{LN}(x + c\mathbf{1}) = \mathrm{LN}(x),\quad \mathrm{RMSNorm}(x + c\mathbf{1}) "
    r"= \frac{(x + c)\odot w}{\sqrt{\sigma^2 + (\mu + c)^2 + \epsilon}}",
    source=ZS19 + ", invariance analysis (re-centring: LayerNorm yes, RMSNorm no)",
    uses=("rms_norm_forward", "layer_norm_forward"),
)
def _shift(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bounds.

    LayerNorm: x' = fl(x + c) is off by u·|x'_i|; through LayerNorm's Jacobian
    w·rstd·(I − 11ᵀ/N − x̂x̂ᵀ/N) that moves y_i by ≤ u·|w_i|·rstd·(|x'_i| + mean|x'| +
    |x̂_i|·mean(|x̂|·|x'|)). Each side: γ(k_y_ln) + η relative to |w_i|·(|x̂_i| + rstd·mean|x|).
    With S_i the sum of these scales (+ |b_i|), the bound is γ(2·k_y_ln + 2) + 2η (η over x, x').
    RMSNorm, relative to |y_i|: the implementation's γ(k_y); the rounding of x + c, 2u as in
    scale_invariance; our prediction: σ² two-pass (γ(N + 3)), (μ + c)² with |δμ| ≤ γ(N + 1)·mean|x|
    gives 2γ(N + 2)·mean|x|·|μ + c| relative to ms', the additions 2: relative error
    ≤ γ(N + 5) + 2γ(N + 2)·ρ, ρ = mean|x|·|μ + c|/ms'; halved by the square root, + 3 (root,
    division, × w) + 1 (second order).
    """
    parts = []
    eps = 1e-5
    moved_rms = moved_ln = 0.0
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        w, b = _weight(rng, n), rng.standard_normal(n)
        spread = np.std(x, axis=-1, keepdims=True)
        y_ln, _, _ = impl.layer_norm_forward(x, n, w, b, eps)
        y_rms, _ = impl.rms_norm_forward(x, n, w, eps)
        y_ln, y_rms = np.asarray(y_ln, np.float64), np.asarray(y_rms, np.float64)
        for kappa in (1.0, 30.0):
            c = kappa * spread  # (M, 1) a shift of kappa standard deviations
            xs = x + c
            y_ln_s, _, _ = impl.layer_norm_forward(xs, n, w, b, eps)
            y_ln_s = np.asarray(y_ln_s, np.float64)
            mu = np.mean(x, axis=-1, keepdims=True)
            var = np.var(x, axis=-1, keepdims=True)
            rstd = 1.0 / np.sqrt(var + eps)
            xhat = (x - mu) * rstd
            absmean = np.mean(np.abs(x), axis=-1, keepdims=True)
            absmean_s = np.mean(np.abs(xs), axis=-1, keepdims=True)
            s = np.abs(w) * (
                np.abs(xhat) + rstd * (absmean + absmean_s + np.abs(xs))
                + np.abs(xhat) * rstd * np.mean(np.abs(xhat) * np.abs(xs), axis=-1, keepdims=True)
            ) + np.abs(b)
            eta = np.maximum(_eta(x, eps), _eta(xs, eps))
            parts.append(_worst(f"N={n} LayerNorm c={kappa:g}σ", y_ln_s - y_ln, s,
                                gamma(2 * k_y_ln(n) + 2) + 2 * eta))
            moved_ln = max(moved_ln, float(np.max(np.abs(y_ln_s - y_ln)) / np.max(np.abs(y_ln))))

            y_rms_s, _ = impl.rms_norm_forward(xs, n, w, eps)
            y_rms_s = np.asarray(y_rms_s, np.float64)
            ms_s = var + (mu + c) * (mu + c)  # (M, 1) eq. RMS² = σ² + μ², shifted
            pred = xs * w / np.sqrt(ms_s + eps)
            rho = absmean * np.abs(mu + c) / ms_s
            bound = gamma(k_y(n) + 2) + 0.5 * (gamma(n + 5) + 2 * gamma(n + 2) * rho) + gamma(4)
            parts.append(_worst(f"N={n} RMSNorm c={kappa:g}σ predicted", y_rms_s - pred,
                                np.abs(pred), bound))
            moved_rms = max(moved_rms,
                            float(np.max(np.abs(y_rms_s - y_rms)) / np.max(np.abs(y_rms))))
    return _noted(parts, f"a shift moves RMSNorm by up to {moved_rms:.3g} of max|y| (LayerNorm: "
                  f"{moved_ln:.2g})")


@_identity(
    "output_rms",
    title="Output RMS = sqrt(ms/(ms + eps)), mean not 0",
    statement="With w = 1 the output's RMS is exactly sqrt(ms/(ms + eps)) (1 at eps = 0); its "
    "mean is not 0 in general (RMSNorm does not re-centre; the mean is reported).",
    latex=r"\mathrm{RMS}(\mathrm{RMSNorm}(x)) = \sqrt{\frac{\overline{x^2}}{\overline{x^2}"
    r"+\epsilon}}",
    source="definition; " + ZS19,
    uses=("rms_norm_forward",),
)
def _output_rms(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound, relative to the predicted RMS.

    The implementation's y carries γ(k_rstd + 1) (no weight); our sqrt(mean(y²)) doubles that,
    adds N + 1 for the squares, sum and division, then halves it and adds 2 (root, second order):
    γ(k_rstd + 1 + ⌈(N + 1)/2⌉ + 2). The prediction: our ms (γ(N + 2)) in numerator and
    denominator, 2 more roundings, halved, + 2: γ(N + 5). Total γ(k_rstd + ⌈(N + 1)/2⌉ + N + 8).
    """
    parts = []
    means = 0.0
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        for eps in (0.0, 1e-6, 1e-1):
            y, _ = impl.rms_norm_forward(x, n, None, eps)
            y = np.asarray(y, np.float64)
            rms_y = np.sqrt(_ms(y))
            ms = _ms(x)
            pred = np.sqrt(ms / (ms + eps))
            bound = gamma(k_rstd(n) + math.ceil((n + 1) / 2) + n + 8)
            parts.append(_worst(f"N={n} eps={eps:g}", rms_y - pred, pred, bound))
            means = max(means, float(np.max(np.abs(np.mean(y, axis=-1)))))
    return _noted(parts, f"|mean(y)| of a row reaches {means:.3g} (not 0: no re-centring)")


@_identity(
    "backward_orthogonality",
    title="⟨dx, x⟩ = eps·rstd²·⟨dx̂, x̂⟩; LayerNorm Σdx = 0",
    statement="Per row, ⟨dx, x⟩ = eps·rstd²·⟨dxhat, xhat⟩ (dxhat = dy ⊙ w), so dx ⟂ x at eps = 0; "
    "for LayerNorm Σ_j dx_j = 0 per row.",
    latex=r"\langle dx, x\rangle = \epsilon\,r^2\langle d\hat x, \hat x\rangle,\quad "
    r"\textstyle\sum_j dx^{\mathrm{LN}}_j = 0",
    source="rmsref/rmsnorm.py eq. (7) and rmsref/layernorm.py eq. (10); follow from "
    "scale invariance (RMSNorm) and shift invariance (LayerNorm)",
    uses=("rms_norm_backward", "layer_norm_backward"),
)
def _backward_orthogonality(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bounds.

    RMSNorm, relative to S = Σ_i |x_i|·M_i: the implementation's dx errs by γ(k_dx)·M_i; our
    Σ dx_i·x_i adds γ(N)·Σ|dx_i x_i| ≤ γ(N)·S; the right side (our rstd², x̂, products and sum,
    3·k_rstd + N + 5 roundings) errs by at most that times eps·rstd²·Σ|dx̂ x̂| ≤ S.
    Total γ(k_dx + N + 1 + 3·k_rstd + N + 5).
    LayerNorm, relative to Σ_i M_i^LN: the implementation's γ(k_dx_ln) + 2η, our sum γ(N).
    """
    parts = []
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        w = _weight(rng, n)
        dy = rng.standard_normal((m, n))
        for eps in (0.0, 1e-1):
            g = impl.rms_norm_backward(dy, x, n, w, eps)
            dx = np.asarray(g[0], np.float64)
            rstd = 1.0 / np.sqrt(_ms(x) + eps)
            xhat, dxhat = x * rstd, dy * w
            lhs = np.sum(dx * x, axis=-1, keepdims=True)
            rhs = eps * rstd * rstd * np.sum(dxhat * xhat, axis=-1, keepdims=True)
            s = np.sum(np.abs(x) * _rms_dx_scale(dxhat, xhat, rstd), axis=-1, keepdims=True)
            bound = gamma(k_dx(n) + 2 * n + 3 * k_rstd(n) + 6)
            parts.append(_worst(f"N={n} RMSNorm eps={eps:g}", lhs - rhs, s, bound))

        eps = 1e-5
        g = impl.layer_norm_backward(dy, x, n, w, None, eps)
        dx = np.asarray(g[0], np.float64)
        mu = np.mean(x, axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
        xhat, dxhat = (x - mu) * rstd, dy * w
        a = np.abs(xhat) + rstd * np.mean(np.abs(x), axis=-1, keepdims=True)
        big_m = rstd * (np.abs(dxhat) + np.mean(np.abs(dxhat), axis=-1, keepdims=True)
                        + a * np.mean(np.abs(dxhat) * a, axis=-1, keepdims=True))
        bound = gamma(k_dx_ln(n) + n) + 2 * _eta(x, eps)
        parts.append(_worst(f"N={n} LayerNorm sum(dx)", np.sum(dx, axis=-1, keepdims=True),
                            np.sum(big_m, axis=-1, keepdims=True), bound))
    return parts


@_identity(
    "dweight_linearity",
    title="dweight = Σ_rows dy ⊙ x̂; backward linear in dy",
    statement="dweight = Σ_rows dy ⊙ xhat, and the backward is linear in dy: "
    "B(a·dy₁ + b·dy₂) = a·B(dy₁) + b·B(dy₂) for dx and dweight.",
    latex=r"dw = \textstyle\sum_{\text{rows}} dy\odot\hat x,\quad "
    r"B(a\,dy_1 + b\,dy_2) = a\,B(dy_1) + b\,B(dy_2)",
    source="rmsref/rmsnorm.py eq. (8); a VJP is linear in its cotangent",
    uses=("rms_norm_backward",),
)
def _dweight_linearity(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bounds.

    dweight, relative to D_j = Σ_rows |dy·x̂|_j: each side computes x̂ (k_xhat), a product (1) and
    an M-term sum (M − 1): γ(k_xhat + M) each, γ(2·k_xhat + 2M + 1) together.
    Linearity of dx, relative to |a|·M_i(dy₁) + |b|·M_i(dy₂): rounding a·dy₁ + b·dy₂ (2 per
    element) moves dx by ≤ γ(2)·(that scale) since M is sublinear in |dy|; each side's backward
    γ(k_dx), counted twice on the left for the same reason; our combination 2:
    γ(2·k_dx + 5). dweight likewise: γ(2·(k_xhat + M) + 5) relative to |a|·D₁ + |b|·D₂.
    """
    parts = []
    eps = 1e-5
    a, b = 0.7, -1.3
    for n in _sizes(quick):
        m = 12
        x = _rows(rng, m, n)
        w = _weight(rng, n)
        dy1, dy2 = rng.standard_normal((m, n)), rng.standard_normal((m, n))
        rstd = 1.0 / np.sqrt(_ms(x) + eps)
        xhat = x * rstd
        g1 = impl.rms_norm_backward(dy1, x, n, w, eps)
        dw_ref = np.sum(dy1 * xhat, axis=0)
        d1 = np.sum(np.abs(dy1 * xhat), axis=0)
        kx = k_rstd(n) + 1
        parts.append(_worst(f"N={n} dweight", np.asarray(g1[1], np.float64) - dw_ref, d1,
                            gamma(2 * kx + 2 * m + 1)))

        g2 = impl.rms_norm_backward(dy2, x, n, w, eps)
        g12 = impl.rms_norm_backward(a * dy1 + b * dy2, x, n, w, eps)
        m1 = _rms_dx_scale(dy1 * w, xhat, rstd)
        m2 = _rms_dx_scale(dy2 * w, xhat, rstd)
        lin_dx = np.asarray(g12[0], np.float64) - (a * np.asarray(g1[0]) + b * np.asarray(g2[0]))
        parts.append(_worst(f"N={n} linearity dx", lin_dx, abs(a) * m1 + abs(b) * m2,
                            gamma(2 * k_dx(n) + 5)))
        d2 = np.sum(np.abs(dy2 * xhat), axis=0)
        lin_dw = np.asarray(g12[1], np.float64) - (a * np.asarray(g1[1]) + b * np.asarray(g2[1]))
        parts.append(_worst(f"N={n} linearity dweight", lin_dw, abs(a) * d1 + abs(b) * d2,
                            gamma(2 * (kx + m) + 5)))
    return parts


@_identity(
    "jacobian",
    title="Jacobian = diag(w)·rstd·(I − x̂x̂ᵀ/N) and its eigenvalues",
    statement="The Jacobian of RMSNorm is diag(w)·rstd·(I − xhat·xhatᵀ/N): checked entry by "
    "entry against the one assembled from the backward (rows) and the JVP (columns); with w = 1 "
    "its eigenvalues are rstd (N − 1 times, on x⊥) and eps·rstd³ (along x).",
    latex=r"J = \operatorname{diag}(w)\,r\,(I - \hat x\hat x^{\top}/N),\quad "
    r"\lambda(J)\big|_{w=1} = \{r^{(N-1)}, \epsilon r^3\}",
    source="rmsref/rmsnorm.py eq. (7) and the derivation above it",
    uses=("rms_norm_backward", "rms_norm_jvp"),
)
def _jacobian(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bounds.

    Entries, relative to S_ij = |w_i|·rstd·(δ_ij + |x̂_i x̂_j|/N): the backward with dy = e_i has
    M_j = S_ij exactly, so its row errs by γ(k_dx)·S_ij; the JVP has the same structure (tangent
    e_j), hence the same bound. Our closed form: x̂ twice and their product (2·k_xhat + 1), / N,
    δ − ·, × rstd, × w (k_rstd + 4): γ(k_dx + 2·k_xhat + k_rstd + 6) in all.
    Eigenvalues (w = 1), absolute: Weyl's inequality moves each eigenvalue of the symmetrised
    assembled Jacobian by ≤ ‖E‖₂ ≤ ‖E‖_F ≤ γ(k_dx + 2)·‖S‖_F (symmetrising: 2); LAPACK's eigvalsh
    adds p(N)·u·‖J‖₂ (LAPACK Users' Guide §4.7, p(N) "a modest function of N", taken as N;
    ‖J‖₂ = rstd ≤ ‖S‖_F); our predicted eps·rstd³ and rstd: γ(3·k_rstd + 3)·rstd.
    """
    parts = []
    sizes = (16,) if quick else (5, 32)
    smallest = math.inf
    for n in sizes:
        m = 3
        x = _rows(rng, m, n, offsets=(0.0, 1.0, -4.0))
        w = _weight(rng, n)
        eps = 0.25 * float(np.mean(_ms(x)))  # large enough that eps·rstd³ is resolved
        rstd = 1.0 / np.sqrt(_ms(x) + eps)  # (m, 1)
        xhat = x * rstd  # (m, N)
        eye = np.eye(n)
        # closed form, (m, N, N): J[r, i, j] = w_i rstd (δ_ij − x̂_i x̂_j / N)
        outer = xhat[:, :, None] * xhat[:, None, :]
        j_ref = w[None, :, None] * rstd[:, :, None] * (eye - outer / n)
        s = np.abs(w)[None, :, None] * rstd[:, :, None] * (eye + np.abs(outer) / n)
        bound = gamma(k_dx(n) + 2 * (k_rstd(n) + 1) + k_rstd(n) + 6)
        xr = np.repeat(x, n, axis=0)  # (m·N, N): each row once per unit cotangent
        units = np.tile(eye, (m, 1))  # (m·N, N)
        j_vjp = np.asarray(impl.rms_norm_backward(units, xr, n, w, eps)[0], np.float64)
        j_vjp = j_vjp.reshape(m, n, n)  # row i of J = Jᵀe_i
        parts.append(_worst(f"N={n} backward rows", j_vjp - j_ref, s, bound))
        try:
            jvp = impl.rms_norm_jvp
        except MissingFunction:
            jvp = None
        if jvp is not None:
            cols = np.asarray(jvp(xr, units, n, w, eps), np.float64).reshape(m, n, n)
            j_jvp = np.transpose(cols, (0, 2, 1))  # column j of J = J e_j
            parts.append(_worst(f"N={n} JVP columns", j_jvp - j_ref, s, bound))

        # eigenvalues with w = 1
        j1 = np.asarray(impl.rms_norm_backward(units, xr, n, None, eps)[0], np.float64)
        j1 = j1.reshape(m, n, n)
        sym = 0.5 * (j1 + np.transpose(j1, (0, 2, 1)))
        lam = np.linalg.eigvalsh(sym)  # (m, N) ascending
        r = rstd[:, 0]
        pred = np.sort(np.concatenate([(eps * r**3)[:, None], np.repeat(r[:, None], n - 1, 1)],
                                      axis=1), axis=1)
        s1 = rstd[:, :, None] * (eye + np.abs(outer) / n)
        fro = np.sqrt(np.sum(s1 * s1, axis=(1, 2)))  # (m,) ‖S‖_F
        abs_bound = (gamma(k_dx(n) + 2) + n * U) * fro + gamma(3 * k_rstd(n) + 3) * r
        err = np.max(np.abs(lam - pred), axis=1)
        parts.append(_worst(f"N={n} eigenvalues (relative to rstd)", err / r, 1.0, abs_bound / r))
        smallest = min(smallest, float(np.min(eps * r * r)))
    return _noted(parts, f"the eigenvalue along x, eps·rstd³, is down to {smallest:.3g}·rstd")


@_identity(
    "rotation_equivariance",
    title="Rotation equivariance (RoPE pairs)",
    statement="For R a block-diagonal matrix of 2×2 rotations (RoPE's pairs), RMSNorm(Rx) = "
    "R·RMSNorm(x) when w is equal within each rotated pair; for a general w the violation is "
    "exactly rstd·sin θ·(w_b − w_a)·(x_b, x_a) per pair (a, b), which is checked and reported.",
    latex=r"\mathrm{RMSNorm}(Rx; w) = R\,\mathrm{RMSNorm}(x; w)\ \text{if } w_{2k}=w_{2k+1}",
    source="‖Rx‖ = ‖x‖ for orthogonal R; RoPE: Su et al., RoFormer, 2021",
    uses=("rms_norm_forward",),
)
def _rotation_equivariance(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound, relative to s_i = |w_i|·rstd·(|c·x_a| + |s·x_b|) (pair (a, b), i = a; mirrored for b).

    Rounding Rx (two products, one sum per entry) errs by γ(2) relative to that scale, moving y_i
    by ≤ 2.5·γ(2)·s_i through RMSNorm's Jacobian (Cauchy-Schwarz bounds the projection term by
    1.5): counted as 6. (c, s) are rounded, so R is orthogonal only to τ = c² + s² − 1, computed
    exactly with fractions: rstd moves by ½·max|τ|. Each side's RMSNorm: γ(k_y) (on the right
    side combined by c, s within the same scale); our combination R·y: 2; second order: 1.
    Total γ(2·k_y + 9) + ½·max|τ|. The general-w part also subtracts our predicted violation
    (w_b − w_a, × x, × s, × rstd: k_rstd + 4, and two subtractions), relative to
    rstd·max(|w_a|, |w_b|)·(|x_a| + |x_b|): γ(2·k_y + 9 + k_rstd + 6) + ½·max|τ|.
    """
    parts = []
    violation = 0.0
    for n in _sizes(quick):
        n2 = n - n % 2  # RoPE rotates pairs; an odd N leaves its last feature alone
        m = 12
        x = _rows(rng, m, n)
        theta = rng.uniform(0.0, 2.0 * np.pi, n2 // 2)
        c, s = np.cos(theta), np.sin(theta)
        tau = max(abs(Fraction(float(ci)) ** 2 + Fraction(float(si)) ** 2 - 1)
                  for ci, si in zip(c, s, strict=True))
        tau = float(tau)

        def rotate(v: np.ndarray, c=c, s=s, n2=n2) -> np.ndarray:
            out = v.copy()
            va, vb = v[:, 0:n2:2], v[:, 1:n2:2]
            out[:, 0:n2:2] = c * va - s * vb
            out[:, 1:n2:2] = s * va + c * vb
            return out

        xa, xb = x[:, 0:n2:2], x[:, 1:n2:2]
        mag = np.abs(x).copy()  # |c x_a| + |s x_b| per entry (|x_i| for an unrotated feature)
        mag[:, 0:n2:2] = np.abs(c * xa) + np.abs(s * xb)
        mag[:, 1:n2:2] = np.abs(s * xa) + np.abs(c * xb)
        rstd = 1.0 / np.sqrt(_ms(x))

        w_pair = np.repeat(rng.uniform(0.5, 2.0, (n + 1) // 2), 2)[:n]
        lhs = np.asarray(impl.rms_norm_forward(rotate(x), n, w_pair, 0.0)[0], np.float64)
        rhs = rotate(np.asarray(impl.rms_norm_forward(x, n, w_pair, 0.0)[0], np.float64))
        parts.append(_worst(f"N={n} paired w", lhs - rhs, np.abs(w_pair) * rstd * mag,
                            gamma(2 * k_y(n) + 9) + 0.5 * tau))

        w = _weight(rng, n)
        lhs = np.asarray(impl.rms_norm_forward(rotate(x), n, w, 0.0)[0], np.float64)
        rhs = rotate(np.asarray(impl.rms_norm_forward(x, n, w, 0.0)[0], np.float64))
        pred = np.zeros_like(x)  # (M, N) predicted violation
        dw = w[1:n2:2] - w[0:n2:2]  # w_b − w_a per pair
        pred[:, 0:n2:2] = rstd * (s * dw) * xb
        pred[:, 1:n2:2] = rstd * (s * dw) * xa
        wmax = np.repeat(np.maximum(np.abs(w[0:n2:2]), np.abs(w[1:n2:2])), 2)
        wmax = np.concatenate([wmax, np.abs(w[n2:])])
        pair_abs = np.abs(x).copy()
        pair_abs[:, 0:n2:2] = np.abs(xa) + np.abs(xb)
        pair_abs[:, 1:n2:2] = np.abs(xa) + np.abs(xb)
        scale = rstd * wmax * pair_abs
        violation = max(violation, float(np.max(np.abs(lhs - rhs)) / np.max(np.abs(rhs))))
        parts.append(_worst(f"N={n} general w, violation predicted", lhs - rhs - pred, scale,
                            gamma(2 * k_y(n) + 15 + k_rstd(n)) + 0.5 * tau))
    return _noted(parts, f"with a general w, RMSNorm(Rx) − R·RMSNorm(x) reaches {violation:.3g} "
                  "of max|y|, as predicted")


@_identity(
    "row_independence",
    title="Rows are independent; no running statistics",
    statement="A row's output (y, rstd, dx) does not depend on the batch it is in: bit for bit "
    "the same alone, in a permuted batch, or among other rows. The module keeps no running "
    "statistics, so 'train' and 'eval' are one computation: calling it on other data in between "
    "changes nothing.",
    latex=r"\mathrm{RMSNorm}(X)_{r} = \mathrm{RMSNorm}(X_{r})",
    source="Ba, Kiros & Hinton, Layer Normalization, 2016 (per-example statistics, identical "
    "at training and test time); docs/kernels.md (batch invariance)",
    uses=("rms_norm_forward", "rms_norm_backward", "RMSNorm"),
    kind="exact",
)
def _row_independence(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound 0: the statistic is per row, so a deterministic implementation gives the same bits
    for the same row whatever surrounds it (the project's determinism rule). The residual is the
    largest difference relative to max|y| (or max|dx|)."""
    parts = []
    eps = 1e-5
    for n in _sizes(quick):
        m = 13
        x = _rows(rng, m, n)
        w = _weight(rng, n)
        dy = rng.standard_normal((m, n))
        y, rstd = impl.rms_norm_forward(x, n, w, eps)
        y, rstd = np.asarray(y), _col(rstd, m)
        dx = np.asarray(impl.rms_norm_backward(dy, x, n, w, eps)[0])
        ymax, dmax = float(np.max(np.abs(y))), float(np.max(np.abs(dx)))
        dy_err = dr_err = dd_err = 0.0
        perm = rng.permutation(m)
        other = _rows(rng, 29, n)
        batches = [np.array([i]) for i in (0, m // 2, m - 1)] + [perm, np.arange(1, m - 1)]
        for rows in batches:
            yb, rb = impl.rms_norm_forward(x[rows], n, w, eps)
            dyb = np.asarray(impl.rms_norm_backward(dy[rows], x[rows], n, w, eps)[0])
            dy_err = max(dy_err, float(np.max(np.abs(np.asarray(yb) - y[rows]))))
            dr_err = max(dr_err, float(np.max(np.abs(_col(rb, len(rows)) - rstd[rows]))))
            dd_err = max(dd_err, float(np.max(np.abs(dyb - dx[rows]))))
        # the same rows among strangers, in a bigger batch
        mixed = np.concatenate([other[:7], x, other[7:]])
        ym, _ = impl.rms_norm_forward(mixed, n, w, eps)
        dy_err = max(dy_err, float(np.max(np.abs(np.asarray(ym)[7:7 + m] - y))))
        parts.append(Part(f"N={n} y", dy_err / ymax, 0.0))
        parts.append(Part(f"N={n} rstd", dr_err / float(np.max(rstd)), 0.0))
        parts.append(Part(f"N={n} dx", dd_err / dmax, 0.0))

    try:
        module_cls = impl.RMSNorm
    except MissingFunction as exc:  # a kernel backend has functions, not modules
        return _noted(parts, f"module part skipped: {exc}")
    n = 64
    module = module_cls(n, eps=eps, dtype=np.float64)
    state = module.state_dict()
    state["weight"] = _weight(rng, n)
    module.load_state_dict(state)
    x = _rows(rng, 5, n)
    y1 = np.asarray(module(x))
    module(_rows(rng, 9, n) * 100.0)  # "training" on other data
    y2 = np.asarray(module(x))
    running = [k for k in vars(module) if "running" in k or "momentum" in k]
    parts.append(Part("module: same output after other calls",
                      float(np.max(np.abs(y2 - y1))) / float(np.max(np.abs(y1))), 0.0))
    parts.append(Part("module: running statistics", float(len(running)), 0.0,
                      note="running-statistics attributes: " + (", ".join(running) or "none")))
    return parts


def _mean_ci(samples: np.ndarray, exact_chi2: bool) -> tuple[float, float, float]:
    """(sample mean, lower, upper) of a CONFIDENCE interval for E[samples] under H0: E = 1.

    exact_chi2: the samples are iid χ²₁ under H0, so n·mean ~ χ²_n and the acceptance interval
    comes from scipy.stats.chi2; otherwise Student's t interval (the CLT), scipy.stats.t.
    """
    from scipy import stats  # lazily: scipy is a test/CLI dependency, not a core one

    n = samples.size
    mean = float(np.mean(samples))
    alpha = 1.0 - CONFIDENCE
    if exact_chi2:
        lo, hi = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n) / n
        return mean, float(lo), float(hi)
    half = float(stats.t.ppf(1 - alpha / 2, n - 1) * np.std(samples, ddof=1) / math.sqrt(n))
    return mean, 1.0 - half, 1.0 + half


def _ci_part(label: str, mean: float, lo: float, hi: float) -> Part:
    """Residual |mean − 1| against the half-width of the interval on the side the mean lies."""
    bound = (hi - 1.0) if mean >= 1.0 else (1.0 - lo)
    return Part(label, abs(mean - 1.0), bound,
                note=f"{label}: mean {mean:.4f}, {CONFIDENCE:.2%} interval [{lo:.4f}, {hi:.4f}]")


@_identity(
    "attention_scale",
    title="Attention logits have unit variance after normalisation",
    statement="For q, k in independent uniformly random directions: if RMS-normalised "
    "(‖q‖² = N), var(q·k/√N) = 1; if unit-normalised, var(√N·q·k) = 1. Monte Carlo with a fixed "
    "seed; 1 must lie in the confidence interval.",
    latex=r"\operatorname{Var}\!\left(\tfrac{q\cdot k}{\sqrt N}\right) = 1\ "
    r"(\|q\|^2=\|k\|^2=N)",
    source="Vaswani et al., Attention Is All You Need, 2017 (footnote on the 1/√d_k scale: q·k "
    "of unit-variance components has variance d_k); QK-norm",
    uses=("rms_norm_forward", "unit_norm_forward"),
    kind="statistical",
)
def _attention_scale(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound: the half-width of a CONFIDENCE Student-t interval for E[z²] (E z = 0 by symmetry,
    so E[z²] = var z). z = √N·cos θ has a finite fourth moment (E cos⁴θ = 3/(N(N + 2))), so the
    CLT applies; with n ≥ 4000 samples the t interval is accurate. Rounding errors (~1e-14) are
    negligible against the half-width (~5e-2)."""
    n, pairs = 64, (4000 if quick else 20000)
    q, k = rng.standard_normal((pairs, n)), rng.standard_normal((pairs, n))
    qr = np.asarray(impl.rms_norm_forward(q, n, None, 0.0)[0], np.float64)
    kr = np.asarray(impl.rms_norm_forward(k, n, None, 0.0)[0], np.float64)
    z = np.sum(qr * kr, axis=-1) / math.sqrt(n)
    parts = [_ci_part(f"RMS-normalised, N={n}, {pairs} pairs", *_mean_ci(z * z, False))]
    try:
        unit_norm_forward = impl.unit_norm_forward
    except MissingFunction as exc:
        return _noted(parts, f"unit-norm part skipped: {exc}")
    q, k = rng.standard_normal((pairs, n)), rng.standard_normal((pairs, n))  # independent
    qu = np.asarray(unit_norm_forward(q, n, None, 0.0)[0], np.float64)
    ku = np.asarray(unit_norm_forward(k, n, None, 0.0)[0], np.float64)
    z = math.sqrt(n) * np.sum(qu * ku, axis=-1)
    parts.append(_ci_part(f"unit-normalised, N={n}, {pairs} pairs", *_mean_ci(z * z, False)))
    return parts


@_identity(
    "xavier",
    title="Xavier/LeCun: unit-variance outputs from RMS-normalised inputs",
    statement="With W ~ N(0, 1/N) and x RMS-normalised (‖x‖² = N), E[(Wx)_i²] = 1: given x, "
    "(Wx)_i ~ N(0, ‖x‖²/N) exactly. Monte Carlo; 1 must lie in the confidence interval.",
    latex=r"W_{ij}\sim\mathcal N(0, 1/N),\ \|x\|^2 = N \Rightarrow \mathbb E[(Wx)_i^2] = 1",
    source="LeCun et al., Efficient BackProp, 1998 (Var W = 1/fan_in); Glorot & Bengio 2010",
    uses=("rms_norm_forward",),
    kind="statistical",
)
def _xavier(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound: exact. Given x with ‖x‖² = N, the (Wx)_i are iid N(0, 1), so n·mean((Wx)²) ~ χ²_n;
    the CONFIDENCE acceptance interval comes from scipy.stats.chi2 (no CLT needed). Rounding
    (‖x‖² = N to ~1e-14) is negligible against the half-width."""
    n, trials, outs = 64, (400 if quick else 2000), 16
    x = rng.standard_normal((trials, n)) * rng.uniform(0.1, 10.0, (trials, 1))
    xr = np.asarray(impl.rms_norm_forward(x, n, None, 0.0)[0], np.float64)
    wmat = rng.standard_normal((trials, outs, n)) / math.sqrt(n)
    z = np.einsum("toj,tj->to", wmat, xr).ravel()
    return [_ci_part(f"N={n}, {z.size} outputs", *_mean_ci(z * z, True))]


@_identity(
    "parameter_count",
    title="RMSNorm has N parameters, LayerNorm 2N",
    statement="Read from the module classes: RMSNorm(normalized_shape) holds N learnable scalars "
    "(the weight), LayerNorm 2N (weight and bias): with Adam's two moments that is 3N floats "
    "of parameters and optimizer state saved per normalisation layer.",
    latex=r"|\theta_{\mathrm{RMSNorm}}| = N,\quad |\theta_{\mathrm{LN}}| = 2N",
    source=ZS19 + " (no re-centring, no bias); torch.nn.RMSNorm / torch.nn.LayerNorm defaults",
    uses=("RMSNorm", "LayerNorm"),
    kind="exact",
)
def _parameter_count(impl: Implementation, rng, quick: bool) -> list[Part]:
    """Bound 0: integer counts, the sizes of the arrays in each module's state_dict()."""
    del rng, quick
    parts, counts = [], []
    for shape in (64, (4, 16)):
        n = int(np.prod(shape))
        for cls_name, expected in (("RMSNorm", n), ("LayerNorm", 2 * n)):
            module = getattr(impl, cls_name)(shape)
            count = sum(int(np.size(p)) for p in module.state_dict().values())
            parts.append(Part(f"{cls_name}({shape})", float(abs(count - expected)), 0.0))
            counts.append(f"{cls_name}({shape}): {count}")
    return _noted(parts, ", ".join(counts))


# ----------------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------------


def to_markdown(results: Iterable[IdentityResult] | None = None) -> str:
    """The registry as Markdown (for docs/identities.md): per identity its statement, LaTeX,
    source, the functions it uses and the derivation of its bound; with ``results``, also the
    measured residual, bound and ratio."""
    measured = {r.name: r for r in results} if results is not None else {}
    lines = ["# Executable identities", "",
             "Generated by `rmsref.identities.to_markdown()`; run them with `rmsref check` or "
             "`rmsref.identities.run()`.", ""]
    for i, ident in enumerate(REGISTRY.values(), 1):
        lines += [f"## {i}. {ident.title} (`{ident.name}`)", "", ident.statement, "",
                  f"$$ {ident.latex} $$", "", f"*Source:* {ident.source}  ",
                  f"*Kind:* {ident.kind}; *uses:* {', '.join(f'`{u}`' for u in ident.uses)}", "",
                  "*Bound:*", "", "```", ident.derivation, "```", ""]
        r = measured.get(ident.name)
        if r is not None:
            lines += [f"*Measured:* residual {r.residual:.3g}, bound {r.bound:.3g}, ratio "
                      f"{r.ratio:.3g} ({r.status}); {r.detail}", ""]
    return "\n".join(lines)


def _summarise(parts: list[Part]) -> tuple[float, float, float]:
    worst = max(parts, key=lambda p: p.ratio)
    return worst.residual, worst.bound, worst.ratio


def run_one(identity: Identity | str, *, seed: int = 0, impl: Any = None,
            quick: bool = False) -> IdentityResult:
    """Run one identity (see :func:`run`)."""
    ident = get(identity) if isinstance(identity, str) else identity
    implementation = impl if isinstance(impl, Implementation) else Implementation(impl)
    # One stream per identity, keyed by its name: running one alone draws the same inputs.
    rng = np.random.default_rng([int(seed), zlib.crc32(ident.name.encode())])
    start = time.perf_counter()
    try:
        parts = ident.func(implementation, rng, quick)
    except MissingFunction as exc:
        return IdentityResult(ident.name, math.nan, math.nan, math.nan, None,
                              f"skipped: {exc}", (), time.perf_counter() - start)
    except ImportError as exc:  # scipy missing for the statistical identities
        return IdentityResult(ident.name, math.nan, math.nan, math.nan, None,
                              f"skipped: {exc} (pip install scipy)", (),
                              time.perf_counter() - start)
    except Exception as exc:  # the implementation under test raised: that is a failure
        return IdentityResult(ident.name, math.inf, math.nan, math.inf, False,
                              f"raised {type(exc).__name__}: {exc}", (),
                              time.perf_counter() - start)
    seconds = time.perf_counter() - start
    residual, bound, ratio = _summarise(parts)
    failed = [p for p in parts if not p.passed]
    notes = list(dict.fromkeys(p.note for p in parts if p.note and p.passed))
    if failed:
        detail = "; ".join(
            f"{p.label}: residual {p.residual:.3g} > bound {p.bound:.3g}" for p in failed[:3]
        ) + (f" (+{len(failed) - 3} more)" if len(failed) > 3 else "")
    else:
        worst = max(parts, key=lambda p: p.ratio)
        detail = f"{len(parts)} parts, worst {worst.label}"
        if notes:
            detail += "; " + "; ".join(notes)
    return IdentityResult(ident.name, residual, bound, ratio, not failed, detail, tuple(parts),
                          seconds)


def run(
    names: Iterable[str] | str | None = None,
    *,
    seed: int = 0,
    impl: Any = None,
    quick: bool = False,
    on_result: Callable[[IdentityResult], None] | None = None,
) -> list[IdentityResult]:
    """Run identities and return their results (residual, bound, ratio, passed, detail).

    Parameters
    ----------
    names : str or iterable of str, optional
        Identities to run (default: all, in registry order). Unknown names raise ValueError.
    seed : int
        Seed of the inputs; each identity draws from its own stream derived from (seed, name).
    impl : None, str, mapping, module or object
        The implementation under test (see :class:`Implementation`; default the NumPy oracle).
    quick : bool
        Fewer sizes and samples (about a third of the time).
    on_result : callable, optional
        Called with each result as it completes (progress display).

    Returns
    -------
    list of IdentityResult
        In the order run. ``passed`` is None for an identity skipped because ``impl`` lacks a
        function it uses.
    """
    if names is None:
        selected = list(REGISTRY.values())
    else:
        selected = [get(n) for n in ([names] if isinstance(names, str) else names)]
    implementation = impl if isinstance(impl, Implementation) else Implementation(impl)
    results = []
    for ident in selected:
        result = run_one(ident, seed=seed, impl=implementation, quick=quick)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
