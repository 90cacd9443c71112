r"""Numba-parallel CPU kernels for RMSNorm (and LayerNorm, written the same way for comparison).

``rmsref.backend("numba_cpu")`` is this module: the oracle's function names and signatures
(docs/kernels.md), computed by ``@njit(parallel=True)`` kernels. The math is the oracle's, eqs.
(1)-(9) of :mod:`rmsref.rmsnorm` and (1)-(11) of :mod:`rmsref.layernorm`; read those first.
Arguments are checked by the oracle's own contract (:func:`rmsref._shapes.prepare`: the same
rules for eps, offset, partial, saved statistics, masked arrays, ``numpy.matrix`` and byte order,
in the same order, so both raise the same error for the same call), plus one rule of this
backend: real dtypes only (complex inputs are a ``TypeError``; use the oracle).

Variants (llm.c style: each line says what changed from the previous one)
-------------------------------------------------------------------------
RMSNorm forward
    v1  prange over rows; a serial row loop ``ss += x_j*x_j`` in float64, then a second pass
        writes y = x·rstd·(offset + w) (+ b). Latency-bound: one dependent float64 add per
        element, which LLVM may not split or vectorise because fastmath is off (that would
        reassociate the sum).
    v2  as v1, but the sum of squares runs in 8 independent partial accumulators (lane j mod 8),
        combined in a fixed tree ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) and then the tail: the
        order is fixed by the code, so the bits are too, and the 8 dependency chains overlap in
        the pipeline. (Numba keeps LLVM's SLP vectoriser off, so the lanes stay scalar; turning
        it on gave no measurable gain.)
    v3  as v2, but 64 lanes held in a small float64 array, ``acc[j mod 64] += x_j²`` (the
        tail goes into lanes 0, 1, ... last), combined by a fixed halving tree
        acc[l] += acc[l + h], h = 32, 16, ..., 1. The loop over the 64 lanes is element-wise,
        so LLVM's loop vectoriser emits packed float64 code (vcvtps2pd, vmulpd, vaddpd on ymm)
        with fastmath off; the order is fixed by the code, so are the bits.
    v4  as v3, but prange runs over blocks of ``ROWS_PER_BLOCK`` = 16 rows and each block is
        pipelined: one loop writes row r's y while summing row r + 1's squares (same lanes,
        same order: the bits of v3), so a core streams reads and writes at once. (default)
RMSNorm backward (dx, dweight, dbias; rows grouped into parts of ``ROWS_PER_PART``)
    v1  prange over parts of 64 rows; per row a serial ``s += dxhat_j*x_j`` pass, then a pass
        writing dx and adding dy·xhat (and dy) into the part's float64 partial row; the partial
        rows are then summed over parts in order 0, 1, 2, ...
    v2  as v1, but the row reductions (sum of squares when rstd is recomputed, Σ dxhat·x) use
        the 8-lane accumulators of forward v2.
    v3  as v2, but with the 64 vectorised lanes of forward v3.
    v4  as v3, but pipelined like forward v4: one loop writes row r's dx and dweight terms
        while summing Σ dxhat·x of row r + 1 (same lanes, same order: the bits of v3) within a
        part. Covers the common call (saved rstd, no ``partial``, a weight, no bias); other
        calls run v3's loops.
    v5  as v4, but the common call gets a kernel of its own (``_rms_bwd_pipelined``: no
        branches for the other calls, every row of a part through the pipelined loop) and the
        rest run v3, which is what v4 runs for them (it pipelines the common call only) and
        compiles in about half v4's time. Same operations, so v4's bits; LLVM schedules the
        smaller loop with fewer spills (timings in bench/results/cpu-summary.md). (default)
Fused residual add (add_rms_norm forward/backward) and LayerNorm forward/backward are written
like v2 only (so bench/cpu.py's RMSNorm/LayerNorm ratio compares LayerNorm with RMSNorm v2).
LayerNorm forward: Σx (8 lanes) -> mu; then (Σd, Σd²) with d = x − mu in one pass (the
corrected two-pass variance, which is also the oracle's "refine mu once") -> write.

Numerical contract
------------------
- Accumulation in float64 for every input dtype; outputs rounded once to the output dtype with
  round-to-nearest-even (float64 -> bfloat16 without double rounding, see ``_halfbits``), i.e.
  the ``torch`` convention of docs/semantics.md with a float64 statistic. The y/dx formulas are the
  oracle's but with x·rstd for x/sqrt(ms + eps): float32 outputs agree with the oracle rounded
  to float32 except for rare last-bit ties (tests: >= 99.9 % equal, rest within 1 ulp).
- Saved statistics: rstd (and LayerNorm's mean) in float32 for float16/bfloat16 inputs (what
  torch saves), float64 for float32 and float64 inputs. For float32 that is a choice: the value
  is computed in float64 anyway and costs 8 bytes per row, and a float64 rstd lets the backward
  reuse the forward's exact statistic. The backward uses a given rstd as is; without one it
  recomputes it with the forward's code (same bits as the forward's float64 value).
- Overflow: float32 and half inputs cannot overflow or underflow a float64 sum of squares
  (3.4e38² · N and (1.4e-45)² are representable). For float64 inputs RMSNorm (forward, backward
  without a saved rstd, and the fused residual kernels) takes the oracle's route only for rows
  that need it: when Σx² is not in [2^-900, 2^1000] the row is recomputed scaled by 2^-k, k the
  exponent of its largest |x| (exact), with eps scaled by 2^-2k — so rows near 1e300 or 1e-300
  give the oracle's finite results; the common row pays one comparison. A backward given a saved
  rstd uses it unscaled (as the oracle does). LayerNorm kernels are not overflow-safe for float64
  rows beyond ~1e150 (a comparison kernel, documented and tested as such).
- Determinism and batch invariance: prange runs over rows (forward v1-v3), blocks of
  ``ROWS_PER_BLOCK`` rows (forward v4: a row gets the same operations wherever it falls in a
  block) or fixed parts of ``ROWS_PER_PART`` rows (backward); every reduction inside a row is
  serial in a fixed order and
  ``fastmath`` is off, so no step depends on the thread count, on the other rows of the batch,
  or on the memory layout (contiguous and strided inputs run the same operations). dweight/dbias:
  float64 partial rows per part, summed over parts in index order; the parts are fixed by the
  row index, so the result does not depend on the thread count, and appending rows with dy = 0
  leaves it unchanged bit for bit.
- Layouts: any leading shape is seen as (B, R, N) rows, which is a view for contiguous inputs,
  strided rows or columns, negative strides and a batch with two leading dims in any order
  (transposed); the kernels walk the strides. Only a layout that cannot be expressed this way
  (three or more non-mergeable leading groups, or permuted normalised dims) is copied first.
- Half precision: float16/bfloat16 arrays are passed as 16-bit integer views (no copy) and
  converted per element in registers (``_halfbits``): float16 -> float64 by the CPU's F16C
  conversion where Numba's target has it (the integer route otherwise; same values). The
  default kernels write a bfloat16 row with ``from_f64_normal``, integer arithmetic on the
  float64 bits that rounds once exactly like ``from_f64`` for ±0 and 2^-126 <= |v| < 2^128,
  and flag any other value (a bfloat16 subnormal, overflow, inf, NaN); a flagged row is
  written again with ``from_f64`` (``_rms_write_general``, ``_bwd_dx_exact``), so every element
  keeps the one-rounding contract above. float16 rows are written by ``from_f64`` directly
  (subnormal float16 outputs are common enough that rows would be rewritten often). Complex
  inputs are not supported here (use the oracle).
- Threads: kernels are ``nogil``; two Python threads may call them at once. Numba's "workqueue"
  threading layer cannot run two parallel regions at once, so when it is the active layer the
  launches are serialised with a lock (the default here is OpenMP/TBB, which need none).
- Speed: ``bench/cpu.py`` times every variant against a parallel copy of the same bytes; the
  committed tables and their summary are in ``bench/results/`` (``cpu.md``, ``cpu-summary.md``).
- Compilation: lazy (first call per dtype and layout), ``cache=True`` (on-disk cache next to this
  file). ``bench/compile.py`` measures each default kernel's cold first call in a fresh process
  with an empty cache (``bench/results/compile.md``): 2.5-5.8 s per kernel and dtype on 2 busy
  cores (forward ~4 s; backward with a saved rstd ~3 s, without one ~4-6 s), about half of it in
  LLVM (the 64-lane loops are unrolled and vectorised) and half in Numba's own passes, both
  growing with the inlined kernel body, which is why rare paths (bias and scaled rows of the
  forward write, the backward calls v5 does not pipeline) live outside the pipelined kernels;
  0.3-0.5 s from the cache (most of it loading Numba's runtime, once per process). After
  editing ``_halfbits.py`` clear ``__pycache__/*.nb[ic]`` (Numba checks only the timestamp of
  the file holding the cached function).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

from rmsref._rounding import round_to
from rmsref._shapes import (
    NormInputs,
    ShapeLike,
    bfloat16,
    check_out,
    check_stat_pair,
    into_out,
    prepare,
    reshape_view,
    resolve_offset,
    resolve_out_dtype,
    resolve_rounding,
    stat_shape,
)
from rmsref.kernels._halfbits import (
    BF16_BITS,
    F16_BITS,
    from_f64,
    from_f64_normal,
    outside_normal,
    to_f64,
)
from rmsref.layernorm import LayerNormGrads
from rmsref.rmsnorm import AddRMSNormGrads, RMSNormGrads

__all__ = [
    "ROWS_PER_PART",
    "VARIANTS",
    "add_rms_norm",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
    "variant",
]

#: Rows per part of the dweight/dbias reduction. Fixed, so the partition (and the bits) do not
#: depend on the thread count; 64 rows give >= 16 parts for a 1000-row batch (work for every
#: core) while the float64 partial rows stay a few % of the bytes the backward moves.
ROWS_PER_PART = 64

#: Σx² outside [SS_LO, SS_HI] sends a float64 row to the scaled (overflow-safe) path.
SS_LO = 2.0**-900
SS_HI = 2.0**1000
#: As the oracle (rmsref._sumsq.SAFE_EXPONENT): rows whose max |x| has a binary exponent within
#: +-SAFE_EXPONENT are never scaled.
SAFE_EXPONENT = 450

#: fastmath stays off (the default). error_model="numpy": a division by zero gives inf/NaN as
#: NumPy's does (an all-zero row with eps = 0 is NaN, as in the oracle), where Numba's default
#: "python" model raises ZeroDivisionError inside a kernel (a SystemError for the caller).
_PAR = {"parallel": True, "nogil": True, "cache": True, "error_model": "numpy"}
#: Row helpers are inlined into the kernels at the Numba IR level (see the note above them).
_INL = {"inline": "always", "nogil": True, "error_model": "numpy"}
#: Serial helpers that are not inlined (the rare paths, the column sum).
_SER = {"nogil": True, "cache": True, "error_model": "numpy"}

_HALF_VIEWS = {np.dtype(np.float16): F16_BITS, bfloat16: BF16_BITS}
_FLOAT_DTYPES = (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64))


# ============================================================================================
# Row helpers (serial, fixed order). A row is (b, i) of a (B, R, N) array and is indexed in
# place: the helpers are inlined into the kernels (inline="always"), so no per-row slice objects
# are made (their atomic reference counts, shared by all threads, cost microseconds per row).
# w, bias: float64 (N,) rows (offset already added to w).
# ============================================================================================
@njit(**_INL)
def _sumsq_v1(x3, b, i, k):
    """Σ_{j<k} x_j² with one accumulator (v1)."""
    ss = 0.0
    for j in range(k):
        v = to_f64(x3[b, i, j])
        ss += v * v
    return ss


@njit(**_INL)
def _sumsq_v2(x3, b, i, k):
    """Σ_{j<k} x_j² in 8 independent lanes, combined in a fixed tree, then the tail (v2)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    k8 = k - k % 8
    for j in range(0, k8, 8):
        v0 = to_f64(x3[b, i, j])
        v1 = to_f64(x3[b, i, j + 1])
        v2 = to_f64(x3[b, i, j + 2])
        v3 = to_f64(x3[b, i, j + 3])
        v4 = to_f64(x3[b, i, j + 4])
        v5 = to_f64(x3[b, i, j + 5])
        v6 = to_f64(x3[b, i, j + 6])
        v7 = to_f64(x3[b, i, j + 7])
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        a4 += v4 * v4
        a5 += v5 * v5
        a6 += v6 * v6
        a7 += v7 * v7
    ss = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for j in range(k8, k):
        v = to_f64(x3[b, i, j])
        ss += v * v
    return ss


@njit(**_INL)
def _scaled(v, k):
    """v·2^-k, exact (k = 0 in the common case costs a compare)."""
    return v if k == 0 else math.ldexp(v, -k)


@njit(**_INL)
def _dot_v1(g3, x3, b, i, w, n, k):
    """Σ_j dxhat_j·x_j·2^-k, dxhat = g·w, one accumulator (v1); k = 0 unless a scaled row."""
    s = 0.0
    for j in range(n):
        s += (to_f64(g3[b, i, j]) * w[j]) * _scaled(to_f64(x3[b, i, j]), k)
    return s


@njit(**_INL)
def _dot_v2(g3, x3, b, i, w, n, k):
    """Σ_j dxhat_j·x_j in 8 lanes, as ``_sumsq_v2`` (v2)."""
    if k != 0:  # a scaled float64 row: rare, keep it simple
        return _dot_v1(g3, x3, b, i, w, n, k)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    n8 = n - n % 8
    for j in range(0, n8, 8):
        a0 += (to_f64(g3[b, i, j]) * w[j]) * to_f64(x3[b, i, j])
        a1 += (to_f64(g3[b, i, j + 1]) * w[j + 1]) * to_f64(x3[b, i, j + 1])
        a2 += (to_f64(g3[b, i, j + 2]) * w[j + 2]) * to_f64(x3[b, i, j + 2])
        a3 += (to_f64(g3[b, i, j + 3]) * w[j + 3]) * to_f64(x3[b, i, j + 3])
        a4 += (to_f64(g3[b, i, j + 4]) * w[j + 4]) * to_f64(x3[b, i, j + 4])
        a5 += (to_f64(g3[b, i, j + 5]) * w[j + 5]) * to_f64(x3[b, i, j + 5])
        a6 += (to_f64(g3[b, i, j + 6]) * w[j + 6]) * to_f64(x3[b, i, j + 6])
        a7 += (to_f64(g3[b, i, j + 7]) * w[j + 7]) * to_f64(x3[b, i, j + 7])
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for j in range(n8, n):
        s += (to_f64(g3[b, i, j]) * w[j]) * to_f64(x3[b, i, j])
    return s


#: Lanes of the v3 reductions: element j of a row goes to lane j mod LANES.
LANES = 64


@njit(**_INL)
def _lane_tree(acc):
    """Σ_l acc[l] by a fixed halving tree: acc[l] += acc[l + h] for h = 32, 16, ..., 1."""
    h = LANES // 2
    while h >= 1:
        for lane in range(h):
            acc[lane] += acc[lane + h]
        h //= 2
    return acc[0]


@njit(**_INL)
def _sumsq_v3(x3, b, i, k):
    """Σ_{j<k} x_j² in 64 lanes held in a small array (v3).

    Lane l sums x_j² for j ≡ l (mod 64) in increasing j (the tail of a row that is not a
    multiple of 64 goes into lanes 0, 1, ... last); the lanes are then combined by
    ``_lane_tree``. So no lane sums more than ceil(k/64) terms: the effective length of the
    sum (docs/tolerances.md) is ceil(k/64) + 6 (at most ceil(log2 k) for k <= 64, as empty lanes add
    exact zeros), within the 8-lane model ceil(k/8) + 3 the tests use.
    The inner loop over the 64 lanes is element-wise (no reassociation), so LLVM's loop
    vectoriser turns it into packed float64 code (vcvtps2pd/vmulpd/vaddpd) with fastmath off.
    """
    acc = np.zeros(LANES)
    k64 = k - k % LANES
    for j0 in range(0, k64, LANES):
        for lane in range(LANES):
            v = to_f64(x3[b, i, j0 + lane])
            acc[lane] += v * v
    for lane in range(k - k64):
        v = to_f64(x3[b, i, k64 + lane])
        acc[lane] += v * v
    return _lane_tree(acc)


@njit(**_INL)
def _dot_v3(g3, x3, b, i, w, n, k):
    """Σ_j dxhat_j·x_j in 64 lanes, as ``_sumsq_v3`` (v3)."""
    if k != 0:  # a scaled float64 row: rare, keep it simple
        return _dot_v1(g3, x3, b, i, w, n, k)
    acc = np.zeros(LANES)
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            j = j0 + lane
            acc[lane] += (to_f64(g3[b, i, j]) * w[j]) * to_f64(x3[b, i, j])
    for lane in range(n - n64):
        j = n64 + lane
        acc[lane] += (to_f64(g3[b, i, j]) * w[j]) * to_f64(x3[b, i, j])
    return _lane_tree(acc)


@njit(**_INL)
def _scale_exponent(amax, eps):
    """k with 2^-k·x safe to square (as rmsref._sumsq.row_exponents), 0 when none is needed."""
    k = 0
    if amax == amax and amax != math.inf and amax != 0.0:
        e = math.frexp(amax)[1]
        if abs(e) > SAFE_EXPONENT:
            k = e
    if eps != 0.0:
        k = max(k, int(math.ceil((math.log2(abs(eps)) - 1000.0) / 2.0)))
    return k


@njit(**_INL)
def _rstd_from_sumsq(ss, x3, b, i, kf, eps):
    """(rstd_s, k) of a row from its Σ_{j<kf} x_j²: rstd = rstd_s·2^-k, xhat = (x·2^-k)·rstd_s.

    Eqs. (1)-(2). A row whose Σx² left [SS_LO, SS_HI] (float64 inputs near the ends of the
    exponent range; also zero/NaN/inf rows, which end with k = 0) is redone scaled by 2^-k.
    """
    if SS_LO <= ss <= SS_HI:
        return 1.0 / math.sqrt(ss / kf + eps), 0
    return _rstd_scaled(ss, x3, b, i, kf, eps)


@njit(**_SER)
def _rstd_scaled(ss, x3, b, i, kf, eps):
    """The rare path of ``_rstd_from_sumsq`` (not inlined: it would only bloat every kernel)."""
    amax = 0.0
    for j in range(kf):  # the features that feed the statistic (pRMSNorm: not the rest)
        a = abs(to_f64(x3[b, i, j]))
        if not a <= amax:  # NaN gets through too, so a NaN row keeps k = 0
            amax = a
    k = _scale_exponent(amax, eps)
    if k == 0:
        return 1.0 / math.sqrt(ss / kf + eps), 0
    ss_s = 0.0
    for j in range(kf):
        v = math.ldexp(to_f64(x3[b, i, j]), -k)
        ss_s += v * v
    return 1.0 / math.sqrt(ss_s / kf + math.ldexp(eps, -2 * k)), k


@njit(**_INL)
def _rstd_saved(rstd):
    """(rstd_s, k) of a saved rstd, as ``_rstd_from_sumsq`` gives for a recomputed one:
    rstd = rstd_s·2^-k. A row whose rstd lies outside 2^+-SAFE_EXPONENT has x (~1/rstd) outside
    it too, so Σ dxhat·x is summed scaled by 2^-k, k = -(rstd's exponent), as the path without a
    saved rstd does; any other row keeps k = 0 (the same operations as before, the same bits)."""
    if rstd == rstd and rstd != math.inf and rstd != 0.0:
        e = math.frexp(rstd)[1]
        if abs(e) > SAFE_EXPONENT:
            return math.ldexp(rstd, -e), -e
    return rstd, 0


def _saved_rstd_in_range(rstd: np.ndarray) -> bool:
    """True when no saved rstd needs scaling (``_rstd_saved`` gives k = 0 for every row)."""
    return bool(np.all(np.abs(np.frexp(rstd)[1]) <= SAFE_EXPONENT))


@njit(**_INL)
def _rms_write(x3, b, i, w, bias, has_bias, y3, rstd_s, k):
    """y_j = (x_j·rstd)·w'_j (+ b_j), rounded once. Eqs. (3)-(4). Unswitched by hand so the
    common loop has no per-element branch."""
    if k == 0 and not has_bias:
        outside = False
        for j in range(x3.shape[2]):
            yj = to_f64(x3[b, i, j]) * rstd_s * w[j]
            y3[b, i, j] = from_f64_normal(yj, y3)
            outside |= outside_normal(yj, y3)
        if outside:  # a rare half row: written again, rounded by from_f64
            _rms_write_general(x3, b, i, w, bias, False, y3, rstd_s, 0)
    else:
        _rms_write_general(x3, b, i, w, bias, has_bias, y3, rstd_s, k)


@njit(nogil=True, cache=True)
def _rms_write_general(x3, b, i, w, bias, has_bias, y3, rstd_s, k):
    """The rows of ``_rms_write`` with a bias or a scale 2^-k, and the half rows that
    ``from_f64_normal`` could not round (not inlined: every forward kernel would compile these
    loops again: they took half of forward v4's compile time). Same y values as the common
    loop, rounded by ``from_f64``, which is exact for every value."""
    n = x3.shape[2]
    if k == 0:
        for j in range(n):
            v = to_f64(x3[b, i, j]) * rstd_s * w[j]
            y3[b, i, j] = from_f64(v + bias[j] if has_bias else v, y3)
    else:
        for j in range(n):
            v = math.ldexp(to_f64(x3[b, i, j]), -k) * rstd_s * w[j]
            y3[b, i, j] = from_f64(v + bias[j] if has_bias else v, y3)


# ============================================================================================
# RMSNorm forward kernels. x3, y3: (B, R, N); rstd_out: (M,) float32/float64.
# ============================================================================================
@njit(**_PAR)
def _rms_fwd_v1(x3, w, bias, has_bias, kf, eps, y3, rstd_out):
    nr = x3.shape[1]
    for r in prange(x3.shape[0] * nr):
        b, i = r // nr, r % nr
        ss = _sumsq_v1(x3, b, i, kf)  # (1) Σx², one accumulator
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
        rstd_out[r] = math.ldexp(rstd_s, -k)
        _rms_write(x3, b, i, w, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


@njit(**_PAR)
def _rms_fwd_v2(x3, w, bias, has_bias, kf, eps, y3, rstd_out):
    nr = x3.shape[1]
    for r in prange(x3.shape[0] * nr):
        b, i = r // nr, r % nr
        ss = _sumsq_v2(x3, b, i, kf)  # (1) Σx², 8 lanes
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
        rstd_out[r] = math.ldexp(rstd_s, -k)
        _rms_write(x3, b, i, w, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


@njit(**_PAR)
def _rms_fwd_v3(x3, w, bias, has_bias, kf, eps, y3, rstd_out):
    nr = x3.shape[1]
    for r in prange(x3.shape[0] * nr):
        b, i = r // nr, r % nr
        ss = _sumsq_v3(x3, b, i, kf)  # (1) Σx², 64 lanes
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
        rstd_out[r] = math.ldexp(rstd_s, -k)
        _rms_write(x3, b, i, w, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


#: Rows per prange task of forward v4 (a block is walked serially, pipelined row by row).
ROWS_PER_BLOCK = 16


@njit(**_INL)
def _write_and_sumsq(x3, b, i, w, y3, rstd_s, b1, i1):
    """Row (b, i)'s y (no bias, unscaled) while summing the squares of row (b1, i1) in the 64
    lanes of ``_sumsq_v3``, in the same order (so the same bits as ``_sumsq_v3``; v4)."""
    n = x3.shape[2]
    acc = np.zeros(LANES)
    outside = False  # whether a y_j needs ``from_f64`` (see ``_rms_write``)
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            j = j0 + lane
            yj = to_f64(x3[b, i, j]) * rstd_s * w[j]  # (3)-(4)
            y3[b, i, j] = from_f64_normal(yj, y3)
            outside |= outside_normal(yj, y3)
            v = to_f64(x3[b1, i1, j])
            acc[lane] += v * v  # (1) of the next row
    for lane in range(n - n64):
        j = n64 + lane
        yj = to_f64(x3[b, i, j]) * rstd_s * w[j]
        y3[b, i, j] = from_f64_normal(yj, y3)
        outside |= outside_normal(yj, y3)
        v = to_f64(x3[b1, i1, j])
        acc[lane] += v * v
    if outside:  # a rare half row: written again, rounded by from_f64 (w: an unread bias)
        _rms_write_general(x3, b, i, w, w, False, y3, rstd_s, 0)
    return _lane_tree(acc)


@njit(**_PAR)
def _rms_fwd_v4(x3, w, bias, has_bias, kf, eps, y3, rstd_out):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    fuse = kf == x3.shape[2] and not has_bias
    for blk in prange((m + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK):
        r0 = blk * ROWS_PER_BLOCK
        r1 = min(m, r0 + ROWS_PER_BLOCK)
        fused = False  # whether the previous row's loop summed this row's squares
        ss_next = 0.0
        for r in range(r0, r1):
            b, i = r // nr, r % nr
            ss = ss_next if fused else _sumsq_v3(x3, b, i, kf)  # (1) Σx², 64 lanes
            rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
            rstd_out[r] = math.ldexp(rstd_s, -k)
            fused = fuse and k == 0 and r + 1 < r1
            if fused:  # write row r while summing row r + 1
                ss_next = _write_and_sumsq(x3, b, i, w, y3, rstd_s, (r + 1) // nr, (r + 1) % nr)
            else:
                _rms_write(x3, b, i, w, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


# ============================================================================================
# RMSNorm backward. dy3, x3, dx3: (B, R, N); rstd_in: (M,) float64 (unused unless has_rstd);
# dw_parts, db_parts: (P, N) float64 partial rows, P = ceil(M / ROWS_PER_PART).
# ============================================================================================
@njit(**_INL)
def _zero_part(parts, p):
    for j in range(parts.shape[1]):
        parts[p, j] = 0.0


@njit(**_INL)
def _coef(s, g3, x3, b, i, w, kf, rstd_s, k):
    """c of eq. (6), s·rstd_s/K from s = Σ_{j<K} dxhat_j·x_j·2^-k. When s left
    [SS_LO, SS_HI] (a dy so large that dxhat·x overflowed, or so small that it lost digits or
    underflowed to 0; also a zero dy row and a NaN row) c is summed again in the oracle's order,
    Σ dxhat·xhat / K: rare rows only, so every other row keeps its bits (a zero dy row gets the
    same c = ±0 either way)."""
    if SS_LO <= abs(s) <= SS_HI:
        return s * rstd_s / kf
    return _coef_from_xhat(g3, x3, b, i, w, kf, rstd_s, k)


@njit(**_SER)
def _coef_from_xhat(g3, x3, b, i, w, kf, rstd_s, k):
    """(1/K) Σ_{j<K} dxhat_j·xhat_j, xhat = (x·2^-k)·rstd_s: the rare path of ``_coef``."""
    c = 0.0
    for j in range(kf):
        c += (to_f64(g3[b, i, j]) * w[j]) * (_scaled(to_f64(x3[b, i, j]), k) * rstd_s)
    return c / kf


@njit(**_INL)
def _rms_bwd_row(g3, x3, b, i, w, kf, rstd_s, k, s, dx3, want_dw, want_db, dw_parts, db_parts,
                 p):
    """dx of one row and its contribution to the part's dweight/dbias rows, given
    s = Σ dxhat·x·2^-k. Eqs. (5)-(9)."""
    n = x3.shape[2]
    c = _coef(s, g3, x3, b, i, w, kf, rstd_s, k)  # (6) c = (1/K) Σ dxhat·xhat
    if k == 0 and kf == n:
        # The common row, unswitched by hand: no per-element scaling test or K test, so the loop
        # vectorises (with them: 4.4x instead of 2.5x the copy time at 65536x512 in one loaded
        # run). Same operations as the general loop below, so the same bits.
        for j in range(n):
            g = to_f64(g3[b, i, j])
            xhat = to_f64(x3[b, i, j]) * rstd_s  # (3)
            dx3[b, i, j] = from_f64(rstd_s * (g * w[j] - xhat * c), dx3)  # (5), (7)
            if want_dw:
                dw_parts[p, j] += g * xhat  # (8), this part's partial row
            if want_db:
                db_parts[p, j] += g  # (9)
        return
    rstd = math.ldexp(rstd_s, -k)
    for j in range(n):
        g = to_f64(g3[b, i, j])
        xhat = _scaled(to_f64(x3[b, i, j]), k) * rstd_s  # (3)
        dxhat = g * w[j]  # (5)
        proj = xhat * c if j < kf else 0.0  # the path through rstd (none past K)
        dx3[b, i, j] = from_f64(rstd * (dxhat - proj), dx3)  # (7) direct term − projection
        if want_dw:
            dw_parts[p, j] += g * xhat  # (8)
        if want_db:
            db_parts[p, j] += g  # (9)


@njit(**_PAR)
def _rms_bwd_v1(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) recomputed
                rstd_s, k = _rstd_from_sumsq(_sumsq_v1(x3, b, i, kf), x3, b, i, kf, eps)
            s = _dot_v1(dy3, x3, b, i, w, x3.shape[2], k)
            _rms_bwd_row(dy3, x3, b, i, w, kf, rstd_s, k, s, dx3, want_dw, want_db, dw_parts,
                         db_parts, p)


@njit(**_PAR)
def _rms_bwd_v2(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) recomputed with the forward's code
                rstd_s, k = _rstd_from_sumsq(_sumsq_v2(x3, b, i, kf), x3, b, i, kf, eps)
            s = _dot_v2(dy3, x3, b, i, w, x3.shape[2], k)
            _rms_bwd_row(dy3, x3, b, i, w, kf, rstd_s, k, s, dx3, want_dw, want_db, dw_parts,
                         db_parts, p)


@njit(**_PAR)
def _rms_bwd_v3(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) recomputed with the forward's code
                rstd_s, k = _rstd_from_sumsq(_sumsq_v3(x3, b, i, kf), x3, b, i, kf, eps)
            s = _dot_v3(dy3, x3, b, i, w, x3.shape[2], k)
            _rms_bwd_row(dy3, x3, b, i, w, kf, rstd_s, k, s, dx3, want_dw, want_db, dw_parts,
                         db_parts, p)


@njit(**_INL)
def _bwd_row_and_dot(g3, x3, b, i, w, rstd_s, c, dx3, dw_parts, p, b1, i1):
    """Row (b, i)'s dx and dweight contribution (the common case: unscaled, K = N, a weight,
    no bias), while summing Σ dxhat·x of row (b1, i1) in the 64 lanes of ``_dot_v3`` in the
    same order (so the same bits as ``_dot_v3``; v4)."""
    n = x3.shape[2]
    acc = np.zeros(LANES)
    outside = False  # whether a dx_j needs ``from_f64`` (see ``_bwd_dx_exact``)
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            j = j0 + lane
            g = to_f64(g3[b, i, j])
            xhat = to_f64(x3[b, i, j]) * rstd_s  # (3)
            dxj = rstd_s * (g * w[j] - xhat * c)  # (5), (7)
            dx3[b, i, j] = from_f64_normal(dxj, dx3)
            outside |= outside_normal(dxj, dx3)
            dw_parts[p, j] += g * xhat  # (8)
            acc[lane] += (to_f64(g3[b1, i1, j]) * w[j]) * to_f64(x3[b1, i1, j])  # next row
    for lane in range(n - n64):
        j = n64 + lane
        g = to_f64(g3[b, i, j])
        xhat = to_f64(x3[b, i, j]) * rstd_s
        dxj = rstd_s * (g * w[j] - xhat * c)
        dx3[b, i, j] = from_f64_normal(dxj, dx3)
        outside |= outside_normal(dxj, dx3)
        dw_parts[p, j] += g * xhat
        acc[lane] += (to_f64(g3[b1, i1, j]) * w[j]) * to_f64(x3[b1, i1, j])
    if outside:
        _bwd_dx_exact(g3, x3, b, i, w, rstd_s, c, dx3)
    return _lane_tree(acc)


@njit(**_SER)
def _bwd_dx_exact(g3, x3, b, i, w, rstd_s, c, dx3):
    """Row (b, i)'s dx of ``_bwd_row_and_dot`` again, rounded by ``from_f64`` (a half row with
    an element outside the format's normal range, as ``_rms_write`` does). Only dx: the
    dweight terms were added once already."""
    for j in range(x3.shape[2]):
        xhat = to_f64(x3[b, i, j]) * rstd_s
        dx3[b, i, j] = from_f64(rstd_s * (to_f64(g3[b, i, j]) * w[j] - xhat * c), dx3)


@njit(**_PAR)
def _rms_bwd_v4(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    # the pipelined loop covers the common call (saved rstd, K = N, a weight, no bias); each
    # helper is inlined once (compile time)
    fuse = has_rstd and kf == n and want_dw and not want_db
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        r0 = p * ROWS_PER_PART
        r1 = min(m, (p + 1) * ROWS_PER_PART)
        s_next = 0.0
        have_next = False  # s_next holds this row's unscaled Σ dxhat·x
        for r in range(r0, r1):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) recomputed with the forward's code
                rstd_s, k = _rstd_from_sumsq(_sumsq_v3(x3, b, i, kf), x3, b, i, kf, eps)
            if have_next and k == 0:
                s = s_next  # summed while the previous row was written
            else:
                s = _dot_v3(dy3, x3, b, i, w, n, k)
            have_next = fuse and k == 0 and r + 1 < r1  # a scaled row takes the general loop
            if have_next:
                c = _coef(s, dy3, x3, b, i, w, kf, rstd_s, 0)  # (6)
                s_next = _bwd_row_and_dot(dy3, x3, b, i, w, rstd_s, c, dx3, dw_parts, p,
                                          (r + 1) // nr, (r + 1) % nr)
            else:
                _rms_bwd_row(dy3, x3, b, i, w, kf, rstd_s, k, s, dx3, want_dw, want_db,
                             dw_parts, db_parts, p)


@njit(**_PAR)
def _rms_bwd_pipelined(dy3, x3, w, rstd_in, dx3, dw_parts):
    """v5's kernel: v4's pipelined loop for the common call only (saved rstd, K = N, a weight,
    no bias), with no branch for the other calls, and every row of a part through the loop
    (the part's last row sums its own Σ dxhat·x again, unused)."""
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        r0 = p * ROWS_PER_PART
        r1 = min(m, r0 + ROWS_PER_PART)
        if r1 <= r0:  # an empty batch still has one (zeroed) part
            continue
        s = _dot_v3(dy3, x3, r0 // nr, r0 % nr, w, n, 0)  # Σ dxhat·x of the part's first row
        for r in range(r0, r1):
            rn = min(r + 1, r1 - 1)  # the row summed while row r is written
            rstd_s = rstd_in[r]
            c = _coef(s, dy3, x3, r // nr, r % nr, w, n, rstd_s, 0)  # (6)
            s = _bwd_row_and_dot(dy3, x3, r // nr, r % nr, w, rstd_s, c, dx3, dw_parts, p,
                                 rn // nr, rn % nr)


def _rms_bwd_v5(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts):
    """v5: the common call runs ``_rms_bwd_pipelined`` (when every saved rstd is in the range
    its unscaled sums allow), every other call v3 (a Python-level choice: one kernel holding both
    paths is what v4 is). For those other calls v4 never pipelines, so it runs v3's operations;
    v3 compiles in about half of v4's time."""
    if (has_rstd and kf == x3.shape[2] and want_dw and not want_db
            and _saved_rstd_in_range(rstd_in)):
        _rms_bwd_pipelined(dy3, x3, w, rstd_in, dx3, dw_parts)
    else:
        _rms_bwd_v3(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                    db_parts)


@njit(**_SER)
def _sum_parts(parts, out):
    """out_j = Σ_p parts[p, j] for p = 0, 1, 2, ... in order (serial: P·N adds, a few ms at
    most, and a serial loop compiles in a fraction of a parallel one's time)."""
    nparts, n = parts.shape
    for j in range(n):
        out[j] = 0.0
    for p in range(nparts):
        for j in range(n):
            out[j] += parts[p, j]


# ============================================================================================
# Fused residual add + RMSNorm. h = x + residual in float64 ("fp32-sum": never rounded before
# the statistic) or rounded to x's dtype first ("rounded-sum").
# ============================================================================================
@njit(**_INL)
def _h(x3, r3, b, i, j, rounded):
    h = to_f64(x3[b, i, j]) + to_f64(r3[b, i, j])
    if rounded:
        h = to_f64(from_f64(h, x3))  # R_x(x + r), back to float64 exactly
    return h


@njit(**_INL)
def _add_stats(x3, r3, b, i, rounded, eps, res3, store_res):
    """Σh² in 8 lanes, storing new_residual = R_res(h) on the way when asked -> (rstd_s, k)."""
    n = x3.shape[2]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    n8 = n - n % 8
    for j0 in range(0, n8, 8):
        h0 = _h(x3, r3, b, i, j0, rounded)
        h1 = _h(x3, r3, b, i, j0 + 1, rounded)
        h2 = _h(x3, r3, b, i, j0 + 2, rounded)
        h3 = _h(x3, r3, b, i, j0 + 3, rounded)
        h4 = _h(x3, r3, b, i, j0 + 4, rounded)
        h5 = _h(x3, r3, b, i, j0 + 5, rounded)
        h6 = _h(x3, r3, b, i, j0 + 6, rounded)
        h7 = _h(x3, r3, b, i, j0 + 7, rounded)
        if store_res:
            res3[b, i, j0] = from_f64(h0, res3)
            res3[b, i, j0 + 1] = from_f64(h1, res3)
            res3[b, i, j0 + 2] = from_f64(h2, res3)
            res3[b, i, j0 + 3] = from_f64(h3, res3)
            res3[b, i, j0 + 4] = from_f64(h4, res3)
            res3[b, i, j0 + 5] = from_f64(h5, res3)
            res3[b, i, j0 + 6] = from_f64(h6, res3)
            res3[b, i, j0 + 7] = from_f64(h7, res3)
        a0 += h0 * h0
        a1 += h1 * h1
        a2 += h2 * h2
        a3 += h3 * h3
        a4 += h4 * h4
        a5 += h5 * h5
        a6 += h6 * h6
        a7 += h7 * h7
    ss = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for j in range(n8, n):
        h = _h(x3, r3, b, i, j, rounded)
        if store_res:
            res3[b, i, j] = from_f64(h, res3)
        ss += h * h
    if SS_LO <= ss <= SS_HI:
        return 1.0 / math.sqrt(ss / n + eps), 0
    return _add_rstd_scaled(ss, x3, r3, b, i, rounded, eps)


@njit(**_SER)
def _add_rstd_scaled(ss, x3, r3, b, i, rounded, eps):
    """The scaled path of ``_rstd_from_sumsq``, on h (rare, not inlined)."""
    n = x3.shape[2]
    amax = 0.0
    for j in range(n):
        a = abs(_h(x3, r3, b, i, j, rounded))
        if not a <= amax:
            amax = a
    k = _scale_exponent(amax, eps)
    if k == 0:
        return 1.0 / math.sqrt(ss / n + eps), 0
    ss_s = 0.0
    for j in range(n):
        v = math.ldexp(_h(x3, r3, b, i, j, rounded), -k)
        ss_s += v * v
    return 1.0 / math.sqrt(ss_s / n + math.ldexp(eps, -2 * k)), k


@njit(**_PAR)
def _add_rms_fwd(x3, r3, rounded, w, eps, y3, res3, rstd_out):
    nr = x3.shape[1]
    for r in prange(x3.shape[0] * nr):
        b, i = r // nr, r % nr
        rstd_s, k = _add_stats(x3, r3, b, i, rounded, eps, res3, True)  # (1)-(2) on h
        rstd_out[r] = math.ldexp(rstd_s, -k)
        for j in range(x3.shape[2]):
            y3[b, i, j] = from_f64(_scaled(_h(x3, r3, b, i, j, rounded), k) * rstd_s * w[j], y3)


@njit(**_SER)
def _add_coef_from_hhat(dy3, x3, r3, b, i, rounded, w, rstd_s, k):
    """(1/N) Σ dxhat_j·hhat_j, hhat = (h·2^-k)·rstd_s: ``_coef_from_xhat`` on h."""
    n = x3.shape[2]
    c = 0.0
    for j in range(n):
        c += (to_f64(dy3[b, i, j]) * w[j]) * (_scaled(_h(x3, r3, b, i, j, rounded), k) * rstd_s)
    return c / n


@njit(**_PAR)
def _add_rms_bwd(dy3, dro3, has_dro, x3, r3, rounded, w, eps, has_rstd, rstd_in, dx3, dr3,
                 want_dw, dw_parts):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:
                rstd_s, k = _add_stats(x3, r3, b, i, rounded, eps, dr3, False)
            s = 0.0
            for j in range(n):  # Σ dxhat·h·2^-k (one lane: the fused backward is not benched)
                s += (to_f64(dy3[b, i, j]) * w[j]) * _scaled(_h(x3, r3, b, i, j, rounded), k)
            if SS_LO <= abs(s) <= SS_HI:
                c = s * rstd_s / n  # (6)
            else:  # as _coef: dxhat·h overflowed or lost digits, sum dxhat·hhat instead
                c = _add_coef_from_hhat(dy3, x3, r3, b, i, rounded, w, rstd_s, k)
            rstd = math.ldexp(rstd_s, -k)
            for j in range(n):
                g = to_f64(dy3[b, i, j])
                hhat = _scaled(_h(x3, r3, b, i, j, rounded), k) * rstd_s
                dh = rstd * (g * w[j] - hhat * c)  # (7) on h
                if has_dro:
                    dh += to_f64(dro3[b, i, j])  # h also feeds new_residual
                dx3[b, i, j] = from_f64(dh, dx3)
                dr3[b, i, j] = from_f64(dh, dr3)
                if want_dw:
                    dw_parts[p, j] += g * hhat  # (8)


# ============================================================================================
# LayerNorm, written like RMSNorm v2 (for the RMSNorm/LayerNorm comparison)
# ============================================================================================
@njit(**_INL)
def _ln_stats(x3, b, i, eps):
    """(mu, rstd): Σx in 8 lanes -> mu; (Σd, Σd²), d = x − mu, in 4+4 lanes; then
    var = (Σd² − (Σd)²/N)/N, the corrected two-pass formula (= the oracle's refined mu)."""
    n = x3.shape[2]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    n8 = n - n % 8
    for j in range(0, n8, 8):
        a0 += to_f64(x3[b, i, j])
        a1 += to_f64(x3[b, i, j + 1])
        a2 += to_f64(x3[b, i, j + 2])
        a3 += to_f64(x3[b, i, j + 3])
        a4 += to_f64(x3[b, i, j + 4])
        a5 += to_f64(x3[b, i, j + 5])
        a6 += to_f64(x3[b, i, j + 6])
        a7 += to_f64(x3[b, i, j + 7])
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for j in range(n8, n):
        s += to_f64(x3[b, i, j])
    mu = s / n  # (1)
    a0 = a1 = a2 = a3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    n4 = n - n % 4
    for j in range(0, n4, 4):
        d0 = to_f64(x3[b, i, j]) - mu
        d1 = to_f64(x3[b, i, j + 1]) - mu
        d2 = to_f64(x3[b, i, j + 2]) - mu
        d3 = to_f64(x3[b, i, j + 3]) - mu
        a0 += d0
        a1 += d1
        a2 += d2
        a3 += d3
        q0 += d0 * d0
        q1 += d1 * d1
        q2 += d2 * d2
        q3 += d3 * d3
    sd = (a0 + a1) + (a2 + a3)
    sq = (q0 + q1) + (q2 + q3)
    for j in range(n4, n):
        d = to_f64(x3[b, i, j]) - mu
        sd += d
        sq += d * d
    mu_refined = mu + sd / n
    var = (sq - sd * (sd / n)) / n  # (3) biased variance about the refined mean
    return mu_refined, 1.0 / math.sqrt(var + eps)  # (4)


@njit(**_PAR)
def _ln_fwd(x3, w, bias, has_bias, eps, y3, mean_out, rstd_out):
    nr = x3.shape[1]
    for r in prange(x3.shape[0] * nr):
        b, i = r // nr, r % nr
        mu, rstd = _ln_stats(x3, b, i, eps)
        mean_out[r] = mu
        rstd_out[r] = rstd
        if has_bias:
            for j in range(x3.shape[2]):
                y3[b, i, j] = from_f64((to_f64(x3[b, i, j]) - mu) * rstd * w[j] + bias[j], y3)
        else:
            for j in range(x3.shape[2]):
                y3[b, i, j] = from_f64((to_f64(x3[b, i, j]) - mu) * rstd * w[j], y3)  # (5)-(6)


@njit(**_PAR)
def _ln_bwd(dy3, x3, w, eps, has_stats, mean_in, rstd_in, dx3, want_dw, want_db, dw_parts,
            db_parts):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    for p in prange(dw_parts.shape[0]):
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_stats:
                mu, rstd = mean_in[r], rstd_in[r]
            else:
                mu, rstd = _ln_stats(x3, b, i, eps)
            a0 = a1 = a2 = a3 = 0.0  # (8)-(9): Σ dxhat and Σ dxhat·(x − mu), 4+4 lanes
            q0 = q1 = q2 = q3 = 0.0
            n4 = n - n % 4
            for j in range(0, n4, 4):
                e0 = to_f64(dy3[b, i, j]) * w[j]
                e1 = to_f64(dy3[b, i, j + 1]) * w[j + 1]
                e2 = to_f64(dy3[b, i, j + 2]) * w[j + 2]
                e3 = to_f64(dy3[b, i, j + 3]) * w[j + 3]
                a0 += e0
                a1 += e1
                a2 += e2
                a3 += e3
                q0 += e0 * (to_f64(x3[b, i, j]) - mu)
                q1 += e1 * (to_f64(x3[b, i, j + 1]) - mu)
                q2 += e2 * (to_f64(x3[b, i, j + 2]) - mu)
                q3 += e3 * (to_f64(x3[b, i, j + 3]) - mu)
            s1 = (a0 + a1) + (a2 + a3)
            s2 = (q0 + q1) + (q2 + q3)
            for j in range(n4, n):
                e = to_f64(dy3[b, i, j]) * w[j]
                s1 += e
                s2 += e * (to_f64(x3[b, i, j]) - mu)
            c1 = s1 / n  # (8)
            c2 = s2 * rstd / n  # (9)
            for j in range(n):
                g = to_f64(dy3[b, i, j])
                xhat = (to_f64(x3[b, i, j]) - mu) * rstd  # (5)
                dx3[b, i, j] = from_f64(rstd * (g * w[j] - c1 - xhat * c2), dx3)  # (10)
                if want_dw:
                    dw_parts[p, j] += g * xhat  # (11)
                if want_db:
                    db_parts[p, j] += g


# ============================================================================================
# Python side: validation (rmsref._shapes), layouts, dtypes, launching
# ============================================================================================
class _Launcher:
    """Runs a parallel kernel; serialises launches only under Numba's workqueue layer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked = False
        self._serialise = True  # until the first launch tells us the threading layer

    def __call__(self, kernel: Callable[..., Any], *args: Any) -> None:
        if self._serialise:
            with self._lock:
                kernel(*args)
                if not self._checked:
                    import numba

                    self._serialise = numba.threading_layer() == "workqueue"
                    self._checked = True
        else:
            kernel(*args)


_launch = _Launcher()


def _check_real(a: np.ndarray, name: str) -> None:
    if a.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {a.dtype}; the numba_cpu backend computes float16, bfloat16, "
            "float32 and float64 (use the NumPy oracle, rmsref.rms_norm, for complex inputs)"
        )


def _checked(x: Any, normalized_shape: ShapeLike, **kwargs: Any) -> NormInputs:
    """The shared input contract (:func:`rmsref._shapes.prepare`: the oracle's checks, in the
    oracle's order), then this backend's own rule: real dtypes only."""
    a = prepare(x, normalized_shape, **kwargs)
    _check_real(a.x, "input")
    for name, arr in (("weight", a.weight), ("bias", a.bias), *a.others.items()):
        if arr is not None:
            _check_real(arr, name)
    return a


def _param_f64(p: np.ndarray | None) -> np.ndarray | None:
    """A checked per-feature parameter as a contiguous float64 (N,) row (O(N): a copy is fine)."""
    return None if p is None else np.ascontiguousarray(p, dtype=np.float64).reshape(-1)


def _weight_row(weight: np.ndarray | None, offset: float, n: int) -> np.ndarray:
    """offset + w as float64 (N,); ones (times 1 + offset) without a weight, as the oracle."""
    offset = resolve_offset(offset)
    if weight is None:
        return np.full(n, 1.0 + float(offset))
    return weight + float(offset) if offset else weight


def _bits(a: np.ndarray) -> np.ndarray:
    """The array the kernels see: itself, or a 16-bit integer view for half types (no copy)."""
    view = _HALF_VIEWS.get(a.dtype)
    return a if view is None else a.view(view)


def _result(out: Any, shape: tuple[int, ...], dtype: np.dtype, inputs: dict[str, Any]):
    """The array a kernel writes y or dx into: the caller's ``out`` (validated), else new."""
    arr = check_out(out, shape, dtype, inputs)
    return np.empty(shape, dtype) if arr is None else arr


def _written(rows3: np.ndarray, arr: np.ndarray) -> None:
    """Copy a kernel's (B, R, N) rows into ``arr`` unless they are ``arr``'s own memory (they
    are not only when ``out``'s layout made ``_rows3`` copy)."""
    into_out(rows3, _bits(arr), arr.shape)


def _rows3(arrays: list[np.ndarray], k: int) -> list[np.ndarray]:
    """(B, R, N) views of same-shaped arrays, one split (B, R) of the leading dims for all.

    Row r = b·R + i is row r of the C-order flattening of the leading dims. A contiguous array
    takes any split; strided rows/columns and two transposed leading dims find one; otherwise
    (rare) the arrays are copied to C order.
    """
    lead = arrays[0].shape[: arrays[0].ndim - k]
    n = int(np.prod(arrays[0].shape[arrays[0].ndim - k :]))
    flat = []
    for a in arrays:
        f = reshape_view(a, lead + (n,))
        flat.append(np.ascontiguousarray(a).reshape(lead + (n,)) if f is None else f)
    for cut in range(len(lead) + 1):
        split = (int(np.prod(lead[:cut])), int(np.prod(lead[cut:])), n)
        views = [reshape_view(f, split) for f in flat]
        if all(v is not None for v in views):
            return views  # type: ignore[return-value]
    m = int(np.prod(lead))
    return [np.ascontiguousarray(f).reshape(1, m, n) for f in flat]


def _stat_dtype(dtype: np.dtype) -> np.dtype:
    """Saved statistics: float32 for half inputs (as torch), float64 for float32/float64."""
    return np.dtype(np.float32) if dtype in _HALF_VIEWS else np.dtype(np.float64)


def _saved(arr: np.ndarray | None) -> np.ndarray | None:
    """A checked saved per-row statistic as a contiguous float64 (M,) array (O(M) copy)."""
    if arr is None:
        return None
    return np.ascontiguousarray(arr, dtype=np.float64).reshape(-1)


def _n_parts(m: int) -> int:
    return max(1, -(-m // ROWS_PER_PART))


def _param_grad(parts: np.ndarray, like: np.ndarray | None, shape: tuple[int, ...]):
    if like is None:
        return None
    out = np.empty(parts.shape[1])
    _sum_parts(parts, out)
    return round_to(out, like.dtype).reshape(shape)


# ---------------------------------------------------------------------------- RMSNorm
_RMS_FWD = {1: _rms_fwd_v1, 2: _rms_fwd_v2, 3: _rms_fwd_v3, 4: _rms_fwd_v4}
_RMS_BWD = {1: _rms_bwd_v1, 2: _rms_bwd_v2, 3: _rms_bwd_v3, 4: _rms_bwd_v4, 5: _rms_bwd_v5}
_DEFAULT_FWD = max(_RMS_FWD)  # the fastest correct one
_DEFAULT_BWD = max(_RMS_BWD)


def _rms_norm_forward(
    kernel: Callable[..., Any],
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
    out_dtype: Any = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    a = _checked(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                 partial=partial)
    x, shape, n, eps, kf, w_arr, bias = a.x, a.shape, a.n, a.eps, a.k_feat, a.weight, a.bias
    w = _weight_row(_param_f64(w_arr), a.offset, n)
    b = _param_f64(bias)
    dtype = resolve_out_dtype(out_dtype, x)
    _check_real(np.empty(0, dtype), "out_dtype")
    y = _result(out, x.shape, dtype, {"x": x, "weight": w_arr, "bias": bias})
    x3, y3 = _rows3([_bits(x), _bits(y)], len(shape))
    rstd = np.empty(x3.shape[0] * x3.shape[1], _stat_dtype(x.dtype))
    has_bias = b is not None
    _launch(kernel, x3, w, b if has_bias else w, has_bias, kf, eps, y3, rstd)
    _written(y3, y)
    return y, rstd.reshape(stat_shape(x, shape))


def _rms_norm_backward(
    kernel: Callable[..., Any],
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rstd: Any = None,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
    out: np.ndarray | None = None,
) -> RMSNormGrads:
    a = _checked(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                 partial=partial, others={"dy": dy}, stats={"rstd": rstd})
    x, dy, shape, n, eps, kf = a.x, a.others["dy"], a.shape, a.n, a.eps, a.k_feat
    w_arr, b_arr = a.weight, a.bias  # the bias enters neither dx nor dweight
    w = _weight_row(_param_f64(w_arr), a.offset, n)
    saved = _saved(a.stats["rstd"])
    dx = _result(out, x.shape, x.dtype, {"dy": dy, "x": x, "weight": w_arr, "rstd": rstd})
    dy3, x3, dx3 = _rows3([_bits(dy), _bits(x), _bits(dx)], len(shape))
    m = x3.shape[0] * x3.shape[1]
    nparts = _n_parts(m)
    want_dw, want_db = w_arr is not None, b_arr is not None
    dw_parts = np.empty((nparts, n) if want_dw else (nparts, 0))
    db_parts = np.empty((nparts, n) if want_db else (nparts, 0))
    has_rstd = saved is not None
    _launch(kernel, dy3, x3, w, kf, eps, has_rstd, saved if has_rstd else w, dx3, want_dw,
            want_db, dw_parts, db_parts)
    _written(dx3, dx)
    return RMSNormGrads(
        dx, _param_grad(dw_parts, w_arr, shape), _param_grad(db_parts, b_arr, shape)
    )


def rms_norm_forward(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
    out_dtype: Any = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm forward (the default variant): ``(y, rstd)``, as :func:`rmsref.rms_norm_forward`.

    Parameters
    ----------
    x : array_like
        float16, bfloat16, float32 or float64; any leading shape, any strides.
    normalized_shape, weight, eps, bias, offset, partial, out_dtype
        As in :func:`rmsref.rms_norm_forward`.
    out : numpy.ndarray, optional
        Where to write ``y`` (as :func:`rmsref.rms_norm`). With x's layout (``np.empty_like(x)``
        of the result dtype) the kernel writes it in place, which saves allocating and
        first-touching a new array: on large inputs that is a third of the call's time
        (bench/cpu.py). Reuse one across calls of the same shape.

    Returns
    -------
    y : numpy.ndarray
        Shape of ``x``, dtype ``out_dtype`` (default ``x.dtype``), rounded once; ``out`` when
        given, else C-contiguous.
    rstd : numpy.ndarray
        Shape ``x.shape[:-k] + (1,)*k``; float32 for half inputs, float64 otherwise.
    """
    return _rms_norm_forward(
        _RMS_FWD[_DEFAULT_FWD], x, normalized_shape, weight, eps, bias=bias, offset=offset,
        partial=partial, out_dtype=out_dtype, out=out,
    )


def rms_norm(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """RMSNorm (torch semantics), as :func:`rmsref.rms_norm`.

    Parameters
    ----------
    x, normalized_shape, weight, eps
        As in :func:`rmsref.rms_norm`.
    out : numpy.ndarray, optional
        Where to write y, as in :func:`rms_norm_forward`.

    Returns
    -------
    numpy.ndarray
        y in ``x``'s dtype (``out`` when given).
    """
    return rms_norm_forward(x, normalized_shape, weight, eps, out=out)[0]


def rms_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rstd: Any = None,
    bias: Any = None,
    offset: float = 0.0,
    partial: float | None = None,
    out: np.ndarray | None = None,
) -> RMSNormGrads:
    """RMSNorm backward (the default variant), as :func:`rmsref.rms_norm_backward`.

    Parameters
    ----------
    dy, x, normalized_shape, weight, eps, rstd, bias, offset, partial
        As in :func:`rmsref.rms_norm_backward`. A given ``rstd`` is used as is.
    out : numpy.ndarray, optional
        Where to write dx (x's shape and dtype), as in :func:`rms_norm_forward`.

    Returns
    -------
    RMSNormGrads
        ``(dx, dweight, dbias)``: dx in ``x``'s dtype (``out`` when given); dweight/dbias in
        the parameter's dtype (None without it), from float64 partial rows summed in a fixed
        order.
    """
    return _rms_norm_backward(
        _RMS_BWD[_DEFAULT_BWD], dy, x, normalized_shape, weight, eps, rstd=rstd, bias=bias,
        offset=offset, partial=partial, out=out,
    )


def variant(name: str, number: int) -> Callable[..., Any]:
    """Variant ``number`` of ``name`` ("rms_norm_forward" or "rms_norm_backward"), with the
    public signature; used by the tests and ``bench/cpu.py`` to check and time each one.

    Parameters
    ----------
    name : str
        The public function whose variant is wanted.
    number : int
        The variant number from the module docstring.

    Returns
    -------
    callable
        Same signature and results contract as the public function.
    """
    table = {"rms_norm_forward": (_RMS_FWD, _rms_norm_forward),
             "rms_norm_backward": (_RMS_BWD, _rms_norm_backward)}
    if name not in table:
        raise ValueError(f"no variants of {name!r}; variants exist for {', '.join(table)}")
    kernels, wrapper = table[name]
    if number not in kernels:
        raise ValueError(f"{name} has variants {sorted(kernels)}, not {number!r}")
    kernel = kernels[number]

    def run(*args: Any, **kwargs: Any) -> Any:
        return wrapper(kernel, *args, **kwargs)

    run.__name__ = f"{name}_v{number}"
    run.__doc__ = f"{name}, variant v{number} (see rmsref.kernels.numba_cpu)."
    return run


#: Variant numbers per function; the default is the highest (the fastest correct one).
VARIANTS: dict[str, tuple[int, ...]] = {
    "rms_norm_forward": tuple(_RMS_FWD),
    "rms_norm_backward": tuple(_RMS_BWD),
}


# ---------------------------------------------------------------------------- fused residual
def add_rms_norm_forward(
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    offset: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fused residual add + RMSNorm: ``(y, new_residual, rstd)``, as
    :func:`rmsref.add_rms_norm_forward`.

    Parameters
    ----------
    x, residual, normalized_shape, weight, eps, rounding, offset
        As in :func:`rmsref.add_rms_norm_forward`.

    Returns
    -------
    y, new_residual, rstd : numpy.ndarray
        y in x's dtype, new_residual = R_res(h) in residual's dtype, rstd as
        :func:`rms_norm_forward`'s (float32 for half x).
    """
    rounded = resolve_rounding(rounding)
    a = _checked(x, normalized_shape, weight=weight, eps=eps, offset=offset,
                 others={"residual": residual})
    x, res, shape, n, eps = a.x, a.others["residual"], a.shape, a.n, a.eps
    w = _weight_row(_param_f64(a.weight), a.offset, n)
    y = np.empty(x.shape, x.dtype)
    new_res = np.empty(x.shape, res.dtype)
    x3, r3, y3, nr3 = _rows3([_bits(x), _bits(res), _bits(y), _bits(new_res)], len(shape))
    rstd = np.empty(x3.shape[0] * x3.shape[1], _stat_dtype(x.dtype))
    _launch(_add_rms_fwd, x3, r3, rounded, w, eps, y3, nr3, rstd)
    return y, new_res, rstd.reshape(stat_shape(x, shape))


def add_rms_norm(
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    offset: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(y, new_residual)`` of :func:`add_rms_norm_forward`.

    Parameters
    ----------
    x, residual, normalized_shape, weight, eps, rounding, offset
        As in :func:`rmsref.add_rms_norm`.

    Returns
    -------
    y, new_residual : numpy.ndarray
    """
    y, new_res, _ = add_rms_norm_forward(
        x, residual, normalized_shape, weight, eps, rounding=rounding, offset=offset
    )
    return y, new_res


def add_rms_norm_backward(
    dy: Any,
    dresidual_out: Any,
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    rstd: Any = None,
    offset: float = 0.0,
) -> AddRMSNormGrads:
    """Backward of the fused residual add + RMSNorm, as :func:`rmsref.add_rms_norm_backward`.

    Parameters
    ----------
    dy, dresidual_out, x, residual, normalized_shape, weight, eps, rounding, rstd, offset
        As in :func:`rmsref.add_rms_norm_backward` (``dresidual_out`` may be None).

    Returns
    -------
    AddRMSNormGrads
        ``(dx, dresidual, dweight)``; dh = dx_RMSNorm(h) + dresidual_out, rounded to x's and to
        residual's dtype.
    """
    rounded = resolve_rounding(rounding)
    others = {"residual": residual, "dy": dy}
    if dresidual_out is not None:
        others["dresidual_out"] = dresidual_out
    a = _checked(x, normalized_shape, weight=weight, eps=eps, offset=offset, others=others,
                 stats={"rstd": rstd})
    x, res, dy, shape, n, eps = a.x, a.others["residual"], a.others["dy"], a.shape, a.n, a.eps
    dro, w_arr = a.others.get("dresidual_out"), a.weight
    w = _weight_row(_param_f64(w_arr), a.offset, n)
    saved = _saved(a.stats["rstd"])
    dx = np.empty(x.shape, x.dtype)
    dres = np.empty(x.shape, res.dtype)
    has_dro = dro is not None
    views = _rows3(
        [_bits(dy), _bits(dro if has_dro else dy), _bits(x), _bits(res), _bits(dx), _bits(dres)],
        len(shape),
    )
    dy3, dro3, x3, r3, dx3, dr3 = views
    m = x3.shape[0] * x3.shape[1]
    nparts = _n_parts(m)
    want_dw = w_arr is not None
    dw_parts = np.empty((nparts, n) if want_dw else (nparts, 0))
    has_rstd = saved is not None
    _launch(_add_rms_bwd, dy3, dro3, has_dro, x3, r3, rounded, w, eps, has_rstd,
            saved if has_rstd else w, dx3, dr3, want_dw, dw_parts)
    return AddRMSNormGrads(dx, dres, _param_grad(dw_parts, w_arr, shape))


# ---------------------------------------------------------------------------- LayerNorm
_LN_EPS = 1e-5


def layer_norm_forward(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = _LN_EPS,
    *,
    out_dtype: Any = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm forward: ``(y, mean, rstd)``, as :func:`rmsref.layer_norm_forward`.

    Parameters
    ----------
    x, normalized_shape, weight, bias, eps, out_dtype
        As in :func:`rmsref.layer_norm_forward`.
    out : numpy.ndarray, optional
        Where to write y, as in :func:`rms_norm_forward`.

    Returns
    -------
    y, mean, rstd : numpy.ndarray
        y rounded once to ``out_dtype`` (default x's dtype); mean and rstd float32 for half
        inputs, float64 otherwise. Not overflow-safe for float64 rows beyond ~1e150.
    """
    a = _checked(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=_LN_EPS)
    x, shape, n, eps, w_arr, bias = a.x, a.shape, a.n, a.eps, a.weight, a.bias
    w = _weight_row(_param_f64(w_arr), 0.0, n)
    b = _param_f64(bias)
    dtype = resolve_out_dtype(out_dtype, x)
    _check_real(np.empty(0, dtype), "out_dtype")
    y = _result(out, x.shape, dtype, {"x": x, "weight": w_arr, "bias": bias})
    x3, y3 = _rows3([_bits(x), _bits(y)], len(shape))
    m = x3.shape[0] * x3.shape[1]
    mean = np.empty(m, _stat_dtype(x.dtype))
    rstd = np.empty(m, _stat_dtype(x.dtype))
    has_bias = b is not None
    _launch(_ln_fwd, x3, w, b if has_bias else w, has_bias, eps, y3, mean, rstd)
    _written(y3, y)
    stat = stat_shape(x, shape)
    return y, mean.reshape(stat), rstd.reshape(stat)


def layer_norm(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = _LN_EPS,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """LayerNorm (torch semantics), as :func:`rmsref.layer_norm`.

    Parameters
    ----------
    x, normalized_shape, weight, bias, eps
        As in :func:`rmsref.layer_norm`.
    out : numpy.ndarray, optional
        Where to write y, as in :func:`rms_norm_forward`.

    Returns
    -------
    numpy.ndarray
        y in x's dtype (``out`` when given).
    """
    return layer_norm_forward(x, normalized_shape, weight, bias, eps, out=out)[0]


def layer_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    bias: Any = None,
    eps: float = _LN_EPS,
    *,
    mean: Any = None,
    rstd: Any = None,
    out: np.ndarray | None = None,
) -> LayerNormGrads:
    """LayerNorm backward, as :func:`rmsref.layer_norm_backward`.

    Parameters
    ----------
    dy, x, normalized_shape, weight, bias, eps, mean, rstd
        As in :func:`rmsref.layer_norm_backward` (pass both saved statistics or neither).
    out : numpy.ndarray, optional
        Where to write dx, as in :func:`rms_norm_forward`.

    Returns
    -------
    LayerNormGrads
        ``(dx, dweight, dbias)`` in the dtypes of x, weight, bias (None without them).
    """
    check_stat_pair(mean, rstd)
    a = _checked(x, normalized_shape, weight=weight, bias=bias, eps=eps, eps_default=_LN_EPS,
                 others={"dy": dy}, stats={"mean": mean, "rstd": rstd})
    x, dy, shape, n, eps, w_arr, b_arr = (a.x, a.others["dy"], a.shape, a.n, a.eps, a.weight,
                                          a.bias)
    w = _weight_row(_param_f64(w_arr), 0.0, n)
    saved_mean, saved_rstd = _saved(a.stats["mean"]), _saved(a.stats["rstd"])
    dx = _result(out, x.shape, x.dtype, {"dy": dy, "x": x, "weight": w_arr, "mean": mean,
                                         "rstd": rstd})
    dy3, x3, dx3 = _rows3([_bits(dy), _bits(x), _bits(dx)], len(shape))
    m = x3.shape[0] * x3.shape[1]
    nparts = _n_parts(m)
    want_dw, want_db = w_arr is not None, b_arr is not None
    dw_parts = np.empty((nparts, n) if want_dw else (nparts, 0))
    db_parts = np.empty((nparts, n) if want_db else (nparts, 0))
    has_stats = saved_rstd is not None
    _launch(_ln_bwd, dy3, x3, w, eps, has_stats, saved_mean if has_stats else w,
            saved_rstd if has_stats else w, dx3, want_dw, want_db, dw_parts, db_parts)
    _written(dx3, dx)
    return LayerNormGrads(
        dx, _param_grad(dw_parts, w_arr, shape), _param_grad(db_parts, b_arr, shape)
    )
