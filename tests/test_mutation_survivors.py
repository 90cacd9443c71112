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


def test_full_jacobian_worst_entries_carry_their_tolerance():
    """Each localised disagreement of the full Jacobian says how far it is beyond its own
    tolerance: error > tolerance > 0, both finite, ratio = error / tolerance."""
    from rmsref.gradcheck import gradcheck
    from tests.test_gradcheck import _problem_with_bug

    r = gradcheck(*_problem_with_bug("single_entry_1e-6", (1, 1024)), full=True,
                  second_order=False, names=("x", "weight", "bias"))
    worst = r.check("jacobian", "x").worst
    assert worst
    for w in worst:
        assert 0 < w.tolerance < w.error < np.inf, w
        assert w.ratio == w.error / w.tolerance


def test_identity_default_seed_is_zero():
    """run_one without a seed draws the inputs of seed 0 (what `rmsref identities` reports)."""
    from rmsref import identities

    name = identities.names()[0]
    a, b = identities.run_one(name, quick=True), identities.run_one(name, seed=0, quick=True)
    c = identities.run_one(name, seed=1, quick=True)
    assert a.residual == b.residual and a.bound == b.bound
    assert a.residual != c.residual
