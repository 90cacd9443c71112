"""The Numba CPU backend (rmsref.kernels.numba_cpu) against the NumPy oracle.

Reference: the oracle (rmsref.rms_norm_forward etc.) on the same inputs. Tolerances:
- float32 outputs: >= 99.9 % of elements equal to the oracle's (which is the float64 result
  rounded once to float32), the rest within 1 float32 ulp (both round a float64 value; the
  float64 values differ by a few float64 ulps).
- float16/bfloat16 outputs: within one ulp of the output dtype (rmsref.tolerance.ulp) of the
  oracle's output, and within the bound below of the exact value; the kernels compute them in
  float32 (RMSNorm's y) or round them to the half type through float32 (dx, LayerNorm), so a
  near-tie may land one ulp from the oracle's once-rounded value (>= 99.9 % equal:
  tests/test_numba_cpu_half.py checks the rate on every bit pattern).
- float64 outputs, dx, dweight: the bound of docs/tolerances.md, checked by
  rmsref.comparison.compare (the oracle in float64 on the same inputs, the per-element bound),
  with float64 accumulation in 8 lanes (reduction="blocked", block=8): an upper bound for the 64
  lanes + tree of the kernels (effective length ceil(n/64) + 6 for n > 64, at most ceil(log2 n)
  below since empty lanes add exact zeros; both <= ceil(n/8) + 3).
Determinism: bitwise equality across NUMBA_NUM_THREADS=1 and 2 (subprocesses), batch sizes,
layouts, and two Python threads at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="the Numba kernels need numba (pip install 'rmsref[numba]')")

import rmsref  # noqa: E402
from rmsref import tolerance  # noqa: E402
from rmsref._shapes import default_eps  # noqa: E402
from rmsref.comparison import Reference, compare  # noqa: E402
from rmsref.kernels import numba_cpu as K  # noqa: E402

from .conftest import DTYPES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NS = (1, 7, 64, 127, 128, 4097)
ROWS = (0, 1, 3, 1000)


def _data(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _check_close(got, want, dtype, what, *, bound=None):
    """The module docstring's contract for one output array; prints the worst element."""
    got64 = np.asarray(got, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, oracle {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, oracle {want.shape}"
    if got.size == 0:
        return
    err = np.abs(got64 - want64)
    dtype = np.dtype(dtype)
    if bound is not None:
        limit = bound
    elif dtype == np.float64:
        raise AssertionError("float64 comparisons need an explicit bound")
    else:
        limit = tolerance.ulp(want64, dtype)
    limit = np.broadcast_to(limit, err.shape)
    worst = np.unravel_index(np.argmax(err - limit), err.shape)
    assert np.all(err <= limit), (
        f"{what}: {np.count_nonzero(err > limit)} elements beyond the bound; worst at {worst}: "
        f"got {got64[worst]!r}, oracle {want64[worst]!r}, bound {limit[worst]!r}"
    )
    if dtype == np.float32 and bound is None:
        equal = np.mean(got64 == want64)
        assert equal >= 0.999, f"{what}: only {equal:.4%} of float32 elements equal the oracle's"


_HALF = (np.dtype(np.float16), rmsref.bfloat16)

#: The error model of the module docstring: float64 sums in 8 lanes (an upper bound).
_SUMS = dict(acc_dtype=np.float64, reduction="blocked", block=8)


def _model(dtype, n, rows=1):
    return tolerance.ErrorModel(out_dtype=np.dtype(dtype), n=n, rows=rows, **_SUMS)


def _reference(x, n, w, dy=None):
    """The oracle on these inputs (float64, eps as the kernels' default)."""
    return Reference(x, (n,), w, default_eps(x.dtype), dy=dy)


def _within_bound(quantity, got, ref, model, what):
    """``got`` within the tolerance model's bound of the oracle (rmsref.comparison.compare);
    prints the worst element."""
    assert np.shape(got) == np.shape(ref.exact(quantity)) or np.size(got) == ref.exact(
        quantity).size, f"{what}: shape {np.shape(got)}"
    c = compare(quantity, got, ref, model)
    if not c.passed:
        r, j = c.worst
        got_w = np.asarray(got, np.float64).reshape(c.reference.shape)[r, j]
        raise AssertionError(
            f"{what}: {np.count_nonzero(c.ratios > 1)} elements beyond the bound; worst at "
            f"({r}, {j}): got {got_w!r}, oracle {c.reference[r, j]!r}, bound {c.bound[r, j]!r} "
            f"(error/bound {c.ratio:.3g})")


# ------------------------------------------------------------------------------------ forward
# float16 and float64 compile their own forward and backward kernels (~5 s each, cold): marked
# slow so that `-m "not slow"` keeps the quick run to float32 and bfloat16.
_DTYPE_PARAMS = [
    pytest.param(dt, id=name, marks=[pytest.mark.slow] if name in ("float16", "float64") else [])
    for name, dt in DTYPES.items()
]


@pytest.mark.parametrize("dtype", _DTYPE_PARAMS)
def test_forward_matches_oracle(dtype, rng):
    """y and rstd for every N x rows of the issue, with a weight."""
    for n in NS:
        w = _data(rng, n, dtype)
        for m in ROWS:
            x = _data(rng, (m, n), dtype)
            y, rstd = K.rms_norm_forward(x, n, w)
            y_o, rstd_o = rmsref.rms_norm_forward(x, n, w)
            what = f"y {np.dtype(dtype)} ({m}, {n})"
            if dtype == np.float64:
                _within_bound("y", y, _reference(x, n, w), _model(dtype, n, rows=m), what)
            else:
                _check_close(y, y_o, dtype, what)
            assert rstd.shape == (m, 1)
            assert rstd.dtype == (np.float32 if dtype in (DTYPES["float16"], DTYPES["bfloat16"])
                                  else np.float64)
            rel = np.abs(rstd.astype(np.float64) - rstd_o) / rstd_o if m else np.zeros(0)
            limit = 2.0**-24 if rstd.dtype == np.float32 else (n / 8 + 8) * 2.0**-53
            assert np.all(rel <= limit), f"rstd ({m}, {n}): max rel error {rel.max():.3g}"


@pytest.mark.parametrize("dtype", _DTYPE_PARAMS)
def test_backward_matches_oracle(dtype, rng):
    """dx, dweight, dbias (weight and bias given, rstd recomputed and rstd saved)."""
    for n in NS:
        w, b = _data(rng, n, dtype), _data(rng, n, dtype)
        for m in ROWS:
            x, dy = _data(rng, (m, n), dtype), _data(rng, (m, n), dtype)
            got = K.rms_norm_backward(dy, x, n, w, bias=b)
            ref = rmsref.rms_norm_backward(dy, x, n, w, bias=b)
            assert isinstance(got, rmsref.RMSNormGrads)
            oracle, model = _reference(x, n, w, dy), _model(dtype, n, rows=m)
            _within_bound("dx", got.dx, oracle, model, f"dx ({m}, {n})")
            _within_bound("dweight", got.dweight, oracle, model, f"dweight ({m}, {n})")
            # dbias = Σ dy: the dweight bound with xhat = 1 (the comparison has no dbias)
            bdb = tolerance.bound("dweight", dweight=ref.dbias, dy=dy, xhat=np.ones(dy.shape),
                                  out_dtype=dtype, n=n, rows=m, **_SUMS)
            _check_close(got.dbias, ref.dbias, dtype, f"dbias ({m}, {n})", bound=bdb)
            # with the forward's own saved rstd (float32 for half inputs): the oracle given the
            # same statistic, within the same bounds
            _, rstd_k = K.rms_norm_forward(x, n, w)
            got = K.rms_norm_backward(dy, x, n, w, rstd=rstd_k)
            ref = rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd_k)
            for name in ("dx", "dweight"):
                bound = oracle.bound(name, model).reshape(np.shape(getattr(ref, name)))
                if name == "dx" and dtype in _HALF:
                    bound = None  # rounded through float32: the 1-ulp contract (docstring)
                _check_close(getattr(got, name), getattr(ref, name), dtype,
                             f"{name} saved rstd ({m}, {n})", bound=bound)
            assert got.dbias is None


def test_float32_equality_rates(rng):
    """float32 dx and dweight: >= 99.9 % equal to the oracle rounded to float32, rest 1 ulp."""
    m, n = 1000, 512
    x, dy, w = _data(rng, (m, n), np.float32), _data(rng, (m, n), np.float32), _data(
        rng, n, np.float32)
    got, ref = K.rms_norm_backward(dy, x, n, w), rmsref.rms_norm_backward(dy, x, n, w)
    _check_close(got.dx, ref.dx, np.float32, "dx")
    _check_close(got.dweight, ref.dweight, np.float32, "dweight")


def test_options_offset_partial_bias_out_dtype(rng):
    """offset, partial and bias honoured in forward and backward; out_dtype."""
    m, n = 37, 100
    x, dy = _data(rng, (m, n), np.float32), _data(rng, (m, n), np.float32)
    w, b = _data(rng, n, np.float32, 0.1), _data(rng, n, np.float32)
    kw = dict(bias=b, offset=1.0, partial=0.3)
    y, _ = K.rms_norm_forward(x, n, w, 1e-5, **kw)
    y_o, _ = rmsref.rms_norm_forward(x, n, w, 1e-5, **kw)
    _check_close(y, y_o, np.float32, "y offset/partial/bias")
    got = K.rms_norm_backward(dy, x, n, w, 1e-5, **kw)
    ref = rmsref.rms_norm_backward(dy, x, n, w, 1e-5, **kw)
    for name in ("dx", "dweight", "dbias"):
        g, r = getattr(got, name), getattr(ref, name)
        b_ = 1e-6 * (np.abs(r).max() + 1)  # float32-level; equality rate checked elsewhere
        _check_close(g, r, np.float32, name, bound=b_)
    y16, _ = K.rms_norm_forward(x, n, w, out_dtype=rmsref.bfloat16)
    y16_o, _ = rmsref.rms_norm_forward(x, n, w, out_dtype=rmsref.bfloat16)
    _check_close(y16, y16_o, rmsref.bfloat16, "y out_dtype=bfloat16")
    y_nw, _ = K.rms_norm_forward(x, n, None, offset=0.5)
    _check_close(y_nw, rmsref.rms_norm_forward(x, n, None, offset=0.5)[0], np.float32, "no w")


def test_multidim_shape_and_views_without_copies(rng):
    """normalized_shape (4, 6); strided rows, strided columns, negative strides and swapped
    leading dims are read in place (the kernel sees views of x) and give the bits of the
    contiguous copy."""
    x = _data(rng, (5, 3, 4, 6), np.float32)
    w = _data(rng, (4, 6), np.float32)
    y, rstd = K.rms_norm_forward(x, (4, 6), w)
    y_o, rstd_o = rmsref.rms_norm_forward(x, (4, 6), w)
    _check_close(y, y_o, np.float32, "y (4, 6)")
    assert rstd.shape == rstd_o.shape == (5, 3, 1, 1)

    big = _data(rng, (40, 2, 3, 130), np.float32)
    dy_big = _data(rng, big.shape, np.float32)
    wn = _data(rng, 65, np.float32)
    views = {
        "strided columns": lambda a: a[:, 0, 1, ::2],
        "strided rows": lambda a: a[::3, 1, 2, :65],
        "negative strides": lambda a: a[::-1, 0, 0, 130:64:-1],
        "swapped leading dims": lambda a: np.swapaxes(a[:, 0, :, :65], 0, 1),
    }
    for name, view in views.items():
        xv, dyv = view(big), view(dy_big)
        assert not xv.flags.c_contiguous
        k3 = K._rows3([K._bits(xv)], 1)[0]
        assert np.shares_memory(k3, big), f"{name}: the kernel got a copy"
        y, _ = K.rms_norm_forward(xv, 65, wn)
        y_c, _ = K.rms_norm_forward(np.ascontiguousarray(xv), 65, wn)
        assert np.array_equal(y, y_c), name
        g = K.rms_norm_backward(dyv, xv, 65, wn)  # rstd first, then the pipelined kernel
        g_c = K.rms_norm_backward(np.ascontiguousarray(dyv), np.ascontiguousarray(xv), 65, wn)
        assert np.array_equal(g.dx, g_c.dx) and np.array_equal(g.dweight, g_c.dweight), name
        g = K.rms_norm_backward(dyv, xv, 65)  # no weight: w = 1 on the same strides
        g_c = K.rms_norm_backward(np.ascontiguousarray(dyv), np.ascontiguousarray(xv), 65)
        assert np.array_equal(g.dx, g_c.dx), name
        # with a saved rstd: the pipelined kernel walking the same strides
        _, rstd_v = K.rms_norm_forward(xv, 65, wn)
        g = K.rms_norm_backward(dyv, xv, 65, wn, rstd=rstd_v)
        g_c = K.rms_norm_backward(np.ascontiguousarray(dyv), np.ascontiguousarray(xv), 65, wn,
                                  rstd=rstd_v)
        assert np.array_equal(g.dx, g_c.dx) and np.array_equal(g.dweight, g_c.dweight), name
        _check_close(y, rmsref.rms_norm_forward(xv, 65, wn)[0], np.float32, name)


def test_half_strided_and_empty(rng):
    """bfloat16 through a strided view; empty batches keep their shapes."""
    x = _data(rng, (20, 64), rmsref.bfloat16)[::2, ::2]  # the one half-precision 'A' layout
    y, _ = K.rms_norm_forward(x, 32)
    _check_close(y, rmsref.rms_norm_forward(x, 32)[0], rmsref.bfloat16, "bf16 strided")
    e = np.zeros((0, 3, 8), np.float32)
    y, rstd = K.rms_norm_forward(e, 8)
    assert y.shape == (0, 3, 8) and rstd.shape == (0, 3, 1)
    g = K.rms_norm_backward(e, e, 8, np.ones(8, np.float32))
    assert g.dx.shape == e.shape and np.array_equal(g.dweight, np.zeros(8, np.float32))
    g = K.rms_norm_backward(e, e, 8, np.ones(8, np.float32), rstd=rstd)  # the pipelined kernel
    assert g.dx.shape == e.shape and np.array_equal(g.dweight, np.zeros(8, np.float32))


# ------------------------------------------------------------------------ determinism
def test_batch_invariance(rng):
    """A row's y, rstd and dx are the same bits alone or in any batch; dweight is unchanged by
    appending rows whose dy is zero (the parts are fixed by the row index)."""
    m, n = 300, 257
    x, dy, w = _data(rng, (m, n), np.float32), _data(rng, (m, n), np.float32), _data(
        rng, n, np.float32)
    y, rstd = K.rms_norm_forward(x, n, w)
    g = K.rms_norm_backward(dy, x, n, w)
    for rows in (slice(0, 1), slice(5, 6), slice(7, 200), slice(299, 300)):
        ys, rs = K.rms_norm_forward(x[rows], n, w)
        assert np.array_equal(ys, y[rows]) and np.array_equal(rs, rstd[rows]), rows
        gs = K.rms_norm_backward(dy[rows], x[rows], n, w)
        assert np.array_equal(gs.dx, g.dx[rows]), rows
    g_saved = K.rms_norm_backward(dy, x, n, w, rstd=rstd)  # the pipelined kernel
    for rows in (slice(0, 1), slice(63, 64), slice(7, 200), slice(299, 300)):
        gs = K.rms_norm_backward(dy[rows], x[rows], n, w, rstd=rstd[rows])
        assert np.array_equal(gs.dx, g_saved.dx[rows]), rows
    xp = np.concatenate([x, _data(rng, (333, n), np.float32)])
    dyp = np.concatenate([dy, np.zeros((333, n), np.float32)])
    gp = K.rms_norm_backward(dyp, xp, n, w)
    assert np.array_equal(gp.dweight, g.dweight)
    assert np.array_equal(gp.dx[:m], g.dx)
    _, rstd_p = K.rms_norm_forward(xp, n, w)
    gp = K.rms_norm_backward(dyp, xp, n, w, rstd=rstd_p)
    assert np.array_equal(gp.dweight, g_saved.dweight)


@pytest.mark.slow  # compiles the fused and LayerNorm kernels in layouts the default run does not
def test_batch_invariance_fused_and_layer_norm(rng):
    """The fused residual and LayerNorm kernels: a row's outputs are the same bits alone or in
    any batch (a block's first row is summed alone, the others inside the previous row's
    loop), and dweight/dbias are unchanged by appended rows whose dy is zero."""
    m, n = 300, 257
    x, r, dy = (_data(rng, (m, n), np.float32) for _ in range(3))
    w, b = _data(rng, n, np.float32), _data(rng, n, np.float32)
    y, res, rstd = K.add_rms_norm_forward(x, r, n, w)
    g = K.add_rms_norm_backward(dy, dy, x, r, n, w)
    yl, mean, rstd_l = K.layer_norm_forward(x, n, w, b)
    gl = K.layer_norm_backward(dy, x, n, w, b)
    for rows in (slice(0, 1), slice(5, 6), slice(7, 200), slice(299, 300)):
        ys, ress, rstds = K.add_rms_norm_forward(x[rows], r[rows], n, w)
        assert np.array_equal(ys, y[rows]) and np.array_equal(ress, res[rows]), rows
        assert np.array_equal(rstds, rstd[rows]), rows
        gs = K.add_rms_norm_backward(dy[rows], dy[rows], x[rows], r[rows], n, w)
        assert np.array_equal(gs.dx, g.dx[rows]) and np.array_equal(gs.dresidual,
                                                                    g.dresidual[rows]), rows
        ys, means, rstds = K.layer_norm_forward(x[rows], n, w, b)
        assert np.array_equal(ys, yl[rows]) and np.array_equal(means, mean[rows]), rows
        assert np.array_equal(rstds, rstd_l[rows]), rows
        assert np.array_equal(K.layer_norm_backward(dy[rows], x[rows], n, w, b).dx, gl.dx[rows])
    # with the forward's saved rstd (float64 for float32 inputs, the value the backward
    # recomputes) the pipelined kernel runs: the same sums in the same order, the same bits
    gs = K.add_rms_norm_backward(dy, dy, x, r, n, w, rstd=rstd)
    assert all(np.array_equal(a, c) for a, c in zip(gs, g, strict=True))
    gs = K.add_rms_norm_backward(dy[7:200], None, x[7:200], r[7:200], n, w, rstd=rstd[7:200])
    assert np.array_equal(gs.dx, K.add_rms_norm_backward(dy, None, x, r, n, w).dx[7:200])
    xp = np.concatenate([x, _data(rng, (333, n), np.float32)])
    dyp = np.concatenate([dy, np.zeros((333, n), np.float32)])
    rp = np.concatenate([r, _data(rng, (333, n), np.float32)])
    assert np.array_equal(K.add_rms_norm_backward(dyp, None, xp, rp, n, w).dweight,
                          K.add_rms_norm_backward(dy, None, x, r, n, w).dweight)
    glp = K.layer_norm_backward(dyp, xp, n, w, b)
    assert np.array_equal(glp.dweight, gl.dweight) and np.array_equal(glp.dbias, gl.dbias)
    # with the forward's saved statistics (float64 for float32 inputs, the values the backward
    # recomputes) the pipelined kernel runs: the same sums in the same order, the same bits
    gs = K.layer_norm_backward(dy, x, n, w, b, mean=mean, rstd=rstd_l)
    assert all(np.array_equal(a, c) for a, c in zip(gs, gl, strict=True))
    gs = K.layer_norm_backward(dy[7:200], x[7:200], n, w, mean=mean[7:200], rstd=rstd_l[7:200])
    assert np.array_equal(gs.dx, K.layer_norm_backward(dy, x, n, w).dx[7:200])


_SUBPROCESS = """
import hashlib, numpy as np, rmsref
from rmsref.kernels import numba_cpu as K
import numba
h = hashlib.sha256()  # RMSNorm
h_other = hashlib.sha256()  # the fused residual add + RMSNorm and LayerNorm
rng = np.random.default_rng(7)
for dt in (np.float32, rmsref.bfloat16):
    x = rng.standard_normal((1000, 257)).astype(dt)
    dy = rng.standard_normal((1000, 257)).astype(dt)
    w = rng.standard_normal(257).astype(dt)
    y, rstd = K.rms_norm_forward(x, 257, w)
    g = K.rms_norm_backward(dy, x, 257, w, bias=w)
    gs = K.rms_norm_backward(dy, x, 257, w, rstd=rstd)
    for a in (y, rstd, g.dx, g.dweight, g.dbias, gs.dx, gs.dweight):
        h.update(np.ascontiguousarray(a).tobytes())
    if dt is not np.float32:  # float32 only: each dtype compiles six more kernels
        continue
    ya, res, rstd_a = K.add_rms_norm_forward(x, dy, 257, w)
    ga = K.add_rms_norm_backward(dy, x, x, dy, 257, w, rstd=rstd_a)
    gr = K.add_rms_norm_backward(dy, None, x, dy, 257, w, rounding="rounded-sum")
    yl, mean, rstd_l = K.layer_norm_forward(x, 257, w, w)
    gl = K.layer_norm_backward(dy, x, 257, w, w, mean=mean, rstd=rstd_l)
    gl2 = K.layer_norm_backward(dy, x, 257, w)
    for a in (ya, res, rstd_a, *ga, *gr[:2], gr.dweight, yl, mean, rstd_l, *gl, gl2.dx,
              gl2.dweight):
        h_other.update(np.ascontiguousarray(a).tobytes())
print(numba.get_num_threads(), h.hexdigest(), h_other.hexdigest())
"""


def test_same_bits_for_1_and_2_threads():
    """RMSNorm forward, dx, dweight, dbias, and the fused residual and LayerNorm kernels:
    identical bits with NUMBA_NUM_THREADS=1 and 2."""
    out = {}
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads, PYTHONPATH=str(ROOT))
        res = subprocess.run([sys.executable, "-c", _SUBPROCESS], env=env, capture_output=True,
                             text=True, timeout=300, cwd=ROOT)
        assert res.returncode == 0, res.stderr[-2000:]
        n_threads, *digests = res.stdout.split()[-3:]
        assert n_threads == threads
        out[threads] = digests
    assert out["1"] == out["2"], out


def test_two_python_threads(rng):
    """nogil kernels called from two Python threads at once give the single-threaded bits."""
    xs = [_data(rng, (400, 300), np.float32) for _ in range(2)]
    w = _data(rng, 300, np.float32)
    want = [K.rms_norm_forward(x, 300, w)[0] for x in xs]
    want_dx = [K.rms_norm_backward(x, x, 300, w).dx for x in xs]
    errors = []

    def work(k):
        try:
            for _ in range(20):
                if not np.array_equal(K.rms_norm_forward(xs[k], 300, w)[0], want[k]):
                    errors.append(f"thread {k}: forward differs")
                if not np.array_equal(K.rms_norm_backward(xs[k], xs[k], 300, w).dx, want_dx[k]):
                    errors.append(f"thread {k}: dx differs")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ------------------------------------------------------------------------ overflow
@pytest.mark.slow  # compiles extra Numba specialisations; CI runs it (pytest -m slow)
def test_float64_rows_near_the_ends_of_the_range(rng):
    """float64 rows of size ~1e300 and ~1e-300 take the scaled path: finite, as the oracle."""
    n = 64
    x = np.concatenate([_data(rng, (2, n), np.float64, 1e300), _data(rng, (2, n), np.float64,
                                                                       1e-300)])
    x[3, :5] = 5e-324  # subnormals in a tiny row
    dy = _data(rng, x.shape, np.float64)
    w = _data(rng, n, np.float64)
    y, rstd = K.rms_norm_forward(x, n, w, eps=0.0)
    y_o, rstd_o = rmsref.rms_norm_forward(x, n, w, eps=0.0)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, y_o, rtol=1e-13, atol=0)
    np.testing.assert_allclose(rstd, rstd_o, rtol=1e-13)
    gk = K.rms_norm_backward(dy[:2], x[:2], n, w, eps=0.0)
    go = rmsref.rms_norm_backward(dy[:2], x[:2], n, w, eps=0.0)
    assert np.all(np.isfinite(gk.dx))
    np.testing.assert_allclose(gk.dx, go.dx, rtol=1e-10, atol=1e-12 * np.abs(go.dx).max())
    # the fused residual kernels take the same path (the backward without and with a saved
    # rstd, which is out of the pipelined kernel's range here)
    yr, _, rstd_r = K.add_rms_norm_forward(x, np.zeros_like(x), n, w, eps=0.0)
    np.testing.assert_allclose(yr, y_o, rtol=1e-13, atol=0)
    for saved in (None, rstd_r[:2]):
        gr = K.add_rms_norm_backward(dy[:2], None, x[:2], np.zeros_like(x[:2]), n, w, eps=0.0,
                                     rstd=saved)
        assert np.all(np.isfinite(gr.dx))
        np.testing.assert_allclose(gr.dx, go.dx, rtol=1e-10, atol=1e-12 * np.abs(go.dx).max())
        np.testing.assert_allclose(gr.dweight, go.dweight, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, rmsref.bfloat16], ids=["float32", "bfloat16"])
def test_narrow_rows_without_the_scaled_route(dtype):
    """float32 and half kernels are compiled without the scaled route of ``_rstd_scaled``
    (``_rstd_from_sumsq``): their Σx² leaves [SS_LO, SS_HI] only for zero, inf and NaN rows,
    where the unscaled rstd is the oracle's, whatever eps (here up to 1e305, where the oracle
    scales the row by eps's exponent)."""
    n = 70
    x = np.ones((6, n), np.float64)
    x[0] = 0.0
    x[1, 3] = np.inf
    x[2, 5] = np.nan
    x[3] = 3e38  # squares overflow float32, not the kernels' float64 sum
    x[4] = 1e-45 if dtype == np.float32 else 1e-40  # the smallest subnormals
    x = x.astype(dtype)
    for eps in (0.0, 1e-6, 1e305):
        y, rstd = K.rms_norm_forward(x, n, eps=eps)
        y_o, rstd_o = rmsref.rms_norm_forward(x, n, eps=eps)
        with np.errstate(over="ignore"):  # bfloat16's saved rstd is float32: 1e40 -> inf
            rstd_o = rstd_o.astype(rstd.dtype)
        np.testing.assert_array_equal(rstd, rstd_o, err_msg=f"eps={eps}")
        np.testing.assert_array_equal(y.astype(np.float64), y_o.astype(np.float64),
                                      err_msg=f"eps={eps}")


@pytest.mark.slow  # compiles extra Numba specialisations; CI runs it (pytest -m slow)
def test_layer_norm_float64_limitation():
    """Documented limitation: LayerNorm kernels are not overflow-safe for float64 rows beyond
    ~1e154 (the squares overflow); the oracle is. Fine below that."""
    x = np.array([[1e200, -1e200, 3e200, 0.0]])
    assert not np.all(np.isfinite(K.layer_norm(x, 4)))
    assert np.all(np.isfinite(rmsref.layer_norm(x, 4)))
    x = np.array([[1e140, -1e140, 3e140, 0.0]])
    np.testing.assert_allclose(K.layer_norm(x, 4), rmsref.layer_norm(x, 4), rtol=1e-13)


# ------------------------------------------------------------------- residual, LayerNorm
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), rmsref.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rounding", [
    "fp32-sum",
    pytest.param("rounded-sum", marks=pytest.mark.slow),  # kernels of their own (budget)
])
def test_add_rms_norm(dtype, rounding, rng):
    """Fused residual add + RMSNorm forward and backward, both meanings of the sum; the
    backward with and without the forward's saved rstd (the pipelined kernel, the training
    call) and without a dresidual_out."""
    m, n = 50, 136
    x, r, dy, dro = (_data(rng, (m, n), dtype) for _ in range(4))
    w = _data(rng, n, dtype)
    y, res, rstd = K.add_rms_norm_forward(x, r, n, w, rounding=rounding)
    y_o, res_o, rstd_o = rmsref.add_rms_norm_forward(x, r, n, w, rounding=rounding)
    _check_close(y, y_o, dtype, f"y {rounding}")
    assert np.array_equal(res.view(np.uint8), res_o.view(np.uint8)), "new_residual"
    for saved in (None, rstd):
        got = K.add_rms_norm_backward(dy, dro, x, r, n, w, rounding=rounding, rstd=saved)
        ref = rmsref.add_rms_norm_backward(dy, dro, x, r, n, w, rounding=rounding, rstd=saved)
        assert isinstance(got, rmsref.AddRMSNormGrads)
        scale = np.abs(ref.dx.astype(np.float64)).max()
        for name in ("dx", "dresidual", "dweight"):
            g, o = getattr(got, name), getattr(ref, name)
            lim = tolerance.ulp(o, dtype) + 1e-12 * scale * (m if name == "dweight" else 1)
            _check_close(g, o, dtype, f"{name} {rounding}, rstd {saved is not None}", bound=lim)
    assert K.add_rms_norm(x, r, n, w, rounding=rounding)[0].dtype == x.dtype
    got_none = K.add_rms_norm_backward(dy, None, x, r, n, w, rounding=rounding)
    ref_none = rmsref.add_rms_norm_backward(dy, None, x, r, n, w, rounding=rounding)
    _check_close(got_none.dx, ref_none.dx, dtype, "dx without dresidual_out",
                 bound=tolerance.ulp(ref_none.dx, dtype) + 1e-12 * scale)


def test_layer_norm(rng):
    """LayerNorm forward (y, mean, rstd) and backward (dx, dweight, dbias) vs the oracle, float32;
    bfloat16 forward (the comparison kernel; fewer dtypes keep the compile time down)."""
    m, n = 60, 200
    dtype = np.dtype(np.float32)
    x = (_data(rng, (m, n), dtype) + 3).astype(dtype)  # a mean to subtract
    dy, w, b = _data(rng, (m, n), dtype), _data(rng, n, dtype), _data(rng, n, dtype)
    y, mean, rstd = K.layer_norm_forward(x, n, w, b)
    y_o, mean_o, rstd_o = rmsref.layer_norm_forward(x, n, w, b)
    _check_close(y, y_o, dtype, "layer_norm y")
    np.testing.assert_allclose(mean, mean_o, rtol=1e-13)
    np.testing.assert_allclose(rstd, rstd_o, rtol=1e-13)
    got = K.layer_norm_backward(dy, x, n, w, b)
    ref = rmsref.layer_norm_backward(dy, x, n, w, b)
    assert isinstance(got, rmsref.LayerNormGrads)
    scale = np.abs(ref.dx.astype(np.float64)).max()
    for name in ("dx", "dweight", "dbias"):
        g, o = getattr(got, name), getattr(ref, name)
        lim = tolerance.ulp(o, dtype) + 1e-12 * scale * (m if name != "dx" else 1)
        _check_close(g, o, dtype, f"layer_norm {name}", bound=lim)
    got_s = K.layer_norm_backward(dy, x, n, w, b, mean=mean, rstd=rstd)
    _check_close(got_s.dx, ref.dx, dtype, "dx, saved stats", bound=tolerance.ulp(ref.dx, dtype)
                 + 1e-12 * scale)
    xb = x.astype(rmsref.bfloat16)
    y, mean, rstd = K.layer_norm_forward(xb, n, w, b)
    _check_close(y, rmsref.layer_norm(xb, n, w, b), rmsref.bfloat16, "layer_norm y bf16")
    assert mean.dtype == rstd.dtype == np.float32


# ------------------------------------------------------------------------ errors
def test_clear_errors(rng):
    x = _data(rng, (2, 5), np.float32)
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\).*\(2, 5\)"):
        K.rms_norm(x, 4)
    with pytest.raises(ValueError, match=r"weight has shape \(4,\)"):
        K.rms_norm(x, 5, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="complex"):
        K.rms_norm(x.astype(np.complex64), 5)
    with pytest.raises(ValueError, match=r"dy has shape"):
        K.rms_norm_backward(x[:1], x, 5)
    with pytest.raises(ValueError, match="rounding"):
        K.add_rms_norm(x, x, 5, rounding="fp16")


def test_registry_returns_this_module():
    assert rmsref.backend("numba_cpu") is K
    for name in ("rms_norm", "rms_norm_forward", "rms_norm_backward", "add_rms_norm",
                 "add_rms_norm_forward", "add_rms_norm_backward", "layer_norm",
                 "layer_norm_forward", "layer_norm_backward"):
        assert callable(getattr(K, name)), name



@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_forked_child_runs_the_kernels(rng):
    """A process forked after a threaded call (the launcher's pool exists in the parent only)
    computes the same bits in the child, without hanging: the pool is made again there, and no
    Numba threading layer was started to abort the child."""
    import select

    x = _data(rng, (256, 512), np.float32)  # above SERIAL_BELOW: the pool is used
    y_parent = K.rms_norm(x, 512)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether its result has the parent's bits
        try:
            ok = np.array_equal(K.rms_norm(x, 512), y_parent)
            os.write(write_end, b"same" if ok else b"diff")
        finally:
            os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 60)
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    answer = os.read(read_end, 4) if ready else b"hung"
    os.close(read_end)
    assert answer == b"same", f"the forked child answered {answer!r}"


@pytest.mark.parametrize("dtype", _DTYPE_PARAMS)  # float16, float64: slow (their own kernels)
def test_the_backward_without_a_weight_runs_the_pipelined_kernel(rng, monkeypatch, dtype):
    """Without a weight (w = 1) the RMSNorm backward, with and without a saved rstd, runs the
    pipelined kernel (v3 read each row twice: 3x the time per element for float32), and dx has
    v3's bits (v3 run through a zero bias and a weight of ones), within the tolerance model's
    bound of the exact value; no dweight is returned."""
    m, n = 130, 200
    x, dy = _data(rng, (m, n), dtype), _data(rng, (m, n), dtype)
    _, rstd = K.rms_norm_forward(x, n)
    ones, zeros = np.ones(n, dtype), np.zeros(n, dtype)
    v3 = {s is None: K.rms_norm_backward(dy, x, n, ones, rstd=s, bias=zeros).dx
          for s in (rstd, None)}

    def no_v3(*args):
        raise AssertionError("the call ran v3")

    monkeypatch.setattr(K, "_rms_bwd_v3", no_v3)
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    for s in (rstd, None):
        got = K.rms_norm_backward(dy, x, n, rstd=s)
        assert got.dweight is None and got.dbias is None
        np.testing.assert_array_equal(got.dx.view(bits), v3[s is None].view(bits))
    _within_bound("dx", got.dx, _reference(x, n, None, dy), _model(dtype, n, rows=m),
                  "dx without a weight")


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_the_layer_norm_backward_without_a_weight_runs_the_pipelined_kernel(rng, monkeypatch,
                                                                           bias):
    """LayerNorm's backward with saved statistics and no weight (w = 1) runs the pipelined
    kernel (the general one took 2.9x its time per element, float32), with the bits of the
    general kernel, which the call without saved statistics runs (float32: the statistics it
    recomputes are the saved float64 ones), and no dweight."""
    m, n = 130, 200
    x, dy = _data(rng, (m, n), np.float32), _data(rng, (m, n), np.float32)
    b = _data(rng, n, np.float32) if bias else None
    _, mean, rstd = K.layer_norm_forward(x, n, None, b)
    general = K.layer_norm_backward(dy, x, n, None, b)

    def no_general(*args):
        raise AssertionError("the call ran the general kernel")

    monkeypatch.setattr(K, "_ln_bwd", no_general)
    got = K.layer_norm_backward(dy, x, n, None, b, mean=mean, rstd=rstd)
    assert got.dweight is None and (got.dbias is not None) == bias
    for name in ("dx", "dbias") if bias else ("dx",):
        np.testing.assert_array_equal(getattr(got, name).view(np.uint32),
                                      getattr(general, name).view(np.uint32), err_msg=name)


@pytest.mark.parametrize("dtype", _DTYPE_PARAMS)  # float16, float64: slow (their own kernels)
def test_rows_of_zero_dy_are_not_written_again(rng, monkeypatch, dtype):
    """Rows of dy = ±0 (tokens the loss leaves out, often half a batch) keep the pipelined
    backward's bits: Σ dxhat·x is +0 and c = +0 also where the general path sums it again, so
    neither RMSNorm's nor the fused add's pipelined kernel flags them to be written again
    (which ran one row at a time, on one thread). dx and dweight equal the general path's
    bits (v3, through ``bias=``), and the zero rows' dx, ±0 by the signs of x and w, the
    oracle's, as are the fused add's."""
    m, n = 130, 200
    x, r, dy = (_data(rng, (m, n), dtype) for _ in range(3))
    dy[:65] = 0.0
    dy[3, ::3] = -0.0
    dy[64, 7] = -0.0
    w = _data(rng, n, dtype)
    w[5] = 0.0

    def no_redo(*args):
        raise AssertionError("a row of the call was written again")

    monkeypatch.setattr(K, "_rms_bwd_redo", no_redo)
    monkeypatch.setattr(K, "_add_bwd_redo", no_redo)
    _, rstd = K.rms_norm_forward(x, n, w)
    fast = K.rms_norm_backward(dy, x, n, w, rstd=rstd)
    general = K.rms_norm_backward(dy, x, n, w, rstd=rstd, bias=w)
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    np.testing.assert_array_equal(fast.dx.view(bits), general.dx.view(bits))
    np.testing.assert_array_equal(fast.dweight.view(bits), general.dweight.view(bits))
    want = rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd)
    np.testing.assert_array_equal(fast.dx[:65].view(bits), want.dx[:65].view(bits))
    assert (fast.dx[:65] == 0).all() and np.signbit(fast.dx[:65]).any()
    *_, rstd_h = K.add_rms_norm_forward(x, r, n, w)
    got = K.add_rms_norm_backward(dy, None, x, r, n, w, rstd=rstd_h)
    want = rmsref.add_rms_norm_backward(dy, None, x, r, n, w, rstd=rstd_h)
    np.testing.assert_array_equal(got.dx[:65].view(bits), want.dx[:65].view(bits))
