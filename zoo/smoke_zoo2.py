"""Smoke check of the non-torch zoo entries: build each, run one forward, print its validate table.

    PYTHONPATH=. python zoo/smoke_zoo2.py [entry-name ...]

For each entry: the package version, a forward on a small float32 case compared with the float64
oracle, then ``rmsref.validate`` with the entry's convention and dtypes, printing its summary, its
FAIL rows and its diagnoses. A second run with ``eps=`` the entry's declared default shows which
failures an explicit eps removes (it prints only new FAIL rows, and lists those that went: the
default-eps rows that declaring ``eps_default=`` should turn into passes). Entries that cannot run
here print their ZooUnavailable reason.

Environment, set here before any of the packages is imported: ``KERAS_BACKEND=jax`` (the keras
entries) and ``TRITON_INTERPRET=1`` (liger's Triton kernels under the CPU interpreter).
"""

from __future__ import annotations

import os
import sys
import time
from importlib import metadata
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import rmsref  # noqa: E402
from zoo.entries import (  # noqa: E402
    flax_entries,
    keras_entries,
    liger_entry,
    llama2c,
    tinygrad_entry,
)
from zoo.entry import ZooEntry, ZooUnavailable  # noqa: E402

MODULES = (flax_entries, keras_entries, tinygrad_entry, liger_entry, llama2c)


def _version(package: str) -> str:
    if not package:
        return "(compiled here)"
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _failed_rows(report) -> list[str]:
    return [line for line in report.table().splitlines()
            if line.split() and line.split()[-1] == "FAIL"]


def _summary(report) -> str:
    return next(line for line in report.table().splitlines()
                if line.startswith(("PASS", "FAIL")))


def smoke(entry: ZooEntry) -> None:
    print(f"== {entry.name}: {entry.title} [{entry.package or 'no package'} "
          f"{_version(entry.package)}]")
    print(f"   convention {entry.convention}, eps_default {entry.eps_default}, "
          f"normalized_dims {entry.normalized_dims}, expected {entry.expected}")
    try:
        forward, backward = entry.build()
    except ZooUnavailable as exc:
        print(f"   UNAVAILABLE: {exc}")
        return
    x = (2.0 * np.random.default_rng(0).standard_normal((4, 64))).astype(np.float32)
    w = np.linspace(0.5, 1.5, 64).astype(np.float32)
    eps = entry.eps_default if entry.eps_default is not None else 1e-5
    y = np.asarray(forward(x, 64, w, eps))
    ref = rmsref.rms_norm(x.astype(np.float64), 64, w.astype(np.float64), eps)
    print(f"   one forward: max |y - oracle| = {np.max(np.abs(y - ref)):.3g} (float32, eps={eps})")
    runs = [("as declared", {})]
    if entry.eps_default is not None:
        runs.append((f"eps={entry.eps_default}", {"eps": entry.eps_default}))
    before: list[str] = []
    for label, kwargs in runs:
        t0 = time.perf_counter()
        report = rmsref.validate(forward, backward, convention=entry.convention,
                                 dtypes=entry.dtypes, name=entry.name, **kwargs)
        seconds = time.perf_counter() - t0
        rows = _failed_rows(report)
        print(f"   validate ({label}, {seconds:.1f} s): {_summary(report)}")
        for line in rows:
            key = tuple(line.split()[:2])                 # (probe, dtype)
            if key not in {tuple(b.split()[:2]) for b in before}:
                print("     " + line)
        if before:
            gone = sorted({tuple(b.split()[:2]) for b in before}
                          - {tuple(r.split()[:2]) for r in rows})
            print(f"     no longer failing: {', '.join('/'.join(k) for k in gone) or 'none'}")
        before = rows
        for d in report.diagnoses:
            print(f"     diagnosis: {d}")


def main(names: list[str]) -> int:
    entries = [e for m in MODULES for e in m.ENTRIES]
    unknown = set(names) - {e.name for e in entries}
    if unknown:
        print(f"unknown entries {sorted(unknown)}; known: {[e.name for e in entries]}")
        return 2
    for entry in entries:
        if not names or entry.name in names:
            smoke(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
