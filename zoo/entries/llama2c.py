"""RMSNorm in C, in the style of llama2.c (forward) and llm.c's train code (backward).

``llama2c_rmsnorm.c`` beside this file is our own C code of that shape: float32 only, one row at a
time, ``ss += x[j]*x[j]; ss /= size; ss += 1e-5f; ss = 1.0f / sqrtf(ss); o[j] = weight[j] * (ss *
x[j])``. It is compiled at build time with the system C compiler (``cc``, ``gcc`` or ``clang``)
into a temporary directory, with ``-O2 -ffp-contract=off`` (no fused multiply-adds, no
reassociation: the sum runs left to right as written), and called through ctypes.

What that implies, read from the C:

- float32 in, float32 out; the wrapper refuses other dtypes (so the float64 gradient check is
  skipped, as for any float32-only kernel);
- eps is the constant 1e-5 inside the square root: the ``eps`` argument cannot reach the C code,
  so a caller asking for another eps silently gets 1e-5 (the ``eps_value`` departure, seen by the
  ``eps_explicit`` probe; ``underflow`` asks for eps = 0 and is advisory);
- rstd = 1/sqrtf(ms + eps): the square root and the division each round (``fused_fp32_div``);
- y = w·(rstd·x): x times rstd first, then the weight, one float32 result per step;
- the rows are contiguous blocks of ``prod(normalized_shape)`` floats, so any number of trailing
  dims is normalised;
- there is always a weight in llama2.c: a missing one is passed as ones (exact: w = 1 changes
  nothing);
- the backward recomputes rstd as the forward does and returns dx = rstd·(dxhat − xhat·c) and
  dweight = Σ_rows dy·xhat, accumulated row after row in float32.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_SOURCE = Path(__file__).with_name("llama2c_rmsnorm.c")
_COMPILERS = ("cc", "gcc", "clang")
_FLAGS = ("-O2", "-ffp-contract=off", "-fPIC", "-shared")
_FLOAT_P = ctypes.POINTER(ctypes.c_float)


def _compiler() -> str:
    for name in _COMPILERS:
        path = shutil.which(name)
        if path is not None:
            return path
    raise ZooUnavailable(f"no C compiler found (looked for {', '.join(_COMPILERS)} on PATH): "
                         "apt-get install gcc")


def _compile() -> ctypes.CDLL:
    """Compile the C source into a temporary directory and load it."""
    cc = _compiler()
    with tempfile.TemporaryDirectory(prefix="rmsref-zoo-") as tmp:
        lib_path = Path(tmp) / "llama2c_rmsnorm.so"
        cmd = [cc, *_FLAGS, "-o", str(lib_path), str(_SOURCE), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ZooUnavailable(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
        lib = ctypes.CDLL(str(lib_path))   # mapped now: the file may go with the directory
    lib.rmsnorm_forward.argtypes = [_FLOAT_P] * 3 + [ctypes.c_int] * 2
    lib.rmsnorm_forward.restype = None
    lib.rmsnorm_backward.argtypes = [_FLOAT_P] * 5 + [ctypes.c_int] * 2
    lib.rmsnorm_backward.restype = None
    return lib


def _rows_and_size(x: np.ndarray, normalized_shape: Any) -> tuple[int, int]:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.dtype != np.float32:
        raise TypeError(f"the llama2.c-style kernel takes float32 only; got x of dtype {x.dtype}")
    if tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"normalized_shape {shape} does not match the trailing dims of input "
                         f"with shape {x.shape}")
    size = math.prod(shape)
    return x.size // size if size else 0, size


def _f32(a: Any) -> np.ndarray:
    """A C-contiguous float32 copy-or-view the C code may read (never written)."""
    return np.ascontiguousarray(a, dtype=np.float32)


def _ptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(_FLOAT_P)


def _weight(weight: Any, size: int) -> np.ndarray:
    if weight is None:
        return np.ones(size, np.float32)          # llama2.c always has a weight; ones are exact
    w = np.asarray(weight)
    if w.dtype != np.float32:
        raise TypeError(f"the llama2.c-style kernel takes a float32 weight; got {w.dtype}")
    return _f32(w).reshape(size)


def _build() -> Callables:
    lib = _compile()

    def llama2c_rmsnorm(x, normalized_shape, weight=None, eps=None):
        x = np.asarray(x)
        rows, size = _rows_and_size(x, normalized_shape)
        xc, w = _f32(x), _weight(weight, size)
        out = np.empty(x.shape, np.float32)
        if rows and size:
            lib.rmsnorm_forward(_ptr(out), _ptr(xc), _ptr(w), rows, size)   # eps: fixed in C
        return out

    def llama2c_rmsnorm_backward(dy, x, normalized_shape, weight=None, eps=None):
        x = np.asarray(x)
        rows, size = _rows_and_size(x, normalized_shape)
        xc, g, w = _f32(x), _f32(dy), _weight(weight, size)
        dx = np.empty(x.shape, np.float32)
        dw = np.zeros(size, np.float32)
        if rows and size:
            lib.rmsnorm_backward(_ptr(dx), _ptr(dw), _ptr(g), _ptr(xc), _ptr(w), rows, size)
        return dx, None if weight is None else dw.reshape(np.shape(weight))

    return llama2c_rmsnorm, llama2c_rmsnorm_backward


ENTRIES: list[ZooEntry] = [
    ZooEntry(
        name="llama2c",
        title="llama2.c-style C rmsnorm (ctypes, float32)",
        package="",
        source="zoo/entries/llama2c_rmsnorm.c:rmsnorm_forward",
        convention="fused_fp32_div",
        build=_build,
        dtypes=("float32",),
        expected={"float32": "fail:eps_value"},
        eps_default=1e-5,
        normalized_dims="any",
        notes="eps is the constant 1e-5 in the C source: an explicit eps is ignored. rstd is "
              "1/sqrtf (two roundings); the sum of squares runs left to right in float32; "
              "y = w·(rstd·x). float32 only.",
    ),
]
