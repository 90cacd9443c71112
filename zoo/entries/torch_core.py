"""PyTorch's own RMSNorm: ``torch.nn.functional.rms_norm`` and ``torch.nn.RMSNorm`` (instance
and class), wrapped with :func:`rmsref.adapters.torch.wrap` as the docs tell users to.

What torch 2.13 computes (``aten/src/ATen/native/layer_norm.cpp``, ``rms_norm_composite``; checked
bit for bit in tests/test_conventions.py): x upcast to opmath (float32 for half types, float64 for
float64), rstd = rsqrt(mean(x²) + eps), y = R_in((f32(x)·rstd)·f32(w)): one rounding, the output in
the input's dtype whatever the weight's. eps=None means finfo(opmath).eps. The module keeps its
``normalized_shape`` (any number of trailing dims). So: the ``torch`` convention, in every dtype
including float64.
"""

from __future__ import annotations

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_DTYPES = ("float32", "bfloat16", "float16", "float64")
_ALL_PASS = dict.fromkeys(_DTYPES, "pass")


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ZooUnavailable(f"torch is not installed ({exc}): pip install torch") from exc
    return torch


def _functional() -> Callables:
    from rmsref.adapters.torch import wrap

    return wrap(_torch().nn.functional.rms_norm, name="torch.nn.functional.rms_norm")


def _module_class() -> Callables:
    from rmsref.adapters.torch import wrap

    return wrap(_torch().nn.RMSNorm)


def _module_instance() -> Callables:
    """An instance with random weights, as a user's model holds it (eps left at None)."""
    from rmsref.adapters.torch import wrap

    torch = _torch()
    module = torch.nn.RMSNorm(768)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        module.weight.copy_(1.0 + 0.1 * torch.randn(768, generator=g))
    return wrap(module, name="torch.nn.RMSNorm(768)")


ENTRIES = [
    ZooEntry(
        name="torch-f-rms-norm",
        title="torch.nn.functional.rms_norm",
        package="torch",
        source="torch.nn.functional:rms_norm",
        convention="torch",
        build=_functional,
        dtypes=_DTYPES,
        expected=_ALL_PASS,
        notes="The reference point of the other rows: opmath accumulation, one rounding of "
              "x̂·w, eps=None is finfo(opmath).eps, float64 computed in float64.",
    ),
    ZooEntry(
        name="torch-rmsnorm-class",
        title="torch.nn.RMSNorm (class, built per call)",
        package="torch",
        source="torch.nn:RMSNorm",
        convention="torch",
        build=_module_class,
        dtypes=_DTYPES,
        expected=_ALL_PASS,
        notes="forward is F.rms_norm(x, self.normalized_shape, self.weight, self.eps): the same "
              "bits; the adapter builds it from its signature (normalized_shape, eps).",
    ),
    ZooEntry(
        name="torch-rmsnorm-instance",
        title="torch.nn.RMSNorm(768) (instance, random weight)",
        package="torch",
        source="torch.nn:RMSNorm",
        convention="torch",
        build=_module_instance,
        dtypes=_DTYPES,
        expected=_ALL_PASS,
        notes="Run as a private copy with each probe's weight (torch.func.functional_call); the "
              "instance's own weight and eps are never touched.",
    ),
]
