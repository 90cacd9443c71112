"""Behaviours that mutation testing (bench/mutation.py) found unchecked, each pinned here.

Each test names the behaviour, not the mutant: a mutant is one way of breaking it.
"""

from __future__ import annotations

import numpy as np

from rmsref import tolerance as T
from rmsref._shapes import bfloat16


def test_ulp_in_every_dtype_down_to_the_subnormals():
    """One ulp at 1 and at the smallest subnormals: p and emin of each dtype."""
    for dtype, p, emin in ((np.float64, 53, -1022), (np.float32, 24, -126), (bfloat16, 8, -126),
                           (np.float16, 11, -14)):
        tiny = np.ldexp(1.0, emin - 5)                        # below the normal range
        got = T.ulp(np.array([1.0, -3.0, tiny, 2.0**emin]), dtype)
        np.testing.assert_array_equal(got, np.ldexp(1.0, [1 - p, 2 - p, emin - p + 1,
                                                          emin - p + 1]), err_msg=str(dtype))


def test_ulp_of_zero_and_non_finite_is_the_ulp_at_one():
    """0, inf and nan have no spacing of their own; ulp() reports the ulp at 1 for them (a finite
    placeholder, so that an error counted in ulps stays finite)."""
    got = T.ulp(np.array([0.0, -0.0, np.inf, np.nan]), np.float32)
    np.testing.assert_array_equal(got, 2.0**-23)
