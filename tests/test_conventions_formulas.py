"""Every convention's emulation is its documented formula, on every path: each input dtype, each
weight dtype (the input's, float32, float64, the other half type, none), with and without an
offset added to the weight, with our statistic and with a given rstd. The formulas are written out
here from docs/semantics.md, step by step, independently of rmsref.conventions; emulate_add is
checked the same way against its two documented meanings."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import conventions as C
from rmsref._shapes import bfloat16

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
HALF = (F16, bfloat16)
INPUTS = {"float16": F16, "bfloat16": bfloat16, "float32": F32, "float64": F64}


def R(v, t) -> np.ndarray:
    """R_t(v): round to dtype t (an exact upcast when t is wider)."""
    return np.asarray(v).astype(t)


def opmath(t) -> np.dtype:
    """float32 for half and float32 inputs, float64 for float64."""
    return F64 if np.dtype(t) == F64 else F32


def promoted(a, b) -> np.dtype:
    """torch's promotion of floating dtypes: the wider; float16 with bfloat16 gives float32."""
    a, b = np.dtype(a), np.dtype(b)
    if {a, b} == {F16, bfloat16}:
        return F32
    return a if a.itemsize >= b.itemsize else b


def ms_of(x, op, k=None) -> np.ndarray:
    """R_op(mean(x²)) over the first k features, per row (M, 1): squares and mean in float64."""
    x64 = R(x, F64)[:, :k]
    return R(np.mean(x64 * x64, axis=1, keepdims=True), op)


def rstd_of(x, eps, op, twice=False) -> np.ndarray:
    """R(1/sqrt(R(ms + eps))) in op; with ``twice``, R(1/R(sqrt(·))) as code writing 1/sqrt."""
    s = ms_of(x, op) + op.type(eps)                       # op + op: rounded in op
    if twice:
        return op.type(1) / np.sqrt(s)                    # sqrt rounded, then the division
    return R(1.0 / np.sqrt(R(s, F64)), op)                # one rounding


def weight_plus(w, offset, t) -> np.ndarray:
    """R_t(offset + w), the sum formed in w's (or t's) opmath dtype."""
    return R(R(w, opmath(w.dtype)) + offset, t) if offset else w


def formula(name, x, w, eps, offset, rstd=None) -> np.ndarray:
    """y of convention ``name`` for rows x (M, N) of dtype t and weight w (N,), written out."""
    t = x.dtype
    op = opmath(t)
    xf = R(x, op)
    r = None if rstd is None else R(np.reshape(rstd, (-1, 1)), op)
    if name == "native":                                 # every step rounded to t
        if r is None:
            sq = R(R(xf * xf, t), op)                     # R_t(x²), summed in op
            ms = R(np.sum(sq, axis=1, keepdims=True) / op.type(x.shape[1]), t)
            s = R(R(ms, op) + op.type(eps), t)
            r = R(1.0 / np.sqrt(R(s, F64)), t)
        h = R(xf * R(R(r, t), op), t)                     # R_t(x·rstd)
        wt = R(R(w, op) + offset, t) if offset else w     # offset + w rounded to t
        out = promoted(t, wt.dtype)
        return R(R(h, opmath(out)) * R(wt, opmath(out)), out)
    if name == "paper":                                  # eps outside the square root
        if r is None:
            d = R(np.sqrt(ms_of(x, op)) + op.type(eps), op)
            h = xf / d
        else:
            h = xf * r
        return R(h * (R(w, op) + op.type(offset)), t)
    if r is None:
        r = rstd_of(x, eps, op, twice=name == "fused_fp32_div")
    xhat = xf * r                                         # (M, N) in op
    if name in ("torch", "fused_fp32", "fused_fp32_div", "gemma"):   # one rounding
        return R(xhat * (R(w, op) + op.type(offset)), t)
    if name == "gemma_wdtype":                           # R_w(offset + w), then one rounding
        return R(xhat * R(weight_plus(w, offset, w.dtype), op), t)
    if name == "llama":                                  # x̂ rounded to t, then w·x̂ rounded
        wt = weight_plus(w, offset, w.dtype)
        out = promoted(w.dtype, t)
        return R(R(wt, opmath(out)) * R(R(xhat, t), opmath(out)), out)
    if name == "t5":                                     # x̂ rounded to w's dtype when half
        wt = weight_plus(w, offset, w.dtype)
        h = R(xhat, w.dtype) if w.dtype in HALF else xhat
        out = promoted(w.dtype, h.dtype)
        return R(R(wt, opmath(out)) * R(h, opmath(out)), out)
    if name == "flax":                                   # rstd·scale first, result_type(x, w)
        opw = promoted(op, opmath(w.dtype))
        scale = R(w, opw) + opw.type(offset)
        return R(R(xf, opw) * (R(r, opw) * scale), promoted(t, w.dtype))
    raise AssertionError(name)


def rows(rng, t, m=6, n=24) -> np.ndarray:
    """Gaussian rows at scales from 3 down to 0.003, where an eps of 1e-3 weighs on rstd."""
    scale = 3.0 * 10.0 ** -(np.arange(m)[:, None] % 4)                  # (M, 1)
    return R(R(scale * rng.standard_normal((m, n)), F32), t)


def weight_dtypes(t) -> list:
    """The weight dtypes the rules tell apart: none, the input's, float32, float64, other half."""
    return [None, *dict.fromkeys([t, F32, F64, bfloat16 if t != bfloat16 else F16])]


@pytest.mark.parametrize("name", C.names())
@pytest.mark.parametrize("dname", list(INPUTS))
def test_emulate_is_the_formula_on_every_path(name, dname, rng):
    """Each weight dtype (none: the weight is 1), each offset (0, 1, 0.375), our statistic and
    a given rstd (float64, one per row: rounded to opmath first): emulate is the formula, bit
    for bit and dtype for dtype."""
    t = INPUTS[dname]
    x = rows(rng, t)
    eps = 1e-3
    r_given = 1.01 / np.sqrt(np.mean(R(x, F64) ** 2, axis=1) + eps)      # (M,), not the statistic
    for wdt in weight_dtypes(t):
        w = None if wdt is None else R(R(1 + 0.3 * rng.standard_normal(x.shape[1]), F32), wdt)
        w_used = np.ones(x.shape[1], t) if w is None else w
        for offset in (0.0, 1.0, 0.375):
            for rstd in (None, r_given):
                got = C.emulate(name, x, w, eps, offset=offset, rstd=rstd)
                want = formula(name, x, w_used, eps, offset, rstd)
                where = f"{name} x={dname} w={wdt} offset={offset} rstd={rstd is not None}"
                assert got.dtype == want.dtype, where
                np.testing.assert_array_equal(R(got, F64), R(want, F64), err_msg=where)


@pytest.mark.parametrize("name", C.names())
def test_missing_weight_is_a_weight_of_ones(name, rng):
    """No weight means w = 1 in x's dtype, with any offset (as the oracle): y = x̂·(offset + 1);
    with offset 0, y is x̂ rounded as the convention rounds it."""
    for t in (bfloat16, F16, F32):
        x = rows(rng, t)
        ones = np.ones(x.shape[1], t)
        for offset in (0.0, 1.0):
            np.testing.assert_array_equal(
                R(C.emulate(name, x, None, 1e-3, offset=offset), F64),
                R(C.emulate(name, x, ones, 1e-3, offset=offset), F64), err_msg=f"{name} {t}")
        y = C.emulate(name, x, None, 1e-3, offset=0.0)
        assert y.dtype == t and np.count_nonzero(y) == x.size    # x̂, not 0·x̂


@pytest.mark.parametrize("name", C.names())
def test_default_offset_and_eps(name, rng):
    """offset=None is the convention's own (1 for gemma and gemma_wdtype, else 0); eps=None is
    its own default for the input dtype."""
    conv = C.get(name)
    assert conv.default_offset == (1.0 if name in ("gemma", "gemma_wdtype") else 0.0)
    for t in (bfloat16, F32, F64):
        x = rows(rng, t)
        w = R(1 + 0.3 * rng.standard_normal(x.shape[1]), t)
        want = formula(name, x, w, conv.default_eps(t), conv.default_offset)
        np.testing.assert_array_equal(R(C.emulate(name, x, w), F64), R(want, F64))


def test_default_eps_values():
    for name in ("llama", "gemma", "gemma_wdtype", "t5", "flax"):
        assert C.get(name).default_eps(bfloat16) == 1e-6
    for name in ("native", "fused_fp32", "fused_fp32_div"):
        assert C.get(name).default_eps(F16) == 1e-5
    assert C.get("paper").default_eps(F32) == 1e-8
    assert C.get("fused_fp32").default_eps(F64) == 1e-5
    assert C.get("torch").default_eps(F16) == C.get("torch").default_eps(F32) == 2.0**-23


@pytest.mark.parametrize("name", C.names())
def test_normalized_shape_and_leading_dims(name, rng):
    """x (B, S, N) normalises its last dim by default (the weight's shape when given); a
    normalized_shape of two dims normalises both together, as rows of their product."""
    x = R(3 * rng.standard_normal((2, 3, 4, 6)), bfloat16)
    flat = x.reshape(-1, 6)
    y = C.emulate(name, x, None, 1e-3)
    assert y.shape == x.shape
    np.testing.assert_array_equal(R(y.reshape(-1, 6), F64),
                                  R(formula(name, flat, np.ones(6, bfloat16), 1e-3,
                                            C.get(name).default_offset), F64))
    w2 = R(1 + 0.3 * rng.standard_normal((4, 6)), bfloat16)
    y2 = C.emulate(name, x, w2, 1e-3)                   # normalized_shape = w2.shape = (4, 6)
    want = formula(name, x.reshape(-1, 24), w2.reshape(24), 1e-3, C.get(name).default_offset)
    np.testing.assert_array_equal(R(y2.reshape(-1, 24), F64), R(want, F64))
    y3 = C.emulate(name, x, None, 1e-3, normalized_shape=(4, 6))
    assert not np.array_equal(R(y3, F64), R(y, F64))


def test_paper_partial_uses_the_first_features(rng):
    """pRMSNorm: rms over the first floor(pN) features (at least one), applied to all N."""
    x = rows(rng, F32, n=10)
    w = R(1 + 0.3 * rng.standard_normal(10), F32)
    for p, k in ((0.25, 2), (0.5, 5), (0.01, 1), (1.0, 10)):
        d = R(np.sqrt(ms_of(x, F32, k)) + F32.type(1e-3), F32)
        want = R((x / d) * w, F32)
        np.testing.assert_array_equal(C.emulate("paper", x, w, 1e-3, partial=p), want,
                                      err_msg=f"p={p}")


def test_given_rstd_is_checked_and_reshaped(rng):
    """rstd has one value per row, of any shape; another count names both."""
    x = rows(rng, F32)
    r = np.full(6, 0.5)
    for shape in ((6,), (6, 1), (2, 3)):
        y = C.emulate("torch", x, None, rstd=r.reshape(shape))
        np.testing.assert_array_equal(y, x * F32.type(0.5))
    with pytest.raises(ValueError) as info:
        C.emulate("torch", x, None, rstd=np.ones((2, 2)))
    assert str(info.value) == ("rstd has 4 values (shape (2, 2)); expected one per row (6 rows)")
    with pytest.raises(ValueError, match=r"partial is only defined for the 'paper' convention, "
                                         r"not 'llama'"):
        C.emulate("llama", x, None, partial=0.5)


def test_emulate_propagates_nan_inf_and_overflow_without_warnings(rng):
    """A row with NaN or Inf gives NaN, an output beyond the dtype's range gives Inf: no
    warning, no error; other rows are unaffected."""
    import warnings

    x = rows(rng, F16)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    big = np.full(x.shape[1], 6e4, F16)                  # x̂·w beyond float16's 65504
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in C.names():
            y = R(C.emulate(name, x, None, 1e-3), F64)
            assert np.isnan(y[1]).all(), name
            assert np.isfinite(y[[0, 3, 4, 5]]).all(), name
            y = R(C.emulate(name, x[[0]], big, 1e-3, offset=0.0), F64)
            assert np.isinf(y).any() and not np.isnan(y).any(), name


def test_emulate_errors_name_the_argument():
    x = np.ones((2, 4), F32)
    with pytest.raises(TypeError, match=r"^x has dtype int64; rmsref accepts float16"):
        C.emulate("torch", np.ones((2, 4), np.int64))
    with pytest.raises(TypeError, match=r"^weight has dtype int32; rmsref accepts float16"):
        C.emulate("llama", x, np.ones(4, np.int32))
    with pytest.raises(ValueError) as info:
        C.emulate("t5", x, np.ones(3, F32), normalized_shape=4)
    assert str(info.value) == "weight has shape (3,) but normalized_shape is (4,)"
    with pytest.raises(ValueError) as info:
        C.emulate("flax", x, normalized_shape=3)
    assert str(info.value) == ("normalized_shape (3,) does not match the trailing dims of x "
                               "with shape (2, 4)")


# ---- fused residual add -------------------------------------------------------------------------


@pytest.mark.parametrize("name", C.names())
def test_emulate_add_rounded_sum_normalises_the_rounded_sum(name, rng):
    """rounded-sum: h = x + residual formed in the wider opmath of the two, rounded to x's
    dtype and normalised; new_residual = R_res(h). Offset, rstd and normalized_shape pass
    through."""
    for t, rdt in ((bfloat16, bfloat16), (F16, F32), (bfloat16, F64), (F32, F16)):
        x, res = rows(rng, t), rows(rng, rdt)[::-1].copy()
        w = R(1 + 0.3 * rng.standard_normal(x.shape[1]), t)
        op = promoted(opmath(t), opmath(rdt))
        h = R(x, op) + R(res, op)
        r = np.full(x.shape[0], 0.25)
        for kw in ({}, {"offset": 0.5}, {"rstd": r}):
            y, new_res = C.emulate_add(name, x, res, w, 1e-3, **kw)
            assert new_res.dtype == rdt and y.shape == x.shape
            np.testing.assert_array_equal(R(new_res, F64), R(R(h, rdt), F64))
            want = C.emulate(name, R(h, t), w, 1e-3, **kw)
            assert y.dtype == want.dtype
            np.testing.assert_array_equal(R(y, F64), R(want, F64), err_msg=f"{name} {t} {kw}")


@pytest.mark.parametrize("name", ["torch", "gemma", "fused_fp32", "fused_fp32_div"])
def test_emulate_add_fp32_sum_rounds_y_once(name, rng):
    """fp32-sum: the opmath sum is normalised and y rounded once to x's dtype; eps=None is the
    input dtype's default, not the sum's (they differ for a float64 residual: 2^-23 vs 2^-52)."""
    for t, rdt in ((bfloat16, bfloat16), (F16, F64), (F32, F32)):
        x, res = rows(rng, t), rows(rng, rdt)[::-1].copy()
        w = R(1 + 0.3 * rng.standard_normal(x.shape[1]), t)
        op = promoted(opmath(t), opmath(rdt))
        h = R(x, op) + R(res, op)                                 # (M, N) in op
        for eps in (None, 1e-3):
            y, new_res = C.emulate_add(name, x, res, w, eps, rounding="fp32-sum", offset=0.5)
            e = C.get(name).default_eps(t) if eps is None else eps
            want = R(formula(name, h, w, e, 0.5), t)
            assert y.dtype == t and new_res.dtype == rdt
            np.testing.assert_array_equal(R(y, F64), R(want, F64), err_msg=f"{name} {t} {eps}")
            np.testing.assert_array_equal(R(new_res, F64), R(R(h, rdt), F64))


@pytest.mark.parametrize("rounding", C.ROUNDINGS)
def test_emulate_add_passes_normalized_shape_on(rounding, rng):
    """x (B, S, N) with normalized_shape (S, N) and no weight: rows of S·N features."""
    x = R(3 * rng.standard_normal((2, 4, 6)), bfloat16)
    res = R(3 * rng.standard_normal((2, 4, 6)), bfloat16)
    y, _ = C.emulate_add("torch", x, res, None, 1e-3, rounding=rounding, normalized_shape=(4, 6))
    h = R(x, F32) + R(res, F32)
    hx = h if rounding == "fp32-sum" else R(h, bfloat16)
    want = R(C.emulate("torch", hx, None, 1e-3, normalized_shape=(4, 6)), bfloat16)
    np.testing.assert_array_equal(R(y, F64), R(want, F64))
    last = R(C.emulate("torch", hx, None, 1e-3), bfloat16)          # rows of N: not the same
    assert not np.array_equal(R(y, F64), R(last, F64))


def test_emulate_add_sums_without_warnings():
    """An overflowing sum is Inf and Inf + (-Inf) is NaN, silently, in y and new_residual."""
    import warnings

    x = np.array([[3e38, 1.0, np.inf, 2.0]], F32)
    res = np.array([[3e38, 1.0, -np.inf, 2.0]], F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, new_res = C.emulate_add("torch", x, res, None, 1e-3)
    assert np.isinf(new_res[0, 0]) and np.isnan(new_res[0, 2]) and np.isnan(y).all()


def test_emulate_add_errors_name_what_they_got(rng):
    x = rows(rng, bfloat16)
    with pytest.raises(TypeError, match=r"^x has dtype int64; "):
        C.emulate_add("torch", np.ones((6, 24), np.int64), x, None)
    with pytest.raises(TypeError, match=r"^residual has dtype int64; "):
        C.emulate_add("torch", x, np.ones((6, 24), np.int64), None)
    with pytest.raises(ValueError) as info:
        C.emulate_add("torch", x, x[:3], None)
    assert str(info.value) == "residual has shape (3, 24) but x has shape (6, 24)"
    with pytest.raises(ValueError) as info:
        C.emulate_add("t5", x, x, None, rounding="fp32-sum")
    assert str(info.value) == ("'fp32-sum' is defined for the single-rounding conventions "
                               "('torch', 'gemma', 'fused_fp32', 'fused_fp32_div'), not 't5'")
    with pytest.raises(ValueError) as info:
        C.emulate_add("torch", x, x, None, rounding="sum")
    assert str(info.value) == "rounding must be one of ('rounded-sum', 'fp32-sum'), got 'sum'"


# ---- where each convention rounds twice: inputs built to land on a midpoint ---------------------


def test_x_rstd_is_rounded_to_float32_before_the_output_dtype():
    """x·rstd is formed in float32 (opmath) and then rounded to float16: two roundings, as the
    systems do. Here x·rstd lies just above a float16 midpoint and rounds onto it in float32,
    so the result goes to even (1.0), where one rounding would give 1 + 2^-10. native is left
    out: it rounds rstd to float16 first."""
    x = np.full((1, 8), 1 + 2.0**-10, F16)
    r = np.float32(0.9995122)
    exact = (1 + 2.0**-10) * float(r)
    assert R(exact, F32) == 1 + 2.0**-11 and exact > 1 + 2.0**-11
    assert R(exact, F16) == 1 + 2.0**-10                               # one rounding
    w = np.ones(8, F16)
    for name in C.names():
        if name != "native":
            y = C.emulate(name, x, w, rstd=[r], offset=0.0)
            np.testing.assert_array_equal(R(y, F64), 1.0, err_msg=name)


@pytest.mark.parametrize("wdt", [F16, bfloat16])
def test_offset_is_added_in_float32_then_rounded_where_the_convention_rounds(wdt, rng):
    """offset + w is formed in float32. llama, t5 and gemma_wdtype round it to the weight's
    dtype (native to the input's, here the same): 1 + offset, on a midpoint of that dtype in
    float32 (just above it exactly), goes to even, 1.0, and y is the y of offset 0. torch,
    gemma, flax and paper keep the float32 1 + offset, and y differs."""
    half_ulp = 2.0**-11 if wdt == F16 else 2.0**-8
    offset = half_ulp + 2.0**-30                       # 1 + offset: a float32 midpoint of wdt
    x = rows(rng, wdt)
    w = np.ones(x.shape[1], wdt)
    for name in C.names():
        y = R(C.emulate(name, x, w, 1e-3, offset=offset), F64)
        y0 = R(C.emulate(name, x, w, 1e-3, offset=0.0), F64)
        if name in ("llama", "t5", "gemma_wdtype", "native"):
            np.testing.assert_array_equal(y, y0, err_msg=name)
        else:
            assert np.mean(y != y0) > 0.2, name


def test_native_adds_eps_in_float32_then_rounds_to_the_input_dtype():
    """native: s = R_t(R_f32(ms + eps)). With ms = 1 and eps just above half a float16 ulp,
    the float32 sum is the midpoint 1 + 2^-11 and goes to even: s = 1, rstd = 1, y = x."""
    x = np.where(np.arange(16) % 3, 1.0, -1.0).astype(F16)[None, :]       # ms = 1 exactly
    eps = 2.0**-11 + 2.0**-30
    np.testing.assert_array_equal(C.emulate("native", x, None, eps), x)
    assert not np.array_equal(R(C.emulate("native", x, None, 2 * eps), F64), R(x, F64))


def test_native_sums_the_squares_as_numpy_sums_a_float32_row(rng):
    """native's sum of squares is NumPy's float32 sum of the row, on rows wider than NumPy's
    8192-element buffer too (a sum through a float64 copy is ordered differently there)."""
    x = R(rng.standard_normal((16, 10000)), F32)
    got = C.emulate("native", x, None, 1e-5)
    np.testing.assert_array_equal(got, formula("native", x, np.ones(10000, F32), 1e-5, 0.0))


@pytest.mark.parametrize("name", ["torch", "fused_fp32", "fused_fp32_div", "llama", "t5",
                                  "native", "flax", "paper"])
def test_a_negative_zero_weight_keeps_its_sign_without_an_offset(name, rng):
    """With offset 0 the weight is used as it is, not as 0 + w: a weight of -0.0 gives a zero of
    the opposite sign to x̂ (0 + (-0.0) would be +0.0)."""
    x = rows(rng, F32)
    w = np.ones(x.shape[1], F32)
    w[::2] = -0.0
    y = C.emulate(name, x, w, 1e-3, offset=0.0)
    assert (y[:, ::2] == 0).all()
    np.testing.assert_array_equal(np.signbit(y[:, ::2]), x[:, ::2] > 0)
