"""Helpers shared by the LayerNorm and unit-norm property tests."""

from __future__ import annotations

import numpy as np


def inputs(rng, ns, xshape, has_w, has_b, scale=1.0, shift=0.0):
    """x = scale · (N(0, 1) + shift), dy, and a weight / bias of normalized_shape ``ns`` (or
    None where absent)."""
    nshape = (ns,) if isinstance(ns, int) else ns
    x = scale * (rng.standard_normal(xshape) + shift)
    dy = rng.standard_normal(xshape)
    w = rng.standard_normal(nshape) if has_w else None
    b = rng.standard_normal(nshape) if has_b else None
    return x, dy, w, b


def assert_grads_close(got, ref, rtol=1e-13):
    """(dx, dweight, dbias) close to ``ref``'s, with the same shapes, dtypes and Nones."""
    for name, g, r in zip(("dx", "dweight", "dbias"), got, ref, strict=True):
        if r is None:
            assert g is None, name
            continue
        assert g.shape == r.shape and g.dtype == r.dtype, name
        np.testing.assert_allclose(g, r, rtol=0, atol=rtol * np.max(np.abs(r)), err_msg=name)


def pick(which, re, im):
    """The real part's argument, the imaginary part's, or the complex combination."""
    return re if which == "re" else im if which == "im" else re + 1j * im


def assert_linear(f):
    """f(which) at the complex combination is f("re") + i f("im"), array by array."""
    got, re, im = f("both"), f("re"), f("im")
    for g, r, i in zip(got, re, im, strict=True):
        assert np.iscomplexobj(g)
        np.testing.assert_allclose(g, r + 1j * i, rtol=1e-14, atol=1e-14)
