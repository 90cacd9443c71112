"""LayerNorm and unit-norm oracles: naive loops, staged == closed form, JVP/VJP transpose."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rmsref
from tests import naive


@pytest.mark.parametrize(("shape", "ns"), [((1, 1), 1), ((3, 7), 7), ((2, 3, 4), (3, 4))])
def test_layer_norm_matches_naive(rng, shape, ns):
    nshape = (ns,) if isinstance(ns, int) else ns
    x, w, b = (
        rng.standard_normal(shape) + 5,
        rng.standard_normal(nshape),
        rng.standard_normal(nshape),
    )
    n = int(np.prod(nshape))
    y, mean, rstd = rmsref.layer_norm_forward(x, ns, w, b)
    np.testing.assert_allclose(y, naive.layer_norm(x, n, w, b), rtol=1e-13, atol=1e-14)
    assert mean.shape == rstd.shape == shape[: len(shape) - len(nshape)] + (1,) * len(nshape)


@pytest.mark.parametrize(("shape", "ns"), [((1, 1), 1), ((3, 7), 7), ((2, 3, 4), (3, 4))])
def test_unit_norm_matches_naive(rng, shape, ns):
    nshape = (ns,) if isinstance(ns, int) else ns
    x, w = rng.standard_normal(shape), rng.standard_normal(nshape)
    n = int(np.prod(nshape))
    np.testing.assert_allclose(
        rmsref.unit_norm(x, ns, w), naive.unit_norm(x, n, w), rtol=4e-15, atol=1e-16
    )


def test_layer_norm_mean_is_accurate_for_large_offsets(rng):
    # mean 1e8 and spread 1: one refinement step keeps xhat accurate despite the offset.
    x = 1e8 + rng.standard_normal((4, 256))
    y = rmsref.layer_norm(x, 256, eps=0.0)
    xc = x - np.mean(x, axis=-1, keepdims=True)
    ref = (xc - np.mean(xc, -1, keepdims=True)) / np.std(xc, -1, keepdims=True)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.sum(y, -1), 0, atol=1e-12)


OPS = {
    "layer_norm": (
        lambda x, w, b: rmsref.layer_norm_forward(x, 9, w, b, 1e-3)[0],
        lambda dy, x, w, b: rmsref.layer_norm_backward(dy, x, 9, w, b, 1e-3),
        lambda dy, x, w, b: rmsref.layer_norm_backward_staged(dy, x, 9, w, b, 1e-3),
        lambda x, t, w, b, tw, tb: rmsref.layer_norm_jvp(
            x, t, 9, w, b, 1e-3, dweight_tan=tw, dbias_tan=tb
        ),
    ),
    "unit_norm": (
        lambda x, w, b: rmsref.unit_norm_forward(x, 9, w, 1e-3, bias=b)[0],
        lambda dy, x, w, b: rmsref.unit_norm_backward(dy, x, 9, w, 1e-3, bias=b),
        lambda dy, x, w, b: rmsref.unit_norm_backward_staged(dy, x, 9, w, 1e-3, bias=b),
        lambda x, t, w, b, tw, tb: rmsref.unit_norm_jvp(
            x, t, 9, w, 1e-3, dweight_tan=tw, bias=b, dbias_tan=tb
        ),
    ),
}


@pytest.mark.parametrize("op", OPS)
def test_staged_closed_jvp_and_complex_step_agree(rng, op):
    fwd, bwd, staged, jvp = OPS[op]
    x, w, b = rng.standard_normal((4, 9)) + 0.5, rng.standard_normal(9), rng.standard_normal(9)
    dy, t, tw, tb = (rng.standard_normal(s) for s in ((4, 9), (4, 9), 9, 9))
    g, gs = bwd(dy, x, w, b), staged(dy, x, w, b)
    for a, c in zip(g, gs, strict=True):
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-14 * np.max(np.abs(a)))
    jv = jvp(x, t, w, b, tw, tb)
    h = 1e-30
    cs = fwd(x + 1j * h * t, w + 1j * h * tw, b + 1j * h * tb).imag / h
    np.testing.assert_allclose(jv, cs, rtol=0, atol=1e-14 * np.max(np.abs(cs)))
    lhs = np.sum(dy * jv)
    rhs = np.sum(g.dx * t) + np.sum(g.dweight * tw) + np.sum(g.dbias * tb)
    assert abs(lhs - rhs) <= 1e-14 * np.sum(np.abs(dy * jv))


def test_layer_norm_dx_sums_to_zero(rng):
    x, dy = rng.standard_normal((5, 33)), rng.standard_normal((5, 33))
    dx = rmsref.layer_norm_backward(dy, x, 33, rng.standard_normal(33)).dx
    assert np.max(np.abs(dx.sum(-1))) < 1e-13


def test_layer_norm_saved_statistics(rng):
    x, dy = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    _, mean, rstd = rmsref.layer_norm_forward(x, 8)
    a = rmsref.layer_norm_backward(dy, x, 8, mean=mean, rstd=rstd).dx
    b = rmsref.layer_norm_backward(dy, x, 8).dx
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14 * np.max(np.abs(b)))  # dx cancels
    with pytest.raises(ValueError, match="both"):
        rmsref.layer_norm_backward(dy, x, 8, rstd=rstd)


def test_rms_norm_is_sqrt_n_unit_norm(rng):
    x = rng.standard_normal((3, 50))
    np.testing.assert_allclose(
        rmsref.rms_norm(x, 50, eps=1e-3),
        math.sqrt(50) * rmsref.unit_norm(x, 50, eps=50e-3),
        rtol=1e-14,
    )


def test_module_classes():
    ln, un = rmsref.LayerNorm((2, 4)), rmsref.UnitNorm(8)
    assert ln.num_parameters == 16 and rmsref.RMSNorm((2, 4)).num_parameters == 8
    assert repr(un) == "UnitNorm((8,), eps=0.0, elementwise_affine=True)"
    x = np.arange(16.0).reshape(2, 8)
    np.testing.assert_array_equal(un(x), rmsref.unit_norm(x, 8, un.weight))
    assert ln.backward(np.ones((3, 2, 4)), np.ones((3, 2, 4)) * np.arange(4)).dbias.shape == (2, 4)


def test_unit_norm_backward_names_the_argument_it_refuses():
    """A bias of the wrong shape is named 'bias'; an out= that overlaps the weight is refused
    naming 'weight' (writing dx there would change the weight while it is still read)."""
    x = np.ones((2, 4))
    with pytest.raises(ValueError) as info:
        rmsref.unit_norm_backward(x, x, 4, np.ones(4), bias=np.ones(3))
    assert str(info.value) == "bias has shape (3,) but normalized_shape is (4,)"
    out = np.zeros((2, 4))
    weight = out[0]  # a view of out's first row
    weight[:] = 1.0
    with pytest.raises(ValueError) as info:
        rmsref.unit_norm_backward(x, x, 4, weight, out=out)
    assert str(info.value).startswith("out shares memory with weight;")
