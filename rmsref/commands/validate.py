"""``rmsref validate``: check an implementation against the oracle and say what is wrong."""

from __future__ import annotations

import argparse
import sys

from rmsref.commands import _args

NAME = "validate"
HELP = "validate an RMSNorm implementation (torch, a module, or package.module:function)"
DESCRIPTION = """\
Run an RMSNorm implementation on adversarial probes (Gaussian rows, large offsets, huge and tiny
magnitudes, zero rows, N = 1, tails, NaN/Inf, non-contiguous, empty, multi-dim shapes, eps) in
each dtype, compare with the float64 oracle on the implementation's own rounded inputs under the
rounding-error bounds of rmsref.tolerance, and diagnose failures.

examples:
  rmsref validate torch                          # torch.nn.functional.rms_norm + autograd
  rmsref validate torch.nn:RMSNorm               # a module class, built per call
  rmsref validate mypkg.kernels:rms_norm --backward mypkg.kernels:rms_norm_bwd \\
      --convention llama --dtype bfloat16 --json out.json

Exit status: 0 when every (non-advisory) check passes, 1 when one fails, 2 on usage errors.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rmsref.conventions import names
    from rmsref.validation import ALL_PROBES

    parser.add_argument("target", help="'torch', or a 'package.module:function' (or :Class) path")
    parser.add_argument("--backward", metavar="PATH",
                        help="backward (dy, x, normalized_shape, weight, eps) -> (dx, dweight)")
    parser.add_argument("--convention", default="torch", choices=names(),
                        help="what the implementation claims to compute (default: torch)")
    parser.add_argument("--dtype", action="append", dest="dtypes", metavar="DTYPE",
                        choices=("float32", "bfloat16", "float16", "float64"),
                        help="input dtype (repeatable; default: float32, bfloat16, float16)")
    parser.add_argument("--probes", default="all",
                        help=f"comma-separated probes (default: all): {', '.join(ALL_PROBES)}")
    parser.add_argument("--eps", type=_args.eps, default=None,
                        help="eps passed to every probe (default: the implementation's default)")
    parser.add_argument("--eps-default", type=_args.eps, default=None, metavar="EPS",
                        help="the eps the implementation uses when given none (default: what "
                             "it declares, e.g. a module's variance_epsilon, else the "
                             "convention's)")
    parser.add_argument("--normalized-dims", choices=("any", "last"), default=None,
                        help="'last' when it normalises the last dimension only (default: what "
                             "it declares, else 'any')")
    parser.add_argument("--seed", type=_args.seed, default=0, help="seed of the probe inputs")
    parser.add_argument("--framework", default="auto", choices=("auto", "numpy", "torch", "jax"),
                        help="adapter to use (default: decided from the object)")
    parser.add_argument("--deterministic", action="store_true",
                        help="use the deterministic (worst-case) accumulation bound")
    parser.add_argument("--json", metavar="FILE", type=_args.writable_file,
                        help="also write the full report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")


def run(args: argparse.Namespace) -> int:
    from rmsref._progress import Output
    from rmsref.adapters.generic import framework_hint, resolve
    from rmsref.validation import ALL_PROBES, validate

    out = Output()
    try:
        loaded = resolve(args.target, args.backward, framework=args.framework)
    except (ImportError, ValueError, TypeError) as exc:
        print(f"rmsref validate: cannot load {args.target!r}: {exc}{_install_hint(exc)}",
              file=sys.stderr)
        return 2
    probes = "all" if args.probes == "all" else [p.strip() for p in args.probes.split(",") if p]
    if probes != "all":
        unknown = [p for p in probes if p not in ALL_PROBES]
        if unknown:
            print(f"rmsref validate: unknown probe(s) {', '.join(unknown)}; known: "
                  f"{', '.join(ALL_PROBES)}", file=sys.stderr)
            return 2
    dtypes = tuple(args.dtypes) if args.dtypes else ("float32", "bfloat16", "float16")
    n_steps = (len(ALL_PROBES) if probes == "all" else len(probes)) * len(dtypes)

    def run_validation(progress):
        return validate(loaded.forward, loaded.backward, convention=args.convention,
                        dtypes=dtypes, probes=probes, eps=args.eps, seed=args.seed,
                        form="deterministic" if args.deterministic else "probabilistic",
                        name=loaded.name, progress=progress, eps_default=args.eps_default,
                        normalized_dims=args.normalized_dims)

    if args.no_progress:
        report = run_validation(None)
    else:
        with out.progress(total=n_steps, description=f"validating {loaded.name}") as bar:
            def progress(done: int, total: int, label: str) -> None:
                bar.update(label)
                bar.advance()

            report = run_validation(progress)
    print(report.table())
    print(_legend(report))
    hint = framework_hint([c.message for c in report.failures], loaded.framework)
    if hint:
        print(hint)
    if not report and ("bfloat16" in dtypes or "float16" in dtypes):
        _print_closest(loaded.forward, args.eps)
    if loaded.backward is None:
        print("note: no backward given (and none derivable): only the forward was checked")
    if args.json:
        report.to_json(args.json)
        print(f"report written to {args.json}")
    return 0 if report else 1


def _print_closest(forward, eps: float | None) -> None:
    """On failure: which convention the output matches bit for bit (conventions.identify)."""
    from rmsref.conventions import identify

    try:
        ranking = identify(forward, eps=1e-5 if eps is None else eps)
    except Exception as exc:  # identification is a hint; never turn it into a crash
        print(f"(could not rank conventions: {exc})")
        return
    best = ", ".join(f"{m.name} {m.rate:.1%}" for m in ranking[:3])
    print(f"closest conventions (bit-exact share of half-precision outputs): {best}")
    per_case = ", ".join(f"{case} {rate:.1%}" for case, rate in ranking[0].rates.items())
    print(f"  {ranking[0].name} per input/weight dtype: {per_case}")


#: The rmsref extra that installs a missing top-level module.
_EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "numba": "numba", "numba_cuda": "cuda"}


def _install_hint(exc: BaseException) -> str:
    """``"; pip install 'rmsref[torch]'"`` when ``exc`` is a missing module an extra provides."""
    missing = (getattr(exc, "name", None) or "").split(".")[0]
    extra = _EXTRAS.get(missing)
    return f" (pip install 'rmsref[{extra}]')" if extra and "pip install" not in str(exc) else ""


def _legend(report) -> str:
    """What the table's rows, statuses and counts mean, with the counts in rows and in checks
    (a row is one probe in one dtype; its checks are the quantities it compares)."""
    from rmsref.validation import ADVISORY

    rows: dict[tuple[str, str], list] = {}
    for c in report.cases:
        rows.setdefault((c.probe, c.dtype), []).append(c)
    warn = [r for r in rows.values() if all(c.ok for c in r) and not all(c.passed for c in r)]
    fail = [r for r in rows.values() if not all(c.ok for c in r)]
    n_warn = sum(not c.passed for r in warn for c in r)
    n_fail = sum(not c.ok for r in fail for c in r)
    return "\n".join([  # lines of at most 80 columns
        f"legend: {len(rows)} rows (one probe in one dtype) = {len(report.cases)} checks "
        "(its y, dx, dweight).",
        "  ok     every check of the row within its bound: ratio <= 1 ('-': none).",
        "         In float16/bfloat16 ~0.96 is normal: the one final rounding to",
        "         the output dtype (0.5 ulp) uses most of the bound.",
        f"  WARN   advisory probe ({', '.join(ADVISORY)}): x² leaves the range of a",
        "         single-precision accumulator, which no such pipeline survives.",
        f"         Reported, not a failure: {len(warn)} rows, {n_warn} checks.",
        f"  FAIL   a check beyond its bound: {len(fail)} rows, {n_fail} checks; the",
        "         diagnosis lines above say why.",
        "  n/a    the probe does not apply to what the implementation declares",
        "         (its eps, the dims it normalises): the notes say why.",
        "  ulp(y) the worst error of y in units in the last place of the output dtype.",
    ])
