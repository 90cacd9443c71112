"""Tests written from the mutation survivors of rmsref/derivatives.py's full-Jacobian mode, its
numerical JVPs, the checks of the point and of the gradients' structure, and the oracle problems.

Most problems here are linear maps y = A·x with dyadic entries: their Jacobian is A, the complex
step reproduces it exactly (Im(A·(x + i·h·e_j))/h = A[:, j] in floating point), so every figure
of a check follows from the formula in the docstring with no numerical noise.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

import rmsref
from rmsref import derivatives
from rmsref.derivatives import (
    RTOL_ULPS,
    _compare_jacobians,
    _holomorphy_test,
    _numeric_jvp,
    check_oracle,
    check_oracle_all,
    gradcheck,
    oracle_configs,
    oracle_problem,
)

# rows 0..2 have largest entries 8, 4, 2; columns 0..4 have 2, 2, 4, 4, 8 (the largest entry of
# the whole matrix is 8, that of column 2 only 4)
A = np.array([[1.0, 2.0, -4.0, 0.5, 8.0],
              [0.25, -1.0, 2.0, 4.0, -0.5],
              [2.0, 0.5, 1.0, -2.0, 1.0]])
X = np.array([0.5, -1.0, 1.5, 2.0, -0.25])


def linear(x):
    """y = A·x, also for a stack of x along a leading axis."""
    return x @ A.T


def backward_of(Ab):
    """The VJP of x -> Ab·x: dx = Abᵀ·dy."""
    return lambda dy, x: (dy @ Ab,)


def with_errors(*entries):
    """A with entries (i, j, delta) added: a VJP wrong at those Jacobian entries."""
    Ab = A.copy()
    for i, j, delta in entries:
        Ab[i, j] += delta
    return Ab


def jacobian(Ab, forward=linear, inputs=(X,), name="input0", **kw):
    kw = {"full": True, "second_order": False, "localize": False, **kw}
    r = gradcheck(forward, backward_of(Ab) if isinstance(Ab, np.ndarray) else Ab, inputs, **kw)
    return r, r.check("jacobian", name)


def entry_scale(J, i, j):
    """The scale of entry (i, j): |J_ij| + sqrt(max_j'|J_ij'| · max_i'|J_i'j|)."""
    return abs(J[i, j]) + math.sqrt(np.max(np.abs(J[i])) * np.max(np.abs(J[:, j])))


# ------------------------------------------------------------------------------------------------
# the full Jacobian's verdict and figures
# ------------------------------------------------------------------------------------------------
def test_a_wrong_entry_is_reported_with_its_figures_relative_to_its_row_and_column():
    """Entry (1, 2) = 2 of a row whose largest is 4 and a column whose largest is 4 (not the
    matrix's 8): its scale is 2 + sqrt(4·4) = 6, its tolerance rtol·6."""
    delta, rtol = 2.0**-10, 2.0**-16
    r, c = jacobian(with_errors((1, 2, delta)), rtol=rtol)
    assert entry_scale(A, 1, 2) == 6.0
    assert c.passed is False
    assert c.ratio == pytest.approx(delta / (rtol * 6.0), rel=1e-12)
    assert c.observed == pytest.approx(delta / 6.0, rel=1e-12)
    assert c.tolerance == pytest.approx(rtol, rel=1e-12)
    assert c.note == "1 of 15 entries out of tolerance"
    [w] = c.worst
    assert (w.input_index, w.output_index) == ((2,), (1,))
    assert w.analytic == A[1, 2] + delta and w.numerical == A[1, 2]
    assert w.error == pytest.approx(delta, rel=1e-12)
    assert w.tolerance == pytest.approx(rtol * 6.0, rel=1e-12)


def test_a_wrong_entry_in_the_first_row_is_found():
    r, c = jacobian(with_errors((0, 0, 2.0**-10)), rtol=2.0**-16)
    assert c.passed is False
    assert [(w.input_index, w.output_index) for w in c.worst] == [((0,), (0,))]


def test_atol_is_added_to_every_entry_s_tolerance():
    """tolerance = rtol·scale + atol: an error of 2^-10 at scale 6 with rtol 2^-16 fails alone
    (ratio 10.7) and passes with atol 2^-10 added."""
    delta, rtol, atol = 2.0**-10, 2.0**-16, 2.0**-10
    r, c = jacobian(with_errors((1, 2, delta)), rtol=rtol, atol=atol)
    assert c.passed is True
    assert c.ratio == pytest.approx(delta / (rtol * 6.0 + atol), rel=1e-12)
    assert c.tolerance == pytest.approx((rtol * 6.0 + atol) / 6.0, rel=1e-12)


def test_an_entry_at_exactly_its_tolerance_passes_and_is_not_listed():
    """rtol = 0 and atol = 2^-10: an error of exactly 2^-10 has ratio exactly 1, which passes."""
    r, c = jacobian(with_errors((1, 2, 2.0**-10)), rtol=0.0, atol=2.0**-10)
    assert (c.passed, c.ratio, c.worst, c.note) == (True, 1.0, [], "")


def test_an_entry_between_one_and_two_tolerances_fails_and_is_listed():
    r, c = jacobian(with_errors((1, 2, 1.5 * 2.0**-10)), rtol=0.0, atol=2.0**-10)
    assert (c.passed, c.ratio) == (False, 1.5)
    assert [w.input_index for w in c.worst] == [(2,)]


def test_only_entries_beyond_their_tolerance_are_counted_and_listed():
    """Ratios 2 at (0, 4) and exactly 1 at (2, 1): one entry is out of tolerance."""
    atol = 2.0**-10
    r, c = jacobian(with_errors((0, 4, 2 * atol), (2, 1, atol)), rtol=0.0, atol=atol)
    assert (c.passed, c.ratio) == (False, 2.0)
    assert c.note == "1 of 15 entries out of tolerance"
    assert [(w.input_index, w.output_index) for w in c.worst] == [((4,), (0,))]
    # the figures are relative to the worst entry's scale, 8 + sqrt(8·8) = 16
    assert (c.observed, c.tolerance) == (2 * atol / 16, atol / 16)


def test_with_zero_tolerance_exact_entries_pass_and_a_wrong_one_fails_without_warnings():
    """rtol = atol = 0: the complex step of a linear map is exact, so a right VJP has ratio 0;
    a wrong entry has an infinite ratio. 0/0 and x/0 are decided, never warned about."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r, c = jacobian(A, rtol=0.0, atol=0.0)
        assert (c.passed, c.ratio) == (True, 0.0)
        r, c = jacobian(with_errors((2, 3, 2.0**-3)), rtol=0.0, atol=0.0)
    assert (c.passed, c.ratio) == (False, math.inf)
    [w] = c.worst
    assert (w.input_index, w.output_index, w.error, w.tolerance) == ((3,), (2,), 2.0**-3, 0.0)


def test_where_an_entry_s_scale_is_zero_its_figures_are_absolute():
    """Column 1 of J is zero (the output does not depend on x_1): a VJP that says otherwise
    there has scale 0 at that entry, so observed and tolerance are its error and atol."""
    A0 = A.copy()
    A0[:, 1] = 0.0
    Ab = A0.copy()
    Ab[0, 1] = 2.0**-8
    r = gradcheck(lambda x: x @ A0.T, backward_of(Ab), [X], full=True, second_order=False,
                  localize=False, rtol=2.0**-20, atol=2.0**-10)
    c = r.check("jacobian", "input0")
    assert (c.passed, c.ratio, c.observed, c.tolerance) == (False, 4.0, 2.0**-8, 2.0**-10)


def test_a_none_gradient_is_a_zero_row_of_the_jacobian():
    """backward returns None for c: right when the output does not depend on c, wrong when it
    does (y = A·x + c), and the Jacobian check says so."""
    c0 = np.array([1.0, -2.0, 0.5])

    def bwd(dy, x, c):
        return (dy @ A, None)

    r = gradcheck(lambda x, c: x @ A.T, bwd, [X, c0], full=True, second_order=False)
    assert r.check("jacobian", "input1").ratio == 0.0 and r, r.report()
    r = gradcheck(lambda x, c: x @ A.T + c, bwd, [X, c0], full=True, second_order=False,
                  localize=False)
    assert r.check("jacobian", "input1").passed is False
    assert r.check("jacobian", "input0").passed is True


def two_outputs(x):
    """(A·x, 2·x[:2]): entries of the second output come after the 3 of the first."""
    return x @ A.T, 2.0 * x[..., :2]


def test_an_entry_of_a_second_output_is_named_by_output_and_element():
    def bwd(dys, x):
        dy, dz = dys
        dx = dy @ A
        dx[:2] += 2.0 * dz
        dx[1] += 2.0**-6 * dz[0]  # wrong: d z[0] / d x[1] is 0
        return (dx,)

    r = gradcheck(two_outputs, bwd, [X], full=True, second_order=False, localize=False)
    c = r.check("jacobian", "input0")
    assert c.passed is False
    [w] = c.worst
    assert (w.output_index, w.input_index) == ((1, 0), (1,))
    assert (w.analytic, w.numerical) == (2.0**-6, 0.0)


def test_a_jacobian_too_large_is_skipped_saying_its_size(monkeypatch):
    monkeypatch.setattr(derivatives, "MAX_JACOBIAN_ENTRIES", 14)
    r, c = jacobian(A, name=None)
    assert (c.name, c.input, c.passed) == ("jacobian", None, None)
    assert c.note == "skipped: 3 x 5 Jacobian entries exceed MAX_JACOBIAN_ENTRIES = 14"
    # the report says "skipped" once, before the reason
    assert re.search(r"^  jacobian +- +skipped: 3 x 5 Jacobian entries exceed", r.report(), re.M)
    assert "skipped: skipped" not in r.report()
    monkeypatch.setattr(derivatives, "MAX_JACOBIAN_ENTRIES", 15)
    r, c = jacobian(A)
    assert c.passed is True and c.input == "input0"


def test_row_blocks_see_every_row_and_add_up_their_counts():
    """One row per block (block_elems = the number of columns): errors in rows 0 and 2 are both
    counted, the worst (ratio 8) is reported although a later block has a smaller one."""
    atol = 2.0**-10
    Ab = with_errors((0, 1, 8 * atol), (2, 0, 2 * atol))
    worst, top, n_bad = _compare_jacobians(Ab, A, None, 0.0, atol, 5, block_elems=5)
    assert n_bad == 2
    assert worst[0] == 8.0
    assert [(t[0], t[1], t[2]) for t in top] == [(8.0, 0, 1), (2.0, 2, 0)]
    # equal ratios in two blocks: the first block's entry is the one reported
    Ab = with_errors((0, 4, atol), (2, 0, atol))
    worst, top, n_bad = _compare_jacobians(Ab, A, None, 0.0, atol, 5, block_elems=5)
    assert worst == (1.0, atol / entry_scale(A, 0, 4), atol / entry_scale(A, 0, 4))


# ------------------------------------------------------------------------------------------------
# the full Jacobian's columns: batched complex steps, and the fallback to one call per column
# ------------------------------------------------------------------------------------------------
def jacobian_calls(forward, backward, inputs, **kw):
    """The complex forward calls the Jacobian's columns took, and the full result."""
    kw = {"second_order": False, "localize": False, **kw}
    full = gradcheck(forward, backward, inputs, full=True, **kw)
    plain = gradcheck(forward, backward, inputs, full=False, **kw)
    return full.evaluations["forward_complex"] - plain.evaluations["forward_complex"], full


def cubic(x):
    """y = (A·x)³: its complex step is exact only for h·v far below x."""
    return (x @ A.T) ** 3


def cubic_backward(dy, x):
    return ((3 * (x @ A.T) ** 2 * dy) @ A,)


@pytest.mark.parametrize("scale", [1.0, 2.0**-70, 2.0**60])
def test_a_broadcasting_forward_takes_four_complex_calls_per_input(scale):
    """Column 0, the two-column probe, the probe's second column alone, and one batch of the
    other columns; the step stays ~1e-30 of x at any scale of x."""
    calls, r = jacobian_calls(cubic, cubic_backward, [scale * X])
    assert calls == 4
    assert r.check("jacobian", "input0").passed, r.report()


def test_a_forward_that_does_not_batch_takes_one_complex_call_per_column():
    """np.outer flattens a leading batch axis (no error, a wrong shape): column 0, the probe,
    then one call for each of the other n - 1 columns; tiny x checks the step of those."""
    def outer(x):
        return np.outer(x, x * x)

    def outer_backward(dy, x):
        return (dy @ (x * x) + 2 * x * (x @ dy),)

    x = 2.0**-70 * X
    calls, r = jacobian_calls(outer, outer_backward, [x])
    assert calls == 1 + 1 + (x.size - 1)
    assert r.check("jacobian", "input0").passed, r.report()


@pytest.mark.parametrize("method,per_column", [("central", 4), ("richardson", 6)])
def test_finite_difference_columns_cost_the_method_s_evaluations_once_each(method, per_column):
    kw = {"second_order": False, "method": method}
    full = gradcheck(linear, backward_of(A), [X], full=True, **kw)
    plain = gradcheck(linear, backward_of(A), [X], **kw)
    assert full.evaluations["forward"] - plain.evaluations["forward"] == per_column * X.size
    assert full.check("jacobian", "input0").passed


def test_batches_hold_at_most_the_batch_budget_of_columns(monkeypatch):
    """_BATCH_ELEMS = 10 over max(n_out, n) = 5 elements per column: batches of 2 columns."""
    monkeypatch.setattr(derivatives, "_BATCH_ELEMS", 10)
    batches = []

    def recording(x):
        if x.ndim == 2:
            batches.append(x.shape[0])
        return cubic(x)

    calls, r = jacobian_calls(recording, cubic_backward, [X])
    assert r.check("jacobian", "input0").passed, r.report()
    assert batches and max(batches) <= 2
    # column 0, probe, column 1, then columns 1..4 in batches of 2
    assert calls == 3 + 2


def summed(x):
    """y = x·Σx, summing over every axis: wrong for a stack of x (it sums the stack too)."""
    return x * np.sum(x)


def summed_backward(dy, x):
    return (dy * np.sum(x) + np.sum(dy * x),)


def last_scaled(x):
    """y = x·x.flat[-1]: reads the last element of the whole array, wrong for a stack of x,
    and only visibly so when the probe's second column is the last one."""
    return x * x.reshape(-1)[-1]


def last_scaled_backward(dy, x):
    dx = dy * x[-1]
    dx[-1] += np.sum(dy * x)
    return (dx,)


@pytest.mark.parametrize("scale", [1.0, 2.0**-70])
@pytest.mark.parametrize("fb", [(summed, summed_backward), (last_scaled, last_scaled_backward)],
                         ids=["sum-over-all-axes", "flat-last-element"])
def test_a_forward_that_mixes_a_stack_is_not_batched(fb, scale):
    """The probe's two columns disagree with single calls: one call per column instead, and
    the Jacobian is right."""
    forward, backward = fb
    x = scale * np.array([0.5, -1.0, 1.5, 2.0, 0.75])
    calls, r = jacobian_calls(forward, backward, [x])
    assert r.check("jacobian", "input0").passed, r.report()
    assert calls == 1 + 1 + 1 + (x.size - 1)


def test_a_forward_that_warns_is_still_batched():
    def warning(x):
        warnings.warn("a forward's own warning", UserWarning, stacklevel=2)
        return cubic(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        calls, r = jacobian_calls(warning, cubic_backward, [X])
    assert calls == 4 and r.check("jacobian", "input0").passed


def test_a_forward_that_cannot_hold_a_large_batch_falls_back_to_single_columns():
    """Two columns fit, four raise MemoryError: the batch of columns 1..4 fails after the probe
    passed, and those columns are computed one by one."""
    def small_batches(x):
        if x.ndim == 2 and x.shape[0] > 2:
            raise MemoryError("batch too large")
        return cubic(x)

    calls, r = jacobian_calls(small_batches, cubic_backward, [X])
    assert r.check("jacobian", "input0").passed, r.report()
    assert calls == 1 + 1 + 1 + 1 + (X.size - 1)


def test_two_outputs_are_batched_together():
    def bwd(dys, x):
        dy, dz = dys
        dx = dy @ A
        dx[:2] += 2.0 * dz
        return (dx,)

    calls, r = jacobian_calls(two_outputs, bwd, [X])
    assert calls == 4 and r.check("jacobian", "input0").passed, r.report()


@pytest.mark.parametrize("n,calls", [(1, 1), (2, 4)])
def test_inputs_of_one_and_two_elements(n, calls):
    """A one-element input is a single column (no batching); with two, both columns are right
    and a wrong second one is caught."""
    w0 = np.linspace(0.5, 1.0, n)

    def fwd(x, w):
        return (x @ A.T) * w.sum(axis=-1, keepdims=True)

    def bwd(dy, x, w, bug=0.0):
        dw = np.full(n, np.sum(dy * (X @ A.T)))
        dw[-1] += bug
        return ((dy @ A) * w.sum(), dw)

    got, r = jacobian_calls(fwd, bwd, [X, w0], wrt=[1])
    assert got == calls
    assert r.check("jacobian", "input1").passed, r.report()
    r = gradcheck(fwd, lambda dy, x, w: bwd(dy, x, w, bug=2.0**-20), [X, w0], wrt=[1],
                  full=True, second_order=False, localize=False)
    assert r.check("jacobian", "input1").passed is False


# ------------------------------------------------------------------------------------------------
# a point that cannot be checked
# ------------------------------------------------------------------------------------------------
def test_an_input_with_nan_fails_naming_the_input_its_count_and_first_element():
    bad = np.array([[1.0, np.nan], [np.inf, 2.0]])
    r = gradcheck(lambda a, x: a * x.sum(), lambda dy, a, x: (dy * x.sum(), np.full_like(x, 1)),
                  [np.ones(2), bad], names=["a", "x"], method="central", rtol=1e-9, atol=0.5,
                  seed=3)
    note = ("the input has NaN/Inf at this point (x: 2 NaN/Inf element(s), the first at (0, 1)): "
            "a derivative there cannot be checked")
    [c] = r.checks
    assert (c.name, c.input, c.passed, c.tolerance, c.ratio, c.note) == (
        "input", None, False, 0.0, math.inf, note)
    assert math.isnan(c.observed)
    assert (r.method, r.notes, r.evaluations) == ("central", [note], {})
    assert r.settings == {"rtol": 1e-9, "atol": 0.5, "seed": 3}
    assert not r and r.report().startswith("gradcheck: FAILED (1 of 1)   method: central   "
                                           "rtol: 1e-09")


def test_a_point_that_cannot_be_checked_records_rtol_0_when_none_was_given():
    r = gradcheck(lambda x: x, lambda dy, x: (dy,), [np.array([np.inf, 1.0, np.nan])])
    assert r.settings == {"rtol": 0.0, "atol": 0.0, "seed": 0}
    assert "(input0: 2 NaN/Inf element(s), the first at (0,))" in r.checks[0].note


# ------------------------------------------------------------------------------------------------
# what the callables return: the structure of the gradients, and errors naming what came back
# ------------------------------------------------------------------------------------------------
def test_the_shapes_check_lists_every_problem_with_its_figures():
    """Two problems (a gradient for a float constant, a wrong shape after a None): observed is
    their number, the ratio infinite, the note both messages in input order."""
    x, w = np.ones((2, 3)), np.ones(3)

    def bwd(dy, x, w, c):
        return (None, np.zeros(4), np.float64(1.0))

    r = gradcheck(lambda x, w, c: x * w * c, bwd, [x, w, 3.0], names=["x", "w", "c"],
                  n_directions=1)
    c = r.check("shapes")
    assert (c.passed, c.observed, c.tolerance, c.ratio) == (False, 2.0, 0.0, math.inf)
    assert c.note == ("w: gradient shape (4,) != input shape (3,); "
                      "c: a gradient for a non-array input")


def test_a_gradient_for_an_array_held_constant_is_checked_for_shape_only():
    """wrt=[0]: w is a constant float array; a gradient of its shape and dtype is fine."""
    x, w = np.linspace(0.5, 1.0, 3), np.linspace(1.0, 2.0, 3)
    r = gradcheck(lambda x, w: x * w, lambda dy, x, w: (dy * w, dy * x), [x, w], wrt=[0])
    c = r.check("shapes")
    assert (c.passed, c.observed, c.ratio, c.note) == (True, 0.0, 0.0, "")
    assert r, r.report()


def test_a_forward_returning_something_else_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"^forward returned None; expected a floating array "
                                        r"or a tuple of floating arrays$"):
        gradcheck(lambda x: None, lambda dy, x: (dy,), [np.ones(2)])
    with pytest.raises(TypeError, match=r"^forward returned a tuple of 2: \(an array of shape "
                                        r"\(2,\) and dtype float64, None\)"):
        gradcheck(lambda x: (x, None), lambda dy, x: (dy,), [np.ones(2)])


def test_a_backward_returning_the_wrong_thing_is_named_with_what_it_returned():
    x = np.ones(2)
    with pytest.raises(TypeError, match=r"^backward returned an array of shape \(2,\) and dtype "
                                        r"float64; expected a tuple of 2 gradients \(one per "
                                        r"input, None where there is none\)$"):
        gradcheck(lambda x, w: x * w, lambda dy, x, w: dy, [x, x])
    with pytest.raises(ValueError, match=r"^backward returned 1 gradient\(s\) for 2 inputs: a "
                                         r"tuple of 1: \(None\)$"):
        gradcheck(lambda x, w: x * w, lambda dy, x, w: (None,), [x, x])
    with pytest.raises(TypeError, match=r"^backward returned str 'dx' as gradient 1; expected a "
                                        r"floating array or None$"):
        gradcheck(lambda x, w: x * w, lambda dy, x, w: (dy * w, "dx"), [x, x])


def test_bfloat16_arrays_are_floating_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    x = np.array([0.5, -1.0, 1.5], dtype=bf16)

    def fwd(x):
        return x * x if x.dtype.kind == "c" else (x * x).astype(bf16)

    def bwd(dy, x):
        return ((2 * x.astype(np.float64) * dy).astype(bf16),)

    # bfloat16's default rtol (RTOL_ULPS·2^-8 = 4) is refused (NOT CHECKED); a given one is used
    assert _default_rtol_refused(gradcheck(fwd, bwd, [x]))
    r = gradcheck(fwd, bwd, [x], rtol=0.05)
    assert r.check("vjp", "input0").passed, r.report()
    assert r.settings["rtol"] == 0.05


def _default_rtol_refused(r):
    return (r.check("vjp", "input0").passed is None and not r
            and r.settings["rtol"] == RTOL_ULPS * 2.0**-8)


def test_an_explicit_rtol_is_used():
    r = gradcheck(linear, backward_of(A), [X], rtol=1e-6, second_order=False)
    assert r.settings["rtol"] == 1e-6


def test_the_default_rtol_follows_a_float32_output_of_a_float64_input():
    """The forward rounds to float32, the gradients are float64: rtol is float32's."""
    def fwd(x):
        return x * 2 if x.dtype.kind == "c" else (x * 2).astype(np.float32)

    r = gradcheck(fwd, lambda dy, x: (2.0 * dy.astype(np.float64),), [X], second_order=False)
    assert r.settings["rtol"] == RTOL_ULPS * 2.0**-24
    assert r, r.report()


def test_an_integer_array_constant_stays_an_integer_array_in_the_complex_step():
    """An index array is passed through untouched (not promoted to complex): the forward can
    still index with it, and the complex step stays the method."""
    idx = np.array([2, 0, 1])

    def fwd(x, idx):
        return x[idx] * x[idx]

    def bwd(dy, x, idx):
        dx = np.zeros_like(x)
        np.add.at(dx, idx, 2 * x[idx] * dy)
        return (dx, None)

    r = gradcheck(fwd, bwd, [np.array([0.5, -1.0, 2.0]), idx])
    assert r.method == "complex" and r, r.report()


# ------------------------------------------------------------------------------------------------
# the directions
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["complex", "central"])
def test_input_directions_are_gaussian_or_relative_to_x_for_finite_differences(method):
    """A jvp sees the directions: standard normal for the complex step whatever the scale of x;
    scaled by |x| elementwise for finite differences (steps small next to each element)."""
    x = np.array([1e6, -1e6, 1e3, 2e6, 5e5])
    seen = []

    def jvp(inputs, tangents):
        seen.append(tangents[0])
        return tangents[0] * 2.0

    gradcheck(lambda x: 2.0 * x, lambda dy, x: (2.0 * dy,), [x], jvp=jvp, method=method,
              second_order=False, n_directions=8)
    t = np.array(seen)
    relative = np.abs(t) / np.abs(x)
    if method == "complex":
        assert np.max(np.abs(t)) < 10
    else:
        assert np.max(relative) < 10 and np.max(np.abs(t[:, 0])) > 1e3


# ------------------------------------------------------------------------------------------------
# a None gradient, and the second order through the backward's wrapper
# ------------------------------------------------------------------------------------------------
def test_a_none_gradient_of_an_unused_input_passes_with_a_zero_error():
    """y = x² does not depend on w: the check of backward's None for w compares 0 with 0."""
    x, w = np.array([0.5, -1.0, 1.5]), np.array([2.0, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning from the zeros standing for None
        r = gradcheck(lambda x, w: x * x, lambda dy, x, w: (2 * x * dy, None), [x, w],
                      atol=0.25)
    c = r.check("vjp", "input1")
    assert (c.passed, c.observed, c.ratio) == (True, 0.0, 0.0)
    # the tolerance of a check with a zero scale is atol itself
    assert c.tolerance == 0.25
    # second order through a None gradient: zeros of w's shape and of the call's dtype
    assert r.check("second_order").passed, r.report()
    assert r.check("hessian_symmetry").passed


# ------------------------------------------------------------------------------------------------
# the numerical JVPs: their steps and error estimates on polynomials with known answers
# ------------------------------------------------------------------------------------------------
U64 = 2.0**-53
V = np.array([1.0, -0.5, 0.25])  # max |v| = 1; powers of two keep every step exact


def as_F(f):
    """f(*args) as the checker's F(args) -> list of outputs."""
    return lambda args, complex_=False: [np.asarray(f(*args))]


def test_central_differences_step_u_to_the_third_and_estimate_their_truncation():
    """x³ at x = 0 along v: D(h) = h²·v³ exactly, all of it truncation (the derivative is 0),
    with h = u^(1/3) rounded to a power of two (2^-18). The estimate (D(2h) − D(h))/3 is h²|v|³,
    plus the rounding bound 4u·(|f(x+hv)| + |f(x−hv)|)/(2h) = 4u·h²|v|³."""
    h = 2.0**-18
    jv, v_eff, err = _numeric_jvp(as_F(lambda x: x**3), [np.zeros(3)], {0: V}, "central", U64)
    np.testing.assert_array_equal(jv[0], h**2 * V**3)
    np.testing.assert_array_equal(v_eff[0], V)
    np.testing.assert_allclose(err[0], h**2 * np.abs(V) ** 3 * (1 + 4 * U64), rtol=1e-15)


def test_richardson_cancels_h2_and_h4_and_estimates_by_its_last_two_entries():
    """x⁵ at x = 0: D(h) = h⁴·v⁵; Romberg at h, h/2, h/4 (h = u^(1/5) -> 2^-11) cancels it
    exactly, and the error estimate |R − R1| is the last O(h⁴) entry's h⁴|v|⁵/64 (plus twice
    the rounding bound at h/4, 2u of it)."""
    h = 2.0**-11
    jv, v_eff, err = _numeric_jvp(as_F(lambda x: x**5), [np.zeros(3)], {0: V}, "richardson",
                                  U64)
    np.testing.assert_array_equal(jv[0], 0.0)
    np.testing.assert_allclose(err[0], h**4 * np.abs(V) ** 5 / 64 * (1 + 2 * U64), rtol=1e-15)


@pytest.mark.parametrize("method,h,weight", [("central", 2.0**-18, 1), ("richardson", 2.0**-13, 2)])
def test_the_rounding_bound_of_a_constant_s_difference(method, h, weight):
    """f = 1 whatever x: every difference is 0, and the estimate is the rounding bound
    4u·(1 + 1)/(2·step) at the smallest step (h for central, h/4 for Richardson, h = 2^-11),
    times the Romberg weights' bound 2."""
    jv, _, err = _numeric_jvp(as_F(lambda x: np.ones(3) + 0 * x), [np.zeros(3)], {0: V}, method,
                              U64)
    np.testing.assert_array_equal(jv[0], 0.0)
    np.testing.assert_array_equal(err[0], weight * 4 * U64 * 2 / (2 * h))


@pytest.mark.parametrize("method", ["central", "richardson"])
def test_the_derivative_is_along_the_direction_actually_taken(method):
    """float32 x: x ± h·v rounds to float32, so the step taken is not h·v. For y = 3·x the
    derivative returned is exactly 3 times the direction returned with it."""
    x = np.linspace(0.3, 1.7, 7).astype(np.float32)
    v = np.linspace(-1.0, 0.9, 7)
    jv, v_eff, err = _numeric_jvp(as_F(lambda x: 3.0 * x.astype(np.float64)), [x], {0: v},
                                  method, 2.0**-24)
    assert np.max(np.abs(v_eff[0] - v)) > 1e-7  # the rounding is visible
    np.testing.assert_allclose(jv[0], 3.0 * v_eff[0], rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# the holomorphy test
# ------------------------------------------------------------------------------------------------
def conj_square(x):
    """x·conj(x) = x² for real x, but its complex step is 0: not holomorphic."""
    return x * np.conj(x)


@pytest.mark.parametrize("scale", [1.0, 2.0**-40, 2.0**40])
def test_a_non_holomorphic_forward_is_detected_at_any_scale(scale):
    x = scale * np.array([0.5, -1.0, 1.5])
    why = _holomorphy_test(as_F(conj_square), [x], {0: x * V}, U64)
    assert why is not None and "it is not holomorphic" in why
    rel = float(re.search(r"differs from a central difference by (\S+) ", why).group(1))
    assert rel == pytest.approx(1.0, rel=1e-6)


def test_a_complex_step_off_by_exactly_one_is_detected():
    """x = 0.5, v = 1: the central difference of x·conj(x) is exactly 1.0, its complex step 0."""
    why = _holomorphy_test(as_F(conj_square), [np.array([0.5])], {0: np.array([1.0])}, U64)
    assert why is not None and "1.00e+00 (relative, 1-norm)" in why


def test_the_relative_mismatch_is_against_the_central_difference_and_its_rounding_bound():
    """0.5·(x·conj(x) + 2^28): the complex step is 0, the central difference ~0.5 with a
    rounding bound 2^-5 next to it; the mismatch relative to both is below 1 (and finite with a
    denominator below 1)."""
    def f(x):
        return 0.5 * (conj_square(x) + 2.0**28)

    why = _holomorphy_test(as_F(f), [np.array([0.5])], {0: np.array([1.0])}, U64)
    rel = float(re.search(r"differs from a central difference by (\S+) ", why).group(1))
    assert rel == pytest.approx(0.5 / (0.5 + 2.0**-5), rel=0.05)
    assert rel < 1


def test_a_holomorphic_forward_with_a_large_derivative_keeps_the_complex_step():
    x = 2.0**40 * np.linspace(0.5, 1.5, 64)
    r = gradcheck(lambda x: x**3, lambda dy, x: (3 * x * x * dy,), [x], second_order=False)
    assert r.method == "complex" and r, r.report()


# ------------------------------------------------------------------------------------------------
# the oracle problems
# ------------------------------------------------------------------------------------------------
def test_oracle_problems_refuse_parameters_their_op_does_not_have():
    with pytest.raises(ValueError, match=r"^layer_norm has no weight offset \(got offset=1.0\)$"):
        oracle_problem("layer_norm", offset=1.0)
    with pytest.raises(ValueError, match=r"^only rms_norm has partial \(got partial=0.5 for "
                                         r"unit_norm\)$"):
        oracle_problem("unit_norm", partial=0.5)
    with pytest.raises(ValueError, match=r"^add_rms_norm has no bias$"):
        oracle_problem("add_rms_norm", bias=True)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "unit_norm", "add_rms_norm"])
def test_an_oracle_problem_is_in_its_dtype_and_says_what_it_is(op):
    bias = op != "add_rms_norm"
    p = oracle_problem(op, (2, 8), bias=bias, dtype=np.float32, seed=5)
    assert p.op == op
    assert all(a.dtype == np.float32 for a in p.inputs)
    for part in (op, "shape=(2, 8)", "normalized_shape=(8,)", "weight=True", f"bias={bias}",
                 "dtype=float32", "seed=5"):
        assert part in p.description, (part, p.description)
    if op in ("layer_norm", "unit_norm"):
        assert p.jvp is not None


def test_a_float32_rms_norm_problem_uses_float32_s_default_eps():
    p = oracle_problem("rms_norm", (2, 8), dtype=np.float32)
    x, w, b = p.inputs
    np.testing.assert_array_equal(p.forward(*p.inputs), rmsref.rms_norm_forward(x, (8,), w)[0])


def test_an_oracle_problem_without_weight_has_none_there():
    p = oracle_problem("rms_norm", (2, 8), weight=False)
    assert p.inputs[1] is None and p.inputs[2] is None


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_oracle_weights_are_near_one_minus_offset_and_biases_near_zero(offset):
    """weight ~ (1 − offset) + 0.5·N(0, 1) (near 0 when used as 1 + w), bias ~ 0.5·N(0, 1):
    over 1024 elements the mean is within 0.1 and the spread within 20 %."""
    p = oracle_problem("rms_norm", (2, 1024), bias=True, offset=offset)
    x, w, b = p.inputs
    assert abs(np.mean(w) - (1.0 - offset)) < 0.1 and 0.4 < np.std(w) < 0.6
    assert abs(np.mean(b)) < 0.1 and 0.4 < np.std(b) < 0.6


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "unit_norm"])
def test_an_oracle_jvp_along_the_bias_alone_is_the_bias_tangent(op):
    """y = ... + bias: along the bias only, the output's tangent is the bias tangent, in the
    problem's dtype also when the x tangent is None."""
    p = oracle_problem(op, (2, 8), bias=True, dtype=np.float32)
    tb = np.linspace(-1.0, 1.0, 8).astype(np.float32)
    out = p.jvp(p.inputs, (None, None, tb))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.broadcast_to(tb, (2, 8)))
    tw = np.linspace(0.5, 1.0, 8).astype(np.float32)
    x = p.inputs[0]
    np.testing.assert_array_equal(p.jvp(p.inputs, (None, tw, None)),
                                  p.jvp(p.inputs, (np.zeros_like(x), tw, None)))


def test_the_oracle_double_backward_reads_a_none_ddx_as_zeros():
    p = oracle_problem("rms_norm", (2, 8), bias=True)
    x, w, b = p.inputs
    dy, ddw = np.linspace(-1.0, 1.0, 16).reshape(2, 8), np.linspace(0.0, 1.0, 8)
    got = p.double_backward((None, ddw, None), dy, *p.inputs)
    want = p.double_backward((np.zeros_like(x), ddw, None), dy, *p.inputs)
    for g, h in zip(got, want, strict=True):
        if h is None:
            assert g is None
        else:
            np.testing.assert_array_equal(g, h)


def test_check_oracle_passes_its_defaults_and_every_option_on(monkeypatch):
    seen = []
    real = derivatives.oracle_problem

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(derivatives, "oracle_problem", spy)
    r = check_oracle("rms_norm", (2, 4), second_order=False, n_directions=1)
    assert seen[-1] == (("rms_norm", (2, 4)), {"weight": True, "bias": False, "offset": 0.0,
                                               "partial": None, "eps": None, "seed": 0})
    assert r.settings["seed"] == 0 and r.settings["n_directions"] == 1
    r = check_oracle("rms_norm", (2, 4), weight=False, bias=True, offset=1.0, partial=0.5,
                     eps=1e-3, seed=7, second_order=False, full=True)
    assert seen[-1] == (("rms_norm", (2, 4)), {"weight": False, "bias": True, "offset": 1.0,
                                               "partial": 0.5, "eps": 1e-3, "seed": 7})
    assert r.settings["seed"] == 7 and r.settings["full"] is True
    assert r, r.report()


def test_the_oracle_configurations():
    """Per shape (3 rows of 16, and a 2 x 3 batch of rows of 8): rms_norm without weight, with
    weight, with bias, with gemma's offset 1, and pRMSNorm with bias; layer_norm with bias and
    without weight; unit_norm with and without bias; add_rms_norm with offsets 0 and 1."""
    per_shape = [
        {"op": "rms_norm", "weight": False}, {"op": "rms_norm"},
        {"op": "rms_norm", "bias": True}, {"op": "rms_norm", "offset": 1.0},
        {"op": "rms_norm", "partial": 0.5, "bias": True},
        {"op": "layer_norm", "bias": True}, {"op": "layer_norm", "weight": False},
        {"op": "unit_norm"}, {"op": "unit_norm", "bias": True},
        {"op": "add_rms_norm"}, {"op": "add_rms_norm", "offset": 1.0},
    ]
    assert oracle_configs() == [{**c, "shape": s} for s in ((3, 16), (2, 3, 8))
                                for c in per_shape]


def test_check_oracle_all_walks_the_configurations_with_its_seed_and_options(monkeypatch):
    monkeypatch.setattr(derivatives, "oracle_configs", lambda: [
        {"op": "rms_norm", "shape": (2, 3, 4), "bias": True},
        {"op": "add_rms_norm", "shape": (3, 5), "offset": 1.0}])
    out = check_oracle_all(seed=3, n_directions=1, second_order=False)
    assert [d.split(" ")[0] for d, _ in out] == ["rms_norm", "add_rms_norm"]
    (d0, r0), (d1, r1) = out
    assert "shape=(2, 3, 4)" in d0 and "bias=True" in d0 and "seed=3" in d0
    assert "shape=(3, 5)" in d1 and "offset=1.0" in d1
    for _, r in out:
        assert r.settings["seed"] == 3 and r.settings["n_directions"] == 1
        assert r.settings["full"] is False and r, r.report()
    # the default seed is 0 and the Jacobian is not built
    for d, r in check_oracle_all(n_directions=1, second_order=False):
        assert "seed=0" in d and r.settings["seed"] == 0 and r.settings["full"] is False


# ------------------------------------------------------------------------------------------------
# two Jacobians that used to be misjudged
# ------------------------------------------------------------------------------------------------
def test_a_nan_entry_of_the_vjp_fails_the_jacobian_check():
    """A NaN in the VJP's matrix: dx = Abᵀ·dy has a NaN at x_2 for every dy (0·NaN is NaN), so
    column 2 of the rows has NaN ratios, which used to leave the check passed with ratio -1."""
    r, c = jacobian(with_errors((1, 2, np.nan)))
    assert (c.passed, c.ratio) == (False, math.inf)
    assert c.note == "3 of 15 entries out of tolerance"
    assert sorted(w.output_index for w in c.worst) == [(0,), (1,), (2,)]
    assert all(w.input_index == (2,) and math.isnan(w.analytic) for w in c.worst)


def test_a_nan_entry_where_the_true_column_is_zero_fails_the_jacobian_check():
    """y = A0·x with column 2 of A0 zero: every entry of that column has scale 0, so its
    tolerance is 0 (atol 0). A NaN there is not an error of 0: it fails (it used to read as
    ratio 0 and pass, since NaN > 0 is False)."""
    a0 = A.copy()
    a0[:, 2] = 0.0
    ab = a0.copy()
    ab[1, 2] = np.nan
    r, c = jacobian(ab, forward=lambda x: x @ a0.T)
    assert (c.passed, c.ratio) == (False, math.inf)
    assert c.note == "3 of 15 entries out of tolerance"  # 0·NaN: the whole column, every row
    assert all(w.input_index == (2,) and math.isnan(w.analytic) for w in c.worst)
    right, c_right = jacobian(a0, forward=lambda x: x @ a0.T)
    assert c_right.passed and c_right.ratio == 0.0


def test_the_jacobian_of_an_empty_input_is_skipped():
    """An empty batch has no Jacobian entries: the check is skipped, saying so (it used to
    raise IndexError), and the other checks still decide the verdict."""
    x = np.zeros((0, 4))
    r = gradcheck(lambda x: x * x, lambda dy, x: (2 * x * dy,), [x], full=True)
    c = r.check("jacobian", "input0")
    assert (c.passed, c.note) == (None, "skipped: the Jacobian has no entries (0 x 0)")
    assert r, r.report()


def test_a_double_backward_may_return_none_for_an_output_the_gradients_ignore():
    """(1, x²): the backward does not read dy of the constant first output, so the double
    backward's ddy for it is None (zero); the second output's ddy still counts."""
    def fwd(x):
        return 0.0 * x + 1.0, x * x

    def bwd(dys, x):
        return (2 * x * dys[1],)

    def dbl(dd, dys, x, bug=1.0):
        (ddx,) = dd
        return (None, 2 * x * ddx * bug), 2 * dys[1] * ddx

    x = np.array([0.5, -1.0, 1.5])
    r = gradcheck(fwd, bwd, [x], double_backward=dbl, localize=False)
    assert r.check("double_backward", "dy").passed, r.report()
    r = gradcheck(fwd, bwd, [x], double_backward=lambda *a: dbl(*a, bug=1.5), localize=False)
    assert r.check("double_backward", "dy").passed is False


def test_the_second_order_checks_survive_a_backward_that_scribbles_on_its_dy():
    """The backward zeroes its dy after use: reentrancy says so, and the second-order checks,
    which hand the backward copies of their cotangents, are still right."""
    def bwd(dy, x):
        g = 3 * x * x * dy
        dy[...] = 0
        return (g,)

    r = gradcheck(lambda x: x**3, bwd, [np.array([0.5, -1.0, 1.5])], localize=False)
    assert r.check("reentrancy").note == "the backward modified its dy in place"
    for name in ("hessian_symmetry", "second_order"):
        c = r.check(name)
        # compared against a real scale: the cotangent u was not zeroed under the check
        assert c.passed and c.tolerance > 0, r.report()


def test_a_double_backward_gets_no_scalar_for_an_input_whose_gradient_is_none():
    """backward returns None for w (unused): the double backward's cotangent for it is None or
    an array of w's shape, never a scalar standing for zeros."""
    x, w = np.array([0.5, -1.0, 1.5]), np.array([2.0, 3.0])
    seen = []

    def dbl(dd, dy, x, w):
        ddx, ddw = dd
        seen.append(None if ddw is None else np.shape(ddw))
        return 2 * x * ddx, 2 * dy * ddx, None

    r = gradcheck(lambda x, w: x * x, lambda dy, x, w: (2 * x * dy, None), [x, w],
                  double_backward=dbl, localize=False)
    assert seen and all(s is None or s == w.shape for s in seen), seen
    assert r, r.report()


@pytest.mark.parametrize("method", ["central", "richardson"])
def test_finite_difference_columns_are_divided_by_the_step_actually_taken(method):
    """float32 x just below 2: x + h·e_j crosses into [2, 4) and rounds to float32 for three of
    the five (a step off by ~8e-6 relative). Dividing by the step taken, the columns of a
    linear map (computed in float64) come out as A to ~1e-12."""
    x = (1.9999 - 1e-4 * np.arange(5)).astype(np.float32)
    J, E = derivatives._jacobian_columns(as_F(lambda x: x.astype(np.float64) @ A.T), [x], 0,
                                         method, 2.0**-24, 1)
    np.testing.assert_allclose(J, A, rtol=1e-12, atol=1e-12)
    assert E is not None and E.shape == A.shape


@pytest.mark.parametrize("method", ["central", "richardson"])
def test_a_finite_difference_column_and_its_error_are_per_unit_of_the_step_taken(method):
    """Column j and its error estimate are the JVP along e_j and its error, both divided by the
    step actually taken (v_eff_j, not 1 where x + h rounds in float32)."""
    x = (1.9999 - 1e-4 * np.arange(5)).astype(np.float32)
    F = as_F(lambda x: x.astype(np.float64) @ A.T)
    J, E = derivatives._jacobian_columns(F, [x], 0, method, 2.0**-24, 1)
    for j in range(5):
        e = np.zeros(5)
        e[j] = 1.0
        jv, v_eff, err = _numeric_jvp(F, [x], {0: e}, method, 2.0**-24)
        vj = v_eff[0][j]
        np.testing.assert_allclose(J[:, j], jv[0] / vj, rtol=1e-15)
        np.testing.assert_allclose(E[:, j], err[0] / abs(vj), rtol=1e-15)


@pytest.mark.parametrize("c_h2,detected", [(1 / 24.5, True), (1 / 22, False)])
def test_a_mismatch_counts_when_above_eight_times_the_central_difference_s_instability(
        c_h2, detected):
    """x·conj(x) + c·(x − 1/2)³ at x = 1/2, v = 1, step h = 2^-19: the complex step is ~0, the
    central difference D(h) = 1 + c·h², so the mismatch is 1 + c·h² and the instability
    |D(h) − D(2h)| = 3·c·h². Above 8 times that it is not holomorphic; below, the difference
    is too unstable to say."""
    c = c_h2 / 2.0**-38

    def f(x):
        return conj_square(x) + c * (x - 0.5) ** 3

    why = _holomorphy_test(as_F(f), [np.array([0.5])], {0: np.array([1.0])}, U64)
    assert (why is not None) == detected, why


def test_every_non_finite_input_is_named_in_the_note():
    r = gradcheck(lambda a, x: a * x.sum(), lambda dy, a, x: (dy * x.sum(), np.full_like(x, 1)),
                  [np.array([np.nan, 1.0]), np.array([1.0, np.inf])], names=["a", "x"])
    assert ("(a: 1 NaN/Inf element(s), the first at (0,); x: 1 NaN/Inf element(s), the first "
            "at (1,))") in r.checks[0].note


def test_a_gradient_for_a_leading_constant_does_not_hide_the_next_input_s_problem():
    x = np.ones(3)
    r = gradcheck(lambda c, x: c * x, lambda dy, c, x: (np.float64(1.0), np.zeros(2)), [3.0, x],
                  names=["c", "x"])
    assert r.check("shapes").note == ("c: a gradient for a non-array input; "
                                      "x: gradient shape (2,) != input shape (3,)")


def test_a_float32_rms_norm_problem_uses_float32_s_default_eps_where_it_matters():
    """At |x| ~ 1e-4 (mean square 1e-8) float32's default eps, 1.2e-7, dominates the norm."""
    p = oracle_problem("rms_norm", (2, 8), dtype=np.float32)
    x, w, b = p.inputs
    small = (1e-4 * x).astype(np.float32)
    np.testing.assert_array_equal(p.forward(small, w, b),
                                  rmsref.rms_norm_forward(small, (8,), w)[0])


@pytest.mark.parametrize("constant_first", [False, True], ids=["x, c", "c, x"])
def test_a_float32_constant_is_passed_as_given_to_the_complex_step(constant_first):
    """c is a constant float32 array (not in wrt), after x or before it. The complex step used
    to get it promoted to complex128, so it differentiated x·(c·c) with c·c in float64 while the
    forward and the backward compute it in float32: a false alarm at ratio ~1e5."""
    c = np.array([1.1, 0.7, 1.3], np.float32)
    x = np.array([0.5, -1.0, 1.5])

    if constant_first:
        def bwd(dy, c, x):
            return (None, dy * (c * c))

        r = gradcheck(lambda c, x: x * (c * c), bwd, [c, x], wrt=[1], full=True)
    else:
        def bwd(dy, x, c):
            return (dy * (c * c), None)

        r = gradcheck(lambda x, c: x * (c * c), bwd, [x, c], wrt=[0], full=True)
    assert r, r.report()


def test_an_empty_input_skips_its_jacobian_and_the_next_input_is_still_checked():
    """Inputs (c, x) with c empty: c's Jacobian has no entries and is skipped, saying so; x's,
    after it, is still compared entry by entry (a wrong entry there fails)."""
    c = np.zeros(0)
    x = np.array([0.5, -1.0, 1.5])

    def fwd(c, x):
        return x * x + np.sum(c)

    def bwd(dy, c, x):
        return (np.zeros(0) + np.sum(dy), 2 * x * dy)

    r = gradcheck(fwd, bwd, [c, x], names=["c", "x"], full=True)
    jc, jx = r.check("jacobian", "c"), r.check("jacobian", "x")
    assert (jc.passed, jc.note) == (None, "skipped: the Jacobian has no entries (3 x 0)")
    assert jx.passed is True and jx.ratio < 1, r.report()

    def wrong(dy, c, x):
        return (np.zeros(0), 2 * x * dy * np.array([1.0, 1.0, 1.01]))

    r = gradcheck(fwd, wrong, [c, x], names=["c", "x"], full=True)
    assert r.check("jacobian", "x").passed is False, r.report()


def test_a_scalar_output_has_its_one_row_jacobian_checked():
    """y = Σ x² has one output element: its Jacobian is one row, compared like any other (not
    skipped as if it had none)."""
    x = np.array([0.5, -1.0, 1.5, 2.0])
    r = gradcheck(lambda x: np.sum(x * x), lambda dy, x: (2 * x * dy,), [x], full=True)
    c = r.check("jacobian", "input0")
    assert c.passed is True and c.ratio < 1, r.report()
    r = gradcheck(lambda x: np.sum(x * x), lambda dy, x: (2.01 * x * dy,), [x], full=True)
    assert r.check("jacobian", "input0").passed is False
