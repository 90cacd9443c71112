"""rmsref._rounding.round_to: float64 -> bfloat16 rounded once, to nearest-even.

Reference: rounding to 8 significant bits done by hand in float64, ``np.round(v / 2**s) * 2**s``
with ``s`` the exponent of v's last bfloat16 bit (division and product by a power of two are
exact; ``np.round`` rounds halves to even). Checked where a double rounding goes wrong: just
above and just below each midpoint between two bfloat16 numbers, both signs, above and below 1.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rmsref._rounding import round_to
from rmsref._shapes import bfloat16


def bfloat16_by_hand(v: np.ndarray) -> np.ndarray:
    """v (float64, inside bfloat16's normal range) rounded to 8 significant bits, ties to even."""
    _, e = np.frexp(v)  # v = f·2^e, f in [0.5, 1): the last of 8 bits is worth 2^(e-8)
    return np.ldexp(np.round(np.ldexp(v, 8 - e)), e - 8)


def near_midpoints(rng: np.random.Generator, size: int, emax: int = 100) -> np.ndarray:
    """float64 values a hair above or below the midpoint between two neighbouring bfloat16
    numbers: float32 rounds them onto the midpoint (away from or toward zero), and rounding
    that midpoint again to bfloat16 then picks the wrong neighbour half of the time."""
    m = rng.integers(128, 256, size).astype(np.float64)  # 8-bit significands
    e = rng.integers(-emax, emax, size)
    mid = np.ldexp(m + 0.5, e - 8)  # exactly halfway between m·2^(e-8) and (m+1)·2^(e-8)
    hair = np.ldexp(rng.uniform(1.0, 2.0, size), e - 8 - 40)  # far below float32's last bit
    sign = rng.choice([-1.0, 1.0], size)
    return sign * (mid + rng.choice([-1.0, 1.0], size) * hair)


def test_round_to_bfloat16_is_correctly_rounded_near_every_kind_of_midpoint(rng):
    v = np.concatenate([near_midpoints(rng, 4000), rng.standard_normal(1000) * 1e3])
    got = round_to(v, bfloat16)
    assert got.dtype == bfloat16
    np.testing.assert_array_equal(got.astype(np.float64), bfloat16_by_hand(v))
    # the example of the module docstring, and its mirror below the midpoint
    one = np.array([1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8 - 2.0**-40, 0.5 * (1 + 2.0**-8 - 2.0**-40)])
    np.testing.assert_array_equal(round_to(one, bfloat16).astype(np.float64),
                                  [1 + 2.0**-7, 1.0, 0.5])


def test_round_to_bfloat16_keeps_exact_values_and_non_finite_ones_silently():
    """Values bfloat16 holds stay as they are; overflow gives inf and NaN stays NaN, without a
    floating-point warning (overflow to inf is the correct rounding, not an accident)."""
    v = np.array([0.0, -0.0, 1.0, -3.0, 2.0**-133, 1e300, -1e300, np.inf, -np.inf, np.nan])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = round_to(v, bfloat16).astype(np.float64)
    np.testing.assert_array_equal(got, [0.0, -0.0, 1.0, -3.0, 2.0**-133, np.inf, -np.inf,
                                        np.inf, -np.inf, np.nan])
    assert np.signbit(got[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_to_other_dtypes_is_numpys_cast(rng, dtype):
    v = near_midpoints(rng, 1000, emax=10)
    np.testing.assert_array_equal(round_to(v, dtype), v.astype(dtype))
