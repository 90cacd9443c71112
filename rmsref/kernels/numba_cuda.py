r"""RMSNorm on a CUDA GPU with ``numba.cuda`` (the numba-cuda package); also runs in the simulator.

Same function names and signatures as the oracle (:mod:`rmsref.rmsnorm`), plus a keyword-only
``launch=`` to force a launch configuration. Inputs are float32, float16 or bfloat16; sums run in
float32 (as every production GPU kernel does); ``y`` is rounded once to the output dtype; ``rstd``
is saved in float32. Half-precision data is read and written as uint16 bit patterns and converted in
registers (:mod:`rmsref.kernels._halfbits_cuda`), because Numba has no bfloat16 arrays.

Math (one row of N features, K = N or floor(N·p) for ``partial=p``, weight used as offset + w):

    (1) ms = (1/K) Σ_{j<K} h_j²      (2) rstd = 1/sqrt(ms + eps)      (3) xhat = h·rstd
    (4) y = xhat·(offset + w) + b
    (5) dxhat = dy·(offset + w)      (6) c = (1/K) Σ_j dxhat_j·xhat_j
    (7) dx = rstd·(dxhat − [j<K]·xhat·c)     (8) dweight = Σ_rows dy·xhat     (9) dbias = Σ_rows dy

with h = x, or h = x + residual for the fused residual add ("fp32-sum": the float32 sum;
"rounded-sum": that sum rounded to x's dtype first).

Variants (llm.c style: each line says what changed from the previous one)
--------------------------------------------------------------------------
forward ``block``  one block of T threads per row. Pass 1: thread t sums h_j² for j = t, t+T, …
                   in a float32 register; the T partial sums meet in a tree (log2 T halving
                   steps: slot t += slot t+s for s = T/2, …, 1). The steps down to 32 slots go
                   through shared memory with ``syncthreads`` between them; the last five, inside
                   warp 0, are a ``shfl_xor_sync`` butterfly, whose lane 0 adds the same values in
                   the same order. Pass 2 re-reads the row (from L1/L2) and writes y.
held rows          (``Launch.held``; both variants, and the backward) each thread keeps its
                   C = ceil(N/T) elements in registers between the passes instead of re-reading
                   them: the loop over them is unrolled (C is a compile-time constant), every load
                   is issued before the first is used, and offset + w (and b) are loaded before
                   the reduction, so their latency hides behind it. Same operations in the same
                   order as the re-read row: the same bits (``tests/cudasim``, in the simulator
                   and on an H200). The two are compiled apart, so on a GPU the compiler could
                   in principle fuse a multiply and an add in one and not the other.
forward ``warp``   as ``block``, but one 32-lane warp per row and T/32 rows per block; the sum is
                   a butterfly of ``shfl_xor_sync`` (no shared memory, no block barrier). For
                   N ≤ 1024, where a block per row would leave most threads idle. The simulator
                   has no warp shuffles: there the same butterfly exchanges values through
                   shared memory (same additions, same order), so the variant's indexing is
                   tested there and the shuffle itself only on a GPU.
backward ``block`` G blocks stride over the rows (block b takes rows b, b+G, …). Per row, one pass
                   computes Σ h² (unless rstd is given) and Σ dxhat·h together (two shared-memory
                   trees), a second pass writes dx and adds dy·xhat (and dy) into per-thread
                   float32 accumulators for the columns that thread owns (j = t + i·T,
                   i < C = ceil(N/T)). At the end each block writes its accumulators as one
                   float32 *partial row* (G, N).
dweight stage 2    one thread per column sums the G partial rows in order b = 0, 1, …, G-1 and
                   rounds once to the weight's dtype. No atomics: every addition happens in a
                   fixed order, so dweight/dbias are the same bits on every run with the same
                   (M, N, T, G) — on any GPU, and in the simulator.

Launch configuration (chosen from N, see :func:`plan_forward` / :func:`plan_backward`)
-------------------------------------------------------------------------------------
* forward variant: ``warp`` when N ≤ 1024, else ``block`` (the same in the simulator). A warp
  per row keeps every lane busy for short rows (a 1024-thread block on N = 512 would idle half
  its threads and pay 10 barriers per row); past 1024 a warp would loop ≥ 32 times per lane and
  a block is better.
* threads per block, ``block`` variants: T = next power of two ≥ N/8, clamped to [32, 1024]. Each
  thread then handles ~8 elements per pass: enough independent loads in flight to cover memory
  latency, and the log2 T-step tree is a small part of the row's time. N = 4096 → 512,
  N ≥ 8192 → 1024 (N = 16384: 16 elements per thread). T must be a power of two for the tree.
* threads per block, ``warp`` forward: 256 (8 rows per block), a common occupancy sweet spot.
* held rows (see above): forward when C ≤ min(32, 8192/T), so up to N = 4096 with the automatic
  T (and a warp per row up to 1024); backward when C ≤ min(16, 512/T), so up to N = 512. Chosen
  from a run on an H200, where held rows past these limits were slower (fewer blocks fit).
* backward grid G = min(M, 1024): enough blocks to fill a 132-SM H100/H200 several times over,
  and a constant, so the partial-row layout (and hence dweight's bits) depends on the shapes only,
  not on which GPU runs it. Partial rows cost G·N·4 bytes (≤ 64 MiB at N = 16384).
* stage 2: 256 threads per block, one thread per column (coalesced: neighbouring threads read
  neighbouring columns of each partial row).
* every kernel is compiled with a launch bound of its T (``.maxntid`` in the PTX; stage 2: 1024,
  since T can be forced), so the compiler keeps to the registers T threads can share: without
  it the backward at T = 512 failed to launch on an H200 (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).

Forcing a configuration (tests do this so tiny inputs cover multi-block and tail paths)::

    k = rmsref.backend("numba_cuda")
    k.rms_norm_forward(x, 7, launch=k.Launch(threads=32))           # one call
    with k.launch_config(threads=64, variant="block", dw_blocks=2):  # every call in the block
        ...

Host API
--------
NumPy arrays (anything with ``__array__``) are copied to the device and the results copied back:
NumPy in, NumPy out (``rstd`` float32, shape ``lead + (1,)*k`` like the oracle's). Objects with
``__cuda_array_interface__`` (numba device arrays, CuPy arrays, torch CUDA tensors) are used in
place, without copies, and the results are of the same kind (torch in, torch out). The CUDA array
interface has no bfloat16 type: pass bfloat16 device data as its uint16/int16 bits (torch
bfloat16 tensors are viewed as int16 automatically and returned as bfloat16). All arrays of one
call must be on the same side. Device rows must be viewable as (M, N) without a copy.

Every call starts from the library's one input contract (``rmsref._shapes.prepare``), device
arrays included: they are checked from their shapes and dtypes by the same rules, with the same
errors, as the oracle's NumPy arguments. What this backend adds on top: float32/float16/bfloat16
only, and a device ``rstd`` must be float32.

For benchmarks, :func:`prepare_forward` / :func:`prepare_backward` move operands and allocate
outputs once and return a :class:`Prepared` whose ``run()`` only enqueues the kernels.

Numerics and limits
-------------------
float32 sums overflow for |h| ≳ 1.8e19 and lose small rows below ~1e-19 (the oracle rescales
rows; these kernels, like the GPU kernels they stand for, do not). Reductions are blocked: the
error model is ``rmsref.tolerance`` with ``reduction="blocked", block=T`` (T = 32 for ``warp``).
On a GPU, NVVM contracts a·b + c into fused multiply-adds (one rounding where the source has
two); ``fastmath`` stays off, so sqrt and division are IEEE (``sqrt.rn``/``div.rn``). In the
simulator the kernels run as Python threads on NumPy float32 scalars without contraction, so the
last bit can differ from a GPU's: tests check indexing, tails, rounding and determinism there,
and ``bench/gpu_check.py`` checks device numerics on a GPU.

Every subscript is an unsigned index (``_ix``): with a signed one Numba adds the length to a
negative index, a compare and a select per access that also keeps the compiler from folding the
addresses of a held row into one base and constant offsets.

Not done yet (``bench/results/gpu-h200.md`` has the measured speeds): vectorised loads (two
bfloat16 or four float32 per load: each thread issues one 2- or 4-byte load per element, so a
bfloat16 row costs as many instructions as a float32 one for half the bytes), and a backward
that holds the row without losing occupancy (its 5C held values cost registers; from N = 1024
on it re-reads the row).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from rmsref._shapes import (
    NormInputs,
    ShapeLike,
    as_array,
    bfloat16,
    check_dtype,
    check_out,
    into_out,
    prepare,
    resolve_out_dtype,
    resolve_rounding,
    rows_view,
    stat_shape,
)
from rmsref.kernels import _halfbits_cuda as hb
from rmsref.rmsnorm import AddRMSNormGrads, RMSNormGrads

__all__ = [
    "BACKWARD_VARIANTS",
    "FORWARD_VARIANTS",
    "SIMULATOR",
    "Launch",
    "Plan",
    "Prepared",
    "add_rms_norm",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "launch_config",
    "plan_backward",
    "plan_forward",
    "prepare_backward",
    "prepare_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
]

SIMULATOR = hb.SIMULATOR
FORWARD_VARIANTS = ("block", "warp")
BACKWARD_VARIANTS = ("block",)
#: Variants whose warp shuffles the simulator emulates (see ``_warp_sum``).
SHUFFLE_VARIANTS = ("warp",)

WARP = 32
MAX_THREADS = 1024
MAX_DW_BLOCKS = 1024
STAGE2_THREADS = 256
WARP_ROW_LIMIT = 1024  # forward uses a warp per row up to this N
# Rows held in registers (see ``Launch.held``): at most C elements per thread, with
#   forward  C <= min(32, 8192 / T)   (N <= 4096 for the automatic T; a warp per row up to 1024)
#   backward C <= min(16, 512 / T)    (N <= 512 for the automatic T)
# Chosen from one run on an H200 (bench/results/gpu-h200.md). Held rows let every load of a
# thread be in flight at once, but cost registers, so fewer blocks fit on a multiprocessor; the
# backward holds 5C values (h, dy, offset + w and the dweight and dbias sums), and from N = 1024
# on (T >= 128) re-reading the row was faster there.
MAX_HELD_COLS, HELD_ELEMS = 32, 8192  # forward
MAX_HELD_COLS_BWD, HELD_ELEMS_BWD = 16, 512  # backward

# Storage kinds: how an array's elements are held on the device.
F32, F16, BF16 = 0, 1, 2
_KIND_OF_DTYPE = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, bfloat16: BF16}
_DTYPE_OF_KIND = {F32: np.dtype(np.float32), F16: np.dtype(np.float16), BF16: bfloat16}
_STORAGE_OF_KIND = {F32: np.dtype(np.float32), F16: np.dtype(np.uint16), BF16: np.dtype(np.uint16)}


# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """A forced launch configuration; ``None`` fields are chosen from N (see module docstring).

    Attributes
    ----------
    threads : int, optional
        Threads per block: a power of two in [1, 1024] (``warp`` variant: a multiple of 32).
        Also used for the dweight stage-2 kernel when given.
    variant : {"block", "warp"}, optional
        Forward variant. The backward has one variant (``block``).
    dw_blocks : int, optional
        Backward grid size G (the number of dweight partial rows), at most M.
    held : bool, optional
        Hold each thread's elements of the row in registers between the two passes (``True``)
        or read the row twice (``False``). Default: held when a thread has at most
        ``min(MAX_HELD_COLS, HELD_ELEMS / T)`` (forward) or
        ``min(MAX_HELD_COLS_BWD, HELD_ELEMS_BWD / T)`` (backward) elements of it. Both do the
        same operations in the same order; ``True`` past those limits is allowed (registers
        may spill).
    """

    threads: int | None = None
    variant: str | None = None
    dw_blocks: int | None = None
    held: bool | None = None


_LAUNCH: contextvars.ContextVar[Launch | None] = contextvars.ContextVar(
    "rmsref_numba_cuda_launch", default=None
)


@contextlib.contextmanager
def launch_config(
    threads: int | None = None, variant: str | None = None, dw_blocks: int | None = None,
    held: bool | None = None,
) -> Iterator[Launch]:
    """Force a launch configuration for every call inside the ``with`` block (thread-safe).

    Parameters
    ----------
    threads, variant, dw_blocks, held
        As in :class:`Launch`; ``None`` keeps the automatic choice.

    Returns
    -------
    contextlib.AbstractContextManager[Launch]
        Yields the forced :class:`Launch`.
    """
    forced = Launch(threads, variant, dw_blocks, held)
    token = _LAUNCH.set(forced)
    try:
        yield forced
    finally:
        _LAUNCH.reset(token)


@dataclass(frozen=True)
class Plan:
    """A resolved launch: the variant, threads per block T, rows per block, grid size, and
    C = ceil(N / T_row) elements of a row per thread (T_row = T, or 32 for a warp per row)."""

    variant: str
    threads: int
    rows_per_block: int
    blocks: int
    cols_per_thread: int = 1  # C: the row elements (and dweight accumulators) of one thread
    held: bool = False  # the C elements stay in registers between the two passes


def _next_pow2(v: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(v, 1))))


def _check_threads(t: int, variant: str) -> int:
    if not isinstance(t, (int, np.integer)) or t < 1 or t > MAX_THREADS or t & (t - 1):
        raise ValueError(f"threads per block must be a power of two in [1, 1024], got {t!r}")
    if variant == "warp" and t % WARP:
        raise ValueError(f"the warp variant needs a multiple of 32 threads per block, got {t}")
    return int(t)


def _block_threads(n: int) -> int:
    """T for the block variants: next power of two >= N/8, in [32, 1024] (~8 elements/thread)."""
    return min(MAX_THREADS, max(WARP, _next_pow2(math.ceil(n / 8))))


def _launch(launch: Launch | None) -> Launch:
    if launch is not None:
        if not isinstance(launch, Launch):
            raise TypeError(
                f"launch must be a numba_cuda.Launch (e.g. Launch(threads=64)) or None; "
                f"got {launch!r} ({type(launch).__name__})"
            )
        return launch
    return _LAUNCH.get() or Launch()


def plan_forward(n: int, m: int, launch: Launch | None = None) -> Plan:
    """The forward launch for M rows of N features (forced fields of ``launch`` win).

    Parameters
    ----------
    n, m : int
        Features per row and number of rows.
    launch : Launch, optional
        Forced fields; default the context's (:func:`launch_config`), else automatic.

    Returns
    -------
    Plan
    """
    lc = _launch(launch)
    variant = lc.variant
    if variant is None:
        variant = "warp" if n <= WARP_ROW_LIMIT else "block"
    if variant not in FORWARD_VARIANTS:
        raise ValueError(f"forward variant must be one of {FORWARD_VARIANTS}, got {variant!r}")
    if variant == "warp":
        t = _check_threads(lc.threads if lc.threads is not None else 256, variant)
        rows = t // WARP
        c = _cols(n, WARP)
        return Plan(variant, t, rows, max(1, math.ceil(m / rows)), c,
                    _held(lc, c, min(MAX_HELD_COLS, HELD_ELEMS // WARP)))
    t = _check_threads(lc.threads if lc.threads is not None else _block_threads(n), variant)
    c = _cols(n, t)
    return Plan(variant, t, 1, max(1, m), c, _held(lc, c, min(MAX_HELD_COLS, HELD_ELEMS // t)))


def plan_backward(n: int, m: int, launch: Launch | None = None) -> Plan:
    """The backward launch: T, grid G = min(M, 1024) (or forced), C = ceil(N/T) per thread.

    Parameters
    ----------
    n, m : int
        Features per row and number of rows.
    launch : Launch, optional
        Forced fields; default the context's (:func:`launch_config`), else automatic.

    Returns
    -------
    Plan
    """
    lc = _launch(launch)
    t = _check_threads(lc.threads if lc.threads is not None else _block_threads(n), "block")
    g = lc.dw_blocks if lc.dw_blocks is not None else max(1, min(m, MAX_DW_BLOCKS))
    if not isinstance(g, (int, np.integer)) or g < 1:
        raise ValueError(f"dw_blocks must be a positive int, got {g!r}")
    g = int(min(g, max(m, 1)))
    c = _cols(n, t)
    return Plan("block", t, 0, g, c, _held(lc, c, min(MAX_HELD_COLS_BWD, HELD_ELEMS_BWD // t)))


def _cols(n: int, t: int) -> int:
    """C = ceil(N / T): the elements of a row one of T threads handles (at least 1)."""
    return max(1, math.ceil(n / t))


def _held(lc: Launch, cols: int, limit: int) -> bool:
    """Whether the row stays in registers: forced, else when C <= limit."""
    if lc.held is None:
        return cols <= limit
    if not isinstance(lc.held, (bool, np.bool_)):
        raise TypeError(f"held must be True, False or None, got {lc.held!r}")
    return bool(lc.held)


# --------------------------------------------------------------------------------------------
# Device functions: element conversion and reductions
# --------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _ld_f32(v):
    return np.float32(v)


@cuda.jit(device=True)
def _st_f32(v):
    return np.float32(v)


_LOAD = {F32: _ld_f32, F16: hb.f16_to_f32, BF16: hb.bf16_to_f32}
_STORE = {F32: _st_f32, F16: hb.f32_to_f16, BF16: hb.f32_to_bf16}


if not SIMULATOR:

    @cuda.jit(device=True)
    def _warp_sum(v):
        """Butterfly sum over the 32 lanes of a warp (every lane gets the same bits: each step
        adds the same two values on both partner lanes, and float addition commutes)."""
        off = 16
        while off > 0:
            v += cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
            off //= 2
        return v

else:

    def _warp_sum(v):
        """Simulator twin of the shuffle butterfly (the simulator has no warp shuffles).

        ``shfl_xor_sync(mask, v, off)`` returns lane (lane ^ off)'s v; here the lanes exchange
        through shared memory between block barriers instead. The additions, their operands and
        their order are those of the GPU version, so the warp variant's indexing (rows per
        block, lanes striding over a row, tails, warps past the last row) is tested in the
        simulator; only the shuffle instruction itself is not (bench/gpu_check.py checks it).
        """
        sh = cuda.shared.array(MAX_THREADS, np.float32)
        tid = cuda.threadIdx.x
        off = 16
        while off > 0:
            sh[tid] = v
            cuda.syncthreads()
            v += sh[tid ^ off]  # lane ^ off flips the low 5 bits: the partner in this warp
            cuda.syncthreads()
            off //= 2
        return v


@cuda.jit(device=True)
def _halve_to(sh, tid, nthreads, last):
    """The shared-memory tree from T slots down to ``last``: step s adds slot tid+s into slot tid
    for tid < s, for s = T/2, T/4, …, last, each behind a barrier."""
    s = nthreads // 2
    while s >= last:
        if tid < s:
            sh[tid] += sh[tid + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def _block_sum(a, sh, tid, nthreads):
    """Sum a over the block by a tree; every thread gets the total.

    nthreads is a power of two. Step s adds slot tid+s into slot tid for tid < s, halving s:
    log2 T steps. The order of additions is fixed by T alone. From T >= 32 the last five steps
    (s = 16 … 1, inside warp 0) run as a warp butterfly (``_warp_sum``): lane 0 of the butterfly
    adds the same two values in the same order as slot 0 of the tree, so the bits are the tree's,
    with five barriers fewer.
    """
    sh[tid] = a
    cuda.syncthreads()
    if nthreads < WARP:
        _halve_to(sh, tid, nthreads, 1)
        total = sh[0]
    else:
        _halve_to(sh, tid, nthreads, WARP)
        v = _warp_sum(sh[tid])  # warp 0: slots 0..31; the other warps' sums are not used
        if tid == 0:
            sh[0] = v
        cuda.syncthreads()
        total = sh[0]
    cuda.syncthreads()  # everyone has read slot 0 before the next use overwrites it
    return total


@cuda.jit(device=True)
def _block_sum2(a, b, sh_a, sh_b, tid, nthreads):
    """As :func:`_block_sum` for two values at once (one barrier per step for both)."""
    sh_a[tid] = a
    sh_b[tid] = b
    cuda.syncthreads()
    last = 1 if nthreads < WARP else WARP
    s = nthreads // 2
    while s >= last:
        if tid < s:
            sh_a[tid] += sh_a[tid + s]
            sh_b[tid] += sh_b[tid + s]
        cuda.syncthreads()
        s //= 2
    if nthreads >= WARP:
        va = _warp_sum(sh_a[tid])  # as in _block_sum: the tree's last five steps, same bits
        vb = _warp_sum(sh_b[tid])
        if tid == 0:
            sh_a[0] = va
            sh_b[0] = vb
        cuda.syncthreads()
    ta = sh_a[0]
    tb = sh_b[0]
    cuda.syncthreads()  # everyone has read slot 0 before the next row overwrites it
    return ta, tb


# --------------------------------------------------------------------------------------------
# Kernel options and factories. A kernel is specialised at build time on the storage kinds of its
# arrays and on which optional arrays exist (closure constants: the dead branches compile away);
# its options record is the cache key.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardOptions:
    """What one forward kernel is built for.

    Storage kinds are ``F32``, ``F16``, ``BF16``; ``None`` marks an absent optional array (its
    argument is then a float32 placeholder that is never read).
    """

    variant: str  # "block" or "warp"
    threads: int  # T, threads per block
    x: int  # the kind of x
    y: int  # the kind of y (out_dtype)
    weight: int | None = None
    bias: int | None = None
    residual: int | None = None  # the fused add: the residual's kind, read and written back
    rounded: bool = False  # "rounded-sum": h is rounded to x's dtype before it is normalised
    cols: int = 0  # C elements of the row held in registers per thread; 0: read the row twice


@dataclass(frozen=True)
class BackwardOptions:
    """What one backward (stage 1) kernel is built for; kinds as in :class:`ForwardOptions`.

    dx has x's kind, dresidual the residual's.
    """

    threads: int  # T, threads per block
    cols: int  # C = ceil(N / T): dweight/dbias accumulators per thread
    x: int
    dy: int
    weight: int | None = None
    bias: bool = False  # dbias is wanted (the bias itself is not read)
    residual: int | None = None
    dresidual_out: int | None = None
    rounded: bool = False
    saved_rstd: bool = False  # use the forward's rstd instead of recomputing it
    held: bool = False  # hold h, dy and offset + w in registers instead of reading them twice


def _kernel_jit(threads: int):
    """``cuda.jit`` for a kernel launched with at most ``threads`` threads per block.

    The launch bound tells the compiler how many threads share a multiprocessor's 65,536
    registers, so it keeps each thread within 65536 / T of them (64 at T = 1024). Without it the
    compiler may use more, and the launch fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: the
    backward at N = 4096 (T = 512) did on an H200. The simulator has no registers and no such
    option.
    """
    return cuda.jit if SIMULATOR else cuda.jit(launch_bounds=threads)


@cuda.jit(device=True)
def _ix(v):
    """An index as uint64. Numba subscripts with a signed index first add the length to a
    negative one (a compare and a select per access, and a 64-bit address computed anew); with
    an unsigned one they do not. Every index in these kernels is >= 0."""
    return np.uint64(v)


def _load(kind: int | None):
    """The device function reading storage ``kind`` as float32 (float32 for an absent array)."""
    return _LOAD[F32 if kind is None else kind]


def _store(kind: int | None):
    """The device function rounding float32 to storage ``kind`` (float32 for an absent array)."""
    return _STORE[F32 if kind is None else kind]


def _h_loader(x_kind: int, residual_kind: int | None, rounded: bool):
    """Device function h(x, r, i, j) -> float32: x, or the residual sum (both meanings)."""
    ldx, ldr, stx = _LOAD[x_kind], _load(residual_kind), _STORE[x_kind]
    has_r = residual_kind is not None

    @cuda.jit(device=True)
    def h_at(x, r, i, j):
        h = ldx(x[_ix(i), _ix(j)])
        if has_r:
            h = h + ldr(r[_ix(i), _ix(j)])  # float32 sum ("fp32-sum")
            if rounded:
                h = ldx(stx(h))  # "rounded-sum": round to x's dtype, then normalise that
        return h

    return h_at


def _factor_loader(weight_kind: int | None):
    """Device function f(w, j, scale, offset) -> offset + w_j, the factor of eqs. (4) and (5)
    (scale = 1 + offset when there is no weight)."""
    ldw, has_w = _load(weight_kind), weight_kind is not None

    @cuda.jit(device=True)
    def factor_at(w, j, scale, offset):
        return (offset + ldw(w[_ix(j)])) if has_w else scale

    return factor_at


@functools.cache
def _forward_kernel(o: ForwardOptions):
    """The forward kernel (``o.variant``: "block" or "warp") built for ``o``."""
    h_at = _h_loader(o.x, o.residual, o.rounded)
    factor_at = _factor_loader(o.weight)
    ldb, sty, stro = _load(o.bias), _STORE[o.y], _store(o.residual)
    has_b, has_r = o.bias is not None, o.residual is not None
    T, held = o.threads, o.cols > 0
    C = max(o.cols, 1)  # the row elements one thread holds (a compile-time constant)

    @cuda.jit(device=True)
    def bias_at(b, j):
        """b_j, eq. (4)'s bias (0 without one, and then not added)."""
        return ldb(b[_ix(j)]) if has_b else np.float32(0.0)

    @cuda.jit(device=True)
    def y_of(h, rs, f, bj):
        """Eqs. (3)-(4): y_j = (h_j·rstd)·f_j + b_j in float32 (not yet rounded)."""
        yj = (h * rs) * f  # eq. (3) xhat, times offset + w_j
        if has_b:
            yj = yj + bj
        return yj

    @cuda.jit(device=True)
    def row_sumsq(x, r, rout, i, n, kf, start, step):
        """Pass 1, eq. (1): this thread's part of Σ_{j<K} h_j²; stores the new residual."""
        acc = np.float32(0.0)
        stop = n if has_r else kf
        for j in range(start, stop, step):
            h = h_at(x, r, i, j)
            if j < kf:
                acc += h * h
            if has_r:
                rout[_ix(i), _ix(j)] = stro(h)  # h rounded to the residual's dtype
        return acc

    @cuda.jit(device=True)
    def write_row(x, r, w, b, y, i, n, rs, scale, offset, start, step):
        """Pass 2, eqs. (3)-(4), re-reading the row: y_j rounded once."""
        for j in range(start, n, step):
            f, bj = factor_at(w, j, scale, offset), bias_at(b, j)
            y[_ix(i), _ix(j)] = sty(y_of(h_at(x, r, i, j), rs, f, bj))

    @cuda.jit(device=True)
    def row_sumsq_held(x, r, rout, i, n, kf, start, step, hrow):
        """As ``row_sumsq``, keeping h_j in hrow[c] for j = start + c·step: the loop over the C
        elements is unrolled (C and step are constants), so hrow lives in registers. Every load
        is unconditional (past the row's end it reads element N-1 again, which is not used), so
        all C loads are in flight at once. Same additions in the same order: the same bits."""
        for c in range(C):
            hrow[c] = h_at(x, r, i, min(start + c * step, n - 1))
        acc = np.float32(0.0)
        for c in range(C):
            j = start + c * step
            if j < kf:
                acc += hrow[c] * hrow[c]
            if has_r and j < n:
                rout[_ix(i), _ix(j)] = stro(hrow[c])
        return acc

    @cuda.jit(device=True)
    def load_factors(w, b, n, scale, offset, start, step, frow, brow):
        """offset + w_j and b_j of this thread's columns, into registers. Loaded before the
        reduction, their latency hides behind it (read after the stores of y, which may alias
        w and b as far as the compiler knows, each would wait for the one before)."""
        for c in range(C):
            jc = min(start + c * step, n - 1)
            frow[c] = factor_at(w, jc, scale, offset)
            brow[c] = bias_at(b, jc)

    @cuda.jit(device=True)
    def write_held(y, i, n, rs, start, step, hrow, frow, brow):
        """As ``write_row``, from the held row and factors instead of memory."""
        for c in range(C):
            j = start + c * step
            if j < n:
                y[_ix(i), _ix(j)] = sty(y_of(hrow[c], rs, frow[c], brow[c]))

    if o.variant == "block":

        @_kernel_jit(T)
        def forward_block(x, r, w, b, y, rout, rstd, n, kf, eps, scale, offset):
            sh = cuda.shared.array(T, np.float32)
            hrow = cuda.local.array(C, np.float32)  # h_j, j = tid + c·T (held rows only)
            frow = cuda.local.array(C, np.float32)  # offset + w_j (held rows only)
            brow = cuda.local.array(C, np.float32)  # b_j (held rows only)
            tid = cuda.threadIdx.x
            i = cuda.blockIdx.x
            if held:
                acc = row_sumsq_held(x, r, rout, i, n, kf, tid, T, hrow)
                load_factors(w, b, n, scale, offset, tid, T, frow, brow)
            else:
                acc = row_sumsq(x, r, rout, i, n, kf, tid, T)
            ss = _block_sum(acc, sh, tid, T)
            rs = np.float32(1.0) / math.sqrt(ss / np.float32(kf) + eps)  # eqs. (1)-(2)
            if tid == 0:
                rstd[_ix(i)] = rs
            if held:
                write_held(y, i, n, rs, tid, T, hrow, frow, brow)
            else:
                write_row(x, r, w, b, y, i, n, rs, scale, offset, tid, T)

        return forward_block

    @_kernel_jit(T)
    def forward_warp(x, r, w, b, y, rout, rstd, n, kf, eps, scale, offset):
        hrow = cuda.local.array(C, np.float32)  # h_j, j = lane + c·32 (held rows only)
        frow = cuda.local.array(C, np.float32)  # offset + w_j (held rows only)
        brow = cuda.local.array(C, np.float32)  # b_j (held rows only)
        tid = cuda.threadIdx.x
        lane = tid % WARP
        i = cuda.blockIdx.x * (T // WARP) + tid // WARP
        active = i < y.shape[0]  # the same for all 32 lanes of a warp
        acc = np.float32(0.0)
        if active:
            if held:
                acc = row_sumsq_held(x, r, rout, i, n, kf, lane, WARP, hrow)
                load_factors(w, b, n, scale, offset, lane, WARP, frow, brow)
            else:
                acc = row_sumsq(x, r, rout, i, n, kf, lane, WARP)
        # Every lane reaches the shuffle (full mask), also in warps past the last row: no early
        # return, so the simulator's emulation below can use block barriers.
        ss = _warp_sum(acc)
        if active:
            rs = np.float32(1.0) / math.sqrt(ss / np.float32(kf) + eps)  # eqs. (1)-(2)
            if lane == 0:
                rstd[_ix(i)] = rs
            if held:
                write_held(y, i, n, rs, lane, WARP, hrow, frow, brow)
            else:
                write_row(x, r, w, b, y, i, n, rs, scale, offset, lane, WARP)

    return forward_warp


@functools.cache
def _backward_kernel(o: BackwardOptions):
    """Backward stage 1 built for ``o``: T = ``o.threads``, C = ``o.cols`` per thread."""
    h_at = _h_loader(o.x, o.residual, o.rounded)
    factor_at = _factor_loader(o.weight)
    lddy, lddro = _LOAD[o.dy], _load(o.dresidual_out)
    stdx, stdr = _STORE[o.x], _store(o.residual)
    has_w, has_b, has_r = o.weight is not None, o.bias, o.residual is not None
    has_dro, has_rstd, held = o.dresidual_out is not None, o.saved_rstd, o.held
    T, C = o.threads, o.cols

    @cuda.jit(device=True)
    def dx_at(h, g_j, wj, rs, cc, j, kf):
        """Eq. (7) for one element, in float32 (not yet rounded)."""
        xhat = h * rs  # eq. (3)
        dxhat = g_j * wj  # eq. (5)
        if j < kf:
            return rs * (dxhat - xhat * cc)  # eq. (7): direct term − projection
        return rs * dxhat  # features past K do not feed the statistic

    @cuda.jit(device=True)
    def store_dx(dro, dx, dr, i, j, dxj):
        """dx_j (plus dresidual_out_j when h also feeds new_residual), rounded once."""
        if has_dro:
            dxj = dxj + lddro(dro[_ix(i), _ix(j)])
        dx[_ix(i), _ix(j)] = stdx(dxj)
        if has_r:
            dr[_ix(i), _ix(j)] = stdr(dxj)

    @cuda.jit(device=True)
    def operands(x, r, dy, w, i, j, c, hrow, grow, wrow, scale, offset):
        """h_j, dy_j and offset + w_j: from the held row, or read (again) from memory."""
        if held:
            return hrow[c], grow[c], wrow[c]
        return h_at(x, r, i, j), lddy(dy[_ix(i), _ix(j)]), factor_at(w, j, scale, offset)

    @_kernel_jit(T)
    def backward_block(dy, x, r, w, dro, rstd_in, dx, dr, pw, pb, m, n, kf, eps, scale,
                       offset):
        sh_a = cuda.shared.array(T, np.float32)
        sh_b = cuda.shared.array(T, np.float32)
        dw_acc = cuda.local.array(C, np.float32)  # Σ_rows dy·xhat for columns tid + c·T
        db_acc = cuda.local.array(C, np.float32)  # Σ_rows dy
        hrow = cuda.local.array(C, np.float32)  # held rows: h_j of the current row
        grow = cuda.local.array(C, np.float32)  # held rows: dy_j of the current row
        wrow = cuda.local.array(C, np.float32)  # held rows: offset + w_j, read once per block
        tid = cuda.threadIdx.x
        g = cuda.gridDim.x
        for c in range(C):
            dw_acc[c] = np.float32(0.0)
            db_acc[c] = np.float32(0.0)
            if held:
                j = tid + c * T
                wrow[c] = factor_at(w, j, scale, offset) if j < n else np.float32(0.0)
        for i in range(cuda.blockIdx.x, m, g):
            # pass 1: Σ_{j<K} h_j² (eq. 1) and Σ_j dxhat_j·h_j (eq. 6 before scaling by rstd/K)
            a_ss = np.float32(0.0)
            a_dh = np.float32(0.0)
            if held:  # every load unconditional, so all 2C are in flight at once
                for c in range(C):
                    jc = min(tid + c * T, n - 1)  # past the row's end: element N-1, unused
                    hrow[c] = h_at(x, r, i, jc)
                    grow[c] = lddy(dy[_ix(i), _ix(jc)])
            for c in range(C):
                j = tid + c * T
                if j < n:
                    h, g_j, wj = operands(x, r, dy, w, i, j, c, hrow, grow, wrow, scale, offset)
                    a_dh += (g_j * wj) * h  # dxhat_j·h_j, eq. (5)
                    if j < kf and not has_rstd:
                        a_ss += h * h
            ss, dh = _block_sum2(a_ss, a_dh, sh_a, sh_b, tid, T)
            if has_rstd:
                rs = np.float32(rstd_in[_ix(i)])  # the forward's own statistic
            else:
                rs = np.float32(1.0) / math.sqrt(ss / np.float32(kf) + eps)  # eqs. (1)-(2)
            cc = (dh * rs) / np.float32(kf)  # eq. (6): c = (1/K) Σ dxhat·xhat
            # pass 2: dx (eq. 7), and this thread's columns of dweight/dbias (eqs. 8-9), from
            # the held row or re-read
            for c in range(C):
                j = tid + c * T
                if j < n:
                    h, g_j, wj = operands(x, r, dy, w, i, j, c, hrow, grow, wrow, scale, offset)
                    store_dx(dro, dx, dr, i, j, dx_at(h, g_j, wj, rs, cc, j, kf))
                    if has_w:
                        dw_acc[c] += g_j * (h * rs)  # eq. (8), this block's rows only
                    if has_b:
                        db_acc[c] += g_j  # eq. (9)
        # this block's partial rows: written once, read by stage 2 in a fixed order
        b = cuda.blockIdx.x
        for c in range(C):
            j = tid + c * T
            if j < n:
                if has_w:
                    pw[_ix(b), _ix(j)] = dw_acc[c]
                if has_b:
                    pb[_ix(b), _ix(j)] = db_acc[c]

    return backward_block


@functools.cache
def _column_sum_kernel(kout: int):
    """Backward stage 2 (dweight or dbias), writing storage kind ``kout``."""
    st = _STORE[kout]

    @_kernel_jit(MAX_THREADS)  # launched with STAGE2_THREADS, or a forced T
    def column_sum(part, out, n):
        """Stage 2: out_j = Σ_b part[b, j] for b = 0, 1, … in order, rounded once."""
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if j < n:
            s = np.float32(0.0)
            for b in range(part.shape[0]):
                s += part[_ix(b), _ix(j)]
            out[_ix(j)] = st(s)

    return column_sum


# --------------------------------------------------------------------------------------------
# Host side: arrays on the host (copied) or on the device (used in place), checked by the
# library's one input contract (rmsref._shapes.prepare) either way
# --------------------------------------------------------------------------------------------


def _is_device(a: Any) -> bool:
    if getattr(type(a), "__cuda_ndarray__", False):  # numba device arrays, simulator arrays
        return True
    try:
        return hasattr(a, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - some libraries raise other errors for host tensors
        return False


def _is_torch(a: Any) -> bool:
    return type(a).__module__.split(".")[0] == "torch"


def _is_cupy(a: Any) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


@dataclass(frozen=True)
class _DeviceArray:
    """A CUDA array as the input contract sees it: its shape and *logical* dtype (bfloat16 for
    uint16/int16 bits), with the storage (float32, or uint16 bits for half types) in place."""

    storage: Any  # numba device array
    dtype: np.dtype
    name: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.storage.shape)

    @property
    def ndim(self) -> int:
        return len(self.storage.shape)

    def reshape(self, *shape: int) -> _DeviceArray:
        """A view with another shape; never a copy (device arrays are used in place)."""
        try:
            return _DeviceArray(self.storage.reshape(*shape), self.dtype, self.name)
        except Exception as exc:  # noqa: BLE001 - numba raises NotImplementedError/ValueError
            raise ValueError(
                f"{self.name} (device array, shape {self.shape}) cannot be viewed as {shape} "
                f"without a copy ({exc}); pass a C-contiguous array"
            ) from None


def _device_array(a: Any, name: str) -> _DeviceArray:
    """A CUDA array (numba, CuPy, torch) viewed in place, its dtype checked as NumPy's are."""
    if _is_torch(a):
        import torch

        if a.dtype == torch.bfloat16:
            a = a.view(torch.int16)  # the CUDA array interface has no bfloat16
    d = a if getattr(type(a), "__cuda_ndarray__", False) else cuda.as_cuda_array(a)
    if np.dtype(d.dtype) in (np.dtype(np.uint16), np.dtype(np.int16)):
        return _DeviceArray(d.view(np.uint16), bfloat16, name)  # bfloat16 passed as its bits
    dtype = check_dtype(d.dtype, name)
    return _DeviceArray(d.view(np.uint16) if dtype == np.float16 else d, dtype, name)


@dataclass(frozen=True)
class _Operand:
    """One array on the device, as a kernel reads it: storage and its kind."""

    dev: Any  # device array holding the storage kind (float32 or uint16 bits)
    kind: int


class _Call:
    """The arrays of one call: all host (copy in/out) or all device (in place)."""

    def __init__(self, x: Any) -> None:
        self.on_device = _is_device(x)
        self.template = x

    # -- inputs --------------------------------------------------------------------------
    def take(self, a: Any, name: str) -> Any:
        """The contract's ``convert``: ``a`` on this call's side, as NumPy or a device view."""
        if a is not None and _is_device(a) != self.on_device:
            mine, theirs = ("host", "device") if self.on_device else ("device", "host")
            raise TypeError(
                f"{name} is a {mine} array but x is a {theirs} array; pass every array of a "
                "call on the same side (NumPy arrays are copied, device arrays used in place)"
            )
        if a is None or not self.on_device:
            return as_array(a, name)  # None too: the contract's own error
        return _device_array(a, name)

    def prepare(self, x: Any, normalized_shape: ShapeLike, **arguments: Any) -> NormInputs:
        """The checked arguments (:func:`rmsref._shapes.prepare`); every array on this side."""
        return prepare(x, normalized_shape, convert=self.take, **arguments)

    def operand(self, a: Any, name: str) -> _Operand:
        """A checked array (NumPy or a device view) on the device, in its storage kind."""
        kind = _kind(a.dtype, name)
        if self.on_device:
            return _Operand(a.storage, kind)
        storage = np.ascontiguousarray(a).view(_STORAGE_OF_KIND[kind])
        return _Operand(cuda.to_device(storage), kind)

    # -- outputs -------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], kind: int) -> Any:
        return cuda.device_array(shape, dtype=_STORAGE_OF_KIND[kind])

    def result(self, dev: Any, kind: int, shape: tuple[int, ...]) -> Any:
        """A device result as the caller's kind: NumPy (copied back) or the input's library."""
        if not self.on_device:
            host = dev.copy_to_host()
            return host.view(_DTYPE_OF_KIND[kind]).reshape(shape)
        out = dev.reshape(shape)
        if kind == F16:
            out = out.view(np.float16)
        src = self.template
        if _is_torch(src):
            import torch

            if kind == BF16:  # int16 bits: a typestr every torch version reads
                return torch.as_tensor(out.view(np.int16), device=src.device).view(torch.bfloat16)
            return torch.as_tensor(out, device=src.device)
        if _is_cupy(src):
            import cupy

            return cupy.asarray(out)
        return out  # numba device array (bfloat16 as uint16 bits)


def _kind(dtype: np.dtype, name: str) -> int:
    try:
        return _KIND_OF_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise TypeError(
            f"{name} has dtype {np.dtype(dtype)}; the numba_cuda backend computes in float32 and "
            "accepts float32, float16 and bfloat16 (use the 'numpy' or 'numba_cpu' backend for "
            "float64 and complex inputs)"
        ) from None


@dataclass
class _Operands:
    """Every array of one checked call on the device: x and the arrays of x's shape as (M, N)
    rows, weight and bias as (N,), a saved rstd as float32 (M,); None where absent."""

    x: _Operand
    weight: _Operand | None
    bias: _Operand | None
    others: dict[str, _Operand]  # dy, residual, dresidual_out: those given
    rstd: Any  # float32 (M,) device array, or None

    @classmethod
    def of(cls, call: _Call, inputs: NormInputs) -> _Operands:
        def vector(p: Any, name: str) -> _Operand | None:
            return None if p is None else call.operand(p.reshape(-1), name)

        others = {name: call.operand(rows_view(a, inputs.shape), name)
                  for name, a in inputs.others.items()}
        return cls(call.operand(inputs.rows, "input"), vector(inputs.weight, "weight"),
                   vector(inputs.bias, "bias"), others,
                   _saved_rstd(call, inputs.stats.get("rstd")))

    def optional(self, name: str) -> _Operand | None:
        """An optional array by name (weight, bias, residual, dresidual_out), None if absent."""
        return getattr(self, name) if name in ("weight", "bias") else self.others.get(name)

    def kind(self, name: str) -> int | None:
        """The storage kind of an optional array, None when absent (a kernel option)."""
        op = self.optional(name)
        return None if op is None else op.kind

    def dev(self, name: str, ndim: int) -> Any:
        """The device array of an optional array, or a placeholder the kernel never reads."""
        op = self.optional(name)
        return _dummy(ndim) if op is None else op.dev

    def nbytes(self) -> int:
        ops = [self.x, self.weight, self.bias, *self.others.values()]
        return _nbytes(*(op.dev for op in ops if op is not None), self.rstd)


def _saved_rstd(call: _Call, rstd: Any) -> Any:
    """A checked saved rstd ((M, 1), any float dtype on the host) as a float32 (M,) array."""
    if rstd is None:
        return None
    if not call.on_device:
        return cuda.to_device(np.ascontiguousarray(rstd.reshape(-1), dtype=np.float32))
    if rstd.dtype != np.float32:  # on the device there is nothing to convert it with
        raise TypeError(
            f"rstd (device array) has dtype {rstd.dtype}; a device rstd must be float32, as "
            "the forward saves it"
        )
    return rstd.reshape(-1).storage


_DUMMIES: dict[int, Any] = {}


def _dummy(ndim: int) -> Any:
    """A 1-element float32 device array standing in for an absent operand (never read)."""
    if ndim not in _DUMMIES:
        _DUMMIES[ndim] = cuda.to_device(np.zeros((1,) * ndim, np.float32))
    return _DUMMIES[ndim]


# --------------------------------------------------------------------------------------------
# Launching: a call is prepared (operands on the device, outputs allocated, kernels chosen) and
# then run. The public functions do both; benchmarks prepare once and time ``run()`` alone.
# --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """Kernels bound to their device arguments and outputs.

    Attributes
    ----------
    launches : list
        ``(kernel, blocks, threads, args)`` in the order they run.
    outputs : dict
        Device arrays in their storage kind (uint16 bits for half types): forward ``y``,
        ``residual`` (fused add only), ``rstd``; backward ``dx``, ``dresidual``, ``dweight``,
        ``dbias`` (absent ones are None).
    plan : Plan
        The launch configuration of the main kernel.
    bytes_moved : int
        Compulsory DRAM traffic of one ``run()`` (every operand read once, every output written
        once, dweight partial rows written and read once), for GB/s figures.
    """

    launches: list
    outputs: dict
    plan: Plan
    bytes_moved: int

    def run(self) -> None:
        """Enqueue the kernels on the default stream (no allocation, no synchronisation)."""
        for kern, blocks, threads, args in self.launches:
            kern[blocks, threads](*args)


def _nbytes(*ops: Any) -> int:
    return sum(int(o.size) * int(o.dtype.itemsize) for o in ops if o is not None)


def _forward_prepare(call: _Call, inputs: NormInputs, ops: _Operands, y_kind: int,
                     rounded: bool, launch: Launch | None) -> Prepared:
    m, n = inputs.m, inputs.n
    y = call.empty((m, n), y_kind)
    residual_kind = ops.kind("residual")
    rout = None if residual_kind is None else call.empty((m, n), residual_kind)
    rstd = cuda.device_array((m,), np.float32)
    plan = plan_forward(n, m, launch)
    launches = []
    if m > 0:
        options = ForwardOptions(variant=plan.variant, threads=plan.threads, x=ops.x.kind,
                                 y=y_kind, weight=ops.kind("weight"), bias=ops.kind("bias"),
                                 residual=residual_kind, rounded=rounded,
                                 cols=plan.cols_per_thread if plan.held else 0)
        args = (ops.x.dev, ops.dev("residual", 2), ops.dev("weight", 1), ops.dev("bias", 1), y,
                _dummy(2) if rout is None else rout, rstd, n, inputs.k_feat,
                np.float32(inputs.eps), np.float32(1.0 + inputs.offset),
                np.float32(inputs.offset))
        launches.append((_forward_kernel(options), plan.blocks, plan.threads, args))
    moved = ops.nbytes() + _nbytes(y, rout, rstd)
    return Prepared(launches, {"y": y, "residual": rout, "rstd": rstd}, plan, moved)


def _column_sum_launch(call: _Call, part: Any, n: int, kout: int,
                       launch: Launch | None) -> tuple[Any, tuple]:
    out = call.empty((n,), kout)
    forced = _launch(launch).threads
    t = forced if forced is not None else STAGE2_THREADS
    return out, (_column_sum_kernel(kout), max(1, math.ceil(n / t)), t, (part, out, n))


def _backward_prepare(call: _Call, inputs: NormInputs, ops: _Operands, rounded: bool,
                      launch: Launch | None) -> Prepared:
    m, n = inputs.m, inputs.n
    dx = call.empty((m, n), ops.x.kind)
    residual_kind = ops.kind("residual")
    dr = None if residual_kind is None else call.empty((m, n), residual_kind)
    plan = plan_backward(n, m, launch)
    has_w, has_b = ops.weight is not None, ops.bias is not None
    # stage 1 writes one float32 partial row per block; with no rows, one zero row
    g = plan.blocks if m > 0 else 1
    pw = cuda.device_array((g, n), np.float32) if has_w else None
    pb = cuda.device_array((g, n), np.float32) if has_b else None
    launches = []
    if m > 0:
        options = BackwardOptions(threads=plan.threads, cols=plan.cols_per_thread, x=ops.x.kind,
                                  dy=ops.others["dy"].kind, weight=ops.kind("weight"),
                                  bias=has_b, residual=residual_kind,
                                  dresidual_out=ops.kind("dresidual_out"), rounded=rounded,
                                  saved_rstd=ops.rstd is not None, held=plan.held)
        args = (ops.others["dy"].dev, ops.x.dev, ops.dev("residual", 2), ops.dev("weight", 1),
                ops.dev("dresidual_out", 2), _dummy(1) if ops.rstd is None else ops.rstd,
                dx, _dummy(2) if dr is None else dr, _dummy(2) if pw is None else pw,
                _dummy(2) if pb is None else pb, m, n, inputs.k_feat, np.float32(inputs.eps),
                np.float32(1.0 + inputs.offset), np.float32(inputs.offset))
        launches.append((_backward_kernel(options), plan.blocks, plan.threads, args))
    else:
        for part in (pw, pb):
            if part is not None:
                part.copy_to_device(np.zeros((1, n), np.float32))
    dw = db = None
    if has_w:
        dw, stage2 = _column_sum_launch(call, pw, n, ops.weight.kind, launch)
        launches.append(stage2)
    if has_b:
        db, stage2 = _column_sum_launch(call, pb, n, ops.bias.kind, launch)
        launches.append(stage2)
    parts = 2 * _nbytes(pw, pb)  # written by stage 1, read by stage 2
    moved = parts + ops.nbytes() + _nbytes(dx, dr, dw, db)
    outputs = {"dx": dx, "dresidual": dr, "dweight": dw, "dbias": db}
    return Prepared(launches, outputs, plan, moved)


# --------------------------------------------------------------------------------------------
# Argument handling shared by the public functions
# --------------------------------------------------------------------------------------------


@dataclass
class _Launched:
    """A prepared call with what its results need: the side, the checked arguments, the kinds."""

    call: _Call
    inputs: NormInputs
    ops: _Operands
    prepared: Prepared

    def result(self, output: str, kind: int, shape: tuple[int, ...]) -> Any:
        return self.call.result(self.prepared.outputs[output], kind, shape)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs.x.shape)

    @property
    def rstd_shape(self) -> tuple[int, ...]:
        return stat_shape(self.inputs.x, self.inputs.shape)


def _given(**arrays: Any) -> dict[str, Any]:
    """The optional arrays that were passed (the contract takes arrays, not None)."""
    return {name: a for name, a in arrays.items() if a is not None}


def _forward_call(x: Any, normalized_shape: ShapeLike, weight: Any, eps: float | None, *,
                  bias: Any = None, offset: float = 0.0, partial: float | None = None,
                  out_dtype: Any = None, residual: Any = None, rounding: str = "fp32-sum",
                  launch: Launch | None = None) -> tuple[_Launched, int]:
    """A forward checked and prepared; returns it and the kind of y."""
    rounded = resolve_rounding(rounding)
    call = _Call(x)
    inputs = call.prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                          partial=partial, others=_given(residual=residual))
    ops = _Operands.of(call, inputs)
    y_kind = _kind(resolve_out_dtype(out_dtype, inputs.x), "out_dtype")
    prepared = _forward_prepare(call, inputs, ops, y_kind, rounded, launch)
    return _Launched(call, inputs, ops, prepared), y_kind


def _backward_call(dy: Any, x: Any, normalized_shape: ShapeLike, weight: Any,
                   eps: float | None, *, rstd: Any = None, bias: Any = None,
                   offset: float = 0.0, partial: float | None = None, residual: Any = None,
                   dresidual_out: Any = None, rounding: str = "fp32-sum",
                   launch: Launch | None = None) -> _Launched:
    """A backward checked and prepared (dy is required, the fused add's arrays optional)."""
    rounded = resolve_rounding(rounding)
    call = _Call(x)
    others = {"dy": dy, **_given(residual=residual, dresidual_out=dresidual_out)}
    inputs = call.prepare(x, normalized_shape, weight=weight, bias=bias, eps=eps, offset=offset,
                          partial=partial, stats={"rstd": rstd}, others=others)
    ops = _Operands.of(call, inputs)
    return _Launched(call, inputs, ops, _backward_prepare(call, inputs, ops, rounded, launch))


def _host_out(call: _Call, out: Any, shape: tuple[int, ...], kind: int,
              inputs: dict[str, Any]) -> np.ndarray | None:
    """Validate ``out=`` before launching: a NumPy array, for host calls only (a device call
    returns device arrays; :func:`prepare_forward` / :func:`prepare_backward` reuse them)."""
    if out is not None and call.on_device:
        raise TypeError(
            "out= takes a NumPy array and this call's inputs are device arrays; device calls "
            "return device arrays (use prepare_forward/prepare_backward to reuse outputs)"
        )
    return check_out(out, shape, _DTYPE_OF_KIND[kind], inputs)


def _required(a: Any, name: str) -> None:
    """The fused functions' residual is an array, never None (an error naming it)."""
    if a is None:
        raise TypeError(f"{name} must be an array, got None")


def _give(result: Any, out: np.ndarray | None, shape: tuple[int, ...]) -> Any:
    """A result as returned: itself, or copied into the caller's (host) ``out``."""
    return result if out is None else into_out(result, out, shape)


def _param_grad(b: _Launched, output: str, param: _Operand | None) -> Any:
    """dweight or dbias in the parameter's dtype and shape; None without that parameter."""
    return None if param is None else b.result(output, param.kind, b.inputs.shape)


def prepare_forward(x: Any, normalized_shape: ShapeLike, weight: Any = None,
                    eps: float | None = None, *, bias: Any = None, offset: float = 0.0,
                    partial: float | None = None, out_dtype: Any = None, residual: Any = None,
                    rounding: str = "fp32-sum", launch: Launch | None = None) -> Prepared:
    """Prepare a forward (``residual`` given: the fused add) for repeated ``run()`` calls.

    For benchmarks: operands are moved to the device and outputs allocated once, so ``run()``
    times the kernels alone. Arguments as in :func:`rms_norm_forward` and
    :func:`add_rms_norm_forward`.

    Returns
    -------
    Prepared
    """
    return _forward_call(x, normalized_shape, weight, eps, bias=bias, offset=offset,
                         partial=partial, out_dtype=out_dtype, residual=residual,
                         rounding=rounding, launch=launch)[0].prepared


def prepare_backward(dy: Any, x: Any, normalized_shape: ShapeLike, weight: Any = None,
                     eps: float | None = None, *, rstd: Any = None, bias: Any = None,
                     offset: float = 0.0, partial: float | None = None, residual: Any = None,
                     dresidual_out: Any = None, rounding: str = "fp32-sum",
                     launch: Launch | None = None) -> Prepared:
    """Prepare a backward (stage 1 and the dweight/dbias column sums) for repeated ``run()``.

    Arguments as in :func:`rms_norm_backward` and :func:`add_rms_norm_backward`.

    Returns
    -------
    Prepared
    """
    return _backward_call(dy, x, normalized_shape, weight, eps, rstd=rstd, bias=bias,
                          offset=offset, partial=partial, residual=residual,
                          dresidual_out=dresidual_out, rounding=rounding,
                          launch=launch).prepared


# --------------------------------------------------------------------------------------------
# Public API: the oracle's names and signatures (docs/kernels.md), plus ``launch=``
# --------------------------------------------------------------------------------------------


def rms_norm(
    x: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    out: np.ndarray | None = None,
    launch: Launch | None = None,
) -> Any:
    """RMSNorm forward on the GPU (torch semantics): ``y``, as :func:`rmsref.rms_norm`.

    Parameters
    ----------
    x : array
        float32, float16 or bfloat16; NumPy (copied) or a CUDA array (used in place).
    normalized_shape : int or tuple of int
        The trailing dims normalised together.
    weight : array, optional
        Per-feature scale, shape ``normalized_shape``.
    eps : float, optional
        Added to the mean of squares; default float32's machine epsilon.
    out : numpy.ndarray, optional
        Host calls only: where to copy y back to (as :func:`rmsref.rms_norm`).
    launch : Launch, optional
        Forced launch configuration (see :class:`Launch`).

    Returns
    -------
    array
        ``y``, same shape and dtype as ``x``, same kind (NumPy or device) as ``x``.
    """
    return rms_norm_forward(x, normalized_shape, weight, eps, out=out, launch=launch)[0]


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
    launch: Launch | None = None,
) -> tuple[Any, Any]:
    """RMSNorm forward returning ``(y, rstd)``; only rstd (O(rows)) is saved for the backward.

    Parameters
    ----------
    x, normalized_shape, weight, eps, out, launch
        As in :func:`rms_norm`.
    bias : array, optional
        Per-feature shift, shape ``normalized_shape``.
    offset : float, default 0.0
        The weight is used as ``offset + weight`` (1.0 for Gemma).
    partial : float in (0, 1], optional
        pRMSNorm: the RMS comes from the first ``floor(N * partial)`` features.
    out_dtype : dtype, optional
        float32, float16 or bfloat16; default ``x``'s dtype.

    Returns
    -------
    y : array
        Shape of ``x``, dtype ``out_dtype``, rounded once from float32.
    rstd : array
        float32, shape ``x.shape[:-k] + (1,) * k``.
    """
    f, y_kind = _forward_call(x, normalized_shape, weight, eps, bias=bias, offset=offset,
                              partial=partial, out_dtype=out_dtype, launch=launch)
    y_out = _host_out(f.call, out, f.x_shape, y_kind, {"x": x, "weight": weight, "bias": bias})
    f.prepared.run()
    return (_give(f.result("y", y_kind, f.x_shape), y_out, f.x_shape),
            f.result("rstd", F32, f.rstd_shape))


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
    launch: Launch | None = None,
) -> RMSNormGrads:
    """RMSNorm backward, eqs. (5)-(9): dx per row, dweight/dbias by two deterministic stages.

    Parameters
    ----------
    dy : array
        ∂L/∂y, same shape as ``x`` (float32, float16 or bfloat16).
    x, normalized_shape, weight, eps, bias, offset, partial, launch
        As in :func:`rms_norm_forward`.
    rstd : array, optional
        The forward's saved statistic (shape ``lead`` or ``lead + (1,)*k``), used as float32;
        recomputed in the kernel when None.
    out : numpy.ndarray, optional
        Host calls only: where to copy dx back to.

    Returns
    -------
    RMSNormGrads
        ``(dx, dweight, dbias)``: dx in x's dtype, dweight/dbias in the parameter's dtype (None
        without that parameter).
    """
    b = _backward_call(dy, x, normalized_shape, weight, eps, rstd=rstd, bias=bias, offset=offset,
                       partial=partial, launch=launch)
    dx_out = _host_out(b.call, out, b.x_shape, b.ops.x.kind, {"dy": dy, "x": x, "weight": weight})
    b.prepared.run()
    return RMSNormGrads(
        _give(b.result("dx", b.ops.x.kind, b.x_shape), dx_out, b.x_shape),
        _param_grad(b, "dweight", b.ops.weight),
        _param_grad(b, "dbias", b.ops.bias),
    )


def add_rms_norm(
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    offset: float = 0.0,
    launch: Launch | None = None,
) -> tuple[Any, Any]:
    """Fused residual add + RMSNorm: ``(y, new_residual)`` as :func:`rmsref.add_rms_norm`.

    Parameters
    ----------
    x, residual : array
        Same shape; float32, float16 or bfloat16 (the dtypes may differ).
    normalized_shape, weight, eps, offset, launch
        As in :func:`rms_norm_forward`.
    rounding : {"fp32-sum", "rounded-sum"}
        Normalise the float32 sum h = x + residual, or h rounded to x's dtype first.

    Returns
    -------
    y : array
        RMSNorm of h, in x's dtype.
    new_residual : array
        h rounded to the residual's dtype.
    """
    y, res, _ = add_rms_norm_forward(x, residual, normalized_shape, weight, eps,
                                     rounding=rounding, offset=offset, launch=launch)
    return y, res


def add_rms_norm_forward(
    x: Any,
    residual: Any,
    normalized_shape: ShapeLike,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "fp32-sum",
    offset: float = 0.0,
    launch: Launch | None = None,
) -> tuple[Any, Any, Any]:
    """:func:`add_rms_norm` that also returns rstd: ``(y, new_residual, rstd)``.

    Parameters
    ----------
    x, residual, normalized_shape, weight, eps, rounding, offset, launch
        As in :func:`add_rms_norm`.

    Returns
    -------
    y, new_residual : array
        As in :func:`add_rms_norm`.
    rstd : array
        float32, shape ``x.shape[:-k] + (1,) * k``.
    """
    _required(residual, "residual")
    f, y_kind = _forward_call(x, normalized_shape, weight, eps, offset=offset,
                              residual=residual, rounding=rounding, launch=launch)
    f.prepared.run()
    return (f.result("y", y_kind, f.x_shape),
            f.result("residual", f.ops.others["residual"].kind, f.x_shape),
            f.result("rstd", F32, f.rstd_shape))


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
    launch: Launch | None = None,
) -> AddRMSNormGrads:
    """Backward of :func:`add_rms_norm`: dh = dx_RMSNorm(dy) + dresidual_out; dx = dresidual = dh.

    Parameters
    ----------
    dy : array
        ∂L/∂y, shape of ``x``.
    dresidual_out : array or None
        ∂L/∂new_residual, shape of ``x``; None when the residual stream is not used later.
    x, residual, normalized_shape, weight, eps, rounding, offset, launch
        As in :func:`add_rms_norm`. "rounded-sum" rounding is differentiated as the identity.
    rstd : array, optional
        The forward's saved statistic; recomputed when None.

    Returns
    -------
    AddRMSNormGrads
        ``(dx, dresidual, dweight)``: dh rounded to x's and to the residual's dtype; dweight in
        the weight's dtype (None without weight).
    """
    _required(residual, "residual")
    b = _backward_call(dy, x, normalized_shape, weight, eps, rstd=rstd, offset=offset,
                       residual=residual, dresidual_out=dresidual_out, rounding=rounding,
                       launch=launch)
    b.prepared.run()
    return AddRMSNormGrads(
        b.result("dx", b.ops.x.kind, b.x_shape),
        b.result("dresidual", b.ops.others["residual"].kind, b.x_shape),
        _param_grad(b, "dweight", b.ops.weight),
    )
