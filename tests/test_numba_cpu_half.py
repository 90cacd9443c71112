"""Half-precision outputs of the Numba CPU kernels: the fast bfloat16 write and its exact
fallback, and how often half outputs equal the oracle's bit for bit.

References: the exact one-rounding encoder ``rmsref.kernels._halfbits.encode`` (tested bit for
bit in tests/test_halfbits.py) applied to the kernel's own float64 values, the kernel's
non-pipelined backward path (which rounds with ``from_f64`` only), and the NumPy oracle
(float64, rounded once to the output dtype).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="the Numba kernels need numba (pip install 'rmsref[numba]')")

import rmsref  # noqa: E402
from rmsref import tolerance  # noqa: E402
from rmsref.kernels import _halfbits as hb  # noqa: E402
from rmsref.kernels import numba_cpu as K  # noqa: E402

BF16 = rmsref.bfloat16


def _weights(rng, n, extreme):
    """Standard normal float32 weights; ``extreme`` puts float32 values whose products with
    x·rstd are bfloat16 subnormals (1e-39), overflow (3e38) or zero in some columns."""
    w = rng.standard_normal(n).astype(np.float32)
    if extreme:
        w[::7] = np.float32(1e-39)
        w[3::11] = np.float32(3e38)
        w[5::13] = 0.0
    return w


@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "subnormal-overflow"])
def test_bfloat16_write_equals_one_rounding_of_its_float64_value(rng, extreme):
    """y in bfloat16 from float32 inputs (float64 rstd returned, so the kernel's float64 value
    (x·rstd)·w is reproducible here) equals that value rounded once, bit for bit: rows inside
    bfloat16's normal range through the integer route, rows with a subnormal or infinite y
    (``extreme``) or a NaN written again exactly. 40 rows: pipelined and block-final rows."""
    m, n = 40, 200
    x = rng.standard_normal((m, n)).astype(np.float32)
    x[3, :5] = [0.0, -0.0, 0.0, -0.0, 0.0]  # exact zeros keep their sign, in the fast route
    x[9, 17] = np.nan  # a NaN row: NaN everywhere
    w = _weights(rng, n, extreme)
    y, rstd = K.rms_norm_forward(x, n, w, out_dtype=BF16)
    assert rstd.dtype == np.float64
    y64 = (x.astype(np.float64) * rstd) * w.astype(np.float64)
    want = hb.encode(y64.reshape(-1), hb.BF16_BITS).view(np.uint16).reshape(m, n)
    got = y.view(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{len(bad)} elements differ, first at {tuple(bad[0])}: got "
                           f"{got[tuple(bad[0])]:#06x}, want {want[tuple(bad[0])]:#06x}")
    if extreme:
        assert np.isinf(y.astype(np.float32)).any() and (np.abs(y64) < 2.0**-126).any()


def test_bfloat16_pipelined_backward_equals_exact_path(rng):
    """dx of the pipelined backward (saved rstd, a weight, no bias: the fast write) equals,
    bit for bit, dx of the path that also returns dbias (the same operations, rounded by
    ``from_f64`` only), with rows whose dx is subnormal (dy ~ 1e-39), overflows (|dy| = 8e37
    times weights up to ~12) or is NaN among ordinary rows."""
    m, n = 150, 192
    x = rng.standard_normal((m, n)).astype(BF16)
    dy = rng.standard_normal((m, n))
    dy[5] *= 1e-39
    dy[70] = np.sign(dy[70]) * 8e37  # times |w| up to ~12: past bfloat16's 3.4e38
    dy[100, 3] = np.nan
    dy = dy.astype(BF16)
    w = (rng.standard_normal(n) * 4).astype(BF16)
    _, rstd = K.rms_norm_forward(x, n, w)
    fast = K.rms_norm_backward(dy, x, n, w, rstd=rstd)
    exact = K.rms_norm_backward(dy, x, n, w, rstd=rstd, bias=w)
    got, want = fast.dx.view(np.uint16), exact.dx.view(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} dx elements differ, first at {tuple(bad[0])}"
    dx = fast.dx.astype(np.float32)
    assert np.isnan(dx[100]).all() and np.isinf(dx[70]).any()
    assert ((dx[5] != 0) & (np.abs(dx[5]) < 2.0**-126)).any()


@pytest.mark.parametrize("dtype", [
    pytest.param(BF16, id="bfloat16"),
    pytest.param(np.dtype(np.float16), id="float16", marks=pytest.mark.slow),
])
def test_half_outputs_mostly_equal_the_oracle(rng, dtype):
    """At a realistic shape (256 x 4096, standard normal x, dy and weight) forward y and
    backward dx equal the oracle's (float64 rounded once) on >= 99.9 % of elements, the rest
    within one ulp of the output dtype: both round a float64 value once, and the float64
    values differ by a few float64 ulps (x·rstd for x/sqrt(ms + eps), the lane order)."""
    m, n = 256, 4096
    x = rng.standard_normal((m, n)).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    w = rng.standard_normal(n).astype(dtype)
    y, rstd = K.rms_norm_forward(x, n, w)
    y_o, _ = rmsref.rms_norm_forward(x, n, w)
    dx = K.rms_norm_backward(dy, x, n, w, rstd=rstd).dx
    dx_o = rmsref.rms_norm_backward(dy, x, n, w).dx
    for what, got, want in (("y", y, y_o), ("dx", dx, dx_o)):
        got64, want64 = got.astype(np.float64), want.astype(np.float64)
        equal = np.mean(got.view(np.uint16) == want.view(np.uint16))
        assert equal >= 0.999, f"{what}: only {equal:.4%} equal the oracle bit for bit"
        err = np.abs(got64 - want64)
        assert np.all(err <= tolerance.ulp(want64, dtype)), f"{what}: beyond one ulp"
