"""Rounding float64 results to the output dtype exactly once.

NumPy rounds float64 -> float32 and float64 -> float16 correctly (round to nearest, ties to even).
A float64 -> bfloat16 cast through float32 rounds *twice* (older ml_dtypes releases cast that way;
0.7 rounds once, and rmsref accepts ml_dtypes >= 0.3): 1 + 2**-8 + 2**-40 becomes 1 + 2**-8 in
float32 (a tie) and then 1 in bfloat16, where the correctly rounded result is 1 + 2**-7.
``round_to`` rounds once whatever the installed release, with round-to-odd: float64 -> float32
rounded to odd keeps a sticky bit, and float32 has 16 bits more than bfloat16, so the final RNE
step is exact.
"""

from __future__ import annotations

import numpy as np

from rmsref._shapes import bfloat16


def round_to(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``v`` (float64 or complex128) rounded once, to nearest-even, to ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == bfloat16 and v.dtype == np.float64:
        return _float64_to_bfloat16(v)
    return v.astype(dtype, copy=False)


def _float64_to_bfloat16(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        # Round to odd: step back toward zero where RNE rounded away from zero, then set the
        # last bit of every inexact result. Inf from overflow stays inf (also inf in bfloat16).
        away = np.isfinite(f) & (np.abs(f.astype(np.float64)) > np.abs(v))
        f = np.where(away, np.nextafter(f, np.float32(0)), f)
        inexact = np.isfinite(f) & (f.astype(np.float64) != v)
        bits = f.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32).astype(bfloat16)
