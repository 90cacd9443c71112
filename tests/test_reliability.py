"""Hostile inputs: no silent wrong result, every bad argument a named error, and a checker that
never passes what it did not check.

Each test pins one failure found by attacking the public entry points of the oracle and the
backends; the reference is the float64 oracle (``rmsref``) unless a test says otherwise.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rmsref
from rmsref._shapes import bfloat16

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nc():
    pytest.importorskip("numba", reason="the numba_cpu backend needs numba")
    return rmsref.backend("numba_cpu")


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest |got - ref| relative to max |ref| (both float64)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


# ---------------------------------------------------------------------------------------------
# 1. numba_cpu backward with a saved rstd at the ends of float64's exponent range
# ---------------------------------------------------------------------------------------------
EXTREME_ROWS = [
    pytest.param(np.array([[1.5e308, -1e308, 0.5e308, 1.0]]), np.array([[1.0, 2.0, -1.0, 0.5]]),
                 0.0, id="huge"),
    pytest.param(np.array([[1e-300, -2e-300, 3e-300, 0.5e-300]]),
                 np.array([[1e-20, 2e-20, -1e-20, 0.5e-20]]), 0.0, id="tiny"),
]


@pytest.mark.slow  # compiles float64 kernels, which the default run leaves to `pytest -m slow`
@pytest.mark.parametrize("x, dy, eps", EXTREME_ROWS)
def test_numba_cpu_backward_with_saved_rstd_is_overflow_safe(nc, x, dy, eps):
    """Reference: the oracle's dx with the same saved rstd; bound 1e-13 relative (a few ulps
    of float64 on a four-element row)."""
    w = np.array([1.0, 0.5, 2.0, 1.0])
    _, rstd = rmsref.rms_norm_forward(x, 4, w, eps)
    ref = rmsref.rms_norm_backward(dy, x, 4, w, eps, rstd=rstd)
    got = nc.rms_norm_backward(dy, x, 4, w, eps, rstd=rstd)
    assert np.all(np.isfinite(got.dx)), got.dx
    assert _rel(got.dx, ref.dx) < 1e-13, (got.dx, ref.dx)
    assert _rel(got.dweight, ref.dweight) < 1e-13
    # the call with no weight and the pipelined common call (a weight, no bias) both
    got_nw = nc.rms_norm_backward(dy, x, 4, None, eps, rstd=rstd)
    ref_nw = rmsref.rms_norm_backward(dy, x, 4, None, eps, rstd=rstd)
    assert _rel(got_nw.dx, ref_nw.dx) < 1e-13


@pytest.mark.slow  # compiles float64 kernels, which the default run leaves to `pytest -m slow`
@pytest.mark.parametrize("x, dy, eps", EXTREME_ROWS)
def test_numba_cpu_add_rms_norm_backward_with_saved_rstd_is_overflow_safe(nc, x, dy, eps):
    """Reference: the oracle's fused backward with the same saved rstd (residual zero)."""
    w = np.array([1.0, 0.5, 2.0, 1.0])
    r = np.zeros_like(x)
    _, _, rstd = rmsref.add_rms_norm_forward(x, r, 4, w, eps)
    ref = rmsref.add_rms_norm_backward(dy, None, x, r, 4, w, eps, rstd=rstd)
    got = nc.add_rms_norm_backward(dy, None, x, r, 4, w, eps, rstd=rstd)
    assert np.all(np.isfinite(got.dx)), got.dx
    assert _rel(got.dx, ref.dx) < 1e-13, (got.dx, ref.dx)


# ---------------------------------------------------------------------------------------------
# 2. oracle LayerNorm on a constant row far from 1
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1e200, 1e300, -1e300, 1e-300])
def test_layer_norm_constant_row_at_any_scale(value):
    """Exact: x - mean = 0, so y = bias (0), rstd = 1/sqrt(eps), dx = rstd·(dy - mean(dy))."""
    x = np.full((2, 4), value)
    y, mean, rstd = rmsref.layer_norm_forward(x, 4, eps=1e-5)
    np.testing.assert_array_equal(y, 0.0)
    np.testing.assert_allclose(rstd, 1 / math.sqrt(1e-5), rtol=1e-15)
    np.testing.assert_allclose(mean, value, rtol=1e-15)
    dy = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 0.0]])
    g = rmsref.layer_norm_backward(dy, x, 4, np.ones(4), eps=1e-5)
    expect = (dy - dy.mean(axis=1, keepdims=True)) / math.sqrt(1e-5)
    np.testing.assert_allclose(g.dx, expect, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(g.dweight, 0.0)


# ---------------------------------------------------------------------------------------------
# 3. gradcheck never passes what it did not check
# ---------------------------------------------------------------------------------------------
def _rms_fns(wrong: float = 1.0):
    def forward(x):
        return rmsref.rms_norm(x, 4, eps=1e-5)

    def backward(dy, x):
        return (wrong * rmsref.rms_norm_backward(dy, x, 4, eps=1e-5).dx,)

    return forward, backward


@pytest.mark.parametrize("kw", [{"rtol": math.nan}, {"atol": math.nan}, {"rtol": -1.0},
                                {"atol": math.inf}])
def test_gradcheck_refuses_nan_or_negative_tolerances(rng, kw):
    fwd, bwd = _rms_fns(2.0)
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        rmsref.gradcheck(fwd, bwd, [rng.standard_normal((3, 4))], **kw)


def test_gradcheck_fails_on_a_nan_input(rng):
    """A 2x wrong backward at a point with a NaN element: nothing can be compared there."""
    fwd, bwd = _rms_fns(2.0)
    x = rng.standard_normal((3, 4))
    x[1, 2] = np.nan
    r = rmsref.gradcheck(fwd, bwd, [x], names=["x"])
    assert not r, r.report()
    assert "PASSED" not in r.report()
    assert "NaN" in r.report()


def test_gradcheck_fails_when_the_forward_returns_nan(rng):
    def forward(x):
        return rmsref.rms_norm(x, 4, eps=1e-5) * np.nan

    _, bwd = _rms_fns(2.0)
    r = rmsref.gradcheck(forward, bwd, [rng.standard_normal((3, 4))])
    assert not r, r.report()
    assert "PASSED" not in r.report()


def test_gradcheck_still_passes_a_correct_backward(rng):
    fwd, bwd = _rms_fns(1.0)
    assert rmsref.gradcheck(fwd, bwd, [rng.standard_normal((3, 4))])


# ---------------------------------------------------------------------------------------------
# 4. masked arrays: refused, by name, in every implementation
# ---------------------------------------------------------------------------------------------
def _masked(shape):
    a = np.ones(shape)
    mask = np.zeros(shape, bool)
    mask.flat[1] = True
    return np.ma.masked_array(a, mask=mask)


@pytest.mark.parametrize("which", ["x", "weight", "dy", "rstd"])
@pytest.mark.parametrize("impl", ["numpy", "numba_cpu"])
def test_masked_arrays_are_refused_by_name(impl, which):
    if impl == "numba_cpu":
        pytest.importorskip("numba")
    mod = rmsref.backend(impl)
    args = {"x": np.ones((2, 3, 4)), "weight": np.ones(4), "dy": np.ones((2, 3, 4)),
            "rstd": np.ones((2, 3))}
    args[which] = _masked(args[which].shape)
    name = "input" if which == "x" else which
    with pytest.raises(TypeError, match=f"{name} is a masked array"):
        mod.rms_norm_backward(args["dy"], args["x"], 4, args["weight"], 1e-5, rstd=args["rstd"])


# ---------------------------------------------------------------------------------------------
# 5. an all-zero row with eps = 0 in numba_cpu: NaN as the oracle, no SystemError
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # compiles float64 kernels, which the default run leaves to `pytest -m slow`
@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_numba_cpu_zero_row_with_zero_eps_is_nan_like_the_oracle(nc, zero):
    x = np.full((2, 8), zero)
    x[1] = 1.0
    w, dy = np.ones(8), np.ones((2, 8))
    for mod in (rmsref, nc):
        y, rstd = mod.rms_norm_forward(x, 8, w, 0.0)
        assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1])), mod
        assert np.isinf(rstd[0, 0]) or np.isnan(rstd[0, 0])
        dx = mod.rms_norm_backward(dy, x, 8, w, 0.0).dx
        assert np.all(np.isnan(dx[0])) and np.all(np.isfinite(dx[1]))
        y2, _, _ = mod.add_rms_norm_forward(x, np.zeros_like(x), 8, w, 0.0)
        assert np.all(np.isnan(y2[0])) and np.all(np.isfinite(y2[1]))
        g2 = mod.add_rms_norm_backward(dy, None, x, np.zeros_like(x), 8, w, 0.0)
        assert np.all(np.isnan(g2.dx[0])) and np.all(np.isfinite(g2.dx[1]))


# ---------------------------------------------------------------------------------------------
# 6. a Numba cache that cannot be written: the backend says why and `rmsref check` fails
# ---------------------------------------------------------------------------------------------
_NO_CACHE = (
    "import numba.core.caching as c\n"
    "def _deny(self):\n"
    "    raise PermissionError('read-only cache directory')\n"
    "c._CacheLocator.ensure_cache_path = _deny\n"
)


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_unwritable_numba_cache_is_reported_not_hidden():
    pytest.importorskip("numba")
    code = _NO_CACHE + (
        "import rmsref\n"
        "reason = rmsref.available_backends()['numba_cpu']\n"
        "print('REASON', reason)\n"
        "try:\n"
        "    rmsref.backend('numba_cpu')\n"
        "except RuntimeError as exc:\n"
        "    print('RAISED', exc)\n"
        "from rmsref.cli import main\n"
        "print('CHECK_REQUESTED', main(['check', '--backend', 'numba_cpu', '--quick']))\n"
        "print('CHECK_DEFAULT', main(['check', '--quick', '--only', 'numba_cpu']))\n"
    )
    proc = _python(code)
    out = proc.stdout + proc.stderr
    assert "REASON None" not in out, out
    assert re.search(r"REASON .*cannot", out), out
    assert "RAISED backend 'numba_cpu' is unavailable" in out, out
    assert "CHECK_REQUESTED 2" in out, out
    assert "CHECK_DEFAULT 1" in out, out


# ---------------------------------------------------------------------------------------------
# 7. np.matrix: used as the 2-D ndarray it holds; refused as out=
# ---------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.parametrize("impl", ["numpy", "numba_cpu"])
def test_np_matrix_is_used_as_an_ndarray(impl):
    if impl == "numba_cpu":
        pytest.importorskip("numba")
    mod = rmsref.backend(impl)
    a = np.array([[1.0, 2.0, 3.0], [4.0, -5.0, 6.0]], np.float32)  # the default run's kernels
    w = np.array([1.0, 2.0, 3.0], np.float32)
    y = mod.rms_norm(np.matrix(a), 3, np.matrix(w).A1, 1e-5)
    assert type(y) is np.ndarray and y.dtype == np.float32
    np.testing.assert_array_equal(y, mod.rms_norm(a, 3, w, 1e-5))
    g = mod.rms_norm_backward(np.matrix(a), np.matrix(a), 3, None, 1e-5)
    np.testing.assert_array_equal(g.dx, mod.rms_norm_backward(a, a, 3, None, 1e-5).dx)
    with pytest.raises(TypeError, match="out must be a NumPy ndarray"):
        mod.rms_norm(a, 3, None, 1e-5, out=np.matrix(np.empty((2, 3))))


# ---------------------------------------------------------------------------------------------
# 8. CLI arguments: refused up front with exit 2, before any check runs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, fragment", [
    (["validate", "rmsref:rms_norm", "--eps", "nan"], "--eps"),
    (["validate", "rmsref:rms_norm", "--eps", "inf"], "--eps"),
    (["validate", "rmsref:rms_norm", "--eps", "-1e-5"], "--eps"),
    (["validate", "rmsref:rms_norm", "--seed", "-1"], "--seed"),
    (["validate", "rmsref:rms_norm", "--json", "/nonexistent-dir/x.json"], "--json"),
    (["check", "--seed", "-1"], "--seed"),
    (["check", "--json", "/nonexistent-dir/x.json"], "--json"),
])
def test_cli_bad_arguments_exit_2_with_a_message(capsys, argv, fragment):
    from rmsref.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# 10. a user's callable that returns the wrong thing is named, with what it returned
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, fragment", [
    ("backward_none", "backward returned None"),
    ("backward_short", "backward returned 1 gradient"),
    ("forward_none", "forward returned None"),
])
def test_gradcheck_names_the_callable_that_returned_the_wrong_thing(rng, bad, fragment):
    w = np.ones(4)

    def forward(x, w):
        return None if bad == "forward_none" else rmsref.rms_norm(x, 4, w, 1e-5)

    def backward(dy, x, w):
        if bad == "backward_none":
            return None
        g = rmsref.rms_norm_backward(dy, x, 4, w, 1e-5)
        return (g.dx,) if bad == "backward_short" else (g.dx, g.dweight)

    with pytest.raises((TypeError, ValueError), match=re.escape(fragment)):
        rmsref.gradcheck(forward, backward, [rng.standard_normal((3, 4)), w])


# ---------------------------------------------------------------------------------------------
# 11. a saved statistic is named by its own name
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["numpy", "numba_cpu"])
def test_layer_norm_backward_names_a_bad_mean(impl):
    if impl == "numba_cpu":
        pytest.importorskip("numba")
    mod = rmsref.backend(impl)
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="^mean has shape"):
        mod.layer_norm_backward(x, x, 4, mean=np.ones(3), rstd=np.ones(2))
    with pytest.raises(ValueError, match="^rstd has shape"):
        mod.layer_norm_backward(x, x, 4, mean=np.ones(2), rstd=np.ones(3))
    with pytest.raises(TypeError, match="^mean has dtype"):
        mod.layer_norm_backward(x, x, 4, mean=np.ones(2, int), rstd=np.ones(2))


def test_unit_norm_backward_names_a_bad_rnorm():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="^rnorm has shape"):
        rmsref.unit_norm_backward(x, x, 4, rnorm=np.ones(3))


# ---------------------------------------------------------------------------------------------
# 12. loose argument checks: one rule for every implementation
# ---------------------------------------------------------------------------------------------
BAD_EPS = [
    (10**400, ValueError), ("1e-5", TypeError), (True, TypeError), (np.bool_(True), TypeError),
    (1e-5 + 1j, TypeError), (math.nan, ValueError), (-math.inf, ValueError),
    (-1e-5, ValueError), (np.array([1e-5]), TypeError), ([1e-5], TypeError),
]
BAD_OFFSET = [("1", TypeError), (1j, TypeError), (None, TypeError), (math.nan, ValueError),
              (True, TypeError)]
BAD_PARTIAL = [("0.5", TypeError), (0.5j, TypeError), (math.nan, ValueError), (0.0, ValueError),
               (1.5, ValueError), (True, TypeError)]


def _impls():
    mods = [rmsref]
    try:
        import numba  # noqa: F401
    except ImportError:
        return mods
    return mods + [rmsref.backend("numba_cpu")]


@pytest.mark.parametrize("eps, exc", BAD_EPS, ids=lambda v: repr(v)[:12])
def test_eps_is_a_finite_non_negative_real_scalar(eps, exc):
    x = np.ones((2, 4))
    for mod in _impls():
        with pytest.raises(exc, match="eps"):
            mod.rms_norm(x, 4, None, eps)
        with pytest.raises(exc, match="eps"):
            mod.layer_norm(x, 4, eps=eps)
        with pytest.raises(exc, match="eps"):
            mod.add_rms_norm(x, x, 4, None, eps)
    with pytest.raises(exc, match="eps"):
        rmsref.unit_norm(x, 4, eps=eps)


def test_good_eps_forms_agree():
    x = np.arange(8.0).reshape(2, 4)
    for mod in _impls():
        ref = mod.rms_norm(x, 4, None, 1e-5)
        for eps in (np.float64(1e-5), np.array(1e-5)[()], 1e-5):
            np.testing.assert_array_equal(mod.rms_norm(x, 4, None, eps), ref)
        assert np.all(np.isfinite(mod.rms_norm(x, 4, None, 0)))


@pytest.mark.parametrize("offset, exc", BAD_OFFSET, ids=repr)
def test_offset_is_checked_by_name_alike_in_both_backends(offset, exc):
    x = np.ones((2, 4))
    for mod in _impls():
        with pytest.raises(exc, match="offset"):
            mod.rms_norm_forward(x, 4, offset=offset)
        with pytest.raises(exc, match="offset"):
            mod.rms_norm_backward(x, x, 4, offset=offset)


@pytest.mark.parametrize("partial, exc", BAD_PARTIAL, ids=repr)
def test_partial_is_checked_by_name_alike_in_both_backends(partial, exc):
    x = np.ones((2, 4))
    for mod in _impls():
        with pytest.raises(exc, match="partial"):
            mod.rms_norm_forward(x, 4, partial=partial)


def test_a_bfloat16_rstd_is_accepted_alike():
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    rstd = rmsref.rms_norm_forward(x, 4)[1].astype(bfloat16)
    dxs = [mod.rms_norm_backward(dy, x, 4, rstd=rstd).dx for mod in _impls()]
    for dx in dxs[1:]:
        np.testing.assert_allclose(dx, dxs[0], rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", [["numba_cpu"], None, 3, {"numba_cpu": 1}])
def test_backend_name_must_be_a_string(name):
    with pytest.raises(TypeError, match="backend name must be a str"):
        rmsref.backend(name)


def test_big_endian_inputs_are_converted():
    x = np.array([[1.0, -2.0, 3.0, 0.5]])
    for mod in _impls():
        for dt in (">f8", ">f4"):
            xb = x.astype(dt)
            y = mod.rms_norm(xb, 4, xb[0], 1e-5)
            np.testing.assert_array_equal(y, mod.rms_norm(x.astype(dt[1:]), 4,
                                                          x[0].astype(dt[1:]), 1e-5))
            assert y.dtype.isnative


# ---------------------------------------------------------------------------------------------
# found by the fuzz suite: a huge dy made numba_cpu's Σ dxhat·x overflow (x itself in range)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, dy", [
    (np.array([[1.56150717e137]]), np.array([[-1.64147984e219]])),
    (np.array([[1.70901312e73, 7.43063395e73, -4.36591310e71]]),
     np.array([[3.48675319e284, -1.83009696e283, -5.96498237e283]])),
], ids=["N1", "N3"])
@pytest.mark.slow  # compiles float64 kernels, which the default run leaves to `pytest -m slow`
def test_numba_cpu_backward_with_a_huge_dy(nc, x, dy):
    """Reference: the oracle (which sums dxhat·xhat, in range); bound 1e-13 relative."""
    n = x.shape[1]
    ref = rmsref.rms_norm_backward(dy, x, n)
    _, rstd = rmsref.rms_norm_forward(x, n)
    w = np.ones(n)
    # with a saved rstd the pipelined kernels run, and write such a row again after the loop
    for got in (nc.rms_norm_backward(dy, x, n), nc.rms_norm_backward(dy, x, n, w, rstd=rstd),
                nc.add_rms_norm_backward(dy, None, x, np.zeros_like(x), n),
                nc.add_rms_norm_backward(dy, None, x, np.zeros_like(x), n, w, rstd=rstd)):
        assert np.all(np.isfinite(got.dx)), got.dx
        np.testing.assert_allclose(got.dx, ref.dx, rtol=1e-13, atol=1e-13 * np.max(
            np.abs(ref.dx)))


# ---------------------------------------------------------------------------------------------
# found by the fuzz suite: pRMSNorm scaled a float64 row by its largest element overall, not
# by the largest of the K features that feed the statistic, and lost them to underflow
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", [
    "numpy",
    pytest.param("numba_cpu", marks=pytest.mark.slow),  # float64 kernels: `pytest -m slow`
])
def test_partial_rms_norm_scales_by_the_features_it_uses(impl):
    """Exact: rstd = 1/|x_0| (K = 1), y = x·rstd; 1e-15 relative (float64 rounding)."""
    if impl == "numba_cpu":
        pytest.importorskip("numba")
    mod = rmsref.backend(impl)
    x = np.array([[2.69117846e-197, -7.35742913e-100], [6.52281990e89, 4.69410059e247]])
    y, rstd = mod.rms_norm_forward(x, 2, None, 0.0, partial=0.5)
    np.testing.assert_allclose(rstd[:, 0], 1 / np.abs(x[:, 0]), rtol=1e-15)
    np.testing.assert_allclose(y, x / np.abs(x[:, :1]), rtol=1e-15)


@pytest.mark.parametrize("x, dy", [
    (np.array([[-1.3478236897427788e-66]]), np.array([[-1.7225425157140511e-276]])),
    (np.array([[5.2771493551993435e-30, 1e-30]]), np.array([[5.010019798190967e-113, 0.0]])),
], ids=["N1", "N2"])
@pytest.mark.slow  # compiles float64 kernels, which the default run leaves to `pytest -m slow`
def test_numba_cpu_backward_with_a_tiny_dy(nc, x, dy):
    """Σ dxhat·x underflowed to 0 and the projection term was lost (found by the fuzz suite).
    Reference: the oracle; bound 1e-15 of the terms rstd·|dxhat| (the tolerance model's M)."""
    n = x.shape[1]
    ref = rmsref.rms_norm_backward(dy, x, n, None, 0.0)
    _, rstd = rmsref.rms_norm_forward(x, n, None, 0.0)
    m_terms = np.max(rstd * np.abs(dy))
    for got in (nc.rms_norm_backward(dy, x, n, None, 0.0),
                nc.rms_norm_backward(dy, x, n, np.ones(n), 0.0, rstd=rstd),
                nc.add_rms_norm_backward(dy, None, x, np.zeros_like(x), n, np.ones(n), 0.0,
                                         rstd=rstd)):
        assert np.max(np.abs(got.dx - ref.dx)) <= 1e-15 * m_terms, (got.dx, ref.dx)
