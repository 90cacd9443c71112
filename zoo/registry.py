"""Find every zoo entry, run one through ``rmsref.validate``, and record what was measured.

:func:`discover` imports each module of ``zoo/entries/`` and collects its ``ENTRIES``; a module
that cannot be imported is kept as a :class:`Broken` record (the tests skip it with its error,
never silently). :func:`run` builds an entry, validates it with what it declares (its convention,
eps default, normalised dims, dtypes) and measures the facts the docs page shows: the conventions
that reproduce it bit for bit (with rates per dtype and weight dtype), its output dtypes, what it
computes for float64 input, and its package's version, so a verdict change is visible.

    python -m zoo.registry                     # run every entry, print verdicts
    python -m zoo.registry --results DIR       # ... and write DIR/<name>.json for the docs page
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import pkgutil
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rmsref.diagnosis import CODES
from zoo.entry import ZooEntry, ZooUnavailable

ENTRIES_PACKAGE = "zoo.entries"

#: The cause codes an expected failure may name ("fail:<code>"), as the diagnosis reports them.
DIAGNOSIS_CODES = tuple(CODES)


@dataclass(frozen=True)
class Broken:
    """An entry module that could not be imported, and why."""

    module: str
    error: str


def entry_modules() -> list[str]:
    """The importable names of the modules in ``zoo/entries/``, sorted."""
    package = importlib.import_module(ENTRIES_PACKAGE)
    return sorted(f"{ENTRIES_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(package.__path__))


def discover() -> list[ZooEntry | Broken]:
    """Every entry of every module in ``zoo/entries/`` (a :class:`Broken` per failed import).

    Raises ValueError when two entries share a name (a name keys the results and the docs row).
    """
    found: list[ZooEntry | Broken] = []
    for name in entry_modules():
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # an entry module's own bug must not hide the others
            found.append(Broken(name, f"{type(exc).__name__}: {exc}"))
            continue
        found.extend(getattr(module, "ENTRIES", []))
    names = [e.name for e in found if isinstance(e, ZooEntry)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"zoo entry names must be unique; repeated: {', '.join(twice)}")
    return found


def package_version(package: str) -> str:
    """The installed version of distribution ``package`` ("" when there is no package)."""
    if not package:
        return ""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------------------------------------
# Running one entry
# ------------------------------------------------------------------------------------------------


@dataclass
class ZooResult:
    """What one entry did: verdicts per dtype and the measured facts of the docs page."""

    name: str
    title: str
    package: str
    version: str
    source: str
    convention: str
    expected: dict[str, str]
    verdicts: dict[str, str] = field(default_factory=dict)        # dtype -> "pass" / "fail"
    codes: dict[str, list[str]] = field(default_factory=dict)     # dtype -> diagnosis codes
    failed_checks: dict[str, list[str]] = field(default_factory=dict)   # dtype -> probe/quantity
    backward: str = ""
    identified: list[dict[str, Any]] = field(default_factory=list)  # best first, with rates
    eps_default: str = ""
    out_dtype: str = ""
    float64: str = ""
    not_applicable: list[str] = field(default_factory=list)
    report_notes: list[str] = field(default_factory=list)
    notes: str = ""
    unavailable: str = ""
    seconds: float = 0.0
    python: str = field(default_factory=platform.python_version)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)


def run(entry: ZooEntry, *, identify: bool = True):
    """Build ``entry`` and validate it as it declares itself.

    Returns
    -------
    (ZooResult, ValidationReport)

    Raises
    ------
    ZooUnavailable
        From ``entry.build`` when the implementation cannot run here.
    """
    from rmsref.validation import validate

    t0 = time.perf_counter()
    forward, backward = entry.build()
    report = validate(
        forward, backward, convention=entry.convention, dtypes=entry.dtypes, name=entry.title,
        eps_default=entry.eps_default,
        normalized_dims="last" if entry.normalized_dims == "last" else None,
    )
    result = ZooResult(entry.name, entry.title, entry.package, package_version(entry.package),
                       entry.source, entry.convention, dict(entry.expected), notes=entry.notes)
    for dname in entry.dtypes:
        result.verdicts[dname], result.codes[dname], result.failed_checks[dname] = _verdict(
            report, dname)
    result.backward = _backward_verdict(report, backward)
    result.not_applicable = sorted({f"{c.probe}: {c.not_applicable}" for c in report.cases
                                    if c.status == "n/a"})
    result.report_notes = list(report.notes)
    result.eps_default = _eps_default(forward, entry)
    result.out_dtype = _out_dtypes(forward)
    result.float64 = _float64_behaviour(forward, entry.convention)
    if identify:
        result.identified = _identified(forward)
    result.seconds = round(time.perf_counter() - t0, 2)
    return result, report


def unavailable(entry: ZooEntry, reason: str) -> ZooResult:
    """The record of an entry that could not run here (shown in the docs page with the reason)."""
    return ZooResult(entry.name, entry.title, entry.package, package_version(entry.package),
                     entry.source, entry.convention, dict(entry.expected), notes=entry.notes,
                     unavailable=reason)


def _verdict(report, dname: str) -> tuple[str, list[str], list[str]]:
    """"pass" or "fail" for one dtype, the diagnosis codes seen there (strongest first), and
    which checks failed."""
    failed = [c for c in report.cases if c.dtype == dname and not c.ok]
    if not failed:
        return "pass", [], []
    seen = {code for c in failed for code in getattr(c, "diagnoses", [])}
    order = [d.code for d in report.diagnoses]
    if not seen:       # a diagnosis that names where it was seen rather than marking the cases
        seen = {d.code for d in report.diagnoses
                if dname in f"{getattr(d, 'seen_in', '')} {getattr(d, 'evidence', '')}"}
    codes = [code for code in order if code in seen] + sorted(seen - set(order))
    return "fail", codes, sorted({f"{c.probe}/{c.quantity}" for c in failed})


def _backward_verdict(report, backward) -> str:
    if backward is None:
        return "no backward"
    grads = [c for c in report.cases if c.quantity in ("dx", "dweight") or c.probe == "gradcheck"]
    bad = sorted({c.dtype for c in grads if not c.ok})
    if not grads:
        return "not run"
    return "pass" if not bad else "fail in " + ", ".join(bad)


def _eps_default(forward, entry: ZooEntry) -> str:
    from rmsref import conventions
    from rmsref._declared import declared_by

    declared = declared_by(forward)
    if entry.eps_default is not None:
        return f"{entry.eps_default:g} (stated by the entry)"
    if declared.eps_default is not None:
        return f"{declared.eps_default:g} (read from the module)"
    return f"{conventions.get(entry.convention).eps_default} (the convention's)"


def _dtype_name(a) -> str:
    return np.asarray(a).dtype.name


def _out_dtypes(forward) -> str:
    """Output dtype for bfloat16 input with a bfloat16 and with a float32 weight."""
    from rmsref._declared import declared_by
    from rmsref._shapes import bfloat16

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32).astype(bfloat16)
    if not declared_by(forward).has_weight:
        return _try_dtype(forward, x, None)
    parts = []
    for wdt in (bfloat16, np.dtype(np.float32)):
        w = (1.0 + 0.1 * rng.standard_normal(64)).astype(np.float32).astype(wdt)
        parts.append(f"{_try_dtype(forward, x, w)} (w {np.dtype(wdt).name})")
    return ", ".join(parts)


def _try_dtype(forward, x, w) -> str:
    try:
        return _dtype_name(forward(x, x.shape[-1], w, 1e-5))
    except Exception as exc:  # a dtype pairing the implementation refuses
        return f"refused ({type(exc).__name__})"


def _float64_behaviour(forward, convention: str) -> str:
    """What the implementation computes for float64 input: its output dtype and how close to
    the float64 oracle of its convention (a float32 pipeline is ~1e-7 relative off, a float64
    one ~1e-16)."""
    from rmsref import conventions
    from rmsref._declared import declared_by
    from rmsref.rmsnorm import rms_norm_forward

    rng = np.random.default_rng(1)
    x = 2.0 * rng.standard_normal((8, 256))
    w = 1.0 + 0.3 * rng.standard_normal(256) if declared_by(forward).has_weight else None
    try:
        y = np.asarray(forward(x, 256, w, 1e-5))
    except Exception as exc:  # refusing float64 is an answer too
        return f"refused ({type(exc).__name__}: {str(exc)[:60]})"
    offset = conventions.get(convention).default_offset
    ref, _ = rms_norm_forward(x, 256, w, 1e-5, offset=offset, out_dtype=np.float64)
    with np.errstate(all="ignore"):
        rel = float(np.max(np.abs(y.astype(np.float64) - ref) / np.abs(ref)))
    if not math.isfinite(rel):
        return f"{y.dtype.name} output, non-finite"
    if rel >= 1e-5:
        return f"{y.dtype.name} output, not RMSNorm's value (max rel err {rel:.1e})"
    precision = "float64" if rel < 1e-12 else "float32"
    return f"{y.dtype.name} output, computed in {precision} (max rel err {rel:.1e})"


def _identified(forward) -> list[dict[str, Any]]:
    from rmsref.conventions import identify

    try:
        ranking = identify(forward)
    except Exception as exc:  # identification is a measurement; its failure is recorded
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    return [{"name": m.name, "rate": m.rate, "rates": dict(m.rates)} for m in ranking[:3]]


def write_result(result: ZooResult, directory: str | Path) -> Path:
    """Write ``result`` as ``directory/<name>.json`` (the docs page is generated from these)."""
    path = Path(directory) / f"{result.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.to_json() + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.registry", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--results", help="write <name>.json per entry into this directory")
    parser.add_argument("names", nargs="*", help="entry names (default: all)")
    args = parser.parse_args(argv)
    for entry in discover():
        if isinstance(entry, Broken):
            print(f"{entry.module}: cannot import ({entry.error})")
            continue
        if args.names and entry.name not in args.names:
            continue
        try:
            result, _ = run(entry)
        except ZooUnavailable as exc:
            result = unavailable(entry, str(exc))
        if args.results:
            write_result(result, args.results)
        shown = result.unavailable or ", ".join(
            f"{d} {v}{'(' + ','.join(result.codes[d]) + ')' if result.codes[d] else ''}"
            for d, v in result.verdicts.items())
        print(f"{entry.name:<28} {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
