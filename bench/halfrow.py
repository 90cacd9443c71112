"""Where a half-precision row spends its time: the row helpers of the default Numba CPU kernels,
timed on one thread with the data in cache, per element.

    python bench/halfrow.py                 # bfloat16, float16, float32 at N = 4096
    python bench/halfrow.py --n 8192 --rounds 21
    python bench/halfrow.py --against HEAD~1 --dtypes bfloat16   # two trees in one process

A kernel is near the copy's speed when its compute per element hides under the memory traffic;
this script takes the memory out (two rows of x and dy, a weight row and an output row, reused
``--reps`` times) so that what is left is the arithmetic and the conversions:

- sumsq: Σx² of a row in the 64 lanes (``_sumsq_v3``): the decode alone, plus a multiply-add.
- encode exact: y_j = round(x_j·rstd·w_j) written with ``from_f64`` (exact for any value: the
  float16 write, and the bfloat16 rows that the fast route hands back).
- fwd row: the forward's pipelined row (``_write_and_sumsq``): write row r, sum row r + 1, in
  the working precision (float32 for half types: ``_halfbits.to_work``), on the route the
  library takes (for bfloat16 on a CPU with AVX512-BF16, the lanes route:
  ``numba_cpu._weight_floor``).
- write row: the forward's unpipelined write (``_rms_write``), which half rows take.
- bwd row: the backward's pipelined row on the route the library takes for the dtype
  (``_bwd_row_and_dot``; for a half type with a weight of its format, the float32 dx of
  ``_bwd_row_and_dot_f32``: ``numba_cpu._f32_weight``), all its results used (its flags
  included).
- add fwd row, add bwd row: the fused residual add's pipelined rows (``_add_write_and_sumsq``,
  ``_add_dh_and_dot``; h = x + r in float64, no dresidual_out; outputs rounded by the CPU
  where the library does it): two inputs and two outputs per element where RMSNorm has one
  of each.
- fwd kernel, bwd kernel: the whole default forward (``_rms_fwd_pipelined``) and backward
  with a saved rstd (``_rms_bwd_pipelined``) on a batch of rows that stays in cache (``in_cache``),
  per-row work included; ``bench/cpu.py`` sets these against the copy's time per element.

Each helper is compiled as the kernels compile it (``_wide_vectors_for``: 512-bit vectors for
half rows). Times are the minimum over interleaved rounds (the machine may be shared), in ns
per element.

``--against REV`` times commit REV's helpers beside this tree's, in the same process and the
same interleaved rounds (REV's ``rmsref`` exported from git into a temporary folder and
imported as ``rmsref_rev``), and prints their ratio. Use it to judge a change: separate runs
of this script on a shared machine differed by up to 40 % for the same code (AMD EPYC, 2
cores, 2026-12-07), where one run's interleaved rounds agree within a few per cent.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

import rmsref
from rmsref.kernels import _halfbits as H
from rmsref.kernels import numba_cpu as K

ROOT = Path(__file__).resolve().parents[1]

#: (column suffix, the tree's numba_cpu, its _halfbits): this tree's, then --against's
Tree = tuple[str, ModuleType, ModuleType]
HERE: Tree = ("", K, H)


def tree_at(rev: str, folder: Path | None = None) -> Tree:
    """Commit ``rev``'s rmsref, exported by git into ``folder`` (a new temporary one by
    default, put on ``sys.path``) as package ``rmsref_rev`` (its imports of rmsref rewritten),
    so both trees' kernels compile and run in this process."""
    folder = folder or Path(tempfile.mkdtemp(prefix="halfrow-"))
    git = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "rmsref"], capture_output=True)
    if git.returncode != 0:
        raise SystemExit(f"halfrow.py: --against {rev!r}: git archive failed: "
                         f"{git.stderr.decode(errors='replace').strip()}")
    archive = git.stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    (folder / "rmsref").rename(folder / "rmsref_rev")
    for path in (folder / "rmsref_rev").rglob("*.py"):
        text = re.sub(r"\brmsref(?=[. ])", "rmsref_rev", path.read_text())
        path.write_text(text)
    sys.path.insert(0, str(folder))
    return (f" {rev}", importlib.import_module("rmsref_rev.kernels.numba_cpu"),
            importlib.import_module("rmsref_rev.kernels._halfbits"))


def _kernels(K: ModuleType = K, H: ModuleType = H):
    """The row helpers of one tree (``K``, ``H``: its numba_cpu and _halfbits), each called
    ``reps`` times from compiled code."""
    from numba import njit

    opts = {"nogil": True, "error_model": "numpy"}

    @njit(**opts)
    def sumsq(x3, reps):
        K._wide_vectors_for(x3)  # as the kernels: 512-bit vectors for half rows
        t = 0.0
        for _ in range(reps):
            t += K._sumsq_v3(x3, 0, 1, x3.shape[2])
        return t

    @njit(**opts)
    def encode_exact(x3, w, y3, reps):
        K._wide_vectors_for(x3)  # as the kernels: 512-bit vectors for half rows
        for rep in range(reps):
            rstd = 1.0 + rep * 1e-9
            for j in range(x3.shape[2]):
                y3[0, 0, j] = H.from_f64(H.to_f64(x3[0, 0, j]) * rstd * w[j], y3)

    @njit(**opts)
    def fwd_row(x3, w, y3, w_floor, reps):
        K._wide_vectors_for(x3)  # as the kernels: 512-bit vectors for half rows
        t = 0.0
        ww = H.work_row(w, x3, y3)
        for rep in range(reps):
            rstd_w = H.as_work(1.0 + rep * 1e-9, x3, y3)
            ss, outside = K._write_and_sumsq(x3, 0, 0, ww, y3, rstd_w, 0, 1, False, w_floor)
            t += ss + outside  # both results used: an unused flag's tests would be left out
        return t

    @njit(**opts)
    def write_row(x3, w, y3, reps):
        K._wide_vectors_for(x3)  # as the kernels: 512-bit vectors for half rows
        ww = H.work_row(w, x3, y3)
        for rep in range(reps):
            K._rms_write(x3, 0, 0, w, ww, w, False, y3, 1.0 + rep * 1e-9, 0)

    @njit(**opts)
    def bwd_row(g3, x3, w, w32, dx3, parts, f64_route, tail, hw, reps):
        K._wide_vectors_for(g3)  # as the kernels: 512-bit vectors for half rows
        t = 0.0
        for rep in range(reps):
            if f64_route is not None:  # the route, as the kernel chooses it (when compiled)
                t += K._bwd_row_and_dot(g3, x3, 0, 0, w, 1.0 + rep * 1e-9, 0.01, dx3, parts,
                                        0, 0, 1)[0]
            if w32 is not None:
                s, outside, lost = K._bwd_row_and_dot_f32(g3, x3, 0, 0, w, w32, 1.0 + rep * 1e-9,
                                                          0.01, dx3, parts, 0, 0, 1, tail, hw)
                t += s + outside + lost  # every result used: an unused flag's work is left out
        return t

    @njit(**opts)
    def add_fwd_row(x3, r3, w, ww, y3, res3, hw, reps):
        K._wide_vectors_for(x3)  # as the kernels: 512-bit vectors for half rows
        t = 0.0
        for rep in range(reps):
            s, outside, y_flushed, res_flushed = K._add_write_and_sumsq(
                x3, r3, None, 0, 0, w, ww, y3, 1.0 + rep * 1e-9, res3, 0, 1, hw)
            t += s + outside + y_flushed + res_flushed  # every result used
        return t

    @njit(**opts)
    def add_bwd_row(g3, x3, r3, w, dx3, dr3, parts, hw, reps):
        K._wide_vectors_for(g3)  # as the kernels: 512-bit vectors for half rows
        t = 0.0
        for rep in range(reps):
            s, outside = K._add_dh_and_dot(g3, g3, False, x3, r3, None, 0, 0, w,
                                           1.0 + rep * 1e-9, 0.01, dx3, dr3, parts, 0, 0, 1, hw)
            t += s + outside  # every result used
        return t

    return sumsq, encode_exact, fwd_row, write_row, bwd_row, add_fwd_row, add_bwd_row


def _kernel_loops(K: ModuleType = K):
    """The default RMSNorm kernels themselves, called ``reps`` times from compiled code (no
    Python call in the timing): the forward (``_rms_fwd_pipelined``) and the backward with a saved
    rstd (``_rms_bwd_pipelined``), each on every row of its arrays, on one thread."""
    from numba import njit

    opts = {"nogil": True, "error_model": "numpy"}

    @njit(**opts)
    def fwd(x3, w, y3, rstd_out, redo, w_floor, reps):
        blocks = -(-x3.shape[1] // K.ROWS_PER_BLOCK)
        for _ in range(reps):
            K._rms_fwd_pipelined(x3, w, 1e-6, y3, rstd_out, redo, w_floor, 0, blocks)

    @njit(**opts)
    def bwd(g3, x3, w, w32, f64_route, tail, hw, rstd, dx3, parts, redo, redo_dw, reps):
        for _ in range(reps):
            K._rms_bwd_pipelined(g3, x3, w, w32, f64_route, tail, hw, rstd, dx3, parts, redo,
                                 redo_dw, 0, parts.shape[0])

    return fwd, bwd


#: Bytes of the arrays a kernel works on in ``in_cache`` (x, dy, dx): well inside L2 (the
#: machines we run on have 1-2 MiB per core); at least a forward block of rows either way.
IN_CACHE_BYTES = 1 << 19


def _best(calls: dict, reps: int, rounds: int, elements: int) -> dict[str, dict[str, float]]:
    """ns per element of each call (keyed (tree suffix, name); ``reps`` calls' worth of
    ``elements``), the minimum over ``rounds`` rounds that take every call in turn, by tree
    suffix then name; each is called once first (compiling)."""
    for call in calls.values():
        call(1)
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call(reps)
            best[name] = min(best[name], (time.perf_counter() - t0) / (elements * reps) * 1e9)
    by_tree: dict[str, dict[str, float]] = {}
    for (suffix, name), ns in best.items():
        by_tree.setdefault(suffix, {})[name] = ns
    return by_tree


def in_cache(dtype: np.dtype, n: int, reps: int, rounds: int) -> dict[str, float]:
    """``in_cache_of`` this tree's kernels alone."""
    return in_cache_of(dtype, n, reps, rounds, [HERE])[""]


def in_cache_of(dtype: np.dtype, n: int, reps: int, rounds: int,
                trees: list[Tree]) -> dict[str, dict[str, float]]:
    """ns per element, one thread, of the whole default forward and backward kernels on a batch
    small enough to stay in cache: what each element costs in arithmetic, conversions and
    per-row work when memory costs nothing. ``bench/cpu.py`` sets it against the copy's time
    per element to tell which targets better overlap could meet and which need less
    arithmetic. For each of ``trees`` (by its suffix), timed in the same rounds."""
    rows = max(16, IN_CACHE_BYTES // (3 * n * np.dtype(dtype).itemsize))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, n)).astype(dtype)
    g = rng.standard_normal((rows, n)).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(dtype).astype(np.float64)  # as bench/cpu.py
    rstd = 1.0 / np.sqrt(np.mean(np.square(x.astype(np.float64)), axis=1) + 1e-6)
    calls = {}
    for suffix, kernels, _ in trees:
        fwd, bwd = _kernel_loops(kernels)
        x3, g3 = kernels._bits(x.reshape(1, rows, n)), kernels._bits(g.reshape(1, rows, n))
        out3 = np.empty_like(x3)
        w32 = kernels._f32_weight(g3, x3, out3, w)  # the library's dx route
        w_floor = kernels._weight_floor(w, x3, out3)  # the library's y route
        rstd_out = np.empty(rows, kernels._stat_dtype(np.dtype(dtype)))
        parts = np.empty((-(-rows // kernels.ROWS_PER_PART), n))
        redo = np.empty(rows, np.bool_)  # rows the kernel would have written again (none here)
        redo_dw = np.empty(parts.shape[0], np.bool_)  # parts whose dweight it would sum again
        route = kernels._bwd_route_types(x3, out3, w32)
        calls[suffix, "fwd kernel"] = lambda r, a=(fwd, x3, w, out3, rstd_out, redo, w_floor): (
            a[0](*a[1:], r))
        calls[suffix, "bwd kernel"] = lambda r, a=(bwd, g3, x3, w, w32, *route, rstd, out3,
                                                   parts, redo, redo_dw): a[0](*a[1:], r)
    return _best(calls, max(2, reps // rows), rounds, rows * n)  # about ``reps`` rows a timing


def measure(dtype: np.dtype, n: int, reps: int, rounds: int,
            trees: list[Tree]) -> dict[str, dict[str, float]]:
    """ns per element of each helper for ``dtype`` rows of length n (minimum over rounds), of
    each of ``trees`` (by its suffix), timed in the same rounds."""
    rng = np.random.default_rng(0)
    x, g, r = (rng.standard_normal((1, 2, n)).astype(dtype) for _ in range(3))
    w = rng.standard_normal(n).astype(dtype).astype(np.float64)  # a weight in x's dtype
    calls = {}
    for suffix, kernels, halfbits in trees:
        sumsq, encode_exact, fwd_row, write_row, bwd_row, add_fwd_row, add_bwd_row = (
            _kernels(kernels, halfbits))
        x3, g3, r3 = kernels._bits(x), kernels._bits(g), kernels._bits(r)
        y3, res3 = np.empty_like(x3), np.empty_like(x3)
        w32 = kernels._f32_weight(g3, x3, y3, w)  # the library's dx route
        w_floor = kernels._weight_floor(w, x3, y3)  # the library's y route
        ww = kernels._add_f32_weight(w, x3, r3, y3)
        hw = kernels._add_by_cpu(x3, r3, y3, res3)
        route = kernels._bwd_route_types(x3, y3, w32)
        parts = np.zeros((1, n))
        for name, f, a in [
            ("sumsq", sumsq, (x3,)),
            ("encode exact", encode_exact, (x3, w, y3)),
            ("fwd row", fwd_row, (x3, w, y3, w_floor)),
            ("write row", write_row, (x3, w, y3)),
            ("bwd row", bwd_row, (g3, x3, w, w32, y3, parts, *route)),
            ("add fwd row", add_fwd_row, (x3, r3, w, ww, y3, res3, hw)),
            ("add bwd row", add_bwd_row, (g3, x3, r3, w, y3, res3, parts, hw)),
        ]:
            calls[suffix, name] = lambda k, f=f, a=a: f(*a, k)
    return _best(calls, reps, rounds, n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--n", type=int, default=4096, help="row length (a multiple of 64)")
    p.add_argument("--reps", type=int, default=500, help="calls per timing")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (minimum)")
    p.add_argument("--against", metavar="REV", default=None,
                   help="also time commit REV's helpers, in the same rounds, and their ratio")
    args = p.parse_args()
    trees = [HERE] + ([tree_at(args.against)] if args.against else [])
    dtypes = {"bfloat16": rmsref.bfloat16, "float16": np.dtype(np.float16),
              "float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
    print(f"ns per element, one thread, in cache, N = {args.n}, min of {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}")
    rows = {}
    for name in args.dtypes.split(","):
        helpers = measure(dtypes[name], args.n, args.reps, args.rounds, trees)
        kernels = in_cache_of(dtypes[name], args.n, args.reps, args.rounds, trees)
        for suffix, _, _ in trees:  # one row per tree
            rows[name + suffix] = helpers[suffix] | kernels[suffix]
        if args.against:
            this, rev = rows[name], rows[name + trees[1][0]]
            rows[f"{name}: this / {args.against}"] = {c: this[c] / rev[c] for c in this}
    cols = list(next(iter(rows.values())))
    print("| dtype | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
