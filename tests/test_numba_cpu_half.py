"""Half-precision outputs of the Numba CPU kernels: the float32 route and its exact fallback,
and how often half outputs equal the oracle's bit for bit, on every bit pattern.

The contract (rmsref.kernels.numba_cpu, "Numerical contract"): RMSNorm's y is computed in
float32 arithmetic, fl(fl(x·fl(rstd))·fl(w')), then rounded to the half type, and so is
LayerNorm's y without a bias, with its mean in two float32 parts, and the fused add's y where x,
the residual and y share a half format; RMSNorm dx, with a weight of few enough bits, in
compensated float32 arithmetic; LayerNorm's dx and its y with a bias, the fused add's dx and
dresidual, and every other RMSNorm dx, in float64, as for every other dtype, rounded to the
half type through float32; a row with
an output that rounds to inf or is NaN (or, for RMSNorm's y, an rstd outside [2^-100, 2^100], or
an x·rstd of a nonzero x below float32's normal range; for LayerNorm's, a mean that
``_mu_parts`` cannot carry) is computed in float64 and rounded once. So >= 99.9 % of the
elements equal the oracle's float64 value rounded once, and the rest are one ulp from it.

References: NumPy float32 arithmetic and ml_dtypes/NumPy casts (the float32 route, bit for
bit), the exact one-rounding encoder ``rmsref.kernels._halfbits.encode`` (tested in
tests/test_halfbits.py) for the rows written again, the kernel's non-pipelined backward path,
and the NumPy oracle (float64, rounded once to the output dtype).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba", reason="the Numba kernels need numba (pip install 'rmsref[numba]')")

import rmsref  # noqa: E402
from rmsref import tolerance  # noqa: E402
from rmsref.kernels import _halfbits as hb  # noqa: E402
from rmsref.kernels import numba_cpu as K  # noqa: E402

BF16 = rmsref.bfloat16
#: The kernels' half types as a test parameter: float16 in the slow run only (the default run
#: compiles no float16 kernel, to stay under five minutes; bfloat16 takes the same routes).
HALF_TYPES = [
    pytest.param(BF16, id="bfloat16"),
    pytest.param(np.dtype(np.float16), id="float16", marks=pytest.mark.slow),
]


def _weights(rng, n, extreme):
    """Standard normal float32 weights; ``extreme`` "tiny" puts float32 values whose products
    with x·rstd are bfloat16 subnormals (1e-39) in some columns, "overflow" these and values
    whose products overflow (3e38) and zeros."""
    w = rng.standard_normal(n).astype(np.float32)
    if extreme in ("tiny", "overflow"):
        w[::7] = np.float32(1e-39)
    if extreme == "overflow":
        w[3::11] = np.float32(3e38)
        w[5::13] = 0.0
    return w


@pytest.mark.parametrize("x_dtype", [np.dtype(np.float32), BF16], ids=["float32-x", "bf16-x"])
@pytest.mark.parametrize("extreme", ["normal", "tiny", "overflow"])
def test_bfloat16_forward_is_its_float32_route(rng, extreme, x_dtype):
    """y in bfloat16 from float32 or bfloat16 inputs (float64 rstd returned for float32 x, so
    the kernel's values are reproducible here) equals, bit for bit, fl32(fl32(x·fl32(rstd))·w)
    rounded once to bfloat16 (NumPy float32 arithmetic, ml_dtypes' RNE), subnormal y included
    ("tiny": the pipelined kernel's hardware rounding would give 0 for them, so its bound
    ``_y_normal`` sends those rows to the unpipelined write); a row whose float32 y has an inf
    ("overflow": weights of 3e38, which also make the call take v4) or a NaN, or whose x·rstd
    of a nonzero x falls below float32's normal range, equals its float64 value rounded once
    instead. 40 rows of 200 (pipelined rows, 64-element blocks and a tail)."""
    m, n = 40, 200
    x = rng.standard_normal((m, n)).astype(x_dtype)
    x[3, :5] = [0.0, -0.0, 0.0, -0.0, 0.0]  # exact zeros keep their sign, in the fast route
    x[9, 17] = np.nan  # a NaN row: NaN everywhere
    x[21, :2] = [3e30, -2e-20]  # x·rstd of 2e-20 underflows float32: the float64 route
    w = _weights(rng, n, extreme)
    y, rstd = K.rms_norm_forward(x, n, w, out_dtype=BF16)
    rstd = rstd.astype(np.float32)  # (float32 already for bfloat16 x)
    x32 = x.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        xhat32 = x32 * rstd
        y32 = xhat32 * w
    lost = (x32 != 0) & (np.abs(xhat32) < np.finfo(np.float32).tiny)
    exact_rows = ~np.isfinite(y32).all(axis=1) | lost.any(axis=1)
    _, rstd64 = rmsref.rms_norm_forward(x, n, w)
    y64 = (x.astype(np.float64) * rstd64.astype(np.float64)) * w.astype(np.float64)
    want = np.where(exact_rows[:, None],
                    hb.encode(y64.reshape(-1), hb.BF16_BITS).view(np.uint16).reshape(m, n),
                    y32.astype(BF16).view(np.uint16))
    got = y.view(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{len(bad)} elements differ, first at {tuple(bad[0])}: got "
                           f"{got[tuple(bad[0])]:#06x}, want {want[tuple(bad[0])]:#06x}")
    assert exact_rows[9] and exact_rows[21]
    assert exact_rows.sum() == (m if extreme == "overflow" else 2)
    if extreme == "tiny":  # subnormal y, which the pipelined kernel must not flush to zero
        y_sub = np.abs(y.astype(np.float64)) < 2.0**-126
        assert (y_sub & (y.astype(np.float64) != 0) & ~exact_rows[:, None]).any()
    if extreme == "overflow":
        assert np.isinf(y.astype(np.float32)).any() and (np.abs(y64) < 2.0**-126).any()


@pytest.mark.parametrize("x_dtype", [BF16, np.dtype(np.float32)], ids=["bf16-x", "float32-x"])
def test_the_forward_bound_sends_a_lost_x_rstd_to_float64_whatever_the_weights(x_dtype):
    """``_y_normal``'s first test alone: in rows of 64 (one block of the pipelined loop, no
    tail, whose elements are tested one by one) the smallest nonzero |x|, |-1.0078125·2^-88|
    beside 2^60, gives an x·rstd of -14·2^-149, a float32 subnormal that kept 4 bits, while
    every weight is at least 2^20, so the bound's second test (that x·rstd times the
    smallest weight, 1.75·2^-126) passes. y = x·rstd·2^100 is an ordinary bfloat16 value,
    several ulps off in float32; the row must be written again in float64: the oracle's
    bits, in 40 pipelined rows, from bfloat16 or float32 x. (The tiny x is negative: a bound
    that took the smallest x instead of the smallest |x| would miss it.)"""
    n = 64
    row = np.zeros(n)
    row[:3] = [2.0**60, -1.0078125 * 2.0**-88, 2.0**59]
    x = np.tile(row, (40, 1)).astype(x_dtype)
    w = np.full(n, 2.0**20)
    w[1] = 2.0**100
    w = w.astype(BF16)
    y, rstd = K.rms_norm_forward(x, n, w, out_dtype=BF16)
    want, _ = rmsref.rms_norm_forward(x, n, w, out_dtype=BF16)
    with np.errstate(under="ignore"):
        xhat32 = x.astype(np.float32) * rstd.astype(np.float32)
    assert 0 < -xhat32[0, 1] < np.finfo(np.float32).tiny  # subnormal, bits lost
    assert (-xhat32[:, 1] * np.float32(2.0**20) >= np.finfo(np.float32).tiny).all()
    y32 = (xhat32 * w.astype(np.float32)).astype(BF16)
    assert (y32.view(np.uint16) != want.view(np.uint16))[:, 1].all()  # float32 is wrong here
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


@pytest.mark.skipif(not hb.BF16_HW, reason="the CPU Numba compiles for has no AVX512-BF16: "
                    "the kernels keep the element-by-element bfloat16 rounding")
def test_the_hardware_bfloat16_rounding_equals_the_integer_one_where_the_kernel_uses_it(rng):
    """``store_lanes`` (``vcvtneps2bf16``) equals ``f32_to_bf16_bits_rne`` (tested against
    ml_dtypes in test_halfbits.py) on ±0 and every kind of normal float32 below the tie that
    rounds to inf: 2^20 random bit patterns, the ties and the values next to them, and the
    ends of the normal range, of both signs."""
    from numba import njit

    @njit
    def store_all(v2, out3):
        for q in range(v2.shape[0]):
            hb.store_lanes(v2[q], out3, (q, 0, 0))

    @njit
    def one_by_one(v, soft):
        for j in range(v.size):
            soft[j] = hb.f32_to_bf16_bits_rne(v[j])

    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    ties = rng.integers(0x0080, 0x7F7F, 1 << 14, dtype=np.uint32) << 16 | 0x8000
    edges = np.array([0x00800000, 0x00800001, 0x7F7F7FFF, 0x7F7F0000, 0x3F800000],
                     np.uint32)
    bits = np.concatenate([bits, ties, ties - 1, ties + 1, edges, np.zeros(1, np.uint32)])
    bits = np.concatenate([bits, bits | 0x80000000])
    a = bits & 0x7FFFFFFF
    v = bits[((a >= 0x00800000) & (a < 0x7F7F8000)) | (a == 0)].view(np.float32)
    v = v[: v.size - v.size % 64]
    soft = np.empty(v.size, np.int16)
    one_by_one(v, soft)
    hard = np.empty((v.size // 64, 1, 64), np.int16)
    store_all(v.reshape(-1, 64), hard)
    np.testing.assert_array_equal(hard.reshape(-1), soft)


def test_the_forward_routes_a_bfloat16_y_by_the_cpu_and_the_layout(rng):
    """``_weight_floor`` picks the lanes route (a float32: the smallest nonzero |w'|) only for
    a bfloat16 y computed in float32, into a C-contiguous output, on a CPU with AVX512-BF16;
    every other call gets None (the element-by-element loop)."""
    w = np.array([0.0, -0.5, 3.0, 2.0**-130])
    x3 = K._bits(np.zeros((1, 2, 4), BF16))
    y3 = K._bits(np.zeros((1, 2, 4), BF16))
    strided = K._bits(np.zeros((1, 2, 8), BF16))[:, :, ::2]
    f16 = K._bits(np.zeros((1, 2, 4), np.float16))
    floor = K._weight_floor(w, x3, y3)
    if hb.BF16_HW:
        assert floor == np.float32(2.0**-130) and floor.dtype == np.float32
        assert K._weight_floor(np.zeros(4), x3, y3) == np.inf
        assert K._weight_floor(w, np.zeros((1, 2, 4), np.float32), y3) is not None
    else:
        assert floor is None
    for x, y in ((x3, strided), (f16, f16), (x3, np.zeros((1, 2, 4), np.float32)),
                 (np.zeros((1, 2, 4)), y3)):
        assert K._weight_floor(w, x, y) is None


@pytest.mark.slow  # kernels for strided rows of their own: the default run's budget
def test_the_bfloat16_forward_into_a_strided_out_has_the_same_bits(rng):
    """The pipelined forward's block store writes 64 contiguous elements (in hardware, where
    the CPU can); an ``out`` whose rows are strided takes the element-by-element loop
    instead, with the same bits (64 rows of 200: three blocks and a tail)."""
    x = rng.standard_normal((64, 200)).astype(BF16)
    w = rng.standard_normal(200).astype(BF16)
    y, _ = K.rms_norm_forward(x, 200, w)
    out = np.empty((64, 400), BF16)[:, ::2]
    K.rms_norm_forward(x, 200, w, out=out)
    np.testing.assert_array_equal(out.view(np.uint16), y.view(np.uint16))


@pytest.mark.parametrize("where", ["block", "tail"])
@pytest.mark.parametrize("rows", [1, 40], ids=["one-row", "pipelined"])
@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_an_x_rstd_lost_to_float32_underflow_is_not_a_wrong_y(op, rows, where):
    """Tiny x beside large ones (rstd ~ 2^-60) times large weights: x·rstd falls below
    float32's normal range (zero for 2^-100·2^-60, a few bits for 3·2^-80·2^-60) while
    y = x·rstd·w' is an ordinary bfloat16 value. y equals the oracle's bits (the row is written
    again in float64), not a zero or a value cut to a float32 subnormal's bits (the fuzz test
    once found -0.0 for -2.37e-28). So for the fused add's y (h = x + 0), and with the tiny
    values in a 64-element block of the pipelined loops or in the row's tail, whose
    elements the row's bound (``_halfbits.lost_in_row``) must also see. A float16 y cannot
    get there: its w' < 2^16 (or, with a large offset, every large x's y overflows and the
    row is written again anyway)."""
    n, j0 = (64, 0) if where == "block" else (68, 64)
    x, w = np.zeros((rows, n)), np.ones(n)
    x[:, j0:j0 + 4] = [2.0**60, -1.0078125 * 2.0**-100, 3.0 * 2.0**-80, 2.0**59]
    w[j0 + 1:j0 + 3] = 2.0**100
    x, w = x.astype(BF16), w.astype(BF16)
    if op == "rms_norm":
        y, _ = K.rms_norm_forward(x, n, w)
        want, _ = rmsref.rms_norm_forward(x, n, w)
    else:
        zero = np.zeros_like(x)
        y = K.add_rms_norm_forward(x, zero, n, w)[0]
        want = rmsref.add_rms_norm_forward(x, zero, n, w)[0]
    tiny = want.astype(np.float64)[:, j0 + 1:j0 + 3]
    assert (tiny[:, 0] < 0).all() and (tiny[:, 1] > 0).all()  # ordinary values, not zeros
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


def test_a_value_that_rounds_to_inf_only_through_float32_is_not_inf():
    """Double rounding at the top of the range: T = 2^128 - 2^119 is the bfloat16 tie between
    the largest finite value and inf. With x = (1, 0, 0, 0) in bfloat16 and eps = 0 (rstd = 2,
    exact), 40 rows so that the pipelined loops take them, and a weight w just below T/2 whose
    float32 rounding is T/2: y_0 = 2·w is T in float32, which goes to inf (even), while the
    float64 value, rounded once, is the largest finite bfloat16; so is dx_1 = 2·w_1 (dy =
    (0, 1, 0, 0), c = 0), with and without a saved rstd, and the fused add's dh_1 of h = x + 0.
    A value that rounds to inf through float32 is written again in float64
    (``outside_work``), so all of them are the oracle's."""
    n = 4
    x = np.tile(np.array([1.0, 0.0, 0.0, 0.0]), (40, 1)).astype(BF16)
    tie = 2.0**128 - 2.0**119
    big = tie / 2 * (1.0 - 2.0**-40)
    assert np.float32(big) * np.float32(2.0) == np.float32(tie)
    largest = float(ml_dtypes.finfo(BF16).max)  # (NumPy 1.x has no finfo for bfloat16)
    y, _ = K.rms_norm_forward(x, n, np.array([big, 1.0, 1.0, 1.0]), eps=0.0)
    assert (y.astype(np.float32)[:, 0] == largest).all()
    dy = np.tile(np.array([0.0, 1.0, 0.0, 0.0]), (40, 1)).astype(BF16)
    w = np.array([1.0, big, 1.0, 1.0])
    for rstd in (None, np.full((40, 1), 2.0)):
        dx = K.rms_norm_backward(dy, x, n, w, eps=0.0, rstd=rstd).dx
        want = rmsref.rms_norm_backward(dy, x, n, w, eps=0.0).dx
        np.testing.assert_array_equal(dx.view(np.uint16), want.view(np.uint16))
        # the fused add's dh_1, the same value with h = x + 0, and dy_0 = 1/2, so that
        # Σ dxhat·h = 1/2 is in range: the pipelined loop flags the row only for its dh
        dyf, r = dy.copy(), np.zeros_like(x)
        dyf[:, 0] = 0.5
        got = K.add_rms_norm_backward(dyf, None, x, r, n, w, eps=0.0, rstd=rstd)
        want_h = rmsref.add_rms_norm_backward(dyf, None, x, r, n, w, eps=0.0)
        for name in ("dx", "dresidual"):
            np.testing.assert_array_equal(getattr(got, name).view(np.uint16),
                                          getattr(want_h, name).view(np.uint16), err_msg=name)
    assert (want.astype(np.float32)[:, 1] == largest).all()
    assert (want_h.dx.astype(np.float32)[:, 1] == largest).all()


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_the_forward_tests_y_for_inf_and_nan_where_the_weight_allows_them(dtype):
    """The pipelined forward leaves out the per-element test of y for inf and NaN when the
    weight rules them out, sqrt(N)·max|w| <= half the float32 value that rounds to inf
    (``_y_bounded``). With x = (1, 0, 0, 0) and eps = 0 (rstd = 2, exact; 40 rows, so the
    pipelined loop takes them), y_0 = 2·w_0: at w_0 = a quarter of the largest finite value
    (inside the bound, just) y_0 is finite and the oracle's; a weight NaN with every payload
    bit set, whose float32 route carries the payload into the sign of a bfloat16 (-0.0), gives
    NaN with the oracle's bits, and an infinite weight the oracle's inf."""
    n = 4
    x = np.tile(np.array([1.0, 0.0, 0.0, 0.0]), (40, 1)).astype(dtype)
    largest = float(ml_dtypes.finfo(dtype).max)
    full_nan = np.array([0x7FFF_FFFF_FFFF_FFFF], np.uint64).view(np.float64)[0]
    for w0 in (largest / 4, full_nan, np.inf):
        w = np.array([w0, 1.0, 1.0, 1.0])
        assert K._y_bounded(w, K._bits(x)) == (w0 == largest / 4)
        y, _ = K.rms_norm_forward(x, n, w, eps=0.0)
        want, _ = rmsref.rms_norm_forward(x, n, w, eps=0.0)
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
        y0 = y.astype(np.float32)[:, 0]
        assert np.isnan(y0).all() if np.isnan(w0) else (y0 == np.float32(2 * w0)).all()


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_the_fused_add_flags_a_row_with_an_inf_y_without_testing_each(dtype):
    """The fused add's float32 y route tests each row for an inf or NaN y once
    (``_y_finite_row``: Σh² and float32(rstd) finite) where the weight rules out an inf
    otherwise (``_y_bounded``), and writes every row again in float64 where it does not.
    x = (1, 0, 0, 0), residual 0, eps = 0: rstd = 2 exactly (40 rows, the pipelined loop), and
    y_0 = 2·w_0. Weights beyond the bound: w_0 just below T/2, T the bfloat16 tie between the
    largest finite value and inf, whose float32 y_0 = T goes to inf while the oracle's rounds
    to the largest finite value; a NaN weight with every payload bit set; inf. In range: a
    quarter of the largest value. And (bfloat16) a row of x = 2^-133 (subnormal), whose
    rstd = 2^133 is inf in float32: every y would be inf there, and the oracle's is w. Each
    y has the oracle's bits."""
    n = 4
    x = np.tile(np.array([1.0, 0.0, 0.0, 0.0]), (40, 1)).astype(dtype)
    r = np.zeros_like(x)
    largest = float(ml_dtypes.finfo(dtype).max)
    tie = 2.0**128 - 2.0**119
    full_nan = np.array([0x7FFF_FFFF_FFFF_FFFF], np.uint64).view(np.float64)[0]
    for w0 in (tie / 2 * (1.0 - 2.0**-40), full_nan, np.inf, largest / 4):
        w = np.array([w0, 1.0, 1.0, 1.0])
        assert K._y_bounded(w, K._bits(x)) == (w0 == largest / 4)
        y, h, _ = K.add_rms_norm_forward(x, r, n, w, eps=0.0)
        want, want_h, _ = rmsref.add_rms_norm_forward(x, r, n, w, eps=0.0)
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16), err_msg=w0)
        np.testing.assert_array_equal(h.view(np.uint16), want_h.view(np.uint16))
        if dtype == BF16 and w0 < np.inf and w0 > largest / 4:  # the float32 y_0 is inf
            assert (want.astype(np.float32)[:, 0] == largest).all()
    if dtype == BF16:
        x[7] = 2.0**-133
        w = np.array([1.0, 2.0, 3.0, 0.5])
        y, _, rstd = K.add_rms_norm_forward(x, r, n, w, eps=0.0)
        want, _, _ = rmsref.add_rms_norm_forward(x, r, n, w, eps=0.0)
        assert rstd.dtype == np.float32 and np.isinf(rstd.reshape(-1)[7])  # 2^133, saved in float32
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
        assert (want.astype(np.float64)[7] == w).all()


@pytest.mark.slow  # compiles float64 kernels, which the default run leaves to `pytest -m slow`
def test_layer_norm_rows_written_again_have_the_oracle_bits(rng):
    """float64 x with a bfloat16 output: y is computed in float64 and rounded by integer
    arithmetic that is exact only in bfloat16's normal range, so rows with a y below it (a
    weight of 1e-39 in every third column) are flagged by the pipelined loop and written again
    after it (``_ln_fwd_redo``), rounded once: the oracle's bits, in rows across several
    blocks and (above ``SERIAL_BELOW`` elements) both threads' shares."""
    m, n = 400, 96
    assert m * n >= K.SERIAL_BELOW
    x = rng.standard_normal((m, n))
    w = np.ones(n)
    w[::3] = 1e-39
    y = K.layer_norm_forward(x, n, w, out_dtype=BF16)[0]
    want = rmsref.layer_norm_forward(x, n, w, out_dtype=BF16)[0]
    assert (np.abs(want.astype(np.float64)[:, ::3]) < 2.0**-126).all()  # the rows are flagged
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


def _ln_fwd_direct(x, w, eps, y_dtype):
    """``_ln_fwd`` on the rows of x without a bias, on the float32 y route and with the CPU's
    rounding where the library takes it (so the kernel is the library's own compilation):
    (y bits, the flagged rows), before any row is written again."""
    m, n = x.shape
    x3 = K._bits(x.reshape(1, m, n))
    y3 = np.empty((1, m, n), hb.BF16_BITS if y_dtype == BF16 else hb.F16_BITS)
    mean = np.empty(m, np.float32 if x.dtype != np.float32 else np.float64)
    rstd = np.empty_like(mean)
    redo = np.empty(m, np.bool_)
    w64 = w.astype(np.float64)
    ww = K._ln_f32_weight(w64, False, x3, y3)
    assert ww is not None
    K._ln_fwd(x3, w64, ww, np.full(n, -0.0), eps, y3, mean, rstd, redo, K._bf16_by_cpu(y3), 0,
              -(-m // K.ROWS_PER_BLOCK))
    return y3[0].view(np.uint16), _flagged_rows(redo)


def _ln_y_numpy(x, w, eps, route):
    """LayerNorm's y without a bias in NumPy, from the kernel's float64 statistics
    (``_ln_stats``): ``route`` "float32" as ``_ln_y32`` computes it, ((x − mu_hi) − mu_lo)·
    fl32(rstd)·fl32(w) in float32 arithmetic (mu_hi = fl32(mu), mu_lo = fl32(mu − mu_hi));
    "float64" as the float64 route, (x − mu)·rstd·w in float64 rounded to float32."""
    m, n = x.shape
    x3 = K._bits(x.reshape(1, m, n))
    y32 = np.empty((m, n), np.float32)
    for r in range(m):
        mu, rstd = K._ln_stats(K._sum_lanes(x3, 0, r), x3, 0, r, eps)
        if route == "float64":
            y32[r] = (x[r].astype(np.float64) - mu) * rstd * w.astype(np.float64)
            continue
        mu_hi = np.float32(mu)
        mu_lo = np.float32(mu - np.float64(mu_hi))
        with np.errstate(under="ignore"):
            d = (x[r].astype(np.float32) - mu_hi) - mu_lo
            y32[r] = d * np.float32(rstd) * w.astype(np.float32)
    return y32


@pytest.mark.parametrize("x_dtype, y_dtype", [
    pytest.param(BF16, BF16, id="bfloat16"),
    pytest.param(np.dtype(np.float16), np.dtype(np.float16), id="float16",
                 marks=pytest.mark.slow),  # kernels of their own: the default run's budget
    pytest.param(np.dtype(np.float32), BF16, id="float32-x-bfloat16-y", marks=pytest.mark.slow),
])
def test_layer_norm_y_without_a_bias_is_its_float32_route(rng, x_dtype, y_dtype):
    """A half LayerNorm y without a bias is computed in float32 arithmetic (``_ln_y32``): bit
    for bit the NumPy float32 emulation rounded once to the half type, on rows of mean 0.3
    and 100 (where x − mu cancels: mu's second part matters), with no row flagged; and that
    emulation is not the float64 route's y (rounded through float32), which differs from it
    in some elements of these rows, so the test tells the two routes apart. (The float64
    route in NumPy, not the kernel's: a kernel of its own to compile, for the default run's
    budget.)"""
    m, n = 256, 4096
    x = (rng.standard_normal((m, n)) + np.where(np.arange(m) % 2, 100.0, 0.3)[:, None])
    x = x.astype(np.float32).astype(x_dtype)
    w = rng.uniform(0.5, 1.5, n).astype(y_dtype)
    eps = 1e-5
    got = K.layer_norm_forward(x, n, w, eps=eps, out_dtype=y_dtype)[0].view(np.uint16)
    want = _ln_y_numpy(x, w, eps, "float32").astype(y_dtype).view(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} elements differ from the float32 route, first {bad[0]}"
    y, flagged = _ln_fwd_direct(x, w, eps, y_dtype)
    assert flagged == [] and np.array_equal(y, got)
    y64 = _ln_y_numpy(x, w, eps, "float64").astype(y_dtype).view(np.uint16)
    assert (y64 != got).any()


def test_a_subnormal_layer_norm_y_without_a_bias_has_the_float32_routes_bits(rng):
    """Subnormal bfloat16 y on the float32 route (weights of 2^-130 in every seventh column):
    into a C-contiguous y, which the CPU rounds where it can (a flushed y flags its row,
    written again by the loop's own route, element by element), and into a strided one
    (element by element throughout), y has the NumPy float32 emulation's bits, so no bit
    depends on the CPU. Every row is flagged where the CPU rounds, and the float64 route
    differs from the float32 one in some of their normal elements, so a row written again
    by the wrong route would show."""
    m, n = 256, 4096
    x = (rng.standard_normal((m, n)) + np.where(np.arange(m) % 2, 100.0, 0.3)[:, None])
    x = x.astype(np.float32).astype(BF16)
    w = rng.uniform(0.5, 1.5, n).astype(BF16)
    w[::7] = 2.0**-130
    want = _ln_y_numpy(x, w, 1e-5, "float32").astype(BF16).view(np.uint16)
    assert (np.abs(want.view(BF16).astype(np.float32)[:, ::7]) < 2.0**-126).all()
    y64 = _ln_y_numpy(x, w, 1e-5, "float64").astype(BF16).view(np.uint16)
    assert (y64 != want)[:, np.arange(n) % 7 != 0].any()  # normal elements
    if hb.BF16_HW_FLUSHED:  # the CPU rounds: every row is flagged, then written again
        assert _ln_fwd_direct(x, w, 1e-5, BF16)[1] == list(range(m))
    strided = np.empty((m, 2 * n), BF16)[:, ::2]
    for out in (np.empty((m, n), BF16), strided):
        got = K.layer_norm_forward(x, n, w, out=out)[0].view(np.uint16)
        bad = np.argwhere(got != want)
        assert bad.size == 0, f"{len(bad)} elements differ, first at {tuple(bad[0])}"


def _add_y_numpy(x, res, w, rstd, rounding, route):
    """The fused add's y in NumPy, h = x + res exactly (float64), rounded to x's type first
    for the rounded sum: ``route`` "float32", fl32(h)·rstd·w in float32 arithmetic (``rstd``
    the saved float32 one); "float64", h·rstd·w in float64 (``rstd`` float64) rounded to
    float32."""
    h = x.astype(np.float64) + res.astype(np.float64)
    if rounding == "rounded-sum":
        h = h.astype(x.dtype).astype(np.float64)
    if route == "float64":
        return (h * rstd * w.astype(np.float64)).astype(np.float32)
    with np.errstate(under="ignore"):
        return (h.astype(np.float32) * rstd.astype(np.float32)) * w.astype(np.float32)


@pytest.mark.parametrize("rounding", [
    "fp32-sum",
    pytest.param("rounded-sum", marks=pytest.mark.slow),  # kernels of their own (budget)
])
@pytest.mark.parametrize("dtype, tiny", [
    pytest.param(BF16, False, id="bfloat16"),
    pytest.param(BF16, True, id="bfloat16-subnormal-y"),
    pytest.param(np.dtype(np.float16), False, id="float16", marks=pytest.mark.slow),
])
def test_the_fused_add_y_is_its_float32_route(rng, dtype, tiny, rounding):
    """The fused add's half y (x and the residual of its format) is computed in float32
    arithmetic, fl(fl(fl32(h)·fl(rstd))·w): bit for bit the NumPy emulation rounded once to
    the half type, also where y is subnormal (weights of 2^-130 in every seventh column:
    where the CPU rounds, every row is flagged and written again by the same route), with no
    row flagged for the float64 route; and the float64 route's y (in NumPy, with NumPy's
    float64 rstd: a kernel of its own to compile otherwise) differs from it in some elements,
    so the test tells the two apart (and would tell a row written again by the wrong
    one)."""
    m, n = 256, 4096
    x = rng.standard_normal((m, n)).astype(dtype)
    res = rng.standard_normal((m, n)).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    if tiny:
        w[::7] = 2.0**-130
    y, _, rstd = K.add_rms_norm_forward(x, res, n, w, 1e-6, rounding=rounding)
    want = _add_y_numpy(x, res, w, rstd, rounding, "float32").astype(dtype).view(np.uint16)
    bad = np.argwhere(y.view(np.uint16) != want)
    assert bad.size == 0, f"{len(bad)} elements differ, first at {tuple(bad[0])}"
    h = x.astype(np.float64) + res.astype(np.float64)
    if rounding == "rounded-sum":
        h = h.astype(dtype).astype(np.float64)
    rstd64 = 1.0 / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + 1e-6)
    y64 = _add_y_numpy(x, res, w, rstd64, rounding, "float64").astype(dtype).view(np.uint16)
    assert (y64 != want)[:, np.arange(n) % 7 != 0].any()  # normal elements
    # the library's own compilation, called directly: no row flagged for the float64 route
    x3, r3 = K._bits(x.reshape(1, m, n)), K._bits(res.reshape(1, m, n))
    y3, res3 = np.empty_like(x3), np.empty_like(x3)
    w64 = w.astype(np.float64)
    ww = K._add_f32_weight(w64, x3, r3, y3)
    assert ww is not None
    rstd3, redo = np.empty(m, np.float32), np.zeros(m, np.uint8)
    like = K._rounding_tag(x3) if rounding == "rounded-sum" else None
    K._add_rms_fwd(x3, r3, like, w64, ww, 1e-6, y3, res3, rstd3, redo,
                   K._add_by_cpu(x3, r3, y3, res3), 0, -(-m // K.ROWS_PER_BLOCK))
    assert not (redo & (K.REDO_Y | K.REDO_RSTD)).any()
    assert (redo != 0).all() if tiny and hb.BF16_HW_FLUSHED else not redo.any()


def test_the_float32_y_routes_are_taken_where_they_keep_the_contract():
    """``_ln_f32_weight`` (the route, a type): a half y of half or float32 x without a bias;
    not with a bias, for float64 x, or for a float32 y. ``_add_f32_weight``: x, the residual
    and y of one half format."""
    w = np.ones(8)
    half = {d: np.zeros((1, 1, 8), b) for d, b in (("bf16", hb.BF16_BITS), ("f16", hb.F16_BITS))}
    f32, f64 = np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 8))
    for x3 in (half["bf16"], half["f16"], f32):
        assert K._ln_f32_weight(w, False, x3, half["bf16"]).dtype == np.float32
        assert K._ln_f32_weight(w, True, x3, half["bf16"]) is None
    assert K._ln_f32_weight(w, False, f64, half["bf16"]) is None
    assert K._ln_f32_weight(w, False, half["bf16"], f32) is None
    # the fused add: x, the residual and y of one half format only (a float16 x beside a
    # float32 residual could give an h far below 2^-24, whose h·rstd no test would watch)
    for h in half.values():
        assert K._add_f32_weight(w, h, h, h).dtype == np.float32
    assert K._add_f32_weight(w, half["f16"], f32, half["bf16"]) is None
    assert K._add_f32_weight(w, half["f16"], half["f16"], half["bf16"]) is None
    assert K._add_f32_weight(w, f32, f32, f32) is None


def test_the_float32_layer_norm_y_sends_rows_it_cannot_carry_to_float64():
    """Rows the float32 y would get wrong are flagged (``_mu_parts``) and written in float64,
    so they keep the contract: 64 rows of 256, bfloat16 x of mean 0 exactly in rows 5 and 6
    (d = x then, of any size) and a float32-x row whose mean is a float32 subnormal plus a part
    no float32 holds (a bfloat16 y). In row 6 an x_j = ±2^-133 beside values ±2^20 gives
    x_j·rstd ~ 2^-153, which float32 rounds to 0, and a weight of 2^30 makes y_j a normal
    bfloat16: the float32 formula is far off there. Every other row is taken."""
    rng = np.random.default_rng(5)
    m, n = 64, 256
    x = rng.standard_normal((m, n)).astype(BF16)
    w = rng.uniform(0.5, 1.5, n).astype(BF16)
    x[5] = _zero_mean_rows(rng, 1, n, [])[0]
    x[6, 0::2], x[6, 1::2] = 2.0**20, -(2.0**20)
    x[6, :2] = 2.0**-133, -(2.0**-133)
    w[0] = 2.0**30
    y, flagged = _ln_fwd_direct(x, w, 1e-5, BF16)
    assert flagged == [5, 6]
    want = rmsref.layer_norm(x, n, w)
    naive = _ln_y_numpy(x[6:7], w, 1e-5, "float32").astype(BF16)
    assert abs(int(naive.view(np.int16)[0, 0]) - int(want.view(np.int16)[6, 0])) > 1
    _contract("layer_norm y", K.layer_norm(x, n, w), want, BF16)
    # float32 x: mean a + δ/3, a = 2^-140, δ = 2^-149: mu_lo rounds to 0 and δ/3 is lost;
    # eps = 2^-200 keeps rstd near 2^100, so y of x = a is the normal −(δ/3)·rstd·w, not 0
    xf = np.full((1, 3), 2.0**-140, np.float32)
    xf[0, 2] += np.float32(2.0**-149)
    wf = np.ones(3, BF16)
    _, flagged = _ln_fwd_direct(xf, wf, 2.0**-200, BF16)
    assert flagged == [0]
    got = K.layer_norm_forward(xf, 3, wf, eps=2.0**-200, out_dtype=BF16)[0]
    want = rmsref.layer_norm_forward(xf, 3, wf, eps=2.0**-200, out_dtype=BF16)[0]
    assert want.astype(np.float32)[0, 0] < 0
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_pipelined_backward_equals_exact_path(rng, dtype):
    """dx of the pipelined backward (saved rstd, a weight, no bias) equals, bit for bit, dx of
    the path that also returns dbias (v3: the same operations, one row at a time), and so do
    dweight's bits, with rows whose dx is subnormal, overflows (|dy| a quarter of the largest
    value, times weights up to ~12) or is NaN among ordinary rows. Both take the float32 dx
    route in both kernels (``_f32_weight``: a weight in the half format); for bfloat16 those
    rows also put their parts' dweight outside ``_gx_exact``'s bound, so the pipelined kernel
    sums those parts again. N = 192: three 64-element blocks, so the kernel compiled without
    the loop over a row's tail (``numba_cpu._tail``); then N = 200, the one compiled with it
    (a tail of 8)."""
    m, n = 150, 192
    big, tiny = float(ml_dtypes.finfo(dtype).max) / 4, float(ml_dtypes.finfo(dtype).tiny)
    x = rng.standard_normal((m, n)).astype(dtype)
    dy = rng.standard_normal((m, n))
    dy[5] *= tiny / 8  # dx below the normal range (bfloat16 1e-39, float16 1e-5)
    dy[70] = np.sign(dy[70]) * big
    dy[100, 3] = np.nan
    dy = dy.astype(dtype)
    w = (rng.standard_normal(n) * 4).astype(dtype)
    route = K._f32_weight(K._bits(dy), K._bits(x), K._bits(x), w.astype(np.float64))
    assert route is not None
    _, rstd = K.rms_norm_forward(x, n, w)
    fast = K.rms_norm_backward(dy, x, n, w, rstd=rstd)
    exact = K.rms_norm_backward(dy, x, n, w, rstd=rstd, bias=w)
    got, want = fast.dx.view(np.uint16), exact.dx.view(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} dx elements differ, first at {tuple(bad[0])}"
    np.testing.assert_array_equal(fast.dweight.view(np.uint16), exact.dweight.view(np.uint16))
    # the same weight values in float32: dweight comes out in float32, where a term's last
    # bits are not rounded away (and dx still takes the float32 route)
    w32 = w.astype(np.float32)
    fast32 = K.rms_norm_backward(dy, x, n, w32, rstd=rstd)
    exact32 = K.rms_norm_backward(dy, x, n, w32, rstd=rstd, bias=w32)
    np.testing.assert_array_equal(fast32.dx.view(np.uint16), fast.dx.view(np.uint16))
    np.testing.assert_array_equal(fast32.dweight.view(np.uint32),
                                  exact32.dweight.view(np.uint32))
    dx = fast.dx.astype(np.float32)
    assert np.isnan(dx[100]).all() and np.isinf(dx[70]).any()
    assert ((dx[5] != 0) & (np.abs(dx[5]) < tiny)).any()
    # a row length that is not a multiple of 64 (ordinary rows): the tail loop, v3's bits
    x, dy = (rng.standard_normal((m, 200)).astype(dtype) for _ in range(2))
    w = (rng.standard_normal(200) * 4).astype(dtype)
    _, rstd = K.rms_norm_forward(x, 200, w)
    fast = K.rms_norm_backward(dy, x, 200, w, rstd=rstd)
    exact = K.rms_norm_backward(dy, x, 200, w, rstd=rstd, bias=w)
    np.testing.assert_array_equal(fast.dx.view(np.uint16), exact.dx.view(np.uint16))


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bfloat16", "float16"])
def test_the_float32_dx_route_is_taken_only_where_it_is_exact(dtype):
    """``_f32_weight``: dy, x and dx of one half format with a weight of at most 13
    significant bits (float16; bfloat16: 16) within 2^+-100 (a weight of that format, 0
    included) take the float32 dx; a weight with one bit more, one outside the range, inf or
    NaN, mixed formats and float32 rows do not. ``_f32_dx_row``: a row whose rstd (0 and NaN
    included) or nonzero scaled |rstd·c| (NaN included) leaves 2^+-100 does not; rstd·c = ±0
    (a row of dy = 0) does."""
    n = 8
    bits = 13 if dtype == np.float16 else 16
    h = K._bits(np.zeros((1, 2, n), dtype))
    half_w = np.linspace(-3, 3, n).astype(dtype).astype(np.float64)
    half_w[2] = 0.0
    w32 = K._f32_weight(h, h, h, half_w)
    assert w32 is not None and w32.dtype == np.float32 and np.array_equal(w32, half_w)
    assert K._f32_weight(h, h, h, np.full(n, 1.0 + 2.0**-(bits - 1))) is not None
    for w in (np.full(n, 1.0 + 2.0**-bits), 1.0 + np.full(n, 2.0**-30), np.full(n, 2.0**-101),
              np.full(n, 2.0**101), np.full(n, np.inf), np.full(n, np.nan)):
        assert K._f32_weight(h, h, h, w) is None, w[0]
    f32 = np.zeros((1, 2, n), np.float32)
    other = K._bits(np.zeros((1, 2, n), BF16 if dtype == np.float16 else np.float16))
    for dy3, x3, dx3 in ((f32, h, h), (other, h, h), (h, h, other), (h, other, h),
                         (f32, f32, f32)):
        assert K._f32_weight(dy3, x3, dx3, half_w) is None, (dy3.dtype, x3.dtype, dx3.dtype)
    assert K._f32_dx_row(1.0, 0.5) and K._f32_dx_row(2.0**100, 2.0**-100)
    assert K._f32_dx_row(2.0**-100, -(2.0**100))
    assert K._f32_dx_row(1.0, 0.0) and K._f32_dx_row(2.0**100, -0.0)
    for rstd, rc in ((2.0**101, 1.0), (2.0**-101, 1.0), (1.0, 2.0**101), (1.0, 2.0**-101),
                     (1.0, 2.0**-1074), (0.0, 0.0), (np.nan, 1.0), (1.0, np.nan),
                     (1.0, np.inf)):
        assert not K._f32_dx_row(rstd, rc), (rstd, rc)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bfloat16", "float16"])
def test_the_float32_dx_scales_a_bfloat16_row_by_its_rstd(dtype):
    """``_dx_scale``: (2^e, rstd·2^-e, rstd·c·2^e), e the binary exponent of rstd (rstd·2^-e in
    [1/2, 1)) for a bfloat16 dx, kept within [0, 100]; e = 0 for float16 (its bits as
    unscaled)."""
    dx3 = K._bits(np.zeros((1, 1, 1), dtype))
    for rstd, e in ((3.0, 2), (1.0, 1), (0.99, 0), (2.0**-60, 0), (2.0**99 * 1.5, 100),
                    (2.0**300, 100)):
        e = e if dtype == BF16 else 0
        gs, rs, rc = K._dx_scale(rstd, 0.375, dx3)
        assert (gs, rs, rc) == (2.0**e, rstd * 2.0**-e, rstd * 0.375 * 2.0**e), (rstd, e)


@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("kind", ["dy = y", "dy = y + 1% noise"])
def test_the_float32_dx_keeps_the_contract_where_its_terms_cancel(rng, kind, dtype):
    """dy along y = xhat·w is the direction whose dx cancels: with w = 1 and dy = y, dx = 0 in
    exact arithmetic, so the float32 value is all cancellation (g·w against x·rstd·c). A plain
    float32 dx left 2.8 % of float16 elements more than an ulp off there (13 % of bfloat16
    ones; bench/results/halfbwd.md); the compensated one (``_dxhat_minus_proj``) keeps the
    contract, through the pipelined kernel and v3 (the path that also returns dbias) alike,
    with a weight of ones and a weight in the half format.
    N = 1000 puts 40 elements of each row in the pipelined row's tail loop."""
    m, n = 64, 1000
    x = rng.standard_normal((m, n)).astype(dtype)
    for w in (np.ones(n, dtype), (1 + 0.1 * rng.standard_normal(n)).astype(dtype)):
        y, rstd = K.rms_norm_forward(x, n, w)
        dy = y.astype(np.float64)
        if kind != "dy = y":
            dy = dy + 0.01 * rng.standard_normal((m, n))
        dy = dy.astype(dtype)
        route = K._f32_weight(K._bits(dy), K._bits(x), K._bits(x), w.astype(np.float64))
        assert route is not None
        want = rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd).dx
        for bias in (None, w):
            got = K.rms_norm_backward(dy, x, n, w, rstd=rstd, bias=bias).dx
            _contract(f"dx, bias={bias is not None}", got, want, dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_the_float32_dx_keeps_the_sign_of_a_zero(rng, dtype):
    """Where dy_j = x_j = 0 (either sign) dx_j is a zero whose sign the oracle's arithmetic
    decides (g·w − xhat·c, then ·rstd); the float32 route gives the same sign in every
    kernel: its rstd·c is split so that both parts share its sign (``_split32``). With the
    high part rounded to nearest, the low part's other sign turned a −0 into +0 in about one
    such element in eight."""
    m, n = 64, 256
    x, dy = rng.standard_normal((m, n)), rng.standard_normal((m, n))
    zero = rng.random((m, n)) < 0.2
    x[zero] = np.copysign(0.0, rng.standard_normal(zero.sum()))
    dy[zero] = np.copysign(0.0, rng.standard_normal(zero.sum()))
    x, dy, w = x.astype(dtype), dy.astype(dtype), rng.standard_normal(n).astype(dtype)
    _, rstd = K.rms_norm_forward(x, n, w)
    want = rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd).dx.view(np.uint16)
    assert (want[zero] == 0x8000).any() and (want[zero] == 0).any()  # both signs occur
    for bias in (None, w):
        got = K.rms_norm_backward(dy, x, n, w, rstd=rstd, bias=bias).dx.view(np.uint16)
        flipped = np.count_nonzero(got[zero] != want[zero])
        assert flipped == 0, f"{flipped} of {zero.sum()} zeros differ (bias={bias is not None})"


@pytest.mark.parametrize("size", ["tiny", "small", "huge"])
def test_bfloat16_rows_far_from_1_keep_the_contract(rng, size):
    """bfloat16 has float32's exponent range, so its float32 dx route meets values that
    float16's never does, while dx (and dweight) stay ordinary values:

    - "tiny": x ~ 2^-99 (rstd ~ 2^99), w = 2^-24, dy ~ 2^-120: unscaled, g·w − x·rstd·c
      (near 2^-144) would fall below float32's normal range and lose bits that rstd makes
      part of dx (``_dx_scale`` scales it by 2^e ~ rstd); dy·x (near 2^-219) underflows
      float32 to 0;
    - "small": x ~ 2^-70 (rstd ~ 2^70), w = 1, dy ~ 2^-70: dy·x (near 2^-140) is a float32
      subnormal with half its bits lost, and so would be the next row's Σ dxhat·x taken from
      it, which stays within [SS_LO, SS_HI]: ``_gx_exact`` flags the row, written again;
    - "huge": x ~ 2^70 (rstd ~ 2^-70), w = 2^20, dy ~ 2^60: dy·x (near 2^130) overflows
      float32.

    In all, the float32 dy·x would give a wrong dweight term, so ``_gx_exact`` sends the
    parts to ``_rms_bwd_dweight_again``. dx keeps the contract and dweight is within one ulp
    of the oracle's, with the same bits in both kernels (v3, taken with a bias, sums
    float64 products)."""
    m, n = 40, 256
    sx, sdy, sw = {"tiny": (-99, -120, -24), "small": (-70, -70, 0), "huge": (70, 60, 20)}[size]
    x = (rng.standard_normal((m, n)) * 2.0**sx).astype(BF16)
    dy = (rng.standard_normal((m, n)) * 2.0**sdy).astype(BF16)
    w = np.full(n, 2.0**sw).astype(BF16)
    assert K._f32_weight(K._bits(dy), K._bits(x), K._bits(x), w.astype(np.float64)) is not None
    _, rstd = K.rms_norm_forward(x, n, w, eps=0.0)
    want = rmsref.rms_norm_backward(dy, x, n, w, eps=0.0, rstd=rstd)
    assert (np.abs(want.dx.astype(np.float64)) > 2.0**-126).mean() > 0.9  # ordinary values
    want_dw = want.dweight.astype(np.float64)
    assert (np.abs(want_dw) > 2.0**-126).all() and np.isfinite(want_dw).all()
    dweights = []
    for bias in (None, w):
        got = K.rms_norm_backward(dy, x, n, w, eps=0.0, rstd=rstd, bias=bias)
        _contract(f"dx, bias={bias is not None}", got.dx, want.dx, BF16)
        err = np.abs(got.dweight.astype(np.float64) - want_dw)
        assert (err <= tolerance.ulp(want_dw, BF16)).all(), f"dweight, bias={bias is not None}"
        dweights.append(got.dweight.view(np.uint16))
    np.testing.assert_array_equal(*dweights)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=["bfloat16", "float32"])
def test_a_saved_rstd_of_inf_gives_the_oracles_row(rng, dtype):
    """A bfloat16 row of x = 2^-128 (and one 0) with eps = 0 has rstd = 2^128, which the saved
    float32 rstd holds as inf (as torch saves it; for float32 the test writes the inf in).
    Given it, every xhat of the row is inf or NaN and the oracle's c = Σ dxhat·xhat/N is NaN,
    so its dx row is NaN; the kernels' c from s·rstd/N would be ±inf and their dx ±inf
    (``_factored``). dx and dweight as the oracle's (NaN where it is, the same values
    elsewhere; dweight ±inf in columns where the row's terms are): the pipelined backward,
    the general one (a bias), and the fused add's."""
    m, n = 70, 128
    x = rng.standard_normal((m, n)).astype(dtype)
    x[5], x[5, 3] = 2.0**-128, 0.0
    dy = rng.standard_normal((m, n)).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    rstd = K.rms_norm_forward(x, n, w, eps=0.0)[1]
    if dtype == BF16:
        assert np.isinf(rstd.ravel()[5])
    rstd.ravel()[5] = np.inf
    with np.errstate(all="ignore"):
        want = rmsref.rms_norm_backward(dy, x, n, w, eps=0.0, rstd=rstd)
        assert np.isnan(want.dx[5].astype(np.float32)).all()
        assert np.isinf(want.dweight.astype(np.float32)).sum() > n // 2
        for bias in (None, np.zeros(n, dtype)):
            got = K.rms_norm_backward(dy, x, n, w, eps=0.0, rstd=rstd, bias=bias)
            np.testing.assert_array_equal(got.dx.astype(np.float32), want.dx.astype(np.float32))
            np.testing.assert_array_equal(got.dweight.astype(np.float32),
                                          want.dweight.astype(np.float32))
        r = rng.standard_normal((m, n)).astype(dtype)
        r[5] = 0.0  # h = x in row 5; the other rows' saved rstd need not be theirs
        want = rmsref.add_rms_norm_backward(dy, None, x, r, n, w, eps=0.0, rstd=rstd)
        got = K.add_rms_norm_backward(dy, None, x, r, n, w, eps=0.0, rstd=rstd)
        assert np.isnan(want.dx[5].astype(np.float32)).all()
        np.testing.assert_array_equal(got.dx.astype(np.float32), want.dx.astype(np.float32))
        np.testing.assert_array_equal(got.dweight.astype(np.float32),
                                      want.dweight.astype(np.float32))


@pytest.mark.slow  # kernels for strided rows of their own: the default run's budget
def test_a_strided_bfloat16_backward_has_the_contiguous_bits(rng):
    """dy and x as strided views (every other column) take the float32 dx route as contiguous
    ones do, with the row bound's keys read element by element (``_halfbits.emit_block_keys``
    reads contiguous rows as vectors): dx and dweight have the contiguous call's bits. Column
    10 holds dy and x near 2^-70, whose float32 products (near 2^-140) lose bits, so every
    part's dweight is summed again; a float32 weight (of bfloat16 values) gives dweight in
    float32, where a lost bit would show: it is within an ulp of the oracle's."""
    m, n = 130, 256
    xs = rng.standard_normal((m, 2 * n)).astype(BF16)
    dys = rng.standard_normal((m, 2 * n)).astype(BF16)
    w = rng.standard_normal(n).astype(BF16).astype(np.float32)
    xs[:, 20] = (rng.standard_normal(m) * 2.0**-70).astype(BF16)  # column 10 of the views
    dys[:, 20] = (rng.standard_normal(m) * 2.0**-70).astype(BF16)
    x, dy = xs[:, ::2], dys[:, ::2]
    xc, dyc = np.ascontiguousarray(x), np.ascontiguousarray(dy)
    assert K._f32_weight(K._bits(dy), K._bits(x), K._bits(x), w.astype(np.float64)) is not None
    _, rstd = K.rms_norm_forward(xc, n, w)
    strided = K.rms_norm_backward(dy, x, n, w, rstd=rstd)
    contiguous = K.rms_norm_backward(dyc, xc, n, w, rstd=rstd)
    np.testing.assert_array_equal(strided.dx.view(np.uint16), contiguous.dx.view(np.uint16))
    np.testing.assert_array_equal(strided.dweight, contiguous.dweight)
    want = rmsref.rms_norm_backward(dyc, xc, n, w, rstd=rstd).dweight.astype(np.float64)
    err = np.abs(strided.dweight.astype(np.float64) - want)
    assert (err <= tolerance.ulp(want, np.float32)).all(), "dweight"


@pytest.mark.skipif(not hb.BF16_HW_FLUSHED, reason="the CPU Numba compiles for has no "
                    "AVX512-BF16 and AVX512-DQ: the backward keeps the integer bfloat16 rounding")
def test_the_flagged_block_store_flags_exactly_the_subnormal_lanes():
    """``store_lanes_flushed`` stores ``store_lanes``'s bits and returns True exactly where a
    lane is a nonzero float32 subnormal (of either sign, in any of the four vectors), which
    the CPU's rounding flushes to zero: not for ±0, the smallest normal values, inf or NaN."""
    from numba import njit

    @njit
    def both(lanes, a3, b3):
        hb.store_lanes(lanes, a3, (0, 0, 0))
        return hb.store_lanes_flushed(lanes, b3, (0, 0, 0))

    base = np.linspace(-3.0, 3.0, 64).astype(np.float32)
    quiet = [0.0, -0.0, 2.0**-126, -(2.0**-126), np.inf, -np.inf, np.nan]
    for lane in (0, 17, 40, 63):
        for value, flagged in [(v, False) for v in quiet] + [(2.0**-127, True),
                                                             (-(2.0**-149), True)]:
            lanes = base.copy()
            lanes[lane] = value
            a3, b3 = np.empty((1, 1, 64), np.int16), np.empty((1, 1, 64), np.int16)
            assert both(lanes, a3, b3) == flagged, (lane, value)
            np.testing.assert_array_equal(a3, b3)


def test_the_backward_routes_a_bfloat16_dx_by_the_cpu_and_the_layout():
    """``_bf16_by_cpu`` gives True (the CPU's block rounding) only for a C-contiguous bfloat16
    dx on a CPU with AVX512-BF16 and AVX512-DQ; a strided bfloat16 dx and a float16 one get
    None (the integer rounding of each element)."""
    dx3 = K._bits(np.zeros((1, 2, 64), BF16))
    assert K._bf16_by_cpu(dx3) is (True if hb.BF16_HW_FLUSHED else None)
    assert K._bf16_by_cpu(K._bits(np.zeros((1, 2, 128), BF16))[:, :, ::2]) is None
    assert K._bf16_by_cpu(K._bits(np.zeros((1, 2, 64), np.float16))) is None


@pytest.mark.parametrize("tiny_by", ["dy", "weight"])
def test_a_subnormal_bfloat16_dx_keeps_its_bits(rng, tiny_by):
    """A dx whose float32 value is subnormal (x_j = 0, so dx_j = rstd·dy_j·w_j) is not
    flushed to zero by the CPU's rounding: its row is written again, with the integer
    rounding's bits, which a strided ``out`` (element by element) gives too, and which equal
    the oracle's. In rows of 200 (three blocks and a tail): in a block's first and last
    element, and in the tail (no block store there); a dx of exactly 0 (dy_j = x_j = 0) is
    not flagged. Two ways to a subnormal dx: a subnormal dy_j (2^-130), whose row also leaves
    ``_gx_exact``'s bound (a g·x may underflow), so the loop flags it on every CPU; and a
    normal dy_j (2^-58) times a weight of 2^-70 in that column, which only the CPU's rounding
    (``store_lanes_flushed``) can flag, so rows are flagged only where it rounds."""
    m, n = 70, 200
    x = rng.standard_normal((m, n)).astype(BF16)
    dy = rng.standard_normal((m, n)).astype(BF16)
    w = rng.uniform(0.5, 1.5, n).astype(BF16)
    cells = ((3, 0), (3, 127), (40, 63), (69, 199))
    for r, j in cells:
        x[r, j] = 0.0
        sign = 1 if j % 2 else -1
        if tiny_by == "dy":
            dy[r, j] = 2.0**-130 * sign
        else:
            dy[r, j], w[j] = 2.0**-58 * sign, 2.0**-70
    x[10, 60:70], dy[10, 60:70] = 0.0, 0.0  # dx_j = 0 exactly
    _, rstd = K.rms_norm_forward(x, n, w)
    got = K.rms_norm_backward(dy, x, n, w, rstd=rstd)
    want = rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd)
    np.testing.assert_array_equal(got.dx.view(np.uint16), want.dx.view(np.uint16))
    tiny = np.abs(got.dx.astype(np.float32)[tuple(np.transpose(cells))])
    assert ((tiny > 0) & (tiny < 2.0**-126)).all()  # subnormal, not flushed
    out = np.empty((m, 2 * n), BF16)[:, ::2]
    K.rms_norm_backward(dy, x, n, w, rstd=rstd, out=out)
    np.testing.assert_array_equal(out.view(np.uint16), got.dx.view(np.uint16))
    g3, x3 = K._bits(dy.reshape(1, m, n)), K._bits(x.reshape(1, m, n))
    dx3 = np.empty_like(x3)
    w64 = w.astype(np.float64)
    w32 = K._f32_weight(g3, x3, dx3, w64)
    assert w32 is not None  # the float32 route, whose store the test is about
    parts = np.empty((-(-m // K.ROWS_PER_PART), n))
    redo, redo_dw = np.empty(m, np.bool_), np.empty(parts.shape[0], np.bool_)
    K._rms_bwd_pipelined(g3, x3, w64, w32, *K._bwd_route_types(x3, dx3, w32),
                         rstd.reshape(-1).astype(np.float64), dx3, parts, redo, redo_dw, 0,
                         parts.shape[0])
    # row 69's tiny dx is in the tail, which the integer rounding writes: never flagged
    flagged = [3, 40] if tiny_by == "dy" or hb.BF16_HW_FLUSHED else []
    assert list(np.flatnonzero(redo)) == flagged


def _zero_mean_rows(rng, m, n, zeros):
    """(m, n) bfloat16 rows of mean 0 exactly: ±v pairs, and 0 in the columns ``zeros``."""
    x = np.zeros((m, n), BF16)
    pairs = np.setdiff1d(np.arange(n), zeros)
    assert pairs.size % 2 == 0
    v = rng.uniform(0.5, 2.0, (m, pairs.size // 2)).astype(BF16)
    x[:, pairs[::2]], x[:, pairs[1::2]] = v, -v
    return x


def _flagged_rows(redo):
    return [int(r) for r in np.flatnonzero(redo)]


def _bf16_values(lo, hi):
    """The bfloat16 values whose bit patterns are lo, ..., hi − 1, as float64."""
    return np.arange(lo, hi, dtype=np.uint16).view(BF16).astype(np.float64)


def _two_roundings(v):
    """(twice, once, hits): the bfloat16 bits of float64 ``v`` rounded through float32 (the
    integer route: a float32 subnormal rounds first) and rounded once, and the indices where
    they differ with |v| below float32's normal range."""
    twice = v.astype(np.float32).astype(BF16).view(np.uint16)
    once = hb.encode(v.ravel(), hb.BF16_BITS).reshape(v.shape).view(np.uint16)
    return twice, once, np.argwhere((twice != once) & (np.abs(v) < 2.0**-126))


def _twice_rounded_case(f, ss0, n, eps):
    """(u, v, w0): bfloat16 values in [0.5, 1) and a bfloat16 subnormal w0 such that the y of
    a row with Σ of squares ss0 + 2u² + 2v² (exact in float64), y = (f·rstd)·w0 with
    rstd = 1/sqrt(ss/n + eps), is a float32 subnormal whose two roundings (``_two_roundings``)
    differ: a row where a y rewritten once-rounded would show."""
    grid, w0 = _bf16_values(0x3F00, 0x3F80), _bf16_values(1, 128)
    for u in grid:
        rstd = 1.0 / np.sqrt((ss0 + 2 * u * u + 2 * grid * grid) / n + eps)
        hits = _two_roundings((f * rstd)[:, None] * w0[None, :])[2]
        if hits.size:
            i, k = hits[0]
            return u, grid[i], w0[k]
    raise AssertionError("no value rounds differently twice and once")


def test_a_subnormal_bfloat16_layer_norm_y_keeps_its_bits(rng):
    """LayerNorm's bfloat16 y rounded by the CPU (``_bf16_by_cpu``): a y whose float32 value is
    subnormal (a weight of 2^-130 where x_j − mu is not 0) flags its row, which is written
    again with the integer rounding, so the row has the bits a strided ``out`` (element by
    element) gives. Rows of 200 (three blocks and a tail) of mean 0 exactly: y_j = 0 exactly
    where x_j = 0 (not flagged); x_j = 1 in a block's first element (row 3) or last (row 40)
    flags the row, in the tail (row 69) it does not (no block store there). Row 3's y_0 is
    one that rounded once (as the rows with an inf are written again) would differ."""
    m, n = 70, 200
    tiny_cols = [0, 127, 199]
    x = _zero_mean_rows(rng, m, n, tiny_cols + [50])
    for r, j in ((3, 0), (40, 127), (69, 199)):
        x[r, j], x[r, 50] = 1.0, -1.0  # the mean stays 0
    w = rng.uniform(0.5, 1.5, n).astype(BF16)
    w[tiny_cols] = 2.0**-130
    # row 3: y_0 = rstd·w_0 rounds differently twice (the integer route) and once
    pairs = np.setdiff1d(np.arange(n), tiny_cols + [50])
    x[3, pairs[::2]], x[3, pairs[1::2]] = 1.0, -1.0
    u, v, w[0] = _twice_rounded_case(1.0, 2.0 + 2.0 * (pairs.size // 2 - 2), n, 1e-5)
    x[3, pairs[:4]] = u, -u, v, -v
    b = np.zeros(n, BF16)
    got = K.layer_norm_forward(x, n, w, b)[0]
    out = np.empty((m, 2 * n), BF16)[:, ::2]
    K.layer_norm_forward(x, n, w, b, out=out)
    np.testing.assert_array_equal(got.view(np.uint16), out.view(np.uint16))
    tiny = np.abs(got.astype(np.float32)[[3, 40, 69], tiny_cols])
    assert ((tiny > 0) & (tiny < 2.0**-126)).all()  # subnormal, not flushed
    want = rmsref.layer_norm_forward(x, n, w, b)[0]  # rounded once
    assert got.view(np.uint16)[3, 0] != want.view(np.uint16)[3, 0]
    x3, y3 = K._bits(x.reshape(1, m, n)), np.empty((1, m, n), np.int16)
    mean, rstd, redo = np.empty(m, np.float32), np.empty(m, np.float32), np.empty(m, np.bool_)
    K._ln_fwd(x3, w.astype(np.float64), None, b.astype(np.float64), 1e-5, y3, mean, rstd, redo,
              K._bf16_by_cpu(y3), 0, -(-m // K.ROWS_PER_BLOCK))
    assert _flagged_rows(redo) == ([3, 40] if hb.BF16_HW_FLUSHED else [])


def _ln_dx_twice_rounded_case(x_row, mu, rstd, n):
    """(c, w_c, g, twice, once): a column c of the first three blocks, a bfloat16 weight in
    [0.5, 2) and a bfloat16 subnormal g such that the dx_c of a row of dy = 0 but for dy_c = g
    (so Σ dxhat = g·w_c and Σ dxhat·(x − mu) = g·w_c·(x_c − mu), as the kernel sums them,
    exactly) is a float32 subnormal whose two roundings differ; with their bits."""
    w_c = _bf16_values(0x3F00, 0x4000)[:, None]
    g = _bf16_values(1, 128)[None, :]
    gw = g * w_c  # exact
    for c in range(3 * 64):
        d = x_row[c] - mu
        c1, c2 = gw / n, (gw * d) * rstd / n  # (8)-(9)
        dx = rstd * (gw - c1 - (d * rstd) * c2)  # (10), as the kernel's ``_ln_dx``
        twice, once, hits = _two_roundings(dx)
        if hits.size:
            i, k = hits[0]
            return c, w_c[i, 0], g[0, k], twice[i, k], once[i, k]
    raise AssertionError("no dx rounds differently twice and once")


def test_a_subnormal_bfloat16_layer_norm_dx_keeps_its_bits(rng):
    """LayerNorm's bfloat16 dx rounded by the CPU: a row of dy = 0 but for one bfloat16
    subnormal (in a block's element: rows 3 and 40) has every float32 dx below float32's
    normal range, nonzero, and that element's a bfloat16 subnormal: the row is flagged and
    written again with the integer rounding (a strided ``out``'s bits; row 3's element is
    one whose two roundings differ, so a row rewritten once-rounded, as rows with an inf
    are, would show); a row of dy = 0 (dx = 0 exactly, row 10) and ordinary rows are not
    flagged."""
    m, n = 70, 200
    x = rng.standard_normal((m, n)).astype(BF16)
    dy = rng.standard_normal((m, n)).astype(BF16)
    w = rng.uniform(0.5, 1.5, n).astype(BF16)
    b = np.zeros(n, BF16)
    _, mean, rstd = K.layer_norm_forward(x, n, w, b)  # they do not depend on w
    mu3, rstd3 = np.float64(mean.reshape(-1)[3]), np.float64(rstd.reshape(-1)[3])
    c, w[c], g, twice, once = _ln_dx_twice_rounded_case(x[3].astype(np.float64), mu3, rstd3, n)
    dy[3], dy[40] = 0.0, 0.0
    dy[3, c], dy[40, 127] = g, 2.0**-130
    dy[10] = 0.0
    got = K.layer_norm_backward(dy, x, n, w, b, mean=mean, rstd=rstd)
    out = np.empty((m, 2 * n), BF16)[:, ::2]
    K.layer_norm_backward(dy, x, n, w, b, mean=mean, rstd=rstd, out=out)
    np.testing.assert_array_equal(got.dx.view(np.uint16), out.view(np.uint16))
    assert got.dx.view(np.uint16)[3, c] == twice != once
    tiny = np.abs(got.dx.astype(np.float32)[[3, 40], [c, 127]])
    assert ((tiny > 0) & (tiny < 2.0**-126)).all()  # subnormal, not flushed
    g3, x3 = K._bits(dy.reshape(1, m, n)), K._bits(x.reshape(1, m, n))
    dx3 = np.empty_like(x3)
    parts = np.empty((-(-m // K.ROWS_PER_PART), n))
    redo = np.empty(m, np.bool_)
    K._ln_bwd_pipelined(g3, x3, w.astype(np.float64), mean.reshape(-1).astype(np.float64),
                        rstd.reshape(-1).astype(np.float64), dx3, False, parts, parts, redo,
                        K._bf16_by_cpu(dx3), 0, parts.shape[0])
    assert _flagged_rows(redo) == ([3, 40] if hb.BF16_HW_FLUSHED else [])


def test_subnormal_bfloat16_fused_add_outputs_keep_their_bits(rng):
    """The fused add's bfloat16 y and new residual rounded by the CPU (``_add_by_cpu``): a y
    whose float32 value is subnormal (a weight of 2^-130 where h_j != 0: row 3) flags its row
    with ``REDO_Y_FLUSHED``, written again with the integer rounding (the bits of the loop
    that rounds element by element: ``hw`` None); a subnormal h (row 20, column 5, which
    also makes y_5 subnormal) flags it with ``REDO_RES`` too, and the new residual keeps the
    oracle's bits; its h·rstd, a float32 subnormal, flags ``REDO_Y`` (y rounded once). In
    the tail (row 69, column 199) neither is flagged. Row 3's y_0 is one that rounded once
    (as a ``REDO_Y`` row is written again) would differ."""
    m, n = 70, 200
    x = rng.standard_normal((m, n)).astype(BF16)
    res = (-x.astype(np.float32)).astype(BF16)  # h = 0 ...
    res[:, 1:199] = rng.standard_normal((m, 198)).astype(BF16)  # ... in columns 0 and 199
    w = rng.uniform(0.5, 1.5, n).astype(BF16)
    w[[0, 199]] = 2.0**-130
    x[3, 0], res[3, 0] = 0.5, 0.5
    x[69, 199], res[69, 199] = 1.0, 0.5
    # row 3: h = 1 in columns 0 ... 198 but for u, u, v, v; y_0 = rstd·w_0 rounds
    # differently twice (the integer route) and once
    x[3, 1:199], res[3, 1:199] = 1.0, 0.0
    u, v, w[0] = _twice_rounded_case(1.0, 195.0, n, 1e-6)
    x[3, 1:5] = u, u, v, v
    x[20, 5], res[20, 5] = 2.0**-125, -(2.0**-125 - 2.0**-130)  # h = 2^-130
    y, new_res, _ = K.add_rms_norm_forward(x, res, n, w, 1e-6)
    want_res = rmsref.add_rms_norm_forward(x, res, n, w, 1e-6)[1]
    np.testing.assert_array_equal(new_res.view(np.uint16), want_res.view(np.uint16))
    assert 0 < new_res[20, 5].astype(np.float32) < 2.0**-126
    tiny = np.abs(y.astype(np.float32)[[3, 20, 69], [0, 5, 199]])
    assert ((tiny > 0) & (tiny < 2.0**-126)).all()  # subnormal, not flushed
    want_y = rmsref.add_rms_norm_forward(x, res, n, w, 1e-6)[0]  # rounded once
    assert y.view(np.uint16)[3, 0] != want_y.view(np.uint16)[3, 0]
    x3, r3 = K._bits(x.reshape(1, m, n)), K._bits(res.reshape(1, m, n))
    w64 = w.astype(np.float64)
    ww = K._add_f32_weight(w64, x3, r3, x3)  # the library's route: y in float32
    assert ww is not None
    blocks = -(-m // K.ROWS_PER_BLOCK)
    for hw in (None, K._add_by_cpu(x3, r3, x3, r3)):
        y3, res3 = np.empty_like(x3), np.empty_like(x3)
        rstd, redo = np.empty(m, np.float32), np.zeros(m, np.uint8)
        K._add_rms_fwd(x3, r3, None, w64, ww, 1e-6, y3, res3, rstd, redo, hw, 0, blocks)
        if hw is not None:
            assert {int(r): int(redo[r]) for r in np.flatnonzero(redo)} == {
                3: K.REDO_Y_FLUSHED, 20: K.REDO_Y | K.REDO_Y_FLUSHED | K.REDO_RES}
        K._add_fwd_redo(x3, r3, None, w64, ww, 1e-6, y3, res3, rstd, redo, 0, m)
        np.testing.assert_array_equal(y3[0], y.view(np.int16))
        np.testing.assert_array_equal(res3[0], new_res.view(np.int16))


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_the_fused_backward_rows_written_again_have_the_general_bits(rng, monkeypatch, dtype):
    """The fused add's pipelined backward (a saved rstd) rounds dh through float32, a bfloat16
    block by the CPU where ``_add_by_cpu`` allows; a row with a subnormal dh (row 5, which
    the CPU's bfloat16 rounding flushes to zero), one that overflows (row 70) or a NaN (row
    100) is written again. dx, dresidual and dweight then have the bits of the general
    kernel, which rounds each element the integer way (the pipelined kernel kept out by
    ``_saved_rstd_in_range``), with and without a dresidual_out and with a row tail
    (N = 200); every element keeps the contract against the oracle."""
    m, n = 130, 200
    big, tiny = float(ml_dtypes.finfo(dtype).max) / 4, float(ml_dtypes.finfo(dtype).tiny)
    x, r, dro = (rng.standard_normal((m, n)).astype(dtype) for _ in range(3))
    dy = rng.standard_normal((m, n))
    dy[5] *= tiny / 8  # dh below the normal range (bfloat16 1e-39, float16 1e-5)
    dy[70] = np.sign(dy[70]) * big
    dy[100, 3] = np.nan
    dy = dy.astype(dtype)
    dro[5] = 0.0  # so that row 5's dh stays subnormal
    w = (rng.standard_normal(n) * 4).astype(dtype)
    *_, rstd = K.add_rms_norm_forward(x, r, n, w)
    fast = {d is None: K.add_rms_norm_backward(dy, d, x, r, n, w, rstd=rstd) for d in (dro, None)}
    monkeypatch.setattr(K, "_saved_rstd_in_range", lambda rstd: False)
    for no_dro, got in fast.items():
        d = None if no_dro else dro
        general = K.add_rms_norm_backward(dy, d, x, r, n, w, rstd=rstd)
        for name in ("dx", "dresidual", "dweight"):
            a, b = getattr(got, name).view(np.uint16), getattr(general, name).view(np.uint16)
            bad = np.argwhere(a != b)
            assert bad.size == 0, f"{name}: {len(bad)} elements differ, first at {tuple(bad[0])}"
        want = rmsref.add_rms_norm_backward(dy, d, x, r, n, w, rstd=rstd)
        with np.errstate(all="ignore"):
            _contract("dx", got.dx, want.dx, dtype)
            _contract("dresidual", got.dresidual, want.dresidual, dtype)
        dx = got.dx.astype(np.float32)
        assert np.isnan(dx[100]).all() and np.isinf(dx[70]).any()
        assert ((dx[5] != 0) & (np.abs(dx[5]) < tiny)).any()


def test_the_fused_add_rounds_by_the_cpu_only_for_bfloat16_throughout():
    """``_add_by_cpu``: True (on a CPU with AVX512-BF16 and -DQ) only where x, the residual
    and both C-contiguous outputs are bfloat16 (then ``sum_to`` takes the float32 route);
    a float16 or float32 residual, or a strided output, gets None."""
    b3 = K._bits(np.zeros((1, 2, 64), BF16))
    assert K._add_by_cpu(b3, b3, b3, b3) is (True if hb.BF16_HW_FLUSHED else None)
    f3 = K._bits(np.zeros((1, 2, 64), np.float16))
    assert K._add_by_cpu(b3, f3, b3, f3) is None
    assert K._add_by_cpu(b3, np.zeros((1, 2, 64), np.float32), b3, b3) is None
    strided = K._bits(np.zeros((1, 2, 128), BF16))[:, :, ::2]
    assert K._add_by_cpu(b3, b3, strided, b3) is None


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_the_pipelined_backward_flags_a_part_by_its_rows_magnitudes(rng, dtype):
    """``_rms_bwd_pipelined`` flags part p (``redo_dw[p]``) for its dweight to be summed again
    where a row of a bfloat16 part has a nonzero |dy| or |x| whose square leaves float32's
    normal range (``_gx_exact``), and no other part: not one of ordinary values, nor one with
    a row of zeros (a masked token's dy) or of values just inside the bound. float16 never
    flags a part (its products are always exact, and its values cannot reach the bound)."""
    n, per = 128, K.ROWS_PER_PART
    m = 6 * per
    x = rng.standard_normal((m, n)).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    dy[0 * per + 3] = 0.0  # part 0: a zero dy row
    if dtype == BF16:
        x[1 * per + 5, 7] = 2.0**-63  # part 1: just inside (its square is 2^-126)
        dy[1 * per + 9, 70] = -(2.0**63)  # and its square just below 2^128
        x[2 * per + 1, 9] = 2.0**-64  # part 2: one element too small
        dy[3 * per + 63, 100] = 2.0**64  # part 3: one too large, in the part's last row
        dy[4 * per, 5] = -(2.0**-70)  # part 4: one too small, in the part's first row
    flagged = [2, 3, 4] if dtype == BF16 else []
    w = rng.standard_normal(n).astype(dtype).astype(np.float64)
    g3, x3 = K._bits(dy.reshape(1, m, n)), K._bits(x.reshape(1, m, n))
    dx3 = np.empty_like(x3)
    w32 = K._f32_weight(g3, x3, dx3, w)
    assert w32 is not None
    rstd = 1.0 / np.sqrt(np.mean(np.square(x.astype(np.float64)), axis=1))
    parts = np.empty((m // per, n))
    redo, redo_dw = np.empty(m, np.bool_), np.empty(m // per, np.bool_)
    K._rms_bwd_pipelined(g3, x3, w, w32, None, None, None, rstd, dx3, parts, redo, redo_dw, 0,
                         m // per)
    assert list(np.flatnonzero(redo_dw)) == flagged


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_half_outputs_mostly_equal_the_oracle(rng, dtype):
    """At a realistic shape (256 x 4096, standard normal x, dy and weight) forward y and
    backward dx, and the fused add's dx and dresidual (a standard normal residual and
    dresidual_out: the training call), equal the oracle's (float64 rounded once) on >= 99.9 %
    of elements, the rest within one ulp of the output dtype (the module docstring's
    contract). The backwards get the forward's saved rstd, and so does the oracle: a dx
    cancelled far below its terms moves by more than an ulp between a float32 rstd and the
    float64 one the oracle would compute (one element of this data)."""
    m, n = 256, 4096
    x, dy, r, dro = (rng.standard_normal((m, n)).astype(dtype) for _ in range(4))
    w = rng.standard_normal(n).astype(dtype)
    y, rstd = K.rms_norm_forward(x, n, w)
    y_o, _ = rmsref.rms_norm_forward(x, n, w)
    dx = K.rms_norm_backward(dy, x, n, w, rstd=rstd).dx
    dx_o = rmsref.rms_norm_backward(dy, x, n, w, rstd=rstd).dx  # the same (float32) rstd
    *_, rstd_h = K.add_rms_norm_forward(x, r, n, w)
    ag = K.add_rms_norm_backward(dy, dro, x, r, n, w, rstd=rstd_h)
    ag_o = rmsref.add_rms_norm_backward(dy, dro, x, r, n, w, rstd=rstd_h)
    for what, got, want in (("y", y, y_o), ("dx", dx, dx_o), ("add_rms_norm dx", ag.dx, ag_o.dx),
                            ("add_rms_norm dresidual", ag.dresidual, ag_o.dresidual)):
        got64, want64 = got.astype(np.float64), want.astype(np.float64)
        equal = np.mean(got.view(np.uint16) == want.view(np.uint16))
        assert equal >= 0.999, f"{what}: only {equal:.4%} equal the oracle bit for bit"
        err = np.abs(got64 - want64)
        assert np.all(err <= tolerance.ulp(want64, dtype)), f"{what}: beyond one ulp"


def _every_pattern_rows(dtype: np.dtype, rng) -> np.ndarray:
    """Every finite bit pattern of ``dtype`` once, as rows of 256: first in random order (rows
    spanning the whole exponent range, where x·rstd of the small ones underflows), then sorted
    by magnitude (rows of similar values: rows of subnormals or of huge values, whose rstd is
    far outside [2^-100, 2^100] and takes the float64 route)."""
    v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    v = v[np.isfinite(v.astype(np.float32))]
    v = v[: v.size - v.size % 256]
    shuffled = rng.permutation(v)
    by_size = v[np.argsort(np.abs(v.astype(np.float64)), kind="stable")]
    return np.concatenate([shuffled, by_size]).reshape(-1, 256)


def _contract(what, got, want, dtype):
    """>= 99.9 % bit-equal to the oracle, the rest within one ulp (NaN: NaN in both)."""
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w64)
    assert np.array_equal(np.isnan(g64), nan), f"{what}: NaN where the oracle has none"
    equal = np.mean((got.view(np.uint16) == want.view(np.uint16)) | (nan & np.isnan(g64)))
    assert equal >= 0.999, f"{what}: only {equal:.4%} equal the oracle bit for bit"
    with np.errstate(invalid="ignore"):
        err = np.where(nan | (g64 == w64), 0.0, np.abs(g64 - w64))  # inf - inf: nan
        limit = tolerance.ulp(w64, dtype)
    bad = np.argwhere(~(err <= limit))
    assert bad.size == 0, (f"{what}: {len(bad)} elements beyond one ulp, first at "
                           f"{tuple(bad[0])}: got {g64[tuple(bad[0])]!r}, oracle "
                           f"{w64[tuple(bad[0])]!r}")
    return equal


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_every_bit_pattern_keeps_the_contract(rng, dtype):
    """x holding every finite bit pattern of the half type (two layouts, see
    ``_every_pattern_rows``), with a standard normal weight and dy: y and dx of RMSNorm and
    LayerNorm and the fused residual add's y, dx and dresidual (dy as the residual, and a
    standard normal dresidual_out) keep the contract against the oracle, and its new residual
    has the oracle's bits; rows holding an inf or NaN (every non-finite pattern, each in a
    row of ordinary values) give the oracle's bits exactly."""
    x = _every_pattern_rows(dtype, rng)
    m, n = x.shape
    special = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    special = special[~np.isfinite(special.astype(np.float32))]
    rows = rng.standard_normal((special.size, n)).astype(dtype)
    rows[np.arange(special.size), rng.integers(0, n, special.size)] = special
    w = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    with np.errstate(all="ignore"):
        for xs, exact in ((x, False), (rows, True)):
            dy = rng.standard_normal(xs.shape).astype(dtype)
            y, rstd = K.rms_norm_forward(xs, n, w)
            y_o, _ = rmsref.rms_norm_forward(xs, n, w)
            dx = K.rms_norm_backward(dy, xs, n, w, rstd=rstd).dx
            dx_o = rmsref.rms_norm_backward(dy, xs, n, w, rstd=rstd).dx
            ly, mu, ls = K.layer_norm_forward(xs, n, w, b)
            ly_o = rmsref.layer_norm(xs, n, w, b)
            ly0 = K.layer_norm(xs, n, w)  # no bias: the float32 y
            ly0_o = rmsref.layer_norm(xs, n, w)
            ldx = K.layer_norm_backward(dy, xs, n, w, mean=mu, rstd=ls).dx
            ldx_o = rmsref.layer_norm_backward(dy, xs, n, w, mean=mu, rstd=ls).dx
            ay, ares, arstd = K.add_rms_norm_forward(xs, dy, n, w)
            ay_o, ares_o, _ = rmsref.add_rms_norm_forward(xs, dy, n, w)
            same = ares.view(np.uint16) == ares_o.view(np.uint16)
            assert (same | np.isnan(ares_o.astype(np.float32))).all(), "new residual differs"
            dro = rng.standard_normal(xs.shape).astype(dtype)
            ag = K.add_rms_norm_backward(dy, dro, xs, dy, n, w, rstd=arstd)
            ag_o = rmsref.add_rms_norm_backward(dy, dro, xs, dy, n, w, rstd=arstd)
            for what, got, want in (("y", y, y_o), ("dx", dx, dx_o), ("layer_norm y", ly, ly_o),
                                    ("layer_norm y, no bias", ly0, ly0_o),
                                    ("layer_norm dx", ldx, ldx_o), ("add_rms_norm y", ay, ay_o),
                                    ("add_rms_norm dx", ag.dx, ag_o.dx),
                                    ("add_rms_norm dresidual", ag.dresidual, ag_o.dresidual)):
                if exact:
                    same = got.view(np.uint16) == want.view(np.uint16)
                    both_nan = np.isnan(got.astype(np.float32)) & np.isnan(
                        want.astype(np.float32))
                    assert (same | both_nan).all(), f"{what}: a non-finite row differs"
                else:
                    _contract(what, got, want, dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("rounding", ["fp32-sum", "rounded-sum"])
def test_the_new_residual_through_float32_is_rounded_once(rng, dtype, rounding):
    """The fused add stores new_residual = R(x + r) through float32 when x, r and the new
    residual share a half format (``_halfbits.sum_to``): every finite pattern as x, with r a
    half value a few ulps of x below it, ±x·2^-e(1 + m/8) for e = p - 1 ... p + 2 (p the
    format's bits), where x + r falls on or next to a half-way point of the format, and rows
    holding inf or NaN: the oracle's bits (its float64 sum rounded once), NaN included. So
    does "rounded-sum"'s h (``_halfbits.rounded_sum``, through float32 too), NaN for NaN."""
    p = 8 if dtype == BF16 else 11
    v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    x = v[np.isfinite(v.astype(np.float32))]
    x = np.repeat(x[: x.size - x.size % 64].reshape(-1, 64), 2, axis=0)  # (rows, 64)
    e = rng.integers(p - 1, p + 3, x.shape)
    frac = 1.0 + rng.integers(0, 8, x.shape) / 8.0
    sign = rng.choice([-1.0, 1.0], x.shape)
    with np.errstate(all="ignore"):
        r = (sign * np.ldexp(frac, -e) * x.astype(np.float64)).astype(dtype)
    specials = v[~np.isfinite(v.astype(np.float32))]
    rows = np.resize(specials, (-(-specials.size // 64), 64)).astype(dtype)
    with np.errstate(all="ignore"):
        for xs, rs in ((x, r), (rows, rng.standard_normal(rows.shape).astype(dtype)),
                       (rng.standard_normal(rows.shape).astype(dtype), rows)):
            got = K.add_rms_norm_forward(xs, rs, 64, rounding=rounding)[1]
            want = rmsref.add_rms_norm_forward(xs, rs, 64, rounding=rounding)[1]
            diff = np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))
            assert diff.size == 0, (
                f"{diff.size} new residuals differ; first x={xs.flat[diff[0]]!r}, "
                f"r={rs.flat[diff[0]]!r}: got {got.flat[diff[0]]!r}, oracle {want.flat[diff[0]]!r}")
            if rounding == "rounded-sum":  # h itself, as the kernels' element loops form it
                h = _rounded_sums(K._bits(xs).ravel(), K._bits(rs).ravel())
                h_o = (xs.astype(np.float64) + rs.astype(np.float64)).astype(dtype).ravel()
                same = (h == h_o.astype(np.float64)) | (np.isnan(h) & np.isnan(h_o))
                first = np.flatnonzero(~same)[:1]
                assert same.all(), (f"h differs: x={xs.flat[first]!r}, r={rs.flat[first]!r}: "
                                    f"got {h[first]!r}, oracle {h_o[first]!r}")


def _rounded_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``_halfbits.rounded_sum`` of each pair of half elements (bits), rounded to their own
    format (the fused add's "rounded-sum" h), in a loop compiled as the kernels' are."""
    from numba import njit

    @njit
    def sums(a, b, like):
        out = np.empty(a.size)
        for j in range(a.size):
            out[j] = hb.rounded_sum(a[j], b[j], like)
        return out

    return sums(a, b, a.dtype.type(0))
