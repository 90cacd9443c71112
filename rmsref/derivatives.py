"""Gradient verification for any callables on NumPy arrays.

``gradcheck(forward, backward, inputs)`` checks a hand-written backward pass (a VJP) against the
forward it claims to differentiate, and optionally a JVP and a double backward. It is built to
catch the bugs that ``torch.autograd.gradcheck`` (fast mode) and ``jax.test_util.check_grads``
let through:

* the ground truth is the **complex step** J·v = Im f(x + i·h·v) / h (h·v about 1e-30 of the
  inputs, h a power of two so that h·v is exact). It has no subtractive cancellation, so it is exact
  to working precision (~1e-16 in float64), six orders better than any finite difference. It
  needs a forward that is holomorphic in its inputs (computes with ``x*x``, ``np.sqrt``; not
  ``abs``, ``conj``, ``np.linalg.norm``): this is *detected* by comparing with one coarse central
  difference, and the check falls back to Richardson extrapolation with a message saying why;
* the transpose identity  ⟨u, J·v⟩ = ⟨Jᵀ·u, v⟩  is tested with Gaussian u and v, and the
  tolerance is ``rtol · Σ_i |u_i (J·v)_i|`` -- the size of the terms actually summed. It is never
  multiplied by the array size (jax) nor by Σu·Σv with non-negative u, v (torch), which at
  N = 4096 hide a single wrong Jacobian entry unless it is hundreds of times the largest entry;
* the analytic JVP is compared with the analytic VJP without any finite difference, the backward
  is itself differentiated (forward-over-reverse), and a double backward is checked against that.

Where a derivative is itself the small difference of large terms (RMSNorm at N = 1, whose
derivative is ~1e-16 of its terms), no computation knows it better than rounding: a
*cancellation floor* modelled from the forward's values (``_Floor``) is added to the scale so
that such points do not raise false alarms; it is negligible wherever the scale has not
collapsed. Comparisons whose scale leaves float64's normal range are skipped, never passed.

Conventions.
``forward(*inputs)`` returns an array (or a tuple of arrays). ``backward(dy, *inputs)`` returns a
tuple with one entry per input: the gradient, or ``None``. ``dy`` has the structure of the
forward's output (an array, or a tuple of arrays). ``jvp(inputs, tangents)`` takes two tuples
aligned with ``inputs`` (a tangent is ``None`` for an input held constant) and returns the output
tangent(s). ``double_backward(ddgrads, dy, *inputs)`` returns ``(ddy, *dinputs)``: the VJP of the
backward, given cotangents ``ddgrads`` (a tuple aligned with ``inputs``, ``None`` for an input
that is not differentiated; a differentiated input whose backward returned ``None`` gets an
array too, its gradient being read as zeros) of the backward's outputs.

**Which inputs are differentiable.** ``wrt`` names them (indices into ``inputs``). By default
(``wrt=None``) every input that is a real floating-point NumPy array is; anything else (``None``,
ints, floats, shape tuples, integer arrays) is passed through untouched as a constant. A ``None``
gradient for a differentiable input is read as "this input does not affect the output" and is
*checked*: the forward's derivative along that input must vanish. So a backward that forgets
``dweight`` fails, while a genuinely constant float array should be left out with ``wrt``.

Evaluation counts (fast mode, the default).
With K differentiable inputs and D = ``n_directions`` (default 4):

* forward: 1 real evaluation, plus 4 real + 1 complex for the holomorphy test (method "complex"),
  plus 1 real per input shaped like an output (the secant of the cancellation floor, see
  ``_Floor``), plus K·D numerical JVPs costing 1 complex ("complex"), 4 real ("central") or 6
  real ("richardson") evaluations each;
* backward: D + 1 (the extra one is the reentrancy check);
* jvp: K·D when given;
* second order (when the backward accepts complex input; ``second_order=None`` detects it):
  backward: 1 real (the gradients at the point), 4 real + 1 complex for the holomorphy test,
  2·K·T real (which gradient depends on which input; T = 3 draws when the differentiable
  inputs hold fewer than 4096 elements, else 1), 2·P complex for P = ceil(D/2) direction
  pairs; forward: 1 complex per input shaped like an output (its radial derivative) and 6·P
  complex; with ``double_backward``: (K+1)·P complex backward and (K+1)·P double_backward
  evaluations;
* only after a failure: at most ``localize_budget`` (default 64) further evaluations per failing
  input, spent bisecting the input to find the worst entries.

None of these depends on the array sizes: fast mode is O(1) evaluations whatever N. The
evaluations actually made are in ``result.evaluations``.

``full=True`` adds the whole Jacobian: for each differentiable input, its n_k columns by complex
step (batched along a new leading axis when the forward broadcasts over one, verified on two
columns, otherwise one call per column) against all n_out rows by VJP (one backward call per
output element); memory is n_out·Σn_k floats. On 4 rows x N = 512 with the NumPy oracle this is
2048 backward calls plus 2560 columns: the backward calls dominate the time.
"""

from __future__ import annotations

import functools
import heapq
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rmsref._shapes import real_scalar

METHODS = ("complex", "central", "richardson")

#: Default rtol is RTOL_ULPS unit roundoffs of the least precise dtype among the forward's output
#: and the gradients (2^10 · 2^-53 ≈ 1.1e-13 in float64). Measured on the correct oracle over the
#: no-false-alarm sweep of tests/test_gradcheck.py (200 seeds, N = 1..4096, rows 1..64): worst
#: observed/tolerance ratio 0.14, so the margin is ~7x at worst and ~1000x typically; a single
#: entry of dx wrong by 1e-6 at N = 4096 is caught at ratio ~400-900.
RTOL_ULPS = 2.0**10
#: The largest default rtol gradcheck will judge with: float32's is 2^-14, but float16's would be
#: 0.5 and bfloat16's 4, at which a gradient three times too large passes. Past it the
#: comparisons are not made (the result says NOT CHECKED and why); an explicit rtol is used as
#: given.
MAX_DEFAULT_RTOL = 2.0**-10
#: Safety factor applied to finite-difference error estimates (they are estimates, not bounds).
FD_SAFETY = 8.0
#: A complex step disagreeing with a coarse central difference by more than this (relative, in
#: the 1-norm) means the forward is not holomorphic (abs, conj, norm...) or drops imaginary parts.
HOLOMORPHY_RTOL = 1e-5


class NotComplexCapable(Exception):
    """The callable cannot be differentiated by complex step (raised internally)."""


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------


@dataclass
class WorstEntry:
    """One localised disagreement: where it is, both values, the error and its tolerance."""

    input_index: tuple[int, ...]
    output_index: tuple[int, ...] | None
    analytic: float
    numerical: float
    error: float
    tolerance: float

    @property
    def ratio(self) -> float:
        return _ratio(self.error, self.tolerance)

    def describe(self, input_name: str) -> str:
        where = f"{input_name}[{', '.join(map(str, self.input_index))}]"
        if self.output_index is not None:
            where = f"d out[{', '.join(map(str, self.output_index))}] / d {where}"
        return (
            f"{where}: analytic {self.analytic:.9e}, numerical {self.numerical:.9e}, "
            f"error {self.error:.2e}, tolerance {self.tolerance:.2e} (ratio {self.ratio:.3g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_index": list(self.input_index),
            "output_index": None if self.output_index is None else list(self.output_index),
            "analytic": self.analytic,
            "numerical": self.numerical,
            "error": self.error,
            "tolerance": self.tolerance,
            "ratio": self.ratio,
        }


@dataclass
class CheckResult:
    """One check on one input (or on the whole function when ``input`` is None).

    ``observed`` and ``tolerance`` are relative to the check's scale (e.g. Σ|u_i (Jv)_i| for the
    transpose identity), ``ratio = observed / tolerance``; the check passes when ratio <= 1.
    ``passed`` is None for a skipped check, with the reason in ``note``.
    """

    name: str
    input: str | None
    passed: bool | None
    observed: float = 0.0
    tolerance: float = 0.0
    ratio: float = 0.0
    worst: list[WorstEntry] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "input": self.input,
            "passed": self.passed,
            "observed": self.observed,
            "tolerance": self.tolerance,
            "ratio": self.ratio,
            "worst": [w.to_dict() for w in self.worst],
            "note": self.note,
        }


#: Checks of the callables' structure, not comparisons of derivatives.
_STRUCTURAL = ("shapes", "reentrancy")


class GradcheckResult:
    """What ``gradcheck`` found. Truthy when every check that ran passed.

    Attributes
    ----------
    checks : list of CheckResult
    method : str
        The method actually used for numerical derivatives of the forward (after any fallback).
    notes : list of str
        Why a method was changed or a check skipped.
    evaluations : dict
        Number of calls made to each callable ("forward", "forward_complex", "backward", ...).
    """

    def __init__(
        self,
        checks: list[CheckResult],
        method: str,
        notes: list[str],
        evaluations: dict[str, int],
        settings: dict[str, Any],
    ) -> None:
        self.checks = checks
        self.method = method
        self.notes = notes
        self.evaluations = evaluations
        self.settings = settings

    @property
    def passed(self) -> bool:
        """No check failed and at least one comparison was made (all skipped is not a pass)."""
        return all(c.passed is not False for c in self.checks) and self.compared()

    def compared(self) -> bool:
        """Whether any comparison check (not the structural ones) ran."""
        return any(c.passed is not None for c in self.checks if c.name not in _STRUCTURAL)

    def __bool__(self) -> bool:
        return self.passed

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if c.passed is False]

    def check(self, name: str, input: str | None = None) -> CheckResult:
        """The first check called ``name`` (on ``input`` when given)."""
        for c in self.checks:
            if c.name == name and (input is None or c.input == input):
                return c
        raise KeyError(f"no check {name!r} on input {input!r}; have "
                       f"{[(c.name, c.input) for c in self.checks]}")

    def max_ratio(self, name: str | None = None) -> float:
        """Largest observed/tolerance ratio over the checks that ran (named ``name`` if given)."""
        ratios = [c.ratio for c in self.checks
                  if c.passed is not None and (name is None or c.name == name)]
        return max(ratios, default=0.0)

    def report(self) -> str:
        """A table: per check and input, observed, tolerance, ratio, worst entries if failed."""
        n_fail = len(self.failures())
        n_run = sum(c.passed is not None for c in self.checks)
        head = "gradcheck: PASSED" if self.passed else f"gradcheck: FAILED ({n_fail} of {n_run})"
        if not n_fail and not self.compared():
            head = "gradcheck: NOT CHECKED (every comparison was skipped; see the notes)"
        lines = [f"{head}   method: {self.method}   rtol: {self.settings.get('rtol', 0):.3g}"]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  {'check':<18} {'input':<12} {'observed':>10} {'tolerance':>10} "
                     f"{'ratio':>10}  status")
        for c in self.checks:
            status = {True: "ok", False: "FAIL", None: "skipped"}[c.passed]
            if c.passed is None:  # the note may say "skipped: ..." itself: say it once
                why = c.note if c.note.startswith(f"{status}: ") else f"{status}: {c.note}"
                lines.append(f"  {c.name:<18} {c.input or '-':<12} {'':>10} {'':>10} {'':>10}  "
                             f"{why}")
                continue
            lines.append(f"  {c.name:<18} {c.input or '-':<12} {c.observed:>10.2e} "
                         f"{c.tolerance:>10.2e} {c.ratio:>10.3g}  {status}")
            if c.note and c.passed is False:
                lines.append(f"      {c.note}")
            for w in c.worst:
                lines.append(f"      {w.describe(c.input or 'input')}")
        ev = ", ".join(f"{k} {v}" for k, v in self.evaluations.items() if v)
        lines.append(f"  evaluations: {ev}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "method": self.method,
            "notes": list(self.notes),
            "evaluations": dict(self.evaluations),
            "settings": dict(self.settings),
            "checks": [c.to_dict() for c in self.checks],
        }

    def __repr__(self) -> str:
        return (f"GradcheckResult(passed={self.passed}, method={self.method!r}, "
                f"failures={[(c.name, c.input) for c in self.failures()]})")


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------


def _tolerance(value: Any, name: str) -> float:
    """rtol or atol: a finite non-negative real number (a NaN tolerance would pass anything)."""
    v = real_scalar(value, name)
    if v < 0:
        raise ValueError(f"{name} must be a finite non-negative real number; got {value!r}")
    return v


def _non_finite(a: Any) -> str:
    """'3 NaN/Inf element(s), the first at (1, 2)'."""
    a = np.asarray(a)
    bad = np.argwhere(~np.isfinite(a))
    first = tuple(int(i) for i in bad[0]) if bad.size else ()
    return f"{len(bad)} NaN/Inf element(s), the first at {first}"


def _not_checkable(what: str, problems: list[str], method: str, counts: dict[str, int],
                   rtol: float | None, atol: float, seed: int) -> GradcheckResult:
    """A failed result for a point where no derivative can be compared (never a pass)."""
    note = (f"the {what} has NaN/Inf at this point ({'; '.join(problems)}): a derivative "
            "there cannot be checked")
    check = CheckResult(what, None, False, math.nan, 0.0, math.inf, note=note)
    return GradcheckResult([check], method, [note], counts,
                           {"rtol": rtol or 0.0, "atol": atol, "seed": seed})


def _ratio(err: float, tol: float) -> float:
    """err / tol; a NaN or infinite error always fails."""
    if not math.isfinite(err):
        return math.inf
    if tol > 0:
        return err / tol
    return 0.0 if err == 0 else math.inf


def _is_float_array(a: Any) -> bool:
    """A real floating NumPy array (float16/32/64 or ml_dtypes' bfloat16)."""
    return isinstance(a, np.ndarray) and (a.dtype.kind == "f" or a.dtype.name == "bfloat16")


def _unit_roundoff(dtype: np.dtype) -> float:
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return 2.0**-8
    if dtype.kind == "c":
        dtype = np.dtype(np.float32) if dtype == np.complex64 else np.dtype(np.float64)
    if dtype.kind != "f":
        return 2.0**-53
    return float(np.finfo(dtype).eps) / 2


def _as_list(out: Any) -> tuple[list[np.ndarray], bool]:
    """Forward/backward output as a list of arrays, and whether it was a tuple/list."""
    if isinstance(out, (tuple, list)):
        return [np.asarray(o) for o in out], True
    return [np.asarray(out)], False


def _pow2(x: float) -> float:
    """The power of two nearest to x > 0 (steps that are powers of two keep h·v exact)."""
    return 2.0 ** round(math.log2(x))


def _relative(v: np.ndarray, x: Any) -> np.ndarray:
    """v scaled elementwise by |x| (floored at 2^-26·max|x|, max|x| taken as 1 for an all-zero
    x): a direction for finite differences.

    A finite-difference step must be small relative to each element, not only to the largest: a
    Gaussian direction with a global step moves a tiny element (an RMSNorm row near zero, whose
    curvature lives at the scale sqrt(eps)) across its whole nonlinear region.
    """
    a = np.abs(np.asarray(x, np.float64))
    big = float(np.max(a[np.isfinite(a)], initial=0.0)) or 1.0
    return v * np.maximum(np.where(np.isfinite(a), a, big), 2.0**-26 * big)


def _scale_of(arrays: Sequence[np.ndarray]) -> float:
    """The largest finite magnitude in the arrays; 1 where there is none (all zero)."""
    m = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64) if a.dtype.kind != "c" else np.abs(a)
        finite = a[np.isfinite(a)]
        if finite.size:
            m = max(m, float(np.max(np.abs(finite))))
    return m if m > 0 else 1.0


def _dot(a: Sequence[np.ndarray | None], b: Sequence[np.ndarray | None]) -> float:
    """Σ over pairs of ⟨a_i, b_i⟩ in float64 (None counts as zero)."""
    s = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # overflow: inf/nan, judged by _Worst
        for x, y in zip(a, b, strict=True):
            if x is None or y is None:
                continue
            s += float(np.sum(np.asarray(x, np.float64) * np.asarray(y, np.float64)))
    return s


def _absdot(a: Sequence[np.ndarray | None], b: Sequence[np.ndarray | None]) -> float:
    """Σ over pairs of Σ|a_i b_i| (the scale of the terms of ⟨a, b⟩)."""
    s = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for x, y in zip(a, b, strict=True):
            if x is None or y is None:
                continue
            s += float(np.sum(np.abs(np.asarray(x, np.float64) * np.asarray(y, np.float64))))
    return s


class _Counted:
    """A callable that counts its calls into a shared dict (real and complex separately) and
    checks what it returns with ``expect(out, name)`` (``_expect_arrays`` for a forward or a
    JVP, ``_expect_grads`` for a backward), so that a user's callable returning the wrong thing
    is reported naming the callable and what it returned, not as an error deep inside."""

    def __init__(self, fn: Callable[..., Any], name: str, counts: dict[str, int],
                 expect: Callable[[Any, str], None] | None = None) -> None:
        self.fn, self.name, self.counts, self.expect = fn, name, counts, expect

    def __call__(self, *args: Any, complex_: bool = False) -> Any:
        key = f"{self.name}_complex" if complex_ else self.name
        self.counts[key] = self.counts.get(key, 0) + 1
        out = self.fn(*args)
        if self.expect is not None:
            self.expect(out, self.name)
        return out


def _what(out: Any) -> str:
    """A short description of a returned value for an error message."""
    if isinstance(out, np.ndarray):
        return f"an array of shape {out.shape} and dtype {out.dtype}"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}: ({', '.join(_what(o) for o in out)})"
    return "None" if out is None else f"{type(out).__name__} {out!r:.40}"


def _is_numeric(a: Any) -> bool:
    return np.asarray(a).dtype.kind in "fc" or np.asarray(a).dtype.name == "bfloat16"


def _expect_arrays(out: Any, name: str) -> None:
    parts = out if isinstance(out, (tuple, list)) else [out]
    if len(parts) == 0 or any(o is None or not _is_numeric(o) for o in parts):
        raise TypeError(f"{name} returned {_what(out)}; expected a floating array or a tuple of "
                        "floating arrays")


def _expect_grads(out: Any, name: str, n_in: int) -> None:
    if not isinstance(out, (tuple, list)):
        raise TypeError(f"{name} returned {_what(out)}; expected a tuple of {n_in} gradients "
                        "(one per input, None where there is none)")
    if len(out) != n_in:
        raise ValueError(f"{name} returned {len(out)} gradient(s) for {n_in} inputs: "
                         f"{_what(out)}")
    for k, g in enumerate(out):
        if g is not None and not _is_numeric(g):
            raise TypeError(f"{name} returned {_what(g)} as gradient {k}; expected a floating "
                            "array or None")


# ----------------------------------------------------------------------------------------------
# numerical directional derivatives of F(args) -> list of arrays
# ----------------------------------------------------------------------------------------------
# F is the forward (args = inputs) or the backward (args = dys + inputs). A "direction" is a dict
# {arg index: array}. Each method returns (Jv, v_eff, err): the derivative along v_eff (the
# direction actually taken once x ± h·v is rounded to the input dtype), and an elementwise
# estimate of its error (None for the complex step: exact to working precision).

Fn = Callable[..., list[np.ndarray]]


def _complex_args(args: Sequence[Any]) -> list[Any]:
    return [a.astype(np.complex128) if _is_float_array(a) or (
        isinstance(a, np.ndarray) and a.dtype.kind == "c") else a for a in args]


#: The smallest imaginary step h·max|v| of a complex step: 2^30 above float64's smallest normal
#: number, so that h·v_i keeps all its digits for every v_i down to 2^-30 of max|v|.
_MIN_STEP = 2.0**-992
#: Below this largest element of an input even _MIN_STEP is not small next to it (2^-40): no
#: complex step can be taken there.
_MIN_COMPLEX_SCALE = _MIN_STEP / 2.0**-40


def _imaginary_step(scale: float) -> float:
    """The imaginary step h·max|v| for an input whose largest element is `scale`: ~1e-30 of it,
    never below _MIN_STEP (1e-30 of an input below ~1e-278 would be subnormal: digits lost)."""
    return max(1e-30 * scale, _MIN_STEP)


def _complex_step(F: Fn, args: Sequence[Any], dirs: dict[int, np.ndarray]) -> list[np.ndarray]:
    """J·v = Im F(args + i·h·v) / h, every floating input promoted to complex128."""
    # h·v_k is at most ~1e-30 of every perturbed input x_k, whatever the scales of v_k and x_k
    # (the backward's inputs mix dy ~ 1 with x ~ 1e150), but not below _MIN_STEP: 1e-30 of an
    # input below ~1e-278 would be subnormal (digits lost: a false alarm on y = 3x at 1e-285)
    # or zero. A power of two keeps h·v exact. The O(h²) terms are ~1e-60 relative (2^-78 at
    # worst, at _MIN_COMPLEX_SCALE).
    scales = {k: _scale_of([args[k]]) for k in dirs}
    smallest = min(scales.values())
    if smallest < _MIN_COMPLEX_SCALE:
        raise NotComplexCapable(
            f"an input's largest element, {smallest:.3g}, is below 2^-952 = "
            f"{_MIN_COMPLEX_SCALE:.3g}: no imaginary step there is both a normal float64 and "
            "small next to it")
    h = _pow2(min(_imaginary_step(scales[k]) / _vmax({k: v}) for k, v in dirs.items()))
    cargs = _complex_args(args)
    for k, v in dirs.items():
        cargs[k] = cargs[k] + 1j * h * v
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        try:
            outs = F(cargs, complex_=True)
        except np.exceptions.ComplexWarning as e:
            raise NotComplexCapable(f"it discards imaginary parts ({e})") from None
        except Exception as e:  # noqa: BLE001 -- any failure on complex input means "cannot"
            raise NotComplexCapable(f"it raised {type(e).__name__}: {e}") from None
    res = []
    for o in outs:
        if o.dtype.kind != "c":
            raise NotComplexCapable(f"it returned dtype {o.dtype} for complex input")
        with np.errstate(over="ignore"):  # a derivative beyond float64: inf, the check skips
            res.append(o.imag.astype(np.float64) / h)
    return res


def _fd_point(args: Sequence[Any], dirs: dict[int, np.ndarray], s: float) -> tuple[list, dict]:
    """args + s·v rounded to each input's dtype, and the step actually taken per input."""
    new = list(args)
    taken = {}
    for k, v in dirs.items():
        a = args[k]
        p = (a.astype(np.float64) + s * v).astype(a.dtype)
        new[k] = p
        taken[k] = p.astype(np.float64) - a.astype(np.float64)
    return new, taken


def _central(F: Fn, args: Sequence[Any], dirs: dict[int, np.ndarray], h: float):
    """One central difference: (F(x + h v) - F(x - h v)) / 2h, its direction, its rounding error."""
    pa, tp = _fd_point(args, dirs, h)
    ma, tm = _fd_point(args, dirs, -h)
    fp, fm = F(pa), F(ma)
    D = [(p.astype(np.float64) - m.astype(np.float64)) / (2 * h)
         for p, m in zip(fp, fm, strict=True)]
    v_eff = {k: (tp[k] - tm[k]) / (2 * h) for k in dirs}
    rnd = [4 * _unit_roundoff(p.dtype) * (np.abs(p) + np.abs(m)).astype(np.float64) / (2 * h)
           for p, m in zip(fp, fm, strict=True)]
    return D, v_eff, rnd


def _vmax(dirs: dict[int, np.ndarray]) -> float:
    """Largest |v| over a direction (1 for an all-zero one)."""
    m = max((float(np.max(np.abs(v))) if np.size(v) else 0.0 for v in dirs.values()), default=0.0)
    return m if m > 0 and math.isfinite(m) else 1.0


def _fd_step(args: Sequence[Any], dirs: dict[int, np.ndarray], power: float, out_u: float) -> float:
    """A finite-difference step: h·v_k at most u^power of every perturbed input x_k."""
    return _pow2(out_u**power * min(_scale_of([args[k]]) / _vmax({k: v})
                                    for k, v in dirs.items()))


def _numeric_jvp(F: Fn, args: Sequence[Any], dirs: dict[int, np.ndarray], method: str,
                 out_u: float):
    """(Jv, v_eff, err) by the named method; err is None for the complex step.

    central: D(h) with h = u^(1/3)·scale (the step that balances h² truncation against u/h
    rounding), its truncation estimated from D(2h) (error of D(2h) is 4x that of D(h)).
    richardson: Romberg table on central differences at h, h/2, h/4 with h = u^(1/5)·scale;
    the result is O(h^6) and its error is estimated by the last two table entries.
    """
    if method == "complex":
        return _complex_step(F, args, dirs), dict(dirs), None
    if method == "central":
        h = _fd_step(args, dirs, 1 / 3, out_u)
        D1, v1, r1 = _central(F, args, dirs, h)
        D2, v2, _ = _central(F, args, dirs, 2 * h)
        # truncation of D1 ≈ (D2 - D1)/3 along (almost) the same direction
        err = [np.abs(b - a) / 3 + r for a, b, r in zip(D1, D2, r1, strict=True)]
        return D1, v1, err
    if method == "richardson":
        h = _fd_step(args, dirs, 1 / 5, out_u)
        (D0, v0, _), (D1, v1, _), (D2, v2, rnd) = (_central(F, args, dirs, h / 2**i)
                                                   for i in range(3))
        R, R1 = [], []
        for a, b, c in zip(D0, D1, D2, strict=True):
            t2, t1 = _romberg(a, b, c)
            R.append(t2)
            R1.append(t1)
        # The same linear combination of the directions, so that R ≈ J·v_R to O(h^6).
        vR = {k: _romberg(v0[k], v1[k], v2[k])[0] for k in dirs}
        # Error estimate: |R - R1| (R1 is O(h^4): this over-estimates R's error), plus the
        # rounding at the smallest step amplified by the Romberg weights (< 2).
        err = [np.abs(a - b) + 2 * r for a, b, r in zip(R, R1, rnd, strict=True)]
        return R, vR, err
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _romberg(d0: Any, d1: Any, d2: Any) -> tuple[Any, Any]:
    """Romberg on central differences at h, h/2, h/4: the O(h^6) value and the last O(h^4) one.

    T[i][1] = (4·T[i][0] − T[i−1][0]) / 3 cancels the h² term; T[2][2] = (16·T[2][1] − T[1][1])
    / 15 cancels the h⁴ term.
    """
    t11 = (4 * d1 - d0) / 3
    t21 = (4 * d2 - d1) / 3
    return (16 * t21 - t11) / 15, t21


def _holomorphy_test(F: Fn, args: Sequence[Any], dirs: dict[int, np.ndarray],
                     out_u: float) -> str | None:
    """None when the complex step of F agrees with a coarse central difference, else why not."""
    try:
        cs = _complex_step(F, args, dirs)
    except NotComplexCapable as e:
        return str(e)
    h = _fd_step(args, dirs, 1 / 3, out_u)
    cd, v_eff, rnd = _central(F, args, dirs, h)
    cd2, _, _ = _central(F, args, dirs, 2 * h)
    # The central difference took v_eff, not v: the mismatch is O(u^(2/3)) relative;
    # HOLOMORPHY_RTOL is far above it and far below the O(1)..5% errors of abs/conj/norm. A
    # derivative that is itself rounding noise (RMSNorm at N = 1, whose derivative is ~1e-16 of
    # its terms) makes both sides noise: the mismatch then also has to exceed the central
    # difference's own instability, |D(h) - D(2h)|.
    num = sum(float(np.sum(np.abs(a - b))) for a, b in zip(cs, cd, strict=True))
    den = sum(float(np.sum(np.abs(b))) for b in cd) + sum(float(np.sum(r)) for r in rnd)
    unstable = sum(float(np.sum(np.abs(a - b))) for a, b in zip(cd, cd2, strict=True))
    if num > HOLOMORPHY_RTOL * max(den, 1e-300) and num > 8 * unstable and not (num == 0):
        rel = num / den if den > 0 else math.inf
        return (f"its complex step differs from a central difference by {rel:.2e} (relative, "
                f"1-norm); it is not holomorphic (abs, conj, np.linalg.norm, max?)")
    return None


# ----------------------------------------------------------------------------------------------
# the transpose identity, with localisation of failures
# ----------------------------------------------------------------------------------------------


class _Floor:
    """The cancellation floor: what rounding leaves of a derivative that is itself cancelled.

    The tolerance of the transpose identity is rtol·Σ|u_i (Jv)_i|, which presumes each (Jv)_i is
    accurate relative to itself. When (Jv)_i is the small difference of large terms -- RMSNorm
    at N = 1, where J = rstd·eps/(x²+eps) ≈ 1e-16·rstd, or any direction v nearly along x --
    both the analytic and the numerical value carry rounding errors of the size of those terms.
    A black box does not show its terms, so we model their size with secants. For an input x_k
    with the shape of an output y, let d_i = |y_i(x) − y_i(x_k = 0)| (one more forward call; it
    removes additive parts such as a bias, which no derivative sees). Then

        first order   |∂y_i/∂x_i|  ~ d_i / |x_i|       (exact in size for RMSNorm's direct term
                                                         rstd·w, in both regimes of eps)
        second order  |∂²y_i/∂x_i²| ~ d_i / x_i² · |1 − p_i|

    with p_i = (J·x)_i / d_i the local degree of homogeneity, from one complex step along x
    itself: 0 for a scale-invariant normalisation (second-order terms of size d/x² that cancel),
    1 where eps dominates and the function is linear (second-order terms tiny: d/x² would
    inflate the tolerance by ~1/eps). A d within the rounding of y − y(0), 4u·(|y| + |y(0)|),
    counts as 0 (a bias that swallows the normalised part). A gradient g_k of an input shaped
    like an output is modelled as Σ|u|·d·|1 − p|/|x_k| (its part that can change), any other
    gradient by its own |g_k|, and its change along another input m as that times
    max|t|/max|x_m|, for the pairs
    where g_k depends on x_m at all (tested by bits at random points: dbias does not depend on
    x). Inputs shaped like no output (weight, bias) get no floor of their own: their derivatives
    are not formed by cancellation in normalisations. The floor is added to the scale, so it
    only matters where the real scale has collapsed. |x_i| is clipped below at 2^-26·max|x| so
    that an exact zero cannot disable the check.

    Measured effect (tests/test_gradcheck_sensitivity.py): no false alarm from 1e-160 to 1e150
    for every oracle op at N = 1 and 3; away from N = 1 the relative tolerances of the
    complex-step checks stay near rtol (e.g. 2.3e-13 for RMSNorm's x against rtol = 1.1e-13).
    """

    def __init__(self, F: Fn, inputs: Sequence[Any], y: list[np.ndarray],
                 diff: list[int]) -> None:
        self.r: dict[int, np.ndarray] = {}
        self.match: dict[int, list[int]] = {}
        self.d: dict[tuple[int, int], np.ndarray] = {}
        self.d_err: dict[tuple[int, int], np.ndarray] = {}
        self.q: dict[tuple[int, int], np.ndarray] = {}
        # (k, m) -> does gradient k depend on input m at all (set by the second-order checks)
        self.depends: dict[tuple[int, int], bool] = {}
        for k in diff:
            xk = np.abs(np.asarray(inputs[k], np.float64))
            m = [o for o, yo in enumerate(y) if yo.shape == xk.shape]
            if not (m and xk.size):
                continue
            big = float(np.max(xk[np.isfinite(xk)], initial=0.0)) or 1.0
            # 1/x overflows to inf for an x_k below ~2^-996: such an input is below the complex
            # step's range (2^-952), and none of its comparisons is made (NOT CHECKED)
            with np.errstate(over="ignore"):
                self.r[k] = 1.0 / np.maximum(xk, 2.0**-26 * big)
            self.match[k] = m
            at0 = list(inputs)
            at0[k] = np.zeros_like(inputs[k])
            with np.errstate(all="ignore"):
                y0 = F(at0)
                for o in m:
                    yo = np.asarray(y[o], np.float64)
                    y0o = np.asarray(y0[o], np.float64)
                    d = np.abs(yo - y0o)
                    # rounding in d: u·(|y| + |y(0)|), large next to d when a bias dominates;
                    # a d within it is noise, and counts as 0
                    err = 4 * _unit_roundoff(y[o].dtype) * (np.abs(yo) + np.abs(y0o))
                    d = np.where(d > err, d, 0.0)
                    # |y| where the secant says nothing: y(0) not finite (0/0 at eps = 0)
                    self.d[(k, o)] = np.where(np.isfinite(y0o), d, np.abs(yo))
                    self.d_err[(k, o)] = np.where(np.isfinite(err), err, 0.0)

    def set_radial(self, k: int, jx: list[np.ndarray]) -> None:
        """Store |1 − p| from J·x_k (the derivative along x_k itself) for the second order.

        p is known only to the relative rounding of d; |1 − p| is reduced by that uncertainty
        so that a linear function seen through a large bias does not look nonlinear. Where p is
        undefined (d = 0, or J·x not finite) |1 − p| is taken as 1."""
        for o in self.match.get(k, []):
            d = self.d[(k, o)]
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.abs(1.0 - np.abs(jx[o]) / d) - self.d_err[(k, o)] / d
            self.q[(k, o)] = np.where(np.isfinite(q), np.maximum(q, 0.0), 1.0)

    def first(self, k: int, u: list[np.ndarray], v: np.ndarray) -> float:
        """Σ_i |u_i|·d_i·|v_i| / |x_i| over the outputs shaped like input k."""
        if k not in self.r:
            return 0.0
        w = np.abs(v) * self.r[k]
        return sum(float(np.sum(np.abs(u[o]) * self.d[(k, o)] * w)) for o in self.match[k])

    def grad_magnitude(self, k: int, u: list[np.ndarray], g: np.ndarray | None,
                       nonlinear: bool = False) -> np.ndarray:
        """|g_k| as the model sees it: Σ_o |u_o|·d_o / |x_k| when k is shaped like an output,
        else the gradient's own magnitude |g| at the point. ``nonlinear``: only the part that
        can change with the inputs (each output weighted by its |1 − p|; an output linear in
        x_k, such as add_rms_norm's new residual, contributes a constant gradient)."""
        if k in self.r:
            return sum(np.abs(u[o]) * self.d[(k, o)]
                       * (self.q.get((k, o), 1.0) if nonlinear else 1.0)
                       for o in self.match[k]) * self.r[k]
        return np.zeros(1) if g is None else np.abs(np.asarray(g, np.float64))

    def cross(self, a: dict[int, np.ndarray], t: dict[int, np.ndarray], u: list[np.ndarray],
              g: dict[int, Any], scales: dict[int, float]) -> float:
        """Σ_{k≠m} Σ|a_k|·|g_k| · max|t_m| / max|x_m|: how much gradient k moves along input m,
        for the pairs that involve an input shaped like an output (the ones a normalisation
        forms by cancellation; dweight along weight, say, is left out)."""
        total = 0.0
        for k, ak in a.items():
            gk = None
            for m, tm in t.items():
                if m == k or (k not in self.r and m not in self.r):
                    continue
                if not self.depends.get((k, m), True):
                    continue
                if gk is None:
                    gk = float(np.sum(np.abs(ak) * self.grad_magnitude(k, u, g.get(k), True)))
                total += gk * float(np.max(np.abs(tm), initial=0.0)) / scales[m]
        return total

    def second(self, k: int, u: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> float:
        """Σ_i |u_i|·d_i·|1 − p_i|·|a_i|·|b_i| / x_i² over the outputs shaped like input k."""
        if k not in self.r:
            return 0.0
        total = 0.0
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow makes the check skip
            w = (np.abs(a) * self.r[k]) * (np.abs(b) * self.r[k])
            for o in self.match[k]:
                t = np.abs(u[o]) * self.d[(k, o)] * w
                if (k, o) in self.q:
                    t = t * self.q[(k, o)]
                total += float(np.sum(t))
        return total


def _numeric_jvp_of(F: Fn, inputs: Sequence[Any], k: int, method: str, out_u: float,
                    v: np.ndarray) -> tuple:
    """(Jv, v_eff, err) along input k only (for the localiser)."""
    jv, v_eff, err = _numeric_jvp(F, inputs, {k: v}, method, out_u)
    return jv, v_eff[k], err


#: Below this scale a comparison's terms may be subnormal (2^-1022 / u): digits are lost.
_SUBNORMAL = 2.0**-1022 / 2.0**-53


class _Worst:
    """The worst of several comparisons of one check: ratio, and error and tolerance relative to
    the comparison's scale. A tolerance or scale that overflowed float64, or that is so small
    that its terms are subnormal, cannot judge anything: such a comparison is counted apart,
    and a check made only of those is reported skipped."""

    def __init__(self) -> None:
        self.ratio, self.observed, self.tolerance, self.index = -1.0, 0.0, 0.0, 0
        self.overflowed = 0

    def add(self, err: float, scale: float, tol: float, index: int = 0) -> None:
        # The point and the forward are finite (checked first), so a NaN scale here is an
        # overflow (inf·0 or inf − inf in the terms): counted with the overflows.
        if not (math.isfinite(tol) and math.isfinite(scale)) or 0 < max(scale, tol) < _SUBNORMAL:
            self.overflowed += 1
            return
        r = _ratio(err, tol)
        if r > self.ratio:
            s = scale if scale > 0 else 1.0
            self.ratio, self.observed, self.tolerance, self.index = r, err / s, tol / s, index

    def result(self, name: str, input: str | None, note: str = "") -> CheckResult:
        if self.ratio < 0:
            return CheckResult(name, input, None, note="skipped: its scale overflows or "
                               "underflows float64 at this point (rescale the inputs)")
        if self.overflowed:
            note = (note + "; " if note else "") + (
                f"{self.overflowed} comparison(s) skipped: scale out of float64's normal range")
        return CheckResult(name, input, self.ratio <= 1, self.observed, self.tolerance,
                           self.ratio, note=note)


def _discrepancy(u: list[np.ndarray], jv: list[np.ndarray], err: list[np.ndarray] | None,
                 g: np.ndarray | None, v: np.ndarray, rtol: float, atol: float,
                 floor: float = 0.0):
    """⟨u, Jv⟩ - ⟨g, v⟩, its scale Σ|u ⊙ Jv| and its absolute tolerance."""
    num = _dot(u, jv)
    ana = 0.0 if g is None else _dot([g], [v])
    scale = _absdot(u, jv)
    fd = 0.0 if err is None else FD_SAFETY * _absdot(u, err)
    return num - ana, scale, rtol * (scale + floor) + fd + atol


def _localize(jv_of: Callable[[np.ndarray], tuple], u: list[np.ndarray], g: np.ndarray | None,
              shape: tuple[int, ...], rng: np.random.Generator, rtol: float, atol: float,
              budget: int, max_worst: int,
              floor_of: Callable[[np.ndarray], float]) -> tuple[list[WorstEntry], int]:
    """Best-first bisection of the flat input index range for entries of g that disagree.

    ``jv_of(v)`` returns (Jv, v_eff, err) for a direction v of this input. A block of indices is
    tested with a Gaussian direction supported on it; a failing block is split in two; a single
    index j gives the entry (Jᵀu)_j = ⟨u, J e_j⟩ exactly. A single wrong entry in n is found with
    2·log2(n) + 1 evaluations (n a power of two). At most ``budget`` evaluations are spent: a
    block costs two (its halves), a single index one. Returns the entries found and the
    evaluations spent.
    """
    n = int(np.prod(shape))
    heap: list[tuple[float, int, int]] = [(-math.inf, 0, n)]
    found: list[WorstEntry] = []
    spent = 0
    flat_g = None if g is None else np.asarray(g, np.float64).reshape(-1)
    while heap and len(found) < max_worst:
        _, lo, hi = heap[0]
        if spent + (1 if hi - lo == 1 else 2) > budget:
            break
        heapq.heappop(heap)
        if hi - lo == 1:
            e = np.zeros(n)
            e[lo] = 1.0
            jv, v_eff, err = jv_of(e.reshape(shape))
            spent += 1
            vj = float(np.asarray(v_eff).reshape(-1)[lo])
            d, _, tol = _discrepancy(u, jv, err, g, np.asarray(v_eff), rtol, atol,
                                     floor_of(np.asarray(v_eff)))
            if _ratio(abs(d), tol) <= 1:
                continue  # the block failed as a whole, this entry alone is within tolerance
            numerical = _dot(u, jv) / vj
            analytic = 0.0 if flat_g is None else float(flat_g[lo])
            found.append(WorstEntry(tuple(int(i) for i in np.unravel_index(lo, shape)), None,
                                    analytic, numerical, abs(d / vj), abs(tol / vj)))
            continue
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            v = np.zeros(n)
            v[a:b] = rng.standard_normal(b - a)
            jv, v_eff, err = jv_of(v.reshape(shape))
            spent += 1
            d, _, tol = _discrepancy(u, jv, err, g, np.asarray(v_eff), rtol, atol,
                                     floor_of(np.asarray(v_eff)))
            r = _ratio(abs(d), tol)
            if r > 1:
                heapq.heappush(heap, (-r, a, b))
    found.sort(key=lambda w: -w.ratio)
    return found, spent


# ----------------------------------------------------------------------------------------------
# gradcheck
# ----------------------------------------------------------------------------------------------


def gradcheck(
    forward: Callable[..., Any],
    backward: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    jvp: Callable[..., Any] | None = None,
    double_backward: Callable[..., Any] | None = None,
    wrt: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    method: str = "complex",
    full: bool = False,
    seed: int = 0,
    n_directions: int = 4,
    rtol: float | None = None,
    atol: float = 0.0,
    second_order: bool | None = None,
    localize: bool = True,
    localize_budget: int = 64,
    max_worst: int = 5,
) -> GradcheckResult:
    """Check ``backward`` (and ``jvp``, ``double_backward``) against ``forward``.

    Parameters
    ----------
    forward : callable
        ``forward(*inputs) -> array`` (or a tuple of arrays). For the default method it should
        accept complex inputs and compute holomorphically (``x*x``, ``np.sqrt``); this is
        detected, with a fallback to Richardson extrapolation and a note saying why.
    backward : callable
        ``backward(dy, *inputs) -> tuple`` of one gradient (or ``None``) per input.
    inputs : sequence
        The point at which to check. Real floating arrays are differentiable (unless ``wrt`` says
        otherwise); anything else is passed through as a constant.
    jvp : callable, optional
        ``jvp(inputs, tangents) -> array``; checked against ``backward`` by the transpose identity
        with no finite differences at all.
    double_backward : callable, optional
        ``double_backward(ddgrads, dy, *inputs) -> (ddy, *dinputs)``, the VJP of ``backward``;
        checked against the complex step of ``backward``.
    wrt : sequence of int, optional
        Indices of the differentiable inputs (default: every real floating array).
    names : sequence of str, optional
        Names of the inputs for the report (default ``input0``, ``input1``, ...).
    method : {"complex", "central", "richardson"}
        Numerical derivative of the forward: complex step (exact to working precision), central
        differences (h = u^(1/3)·scale, error ~u^(2/3)) or Richardson extrapolation (Romberg on
        three central differences, error ~u^(6/7), with an error estimate).
    full : bool
        Also build the whole Jacobian column by column and compare it with the VJP row by row,
        reporting the worst (output index, input index) entries.
    seed : int
        Seed of the Gaussian directions (results are reproducible).
    n_directions : int
        Number of random (u, v) pairs per input for the transpose identity.
    rtol : float, optional
        Relative tolerance, applied to Σ|u_i (Jv)_i|. Default ``RTOL_ULPS`` unit roundoffs of the
        least precise dtype among the forward output and the gradients (1.1e-13 in float64,
        6.1e-5 in float32). In float16 and bfloat16 that default would pass a gradient three
        times too large, so no comparison is made (the result is NOT CHECKED, with a note) unless
        rtol is given.
    atol : float
        Absolute tolerance added to every comparison (default 0).
    second_order : bool, optional
        Check the backward's own derivative (forward-over-reverse) and ``double_backward``.
        None (default): do it when the backward accepts complex input holomorphically.
    localize : bool
        After a failing transpose check, bisect the input to report the worst entries.
    localize_budget : int
        Most evaluations spent localising one failing check.
    max_worst : int
        Most worst entries reported per failing check.

    Returns
    -------
    GradcheckResult
        Truthy when all checks passed; ``.report()`` and ``.to_dict()`` describe each check.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(inputs, np.ndarray):
        inputs = (inputs,)
    inputs = list(inputs)
    names = list(names) if names is not None else [f"input{k}" for k in range(len(inputs))]
    if len(names) != len(inputs):
        raise ValueError(f"names has {len(names)} entries but there are {len(inputs)} inputs")
    if n_directions < 1:
        raise ValueError(f"n_directions must be >= 1, got {n_directions}")
    settings = _Settings(
        requested_method=method, full=full, seed=seed, n_directions=n_directions,
        rtol=None if rtol is None else _tolerance(rtol, "rtol"), atol=_tolerance(atol, "atol"),
        localize=localize, localize_budget=localize_budget, max_worst=max_worst)
    checker = _Checker(forward, backward, inputs, names, _differentiable(inputs, wrt), settings)
    return checker.run(jvp=jvp, double_backward=double_backward, second_order=second_order)


def _differentiable(inputs: list[Any], wrt: Sequence[int] | None) -> list[int]:
    """Indices of the inputs to differentiate: ``wrt``, checked, or every real float array."""
    if wrt is None:
        return [k for k, a in enumerate(inputs) if _is_float_array(a)]
    diff = [int(k) for k in wrt]
    for k in diff:
        if not (0 <= k < len(inputs)) or not _is_float_array(inputs[k]):
            got = "out of range" if not (0 <= k < len(inputs)) else type(inputs[k]).__name__
            raise ValueError(f"wrt index {k} must name a real floating array input ({got})")
    return diff


@dataclass(frozen=True)
class _Settings:
    """The options of one ``gradcheck`` call, checked (rtol None: chosen from the dtypes)."""

    requested_method: str
    full: bool
    seed: int
    n_directions: int
    rtol: float | None
    atol: float
    localize: bool
    localize_budget: int
    max_worst: int


class _Checker:
    """One ``gradcheck`` call: the callables, the point and the directions every check shares.

    ``run`` goes through the checks in order -- the point (finite?), (f) the gradients'
    structure, the method (is the forward holomorphic?), (a) VJP against the numerical JVP,
    (b) analytic JVP against VJP, (e) reentrancy, (c) the full Jacobian, (d) second order --
    each a method reading the state set up before it. The random draws happen in that order
    from one generator, so a seed gives the same directions whatever checks are asked for
    after them.
    """

    def __init__(self, forward: Callable[..., Any], backward: Callable[..., Any],
                 inputs: list[Any], names: list[str], diff: list[int], settings: _Settings):
        self.inputs, self.names, self.diff, self.settings = inputs, names, diff, settings
        self.n_in = len(inputs)
        self.counts: dict[str, int] = {}
        self.fwd = _Counted(forward, "forward", self.counts, _expect_arrays)
        self.bwd = _Counted(backward, "backward", self.counts,
                            functools.partial(_expect_grads, n_in=self.n_in))
        self.rng = np.random.default_rng(settings.seed)
        self.checks: list[CheckResult] = []
        self.notes: list[str] = []
        self.method = settings.requested_method  # the method used (after the holomorphy test)
        self.rtol = settings.rtol
        self.atol = settings.atol
        # set by run(): the forward's outputs at the point, the output directions u and the
        # backward's gradients along them, the unit roundoff of the outputs, the floor
        self.y: list[np.ndarray] = []
        self.multi = False
        self.us: list[list[np.ndarray]] = []
        self.grads: list[tuple[Any, ...]] = []
        self.out_u = 0.0
        self.floor: _Floor

    # --- the callables as functions of argument lists ------------------------------------------

    @property
    def n_out(self) -> int:
        return len(self.y)

    def pack_dy(self, dys: list[np.ndarray]) -> Any:
        """dy in the structure of the forward's output: an array, or a tuple of arrays."""
        return tuple(dys) if self.multi else dys[0]

    def as_given(self, args: Sequence[Any], offset: int = 0) -> list[Any]:
        """args with every input that is not differentiated (args[offset + i]) replaced by the
        caller's own object: the complex step promotes floating arrays to complex128, and a
        constant float32 array promoted would change the function differentiated (its own
        products in float64 instead of float32)."""
        return [self.inputs[i - offset] if i >= offset and i - offset not in self.diff else a
                for i, a in enumerate(args)]

    def F(self, args: Sequence[Any], complex_: bool = False) -> list[np.ndarray]:
        """The forward as a function of the inputs -> list of outputs."""
        return _as_list(self.fwd(*self.as_given(args), complex_=complex_))[0]

    def B(self, args: Sequence[Any], complex_: bool = False) -> list[np.ndarray]:
        """The backward as a function of (dys..., inputs...) -> gradients of `diff` inputs."""
        dys = [np.array(a, copy=True) for a in args[:self.n_out]]
        inputs = self.as_given(args, self.n_out)[self.n_out:]
        gs = self.bwd(self.pack_dy(dys), *inputs, complex_=complex_)
        out = []
        for k in self.diff:
            gk = gs[k]
            if gk is None:
                dt = np.complex128 if complex_ else np.float64
                gk = np.zeros(np.shape(args[self.n_out + k]), dtype=dt)
            out.append(np.asarray(gk))
        return out

    def result(self) -> GradcheckResult:
        s = self.settings
        settings = {"rtol": float(self.rtol), "atol": self.atol, "seed": s.seed,
                    "n_directions": s.n_directions, "requested_method": s.requested_method,
                    "full": s.full}
        return GradcheckResult(self.checks, self.method, self.notes, self.counts, settings)

    # --- the run -------------------------------------------------------------------------------

    def run(self, *, jvp: Callable[..., Any] | None, double_backward: Callable[..., Any] | None,
            second_order: bool | None) -> GradcheckResult:
        s = self.settings
        originals = [a.copy() if isinstance(a, np.ndarray) else a for a in self.inputs]
        problem = self.point_problem()
        if problem is not None:
            return problem
        dy_modified = self.draw_output_directions()
        if not self.check_structure():
            # Shapes wrong: the inner products below would broadcast nonsense.
            return self.result()
        if s.rtol is None and self.rtol > MAX_DEFAULT_RTOL:
            return self.too_imprecise()
        self.floor = _Floor(self.F, self.inputs, self.y, self.diff)
        self.choose_method()
        vs = self.draw_input_directions()
        self.check_vjp(vs)
        if jvp is not None:
            self.check_jvp(jvp, vs)
        self.check_reentrancy(originals, dy_modified)
        if s.full and self.diff:
            self.checks += _full_jacobian(self)
        if self.diff and second_order is not False:
            self.checks += _second_order(self, double_backward, second_order)
        return self.result()

    def too_imprecise(self) -> GradcheckResult:
        """The result when the default rtol exceeds ``MAX_DEFAULT_RTOL``: every comparison is
        skipped (NOT CHECKED, never a pass), with the dtype, its unit roundoff and the way out."""
        dtypes = [o.dtype for o in self.y] + [np.asarray(self.grads[0][k]).dtype
                                              for k in self.diff if self.grads[0][k] is not None]
        worst = max(dtypes, key=_unit_roundoff)
        note = (f"not checked: {worst} rounds at u = {_unit_roundoff(worst):.2g}, so the default "
                f"rtol ({RTOL_ULPS:g}·u = {self.rtol:.3g}) could not tell a wrong gradient from a "
                "right one; cast the inputs to float64 (or float32), or pass rtol yourself")
        self.notes.append(note)
        skipped = f"the default rtol would be {self.rtol:.3g} ({worst}): see the note"
        self.checks += [CheckResult("vjp", self.names[k], None, note=skipped) for k in self.diff]
        return self.result()

    def point_problem(self) -> GradcheckResult | None:
        """A failed result when the point or the forward there has NaN/Inf; sets ``y``."""
        s = self.settings
        bad = [f"{self.names[k]}: {_non_finite(self.inputs[k])}" for k in self.diff
               if not np.all(np.isfinite(self.inputs[k]))]
        if bad:
            return _not_checkable("input", bad, s.requested_method, self.counts, s.rtol, s.atol,
                                  s.seed)
        self.y, self.multi = _as_list(self.fwd(*self.inputs))
        bad = [f"output {o}: {_non_finite(yo)}" for o, yo in enumerate(self.y)
               if not np.all(np.isfinite(yo))]
        if bad:
            return _not_checkable("forward", bad, s.requested_method, self.counts, s.rtol,
                                  s.atol, s.seed)
        return None

    def draw_output_directions(self) -> bool:
        """Draw u, run the backward along each, choose rtol; True if a backward changed its dy."""
        n_dir = self.settings.n_directions
        self.us = [[self.rng.standard_normal(o.shape) for o in self.y] for _ in range(n_dir)]
        # the backward gets copies of u: one that scribbles on its dy is caught under reentrancy
        dy_copies = [[a.copy() for a in u] for u in self.us]
        self.grads = [tuple(self.bwd(self.pack_dy(dc), *self.inputs)) for dc in dy_copies]
        self.out_u = max(_unit_roundoff(o.dtype) for o in self.y)
        grad_u = [_unit_roundoff(np.asarray(g[k]).dtype) for g in self.grads[:1]
                  for k in self.diff if g[k] is not None]
        if self.rtol is None:
            self.rtol = RTOL_ULPS * max([self.out_u, *grad_u])
        self.rtol = float(self.rtol)
        return any(not np.array_equal(a, b) for u, dc in zip(self.us, dy_copies, strict=True)
                   for a, b in zip(u, dc, strict=True))

    def check_structure(self) -> bool:
        """(f) one gradient per input, shapes and dtypes match; False if they do not."""
        msgs = []
        g0 = self.grads[0]
        if len(g0) != self.n_in:
            raise ValueError(f"backward returned {len(g0)} gradients for {self.n_in} inputs")
        for k in range(self.n_in):
            gk = g0[k]
            if gk is None:
                continue
            name = self.names[k]
            if k not in self.diff and not isinstance(self.inputs[k], np.ndarray):
                msgs.append(f"{name}: a gradient for a non-array input")
                continue
            gk = np.asarray(gk)
            xk = np.asarray(self.inputs[k])
            if gk.shape != xk.shape:
                msgs.append(f"{name}: gradient shape {gk.shape} != input shape {xk.shape}")
            if gk.dtype != xk.dtype:
                msgs.append(f"{name}: gradient dtype {gk.dtype} != input dtype {xk.dtype}")
        # pass/fail checks: observed = number of problems, ratio 0 or inf
        self.checks.append(CheckResult("shapes", None, not msgs, float(len(msgs)), 0.0,
                                       math.inf if msgs else 0.0, note="; ".join(msgs)))
        return not msgs

    def choose_method(self) -> None:
        """Fall back from the complex step to Richardson when the forward is not holomorphic."""
        if self.method == "complex" and self.diff:
            probe = {k: _relative(self.rng.standard_normal(np.shape(self.inputs[k])),
                                  self.inputs[k]) for k in self.diff}
            why = _holomorphy_test(self.F, self.inputs, probe, self.out_u)
            if why is not None:
                self.method = "richardson"
                self.notes.append(f"complex step unusable for the forward: {why}; "
                                  "falling back to Richardson extrapolation")

    def draw_input_directions(self) -> dict[int, list[np.ndarray]]:
        """v per differentiable input and direction (relative to |x| for finite differences)."""
        n_dir = self.settings.n_directions
        vs = {k: [self.rng.standard_normal(np.shape(self.inputs[k])) for _ in range(n_dir)]
              for k in self.diff}
        if self.method != "complex":  # finite differences: steps relative to each element
            vs = {k: [_relative(v, self.inputs[k]) for v in vk] for k, vk in vs.items()}
        return vs

    def localized(self, c: CheckResult, k: int, d: int,
                  jv_of: Callable[[np.ndarray], tuple]) -> int:
        """Bisect input k for the worst entries of a failing check along direction pair d."""
        s = self.settings
        c.worst, spent = _localize(jv_of, self.us[d], self.grads[d][k], np.shape(self.inputs[k]),
                                   self.rng, self.rtol, self.atol, s.localize_budget,
                                   s.max_worst, functools.partial(self.floor.first, k, self.us[d]))
        return spent

    def not_localised(self, spent: int) -> str:
        """Why a failing check found no worst entry: the budget ran out (the next block, which
        costs up to 2 evaluations, would have passed it), or the search ended with no entry or
        block wrong by more than its own tolerance."""
        budget = self.settings.localize_budget
        if spent + 2 > budget:
            return (f"not localised in {spent} evaluations: localize_budget ({budget}) ran out; "
                    "a larger one may find the entries")
        return f"not localised in {spent} evaluations: the error is spread thinly"

    def check_vjp(self, vs: dict[int, list[np.ndarray]]) -> None:
        """(a) ⟨u, J v⟩ by the numerical JVP against ⟨backward(u), v⟩, per input."""
        for k in self.diff:
            worst = _Worst()
            for d in range(self.settings.n_directions):
                jv, v_eff, err = _numeric_jvp(self.F, self.inputs, {k: vs[k][d]}, self.method,
                                              self.out_u)
                disc, scale, tol = _discrepancy(self.us[d], jv, err, self.grads[d][k], v_eff[k],
                                                self.rtol, self.atol,
                                                self.floor.first(k, self.us[d], v_eff[k]))
                worst.add(abs(disc), scale, tol, d)
            c = worst.result("vjp", self.names[k], "backward returned None: checked that the "
                             "output does not depend on it" if self.grads[0][k] is None else "")
            if c.passed is False and self.settings.localize:
                spent = self.localized(c, k, worst.index, functools.partial(
                    _numeric_jvp_of, self.F, self.inputs, k, self.method, self.out_u))
                if not c.worst:
                    c.note = (c.note + "; " if c.note else "") + self.not_localised(spent)
            self.checks.append(c)

    def check_jvp(self, jvp: Callable[..., Any], vs: dict[int, list[np.ndarray]]) -> None:
        """(b) the analytic JVP against the analytic VJP: no finite difference at all."""
        jvp_c = _Counted(jvp, "jvp", self.counts, _expect_arrays)

        def jvp_dirs(k: int, v: np.ndarray):
            tans = [None] * self.n_in
            tans[k] = v.astype(np.asarray(self.inputs[k]).dtype)
            out, _ = _as_list(jvp_c(tuple(self.inputs), tuple(tans)))
            return out, tans[k].astype(np.float64), None

        for k in self.diff:
            worst = _Worst()
            for d in range(self.settings.n_directions):
                jv, v_eff, _ = jvp_dirs(k, vs[k][d])
                disc, scale, tol = _discrepancy(self.us[d], jv, None, self.grads[d][k], v_eff,
                                                self.rtol, self.atol,
                                                self.floor.first(k, self.us[d], v_eff))
                worst.add(abs(disc), scale, tol, d)
            c = worst.result("jvp", self.names[k])
            if c.passed is False and self.settings.localize:
                self.localized(c, k, worst.index, functools.partial(jvp_dirs, k))
                c.note = "worst entries of the VJP relative to the analytic JVP"
            self.checks.append(c)

    def check_reentrancy(self, originals: list[Any], dy_modified: bool) -> None:
        """(e) the same bits again from a second identical call; inputs and dy untouched."""
        again = tuple(self.bwd(self.pack_dy([a.copy() for a in self.us[0]]), *self.inputs))
        msgs = ["the backward modified its dy in place"] if dy_modified else []
        for k in range(self.n_in):
            a, b = self.grads[0][k], again[k]
            if (a is None) != (b is None) or (
                a is not None and not np.array_equal(np.asarray(a), np.asarray(b),
                                                     equal_nan=True)
            ):
                msgs.append(f"{self.names[k]}: gradient changed between two identical calls")
            if isinstance(originals[k], np.ndarray) and not np.array_equal(
                originals[k], self.inputs[k], equal_nan=True
            ):
                msgs.append(f"{self.names[k]}: the input was modified in place")
        self.checks.append(CheckResult("reentrancy", None, not msgs, float(len(msgs)), 0.0,
                                       math.inf if msgs else 0.0, note="; ".join(msgs)))


# ----------------------------------------------------------------------------------------------
# (c) full Jacobian
# ----------------------------------------------------------------------------------------------

#: Most complex elements one batched forward call may hold (2 MiB: cache-friendly; larger
#: batches measured slower with the oracle, whose temporaries then spill out of cache).
_BATCH_ELEMS = 2**17
#: Refuse to build a Jacobian with more entries than this (~512 MiB of float64).
MAX_JACOBIAN_ENTRIES = 2**26


def _jacobian_columns(F: Fn, inputs: list, k: int, method: str, out_u: float,
                      n_outputs: int) -> tuple[np.ndarray, np.ndarray | None]:
    """J_k (n_out_total x n_k) and an elementwise error estimate (None for the complex step).

    Complex step columns are computed B at a time by stacking x_k + i·h·e_j along a new leading
    axis, when the forward broadcasts over it (checked on two columns against single calls);
    otherwise one forward call per column.
    """
    shape = np.shape(inputs[k])
    n = int(np.prod(shape))

    def column(j: int):
        e = np.zeros(n)
        e[j] = 1.0
        jv, v_eff, err = _numeric_jvp(F, inputs, {k: e.reshape(shape)}, method, out_u)
        vj = float(np.asarray(v_eff[k]).reshape(-1)[j])
        col = np.concatenate([o.reshape(-1) for o in jv]) / vj
        ecol = None if err is None else np.concatenate([x.reshape(-1) for x in err]) / abs(vj)
        return col, ecol

    first, ef = column(0)
    J = np.empty((first.size, n))
    E = None if ef is None else np.empty((first.size, n))
    J[:, 0] = first
    if E is not None:
        E[:, 0] = ef
    if n == 1:
        return J, E

    if method == "complex":
        if _batched_complex_columns(F, inputs, k, J, first, column):
            return J, None
        # One call per column; the complex arguments are built once (column 0 went through
        # _complex_step and its checks: same h, same promotion).
        h = _pow2(_imaginary_step(_scale_of([inputs[k]])))
        cargs = _complex_args(inputs)
        base = cargs[k]
        for j in range(1, n):
            a = base.copy()
            a.reshape(-1)[j] += 1j * h
            cargs[k] = a
            outs = F(cargs, complex_=True)
            J[:, j] = np.concatenate([o.imag.reshape(-1) for o in outs]) / h
        return J, None
    for j in range(1, n):
        J[:, j], ej = column(j)
        if E is not None:
            E[:, j] = ej
    return J, E


def _batched_complex_columns(F, inputs, k, J, first, column) -> bool:
    """Fill J[:, 1:] by batched complex steps; False (J untouched) when batching does not work."""
    xk = inputs[k]
    shape = xk.shape
    n = xk.size
    h = _pow2(_imaginary_step(_scale_of([xk])))
    size = max(first.size, n)
    B = int(max(2, min(n, _BATCH_ELEMS // max(size, 1))))
    cargs = _complex_args(inputs)

    def run(cols: np.ndarray) -> np.ndarray | None:
        X = np.broadcast_to(cargs[k], (len(cols),) + shape).copy()
        flat = X.reshape(len(cols), n)
        flat[np.arange(len(cols)), cols] += 1j * h
        args = list(cargs)
        args[k] = X
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", np.exceptions.ComplexWarning)
                outs = F(args, complex_=True)
        except Exception:  # noqa: BLE001 -- the forward does not broadcast: loop instead
            return None
        try:
            block = np.concatenate([o.reshape(len(cols), -1) for o in outs], axis=1)
        except ValueError:
            return None
        if block.shape != (len(cols), first.size) or block.dtype.kind != "c":
            return None
        return block.imag.T / h

    # Verify on two columns (the first and a later one) against single calls.
    j2 = min(n - 1, B - 1) if B > 1 else 1
    probe = run(np.array([0, j2]))
    if probe is None:
        return False
    c2, _ = column(j2)
    tol = 1e-12 * (np.abs(first) + np.abs(c2) + 1e-300)
    if not (np.all(np.abs(probe[:, 0] - first) <= tol) and
            np.all(np.abs(probe[:, 1] - c2) <= tol)):
        return False
    for lo in range(1, n, B):
        cols = np.arange(lo, min(n, lo + B))
        block = run(cols)
        if block is None:
            return False
        J[:, cols] = block
    return True


def _compare_jacobians(A: np.ndarray, J: np.ndarray, E: np.ndarray | None, rtol: float,
                       atol: float, max_worst: int, block_elems: int = 2**17):
    """Compare the VJP rows A with the numerical Jacobian J entry by entry, in row blocks.

    Entry scale: |J_ij| plus the geometric mean of the largest entries of its row and column (an
    entry computed by cancellation is accurate relative to those, not to itself); tolerance
    rtol·scale + atol (+ FD_SAFETY·E for finite differences). Row blocks of ~1 MiB keep the
    temporaries in cache (these are n_out x n_k matrices).

    Returns ((max ratio, observed/scale, tol/scale) at the worst entry, up to ``max_worst``
    entries (ratio, i, j, error, tolerance) with ratio > 1, worst first, number of such entries).
    """
    absJ_rowmax = np.max(np.abs(J), axis=1)
    colmax = np.max(np.abs(J), axis=0)
    sqrt_col = np.sqrt(colmax)
    step = max(1, block_elems // max(J.shape[1], 1))
    worst = (-1.0, 0.0, 0.0)
    top: list[tuple[float, int, int, float, float]] = []
    n_bad = 0
    for lo in range(0, J.shape[0], step):
        Jb, Ab = J[lo:lo + step], A[lo:lo + step]
        scale = np.abs(Jb)
        scale += np.sqrt(absJ_rowmax[lo:lo + step])[:, None] * sqrt_col
        tol = scale * rtol
        if atol:
            tol += atol
        if E is not None:
            tol += FD_SAFETY * E[lo:lo + step]
        err = np.abs(Ab - Jb)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = err / tol
        zero = tol == 0  # an entry of scale 0 (its row or column is all zero), atol 0
        if zero.any():
            # only an exact 0 error is within a zero tolerance: NaN is not (NaN > 0 is False)
            ratio[zero] = np.where(err[zero] == 0, 0.0, np.inf)
        # a NaN entry (a NaN gradient, or inf - inf) fails, as in _ratio: argmax would pick it
        # and no comparison with it could replace the initial worst
        ratio[np.isnan(ratio)] = np.inf
        f = int(np.argmax(ratio))
        i, j = np.unravel_index(f, ratio.shape)
        if ratio[i, j] > worst[0]:
            sc = float(scale[i, j]) or 1.0
            worst = (float(ratio[i, j]), float(err[i, j]) / sc, float(tol[i, j]) / sc)
        bad = ratio > 1
        nb = int(np.count_nonzero(bad))
        if nb:
            n_bad += nb
            flat = ratio.reshape(-1)
            kk = min(max_worst, flat.size)
            cand = np.argpartition(flat, -kk)[-kk:]
            for f in cand:
                ii, jj = np.unravel_index(int(f), ratio.shape)
                if ratio[ii, jj] > 1:
                    top.append((float(ratio[ii, jj]), lo + int(ii), int(jj), float(err[ii, jj]),
                                float(tol[ii, jj])))
            top = sorted(top, reverse=True)[:max_worst]
    return worst, top, n_bad


def _full_jacobian(checker: _Checker) -> list[CheckResult]:
    """(c) every Jacobian entry: rows by VJP (one backward call per output element) against
    columns by the numerical JVP, per differentiable input."""
    c = checker
    inputs, y, diff = c.inputs, c.y, c.diff
    n_out = sum(o.size for o in y)
    total_in = sum(np.size(inputs[k]) for k in diff)
    if n_out * total_in > MAX_JACOBIAN_ENTRIES:
        return [CheckResult("jacobian", None, None,
                            note=f"skipped: {n_out} x {total_in} Jacobian entries exceed "
                                 f"MAX_JACOBIAN_ENTRIES = {MAX_JACOBIAN_ENTRIES}")]
    # rows by VJP: one backward call per output element
    rows = {k: np.empty((n_out, np.size(inputs[k]))) for k in diff}
    offsets = np.cumsum([0] + [o.size for o in y])
    i = 0
    for which, o in enumerate(y):
        for j in range(o.size):
            # a fresh dy per call: a backward may keep or modify its dy
            dys = [np.zeros(q.shape) for q in y]
            dys[which].reshape(-1)[j] = 1.0
            gs = c.bwd(c.pack_dy(dys), *inputs)
            for k in diff:
                if gs[k] is None:
                    rows[k][i] = 0.0
                else:
                    rows[k][i] = np.ravel(gs[k])
            i += 1

    def out_index(i: int) -> tuple[int, ...]:
        which = int(np.searchsorted(offsets, i, side="right") - 1)
        idx = tuple(int(t) for t in np.unravel_index(i - offsets[which], y[which].shape))
        return ((which,) + idx) if len(y) > 1 else idx

    res = []
    for k in diff:
        if n_out == 0 or np.size(inputs[k]) == 0:
            res.append(CheckResult("jacobian", c.names[k], None,
                                   note=f"skipped: the Jacobian has no entries ({n_out} x "
                                        f"{np.size(inputs[k])})"))
            continue
        J, E = _jacobian_columns(c.F, inputs, k, c.method, c.out_u, len(y))
        A = rows[k]
        worst, top, n_bad = _compare_jacobians(A, J, E, c.rtol, c.atol,
                                              c.settings.max_worst)
        r, obs, tol_rel = worst
        check = CheckResult("jacobian", c.names[k], r <= 1, obs, tol_rel, r)
        if r > 1:
            shape = np.shape(inputs[k])
            for _, ii, jj, err_e, tol_e in top:
                check.worst.append(WorstEntry(
                    tuple(int(t) for t in np.unravel_index(jj, shape)), out_index(ii),
                    float(A[ii, jj]), float(J[ii, jj]), err_e, tol_e))
            check.note = f"{n_bad} of {A.size} entries out of tolerance"
        res.append(check)
    return res


# ----------------------------------------------------------------------------------------------
# (d) second order
# ----------------------------------------------------------------------------------------------


def _second_directional(F: Fn, inputs: Sequence[Any], diff: list[int], u: list[np.ndarray],
                        v1: dict[int, np.ndarray], v2: dict[int, np.ndarray],
                        out_u: float) -> tuple[float, float]:
    """d/ds ⟨u, J(θ + s·v2)·v1⟩ at s = 0 and an estimate of its error.

    The inner J·v1 is a complex step (exact); d/ds is Romberg on s = s0, s0/2, s0/4. v2 is
    relative to |x| (see ``_relative``), so s·|v2_i / x_i| <= s·max|gaussian| ~ 4s: s0 = 2^-8
    moves each element by at most ~1.5 % of itself.
    """

    def jv1_at(s: float) -> list[np.ndarray]:
        pt = list(inputs)
        for k in diff:
            pt[k] = np.asarray(inputs[k], np.float64) + s * v2[k]
        return _complex_step(F, pt, v1)

    s0 = 2.0**-8
    T0, mag = [], 0.0
    for s in (s0, s0 / 2, s0 / 4):
        jp, jm = jv1_at(s), jv1_at(-s)
        T0.append((_dot(u, jp) - _dot(u, jm)) / (2 * s))
        # rounding of φ(s) − φ(−s): ~u·|u·Jv1| per element, except where both sides are
        # bitwise equal (a part that does not move with s, e.g. a linear output, cancels exactly)
        for a, b, w in zip(jp, jm, u, strict=True):
            moved = a != b
            mag = max(mag, float(np.sum(np.abs(w[moved]) * np.maximum(np.abs(a[moved]),
                                                                      np.abs(b[moved])))))
    T2, T1 = _romberg(*T0)
    # truncation: the last two Romberg entries; rounding: `mag`·u divided by the smallest step,
    # times the Romberg weights (< 2) and a margin of 16
    est = abs(T2 - T1) + 2 * 16 * out_u * mag / (s0 / 4)
    return T2, est


def _second_order(checker: _Checker, double_backward: Callable[..., Any] | None,
                  requested: bool | None) -> list[CheckResult]:
    """Forward-over-reverse: the backward differentiated by complex step.

    With L(θ) = ⟨u, f(θ)⟩ and H its Hessian, the complex step of the backward along v gives
    H·v exactly to working precision. Checks:
      hessian_symmetry  ⟨v1, H v2⟩ = ⟨v2, H v1⟩ (any true gradient has a symmetric derivative);
      second_order      ⟨v1, H v2⟩ = d/ds ⟨u, J(θ + s·v2) v1⟩, the inner J·v1 by complex step of
                        the forward, d/ds by Richardson extrapolation (error estimated);
      double_backward   ⟨dd, J_B t⟩ = ⟨double_backward(dd), t⟩ per input (dy included), with
                        J_B t the complex step of the backward.
    """
    c = checker
    F, B, inputs, diff, names, floor = c.F, c.B, c.inputs, c.diff, c.names, c.floor
    u, n_out, out_u, rtol, atol, rng = c.us[0], c.n_out, c.out_u, c.rtol, c.atol, c.rng
    args = [*u, *inputs]
    off = n_out
    res: list[CheckResult] = []
    bwd_u = max([out_u] + [_unit_roundoff(np.asarray(inputs[k]).dtype) for k in diff])
    probe = {off + k: _relative(rng.standard_normal(np.shape(inputs[k])), inputs[k])
             for k in diff}
    for i in range(n_out):
        probe[i] = rng.standard_normal(u[i].shape)
    why = _holomorphy_test(B, args, probe, bwd_u)
    if why is not None:
        msg = f"the backward cannot be complex-stepped: {why}"
        if requested:
            return [CheckResult("second_order", None, False, math.inf, 0.0, math.inf, note=msg)]
        c.notes.append(f"second-order checks skipped: {msg}")
        return [CheckResult("second_order", None, None, note=msg)]

    g0 = dict(zip(diff, B(args), strict=True))  # the gradients at the point, for the floor
    scales = {k: _scale_of([inputs[k]]) for k in diff}
    # Which gradients depend on which other input at all (dbias does not depend on x): at a
    # random point, the backward at two random values of input m; a gradient with the same
    # bits at both does not depend on it. The random values span 2^-200..2^200 elementwise so
    # that every regime is visited (RMSNorm at N = 1 is constant in float64 for
    # |x| >> sqrt(eps), and add_rms_norm's x is invisible next to a residual of 1e150, yet
    # neither derivative is structurally zero). The floor's cross terms leave independent pairs
    # out.
    def random_like(k: int) -> np.ndarray:
        shape = np.shape(inputs[k])
        dt = np.asarray(inputs[k]).dtype
        e = min(200, int(np.finfo(np.float32 if dt.name == "bfloat16" else dt).maxexp) // 2 - 2)
        mag = np.exp2(rng.uniform(-e, e, shape))
        return (mag * rng.standard_normal(shape)).astype(np.asarray(inputs[k]).dtype)

    # Small inputs visit few regimes per draw: three draws below 4096 elements, else one.
    trials = 3 if sum(np.size(inputs[k]) for k in diff) < 4096 else 1
    for k in diff:
        for m in diff:
            floor.depends[(k, m)] = False
    for _ in range(trials):
        base = list(args)
        for k in diff:
            base[off + k] = random_like(k)
        for m in diff:
            outs = []
            for _ in range(2):
                pt = list(base)
                pt[off + m] = random_like(m)
                with np.errstate(all="ignore"):
                    outs.append(B(pt))
            for k, a, b in zip(diff, outs[0], outs[1], strict=True):
                if not np.array_equal(a, b, equal_nan=True):
                    floor.depends[(k, m)] = True
    # the radial derivative J·x_k of the inputs shaped like an output, for the floor's |1 - p|
    for k in floor.match:
        floor.set_radial(k, _numeric_jvp(F, inputs, {k: np.asarray(inputs[k], np.float64)},
                                         c.method, out_u)[0])

    n_pairs = max(1, math.ceil(c.settings.n_directions / 2))
    sym_worst, fd_worst = _Worst(), _Worst()
    fd_note = ""
    for _ in range(n_pairs):
        v1 = {off + k: rng.standard_normal(np.shape(inputs[k])) for k in diff}
        # v2 is the finite-difference direction of the second_order check: relative steps
        v2 = {off + k: _relative(rng.standard_normal(np.shape(inputs[k])), inputs[k])
              for k in diff}
        Hv1 = _complex_step(B, args, v1)
        Hv2 = _complex_step(B, args, v2)
        a = _dot(list(v1.values()), Hv2)
        b = _dot(list(v2.values()), Hv1)
        scale = _absdot(list(v1.values()), Hv2) + _absdot(list(v2.values()), Hv1)
        a1 = {k: v1[off + k] for k in diff}
        a2 = {k: v2[off + k] for k in diff}
        fl = (2 * sum(floor.second(k, u, a1[k], a2[k]) for k in diff)
              + floor.cross(a1, a2, u, g0, scales) + floor.cross(a2, a1, u, g0, scales))
        sym_worst.add(abs(a - b), scale, rtol * (scale + fl) + atol)
        if c.method != "complex":
            fd_note = "needs a complex-step forward (the nested finite difference is too coarse)"
        elif not fd_note:
            try:
                T2, est = _second_directional(F, inputs, diff, u,
                                              {k: v1[off + k] for k in diff},
                                              {k: v2[off + k] for k in diff}, out_u)
            except NotComplexCapable as e:
                # the points x ± s·v2 move each element by up to ~1.5 %: an input just above
                # the complex step's smallest scale can fall below it there
                fd_note = f"skipped: the forward cannot be complex-stepped near the point ({e})"
            else:
                scale2 = _absdot(list(v1.values()), Hv2)
                fd_worst.add(abs(a - T2), scale2, rtol * (scale2 + fl) + FD_SAFETY * est + atol)
    res.append(sym_worst.result("hessian_symmetry", None))
    if fd_note:
        res.append(CheckResult("second_order", None, None, note=fd_note))
    else:
        res.append(fd_worst.result("second_order", None,
                                   "⟨v1, H v2⟩ from the backward vs d/ds of the forward's JVP"))

    if double_backward is not None:
        dbl = _Counted(double_backward, "double_backward", c.counts)
        n_in = len(inputs)
        targets = [("dy", list(range(n_out)))] + [(names[k], [off + k]) for k in diff]
        for label, idxs in targets:
            worst = _Worst()
            for _ in range(n_pairs):
                t = {i: rng.standard_normal(np.shape(args[i])) for i in idxs}
                JBt = _complex_step(B, args, t)
                dd = [rng.standard_normal(g.shape) for g in JBt]
                ddgrads = [None] * n_in
                for j, k in enumerate(diff):
                    ddgrads[k] = dd[j]
                pack = (lambda ds: tuple(ds)) if n_out > 1 else (lambda ds: ds[0])
                out = dbl(tuple(ddgrads), pack(u), *inputs)
                ddy, dins = out[0], out[1:]
                ddys = list(ddy) if n_out > 1 else [ddy]
                if label == "dy":
                    ana = _dot([None if g is None else np.asarray(g) for g in ddys],
                               [t[i] for i in idxs])
                else:
                    k = idxs[0] - off
                    ana = _dot([None if dins[k] is None else np.asarray(dins[k])], [t[idxs[0]]])
                num = _dot(dd, JBt)
                scale = _absdot(dd, JBt)
                # Floor (see _Floor). Along dy every gradient is linear: |g_k|·max|t|/max|u|.
                # Along an input m: the cross terms, and the elementwise model for m itself.
                ddk = {k: dd[j] for j, k in enumerate(diff)}
                if label == "dy":
                    rho = max(float(np.max(np.abs(t[i]), initial=0.0)) / _scale_of([args[i]])
                              for i in idxs)
                    fl = rho * sum(float(np.sum(np.abs(ddk[k])
                                                * floor.grad_magnitude(k, u, g0[k])))
                                   for k in diff)
                else:
                    m = idxs[0] - off
                    fl = (floor.cross(ddk, {m: t[idxs[0]]}, u, g0, scales)
                          + floor.second(m, u, ddk[m], t[idxs[0]]))
                worst.add(abs(num - ana), scale, rtol * (scale + fl) + atol)
            res.append(worst.result("double_backward", label))
    return res


# ----------------------------------------------------------------------------------------------
# the oracle's ops, ready to check
# ----------------------------------------------------------------------------------------------

#: The oracle ops ``oracle_problem`` knows how to wrap.
ORACLE_OPS = ("rms_norm", "layer_norm", "unit_norm", "add_rms_norm")


@dataclass
class OracleProblem:
    """An oracle op wrapped as ``gradcheck`` callables at a random point.

    ``inputs`` are ``(x, weight, bias)`` (``(x, residual, weight)`` for add_rms_norm), with
    ``None`` for a parameter not used; ``jvp`` / ``double_backward`` are None where the oracle
    has none for that op.
    """

    op: str
    forward: Callable[..., Any]
    backward: Callable[..., Any]
    inputs: tuple[Any, ...]
    names: tuple[str, ...]
    jvp: Callable[..., Any] | None
    double_backward: Callable[..., Any] | None
    description: str

    def check(self, **kwargs: Any) -> GradcheckResult:
        """``gradcheck`` on this problem; ``kwargs`` go to ``gradcheck``."""
        kw: dict[str, Any] = {"jvp": self.jvp, "double_backward": self.double_backward,
                              "names": self.names}
        kw.update(kwargs)
        return gradcheck(self.forward, self.backward, self.inputs, **kw)


def oracle_problem(
    op: str,
    shape: tuple[int, ...] = (4, 16),
    *,
    weight: bool = True,
    bias: bool = False,
    offset: float = 0.0,
    partial: float | None = None,
    eps: float | None = None,
    normalized_ndim: int = 1,
    dtype: Any = np.float64,
    seed: int = 0,
) -> OracleProblem:
    """Wrap the oracle's ``op`` (one of ``ORACLE_OPS``) for ``gradcheck`` at a random point.

    Parameters
    ----------
    op : str
        "rms_norm", "layer_norm", "unit_norm" or "add_rms_norm".
    shape : tuple of int
        Shape of x; the last ``normalized_ndim`` dims are normalised.
    weight, bias : bool
        Whether the op gets a weight / a bias (bias: rms_norm, layer_norm, unit_norm only).
    offset : float
        Weight offset (weight used as offset + w): rms_norm and add_rms_norm only.
    partial : float, optional
        pRMSNorm fraction p (rms_norm only).
    eps : float, optional
        The op's eps (its own default when None).
    normalized_ndim : int
        How many trailing dims form ``normalized_shape``.
    dtype : dtype
        dtype of x and the parameters.
    seed : int
        Seed of the random point.

    Returns
    -------
    OracleProblem
    """
    import rmsref  # the oracle; imported here so that gradcheck stays usable on its own
    from rmsref._shapes import resolve_eps

    if op not in ORACLE_OPS:
        raise ValueError(f"op must be one of {ORACLE_OPS}, got {op!r}")
    if op not in ("rms_norm", "add_rms_norm") and offset != 0.0:
        raise ValueError(f"{op} has no weight offset (got offset={offset!r})")
    if op != "rms_norm" and partial is not None:
        raise ValueError(f"only rms_norm has partial (got partial={partial!r} for {op})")
    if op == "add_rms_norm" and bias:
        raise ValueError("add_rms_norm has no bias")
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    ns = tuple(shape[len(shape) - normalized_ndim:])
    # eps resolved once, from the problem's dtype: RMSNorm's default depends on the input's
    # dtype, and the complex step (complex128 inputs) must differentiate the same function.
    e = resolve_eps(eps, dtype, {"layer_norm": 1e-5, "unit_norm": 0.0}.get(op))
    x = rng.standard_normal(shape).astype(dtype)
    # weight near 1, or near 0 when it is used as offset + w (gemma: offset 1, w ~ 0)
    w = ((1.0 - offset) + 0.5 * rng.standard_normal(ns)).astype(dtype) if weight else None
    b = (0.5 * rng.standard_normal(ns)).astype(dtype) if bias else None
    desc = (f"{op} shape={shape} normalized_shape={ns} weight={weight} bias={bias} "
            f"offset={offset} partial={partial} eps={eps} dtype={dtype.name} seed={seed}")

    def zeros_if_none(t, like):
        return np.zeros(np.shape(like), np.asarray(like).dtype) if t is None else t

    if op == "rms_norm":
        kw = {"offset": offset, "partial": partial}

        def forward(x, w, b):
            return rmsref.rms_norm_forward(x, ns, w, e, bias=b, **kw)[0]

        def backward(dy, x, w, b):
            return tuple(rmsref.rms_norm_backward(dy, x, ns, w, e, bias=b, **kw))

        def jvp(inputs, tangents):
            x, w, b = inputs
            tx, tw, tb = tangents
            return rmsref.rms_norm_jvp(x, zeros_if_none(tx, x), ns, w, e, dweight_tan=tw,
                                       bias=b, dbias_tan=tb, **kw)

        def double_backward(dd, dy, x, w, b):
            ddx, ddw, ddb = dd
            g = rmsref.rms_norm_double_backward(zeros_if_none(ddx, x), dy, x, ns, w, e,
                                                ddweight=ddw, ddbias=ddb, **kw)
            return (g.ddy, g.dx, g.dweight, None)

        return OracleProblem(op, forward, backward, (x, w, b), ("x", "weight", "bias"), jvp,
                             double_backward, desc)

    if op in ("layer_norm", "unit_norm"):
        if op == "layer_norm":
            def forward(x, w, b):
                return rmsref.layer_norm_forward(x, ns, w, b, e)[0]

            def backward(dy, x, w, b):
                return tuple(rmsref.layer_norm_backward(dy, x, ns, w, b, e))

            def jvp(inputs, tangents):
                x, w, b = inputs
                tx, tw, tb = tangents
                return rmsref.layer_norm_jvp(x, zeros_if_none(tx, x), ns, w, b, e,
                                             dweight_tan=tw, dbias_tan=tb)
        else:
            def forward(x, w, b):
                return rmsref.unit_norm_forward(x, ns, w, e, bias=b)[0]

            def backward(dy, x, w, b):
                return tuple(rmsref.unit_norm_backward(dy, x, ns, w, e, bias=b))

            def jvp(inputs, tangents):
                x, w, b = inputs
                tx, tw, tb = tangents
                return rmsref.unit_norm_jvp(x, zeros_if_none(tx, x), ns, w, e, dweight_tan=tw,
                                            bias=b, dbias_tan=tb)

        return OracleProblem(op, forward, backward, (x, w, b), ("x", "weight", "bias"), jvp,
                             None, desc)

    # add_rms_norm: two outputs (y, new_residual); its backward takes both cotangents.
    r = rng.standard_normal(shape).astype(dtype)

    def forward(x, r, w):
        y, res, _ = rmsref.add_rms_norm_forward(x, r, ns, w, e, offset=offset)
        return y, res

    def backward(dys, x, r, w):
        dy, dres = dys
        g = rmsref.add_rms_norm_backward(dy, dres, x, r, ns, w, e, offset=offset)
        return (g.dx, g.dresidual, g.dweight)

    return OracleProblem(op, forward, backward, (x, r, w), ("x", "residual", "weight"), None,
                         None, desc)


def check_oracle(op: str, shape: tuple[int, ...] = (4, 16), *, weight: bool = True,
                 bias: bool = False, offset: float = 0.0, partial: float | None = None,
                 eps: float | None = None, seed: int = 0, **gradcheck_kwargs: Any
                 ) -> GradcheckResult:
    """``gradcheck`` of the oracle's ``op`` (backward, jvp, double backward where it has them).

    Parameters are those of ``oracle_problem``; ``gradcheck_kwargs`` go to ``gradcheck``
    (e.g. ``full=True``, ``method="richardson"``).

    Returns
    -------
    GradcheckResult
    """
    p = oracle_problem(op, shape, weight=weight, bias=bias, offset=offset, partial=partial,
                       eps=eps, seed=seed)
    return p.check(seed=seed, **gradcheck_kwargs)


def oracle_configs() -> list[dict[str, Any]]:
    """The standard set of oracle configurations ``check_oracle_all`` walks (keyword dicts)."""
    cfgs: list[dict[str, Any]] = []
    for shape in ((3, 16), (2, 3, 8)):
        cfgs += [
            {"op": "rms_norm", "shape": shape, "weight": False},
            {"op": "rms_norm", "shape": shape},
            {"op": "rms_norm", "shape": shape, "bias": True},
            {"op": "rms_norm", "shape": shape, "offset": 1.0},
            {"op": "rms_norm", "shape": shape, "partial": 0.5, "bias": True},
            {"op": "layer_norm", "shape": shape, "bias": True},
            {"op": "layer_norm", "shape": shape, "weight": False},
            {"op": "unit_norm", "shape": shape},
            {"op": "unit_norm", "shape": shape, "bias": True},
            {"op": "add_rms_norm", "shape": shape},
            {"op": "add_rms_norm", "shape": shape, "offset": 1.0},
        ]
    return cfgs


def check_oracle_all(*, seed: int = 0, full: bool = False,
                     **gradcheck_kwargs: Any) -> list[tuple[str, GradcheckResult]]:
    """Run ``check_oracle`` on every configuration of ``oracle_configs()``.

    Returns
    -------
    list of (description, GradcheckResult)
    """
    out = []
    for cfg in oracle_configs():
        cfg = dict(cfg)
        op = cfg.pop("op")
        shape = cfg.pop("shape")
        p = oracle_problem(op, shape, seed=seed, **cfg)
        out.append((p.description, p.check(seed=seed, full=full, **gradcheck_kwargs)))
    return out
