"""Validate, then time, the Numba CPU kernels against a parallel copy of the same bytes.

    python bench/cpu.py                      # the target cases, table -> bench/results/cpu.md
    python bench/cpu.py --quick              # tiny float32 case, one round (a smoke run;
                                             # writes to the temporary folder, not results/)
    python bench/cpu.py --cases float32:8192x4096,bfloat16:8192x4096 --rounds 5 --repeats 3

What is measured, all in one process and interleaved round by round (the machine may be shared,
so every ratio is taken inside a round and the median over rounds is reported):

- copy: a row copy of x into a preallocated array on all threads, three ways: a ``prange``
  loop (Numba's OpenMP threads), a serial ``nogil`` copy of a range of rows run on rmsref's own
  thread pool, the way the kernels run, and the same asking for memory ahead (software
  prefetch) as the kernels' row loops do. The machine's copy bandwidth B = 2·|x| / t_copy is
  taken, round by round, from the fastest: they read differently on the same bytes (at
  65536x512 the ``prange`` copy took 16 ms where ``np.copyto`` on one thread took 6.5; the
  prefetching copy took 4-26 % less time than the plain one, mostly 12-15 %), and a target met
  against a slow copy is not met. ``np.copyto`` (single-threaded) is shown
  next to them, and both copies into a *new* array (allocation and first-touch page faults
  included, as every API call that returns a new array pays), whose faster one is the
  allocating baseline.
- every RMSNorm kernel variant (``bench/variants/numba_cpu_history.py``: the highest numbers are
  the library's defaults), the default fused residual add + RMSNorm and LayerNorm kernels (written
  the way the RMSNorm defaults are), the NumPy oracle, torch's ``F.rms_norm`` forward and
  forward+autograd backward when torch is installed, and JAX's ``jax.jit`` forward and
  forward+backward (``jax.vjp``) in the torch convention (float32 opmath, one rounding) when jax
  is installed (not for float64, which needs JAX's global x64 mode). Each is validated against
  the oracle on the first rows of the same data *before* it is timed
  (``rmsref.comparison.compare`` for the tolerance-model bounds); a candidate that fails is
  reported as REFUSED and not timed.
- the default RMSNorm and LayerNorm forward and backward called with ``out=`` (y and dx
  written into arrays kept across calls), checked bit for bit against the allocating call
  first: the like-for-like comparison with the preallocated parallel copy.
- the RMSNorm/LayerNorm time ratio compares the default kernels of each (forward and backward),
  which are written the same way (64 vectorised lanes, pipelined blocks of rows), both called
  with ``out=``, so that the cost of fresh pages, which varies from call to call on a virtual
  machine, enters neither. It is printed under the table with the targets. (The LayerNorm
  backward also has a slow state on the machine we run on, with ``out=`` too: see
  ``bench/slow_state.py``.)

Bytes moved (s = element size of x, s_w of the weight, s_r of rstd; M rows, N features):
    forward   read x, write y, read w, write rstd:          2·M·N·s + N·s_w + M·s_r
    backward  read x, dy, rstd, w; write dx, dweight:        3·M·N·s + M·s_r + 2·N·s_w
    LayerNorm as RMSNorm, plus the mean (M·s_r, written by the forward, read by the backward)
    fused residual forward   read x, residual, w; write y, new_residual, rstd:
                                                             4·M·N·s + N·s_w + M·s_r
    fused residual backward  read dy, dresidual_out, x, residual, rstd, w; write dx,
                             dresidual, dweight:             6·M·N·s + M·s_r + 2·N·s_w
GB/s = bytes / time. "x copy" = time / (bytes / B), the time relative to moving the same bytes at
copy speed. "x copy, new array" is the same against the parallel copy into a freshly allocated
array. The targets (forward <= 1.25, backward <= 1.4) are checked like for like, in the
"targets" lines under the table: a call with ``out=`` against the preallocated copy, and an
allocating call against the copy that allocates too (every call that returns a new array -- ours,
torch's, the oracle's -- pays the allocation and the OS zeroing its fresh pages, measured here at
+28 % to +58 % of the copy time in bench/results/cpu.md). Backward timings use the forward's
saved rstd (as autograd does); "fwd+bwd" for torch is forward + autograd backward, compared with
our forward + backward.

Under each target line, what the kernel's arithmetic allows (``--no-model`` skips it): the
default kernel is timed on one thread on a batch that stays in cache (``bench/halfrow.py``,
``in_cache``), which gives its arithmetic per element with memory taken out, a; the copy moves
an element's bytes in c per thread (bytes per element / B, times the thread count). A kernel
that overlapped its arithmetic with its memory traffic perfectly would take max(1, a/c) times
the copy, one that overlapped nothing 1 + a/c. So a target below max(1, a/c) needs less
arithmetic per element, and one between the two needs better overlap.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import rmsref
from rmsref import tolerance
from rmsref._shapes import FLOAT_DTYPES, default_eps
from rmsref.comparison import Reference, compare

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/variants is imported from the checkout (not installed)
    sys.path.insert(0, str(ROOT))

DEFAULT_CASES = "float32:8192x4096,float32:65536x512,float32:4096x16384,bfloat16:8192x4096"
QUICK_CASES = "float32:256x512"
RESULTS = ROOT / "bench" / "results"
OUT_FWD = "numba rms_norm fwd (default), out="
OUT_BWD = "numba rms_norm bwd (default), out="
LN_FWD = "numba layer_norm fwd (default)"
LN_BWD = "numba layer_norm bwd (default)"
LN_OUT_FWD = "numba layer_norm fwd (default), out="
LN_OUT_BWD = "numba layer_norm bwd (default), out="
ADD_FWD = "numba add_rms_norm fwd (default)"
ADD_BWD = "numba add_rms_norm bwd (default)"
ADD_FWD_RS = "numba add_rms_norm fwd (rounded-sum)"
ADD_BWD_RS = "numba add_rms_norm bwd (rounded-sum)"
RATIO_NAME = "RMSNorm/LayerNorm time ratio"
#: targets, time relative to a parallel copy of the same bytes
TARGETS = {"fwd": 1.25, "bwd": 1.4}
#: other implementations timed next to ours (name prefixes); "peer / ours" is their time / ours
PEERS = ("torch", "jax")
PEER_LABELS = ("torch", "XLA")


# ------------------------------------------------------------------------------ candidates
@dataclass
class Candidate:
    """One timed callable: its name, kind ("fwd"/"bwd"/"fwd+bwd"/"copy"), bytes and result."""

    name: str
    kind: str
    run: Callable[[], object]
    nbytes: int
    check: Callable[[], str | None] | None = None  # None = valid, else the reason it is wrong
    refused: str | None = None
    #: a copy that sets the copy bandwidth B: "out" (into a preallocated array) or "new" (into
    #: a new one); per round B is the fastest of that baseline's copies
    baseline: str | None = None
    times: list[float] = field(default_factory=list)


def _parallel_copy():
    from numba import njit, prange

    # not cache=True: the smoke test imports this file under another module name, and a cached
    # entry written by one name cannot be loaded by the other
    @njit(parallel=True, nogil=True)
    def pcopy(src, dst):
        for i in prange(src.shape[0]):
            for j in range(src.shape[1]):
                dst[i, j] = src[i, j]

    return pcopy


def _pool_copy(prefetch: bool = False):
    """A row copy run the way the kernels are: a serial ``nogil`` function of a range of rows,
    split across rmsref's thread pool (``numba_cpu._launch``), no OpenMP. With ``prefetch``
    the row loop asks for memory ahead as the kernels' pipelined loops do
    (``numba_cpu._read_ahead``/``_write_ahead``), which took 4-26 % off the copy's time
    (bench/results/cpu.md): the copy the kernels must be measured against."""
    from numba import njit

    from rmsref.kernels import numba_cpu

    lanes = numba_cpu.LANES

    @njit(nogil=True)
    def copy_rows(src, dst, r0, r1):
        for i in range(r0, r1):
            for j in range(src.shape[1]):
                dst[i, j] = src[i, j]

    @njit(nogil=True)
    def copy_rows_ahead(src, dst, r0, r1):
        n = src.shape[1]
        n64 = n - n % lanes
        for i in range(r0, r1):
            for j0 in range(0, n64, lanes):
                numba_cpu._read_ahead(src, (i, j0))
                numba_cpu._write_ahead(dst, (i, j0))
                for lane in range(lanes):
                    dst[i, j0 + lane] = src[i, j0 + lane]
            for j in range(n64, n):
                dst[i, j] = src[i, j]

    rows = copy_rows_ahead if prefetch else copy_rows

    def pool_copy(src, dst):
        numba_cpu._launch(rows, src.shape[0], src.size, src, dst)

    return pool_copy


def _check_forward(y: np.ndarray, y_ref: np.ndarray, dtype: np.dtype, *, exact: bool,
                   x: np.ndarray | None = None, w: np.ndarray | None = None) -> str | None:
    """Our contract (exact=True: float32 >= 99.9 % equal to the oracle's rounded output, all
    within 1 ulp) or, for other implementations, the docs/tolerances.md bound with float32
    accumulation (``rmsref.comparison.compare`` on the inputs ``x``, ``w``)."""
    if exact:
        return _check_ulp(y, y_ref, dtype, equal_rate=dtype == np.float32)
    n = y.shape[-1]
    ref = Reference(x, (n,), w, default_eps(x.dtype))
    return _verdict([compare("y", y, ref, _model(dtype, n, x.shape[0], np.float32))])


def _check_ulp(got: np.ndarray, want: np.ndarray, dtype: np.dtype, *, equal_rate: bool,
               atol: float = 0.0) -> str | None:
    """Within 1 ulp of the oracle's rounded result (+ atol); with ``equal_rate``, >= 99.9 % of
    the elements equal to it."""
    g64, r64 = got.astype(np.float64), want.astype(np.float64)
    err = np.abs(g64 - r64)
    bad = np.count_nonzero(err > tolerance.ulp(r64, dtype) + atol)
    equal = np.mean(g64 == r64)
    if bad or (equal_rate and equal < 0.999):
        return f"{bad} elements beyond 1 ulp, {equal:.4%} equal"
    return None


def _model(dtype: np.dtype, n: int, rows: int, acc) -> tolerance.ErrorModel:
    return tolerance.ErrorModel(out_dtype=np.dtype(dtype), n=n, rows=rows, acc_dtype=acc)


def _verdict(comparisons) -> str | None:
    """None when every comparison is within its bound, else which are not and by how much."""
    bad = [f"{c.quantity} {np.count_nonzero(c.ratios > 1)} elements beyond the "
           f"docs/tolerances.md bound (worst error/bound {c.ratio:.3g})"
           for c in comparisons if not c.passed]
    return "; ".join(bad) or None


def _check_backward(dx, dw, x, dy, w, dtype, *, acc) -> str | None:
    """dx and dweight within the docs/tolerances.md bound (acc: the candidate's accumulation
    dtype), through ``rmsref.comparison.compare``."""
    n = x.shape[-1]
    ref = Reference(x, (n,), w, default_eps(x.dtype), dy=dy)
    model = _model(dtype, n, x.shape[0], acc)
    return _verdict([compare("dx", dx, ref, model), compare("dweight", dw, ref, model)])


def build_candidates(x, dy, w, *, with_torch: bool, with_oracle: bool,
                     with_jax: bool = False) -> list[Candidate]:
    """Every candidate for one case, each with its validation on the first rows of the data."""
    from rmsref.kernels import numba_cpu as nb

    m, n = x.shape
    dtype = x.dtype
    s, s_w = x.dtype.itemsize, w.dtype.itemsize
    s_r = nb._stat_dtype(dtype).itemsize
    fwd_bytes = 2 * m * n * s + n * s_w + m * s_r
    bwd_bytes = 3 * m * n * s + m * s_r + 2 * n * s_w
    vrows = min(m, 64)
    xv, dyv = x[:vrows], dy[:vrows]
    y_ref = rmsref.rms_norm(xv, n, w)
    _, rstd = nb.rms_norm_forward(x, n, w)
    cands: list[Candidate] = []

    pcopy = _parallel_copy()
    out = np.empty_like(x)
    xb, outb = nb._bits(x), nb._bits(out)  # half types as 16-bit integer views, as the kernels
    pool_copy = _pool_copy()
    cands.append(Candidate("parallel copy (prange)", "copy", lambda: pcopy(xb, outb),
                           2 * x.nbytes, baseline="out"))
    cands.append(Candidate("parallel copy, new array", "copy",
                           lambda: pcopy(xb, nb._bits(np.empty_like(x))), 2 * x.nbytes,
                           baseline="new"))
    cands.append(Candidate("parallel copy (rmsref's threads)", "copy",
                           lambda: pool_copy(xb, outb), 2 * x.nbytes, baseline="out"))
    cands.append(Candidate("parallel copy (rmsref's threads), new array", "copy",
                           lambda: pool_copy(xb, nb._bits(np.empty_like(x))), 2 * x.nbytes,
                           baseline="new"))
    ahead_copy = _pool_copy(prefetch=True)
    cands.append(Candidate("parallel copy (rmsref's threads, prefetch)", "copy",
                           lambda: ahead_copy(xb, outb), 2 * x.nbytes, baseline="out"))
    cands.append(Candidate("parallel copy (rmsref's threads, prefetch), new array", "copy",
                           lambda: ahead_copy(xb, nb._bits(np.empty_like(x))), 2 * x.nbytes,
                           baseline="new"))
    cands.append(Candidate("np.copyto (1 thread)", "copy", lambda: np.copyto(out, x),
                           2 * x.nbytes))

    cands.extend(_variant_candidates(x, dy, w, rstd, xv, dyv, y_ref, fwd_bytes, bwd_bytes))
    cands.extend(_out_candidates(nb, x, dy, w, rstd, fwd_bytes, bwd_bytes, m * s_r))
    cands.extend(_layer_norm_candidates(nb, x, dy, w, xv, dyv, fwd_bytes + m * s_r,
                                        bwd_bytes + m * s_r))
    cands.extend(_add_candidates(nb, x, dy, w, xv, dyv, 4 * m * n * s + n * s_w + m * s_r,
                                 6 * m * n * s + m * s_r + 2 * n * s_w))

    if with_oracle:
        cands.append(Candidate("numpy oracle fwd", "fwd", lambda: rmsref.rms_norm_forward(x, n, w),
                               fwd_bytes, check=lambda: None))
        cands.append(Candidate("numpy oracle bwd", "bwd",
                               lambda: rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd),
                               bwd_bytes, check=lambda: None))
    if with_torch:
        cands.extend(_torch_candidates(x, dy, w, xv, dyv, fwd_bytes, bwd_bytes))
    if with_jax:
        cands.extend(_jax_candidates(x, dy, w, xv, dyv, fwd_bytes, bwd_bytes))
    return cands


def _variant_candidates(x, dy, w, rstd, xv, dyv, y_ref, fwd_bytes, bwd_bytes
                        ) -> list[Candidate]:
    """Every RMSNorm variant of the kernel history; the highest numbers are the defaults."""
    from bench.variants.numba_cpu_history import VARIANTS, variant

    n, dtype = x.shape[-1], x.dtype
    cands = []
    for v in VARIANTS["rms_norm_forward"]:
        f = variant("rms_norm_forward", v)
        default = " (default)" if v == max(VARIANTS["rms_norm_forward"]) else ""
        cands.append(Candidate(
            f"numba rms_norm fwd v{v}{default}", "fwd", lambda f=f: f(x, n, w), fwd_bytes,
            check=lambda f=f: _check_forward(f(xv, n, w)[0], y_ref, dtype, exact=True)))
    for v in VARIANTS["rms_norm_backward"]:
        g = variant("rms_norm_backward", v)
        default = " (default)" if v == max(VARIANTS["rms_norm_backward"]) else ""

        def chk(g=g):
            r = g(dyv, xv, n, w)
            return _check_backward(r.dx, r.dweight, xv, dyv, w, dtype, acc=np.float64)

        cands.append(Candidate(f"numba rms_norm bwd v{v}{default}", "bwd",
                               lambda g=g: g(dy, x, n, w, rstd=rstd), bwd_bytes, check=chk))
    return cands


def _layer_norm_candidates(nb, x, dy, w, xv, dyv, fwd_bytes, bwd_bytes) -> list[Candidate]:
    """The default LayerNorm kernels (no bias, as the RMSNorm rows), the backward with the
    forward's saved statistics. Checked against the oracle: y as RMSNorm's (>= 99.9 % of float32
    equal, all within 1 ulp), dx within 1 ulp + 1e-12 of its largest element."""
    n, dtype = x.shape[-1], x.dtype
    _, mean, rstd = nb.layer_norm_forward(x, n, w)
    y_ref = rmsref.layer_norm(xv, n, w)
    dx_ref = rmsref.layer_norm_backward(dyv, xv, n, w).dx
    atol = 1e-12 * float(np.abs(dx_ref.astype(np.float64)).max(initial=0.0))
    return [
        Candidate(LN_FWD, "fwd", lambda: nb.layer_norm_forward(x, n, w), fwd_bytes,
                  check=lambda: _check_forward(nb.layer_norm(xv, n, w), y_ref, dtype,
                                               exact=True)),
        Candidate(LN_BWD, "bwd", lambda: nb.layer_norm_backward(dy, x, n, w, mean=mean,
                                                                 rstd=rstd),
                  bwd_bytes, check=lambda: _check_ulp(nb.layer_norm_backward(dyv, xv, n, w).dx,
                                                      dx_ref, dtype, equal_rate=False,
                                                      atol=atol)),
    ]


def _add_candidates(nb, x, dy, w, xv, dyv, fwd_bytes, bwd_bytes) -> list[Candidate]:
    """The default fused residual add + RMSNorm kernels, for both meanings of the sum
    (``rounding``; "rounded-sum" once ran 7-20x slower than "fp32-sum" for half types,
    unseen while only the default was timed): residual = dy's data (any second array),
    dresidual_out = x's, the backward with the forward's saved rstd. Checked against the
    oracle as the LayerNorm rows are; new_residual bit for bit."""
    return (_add_pair(nb, x, dy, w, xv, dyv, fwd_bytes, bwd_bytes, "fp32-sum", ADD_FWD, ADD_BWD)
            + _add_pair(nb, x, dy, w, xv, dyv, fwd_bytes, bwd_bytes, "rounded-sum", ADD_FWD_RS,
                        ADD_BWD_RS))


def _add_pair(nb, x, dy, w, xv, dyv, fwd_bytes, bwd_bytes, rounding, fwd_name,
              bwd_name) -> list[Candidate]:
    """``_add_candidates``' forward and backward for one ``rounding``."""
    n, dtype = x.shape[-1], x.dtype
    _, _, rstd = nb.add_rms_norm_forward(x, dy, n, w, rounding=rounding)
    y_ref, res_ref, _ = rmsref.add_rms_norm_forward(xv, dyv, n, w, rounding=rounding)
    g_ref = rmsref.add_rms_norm_backward(dyv, xv, xv, dyv, n, w, rounding=rounding)
    atol = 1e-12 * float(np.abs(g_ref.dx.astype(np.float64)).max(initial=0.0))

    def chk_fwd():
        y, res, _ = nb.add_rms_norm_forward(xv, dyv, n, w, rounding=rounding)
        if not np.array_equal(res.view(np.uint8), res_ref.view(np.uint8)):
            return "new_residual differs from the oracle's"
        return _check_forward(y, y_ref, dtype, exact=True)

    def chk_bwd():
        g = nb.add_rms_norm_backward(dyv, xv, xv, dyv, n, w, rounding=rounding)
        return (_check_ulp(g.dx, g_ref.dx, dtype, equal_rate=False, atol=atol)
                or _check_ulp(g.dresidual, g_ref.dresidual, dtype, equal_rate=False, atol=atol))

    return [
        Candidate(fwd_name, "fwd", lambda: nb.add_rms_norm_forward(x, dy, n, w, rounding=rounding),
                  fwd_bytes, check=chk_fwd),
        Candidate(bwd_name, "bwd", lambda: nb.add_rms_norm_backward(dy, x, x, dy, n, w,
                                                                    rounding=rounding, rstd=rstd),
                  bwd_bytes, check=chk_bwd),
    ]


def _out_candidates(nb, x, dy, w, rstd, fwd_bytes, bwd_bytes, stat_bytes) -> list[Candidate]:
    """The default RMSNorm and LayerNorm forwards and backwards called with ``out=``: y and dx
    written into arrays the caller keeps across calls (as a training loop would), so the call
    does what the preallocated parallel copy does: no allocation, no first touch of fresh pages
    (the OS zeroes every one, and on a virtual machine the host may have to supply them, at a
    cost that varies from call to call). Checked bit for bit against the allocating call
    first."""
    n = x.shape[-1]
    _, mean, ln_rstd = nb.layer_norm_forward(x, n, w)
    calls = (  # name, kind, call(out), bytes
        (OUT_FWD, "fwd", lambda out: nb.rms_norm_forward(x, n, w, out=out), fwd_bytes),
        (OUT_BWD, "bwd", lambda out: nb.rms_norm_backward(dy, x, n, w, rstd=rstd, out=out),
         bwd_bytes),
        (LN_OUT_FWD, "fwd", lambda out: nb.layer_norm_forward(x, n, w, out=out),
         fwd_bytes + stat_bytes),
        (LN_OUT_BWD, "bwd", lambda out: nb.layer_norm_backward(dy, x, n, w, mean=mean,
                                                                rstd=ln_rstd, out=out),
         bwd_bytes + stat_bytes),
    )

    def same(got, ref):
        return all((a is None and b is None) or np.array_equal(np.asarray(a).view(np.uint8),
                                                               np.asarray(b).view(np.uint8))
                   for a, b in zip(got, ref, strict=True))

    def candidate(name, kind, call, nbytes):
        out = np.empty_like(x)

        def check():
            return None if same(call(out), call(None)) else "differs from the allocating call"

        return Candidate(name, kind, lambda: call(out), nbytes, check=check)

    return [candidate(*c) for c in calls]


def _torch_candidates(x, dy, w, xv, dyv, fwd_bytes, bwd_bytes) -> list[Candidate]:
    import torch
    import torch.nn.functional as F

    n = x.shape[-1]
    tdt = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
           np.dtype(np.float16): torch.float16, rmsref.bfloat16: torch.bfloat16}[x.dtype]

    def to_t(a):
        return torch.from_numpy(a.astype(np.float32)).to(tdt) if a.dtype == rmsref.bfloat16 \
            else torch.from_numpy(np.ascontiguousarray(a))

    def to_np(t):
        return t.detach().float().numpy().astype(x.dtype) if tdt == torch.bfloat16 \
            else t.detach().numpy()

    xt, dyt, wt = to_t(x), to_t(dy), to_t(w)

    def fwd_bwd(xa, dya):
        xr = xa.detach().requires_grad_(True)
        wr = wt.detach().requires_grad_(True)
        y = F.rms_norm(xr, (n,), wr)
        y.backward(dya)
        return y, xr.grad, wr.grad

    def chk_fwd():
        y = to_np(F.rms_norm(to_t(xv), (n,), wt))
        return _check_forward(y, None, x.dtype, exact=False, x=xv, w=w)

    def chk_bwd():
        _, dx, dw = fwd_bwd(to_t(xv), to_t(dyv))
        return _check_backward(to_np(dx), to_np(dw), xv, dyv, w, x.dtype, acc=np.float32)

    return [
        Candidate(f"torch {torch.__version__} F.rms_norm fwd", "fwd",
                  lambda: F.rms_norm(xt, (n,), wt), fwd_bytes, check=chk_fwd),
        Candidate(f"torch {torch.__version__} fwd+autograd bwd", "fwd+bwd",
                  lambda: fwd_bwd(xt, dyt), fwd_bytes + bwd_bytes, check=chk_bwd),
    ]


def _jax_candidates(x, dy, w, xv, dyv, fwd_bytes, bwd_bytes) -> list[Candidate]:
    """JAX ``jax.jit`` (XLA CPU) RMSNorm in the torch convention: float32 opmath, the statistic
    in float32, one rounding to the input dtype; forward, and forward + backward through
    ``jax.vjp`` with the cotangent dy (what ``jax.grad`` computes, without reducing to a scalar).
    float64 needs JAX's global x64 mode, so it is not run."""
    if x.dtype == np.float64:
        return []
    import jax
    import jax.numpy as jnp

    from rmsref._shapes import resolve_eps

    eps = resolve_eps(None, x.dtype)  # the oracle's default, as for every other candidate

    def rms(xa, wa):
        x32 = xa.astype(jnp.float32)
        rstd = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
        return (x32 * rstd * wa.astype(jnp.float32)).astype(xa.dtype)

    def rms_fwd_bwd(xa, wa, dya):
        y, vjp = jax.vjp(rms, xa, wa)
        dx, dw = vjp(dya)
        return y, dx, dw

    fwd, fwd_bwd = jax.jit(rms), jax.jit(rms_fwd_bwd)
    xj, dyj, wj = jnp.asarray(x), jnp.asarray(dy), jnp.asarray(w)

    def chk_fwd():
        y = np.asarray(fwd(jnp.asarray(xv), wj))
        return _check_forward(y, None, x.dtype, exact=False, x=xv, w=w)

    def chk_bwd():
        _, dx, dw = fwd_bwd(jnp.asarray(xv), wj, jnp.asarray(dyv))
        return _check_backward(np.asarray(dx), np.asarray(dw), xv, dyv, w, x.dtype,
                               acc=np.float32)

    return [
        Candidate(f"jax {jax.__version__} jit fwd", "fwd",
                  lambda: fwd(xj, wj).block_until_ready(), fwd_bytes, check=chk_fwd),
        Candidate(f"jax {jax.__version__} jit vjp fwd+bwd", "fwd+bwd",
                  lambda: jax.block_until_ready(fwd_bwd(xj, wj, dyj)), fwd_bytes + bwd_bytes,
                  check=chk_bwd),
    ]


# ------------------------------------------------------------------------------ measuring
def measure(cands: list[Candidate], rounds: int, repeats: int) -> None:
    """Validate every candidate, then time the valid ones, interleaved round by round."""
    for c in cands:
        if c.check is not None:
            try:
                c.refused = c.check()
            except Exception as exc:  # a crash is a failed validation, not a benchmark
                c.refused = f"{type(exc).__name__}: {exc}"
        if c.refused is None:
            c.run()  # warm-up (compilation, first touch)
    for _ in range(rounds):
        for c in cands:
            if c.refused is not None:
                continue
            best = float("inf")
            reps = 1 if c.name.startswith("numpy oracle") else repeats
            for _ in range(reps):
                t0 = time.perf_counter()
                c.run()
                best = min(best, time.perf_counter() - t0)
            c.times.append(best)


def summarise(case: str, cands: list[Candidate]) -> list[dict]:
    """Per-candidate medians; ratios are per round (same-round copy bandwidth: the fastest
    copy of the baseline), then the median. Without baselines marked, the first two candidates
    are the preallocated and the allocating copy."""
    outs, news = _baseline(cands, "out"), _baseline(cands, "new")
    by_name = {c.name: c for c in cands}
    ours_fwd = next(c for c in cands if c.name.startswith("numba rms_norm fwd") and "default"
                    in c.name)
    ours_bwd = next(c for c in cands if c.name.startswith("numba rms_norm bwd") and "default"
                    in c.name)
    oracle_f, oracle_b = by_name.get("numpy oracle fwd"), by_name.get("numpy oracle bwd")
    rows = []
    for c in cands:
        row = {"case": case, "name": c.name, "kind": c.kind, "refused": c.refused}
        if c.refused is None and c.times:
            t = statistics.median(c.times)
            bw = _bandwidths(outs)  # B per round
            pairs = zip(c.times, bw, strict=True)
            ratio = statistics.median(tt / (c.nbytes / b) for tt, b in pairs)
            row.update(time_ms=t * 1e3, gbs=c.nbytes / t / 1e9, x_copy=ratio)
            bw_new = _bandwidths(news)
            if bw_new:  # the same, against a copy that also allocates its output
                pairs = zip(c.times, bw_new, strict=True)
                row["x_copy_new"] = statistics.median(tt / (c.nbytes / b) for tt, b in pairs)
            if c.kind == "fwd" and oracle_f is not None and oracle_f.times and c is ours_fwd:
                row["vs_oracle"] = statistics.median(oracle_f.times) / t
            if c.kind == "bwd" and oracle_b is not None and oracle_b.times and c is ours_bwd:
                row["vs_oracle"] = statistics.median(oracle_b.times) / t
            if c.name.startswith(PEERS) and ours_fwd.times and ours_bwd.times:
                ours = statistics.median(ours_fwd.times) + (
                    statistics.median(ours_bwd.times) if c.kind == "fwd+bwd" else 0.0)
                row["speedup_ours"] = t / ours
        rows.append(row)
    # the default kernels of each, written the same way (64 lanes, pipelined blocks of rows),
    # both called with out=: an allocating call's time varies with the OS (_out_candidates)
    for ours, ln, label in ((by_name.get(OUT_FWD), by_name.get(LN_OUT_FWD), "fwd"),
                            (by_name.get(OUT_BWD), by_name.get(LN_OUT_BWD), "bwd")):
        if ours is not None and ln is not None and ln.times and ours.times:
            rows.append({"case": case, "name": f"{RATIO_NAME} ({label})", "kind": "ratio",
                         "label": label, "refused": None,
                         "value": statistics.median(ours.times) / statistics.median(ln.times)})
    return rows


def arithmetic_rows(case: str, cands: list[Candidate], in_cache: dict[str, float],
                    elements: int, threads: int) -> list[dict]:
    """The default kernels' arithmetic against the copy: ``in_cache`` gives what an element
    costs a thread when memory costs nothing (``bench/halfrow.py``: ns per element, one thread,
    the whole kernel on a batch in cache), and the copy's time per element on a thread is
    this case's bytes per element at the preallocated copy's bandwidth B (median over rounds),
    times the number of threads sharing B. Their ratio r bounds what overlap can do: a kernel
    that hid every memory access under its arithmetic (or the reverse) would take max(1, r)
    times the copy, one that overlapped nothing 1 + r."""
    bw = _bandwidths(_baseline(cands, "out"))
    rows = []
    for kind, key in (("fwd", "fwd kernel"), ("bwd", "bwd kernel")):
        ours = next((c for c in cands if c.name.startswith(f"numba rms_norm {kind} v")
                     and "default" in c.name), None)
        if ours is None or not bw or key not in in_cache:
            continue
        copy_ns = ours.nbytes / statistics.median(bw) / elements * threads * 1e9
        rows.append({"case": case, "name": f"arithmetic in cache ({kind})", "kind": "arith",
                     "label": kind, "refused": None, "value": in_cache[key],
                     "copy_ns": copy_ns, "threads": threads})
    return rows


def _baseline(cands: list[Candidate], kind: str) -> list[Candidate]:
    """The copies that set B for ``kind`` ("out": preallocated, "new": allocating); without
    marked baselines, the first candidate for "out" and the second for "new"."""
    return [c for c in cands if c.baseline == kind] or (cands[:1] if kind == "out" else cands[1:2])


def _bandwidths(copies: list[Candidate]) -> list[float]:
    """Bytes per second of the fastest of ``copies`` in each round ([] if none was timed)."""
    timed = [c for c in copies if c.times]
    return [max(rates) for rates in zip(*([c.nbytes / t for t in c.times] for c in timed),
                                        strict=True)] if timed else []


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| case | candidate | time (ms) | GB/s | x copy | x copy, new array | vs oracle "
             "| peer / ours |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["kind"] == "ratio":
            lines.append(f"| {r['case']} | {r['name']} | | | | | | **{r['value']:.2f}** |")
            continue
        if r["kind"] == "arith":  # in the targets lines
            continue
        if r["refused"] is not None:
            lines.append(f"| {r['case']} | {r['name']} | REFUSED: {r['refused']} | | | | | |")
            continue
        if "time_ms" not in r:
            continue
        vo = f"{r['vs_oracle']:.1f}x" if "vs_oracle" in r else ""
        st = f"{r['speedup_ours']:.1f}x" if "speedup_ours" in r else ""
        xn = f"{r['x_copy_new']:.2f}" if "x_copy_new" in r else ""
        lines.append(f"| {r['case']} | {r['name']} | {r['time_ms']:.2f} | {r['gbs']:.1f} | "
                     f"{r['x_copy']:.2f} | {xn} | {vo} | {st} |")
    return "\n".join(lines) + "\n\n" + "\n".join(targets(rows)) + "\n"


def targets(rows: list[dict]) -> list[str]:
    """The ratio targets, like for like: ``out=`` calls against the preallocated copy,
    allocating calls against the copy into a new array."""
    lines = ["Targets (forward <= 1.25x, backward <= 1.4x a parallel copy of the same "
             "bytes), like for like:", ""]
    by = {(r["case"], r["name"]): r for r in rows if "x_copy" in r}
    for case in dict.fromkeys(r["case"] for r in rows):
        for kind, out_name in (("fwd", OUT_FWD), ("bwd", OUT_BWD)):
            alloc = next((r for (c, name), r in by.items() if c == case and name.startswith(
                f"numba rms_norm {kind} v") and "(default)" in name), None)
            with_out = by.get((case, out_name))
            if alloc is None or with_out is None or "x_copy_new" not in alloc:
                continue
            t = TARGETS[kind]
            a, b = with_out["x_copy"], alloc["x_copy_new"]
            # the same targets for every dtype: a half-precision call moves half the bytes
            verdict = f"target {t}: " + ("met" if max(a, b) <= t else "NOT met")
            lines.append(f"- {case} {kind}: out= {a:.2f}x the preallocated copy, allocating "
                         f"{b:.2f}x the allocating copy ({verdict})")
            arith = next((r for r in rows if r["case"] == case and r["kind"] == "arith"
                          and r["label"] == kind), None)
            if arith is not None:
                lines.append("  " + _overlap_model(arith, t))
        ratios = [f"{r['label']} {r['value']:.2f}" for r in rows
                  if r["case"] == case and r["kind"] == "ratio"]
        if ratios:
            lines.append(f"- {case} {RATIO_NAME}, default kernels of each, out=: "
                         + ", ".join(ratios))
        peers = []
        for prefix, label in zip(PEERS, PEER_LABELS, strict=True):
            got = [f"{r['kind']} {r['speedup_ours']:.2f}" for r in rows if r["case"] == case
                   and r["name"].startswith(prefix) and "speedup_ours" in r]
            if got:
                peers.append(f"{label}/rmsref time " + ", ".join(got))
        if peers:
            lines.append(f"- {case} " + "; ".join(peers)
                         + " (fwd+bwd against our forward + backward)")
    return lines


def _overlap_model(arith: dict, target: float) -> str:
    """What the kernel's arithmetic allows (``arithmetic_rows``), in words."""
    r = arith["value"] / arith["copy_ns"]
    floor, none = max(1.0, r), 1.0 + r
    if floor > target:
        reach = "the target is out of reach with this arithmetic per element"
    elif none > target:
        reach = "the target is within reach only where the arithmetic overlaps the memory"
    else:
        reach = "the target is within reach even with no overlap"
    return (f"arithmetic in cache {arith['value']:.3f} ns per element on one thread, "
            f"{r:.2f}x the copy's {arith['copy_ns']:.3f} ns per element on each of "
            f"{arith['threads']} threads: full overlap would give {floor:.2f}x the copy, none "
            f"{none:.2f}x; {reach}")


def plot(rows: list[dict], path: Path) -> str | None:
    """GB/s against N, one panel per dtype in the run (float32, bfloat16, float16): the default
    kernels, the copy and the peers. None when done."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r in rows:
        if "gbs" not in r:
            continue
        if not (r["kind"] == "copy" and r["name"].startswith("parallel copy (")
                and not r["name"].endswith("new array")
                or "(default)" in r["name"] or r["name"].startswith(PEERS)):
            continue
        dtype, n = r["case"].split(":")[0], int(r["case"].split("x")[-1])
        panels.setdefault(dtype, {}).setdefault(r["name"], []).append((n, r["gbs"]))
    order = [d for d in ("float32", "bfloat16", "float16", "float64") if d in panels]
    if not order:
        return "no rows to plot"
    fig, axes = plt.subplots(1, len(order), figsize=(5.2 * len(order), 4.6), sharey=True,
                             squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, dtype in zip(axes[0], order, strict=True):
        for k, (name, pts) in enumerate(panels[dtype].items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                    linestyle=styles[k // 10 % len(styles)])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (features per row)")
        ax.set_title(f"{dtype} RMSNorm on CPU, median over rounds")
    axes[0][0].set_ylabel("GB/s (bytes formula in bench/cpu.py)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def parse_cases(text: str) -> list[tuple[np.dtype, int, int]]:
    cases = []
    for item in text.split(","):
        try:
            dname, shape = item.strip().split(":")
            m, n = (int(v) for v in shape.lower().split("x"))
            cases.append((FLOAT_DTYPES[dname], m, n))
        except (ValueError, KeyError):
            raise SystemExit(f"bad case {item!r}: expected dtype:MxN, e.g. float32:8192x4096, "
                             f"dtype one of {', '.join(FLOAT_DTYPES)}") from None
    return cases


def _installed(peer: str) -> bool:
    """Whether the peer ``peer`` (a module name) can be imported; says so when it cannot."""
    try:
        importlib.import_module(peer)
    except ImportError:
        print(f"{peer} not installed: no {peer} comparison", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None,
                        help=f"comma list dtype:MxN (default {DEFAULT_CASES})")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--repeats", type=int, default=3, help="calls per round (best of)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_CASES}, 1 round, 1 repeat")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    parser.add_argument("--no-jax", action="store_true", help="skip JAX even if installed")
    parser.add_argument("--no-oracle", action="store_true", help="skip timing the NumPy oracle")
    parser.add_argument("--no-model", action="store_true",
                        help="skip timing the kernels in cache (the overlap model under the "
                        "targets)")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown table (default bench/results/cpu.md; with --quick, "
                        "quick-cpu.md in the system's temporary folder)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="PNG plot (default bench/results/cpu_gbps.png; with --quick, "
                        "quick-cpu_gbps.png in the system's temporary folder)")
    args = parser.parse_args(argv)
    # a smoke run never replaces the committed results unless asked to
    where, prefix = (Path(tempfile.gettempdir()), "quick-") if args.quick else (RESULTS, "")
    args.out = args.out or where / f"{prefix}cpu.md"
    args.plot = args.plot or where / f"{prefix}cpu_gbps.png"
    if args.quick:
        args.cases = args.cases or QUICK_CASES
        args.rounds, args.repeats = 1, 1
        args.no_model = True  # a smoke run: tiny arrays, where the copy is mostly call overhead
    cases = parse_cases(args.cases or DEFAULT_CASES)
    reason = rmsref.backends.why_unavailable("numba_cpu")
    if reason is not None:
        print(f"numba_cpu is unavailable: {reason}", file=sys.stderr)
        return 1
    with_torch = not args.no_torch and _installed("torch")
    with_jax = not args.no_jax and _installed("jax")

    import numba

    rows: list[dict] = []
    rng = np.random.default_rng(0)
    for dtype, m, n in cases:
        name = f"{dtype.name}:{m}x{n}"
        x = rng.standard_normal((m, n)).astype(dtype)
        dy = rng.standard_normal((m, n)).astype(dtype)
        w = rng.standard_normal(n).astype(dtype)
        cands = build_candidates(x, dy, w, with_torch=with_torch, with_oracle=not args.no_oracle,
                                 with_jax=with_jax)
        measure(cands, args.rounds, args.repeats)
        case_rows = summarise(name, cands)
        if not args.no_model:
            from bench.halfrow import in_cache  # the kernels' arithmetic, memory taken out
            from rmsref.kernels.numba_cpu import thread_count

            case_rows += arithmetic_rows(name, cands, in_cache(dtype, n, 500, args.rounds + 2),
                                         m * n, thread_count())
        rows.extend(case_rows)
        print(markdown(case_rows, f"## {name}"), flush=True)

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    header = (
        f"# bench/cpu.py: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{numba.get_num_threads()} Numba threads ({numba.threading_layer()} layer), "
        f"numba {numba.__version__}, numpy {np.__version__}\n\n"
        f"Median of {args.rounds} interleaved rounds (best of {args.repeats} calls each; oracle 1 "
        f"call). 'x copy': time relative to moving the same bytes at the copy bandwidth measured "
        f"in the same round (the fastest parallel copy: prange, rmsref's threads, or rmsref's "
        f"threads with prefetch; 'new array': the fastest of the copies into a new array). Load "
        f"average at the end: {load}."
    )
    text = markdown(rows, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    why = plot(rows, args.plot)
    print(why or f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
