"""Input handling shared by every implementation: dtypes, ``normalized_shape``, eps, rows.

Everything here raises an error that names what it received: a wrong shape or dtype is
never silently broadcast or cast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
#: How :func:`prepare` takes an array argument: ``convert(a, name)`` (default :func:`as_array`).
ArrayTaker = Callable[[Any, str], Any]


def as_array(a: Any, name: str) -> np.ndarray:
    """Return ``a`` as a NumPy array of a supported dtype, without copying when possible.

    Accepts NumPy arrays, torch tensors (bfloat16 included, on any device), JAX arrays, CuPy
    arrays, and anything with ``__array__`` or ``__dlpack__``. The policies every entry point
    shares (so that no two backends disagree on what they accept):

    * integer, bool, object, string and other unsupported dtypes: ``TypeError`` naming the dtype;
    * masked arrays (``numpy.ma``): ``TypeError``. A norm over a row with holes has no single
      meaning (leave the masked values out of the statistic? out of the output?), so rmsref asks
      the caller to decide: pass ``a.filled(value)`` or ``a.data``;
    * ``numpy.matrix`` and other ndarray subclasses: used as the plain ndarray they hold (a view;
      a matrix is always 2-D, so ``normalized_shape`` applies to its columns);
    * big-endian (non-native byte order) arrays: converted to native byte order (a copy; the
      values are unchanged).
    """
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a masked array (numpy.ma); rmsref does not guess what a masked element "
            f"means for a norm: pass {name}.filled(value) or {name}.data"
        )
    from_framework = None if isinstance(a, np.ndarray) else _framework_array(a)
    if isinstance(a, np.ndarray):
        arr = a if type(a) is np.ndarray else np.asarray(a)
    elif from_framework is not None:
        arr = from_framework
    elif hasattr(a, "__array__"):
        arr = np.asarray(a)
    elif hasattr(a, "__dlpack__"):
        arr = np.from_dlpack(a)
    elif isinstance(a, (int, float, complex, list, tuple)) and not isinstance(a, bool):
        arr = np.asarray(a)
    else:
        raise TypeError(
            f"{name} must be an array (NumPy, or an object with __array__ or __dlpack__), "
            f"got {type(a).__name__}"
        )
    if arr.dtype.byteorder not in ("=", "|") and arr.dtype.newbyteorder("=") in (
        SUPPORTED_DTYPES.values()
    ):
        arr = arr.astype(arr.dtype.newbyteorder("="))  # big-endian: same values, native order
    check_dtype(arr.dtype, name)
    return arr


def check_dtype(dtype: Any, name: str) -> np.dtype:
    """``dtype`` when rmsref accepts it (:data:`SUPPORTED_DTYPES`), else a ``TypeError`` naming
    ``name`` and the dtype. From the dtype alone, so arrays that are not NumPy's (device arrays)
    are held to the same rule as :func:`as_array`'s."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES.values():
        hint = (
            " (cast integer inputs explicitly, e.g. x.astype(np.float32))"
            if dtype.kind in "iub" else ""
        )
        raise TypeError(
            f"{name} has dtype {dtype}; rmsref accepts {', '.join(SUPPORTED_DTYPES)}{hint}"
        )
    return dtype


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


def check_param(
    p: Any, name: str, shape: tuple[int, ...], convert: ArrayTaker | None = None
) -> np.ndarray | None:
    """Validate an optional per-feature parameter (weight, bias, or a tangent of one).

    ``convert`` takes the array (default :func:`as_array`; see :func:`prepare`)."""
    if p is None:
        return None
    arr = (convert or as_array)(p, name)
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


def real_scalar(value: Any, name: str) -> float:
    """``value`` as a finite Python float, when it is a real Python or NumPy scalar.

    Refused with an error naming ``name``: bool (``True`` is not a number here), str, complex,
    None, arrays, and non-finite or too large values (``10**400`` does not fit a float).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"{name} must be a finite real number (a Python or NumPy scalar); "
            f"got {value!r} ({type(value).__name__})"
        )
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite real number; got {value!r}")
    return result


def resolve_eps(eps: float | None, dtype: np.dtype, default: float | None = None) -> float:
    """Return eps as a float; ``None`` means ``default`` or, if that is None, ``default_eps``.

    eps must be a finite, non-negative real Python or NumPy scalar: ``TypeError`` for bool, str,
    complex and arrays, ``ValueError`` for NaN, infinities, values too large for a float and
    negative values (mean(x²) + eps could then be zero or negative: a NaN, not a norm).
    """
    if eps is None:
        return default_eps(dtype) if default is None else float(default)
    value = real_scalar(eps, "eps")
    if value < 0:
        raise ValueError(f"eps must be a finite non-negative real number; got {eps!r}")
    return value


def resolve_offset(offset: Any) -> float:
    """The weight offset as a float (the weight is used as ``offset + weight``); a finite real
    Python or NumPy scalar, else an error naming ``offset``."""
    return real_scalar(offset, "offset")


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
    """Number of features K = floor(N * p) that estimate the RMS in pRMSNorm (K = N when None).

    ``partial`` is None or a real Python or NumPy scalar in (0, 1]; anything else is an error
    naming ``partial``.
    """
    if partial is None:
        return n
    p = real_scalar(partial, "partial")
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


def check_stat_shape(
    stat_shape_: tuple[int, ...], x_shape: tuple[int, ...], shape: tuple[int, ...], name: str
) -> None:
    """Raise ValueError unless a saved statistic of shape ``stat_shape_`` fits an input of shape
    ``x_shape``: ``lead`` or ``lead + (1,)*k``. From shapes only, so device arrays use it too."""
    lead = tuple(x_shape[: len(x_shape) - len(shape)])
    if tuple(stat_shape_) not in (lead, lead + (1,) * len(shape)):
        raise ValueError(
            f"{name} has shape {tuple(stat_shape_)}; for input of shape {tuple(x_shape)} and "
            f"normalized_shape {shape} expected {lead} or {lead + (1,) * len(shape)}"
        )


def check_stat_dtype(dtype: np.dtype, name: str, complex_ok: bool = False) -> None:
    """A saved statistic is real floating (float16, bfloat16, float32, float64); complex only
    where the computation is complex (``complex_ok``: a complex x in the oracle)."""
    allowed = SUPPORTED_DTYPES if complex_ok else FLOAT_DTYPES
    if np.dtype(dtype) not in allowed.values():
        raise TypeError(
            f"{name} has dtype {np.dtype(dtype)}; a saved statistic must have a "
            f"{'floating' if complex_ok else 'real floating'} dtype ({', '.join(allowed)})"
        )


def check_stat(
    stat: Any,
    x: np.ndarray,
    shape: tuple[int, ...],
    name: str = "rstd",
    convert: ArrayTaker | None = None,
) -> np.ndarray | None:
    """Validate a saved statistic (``rstd``, ``mean``, ``rnorm``) by its own name: shape
    ``lead`` or ``lead + (1,)*k``, a floating dtype (complex only for complex ``x``); return it
    as (M, 1). ``convert`` takes the array (default :func:`as_array`; see :func:`prepare`)."""
    if stat is None:
        return None
    arr = (convert or as_array)(stat, name)
    check_stat_dtype(arr.dtype, name, complex_ok=x.dtype.kind == "c")
    check_stat_shape(tuple(arr.shape), tuple(x.shape), shape, name)
    return arr.reshape(-1, 1)


def check_rstd(rstd: Any, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``check_stat`` for a saved rstd."""
    return check_stat(rstd, x, shape, "rstd")


@dataclass(frozen=True)
class NormInputs:
    """The checked arguments of one norm call: what every implementation starts from.

    Built by :func:`prepare`, so the oracle and the backends accept and refuse the same
    arguments with the same errors. Arrays keep their own dtype (each implementation chooses
    its compute dtype); per-feature parameters are validated against ``shape``. The arrays are
    NumPy arrays, or whatever ``prepare``'s ``convert`` returned (a GPU backend's device arrays).
    """

    x: np.ndarray  # the input, native byte order, any leading shape
    shape: tuple[int, ...]  # normalized_shape
    rows: np.ndarray  # (M, N) view of x (a NumPy copy only when its layout needs one)
    weight: np.ndarray | None  # (*shape) or None
    bias: np.ndarray | None  # (*shape) or None
    eps: float  # finite, >= 0
    offset: float  # the weight is used as offset + weight
    k_feat: int  # K: features that feed the statistic (N unless partial)
    others: dict[str, np.ndarray]  # same-shaped arrays by name (dy, residual, ...)
    stats: dict[str, np.ndarray | None]  # saved statistics by their own name, each (M, 1)

    @property
    def m(self) -> int:
        """Number of rows M."""
        return self.rows.shape[0]

    @property
    def n(self) -> int:
        """Features per row N."""
        return self.rows.shape[1]


def prepare(
    x: Any,
    normalized_shape: ShapeLike,
    *,
    weight: Any = None,
    bias: Any = None,
    eps: Any = None,
    eps_default: float | None = None,
    offset: Any = 0.0,
    partial: Any = None,
    others: dict[str, Any] | None = None,
    stats: dict[str, Any] | None = None,
    convert: ArrayTaker | None = None,
) -> NormInputs:
    """Check every argument of a norm call once and return them as :class:`NormInputs`.

    Parameters
    ----------
    x, normalized_shape, weight, bias, eps, offset, partial
        As in :func:`rmsref.rms_norm_forward`; ``eps=None`` means ``eps_default`` (or, when
        that is None, :func:`default_eps` of x's dtype).
    others : dict, optional
        Arrays that must have x's shape, by name (``{"dy": dy}``).
    stats : dict, optional
        Saved per-row statistics by their own name (``{"mean": mean, "rstd": rstd}``); None
        values stay None.
    convert : callable, optional
        ``convert(a, name)`` takes each array argument; default :func:`as_array` (NumPy). A GPU
        backend passes its own, returning device arrays: every check below reads only
        ``.shape``, ``.ndim``, ``.dtype`` and calls ``.reshape`` (a view), so device arrays meet
        the same rules and errors as NumPy ones (``convert`` must check the dtype itself, e.g.
        with :func:`check_dtype`).

    Raises
    ------
    TypeError, ValueError
        Naming the argument and what was received (see :func:`as_array` for the array
        policies: masked arrays, ``numpy.matrix``, byte order).
    """
    convert = convert or as_array
    arr = convert(x, "input")
    shape = normalize_shape(normalized_shape)
    check_input(arr, shape, "input")
    checked = {}
    for name, a in (others or {}).items():
        checked[name] = convert(a, name)
        check_same_shape(checked[name], arr, name)
    rows = rows_view(arr, shape)
    return NormInputs(
        x=arr,
        shape=shape,
        rows=rows,
        weight=check_param(weight, "weight", shape, convert),
        bias=check_param(bias, "bias", shape, convert),
        eps=resolve_eps(eps, arr.dtype, eps_default),
        offset=resolve_offset(offset),
        k_feat=resolve_partial(partial, rows.shape[1]),
        others=checked,
        stats={name: check_stat(s, arr, shape, name, convert)
               for name, s in (stats or {}).items()},
    )


#: How the fused residual add forms h = x + residual: kept in float32/float64 ("fp32-sum") or
#: rounded to x's dtype first ("rounded-sum").
ROUNDINGS = ("fp32-sum", "rounded-sum")


def resolve_rounding(rounding: Any) -> bool:
    """Whether the fused add rounds h to x's dtype; ``rounding`` must be one of ``ROUNDINGS``."""
    if not isinstance(rounding, str) or rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding == "rounded-sum"


def check_stat_pair(mean: Any, rstd: Any) -> None:
    """LayerNorm's saved statistics come together: both or neither."""
    if (mean is None) != (rstd is None):
        raise ValueError("pass both mean and rstd (the forward's saved statistics), or neither")


def param_as_row(p: np.ndarray | None, ctype: np.dtype) -> np.ndarray | None:
    """A checked per-feature parameter as a (1, N) row in the compute dtype (or None)."""
    return None if p is None else p.reshape(1, -1).astype(ctype)


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
    if type(out) is not np.ndarray:  # a matrix or masked array would not be written as asked
        raise TypeError(f"{name} must be a NumPy ndarray, got {type(out).__name__}")
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
