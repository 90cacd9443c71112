"""tinygrad's ``nn.RMSNorm`` on its CPU device, backward through tinygrad's autograd.

What ``tinygrad/nn/__init__.py`` computes (read on tinygrad 0.14.0)::

    def _norm(self, x): return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()
    def __call__(self, x):
        x = self._norm(x.float()).cast(x.dtype)
        return x if self.weight is None else x * self.weight

- x is cast to float32 once; ``mean`` sums in float32 and divides by N; ``rsqrt`` is
  ``sqrt().reciprocal()`` (two roundings, as 1/sqrtf);
- x̂ is rounded to the input dtype (``.cast(x.dtype)``) *before* the weight, and x̂·w is rounded
  again in ``promote(x.dtype, w.dtype)``: the ``llama`` convention (two roundings on half types);
- ``eps`` defaults to 1e-6; only the last axis is normalised (``mean(-1)``, ``dim`` is an int), so
  the wrapper refuses a normalized_shape of more than one dim;
- ``elementwise_affine=False`` gives no weight; otherwise the module's ``weight`` (ones, float32)
  is replaced, on a module built for that call only, by the probe's weight.

Measured, not in the source: with a float16 x and a float32 weight the rounding of x̂ to float16
disappears (tinygrad's graph drops the float32 -> float16 -> float32 round trip): y agrees with the
unrounded x̂·w to 1e-6 relative on every element of an 8 x 768 case and with the llama order on
none. With bfloat16, or with the weight in x's dtype (what ``validate`` probes), the source's order
holds bit for bit.

The backward is ``y.gradient(x, weight, gradient=dy)`` (no ``.grad`` is stored anywhere): the cast
of x to float32 happens once, so dx is rounded once, after the two terms meet in float32.

The CPU device compiles each kernel with clang (``CC``, default ``clang``; Debian: ``apt-get
install clang``). Some bfloat16 kernels need a clang that can convert float to ``__bf16``: clang
14 and 16 (Debian 12) reject the constant a zero-size bfloat16 reduction needs (the ``empty``
probe's backward), though every other bfloat16 probe runs; clang 19 (Debian 12's ``clang-19``, with
``CC=clang-19`` in the environment) compiles them all. bfloat16 is therefore a separate entry,
unavailable (with that reason) when the compiler cannot do the conversion.
"""

from __future__ import annotations

import subprocess
from typing import Any

import numpy as np

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_DEVICE = "CPU"
_EPS_DEFAULT = 1e-6          # tinygrad.nn.RMSNorm(dim, eps=1e-6)


def _tinygrad() -> tuple[Any, Any, Any]:
    try:
        from tinygrad import Tensor, dtypes, nn
    except ImportError as exc:
        raise ZooUnavailable(f"tinygrad is not installed ({exc}): pip install tinygrad") from exc
    return Tensor, dtypes, nn


def _check_cpu_device(Tensor: Any) -> None:
    try:
        (Tensor([1.0], device=_DEVICE) * 2).numpy()
    except Exception as exc:
        raise ZooUnavailable(f"tinygrad's {_DEVICE} device cannot compile a kernel ({exc}); it "
                             "needs clang on PATH: apt-get install clang") from exc


def _check_bf16_compiler() -> None:
    """tinygrad's CPU device compiles with $CC (default clang); can it convert float to __bf16?"""
    from tinygrad.helpers import getenv

    cc = getenv("CC", "clang")
    code = "unsigned short f(float x) { return __builtin_bit_cast(unsigned short, (__bf16)x); }"
    cmd = [cc, "-c", "-x", "c", "-O2", "-ffreestanding", "-nostdlib",
           "--target=x86_64-none-unknown-elf", "-", "-o", "/dev/null"]
    try:
        done = subprocess.run(cmd, input=code, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ZooUnavailable(f"cannot run tinygrad's C compiler {cc!r}: {exc}") from exc
    if done.returncode != 0:
        first = done.stderr.strip().splitlines()[0] if done.stderr.strip() else "failed"
        raise ZooUnavailable(f"tinygrad compiles CPU kernels with {cc!r}, which cannot convert "
                             f"float to __bf16 ({first}); bfloat16 kernels (the empty probe's "
                             "backward) fail to build. Install clang 19 and set CC=clang-19")


def _wrap(Tensor: Any, dtypes: Any, nn: Any) -> Callables:
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)

    def to_tensor(a: Any, requires_grad: bool = False) -> Any:
        a = np.ascontiguousarray(a)
        if a.dtype == bf16:       # tinygrad cannot read ml_dtypes' buffer: pass the bits
            t = Tensor(a.view(np.uint16), device=_DEVICE).bitcast(dtypes.bfloat16)
        else:
            t = Tensor(a, device=_DEVICE)
        t.requires_grad = requires_grad
        return t

    def to_numpy(t: Any) -> np.ndarray:
        if t.dtype == dtypes.bfloat16:
            return t.bitcast(dtypes.uint16).numpy().view(bf16)
        return t.numpy()

    def last_dim(normalized_shape: Any) -> int:
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"tinygrad's RMSNorm normalises the last dim only; got "
                             f"normalized_shape {shape}")
        return shape[0]

    def module(n: int, weight: Any, eps: float | None, requires_grad: bool = False) -> Any:
        kwargs = {} if eps is None else {"eps": eps}
        norm = nn.RMSNorm(n, elementwise_affine=weight is not None, **kwargs)
        if weight is not None:
            norm.weight = to_tensor(weight, requires_grad)   # this call's module only
        return norm

    def tinygrad_rms_norm(x, normalized_shape, weight=None, eps=None):
        norm = module(last_dim(normalized_shape), weight, eps)
        return to_numpy(norm(to_tensor(x)))

    def tinygrad_rms_norm_backward(dy, x, normalized_shape, weight=None, eps=None):
        norm = module(last_dim(normalized_shape), weight, eps, requires_grad=True)
        xt = to_tensor(x, requires_grad=True)
        y = norm(xt)
        targets = [xt] if weight is None else [xt, norm.weight]
        grads = y.gradient(*targets, gradient=to_tensor(dy))
        dx = to_numpy(grads[0])
        return dx, None if weight is None else to_numpy(grads[1])

    return tinygrad_rms_norm, tinygrad_rms_norm_backward


def _build() -> Callables:
    Tensor, dtypes, nn = _tinygrad()
    _check_cpu_device(Tensor)
    return _wrap(Tensor, dtypes, nn)


def _build_bf16() -> Callables:
    Tensor, dtypes, nn = _tinygrad()
    _check_cpu_device(Tensor)
    _check_bf16_compiler()
    return _wrap(Tensor, dtypes, nn)


_NOTES = ("x̂ = x·rsqrt(mean(x²) + eps) in float32, rounded to the input dtype before the weight, "
          "then x̂·w rounded again (HF Llama's order). rsqrt is 1/sqrt (two roundings). Default "
          "eps 1e-6; last dim only. With float16 x and a float32 weight the rounding of x̂ to "
          "float16 is optimised away (measured).")

ENTRIES: list[ZooEntry] = [
    ZooEntry(
        name="tinygrad",
        title="tinygrad nn.RMSNorm (CPU device)",
        package="tinygrad",
        source="tinygrad.nn:RMSNorm",
        convention="llama",
        build=_build,
        dtypes=("float32", "float16"),
        expected={"float32": "pass", "float16": "pass"},
        eps_default=_EPS_DEFAULT,
        normalized_dims="last",
        notes=_NOTES,
    ),
    ZooEntry(
        name="tinygrad-bf16",
        title="tinygrad nn.RMSNorm (CPU device), bfloat16",
        package="tinygrad",
        source="tinygrad.nn:RMSNorm",
        convention="llama",
        build=_build_bf16,
        dtypes=("bfloat16",),
        expected={"bfloat16": "pass"},
        eps_default=_EPS_DEFAULT,
        normalized_dims="last",
        notes=_NOTES + " Needs a clang that converts float to __bf16 (14 and 16 cannot).",
    ),
]
