"""Flax's RMSNorm, linen and nnx, applied functionally with the probe's scale (never a stored one).

Both APIs share one computation (``_compute_stats`` and ``_normalize`` in
``flax/linen/normalization.py`` and ``flax/nnx/nn/normalization.py``), read on flax 0.12.8:

- the statistic: x is converted to ``promote_types(x.dtype, float32)`` and ``var = mean(x²)`` is
  taken over ``reduction_axes`` in float32 (``use_mean=False``: no centring);
- the epilogue: ``y = x - mean`` with a float32 zero mean (so y is x promoted to float32, by a
  *second*, implicit conversion of x), ``mul = rsqrt(var + epsilon)``, ``mul *= scale``,
  ``y *= mul`` and one final cast to ``result_type(x, scale)``: the ``flax`` convention,
  y = R_out(f32(x)·R(rstd·scale));
- ``epsilon`` defaults to 1e-6; ``reduction_axes = feature_axes = -1`` by default, and both take a
  tuple, so the wrapper below normalises the trailing ``len(normalized_shape)`` axes;
- nnx first casts x and scale to their common dtype (``promote_dtype``); with the probe's weight in
  the input's dtype that changes nothing.

The backward is ``jax.vjp`` of the apply. Because x reaches float32 through two separate
conversions (one in ``_compute_stats``, one in ``y = x - mean``), autodiff transposes each
conversion on its own: the direct term and the term through rstd are each rounded to the input
dtype and then added in it. In float32 that is harmless; in bfloat16/float16 it is the
``separately_rounded_terms`` mistake (checked: flax's bfloat16 dx equals R(R(direct) + R(through
rstd)) on every element of a 16 x 768 Gaussian case, and a once-rounded sum on 74 % of them).
"""

from __future__ import annotations

import math
from typing import Any

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_EPS_DEFAULT = 1e-6          # flax.linen.RMSNorm.epsilon and nnx.RMSNorm(epsilon=...) defaults
_HALF_BACKWARD = "fail:separately_rounded_terms"


def _imports() -> tuple[Any, Any, Any]:
    try:
        import flax.linen as linen
        from flax import nnx
    except ImportError as exc:
        raise ZooUnavailable(f"flax is not installed ({exc}): pip install flax") from exc
    from rmsref.adapters import jax as jax_adapter
    return linen, nnx, jax_adapter


def _trailing_axes(normalized_shape: Any) -> tuple[int, ...]:
    """The axes flax should reduce over and scale along: the last ``len(normalized_shape)``."""
    k = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return tuple(range(-k, 0))


def _eps_kwargs(eps: float | None) -> dict[str, float]:
    """eps=None leaves flax's own default in place."""
    return {} if eps is None else {"epsilon": eps}


def _build_linen() -> Callables:
    linen, _, jax_adapter = _imports()

    def flax_linen_rms_norm(x, normalized_shape, weight, eps):
        axes = _trailing_axes(normalized_shape)
        layer = linen.RMSNorm(use_scale=weight is not None, reduction_axes=axes,
                              feature_axes=axes, **_eps_kwargs(eps))
        variables = {} if weight is None else {"params": {"scale": weight}}
        return layer.apply(variables, x)

    return jax_adapter.wrap(flax_linen_rms_norm)


def _build_nnx() -> Callables:
    _, nnx, jax_adapter = _imports()

    def flax_nnx_rms_norm(x, normalized_shape, weight, eps):
        axes = _trailing_axes(normalized_shape)
        n = normalized_shape if isinstance(normalized_shape, int) else math.prod(normalized_shape)
        # A fresh module per call; its initial (ones) scale is swapped for the probe's weight in
        # the split state, so no module is changed after it is built.
        layer = nnx.RMSNorm(n, use_scale=weight is not None, reduction_axes=axes,
                            feature_axes=axes, rngs=nnx.Rngs(0), **_eps_kwargs(eps))
        if weight is None:
            return layer(x)
        graphdef, state = nnx.split(layer)
        state["scale"] = state["scale"].replace(weight)
        return nnx.merge(graphdef, state)(x)

    return jax_adapter.wrap(flax_nnx_rms_norm)


_NOTES = (
    "Same arithmetic as torch's F.rms_norm except the epilogue order: rsqrt(var + eps) is "
    "multiplied by the scale first (rounded in float32), then by x, and the result is cast to "
    "result_type(x, scale) (float32 for a bfloat16 x with flax's default float32 scale). Default "
    "epsilon 1e-6, last axis only unless reduction_axes/feature_axes say otherwise (the wrapper "
    "passes the trailing axes of normalized_shape). Backward (jax.vjp): x is converted to float32 "
    "twice (for the statistic and for y = x - 0), so on half types dx is the sum of two terms each "
    "already rounded to the input dtype."
)

ENTRIES: list[ZooEntry] = [
    ZooEntry(
        name="flax-linen",
        title="flax.linen.RMSNorm (apply with params)",
        package="flax",
        source="flax.linen.normalization:RMSNorm",
        convention="flax",
        build=_build_linen,
        expected={"float32": "pass", "bfloat16": _HALF_BACKWARD, "float16": _HALF_BACKWARD},
        eps_default=_EPS_DEFAULT,
        normalized_dims="any",
        notes=_NOTES,
    ),
    ZooEntry(
        name="flax-nnx",
        title="flax.nnx.RMSNorm (split/merge with the weight)",
        package="flax",
        source="flax.nnx.nn.normalization:RMSNorm",
        convention="flax",
        build=_build_nnx,
        expected={"float32": "pass", "bfloat16": _HALF_BACKWARD, "float16": _HALF_BACKWARD},
        eps_default=_EPS_DEFAULT,
        normalized_dims="any",
        notes=_NOTES + " nnx casts x and scale to their common dtype before all of this.",
    ),
]
