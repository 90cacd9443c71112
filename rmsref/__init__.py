"""rmsref: the reference implementation of RMSNorm.

``import rmsref`` imports NumPy and ml_dtypes only. The oracle (``rms_norm`` and friends)
computes in float64, is overflow-safe and follows ``torch.nn.functional.rms_norm`` semantics.
Everything else (gradient checks, identities, conventions, validation, fast backends) builds on
it and is loaded when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from rmsref._shapes import bfloat16
from rmsref.backends import available_backends, backend
from rmsref.layernorm import (
    LayerNorm,
    LayerNormGrads,
    layer_norm,
    layer_norm_backward,
    layer_norm_backward_staged,
    layer_norm_forward,
    layer_norm_jvp,
)
from rmsref.rmsnorm import (
    AddRMSNormGrads,
    RMSNorm,
    RMSNormDoubleGrads,
    RMSNormGrads,
    add_rms_norm,
    add_rms_norm_backward,
    add_rms_norm_forward,
    rms_norm,
    rms_norm_backward,
    rms_norm_backward_staged,
    rms_norm_double_backward,
    rms_norm_forward,
    rms_norm_jvp,
)
from rmsref.unitnorm import (
    UnitNorm,
    UnitNormGrads,
    unit_norm,
    unit_norm_backward,
    unit_norm_backward_staged,
    unit_norm_forward,
    unit_norm_jvp,
)

__version__ = "0.1.0"

# name -> (module, attribute or None for the module itself). Loaded on first use so that
# ``import rmsref`` stays cheap; each is NumPy-only unless its docstring says otherwise.
_LAZY: dict[str, tuple[str, str | None]] = {
    "gradcheck": ("rmsref.derivatives", "gradcheck"),
    "GradcheckResult": ("rmsref.derivatives", "GradcheckResult"),
    "validate": ("rmsref.validation", "validate"),
    "ValidationReport": ("rmsref.validation", "ValidationReport"),
    "identities": ("rmsref.identities", None),
    "conventions": ("rmsref.conventions", None),
    "tolerance": ("rmsref.tolerance", None),
    "testing": ("rmsref.testing", None),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'rmsref' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # cached: the next access does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AddRMSNormGrads",
    "LayerNorm",
    "LayerNormGrads",
    "RMSNorm",
    "RMSNormDoubleGrads",
    "RMSNormGrads",
    "UnitNorm",
    "UnitNormGrads",
    "add_rms_norm",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "available_backends",
    "backend",
    "bfloat16",
    "gradcheck",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_backward_staged",
    "layer_norm_forward",
    "layer_norm_jvp",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_backward_staged",
    "rms_norm_double_backward",
    "rms_norm_forward",
    "rms_norm_jvp",
    "unit_norm",
    "unit_norm_backward",
    "unit_norm_backward_staged",
    "unit_norm_forward",
    "unit_norm_jvp",
    "validate",
]
