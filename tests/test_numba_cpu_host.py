"""The Numba CPU backend's host code: the launcher, the argument checks and the array layouts.

tests/test_numba_cpu.py checks the kernels' numbers; this file checks the Python around them,
which decides which kernel runs on which rows with which arguments:

- the launcher (``_Launcher``, ``thread_count``): how the tasks are split among threads, when a
  call stays on the calling thread, how the pool is kept and remade, and that Numba's threading
  layer is never started (a forked child can then still run OpenMP code);
- every public function forwards each argument (eps, offset, partial, out_dtype, out=, the
  saved statistics, the fused add's rounding) to the kernel: each is set to a value that
  changes the result, and the result must follow the oracle's;
- layouts: leading dims split into more blocks than rows per block, three leading groups that
  no split covers (copied), permuted normalised dims, an ``out=`` whose layout is copied, a 2-D
  normalised shape's dweight;
- the errors name what they received (a complex dtype, an ``out=`` that shares memory with an
  input).

Tolerance: float32 results as tests/test_numba_cpu.py's contract (the oracle's bits on >= 99.9 %
of elements, the rest one float32 ulp); float64 results within 2^-40 of their row's largest
magnitude of the oracle's (the kernels' float64 errors are ~N·2^-53 of the row's terms, here
N <= 64, and dx may cancel below its terms; every change these tests guard against moves a
result by 1e-3 of it or more).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("numba", reason="the Numba kernels need numba (pip install 'rmsref[numba]')")

import rmsref  # noqa: E402
from rmsref.kernels import numba_cpu as K  # noqa: E402

from .test_numba_cpu import ROOT, _check_close  # noqa: E402


def _close(got, want, what):
    """The module docstring's tolerance for one output (float32: the kernels' contract)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype}{got.shape}, oracle {want.dtype}{want.shape}")
    if got.dtype == np.float32:
        _check_close(got, want, np.float32, what)
        return
    want64 = want.astype(np.float64).reshape(-1, want.shape[-1] if want.ndim else 1)
    scale = np.max(np.abs(want64), axis=-1, keepdims=True)  # (rows, 1)
    bound = np.broadcast_to(2.0 ** -40 * scale, want64.shape).reshape(want.shape)
    _check_close(got, want, np.float64, what, bound=bound)


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture
def rng():
    return np.random.default_rng(20261203)


# ----------------------------------------------------------------------------------- launcher
class _Recorder:
    """A stand-in kernel: records each call's task range and the thread that ran it."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, tag, t0, t1):
        with self.lock:
            self.calls.append((tag, t0, t1, threading.current_thread().name))


@pytest.mark.parametrize("threads, ntasks", [(2, 2), (2, 9), (3, 10), (4, 3), (3, 64)])
def test_the_launcher_splits_the_tasks_into_one_contiguous_range_per_thread(
        monkeypatch, threads, ntasks):
    monkeypatch.setattr(K, "thread_count", lambda: threads)
    rec = _Recorder()
    launcher = K._Launcher()
    launcher(rec, ntasks, K.SERIAL_BELOW, "args")
    used = min(threads, ntasks)
    assert launcher._pool._max_workers == used - 1, "one pool thread per range but the last"
    ranges = sorted((t0, t1) for _, t0, t1, _ in rec.calls)
    want = [(ntasks * k // used, ntasks * (k + 1) // used) for k in range(used)]
    assert ranges == want, f"{threads} threads, {ntasks} tasks: ranges {ranges}"
    assert all(tag == "args" for tag, *_ in rec.calls), "the kernel's arguments come first"
    by_range = {(t0, t1): name for _, t0, t1, name in rec.calls}
    assert by_range[want[-1]] == threading.current_thread().name, "the last range runs here"
    others = [by_range[r] for r in want[:-1]]
    assert all(name.startswith("rmsref-numba") for name in others), (
        f"the other ranges run on the launcher's pool threads: {others}")


@pytest.mark.parametrize("threads, elements", [(1, 1 << 20), (2, K.SERIAL_BELOW - 1),
                                               (8, 0)])
def test_a_small_call_or_one_thread_runs_every_task_on_the_calling_thread(
        monkeypatch, threads, elements):
    monkeypatch.setattr(K, "thread_count", lambda: threads)
    rec = _Recorder()
    K._Launcher()(rec, 10, elements, "args")
    assert rec.calls == [("args", 0, 10, threading.current_thread().name)]


def test_a_kernel_error_on_a_pool_thread_reaches_the_caller(monkeypatch):
    monkeypatch.setattr(K, "thread_count", lambda: 2)

    def kernel(t0, t1):
        if t0 == 0:
            raise ZeroDivisionError(f"task range {t0}..{t1}")

    with pytest.raises(ZeroDivisionError, match="task range 0..2"):
        K._Launcher()(kernel, 4, K.SERIAL_BELOW)


def test_the_pool_is_kept_grown_and_remade_in_a_forked_child():
    launcher = K._Launcher()
    one = launcher._executor(1)
    assert one._max_workers == 1
    assert launcher._executor(1) is one, "the same pool serves the next call"
    two = launcher._executor(2)
    assert two is not one and two._max_workers == 2, "a call needing more workers grows it"
    assert one._shutdown, "the pool it replaces is shut down"
    assert launcher._executor(1) is two, "a call needing fewer workers keeps the larger pool"
    launcher._pid = -1  # as in a forked child: the pool's threads live in the parent
    child = launcher._executor(1)
    assert child is not two and launcher._pid == os.getpid()
    assert not two._shutdown, "a parent's pool is not touched from its child"
    assert launcher._executor(1) is child
    for pool in (two, child):
        pool.shutdown()


def test_thread_count_reads_numba_only_once_its_layer_has_started(monkeypatch):
    """Before the layer starts: NUMBA_NUM_THREADS (the config); after: numba.get_num_threads()
    (which honours numba.set_num_threads); and get_num_threads() if a Numba version lacks the
    flag (the safe side: the count set by the user)."""
    import numba
    from numba.np.ufunc import parallel

    monkeypatch.setattr(numba, "get_num_threads", lambda: 5)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 3)
    monkeypatch.setattr(parallel, "_is_initialized", False)
    assert K.thread_count() == 3
    monkeypatch.setattr(parallel, "_is_initialized", True)
    assert K.thread_count() == 5
    monkeypatch.delattr(parallel, "_is_initialized")
    assert K.thread_count() == 5


def test_thread_count_follows_set_num_threads_and_does_not_start_the_layer():
    """In a fresh process: the kernels run on NUMBA_NUM_THREADS threads without starting Numba's
    threading layer, so a forked child can run parallel=True code (GNU OpenMP aborts a child
    whose parent used it); after numba.set_num_threads(1) they use one thread."""
    script = (
        "import os, numpy as np, numba\n"
        "from numba.np.ufunc import parallel\n"
        "from rmsref.kernels import numba_cpu as K\n"
        "x = np.ones((256, 512), np.float32)\n"
        "K.rms_norm(x, 512)\n"
        "print('started', parallel._is_initialized, K.thread_count())\n"
        "@numba.njit(parallel=True)\n"
        "def total(a):\n"
        "    s = 0.0\n"
        "    for i in numba.prange(a.size):\n"
        "        s += a[i]\n"
        "    return s\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if total(np.ones(1000)) == 1000.0 else 3)\n"
        "print('child', os.waitpid(pid, 0)[1])\n"
        "numba.set_num_threads(1)\n"
        "print('after', K.thread_count())\n"
    )
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert lines["started"] == "False 2", f"after a call: {lines['started']}"
    assert lines["child"] == "0", f"the forked child's parallel call ended with {lines['child']}"
    assert lines["after"] == "1"


# ------------------------------------------------------------- threads, blocks and layouts
def _rms_calls(x, w, dy, n, **kw):
    """Every RMSNorm output of the backend on these inputs (forward, both backwards)."""
    y, rstd = K.rms_norm_forward(x, n, w, **kw)
    g = K.rms_norm_backward(dy, x, n, w, **kw)
    gs = K.rms_norm_backward(dy, x, n, w, rstd=rstd, **kw)
    return [y, rstd, g.dx, g.dweight, gs.dx, gs.dweight]


def _ln_calls(x, w, b, dy, n):
    y, mean, rstd = K.layer_norm_forward(x, n, w, b)
    g = K.layer_norm_backward(dy, x, n, w, b)
    gs = K.layer_norm_backward(dy, x, n, w, b, mean=mean, rstd=rstd)
    return [y, mean, rstd, g.dx, g.dweight, g.dbias, gs.dx, gs.dweight, gs.dbias]


def _add_calls(x, r, w, dy, n):
    y, h, rstd = K.add_rms_norm_forward(x, r, n, w)
    g = K.add_rms_norm_backward(dy, dy, x, r, n, w)
    gs = K.add_rms_norm_backward(dy, None, x, r, n, w, rstd=rstd)
    return [y, h, rstd, g.dx, g.dresidual, g.dweight, gs.dx, gs.dresidual, gs.dweight]


@pytest.mark.parametrize("threads", [2, 3])
def test_every_kernel_gives_one_threads_bits_on_several_threads(monkeypatch, rng, threads):
    """Above SERIAL_BELOW elements, with 2 or 3 threads (the launcher's pool), every output has
    the bits of the one-thread call: the row blocks and dweight parts do not depend on who
    runs them."""
    m, n = 300, 128  # 38 400 elements: threaded; 19 row blocks, 5 dweight parts
    x, dy, r = (rng.standard_normal((m, n)).astype(np.float32) for _ in range(3))
    w, b = rng.uniform(0.5, 1.5, (2, n)).astype(np.float32)
    monkeypatch.setattr(K, "thread_count", lambda: 1)
    one = _rms_calls(x, w, dy, n) + _ln_calls(x, w, b, dy, n) + _add_calls(x, r, w, dy, n)
    monkeypatch.setattr(K, "thread_count", lambda: threads)
    many = _rms_calls(x, w, dy, n) + _ln_calls(x, w, b, dy, n) + _add_calls(x, r, w, dy, n)
    for k, (a, c) in enumerate(zip(one, many, strict=True)):
        assert _same_bits(a, c), f"output {k} differs on {threads} threads"
    _close(many[2], rmsref.rms_norm_backward(dy, x, n, w).dx, "RMSNorm dx")
    _close(many[9], rmsref.layer_norm_backward(dy, x, n, w, b).dx, "LayerNorm dx")
    _close(many[18], rmsref.add_rms_norm_backward(dy, dy, x, r, n, w).dx, "fused add's dx")
    _close(many[0], rmsref.rms_norm(x, n, w), "RMSNorm y")


def _blocks_over_rows(rng, dtype):
    """(40, 3, 64) rows cut from a (40, 5, 64) array: strided leading dims that split into 40
    blocks of 3 rows (more blocks than rows per block; 120 rows, two dweight parts), and the
    same data contiguous."""
    base = rng.standard_normal((40, 5, 64)).astype(dtype)
    return base[:, :3, :], np.ascontiguousarray(base[:, :3, :])


@pytest.mark.slow  # compiles every kernel for strided rows: a fifth of a minute on 2 cores
def test_more_blocks_than_rows_per_block_computes_every_row(monkeypatch, rng):
    """The strided layout (40 blocks of 3 rows) gives the contiguous array's bits, threaded,
    and the oracle's values."""
    monkeypatch.setattr(K, "thread_count", lambda: 2)
    x, xc = _blocks_over_rows(rng, np.float32)
    dy, dyc = _blocks_over_rows(rng, np.float32)
    r, rc = _blocks_over_rows(rng, np.float32)
    w, b = rng.uniform(0.5, 1.5, (2, 64)).astype(np.float32)
    views = _rms_calls(x, w, dy, 64) + _ln_calls(x, w, b, dy, 64) + _add_calls(x, r, w, dy, 64)
    flat = (_rms_calls(xc, w, dyc, 64) + _ln_calls(xc, w, b, dyc, 64)
            + _add_calls(xc, rc, w, dyc, 64))
    for k, (a, c) in enumerate(zip(views, flat, strict=True)):
        assert _same_bits(np.ascontiguousarray(a), c), f"output {k}: strided blocks differ"
    _close(views[0], rmsref.rms_norm(xc, 64, w), "y on strided blocks")
    _close(np.ascontiguousarray(views[2]), rmsref.rms_norm_backward(dyc, xc, 64, w).dx, "dx")
    _close(np.ascontiguousarray(views[9]), rmsref.layer_norm_backward(dyc, xc, 64, w, b).dx,
           "LayerNorm dx on strided blocks")
    _close(np.ascontiguousarray(views[18]),
           rmsref.add_rms_norm_backward(dyc, dyc, xc, rc, 64, w).dx, "fused dx on strided blocks")


def test_three_leading_groups_and_permuted_features_are_copied_first(rng):
    """Leading dims that no (blocks, rows) split covers, and normalised dims in permuted order:
    the arrays are copied to C order, with the contiguous array's results."""
    base = rng.standard_normal((4, 5, 6, 32)).astype(np.float32)
    x = base[:, :3, :4, :]  # strides (30n, 6n, n): three groups
    xc = np.ascontiguousarray(x)
    w = rng.uniform(0.5, 1.5, 32).astype(np.float32)
    for a, c in zip(_rms_calls(x, w, x, 32), _rms_calls(xc, w, xc, 32), strict=True):
        assert _same_bits(np.ascontiguousarray(a), c), "three leading groups"
    xt = rng.standard_normal((6, 8, 4)).astype(np.float32).transpose(0, 2, 1)  # (6, 4, 8)
    w2 = rng.uniform(0.5, 1.5, (4, 8)).astype(np.float32)
    _close(K.rms_norm(xt, (4, 8), w2), rmsref.rms_norm(xt, (4, 8), w2), "permuted features")


def test_an_out_whose_layout_is_copied_receives_the_result(rng):
    """``out=`` of three leading groups (the kernel writes a C-order copy, then copies it in):
    the array returned is ``out``, holding the oracle's values."""
    x = rng.standard_normal((4, 3, 4, 24)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    for name, call, want in (
        ("y", lambda o: K.rms_norm(x, 24, w, out=o), rmsref.rms_norm(x, 24, w)),
        ("dx", lambda o: K.rms_norm_backward(x, x, 24, w, out=o).dx,
         rmsref.rms_norm_backward(x, x, 24, w).dx),
        ("LayerNorm y", lambda o: K.layer_norm(x, 24, w, out=o), rmsref.layer_norm(x, 24, w)),
    ):
        out = np.zeros((4, 5, 6, 24), np.float32)[:, :3, :4, :]
        assert call(out) is out, name
        _close(out, want, f"{name} in an out of three leading groups")


def test_a_two_dim_normalised_shape_gives_dweight_and_dbias_its_shape(rng):
    x = rng.standard_normal((5, 4, 6)).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, (2, 4, 6)).astype(np.float32)
    g = K.rms_norm_backward(x, x, (4, 6), w, bias=b)
    assert g.dweight.shape == (4, 6) and g.dbias.shape == (4, 6)
    ln = K.layer_norm_backward(x, x, (4, 6), w, b)
    assert ln.dweight.shape == (4, 6) and ln.dbias.shape == (4, 6)
    add = K.add_rms_norm_backward(x, None, x, x, (4, 6), w)
    assert add.dweight.shape == (4, 6)
    _close(g.dweight, rmsref.rms_norm_backward(x, x, (4, 6), w, bias=b).dweight, "dweight")


# -------------------------------------------------------- each argument reaches the kernel
@pytest.fixture
def small(rng):
    """Rows of RMS ~0.1, where eps = 0.05 changes every output by ~1 %."""
    x, dy, r = (0.1 * rng.standard_normal((6, 16)).astype(np.float32) for _ in range(3))
    w, b = rng.uniform(0.5, 1.5, (2, 16)).astype(np.float32)
    return x, dy, r, w, b


def test_eps_offset_partial_and_bias_reach_the_rms_norm_kernels(small):
    x, dy, _, w, b = small
    kw = dict(eps=0.05, offset=1.0, partial=0.5, bias=b)
    y, rstd = K.rms_norm_forward(x, 16, w, **{k: v for k, v in kw.items() if k != "eps"},
                                 eps=0.05)
    want_y, want_rstd = rmsref.rms_norm_forward(x, 16, w, **kw)
    _close(y, want_y, "y")
    _close(rstd, want_rstd, "rstd")
    assert not np.allclose(y, rmsref.rms_norm_forward(x, 16, w)[0], rtol=1e-3), "not sensitive"
    for saved in (None, rstd):
        g = K.rms_norm_backward(dy, x, 16, w, rstd=saved, **kw)
        want = rmsref.rms_norm_backward(dy, x, 16, w, rstd=saved, **kw)
        for q in ("dx", "dweight", "dbias"):
            _close(getattr(g, q), getattr(want, q), f"{q} (saved rstd: {saved is not None})")
    _close(K.rms_norm(x, 16, w, 0.05), rmsref.rms_norm(x, 16, w, 0.05), "rms_norm's eps")


def test_a_saved_rstd_is_used_as_given(small):
    """A backward given rstd uses it (as torch's does), here twice the true one: in the range
    (the pipelined path), beyond it (2^-500: scaled), with a bias (the general path) and with a
    partial row; each as the oracle with the same rstd."""
    x, dy, _, w, b = small
    rstd = K.rms_norm_forward(x, 16, w)[1]
    for saved, kw in ((2 * rstd, {}), (np.full_like(rstd, 2.0 ** -500), {}),
                      (2 * rstd, {"bias": b}), (2 * rstd, {"partial": 0.5})):
        g = K.rms_norm_backward(dy, x, 16, w, rstd=saved, **kw)
        want = rmsref.rms_norm_backward(dy, x, 16, w, rstd=saved, **kw)
        for q in ("dx", "dweight") + (("dbias",) if kw.get("bias") is not None else ()):
            _close(getattr(g, q), getattr(want, q), f"{q} with saved rstd, {kw}")


@pytest.mark.parametrize("e", [K.SAFE_EXPONENT - 1, K.SAFE_EXPONENT, K.SAFE_EXPONENT + 1])
def test_the_saved_rstd_range_ends_at_safe_exponent(e):
    """_saved_rstd_in_range chooses the pipelined path (no scaling) exactly while every saved
    rstd's binary exponent is within ±SAFE_EXPONENT."""
    for sign in (1, -1):
        rstd = np.array([1.0, np.ldexp(0.5, sign * e)])  # frexp exponent sign·e
        assert K._saved_rstd_in_range(rstd) == (e <= K.SAFE_EXPONENT), (sign, e)


def test_eps_and_saved_statistics_reach_the_layer_norm_kernels(small):
    x, dy, _, w, b = small
    y, mean, rstd = K.layer_norm_forward(x, 16, w, b, 0.05)
    want = rmsref.layer_norm_forward(x, 16, w, b, 0.05)
    for got, exp, what in zip((y, mean, rstd), want, ("y", "mean", "rstd"), strict=True):
        _close(got, exp, what)
    _close(K.layer_norm(x, 16, w, b, 0.05), want[0], "layer_norm")
    assert not np.allclose(y, rmsref.layer_norm(x, 16, w, b), rtol=1e-3), "not sensitive"
    for stats in ({}, {"mean": mean + 0.01, "rstd": 2 * rstd}):
        for weight in (w, None):  # with a weight: the pipelined path; without: the general one
            g = K.layer_norm_backward(dy, x, 16, weight, b, 0.05, **stats)
            exp = rmsref.layer_norm_backward(dy, x, 16, weight, b, 0.05, **stats)
            for q in ("dx", "dweight", "dbias"):
                got, want_q = getattr(g, q), getattr(exp, q)
                if want_q is None:
                    assert got is None, q
                    continue
                _close(got, want_q, f"{q} with {sorted(stats)}, weight: {weight is not None}")
    for call in (K.layer_norm_forward, lambda *a, **k: (K.layer_norm_backward(dy, *a, **k),)):
        default, unset = call(x, 16, w, b), call(x, 16, w, b, None)
        assert all(_same_bits(np.asarray(getattr(p, "dx", p)), np.asarray(getattr(q, "dx", q)))
                   for p, q in zip(default, unset, strict=True)), "eps=None is LayerNorm's 1e-5"


def test_layer_norm_without_weight_or_bias_keeps_the_oracles_signed_zeros():
    """No bias is an exact -0.0 added (0 + -0.0 keeps the product's sign): x_j = mean with a
    negative weight gives -0.0, as the oracle, and no weight means ones."""
    x = np.array([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]], np.float32)
    minus = np.array([-1.0, -1.0, -1.0], np.float32)
    for w in (minus, None):
        y = K.layer_norm(x, 3, w)
        want = rmsref.layer_norm(x, 3, w)
        assert _same_bits(y, want), f"weight {w}: {y} against {want}"
    assert np.signbit(K.layer_norm(x, 3, minus)[0, 1])


def test_a_negative_zero_weight_keeps_its_sign(rng):
    """Without an offset the weight is used as given: w_j = -0.0 gives y_j = -0.0 for x_j > 0."""
    x = (np.abs(rng.standard_normal((3, 8))) + 0.5).astype(np.float32)
    w = np.full(8, -0.0, np.float32)
    y = K.rms_norm(x, 8, w)
    assert np.all(np.signbit(y)) and _same_bits(y, rmsref.rms_norm(x, 8, w))


@pytest.mark.parametrize("rounding", [
    "fp32-sum",
    pytest.param("rounded-sum", marks=pytest.mark.slow),  # kernels of their own (budget)
])
def test_eps_offset_and_rounding_reach_the_fused_add_kernels(small, rounding):
    x, dy, r, w, _ = small
    x32, r32, dy32, w32 = x, r, dy, w
    kw = dict(eps=0.05, offset=1.0, rounding=rounding)
    got = K.add_rms_norm_forward(x32, r32, 16, w32, **kw)
    want = rmsref.add_rms_norm_forward(x32, r32, 16, w32, **kw)
    for a, c, what in zip(got, want, ("y", "h", "rstd"), strict=True):
        _close(a, c, f"{what}, {rounding}")
    y, h = K.add_rms_norm(x32, r32, 16, w32, **kw)
    assert _same_bits(y, got[0]) and _same_bits(h, got[1]), "add_rms_norm's arguments"
    for saved, dro in ((None, dy32), (got[2], None)):
        g = K.add_rms_norm_backward(dy32, dro, x32, r32, 16, w32, rstd=saved, **kw)
        exp = rmsref.add_rms_norm_backward(dy32, dro, x32, r32, 16, w32, rstd=saved, **kw)
        for q in ("dx", "dresidual", "dweight"):
            what = f"{q}, {rounding}, saved rstd: {saved is not None}"
            _close(getattr(g, q), getattr(exp, q), what)
    for saved in (None, K.add_rms_norm_forward(x32, r32, 16)[2]):  # no weight: ones
        _close(K.add_rms_norm(x32, r32, 16)[0], rmsref.add_rms_norm(x32, r32, 16)[0], "y")
        g = K.add_rms_norm_backward(dy32, None, x32, r32, 16, rstd=saved)
        _close(g.dx, rmsref.add_rms_norm_backward(dy32, None, x32, r32, 16, rstd=saved).dx, "dx")
        assert g.dweight is None
    default = K.add_rms_norm(x32, r32, 16, w32)
    explicit = K.add_rms_norm(x32, r32, 16, w32, rounding="fp32-sum", offset=0.0)
    assert all(_same_bits(a, c) for a, c in zip(default, explicit, strict=True))
    assert not np.allclose(K.add_rms_norm(x32, r32, 16, w32, 0.05)[0], default[0], rtol=1e-3)


def test_the_fused_adds_saved_rstd_is_used_as_given(small):
    x, dy, r, w, _ = small
    rstd = K.add_rms_norm_forward(x, r, 16, w)[2]
    for saved in (2 * rstd, np.full_like(rstd, 2.0 ** -500)):
        g = K.add_rms_norm_backward(dy, dy, x, r, 16, w, rstd=saved)
        exp = rmsref.add_rms_norm_backward(dy, dy, x, r, 16, w, rstd=saved)
        for q in ("dx", "dresidual", "dweight"):
            _close(getattr(g, q), getattr(exp, q), f"{q} with a saved rstd")


def test_the_statistics_have_the_oracles_shape_and_dtype(rng):
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    rstd = K.rms_norm_forward(x, 8, w)[1]
    h_rstd = K.add_rms_norm_forward(x, x, 8, w)[2]
    _, mean, ln_rstd = K.layer_norm_forward(x, 8, w)
    oracle = rmsref.rms_norm_forward(x, 8, w)[1]
    for got in (rstd, h_rstd, mean, ln_rstd):
        assert got.shape == oracle.shape == (2, 3, 1) and got.dtype == oracle.dtype
    xh = x.astype(rmsref.bfloat16)
    for half in (K.rms_norm_forward(xh, 8)[1], K.add_rms_norm_forward(xh, xh, 8)[2],
                 *K.layer_norm_forward(xh, 8)[1:]):
        assert half.dtype == np.float32, "half inputs save float32 statistics, as torch"


def test_out_dtype_reaches_the_forward_kernels(rng):
    out_dtype = np.float64
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, (2, 8)).astype(x.dtype)
    y, _ = K.rms_norm_forward(x, 8, w, out_dtype=out_dtype)
    _close(y, rmsref.rms_norm_forward(x, 8, w, out_dtype=out_dtype)[0], "rms y")
    yl = K.layer_norm_forward(x, 8, w, b, out_dtype=out_dtype)[0]
    _close(yl, rmsref.layer_norm_forward(x, 8, w, b, out_dtype=out_dtype)[0], "ln y")


def test_out_receives_the_result_of_every_function_that_takes_it(rng):
    x, dy = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, (2, 8)).astype(np.float32)
    calls = {
        "rms_norm": (lambda o: K.rms_norm(x, 8, w, out=o), rmsref.rms_norm(x, 8, w)),
        "rms_norm_forward": (lambda o: K.rms_norm_forward(x, 8, w, out=o)[0],
                             rmsref.rms_norm(x, 8, w)),
        "rms_norm_backward": (lambda o: K.rms_norm_backward(dy, x, 8, w, out=o).dx,
                              rmsref.rms_norm_backward(dy, x, 8, w).dx),
        "layer_norm": (lambda o: K.layer_norm(x, 8, w, b, out=o), rmsref.layer_norm(x, 8, w, b)),
        "layer_norm_forward": (lambda o: K.layer_norm_forward(x, 8, w, b, out=o)[0],
                               rmsref.layer_norm(x, 8, w, b)),
        "layer_norm_backward": (lambda o: K.layer_norm_backward(dy, x, 8, w, b, out=o).dx,
                                rmsref.layer_norm_backward(dy, x, 8, w, b).dx),
    }
    for name, (call, want) in calls.items():
        out = np.full((5, 8), np.nan, np.float32)
        assert call(out) is out, f"{name} returns its out"
        _close(out, want, name)


# ------------------------------------------------------------------------ errors name inputs
def _complex(a):
    return np.asarray(a, np.complex128)


_MESSAGE = ("has dtype complex128; the numba_cpu backend computes float16, bfloat16, float32 "
            "and float64 (for complex inputs use the function of the same name in rmsref, "
            "the NumPy oracle)")


def test_a_complex_argument_is_refused_by_name():
    x = np.ones((2, 4))
    w = np.ones(4)
    cases = {
        "input": lambda: K.rms_norm(_complex(x), 4),
        "weight": lambda: K.rms_norm_backward(x, x, 4, _complex(w)),
        "bias": lambda: K.layer_norm(x, 4, w, _complex(w)),
        "residual": lambda: K.add_rms_norm(x, _complex(x), 4),
        "dy": lambda: K.rms_norm_backward(_complex(x), x, 4),
        "out_dtype": lambda: K.rms_norm_forward(x, 4, out_dtype=np.complex128),
    }
    for name, call in cases.items():
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == f"{name} {_MESSAGE}", name
    with pytest.raises(TypeError, match=f"^out_dtype {_MESSAGE[:20]}"):
        K.layer_norm_forward(x, 4, out_dtype=np.complex128)


def test_an_out_that_shares_memory_with_an_input_is_refused_by_name(rng):
    buf = rng.standard_normal((3, 4, 8))
    x, dy = buf[0], buf[1]
    w = buf[2, 0]
    mean_rstd = np.ones((4, 1))
    for iname, out, call in (
        ("x", x, lambda o: K.rms_norm_forward(x, 8, w, out=o)),
        ("weight", buf[2], lambda o: K.rms_norm_forward(x, 8, w, out=o)),
        ("bias", buf[2], lambda o: K.rms_norm_forward(x, 8, bias=w, out=o)),
        ("dy", dy, lambda o: K.rms_norm_backward(dy, x, 8, out=o)),
        ("x", x, lambda o: K.rms_norm_backward(dy, x, 8, out=o)),
        ("weight", buf[2], lambda o: K.rms_norm_backward(dy, x, 8, w, out=o)),
        ("x", x, lambda o: K.layer_norm_forward(x, 8, out=o)),
        ("weight", buf[2], lambda o: K.layer_norm_forward(x, 8, w, out=o)),
        ("bias", buf[2], lambda o: K.layer_norm_forward(x, 8, None, w, out=o)),
        ("dy", dy, lambda o: K.layer_norm_backward(dy, x, 8, out=o)),
        ("x", x, lambda o: K.layer_norm_backward(dy, x, 8, out=o)),
        ("weight", buf[2], lambda o: K.layer_norm_backward(dy, x, 8, w, out=o)),
    ):
        with pytest.raises(ValueError, match=f"^out shares memory with {iname};"):
            call(out)
    out = np.empty((4, 8))
    for iname, call in (
        ("rstd", lambda: K.rms_norm_backward(dy, x, 8, rstd=out[:, :1], out=out)),
        ("mean", lambda: K.layer_norm_backward(dy, x, 8, mean=out[:, :1], rstd=mean_rstd,
                                               out=out)),
        ("rstd", lambda: K.layer_norm_backward(dy, x, 8, mean=mean_rstd, rstd=out[:, 1:2],
                                               out=out)),
    ):
        with pytest.raises(ValueError, match=f"^out shares memory with {iname};"):
            call()


def test_an_out_of_the_wrong_shape_names_both_shapes():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match=r"out has shape \(4, 2\); the result has shape \(2, 4\)"):
        K.rms_norm_backward(x, x, 4, out=np.empty((4, 2)))
    with pytest.raises(ValueError, match=r"out has shape \(4, 2\); the result has shape \(2, 4\)"):
        K.layer_norm_forward(x, 4, out=np.empty((4, 2)))
    with pytest.raises(TypeError, match="out has dtype float32; the result has dtype float64"):
        K.layer_norm_backward(x, x, 4, out=np.empty((2, 4), np.float32))
