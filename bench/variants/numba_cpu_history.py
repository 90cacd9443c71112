r"""The Numba CPU RMSNorm kernels as they were written on the way to the library's defaults.

``rmsref.kernels.numba_cpu`` ships only what it runs: forward v5 and backward v6 (with the v4
and v3 loops they fall back to). The versions before them live here, with the library's public
signatures, so that ``bench/cpu.py`` can time each one and ``tests/test_variants.py`` can check
each one against the oracle (and the pipelined ones against v3, bit for bit). They use the
library's row helpers (its private names) so that the shared steps are the same code.

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
        same order: the bits of v3), so a core streams reads and writes at once.
    v5  as v4, but the common call (K = N, no bias) gets a kernel of its own
        (``_rms_fwd_pipelined``: every row of a block through the pipelined loop, no branch for
        the other calls) and the rest run v4. Its rare rows (a scaled float64 row, a half row
        outside the float32 route) are only flagged by the loop and written again after it
        (``_rms_fwd_redo``, v4's row code): v4's bits, and a first call that compiles neither
        v4's unpipelined rows nor the rare paths. (the library's default)
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
        smaller loop with fewer spills. (Its rare rows are now flagged by the loop and written
        again after it, by ``_rms_bwd_redo``: the same bits, a faster first call.)
    v6  as v5, and a call without a saved rstd takes the pipelined kernel too: its rows' rstd
        are first computed with the forward's code (``_rms_rstd``, the values v3 recomputes),
        one more read of x. Its first call then compiles neither v3 nor v3's recomputation.
        A float16 call whose weight allows it computes dx in float32, compensated
        (``_dx_f32``), in its pipelined kernel and in v3 alike; v1-v5 here keep the float64
        dx. (the library's default)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from numba import njit

from rmsref.kernels._halfbits import to_f64, work_row
from rmsref.kernels.numba_cpu import (
    _INL,
    _PAR,
    ROWS_PER_PART,
    _bwd_dx_exact,
    _bwd_row_and_dot,
    _coef,
    _dot_v1,
    _dot_v3,
    _rms_bwd_common,
    _rms_bwd_row,
    _rms_bwd_v3,
    _rms_bwd_v6,
    _rms_fwd_v4,
    _rms_fwd_v5,
    _rms_norm_backward,
    _rms_norm_forward,
    _rms_write,
    _rstd_from_sumsq,
    _rstd_saved,
    _saved_rstd_in_range,
    _sumsq_v3,
    _zero_part,
)

__all__ = ["VARIANTS", "variant"]


# ============================================================================================
# Row reductions of v1 and v2 (v3's 64 lanes are the library's ``_sumsq_v3``/``_dot_v3``).
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


# ============================================================================================
# Forward v1-v3 (v4, v5: the library's ``_rms_fwd_v4``, ``_rms_fwd_v5``). x3, y3: (B, R, N).
# ============================================================================================
@njit(**_PAR)
def _rms_fwd_v1(x3, w, bias, has_bias, kf, eps, y3, rstd_out, t0, t1):
    nr = x3.shape[1]
    ww = work_row(w, x3, y3)  # w' in the working precision (the library's, for its y)
    for r in range(t0, t1):  # this call's share of the tasks (``_launch``)
        b, i = r // nr, r % nr
        ss = _sumsq_v1(x3, b, i, kf)  # (1) Σx², one accumulator
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
        rstd_out[r] = math.ldexp(rstd_s, -k)
        _rms_write(x3, b, i, w, ww, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


@njit(**_PAR)
def _rms_fwd_v2(x3, w, bias, has_bias, kf, eps, y3, rstd_out, t0, t1):
    nr = x3.shape[1]
    ww = work_row(w, x3, y3)  # w' in the working precision (the library's, for its y)
    for r in range(t0, t1):  # this call's share of the tasks (``_launch``)
        b, i = r // nr, r % nr
        ss = _sumsq_v2(x3, b, i, kf)  # (1) Σx², 8 lanes
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
        rstd_out[r] = math.ldexp(rstd_s, -k)
        _rms_write(x3, b, i, w, ww, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


@njit(**_PAR)
def _rms_fwd_v3(x3, w, bias, has_bias, kf, eps, y3, rstd_out, t0, t1):
    nr = x3.shape[1]
    ww = work_row(w, x3, y3)  # w' in the working precision (the library's, for its y)
    for r in range(t0, t1):  # this call's share of the tasks (``_launch``)
        b, i = r // nr, r % nr
        ss = _sumsq_v3(x3, b, i, kf)  # (1) Σx², 64 lanes
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
        rstd_out[r] = math.ldexp(rstd_s, -k)
        _rms_write(x3, b, i, w, ww, bias, has_bias, y3, rstd_s, k)  # (3)-(4)


# ============================================================================================
# Backward v1, v2, v4, v5 (v3 and v6 are the library's ``_rms_bwd_v3``/``_rms_bwd_v6``).
# ============================================================================================
@njit(**_PAR)
def _rms_bwd_v1(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) recomputed
                rstd_s, k = _rstd_from_sumsq(_sumsq_v1(x3, b, i, kf), x3, b, i, kf, eps)
            s = _dot_v1(dy3, x3, b, i, w, x3.shape[2], k)
            _rms_bwd_row(dy3, x3, b, i, w, None, kf, rstd_s, k, s, dx3, want_dw, want_db,
                         dw_parts, db_parts, p)


@njit(**_PAR)
def _rms_bwd_v2(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) recomputed with the forward's code
                rstd_s, k = _rstd_from_sumsq(_sumsq_v2(x3, b, i, kf), x3, b, i, kf, eps)
            s = _dot_v2(dy3, x3, b, i, w, x3.shape[2], k)
            _rms_bwd_row(dy3, x3, b, i, w, None, kf, rstd_s, k, s, dx3, want_dw, want_db,
                         dw_parts, db_parts, p)


@njit(**_PAR)
def _rms_bwd_v4(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1):
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    # the pipelined loop covers the common call (saved rstd, K = N, a weight, no bias); each
    # helper is inlined once (compile time)
    fuse = has_rstd and kf == n and want_dw and not want_db
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
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
                s_next, outside = _bwd_row_and_dot(dy3, x3, b, i, w, rstd_s, c, dx3,
                                                   dw_parts, p, (r + 1) // nr, (r + 1) % nr)
                if outside:  # a half dx outside the normal range: the row again, exactly
                    _bwd_dx_exact(dy3, x3, b, i, w, rstd_s, c, dx3)
            else:
                _rms_bwd_row(dy3, x3, b, i, w, None, kf, rstd_s, k, s, dx3, want_dw, want_db,
                             dw_parts, db_parts, p)


def _rms_bwd_v5(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1):
    """v5: the common call with a saved rstd runs ``_rms_bwd_pipelined``, every other call v3."""
    if (has_rstd and kf == x3.shape[2] and want_dw and not want_db
            and _saved_rstd_in_range(rstd_in)):
        _rms_bwd_common(dy3, x3, w, rstd_in, dx3, dw_parts, t0, t1)
    else:
        _rms_bwd_v3(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                    db_parts, t0, t1)


_RMS_FWD = {1: _rms_fwd_v1, 2: _rms_fwd_v2, 3: _rms_fwd_v3, 4: _rms_fwd_v4, 5: _rms_fwd_v5}
_RMS_BWD = {1: _rms_bwd_v1, 2: _rms_bwd_v2, 3: _rms_bwd_v3, 4: _rms_bwd_v4, 5: _rms_bwd_v5,
            6: _rms_bwd_v6}

#: Variant numbers per function; the highest is the library's default.
VARIANTS: dict[str, tuple[int, ...]] = {
    "rms_norm_forward": tuple(_RMS_FWD),
    "rms_norm_backward": tuple(_RMS_BWD),
}


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
        Same signature and results contract as the public function of
        ``rmsref.kernels.numba_cpu``.
    """
    table = {"rms_norm_forward": (_RMS_FWD, _rms_norm_forward),
             "rms_norm_backward": (_RMS_BWD, _rms_norm_backward)}
    if name not in table:
        raise ValueError(f"no variants of {name!r}; variants exist for {', '.join(table)}")
    kernels, wrapper = table[name]
    if number not in kernels:
        raise ValueError(f"{name} has variants {sorted(kernels)}, not {number!r}")
    kernel = kernels[number]

    if name == "rms_norm_forward" and number < 4:  # v1-v3 run a task per row
        kwargs_task = {"rows_per_task": 1}
    else:
        kwargs_task = {}

    import inspect

    from rmsref.kernels import numba_cpu

    signature = inspect.signature(getattr(numba_cpu, name))  # the public function's defaults

    def run(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return wrapper(kernel, *bound.args, **kwargs_task, **bound.kwargs)

    run.__name__ = f"{name}_v{number}"
    run.__doc__ = f"{name}, variant v{number} (see bench.variants.numba_cpu_history)."
    return run
