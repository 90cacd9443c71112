"""``rmsref check``: the library verifies itself and prints what it measured.

Four groups of checks, each row a measured residual (or error) against a derived bound:

* ``identities`` -- the executable identities of :mod:`rmsref.identities` (RMS² = σ² + μ²,
  scale invariance, the Jacobian's eigenvalues, ...) on the NumPy oracle, bounds from the float64
  error model or from confidence intervals;
* ``gradcheck`` -- :func:`rmsref.gradcheck` on every op of the oracle (backward, JVP, double
  backward against complex-step derivatives), over ``rmsref.derivatives.oracle_configs()``;
* ``<backend>`` -- for every fast backend ``rmsref.available_backends()`` reports: agreement with
  the oracle (y, rstd, dx, dweight on a few shapes, per dtype; bounds from
  :mod:`rmsref.tolerance`) and bitwise determinism (the same call twice; a row's result whatever
  the batch size; whatever the thread count for Numba backends);
* ``<backend> identities`` -- the identities again, computed by the backend (those needing a
  function it lacks are skipped with the reason).

The exit status is 0 only when nothing failed (skipped checks are reported, not failures).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rmsref import backends
from rmsref.commands import _args

NAME = "check"
HELP = "verify rmsref: identities, gradient checks, fast backends against the oracle"
DESCRIPTION = """\
Verify rmsref on this machine and print what was measured.

Every row is one check: a residual (how far two things that should agree
are apart), the bound it must stay under (derived from a floating-point error
model or a confidence interval, never fitted), their ratio, and the status.
A check passes when ratio <= 1. Correct float64 and float32 code typically
shows ratios of 1e-3 to 1e-1; in float16 and bfloat16 ratios near 1 (~0.96)
are normal for correct code: the one final rounding to the output dtype
(half an ulp) uses most of the bound.

Groups:
  identities   properties of RMSNorm from the literature, on the NumPy oracle:
               RMS^2 = var + mean^2, RMSNorm = sqrt(N) * UnitNorm, LayerNorm =
               RMSNorm of the centred input, scale invariance, the Jacobian
               and its eigenvalues, ... (see rmsref.identities)
  gradcheck    every backward, JVP and double backward of the oracle against
               complex-step derivatives (see rmsref.gradcheck)
  <backend>    each fast backend (e.g. numba_cpu) against the oracle, per
               dtype, and bit-for-bit determinism (repeat, batch size, threads)
  <backend> identities
               with --full: the identities computed by that backend

Exit status: 0 when every check passed (skipped ones are listed with the
reason), 1 when a check failed, 2 for a usage error.

Examples:
  rmsref check             the default run (seconds; the first run also
                           compiles the Numba kernels, about half a minute,
                           cached after, and says so while it does)
  rmsref check --quick     fewer sizes, samples and dtypes
  rmsref check --full      all dtypes, and the identities on each backend
  rmsref check --only identities
                           one group; --only 'jacobian', --only '*:forward y*'
  rmsref check --backend numba_cpu --json report.json
"""

#: Table columns.
_COLUMNS = ("group", "check", "residual", "bound", "ratio", "status")


@dataclass
class Outcome:
    """One row of the report. ``residual``/``bound`` are None where they do not apply."""

    group: str
    check: str
    residual: float | None
    bound: float | None
    ratio: float | None
    status: str  # "pass", "FAIL" or "skip"
    detail: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as strict JSON data: a non-finite number (an infinite ratio) becomes null."""
        out = {
            "group": self.group,
            "check": self.check,
            "residual": self.residual,
            "bound": self.bound,
            "ratio": self.ratio,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 4),
        }
        if self.extra:
            out.update(self.extra)
        return _strict(out)


def _strict(obj: Any) -> Any:
    """``obj`` with NaN and ±inf replaced by None, recursively (JSON has no such numbers)."""
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


@dataclass
class Check:
    """A planned check: ``fn()`` returns (residual, bound, ratio, passed, detail[, extra])."""

    group: str
    name: str
    fn: Callable[[], tuple]

    @property
    def full_name(self) -> str:
        return f"{self.group}: {self.name}"


class _Skip(Exception):
    """Raised by a check that cannot run here; the message is the reason."""


# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``rmsref check``."""
    parser.add_argument(
        "--quick", action="store_true",
        help="fewer sizes and samples; backends in float32 only",
    )
    parser.add_argument(
        "--full", action="store_true",
        help="also compare backends in float16 and float64 (not only float32 and bfloat16) and "
        "run the identities on each backend's own functions; a cold Numba cache then compiles "
        "for every dtype (about 10-25 s each, once)",
    )
    parser.add_argument(
        "--json", metavar="FILE", type=_args.writable_file,
        help="also write every result (with the identities' parts) to FILE as JSON",
    )
    parser.add_argument(
        "--backend", metavar="NAME",
        help="check only this backend against the oracle (registered: "
        f"{', '.join(backends.backend_names())}; default: every available one; the reference "
        f"{'/'.join(n for n in backends.backend_names() if backends.spec(n).reference)} means "
        "the oracle alone). See `python -c 'import rmsref; print(rmsref.available_backends())'`",
    )
    parser.add_argument(
        "--only", metavar="PATTERN", action="append",
        help="run only checks whose 'group: check' name contains PATTERN (case-insensitive), "
        "or matches it as a glob when it has * ? or [ ; repeatable",
    )
    parser.add_argument(
        "--seed", metavar="N", type=_args.seed, default=0,
        help="seed of every random input (default 0); any seed should pass",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="print each check's detail (worst part, measured deviations) under the table",
    )
    parser.add_argument(
        "--plain", action="store_true",
        help="plain-text output even when rich is installed",
    )


# ----------------------------------------------------------------------------------------------
# planning
# ----------------------------------------------------------------------------------------------


def _identity_checks(group: str, seed: int, quick: bool, impl: Callable[[], Any] | None
                     ) -> list[Check]:
    from rmsref import identities

    def make(name: str) -> Callable[[], tuple]:
        def fn() -> tuple:
            target = None if impl is None else impl()
            r = identities.run_one(name, seed=seed, impl=target, quick=quick)
            if r.passed is None:
                raise _Skip(r.detail.removeprefix("skipped: "))
            extra = {"parts": r.to_dict()["parts"]}
            return r.residual, r.bound, r.ratio, r.passed, r.detail, extra

        return fn

    return [Check(group, name, make(name)) for name in identities.names()]


def _config_label(cfg: dict[str, Any]) -> str:
    """A short name for one gradcheck configuration: op, shape and the options set."""
    shape = "x".join(str(d) for d in cfg["shape"])
    flags = []
    for key in ("weight", "bias"):
        if key in cfg:
            flags.append(key if cfg[key] else f"no {key}")
    for key in ("offset", "partial", "eps"):
        if cfg.get(key) is not None and cfg.get(key) != 0.0:
            flags.append(f"{key}={cfg[key]:g}")
    return f"{cfg['op']} {shape}" + (f" ({', '.join(flags)})" if flags else "")


def _gradcheck_checks(seed: int, quick: bool) -> list[Check]:
    try:
        gc = importlib.import_module("rmsref.derivatives")
        configs = gc.oracle_configs()
    except (ImportError, AttributeError) as exc:
        reason = f"rmsref.gradcheck does not provide oracle_configs/oracle_problem ({exc})"

        def skip() -> tuple:
            raise _Skip(reason)

        return [Check("gradcheck", "oracle ops", skip)]
    if quick:  # the first shape only
        configs = [c for c in configs if tuple(c["shape"]) == tuple(configs[0]["shape"])]

    def make(cfg: dict[str, Any]) -> Callable[[], tuple]:
        def fn() -> tuple:
            kw = dict(cfg)
            op, shape = kw.pop("op"), kw.pop("shape")
            problem = gc.oracle_problem(op, tuple(shape), seed=seed, **kw)
            result = problem.check(seed=seed)
            ran = [c for c in result.checks if c.passed is not None]
            if not ran:
                raise _Skip("gradcheck ran no check: " + "; ".join(result.notes))
            worst = max(ran, key=lambda c: c.ratio)
            where = worst.name + (f" {worst.input}" if worst.input else "")
            failed = [c for c in ran if c.passed is False]
            detail = f"{len(ran)} checks (numerical derivatives: {result.method}), worst {where}"
            if failed:
                detail = "failed: " + ", ".join(
                    c.name + (f" {c.input}" if c.input else "") for c in failed)
            if result.notes:
                detail += "; " + "; ".join(result.notes)
            if failed:
                detail += "\n" + result.report()
            return (worst.observed, worst.tolerance, worst.ratio, not failed, detail,
                    {"gradcheck": result.to_dict()})

        return fn

    return [Check("gradcheck", _config_label(c), make(c)) for c in configs]


def _backend_loader(name: str) -> Callable[[], Any]:
    """A memoised loader of backend ``name``: returns the module, raises _Skip when it cannot
    run here (a missing optional dependency) and re-raises any other error, including a module
    of rmsref itself that is missing (a broken install: a failure)."""
    state: dict[str, Any] = {}

    def load() -> Any:
        if "module" in state:
            return state["module"]
        if "skip" in state:
            raise _Skip(state["skip"])
        import rmsref

        try:
            module = rmsref.backend(name)
        except ModuleNotFoundError as exc:
            if (exc.name or "rmsref").split(".")[0] == "rmsref":
                raise
            state["skip"] = f"{name} needs {exc.name}, which is not installed ({exc})"
            raise _Skip(state["skip"]) from None
        except RuntimeError as exc:  # unavailable after all
            state["skip"] = str(exc)
            raise _Skip(state["skip"]) from None
        state["module"] = module
        return module

    return load


def _plan(args: argparse.Namespace) -> tuple[list[Check], list[str]]:
    """Every check of this run, in order, and the backends covered."""
    import rmsref

    seed, quick = args.seed, args.quick
    checks = _identity_checks("identities", seed, quick, None)
    checks += _gradcheck_checks(seed, quick)

    available = rmsref.available_backends()
    if args.backend is not None:
        if args.backend not in available:
            raise _UsageError(f"unknown backend {args.backend!r}; registered: "
                              f"{', '.join(available)}")
        if available[args.backend] is not None:
            raise _UsageError(f"backend {args.backend!r} is unavailable here: "
                              f"{available[args.backend]}")
        names = [] if backends.spec(args.backend).reference else [args.backend]
    else:
        names = backends.fast_backend_names()
    covered = []
    for name in names:
        reason = available[name]
        if reason is None and _simulated(name) and args.backend != name:
            reason = ("NUMBA_ENABLE_CUDASIM=1: the CUDA simulator runs every GPU thread in "
                      "Python, too slow for the default run; `rmsref check --backend "
                      f"{name} --quick` checks it on small shapes")
        broken = backends.why_broken(name) if reason is not None else None
        if broken is not None:  # installed but cannot run: a failure, not a skip
            def fail(broken: str = broken) -> tuple:
                raise RuntimeError(broken)

            checks.append(Check(name, "cannot load", fail))
            continue
        if reason is not None:
            def skip(reason: str = reason) -> tuple:
                raise _Skip(reason)

            checks.append(Check(name, "unavailable", skip))
            continue
        covered.append(name)
        load = _backend_loader(name)
        small = quick or _simulated(name)
        dtypes = [d for d in _dtypes(quick, args.full) if d.name in backends.spec(name).dtypes]
        checks += _agreement_checks(name, load, seed, dtypes, small)
        checks += _determinism_checks(name, load, seed, quick, small=_simulated(name))
        if args.full:
            checks += _identity_checks(f"{name} identities", seed, quick, load)
    return checks, covered


class _UsageError(Exception):
    pass


def _simulated(name: str) -> bool:
    """True for a backend running in its simulator (Python speed: small shapes only)."""
    return backends.spec(name).simulated()


# ----------------------------------------------------------------------------------------------
# backends against the oracle
# ----------------------------------------------------------------------------------------------

#: (shape of x, normalized_shape) pairs each backend is compared on.
_SHAPES = (((4, 64), 64), ((7, 33), 33), ((3, 5, 96), 96), ((2, 3, 8, 16), (8, 16)))
_QUICK_SHAPES = _SHAPES[:2]


def _dtypes(quick: bool, full: bool) -> list[np.dtype]:
    """Backend dtypes: float32 (quick); float32, bfloat16 (default); all four (full).

    Each dtype costs a Numba compilation on a cold cache (10-25 s on 2 busy cores, once; the
    cache is kept next to the kernels), which is what keeps the default to the two dtypes
    models train in.
    """
    from rmsref._shapes import FLOAT_DTYPES

    if full:
        keep: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")
    else:
        keep = ("float32",) if quick else ("float32", "bfloat16")
    return [FLOAT_DTYPES[k] for k in keep]


def _worst_element(err: np.ndarray, bound: np.ndarray) -> tuple[float, float, float]:
    """(error, bound, ratio) at the element with the largest error/bound."""
    err = np.abs(np.asarray(err, np.float64)).ravel()
    bound = np.asarray(bound, np.float64).ravel()
    if not np.all(np.isfinite(err)):
        return math.inf, float(np.max(bound)), math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound)
    k = int(np.argmax(ratio))
    return float(err[k]), float(bound[k]), float(ratio[k])


def _agreement(module: Any, dtype: np.dtype, seed: int, quick: bool,
               convention: str = "torch") -> dict[str, tuple]:
    """Backend vs oracle for one dtype over the shapes: quantity -> (err, bound, ratio, detail).

    y, dx and dweight go through :func:`rmsref.comparison.compare`: the oracle in float64 on
    exactly the backend's (rounded) inputs, with the eps the backend's default resolves to, and
    the bounds of the error model of the backend's convention (its registry entry;
    docs/tolerances.md, the default probabilistic form). rstd is compared relatively, against
    ρ (tolerance.ErrorModel.rho) plus one rounding to the dtype the backend stores it in.
    """
    from rmsref import conventions, tolerance
    from rmsref._shapes import default_eps
    from rmsref.comparison import Reference, compare

    rng = np.random.default_rng([seed, 7, dtype.num, dtype.itemsize])
    worst: dict[str, tuple] = {}
    for shape, ns in (_QUICK_SHAPES if quick else _SHAPES):
        nsz = (ns,) if isinstance(ns, int) else ns
        n, m = int(np.prod(nsz)), int(np.prod(shape)) // int(np.prod(nsz))
        x = rng.standard_normal(shape).astype(dtype)
        w = rng.uniform(0.5, 1.5, nsz).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        ref = Reference(x, nsz, w, default_eps(dtype), dy=dy)
        model = conventions.get(convention).error_model(dtype, n, m)

        y, rstd = module.rms_norm_forward(x, ns, w, None)
        g = module.rms_norm_backward(dy, x, ns, w, None, rstd=rstd)
        label = f"worst at x shape {shape}"

        def record(q: str, e: float, b: float, r: float, detail: str) -> None:
            if q not in worst or r > worst[q][2]:
                worst[q] = (e, b, r, detail)

        for got, what in ((y, "y"), (g.dx, "dx"), (g.dweight, "dweight")):
            expected_dtype = dtype if what != "dweight" else w.dtype
            expected_shape = np.shape(x) if what != "dweight" else np.shape(w)
            if got is None or np.shape(got) != expected_shape or np.dtype(
                    got.dtype) != expected_dtype:
                got_desc = None if got is None else (np.shape(got), str(np.asarray(got).dtype))
                worst[what] = (math.inf, 0.0, math.inf,
                               f"{what} is {got_desc}, expected {expected_shape} {dtype.name}")
                continue
            if what in worst and not math.isfinite(worst[what][2]):
                continue
            c = compare(what, got, ref, model)
            row, col = c.worst if c.worst is not None else (0, 0)
            b = float(c.bound[row, col]) if c.bound.size else 0.0
            detail = label + (f"; max error {c.max_ulp:.2f} ulp of {dtype.name}"
                              if what == "y" else "")   # ≤ 0.5 ulp is one rounding
            record(what, c.ratio * b, b, c.ratio, detail)
        r_b = np.asarray(rstd)
        if r_b.size != m:
            worst["rstd"] = (math.inf, 0.0, math.inf,
                             f"rstd has shape {r_b.shape}, expected {m} values (one per row)")
        else:
            u_stat = tolerance.unit_roundoff(r_b.dtype) if r_b.dtype.kind == "f" else 0.0
            r64 = ref.rstd.reshape(-1)
            e, b, r = _worst_element(r_b.astype(np.float64).reshape(-1) - r64,
                                     (model.rho + u_stat) * np.abs(r64))
            record("rstd", e, b, r, label)
    return worst


def _agreement_checks(name: str, load: Callable[[], Any], seed: int,
                      dtypes: Sequence[np.dtype], quick: bool) -> list[Check]:
    cache: dict[str, dict[str, tuple]] = {}
    checks = []
    for dtype in dtypes:
        for quantity in ("y", "rstd", "dx", "dweight"):
            def fn(dtype: np.dtype = dtype, quantity: str = quantity) -> tuple:
                module = load()
                if dtype.name not in cache:
                    cache[dtype.name] = _agreement(module, dtype, seed, quick,
                                                   backends.spec(name).convention)
                err, bnd, ratio, detail = cache[dtype.name][quantity]
                return err, bnd, ratio, ratio <= 1.0, detail

            phase = "forward" if quantity in ("y", "rstd") else "backward"
            checks.append(Check(name, f"{phase} {quantity} {dtype.name}", fn))
    return checks


def _bits_equal(a: Any, b: Any) -> int:
    """Number of elements whose bits differ (shape mismatch counts every element)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size, 1)
    av = a.reshape(-1).view(np.uint8).reshape(a.size, -1)
    bv = b.reshape(-1).view(np.uint8).reshape(b.size, -1)
    return int(np.count_nonzero(np.any(av != bv, axis=1)))


def _determinism_checks(name: str, load: Callable[[], Any], seed: int, quick: bool, *,
                        small: bool = False) -> list[Check]:
    """Bitwise: the same call twice; each row's y/dx whatever the batch; the thread count."""
    from rmsref._shapes import FLOAT_DTYPES

    dtypes = [FLOAT_DTYPES["float32"]] if quick else [FLOAT_DTYPES["float32"],
                                                      FLOAT_DTYPES["bfloat16"]]
    # several rows per thread and several parts of the dweight reduction (small: the simulator)
    m, n = (9, 40) if small else (257, 128)

    def inputs(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, 11, dtype.num])
        return (rng.standard_normal((m, n)).astype(dtype),
                rng.uniform(0.5, 1.5, n).astype(dtype),
                rng.standard_normal((m, n)).astype(dtype))

    def run_all(module: Any, x, w, dy) -> dict[str, np.ndarray]:
        y, rstd = module.rms_norm_forward(x, n, w)
        g = module.rms_norm_backward(dy, x, n, w, rstd=rstd)
        return {"y": y, "rstd": rstd, "dx": g.dx, "dweight": g.dweight}

    def summary(diffs: dict[str, int], total: dict[str, int], what: str) -> tuple:
        bad = {k: v for k, v in diffs.items() if v}
        count = float(sum(bad.values()))
        if bad:
            detail = "; ".join(f"{k}: {v} of {total[k]} elements differ" for k, v in bad.items())
        else:
            detail = f"{what}: identical bits ({', '.join(sorted(total))})"
        return count, 0.0, (0.0 if count == 0 else math.inf), count == 0, detail

    def repeat() -> tuple:
        module = load()
        diffs: dict[str, int] = {}
        total: dict[str, int] = {}
        for dtype in dtypes:
            args = inputs(dtype)
            a, b = run_all(module, *args), run_all(module, *args)
            for k in a:
                diffs[k] = diffs.get(k, 0) + _bits_equal(a[k], b[k])
                total[k] = total.get(k, 0) + np.size(a[k])
        return summary(diffs, total, "two identical calls")

    def batch() -> tuple:
        module = load()
        diffs = {"y": 0, "rstd": 0, "dx": 0}
        total = {"y": 0, "rstd": 0, "dx": 0}
        for dtype in dtypes:
            x, w, dy = inputs(dtype)
            full = run_all(module, x, w, dy)
            for k in (1, 5, m - 1):
                part = run_all(module, x[:k], w, dy[:k])
                for q in diffs:
                    diffs[q] += _bits_equal(part[q], np.asarray(full[q])[:k])
                    total[q] += np.size(part[q])
        return summary(diffs, total, "batches of 1, 5 and M-1 rows vs the full batch")

    def threads() -> tuple:
        module = load()
        most = backends.max_threads(name)
        if most < 2:
            raise _Skip(f"{name} has a single thread here (its thread knob: "
                        f"{backends.spec(name).threads})")
        before = backends.set_threads(name, most)
        diffs: dict[str, int] = {}
        total: dict[str, int] = {}
        try:
            for dtype in dtypes:
                args = inputs(dtype)
                backends.set_threads(name, 1)
                one = run_all(module, *args)
                backends.set_threads(name, most)
                many = run_all(module, *args)
                for k in one:
                    diffs[k] = diffs.get(k, 0) + _bits_equal(one[k], many[k])
                    total[k] = total.get(k, 0) + np.size(one[k])
        finally:
            backends.set_threads(name, before)
        return summary(diffs, total, f"1 thread vs {most}")

    checks = [Check(name, "bitwise repeat", repeat), Check(name, "bitwise batch size", batch)]
    if backends.spec(name).threads is not None:
        checks.append(Check(name, "bitwise thread count", threads))
    return checks


# ----------------------------------------------------------------------------------------------
# running and reporting
# ----------------------------------------------------------------------------------------------


def _matches(full_name: str, patterns: Sequence[str] | None) -> bool:
    """Whether ``full_name`` ("group: check") is selected by any of the --only patterns.

    Case-insensitive; "group:check" and "group: check" are the same. A pattern with * ? or [
    is a glob over the whole name, anything else a substring.
    """
    if not patterns:
        return True
    name = full_name.lower().replace(": ", ":")
    for p in patterns:
        p = p.lower().replace(": ", ":")
        if any(ch in p for ch in "*?["):
            if fnmatch.fnmatchcase(name, p):
                return True
        elif p in name:
            return True
    return False


def _execute(check: Check) -> Outcome:
    start = time.perf_counter()
    extra = None
    try:
        out = check.fn()
        residual, bound, ratio, passed, detail = out[:5]
        extra = out[5] if len(out) > 5 else None
        status = "pass" if passed else "FAIL"
    except _Skip as exc:
        residual = bound = ratio = None
        status, detail = "skip", str(exc)
    except Exception as exc:  # the code under test raised: a failure, with its message
        residual = bound = None
        ratio = math.inf
        status, detail = "FAIL", f"raised {type(exc).__name__}: {exc}"
    return Outcome(check.group, check.name, residual, bound, ratio, status, detail,
                   time.perf_counter() - start, extra)


#: A Numba backend's check that runs longer than this is compiling: the run says so.
_COMPILE_NOTICE_AFTER_S = 2.0
#: Cold-cache compile time per dtype of the kernels a check calls (the forward and the backward
#: with a saved rstd: 8-9 s on 2 cores in bench/results/compile.md), rounded up for busy machines.
_COMPILE_S_PER_DTYPE = 10


def _compile_notice(check: Check, bar: Any, n_dtypes: int, noticed: set[str]) -> Any:
    """A timer that tells the user, once per backend, that Numba is compiling when a check of a
    Numba backend is still running after a moment (a cold cache: the first run only). Printed
    to stderr and flushed, also when the output is piped. Returns the started timer, or None."""
    import threading

    group = check.group.split()[0]
    if group not in backends.backend_names() or not backends.spec(group).compiles or (
            group in noticed or _simulated(group)):
        return None

    def say() -> None:
        noticed.add(group)
        bar.note(f"compiling Numba kernels for {group} (first run only, about "
                 f"{_COMPILE_S_PER_DTYPE * n_dtypes} s; cached on disk after)")

    timer = threading.Timer(_COMPILE_NOTICE_AFTER_S, say)
    timer.daemon = True
    timer.start()
    return timer


def _fmt(v: float | None, spec: str) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    return format(v, spec)


_STYLES = {"pass": None, "FAIL": "bold red", "skip": "yellow"}


def _report(out: Any, outcomes: list[Outcome], verbose: bool) -> None:
    from rmsref._progress import Column

    columns = [Column("group"), Column("check"), Column("residual", "right", True),
               Column("bound", "right", True), Column("ratio", "right", True),
               Column("status", no_wrap=True)]
    rows, styles = [], []
    for o in outcomes:
        rows.append([o.group, o.check, _fmt(o.residual, ".2e"), _fmt(o.bound, ".2e"),
                     _fmt(o.ratio, ".3g"), o.status])
        styles.append(_STYLES[o.status])
    out.table(None, columns, rows, styles=styles)
    notes = [o for o in outcomes if verbose or o.status != "pass"]
    if notes:
        out.print()
    for o in notes:
        first, *rest = o.detail.splitlines() or [""]
        out.print(f"{o.status:4}  {o.group}: {o.check} -- {first}", style=_STYLES[o.status])
        if o.status == "FAIL" or verbose:
            for line in rest:
                out.print(f"      {line}")


def _write_json(path: str, args: argparse.Namespace, outcomes: list[Outcome], covered: list[str],
                elapsed: float, counts: dict[str, int]) -> None:
    import rmsref

    doc = {
        "rmsref": rmsref.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "seed": args.seed,
        "quick": bool(args.quick),
        "backends": covered,
        "only": args.only,
        "elapsed_s": round(elapsed, 3),
        "summary": counts,
        "passed": counts["failed"] == 0,
        "results": [o.to_dict() for o in outcomes],
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, allow_nan=False)
        fh.write("\n")


def run(args: argparse.Namespace) -> int:
    """Run the checks selected by ``args``; 0 when none failed, 1 otherwise, 2 on bad usage."""
    import rmsref
    from rmsref._progress import Output

    out = Output(plain=True if args.plain else None)
    start = time.perf_counter()
    try:
        planned, covered = _plan(args)
    except _UsageError as exc:
        out.print(f"rmsref check: {exc}")
        return 2
    checks = [c for c in planned if _matches(c.full_name, args.only)]
    if not checks:
        out.print(f"rmsref check: no check matches --only {' '.join(args.only or [])}; "
                  f"groups: {', '.join(dict.fromkeys(c.group for c in planned))}")
        return 2

    what = ", ".join(["the NumPy oracle"] + covered)
    out.print(f"rmsref {rmsref.__version__} check: {what}; seed {args.seed}"
              + ("; quick" if args.quick else ""), style="bold")
    out.print("ratio = residual / bound; a check passes when ratio <= 1. Bounds: identities from "
              "the float64 error model or a confidence interval (rmsref.identities), gradcheck "
              "from its rtol (rmsref.gradcheck), backends from rmsref.tolerance. In bfloat16 "
              "and float16 ratios near 1 (~0.96) are normal: the one final rounding to the "
              "output dtype uses most of the bound.")
    outcomes: list[Outcome] = []
    noticed: set[str] = set()
    with out.progress(len(checks), "rmsref check") as bar:
        for check in checks:
            bar.update(check.full_name)
            timer = _compile_notice(check, bar, len(_dtypes(args.quick, args.full)), noticed)
            outcomes.append(_execute(check))
            if timer is not None:
                timer.cancel()
            bar.advance()
    elapsed = time.perf_counter() - start

    _report(out, outcomes, args.verbose)
    counts = {s: sum(o.status == k for o in outcomes)
              for s, k in (("passed", "pass"), ("failed", "FAIL"), ("skipped", "skip"))}
    ran = [o for o in outcomes if o.status != "skip" and o.ratio is not None]
    worst = max(ran, key=lambda o: o.ratio if not math.isnan(o.ratio) else math.inf,
                default=None)
    line = (f"rmsref check: {'PASSED' if counts['failed'] == 0 else 'FAILED'} -- "
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
            f"in {elapsed:.1f} s")
    if worst is not None:
        line += f"; worst ratio {_fmt(worst.ratio, '.3g')} ({worst.group}: {worst.check})"
    if args.json:
        _write_json(args.json, args, outcomes, covered, elapsed, counts)
        line += f"; JSON in {args.json}"
    out.print()
    out.print(line, style="bold green" if counts["failed"] == 0 else "bold red")
    return 0 if counts["failed"] == 0 else 1
