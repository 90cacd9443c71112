"""The error model of rmsref.tolerance: it holds for correct pipelines, fails for wrong ones, and
says how loose it is. Reference: the float64 oracle on the pipeline's own rounded inputs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import rmsref
from rmsref import tolerance as T
from rmsref._shapes import bfloat16

DTS = {"float32": np.dtype(np.float32), "bfloat16": bfloat16, "float16": np.dtype(np.float16)}


def pipeline_fp32(x, w, dy, eps, out):
    """A correct float32 pipeline with *sequential* sums (np.cumsum runs left to right): the
    worst ordinary accumulation order, so the bound is tested where it is tightest."""
    xf, wf, g = x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32)
    n = x.shape[1]
    ms = np.cumsum(xf * xf, axis=1, dtype=np.float32)[:, -1:] / np.float32(n)     # (M, 1)
    rstd = (np.float32(1) / np.sqrt(ms + np.float32(eps))).astype(np.float32)     # (M, 1)
    xhat = xf * rstd                                                              # (M, N)
    y = (xhat * wf).astype(out)
    dxhat = g * wf
    c = np.cumsum(dxhat * xhat, axis=1, dtype=np.float32)[:, -1:] / np.float32(n)
    dx = (rstd * (dxhat - xhat * c)).astype(out)
    dw = np.cumsum(g * xhat, axis=0, dtype=np.float32)[-1].astype(out)
    return y, dx, dw


def exact(x, w, dy, eps):
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, dy))
    n = x.shape[1]
    y, rstd = rmsref.rms_norm_forward(x64, n, w64, eps)
    gr = rmsref.rms_norm_backward(g64, x64, n, w64, eps)
    return y, gr.dx, gr.dweight, x64 * rstd, rstd, g64, w64


def ratios(got, ref, dt, form, rows):
    y, dx, dw = got
    y_ref, dx_ref, dw_ref, xhat, rstd, g, w = ref
    n = y.shape[1]
    by = T.bound("y", out_dtype=dt, n=n, y=y_ref, form=form)
    bdx = T.bound("dx", out_dtype=dt, n=n, dx=dx_ref, dy=g, xhat=xhat, rstd=rstd, weight=w,
                  form=form)
    bdw = T.bound("dweight", out_dtype=dt, n=n, rows=rows, dweight=dw_ref, dy=g, xhat=xhat,
                  form=form)
    r = lambda a, b_, bd: float(np.max(np.abs(a.astype(np.float64) - b_) / bd))  # noqa: E731
    return r(y, y_ref, by), r(dx, dx_ref, bdx), r(dw, dw_ref, bdw)


def inputs(rng, m, n, dt):
    x = rng.standard_normal((m, n)).astype(np.float32).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(n)).astype(np.float32).astype(dt)
    dy = rng.standard_normal((m, n)).astype(np.float32).astype(dt)
    return x, w, dy


def test_unit_roundoff_and_ulp():
    assert T.unit_roundoff(np.float32) == 2.0**-24
    assert T.unit_roundoff(bfloat16) == 2.0**-8
    assert T.unit_roundoff(np.float16) == 2.0**-11
    assert T.unit_roundoff(np.float64) == 2.0**-53
    assert T.ulp(np.array([1.0]), np.float32)[0] == 2.0**-23
    assert T.ulp(np.array([1.5]), bfloat16)[0] == 2.0**-7
    assert T.ulp(np.array([0.99]), np.float16)[0] == 2.0**-11
    assert T.ulp(np.array([1e-9]), np.float16)[0] == 2.0**-24      # subnormal spacing
    assert T.underflow_atol(np.float16) == 2.0**-25
    with pytest.raises(TypeError, match="int32"):
        T.unit_roundoff(np.int32)


def test_gamma_forms_and_reductions():
    u = 2.0**-24
    assert T.gamma_acc(64, np.float32, form="deterministic") == pytest.approx(
        64 * u / (1 - 64 * u), abs=0)
    assert T.gamma_acc(64, np.float32) == pytest.approx(6 * 8 * u, abs=0)
    assert T.effective_length(4096, "blocked", 32) == 128 + 5
    assert T.effective_length(4096, "pairwise") == 12
    # for large N the worst case is far above the probabilistic form
    assert T.gamma_acc(65536, form="deterministic") > 40 * T.gamma_acc(65536)
    with pytest.raises(ValueError, match="reduction"):
        T.effective_length(10, "tree")
    with pytest.raises(ValueError, match="needs dx"):
        T.bound("dx", out_dtype=np.float32, n=4, dx=np.zeros(4))


@pytest.mark.parametrize("dname", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("form", ["probabilistic", "deterministic"])
def test_bounds_hold_for_correct_fp32_pipeline_up_to_65536(dname, form, rng):
    dt = DTS[dname]
    seen = {}
    for n in (64, 1024, 4096, 65536):
        m = 8 if n < 65536 else 4
        x, w, dy = inputs(rng, m, n, dt)
        got = pipeline_fp32(x, w, dy, 1e-6, dt)
        r = ratios(got, exact(x, w, dy, 1e-6), dt, form, m)
        seen[n] = r
        assert max(r) <= 1.0, f"{dname} N={n} {form}: observed/bound (y, dx, dw) = {r}"
    print(f"\n{dname} {form} observed/bound (y, dx, dw):",
          {n: tuple(round(v, 4) for v in r) for n, r in seen.items()})


def test_fp32_error_grows_and_bound_is_loose_by_stated_amount(rng):
    """fp32, sequential sums: the y error grows with N, and the probabilistic bound stays within
    ~50x of it while the deterministic one is far looser at N = 65536."""
    rel = {}
    rat = {}
    for n in (64, 65536):
        x, w, dy = inputs(rng, 4, n, np.float32)
        got = pipeline_fp32(x, w, dy, 1e-6, np.float32)
        ref = exact(x, w, dy, 1e-6)
        rel[n] = float(np.max(np.abs(got[0] - ref[0]) / np.abs(ref[0]))) / 2.0**-24
        rat[n] = (ratios(got, ref, np.float32, "probabilistic", 4)[0],
                  ratios(got, ref, np.float32, "deterministic", 4)[0])
    print("\nfp32 max rel error of y in units of u:", rel, "y ratios (prob, det):", rat)
    assert rel[65536] > 4 * rel[64]
    assert rat[65536][0] > 0.02                # probabilistic: not vacuous
    assert rat[65536][1] < rat[65536][0] / 10  # deterministic: 10x+ looser at N = 65536


def test_bound_catches_an_inaccurate_pipeline(rng):
    """Rounding rstd to bfloat16 in a float32 pipeline must break the float32 bound."""
    x, w, dy = inputs(rng, 8, 1024, np.float32)
    ref = exact(x, w, dy, 1e-6)
    xf = x.astype(np.float32)
    rstd = (1 / np.sqrt(np.mean(xf.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6))
    y = (xf * rstd.astype(bfloat16).astype(np.float32) * w).astype(np.float32)
    by = T.bound("y", out_dtype=np.float32, n=1024, y=ref[0])
    assert np.max(np.abs(y - ref[0]) / by) > 10


def test_relative_error_on_dx_is_the_wrong_measure(rng):
    """dy = x̂/w makes dx = rstd·(w·dy − x̂·c) cancel: dx is ~eps-small while each term is O(rstd).
    A correct fp32 pipeline then shows a relative error >= 100 % on dx, yet it is within the
    cancellation-aware bound (the terms' size M_i), which a wrong dx still breaks."""
    n = 1024
    x = rng.standard_normal((4, n)).astype(np.float32)
    w = (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    xhat = x64 / np.sqrt(np.mean(x64**2, axis=1, keepdims=True))
    dy = (xhat / w64).astype(np.float32)
    got = pipeline_fp32(x, w, dy, 1e-9, np.float32)
    ref = exact(x, w, dy, 1e-9)
    rel = np.abs(got[1] - ref[1]) / np.abs(ref[1])
    assert np.max(rel) > 1.0                       # "100 % wrong" by relative error
    assert np.max(np.abs(ref[1])) < 1e-3 * np.max(np.abs(dy))   # the exact dx has cancelled
    assert ratios(got, ref, np.float32, "probabilistic", 4)[1] <= 1.0
    # the bound is not vacuous here: dropping the projection term breaks it by far
    wrong = ref[4] * dy.astype(np.float64) * w64
    bdx = T.bound("dx", out_dtype=np.float32, n=n, dx=ref[1], dy=ref[5], xhat=ref[3],
                  rstd=ref[4], weight=w64)
    print(f"\ncancelling dx: max relative error {np.max(rel):.3g}, observed/bound "
          f"{ratios(got, ref, np.float32, 'probabilistic', 4)[1]:.3g}")
    assert np.max(np.abs(wrong - ref[1]) / bdx) > 1e3


def test_bounds_hold_for_torch_up_to_65536(rng):
    torch = pytest.importorskip("torch", reason="torch not installed: torch pipeline check")
    from rmsref.adapters.torch import wrap

    fwd, bwd = wrap(torch.nn.functional.rms_norm)
    for dname, dt in DTS.items():
        for n in (64, 65536):
            x, w, dy = inputs(rng, 4, n, dt)
            y = fwd(x, n, w, 1e-6)
            dx, dw = bwd(dy, x, n, w, 1e-6)
            r = ratios((y, dx, dw), exact(x, w, dy, 1e-6), dt, "probabilistic", 4)
            assert max(r) <= 1.0, f"torch {dname} N={n}: {r}"


# ------------------------------------------------- the bounds are the documented formulas, exactly


def _bounds_by_hand(model, y, dx, dw, dy, xhat, rstd, w):
    """Eqs. (y), (dx), (dw) of the module docstring, written out in plain float64 loops.

    ``model``: (u_out, u_acc, n, rows, k_out, gamma) with gamma(m) the accumulation bound."""
    u_out, u_acc, n, rows, k_out, gamma = model
    atol = k_out * T.underflow_atol(np.float16)
    rho = 0.5 * gamma(n) + 3.0 * u_acc
    g, xh = dy.reshape(-1, n), xhat.reshape(-1, n)
    wf = np.ravel(w)
    by = (k_out * u_out + 0.5 * gamma(n) + 5.0 * u_acc) * np.abs(y) + atol
    dx_rel = 3.0 * rho + gamma(n) + T.C_DX * u_acc + 2.0 * (k_out - 1) * u_out
    bdx = np.zeros_like(g)
    for i in range(g.shape[0]):
        s = sum(abs(xh[i, j] * wf[j] * g[i, j]) for j in range(n)) / n
        for j in range(n):
            m_ij = float(np.ravel(rstd)[i]) * (abs(wf[j] * g[i, j]) + abs(xh[i, j]) * s)
            bdx[i, j] = dx_rel * m_ij + k_out * u_out * abs(dx.reshape(-1, n)[i, j]) + atol
    dw_rel = gamma(rows) + rho + 2.0 * u_acc + 2.0 * (k_out - 1) * u_out
    bdw = np.zeros(n)
    for j in range(n):
        s = sum(abs(g[i, j] * xh[i, j]) for i in range(g.shape[0]))
        bdw[j] = dw_rel * s + k_out * u_out * abs(np.ravel(dw)[j]) + atol
    return by, bdx.reshape(dx.shape), bdw.reshape(dw.shape)


@pytest.mark.parametrize("k_out", [1, 2])
def test_bounds_are_the_documented_formulas(rng, k_out):
    """tolerance.bound against eqs. (y), (dx), (dw) by hand, for a float16 output summed in
    float16 (acc_dtype given), blocked sums and the deterministic form, a weight and a 2-D
    normalized shape (3, 4): every factor of every equation shows in the result. The inputs are
    float16, as an implementation's would be: the bound is still computed in float64."""
    shape, n, rows = (3, 4), 12, 5
    x = rng.standard_normal((rows, *shape))
    w = (1 + 0.5 * rng.standard_normal(shape)).astype(np.float16)
    dy = rng.standard_normal((rows, *shape)).astype(np.float16)
    y, rstd = rmsref.rms_norm_forward(x, shape, w.astype(np.float64), 0.0)
    gr = rmsref.rms_norm_backward(dy.astype(np.float64), x, shape, w.astype(np.float64), 0.0)
    xhat = (x * rstd).astype(np.float16)  # half inputs everywhere
    y, dx, dw, rstd = (a.astype(np.float16) for a in (y, gr.dx, gr.dweight, rstd))
    options = dict(out_dtype=np.float16, n=n, acc_dtype=np.float16, k_out=k_out,
                   reduction="blocked", block=4, form="deterministic")
    got = (T.bound("y", y=y, **options),
           T.bound("dx", dx=dx, dy=dy, xhat=xhat, rstd=rstd, weight=w, **options),
           T.bound("dweight", rows=rows, dweight=dw, dy=dy, xhat=xhat, **options))

    u16 = 2.0**-11
    def gamma(m):  # blocked over 4 lanes, deterministic: γ_k of the depth, in float16
        depth = math.ceil(m / 4) + 2
        return depth * u16 / (1 - depth * u16)

    f64 = [a.astype(np.float64) for a in (y, dx, dw, dy, xhat, rstd, w)]
    expect = _bounds_by_hand((u16, u16, n, rows, k_out, gamma), *f64)
    for name, b, e, like in zip(("y", "dx", "dweight"), got, expect, (y, dx, dw), strict=True):
        assert b.dtype == np.float64 and b.shape == like.shape, name
        np.testing.assert_allclose(b, e, rtol=1e-13, atol=0, err_msg=name)


def test_dx_bound_without_a_weight_is_the_unit_weight_bound(rng):
    n = 8
    dy, xhat, rstd = rng.standard_normal((3, n)), rng.standard_normal((3, n)), rng.random(3)
    dx = rng.standard_normal((3, n))
    kw = dict(out_dtype=np.float32, n=n, dx=dx, dy=dy, xhat=xhat, rstd=rstd)
    np.testing.assert_array_equal(T.bound("dx", **kw), T.bound("dx", weight=np.ones(n), **kw))
    assert not np.array_equal(T.bound("dx", **kw), T.bound("dx", weight=np.full(n, 2.0), **kw))


@pytest.mark.parametrize(
    ("quantity", "given", "message"),
    [
        ("y", {}, "bound('y', ...) needs the exact y"),
        ("dx", {"dy", "xhat", "rstd"}, "bound('dx', ...) needs dx, dy, xhat and rstd"),
        ("dx", {"dx", "xhat", "rstd"}, "bound('dx', ...) needs dx, dy, xhat and rstd"),
        ("dx", {"dx", "dy", "rstd"}, "bound('dx', ...) needs dx, dy, xhat and rstd"),
        ("dx", {"dx", "dy", "xhat"}, "bound('dx', ...) needs dx, dy, xhat and rstd"),
        ("dweight", {"dy", "xhat"}, "bound('dweight', ...) needs dweight, dy and xhat"),
        ("dweight", {"dweight", "xhat"}, "bound('dweight', ...) needs dweight, dy and xhat"),
        ("dweight", {"dweight", "dy"}, "bound('dweight', ...) needs dweight, dy and xhat"),
        ("dxhat", {"dx"}, "quantity must be 'y', 'dx' or 'dweight', got 'dxhat'"),
    ],
)
def test_bound_names_each_missing_input(quantity, given, message):
    """Any one missing input is refused, with a message that says what the quantity needs."""
    arrays = {k: np.ones((2, 4)) for k in given}
    arrays = {k: (np.ones(2) if k == "rstd" else np.ones(4) if k == "dweight" else v)
              for k, v in arrays.items()}
    with pytest.raises(ValueError) as info:
        T.bound(quantity, out_dtype=np.float32, n=4, **arrays)
    assert str(info.value) == message


def test_effective_length_at_the_edges():
    """The depth of a sum's error chain: one term is depth 1 whatever the reduction; a single
    lane is a sequential sum; two lanes halve it (plus one combining step); the default is
    32 lanes, sequential."""
    assert T.effective_length(1) == T.effective_length(0) == 1
    assert T.effective_length(100) == 100
    assert T.effective_length(1, "pairwise") == T.effective_length(2, "pairwise") == 1
    assert T.effective_length(100, "blocked", block=1) == 100
    assert T.effective_length(100, "blocked", block=0) == 100
    assert T.effective_length(100, "blocked", block=2) == 50 + 1
    assert T.effective_length(1024, "blocked") == 32 + 5
    u = 2.0**-24
    assert T.gamma_acc(1024, reduction="blocked") == 6.0 * math.sqrt(37) * u


def test_error_model_uses_its_accumulation_dtype_and_reduction():
    """acc_dtype overrides the default (float32 for half outputs); gamma follows the model's
    reduction, block and lam."""
    f16 = np.dtype(np.float16)
    assert T.ErrorModel(f16, 64).u_acc == 2.0**-24
    assert T.ErrorModel(f16, 64, acc_dtype=np.float16).u_acc == 2.0**-11
    model = T.ErrorModel(f16, 64, reduction="blocked", block=8, lam=3.0)
    assert model.gamma(64) == 3.0 * math.sqrt(8 + 3) * 2.0**-24


def test_bounds_are_computed_in_float64_whatever_the_inputs_dtype(rng):
    """Inputs in float16 (values it holds exactly) give the float64 inputs' bound, bit for bit:
    with a float32 output, u_out·|v| ~ 2^-24·|v| would underflow in float16 arithmetic."""
    n = 8
    a = {k: rng.standard_normal((3, n)).astype(np.float16) for k in ("y", "dx", "dy", "xhat")}
    a["rstd"] = rng.random(3).astype(np.float16)
    a["weight"] = rng.standard_normal(n).astype(np.float16)
    a["dweight"] = rng.standard_normal(n).astype(np.float16)
    wide = {k: v.astype(np.float64) for k, v in a.items()}
    need = {"y": ("y",), "dx": ("dx", "dy", "xhat", "rstd", "weight"),
            "dweight": ("dweight", "dy", "xhat")}
    for quantity, keys in need.items():
        got = T.bound(quantity, out_dtype=np.float32, n=n, **{k: a[k] for k in keys})
        expect = T.bound(quantity, out_dtype=np.float32, n=n, **{k: wide[k] for k in keys})
        assert got.dtype == np.float64, quantity
        np.testing.assert_array_equal(got, expect, err_msg=quantity)


def test_bound_defaults_to_32_lanes_when_blocked(rng):
    y = rng.standard_normal(1024)
    kw = dict(out_dtype=np.float16, n=1024, y=y, reduction="blocked")
    np.testing.assert_array_equal(T.bound("y", **kw), T.bound("y", block=32, **kw))
    assert not np.array_equal(T.bound("y", **kw), T.bound("y", block=16, **kw))


def test_gamma_k_is_infinite_once_k_u_reaches_one_half():
    """γ_k = k·u/(1 − k·u) below k·u = 1/2; from there on the first-order bound means nothing
    and γ_k is inf (not 1 at k·u = 1/2, not a division by zero at k·u = 1)."""
    u = 2.0**-24
    assert T.gamma_k(10, np.float32) == 10 * u / (1 - 10 * u)
    assert T.gamma_k(2**23 - 1, np.float32) == (2**23 - 1) * u / (1 - (2**23 - 1) * u)
    for k in (2**23, 2**24, 2**30):
        assert T.gamma_k(k, np.float32) == float("inf"), k


def test_unknown_dtypes_and_forms_are_named():
    with pytest.raises(TypeError) as info:
        T.unit_roundoff(np.int8)
    assert str(info.value) == ("no unit roundoff for dtype int8; expected one of float16, "
                               "bfloat16, float32, float64")
    with pytest.raises(ValueError) as info:
        T.gamma_acc(8, form="worst")
    assert str(info.value) == "form must be 'probabilistic' or 'deterministic', got 'worst'"


def test_abs_error_of_finite_and_non_finite_values():
    """|actual − ref| in float64; a NaN where the reference has one, or the same infinity, is
    no error; any other non-finite value (or a finite one where the reference is not) is an
    infinite error, never NaN, so that it fails every bound."""
    inf, nan = np.inf, np.nan
    actual = np.array([1.5, -2.0, nan, inf, -inf, nan, inf, 1.0, inf, 1e308], dtype=np.float64)
    ref = np.array([1.0, -2.5, nan, inf, -inf, 1.0, 1.0, nan, -inf, -1e308])
    expect = np.array([0.5, 0.5, 0.0, 0.0, 0.0, inf, inf, inf, inf, inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflow of 1e308 − (−1e308) is expected: no warning
        got = T.abs_error(actual, ref)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, expect)
    # half-precision inputs are compared in float64: the difference of two float16 values
    # near 65504 is not an overflow there
    half = T.abs_error(np.float16([65504.0, 2.0**-24]), np.float16([-65504.0, 0.0]))
    np.testing.assert_array_equal(half, [131008.0, 2.0**-24])
