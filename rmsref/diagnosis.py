"""Why does an implementation fail? Fit known mistakes to what it returned; name the one that fits.

:func:`rmsref.validate` says *whether* an implementation is right; this module says *why* not.
Each hypothesis is a parametrised mutation of the reference computation (a different eps, the
variance in place of the mean of squares, a missing term of the backward, an extra rounding, ...).
A hypothesis **explains** a checked case when the implementation's output, compared with the
*mutated* reference, falls back inside the tolerance model's bound (:mod:`rmsref.tolerance`),
not merely closer; on half-precision outputs it must also reproduce most elements bit for bit.
Continuous parameters (an eps, a weight offset, the scale of the path through rstd, how many rows
dweight covers) are fitted from the outputs and reported.

Hypotheses are ranked by how many failing cases they explain, then by their exact-match rate,
then by simplicity; a winner must also stay inside the bound on the cases that passed (a wrong
eps that explains one probe but breaks five others is no explanation). Several causes may hold at
once: the search is greedy, each round taking the hypothesis that explains most of what is still
unexplained, and a mutation may combine two causes (an eps mismatch *and* double rounding). The
backward is fitted after the forward, starting from the forward's fitted parameters, so an eps
mismatch is not misread as a backward bug. What nothing explains is reported as
``no_known_cause`` with the list of what was tried: a wrong diagnosis is worse than none.

The family of forward computations every hypothesis lives in (per row, or per group of the
statistic's axes)::

    a = x − κ_num·μ              numerator (κ_num = 1: the mean is removed)
    b = x − κ_stat·μ             what is squared (κ_stat = 1: the variance)
    s = Σ b² / D                 D = N (mean), N − 1, or 1 (a sum)
    r = 1 / (sqrt(s + ε_in) + ε_out)
    y = (w + offset) · a · r

and its backward, derived like the reference one (g = dy·(w + offset), q = sqrt(s + ε_in))::

    dx = r·(g − κ_num·mean(g)) − r²·Σ(g·a)·b / (q·D)      direct term − path through r
    dw = Σ_rows dy·a·r
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from rmsref import tolerance as tol
from rmsref._rounding import round_to
from rmsref._shapes import FLOAT_DTYPES, bfloat16

Quantity = Literal["y", "dx", "dweight"]

_HALF = (np.dtype(np.float16), bfloat16)
#: On half-precision outputs a hypothesis must reproduce this fraction of elements bit for bit.
MIN_MATCH = 0.75

# ------------------------------------------------------------------------------------------------
# The codes: one place for what each cause is called, how it reads, and how to fix it
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Code:
    """A diagnosis code: its one-line text and the fix hint, both formatted with the fit."""

    code: str
    text: str
    fix: str


CODES: dict[str, Code] = {c.code: c for c in (
    Code("eps_value", "eps differs from the one asked for: the output is reproduced with "
         "eps = {eps_fit}{eps_scope}; the reference used {eps_ref}",
         "{eps_fix}"),
    Code("eps_outside_sqrt", "eps is added outside the square root: "
         "rstd = 1/(sqrt(mean(x²)) + eps) instead of 1/sqrt(mean(x²) + eps)",
         "compute rstd = 1/sqrt(mean(x²) + eps) (or rsqrt(mean(x²) + eps))"),
    Code("centred_statistic", "the statistic is the variance (the mean is removed{num}) in place "
         "of the mean of squares: this is LayerNorm's statistic, not RMSNorm's",
         "use mean(x²), not x.var(): RMSNorm does not subtract the mean"),
    Code("sum_not_mean", "the sum of squares is not divided by N (a √N scale on rstd)",
         "divide the sum of squares by N (use mean(x²))"),
    Code("n_minus_1", "the mean of squares divides by N − 1 instead of N (a variance formula)",
         "divide by N (unbiased=False / correction=0 if you use a variance routine)"),
    Code("wrong_axis", "the statistic is taken over the wrong axes ({axes})",
         "reduce over exactly the normalised (trailing) dims: {fix_axes}"),
    Code("low_precision_accumulation", "{what} is computed in the input's 16-bit type "
         "({how}): its rounding errors reach the output",
         "{precision_fix}"),
    Code("truncation", "the output is rounded toward zero instead of to nearest-even "
         "({match} of elements reproduced bit for bit by truncation)",
         "round float32 -> {dtype} to nearest-even (a plain cast), not by dropping bits"),
    Code("double_rounding", "an intermediate is rounded to the input dtype where one rounding was "
         "expected: x̂ = x·rstd is rounded before the weight multiplies it ({match} of elements "
         "reproduced bit for bit by that order)",
         "multiply by the weight in float32 and round once at the end: "
         "(x.float() * rstd * w.float()).to(dtype)"),
    Code("offset_weight", "the weight is used as {used} where {expected} was expected "
         "(fitted offset {offset_fit})",
         "{offset_fix}"),
    Code("float64_as_float32", "float64 input is computed in float32: the errors are float32's "
         "(ratio {ratio32} to a float32 computation's bound)",
         "compute float64 inputs in float64 (opmath of float64 is float64)"),
    Code("missing_projection", "dx lacks the path through rstd: dx = rstd·w·dy instead of "
         "rstd·(w·dy − x̂·mean(w·dy·x̂))",
         "subtract the projection x̂·mean(w·dy·x̂) before scaling by rstd"),
    Code("projection_scale", "the path through rstd is scaled by {scale_fit} ({scale_name}): "
         "dx = rstd·(w·dy − {scale_fit}·x̂·c)",
         "c = mean(w·dy·x̂) over the N normalised elements: divide the sum by N"),
    Code("separately_rounded_terms", "dx's two terms are rounded to {dtype} before they are "
         "subtracted: where they cancel, their rounding errors are the result",
         "subtract in float32 and round dx once: rstd·(dxhat − x̂·c) in float32, then cast"),
    Code("dweight_reduction", "dweight is not reduced over all rows ({rows_used})",
         "sum dy·x̂ over every leading (row) axis, all rows"),
    Code("dweight_from_x", "dweight sums dy·x instead of dy·x̂ (the factor rstd is missing)",
         "dweight = Σ_rows dy·x̂ with x̂ = x·rstd"),
    Code("dweight_times_weight", "dweight is multiplied by the weight: Σ dy·x̂·w instead of Σ dy·x̂",
         "dweight = Σ_rows dy·x̂ (the weight is what is differentiated, not a factor)"),
    Code("single_rounding", "the output has one rounding where the convention rounds x̂ first "
         "(matches the 'torch' order on {alt} of elements, the expected order on {own})",
         "round x̂·rstd to the input dtype before multiplying by the weight, or validate against "
         "the 'torch' convention"),
    Code("offset_rounding", "the offset 1 + w is {how} ({match} of elements reproduced bit for "
         "bit that way)", "{fix_how}"),
    Code("tail_statistic", "the sum of squares skips the columns of the last partial block "
         "({block})", "include the last, partial block of the row in the sum of squares"),
    Code("tail", "errors are confined to the columns of the last partial block (consistent with "
         "{block}): a block/tail-handling bug, e.g. masking or indexing of the last partial block",
         "check the masking and the index arithmetic of the last, partial block of the row"),
    Code("nondeterministic", "non-deterministic {what}: two calls on the same inputs differ "
         "(atomics or a thread-count-dependent reduction order)",
         "reduce in a fixed order (per-block partials combined in a fixed tree), no atomics"),
    Code("inconsistent_backward", "in float64 the backward is not the derivative of the "
         "implementation's own forward (directional central differences disagree)",
         "derive the backward from the forward you ship; check it with rmsref.gradcheck"),
    Code("no_known_cause", "no known mistake explains {cases}; tried: {tried}",
         "look at the worst elements (rmsref validate --json) and compare with the derivation"),
)}


@dataclass
class Evidence:
    """What a diagnosis rests on, in numbers."""

    cases: list[str] = field(default_factory=list)     # "probe/dtype/quantity" it explains
    ratio_before: float = 0.0       # worst error/bound against the correct reference
    ratio_after: float | None = None  # worst error/bound against the mutated reference
    match_rate: float | None = None  # fraction of elements reproduced bit for bit (half dtypes)
    params: dict[str, Any] = field(default_factory=dict)   # fitted values

    def brief(self) -> str:
        where = ", ".join(self.cases[:4]) + (" ..." if len(self.cases) > 4 else "")
        bits = [f"ratio {format_ratio(self.ratio_before)}" + (
            f" -> {format_ratio(self.ratio_after)}" if self.ratio_after is not None else "")]
        if self.match_rate is not None:
            bits.append(f"bit-exact {self.match_rate:.1%}")
        bits += [f"{k}={_fmt_param(v) if k == 'eps' else _fmt_num(v)}"
                 for k, v in self.params.items()]
        return f"{'; '.join(bits)}; in {where}"


@dataclass
class Diagnosis:
    """A cause that explains (part of) a failure: a stable ``code``, a ``text``, the
    ``evidence`` and a ``fix`` hint in the user's terms."""

    code: str
    text: str
    evidence: Evidence = field(default_factory=Evidence)
    fix: str = ""

    @property
    def seen_in(self) -> list[str]:
        """Where it was seen ("probe/dtype"), as the report's rows name them."""
        out: list[str] = []
        for c in self.evidence.cases:
            where = "/".join(c.split("/")[:2])
            if where not in out:
                out.append(where)
        return out

    def line(self) -> str:
        return (f"DIAGNOSIS [{self.code}] {self.text} (evidence: {self.evidence.brief()})"
                + (f"\n    fix: {self.fix}" if self.fix else ""))


def make(code: str, evidence: Evidence | None = None, **fields: Any) -> Diagnosis:
    """A :class:`Diagnosis` of ``code``, its text and fix formatted with ``fields``."""
    c = CODES[code]
    ev = evidence or Evidence()
    return Diagnosis(code, _format(c.text, fields), ev, _format(c.fix, fields))


def _format(template: str, fields: dict[str, Any]) -> str:
    class Missing(dict):
        def __missing__(self, key):
            return "?"
    return template.format_map(Missing({k: _fmt_num(v) for k, v in fields.items()}))


def format_ratio(v: float | None) -> str:
    """A ratio or error figure in at most 8 characters ("-" for none, "inf", "nan"; a negative
    figure takes one more, for its sign)."""
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v == 0:
        return "0"
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.1e}"


def _fmt_num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _fmt_param(v: Any) -> str:
    """An eps value, with the name of the default it equals."""
    if isinstance(v, float):
        name = _NAMED_EPS.get(v)
        return f"{v:.6g}" + (f" ({name})" if name else "")
    return str(v)


# ------------------------------------------------------------------------------------------------
# Observations: what validate saw in each case
# ------------------------------------------------------------------------------------------------


@dataclass
class Observation:
    """One checked case: the inputs the implementation got, what it returned, how it was judged.

    ``got`` is the implementation's result as float64 rows (rows, N) for y and dx, (1, N) for
    dweight. ``eps_asked`` is what was passed (None: the implementation's default); ``eps`` the
    value the reference used. ``model`` is the error model the case was judged with.
    """

    probe: str
    quantity: Quantity
    x: np.ndarray                  # as given to the implementation (its dtype)
    shape: tuple[int, ...]         # normalized_shape
    weight: np.ndarray | None
    dy: np.ndarray | None
    eps_asked: float | None
    eps: float
    offset: float
    got: np.ndarray
    model: tol.ErrorModel
    ratio: float
    passed: bool
    mask_rows: np.ndarray | None = None
    codes: list[str] | None = None     # where to record the codes that explain this case
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def dtype(self) -> np.dtype:
        return self.x.dtype

    @property
    def dname(self) -> str:
        return _dname(self.dtype)

    @property
    def label(self) -> str:
        return f"{self.probe}/{self.dname}/{self.quantity}" + (
            f" N={self.n}" if self.probe == "tails" else "")

    @property
    def n(self) -> int:
        return int(np.prod(self.shape))

    def rows(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a, np.float64).reshape(-1, self.n)

    @property
    def xrows(self) -> np.ndarray:
        """x as (M, N) float64 rows."""
        return self._cached("xrows", lambda: self.rows(self.x))

    @property
    def w(self) -> np.ndarray:
        """The weight as stored (ones when there is none), (N,) float64."""
        return self._cached("w", lambda: np.ones(self.n) if self.weight is None else
                            np.asarray(self.weight, np.float64).reshape(self.n))

    @property
    def dyrows(self) -> np.ndarray:
        """dy as (M, N) float64 rows."""
        return self._cached("dyrows", lambda: self.rows(self.dy))

    def _cached(self, key: str, make_value: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make_value()
        return self._cache[key]


def _dname(dt: np.dtype) -> str:
    return next((k for k, v in FLOAT_DTYPES.items() if v == dt), str(dt))


# ------------------------------------------------------------------------------------------------
# Hypotheses: mutations of the reference computation
# ------------------------------------------------------------------------------------------------

#: Named eps values a fitted eps snaps to ("input" = finfo of the input dtype, resolved per case).
_NAMED_EPS: dict[float, str] = {
    0.0: "eps ignored",
    2.0**-7: "finfo(bfloat16).eps",
    2.0**-10: "finfo(float16).eps",
    2.0**-23: "finfo(float32).eps",
    2.0**-52: "finfo(float64).eps",
    1e-3: "", 1e-4: "", 1e-5: "a common default", 1e-6: "HF's rms_norm_eps default",
    1e-7: "keras' epsilon default", 1e-8: "the RMSNorm paper's default", 1e-12: "",
}
for _k in [k for k, v in _NAMED_EPS.items() if not v]:
    del _NAMED_EPS[_k]
_EPS_GRID = (0.0, 2.0**-7, 2.0**-10, 2.0**-23, 2.0**-52, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8,
             1e-10, 1e-12)
_INPUT_EPS = "finfo(input dtype).eps"


#: Scales of the path through rstd that real mistakes produce (besides a fitted one).
_SCALES: tuple[float | str, ...] = (1.0, 0.0, "N", "N/(N-1)", "(N-1)/N", "1/N", 2.0, 0.5, -1.0)


@dataclass(frozen=True)
class Hypothesis:
    """A mutated reference: every field at its default is the correct computation.

    Forward fields: ``eps`` replaces eps (``eps_scope`` "default": only where eps=None was
    passed; "all": everywhere; the value :data:`_INPUT_EPS` means finfo(input dtype).eps);
    ``eps_outside``; ``centre_stat``/``centre_num`` (κ); ``divisor`` ("N", "N-1", "1");
    ``offset`` (added to the weight's offset); ``stat_block`` (the statistic skips the last
    partial block of that many columns: a tail bug); ``stat_group`` ("last": over the last
    normalised dim only; "rows": over the batch axis); ``precision`` (statistic in the input
    dtype: "native" or "sequential"); ``as_float32`` (float64 computed in float32); ``rounding``
    ("once", "double", "trunc"). Backward fields: ``projection`` (scale of the path through
    rstd: a number, or "N", "N/(N-1)", "(N-1)/N", "1/N" resolved per case), ``separate_terms``,
    ``dweight`` ("rows", "from_x", "times_w", "prefix:k", "suffix:k", "features", "half_sum").
    """

    eps: float | str | None = None
    eps_scope: str = "default"
    eps_outside: bool = False
    centre_stat: bool = False
    centre_num: bool = False
    divisor: str = "N"
    offset: float = 0.0
    stat_block: int | None = None
    stat_group: str | None = None
    precision: str | None = None
    as_float32: bool = False
    rounding: str = "once"
    offset_rounded: bool = False
    projection: float | str = 1.0
    separate_terms: bool = False
    dweight: str = "rows"

    def codes(self) -> list[str]:
        """The diagnosis codes this mutation stands for (empty: the correct computation)."""
        out = []
        if self.eps is not None:
            out.append("eps_value")
        if self.eps_outside:
            out.append("eps_outside_sqrt")
        if self.centre_stat:
            out.append("centred_statistic")
        if self.divisor == "N-1":
            out.append("n_minus_1")
        if self.divisor == "1":
            out.append("sum_not_mean")
        if self.offset:
            out.append("offset_weight")
        if self.stat_block is not None:
            out.append("tail_statistic")
        if self.stat_group is not None:
            out.append("wrong_axis")
        if self.precision:
            out.append("low_precision_accumulation")
        if self.as_float32:
            out.append("float64_as_float32")
        if self.rounding == "double":
            out.append("double_rounding")
        if self.rounding == "trunc":
            out.append("truncation")
        if self.offset_rounded:
            out.append("offset_rounding")
        if self.projection == 0.0:
            out.append("missing_projection")
        elif self.projection != 1.0:
            out.append("projection_scale")
        if self.separate_terms:
            out.append("separately_rounded_terms")
        if self.dweight == "from_x":
            out.append("dweight_from_x")
        elif self.dweight == "times_w":
            out.append("dweight_times_weight")
        elif self.dweight == "half_sum":
            out.append("low_precision_accumulation")
        elif self.dweight != "rows":
            out.append("dweight_reduction")
        return out

    def forward_part(self) -> Hypothesis:
        """What the backward inherits of a forward's explanation: everything but the backward
        fields (autograd replays the forward's roundings, so they widen dx's bound too)."""
        return replace(self, projection=1.0, separate_terms=False, dweight="rows")

    @property
    def size(self) -> int:
        return len(self.codes())

    @property
    def fitted(self) -> bool:
        """Whether a parameter is a raw fitted number rather than a value real code uses."""
        return ((isinstance(self.eps, float) and self.eps not in _EPS_GRID)
                or (isinstance(self.projection, float) and self.projection not in _SCALES)
                or self.offset not in (0.0, 1.0, -1.0))

    @property
    def loosens(self) -> bool:
        """Whether the mutation only adds roundings (its bound is looser than the correct
        one's): such a cause must then reproduce the bits clearly better than the correct one."""
        return (self.rounding != "once" or bool(self.precision) or self.separate_terms
                or self.dweight == "half_sum" or self.as_float32)


CORRECT = Hypothesis()


def _eps_used(h: Hypothesis, obs: Observation) -> float:
    if h.eps is None or (h.eps_scope == "default" and obs.eps_asked is not None):
        return obs.eps
    if h.eps == _INPUT_EPS:
        return 2.0**-7 if obs.dtype == bfloat16 else float(np.finfo(obs.dtype).eps)
    return float(h.eps)


@dataclass
class _Groups:
    """How the rows (R, N) are grouped for the statistic: the view (G, K) and back."""

    to_view: Callable[[np.ndarray], np.ndarray]
    from_view: Callable[[np.ndarray], np.ndarray]


def _groups(h: Hypothesis, obs: Observation) -> _Groups | None:
    rows, n = obs.xrows.shape
    if h.stat_group is None:
        return _Groups(lambda a: a, lambda a: a)
    if h.stat_group == "rows":
        return _Groups(lambda a: a.T, lambda a: a.T) if rows > 1 else None
    k = obs.shape[-1]                                  # "last": the last normalised dim alone
    if len(obs.shape) < 2:
        return None
    return _Groups(lambda a: a.reshape(-1, k), lambda a: a.reshape(rows, n))


def _projection(h: Hypothesis, n: int) -> float:
    p = h.projection
    if isinstance(p, str):
        return {"N": float(n), "N/(N-1)": n / (n - 1) if n > 1 else math.inf,
                "(N-1)/N": (n - 1) / n, "1/N": 1.0 / n}[p]
    return float(p)


@dataclass
class _Family:
    """The family's forward on the group view: everything the backward needs."""

    a: np.ndarray      # (G, K) numerator
    b: np.ndarray      # (G, K) what is squared (masked to the statistic's columns)
    q: np.ndarray      # (G, 1) sqrt(s + ε_in)
    r: np.ndarray      # (G, 1) 1 / (q + ε_out)
    d: float           # D


def _family(h: Hypothesis, X: np.ndarray, eps: float, dt: np.dtype) -> _Family:
    k = X.shape[1]
    mu = np.mean(X, axis=1, keepdims=True) if (h.centre_num or h.centre_stat) else 0.0
    a = X - mu if h.centre_num else X
    b = X - mu if h.centre_stat else X
    if h.stat_block is not None:                       # the last partial block is skipped
        keep = (k // h.stat_block) * h.stat_block or k
        b = np.where(np.arange(k) < keep, b, 0.0)
    d = {"N": float(k), "N-1": float(k - 1), "1": 1.0}[h.divisor]
    if h.precision in ("native", "native_div"):       # R_t(x²), fp32 mean, R_t(ms), R_t(ms+eps)
        b2 = _rt(b * b, dt)
        s = _rt(np.sum(b2, axis=1, keepdims=True) / d, dt)
        s_eps = _rt(s + eps, dt)
        q = np.sqrt(s_eps)
        # rsqrt rounded once, or (torch's half rsqrt) sqrt rounded, then 1/· rounded
        r = _rt(1.0 / q, dt) if h.precision == "native" else _rt(1.0 / _rt(q, dt), dt)
        return _Family(a, b, q, r, d)
    if h.precision == "sequential":                    # acc += x² in the input dtype
        acc = np.cumsum(_rt(b * b, dt).astype(dt), axis=1, dtype=dt)[:, -1:].astype(np.float64)
        s = acc / d
    else:
        s = np.sum(b * b, axis=1, keepdims=True) / d
    q = np.sqrt(s + (0.0 if h.eps_outside else eps))
    r = 1.0 / (q + (eps if h.eps_outside else 0.0))
    return _Family(a, b, q, r, d)


def _rt(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Round to ``dt`` once and come back to float64 (the value a ``dt`` variable holds)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to(np.asarray(v, np.float64), dt).astype(np.float64)


def _trunc(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Round toward zero to ``dt``, as float64 values. Never away from zero: a finite value past
    ``dt``'s largest number truncates to that number, where rounding to nearest gives inf."""
    r = _rt(v, dt)
    with np.errstate(invalid="ignore"):
        away = np.isfinite(v) & (np.abs(r) > np.abs(v))
        nearer = np.where(np.isinf(r), np.sign(v) * float(np.finfo(dt).max),
                          r - np.sign(v) * tol.ulp(v, dt))
        return np.where(away, nearer, r)


@dataclass
class Prediction:
    """A hypothesis's answer for one case: the exact mutated value, the bound around it, and
    (on half dtypes) the emulated rounded output for the bit-exact comparison."""

    exact: np.ndarray
    bound: np.ndarray
    emulated: np.ndarray | None


def predict(h: Hypothesis, obs: Observation) -> Prediction | None:
    """What the mutated computation returns for ``obs``; None where it does not apply."""
    grp = _groups(h, obs)
    if grp is None:
        return None
    eps = _eps_used(h, obs)
    dt = obs.dtype
    if dt not in _HALF and (h.rounding != "once" or h.precision or h.separate_terms
                            or h.dweight == "half_sum"):
        return None                                    # last-bit effects of 16-bit types only
    model = obs.model
    xrows = obs.xrows
    if h.as_float32:
        if dt != np.float64:
            return None
        xrows = xrows.astype(np.float32).astype(np.float64)
        model = replace(model, out_dtype=np.dtype(np.float32), acc_dtype=np.dtype(np.float32))
    # (code without a weight has no offset to get wrong: its path skips the scale)
    w_eff = obs.w + obs.offset + (h.offset if obs.weight is not None else 0.0)
    if h.offset_rounded:                               # R_w(offset + w): rounded in w's dtype
        if obs.weight is None or obs.weight.dtype not in _HALF or not (obs.offset + h.offset):
            return None
        w_eff = _rt(w_eff, obs.weight.dtype)
    rows, n = xrows.shape
    W = np.broadcast_to(w_eff, (rows, n))
    with np.errstate(all="ignore"):
        X = grp.to_view(xrows)
        fam = _family(h, X, eps, dt)
        xhat = grp.from_view(fam.a * fam.r)                        # (R, N)  x̂ of the mutation
        rstd = grp.from_view(np.broadcast_to(fam.r, fam.a.shape))  # (R, N)  rstd per element
        # Removing the mean cancels: the variance of a row with mean μ and deviation σ carries
        # rounding errors (μ² + σ²)/σ² times larger than a mean of squares does.
        cond = grp.from_view(np.broadcast_to(
            np.sum(X * X, axis=1, keepdims=True) / np.sum(fam.b * fam.b, axis=1, keepdims=True),
            X.shape)) if h.centre_stat else 1.0
        cond = np.where(np.isfinite(cond), cond, 1.0)
        if obs.quantity == "y":
            pred = _predict_y(h, obs, model, xhat, rstd, W, dt)
        else:
            pred = _predict_backward(h, obs, model, fam, grp, xhat, rstd, W, w_eff)
    if pred is not None:
        pred.bound = pred.bound * (np.max(cond, axis=0, keepdims=True, initial=1.0)
                                   if obs.quantity == "dweight" and np.ndim(cond) else cond)
    return pred


def _predict_y(h, obs, model, xhat, rstd, W, dt) -> Prediction:
    exact = xhat * W                                               # (R, N)  y
    k_extra = 0
    emulated = None
    if h.rounding == "double":
        k_extra = 1
        emulated = _rt(_rt(xhat, dt) * W, dt)
    elif h.rounding == "trunc":                        # the low bits of a float32 dropped
        k_extra = 1
        emulated = _trunc(exact.astype(np.float32).astype(np.float64), dt)
    elif h.precision in ("native", "native_div"):
        k_extra = 2                                               # R_t(x·rstd), then ·w
        emulated = _rt(_rt(obs.xrows * rstd, dt) * W, dt)          # rstd is already R_t
    elif dt in _HALF:
        emulated = _rt(exact, dt)
    if h.precision is not None:
        model = replace(model, acc_dtype=dt)
    model = replace(model, k_out=model.k_out + k_extra)
    bound = tol.bound_y(exact, model)
    if h.centre_num:
        # x − μ is formed with an absolute error of about u·|x| + γ(N)·mean|x| (μ is a sum
        # of N terms), which is no small relative error where x is close to its row's mean
        scale = np.mean(np.abs(obs.xrows), axis=1, keepdims=True)
        bound = bound + (2.0 * model.u_acc * np.abs(obs.xrows) + model.gamma(obs.n) * scale) \
            * rstd * np.abs(W)
    return Prediction(exact, bound, emulated)


def _predict_backward(h, obs, model, fam, grp, xhat, rstd, W, w_eff) -> Prediction | None:
    if obs.dy is None:
        return None
    # the forward's extra roundings, replayed by autograd, widen the backward's bound
    k_extra = {"once": 0, "double": 1, "trunc": 1}[h.rounding] + (2 if h.precision else 0) \
        + (1 if h.offset_rounded else 0)
    model = replace(model, k_out=model.k_out + k_extra,
                    acc_dtype=obs.dtype if h.precision else model.acc_dtype)
    g_view = grp.to_view(obs.dyrows * W)                               # (G, K)  g = dy·w
    ga = np.sum(g_view * fam.a, axis=1, keepdims=True)             # (G, 1)  Σ g·a
    if obs.quantity == "dx":
        direct = fam.r * (g_view - (np.mean(g_view, axis=1, keepdims=True)
                                    if h.centre_num else 0.0))     # (G, K)  direct term
        through = fam.r * fam.r * ga * fam.b / (fam.q * fam.d)     # (G, K)  path through r
        term1 = grp.from_view(direct)
        term2 = grp.from_view(_projection(h, obs.n) * through)
        exact = term1 - term2                                      # (R, N)  dx
        dt = obs.dtype
        if h.separate_terms:
            if dt not in _HALF and dt != np.float32:
                return None
            model = replace(model, k_out=model.k_out + 1)
            emulated = _rt(_rt(term1, dt) - _rt(term2, dt), dt)
        else:
            emulated = _rt(exact, dt) if dt in _HALF else None
        # the size of the two terms before they cancel, as the mutation computes them
        m = grp.from_view(fam.r * np.abs(g_view) + abs(_projection(h, obs.n)) * fam.r * fam.r
                          * np.sum(np.abs(g_view * fam.a), axis=1, keepdims=True)
                          * np.abs(fam.b) / (fam.q * fam.d))
        bound = tol.bound_dx_of_magnitude(exact, m, model)
        return Prediction(exact, bound, emulated)
    # dweight: Σ_rows dy·x̂ (dy·x̂ per row, then the rows the hypothesis sums)
    terms = obs.dyrows * xhat                                          # (R, N)
    if h.dweight == "from_x":
        terms = obs.dyrows * obs.xrows
    elif h.dweight == "times_w":
        terms = terms * w_eff
    exact = _reduce_rows(terms, h.dweight)
    if exact is None:
        return None
    if h.dweight == "half_sum":                        # Σ_rows accumulated in the input dtype
        if obs.dtype not in _HALF:
            return None
        model = replace(model, acc_dtype=obs.dtype)
    bound = tol.bound_dweight(exact.reshape(-1), obs.dyrows, xhat, model).reshape(1, -1) \
        if exact.size == obs.n else None
    if bound is None:
        return None
    emulated = _rt(exact, obs.dtype) if obs.dtype in _HALF else None
    return Prediction(exact, bound, emulated)


def _reduce_rows(terms: np.ndarray, how: str) -> np.ndarray | None:
    rows, n = terms.shape
    if how in ("rows", "from_x", "times_w", "half_sum"):
        return np.sum(terms, axis=0, keepdims=True)
    if how == "features":
        return np.sum(terms, axis=1)[None, :] if rows == n else None
    kind, _, k = how.partition(":")
    k = int(k)
    if kind == "prefix":
        return np.sum(terms[:k], axis=0, keepdims=True)
    if kind == "suffix":
        return np.sum(terms[rows - k:], axis=0, keepdims=True)
    raise ValueError(how)


# ------------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------------


@dataclass
class Score:
    """How one hypothesis fares on one case."""

    ratio: float                 # worst |got − mutated| / bound
    match: float | None          # bit-exact fraction (half dtypes), else None
    exact_output: bool = True    # whether the bits can be expected to match (y: yes; dx and
    #                              dweight: cancellation and sums leave last bits to the order)

    @property
    def explains(self) -> bool:
        return self.ratio <= 1.0 and (self.match is None or not self.exact_output
                                      or self.match >= MIN_MATCH)


def score(h: Hypothesis, obs: Observation) -> Score | None:
    """Score ``h`` on ``obs``; None where the hypothesis does not apply to the case."""
    pred = predict(h, obs)
    if pred is None or pred.exact.shape != obs.got.shape:
        return None
    got = obs.got
    keep = np.ones(got.shape[0], bool) if obs.mask_rows is None or obs.quantity == "dweight" \
        else obs.mask_rows
    err = tol.abs_error(got[keep], pred.exact[keep])
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(err == 0, 0.0, err / pred.bound[keep])
    ratio = float(np.max(r)) if r.size else 0.0
    match = None
    if pred.emulated is not None and got[keep].size:
        e = pred.emulated[keep]
        same = (e == got[keep]) | (np.isnan(e) & np.isnan(got[keep]))
        match = float(np.mean(same))
    return Score(ratio if math.isfinite(ratio) else math.inf, match, obs.quantity == "y")


# ------------------------------------------------------------------------------------------------
# Fitting continuous parameters
# ------------------------------------------------------------------------------------------------


def _readback_rstd(obs: Observation, h: Hypothesis) -> np.ndarray | None:
    """Per row: the rstd the implementation used, read from y / ((w + offset)·a)."""
    w_eff = obs.w + obs.offset + h.offset
    xrows = obs.xrows
    a = xrows - np.mean(xrows, axis=1, keepdims=True) if h.centre_num else xrows
    den = a * w_eff
    with np.errstate(all="ignore"):
        q = obs.got / den
    ok = np.isfinite(q) & (np.abs(den) > 1e-30)
    out = np.full((xrows.shape[0], 1), np.nan)
    for i in range(xrows.shape[0]):
        v = q[i][ok[i]]
        if v.size:
            out[i, 0] = np.median(v)
    return out


def fit_eps(obs_list: Sequence[Observation], h: Hypothesis) -> float | None:
    """The eps that reproduces the rstd read back from the y cases (median over rows)."""
    fits = []
    for obs in obs_list:
        if obs.quantity != "y":
            continue
        r = _readback_rstd(obs, h)
        if r is None:
            continue
        b = obs.xrows - np.mean(obs.xrows, axis=1, keepdims=True) if h.centre_stat else obs.xrows
        d = {"N": obs.n, "N-1": max(obs.n - 1, 1), "1": 1}[h.divisor]
        with np.errstate(all="ignore"):  # rows with |x| > ~1e154 overflow s: left out below
            s = np.sum(b * b, axis=1, keepdims=True) / d
            e = (1.0 / r - np.sqrt(s)) if h.eps_outside else (1.0 / (r * r) - s)
            # only rows where eps is a visible part of the statistic pin it down
            e = e[np.isfinite(e) & (np.abs(e) > 1e-3 * s)]
        fits.extend(e.tolist())
    if not fits:
        return None
    v = float(np.median(fits))
    return v if v >= 0 else None


def fit_offset(obs_list: Sequence[Observation]) -> float | None:
    """δ in y = x̂·(w + offset + δ): median of y/x̂ − (w + offset) over the y cases."""
    fits = []
    for obs in obs_list:
        if obs.quantity != "y" or obs.weight is None:
            continue
        with np.errstate(all="ignore"):
            rstd = 1.0 / np.sqrt(np.mean(obs.xrows ** 2, axis=1, keepdims=True) + obs.eps)
            xhat = obs.xrows * rstd
            d = obs.got / xhat - (obs.w + obs.offset)
        d = d[np.isfinite(d) & (np.abs(xhat) > 0.1)]
        fits.extend(d.tolist())
    if not fits:
        return None
    v = float(np.median(fits))
    return float(np.round(v)) if abs(v - np.round(v)) < 0.05 and np.round(v) != 0 else None


def fit_projection(obs_list: Sequence[Observation], base: Hypothesis) -> float | None:
    """s in dx = direct − s·through, least squares over the dx cases."""
    num = den = 0.0
    for obs in obs_list:
        if obs.quantity != "dx":
            continue
        p1 = predict(replace(base, projection=0.0), obs)
        p0 = predict(base, obs)
        if p1 is None or p0 is None:
            continue
        through = p1.exact - p0.exact                     # the path through rstd, 1·through
        resid = p1.exact - obs.got                        # = s·through if the hypothesis holds
        ok = np.isfinite(through) & np.isfinite(resid)
        num += float(np.sum(through[ok] * resid[ok]))
        den += float(np.sum(through[ok] ** 2))
    if den == 0:
        return None
    return num / den


def _snap_scale(s: float, n_values: Iterable[int]) -> list[float]:
    """Candidate scales near ``s``: exact values a real bug produces (N, N/(N−1), 2, ½, ...)."""
    cands = {0.0, 2.0, 0.5, -1.0}
    for n in n_values:
        cands.update({float(n), n / max(n - 1, 1), (n - 1) / n, 1.0 / n})
    out = sorted(cands, key=lambda c: abs(c - s))[:3]
    if s not in out:
        out.append(s)
    return out


def fit_dweight_rows(obs_list: Sequence[Observation]) -> list[str]:
    """Which contiguous rows (a prefix or a suffix) dweight was summed over, per case."""
    out: list[str] = []
    for obs in obs_list:
        if obs.quantity != "dweight":
            continue
        with np.errstate(all="ignore"):
            rstd = 1.0 / np.sqrt(np.mean(obs.xrows ** 2, axis=1, keepdims=True) + obs.eps)
            terms = obs.dyrows * obs.xrows * rstd                 # (R, N)  dy·x̂ per row
        got = obs.got.reshape(-1)
        for kind, part in (("prefix", terms), ("suffix", terms[::-1])):
            cum = np.cumsum(part, axis=0)                   # (R, N)  sums of the first k rows
            d = np.nanmax(np.abs(cum - got), axis=1)
            k = int(np.argmin(d)) + 1
            if k < terms.shape[0]:
                out.append(f"{kind}:{k}")
    return sorted(set(out))


# ------------------------------------------------------------------------------------------------
# The search: candidates, a greedy cover of the failing cases, consistency with the passing ones
# ------------------------------------------------------------------------------------------------

_BLOCKS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class _Scores:
    """Memoised scores of (hypothesis, case)."""

    def __init__(self) -> None:
        self._memo: dict[tuple[Hypothesis, int], Score | None] = {}

    def __call__(self, h: Hypothesis, obs: Observation) -> Score | None:
        key = (h, id(obs))
        if key not in self._memo:
            self._memo[key] = score(h, obs)
        return self._memo[key]


def _forward_candidates(failing: Sequence[Observation], scores: _Scores
                        ) -> tuple[list[Hypothesis], list[Hypothesis]]:
    """One mutation at a time, and pairs of the promising ones (each bringing some failing case
    at least 2x closer) with each other."""
    ref_eps = {o.eps for o in failing}
    eps_values: list[float | str] = [e for e in _EPS_GRID if e not in ref_eps] + [_INPUT_EPS]
    for base in (CORRECT, Hypothesis(eps_outside=True)):
        fitted = fit_eps(failing, base)
        if fitted is not None and fitted not in eps_values:
            eps_values.append(_snap(fitted))
    singles: list[Hypothesis] = [Hypothesis(eps=e, eps_scope=sc) for e in eps_values
                                 for sc in ("default", "all")]
    singles += [Hypothesis(eps_outside=True), Hypothesis(centre_stat=True),
                Hypothesis(centre_stat=True, centre_num=True), Hypothesis(divisor="N-1"),
                Hypothesis(divisor="1"), Hypothesis(stat_group="last"),
                Hypothesis(stat_group="rows"), Hypothesis(rounding="double"),
                Hypothesis(rounding="trunc"), Hypothesis(offset_rounded=True)]
    singles += [Hypothesis(stat_block=b) for b in _BLOCKS]
    offset = fit_offset(failing)
    singles += [Hypothesis(offset=d) for d in sorted({1.0, -1.0} | ({offset} if offset else set()))]
    dtypes = {o.dtype for o in failing}
    if dtypes & set(_HALF):
        singles += [Hypothesis(precision=p) for p in ("native", "native_div", "sequential")]
    if np.dtype(np.float64) in dtypes:
        singles.append(Hypothesis(as_float32=True))
    # A mutation is promising when it brings some failing case at least 2x closer.
    promising = []
    sample = _spread(failing, 16)
    for h in singles:
        for o in sample:
            s = scores(h, o)
            if s is not None and s.ratio * 2.0 < o.ratio:
                promising.append(h)
                break
    pairs = [_merge(a, b) for i, a in enumerate(promising) for b in promising[i + 1:]]
    return singles, [p for p in pairs if p is not None]


def _snap(v: float) -> float:
    """A fitted eps: the named value it is within 1 % of, else itself to 3 digits."""
    for e in _EPS_GRID:
        if e and abs(v - e) <= 0.01 * e:
            return e
    return float(f"{v:.3g}")


def _merge(a: Hypothesis, b: Hypothesis) -> Hypothesis | None:
    """The hypothesis with both mutations, or None when they touch the same field."""
    fa = {k: v for k, v in a.__dict__.items() if v != getattr(CORRECT, k)}
    fb = {k: v for k, v in b.__dict__.items() if v != getattr(CORRECT, k)}
    if set(fa) & set(fb) - {"eps_scope"} or ("eps" in fa and "eps" in fb):
        return None
    return replace(a, **fb)


def _backward_candidates(failing: Sequence[Observation], bases: Sequence[Hypothesis]
                         ) -> list[Hypothesis]:
    out: list[Hypothesis] = []
    ns = sorted({o.n for o in failing})
    rows_fits = fit_dweight_rows(failing)
    for base in bases:
        out.append(base)
        scales: list[float | str] = list(_SCALES)
        s = fit_projection(failing, base)
        if s is not None and math.isfinite(s):
            near = [c for c in _snap_scale(s, ns) if isinstance(c, float)]
            scales += [c for c in near if c not in scales and c != 1.0]
        out += [replace(base, projection=p) for p in scales if p != 1.0]
        out.append(replace(base, separate_terms=True))
        out += [replace(base, dweight=d) for d in ("from_x", "times_w", "features", "half_sum")]
        out += [replace(base, dweight=d) for d in rows_fits]
    return list(dict.fromkeys(out))


@dataclass
class _Choice:
    h: Hypothesis
    explained: list[Observation]
    scores: list[Score]


def _cover(cands: Sequence[Hypothesis], failing: Sequence[Observation],
           passing: Sequence[Observation], scores: _Scores) -> tuple[list[_Choice],
                                                                    list[Observation]]:
    """Greedy: the hypothesis that explains most of what is left, as long as one does."""
    remaining = list(failing)
    chosen: list[_Choice] = []
    rejected: set[Hypothesis] = set()
    while remaining:
        best, best_key = None, None
        sample = _spread(remaining)
        for h in cands:
            if h in rejected or h == CORRECT:
                continue
            # a cause that explains none of a spread sample is not the strongest: skip it
            if not any(_explains(h, scores(h, o), scores(CORRECT, o)) for o in sample):
                continue
            got = [(o, scores(h, o)) for o in remaining]
            expl = [(o, s) for o, s in got if _explains(h, s, scores(CORRECT, o))]
            if not expl:
                continue
            matches = [s.match for _, s in expl if s.match is not None]
            key = (len(expl), float(np.mean(matches)) if matches else 0.0, -h.size,
                   not h.fitted, -max(s.ratio for _, s in expl))
            if best_key is None or key > best_key:
                best, best_key = (h, expl), key
        if best is None:
            break
        h, expl = best
        dtypes = {o.dtype for o, _ in expl}
        if not _consistent(h, [o for o in passing if o.dtype in dtypes], scores):
            rejected.add(h)
            continue
        chosen.append(_Choice(h, [o for o, _ in expl], [s for _, s in expl]))
        done = {id(o) for o, _ in expl}
        remaining = [o for o in remaining if id(o) not in done]
    return chosen, remaining


def _spread(obs: Sequence[Observation], k: int = 8) -> list[Observation]:
    """Up to ``k`` cases, one per (probe, dtype, quantity) first: a sample that sees every kind
    of failure."""
    seen: dict[tuple[str, str, str], Observation] = {}
    for o in obs:
        seen.setdefault((o.probe, o.dname, o.quantity), o)
    groups = list(seen.values())
    return groups[:: max(1, len(groups) // k)][:k] if len(groups) > k else groups


def _explains(h: Hypothesis, s: Score | None, correct: Score | None) -> bool:
    """``s`` explains its case, and on half dtypes reproduces the bits at least as well as the
    correct computation does (clearly better, 2 points, when ``h`` only adds roundings)."""
    if s is None or not s.explains:
        return False
    if s.match is None or correct is None or correct.match is None:
        return True
    # a cause that only adds roundings must show them in the bits: on y, or on dx/dweight when
    # the rounding is the backward's own (inherited forward roundings do not change dx's bits)
    own_rounding = h.loosens if s.exact_output else (h.separate_terms or h.dweight == "half_sum")
    return s.match >= correct.match + (0.02 if own_rounding else 0.0)


def _consistent(h: Hypothesis, passing: Sequence[Observation], scores: _Scores) -> bool:
    """A cause must not contradict what passed: the mutated reference stays within the bound
    (ratio <= 1) on the passing cases it applies to."""
    for o in passing:
        s = scores(h, o)
        if s is not None and s.ratio > 1.0:
            return False
    return True


# ------------------------------------------------------------------------------------------------
# From choices to diagnoses
# ------------------------------------------------------------------------------------------------


def diagnose(observations: Sequence[Observation]) -> list[Diagnosis]:
    """Explain the failing cases among ``observations``; strongest diagnosis first.

    The forward's failures are fitted first; the backward's are fitted starting from both the
    correct computation and the forward's best explanation (its value mutations carried over).
    Cases nothing explains are reported as ``tail`` when their errors sit in the last partial
    block of the row, else as ``no_known_cause``.
    """
    scores = _Scores()
    failing = [o for o in observations if not o.passed]
    if not failing:
        return []
    passing = [o for o in observations if o.passed]
    chosen: list[_Choice] = []
    unexplained: list[Observation] = []
    tried: list[str] = []

    y_fail = [o for o in failing if o.quantity == "y"]
    base = CORRECT
    if y_fail:
        singles, pairs = _forward_candidates(y_fail, scores)
        tried += [c for h in singles for c in h.codes()]
        y_pass = [o for o in passing if o.quantity == "y"]
        got, rest = _cover(singles, y_fail, y_pass, scores)
        if (rest or len(got) > 1) and pairs:      # two causes at once may explain it better
            got2, rest2 = _cover(singles + pairs, y_fail, y_pass, scores)
            if (len(rest2), len(got2)) < (len(rest), len(got)):
                got, rest = got2, rest2
        chosen += got
        unexplained += rest
        if got:
            base = got[0].h.forward_part()
    b_fail = [o for o in failing if o.quantity != "y"]
    if b_fail:
        bases = [CORRECT] if base == CORRECT else [base, CORRECT]
        cands = _backward_candidates(b_fail, bases)
        tried += [c for h in cands for c in h.codes()]
        got, rest = _cover(cands, b_fail, [o for o in passing if o.quantity != "y"], scores)
        chosen += got
        unexplained += rest
    out = _merge_diagnoses([d for ch in chosen for d in _diagnoses_of(ch)])
    if unexplained:
        out += _unexplained(unexplained, sorted(set(tried)))
    return out


def _merge_diagnoses(diags: list[Diagnosis]) -> list[Diagnosis]:
    """One diagnosis per code (the evidence of all its cases), most cases first."""
    merged: dict[str, Diagnosis] = {}
    for d in diags:
        if d.code not in merged:
            merged[d.code] = d
            continue
        m = merged[d.code].evidence
        m.cases += [c for c in d.evidence.cases if c not in m.cases]
        m.ratio_before = max(m.ratio_before, d.evidence.ratio_before)
        if d.evidence.ratio_after is not None:
            m.ratio_after = max(m.ratio_after or 0.0, d.evidence.ratio_after)
    return sorted(merged.values(), key=lambda d: -len(d.evidence.cases))


def _record(obs: Sequence[Observation], *codes: str) -> None:
    for o in obs:
        if o.codes is not None:
            o.codes.extend(c for c in codes if c not in o.codes)


def _diagnoses_of(ch: _Choice) -> list[Diagnosis]:
    h, obs = ch.h, ch.explained
    _record(obs, *h.codes())
    matches = [s.match for s in ch.scores if s.match is not None]
    ev = Evidence(
        cases=[o.label for o in obs],
        ratio_before=max(o.ratio for o in obs),
        ratio_after=max(s.ratio for s in ch.scores),
        match_rate=float(np.mean(matches)) if matches else None,
        params=_params(h, obs),
    )
    fields = _fields(h, obs, ev)
    return [make(code, replace(ev, cases=list(ev.cases), params=dict(ev.params)), **fields)
            for code in h.codes()]


def _params(h: Hypothesis, obs: Sequence[Observation]) -> dict[str, Any]:
    p: dict[str, Any] = {}
    if h.eps is not None:
        p["eps"] = h.eps if isinstance(h.eps, str) else float(h.eps)
    if h.offset:
        p["offset"] = h.offset
    if h.projection != 1.0:
        p["projection_scale"] = h.projection
    if h.stat_block:
        p["block"] = h.stat_block
    if h.dweight not in ("rows",):
        p["dweight"] = h.dweight
    return p


def _fields(h: Hypothesis, obs: Sequence[Observation], ev: Evidence) -> dict[str, Any]:
    o = obs[0]
    dnames = sorted({x.dname for x in obs})
    eps_ref = sorted({x.eps for x in obs})
    fields: dict[str, Any] = {
        "dtype": "/".join(dnames),
        "match": f"{ev.match_rate:.1%}" if ev.match_rate is not None else "most",
        "eps_ref": ", ".join(_fmt_param(e) for e in eps_ref),
    }
    if h.eps is not None:
        e = h.eps if isinstance(h.eps, str) else _fmt_param(float(h.eps))
        scope = " where eps=None was passed" if h.eps_scope == "default" else \
            " whatever eps was passed (the eps argument is ignored)"
        fields.update(eps_fit=e, eps_scope=scope)
        fields["eps_fix"] = ("use the convention's default eps when eps=None is passed "
                             f"({_fmt_param(eps_ref[0])})" if h.eps_scope == "default" else
                             "pass the eps argument through to the computation")
    fields["num"] = " from the numerator too" if h.centre_num else ", numerator left as x"
    if h.stat_group == "last":
        fields.update(axes=f"the last dim only, where normalized_shape {o.shape} was asked",
                      fix_axes=f"all of {o.shape}")
    else:
        fields.update(axes="the batch axis (over rows) instead of the features",
                      fix_axes="the trailing (feature) dims, one statistic per row")
    if h.precision:
        fields.update(what="the statistic", precision_fix="compute the sum of squares (and "
                      "rstd) in float32: x.float().pow(2).mean(-1)")
    if h.precision in ("native", "native_div"):
        fields["how"] = "x², the mean, rstd and x·rstd each rounded to the input dtype"
    elif h.precision == "sequential":
        fields["how"] = "x² summed in a 16-bit accumulator"
    elif h.dweight == "half_sum":
        # dweight's own sum, not the statistic: its text and its fix say so
        fields.update(what="dweight's sum over rows", how="each partial sum rounded to the "
                      "input dtype", precision_fix="accumulate dweight over the rows in float32 "
                      "and round once: (dy.float() * x̂).sum(0).to(dtype)")
    if h.offset:
        used = "1 + w" if h.offset > 0 else "w − 1"
        expected = "w" if o.offset == 0 else f"{o.offset:g} + w"
        fields.update(used=used if o.offset == 0 else f"{o.offset + h.offset:g} + w",
                      expected=expected, offset_fit=h.offset, offset_fix=_offset_fix(h, o))
    if h.as_float32:
        fields["ratio32"] = format_ratio(ev.ratio_after)
    if h.projection != 1.0:
        fields.update(scale_fit=h.projection if isinstance(h.projection, str) else
                      f"{float(h.projection):.4g}",
                      scale_name={"N": "a sum where the mean belongs", "N/(N-1)": "N − 1 in "
                                  "the projection's mean", "(N-1)/N": "a stray factor (N − 1)/N",
                                  "1/N": "divided by N twice", 2.0: "counted twice",
                                  0.5: "halved",
                                  -1.0: "added instead of subtracted"}.get(h.projection,
                                                                           "fitted"))
    if h.dweight.startswith(("prefix", "suffix")):
        kind, _, k = h.dweight.partition(":")
        fields["rows_used"] = f"only the {'first' if kind == 'prefix' else 'last'} {k} rows"
    elif h.dweight == "features":
        fields["rows_used"] = "summed over the features instead of the rows (it has the right " \
            "shape only because rows = N)"
    if h.stat_block:
        fields["block"] = f"a block of {h.stat_block} columns"
    if h.offset_rounded:
        fields.update(how="rounded to the weight dtype before it multiplies: R_w(1 + w)",
                      fix_how="add the 1 in float32: (1 + w.float()), or validate against "
                      "'gemma_wdtype'")
    return fields


def _offset_fix(h: Hypothesis, o: Observation) -> str:
    """The fix for a weight used with an offset the convention does not have (o.offset: the
    convention's own, 0 or 1; h.offset: what the kernel adds on top of it)."""
    if o.offset == 0:
        if h.offset > 0:
            return ("validate against the 'gemma' convention if your weights are stored as "
                    "scale − 1; else multiply by w itself")
        return "multiply by w itself, not by w − 1"
    if h.offset > 0:
        return f"add the convention's {o.offset:g} once: ({o.offset:g} + w)"
    return ("add the 1 to the weight (the convention stores w = scale − 1), or validate "
            "against 'torch' if your weights are the scale itself")


def _unexplained(obs: Sequence[Observation], tried: Sequence[str]) -> list[Diagnosis]:
    """``tail`` when the errors sit in the last partial block of the row, else no_known_cause."""
    out: list[Diagnosis] = []
    tails, rest, common = [], [], set(_BLOCKS)
    for o in obs:
        blocks = _tail_blocks(o)
        (tails if blocks else rest).append(o)
        common &= blocks or common
    if tails:
        b = max(common) if common else None
        ev = Evidence(cases=[o.label for o in tails], ratio_before=max(o.ratio for o in tails),
                      params={"block": b} if b else {})
        _record(tails, "tail")
        out.append(make("tail", ev, block=f"a block of {b} columns" if b else "a block"))
    if rest:
        _record(rest, "no_known_cause")
        ev = Evidence(cases=[o.label for o in rest], ratio_before=max(o.ratio for o in rest),
                      params={"tried": len(tried)})
        labels = ", ".join(o.label for o in rest[:4]) + (" ..." if len(rest) > 4 else "")
        out.append(make("no_known_cause", ev, cases=labels, tried=", ".join(tried)))
    return out


def _tail_blocks(o: Observation) -> set[int]:
    """Block sizes B for which every failing element lies in the last partial block of N."""
    pred = predict(CORRECT, o)
    if pred is None or o.quantity == "dweight":
        return set()
    err = tol.abs_error(o.got, pred.exact)
    with np.errstate(divide="ignore", invalid="ignore"):
        bad = np.nonzero(np.where(err == 0, 0.0, err / pred.bound) > 1.0)[1]
    if bad.size == 0:
        return set()
    n, lo = o.n, int(bad.min())
    return {b for b in _BLOCKS if n % b and n // b >= 1 and lo >= (n // b) * b}
