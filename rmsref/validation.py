"""Is my RMSNorm right, and if not, what is wrong with it? ``validate`` answers both.

``validate(forward, backward)`` runs an implementation on adversarial probes (below) in each
dtype, computes the exact answer with the float64 oracle *on the implementation's own rounded
inputs*, and compares element by element against the rounding-error bounds of
:mod:`rmsref.tolerance`. A case passes when every element is within its bound (observed/bound
ratio ≤ 1). When cases fail, :mod:`rmsref.diagnosis` fits known mistakes (a missing projection
term, 1/(N−1), eps outside the sqrt, double rounding, a different eps, ...) and the report names
the one that explains them, or says that none does.

The implementation is a plain array callable with the signature of :func:`rmsref.rms_norm`::

    forward(x, normalized_shape, weight=None, eps=None) -> y
    backward(dy, x, normalized_shape, weight=None, eps=None) -> (dx, dweight)

NumPy arrays in and out, bfloat16 as ml_dtypes. ``rmsref.adapters.torch`` / ``jax`` turn framework
functions and modules into such callables.

Probes (:data:`PROBES`, each a small function registered with what it looks for): ``gaussian``,
``offset`` (a large common offset: RMSNorm and LayerNorm part ways), ``huge`` / ``tiny``
magnitudes (x² overflows or underflows the input dtype), ``overflow`` / ``underflow`` (x² leaves
the range of a float32 accumulator: advisory, since a float32 pipeline cannot pass),
``zero_rows``, ``n1`` (N = 1), ``tails`` (N not a multiple of 32/128/1024), ``boundaries``
(one-hot entries at block boundaries), ``cancel`` (dy ∥ x̂/w: dx cancels), ``nan_inf`` (one NaN
and one Inf must stay in their rows), ``noncontig``, ``empty``, ``multidim``, ``no_weight``,
``square`` (rows = N, where a dweight summed over the wrong axis has the right shape),
``eps_default``, ``eps_explicit``. Plus: the rounding order on half types, the determinism of
two identical calls, and, when float64 is asked for, that the backward is the derivative of its
own forward (directional central differences).
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from rmsref import conventions as conv_mod
from rmsref import diagnosis
from rmsref import tolerance as tol
from rmsref._declared import Declared, NormalizedDims, declared_by
from rmsref._shapes import FLOAT_DTYPES
from rmsref._shapes import to_numpy as _as_numpy
from rmsref.comparison import Comparison, Reference, compare
from rmsref.diagnosis import Diagnosis
from rmsref.diagnosis import format_ratio as _fmt

Forward = Callable[..., Any]
Backward = Callable[..., Any]
Progress = Callable[[int, int, str], None]

# ------------------------------------------------------------------------------------------------
# Probe inputs
# ------------------------------------------------------------------------------------------------


@dataclass
class _Case:
    probe: str
    x: np.ndarray
    weight: np.ndarray | None
    shape: tuple[int, ...]
    eps: float | None
    dy: np.ndarray
    skip_rows: tuple[int, ...] = ()      # rows that hold NaN/Inf: checked for containment only


def _dt(name: str) -> np.dtype:
    try:
        return FLOAT_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r} not supported; use {', '.join(FLOAT_DTYPES)}") from None


def _cast(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    # float64 -> float32 -> dtype: the probe values need not be correctly rounded, only exact
    # in the dtype once made (the reference is computed on these rounded values).
    with np.errstate(over="ignore"):
        return np.asarray(a, np.float64).astype(np.float32).astype(dt)


@dataclass
class _ProbeInputs:
    """What a probe builds its cases from: the dtype, the probe's own random stream, the
    shapes and eps asked for, and :meth:`case`, which rounds everything to the dtype."""

    probe: str
    dt: np.dtype
    rng: np.random.Generator
    shapes: Sequence[tuple[int, ...]] | None
    eps: float | None

    @property
    def fmax(self) -> float:
        return 65504.0 if self.dt == np.float16 else 3.0e38

    def g(self, shape) -> np.ndarray:
        return self.rng.standard_normal(shape)

    def case(self, x64, shape=None, w64="rand", e="keep", dy64=None, skip=()) -> _Case:
        """A case from float64 values: ``w64="rand"`` draws a weight, ``e="keep"`` passes the
        eps validate was given, ``dy64=None`` draws dy, ``skip`` names rows holding NaN/Inf."""
        x = _cast(x64, self.dt)
        shape = (x.shape[-1],) if shape is None else shape
        if isinstance(w64, str):
            w64 = 1.0 + 0.3 * self.g(shape)
        w = None if w64 is None else _cast(w64, self.dt)
        if dy64 is None:
            dy64 = self.g(x.shape)
        e_arg = self.eps if e == "keep" else e
        return _Case(self.probe, x, w, tuple(shape), e_arg, _cast(dy64, self.dt), tuple(skip))


@dataclass(frozen=True)
class Probe:
    """One probe: its name, what it looks for, how it builds its cases, and whether a failure
    only warns (``advisory``: no float32-accumulating implementation can pass it)."""

    name: str
    what: str
    make: Callable[[_ProbeInputs], list[_Case]]
    advisory: bool = False


#: The probes, in the order they run (the order also seeds each probe's inputs).
PROBES: dict[str, Probe] = {}


def _probe(name: str, what: str, advisory: bool = False):
    def register(make: Callable[[_ProbeInputs], list[_Case]]):
        PROBES[name] = Probe(name, what, make, advisory)
        return make
    return register


@_probe("gaussian", "Gaussian rows (σ = 2) of the shapes asked for (default 16×768)")
def _gaussian(p: _ProbeInputs) -> list[_Case]:
    return [p.case(2.0 * p.g(s), (s[-1],)) for s in (p.shapes or [(16, 768)])]


@_probe("offset", "a large common offset (30 ± 0.05): RMSNorm and LayerNorm part ways")
def _offset(p: _ProbeInputs) -> list[_Case]:
    return [p.case(30.0 + 0.05 * p.g((16, 512)))]


@_probe("huge", "x² overflows the input dtype (float16) or reaches 1e18")
def _huge(p: _ProbeInputs) -> list[_Case]:
    # x² overflows float16 (|x| > 256); for 8-bit-exponent dtypes x² ~ 1e18 stays finite.
    # (Not beyond 1e9: autograd's d rsqrt(ms) = -½·ms^(-3/2) then underflows float32 and
    # the projection term of dx is lost; that range is the advisory `overflow` probe.)
    scale = 2.0e3 if p.dt == np.float16 else 1.0e9
    return [p.case(np.clip(scale * p.g((8, 256)), -p.fmax / 2, p.fmax / 2))]


@_probe("tiny", "x² underflows the input dtype; eps (default) dominates")
def _tiny(p: _ProbeInputs) -> list[_Case]:
    # x² underflows float16 (|x| < 2^-12) / float32 (|x| < 1e-23); eps (default) dominates.
    scale = 1.0e-3 if p.dt == np.float16 else 1.0e-21
    return [p.case(scale * p.g((8, 256)))]


@_probe("overflow", "x² beyond a float32 accumulator's range (advisory)", advisory=True)
def _overflow(p: _ProbeInputs) -> list[_Case]:
    return [] if p.dt == np.float16 else [p.case(1.0e20 * p.g((8, 256)))]


@_probe("underflow", "x² below a float32 accumulator's range, eps = 0 (advisory)", advisory=True)
def _underflow(p: _ProbeInputs) -> list[_Case]:
    return [] if p.dt == np.float16 else [p.case(1.0e-25 * p.g((8, 256)), e=0.0)]


@_probe("zero_rows", "rows of zeros among Gaussian rows")
def _zero_rows(p: _ProbeInputs) -> list[_Case]:
    x = 2.0 * p.g((8, 128))
    x[[1, 6]] = 0.0
    return [p.case(x)]


@_probe("n1", "N = 1: x̂ = ±1 and dx cancels completely")
def _n1(p: _ProbeInputs) -> list[_Case]:
    return [p.case(2.0 * p.g((8, 1)))]


@_probe("tails", "N not a multiple of 32, 128 or 1024 (33, 127, 129, 1025)")
def _tails(p: _ProbeInputs) -> list[_Case]:
    return [p.case(2.0 * p.g((4, n))) for n in (33, 127, 129, 1025)]


@_probe("boundaries", "one large entry per row at block boundaries (0, 31, 32, 127, ... 1030)")
def _boundaries(p: _ProbeInputs) -> list[_Case]:
    n = 1031
    cols = (0, 31, 32, 127, 128, 1023, 1024, 1030)
    x = 0.01 * p.g((len(cols), n))
    for r, c in enumerate(cols):
        x[r, c] = 10.0
    return [p.case(x)]


@_probe("cancel", "dy ∥ x̂/w: the two terms of dx nearly cancel")
def _cancel(p: _ProbeInputs) -> list[_Case]:
    # dy = x̂/w (+ tiny noise): dxhat = dy·w ∥ x̂, so dx = rstd·(dxhat − x̂·c) nearly cancels.
    x = 2.0 * p.g((8, 512))
    w = 1.0 + 0.3 * p.g(512)
    xq, wq = _cast(x, p.dt).astype(np.float64), _cast(w, p.dt).astype(np.float64)
    xhat = xq / np.sqrt(np.mean(xq * xq, axis=1, keepdims=True))
    return [p.case(x, w64=w, dy64=xhat / wq + 1e-3 * p.g(x.shape))]


@_probe("nan_inf", "one NaN and one Inf, each must stay in its row")
def _nan_inf(p: _ProbeInputs) -> list[_Case]:
    x = 2.0 * p.g((8, 256))
    x[2, 5] = np.nan
    x[5, 100] = np.inf
    return [p.case(x, skip=(2, 5))]


@_probe("noncontig", "strided rows and columns (a view, not a copy)")
def _noncontig(p: _ProbeInputs) -> list[_Case]:
    base = 2.0 * p.g((16, 1024))
    c = p.case(base)
    c.x = c.x[::2, ::2]                    # strided rows and columns
    c.dy = c.dy[::2, ::2]
    c.shape = (512,)
    c.weight = _cast(1.0 + 0.3 * p.g(1024), p.dt)[::2]
    return [c]


@_probe("empty", "no rows")
def _empty(p: _ProbeInputs) -> list[_Case]:
    return [p.case(np.zeros((0, 64)))]


@_probe("multidim", "two normalised dims (normalized_shape (4, 16)) under two batch dims")
def _multidim(p: _ProbeInputs) -> list[_Case]:
    return [p.case(2.0 * p.g((3, 5, 4, 16)), shape=(4, 16))]


@_probe("no_weight", "weight=None")
def _no_weight(p: _ProbeInputs) -> list[_Case]:
    return [p.case(2.0 * p.g((8, 256)), w64=None)]


@_probe("square", "rows = N: a dweight summed over the wrong axis has the right shape")
def _square(p: _ProbeInputs) -> list[_Case]:
    return [p.case(2.0 * p.g((64, 64)))]


@_probe("eps_default", "eps=None at activation scale 0.06, where the default eps shows")
def _eps_default(p: _ProbeInputs) -> list[_Case]:
    # activation scale 0.06: mean(x²) ≈ 0.0036, so 2^-7 (bf16 eps) instead of 2^-23 is a
    # 1.8x error and 1e-6 instead of 2^-23 a 1e-4 relative one.
    return [p.case(0.06 * p.g((8, 512)), e=None)]


@_probe("eps_explicit", "an explicit eps (1e-3, or the one given) comparable to mean(x²)")
def _eps_explicit(p: _ProbeInputs) -> list[_Case]:
    return [p.case(0.03 * p.g((8, 512)), e=1e-3 if p.eps is None else p.eps)]


ALL_PROBES = tuple(PROBES)
#: Probes whose failure is reported but does not fail validation: no float32-accumulating
#: implementation can pass them (x² leaves float32's range), and the oracle's answer is shown.
ADVISORY = tuple(name for name, probe in PROBES.items() if probe.advisory)


def _make_cases(probe: str, dt: np.dtype, rng: np.random.Generator,
                shapes: Sequence[tuple[int, ...]] | None, eps: float | None) -> list[_Case]:
    try:
        spec = PROBES[probe]
    except KeyError:
        raise ValueError(f"unknown probe {probe!r}; known: {', '.join(ALL_PROBES)}") from None
    return spec.make(_ProbeInputs(probe, dt, rng, shapes, eps))


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """One probe × dtype × quantity: the worst error and its ratio to the bound."""

    probe: str
    dtype: str
    quantity: str                     # "y", "dx", "dweight", "order", "repeat"
    shape: tuple[int, ...]
    passed: bool
    ratio: float = 0.0                # max over elements of |error| / bound
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: float = 0.0
    worst: tuple[int, int] | None = None   # (row, column) in the (rows, N) view
    advisory: bool = False
    message: str = ""
    diagnoses: list[str] = field(default_factory=list)
    not_applicable: str = ""          # why the probe does not apply to what was declared

    @property
    def ok(self) -> bool:
        return self.passed or self.advisory or bool(self.not_applicable)

    @property
    def status(self) -> str:
        """"pass", "fail", "warn" (an advisory failure) or "n/a" (not applicable)."""
        if self.not_applicable:
            return "n/a"
        if self.passed:
            return "pass"
        return "warn" if self.advisory else "fail"


@dataclass
class ValidationReport:
    """The outcome of :func:`validate`: truthy when every non-advisory case passes."""

    convention: str
    dtypes: tuple[str, ...]
    cases: list[CaseResult]
    diagnoses: list[Diagnosis]
    name: str = "implementation"
    notes: list[str] = field(default_factory=list)     # what was declared and how it was used

    def __bool__(self) -> bool:
        return all(c.ok for c in self.cases)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.ok]

    def lines(self) -> list[str]:
        """The summary and diagnosis lines (what ``assert_rms_norm_close`` raises with)."""
        n_fail = len(self.failures)
        head = (f"{self.name}: {'PASS' if self else 'FAIL'} against convention "
                f"'{self.convention}' ({len(self.cases)} checks, {n_fail} failed)")
        out = [head] + [f"  note: {note}" for note in self.notes]
        for c in self.failures[:12]:
            out.append(f"  FAIL {c.probe}/{c.dtype} {c.quantity}: ratio {_fmt(c.ratio)}, "
                       f"max abs {_fmt(c.max_abs)}, max ulp {_fmt(c.max_ulp)} at {c.worst}"
                       + (f" — {c.message}" if c.message else ""))
        out.extend(d.line() for d in self.diagnoses)
        return out

    def table(self) -> str:
        """One screen: a row per probe × dtype with the observed/bound ratio of y, dx, dweight."""
        rows: dict[tuple[str, str], dict[str, CaseResult]] = {}
        for c in self.cases:
            rows.setdefault((c.probe, c.dtype), {})[c.quantity] = c
        hdr = (f"{'probe':<13}{'dtype':<9}{'y':>9}{'dx':>9}{'dweight':>9}{'ulp(y)':>9}  "
               f"{'worst (q,row,col)':<22}status")
        out = [f"rmsref validate: {self.name} as '{self.convention}' "
               "(ratio = max |error| / bound; pass when <= 1)", hdr, "-" * len(hdr)]
        for (probe, dtype), qs in rows.items():
            def r(q, qs=qs):
                c = qs.get(q)
                if c is None or c.status == "n/a":
                    return "-"
                return _fmt(c.ratio) if not c.message or c.ratio else "ERR"
            worst_c = max(qs.values(), key=lambda c: (not c.ok, c.ratio))
            worst = f"{worst_c.quantity},{worst_c.worst[0]},{worst_c.worst[1]}" \
                if worst_c.worst is not None else ""
            ulp_y = _fmt(qs["y"].max_ulp) if "y" in qs and qs["y"].status != "n/a" else "-"
            status = _row_status(qs.values())
            if probe in ("order", "repeat"):
                msg = next(iter(qs.values())).message
                if not msg or msg not in status:    # ("" is in every status)
                    status += f" ({msg})" if msg else " (identical bits)"
            out.append(f"{probe:<13}{dtype:<9}{r('y'):>9}{r('dx'):>9}{r('dweight'):>9}"
                       f"{ulp_y:>9}  {worst:<22}{status}")
        n_fail = len(self.failures)
        out.append("-" * len(hdr))
        n_na = sum(1 for c in self.cases if c.status == "n/a")
        out.append(f"{'PASS' if self else 'FAIL'}: {len(self.cases)} checks, {n_fail} failed, "
                   f"{sum(1 for c in self.cases if c.status == 'warn')} advisory warnings"
                   + (f", {n_na} not applicable" if n_na else ""))
        out.extend(f"note: {note}" for note in self.notes)
        out.extend(d.line() for d in self.diagnoses)
        return "\n".join(out)

    def to_json(self, path: str | None = None) -> str:
        """All cases and diagnoses as JSON (written to ``path`` when given)."""
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return str(v)
            return v
        doc = {
            "name": self.name, "convention": self.convention, "dtypes": list(self.dtypes),
            "passed": bool(self),
            "notes": list(self.notes),
            "cases": [{"status": c.status, **{k: clean(v) for k, v in asdict(c).items()}}
                      for c in self.cases],
            "diagnoses": [asdict(d) for d in self.diagnoses],
        }
        text = json.dumps(doc, indent=1)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def __str__(self) -> str:
        return self.table()


def _row_status(results) -> str:
    """A table row's status; a failure raised by the implementation carries its text."""
    results = list(results)
    if all(c.status == "n/a" for c in results):
        return f"n/a ({results[0].not_applicable})"
    if all(c.status in ("pass", "n/a") for c in results):
        return "ok"
    if all(c.ok for c in results):
        return "WARN"
    raised = next((c.message for c in results if not c.ok and " raised " in c.message), "")
    return f"FAIL — {raised}" if raised else "FAIL"


# ------------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------------


def _as_rows(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` as (M, N) float64 rows."""
    return np.asarray(a, dtype=np.float64).reshape(-1, n)


def _measure(result: CaseResult, c: Comparison) -> None:
    """Fill the error figures of ``result`` from the comparison ``c``."""
    result.ratio, result.worst = c.ratio, c.worst
    result.max_abs, result.max_rel, result.max_ulp = c.max_abs, c.max_rel, c.max_ulp
    result.passed = c.passed


# ------------------------------------------------------------------------------------------------
# validate
# ------------------------------------------------------------------------------------------------


class _Diagnoser:
    """Collects what each case saw (for :func:`rmsref.diagnosis.diagnose`) and the diagnoses
    of the checks that are not value comparisons (order, repeat, float64 gradient, shapes)."""

    def __init__(self) -> None:
        self.observations: list[diagnosis.Observation] = []
        self.direct: list[Diagnosis] = []

    def observe(self, obs: diagnosis.Observation) -> None:
        self.observations.append(obs)

    def add(self, code: str, where: str, result: CaseResult | None = None, **fields) -> None:
        """A diagnosis found directly by a check (not fitted): ``where`` is "probe/dtype"."""
        ev = diagnosis.Evidence(cases=[where], ratio_before=result.ratio if result else 0.0)
        for d in self.direct:
            if d.code == code:
                if where not in d.evidence.cases:
                    d.evidence.cases.append(where)
                break
        else:
            self.direct.append(diagnosis.make(code, ev, **fields))
        if result is not None and code not in result.diagnoses:
            result.diagnoses.append(code)

    def finish(self) -> list[Diagnosis]:
        fitted = diagnosis.diagnose(self.observations)
        codes = {d.code for d in fitted}
        out = list(fitted)
        if "low_precision_accumulation" in codes:   # it rounds x̂ before w: not a second cause
            codes.add("double_rounding")
            self.direct = [d for d in self.direct if d.code != "double_rounding"]
        for d in self.direct:
            if d.code in codes:        # the same cause, also seen by a direct check
                same = next(f for f in fitted if f.code == d.code)
                same.evidence.cases += [c for c in d.evidence.cases if c not in same.evidence.cases]
            else:
                out.append(d)
        return out


def _call(fn: Callable, *args) -> tuple[Any, str]:
    """``fn(*args)`` with its arrays as NumPy (torch/CuPy outputs included), and "" or what went
    wrong, as a verb phrase: "raised TypeError: ..." or "returned a dict, not an array"."""
    try:
        out = fn(*args)
        items = out if isinstance(out, (tuple, list)) else (out,)
        arrays = tuple(None if o is None else _as_numpy(o) for o in items)
    except Exception as exc:  # the implementation's own error is a result, not our crash
        return None, "raised " + traceback.format_exception_only(type(exc), exc)[-1].strip()
    for o, a in zip(items, arrays, strict=True):
        if a is not None and a.dtype.kind in "OSUV" and a.dtype not in FLOAT_DTYPES.values():
            return None, f"returned {_returned(o)}, not an array of numbers"
    return (arrays if isinstance(out, (tuple, list)) else arrays[0]), ""


def validate(
    forward: Forward,
    backward: Backward | None = None,
    *,
    convention: str = "torch",
    dtypes: Sequence[str] = ("float32", "bfloat16", "float16"),
    shapes: Sequence[tuple[int, ...]] | None = None,
    probes: str | Sequence[str] = "all",
    eps: float | None = None,
    seed: int = 0,
    form: tol.Form = "probabilistic",
    repeat: bool = True,
    name: str = "implementation",
    progress: Progress | None = None,
    eps_default: float | None = None,
    normalized_dims: NormalizedDims | None = None,
) -> ValidationReport:
    """Check ``forward`` (and ``backward``) against the oracle under rounding-error bounds.

    Parameters
    ----------
    forward : callable
        ``forward(x, normalized_shape, weight=None, eps=None) -> y`` on NumPy arrays.
    backward : callable, optional
        ``backward(dy, x, normalized_shape, weight=None, eps=None) -> (dx, dweight)``.
    convention : str
        What the implementation claims to compute (:mod:`rmsref.conventions`): sets the eps
        default, the weight offset (``gemma``: 1 + w), the number of output roundings allowed,
        and the rounding order expected on half types.
    dtypes : sequence of str
        Input dtypes to run (x, weight and dy share the dtype).
    shapes : sequence of tuples, optional
        Shapes of the ``gaussian`` probe (default ``[(16, 768)]``); the last dim is normalised.
    probes : "all" or sequence of str
        Which probes to run (:data:`ALL_PROBES`).
    eps : float, optional
        None: probes pass eps=None (the implementation's default) except ``eps_explicit``; a
        float: every probe except ``eps_default`` and ``underflow`` passes it.
    seed : int
        Seed of the probe inputs.
    form : {"probabilistic", "deterministic"}
        The form of the accumulation term γ (:func:`rmsref.tolerance.gamma_acc`).
    repeat : bool
        Also call twice on the same inputs and require identical bits (determinism).
    name : str
        How the implementation is called in the report.
    progress : callable, optional
        ``progress(done, total, label)`` after each probe × dtype.
    eps_default : float, optional
        The eps the implementation uses when called with eps=None, when it differs from the
        convention's. Default: what the implementation declares (an adapter reads a module's
        ``eps`` / ``variance_epsilon`` / ``epsilon``), else the convention's.
    normalized_dims : {"any", "last"}, optional
        "last" when it normalises the last dimension only: the multi-dimensional probe is then
        reported as not applicable. Default: what the implementation declares, else "any".

    What the implementation declares (``forward.rmsref_declared``, set by the adapters; see
    :mod:`rmsref._declared`) is respected: its eps default, normalised dims, whether it has a
    weight and takes an eps. A probe that does not apply is reported with status "n/a" and the
    reason, never as a failure; the report's ``notes`` say what was declared and used.

    Returns
    -------
    ValidationReport
        Truthy when every non-advisory check passes; ``.table()``, ``.lines()``, ``.to_json()``.
    """

    conv = conv_mod.get(convention)
    if convention == "paper":
        raise ValueError("validate checks RMSNorm with eps inside the square root; the 'paper' "
                         "convention (x / (rms + eps)) is a different function: compare it with "
                         "rmsref.conventions.emulate('paper', ...) instead")
    probe_list = list(ALL_PROBES) if probes == "all" else list(
        [probes] if isinstance(probes, str) else probes)
    for p in probe_list:
        if p not in ALL_PROBES:
            raise ValueError(f"unknown probe {p!r}; known: {', '.join(ALL_PROBES)}")
    dtype_list = [d if isinstance(d, str) else np.dtype(d).name for d in dtypes]
    for d in dtype_list:
        _dt(d)
    declared = declared_by(forward).overridden(eps_default=eps_default,
                                               normalized_dims=normalized_dims)
    declared_conv, notes = _as_declared(conv, declared)
    run = _Run(forward, backward, declared_conv, conv.default_offset, form, seed, declared)
    total = len(probe_list) * len(dtype_list)
    done = 0

    for dname in dtype_list:
        dt = _dt(dname)
        for probe in probe_list:
            rng = np.random.default_rng([seed, ALL_PROBES.index(probe), list(FLOAT_DTYPES).index(
                dname)])
            for c in _make_cases(probe, dt, rng, shapes, eps):
                run.check_case(c, dname, dt)
            done += 1
            if progress is not None:
                progress(done, total, f"{probe}/{dname}")
        if conv.order_rival and dt in (FLOAT_DTYPES["float16"], FLOAT_DTYPES["bfloat16"]):
            run.check_order(convention, dname, dt)
        if repeat:
            run.check_repeat(dname, dt)
    if backward is not None and "gaussian" in probe_list and "float64" in dtype_list:
        run.check_float64_gradient()

    return ValidationReport(convention, tuple(dtype_list), run.cases, run.diag.finish(), name,
                            notes)


def _as_declared(conv: conv_mod.Convention, declared: Declared
                 ) -> tuple[conv_mod.Convention, list[str]]:
    """The convention with the implementation's declared eps default, and notes saying so."""
    notes = []
    if declared.eps_default is not None:
        e = declared.eps_default
        conv = replace(conv, default_eps=lambda dt: e,
                       eps_default=f"{e:g}, declared by the implementation")
        notes.append(f"eps=None probes use the implementation's declared eps {e:g} (the "
                     f"'{conv.name}' convention's default is not used)")
    if declared.normalized_dims == "last":
        notes.append("the implementation normalises the last dimension only")
    if declared.param_dtype is not None:
        notes.append(f"its own parameters are {declared.param_dtype}; each probe passes its "
                     "weight in the probe's dtype")
    if not declared.has_weight:
        notes.append("the implementation has no weight: the probes' weights are dropped and "
                     "y = x·rstd is checked")
    if not declared.takes_eps:
        notes.append("the implementation takes no eps: probes with an explicit eps do not apply")
    if declared.offset is not None and declared.offset != conv.default_offset:
        notes.append(f"the implementation uses its weight as {declared.offset:g} + w, the "
                     f"'{conv.name}' convention as {conv.default_offset:g} + w")
    return conv, notes


def _not_applicable(c: _Case, declared: Declared) -> str:
    """Why probe case ``c`` does not apply to what the implementation declares ("" if it does)."""
    if declared.normalized_dims == "last" and len(c.shape) > 1:
        return f"normalises the last dimension only; this probe normalises {len(c.shape)} dims"
    if not declared.takes_eps and c.eps is not None:
        return f"takes no eps; this probe passes eps={c.eps:g}"
    return ""


def _returned(obj: Any) -> str:
    """What a user's callable returned, in words (for error messages)."""
    if obj is None:
        return "None"
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)} item(s)"
    shape = getattr(obj, "shape", None)
    return f"a {type(obj).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")


def _label(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class _Run:
    """One ``validate`` call: the implementation, the convention and form it is judged by, and
    what the checks found (``cases``, and ``diag`` collecting observations for the diagnosis).

    Each check is a method: a probe case, the rounding order, two identical calls, the float64
    gradient. ``conv`` is the convention with the implementation's declared eps default.
    """

    def __init__(self, forward: Forward, backward: Backward | None, conv: conv_mod.Convention,
                 offset: float, form: str, seed: int, declared: Declared) -> None:
        self.forward, self.backward = forward, backward
        self.conv, self.offset, self.form, self.seed = conv, offset, form, seed
        self.declared = declared
        self.cases: list[CaseResult] = []
        self.diag = _Diagnoser()

    def check_case(self, c: _Case, dname: str, dt: np.dtype) -> None:
        """Probe case ``c``, or its "n/a" when it does not apply to what was declared."""
        reason = _not_applicable(c, self.declared)
        if reason:
            self.cases.append(CaseResult(c.probe, dname, "y", tuple(c.x.shape), False,
                                         not_applicable=reason))
            return
        if not self.declared.has_weight:
            c.weight = None
        self.compare_case(c, dname, dt)

    def compare_case(self, c: _Case, dname: str, dt: np.dtype) -> None:
        """Run probe case ``c`` through the implementation and compare y, dx, dweight with the
        oracle on the same inputs (:mod:`rmsref.comparison`); record what was seen for the
        diagnosis."""
        forward, backward, conv, offset = self.forward, self.backward, self.conv, self.offset
        cases, diag = self.cases, self.diag
        shape = c.shape
        n = int(np.prod(shape))
        where = f"{c.probe}/{dname}"
        eps_val = conv.default_eps(dt) if c.eps is None else float(c.eps)
        ref = Reference(c.x, shape, c.weight, eps_val, dy=c.dy, offset=offset)
        model = conv.error_model(dt, n, ref.rows, self.form)
        advisory = c.probe in ADVISORY
        mask = None
        if c.skip_rows:
            mask = np.ones(ref.rows, bool)
            mask[list(c.skip_rows)] = False
        shape_arg = shape if len(shape) > 1 else shape[0]

        # -- forward ------------------------------------------------------------------------------
        res = CaseResult(c.probe, dname, "y", tuple(c.x.shape), False, advisory=advisory)
        cases.append(res)
        y, err = _call(forward, c.x, shape_arg, c.weight, c.eps)
        if err or y is None:
            res.message = (f"forward {_label(forward)} {err}" if err else
                           f"forward {_label(forward)} returned None; expected y shaped like x "
                           f"{c.x.shape}")
            res.ratio = math.inf
        else:
            y = _as_numpy(y)
            if y.shape != c.x.shape:
                res.message = f"y has shape {y.shape}, expected {c.x.shape}"
                res.ratio = math.inf
            else:
                if y.dtype != dt:
                    res.message = f"y has dtype {y.dtype}, expected {dt} (the input dtype)"
                yrows = _as_rows(y, n)
                _measure(res, compare("y", yrows, ref, model, mask_rows=mask))
                if res.message:
                    res.passed = False
                if mask is not None:
                    _containment(res, yrows, mask)
                if not advisory:
                    diag.observe(_observation(c, "y", yrows, model, res, eps_val, offset, mask))

        # -- backward -----------------------------------------------------------------------------
        if backward is None or c.probe == "nan_inf":
            return
        out, err = _call(backward, c.dy, c.x, shape_arg, c.weight, c.eps)
        rdx = CaseResult(c.probe, dname, "dx", tuple(c.x.shape), False, advisory=advisory)
        cases.append(rdx)
        if err or not isinstance(out, (tuple, list)) or len(out) != 2:
            rdx.message = (f"backward {_label(backward)} {err}" if err else
                           f"backward {_label(backward)} returned {_returned(out)}; expected the "
                           "pair (dx, dweight) (dweight None when there is no weight)")
            rdx.ratio = math.inf
            return
        dx, dw = out[0], out[1] if len(out) > 1 else None
        dx = _as_numpy(dx)
        if dx.shape != c.x.shape:
            rdx.message = f"dx has shape {dx.shape}, expected {c.x.shape}"
            rdx.ratio = math.inf
        else:
            _measure(rdx, compare("dx", dx, ref, model))
            if dx.dtype != dt:
                rdx.message = f"dx has dtype {dx.dtype}, expected {dt}"
                rdx.passed = False
            if not advisory:
                diag.observe(_observation(c, "dx", _as_rows(dx, n), model, rdx, eps_val, offset))
        if c.weight is None:
            return
        rdw = CaseResult(c.probe, dname, "dweight", tuple(c.weight.shape), False, advisory=advisory)
        cases.append(rdw)
        if dw is None:
            rdw.message = "backward returned no dweight"
            rdw.ratio = math.inf
            return
        dw = _as_numpy(dw)
        if dw.size != n or (dw.shape != c.weight.shape and dw.shape != (n,)):
            rdw.message = f"dweight has shape {dw.shape}, expected {c.weight.shape}"
            rdw.ratio = math.inf
            diag.add("dweight_reduction", where, rdw, rows_used=f"dweight has shape {dw.shape}, "
                     f"the weight {c.weight.shape}: summed over the wrong axes")
            return
        _measure(rdw, compare("dweight", dw, ref, model))
        if not advisory:
            diag.observe(_observation(c, "dweight", dw.reshape(1, n), model, rdw, eps_val, offset))

    def check_order(self, convention: str, dname: str, dt: np.dtype) -> None:
        """On half types, the rounding order must be the convention's (bit-exact majority)."""
        forward, seed, declared = self.forward, self.seed, self.declared
        cases, diag = self.cases, self.diag
        rival = conv_mod.get(convention).order_rival
        rng = np.random.default_rng([seed, 99])
        n = 768
        x = _cast(2.0 * rng.standard_normal((32, n)), dt)
        w = _cast(1.0 + 0.3 * rng.standard_normal(n), dt) if declared.has_weight else None
        eps = 1e-5 if declared.takes_eps else None     # None: the implementation's own eps
        eps_emul = eps if eps is not None else declared.eps_default
        res = CaseResult("order", dname, "order", tuple(x.shape), False)
        cases.append(res)
        y, err = _call(forward, x, n, w, eps)
        if err or y is None:
            res.message = f"forward {_label(forward)} {err}" if err else (
                f"forward {_label(forward)} returned None")
            res.ratio = math.inf
            return
        yrows = _as_rows(y, n)
        # The implementation's own rstd (read back from a float32 run) keeps last-bit differences of
        # its sum out of the comparison; without it, ours (correctly rounded) is used. A 1 + w
        # module is read back with w = 0, the neutral weight of its convention.
        offset = conv_mod.get(convention).default_offset
        r = conv_mod.estimate_rstd(forward, x, eps, offset=offset)
        own = _match(yrows, conv_mod.emulate(convention, x, w, eps_emul, rstd=r), n)
        alt = _match(yrows, conv_mod.emulate(rival, x, w, eps_emul, rstd=r), n)
        res.max_rel = 1.0 - own                # fraction of elements not bit-identical
        res.ratio = (1.0 - own) / max(1.0 - alt, 1e-12) if own < alt else 0.0
        res.passed = own >= alt or alt < 0.5    # neither order fits: other checks say why
        res.message = f"bit-exact with '{convention}' {own:.1%}, with '{rival}' {alt:.1%}"
        if not res.passed:
            _order_diagnosis(diag, convention, rival, own, alt, f"order/{dname}", res)

    def check_repeat(self, dname: str, dt: np.dtype) -> None:
        """Two identical calls must give identical bits (forward and, when given, backward)."""
        forward, backward, seed, declared = self.forward, self.backward, self.seed, self.declared
        cases, diag = self.cases, self.diag
        rng = np.random.default_rng([seed, 98])
        n = 1024
        x = _cast(2.0 * rng.standard_normal((64, n)), dt)
        w = _cast(1.0 + 0.3 * rng.standard_normal(n), dt) if declared.has_weight else None
        g = _cast(rng.standard_normal((64, n)), dt)
        res = CaseResult("repeat", dname, "repeat", tuple(x.shape), True)
        cases.append(res)
        y1, e1 = _call(forward, x, n, w, None)
        y2, e2 = _call(forward, x, n, w, None)
        if e1 or e2:
            res.passed, res.message = False, f"forward {_label(forward)} {e1 or e2}"
            return
        bad = []
        if not _same_bits(y1, y2):
            bad.append("y")
        if backward is not None:
            o1, e1 = _call(backward, g, x, n, w, None)
            o2, e2 = _call(backward, g, x, n, w, None)
            if not (e1 or e2):
                if not _same_bits(o1[0], o2[0]):
                    bad.append("dx")
                if len(o1) > 1 and o1[1] is not None and not _same_bits(o1[1], o2[1]):
                    bad.append("dweight")
        if bad:
            res.passed = False
            res.message = "two identical calls gave different bits in " + ", ".join(bad)
            what = "dweight" if bad == ["dweight"] else "/".join(bad)
            diag.add("nondeterministic", f"repeat/{dname}", res, what=what)

    def check_float64_gradient(self) -> None:
        """In float64, the backward must be the derivative of the implementation's *own* forward.

        Directional central differences along a random v (and a random weight direction):
        <dy, (f(x + hv) − f(x − hv)) / 2h> must equal <dx, v> (+ <dw, v_w>) to ~1e-7 relative
        (truncation h² ≈ 1e-10, rounding u/h ≈ 1e-10 of the terms' size). Skipped (not failed) when
        the implementation refuses float64 or computes below float64 accuracy.
        """
        forward, backward, seed, declared = self.forward, self.backward, self.seed, self.declared
        cases, diag = self.cases, self.diag
        rng = np.random.default_rng([seed, 97])
        m, n = 4, 64
        x = 2.0 * rng.standard_normal((m, n))
        w = 1.0 + 0.3 * rng.standard_normal(n)
        g = rng.standard_normal((m, n))
        v = rng.standard_normal((m, n))
        vw = rng.standard_normal(n)
        if not declared.has_weight:
            w, vw = None, np.zeros(n)
        eps = 1e-5 if declared.takes_eps else None
        res = CaseResult("gradcheck", "float64", "dx", (m, n), True)
        y0, err = _call(forward, x, n, w, eps)
        if err or y0 is None or np.asarray(y0).dtype != np.float64:
            return                                              # no float64 support: nothing to do
        cases.append(res)
        out, err = _call(backward, g, x, n, w, eps)
        if err or out is None:
            res.passed, res.ratio = False, math.inf
            res.message = (f"backward {err}" if err else "backward returned None") + \
                " in float64"
            return
        h = 1e-6
        yp = np.asarray(forward(x + h * v, n, None if w is None else w + h * vw, eps), np.float64)
        ym = np.asarray(forward(x - h * v, n, None if w is None else w - h * vw, eps), np.float64)
        # Second difference y(x+hv) − 2y(x) + y(x−hv) = O(h²) ≈ 1e-12 for a float64 computation; far
        # larger means float64 in name only (e.g. an internal cast to float32): h is then too small.
        y0 = np.asarray(y0, np.float64)
        if not np.max(np.abs(yp - 2.0 * y0 + ym)) <= 1e-9 * np.max(np.abs(y0)):
            cases.remove(res)
            return
        fd = float(np.sum(g * (yp - ym)) / (2 * h))             # directional derivative of <g, f>
        dx = np.asarray(out[0], np.float64)
        dw = np.zeros(n) if out[1] is None else np.asarray(out[1], np.float64).reshape(-1)
        if dx.shape != x.shape or dw.size != n:
            res.message = "gradcheck skipped: dx or dweight has the wrong shape (reported above)"
            return
        an = float(np.sum(dx * v) + np.sum(dw * vw))            # the backward's answer
        scale = float(np.sum(np.abs(g * (yp - ym))) / (2 * h)) + 1e-300
        res.max_abs = abs(fd - an)
        res.ratio = res.max_abs / (1e-7 * scale)
        res.passed = res.ratio <= 1.0
        res.message = f"<dy, J v> by central differences {fd:.10g}, from the backward {an:.10g}"
        if not res.passed:
            diag.add("inconsistent_backward", "gradcheck/float64", res)


def _observation(c: _Case, quantity: str, got_rows: np.ndarray, model: tol.ErrorModel,
                 res: CaseResult, eps_val: float, offset: float,
                 mask: np.ndarray | None = None) -> diagnosis.Observation:
    """What the diagnosis engine needs of one compared quantity."""
    return diagnosis.Observation(
        c.probe, quantity, c.x, c.shape, c.weight, c.dy, c.eps, eps_val, offset,
        np.asarray(got_rows, np.float64), model, res.ratio, res.ratio <= 1.0, mask, res.diagnoses)


def _containment(res: CaseResult, yrows: np.ndarray, mask: np.ndarray) -> None:
    """Rows with NaN/Inf in x may be anything; the other rows must be finite (checked above)."""
    clean = yrows[mask]
    if clean.size and not np.all(np.isfinite(clean)):
        res.passed = False
        res.message = "NaN/Inf leaked out of its row"


def _order_diagnosis(diag: _Diagnoser, expected: str, rival: str, own: float, alt: float,
                     where: str, res: CaseResult) -> None:
    """The output matches the rival convention's rounding order better than the expected one."""
    rates = {"alt": f"{alt:.1%}", "own": f"{own:.1%}", "match": f"{alt:.1%}"}
    if rival == "llama":
        diag.add("double_rounding", where, res, **rates)
    elif rival == "torch":
        diag.add("single_rounding", where, res, **rates)
    elif rival == "gemma_wdtype":
        diag.add("offset_rounding", where, res, how="rounded to the weight dtype before it "
                 "multiplies (R_w(1 + w))", fix_how="add the 1 in float32: (1 + w.float())",
                 **rates)
    else:
        diag.add("offset_rounding", where, res, how="added in float32 where the weight dtype "
                 "was expected", fix_how="round 1 + w to the weight dtype first, or validate "
                 "against 'gemma'", **rates)


def _match(yrows: np.ndarray, ye: np.ndarray, n: int) -> float:
    a = yrows.astype(np.float64)
    b = _as_rows(ye, n)
    if a.size == 0:
        return 1.0
    return float(np.mean((a == b) | (np.isnan(a) & np.isnan(b))))


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                               np.ascontiguousarray(b).view(np.uint8)))
