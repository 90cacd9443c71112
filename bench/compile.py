"""First calls of the default Numba CPU kernels: cold (compiling) and warm (from the cache).

    python bench/compile.py                    # the table -> bench/results/compile.md
    python bench/compile.py --dtypes float32 --no-check
    python bench/compile.py --profile float32  # where one cold first call spends its time

Every measurement runs in a fresh Python subprocess, so nothing compiled in this process helps.
"Cold" gives the subprocess a fresh, empty ``NUMBA_CACHE_DIR`` (a temporary directory), so every
kernel and every helper it calls is compiled; "warm" runs the same call again in a new subprocess
with that now-filled cache directory, which is what a user's second session pays. The first call
is timed on its own (``import rmsref.kernels.numba_cpu`` is done and timed before it); a second
call in the same process shows the run time of the small input, so the first call minus it is the
compile (or cache load).

Kernels, as ``rmsref.backend("numba_cpu")`` runs them by default:
    fwd           rms_norm_forward                      (forward v5: the pipelined kernel)
    bwd+rstd      rms_norm_backward with a saved rstd   (backward v6: the pipelined kernel)
    bwd           rms_norm_backward without one         (backward v6: rstd by ``_rms_rstd``,
                                                         then the pipelined kernel)
The saved rstd for "bwd+rstd" comes from the NumPy oracle, so the forward is not compiled there.

``--profile DTYPE`` runs each cold first call once more with Numba's compile events recorded
(``numba.core.event``): the time of each compiled function (its own, without the functions it
compiles while being typed), how many specialisations each dispatcher holds afterwards, and the
time spent holding LLVM's lock (optimisation and machine-code generation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KERNELS = ("fwd", "bwd+rstd", "bwd")
DTYPES = ("float32", "bfloat16", "float16", "float64")
SHAPE = (64, 1024)


# ---------------------------------------------------------------------------- child side
def _inputs(dtype_name: str):
    import numpy as np

    import rmsref
    from rmsref._shapes import FLOAT_DTYPES

    dtype = FLOAT_DTYPES[dtype_name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(dtype)
    dy = rng.standard_normal(SHAPE).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(SHAPE[-1])).astype(dtype)
    stat = np.float32 if dtype.itemsize == 2 else np.float64
    _, rstd = rmsref.rms_norm_forward(x, SHAPE[-1], w)  # the oracle: nothing compiled
    return x, dy, w, np.asarray(rstd, dtype=stat)


def _call(kernel: str, mod, x, dy, w, rstd) -> None:
    if kernel == "fwd":
        mod.rms_norm_forward(x, SHAPE[-1], w)
    elif kernel == "bwd+rstd":
        mod.rms_norm_backward(dy, x, SHAPE[-1], w, rstd=rstd)
    else:
        mod.rms_norm_backward(dy, x, SHAPE[-1], w)


def _child(kernel: str, dtype_name: str, profile: bool) -> dict:
    t0 = time.perf_counter()
    import numba

    from rmsref.kernels import numba_cpu as mod

    t_import = time.perf_counter() - t0
    args = _inputs(dtype_name)
    result: dict = {"import_s": t_import}
    if profile:
        from numba.core import event

        with event.install_recorder("numba:compile") as rec, \
                event.install_recorder("numba:llvm_lock") as llvm:
            t0 = time.perf_counter()
            _call(kernel, mod, *args)
            result["first_s"] = time.perf_counter() - t0
        result["compiles"] = _own_times(rec.buffer)
        result["llvm_lock_s"] = _total(llvm.buffer)
        result["signatures"] = {
            name: len(obj.signatures) for name, obj in _dispatchers(mod).items() if obj.signatures
        }
    else:
        t0 = time.perf_counter()
        _call(kernel, mod, *args)
        result["first_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _call(kernel, mod, *args)
    result["second_s"] = time.perf_counter() - t0
    result["threads"] = numba.get_num_threads()
    return result


def _dispatchers(mod) -> dict:
    from numba.core.registry import CPUDispatcher

    from rmsref.kernels import _halfbits

    found = {}
    for m in (mod, _halfbits):
        for name, obj in vars(m).items():
            if isinstance(obj, CPUDispatcher):
                found[f"{m.__name__.rsplit('.', 1)[-1]}.{name}"] = obj
    return found


def _own_times(buffer: list) -> list[tuple[str, float]]:
    """(function, seconds) per compile event, without the time of compiles nested inside it."""
    stack: list[list] = []  # [name, start, nested seconds]
    own: dict[str, float] = {}
    for t, ev in buffer:
        if ev.is_start:
            stack.append([ev.data["dispatcher"].py_func.__qualname__, t, 0.0])
        else:
            name, start, nested = stack.pop()
            own[name] = own.get(name, 0.0) + (t - start - nested)
            if stack:
                stack[-1][2] += t - start
    return sorted(own.items(), key=lambda kv: -kv[1])


def _total(buffer: list) -> float:
    starts, total = [], 0.0
    for t, ev in buffer:
        if ev.is_start:
            starts.append(t)
        else:
            total += t - starts.pop()
    return total


# ---------------------------------------------------------------------------- parent side
def _env(cache_dir: str) -> dict:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run_child(kernel: str, dtype_name: str, cache_dir: str, profile: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", kernel, dtype_name]
    cmd += ["--prof"] if profile else []
    proc = subprocess.run(cmd, env=_env(cache_dir), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kernel} {dtype_name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _timed_cli(args: list[str], cache_dir: str) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "rmsref.cli", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(cache_dir), capture_output=True, text=True, check=False)
    return time.perf_counter() - t0, proc.returncode


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def _table(dtypes: list[str]) -> list[str]:
    lines = [
        "| kernel | dtype | cold first call (s) | warm first call (s) | second call (s) "
        "| import (s) |",
        "|---|---|---|---|---|---|",
    ]
    for dtype_name in dtypes:
        for kernel in KERNELS:
            with tempfile.TemporaryDirectory(prefix="rmsref-numba-") as cache:
                cold = _run_child(kernel, dtype_name, cache)
                warm = _run_child(kernel, dtype_name, cache)
            row = (f"| {kernel} | {dtype_name} | {cold['first_s']:.2f} | {warm['first_s']:.3f} "
                   f"| {warm['second_s']:.4f} | {warm['import_s']:.2f} |")
            print(row, flush=True)
            lines.append(row)
    return lines


def _check_lines() -> list[str]:
    lines = ["", "| command | cold (s) | warm (s) | exit status |", "|---|---|---|---|"]
    for args in (["check", "--quick"], ["check"]):
        with tempfile.TemporaryDirectory(prefix="rmsref-numba-") as cache:
            cold, rc = _timed_cli(args, cache)
            warm, rc2 = _timed_cli(args, cache)
        row = f"| rmsref {' '.join(args)} | {cold:.1f} | {warm:.1f} | {rc}, {rc2} |"
        print(row, flush=True)
        lines.append(row)
    return lines


def _profile(dtype_name: str, top: int) -> list[str]:
    lines = [f"### Profile of the cold first calls, {dtype_name}", ""]
    for kernel in KERNELS:
        with tempfile.TemporaryDirectory(prefix="rmsref-numba-") as cache:
            r = _run_child(kernel, dtype_name, cache, profile=True)
        own = r["compiles"]
        lines.append(f"{kernel}: first call {r['first_s']:.2f} s, of which "
                     f"{r['llvm_lock_s']:.2f} s holding LLVM's lock; {len(own)} functions compiled")
        lines += [f"    {t:6.2f} s  {name}" for name, t in own[:top]]
        sigs = ", ".join(f"{k.split('.', 1)[1]}: {v}" for k, v in sorted(r["signatures"].items()))
        lines += [f"    specialisations afterwards: {sigs}", ""]
    print("\n".join(lines), flush=True)
    return lines


NOTES = "## Where the compile time goes"


def _kept_notes(path: Path) -> str:
    """The hand-written notes of an earlier output (from ``NOTES`` on), kept across reruns."""
    if not path.exists():
        return ""
    text = path.read_text()
    at = text.find(NOTES)
    return "" if at < 0 else "\n" + text[at:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--no-check", action="store_true", help="skip the cold `rmsref check` runs")
    p.add_argument("--profile", metavar="DTYPE", help="only profile the cold calls of DTYPE")
    p.add_argument("--top", type=int, default=8, help="functions listed per profile")
    p.add_argument("--output", type=Path, default=RESULTS / "compile.md")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--prof", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], args.prof)))
        return 0
    if args.profile:
        _profile(args.profile, args.top)
        return 0
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    head = [
        "# First-call (compile) times of the default Numba CPU kernels",
        "",
        f"`python bench/compile.py` on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; input {SHAPE[0]}x{SHAPE[1]}, one fresh subprocess "
        "per cell; cold = empty NUMBA_CACHE_DIR, warm = the same call again with the filled one.",
        f"Load average at start: {_load()}",
        "",
    ]
    lines = head + _table(dtypes)
    if not args.no_check:
        lines += _check_lines()
    lines += ["", f"Load average at end: {_load()}", ""]
    args.output.write_text("\n".join(lines) + _kept_notes(args.output))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
