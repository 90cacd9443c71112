"""Liger-Kernel's ``LigerRMSNorm`` (a Triton kernel) under Triton's CPU interpreter.

Running it without a GPU. Triton decides, when a kernel is *decorated* (``@triton.jit``, at the
import of ``liger_kernel.ops.rms_norm``), whether it is compiled or interpreted in NumPy, from the
environment variable ``TRITON_INTERPRET``. So ``build`` sets ``TRITON_INTERPRET=1`` before it
imports liger_kernel, and refuses (:class:`ZooUnavailable`) if liger's kernels were already
decorated as compiled kernels in this process. A test process that runs this entry should either
start with ``TRITON_INTERPRET=1`` in its environment or import nothing that imports liger_kernel
first. (The variable stays set for the rest of the process: later Triton kernels are interpreted.)

What it finds, on liger-kernel 0.8.5 with triton 3.9.0: the forward kernel fails at its first
line of arithmetic, ``eps = eps.to(tl.float32)`` (and likewise ``offset.to``): Triton's interpreter
passes a Python float kernel argument as a plain ``float`` (its ``_implicit_cvt`` wraps bools,
ints and tensors, not floats), which has no ``.to``. Compiled Triton turns it into an fp32 scalar.
Past that line a second obstacle waits: liger's ``rsqrt`` is CUDA libdevice's
(``triton.language.extra.libdevice.rsqrt``), which in the same interpreter returns None (checked
with a three-line kernel: "cannot convert None of type NoneType to tensor"). ``build`` runs one
tiny forward and raises :class:`ZooUnavailable` with the interpreter's error when it fails, so a
future liger or Triton that fixes both is run, not skipped.

The expected verdict, from reading ``liger_kernel/ops/rms_norm.py`` (casting mode ``"llama"``,
``LigerRMSNorm``'s default, with ``eps=1e-6``, ``offset=0.0``, ``in_place=True``):

- forward: x is loaded and upcast to float32, ``mean_square = sum(x*x) / n_cols``,
  ``rstd = rsqrt(mean_square + eps)`` (fp32, saved per row), ``x̂ = (x*rstd).to(x.dtype)`` (first
  rounding), ``y = x̂ * (offset + w)`` with ``offset + w`` in fp32, stored in y's dtype (second
  rounding): the ``llama`` convention;
- backward: ``m = dy * (w + offset)`` in fp32, ``dx = rstd*m - rstd * (1/n) * rstd² * sum(m*x) *
  x`` in fp32, one rounding to x's dtype: correct;
- dweight: ``dw += dy * (x*rstd).to(x.dtype)`` per row into an fp32 partial per program, the
  partials summed by torch and cast to w's dtype: the derivative of its own rounded forward;
- the kernel views x as ``(-1, x.shape[-1])``: only the last dim is normalised;
- ``in_place=True`` writes dx into dy's storage; the torch adapter gives it a copy of dy.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_EPS_DEFAULT = 1e-6          # LigerRMSNorm(hidden_size, eps=1e-6)


def _interpreted(module) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(module._rms_norm_forward_kernel, InterpretedFunction)


def _build() -> Callables:
    if "liger_kernel.ops.rms_norm" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"       # read when liger's kernels are decorated
    try:
        import liger_kernel.ops.rms_norm as liger_ops
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError as exc:
        raise ZooUnavailable(f"liger-kernel or triton is not installed ({exc}): "
                             "pip install liger-kernel") from exc
    if not _interpreted(liger_ops):
        raise ZooUnavailable("liger_kernel was imported before TRITON_INTERPRET=1 was set: its "
                             "kernels are compiled for a GPU; start the process with "
                             "TRITON_INTERPRET=1")
    from rmsref.adapters import torch as torch_adapter

    try:   # wrapping may already run the module (to read what it declares)
        forward, backward = torch_adapter.wrap(LigerRMSNorm)
        forward(np.ones((1, 8), np.float32), 8, np.ones(8, np.float32), None)
    except Exception as exc:
        raise ZooUnavailable(f"LigerRMSNorm does not run under Triton's CPU interpreter: "
                             f"{type(exc).__name__}: {exc}") from exc
    return forward, backward


ENTRIES: list[ZooEntry] = [
    ZooEntry(
        name="liger",
        title="liger-kernel LigerRMSNorm (Triton, CPU interpreter)",
        package="liger-kernel",
        source="liger_kernel.transformers.rms_norm:LigerRMSNorm",
        convention="llama",
        build=_build,
        expected={"float32": "pass", "bfloat16": "pass", "float16": "pass"},
        eps_default=_EPS_DEFAULT,
        normalized_dims="last",
        notes="HF Llama's order in one Triton kernel: x̂ rounded to the input dtype, then ·w "
              "rounded again; fp32 statistic saved per row; dx in fp32, rounded once; dweight "
              "from the rounded x̂. Default eps 1e-6; last dim only. Does not run under Triton "
              "3.9's interpreter (eps.to on a Python float; libdevice rsqrt).",
    ),
]
