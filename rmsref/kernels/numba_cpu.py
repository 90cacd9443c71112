r"""Numba-parallel CPU kernels for RMSNorm (and LayerNorm, written the same way for comparison).

``rmsref.backend("numba_cpu")`` is this module: the oracle's function names and signatures
(docs/kernels.md), computed by serial ``@njit(nogil=True)`` kernels run on several threads
(``_Launcher``: each thread a contiguous range of the kernel's tasks). The math is the
oracle's, eqs. (1)-(9) of :mod:`rmsref.rmsnorm` and (1)-(11) of :mod:`rmsref.layernorm`; read
those first.
Arguments are checked by the oracle's own contract (:func:`rmsref._shapes.prepare`: the same
rules for eps, offset, partial, saved statistics, masked arrays, ``numpy.matrix`` and byte order,
in the same order, so both raise the same error for the same call), plus one rule of this
backend: real dtypes only (complex inputs are a ``TypeError``; use the oracle).

Kernels
-------
RMSNorm forward
    ``_rms_fwd_v5``  tasks: blocks of ``ROWS_PER_BLOCK`` rows. A row's Σx² is summed in
                     ``LANES`` = 64 float64 lanes (element j into lane j mod 64, in increasing j),
                     which LLVM vectorises with fastmath off, and the lanes are combined by a
                     fixed halving tree (``_lane_tree``). The common call (no ``partial``, no
                     bias) runs ``_rms_fwd_pipelined``: one loop writes row r's y while summing
                     row r + 1's squares (the same lanes in the same order, so the same bits as
                     summing that row alone); every other call runs ``_rms_fwd_v4`` (blocks
                     pipelined where they can be, the other rows one at a time).
RMSNorm backward
    ``_rms_bwd_v6``  rows in fixed parts of ``ROWS_PER_PART``, Σ dxhat·x in the same 64 lanes.
                     The common call (no ``partial``, no bias) runs a kernel of its
                     own that writes row r's dx and dweight terms while summing row r + 1's
                     Σ dxhat·x, after computing rstd (``_rms_rstd``) when none was saved; every
                     other call runs ``_rms_bwd_v3`` (the same lanes, a row at a time).
Rare rows of the common calls
    The pipelined RMSNorm and LayerNorm kernels only flag a rare row (a half output outside the
    float32 route, a scaled float64 row, a Σ dxhat·x outside [SS_LO, SS_HI] or a saved rstd
    of inf: ``_factored``) in a per-row array;
    after the kernel, ``_rms_fwd_redo``, ``_rms_bwd_redo``, ``_ln_fwd_redo`` or ``_ln_bwd_redo``
    writes the flagged rows again with the unpipelined row code, so they have its bits (and
    ``_rms_bwd_dweight_again`` sums the dweight row of a flagged part again: bfloat16's float32 dx
    route, ``_gx_exact``). Rare-path code then never enters the common kernels' compilation, and
    the row loop holds no call (a call site costs registers: the backward at N = 512 ran 6-19 %
    faster per element in cache without them). The fused residual kernels do the same
    (``_add_fwd_redo``, ``_add_bwd_redo``). A row of dy = ±0 (a token the loss leaves out) has
    Σ dxhat·x = +0 but is not rare and is not flagged (``_c_in_range``): c = +0 either way.
Fused residual add + RMSNorm and LayerNorm, written the same way
    ``_add_fwd_rows`` h = x + residual; Σh² in the 64 lanes, storing new_residual on the way;
                      a thread's rows pipelined as RMSNorm's (y of row r while Σh² of
                      row r + 1).
    ``_add_bwd_rows`` parts as RMSNorm's; Σ dxhat·h in the 64 lanes, then dx and dresidual.
                      The common call (a saved rstd, a weight) runs
                      ``_add_bwd_pipelined_rows`` (dh of row r while Σ dxhat·h of row r + 1).
                      Each is compiled once per rounding of h: ``like`` is None or a zero
                      of x's element type, so the rounding is a type of the element loops,
                      not a branch.
    ``_ln_fwd``       Σx in the 64 lanes -> mu; (Σd, Σd²), d = x − mu, in one pass (the
                      corrected two-pass variance, which is also the oracle's "refine mu once");
                      a thread's rows pipelined as one run (y of row r while Σx of row r + 1).
    ``_ln_bwd``       parts as RMSNorm's; (Σ dxhat, Σ dxhat·d) in the 64 lanes, then dx. The
                      common call (saved mean and rstd) runs ``_ln_bwd_pipelined``
                      (dx of row r while the sums of row r + 1).
A pipelined loop sums the next row in the same lanes and order as the row's own reduction, so a
row has the same bits whichever loop summed it (the tests check this against the unpipelined
kernels and across batch splits).
The 64 lanes are a stack array (``_lanes``), which LLVM keeps in vector registers where the
lane loop unrolls (an ``np.zeros`` array lived on the heap and was loaded and stored every 64
elements), and half-precision kernels ask LLVM for 512-bit vectors (``_wide_vectors_for``).
Neither changes an operation or its order, so neither changes a bit (``bench/bits.py``).

The version numbers in the names are those of the kernel history: the variants that led to the
RMSNorm kernels (forward v1-v4, backward v1-v6, each saying what changed) live in
``bench/variants/numba_cpu_history.py``, which ``bench/cpu.py`` times and ``tests/test_variants.py``
checks against the oracle.

Numerical contract
------------------
- Accumulation in float64 for every input dtype (Σx², Σ dxhat·x, LayerNorm's sums, the
  dweight/dbias partial rows). float32 and float64 outputs are float64 values rounded once to
  the output dtype with round-to-nearest-even, i.e. the ``torch`` convention of
  docs/semantics.md with a float64 statistic. The y/dx formulas are the oracle's but with
  x·rstd for x/sqrt(ms + eps): float32 outputs agree with the oracle rounded to float32 except
  for rare last-bit ties (tests: >= 99.9 % equal, rest within 1 ulp).
- Half outputs (bfloat16, float16) keep the float64 statistics, and take float32 for the last
  step, as torch's opmath does: RMSNorm's y is computed in float32 arithmetic,
  fl(fl(x·fl(rstd))·fl(w')) (x and a half weight are exact in float32); so is the fused add's y
  where x, the residual and y share a half format, with h = x + residual rounded to float32
  once (exact for the rounded sum), a row with an h·rstd of a nonzero h below float32's normal
  range written in float64 and rounded once; and so is LayerNorm's y without a bias,
  fl(fl(fl(fl(x − mu_hi) − mu_lo)·fl(rstd))·fl(w)), with the float64 mean in two float32 parts
  (``_mu_parts``: d = x − mu then keeps nearly 24 bits however much it cancels; a row where it
  might not, or where an (x − mu)·rstd could underflow, as in a row of mean 0, is written in
  float64 and rounded once). LayerNorm's dx, its y with a bias (y + b can cancel far below the
  float32 y's error), the fused add's other y and its dx and dresidual (dh, the same value
  rounded to x's and to the residual's dtype) are computed in float64 and rounded to float32
  first; the float32 value is then rounded (RNE) to the half type. RMSNorm dx, where
  dy, x and dx share a half format and the weight allows it (at most 13 significant bits for
  float16, 16 for bfloat16, as a weight of that format has: ``_f32_weight``), is computed in
  float32 arithmetic, compensated: dx = rstd·(g·w − x·(rstd·c)) with g·w exact, rstd·c carried
  in two float32 parts of one sign and each product added by a fused multiply-add, so the
  difference keeps 24 bits however much its terms cancel (``_dxhat_minus_proj``; a plain
  float32 dx, measured in bench/halfbwd.py, loses the contract below where dy lies along y);
  for bfloat16, whose exponent range is float32's, the difference is scaled by a power of
  two near rstd and dx by its inverse (``_dx_scale``), so that underflow inside cannot reach
  an ordinary dx. With other weights
  RMSNorm dx is computed in float64, rounded through float32. So an element may differ from
  the oracle's float64 value rounded once only where that value lies within a few float32 ulps
  of a half rounding boundary:
  >= 99.9 % of elements are bit-equal to the oracle's, the rest one ulp away
  (tests/test_numba_cpu_half.py, on every bit pattern and on dy along y), always within the
  tolerance model's bound (a dx cancelled below about 2^-34 of its projection term, which the
  float64 route keeps to 2^-41, can be further off in ulps of itself, not of that term;
  ``_f32_weight`` has the error bound). Float32 arithmetic is what brings a half forward near
  float32's time per element, and what makes the half backwards' arithmetic cheaper (bench/cpu.py,
  bench/halfrow.py, bench/halfbwd.py). A row with an output that rounds to inf or is NaN is
  written again in float64 and rounded once, so those rows have the oracle's bits (through
  float32, a value just below the tie between the largest finite half value and inf may round to
  inf where rounded once it is finite). So is, for y, a row whose rstd is outside [2^-100, 2^100],
  where float32 products could overflow or lose bits, or in which the float32 x·rstd of a nonzero
  x falls below float32's normal range (a tiny x beside large ones, whose y a large w' makes an
  ordinary half value). A row whose rstd or scaled |rstd·c| is outside [2^-100, 2^100] takes the
  float64 dx (``_f32_dx_row``). The float32 dx route gives dweight's terms as (dy·x)·rstd, dy·x
  exact, where the float64 route has dy·(x·rstd): for bfloat16 the float32 dy·x is exact only
  within float32's normal range, so a row with a nonzero |dy| or |x| whose square leaves it
  (``_gx_exact``, a bound from the row's smallest and largest magnitudes) has its part's dweight
  row summed again from float64 products (``_rms_bwd_dweight_again``). The pipelined loop sums
  the next row's Σ dxhat·x from the float32 dy·x too, as (dy·x)·w': with dy·x exact that
  product is exact in float64 (at most 32 or 35 significant bits), as (dy·w')·x is, so the
  sum has the float64 route's bits; a bfloat16 row outside ``_gx_exact`` is written again.
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
- Determinism and batch invariance: a kernel's tasks are blocks of ``ROWS_PER_BLOCK`` rows
  (forwards: a row gets the same operations wherever it falls in a block) or fixed parts of
  ``ROWS_PER_PART`` rows (backwards); every reduction inside a row is serial in a fixed order and
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
  converted per element in registers (``_halfbits``): to float32 exactly (bfloat16 by a shift,
  float16 by the CPU's F16C conversion where Numba's target has it, the integer route
  otherwise), to float64 from there; back by integer RNE on the float32 bits (bfloat16) or
  F16C (float16). Where the CPU has AVX512-BF16, the forward's pipelined bfloat16 y (into a
  contiguous output) rounds 64 float32 values at a time in hardware (``_y_lanes``,
  ``_halfbits.store_lanes``), whose rounding is the integer one's only for ±0 and normal
  values: a bound per row (``_y_normal``: the row's smallest nonzero |x| times rstd, and that
  times the smallest nonzero |w'|) shows every y of the row to be one, or sends the row to
  ``_rms_write``, which tests each element, so no bit depends on the CPU or on the bound; the
  same bound replaces the per-element test of x·rstd for underflow in that loop. The other
  pipelined loops' float32 bfloat16 outputs (into contiguous outputs: RMSNorm's and
  LayerNorm's dx, LayerNorm's y, the fused add's y and new residual, and its dx and
  dresidual; ``_bf16_by_cpu``,
  ``_add_by_cpu``) are rounded by the CPU too (``_halfbits.store_lanes_flushed``), where a
  bound per row is not to be had (a difference, or a sum with a bias): the store itself
  reports a subnormal (one ``vfpclassps`` per 16 values), and that row is written again
  with the integer rounding, so again no bit depends on the CPU.
  ``_halfbits.to_work``/``from_work``/``outside_work`` choose the working precision per output
  type, so one kernel source serves every dtype, and flag the rows to write again
  (``_rms_write_general``, ``_bwd_dx_exact``, ``_ln_write_exact``, ``_ln_dx_exact``,
  ``_add_write_scaled_row``, ``_add_dh_exact``). The fused residual add's y is computed or
  rounded through float32 too (above), and so is its new residual (h = x + residual) when x,
  the residual and the new residual share a half format (``sum_to``: the same bits as one
  rounding, a theorem), else it is rounded once from float64.
  Complex inputs are not supported here (use the oracle).
- Threads: ``thread_count()`` of them (``NUMBA_NUM_THREADS``, or ``numba.set_num_threads``);
  calls below ``SERIAL_BELOW`` elements run on the calling thread alone. Kernels are ``nogil``,
  so two Python threads may call them at once (they share the launcher's pool). No Numba
  threading layer (OpenMP, TBB, workqueue) is used or started, so forking after a call is
  safe, also for a child that then runs OpenMP code.
- Speed: ``bench/cpu.py`` times the default kernels (and the history's variants) against a
  parallel copy of the same bytes; the committed tables are in ``bench/results/cpu.md`` (and
  ``cpu-summary.md``).
- Compilation: lazy (first call per dtype and layout), ``cache=True`` (on-disk cache next to
  this file). Compile time grows with the inlined kernel body (the 64-lane loops are unrolled
  and vectorised by LLVM) and with every helper a kernel calls (each is compiled with it, used
  or not), which is why rare paths (bias and scaled rows of the forward write, the calls that
  are not pipelined, the rows written again) live in kernels of their own that the common
  calls never call, and why float32 and half kernels are compiled without the overflow-safe
  route they never need (``_rstd_from_sumsq``). A backward
  without a saved rstd computes it first (``_rms_rstd``) and runs the pipelined kernel, so its
  first call compiles two small kernels rather than v3's general one. ``bench/compile.py``
  measures each default kernel's cold first call (``bench/results/compile.md``). After editing
  ``_halfbits.py`` clear ``__pycache__/*.nb[ic]`` (Numba checks only the timestamp of the file
  holding the cached function). The kernels are serial (not ``parallel=True``), which halves a
  first call's compile time: Numba's parfor passes and gufunc wrapper took about half of it.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic, overload

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
    BF16_HW,
    BF16_HW_FLUSHED,
    F16_BITS,
    F32_BITS_TO_INF,
    TINY32,
    _fma,
    add_square,
    as_work,
    emit_block_keys,
    emit_lanes_max,
    from_f64,
    from_work,
    lost_in_row,
    magnitude_key,
    note_magnitude,
    outside_work,
    rounded_sum,
    smallest_magnitude,
    store_lanes,
    store_lanes_flushed,
    sum_to,
    to_f64,
    to_work,
    work_in_range,
    work_row,
)
from rmsref.layernorm import LayerNormGrads
from rmsref.rmsnorm import AddRMSNormGrads, RMSNormGrads

__all__ = [
    "ROWS_PER_PART",
    "add_rms_norm",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
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
#: Kernels: serial over a task range [t0, t1) (``_Launcher`` runs the ranges on threads).
_PAR = {"nogil": True, "cache": True, "error_model": "numpy"}
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


#: Lanes of the v3 reductions: element j of a row goes to lane j mod LANES. Every loop over a
#: row's 64-element blocks runs to n64 = n - n mod LANES, with the tail in a loop of its own:
#: written as range(0, n, LANES), the same loop was left scalar by LLVM, several times slower.
LANES = 64


def _stack_lanes(builder, t, aligned):
    """LANES zeroed values of LLVM type ``t`` on the stack (in the entry block: one array per
    call site, zeroed wherever the call is); a pointer to the first. ``aligned``: on a 64-byte
    boundary, so that no vector of them straddles a cache line: for a buffer that a loop
    stores and loads back, and for the forward's accumulators (the bfloat16 forward ran
    markedly slower with them unaligned); aligning the backward's made it slower (a realigned
    stack frame), so those are not (bench/results/cpu-summary.md)."""
    from llvmlite import ir
    from numba.core import cgutils

    lanes_t = ir.ArrayType(t, LANES)
    lanes = cgutils.alloca_once(builder, lanes_t)
    if aligned:
        lanes.align = CACHE_LINE
    builder.store(lanes_t(None), lanes)
    return builder.bitcast(lanes, t.as_pointer())


@intrinsic
def _zero_lanes(typingctx, dtype):
    """LANES zeros of ``dtype`` (np.float64, np.float32) on the stack of the kernel this is
    inlined into, as a pointer.

    ``np.zeros(LANES)`` put the lanes on the heap, and LLVM then kept them there: each 64
    elements of a row loaded and stored all 64 lanes (16 loads, 16 stores), and the stores
    may alias y or dx, so nothing moved them out of the loop. A stack array that never escapes
    is promoted to vector registers once the lane loop is unrolled: the same additions in the
    same order (the same bits), without the memory traffic.
    """
    elem = dtype.dtype  # np.float64 is typed as the class of float64

    def codegen(context, builder, signature, args):  # float32: a buffer (``_lanes32``)
        return _stack_lanes(builder, context.get_value_type(elem), elem == types.float32)

    return types.CPointer(elem)(dtype), codegen


@intrinsic
def _zero_lanes_aligned(typingctx, dtype):
    """``_zero_lanes`` on a 64-byte boundary (``_stack_lanes``)."""
    elem = dtype.dtype

    def codegen(context, builder, signature, args):
        return _stack_lanes(builder, context.get_value_type(elem), True)

    return types.CPointer(elem)(dtype), codegen


@intrinsic
def _key_lanes(typingctx, x3):
    """LANES zero keys (``_halfbits.magnitude_key``: uint16 for 16-bit x3, else uint32) on the
    stack, as a pointer (indexed like an array): a row's running maxima, as ``_lanes``."""
    from llvmlite import ir

    key = types.uint16 if x3.dtype.bitwidth == 16 else types.uint32

    def codegen(context, builder, signature, args):
        return _stack_lanes(builder, ir.IntType(key.bitwidth), False)

    return types.CPointer(key)(x3), codegen


@intrinsic
def _wide_vectors_for(typingctx, x3):
    """Ask LLVM for 512-bit vectors in the kernel this is called from when x3 holds a half
    type (16-bit views), by the function attribute "prefer-vector-width"="512".

    LLVM's default on AVX-512 CPUs is 256-bit vectors. A half kernel is limited by its
    conversions (half to float32 to float64, and back), which 512-bit vectors do twice as
    many of per instruction: bfloat16 forward and backward ran 15-20 % faster at 8192x4096.
    The float32 forward ran slower with them (1.6x the copy's time instead of 1.35x, a cause
    not found), so float32 and float64 kernels keep the default. Vector width never changes
    what an element or a lane computes, only how many are done at once; on a CPU without
    AVX-512 the attribute changes nothing.
    """
    wide = isinstance(x3, types.Array) and x3.dtype.bitwidth == 16

    def codegen(context, builder, signature, args):
        if wide:
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return types.none(x3), codegen


#: How far ahead of the elements a pipelined row loop works on it asks for memory, in bytes
#: (software prefetch, one request per 64-byte cache line of each 64-element block, for
#: every array the loop reads from memory or writes). Without it the loops stall on memory
#: that the CPU's own prefetchers fetch too late; with it the float32 kernels run at about a
#: copy's time and the half forwards come closer to it (bench/results/cpu-summary.md, "What
#: changed"). A copy that asks ahead the same way is faster than a plain one, so
#: ``bench/cpu.py`` times both and sets the kernels against the faster. 1-8 KiB ahead gave
#: about the same times. A request for an address past the array's end is harmless
#: (prefetches never fault); the addresses are the bytes that follow in memory, which are
#: the next elements for contiguous rows only.
PREFETCH_AHEAD = 2048
CACHE_LINE = 64


# pragma: no mutate start (a hint: no value depends on it, only the speed: bench/cpu.py)
def _prefetcher(write: bool):
    """An intrinsic ``f(a, idx, ahead)``: ask for the cache line ``ahead`` bytes past
    element ``a[idx]`` (``idx`` a tuple of indices), for reading or, when ``write``, for
    writing (LLVM's ``llvm.prefetch``; nothing on targets without such an instruction). A
    hint only: no value changes, and the address may lie outside the array."""

    @intrinsic
    def prefetch(typingctx, a, idx, ahead):
        from llvmlite import ir
        from numba.core import cgutils

        def codegen(context, builder, signature, args):
            aty = signature.args[0]
            arr = context.make_array(aty)(context, builder, args[0])
            indices = cgutils.unpack_tuple(builder, args[1])
            ptr = cgutils.get_item_pointer(context, builder, aty, arr, indices)
            i8p, i32, i64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)
            addr = builder.inttoptr(builder.add(builder.ptrtoint(ptr, i64), args[2]), i8p)
            fn = builder.module.declare_intrinsic(  # named for the pointer type llvmlite uses
                "llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
            # (address, 1 = write / 0 = read, locality 3 = keep in all levels, 1 = data)
            builder.call(fn, [addr, ir.Constant(i32, int(write)), ir.Constant(i32, 3),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.none(a, idx, types.intp), codegen

    return prefetch


_prefetch_read = _prefetcher(write=False)
_prefetch_write = _prefetcher(write=True)
# pragma: no mutate end


@intrinsic
def _block_bytes(typingctx, a):
    """The bytes of a 64-element block of array ``a``, as a constant of the compiled code
    (``a.itemsize`` is read from the array at run time, which left the prefetch loops below
    as loops with a trip count to test, not the two to eight requests they are). LLVM IR: as
    an overload it was a function of its own, compiled in 0.02-0.1 s (bench/compile.py)."""
    if not isinstance(a, types.Array):
        return None
    size = LANES * (a.dtype.bitwidth // 8)

    def codegen(context, builder, signature, args):
        return context.get_constant(types.intp, size)

    return types.intp(a), codegen


@njit(**_INL)
def _read_ahead(a, idx):
    """Ask for the cache lines PREFETCH_AHEAD bytes past the 64-element block at ``a[idx]``."""
    for off in range(0, _block_bytes(a), CACHE_LINE):
        _prefetch_read(a, idx, PREFETCH_AHEAD + off)


@njit(**_INL)
def _write_ahead(a, idx):
    """``_read_ahead`` for a block the loop will write."""
    for off in range(0, _block_bytes(a), CACHE_LINE):
        _prefetch_write(a, idx, PREFETCH_AHEAD + off)


@njit(**_INL)
def _lanes():
    """LANES float64 zeros in registers (see ``_zero_lanes``): the accumulators of a row.

    Inlined by Numba (``inline="always"``) so that the stack array belongs to the caller's
    frame: compiled as a function of its own, it would return a pointer into its own finished
    frame."""
    return carray(_zero_lanes(np.float64), LANES)


@njit(**_INL)
def _lanes_aligned():
    """``_lanes`` on a 64-byte boundary: the forward's pipelined row (``_write_and_sumsq``)."""
    return carray(_zero_lanes_aligned(np.float64), LANES)


@njit(**_INL)
def _lanes32():
    """LANES float32 zeros on the stack, as ``_lanes``: a block's values kept for a second
    loop over the block (``_bwd_row_and_dot_f32``)."""
    return carray(_zero_lanes(np.float32), LANES)


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
def _sumsq_v3(x3, b, i, kf):
    """Σ_{j<kf} x_j² in 64 lanes held in a small array (v3).

    Lane l sums x_j² for j ≡ l (mod 64) in increasing j (the tail of a row that is not a
    multiple of 64 goes into lanes 0, 1, ... last); the lanes are then combined by
    ``_lane_tree``. So no lane sums more than ceil(kf/64) terms: the effective length of the
    sum (docs/tolerances.md) is ceil(kf/64) + 6 (at most ceil(log2 kf) for kf <= 64, as empty lanes
    add exact zeros), within the 8-lane model ceil(kf/8) + 3 the tests use.
    The inner loop over the 64 lanes is element-wise (no reassociation), so LLVM's loop
    vectoriser turns it into packed float64 code (vcvtps2pd/vmulpd/vaddpd) with fastmath off;
    for float32 and half x the product and sum are one FMA with the same bits
    (``_halfbits.add_square``: x² is exact in float64).
    """
    acc = _lanes()
    kf64 = kf - kf % LANES
    for j0 in range(0, kf64, LANES):
        for lane in range(LANES):
            v = to_f64(x3[b, i, j0 + lane])
            acc[lane] = add_square(acc[lane], v, x3)
    for lane in range(kf - kf64):
        v = to_f64(x3[b, i, kf64 + lane])
        acc[lane] = add_square(acc[lane], v, x3)
    return _lane_tree(acc)


@njit(**_INL)
def _dot_v3(g3, x3, b, i, w, n, k):
    """Σ_j dxhat_j·x_j in 64 lanes, as ``_sumsq_v3`` (v3); a scaled row (k != 0) by v1."""
    if k != 0:  # a scaled float64 row: rare, keep it simple
        return _dot_v1(g3, x3, b, i, w, n, k)
    return _dot_lanes(g3, x3, b, i, w, n)


@njit(**_INL)
def _dot_lanes(g3, x3, b, i, w, n):
    """Σ_j dxhat_j·x_j of an unscaled row in the 64 lanes of ``_sumsq_v3``."""
    acc = _lanes()
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


def _rstd_from_sumsq(ss, x3, b, i, kf, eps):
    """(rstd_s, k) of a row from its Σ_{j<kf} x_j²: rstd = rstd_s·2^-k, xhat = (x·2^-k)·rstd_s.

    Eqs. (1)-(2). A float64 row whose Σx² left [SS_LO, SS_HI] (inputs near the ends of the
    exponent range; also zero/NaN/inf rows, which end with k = 0) is redone scaled by 2^-k
    (``_rstd_scaled``). A float32 or half row never needs it: its nonzero squares lie in
    [2^-298, 2^256), so Σx² is in range unless it is 0, NaN or inf, rows for which the
    scaled route gives the same rstd (0 and inf scale exactly; NaN stays NaN). Those kernels
    are compiled without the scaled route (its loops took ~0.2 s of their first call).
    Numba-compiled code only (an overload on x3's type, inlined).
    """
    raise NotImplementedError("_rstd_from_sumsq is only callable from Numba-compiled code")


@overload(_rstd_from_sumsq, inline="always", jit_options={"nogil": True, "error_model": "numpy"})
def _rstd_from_sumsq_impl(ss, x3, b, i, kf, eps):
    if x3.dtype != types.float64:
        return lambda ss, x3, b, i, kf, eps: (1.0 / math.sqrt(ss / kf + eps), 0)

    def checked(ss, x3, b, i, kf, eps):
        if SS_LO <= ss <= SS_HI:
            return 1.0 / math.sqrt(ss / kf + eps), 0
        return _rstd_scaled(ss, x3, b, i, kf, eps)

    return checked


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
def _rms_write(x3, b, i, w, ww, bias, has_bias, y3, rstd_s, k):
    """y_j = (x_j·rstd)·w'_j (+ b_j), rounded once. Eqs. (3)-(4). Unswitched by hand so the
    common loop has no per-element branch; that loop computes in the working precision
    (``ww``: w' in it, ``work_row``; float32 for a half output, see ``_halfbits.to_work``)."""
    if k == 0 and not has_bias and work_in_range(rstd_s, x3, y3):
        rstd_w = as_work(rstd_s, x3, y3)
        outside = False
        key = _key_lanes(x3)[0]  # the row's smallest nonzero |x_j|, for ``lost_in_row``
        for j in range(x3.shape[2]):
            yj = to_work(x3[b, i, j], y3) * rstd_w * ww[j]  # (3)-(4)
            y3[b, i, j] = from_work(yj, y3)
            outside |= outside_work(yj, y3)
            key = note_magnitude(key, x3[b, i, j], x3, y3)
        # a rare row: written again in float64, rounded by from_f64
        if outside or lost_in_row(key, rstd_w, x3, y3):
            _rms_write_general(x3, b, i, w, bias, has_bias, y3, rstd_s, k)  # (False, 0)
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


#: Rows per task of the forwards (v4 walks each block serially, pipelined row by row; v5's
#: kernel pipelines a thread's blocks as one run of rows).
ROWS_PER_BLOCK = 16


@njit(**_INL)
def _row_after(b, i, nr, last):
    """Row (b, i)'s successor in a (B, R, N) batch of R = nr rows per b, or (b, i) itself when
    ``last`` (the row of a block or part that a pipelined loop sums again, unused). A task's
    loops step their rows with it instead of dividing r by nr twice per row (this, with the
    forward storing rstd without ``ldexp`` when k = 0, took 11 % off a 512-element float32
    forward in cache: bench/results/cpu-summary.md)."""
    if last:
        return b, i
    return (b, i + 1) if i + 1 < nr else (b + 1, 0)


# pragma: no mutate start (jitted by a call below)
def _task_rows_py(m, t0, t1, rows_per_task):
    """Rows [r0, r1) of tasks [t0, t1) of ``rows_per_task`` rows each, in a batch of m rows
    (r1 <= r0 when the tasks hold no row): what one thread's call covers. Used by the kernels
    (``_task_rows``) and by the Python side that calls them."""
    return min(m, t0 * rows_per_task), min(m, t1 * rows_per_task)


# pragma: no mutate end
_task_rows = njit(**_INL)(_task_rows_py)


def _weight_floor(w: np.ndarray, x3: np.ndarray, y3: np.ndarray) -> np.float32 | None:
    """What routes the pipelined forward's y (``_write_and_sumsq``): for a bfloat16 y computed
    in float32 (x3 a half view or float32) into a C-contiguous y3 on a CPU that rounds to
    bfloat16 in hardware (``_halfbits.BF16_HW``), the smallest nonzero |w'_j| in float32 (inf
    if there is none), the weight's part of the row bound ``_y_normal``; else None, the
    element by element route. A type, so Numba compiles each kernel with one of the two loops
    (a branch on a value would compile both into every dtype's kernel: slower first calls,
    bench/compile.py)."""
    if not (BF16_HW and y3.dtype == BF16_BITS and y3.flags.c_contiguous
            and x3.dtype in (BF16_BITS, F16_BITS, np.dtype(np.float32))):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.abs(w.astype(np.float32))
    a = a[a != 0]
    return np.float32(a.min()) if a.size else np.float32(np.inf)


@njit(**_INL)
def _y_lanes(x3, b, i, j0, ww, y3, rstd_w, check_y, keys):
    """y_j = (x_j·rstd)·w'_j of row (b, i) for j in [j0, j0 + 64), bfloat16 computed in
    float32 (``rstd_w``, ``ww``), into 64 float32 lanes rounded in hardware by one
    ``store_lanes``; the block's x_j go into ``keys`` (``magnitude_key``) for the row's bound
    ``_y_normal``, in place of tests of each x·rstd for underflow (which cost as much as the
    rounding, bench/halfrow.py) and of each y_j for a subnormal (which the store flushes).
    Eqs. (3)-(4). Returns whether, with ``check_y``, a y_j is inf or NaN."""
    y_l = _lanes32()
    outside = False
    for lane in range(LANES):
        j = j0 + lane
        yj = to_work(x3[b, i, j], y3) * rstd_w * ww[j]  # (3)-(4)
        y_l[lane] = yj
        outside |= check_y & outside_work(yj, y3)
    store_lanes(y_l, y3, (b, i, j0))
    for lane in range(LANES):  # a loop of its own: 16-bit keys, 32 to an instruction
        key = magnitude_key(x3[b, i, j0 + lane])
        keys[lane] = key if key > keys[lane] else keys[lane]
    return outside


@njit(**_INL)
def _max_key(keys):
    """The largest of LANES keys (``_key_lanes``): the smallest nonzero magnitude's."""
    key = keys[0]
    for lane in range(1, LANES):
        key = keys[lane] if keys[lane] > key else key
    return key


@njit(**_INL)
def _y_normal(keys, rstd_w, w_floor, x3):
    """Whether every y_j of a row written by ``_y_lanes`` is ±0 or normal, and every x_j·rstd
    of a nonzero x_j normal: then ``store_lanes``'s hardware rounding gives the integer
    rounding's bits, and no x·rstd lost bits to underflow (``lost_in_row``). A bound from the
    row's smallest nonzero |x_j| (the maximum of ``keys``), m: rounding is monotonic, so
    |fl(x_j·rstd)| >= fl(m·rstd) for every nonzero x_j, and |y_j| >= fl(fl(m·rstd)·w_floor)
    where w'_j != 0 (``_weight_floor``; y_j is ±0 exactly where x_j or w'_j is). A row it fails
    (tiny values beside large ones, or tiny weights) is written again by ``_rms_write``, whose
    tests are exact (each y_j's, and ``lost_in_row``), so its bits do not depend on the bound."""
    xhat_min = np.float32(smallest_magnitude(_max_key(keys), x3) * rstd_w)
    return xhat_min >= TINY32 and np.float32(xhat_min * w_floor) >= TINY32


@njit(**_INL)
def _write_and_sumsq(x3, b, i, ww, y3, rstd_w, b1, i1, check_y, w_floor):
    """Row (b, i)'s y (no bias, unscaled, in the working precision: ``rstd_w``, ``ww``) while
    summing the squares of row (b1, i1) in the 64 lanes of ``_sumsq_v3``, in the same order
    (so the same bits as ``_sumsq_v3``; v4). Returns (Σx² of row (b1, i1), whether row (b, i)
    must be written again by ``_rms_write``: a y_j that needs the float64 route, an x·rstd
    lost to underflow (``lost_in_row``, on the row's keys), or, on the lanes route
    (``w_floor`` not None: ``_weight_floor``), a row outside ``_y_normal``'s bound).
    ``check_y`` (a constant at each call site) False leaves out the test of each y_j for inf
    and NaN, for calls where ``_y_bounded`` showed that no y_j can be either."""
    n = x3.shape[2]
    acc = _lanes_aligned()
    keys = _key_lanes(x3)
    outside = False
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):  # 64 elements of y, then 64 squares of the next row
        _read_ahead(x3, (b1, i1, j0))
        _write_ahead(y3, (b, i, j0))
        if w_floor is None:  # element by element
            for lane in range(LANES):
                j = j0 + lane
                yj = to_work(x3[b, i, j], y3) * rstd_w * ww[j]  # (3)-(4)
                y3[b, i, j] = from_work(yj, y3)
                outside |= check_y & outside_work(yj, y3)
            for lane in range(LANES):  # a loop of its own, as in ``_y_lanes``
                keys[lane] = note_magnitude(keys[lane], x3[b, i, j0 + lane], x3, y3)
        else:
            outside |= _y_lanes(x3, b, i, j0, ww, y3, rstd_w, check_y, keys)  # (3)-(4)
        for lane in range(LANES):  # a loop of its own: LLVM then keeps the lanes in registers
            v = to_f64(x3[b1, i1, j0 + lane])
            acc[lane] = add_square(acc[lane], v, x3)  # (1) of the next row
    for lane in range(n - n64):
        j = n64 + lane
        yj = to_work(x3[b, i, j], y3) * rstd_w * ww[j]
        y3[b, i, j] = from_work(yj, y3)
        outside |= check_y & outside_work(yj, y3)
        keys[lane] = note_magnitude(keys[lane], x3[b, i, j], x3, y3)  # either route
        v = to_f64(x3[b1, i1, j])
        acc[lane] = add_square(acc[lane], v, x3)
    if w_floor is None:
        outside |= lost_in_row(_max_key(keys), rstd_w, x3, y3)
    else:
        outside |= not _y_normal(keys, rstd_w, w_floor, x3)
    return _lane_tree(acc), outside


@njit(**_PAR)
def _rms_fwd_v4(x3, w, bias, has_bias, kf, eps, y3, rstd_out, t0, t1):
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    ww = work_row(w, x3, y3)  # w' in the working precision of the element-wise step
    fuse = kf == x3.shape[2] and not has_bias  # the common call: rows pipelined
    for blk in range(t0, t1):  # this call's share of the tasks (``_launch``)
        r0 = blk * ROWS_PER_BLOCK
        r1 = min(m, r0 + ROWS_PER_BLOCK)
        fused = False  # whether the previous row's loop summed this row's squares
        ss_next = 0.0
        b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
        for r in range(r0, r1):
            b1, i1 = _row_after(b, i, nr, r + 1 == r1)
            ss = ss_next if fused else _sumsq_v3(x3, b, i, kf)  # (1) Σx², 64 lanes
            rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, kf, eps)  # (2)
            rstd_out[r] = rstd_s if k == 0 else math.ldexp(rstd_s, -k)
            fused = fuse and k == 0 and r + 1 < r1 and work_in_range(rstd_s, x3, y3)
            if fused:  # write row r while summing row r + 1
                rstd_w = as_work(rstd_s, x3, y3)
                ss_next, outside = _write_and_sumsq(x3, b, i, ww, y3, rstd_w, b1, i1, True,
                                                    None)  # element by element (rare calls)
                if outside:  # a rare row: written again in float64 (has_bias is False here,
                    # k is 0; passed as variables, so this call shares _rms_write's compilation)
                    _rms_write_general(x3, b, i, w, bias, has_bias, y3, rstd_s, k)
            else:
                _rms_write(x3, b, i, w, ww, bias, has_bias, y3, rstd_s, k)  # (3)-(4)
            b, i = b1, i1


@njit(**_PAR)
def _rms_fwd_pipelined(x3, w, eps, y3, rstd_out, redo, w_floor, t0, t1):
    """v5's kernel: v4's pipelined loop for the common call only (K = N, no bias), with no
    branch for the other calls. The rows of blocks [t0, t1) are contiguous, so one loop runs
    through all of them: row r's y is written while row r + 1's squares are summed, across
    block boundaries too (the last row sums its own squares again, unused).

    A rare row is only flagged here (``redo[r]``: a float64 row whose Σx² needed the scale
    2^-k, a half row whose rstd is outside the float32 route's range, or one with a y that
    ``_write_and_sumsq`` could not round; its y are not tested for inf and NaN, which the
    weight rules out: ``_y_bounded``) and written again afterwards by ``_rms_fwd_redo``
    (``_rms_fwd_v5`` calls both); the loop's y for it is discarded. The rare paths' code then
    stays out of this kernel, whose first call compiles faster (bench/compile.py).
    ``w_floor`` (``_weight_floor``): None, or the weight's part of the bound that lets a
    bfloat16 y take the lanes route (``_y_lanes``; a row outside it is flagged too)."""
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    n = x3.shape[2]
    r0, r1 = _task_rows(x3.shape[0] * nr, t0, t1, ROWS_PER_BLOCK)
    if r1 <= r0:
        return
    ww = work_row(w, x3, y3)  # w' in the working precision of the element-wise step
    b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
    ss = _sumsq_v3(x3, b, i, n)  # (1) Σx² of the first row, 64 lanes
    for r in range(r0, r1):
        b1, i1 = _row_after(b, i, nr, r + 1 == r1)  # the row summed while r is written
        rstd_s, k = _rstd_from_sumsq(ss, x3, b, i, n, eps)  # (2)
        rstd_out[r] = rstd_s if k == 0 else math.ldexp(rstd_s, -k)
        rstd_w = as_work(rstd_s, x3, y3)
        ss, outside = _write_and_sumsq(x3, b, i, ww, y3, rstd_w, b1, i1, False,
                                       w_floor)  # (3)-(4), (1)
        redo[r] = outside or k != 0 or not work_in_range(rstd_s, x3, y3)
        b, i = b1, i1


@njit(**_SER)
def _rms_fwd_redo(x3, w, eps, y3, redo, r0, r1):
    """y of the rows in [r0, r1) that ``_rms_fwd_pipelined`` flagged, written again as v4
    writes a row it does not pipeline (``_rms_write``: the common loop where it applies,
    float64 rounded once where it does not), so with v4's bits. The rstd the loop saved
    stands (the same value). Compiled by the first call that flags a row."""
    nr = x3.shape[1]
    n = x3.shape[2]
    ww = work_row(w, x3, y3)
    for r in range(r0, r1):
        if redo[r]:
            b, i = r // nr, r % nr
            rstd_s, k = _rstd_from_sumsq(_sumsq_v3(x3, b, i, n), x3, b, i, n, eps)  # (1)-(2)
            _rms_write(x3, b, i, w, ww, w, False, y3, rstd_s, k)  # (3)-(4), no bias


def _y_bounded(w, y3) -> bool:
    """Whether no y of a row can round to inf or be NaN on the float32 route when the row's
    rstd is unscaled and in ``work_in_range`` (every other row is written again anyway), so
    that the loop need not test each y_j (``outside_work``): y3 does not hold a half type (its
    y are not on that route), or sqrt(N)·max|w| is at most half of T, the float32 value from
    which the half type's rounding goes to inf (``_halfbits.F32_BITS_TO_INF``).

    Why that suffices: Σx² in float64 is at least each x_j² (the squares are exact, and
    rounding a sum of nonnegative terms never makes it smaller than a term), so
    |x_j|·rstd <= sqrt(N) up to float64 rounding, and |y_j| <= sqrt(N)·max|w|·(1 + 2^-21)
    after the float32 roundings of rstd, w, x·rstd and y, which is below T. A NaN y needs a
    NaN or infinite x (then Σx² is NaN or inf, and rstd NaN or 0, outside the route's range)
    or a NaN or infinite w (then max|w| is no number below the bound). The test left out is a
    good part of a half forward's arithmetic per element (bench/halfrow.py;
    bench/results/cpu-summary.md)."""
    if y3.dtype not in (BF16_BITS, F16_BITS):
        return True
    to_inf = float(np.array([F32_BITS_TO_INF[y3.dtype]], np.uint32).view(np.float32)[0])
    return bool(math.sqrt(w.size) * np.max(np.abs(w), initial=0.0) <= to_inf / 2)


def _rms_fwd_v5(x3, w, bias, has_bias, kf, eps, y3, rstd_out, t0, t1):
    """v5: the common call (K = N, no bias) with a weight that keeps every y finite
    (``_y_bounded``) runs ``_rms_fwd_pipelined`` on blocks [t0, t1), then ``_rms_fwd_redo``
    for the rows it flagged (none in ordinary data); every other call runs v4 (a Python-level
    choice, as ``_rms_bwd_v6``: the first call of the common one then compiles neither v4's
    unpipelined rows nor the rare paths)."""
    if kf == x3.shape[2] and not has_bias and _y_bounded(w, y3):
        m = x3.shape[0] * x3.shape[1]
        r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_BLOCK)
        redo = np.empty(m, np.bool_)  # only rows [r0, r1) are written and read
        _rms_fwd_pipelined(x3, w, eps, y3, rstd_out, redo, _weight_floor(w, x3, y3), t0, t1)
        if redo[r0:r1].any():
            _rms_fwd_redo(x3, w, eps, y3, redo, r0, r1)
        return
    _rms_fwd_v4(x3, w, bias, has_bias, kf, eps, y3, rstd_out, t0, t1)


# ============================================================================================
# RMSNorm backward. dy3, x3, dx3: (B, R, N); rstd_in: (M,) float64 (unused unless has_rstd);
# dw_parts, db_parts: (P, N) float64 partial rows, P = ceil(M / ROWS_PER_PART).
# ============================================================================================
@njit(**_INL)
def _zero_part(parts, p):
    for j in range(parts.shape[1]):
        parts[p, j] = 0.0


@njit(**_INL)
def _factored(s, rstd_s):
    """Whether c = s·rstd_s/K is c = Σ dxhat·xhat/K as the oracle sums it, up to rounding:
    s within [SS_LO, SS_HI] and rstd_s not inf. (A saved rstd of inf, which a float32 rstd
    of a half row of x ~ 2^-128 with eps = 0 is, makes every xhat infinite or NaN, and the
    oracle's sum NaN where s·inf is ±inf.)"""
    return SS_LO <= abs(s) <= SS_HI and rstd_s < math.inf


@njit(**_INL)
def _coef(s, g3, x3, b, i, w, kf, rstd_s, k):
    """c of eq. (6), s·rstd_s/K from s = Σ_{j<K} dxhat_j·x_j·2^-k. Outside ``_factored`` (s
    left [SS_LO, SS_HI]: a dy so large that dxhat·x overflowed, or so small that it lost digits
    or underflowed to 0; also a zero dy row and a NaN row; or a saved rstd of inf) c is summed
    again in the oracle's order, Σ dxhat·xhat / K: rare rows only, so every other row keeps
    its bits (a zero dy row gets the same c = ±0 either way)."""
    if _factored(s, rstd_s):
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
def _c_in_range(s, rstd_s, g3, b, i):
    """Whether the pipelined backward's c = s·rstd_s/N of row (b, i) is ``_coef``'s (so the row
    need not be written again): ``_factored``, or s = 0 from a row of dy = ±0 (a
    token the loss leaves out) with a finite positive rstd. Every term of s is then ±0 and
    the sum starts from +0, so c = +0 also where ``_coef`` sums it again. (A half batch of
    such rows, written again one by one on one thread, took four times the call's time.)"""
    if _factored(s, rstd_s):
        return True
    if s != 0 or not 0 < rstd_s < math.inf:
        return False
    nonzero = False
    for j in range(g3.shape[2]):
        nonzero |= to_f64(g3[b, i, j]) != 0  # NaN too
    return not nonzero


#: The compensated float32 dx (``_dxhat_minus_proj``) takes a row whose rstd and scaled
#: |rstd·c| (``_dx_scale``) lie within 2^+-F32_DX_RANGE (``_f32_dx_row``): rstd·c then splits
#: into two float32 parts that carry it to 2^-47 of itself, and no product of a float16
#: element with them leaves float32's range.
F32_DX_RANGE = 100
#: The bits of a float64 that float32's 24 keep: the rest is cut off by ``_split32``.
_F32_HI_MASK = np.int64(-(1 << 29))


@njit(**_INL)
def _split32(v):
    """(hi, lo), two float32 with hi + lo = v to within 2^-47·|v|, for 2^-100 <= |v| <= 2^100:
    hi is v cut to float32's 24 bits (toward zero, exact), lo = fl32(v − hi) (v − hi is exact
    in float64) with v's sign also when it is zero. So hi and lo never have opposite signs,
    and the second multiply-add of ``_dxhat_minus_proj`` cannot turn a −0 into a +0 (rounding
    hi to nearest did, where dy_j = x_j = 0: the oracle's zero has its sign)."""
    hi = np.float32(np.int64(np.float64(v).view(np.int64) & _F32_HI_MASK).view(np.float64))
    return hi, np.float32(math.copysign(v - np.float64(hi), v))


@njit(**_INL)
def _dxhat_minus_proj(g, xj, wj, rc_hi, rc_lo):
    """dxhat_j − xhat_j·c = g·w − x·(rstd·c) in float32 arithmetic, eqs. (5)-(7), with xhat·c
    written x·(rstd·c): g·w is exact in float32 (a half g, a weight of few bits: ``_f32_weight``),
    and rstd·c is carried as rc_hi + rc_lo (``_split32``), each product with x added by a fused
    multiply-add (one rounding), so the difference keeps float32's 24 bits however much g·w and
    x·rstd·c cancel. dx_j = rstd·(the difference)."""
    t = _fma(-xj, rc_hi, g * wj)  # dxhat − x·rc_hi, rounded once
    return _fma(-xj, rc_lo, t)  # − the rest of x·rstd·c


@njit(**_INL)
def _f32_dx_row(rstd_s, rc):
    """Whether a row may take the float32 dx: rstd within 2^+-F32_DX_RANGE (False for 0 and
    NaN) and rc = rstd·c·2^e (``_dx_scale``) too, or 0 (a row of dy = 0: dx = rstd·dy·w)."""
    lo, hi = 2.0**-F32_DX_RANGE, 2.0**F32_DX_RANGE
    return lo <= rstd_s <= hi and (lo <= abs(rc) <= hi or rc == 0)


@intrinsic
def _dx_exponent(typingctx, rstd_s, dx3):
    """e of ``_dx_scale``: 0 for a float16 dx (a constant, so the scaling folds away), for a
    bfloat16 dx the binary exponent of rstd (rstd·2^-e in [1/2, 1)) kept within
    [0, F32_DX_RANGE]. (LLVM IR, as the other route helpers here: each Numba helper a kernel
    calls adds to its first call, bench/compile.py.)"""
    from llvmlite import ir

    if rstd_s != types.float64 or not isinstance(dx3, types.Array):
        return None
    bf16 = dx3.dtype == types.int16

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        if not bf16:
            return ir.Constant(i64, 0)
        field = builder.and_(builder.lshr(builder.bitcast(args[0], i64), ir.Constant(i64, 52)),
                             ir.Constant(i64, 0x7FF))
        e = builder.sub(field, ir.Constant(i64, 1022))
        e = builder.select(builder.icmp_signed("<", e, ir.Constant(i64, 0)), ir.Constant(i64, 0), e)
        top = ir.Constant(i64, F32_DX_RANGE)
        return builder.select(builder.icmp_signed(">", e, top), top, e)

    return types.int64(rstd_s, dx3), codegen


@njit(**_INL)
def _dx_scale(rstd_s, c, dx3):
    """A row's factors for the float32 dx: (2^e in float32, rstd·2^-e, rstd·c·2^e), all exact
    (powers of two), with e from ``_dx_exponent``. The route computes
    dx = (rstd·2^-e)·(g·2^e·w − x·rstd·c·2^e), which is rstd·(g·w − x·rstd·c) scaled inside
    and out. Why: with bfloat16's exponent range the difference can fall below float32's
    normal range while dx does not, where each rounding errs by up to 2^-150 absolutely, and
    rstd (up to 2^100) would multiply that error into an ordinary dx. Scaled, the factor
    outside is below 1 and the error stays below 2^-148. float16 needs no scaling (its
    smallest spacing, 2^-24, is far above rstd·2^-150) and gets e = 0: its bits as before."""
    e = _dx_exponent(rstd_s, dx3)
    return np.float32(_pow2(e)), rstd_s * _pow2(-e), (rstd_s * c) * _pow2(e)


@njit(**_INL)
def _pow2(e):
    """2^e as a float64, for |e| <= 1022, from its bits: no call in the row loop (as
    ``math.ldexp`` is), and 2^0 a constant that LLVM folds where e is one."""
    return np.int64((e + 1023) << 52).view(np.float64)


@intrinsic
def _gx_keys(typingctx, lo, hi, g3, x3, idx, dx3):
    """For a bfloat16 dx on the float32 route, the keys of row (b, i)'s block [j0, j0 + 64)
    (``idx``) of dy and x together in the 64 lanes ``lo``, ``hi`` (``_key_lanes``): running
    maxima from which ``_gx_exact`` reads the smallest nonzero and the largest magnitude
    (``_halfbits.emit_block_keys``). Nothing for float16."""
    if not (isinstance(dx3, types.Array) and isinstance(g3, types.Array)):
        return None
    bf16 = dx3.dtype == types.int16

    def codegen(context, builder, signature, args):
        if bf16:
            emit_block_keys(context, builder, signature.args[2], args[2], signature.args[3],
                            args[3], args[4], args[0], args[1])
        return context.get_dummy_value()

    return types.none(lo, hi, g3, x3, idx, dx3), codegen


@intrinsic
def _gx_exact(typingctx, lo, hi, dx3):
    """Whether every float32 g·x of a row whose blocks ``_gx_keys`` saw is exact, so that
    dweight's terms (g·x)·rstd taken from them are the float64 ones: always for float16 (11
    and 11 significant bits, within 2^+-32); for bfloat16 (8 and 8 bits, float32's exponent
    range) when the square of the smallest nonzero magnitude among the row's g and x is
    normal and that of the largest is finite (every nonzero |g|, |x| in about
    [2^-63, 2^64)): every nonzero g·x then lies between the two squares, and 16 significant
    bits are exact there. A bound on the row, not a test of each product (slower, in cache:
    bench/halfrow.py); a row outside it has its part's dweight summed again from float64
    products."""
    from llvmlite import ir

    if not isinstance(dx3, types.Array):
        return None
    bf16 = dx3.dtype == types.int16

    def codegen(context, builder, signature, args):
        if not bf16:
            return ir.Constant(ir.IntType(1), 1)
        i16, i32, f32 = ir.IntType(16), ir.IntType(32), ir.FloatType()

        def value(bits):  # bfloat16 magnitude bits -> float32
            return builder.bitcast(builder.shl(builder.zext(bits, i32), ir.Constant(i32, 16)),
                                   f32)

        key = emit_lanes_max(builder, args[0])
        small = builder.select(builder.icmp_unsigned("==", key, ir.Constant(i16, 0)),
                               ir.Constant(f32, float("inf")),  # no nonzero element
                               value(builder.and_(builder.neg(key), ir.Constant(i16, 0x7FFF))))
        large = value(emit_lanes_max(builder, args[1]))
        normal = builder.fcmp_ordered(">=", builder.fmul(small, small),
                                      ir.Constant(f32, 2.0**-126))
        finite = builder.fcmp_ordered("<", builder.fmul(large, large),
                                      ir.Constant(f32, float("inf")))
        return builder.and_(normal, finite)

    return types.boolean(lo, hi, dx3), codegen


@njit(**_INL)
def _dweight_term(g, xj, xhat, rstd_s, w32):
    """Eq. (8)'s term of element j, dy_j·xhat_j: g·xhat on the float64 route (``w32`` None),
    (g·x)·rstd on the float32 one, g·x exact in float64 (so the float32 loop can keep a block's
    g and x in float32 for a float64 loop of its own). Which one is fixed by ``w32``'s type."""
    if w32 is None:
        return g * xhat
    return (g * xj) * rstd_s


@njit(**_INL)
def _rms_bwd_row(g3, x3, b, i, w, w32, kf, rstd_s, k, s, dx3, want_dw, want_db, dw_parts,
                 db_parts, p):
    """dx of one row and its contribution to the part's dweight/dbias rows, given
    s = Σ dxhat·x·2^-k. Eqs. (5)-(9). ``w32``: None, or the weight in float32 for the float32
    dx route (``_f32_weight``), which a row takes where ``_f32_dx_row`` allows."""
    n = x3.shape[2]
    c = _coef(s, g3, x3, b, i, w, kf, rstd_s, k)  # (6) c = (1/K) Σ dxhat·xhat
    if k == 0 and kf == n:
        if w32 is not None and _f32_dx_row(rstd_s, _dx_scale(rstd_s, c, dx3)[2]):
            outside = _dx_f32_row(g3, x3, b, i, w32, rstd_s, c, dx3)
            if want_dw or want_db:
                for j in range(n):
                    g = to_f64(g3[b, i, j])
                    if want_dw:
                        dw_parts[p, j] += _dweight_term(g, to_f64(x3[b, i, j]), 0.0, rstd_s,
                                                        w32)  # (8)
                    if want_db:
                        db_parts[p, j] += g  # (9)
            if outside:  # a rare row: dx again, rounded once by from_f64
                _bwd_dx_exact(g3, x3, b, i, w, rstd_s, c, dx3)
            return
        # The common row, unswitched by hand: no per-element scaling test or K test, so the loop
        # vectorises (with them it does not, and the row costs well above the copy time).
        # Same operations as the general loop below, so the same float64 dx; a half dx is
        # rounded to it through float32 (``as_work``; exact rows again by ``_bwd_dx_exact``).
        outside = False
        for j in range(n):
            g = to_f64(g3[b, i, j])
            xj = to_f64(x3[b, i, j])
            xhat = xj * rstd_s  # (3)
            dxj = as_work(rstd_s * (g * w[j] - xhat * c), x3, dx3)  # (5), (7)
            dx3[b, i, j] = from_work(dxj, dx3)
            outside |= outside_work(dxj, dx3)
            if want_dw:
                dw_parts[p, j] += _dweight_term(g, xj, xhat, rstd_s, w32)  # (8), partial row
            if want_db:
                db_parts[p, j] += g  # (9)
        if outside:  # a rare row: dx again, rounded once by from_f64
            _bwd_dx_exact(g3, x3, b, i, w, rstd_s, c, dx3)
        return
    rstd = math.ldexp(rstd_s, -k)
    for j in range(n):
        g = to_f64(g3[b, i, j])
        xj = _scaled(to_f64(x3[b, i, j]), k)
        xhat = xj * rstd_s  # (3)
        dxhat = g * w[j]  # (5)
        proj = xhat * c if j < kf else 0.0  # the path through rstd (none past K)
        dx3[b, i, j] = from_f64(rstd * (dxhat - proj), dx3)  # (7) direct term − projection
        if want_dw:
            dw_parts[p, j] += _dweight_term(g, xj, xhat, rstd_s, w32)  # (8)
        if want_db:
            db_parts[p, j] += g  # (9)


@njit(**_INL)
def _dx_f32_row(g3, x3, b, i, w32, rstd_s, c, dx3):
    """Row (b, i)'s dx by ``_dxhat_minus_proj`` (as ``_bwd_row_and_dot_f32`` writes it, without
    the dweight terms and the next row's sum); returns whether it must be written again by
    ``_bwd_dx_exact``."""
    gs, rs, rc = _dx_scale(rstd_s, c, dx3)
    rs32 = np.float32(rs)
    rc_hi, rc_lo = _split32(rc)
    outside = False
    for j in range(x3.shape[2]):
        g = to_work(g3[b, i, j], dx3)
        xj = to_work(x3[b, i, j], dx3)
        t = _dxhat_minus_proj(g * gs, xj, w32[j], rc_hi, rc_lo)  # scaled by 2^e
        dxj = rs32 * t  # (7)
        dx3[b, i, j] = from_work(dxj, dx3)
        outside |= outside_work(dxj, dx3)
    return outside


@njit(**_PAR)
def _rms_bwd_v3(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1, w32=None):
    """One row at a time: rstd (saved, or recomputed), Σ dxhat·x, then ``_rms_bwd_row``.
    ``w32``: the float32 dx route's weight (``_f32_weight``), or None (the float64 route)."""
    _wide_vectors_for(x3)
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
                rstd_s, k = _rstd_from_sumsq(_sumsq_v3(x3, b, i, kf), x3, b, i, kf, eps)
            s = _dot_v3(dy3, x3, b, i, w, x3.shape[2], k)
            _rms_bwd_row(dy3, x3, b, i, w, w32, kf, rstd_s, k, s, dx3, want_dw, want_db,
                         dw_parts, db_parts, p)


@njit(**_INL)
def _bwd_row_and_dot(g3, x3, b, i, w, rstd_s, c, dx3, dw_parts, p, b1, i1):
    """Row (b, i)'s dx and dweight contribution (the common case: unscaled, K = N, a weight,
    no bias), while summing Σ dxhat·x of row (b1, i1) in the 64 lanes of ``_dot_v3`` in the
    same order (so the same bits as ``_dot_v3``; v4). dx as ``_rms_bwd_row``'s common loop.
    Returns (the sum, whether row (b, i)'s dx must be written again by ``_bwd_dx_exact``:
    the caller does it, or has it done)."""
    n = x3.shape[2]
    acc = _lanes()
    outside = False  # whether dx needs ``_bwd_dx_exact``
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):  # 64 elements of dx, then 64 terms of the next row's sum
        _read_ahead(g3, (b1, i1, j0))
        _read_ahead(x3, (b1, i1, j0))
        _write_ahead(dx3, (b, i, j0))
        for lane in range(LANES):
            j = j0 + lane
            g = to_f64(g3[b, i, j])
            xhat = to_f64(x3[b, i, j]) * rstd_s  # (3)
            dxj = as_work(rstd_s * (g * w[j] - xhat * c), x3, dx3)  # (5), (7)
            dx3[b, i, j] = from_work(dxj, dx3)
            outside |= outside_work(dxj, dx3)
            dw_parts[p, j] += g * xhat  # (8)
        for lane in range(LANES):  # a loop of its own, as in ``_write_and_sumsq``
            j = j0 + lane
            acc[lane] += (to_f64(g3[b1, i1, j]) * w[j]) * to_f64(x3[b1, i1, j])  # next row
    for lane in range(n - n64):
        j = n64 + lane
        g = to_f64(g3[b, i, j])
        xhat = to_f64(x3[b, i, j]) * rstd_s
        dxj = as_work(rstd_s * (g * w[j] - xhat * c), x3, dx3)
        dx3[b, i, j] = from_work(dxj, dx3)
        outside |= outside_work(dxj, dx3)
        dw_parts[p, j] += g * xhat
        acc[lane] += (to_f64(g3[b1, i1, j]) * w[j]) * to_f64(x3[b1, i1, j])
    return _lane_tree(acc), outside


@njit(**_INL)
def _bwd_row_and_dot_f32(g3, x3, b, i, w, w32, rstd_s, c, dx3, dw_parts, p, b1, i1, tail,
                         hw):
    """``_bwd_row_and_dot`` on the float32 dx route: dx as ``_dx_f32_row`` writes it, the
    dweight terms (g·x)·rstd (``_dweight_term``) from the block's float32 g·x, in a float64
    loop of their own (float64 work inside the float32 loop made LLVM give all of it
    half-width vectors; keeping g and x for that loop instead of their product was slower),
    and row (b1, i1)'s Σ dxhat·x in the lanes of ``_dot_lanes``, its terms (g·x)·w from a
    float32 g·x (two conversions and a float64 product fewer than (g·w)·x; exact in float64
    either way, so the same bits, where g·x is exact: always for float16, and for bfloat16
    where ``_gx_exact`` holds for that row, which the next call reports). Returns (the sum,
    whether row (b, i)'s dx must be written again: an element outside the format's range or a
    row outside ``_f32_dx_row``, whether a g·x of the row may not be exact (``_gx_exact``,
    never for float16): then the part's dweight row must be summed again, and the row's own
    Σ dxhat·x, summed by the previous call, may be wrong, so its dx is written again too).

    ``tail``: None where the row length is a multiple of LANES, else True: a type, so a kernel
    for such rows is compiled without the loop over a row's tail, which took about a fifth of
    the backward's first call to compile (bench/compile.py). ``hw``: None, or True where the
    CPU rounds the block's dx to bfloat16 (``_bf16_by_cpu``): one ``store_lanes_flushed`` per
    block in place of 64 integer roundings, and a nonzero |dx| below float32's normal range
    (which the CPU flushes to zero) flags the row, written again with the integer rounding."""
    n = x3.shape[2]
    acc = _lanes()
    dx_blk = _lanes32()  # the block's float32 dx, for ``store_lanes_flushed``
    gx_blk = _lanes32()  # the block's g·x, exact in float32 where ``_gx_exact``
    lo, hi = _key_lanes(x3), _key_lanes(x3)  # for ``_gx_exact`` (bfloat16)
    gs, rs, rc = _dx_scale(rstd_s, c, dx3)
    rs32 = np.float32(rs)
    rc_hi, rc_lo = _split32(rc)
    outside = not _f32_dx_row(rstd_s, rc)  # whether dx needs ``_bwd_dx_exact``
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):  # 64 elements of dx, their dweight terms, the next row's
        _read_ahead(g3, (b1, i1, j0))
        _read_ahead(x3, (b1, i1, j0))
        _write_ahead(dx3, (b, i, j0))
        for lane in range(LANES):
            j = j0 + lane
            g = to_work(g3[b, i, j], dx3)
            xj = to_work(x3[b, i, j], dx3)
            t = _dxhat_minus_proj(g * gs, xj, w32[j], rc_hi, rc_lo)  # (5)-(6), scaled by 2^e
            dxj = rs32 * t  # (7)
            if hw is None:
                dx3[b, i, j] = from_work(dxj, dx3)
            else:
                dx_blk[lane] = dxj
            outside |= outside_work(dxj, dx3)
            gx_blk[lane] = g * xj
        if hw is not None:  # (7) rounded by the CPU; a subnormal dx flags the row
            outside |= store_lanes_flushed(dx_blk, dx3, (b, i, j0))
        _gx_keys(lo, hi, g3, x3, (b, i, j0), dx3)
        for lane in range(LANES):
            dw_parts[p, j0 + lane] += np.float64(gx_blk[lane]) * rstd_s  # (8)
        for lane in range(LANES):  # the next row's (g·x)·w, g·x exact where ``_gx_exact``
            j = j0 + lane
            gx = to_work(g3[b1, i1, j], dx3) * to_work(x3[b1, i1, j], dx3)
            acc[lane] += np.float64(gx) * w[j]
    if tail is not None:
        for lane in range(n - n64):  # dweight's terms from float64 products: always exact
            j = n64 + lane
            g = to_work(g3[b, i, j], dx3)
            xj = to_work(x3[b, i, j], dx3)
            t = _dxhat_minus_proj(g * gs, xj, w32[j], rc_hi, rc_lo)
            dxj = rs32 * t
            dx3[b, i, j] = from_work(dxj, dx3)
            outside |= outside_work(dxj, dx3)
            dw_parts[p, j] += (np.float64(g) * np.float64(xj)) * rstd_s
            acc[lane] += (to_f64(g3[b1, i1, j]) * w[j]) * to_f64(x3[b1, i1, j])
    return _lane_tree(acc), outside, not _gx_exact(lo, hi, dx3)


def _bf16_by_cpu(out3: np.ndarray) -> bool | None:
    """True where a pipelined loop's float32 values for ``out3`` are rounded to bfloat16 by
    the CPU (``store_lanes_flushed``: ``_halfbits.BF16_HW_FLUSHED``, a C-contiguous bfloat16
    output; RMSNorm's and LayerNorm's dx, LayerNorm's y, the fused add's y and new residual),
    else None: a type, as ``_tail``, so the kernel's machine code has one of the two stores
    (where it is True, Numba types both and LLVM drops the other, a branch on a constant)."""
    return (True if BF16_HW_FLUSHED and out3.dtype == BF16_BITS and out3.flags.c_contiguous
            else None)


@njit(**_SER)
def _bwd_dx_exact(g3, x3, b, i, w, rstd_s, c, dx3):
    """Row (b, i)'s dx of ``_bwd_row_and_dot`` again, rounded by ``from_f64`` (a half row with
    an element outside the format's normal range, as ``_rms_write`` does). Only dx: the
    dweight terms were added once already."""
    for j in range(x3.shape[2]):
        xhat = to_f64(x3[b, i, j]) * rstd_s
        dx3[b, i, j] = from_f64(rstd_s * (to_f64(g3[b, i, j]) * w[j] - xhat * c), dx3)


@njit(**_PAR)
def _rms_bwd_pipelined(dy3, x3, w, w32, f64_route, tail, hw, rstd_in, dx3, dw_parts, redo,
                       redo_dw, t0, t1):
    """v5's kernel: v4's pipelined loop for the common call only (saved rstd, K = N, a weight
    or w = 1, no bias), with no branch for the other calls, and every row of a part through the loop
    (the part's last row sums its own Σ dxhat·x again, unused).

    A rare row is only flagged here (``redo[r]``: its Σ dxhat·x left [SS_LO, SS_HI], so c must
    be summed again (not for a row of dy = 0: ``_c_in_range``), or its dx left the half
    format's normal range) and written again
    afterwards by ``_rms_bwd_redo`` (``_rms_bwd_common`` calls both): the rare paths' code then
    stays out of this kernel, whose first call compiles faster (bench/compile.py).
    ``w32`` not None: the float32 dx route (``_bwd_row_and_dot_f32``; a row outside
    ``_f32_dx_row`` is flagged too), chosen when the kernel is compiled (None is a type). On
    that route a bfloat16 part whose dweight terms took a g·x that may not be exact is flagged
    in ``redo_dw[p]`` and summed again by ``_rms_bwd_dweight_again``, and so is the row (its
    Σ dxhat·x took those products too); ``tail`` (None or True,
    ``_tail``) says whether that route's row needs its loop over a row's tail, and ``hw``
    (None or True, ``_bf16_by_cpu``) whether the CPU rounds its dx. ``f64_route`` is True
    where ``w32`` is None, else None: Numba prunes a branch on ``is None`` only where the
    argument is None, so a test of ``w32`` alone would compile the float64 route into the
    float32 route's kernels too (about a fifth of their first call, bench/compile.py)."""
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        redo_dw[p] = False
        r0 = p * ROWS_PER_PART
        r1 = min(m, r0 + ROWS_PER_PART)
        if r1 <= r0:  # an empty batch still has one (zeroed) part
            continue
        b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
        s = _dot_lanes(dy3, x3, b, i, w, n)  # Σ dxhat·x of the part's first row
        for r in range(r0, r1):
            b1, i1 = _row_after(b, i, nr, r + 1 == r1)  # the row summed while r is written
            rstd_s = rstd_in[r]
            c = s * rstd_s / n  # (6), as ``_coef`` for s in [SS_LO, SS_HI] (else redone)
            if f64_route is not None:  # one of the two branches is pruned
                s_next, outside = _bwd_row_and_dot(dy3, x3, b, i, w, rstd_s, c, dx3, dw_parts,
                                                   p, b1, i1)
            if w32 is not None:
                s_next, outside, lost = _bwd_row_and_dot_f32(dy3, x3, b, i, w, w32, rstd_s, c,
                                                             dx3, dw_parts, p, b1, i1, tail, hw)
                redo_dw[p] |= lost
                outside |= lost  # its Σ dxhat·x took those products too
            redo[r] = outside or not _c_in_range(s, rstd_s, dy3, b, i)
            s = s_next
            b, i = b1, i1


@njit(**_SER)
def _rms_bwd_redo(dy3, x3, w, w32, rstd_in, dx3, redo, r0, r1):
    """dx of the rows in [r0, r1) that ``_rms_bwd_pipelined`` flagged, written again as v3
    writes them (``_rms_bwd_row``: c by ``_coef``, then the common loop and, where a dx left
    the normal range, ``_bwd_dx_exact``), so with v3's bits. Only dx: the loop added these
    rows' dweight terms already. Compiled by the first call that flags a row."""
    nr = x3.shape[1]
    n = x3.shape[2]
    no_parts = np.empty((1, 0))
    for r in range(r0, r1):
        if redo[r]:
            b, i = r // nr, r % nr
            s = _dot_lanes(dy3, x3, b, i, w, n)  # the pipelined loop's sum, bit for bit
            _rms_bwd_row(dy3, x3, b, i, w, w32, n, rstd_in[r], 0, s, dx3, False, False,
                         no_parts, no_parts, 0)


@njit(**_SER)
def _rms_bwd_dweight_again(dy3, x3, rstd_in, dw_parts, redo_dw, t0, t1):
    """The dweight rows of the parts in [t0, t1) that ``_rms_bwd_pipelined`` flagged, summed
    again from float64 products: term (g·x)·rstd (``_dweight_term``, eq. (8)) with g·x exact
    in float64, in the pipelined loop's order, so a part gets the bits that loop gives where
    every float32 g·x is exact. Compiled by the first call that flags a part."""
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in range(t0, t1):
        if redo_dw[p]:
            _zero_part(dw_parts, p)
            for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
                b, i = r // nr, r % nr
                for j in range(x3.shape[2]):  # (8), as the float32 route's ``_dweight_term``
                    dw_parts[p, j] += (to_f64(dy3[b, i, j]) * to_f64(x3[b, i, j])) * rstd_in[r]


def _tail(x3: np.ndarray) -> bool | None:
    """None where rows are a multiple of LANES long, else True: what ``_rms_bwd_pipelined``
    is compiled with (``_bwd_row_and_dot_f32``'s tail loop)."""
    return None if x3.shape[2] % LANES == 0 else True


def _bwd_route_types(x3: np.ndarray, dx3: np.ndarray, w32: np.ndarray | None) -> tuple:
    """``_rms_bwd_pipelined``'s (f64_route, tail, hw) for ``w32`` (``_f32_weight``): types
    that choose the code it is compiled with. The float64 row has its tail loop anyway."""
    if w32 is None:
        return True, None, None
    return None, _tail(x3), _bf16_by_cpu(dx3)


def _rms_bwd_common(dy3, x3, w, rstd_in, dx3, dw_parts, t0, t1, w32=None):
    """The common call on parts [t0, t1): ``_rms_bwd_pipelined``, then ``_rms_bwd_redo`` for
    the rows it flagged and ``_rms_bwd_dweight_again`` for the parts it flagged (none in
    ordinary data)."""
    m = x3.shape[0] * x3.shape[1]
    r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_PART)
    redo = np.empty(m, np.bool_)  # only rows [r0, r1) are written and read
    redo_dw = np.empty(dw_parts.shape[0], np.bool_)  # only parts [t0, t1)
    _rms_bwd_pipelined(dy3, x3, w, w32, *_bwd_route_types(x3, dx3, w32), rstd_in, dx3, dw_parts,
                       redo, redo_dw, t0, t1)
    if redo[r0:r1].any():
        _rms_bwd_redo(dy3, x3, w, w32, rstd_in, dx3, redo, r0, r1)
    if redo_dw[t0:t1].any():
        _rms_bwd_dweight_again(dy3, x3, rstd_in, dw_parts, redo_dw, t0, t1)


@njit(**_PAR)
def _rms_rstd(x3, kf, eps, rstd_out, r0, r1):
    """rstd of rows [r0, r1) by the forward's code, eqs. (1)-(2): the float64 values that
    ``_rms_fwd_v4`` saves for float32/float64 inputs and ``_rms_bwd_v3`` recomputes, bit for
    bit."""
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    for r in range(r0, r1):
        b, i = r // nr, r % nr
        rstd_s, k = _rstd_from_sumsq(_sumsq_v3(x3, b, i, kf), x3, b, i, kf, eps)  # (1)-(2)
        rstd_out[r] = math.ldexp(rstd_s, -k)


#: The significant bits a weight may have for the float32 dx route, per half format: 24 less
#: the bits of a g of that format (float16 11, bfloat16 8), so that g·w is exact in float32.
F32_DX_WEIGHT_BITS = {F16_BITS: 24 - 11, BF16_BITS: 24 - 8}


def _f32_weight(dy3: np.ndarray, x3: np.ndarray, dx3: np.ndarray,
                w: np.ndarray) -> np.ndarray | None:
    """The weight row in float32 when the call's dx may take the float32 route, else None.

    The route (``_dxhat_minus_proj``) is taken for dy, x and dx of one half format (the 16-bit
    views) with a weight row w' (offset added) that is exact in float32 with at most
    ``F32_DX_WEIGHT_BITS`` significant bits and nonzero magnitudes within 2^+-F32_DX_RANGE: a
    weight of the same format is (with an offset of 1, only where w' keeps few bits).

    Why it keeps the contract: per row (``_f32_dx_row``: rstd and the scaled |rstd·c| within
    2^+-F32_DX_RANGE), g·w and x·rc_hi are exact where normal (inside the fused
    multiply-adds), each multiply-add rounds once (2^-24 of its result, or 2^-150 where the
    result is below float32's normal range), and rstd·c − rc_hi − rc_lo is at most
    2^-47·|rstd·c|. So the difference t is within about 2^-23·|t| + 2^-45·|x·rstd·c| + 3·2^-150
    of the exact one, and dx = fl(fl32(rstd·2^-e)·t) within about 2^-22·|dx| +
    2^-45·|rstd·xhat·c| + 3·2^-150, the inner values scaled by 2^e (``_dx_scale``: the last
    term would otherwise be rstd·3·2^-150). That term is far under the smallest spacing of
    either format (float16 2^-24, bfloat16 2^-133), and overflow gives inf or NaN, which
    ``outside_work`` flags. A half ulp of dx is 2^-11·|dx| (float16) or 2^-8·|dx|
    (bfloat16), so the float32 value rounds to the oracle's bits except within a few float32
    ulps of a rounding boundary (as the float64 route's twice-rounded value does), or where
    dx is below about 2^-34 of the projection term it cancels: there it can be more than an
    ulp of itself off (the float64 route: below 2^-41), still within the tolerance model's
    bound, which is relative to that term.

    dweight's terms are (g·x)·rstd in float64 from the float32 g·x: exact for float16 (22
    bits within 2^+-32); for bfloat16 exact unless it leaves float32's normal range, where
    the loop flags the part (``_gx_exact``) and its row is summed again from float64 products.
    """
    fmt = dy3.dtype
    if not (fmt == x3.dtype == dx3.dtype and fmt in F32_DX_WEIGHT_BITS):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        w32 = w.astype(np.float32)
    if not np.array_equal(w32, w):  # not exact in float32, or NaN
        return None
    a = np.abs(w32[w32 != 0])
    if a.size and not (a.min() >= 2.0**-F32_DX_RANGE and a.max() <= 2.0**F32_DX_RANGE):
        return None
    if np.any(w32.view(np.uint32) & np.uint32((1 << (24 - F32_DX_WEIGHT_BITS[fmt])) - 1)):
        return None
    return w32


def _rms_bwd_v6(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1):
    """v6: the common call (K = N, no bias) runs ``_rms_bwd_pipelined`` when every
    rstd it needs is in the range its unscaled sums allow; every other call runs v3 (a
    Python-level choice: one kernel holding both paths is what v4 is, and v3 compiles faster).
    Without a saved rstd, this thread's rows get theirs from ``_rms_rstd`` first (the values v3
    would recompute, so v3's bits): one more read of x, in exchange for the pipelined loop,
    and a first call that compiles neither v3 nor its recomputation of rstd (bench/compile.py).
    v5 did this for a saved rstd only. A half call whose weight allows it computes dx in
    float32 (``_f32_weight``), in every kernel, so they keep one another's bits. A call
    without a weight runs the pipelined kernel too (with w = 1, as v3; the host gives it
    partial rows for a dweight nobody asked for): v3 read each row twice and took 3x the
    pipelined kernel's time per element for float32 (2048 rows of 2048)."""
    w32 = _f32_weight(dy3, x3, dx3, w)
    if kf == x3.shape[2] and dw_parts.shape[1] == kf and not want_db:  # a weight or none
        if has_rstd and _saved_rstd_in_range(rstd_in):
            _rms_bwd_common(dy3, x3, w, rstd_in, dx3, dw_parts, t0, t1, w32)
            return
        if not has_rstd:
            m = x3.shape[0] * x3.shape[1]
            r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_PART)
            rstd = np.empty(m)  # only rows [r0, r1) are written and read
            _rms_rstd(x3, kf, eps, rstd, r0, r1)
            if _saved_rstd_in_range(rstd[r0:r1]):
                _rms_bwd_common(dy3, x3, w, rstd, dx3, dw_parts, t0, t1, w32)
                return
    _rms_bwd_v3(dy3, x3, w, kf, eps, has_rstd, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1, w32)


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
# the statistic) or rounded to x's dtype first ("rounded-sum"). RMSNorm's technique on h: Σh² and
# Σ dxhat·h in the 64 lanes, the forward's blocks pipelined.
# The rounding of h is chosen by a type, not a flag: ``like`` is None ("fp32-sum") or a zero
# of x's element type ("rounded-sum", ``_rounding_tag``), and ``_halfbits.rounded_sum``
# compiles to the identity or to the rounding, so one kernel serves both, compiled once for
# each. (``like`` was the x array, passed to ``_h_of`` for every element: its reference count
# kept the loops from vectorising. With that and h rounded to the half format from float64,
# which ``rounded_sum`` now avoids where x, the residual and x's dtype are one half format,
# "rounded-sum" ran 7-20x slower than "fp32-sum" for half types at full size, 1.3-2x for
# float32.) The element loops index their rows (1-D views) themselves, pass values to the
# helpers and do their own stores: an array argument of an inlined per-element helper (a row
# to store into, or a row and an index to read) costs a reference count update per element
# and kept the loops from vectorising, as
# ``_ln_dx`` notes (bench/halfrow.py, float32 in cache: the forward's row 1.3 -> 0.46 ns per
# element, the backward's 2.2 -> 0.79; bfloat16 3.2 -> 0.75 and 10.4 -> 1.24).
# A row helper that takes the scale exponent k is compiled twice: inlined for the common row,
# called with k = 0 (so ``_scaled`` folds away and the loop vectorises), and on its own
# (``*_scaled_row``) for the rare scaled float64 rows, which keeps that copy out of the kernels.
# ============================================================================================
def _rounding_tag(x3: np.ndarray) -> np.generic:
    """``like`` for "rounded-sum": a zero of x3's element type (float64, float32, or the half
    format's bits), whose type ``_h_of`` rounds h to. A scalar, not x3 itself (see above)."""
    return x3.dtype.type(0)


@njit(**_INL)
def _h_of(xj, rj, like):
    """h_j = x_j + r_j in float64, rounded to the type of ``like`` unless it is None."""
    return rounded_sum(xj, rj, like)


@njit(**_INL)
def _h(x3, r3, b, i, j, like):
    """h_j of row (b, i) (the rare rows' loops)."""
    return _h_of(x3[b, i, j], r3[b, i, j], like)


@njit(**_SER)
def _add_residual_exact(x3, r3, b, i, like, res3):
    """new_residual of row (b, i) rounded once from float64: the oracle's bits, NaN included
    (rare: a row holding an inf or NaN, not inlined)."""
    for j in range(x3.shape[2]):
        res3[b, i, j] = from_f64(_h(x3, r3, b, i, j, like), res3)


@njit(**_INL)
def _add_sumsq(x3, r3, b, i, like, res3):
    """Σh² of row (b, i) in the 64 lanes of ``_sumsq_v3`` (same order), storing the row's
    new_residual = R_res(h) on the way (``sum_to``: through float32 when x, the residual and
    the new residual share a half format; a row whose Σh² is not finite holds an inf or NaN
    and is stored again by ``_add_residual_exact``). The loops store into the row themselves:
    the store inside an inlined helper kept them from vectorising."""
    n = x3.shape[2]
    x, r, res = x3[b, i], r3[b, i], res3[b, i]  # (N,) each
    acc = _lanes()
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            j = j0 + lane
            h = _h_of(x[j], r[j], like)
            res[j] = sum_to(h, x3, r3, res3)  # new_residual = R_res(h)
            acc[lane] += h * h
    for lane in range(n - n64):
        j = n64 + lane
        h = _h_of(x[j], r[j], like)
        res[j] = sum_to(h, x3, r3, res3)
        acc[lane] += h * h
    return _lane_tree(acc)


@njit(**_INL)
def _add_rstd(ss, x3, r3, b, i, like, eps):
    """(rstd_s, k) of a row from its Σh², as ``_rstd_from_sumsq`` does from Σx²."""
    if SS_LO <= ss <= SS_HI:
        return 1.0 / math.sqrt(ss / x3.shape[2] + eps), 0
    return _add_rstd_scaled(ss, x3, r3, b, i, like, eps)


@njit(**_SER)
def _add_rstd_scaled(ss, x3, r3, b, i, like, eps):
    """The scaled path of ``_rstd_from_sumsq``, on h (rare, not inlined)."""
    n = x3.shape[2]
    amax = 0.0
    for j in range(n):
        a = abs(_h(x3, r3, b, i, j, like))
        if not a <= amax:
            amax = a
    k = _scale_exponent(amax, eps)
    if k == 0:
        return 1.0 / math.sqrt(ss / n + eps), 0
    ss_s = 0.0
    for j in range(n):
        v = math.ldexp(_h(x3, r3, b, i, j, like), -k)
        ss_s += v * v
    return 1.0 / math.sqrt(ss_s / n + math.ldexp(eps, -2 * k)), k


@njit(**_INL)
def _add_write_and_sumsq(x3, r3, like, b, i, w, ww, y3, rstd_s, res3, b1, i1, hw):
    """Row (b, i)'s y (unscaled) while summing Σh² of row (b1, i1) and storing its
    new_residual, in the lanes of ``_add_sumsq`` (same order, so the same bits). ``ww``: None,
    y in float64 rounded to the working precision (``as_work``), as RMSNorm's dx; or the
    weight in float32 (``_add_f32_weight``), y in float32 arithmetic as RMSNorm's,
    fl(fl(fl32(h)·fl(rstd))·w'), a row with an h·rstd lost to underflow (``lost_in_row``)
    flagged; its y are not tested for inf and NaN one by one (``_y_finite_row`` tests the
    row). On the float64 route each y is tested (``outside_work``: also a bfloat16 y below
    the normal range, which the integer rounding cannot round). The new residual is rounded
    by ``sum_to``.
    ``hw``: None, or True where x, the residual and both outputs are C-contiguous bfloat16
    and the CPU rounds (``_add_by_cpu``): y and the new residual (``sum_to``'s float32 h)
    are rounded by ``store_lanes_flushed``. Returns (Σh² of row (b1, i1), whether y needs
    ``_add_write_scaled_row``, whether a y of row (b, i) and whether a new
    residual of row (b1, i1) was a float32 subnormal, which the CPU flushed: ``_add_fwd_redo``
    writes them again the integer way)."""
    n = x3.shape[2]
    x, r, y = x3[b, i], r3[b, i], y3[b, i]  # (N,) each: row (b, i)
    x1, r1, res1 = x3[b1, i1], r3[b1, i1], res3[b1, i1]  # row (b1, i1)
    acc = _lanes()
    y_blk = _lanes32()  # the block's float32 y and new residual, for ``store_lanes_flushed``
    res_blk = _lanes32()
    keys = _key_lanes(res_blk)  # of the float32 h, for ``lost_in_row``
    rstd_w = np.float32(rstd_s)  # the float32 route's rstd
    outside = False
    y_flushed = False
    res_flushed = False
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        _read_ahead(x1, (j0,))
        _read_ahead(r1, (j0,))
        _write_ahead(y, (j0,))
        _write_ahead(res1, (j0,))
        for lane in range(LANES):
            j = j0 + lane
            h = _h_of(x[j], r[j], like)
            if ww is None:
                yj = as_work(h * rstd_s * w[j], x3, y3)  # (3)-(4) in float64
            else:  # (3)-(4) in float32, h rounded once (exact for the rounded sum)
                yj = np.float32(h) * rstd_w * ww[j]
                keys[lane] = note_magnitude(keys[lane], np.float32(h), x3, y3)
            if hw is None:
                y[j] = from_work(yj, y3)
            else:
                y_blk[lane] = yj
            if ww is None:  # (the float32 route's test is one per row: ``_y_finite_row``)
                outside |= outside_work(yj, y3)
        if hw is not None:
            y_flushed |= store_lanes_flushed(y_blk, y3, (b, i, j0))
        for lane in range(LANES):  # a loop of its own, as in ``_write_and_sumsq``
            j = j0 + lane
            h = _h_of(x1[j], r1[j], like)
            if hw is None:
                res1[j] = sum_to(h, x3, r3, res3)  # new_residual = R_res(h)
            else:
                res_blk[lane] = np.float32(h)  # as ``sum_to`` rounds it, then by the CPU
            acc[lane] += h * h  # (1) of the next row
        if hw is not None:
            res_flushed |= store_lanes_flushed(res_blk, res3, (b1, i1, j0))
    for lane in range(n - n64):
        j = n64 + lane
        h = _h_of(x[j], r[j], like)
        if ww is None:
            yj = as_work(h * rstd_s * w[j], x3, y3)
        else:
            yj = np.float32(h) * rstd_w * ww[j]
            keys[lane] = note_magnitude(keys[lane], np.float32(h), x3, y3)
        y[j] = from_work(yj, y3)
        if ww is None:
            outside |= outside_work(yj, y3)
        h = _h_of(x1[j], r1[j], like)
        res1[j] = sum_to(h, x3, r3, res3)
        acc[lane] += h * h
    if ww is not None:
        outside |= lost_in_row(_max_key(keys), rstd_w, x3, y3)
    return _lane_tree(acc), outside, y_flushed, res_flushed


@njit(**_SER)
def _add_write_scaled_row(x3, r3, like, b, i, w, y3, rstd_s, k):
    """y of a scaled row, (h·2^-k)·rstd_s·w, or of a row ``_add_write_and_sumsq`` flagged
    (k = 0), rounded once by ``from_f64`` (rare, not inlined)."""
    for j in range(x3.shape[2]):
        y3[b, i, j] = from_f64(math.ldexp(_h(x3, r3, b, i, j, like), -k) * rstd_s * w[j], y3)


#: Why ``_add_fwd_rows`` flags a row for ``_add_fwd_redo`` (bits of its ``redo`` entry).
REDO_Y = 1  # y needs the float64 route, rounded once (a flagged half row)
REDO_RSTD = 2  # Σh² outside [SS_LO, SS_HI]: rstd by ``_add_rstd`` (maybe scaled), then y
REDO_RES = 4  # Σh² not finite, or a flushed subnormal: new_residual by ``_add_residual_exact``
REDO_Y_FLUSHED = 8  # a y the CPU flushed (``_add_write_and_sumsq``): y again the integer way


@njit(**_INL)
def _add_fwd_rows(x3, r3, like, w, ww, eps, y3, res3, rstd_out, redo, hw, t0, t1):
    """The rows of blocks [t0, t1) as one run through the pipelined loop, as RMSNorm's
    forward (the last row sums itself again, unused). Rare rows are only flagged in ``redo``
    (``REDO_Y``, ``REDO_RSTD``, ``REDO_RES``, ``REDO_Y_FLUSHED``) and written again by
    ``_add_fwd_redo``; ``redo`` must hold zeros for these rows on entry. ``ww``:
    ``_add_f32_weight``; ``hw``: ``_add_by_cpu``."""
    nr = x3.shape[1]
    n = x3.shape[2]
    r0, r1 = _task_rows(x3.shape[0] * nr, t0, t1, ROWS_PER_BLOCK)
    if r1 <= r0:
        return
    b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
    ss = _add_sumsq(x3, r3, b, i, like, res3)  # (1) of the first row
    if not math.isfinite(ss):
        redo[r0] |= REDO_RES
    for r in range(r0, r1):
        b1, i1 = _row_after(b, i, nr, r + 1 == r1)  # the row summed while r is written
        rstd_s = 1.0 / math.sqrt(ss / n + eps)  # (2) on h, as ``_add_rstd`` in range
        if not SS_LO <= ss <= SS_HI:
            redo[r] |= REDO_RSTD
        if not _y_finite_row(ss, rstd_s, ww):  # an inf or NaN y, in place of testing each
            redo[r] |= REDO_Y
        rstd_out[r] = rstd_s
        ss, outside, y_flushed, res_flushed = _add_write_and_sumsq(
            x3, r3, like, b, i, w, ww, y3, rstd_s, res3, b1, i1, hw)  # (3)-(4) of r, (1) of r + 1
        if outside:
            redo[r] |= REDO_Y
        if y_flushed:
            redo[r] |= REDO_Y_FLUSHED
        if res_flushed:  # row r + 1's (row r's own for the last row, summed again)
            redo[min(r + 1, r1 - 1)] |= REDO_RES
        if not math.isfinite(ss) and r + 1 < r1:
            redo[r + 1] |= REDO_RES
        b, i = b1, i1


@njit(**_INL)
def _y_finite_row(ss, rstd_s, ww):
    """For the fused add's float32 route (``ww`` the float32 weight), whether no y of the row
    is inf or NaN, given ``_y_bounded`` (``_add_rms_fwd_rows`` flags every row where the
    weight fails it): exactly when Σh² and float32(rstd_s) are finite. Then
    |h_j|·rstd <= sqrt(N) (Σh² >= h_j²) and |y_j| stays below half of the float32 value that
    rounds to inf (``_y_bounded``'s argument); otherwise some y_j is inf or NaN (an inf or
    NaN h, or any h times an inf rstd). One test per row in place of one per element (the
    same rows flagged), as ``lost_in_row`` for underflow. True on the float64 route (``ww``
    None), whose y are tested one by one."""
    return ww is None or (math.isfinite(ss) and math.isfinite(np.float32(rstd_s)))


@njit(**_PAR)
def _add_rms_fwd(x3, r3, like, w, ww, eps, y3, res3, rstd_out, redo, hw, t0, t1):
    """The forward: h = x + r in float64 (``like`` None, ``rounding="fp32-sum"``) or
    h = R_x(x + r) (``like`` a zero of x's element type, ``rounding="rounded-sum"``); one
    compiled copy each.
    ``ww``: ``_add_f32_weight``; ``hw``: ``_add_by_cpu``."""
    _wide_vectors_for(x3)
    _add_fwd_rows(x3, r3, like, w, ww, eps, y3, res3, rstd_out, redo, hw, t0, t1)


@njit(**_SER)
def _add_fwd_redo(x3, r3, like, w, ww, eps, y3, res3, rstd_out, redo, r0, r1):
    """The rows in [r0, r1) that ``_add_fwd_rows`` flagged, written as its loop wrote them
    before rare rows left it (so with those bits): rstd from ``_add_rstd`` (the scaled route
    where it applies), y again in float64 for a scaled row or a ``REDO_Y`` row (an inf or
    NaN y, or on the float32 route an h·rstd lost to underflow), else by the loop's own route
    (``ww``) rounded element by element for a ``REDO_Y_FLUSHED`` row (so its bits do not
    depend on the CPU), and the new residual
    rounded once from float64 for a ``REDO_RES`` row (a flushed one included: through
    float32 it has those bits, ``sum_to``), after ``_add_sumsq`` has stored it the fast way.
    Compiled by the first call that flags a row."""
    nr = x3.shape[1]
    for r in range(r0, r1):
        f = redo[r]
        if f == 0:
            continue
        b, i = r // nr, r % nr
        if f & (REDO_Y | REDO_RSTD | REDO_Y_FLUSHED):
            ss = _add_sumsq(x3, r3, b, i, like, res3)  # the loop's Σh², bit for bit
            rstd_s, k = _add_rstd(ss, x3, r3, b, i, like, eps)  # (2) on h
            rstd_out[r] = rstd_s if k == 0 else math.ldexp(rstd_s, -k)
            if k != 0 or f & REDO_Y:  # a scaled float64 row, or a flagged half row
                _add_write_scaled_row(x3, r3, like, b, i, w, y3, rstd_s, k)
            elif f & REDO_Y_FLUSHED:  # the loop's y, each rounded the integer way
                _add_write_and_sumsq(x3, r3, like, b, i, w, ww, y3, rstd_s, res3, b, i, None)
        if f & REDO_RES:
            _add_residual_exact(x3, r3, b, i, like, res3)


def _add_by_cpu(x3: np.ndarray, r3: np.ndarray, y3: np.ndarray, res3: np.ndarray) -> bool | None:
    """True where the fused add's two outputs are rounded by the CPU, a block at a time: the
    forward's y and new residual (``_add_write_and_sumsq``; ``sum_to``'s float32 route) or
    the backward's dx and dresidual (``_add_dh_and_dot``), called with those as ``y3`` and
    ``res3``: x, the residual and both outputs bfloat16 and the outputs C-contiguous
    (``_bf16_by_cpu``); else None."""
    return (True if _bf16_by_cpu(y3) and _bf16_by_cpu(res3) and x3.dtype == r3.dtype == BF16_BITS
            else None)


def _add_f32_weight(w: np.ndarray, x3: np.ndarray, r3: np.ndarray,
                    y3: np.ndarray) -> np.ndarray | None:
    """The weight in float32 where the fused add's y is computed in float32 arithmetic
    (``_add_write_and_sumsq``): a half y, x and the residual of one half format (so a nonzero
    float16 h is at least 2^-24, and ``lost_in_row`` need test only bfloat16 rows); else
    None. A type, as ``_ln_f32_weight``."""
    if y3.dtype not in (BF16_BITS, F16_BITS) or not x3.dtype == r3.dtype == y3.dtype:
        return None
    with np.errstate(over="ignore"):
        return w.astype(np.float32)  # a weight beyond float32 gives an inf y: a flagged row


def _add_rms_fwd_rows(x3, r3, like, w, eps, y3, res3, rstd_out, t0, t1):
    """``_add_rms_fwd`` on blocks [t0, t1), then ``_add_fwd_redo`` for the rows it flagged."""
    m = x3.shape[0] * x3.shape[1]
    r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_BLOCK)
    redo = np.zeros(m, np.uint8)  # only rows [r0, r1) are written and read
    ww = _add_f32_weight(w, x3, r3, y3)
    _add_rms_fwd(x3, r3, like, w, ww, eps, y3, res3, rstd_out, redo,
                 _add_by_cpu(x3, r3, y3, res3), t0, t1)
    if ww is not None and not _y_bounded(w, y3):  # a weight that may take a y to inf:
        redo[r0:r1] |= REDO_Y  # every row in float64 (``_y_finite_row`` assumes it does not)
    if redo[r0:r1].any():
        _add_fwd_redo(x3, r3, like, w, ww, eps, y3, res3, rstd_out, redo, r0, r1)


@njit(**_INL)
def _dxhat_h(gj, wj, xj, rj, like, k):
    """dxhat_j·h_j·2^-k from the elements, dxhat = dy·w' (k = 0 unless a scaled row)."""
    return (to_f64(gj) * wj) * _scaled(_h_of(xj, rj, like), k)


# pragma: no mutate start (jitted by a call below: mutmut's wrapper would not compile)
def _add_dot_py(dy3, x3, r3, b, i, like, w, k):
    """Σ_j dxhat_j·h_j·2^-k of row (b, i) in the 64 lanes of ``_dot_v3`` (same order)."""
    n = x3.shape[2]
    g, x, r = dy3[b, i], x3[b, i], r3[b, i]  # (N,) each
    acc = _lanes()
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            j = j0 + lane
            acc[lane] += _dxhat_h(g[j], w[j], x[j], r[j], like, k)
    for lane in range(n - n64):
        j = n64 + lane
        acc[lane] += _dxhat_h(g[j], w[j], x[j], r[j], like, k)
    return _lane_tree(acc)


# pragma: no mutate end
_add_dot = njit(**_INL)(_add_dot_py)
_add_dot_scaled_row = njit(**_SER)(_add_dot_py)


@njit(**_INL)
def _add_coef(s, dy3, x3, r3, b, i, like, w, rstd_s, k):
    """c of eq. (6) on h, s·rstd_s/N, as ``_coef``: rows outside ``_factored`` sum
    Σ dxhat·hhat / N instead."""
    if _factored(s, rstd_s):
        return s * rstd_s / x3.shape[2]
    return _add_coef_from_hhat(dy3, x3, r3, b, i, like, w, rstd_s, k)


@njit(**_SER)
def _add_coef_from_hhat(dy3, x3, r3, b, i, like, w, rstd_s, k):
    """(1/N) Σ dxhat_j·hhat_j, hhat = (h·2^-k)·rstd_s: ``_coef_from_xhat`` on h."""
    n = x3.shape[2]
    c = 0.0
    for j in range(n):
        c += (to_f64(dy3[b, i, j]) * w[j]) * (_scaled(_h(x3, r3, b, i, j, like), k) * rstd_s)
    return c / n


@njit(**_INL)
def _add_dh(gj, hhat, wj, rstd, c, droj, has_dro):
    """dh_j = dx_RMSNorm(h)_j (+ dresidual_out_j) in float64, from the elements (the loops
    store it into dx and dresidual and add the dweight term g·hhat themselves: stores inside
    an inlined helper kept the loops from vectorising). Eq. (7) on h; rstd = rstd_s·2^-k."""
    dh = rstd * (to_f64(gj) * wj - hhat * c)  # (7) direct term − projection
    if has_dro:
        dh += to_f64(droj)  # h also feeds new_residual
    return dh


# pragma: no mutate start (jitted by a call below)
def _add_bwd_row_py(
    dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, k, c, dx3, dr3, dw_parts, p
):
    """dh of one row in float64, rounded into dx and dresidual as RMSNorm's float64 dx
    (through float32 for a half output: ``as_work``), and its dweight terms (summed with or
    without a weight: no branch in the loop; the host drops them). Eqs. (3), (5)-(8) on h.
    Returns whether a rounded dh left the float32 route (``outside_work``): the caller
    writes the row's dh again with ``_add_dh_exact``."""
    rstd = math.ldexp(rstd_s, -k)
    g, dro, x, r = dy3[b, i], dro3[b, i], x3[b, i], r3[b, i]  # (N,) each
    dx, dr, dw = dx3[b, i], dr3[b, i], dw_parts[p]
    outside = False
    for j in range(x3.shape[2]):
        hhat = _scaled(_h_of(x[j], r[j], like), k) * rstd_s  # (3)
        dh = _add_dh(g[j], hhat, w[j], rstd, c, dro[j], has_dro)
        dxj, drj = as_work(dh, x3, dx3), as_work(dh, r3, dr3)
        dx[j] = from_work(dxj, dx3)
        dr[j] = from_work(drj, dr3)
        outside |= outside_work(dxj, dx3) | outside_work(drj, dr3)
        dw[j] += to_f64(g[j]) * hhat  # (8)
    return outside


# pragma: no mutate end
_add_bwd_row = njit(**_INL)(_add_bwd_row_py)
_add_bwd_scaled_row = njit(**_SER)(_add_bwd_row_py)


@njit(**_SER)
def _add_dh_exact(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, k, c, dx3, dr3):
    """Row (b, i)'s dx and dresidual of ``_add_bwd_row`` again, rounded once by ``from_f64``
    (a row with a dh that rounds to inf or is NaN through float32, as ``_bwd_dx_exact``):
    the oracle's bits. Only dh: the row's dweight terms were added once already."""
    rstd = math.ldexp(rstd_s, -k)
    for j in range(x3.shape[2]):
        hhat = _scaled(_h(x3, r3, b, i, j, like), k) * rstd_s  # (3)
        dh = _add_dh(dy3[b, i, j], hhat, w[j], rstd, c, dro3[b, i, j], has_dro)
        dx3[b, i, j] = from_f64(dh, dx3)
        dr3[b, i, j] = from_f64(dh, dr3)


@njit(**_INL)
def _add_bwd_rows(dy3, dro3, has_dro, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3,
                  dw_parts, t0, t1):
    """Every row of parts t0, ..., t1 - 1 on its own (any call); inlined with ``has_dro`` a
    constant."""
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_rstd:
                rstd_s, k = _rstd_saved(rstd_in[r])
            else:  # (1)-(2) on h; the row's new_residual goes to dr3, overwritten by dh below
                ss = _add_sumsq(x3, r3, b, i, like, dr3)
                rstd_s, k = _add_rstd(ss, x3, r3, b, i, like, eps)
            if k == 0:
                s = _add_dot(dy3, x3, r3, b, i, like, w, 0)
                c = _add_coef(s, dy3, x3, r3, b, i, like, w, rstd_s, 0)  # (6)
                outside = _add_bwd_row(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, 0, c,
                                       dx3, dr3, dw_parts, p)
            else:  # a scaled float64 row (rare)
                s = _add_dot_scaled_row(dy3, x3, r3, b, i, like, w, k)
                c = _add_coef(s, dy3, x3, r3, b, i, like, w, rstd_s, k)
                outside = _add_bwd_scaled_row(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s,
                                              k, c, dx3, dr3, dw_parts, p)
            if outside:  # a rare row: dh again, rounded once
                _add_dh_exact(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, k, c, dx3, dr3)


@njit(**_INL)
def _add_dh_and_dot(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, c, dx3, dr3, dw_parts,
                    p, b1, i1, hw):
    """Row (b, i)'s dh (unscaled, a weight), rounded as ``_add_bwd_row`` rounds it, while
    summing Σ dxhat·h of row (b1, i1) in the lanes of ``_add_dot`` (same order, so the same
    bits): ``_bwd_row_and_dot`` on h. ``hw``: None, or True where the CPU rounds dx and
    dresidual to bfloat16 (``_add_by_cpu``), a block at a time (``store_lanes_flushed``).
    Returns (the sum, whether row (b, i) must be written again by the general row code: a dh
    outside the float32 route, or one the CPU flushed to zero)."""
    n = x3.shape[2]
    g, dro, x, r = dy3[b, i], dro3[b, i], x3[b, i], r3[b, i]  # (N,) each: row (b, i)
    dx, dr, dw = dx3[b, i], dr3[b, i], dw_parts[p]
    g1, x1, r1 = dy3[b1, i1], x3[b1, i1], r3[b1, i1]  # row (b1, i1)
    acc = _lanes()
    dh_blk = _lanes32()  # the block's float32 dh, for ``store_lanes_flushed``
    outside = False
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        _read_ahead(g1, (j0,))
        _read_ahead(x1, (j0,))
        _read_ahead(r1, (j0,))
        if has_dro:  # read here only
            _read_ahead(dro, (j0,))
        _write_ahead(dx, (j0,))
        _write_ahead(dr, (j0,))
        for lane in range(LANES):
            j = j0 + lane
            hhat = _h_of(x[j], r[j], like) * rstd_s  # (3)
            dh = _add_dh(g[j], hhat, w[j], rstd_s, c, dro[j], has_dro)
            dxj, drj = as_work(dh, x3, dx3), as_work(dh, r3, dr3)
            if hw is None:
                dx[j] = from_work(dxj, dx3)
                dr[j] = from_work(drj, dr3)
            else:
                dh_blk[lane] = dxj  # dx and dresidual both bfloat16: one value
            outside |= outside_work(dxj, dx3) | outside_work(drj, dr3)
            dw[j] += to_f64(g[j]) * hhat  # (8)
        if hw is not None:  # rounded by the CPU; a subnormal dh flags the row
            outside |= store_lanes_flushed(dh_blk, dx3, (b, i, j0))
            outside |= store_lanes_flushed(dh_blk, dr3, (b, i, j0))
        for lane in range(LANES):  # a loop of its own, as in ``_bwd_row_and_dot``
            j = j0 + lane
            acc[lane] += _dxhat_h(g1[j], w[j], x1[j], r1[j], like, 0)  # the next row's
    for lane in range(n - n64):
        j = n64 + lane
        hhat = _h_of(x[j], r[j], like) * rstd_s
        dh = _add_dh(g[j], hhat, w[j], rstd_s, c, dro[j], has_dro)
        dxj, drj = as_work(dh, x3, dx3), as_work(dh, r3, dr3)
        dx[j] = from_work(dxj, dx3)
        dr[j] = from_work(drj, dr3)
        outside |= outside_work(dxj, dx3) | outside_work(drj, dr3)
        dw[j] += to_f64(g[j]) * hhat
        acc[lane] += _dxhat_h(g1[j], w[j], x1[j], r1[j], like, 0)
    return _lane_tree(acc), outside


@njit(**_INL)
def _add_bwd_pipelined_rows(dy3, dro3, has_dro, x3, r3, like, w, rstd_in, dx3, dr3,
                            dw_parts, redo, hw, t0, t1):
    """The common call (a saved rstd in range, a weight), as ``_rms_bwd_pipelined``: every row
    of a part through one loop that writes row r's dh while summing row r + 1's Σ dxhat·h (the
    part's last row sums itself again, unused); a row whose Σ dxhat·h left [SS_LO, SS_HI]
    (``_c_in_range``: not a row of dy = 0), or whose dh left the float32 route or was flushed
    by the CPU (``_add_dh_and_dot``; ``hw``: ``_add_by_cpu``), is flagged in ``redo`` and
    written again by ``_add_bwd_redo``. Inlined with ``has_dro`` a constant."""
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        r0 = p * ROWS_PER_PART
        r1 = min(m, r0 + ROWS_PER_PART)
        if r1 <= r0:  # an empty batch still has one (zeroed) part
            continue
        b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
        s = _add_dot(dy3, x3, r3, b, i, like, w, 0)  # the first row's
        for r in range(r0, r1):
            b1, i1 = _row_after(b, i, nr, r + 1 == r1)  # the row summed while r is written
            rstd_s = rstd_in[r]
            c = s * rstd_s / x3.shape[2]  # (6), as ``_add_coef`` for s in [SS_LO, SS_HI]
            in_range = _c_in_range(s, rstd_s, dy3, b, i)
            s, outside = _add_dh_and_dot(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, c,
                                         dx3, dr3, dw_parts, p, b1, i1, hw)
            redo[r] = outside or not in_range
            b, i = b1, i1


@njit(**_SER)
def _add_bwd_redo(dy3, dro3, has_dro, x3, r3, like, w, rstd_in, dx3, dr3, redo, r0, r1):
    """dx and dresidual of the rows in [r0, r1) that ``_add_bwd_pipelined_rows`` flagged,
    written again as the general backward writes them (c by ``_add_coef``, then
    ``_add_bwd_row``), so with its bits. Only dh: the loop added these rows' dweight terms
    already, so the row's terms here go to a scratch row. Compiled by the first call that
    flags a row."""
    nr = x3.shape[1]
    scratch = np.zeros((1, x3.shape[2]))
    for r in range(r0, r1):
        if redo[r]:
            b, i = r // nr, r % nr
            rstd_s = rstd_in[r]
            s = _add_dot(dy3, x3, r3, b, i, like, w, 0)  # the pipelined loop's sum, bit for bit
            c = _add_coef(s, dy3, x3, r3, b, i, like, w, rstd_s, 0)  # (6)
            if _add_bwd_row(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, 0, c, dx3, dr3,
                            scratch, 0):
                _add_dh_exact(dy3, dro3, has_dro, x3, r3, like, b, i, w, rstd_s, 0, c, dx3, dr3)


# Four kernels, one per has_dro for each loop: each compiles only its own inlined copy of the
# row loop. A flag passed at run time compiled both copies into every specialisation, about
# twice the time; so would a test of ``dro3 is None``, whose branch Numba prunes only where the
# argument is None.
@njit(**_PAR)
def _add_rms_bwd_dro(dy3, dro3, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3, dw_parts,
                     t0, t1):
    """The general backward with a dresidual_out (``like`` as in ``_add_rms_fwd``: one
    compiled copy each)."""
    _wide_vectors_for(x3)
    _add_bwd_rows(dy3, dro3, True, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3,
                  dw_parts, t0, t1)


@njit(**_PAR)
def _add_rms_bwd_no_dro(dy3, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3, dw_parts,
                        t0, t1):
    """The general backward without a dresidual_out (dy3 stands in for it, never read)."""
    _wide_vectors_for(x3)
    _add_bwd_rows(dy3, dy3, False, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3,
                  dw_parts, t0, t1)


@njit(**_PAR)
def _add_rms_bwd_pipelined_dro(dy3, dro3, x3, r3, like, w, rstd_in, dx3, dr3, dw_parts, redo,
                               hw, t0, t1):
    """The pipelined backward (a saved rstd in range, a weight) with a dresidual_out."""
    _wide_vectors_for(x3)
    _add_bwd_pipelined_rows(dy3, dro3, True, x3, r3, like, w, rstd_in, dx3, dr3, dw_parts,
                            redo, hw, t0, t1)


@njit(**_PAR)
def _add_rms_bwd_pipelined_no_dro(dy3, x3, r3, like, w, rstd_in, dx3, dr3, dw_parts, redo,
                                  hw, t0, t1):
    """The pipelined backward without a dresidual_out."""
    _wide_vectors_for(x3)
    _add_bwd_pipelined_rows(dy3, dy3, False, x3, r3, like, w, rstd_in, dx3, dr3, dw_parts,
                            redo, hw, t0, t1)


def _add_rms_bwd_any(dy3, dro3, has_dro, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3,
                     dw_parts, t0, t1):
    """A saved rstd in the range of unscaled sums runs the pipelined kernel, every other call
    the general one (as ``_rms_bwd_v6``); each with or without a dresidual_out."""
    if has_rstd and _saved_rstd_in_range(rstd_in):
        m = x3.shape[0] * x3.shape[1]
        r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_PART)
        redo = np.empty(m, np.bool_)  # only rows [r0, r1) are written and read
        hw = _add_by_cpu(x3, r3, dx3, dr3)
        if has_dro:
            _add_rms_bwd_pipelined_dro(dy3, dro3, x3, r3, like, w, rstd_in, dx3, dr3, dw_parts,
                                       redo, hw, t0, t1)
        else:
            _add_rms_bwd_pipelined_no_dro(dy3, x3, r3, like, w, rstd_in, dx3, dr3, dw_parts,
                                          redo, hw, t0, t1)
        if redo[r0:r1].any():
            _add_bwd_redo(dy3, dro3, has_dro, x3, r3, like, w, rstd_in, dx3, dr3, redo, r0, r1)
    elif has_dro:
        _add_rms_bwd_dro(dy3, dro3, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3,
                         dw_parts, t0, t1)
    else:
        _add_rms_bwd_no_dro(dy3, x3, r3, like, w, eps, has_rstd, rstd_in, dx3, dr3, dw_parts,
                            t0, t1)


# ============================================================================================
# LayerNorm, written as the RMSNorm kernels are (for the RMSNorm/LayerNorm comparison): Σx,
# (Σd, Σd²) and the backward's sums in the 64 lanes; the forward's blocks pipelined.
# ============================================================================================
@njit(**_INL)
def _sum_lanes(x3, b, i):
    """Σ_j x_j of row (b, i) in the 64 lanes of ``_sumsq_v3`` (same order)."""
    n = x3.shape[2]
    acc = _lanes()
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            acc[lane] += to_f64(x3[b, i, j0 + lane])
    for lane in range(n - n64):
        acc[lane] += to_f64(x3[b, i, n64 + lane])
    return _lane_tree(acc)


@njit(**_INL)
def _ln_stats(s, x3, b, i, eps):
    """(mu, rstd) of row (b, i) from its Σx: mu = Σx/N; (Σd, Σd²), d = x − mu, in 64 lanes
    each; var = (Σd² − (Σd)²/N)/N, the corrected two-pass formula (= the oracle's refined mu)."""
    n = x3.shape[2]
    mu = s / n  # (1)
    acc_d = _lanes()
    acc_q = _lanes()
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            d = to_f64(x3[b, i, j0 + lane]) - mu
            acc_d[lane] += d
            acc_q[lane] += d * d
    for lane in range(n - n64):
        d = to_f64(x3[b, i, n64 + lane]) - mu
        acc_d[lane] += d
        acc_q[lane] += d * d
    sd = _lane_tree(acc_d)
    sq = _lane_tree(acc_q)
    mu_refined = mu + sd / n
    var = (sq - sd * (sd / n)) / n  # (3) biased variance about the refined mean
    return mu_refined, 1.0 / math.sqrt(var + eps)  # (4)


@njit(**_INL)
def _mu_parts(mu, rstd):
    """(mu_hi, mu_lo, whether the row may take the float32 y): mu in two float32 parts, mu_hi
    = fl32(mu), mu_lo = fl32(mu − mu_hi), for d = (x − mu_hi) − mu_lo in float32
    (``_ln_y32``).

    Why d then carries x − mu to a few float32 roundings (x on float32's grid, as every half
    and float32 value is), where mu's part below mu_lo (``rest``) is zero or mu_lo is normal
    (then |rest| <= 2^-24·|mu_lo|):

    - x = mu_hi: d = −mu_lo, which is x − mu but for ``rest``.
    - x ≠ mu_hi: |x − mu| is at least half the gap beside mu_hi (the float32 value nearest
      mu), so at least 2^-26·|mu| and at least |mu_lo|. Either x is within a factor 2 of
      mu_hi, x − mu_hi is exact and d one rounding of it minus mu_lo; or |x − mu_hi| >=
      |mu_hi|/2, and subtracting mu_lo cancels nothing: two roundings.

    So every nonzero |d| is at least about d_min = min(2^-26·|mu|, |mu_lo|), and
    d_min·rstd >= 2^-125 keeps every xhat = d·rstd a normal float32: none loses bits to
    underflow, which a large weight could lift into a normal y. A zero mean fails this (d = x
    then, of any size), and its row is written in float64, rounded once. Products that
    overflow give an inf or NaN y, which the loop flags (``outside_work``)."""
    mu_hi = np.float32(mu)
    lo = mu - np.float64(mu_hi)  # exact: mu_hi is mu rounded
    mu_lo = np.float32(lo)
    rest = lo - np.float64(mu_lo)  # exact too
    d_min = 2.0**-26 * abs(mu)
    if mu_lo != 0:
        d_min = min(d_min, abs(np.float64(mu_lo)))
    ok = (rest == 0 or abs(mu_lo) >= TINY32) and d_min * rstd >= 2.0**-125
    return mu_hi, mu_lo, ok


@njit(**_INL)
def _ln_y64(xv, mu, rstd, wj, bj):
    """Eqs. (5)-(6) in float64: y_j = (x_j − mu)·rstd·w_j + b_j (scalars only, as ``_ln_dx``)."""
    return (xv - mu) * rstd * wj + bj


@njit(**_INL)
def _ln_y32(xw, mu_hi, mu_lo, rstd_w, wwj):
    """Eqs. (5)-(6) in float32, no bias: y_j = ((x_j − mu_hi) − mu_lo)·rstd·w_j
    (``_mu_parts``)."""
    return ((xw - mu_hi) - mu_lo) * rstd_w * wwj


@njit(**_INL)
def _ln_write_and_sum(x3, b, i, w, ww, bias, y3, mu, rstd, b1, i1, hw):
    """Row (b, i)'s y = (x − mu)·rstd·w + b while summing Σx of row (b1, i1) in the lanes of
    ``_sum_lanes`` (same order, so the same bits). Eqs. (5)-(6). Without a bias, b is a row of
    -0.0, the exact additive identity (v + (-0.0) is v, bit for bit, also for v = ±0): no
    per-element branch, which kept this loop from vectorising. Returns the sum and whether
    row (b, i) must be written again (``_ln_fwd_redo``). ``ww``: None, y in float64 rounded
    to the working precision; or the weight in float32 (``_ln_f32_weight``: a half y, no
    bias), y in float32 arithmetic (``_ln_y32``; a row outside ``_mu_parts`` is flagged).
    ``hw``: None, or True where the CPU rounds the block's float32 y to bfloat16
    (``_bf16_by_cpu``: ``store_lanes_flushed``, as the RMSNorm backward's dx); a subnormal y
    then flags the row too."""
    n = x3.shape[2]
    acc = _lanes()
    y_blk = _lanes32()  # the block's float32 y, for ``store_lanes_flushed``
    mu_hi, mu_lo, ok = _mu_parts(mu, rstd)  # the float32 route's mu and rows
    rstd_w = np.float32(rstd)
    outside = ww is not None and not ok  # whether the row needs ``_ln_fwd_redo``
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        _read_ahead(x3, (b1, i1, j0))
        _write_ahead(y3, (b, i, j0))
        for lane in range(LANES):
            j = j0 + lane
            if ww is None:
                yj = as_work(_ln_y64(to_f64(x3[b, i, j]), mu, rstd, w[j], bias[j]), x3, y3)
            else:
                yj = _ln_y32(to_work(x3[b, i, j], y3), mu_hi, mu_lo, rstd_w, ww[j])
            if hw is None:
                y3[b, i, j] = from_work(yj, y3)
            else:
                y_blk[lane] = yj
            outside |= outside_work(yj, y3)
        if hw is not None:  # (6) rounded by the CPU; a subnormal y flags the row
            outside |= store_lanes_flushed(y_blk, y3, (b, i, j0))
        for lane in range(LANES):  # a loop of its own, as in ``_write_and_sumsq``
            acc[lane] += to_f64(x3[b1, i1, j0 + lane])  # (1) of the next row
    for lane in range(n - n64):
        j = n64 + lane
        if ww is None:
            yj = as_work(_ln_y64(to_f64(x3[b, i, j]), mu, rstd, w[j], bias[j]), x3, y3)
        else:
            yj = _ln_y32(to_work(x3[b, i, j], y3), mu_hi, mu_lo, rstd_w, ww[j])
        y3[b, i, j] = from_work(yj, y3)
        outside |= outside_work(yj, y3)
        acc[lane] += to_f64(x3[b1, i1, j])
    return _lane_tree(acc), outside


@njit(**_SER)
def _ln_write_exact(x3, b, i, w, bias, y3, mu, rstd):
    """Row (b, i)'s y again, rounded once by ``from_f64`` (a half row with an inf or NaN, or
    a float64 value outside the bfloat16 normal range: see ``_halfbits.from_work``)."""
    for j in range(x3.shape[2]):
        y3[b, i, j] = from_f64(_ln_y64(to_f64(x3[b, i, j]), mu, rstd, w[j], bias[j]), y3)


@njit(**_PAR)
def _ln_fwd(x3, w, ww, bias, eps, y3, mean_out, rstd_out, redo, hw, t0, t1):
    """The rows of blocks [t0, t1) as one run through the pipelined loop, as
    ``_rms_fwd_pipelined`` (the last row sums itself again, unused); a half row with a y
    outside the normal range (or one the CPU flushed: ``hw``, ``_bf16_by_cpu``; or, with
    ``ww``, one outside ``_mu_parts``) is flagged in ``redo`` and written again by
    ``_ln_fwd_redo``."""
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    r0, r1 = _task_rows(x3.shape[0] * nr, t0, t1, ROWS_PER_BLOCK)
    if r1 <= r0:
        return
    b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
    s = _sum_lanes(x3, b, i)  # Σx of the first row
    for r in range(r0, r1):
        b1, i1 = _row_after(b, i, nr, r + 1 == r1)  # the row summed while r is written
        mu, rstd = _ln_stats(s, x3, b, i, eps)  # (1)-(4)
        mean_out[r] = mu
        rstd_out[r] = rstd
        s, redo[r] = _ln_write_and_sum(x3, b, i, w, ww, bias, y3, mu, rstd, b1, i1, hw)
        b, i = b1, i1


@njit(**_SER)
def _ln_fwd_redo(x3, w, ww, bias, eps, y3, redo, r0, r1):
    """y of the rows in [r0, r1) that ``_ln_fwd`` flagged, with the float64 statistics
    recomputed by the same code (so the same bits: a half input saves them in float32): by
    the loop's own route (``ww``) rounded element by element (``hw`` None: a row whose y the
    CPU flushed, so its bits do not depend on the CPU), and where that flags the row again
    (an inf or NaN y, or a row the float32 y cannot carry: ``_mu_parts``), in float64
    rounded once (``_ln_write_exact``). Compiled by the first call that flags a row."""
    nr = x3.shape[1]
    for r in range(r0, r1):
        if redo[r]:
            b, i = r // nr, r % nr
            mu, rstd = _ln_stats(_sum_lanes(x3, b, i), x3, b, i, eps)  # (1)-(4)
            _, outside = _ln_write_and_sum(x3, b, i, w, ww, bias, y3, mu, rstd, b, i, None)
            if outside:  # rounded once
                _ln_write_exact(x3, b, i, w, bias, y3, mu, rstd)


def _ln_f32_weight(w: np.ndarray, has_bias: bool, x3: np.ndarray,
                   y3: np.ndarray) -> np.ndarray | None:
    """The weight in float32 where LayerNorm's y is computed in float32 arithmetic
    (``_ln_y32``): a half y of half or float32 x (``_halfbits``' float32 route), and no bias
    (y + b can cancel to far below the float32 y's error, which a row test cannot rule out
    without flagging most rows of ordinary data). Else None: y in float64, rounded to the
    working precision. A type, as ``_tail``: each kernel's machine code has one of the two
    (Numba prunes the float32 branch where this is None; where it is an array, Numba types
    both and LLVM drops the other, a branch on a constant)."""
    if has_bias or y3.dtype not in (BF16_BITS, F16_BITS) or x3.dtype == np.float64:
        return None
    with np.errstate(over="ignore"):
        return w.astype(np.float32)  # a weight beyond float32 gives an inf y: a flagged row


def _ln_fwd_rows(x3, w, ww, bias, eps, y3, mean_out, rstd_out, t0, t1):
    """``_ln_fwd`` on blocks [t0, t1), then ``_ln_fwd_redo`` for the rows it flagged."""
    m = x3.shape[0] * x3.shape[1]
    r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_BLOCK)
    redo = np.empty(m, np.bool_)  # only rows [r0, r1) are written and read
    _ln_fwd(x3, w, ww, bias, eps, y3, mean_out, rstd_out, redo, _bf16_by_cpu(y3), t0, t1)
    if redo[r0:r1].any():
        _ln_fwd_redo(x3, w, ww, bias, eps, y3, redo, r0, r1)


@njit(**_INL)
def _dxhat_terms(g, x, w_j, mu):
    """(dxhat_j, dxhat_j·(x_j − mu)), dxhat = dy·w: the terms of eqs. (8)-(9), from the float64
    elements g = dy_j and x = x_j (scalars only, as ``_ln_dx``)."""
    dxhat = g * w_j
    return dxhat, dxhat * (x - mu)


@njit(**_INL)
def _ln_bwd_sums(dy3, x3, b, i, w, mu):
    """(Σ dxhat_j, Σ dxhat_j·(x_j − mu)) of row (b, i), 64 lanes each."""
    n = x3.shape[2]
    acc_g = _lanes()
    acc_gd = _lanes()
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        for lane in range(LANES):
            j = j0 + lane
            g, gd = _dxhat_terms(to_f64(dy3[b, i, j]), to_f64(x3[b, i, j]), w[j], mu)
            acc_g[lane] += g
            acc_gd[lane] += gd
    for lane in range(n - n64):
        j = n64 + lane
        g, gd = _dxhat_terms(to_f64(dy3[b, i, j]), to_f64(x3[b, i, j]), w[j], mu)
        acc_g[lane] += g
        acc_gd[lane] += gd
    return _lane_tree(acc_g), _lane_tree(acc_gd)


@njit(**_INL)
def _ln_dx(g, x, w_j, mu, rstd, c1, c2):
    """(dx_j, xhat_j) from the float64 elements g = dy_j and x = x_j. Eqs. (5), (10); the
    caller adds the dweight/dbias terms g·xhat and g (11). Scalars only: an array argument of an
    inlined per-element helper costs a reference count update per element, which keeps the
    loop from vectorising."""
    xhat = (x - mu) * rstd  # (5)
    return rstd * (g * w_j - c1 - xhat * c2), xhat  # (10)


@njit(**_PAR)
def _ln_bwd(dy3, x3, w, eps, has_stats, mean_in, rstd_in, dx3, want_dw, want_db, dw_parts,
            db_parts, t0, t1):
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        for r in range(p * ROWS_PER_PART, min(m, (p + 1) * ROWS_PER_PART)):
            b, i = r // nr, r % nr
            if has_stats:
                mu, rstd = mean_in[r], rstd_in[r]
            else:  # (1)-(4) recomputed with the forward's code
                mu, rstd = _ln_stats(_sum_lanes(x3, b, i), x3, b, i, eps)
            s1, s2 = _ln_bwd_sums(dy3, x3, b, i, w, mu)
            c1 = s1 / n  # (8) the path through mu
            c2 = s2 * rstd / n  # (9) the path through rstd
            outside = False
            for j in range(n):
                g = to_f64(dy3[b, i, j])
                dxj, xhat = _ln_dx(g, to_f64(x3[b, i, j]), w[j], mu, rstd, c1, c2)
                dx_w = as_work(dxj, x3, dx3)  # through float32 for a half dx
                dx3[b, i, j] = from_work(dx_w, dx3)
                outside |= outside_work(dx_w, dx3)
                if want_dw:
                    dw_parts[p, j] += g * xhat  # (11)
                if want_db:
                    db_parts[p, j] += g
            if outside:
                _ln_dx_exact(dy3, x3, b, i, w, mu, rstd, c1, c2, dx3)


@njit(**_INL)
def _ln_dx_and_sums(dy3, x3, b, i, w, mu, rstd, c1, c2, dx3, want_db, dw_parts, db_parts, p,
                    b1, i1, mu1, hw):
    """Row (b, i)'s dx, dweight (and dbias) terms while summing (Σ dxhat, Σ dxhat·(x − mu1))
    of row (b1, i1) in the lanes of ``_ln_bwd_sums`` (same order, so the same bits). Returns
    the two sums and whether row (b, i)'s dx must be written again (``_ln_bwd_redo``).
    ``hw`` as in ``_ln_write_and_sum``: a CPU-rounded bfloat16 dx."""
    n = x3.shape[2]
    acc_g = _lanes()
    acc_gd = _lanes()
    dx_blk = _lanes32()  # the block's float32 dx, for ``store_lanes_flushed``
    outside = False  # whether the row needs ``_ln_dx_exact``
    n64 = n - n % LANES
    for j0 in range(0, n64, LANES):
        _read_ahead(dy3, (b1, i1, j0))
        _read_ahead(x3, (b1, i1, j0))
        _write_ahead(dx3, (b, i, j0))
        for lane in range(LANES):
            j = j0 + lane
            g = to_f64(dy3[b, i, j])
            dxj, xhat = _ln_dx(g, to_f64(x3[b, i, j]), w[j], mu, rstd, c1, c2)
            dx_w = as_work(dxj, x3, dx3)  # through float32 for a half dx
            if hw is None:
                dx3[b, i, j] = from_work(dx_w, dx3)
            else:
                dx_blk[lane] = dx_w
            outside |= outside_work(dx_w, dx3)
            dw_parts[p, j] += g * xhat  # (11)
            if want_db:
                db_parts[p, j] += g
        if hw is not None:  # (10) rounded by the CPU; a subnormal dx flags the row
            outside |= store_lanes_flushed(dx_blk, dx3, (b, i, j0))
        for lane in range(LANES):  # a loop of its own, as in ``_bwd_row_and_dot``
            j = j0 + lane
            g, gd = _dxhat_terms(to_f64(dy3[b1, i1, j]), to_f64(x3[b1, i1, j]), w[j], mu1)
            acc_g[lane] += g  # (8)-(9) of the next row
            acc_gd[lane] += gd
    for lane in range(n - n64):
        j = n64 + lane
        g = to_f64(dy3[b, i, j])
        dxj, xhat = _ln_dx(g, to_f64(x3[b, i, j]), w[j], mu, rstd, c1, c2)
        dx_w = as_work(dxj, x3, dx3)
        dx3[b, i, j] = from_work(dx_w, dx3)
        outside |= outside_work(dx_w, dx3)
        dw_parts[p, j] += g * xhat
        if want_db:
            db_parts[p, j] += g
        g, gd = _dxhat_terms(to_f64(dy3[b1, i1, j]), to_f64(x3[b1, i1, j]), w[j], mu1)
        acc_g[lane] += g
        acc_gd[lane] += gd
    return _lane_tree(acc_g), _lane_tree(acc_gd), outside


@njit(**_SER)
def _ln_dx_exact(dy3, x3, b, i, w, mu, rstd, c1, c2, dx3):
    """Row (b, i)'s dx again, rounded once by ``from_f64`` (as ``_ln_write_exact``); only dx:
    the parameter terms were added once already."""
    for j in range(x3.shape[2]):
        dxj, _ = _ln_dx(to_f64(dy3[b, i, j]), to_f64(x3[b, i, j]), w[j], mu, rstd, c1, c2)
        dx3[b, i, j] = from_f64(dxj, dx3)


@njit(**_PAR)
def _ln_bwd_pipelined(dy3, x3, w, mean_in, rstd_in, dx3, want_db, dw_parts, db_parts, redo, hw,
                      t0, t1):
    """The common call (saved mean and rstd, a weight or w = 1), as ``_rms_bwd_pipelined``:
    every row of a part through one loop that writes row r's dx and parameter terms while
    summing row r + 1's sums (the part's last row sums itself again, unused); a half row with
    a dx outside the normal range (or one the CPU flushed: ``hw``, ``_bf16_by_cpu``) is
    flagged in ``redo`` and written again by ``_ln_bwd_redo``."""
    _wide_vectors_for(x3)
    nr = x3.shape[1]
    m = x3.shape[0] * nr
    n = x3.shape[2]
    for p in range(t0, t1):  # this call's share of the tasks (``_launch``)
        _zero_part(dw_parts, p)
        _zero_part(db_parts, p)
        r0 = p * ROWS_PER_PART
        r1 = min(m, r0 + ROWS_PER_PART)
        if r1 <= r0:  # an empty batch still has one (zeroed) part
            continue
        b, i = r0 // nr, r0 % nr  # row r; the next by _row_after
        s1, s2 = _ln_bwd_sums(dy3, x3, b, i, w, mean_in[r0])  # the first row's
        for r in range(r0, r1):
            rn = min(r + 1, r1 - 1)  # the row summed while row r is written
            b1, i1 = _row_after(b, i, nr, r + 1 == r1)  # rn's (b, i)
            mu, rstd = mean_in[r], rstd_in[r]
            c1 = s1 / n  # (8)
            c2 = s2 * rstd / n  # (9)
            s1, s2, redo[r] = _ln_dx_and_sums(dy3, x3, b, i, w, mu, rstd, c1, c2, dx3, want_db,
                                              dw_parts, db_parts, p, b1, i1, mean_in[rn],
                                              hw)
            b, i = b1, i1


@njit(**_SER)
def _ln_bwd_redo(dy3, x3, w, mean_in, rstd_in, dx3, redo, r0, r1):
    """dx of the rows in [r0, r1) that ``_ln_bwd_pipelined`` flagged, with the loop's c1 and
    c2 (the row's sums in the same lanes, so the same bits): by the loop's element-by-element
    rounding (``hw`` None: a row whose dx the CPU flushed), and where a dx is inf or NaN
    there, by ``_ln_dx_exact``. Compiled by the first call that flags a row."""
    nr = x3.shape[1]
    n = x3.shape[2]
    scratch = np.zeros((1, n))  # the parameter terms, added once already
    for r in range(r0, r1):
        if redo[r]:
            b, i = r // nr, r % nr
            mu, rstd = mean_in[r], rstd_in[r]
            s1, s2 = _ln_bwd_sums(dy3, x3, b, i, w, mu)
            c1, c2 = s1 / n, s2 * rstd / n  # (8)-(9)
            _, _, outside = _ln_dx_and_sums(dy3, x3, b, i, w, mu, rstd, c1, c2, dx3, False,
                                            scratch, scratch, 0, b, i, mu, None)
            if outside:  # an inf or NaN dx: rounded once
                _ln_dx_exact(dy3, x3, b, i, w, mu, rstd, c1, c2, dx3)  # (10)


def _ln_bwd_any(dy3, x3, w, eps, has_stats, mean_in, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1):
    """The common call (saved statistics) runs ``_ln_bwd_pipelined``, every other call
    ``_ln_bwd`` (a Python-level choice, as ``_rms_bwd_v6``: each kernel compiles alone). A
    call without a weight runs the pipelined kernel with w = 1 and partial rows for a dweight
    nobody asked for (``_ln_bwd`` took 2.9x its time per element for float32, 2048 rows of
    2048)."""
    if has_stats and dw_parts.shape[1] == x3.shape[2]:  # a weight or none
        m = x3.shape[0] * x3.shape[1]
        r0, r1 = _task_rows_py(m, t0, t1, ROWS_PER_PART)
        redo = np.empty(m, np.bool_)  # only rows [r0, r1) are written and read
        _ln_bwd_pipelined(dy3, x3, w, mean_in, rstd_in, dx3, want_db, dw_parts, db_parts, redo,
                          _bf16_by_cpu(dx3), t0, t1)
        if redo[r0:r1].any():
            _ln_bwd_redo(dy3, x3, w, mean_in, rstd_in, dx3, redo, r0, r1)
    else:
        _ln_bwd(dy3, x3, w, eps, has_stats, mean_in, rstd_in, dx3, want_dw, want_db, dw_parts,
                db_parts, t0, t1)


# ============================================================================================
# Python side: validation (rmsref._shapes), layouts, dtypes, launching
# ============================================================================================
#: Below this many elements a call runs on the calling thread alone (a thread hand-off costs
#: tens of microseconds, more than such a call's work).
SERIAL_BELOW = 1 << 15


def thread_count() -> int:
    """The threads a kernel call uses: ``numba.get_num_threads()`` once Numba's threading layer
    has started (``numba.set_num_threads`` starts it), ``NUMBA_NUM_THREADS`` before.

    ``numba.get_num_threads()`` itself starts the layer, OpenMP here, and a process that has
    started GNU OpenMP cannot use it again in a forked child: the child's first parallel region
    aborts it ("fork() called from a process already using GNU OpenMP"). The kernels never use
    the layer, so they read the count without starting it, and a process that called them can
    fork a child that runs ``parallel=True`` code (Numba's, or torch's on the same OpenMP).
    """
    import numba
    from numba.np.ufunc import parallel

    if getattr(parallel, "_is_initialized", True):
        return int(numba.get_num_threads())
    return int(numba.config.NUMBA_NUM_THREADS)


class _Launcher:
    """Runs a kernel's tasks (blocks of rows, or parts of the dweight reduction) on threads.

    A kernel is a serial ``nogil`` function of its arguments and a task range [t0, t1): it runs
    tasks t0, ..., t1 - 1 in order, each on rows fixed by the task number. The launcher splits
    [0, ntasks) into one contiguous range per thread (:func:`thread_count`), runs the last range
    on the calling thread and the others on a pool of Python threads, which run at once because
    the kernels release the GIL. Which thread runs a task never changes what the task computes,
    so the bits do not depend on the thread count. Serial kernels compile in about half the
    time of ``parallel=True`` ones (no parfor passes, no gufunc wrapper: bench/compile.py), and
    no OpenMP or TBB pool is started, so a process that called them can fork.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: Any = None
        self._workers = 0
        self._pid = 0

    def _executor(self, workers: int) -> Any:
        """The pool, (re)made when it has too few workers or belongs to the parent of a forked
        process (whose pool threads do not exist in the child)."""
        with self._lock:
            if self._pool is None or self._workers < workers or self._pid != os.getpid():
                from concurrent.futures import ThreadPoolExecutor

                if self._pool is not None and self._pid == os.getpid():
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rmsref-numba")
                self._workers = workers
                self._pid = os.getpid()
            return self._pool

    def __call__(self, kernel: Callable[..., Any], ntasks: int, elements: int,
                 *args: Any) -> None:
        threads = min(thread_count(), ntasks)
        if threads <= 1 or elements < SERIAL_BELOW:
            kernel(*args, 0, ntasks)
            return
        cuts = [ntasks * k // threads for k in range(threads + 1)]
        pool = self._executor(threads - 1)
        futures = [pool.submit(kernel, *args, cuts[k], cuts[k + 1]) for k in range(threads - 1)]
        kernel(*args, cuts[-2], cuts[-1])
        for f in futures:
            f.result()


_launch = _Launcher()


def _check_real(a: np.ndarray, name: str) -> None:
    if a.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {a.dtype}; the numba_cpu backend computes float16, bfloat16, "
            "float32 and float64 (for complex inputs use the function of the same name in rmsref, "
            "the NumPy oracle)"
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


def _rms_norm_forward(
    kernel: Callable[..., Any],
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    bias: Any,
    offset: float,
    partial: float | None,
    out_dtype: Any,
    out: np.ndarray | None,
    rows_per_task: int = ROWS_PER_BLOCK,
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
    m = x3.shape[0] * x3.shape[1]
    _launch(kernel, -(-m // rows_per_task), x.size, x3, w, b if has_bias else w, has_bias, kf,
            eps, y3, rstd)
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
    rstd: Any,
    bias: Any,
    offset: float,
    partial: float | None,
    out: np.ndarray | None,
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
    # dweight's partial rows also where no dweight is wanted but v6's pipelined kernel may run
    # (it sums them unasked, which costs far less than the one-row-at-a-time loop of v3)
    pipelined = kf == n and not want_db
    dw_parts = np.empty((nparts, n) if want_dw or pipelined else (nparts, 0))
    db_parts = np.empty((nparts, n) if want_db else (nparts, 0))
    has_rstd = saved is not None
    _launch(kernel, nparts, x.size, dy3, x3, w, kf, eps, has_rstd, saved if has_rstd else w,
            dx3, want_dw, want_db, dw_parts, db_parts)
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
        _rms_fwd_v5, x, normalized_shape, weight, eps, bias=bias, offset=offset,
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
        _rms_bwd_v6, dy, x, normalized_shape, weight, eps, rstd=rstd, bias=bias,
        offset=offset, partial=partial, out=out,
    )


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
    like = _rounding_tag(x3) if rounded else None  # what h is rounded to, or none
    _launch(_add_rms_fwd_rows, -(-rstd.size // ROWS_PER_BLOCK), x.size, x3, r3, like, w, eps,
            y3, nr3, rstd)
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
    dw_parts = np.empty((nparts, n))  # summed with or without a weight (no branch per element)
    has_rstd = saved is not None
    like = _rounding_tag(x3) if rounded else None  # as in add_rms_norm_forward
    _launch(_add_rms_bwd_any, nparts, x.size, dy3, dro3, has_dro, x3, r3, like, w, eps,
            has_rstd, saved if has_rstd else w, dx3, dr3, dw_parts)
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
    ww = _ln_f32_weight(w, b is not None, x3, y3)
    if b is None:
        b = np.full(n, -0.0)  # the exact additive identity (see _ln_write_and_sum)
    _launch(_ln_fwd_rows, -(-m // ROWS_PER_BLOCK), x.size, x3, w, ww, b, eps, y3, mean, rstd)
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
    has_stats = saved_rstd is not None
    # dweight's partial rows also where none is wanted but the pipelined kernel runs (saved
    # statistics): it sums them unasked, as RMSNorm's does
    dw_parts = np.empty((nparts, n) if want_dw or has_stats else (nparts, 0))
    db_parts = np.empty((nparts, n) if want_db else (nparts, 0))
    _launch(_ln_bwd_any, nparts, x.size, dy3, x3, w, eps, has_stats,
            saved_mean if has_stats else w, saved_rstd if has_stats else w, dx3, want_dw,
            want_db, dw_parts, db_parts)
    _written(dx3, dx)
    return LayerNormGrads(
        dx, _param_grad(dw_parts, w_arr, shape), _param_grad(db_parts, b_arr, shape)
    )
