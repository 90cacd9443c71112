"""gradcheck's thresholds, each seen from both sides: an error planted just beyond a tolerance is
caught, and a correct value just inside it passes.

The tolerances are gradcheck's own (rtol = 2^10 unit roundoffs, the entry scale of the full
Jacobian, the cancellation floor); each test states the formula it checks and builds an input
where that formula, and no nearby one, decides the verdict.
"""

from __future__ import annotations

import numpy as np
import pytest

from rmsref.derivatives import _compare_jacobians

# ------------------------------------------------------------------------------------------------
# The full Jacobian's entry scale: |J_ij| + sqrt(max_j' |J_ij'| · max_i' |J_i'j|)
# ------------------------------------------------------------------------------------------------

RTOL = 1e-10


@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_an_entry_is_judged_against_the_geometric_mean_of_its_row_and_column(factor):
    """J = diag(4, 1): entry (1, 0) is zero, its row's largest entry is 1 and its column's 4, so
    its scale is sqrt(1·4) = 2 and an error of factor·2·rtol there has ratio exactly factor."""
    J = np.array([[4.0, 0.0], [0.0, 1.0]])
    A = J.copy()
    A[1, 0] = factor * 2 * RTOL
    worst, top, n_bad = _compare_jacobians(A, J, None, RTOL, 0.0, max_worst=4)
    ratio, observed, tol = worst
    assert ratio == pytest.approx(factor, rel=1e-12)
    assert observed == pytest.approx(factor * RTOL, rel=1e-12)  # relative to the scale 2
    assert tol == pytest.approx(RTOL, rel=1e-12)
    if factor > 1:
        assert n_bad == 1
        assert [(i, j) for _, i, j, _, _ in top] == [(1, 0)]
        assert top[0][3] == pytest.approx(factor * 2 * RTOL)
        assert top[0][4] == pytest.approx(2 * RTOL)
    else:
        assert n_bad == 0 and top == []
