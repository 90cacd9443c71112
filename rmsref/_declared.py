"""What an implementation declares about itself, carried from its adapter to ``validate``.

A module knows things a bare function does not say: HF's ``LlamaRMSNorm`` stores its eps as
``variance_epsilon`` (1e-6), normalises the last dimension only, and Gemma's uses its weight as
1 + w. An adapter reads these from the object and attaches them to the forward callable it
returns, as the attribute ``rmsref_declared``::

    fwd, bwd = rmsref.adapters.torch.wrap(module)
    fwd.rmsref_declared      # Declared(eps_default=1e-06, normalized_dims='last', offset=0.0, ...)

``validate`` reads it with :func:`declared_by` and the caller can override any field
(``validate(..., eps_default=1e-6, normalized_dims="last")``). A probe that does not apply to what
was declared (a two-dimensional normalised shape for a last-dimension module) is reported as not
applicable with the reason, never as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

NormalizedDims = Literal["any", "last"]

#: Attribute names under which modules store their eps (torch, HF, flax/keras).
EPS_NAMES = ("eps", "variance_epsilon", "epsilon")


@dataclass(frozen=True)
class Declared:
    """What an implementation computes by its own account.

    Attributes
    ----------
    eps_default : float or None
        The eps it uses when called with eps=None; None: the convention's default.
    normalized_dims : {"any", "last"}
        "last" when it normalises the last dimension only (most modules).
    offset : float or None
        1.0 when the weight is used as 1 + w (Gemma), 0.0 when as w; None: not known.
    param_dtype : str or None
        The dtype of its own parameters, as built.
    has_weight : bool
        False when it has no weight: the probes' weights are then dropped (and the report says so).
    takes_eps : bool
        False when eps cannot be set: probes with an explicit eps are then not applicable.
    """

    eps_default: float | None = None
    normalized_dims: NormalizedDims = "any"
    offset: float | None = None
    param_dtype: str | None = None
    has_weight: bool = True
    takes_eps: bool = True

    def overridden(self, **fields: Any) -> Declared:
        """A copy with the fields that are not None replaced (the caller's word wins)."""
        given = {k: v for k, v in fields.items() if v is not None}
        if "normalized_dims" in given and given["normalized_dims"] not in ("any", "last"):
            raise ValueError(f"normalized_dims must be 'any' or 'last'; got "
                             f"{given['normalized_dims']!r}")
        if "eps_default" in given:
            given["eps_default"] = _eps(given["eps_default"])
        return replace(self, **given)


#: What a bare function declares: nothing (the convention's defaults apply).
NOTHING_DECLARED = Declared()


def _eps(value: Any) -> float:
    try:
        e = float(value)
    except (TypeError, ValueError):
        e = float("nan")
    if not (e >= 0.0 and e != float("inf")):
        raise ValueError(f"eps_default must be a finite non-negative real number; got {value!r} "
                         f"({type(value).__name__})")
    return e


def declared_by(fn: Any) -> Declared:
    """The declaration an adapter attached to ``fn`` (an empty one when there is none)."""
    d = getattr(fn, "rmsref_declared", None)
    return d if isinstance(d, Declared) else NOTHING_DECLARED


def eps_attribute(obj: Any) -> tuple[str | None, Any]:
    """``(name, value)`` of the first of :data:`EPS_NAMES` that ``obj`` has, else (None, None)."""
    for attr in EPS_NAMES:
        if hasattr(obj, attr):
            return attr, getattr(obj, attr)
    return None, None
