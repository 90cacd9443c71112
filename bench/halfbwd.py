"""The half-precision backward row taken apart: what each step costs, and what computing dx in
float32 would save, and cost in accuracy.

    python bench/halfbwd.py                  # bfloat16, float16, float32 at N = 4096
    python bench/halfbwd.py --dtypes bfloat16 --rounds 21 --rows 1024

The default backward's row (``numba_cpu._bwd_row_and_dot``) writes row r's dx and dweight terms
while summing row r + 1's Σ dxhat·x, all in float64; a half dx is rounded to float32 and then
to the half type. ``bench/halfrow.py`` times that row whole; here it is rebuilt from its steps,
and each variant leaves a step out or does it in float32, timed as ``halfrow`` times it (one
thread, two rows in cache, ns per element, the minimum over interleaved rounds). Half calls
whose weight allows it now take the compensated float32 dx below instead
(``numba_cpu._bwd_row_and_dot_f32``: for float16 the "+ dweight loop" row, bit for bit; for
bfloat16 that row with the scaling and the row bound described there); other calls keep the
float64 row.

- shipped: the kernel's float64 dx row (the route of calls whose weight does not allow the
  float32 one).
- shipped float32 dx: the kernel's float32 dx route (``_bwd_row_and_dot_f32``), which both
  half types take with a weight of their format.
- as rebuilt: every step, as the kernel writes it. It should read as "shipped" (and
  ``tests/test_bench_cpu.py`` checks that it gives the same bits), so that the other rows
  differ from the kernel only where they say.
- no next-row sum, no dweight terms, no overflow test: the row without that step.
- float32 dx: dx = rstd·(g·w − xhat·c) in float32 arithmetic (g, x exact in float32; rstd, c,
  w rounded to it), the next row's products in float32 too; the dweight terms still added to
  the float64 partial row.
- float32 dx, float32 dweight: the partial row in float32 as well.
- + cancellation test: that, and a flag where |dx| < 2^-p·(|g·w| + |xhat·c|), p the half
  type's precision: the elements whose float32 value could be more than an ulp of the half
  type off, for a kernel that would write such rows again in float64.
- compensated float32 dx: g·w − x·(rstd·c) by two float32 fused multiply-adds, rstd·c split
  into two float32 parts (``numba_cpu._split32``): g·w is exact in float32 for a half weight,
  and each FMA rounds once, so the difference keeps about 24 bits however much its terms
  cancel; then dx = rstd·that. The dweight term (g·x)·rstd in float64 (g·x is exact in
  float32 where it does not underflow); the next row's (g·w)·x in float64 from the float32 g·w.
- + dweight loop: float16's shipped float32 row. The dweight terms from the block's float32
  g·x kept in a 64-element buffer, in a float64 loop of their own (float64 work in the float32
  loop made LLVM use half-width vectors for all of it), and the next row's sum as the float64
  route sums it. The shipped bfloat16 row also scales the difference by a power of two near
  rstd (``numba_cpu._dx_scale``) and keeps the keys of the row's bound on g·x
  (``_gx_exact``), which this row leaves out.
- + float32 sum: that, with the next row's (g·w)·x in float32 (exact for bfloat16 where
  nothing underflows: 8 + 8 + 8 bits; not what the kernel does).

The float32 variants are timed on float32 rows too, for comparison only: a float32 dx is
computed in float64 and rounded once. The timing rows do not check what the kernel checks
before it takes the compensated route (``numba_cpu._f32_weight``, ``_f32_dx_row``): a weight
with at most 24 - p significant bits, and rstd and rstd·c within 2^+-100.

Then the accuracy, on ``--rows`` rows of each kind of ``DATA``: each route's dx against the
oracle's (``rmsref.rms_norm_backward``, float64 rounded once), as the share of elements with
the same bits, the share more than one ulp away, the share of rows holding such an element,
and the share of rows the kernel would write again (the overflow test, and for the float32
route the cancellation test). The routes other than the shipped kernel get the same float64
rstd and c (from NumPy), so what differs between them is the arithmetic of dx alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import ml_dtypes
import numpy as np
from numba import njit

import rmsref
from rmsref.kernels import numba_cpu as K
from rmsref.kernels._halfbits import _fma, as_work, from_work, outside_work, to_f64, to_work

# Each variant's row is assembled from these steps (source lines inside the 64-element block
# loop of ``_bwd_row_and_dot``), so that a variant differs from the kernel's row only where it
# says. Names: g = dy_j, xhat = x_j·rstd, dxj = dx_j before rounding; c and rstd are the row's.
_DX64 = """
            g = to_f64(g3[b, i, j])
            xhat = to_f64(x3[b, i, j]) * rstd_s  # (3)
            dxj = as_work(rstd_s * (g * w[j] - xhat * c), x3, dx3)  # (5), (7)
            dx3[b, i, j] = from_work(dxj, dx3)
"""
_DX32 = """
            g = to_work(g3[b, i, j], dx3)  # exact
            xhat = to_work(x3[b, i, j], dx3) * rstd32  # (3) in float32
            dxj = rstd32 * (g * w32[j] - xhat * c32)  # (5), (7) in float32
            dx3[b, i, j] = from_work(dxj, dx3)
"""
_DXFMA = """
            g = np.float32(to_work(g3[b, i, j], dx3))  # exact (float32 rows: from float64)
            xw = np.float32(to_work(x3[b, i, j], dx3))  # exact
            t = fma(-xw, rc_hi, g * w32[j])  # g·w exact (a half weight); x·rc_hi exact inside
            t = fma(-xw, rc_lo, t)  # the rest of x·rstd·c
            dxj = rstd32 * t  # (7)
            dx3[b, i, j] = from_work(dxj, dx3)
"""
_DW_GX = "            dw_parts[p, j] += np.float64(g * xw) * rstd_s  # (8): g·x exact in float32\n"
_SUMGW = ("            acc[lane] += np.float64(to_work(g3[b1, i1, j], dx3) * w32[j])"
          " * to_f64(x3[b1, i1, j])\n")
_DW_BUF = "            gx_blk[lane] = g * xw  # exact for float16; bfloat16 may underflow\n"
_OVERFLOW = "            outside |= outside_work(dxj, dx3)\n"
_CANCEL = ("            outside |= abs(dxj) < (abs(g * w32[j]) + abs(xhat * c32)) * cancel\n")
_DW64 = "            dw_parts[p, j] += g * xhat  # (8)\n"
_DW64_OF32 = "            dw_parts[p, j] += np.float64(g * xhat)  # (8)\n"
_DW32 = "            dw32[j] += g * xhat  # (8), a float32 partial row\n"
_SUM64 = "            acc[lane] += (to_f64(g3[b1, i1, j]) * w[j]) * to_f64(x3[b1, i1, j])\n"
_SUM32 = ("            acc[lane] += np.float64((to_work(g3[b1, i1, j], dx3) * w32[j])"
          " * to_work(x3[b1, i1, j], dx3))\n")
_NOTHING = "            pass\n"

VARIANTS = {  # name: (the dx step, the next row's sum)
    "as rebuilt": (_DX64 + _OVERFLOW + _DW64, _SUM64),
    "no next-row sum": (_DX64 + _OVERFLOW + _DW64, _NOTHING),
    "no dweight terms": (_DX64 + _OVERFLOW, _SUM64),
    "no overflow test": (_DX64 + _DW64, _SUM64),
    "float32 dx": (_DX32 + _OVERFLOW + _DW64_OF32, _SUM32),
    "float32 dx, float32 dweight": (_DX32 + _OVERFLOW + _DW32, _SUM32),
    "+ cancellation test": (_DX32 + _OVERFLOW + _CANCEL + _DW32, _SUM32),
    "compensated float32 dx": (_DXFMA + _OVERFLOW + _DW_GX, _SUMGW),
    "+ dweight loop": (_DXFMA + _OVERFLOW + _DW_BUF, _SUM64),
    "+ float32 sum": (_DXFMA + _OVERFLOW + _DW_BUF, _SUM32),
}

# The loop of ``_bwd_row_and_dot`` for a row length that is a multiple of 64 (the block loop
# must run to such a bound: with range(0, n, LANES) LLVM left the lane loops scalar).
_ROW = """
def row(g3, x3, b, i, w, w32, rstd_s, c, dx3, dw_parts, dw32, p, b1, i1, cancel):
    n64 = x3.shape[2] - x3.shape[2] %% LANES
    acc = K._lanes()
    outside = False
    rstd32, c32 = np.float32(rstd_s), np.float32(c)
    rc = rstd_s * c
    gx_blk = K._lanes32()  # a block's g·x (+ dweight loop)
    rc_hi, rc_lo = K._split32(rc)
    for j0 in range(0, n64, LANES):
        K._read_ahead(g3, (b1, i1, j0))
        K._read_ahead(x3, (b1, i1, j0))
        K._write_ahead(dx3, (b, i, j0))
        for lane in range(LANES):
            j = j0 + lane
%s
        if DW_LOOP:
            for lane in range(LANES):
                dw_parts[p, j0 + lane] += np.float64(gx_blk[lane]) * rstd_s  # (8)
        for lane in range(LANES):
            j = j0 + lane
%s
    return K._lane_tree(acc), outside
"""


def _rows():
    """name -> the variant's row, compiled inline (as the kernel's helpers are)."""
    names = {"fma": _fma, "np": np, "K": K, "LANES": K.LANES, "as_work": as_work,
             "from_work": from_work, "outside_work": outside_work, "to_f64": to_f64,
             "to_work": to_work}
    rows = {}
    for name, (dx_step, sum_step) in VARIANTS.items():
        scope = dict(names, DW_LOOP=_DW_BUF in dx_step)  # the dweight loop after the dx loop
        exec(_ROW % (dx_step, sum_step), scope)  # noqa: S102 (our own source, above)
        rows[name] = njit(inline="always", nogil=True, error_model="numpy")(scope["row"])
    return rows


def _timed(row):
    """A loop calling ``row`` ``reps`` times on rows 0 (written) and 1 (summed), as
    ``bench/halfrow.py`` times the kernel's row; ``row`` None: the kernel's own, "f32": the
    kernel's float32 dx row."""

    @njit(nogil=True, error_model="numpy")
    def loop(g3, x3, w, w32, dx3, parts, dw32, cancel, hw, reps):
        K._wide_vectors_for(g3)  # as the kernels: 512-bit vectors for half rows
        t = 0.0
        for rep in range(reps):
            rstd = 1.0 + rep * 1e-9
            if row is None:
                s, outside = K._bwd_row_and_dot(g3, x3, 0, 0, w, rstd, 0.01, dx3, parts, 0, 0,
                                                1)
            elif row == "f32":
                s, outside, _ = K._bwd_row_and_dot_f32(g3, x3, 0, 0, w, w32, rstd, 0.01, dx3,
                                                       parts, 0, 0, 1, None, hw)
            else:
                s, outside = row(g3, x3, 0, 0, w, w32, rstd, 0.01, dx3, parts, dw32, 0, 0, 1,
                                 cancel)
            t += s + outside  # both results used, so neither step is left out
        return t

    return loop


def _precision(dtype: np.dtype) -> int:
    """Significand bits p of ``dtype``, the implicit bit included (8 bfloat16, 11 float16)."""
    return int(ml_dtypes.finfo(dtype).nmant) + 1  # (NumPy 1.x has no finfo for bfloat16)


def speed(dtype: np.dtype, n: int, reps: int, rounds: int) -> dict[str, float]:
    """ns per element of each variant's row, one thread, in cache."""
    rng = np.random.default_rng(0)
    x3 = K._bits(rng.standard_normal((1, 2, n)).astype(dtype))
    g3 = K._bits(rng.standard_normal((1, 2, n)).astype(dtype))
    dx3 = np.empty_like(x3)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(dtype).astype(np.float64)
    w32 = w.astype(np.float32)
    parts, dw32 = np.zeros((1, n)), np.zeros(n, np.float32)
    cancel = np.float32(2.0 ** -_precision(dtype))
    hw = K._bf16_by_cpu(dx3)  # the shipped row's store of dx (rows here are a multiple of 64)
    loops = {"shipped": _timed(None)}
    if np.dtype(dtype).itemsize == 2:  # the float32 dx route is for half rows only
        loops["shipped float32 dx"] = _timed("f32")
    loops |= {name: _timed(r) for name, r in _rows().items()}
    for loop in loops.values():
        loop(g3, x3, w, w32, dx3, parts, dw32, cancel, hw, 1)  # compile
    best = dict.fromkeys(loops, float("inf"))
    for _ in range(rounds):
        for name, loop in loops.items():
            t0 = time.perf_counter()
            loop(g3, x3, w, w32, dx3, parts, dw32, cancel, hw, reps)
            best[name] = min(best[name], (time.perf_counter() - t0) / (n * reps) * 1e9)
    return best


def _ulps(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """|a - b| in units in the last place of ``dtype``: the distance of their bits on the
    ordered line of values (sign and magnitude made one signed integer; +0 and -0 are 0)."""
    bits = np.dtype(f"u{dtype.itemsize}")
    sign = np.uint64(1) << np.uint64(8 * dtype.itemsize - 1)

    def ordered(v):
        u = v.astype(dtype).view(bits).astype(np.uint64)
        mag = (u & (sign - np.uint64(1))).astype(np.int64)
        return np.where(u & sign, -mag, mag)

    return np.abs(ordered(a) - ordered(b))


#: The accuracy table's data: dy independent of x, and dy along the forward's output y =
#: xhat·w, the direction that RMSNorm's scale invariance removes (dx = 0 in exact arithmetic
#: for dy = y when w = 1, so dx is all cancellation), and that direction plus 1 % noise.
DATA = ("dy independent", "dy = y + 1% noise", "dy = y, w = 1")


def _data(kind: str, dtype: np.dtype, rows: int, n: int, rng: np.random.Generator):
    x = rng.standard_normal((rows, n))
    w = np.ones(n) if kind == "dy = y, w = 1" else 1.0 + 0.1 * rng.standard_normal(n)
    x, w = x.astype(dtype), w.astype(dtype)
    y = rmsref.rms_norm(x, (n,), w, 1e-6).astype(np.float64)
    dy = {"dy independent": rng.standard_normal((rows, n)),
          "dy = y + 1% noise": y + 0.01 * rng.standard_normal((rows, n)),
          "dy = y, w = 1": y}[kind]
    return x, dy.astype(dtype), w


def accuracy(dtype: np.dtype, n: int, rows: int) -> dict[tuple[str, str], tuple]:
    """Each route's dx against the oracle's on ``rows`` rows of each kind of ``DATA``: % of
    elements bit-equal, % more than one ulp away, % of rows with such an element, and % of rows
    flagged (the overflow test; for the float32 route, the cancellation test too)."""
    rows_ = _rows()
    rebuilt, f32, comp = (rows_[k] for k in ("as rebuilt", "+ cancellation test",
                                              "compensated float32 dx"))

    @njit(nogil=True, error_model="numpy")
    def dx_rows(row, g3, x3, w, w32, rstd, c, dx3, parts, dw32, cancel, flags):
        K._wide_vectors_for(g3)
        for r in range(x3.shape[1]):
            flags[r] = row(g3, x3, 0, r, w, w32, rstd[r], c[r], dx3, parts, dw32, 0, 0, r,
                           cancel)[1]

    rng = np.random.default_rng(1)
    cancel = np.float32(2.0 ** -_precision(np.dtype(dtype)))
    out = {}
    for kind in DATA:
        x, dy, w = _data(kind, dtype, rows, n, rng)
        w64, x64, dy64 = (a.astype(np.float64) for a in (w, x, dy))
        rstd = 1.0 / np.sqrt(np.mean(x64 * x64, axis=1) + 1e-6)  # (M,)  eq. (2)
        c = np.mean(dy64 * w64 * x64 * rstd[:, None], axis=1)  # (M,)  eq. (6)
        ref = rmsref.rms_norm_backward(dy, x, (n,), w, 1e-6).dx
        shipped = rmsref.backend("numba_cpu").rms_norm_backward(dy, x, (n,), w, 1e-6).dx
        results = {"shipped kernel": (shipped, None)}  # its rows written again: not returned
        for route, row in (("float64 dx (as rebuilt)", rebuilt), ("float32 dx", f32),
                           ("compensated float32 dx", comp)):
            dx = np.empty_like(x)
            flags = np.zeros(rows, np.bool_)
            dx_rows(row, K._bits(dy[None]), K._bits(x[None]), w64, w64.astype(np.float32),
                    rstd, c, K._bits(dx[None]), np.zeros((1, n)), np.zeros(n, np.float32),
                    cancel, flags)
            results[route] = (dx, flags)
        for route, (dx, flags) in results.items():
            ulps = _ulps(dx, ref, np.dtype(dtype))
            out[kind, route] = (100 * np.mean(ulps == 0), 100 * np.mean(ulps > 1),
                                100 * np.mean(np.any(ulps > 1, axis=1)),
                                None if flags is None else 100 * np.mean(flags))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--n", type=int, default=4096, help="row length (a multiple of 64)")
    p.add_argument("--reps", type=int, default=500, help="calls per timing")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (minimum)")
    p.add_argument("--rows", type=int, default=256, help="random rows for the accuracy table")
    args = p.parse_args(argv)
    if args.n % K.LANES:
        p.error(f"--n must be a multiple of {K.LANES}, got {args.n}")
    dtypes = {"bfloat16": rmsref.bfloat16, "float16": np.dtype(np.float16),
              "float32": np.dtype(np.float32)}
    unknown = [name for name in args.dtypes.split(",") if name not in dtypes]
    if unknown:
        p.error(f"--dtypes takes {', '.join(dtypes)}; got {', '.join(map(repr, unknown))}")
    import numba

    print(f"# bench/halfbwd.py: {platform.machine()}, numba {numba.__version__}, numpy "
          f"{np.__version__}\n")
    print(f"ns per element, one thread, in cache, N = {args.n}, min of {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    times = {name: speed(dtypes[name], args.n, args.reps, args.rounds)
             for name in args.dtypes.split(",")}
    names = list(max(times.values(), key=len))
    print("| row | " + " | ".join(times) + " |")
    print("|---|" + "---:|" * len(times))
    for v in names:
        print(f"| {v} | " + " | ".join("-" if v not in t else f"{t[v]:.3f}"
                                       for t in times.values()) + " |")
    print(f"\nload average {os.getloadavg()[0]:.2f}\n")
    print(f"dx against the oracle's on {args.rows} rows of {args.n} of each kind: % of "
          "elements bit-equal, % more than 1 ulp away, % of rows with such an element, % of "
          "rows a kernel would write again (the overflow test; for float32 dx, the "
          "cancellation test too)\n")
    print("| dtype | data | route | bit-equal | > 1 ulp | rows with > 1 ulp | rows flagged |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name in args.dtypes.split(","):
        if name == "float32":
            continue  # float32 already computes dx in float64 and rounds once
        for (kind, route), (eq, off, rows_off, flagged) in accuracy(dtypes[name], args.n,
                                                                     args.rows).items():
            redone = "-" if flagged is None else f"{flagged:.1f}"
            print(f"| {name} | {kind} | {route} | {eq:.3f} | {off:.4f} | {rows_off:.1f} | "
                  f"{redone} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
