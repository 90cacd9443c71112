"""JAX as plain array callables: a function ``f(x, normalized_shape, weight, eps)`` and its
``jax.vjp`` as the backward. jax is imported when an adapter is built, never by ``import rmsref``.

bfloat16 crosses without loss: JAX's bfloat16 *is* ml_dtypes' bfloat16, so NumPy arrays go in
and come out as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rmsref._shapes import normalize_shape


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:  # pragma: no cover - exercised only without jax
        raise ImportError("the JAX adapter needs jax: pip install 'rmsref[jax]'") from exc
    return jax, jnp


def _shape_arg(shape: tuple[int, ...]) -> Any:
    return shape[0] if len(shape) == 1 else shape


def wrap(fn: Callable[..., Any]) -> tuple[Callable[..., np.ndarray], Callable[..., Any]]:
    """(forward, backward) NumPy callables for a JAX RMSNorm function.

    Parameters
    ----------
    fn : callable
        ``fn(x, normalized_shape, weight, eps) -> y`` on JAX arrays (``weight`` may be None).

    Returns
    -------
    (forward, backward)
        ``forward(x, normalized_shape, weight=None, eps=None) -> y`` and
        ``backward(dy, x, normalized_shape, weight=None, eps=None) -> (dx, dweight)`` where the
        backward is ``jax.vjp`` of ``fn`` with respect to x (and weight when given).
    """
    jax, jnp = _jax()

    def forward(x, normalized_shape, weight=None, eps=None):
        shape = _shape_arg(normalize_shape(normalized_shape))
        w = None if weight is None else jnp.asarray(np.ascontiguousarray(weight))
        return np.asarray(fn(jnp.asarray(np.ascontiguousarray(x)), shape, w, eps))

    def backward(dy, x, normalized_shape, weight=None, eps=None):
        shape = _shape_arg(normalize_shape(normalized_shape))
        xj = jnp.asarray(np.ascontiguousarray(x))
        g = jnp.asarray(np.ascontiguousarray(dy))
        if weight is None:
            _, vjp = jax.vjp(lambda a: fn(a, shape, None, eps), xj)
            (dx,) = vjp(g)
            return np.asarray(dx), None
        wj = jnp.asarray(np.ascontiguousarray(weight))
        _, vjp = jax.vjp(lambda a, b: fn(a, shape, b, eps), xj, wj)
        dx, dw = vjp(g)
        return np.asarray(dx), np.asarray(dw)

    name = getattr(fn, "__name__", "jax_function")
    forward.__name__ = backward.__name__ = name
    return forward, backward


def wrap_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A hand-written JAX backward ``(dy, x, normalized_shape, weight, eps)`` on NumPy arrays."""
    _, jnp = _jax()

    def call(*args, **kwargs):
        conv = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        out = fn(*conv, **kwargs)
        if isinstance(out, (tuple, list)):
            return tuple(None if o is None else np.asarray(o) for o in out)
        return np.asarray(out)

    return call
