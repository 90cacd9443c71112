"""Where a cold test run's time goes: every Numba compilation the tests cause, timed, with the
test that caused it.

    python bench/suite_compiles.py                            # the default run (about 6 min)
    python bench/suite_compiles.py tests/test_numba_cpu.py -k add --top 10

Runs pytest in one process (``-n 0``) with an empty ``NUMBA_CACHE_DIR``, so every kernel
specialisation the tests reach is compiled, and records Numba's compile events
(``numba.core.event``): for each compiled function, the seconds of its outermost compilation
(the helpers it compiles while being typed count in it) and the test running at the time.
Prints the seconds per dispatcher, then the costliest specialisations with the argument types
that made each one and the test that compiled it first.

Most of a cold default run is this compilation, and each distinct tuple of argument types is a
specialisation of its own: a dtype, a layout (``'C'`` or ``'A'``), or a None in place of an array
(a route chosen by type). Marking a test slow saves nothing when another test compiles the same
specialisation; the table says which tests would have to change together, and which kernels
cost the most to compile per specialisation. Extra arguments go to pytest.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- the pytest plugin
# Loaded into the pytest process by ``-p suite_compiles`` (this file's folder on PYTHONPATH).
_RECORDS: list[dict] = []
_STARTS: list[float] = []
_TEST = {"id": None}


def pytest_configure(config) -> None:
    if not os.environ.get("RMSREF_COMPILES_OUT"):
        return
    from numba.core import event

    class _Timer(event.Listener):
        def on_start(self, ev) -> None:
            _STARTS.append(time.perf_counter())

        def on_end(self, ev) -> None:
            seconds = time.perf_counter() - _STARTS.pop()
            if _STARTS:  # compiled while an outer function was typed: counted in that one
                return
            data = ev.data or {}
            func = getattr(data.get("dispatcher"), "py_func", None)
            _RECORDS.append({"name": getattr(func, "__qualname__", "?"),
                             "args": str(data.get("args")), "seconds": seconds,
                             "test": _TEST["id"]})

    event.register("numba:compile", _Timer())


def pytest_runtest_logstart(nodeid, location) -> None:
    _TEST["id"] = nodeid


def pytest_sessionfinish(session) -> None:
    out = os.environ.get("RMSREF_COMPILES_OUT")
    if out:
        Path(out).write_text(json.dumps(_RECORDS), encoding="utf-8")


# ---------------------------------------------------------------------------- the report
def short_types(args: str) -> str:
    """Numba's argument types, shortened: ``Array(int16, 3, 'C', False, aligned=True)`` ->
    ``int16[3C]`` (int16 is bfloat16's bits, uint16 float16's)."""
    args = re.sub(r"[Aa]rray\((\w+), (\d), '(\w)', (True|False), aligned=True\)",
                  lambda m: ("ro " if m[4] == "True" else "") + f"{m[1]}[{m[2]}{m[3]}]", args)
    return args


def report(records: list[dict], top: int) -> str:
    """Markdown: seconds per dispatcher, then the ``top`` costliest specialisations."""
    total = sum(r["seconds"] for r in records)
    per = collections.defaultdict(lambda: [0, 0.0])
    for r in records:
        per[r["name"]][0] += 1
        per[r["name"]][1] += r["seconds"]
    lines = [f"{len(records)} compilations, {total:.1f} s in all", "",
             "| function | specialisations | seconds |", "|---|---:|---:|"]
    for name, (count, seconds) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        if seconds >= 0.1:  # the test files' own small jitted helpers left out
            lines.append(f"| `{name}` | {count} | {seconds:.1f} |")
    lines += ["", f"The {top} costliest specialisations:", "",
              "| seconds | function | argument types | first compiled by |", "|---:|---|---|---|"]
    for r in sorted(records, key=lambda r: -r["seconds"])[:top]:
        test = (r["test"] or "(collection)").split("::", 1)[-1]
        lines.append(f"| {r['seconds']:.1f} | `{r['name']}` | {short_types(r['args'])} | {test} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25, help="specialisations listed (25)")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmsref-compiles-") as tmp:
        out = Path(tmp) / "compiles.json"
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "numba-cache"),
                   RMSREF_COMPILES_OUT=str(out),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                            os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
               "-p", "suite_compiles", *pytest_args]
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=env)
        wall = time.perf_counter() - started
        if not out.exists():
            print(f"suite_compiles.py: pytest wrote no records (exit status {done.returncode})",
                  file=sys.stderr)
            return 2
        records = json.loads(out.read_text(encoding="utf-8"))
    print(f"\npytest: exit status {done.returncode}, {wall:.0f} s wall in one process\n")
    print(report(records, args.top))
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
