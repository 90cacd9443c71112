"""rmsref.adapters: torch (F.rms_norm, module classes and instances, autograd), the generic
"package.module:function" loader, and JAX (skipped when jax is absent)."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from rmsref._shapes import bfloat16
from rmsref.adapters import generic


def _torch():
    return pytest.importorskip("torch", reason="torch not installed: torch adapter tests")


def test_bfloat16_crosses_without_loss():
    _torch()
    from rmsref.adapters.torch import to_numpy, to_torch

    bits = np.arange(0, 2**16, 7, dtype=np.uint16)
    a = bits.view(bfloat16)
    t = to_torch(a)
    assert str(t.dtype) == "torch.bfloat16"
    back = to_numpy(t)
    assert back.dtype == bfloat16 and np.array_equal(back.view(np.uint16), bits)


def test_f_rms_norm_forward_and_autograd_backward(rng):
    torch = _torch()
    from rmsref.adapters.torch import to_numpy, to_torch, wrap

    fwd, bwd = wrap(torch.nn.functional.rms_norm)
    x = rng.standard_normal((4, 64)).astype(np.float32).astype(bfloat16)
    w = rng.standard_normal(64).astype(np.float32).astype(bfloat16)
    dy = rng.standard_normal((4, 64)).astype(np.float32).astype(bfloat16)
    y = fwd(x, 64, w, 1e-5)
    ref = torch.nn.functional.rms_norm(to_torch(x), [64], to_torch(w), 1e-5)
    assert y.dtype == bfloat16 and np.array_equal(y.view(np.uint16), to_numpy(ref).view(np.uint16))
    dx, dw = bwd(dy, x, 64, w, 1e-5)
    xt, wt = to_torch(x).requires_grad_(True), to_torch(w).requires_grad_(True)
    torch.nn.functional.rms_norm(xt, [64], wt, 1e-5).backward(to_torch(dy))
    assert np.array_equal(dx.view(np.uint16), to_numpy(xt.grad).view(np.uint16))
    assert np.array_equal(dw.view(np.uint16), to_numpy(wt.grad).view(np.uint16))
    assert bwd(dy, x, 64, None, 1e-5)[1] is None


def test_module_class_and_instance(rng):
    torch = _torch()
    from rmsref.adapters.torch import wrap

    x = rng.standard_normal((3, 4, 8)).astype(np.float32)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    y_f = wrap(torch.nn.functional.rms_norm)[0](x, (4, 8), w, 1e-3)
    fwd_cls, _ = wrap(torch.nn.RMSNorm)
    assert np.array_equal(fwd_cls(x, (4, 8), w, 1e-3), y_f)
    inst = torch.nn.RMSNorm([4, 8], eps=0.5)
    fwd_inst, bwd_inst = wrap(inst)
    assert np.array_equal(fwd_inst(x, (4, 8), w, 1e-3), y_f)     # a private copy's
    assert inst.eps == 0.5 and torch.equal(inst.weight.detach(), torch.ones(4, 8))  # not inst's
    dx, dw = bwd_inst(np.ones_like(x), x, (4, 8), w, 1e-3)
    assert dx.shape == x.shape and dw.shape == w.shape


def test_non_contiguous_input_stays_non_contiguous(rng):
    torch = _torch()
    from rmsref.adapters.torch import wrap

    seen = []

    def spy(xt, shape, wt, eps):
        seen.append(xt.is_contiguous())
        return torch.nn.functional.rms_norm(xt, shape, wt, eps)

    base = rng.standard_normal((8, 64)).astype(np.float32)
    x = base[::2, ::2]
    y = wrap(spy)[0](x, 32, None, None)
    assert seen == [False]
    assert np.array_equal(y, wrap(spy)[0](np.ascontiguousarray(x), 32, None, None))


def test_generic_loader_paths_and_errors(tmp_path, monkeypatch):
    mod = tmp_path / "my_rms_kernels.py"
    mod.write_text(textwrap.dedent("""
        import rmsref

        def rms_norm(x, shape, weight=None, eps=None):
            return rmsref.rms_norm(x, shape, weight, eps)

        class ns:
            @staticmethod
            def fwd(x, shape, weight=None, eps=None):
                return rmsref.rms_norm(x, shape, weight, eps)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = generic.resolve("my_rms_kernels:rms_norm")
    assert loaded.framework == "numpy" and loaded.backward is None
    assert generic.load("my_rms_kernels:ns.fwd") is sys.modules["my_rms_kernels"].ns.fwd
    with pytest.raises(ValueError, match="not a 'package.module:function' path"):
        generic.load("my_rms_kernels.rms_norm")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        generic.load("my_rms_kernels:nope")
    with pytest.raises(ImportError):
        generic.load("no_such_module_xyz:fn")


def test_generic_resolves_torch_objects():
    _torch()
    loaded = generic.resolve("torch")
    assert loaded.framework == "torch" and loaded.backward is not None
    assert generic.resolve("torch.nn:RMSNorm").framework == "torch"


def test_jax_adapter(rng):
    jax = pytest.importorskip("jax", reason="jax not installed: JAX adapter test")
    import jax.numpy as jnp

    from rmsref.adapters.jax import wrap

    def rms(x, shape, w, eps):
        xf = x.astype(jnp.float32)
        ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
        y = xf * jax.lax.rsqrt(ms + (1e-6 if eps is None else eps))
        return (y * w.astype(jnp.float32)).astype(x.dtype)

    fwd, bwd = wrap(rms)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    y = fwd(x, 32, w, 1e-5)
    import rmsref

    np.testing.assert_allclose(y, rmsref.rms_norm(x, 32, w, 1e-5), rtol=1e-5)
    dx, dw = bwd(np.ones_like(x), x, 32, w, 1e-5)
    g = rmsref.rms_norm_backward(np.ones_like(x), x, 32, w, 1e-5)
    np.testing.assert_allclose(dx, g.dx, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw, g.dweight, rtol=1e-4, atol=1e-6)
