"""Input handling shared by every implementation: dtypes, ``normalized_shape``, eps, rows.

Everything here raises an error that names what it received: a wrong shape or dtype is
never silently broadcast or cast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

try:
    from numpy.exceptions import TooHardError
except ImportError:  # NumPy < 1.25
    from numpy import TooHardError  # type: ignore[attr-defined,no-redef]

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: The floating dtypes rmsref accepts, by name.
FLOAT_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": bfloat16,
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
COMPLEX_DTYPES: dict[str, np.dtype] = {
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
}
SUPPORTED_DTYPES: dict[str, np.dtype] = {**FLOAT_DTYPES, **COMPLEX_DTYPES}

ShapeLike = int | Sequence[int]


def as_array(a: Any, name: str) -> np.ndarray:
    """Return ``a`` as a NumPy array of a supported dtype, without copying when possible.

    Accepts NumPy arrays, torch tensors (bfloat16 included, on any device), JAX arrays, CuPy
    arrays, and anything with ``__array__`` or ``__dlpack__``. Raises ``TypeError`` naming the
    dtype for integer, bool, object, string and other unsupported dtypes.
    """
    from_framework = None if isinstance(a, np.ndarray) else _framework_array(a)
    if isinstance(a, np.ndarray):
        arr = a
    elif from_framework is not None:
        arr = from_framework
    elif hasattr(a, "__array__"):
        arr = np.asarray(a)
    elif hasattr(a, "__dlpack__"):
        arr = np.from_dlpack(a)
    elif isinstance(a, (int, float, complex, list, tuple)):
        arr = np.asarray(a)
    else:
        raise TypeError(
            f"{name} must be an array (NumPy, or an object with __array__ or __dlpack__), "
            f"got {type(a).__name__}"
        )
    if arr.dtype not in SUPPORTED_DTYPES.values():
        raise TypeError(
            f"{name} has dtype {arr.dtype}; rmsref accepts "
            f"{', '.join(SUPPORTED_DTYPES)} "
            "(cast integer inputs explicitly, e.g. x.astype(np.float32))"
        )
    return arr


def _framework_array(a: Any) -> np.ndarray | None:
    """A torch tensor or CuPy array as NumPy, bits unchanged; None for anything else.

    NumPy's own conversion fails on both (torch bfloat16 has no NumPy dtype, CuPy refuses the
    implicit device-to-host copy); JAX arrays convert through ``__array__`` (their bfloat16 is
    ml_dtypes').
    """
    package = type(a).__module__.partition(".")[0]
    if package == "torch":
        from rmsref.adapters.torch import to_numpy

        return to_numpy(a)
    if package == "cupy":
        return a.get()
    return None


def to_numpy(a: Any) -> np.ndarray:
    """An implementation's output as NumPy, bits unchanged (torch bfloat16 and CuPy included)."""
    from_framework = None if isinstance(a, np.ndarray) else _framework_array(a)
    return np.asarray(a) if from_framework is None else from_framework


def normalize_shape(normalized_shape: ShapeLike) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of positive ints (an int ``N`` means ``(N,)``)."""
    if isinstance(normalized_shape, (int, np.integer)) and not isinstance(normalized_shape, bool):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(normalized_shape)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}"
            ) from None
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
            raise TypeError(
                f"normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}"
            )
        shape = tuple(int(d) for d in shape)
    if len(shape) == 0:
        raise ValueError(
            "normalized_shape is empty: name at least one trailing dimension to normalise"
        )
    if any(d <= 0 for d in shape):
        raise ValueError(
            f"normalized_shape {shape} has a dimension <= 0: a row must have N >= 1 features"
        )
    return shape


def check_input(x: np.ndarray, shape: tuple[int, ...], name: str = "input") -> None:
    """Raise ValueError unless the trailing dims of ``x`` are ``shape``."""
    k = len(shape)
    if x.ndim < k or tuple(x.shape[x.ndim - k :]) != shape:
        raise ValueError(
            f"normalized_shape {shape} does not match the trailing dims of {name} "
            f"with shape {tuple(x.shape)}"
        )


def check_param(p: Any, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Validate an optional per-feature parameter (weight, bias, or a tangent of one)."""
    if p is None:
        return None
    arr = as_array(p, name)
    if tuple(arr.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(arr.shape)} but normalized_shape is {shape}")
    return arr


def check_same_shape(a: np.ndarray, x: np.ndarray, name: str, xname: str = "x") -> None:
    """Raise ValueError unless ``a`` has the shape of ``x`` (e.g. ``dy`` and ``x``)."""
    if a.shape != x.shape:
        raise ValueError(
            f"{name} has shape {tuple(a.shape)} but {xname} has shape {tuple(x.shape)}"
        )


def opmath_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype PyTorch computes in for ``dtype``: float32 for half types, else itself."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float16), bfloat16):
        return np.dtype(np.float32)
    return dtype


def default_eps(dtype: np.dtype) -> float:
    """``eps=None`` for RMSNorm: machine epsilon of the opmath dtype (current PyTorch).

    float16/bfloat16/float32 -> 2**-23 (1.1920929e-07); float64 -> 2**-52. complex64 uses
    float32's, complex128 float64's. PyTorch before its fp32-opmath change (and its OpInfo
    reference) used the *input* dtype's eps, e.g. 2**-7 for bfloat16; see docs/semantics.md.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        dtype = np.dtype(np.float32) if dtype == np.complex64 else np.dtype(np.float64)
    return float(np.finfo(opmath_dtype(dtype)).eps)


def resolve_eps(eps: float | None, dtype: np.dtype, default: float | None = None) -> float:
    """Return eps as a float; ``None`` means ``default`` or, if that is None, ``default_eps``.

    Negative finite eps is accepted (PyTorch accepts it); rows with mean(x^2) + eps <= 0 then
    give NaN. Non-finite eps is a ValueError.
    """
    if eps is None:
        return default_eps(dtype) if default is None else float(default)
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise TypeError(f"eps must be a real number or None, got {eps!r}") from None
    if not np.isfinite(value):
        raise ValueError(f"eps must be finite, got {eps!r}")
    return value


def compute_dtype(*arrays: np.ndarray | None) -> np.dtype:
    """float64, or complex128 when any input is complex (complex-step differentiation)."""
    if any(a is not None and a.dtype.kind == "c" for a in arrays):
        return np.dtype(np.complex128)
    return np.dtype(np.float64)


def resolve_out_dtype(out_dtype: Any, x: np.ndarray) -> np.dtype:
    """The output dtype: ``out_dtype`` if given (validated), else the input's dtype."""
    if out_dtype is None:
        return x.dtype
    try:
        dt = np.dtype(out_dtype)
    except TypeError:
        raise TypeError(f"out_dtype {out_dtype!r} is not a dtype") from None
    if dt not in SUPPORTED_DTYPES.values():
        raise TypeError(
            f"out_dtype {dt} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}"
        )
    return dt


def resolve_partial(partial: float | None, n: int) -> int:
    """Number of features K = floor(N * p) that estimate the RMS in pRMSNorm (K = N when None)."""
    if partial is None:
        return n
    p = float(partial)
    if not (0.0 < p <= 1.0):
        raise ValueError(f"partial must be in (0, 1], got {partial!r}")
    k = int(np.floor(n * p))
    if k < 1:
        raise ValueError(
            f"partial={partial!r} with N={n} features leaves floor(N*p)={k} features to estimate "
            "the RMS from; use a larger p"
        )
    return k


def rows_view(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` as a (M, N) array of rows: a view when the layout allows, else a copy."""
    return x.reshape(-1, int(np.prod(shape)))


def check_rstd(rstd: Any, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """Validate a saved rstd: shape ``lead`` or ``lead + (1,)*k``; return it as (M, 1)."""
    if rstd is None:
        return None
    arr = np.asarray(rstd)
    if arr.dtype not in SUPPORTED_DTYPES.values():
        raise TypeError(f"rstd has dtype {arr.dtype}; expected a floating dtype")
    lead = tuple(x.shape[: x.ndim - len(shape)])
    if tuple(arr.shape) not in (lead, lead + (1,) * len(shape)):
        raise ValueError(
            f"rstd has shape {tuple(arr.shape)}; for input of shape {tuple(x.shape)} and "
            f"normalized_shape {shape} expected {lead} or {lead + (1,) * len(shape)}"
        )
    return arr.reshape(-1, 1)


def prepare_input(
    x: Any, normalized_shape: ShapeLike, name: str = "input"
) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
    """Validate ``x`` and ``normalized_shape``; return (array, shape tuple, (M, N) rows view)."""
    arr = as_array(x, name)
    shape = normalize_shape(normalized_shape)
    check_input(arr, shape, name)
    return arr, shape, rows_view(arr, shape)


def param_row(p: Any, name: str, shape: tuple[int, ...], ctype: np.dtype) -> np.ndarray | None:
    """A validated per-feature parameter as a (1, N) row in the compute dtype (or None)."""
    arr = check_param(p, name, shape)
    if arr is None:
        return None
    return arr.reshape(1, -1).astype(ctype)


def stat_shape(x: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of a saved per-row statistic: the leading dims, then 1 per normalised dim."""
    return tuple(x.shape[: x.ndim - len(shape)]) + (1,) * len(shape)


def result_dtype(dtype: np.dtype, ctype: np.dtype) -> np.dtype:
    """The dtype a result takes: ``dtype``, promoted to complex when the computation is complex.

    A real x with a complex dy (complex-step differentiation through the backward) must give a
    complex dx, not a silently discarded imaginary part.
    """
    dtype = np.dtype(dtype)
    if np.dtype(ctype).kind != "c" or dtype.kind == "c":
        return dtype
    return np.dtype(np.complex128) if dtype == np.float64 else np.dtype(np.complex64)


def check_out(
    out: Any, shape: tuple[int, ...], dtype: np.dtype, inputs: dict[str, Any], name: str = "out"
) -> np.ndarray | None:
    """Validate a caller's output array (``out=``); return it, or None when ``out`` is None.

    ``out`` must be a writeable NumPy array of exactly the result's ``shape`` and ``dtype``
    (nothing is cast or broadcast: a silent cast would hide a second rounding) and must not
    overlap any of ``inputs`` (name -> array): a result written over an input it still has to
    read would be wrong, so in-place calls are refused rather than guessed at.
    """
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(out.shape)}; the result has shape {shape}")
    if out.dtype != np.dtype(dtype):
        raise TypeError(
            f"{name} has dtype {out.dtype}; the result has dtype {np.dtype(dtype)} (pass "
            "out_dtype= to change the result's dtype)"
        )
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only")
    for iname, a in inputs.items():
        if isinstance(a, np.ndarray) and _overlap(out, a):
            raise ValueError(
                f"{name} shares memory with {iname}; in-place results are not supported "
                "(pass a separate array)"
            )
    return out


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` share an element: the cheap bounds test, then the exact one for
    interleaved views of one buffer (bounded work; "too hard" counts as overlapping)."""
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=1_000_000))
    except TooHardError:
        return True


def reshape_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped without copying, or None when its strides do not allow it."""
    try:
        return a.reshape(shape, copy=False)
    except ValueError:
        return None
    except TypeError:  # NumPy < 2.1 has no copy=; setting .shape refuses to copy
        v = a.view()
        try:
            v.shape = shape
        except AttributeError:
            return None
        return v


def rows_into(out: np.ndarray | None, m: int, n: int, dtype: np.dtype) -> np.ndarray:
    """(M, N) rows to compute a result into: a view of ``out`` when its layout allows (so the
    result is written in place), else a new array that ``into_out`` then copies into ``out``."""
    rows = None if out is None else reshape_view(out, (m, n))
    return np.empty((m, n), dtype) if rows is None else rows


def into_out(result: np.ndarray, out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """The result to return: ``result`` reshaped to ``shape``, or ``out`` itself (the object the
    caller passed, as NumPy's ``out=`` does) after copying ``result`` into it unless the result
    was computed in ``out``'s memory already."""
    if out is None:
        return result.reshape(shape)
    if not np.may_share_memory(result, out):
        np.copyto(out, result.reshape(out.shape))
    return out
