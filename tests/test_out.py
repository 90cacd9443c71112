"""``out=``: every backend writes y (forward) and dx (backward) into a caller's array, for
RMSNorm and the LayerNorm / unit-norm functions beside it.

Reference: the same backend's result without ``out=`` (bit for bit: writing into a given array
must not change a single result). Layouts: x's own layout (written in place, no temporary), a
transposed and a strided ``out`` (which the Numba kernels cannot always walk together with x:
then they compute into a temporary and copy, and the result must still land in ``out``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import rmsref
from tests.conftest import DTYPES, backend_params

N = 48
SHAPE = (3, 5, N)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def _outs(dtype: np.dtype) -> dict[str, np.ndarray]:
    return {
        "empty_like": np.empty(SHAPE, dtype),
        "transposed": np.empty(SHAPE[::-1], dtype).transpose(2, 1, 0),
        "strided": np.empty(SHAPE[:-1] + (2 * N,), dtype)[..., ::2],
    }


def _data(rng, dtype):
    x = rng.standard_normal(SHAPE).astype(dtype)
    dy = rng.standard_normal(SHAPE).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(N)).astype(dtype)
    return x, dy, w


#: family -> (forward, plain call, backward given the forward's saved statistics)
FAMILIES = {
    "rms_norm": (
        lambda be, x, w, **kw: be.rms_norm_forward(x, N, w, **kw),
        lambda be, x, w, **kw: be.rms_norm(x, N, w, **kw),
        lambda be, dy, x, w, st, **kw: be.rms_norm_backward(dy, x, N, w, rstd=st[1], **kw),
    ),
    "layer_norm": (
        lambda be, x, w, **kw: be.layer_norm_forward(x, N, w, **kw),
        lambda be, x, w, **kw: be.layer_norm(x, N, w, **kw),
        lambda be, dy, x, w, st, **kw: be.layer_norm_backward(dy, x, N, w, mean=st[1],
                                                              rstd=st[2], **kw),
    ),
    "unit_norm": (
        lambda be, x, w, **kw: be.unit_norm_forward(x, N, w, **kw),
        lambda be, x, w, **kw: be.unit_norm(x, N, w, **kw),
        lambda be, dy, x, w, st, **kw: be.unit_norm_backward(dy, x, N, w, rnorm=st[1], **kw),
    ),
}
#: which CPU backend has which family (numba_cpu writes LayerNorm for comparison only)
HAS = {"numpy": ("rms_norm", "layer_norm", "unit_norm"), "numba_cpu": ("rms_norm", "layer_norm")}


def _cases():
    """(backend, family, dtype, layout); a layout other than x's makes Numba compile a new
    specialisation of each kernel (~10 s each, cold), so those numba_cpu cases are marked slow
    (CI runs them)."""
    for be in backend_params(exclude=("numba_cuda",)):
        name = be.values[0]
        for family in HAS[name]:
            for dtype in ("bfloat16", "float32"):
                for layout in ("empty_like", "transposed", "strided"):
                    if name == "numba_cpu" and family == "layer_norm" and layout != "empty_like" \
                            and (dtype, layout) != ("float32", "strided"):
                        continue  # the copy-back path is rms_norm's; one LayerNorm case shows it
                    slow = name == "numba_cpu" and (layout != "empty_like" or family != "rms_norm")
                    marks = list(be.marks) + ([pytest.mark.slow] if slow else [])
                    yield pytest.param(name, family, dtype, layout, marks=marks,
                                       id=f"{name}-{family}-{dtype}-{layout}")


@pytest.mark.parametrize(("backend_name", "family", "dtype", "layout"), list(_cases()))
def test_out_gets_the_same_bits(backend_name, family, dtype, layout, rng):
    be = rmsref.backend(backend_name)
    forward, plain, backward = FAMILIES[family]
    dt = DTYPES[dtype]
    x, dy, w = _data(rng, dt)
    stats = forward(be, x, w)
    y_ref = stats[0]
    g_ref = backward(be, dy, x, w, stats)

    out = _outs(dt)[layout]
    y = forward(be, x, w, out=out)[0]
    assert y is out, "the returned y must be the caller's out array itself"
    assert np.array_equal(_bits(np.ascontiguousarray(out)), _bits(y_ref))

    out = _outs(dt)[layout]
    assert plain(be, x, w, out=out) is out
    assert np.array_equal(_bits(np.ascontiguousarray(out)), _bits(y_ref))

    out = _outs(dt)[layout]
    g = backward(be, dy, x, w, stats, out=out)
    assert g.dx is out
    assert np.array_equal(_bits(np.ascontiguousarray(out)), _bits(g_ref.dx))
    assert np.array_equal(_bits(g.dweight), _bits(g_ref.dweight))


@pytest.mark.parametrize("backend_name", backend_params(exclude=("numba_cuda",)))
def test_out_with_out_dtype(backend_name, rng):
    be = rmsref.backend(backend_name)
    x, _, w = _data(rng, np.float32)
    out = np.empty(SHAPE, np.float64)
    y, _ = be.rms_norm_forward(x, N, w, out_dtype=np.float64, out=out)
    assert y is out
    assert np.array_equal(out, be.rms_norm_forward(x, N, w, out_dtype=np.float64)[0])


@pytest.mark.parametrize("backend_name", backend_params(exclude=("numba_cuda",)))
def test_bad_out_is_refused_naming_what_it_got(backend_name, rng):
    be = rmsref.backend(backend_name)
    x, dy, w = _data(rng, np.float32)
    cases = [
        (np.empty((3, 5, N + 1), np.float32), ValueError, "shape (3, 5, 49)"),
        (np.empty(SHAPE, np.float64), TypeError, "dtype float64"),
        (np.empty(SHAPE, np.float32).tolist(), TypeError, "got list"),
        (x, ValueError, "shares memory with x"),
        (x[:, ::-1], ValueError, "shares memory with x"),
    ]
    ro = np.empty(SHAPE, np.float32)
    ro.flags.writeable = False
    cases.append((ro, ValueError, "read-only"))
    for out, exc, text in cases:
        with pytest.raises(exc, match=re.escape(text)):
            be.rms_norm_forward(x, N, w, out=out)
    with pytest.raises(ValueError, match="shares memory with dy"):
        be.rms_norm_backward(dy, x, N, w, out=dy)
    # interleaved halves of one buffer do not overlap: accepted (an exact test, not bounds)
    both = np.empty(SHAPE[:-1] + (2 * N,), np.float32)
    x_half, out_half = both[..., :N], both[..., N:]
    x_half[...] = x
    assert be.rms_norm(x_half, N, w, out=out_half) is out_half
    assert np.array_equal(out_half, be.rms_norm(x, N, w))

    buf = np.empty(SHAPE, np.float32)
    w_in_buf = buf.reshape(-1)[:N]
    w_in_buf[:] = w
    with pytest.raises(ValueError, match="shares memory with weight"):
        be.rms_norm_backward(dy, x, N, w_in_buf, out=buf)
