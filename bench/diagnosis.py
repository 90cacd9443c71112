"""How often does the diagnosis name the right cause, and how long does it take?

    python bench/diagnosis.py                 # table -> bench/results/diagnosis.md
    python bench/diagnosis.py --no-write      # print only

Runs every planted bug of the test suite (``tests/planted_bugs.py``: torch and NumPy code with the
mistakes real code has, and the NumPy float32 pipeline of ``tests/test_validate.py`` with its
switchable bugs) through :func:`rmsref.validate`, and prints the confusion table: the true cause
(the bug's planted code) against the code the report names first, with the other codes it
reports and the time the diagnosis alone took (the validation's own calls are timed apart).
Correct implementations (every convention's emulation, and torch's ``F.rms_norm`` when torch is
installed) are run too: their row must say "none".
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rmsref  # noqa: E402
from rmsref import diagnosis  # noqa: E402
from tests.planted_bugs import PLANTED  # noqa: E402
from tests.test_validate import PLANTED as PIPELINE  # noqa: E402
from tests.test_validate import make_impl  # noqa: E402


def _timed_validate(fwd, bwd, **kwargs):
    """validate() with the time spent in diagnosis.diagnose measured apart."""
    spent = [0.0]
    real = diagnosis.diagnose

    def timed(observations):
        t = time.perf_counter()
        try:
            return real(observations)
        finally:
            spent[0] += time.perf_counter() - t

    diagnosis.diagnose = timed
    try:
        t = time.perf_counter()
        rep = rmsref.validate(fwd, bwd, **kwargs)
        total = time.perf_counter() - t
    finally:
        diagnosis.diagnose = real
    return rep, total, spent[0]


def _cases():
    for p in PLANTED:
        if p.name.startswith("torch"):
            try:
                import torch  # noqa: F401
            except ImportError:
                print(f"skip {p.name}: torch not installed", file=sys.stderr)
                continue
        fwd, bwd = p.build()
        yield p.name, p.code, fwd, bwd, dict(convention=p.convention, dtypes=p.dtypes,
                                             probes=p.probes, repeat=False)
    for bug, convention, code in PIPELINE:
        fwd, bwd = make_impl(bug, offset=1.0 if convention == "gemma" else 0.0)
        yield f"numpy_pipeline_{bug}", code, fwd, bwd, dict(convention=convention)
    for name in rmsref.conventions.names():
        if name == "paper":
            continue

        def emulated(x, shape, w=None, eps=None, name=name):
            return rmsref.conventions.emulate(name, x, w, eps, normalized_shape=shape)

        # 'native' squares in the input dtype: in float16, x² overflows on the huge probe, a
        # real failure of the convention itself, whose cause is the 16-bit statistic
        truth = "low_precision_accumulation" if name == "native" else "none"
        yield f"correct_{name}", truth, emulated, None, dict(convention=name, repeat=False)
    try:
        import torch

        from rmsref.adapters.torch import wrap

        fwd, bwd = wrap(torch.nn.functional.rms_norm)
        yield "correct_F.rms_norm", "none", fwd, bwd, dict(repeat=False)
    except ImportError:
        print("skip correct_F.rms_norm: torch not installed", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    rows = []
    for name, code, fwd, bwd, kw in _cases():
        rep, total, diag_t = _timed_validate(fwd, bwd, **kw)
        codes = [d.code for d in rep.diagnoses]
        top = codes[0] if codes else "none"
        verdict = "PASS" if rep else "FAIL"
        rows.append((name, code, top, ", ".join(codes[1:]) or "", verdict, total, diag_t))
        print(f"{name:40s} true={code:28s} top={top:28s} {verdict} {diag_t:5.2f}s",
              file=sys.stderr, flush=True)
    right = sum(1 for r in rows if r[1] == r[2])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# Diagnosis: true cause against the code named first",
        "",
        f"`python bench/diagnosis.py` on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {load:.1f} at the end.",
        "",
        f"**{right} of {len(rows)}** implementations get their true cause first "
        "(\"none\": a correct implementation, no diagnosis).",
        "",
        "| implementation | true cause | named first | also named | verdict | validate (s) "
        "| diagnosis (s) |",
        "|---|---|---|---|---|---:|---:|",
    ]
    for name, code, top, also, verdict, total, diag_t in rows:
        mark = "" if code == top else " **(wrong)**"
        lines.append(f"| {name} | `{code}` | `{top}`{mark} | {also} | {verdict} | {total:.2f} "
                     f"| {diag_t:.2f} |")
    worst = max(r[6] for r in rows)
    lines += ["", f"Longest diagnosis: {worst:.2f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        out = ROOT / "bench" / "results" / "diagnosis.md"
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0 if right == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
