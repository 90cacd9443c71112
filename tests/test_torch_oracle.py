"""The oracle against PyTorch's F.rms_norm and autograd (skipped when torch is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

import rmsref
from rmsref._shapes import bfloat16

torch = pytest.importorskip("torch", reason="torch not installed: pip install 'rmsref[torch]'")
F = torch.nn.functional

SHAPES = [((4, 16), (16,)), ((2, 3, 4, 5), (4, 5)), ((0, 8), (8,)), ((3, 1), (1,)), ((7,), (7,))]


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def test_negative_eps_is_refused_where_torch_accepts_it(rng):
    """A deliberate difference: mean(x²) + eps <= 0 would be a NaN, not a norm."""
    x = rng.standard_normal((2, 4))
    assert torch.isfinite(F.rms_norm(_t(x * 10), (4,), None, -0.5)).all()
    with pytest.raises(ValueError, match="eps must be a finite non-negative"):
        rmsref.rms_norm(x * 10, 4, None, -0.5)


@pytest.mark.parametrize(("shape", "ns"), SHAPES)
@pytest.mark.parametrize("eps", [None, 0.5, 1e-6])
@pytest.mark.parametrize("with_weight", [True, False])
def test_float64_forward_and_backward_match_torch(rng, shape, ns, eps, with_weight):
    x = rng.uniform(-1000, 1000, shape)
    w = rng.standard_normal(ns) if with_weight else None
    dy = rng.standard_normal(shape)
    xt = _t(x).requires_grad_(True)
    wt = _t(w).requires_grad_(True) if with_weight else None
    yt = F.rms_norm(xt, ns, wt, eps)
    yt.backward(_t(dy))
    y = rmsref.rms_norm(x, ns, w, eps)
    g = rmsref.rms_norm_backward(dy, x, ns, w, eps)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-14, atol=1e-300, equal_nan=True)
    # dx cancels when dy is nearly parallel to x (always, at N = 1): both sides are accurate to
    # u times the size of the terms of dx = rstd·(dxhat − xhat·c), not to u·|dx|
    # (docs/tolerances.md).
    _, rstd = rmsref.rms_norm_forward(x, ns, None, eps)
    xhat = np.abs(x * rstd)
    dxhat = np.abs(dy * (1.0 if w is None else w))
    k = tuple(range(x.ndim - len(ns), x.ndim))
    terms = np.abs(rstd) * (dxhat + xhat * np.mean(dxhat * xhat, axis=k, keepdims=True))
    np.testing.assert_array_less(np.abs(g.dx - xt.grad.numpy()), 1e-13 * terms + 1e-300)
    if with_weight:
        dw_t = wt.grad.numpy()
        np.testing.assert_allclose(
            g.dweight, dw_t, rtol=0, atol=1e-13 * max(1, np.max(np.abs(dw_t)))
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("n", [1, 64, 1000])
def test_low_precision_forward_within_output_rounding(rng, dtype, n):
    np_dtype = {"float16": np.float16, "bfloat16": bfloat16, "float32": np.float32}[dtype]
    x = (rng.standard_normal((8, n)) * 3).astype(np_dtype)
    w = rng.standard_normal(n).astype(np_dtype)
    tdt = getattr(torch, dtype)
    xt = _t(x.astype(np.float32)).to(tdt)
    wt = _t(w.astype(np.float32)).to(tdt)
    ours = rmsref.rms_norm(x, n, w).astype(np.float64)
    theirs = F.rms_norm(xt, (n,), wt).float().numpy().astype(np.float64)
    # torch computes in float32 and rounds to the output dtype; we compute in float64 and round
    # once. They may differ by one unit of the output dtype where torch's float32 result lands
    # on the other side of a rounding boundary; for float32 output, by torch's own float32
    # error: accumulation (deterministic bound N·u/2 on y) plus a few roundings.
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}[dtype]
    if dtype == "float32":
        bound = (n / 2 + 4) * u * np.abs(ours) + 1e-30
    else:
        bound = np.spacing(np.abs(ours).astype(np_dtype)).astype(np.float64) * 1.0 + (
            n / 2 + 4
        ) * 2.0**-24 * np.abs(ours)  # noqa: E501
    assert np.all(np.abs(ours - theirs) <= bound), np.max(np.abs(ours - theirs) / bound)
