"""rmsref.comparison beyond y/dx/dweight: bias, pRMSNorm's partial, rstd, dbias, the fused add's
dresidual_out, and values that are only rounded (``compare_rounded``).

Reference: the float64 oracle (``rmsref.rms_norm_forward`` / ``rms_norm_backward``). A float32
pipeline written out below (the way a GPU kernel computes, one rounding to bfloat16 at the end)
must pass every comparison; the same pipeline with one planted mistake must fail the one it
breaks. Tolerance: ``rmsref.tolerance`` (float32 accumulation, sequential sums).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rmsref
from rmsref import tolerance
from rmsref._shapes import bfloat16
from rmsref.comparison import Reference, compare, compare_rounded

F32 = np.dtype(np.float32)
M, N, EPS, OFFSET, PARTIAL = 6, 40, 1e-6, 1.0, 0.5
K = int(N * PARTIAL)


@pytest.fixture
def inputs(rng):
    """bfloat16 inputs: x, dy (M, N), weight, bias (N,)."""
    x = (2.0 * rng.standard_normal((M, N))).astype(bfloat16)
    dy = rng.standard_normal((M, N)).astype(bfloat16)
    w = (0.5 * rng.standard_normal(N)).astype(bfloat16)
    b = (0.5 * rng.standard_normal(N)).astype(bfloat16)
    return x, dy, w, b


def _float32_pipeline(x, dy, w, b, *, k: int = K, c_terms: int = N) -> dict:
    """pRMSNorm forward and backward in float32 (statistic from the first ``k`` features),
    results rounded once to bfloat16; rstd kept in float32, and dx also before its rounding."""
    x, dy = x.astype(F32), dy.astype(F32)                          # (M, N)
    w_eff = np.float32(OFFSET) + w.astype(F32)                     # (N,)
    ms = np.sum(x[:, :k] * x[:, :k], axis=1, keepdims=True) / np.float32(k)  # (M, 1) eq. (1)
    rstd = np.float32(1.0) / np.sqrt(ms + np.float32(EPS))         # (M, 1)  eq. (2)
    xhat = x * rstd                                                # (M, N)  eq. (3)
    y = xhat * w_eff + b.astype(F32)                               # (M, N)  eq. (4)
    dxhat = dy * w_eff                                             # (M, N)  eq. (5)
    dxhat_xhat = (dxhat * xhat)[:, :c_terms]  # every feature reaches rstd through y
    c = np.sum(dxhat_xhat, axis=1, keepdims=True) / np.float32(k)  # (M, 1)  eq. (6)
    in_stat = (np.arange(x.shape[1]) < k).astype(F32)              # (N,)  [j < K]
    dx = rstd * (dxhat - in_stat * xhat * c)                       # (M, N)  eq. (7)
    return {"y": y.astype(bfloat16), "rstd": rstd, "dx": dx.astype(bfloat16), "dx_f32": dx,
            "dweight": np.sum(dy * xhat, axis=0).astype(bfloat16),    # eq. (8)
            "dbias": np.sum(dy, axis=0).astype(bfloat16)}              # eq. (9)


def _reference(x, dy, w, b, **kwargs) -> Reference:
    return Reference(x, (N,), w, EPS, dy=dy, offset=OFFSET, bias=b, partial=PARTIAL, **kwargs)


MODEL = tolerance.ErrorModel(bfloat16, N, M, acc_dtype=F32)


def test_reference_is_the_oracle_with_every_option(inputs):
    x, dy, w, b = inputs
    ref = _reference(x, dy, w, b)
    x64, dy64, w64, b64 = (a.astype(np.float64) for a in inputs)
    y, rstd = rmsref.rms_norm_forward(x64, N, w64, EPS, bias=b64, offset=OFFSET,
                                      partial=PARTIAL)
    g = rmsref.rms_norm_backward(dy64, x64, N, w64, EPS, bias=b64, offset=OFFSET,
                                 partial=PARTIAL)
    assert ref.k_feat == K
    np.testing.assert_array_equal(ref.exact("y"), y)
    np.testing.assert_array_equal(ref.exact("rstd"), rstd)
    np.testing.assert_array_equal(ref.exact("dx"), g.dx)
    np.testing.assert_array_equal(ref.exact("dweight").ravel(), g.dweight)
    np.testing.assert_array_equal(ref.exact("dbias").ravel(), g.dbias)


@pytest.mark.parametrize("quantity", ["y", "rstd", "dx", "dweight", "dbias"])
def test_a_float32_pipeline_is_within_every_bound(inputs, quantity):
    got = _float32_pipeline(*inputs)[quantity]
    c = compare(quantity, got, _reference(*inputs), MODEL)
    assert c.passed, f"{quantity}: ratio {c.ratio:.3g} at {c.worst}"


@pytest.mark.parametrize("quantity", ["y", "rstd", "dx"])
def test_ignoring_partial_is_caught(inputs, quantity):
    """The statistic taken over the whole row instead of the first K features."""
    got = _float32_pipeline(*inputs, k=N)[quantity]
    assert not compare(quantity, got, _reference(*inputs), MODEL).passed


def test_projection_over_the_first_k_features_only_is_caught(inputs):
    """c summed over the K features of the statistic: the others feed rstd through y too."""
    got = _float32_pipeline(*inputs, c_terms=K)["dx"]
    assert not compare("dx", got, _reference(*inputs), MODEL).passed


def test_dropped_bias_and_short_dbias_are_caught(inputs):
    x, dy, w, b = inputs
    ref = _reference(x, dy, w, b)
    no_bias = _float32_pipeline(x, dy, w, np.zeros_like(b))
    assert not compare("y", no_bias["y"], ref, MODEL).passed
    short = np.sum(dy[1:].astype(F32), axis=0).astype(bfloat16)  # one row left out
    assert not compare("dbias", short, ref, MODEL).passed


def test_bias_bound_follows_the_terms_not_y(inputs):
    """Where x̂·w and b cancel, the bound keeps the size of the terms (|y| alone would not);
    the sums of squares have K terms (partial), so γ(K)."""
    x, dy, w, b = inputs
    ref = _reference(x, dy, w, b)
    b64 = b.astype(np.float64)
    terms = np.abs(ref.y - b64) + np.abs(b64)
    stat_model = dataclasses.replace(MODEL, n=K)
    expected = (MODEL.u_out * np.abs(ref.y)
                + (0.5 * stat_model.gamma(K) + 5.0 * MODEL.u_acc) * terms + MODEL.atol)
    np.testing.assert_allclose(ref.bound("y", MODEL), expected, rtol=1e-12)
    assert np.any(terms > 2.0 * np.abs(ref.y))  # the case the terms are there for


def test_dresidual_out_is_added_to_dx(inputs, rng):
    x, dy, w, b = inputs
    dro = rng.standard_normal((M, N)).astype(F32)
    ref = _reference(x, dy, w, b, dresidual_out=dro)
    np.testing.assert_array_equal(ref.dx, ref.dx_norm + dro)
    dh = (_float32_pipeline(x, dy, w, b)["dx_f32"] + dro).astype(bfloat16)  # one rounding
    assert compare("dx", dh, ref, MODEL).passed
    without = _float32_pipeline(x, dy, w, b)["dx"]  # dresidual_out forgotten
    assert not compare("dx", without, ref, MODEL).passed


def test_compare_rounded(rng):
    h = rng.standard_normal((3, 8)) * 4.0
    once = h.astype(bfloat16)
    assert compare_rounded("h", once, h, bfloat16).passed
    off = once.copy()
    off.view(np.uint16)[2, 5] += 2  # two bfloat16 ulps further from zero: 1.5 to 2.5 ulps off
    c = compare_rounded("h", off, h, bfloat16)
    assert not c.passed and c.worst == (2, 5)
    assert compare_rounded("h", off, h, bfloat16, roundings=5).passed  # 5u|h| >= 2.5 ulps
    assert compare_rounded("h", np.zeros(4), np.zeros(4), bfloat16).ratio == 0.0
