"""gradcheck's own arguments, defaults and early exits, written from mutation survivors of
rmsref/derivatives.py: what a user passes is what is used, errors name what they received, the
documented defaults are the ones in force, and a point or a precision where nothing can be
compared is reported as not checked, never as a pass.

The problem throughout is a linear map y = A·x, whose Jacobian A is known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import bfloat16
from rmsref.derivatives import MAX_DEFAULT_RTOL, RTOL_ULPS, gradcheck

A = np.random.default_rng(0).standard_normal((6, 8))  # (6, 8): the Jacobian
X = np.random.default_rng(1).standard_normal(8)  # (8,)


def forward(x):
    return A @ x  # (6,)


def backward(dy, x):
    return (A.T @ dy,)  # (8,)


def backward_times(factor):
    return lambda dy, x: (factor * (A.T @ dy),)


# ------------------------------------------------------------------------------------------------
# arguments: refused with the name and the value received, or used as given
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rtol", "atol"])
def test_a_negative_tolerance_is_refused_by_name(name):
    with pytest.raises(ValueError, match=f"^{name} must be a finite non-negative real number; "
                                         "got -1e-05$"):
        gradcheck(forward, backward, X, **{name: -1e-5})


@pytest.mark.parametrize("name", ["rtol", "atol"])
def test_a_tolerance_that_is_not_a_number_is_refused_by_name(name):
    with pytest.raises(TypeError, match=f"^{name} must be a finite real number"):
        gradcheck(forward, backward, X, **{name: "1e-5"})


def test_the_given_tolerances_are_the_ones_judged_with():
    """rtol and atol as given reach the settings and the report; a gradient 1 % too large
    passes under rtol = 0.1 and fails under the default (float64: 1024 u)."""
    r = gradcheck(forward, backward_times(1.01), X, rtol=0.1, atol=1e-9)
    assert r.passed and r.settings["rtol"] == 0.1 and r.settings["atol"] == 1e-9
    assert "rtol: 0.1" in r.report().split("\n")[0]
    default = gradcheck(forward, backward_times(1.01), X)
    assert not default and default.settings["rtol"] == RTOL_ULPS * 2.0**-53


def test_names_of_the_wrong_length_are_refused_with_both_counts():
    with pytest.raises(ValueError, match="^names has 1 entries but there are 2 inputs$"):
        gradcheck(lambda x, s: A @ x * s, lambda dy, x, s: (A.T @ dy * s, None), (X, 2.0),
                  names=["x"])


def test_n_directions_below_one_is_refused_and_one_is_allowed():
    """One direction is the smallest check: the backward runs D + 1 = 2 times (the extra one is
    the reentrancy check), four directions 5 times."""
    with pytest.raises(ValueError, match="^n_directions must be >= 1, got 0$"):
        gradcheck(forward, backward, X, n_directions=0)
    for d in (1, 4):
        r = gradcheck(forward, backward, X, n_directions=d, second_order=False)
        assert r.passed and r.evaluations["backward"] == d + 1
        assert r.settings["n_directions"] == d


def test_a_bare_array_is_one_input():
    """gradcheck(f, b, x) for one array x is gradcheck(f, b, (x,))."""
    bare, packed = gradcheck(forward, backward, X), gradcheck(forward, backward, (X,))
    assert bare.passed and bare.to_dict() == packed.to_dict()


def test_the_default_seed_is_0():
    """Results are reproducible from the seed, and the default is seed 0 (another seed draws
    other directions, so other observed errors of the same wrong gradient)."""
    wrong = backward_times(1.001)
    d0, s0, s1 = (gradcheck(forward, wrong, X, **kw).to_dict()
                  for kw in ({}, {"seed": 0}, {"seed": 1}))
    assert d0 == s0 and d0["settings"]["seed"] == 0
    assert d0["checks"][1]["observed"] != s1["checks"][1]["observed"]


# ------------------------------------------------------------------------------------------------
# which inputs are differentiable by default
# ------------------------------------------------------------------------------------------------
def test_bfloat16_arrays_are_differentiable_and_integer_arrays_are_constants():
    """A bfloat16 array is a real floating array (it gets its own check), an integer array is
    passed through untouched (no check names it)."""
    k = np.arange(3)
    r = gradcheck(lambda x, k: A @ x * k.sum(), lambda dy, x, k: (A.T @ dy * k.sum(), None),
                  (X, k), names=["x", "k"], second_order=False)
    assert r.passed and {c.input for c in r.checks} == {None, "x"}
    xb = X.astype(bfloat16)
    rb = gradcheck(lambda x: A @ x.astype(np.float64),
                   lambda dy, x: ((A.T @ dy).astype(bfloat16),), xb, names=["xb"], rtol=0.5,
                   second_order=False)
    assert "xb" in {c.input for c in rb.checks}


# ------------------------------------------------------------------------------------------------
# precisions too coarse for the default tolerance
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [bfloat16, np.float16], ids=["bfloat16", "float16"])
def test_a_half_precision_function_is_not_checked_with_the_default_rtol(dtype):
    """In bfloat16 (u = 2^-8) or float16 (u = 2^-11) the default rtol, 1024 u, would be 4 or 0.5:
    a gradient three times too large passed. Now no comparison is made: NOT CHECKED (falsy),
    the note names the dtype and the way out, and the backward is still called (its structure
    is checked)."""
    x = X.astype(dtype)

    def f(x):
        return (A @ x.astype(np.float32)).astype(dtype)

    def b(dy, x):
        return ((3 * A.T @ dy.astype(np.float32)).astype(dtype),)

    r = gradcheck(f, b, x, names=["x"])
    u = 2.0**-8 if dtype == bfloat16 else 2.0**-11
    assert not r and not r.compared() and r.settings["rtol"] == RTOL_ULPS * u > MAX_DEFAULT_RTOL
    assert r.report().startswith("gradcheck: NOT CHECKED")
    assert r.check("shapes").passed and r.check("vjp", "x").passed is None
    (note,) = r.notes
    assert np.dtype(dtype).name in note and "float64" in note and "pass rtol yourself" in note


@pytest.mark.parametrize("n_directions", [1, 3])
def test_the_refusal_names_the_coarsest_dtype_of_outputs_and_gradients(n_directions):
    """y in float32, the gradient of x in bfloat16, and a constant-like input s whose gradient is
    None: the note names bfloat16 (the gradient's dtype, coarser than y's), its u and the rtol it
    would give, in full; each differentiated input gets one vjp check that is skipped and says
    why; the None gradient is left out of the choice; one output direction is enough."""
    xb = X.astype(bfloat16)
    s = np.ones(3)

    def f(x, s):
        return A @ x.astype(np.float32)  # (6,) float32

    def b(dy, x, s):
        return ((A.T @ dy).astype(bfloat16), None)

    r = gradcheck(f, b, [xb, s], names=["x", "s"], n_directions=n_directions)
    assert not r and not r.compared()
    assert r.notes == [
        "not checked: bfloat16 rounds at u = 0.0039, so the default rtol (1024·u = 4) could not "
        "tell a wrong gradient from a right one; cast the inputs to float64 (or float32), or "
        "pass rtol yourself"]
    for name in ("x", "s"):
        c = r.check("vjp", name)
        assert c.passed is None and c.note == "the default rtol would be 4 (bfloat16): see the note"


def test_float32_keeps_the_default_rtol_and_its_verdicts():
    """float32 (u = 2^-24, rtol 2^-14) is judged as before: a gradient 1 % too large fails, the
    right one passes."""
    a32, x32 = A.astype(np.float32), X.astype(np.float32)

    def b(factor):
        return lambda dy, x: (np.float32(factor) * (a32.T @ dy.astype(np.float32)),)

    right, wrong = (gradcheck(lambda x: a32 @ x, b(f), x32) for f in (1.0, 1.01))
    assert right.passed and not wrong and wrong.check("vjp").passed is False
    assert right.settings["rtol"] == RTOL_ULPS * 2.0**-24 <= MAX_DEFAULT_RTOL


# ------------------------------------------------------------------------------------------------
# localisation: the documented defaults
# ------------------------------------------------------------------------------------------------
def test_at_most_five_worst_entries_are_reported_by_default():
    """Every entry of a gradient twice too large is wrong; 8 entries localise within the budget,
    and the report keeps the five worst (max_worst's default), or all 8 when asked."""
    c = gradcheck(forward, backward_times(2.0), X).check("vjp")
    assert c.passed is False and len(c.worst) == 5
    assert len(gradcheck(forward, backward_times(2.0), X, max_worst=8).check("vjp").worst) == 8


def test_localisation_spends_at_most_64_evaluations_by_default():
    """The module docs: "at most localize_budget (default 64) further evaluations per failing
    input". A gradient wrong by 0.1 % in every one of 4096 entries (alternating signs) cannot be
    localised in 64 evaluations: the default run spends exactly 64 more complex forwards than
    the run without localisation, and 100 when the budget is 100."""
    b = np.random.default_rng(2).standard_normal((3, 4096))
    x = np.random.default_rng(3).standard_normal(4096)
    sign = np.where(np.arange(4096) % 2, 1.0, -1.0)

    def run(**kw):
        r = gradcheck(lambda x: b @ x, lambda dy, x: (b.T @ dy * (1 + 1e-3 * sign),), x,
                      second_order=False, max_worst=10_000, **kw)
        assert r.check("vjp").passed is False
        return r.evaluations["forward_complex"]

    base = run(localize=False)
    assert run() - base == 64
    assert run(localize_budget=100) - base == 100


# ------------------------------------------------------------------------------------------------
# a point where nothing can be compared
# ------------------------------------------------------------------------------------------------
OPTIONS = {"method": "central", "rtol": 1e-5, "atol": 1e-9, "seed": 3}


def test_a_nan_input_is_a_failed_input_check_that_keeps_the_options():
    x = X.copy()
    x[2] = np.nan
    r = gradcheck(forward, backward, x, **OPTIONS)
    assert not r and [c.name for c in r.checks] == ["input"] and r.method == "central"
    assert r.evaluations == {}  # nothing was called
    assert r.settings == {"rtol": 1e-5, "atol": 1e-9, "seed": 3}
    assert "input0: 1 NaN/Inf element(s), the first at (2,)" in r.notes[0]


def test_a_forward_that_is_nan_at_the_point_is_a_failed_forward_check():
    def nan_forward(x):
        return A @ x * np.nan

    r = gradcheck(nan_forward, backward, X, **OPTIONS)
    assert not r and [c.name for c in r.checks] == ["forward"] and r.method == "central"
    assert r.evaluations == {"forward": 1}
    assert r.settings == {"rtol": 1e-5, "atol": 1e-9, "seed": 3}
    assert "output 0: 6 NaN/Inf element(s), the first at (0,)" in r.to_dict()["notes"][0]


def test_a_localisation_that_runs_out_of_budget_says_so():
    """dx off by δ in each of 4096 entries (each alone within atol = 2δ): with a budget of 8 the
    bisection stops at the budget, and the note says that the budget ran out (a larger one may
    find entries), not that the error is spread thinly, which a search that ended would say."""
    delta = 1e-3
    r = gradcheck(lambda x: x, lambda dy, x: (dy + delta,), [np.ones(4096)], atol=2 * delta,
                  second_order=False, localize_budget=8)
    c = r.check("vjp", "input0")
    assert c.passed is False and not c.worst
    assert c.note == ("not localised in 8 evaluations: localize_budget (8) ran out; a larger "
                      "one may find the entries")
