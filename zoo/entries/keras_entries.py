"""Keras 3's RMSNorm on its JAX backend: ``keras.ops.rms_normalization`` and
``keras.layers.RMSNormalization``, wrapped with :func:`rmsref.adapters.jax.wrap`.

The backend. Keras picks its backend once, when it is first imported, from ``KERAS_BACKEND``. The
build functions set ``KERAS_BACKEND=jax`` if keras has not been imported yet in this process, and
raise :class:`ZooUnavailable` if it was imported earlier with another backend. JAX, because on it
Keras runs its own arithmetic (on the torch backend ``rms_normalization`` hands contiguous axes to
``torch.nn.functional.rms_norm``, which the torch entries already cover), and because its autodiff
(``jax.vjp``) gives the backward of exactly that arithmetic.

What ``_rms_normalization`` in ``keras/src/ops/nn.py`` computes (read on keras 3.15.1):

- ``epsilon=None`` means ``keras.config.epsilon()``, 1e-7 unless the user changed it; the layer's
  own default is ``epsilon=1e-6``, which it always passes;
- x is converted once to ``result_type(x.dtype, "float32")`` and the scale to that same dtype;
- ``rrms = rsqrt(mean(square(x), axis, keepdims=True) + epsilon)``, ``outputs = x * rrms``, then
  ``outputs * scale``, and one cast back to x's dtype: the ``torch`` convention,
  y = R_in((f32(x)·rstd)·f32(w));
- ``axis`` may be a tuple (sorted first), so the trailing axes of ``normalized_shape`` are passed.

x reaches float32 through one conversion only, so ``jax.vjp`` rounds dx once: the backward is
expected to pass in every dtype. The layer builds its float32 ``scale`` unless given a dtype
policy; as a user running a bfloat16 model would, the wrapper builds it with ``dtype=`` the input's
dtype, and applies it with ``stateless_call`` (the probe's weight replaces the variable's value in
that call only).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_OPS_EPS_DEFAULT = 1e-7      # keras.config.epsilon(), used when epsilon=None
_LAYER_EPS_DEFAULT = 1e-6    # RMSNormalization(epsilon=1e-6)


def _keras() -> tuple[Any, Any]:
    """keras on its JAX backend, and rmsref's JAX adapter."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "jax"        # read by keras on its first import only
    try:
        import keras
    except ImportError as exc:
        raise ZooUnavailable(f"keras is not installed ({exc}): pip install keras") from exc
    if keras.backend.backend() != "jax":
        raise ZooUnavailable(f"keras was imported with the {keras.backend.backend()!r} backend "
                             "before this entry; run it in a process that sets KERAS_BACKEND=jax "
                             "before keras is first imported")
    from rmsref.adapters import jax as jax_adapter
    return keras, jax_adapter


def _trailing_axes(normalized_shape: Any) -> tuple[int, ...]:
    k = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return tuple(range(-k, 0))


def _build_ops() -> Callables:
    keras, jax_adapter = _keras()

    def keras_ops_rms_normalization(x, normalized_shape, weight, eps):
        return keras.ops.rms_normalization(x, scale=weight, axis=_trailing_axes(normalized_shape),
                                           epsilon=eps)

    return jax_adapter.wrap(keras_ops_rms_normalization)


def _build_layer() -> Callables:
    keras, jax_adapter = _keras()

    def keras_rms_normalization_layer(x, normalized_shape, weight, eps):
        kwargs = {} if eps is None else {"epsilon": eps}
        layer = keras.layers.RMSNormalization(axis=_trailing_axes(normalized_shape),
                                              dtype=str(x.dtype), **kwargs)
        layer.build(x.shape)
        if weight is None:
            return layer(x)                       # its own scale: ones
        y, _ = layer.stateless_call([weight], [], x)
        return y

    return jax_adapter.wrap(keras_rms_normalization_layer)


_PASS = {"float32": "pass", "bfloat16": "pass", "float16": "pass"}

ENTRIES: list[ZooEntry] = [
    ZooEntry(
        name="keras-ops",
        title="keras.ops.rms_normalization (JAX backend)",
        package="keras",
        source="keras.src.ops.nn:rms_normalization",
        convention="torch",
        build=_build_ops,
        expected=dict(_PASS),
        eps_default=_OPS_EPS_DEFAULT,
        normalized_dims="any",
        notes="Same order as F.rms_norm (x·rstd, then ·scale, one rounding). Default eps is "
              "keras.config.epsilon() = 1e-7 rather than torch's 2^-23.",
    ),
    ZooEntry(
        name="keras-layer",
        title="keras.layers.RMSNormalization (JAX backend, stateless_call)",
        package="keras",
        source="keras.src.layers.normalization.rms_normalization:RMSNormalization",
        convention="torch",
        build=_build_layer,
        expected=dict(_PASS),
        eps_default=_LAYER_EPS_DEFAULT,
        normalized_dims="any",
        notes="Calls keras.ops.rms_normalization with its own epsilon, 1e-6 by default. Always "
              "scales (no use_scale option); its scale is float32 unless the layer is built with "
              "a dtype policy.",
    ),
]
