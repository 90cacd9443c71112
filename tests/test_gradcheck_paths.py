"""Paths of gradcheck that the planted-bug and no-false-alarm suites do not reach.

A forward with two outputs checked to second order, inputs in another order than the oracle's,
the batched complex steps of the full Jacobian, the oracle problems' own arguments, and the texts
a failing check reports. Each test names the property; each was written against a one-line
change to ``rmsref.derivatives`` that no other test noticed (a mutation survivor).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import rmsref
from rmsref.derivatives import (
    ORACLE_OPS,
    CheckResult,
    GradcheckResult,
    WorstEntry,
    _Worst,
    check_oracle,
    gradcheck,
    oracle_configs,
    oracle_problem,
)


# ------------------------------------------------------------------------------------------------
# a forward with two outputs: (x·w, x²), elementwise
# ------------------------------------------------------------------------------------------------
def _two_outputs(x, w):
    return x * w, x * x


def _two_outputs_backward(dy, x, w):
    dy1, dy2 = dy
    return dy1 * w + 2 * x * dy2, np.sum(dy1 * x, axis=0)


def _two_outputs_double_backward(dd, dy, x, w, *, bug: float = 0.0):
    """The VJP of the backward: its outputs (dx, dw) are bilinear in (dy1, dy2) and (x, w)."""
    ddx, ddw = dd
    dy1, dy2 = dy
    ddx = np.zeros_like(x) if ddx is None else ddx
    ddw = np.zeros_like(w) if ddw is None else ddw
    ddy1 = ddx * w + ddw * x  # ∂/∂dy1 of <ddx, dx> + <ddw, dw>
    ddy2 = 2 * x * ddx
    gx = 2 * dy2 * ddx + dy1 * ddw  # ∂/∂x
    gw = np.sum(dy1 * ddx, axis=0) * (1 + bug)  # ∂/∂w
    return (ddy1, ddy2), gx, gw


def test_a_two_output_forward_is_checked_to_second_order_with_its_double_backward():
    """The double backward of a forward with two outputs gets both output cotangents as a tuple
    and returns a tuple of ddy; checked right it passes, with a 1e-6 error in one gradient it
    fails on that input alone."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    ok = gradcheck(_two_outputs, _two_outputs_backward, (x, w), names=("x", "w"),
                   double_backward=_two_outputs_double_backward, second_order=True)
    assert ok, ok.report()
    assert {c.input for c in ok.checks if c.name == "double_backward"} == {"dy", "x", "w"}

    def wrong(dd, dy, x, w):
        return _two_outputs_double_backward(dd, dy, x, w, bug=1e-6)

    bad = gradcheck(_two_outputs, _two_outputs_backward, (x, w), names=("x", "w"),
                    double_backward=wrong, second_order=True)
    assert bad.check("double_backward", "w").passed is False
    assert bad.check("double_backward", "x").passed is True
    assert bad.check("double_backward", "dy").passed is True


# ------------------------------------------------------------------------------------------------
# the cancellation floor does not depend on where x sits among the inputs
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_rms_norm_at_n_1_passes_with_the_weight_before_x(scale):
    """At N = 1 RMSNorm's derivative is ~1e-16 of its terms (a cancellation); the floor that
    keeps the oracle from failing is built for every input shaped like the output, also when
    it follows one that is not (here: the weight first)."""
    p = oracle_problem("rms_norm", (3, 1), bias=True)
    x, w, b = p.inputs
    x = x * scale

    def forward(w, b, x):
        return p.forward(x, w, b)

    def backward(dy, w, b, x):
        dx, dw, db = p.backward(dy, x, w, b)
        return dw, db, dx

    r = gradcheck(forward, backward, (w, b, x), names=("weight", "bias", "x"),
                  second_order=False)
    assert r, r.report()


# ------------------------------------------------------------------------------------------------
# the full Jacobian: batched complex steps, and the fallback when the forward does not batch
# ------------------------------------------------------------------------------------------------
def test_the_full_jacobian_batches_its_complex_steps_when_the_forward_broadcasts():
    """The oracle broadcasts over a leading axis, so the 128 + 16 + 16 columns of the Jacobian
    of rms_norm on (8, 16) take a few batched calls per input, not one call per column; a
    forward that refuses a leading batch axis gets one call per column and the same verdict."""
    p = oracle_problem("rms_norm", (8, 16), bias=True)
    plain = p.check(full=False, second_order=False)
    full = p.check(full=True, second_order=False)
    batched_calls = full.evaluations["forward_complex"] - plain.evaluations["forward_complex"]
    columns = sum(np.size(a) for a in p.inputs)
    assert full, full.report()
    assert batched_calls <= columns // 4, (batched_calls, columns)

    x0 = p.inputs[0]

    def unbatched(x, w, b):
        if np.shape(x) != x0.shape:
            raise ValueError("no batch axis")
        return p.forward(x, w, b)

    loop = gradcheck(unbatched, p.backward, p.inputs, names=p.names, full=True,
                     second_order=False)
    loop_plain = gradcheck(unbatched, p.backward, p.inputs, names=p.names, full=False,
                           second_order=False)
    assert loop, loop.report()
    calls = loop.evaluations["forward_complex"] - loop_plain.evaluations["forward_complex"]
    assert calls >= columns
    for name in p.names:
        assert loop.check("jacobian", name).ratio == pytest.approx(
            full.check("jacobian", name).ratio, rel=1e-6, abs=1e-3)


# ------------------------------------------------------------------------------------------------
# the oracle problems: their names, and the eps they were asked for
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ORACLE_OPS)
def test_oracle_problems_name_their_inputs(op):
    names = {"add_rms_norm": ("x", "residual", "weight")}.get(op, ("x", "weight", "bias"))
    assert oracle_problem(op).names == names


@pytest.mark.parametrize("op", ORACLE_OPS)
def test_oracle_problems_use_the_eps_they_are_given(op):
    """The wrapped forward is the op at the requested eps (0.5: far from every default), not
    at the op's default."""
    p = oracle_problem(op, (3, 4), eps=0.5)
    x = p.inputs[0]
    ns = (4,)
    if op == "rms_norm":
        want = rmsref.rms_norm_forward(x, ns, p.inputs[1], 0.5)[0]
    elif op == "layer_norm":
        want = rmsref.layer_norm_forward(x, ns, p.inputs[1], None, 0.5)[0]
    elif op == "unit_norm":
        want = rmsref.unit_norm_forward(x, ns, p.inputs[1], 0.5)[0]
    else:
        want = rmsref.add_rms_norm_forward(x, p.inputs[1], ns, p.inputs[2], 0.5)[0]
    got = p.forward(*p.inputs)
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_array_equal(got, want)
    default = oracle_problem(op, (3, 4)).forward(*p.inputs)
    default = default[0] if isinstance(default, tuple) else default
    assert not np.array_equal(got, default)


# ------------------------------------------------------------------------------------------------
# what a failing check says
# ------------------------------------------------------------------------------------------------
def test_a_failing_jvp_says_which_side_its_worst_entries_are_relative_to():
    p = oracle_problem("rms_norm", (2, 8))

    def jvp_wrong(inputs, tangents):
        return p.jvp(inputs, tangents) * (1 + 1e-6)

    c = p.check(jvp=jvp_wrong, second_order=False).check("jvp", "x")
    assert c.passed is False
    assert c.note == "worst entries of the VJP relative to the analytic JVP"


def test_skipped_comparisons_are_counted_after_the_checks_own_note():
    w = _Worst()
    w.add(1.0, 10.0, 2.0)  # ratio 0.5
    w.add(1.0, math.inf, 2.0)  # a scale that overflowed: counted apart
    r = w.result("jvp", "x", "a note")
    assert r.passed is True and r.ratio == 0.5
    assert r.note == ("a note; 1 comparison(s) skipped: scale out of float64's normal range")
    assert w.result("jvp", "x").note == ("1 comparison(s) skipped: scale out of float64's "
                                         "normal range")


# ------------------------------------------------------------------------------------------------
# tolerances: from the gradients' dtypes too, and at any scale
# ------------------------------------------------------------------------------------------------
def test_rtol_follows_the_coarsest_gradient_dtype():
    """float64 x with a float32 weight: y and dx are float64 but dweight is rounded to float32,
    so the checks on it need float32's rtol (float64's would call a correct dweight wrong)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4).astype(np.float32)

    def forward(x, w):
        return rmsref.rms_norm_forward(x, 4, w)[0]

    def backward(dy, x, w):
        return tuple(rmsref.rms_norm_backward(dy, x, 4, w))[:2]

    r = gradcheck(forward, backward, (x, w), names=("x", "weight"), second_order=False)
    assert forward(x, w).dtype == np.float64
    assert backward(forward(x, w), x, w)[1].dtype == w.dtype
    assert r, r.report()
    assert r.settings["rtol"] >= 2.0**10 * 2.0**-24


def test_an_empty_batch_is_checked_to_second_order():
    """No rows: every check compares empty arrays and passes (nothing can be wrong), none
    raises on the empty maxima."""
    r = oracle_problem("rms_norm", (0, 4)).check(second_order=True)
    assert r, r.report()
    assert r.check("double_backward", "dy").passed is True


@pytest.mark.parametrize("scale", [1e-8, 1e8])
def test_a_wrong_double_backward_is_caught_at_any_scale(scale):
    """The second-order tolerances are relative: a double backward off by 1e-6 in its x term is
    caught whether the inputs are near 1e-8 or 1e8 (an absolute term in the cancellation floor
    would hide it at one end)."""
    p = oracle_problem("rms_norm", (2, 8))
    x, w, b = p.inputs
    x = x * scale

    def wrong(dd, dy, x, w, b):
        ddy, dx, dw, db = p.double_backward(dd, dy, x, w, b)
        return ddy, dx * (1 + 1e-6), dw, db

    ok = gradcheck(p.forward, p.backward, (x, w, b), names=p.names,
                   double_backward=p.double_backward, second_order=True)
    assert ok, ok.report()
    bad = gradcheck(p.forward, p.backward, (x, w, b), names=p.names, double_backward=wrong,
                    second_order=True)
    assert bad.check("double_backward", "x").passed is False, bad.report()


def test_float32_rms_norm_at_n_1_passes_when_second_order_is_requested():
    """RMSNorm's default eps depends on the input's dtype; the complex step calls the op on
    complex128 inputs, so an oracle problem must fix eps from its own dtype first. Otherwise, at
    N = 1, where the derivative is proportional to eps, the complex step differentiates another
    function (float64's eps, 5e8 times smaller) and the correct float32 oracle fails."""
    r = oracle_problem("rms_norm", (3, 1), dtype=np.float32).check(second_order=True)
    assert r, r.report()
    assert r.check("second_order").passed is True


# ------------------------------------------------------------------------------------------------
# the full Jacobian by finite differences, and its worst entries
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["central", "richardson"])
def test_the_full_jacobian_by_finite_differences_passes_the_oracle(method):
    """A finite-difference Jacobian carries its own error estimate, which widens (never
    narrows) each entry's tolerance: the correct oracle passes."""
    r = oracle_problem("rms_norm", (2, 8), bias=True).check(full=True, method=method,
                                                           second_order=False)
    assert r, r.report()


def test_the_full_jacobian_lists_its_worst_entries_worst_first():
    from tests.test_gradcheck import _problem_with_bug

    r = gradcheck(*_problem_with_bug("column_127", (2, 256)), full=True, second_order=False,
                  names=("x", "weight", "bias"), max_worst=5)
    worst = r.check("jacobian", "x").worst
    assert len(worst) >= 2
    ratios = [w.ratio for w in worst]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > 1


def test_a_worst_entry_names_its_output_and_input_indices():
    w = WorstEntry(input_index=(1, 7), output_index=(0, 3), analytic=1.0, numerical=2.0,
                   error=1.0, tolerance=0.5)
    assert w.describe("x").startswith("d out[0, 3] / d x[1, 7]: analytic 1.000000000e+00")


# ------------------------------------------------------------------------------------------------
# what gradcheck says about its own arguments and results
# ------------------------------------------------------------------------------------------------
def test_wrt_naming_a_non_float_input_says_its_type_and_out_of_range_says_so():
    p = oracle_problem("rms_norm", (2, 4))
    x, w, b = p.inputs
    with pytest.raises(ValueError, match=r"wrt index 0 must name a real floating array input "
                                         r"\(list\)"):
        gradcheck(p.forward, p.backward, (x.tolist(), w, b), wrt=[0])
    with pytest.raises(ValueError, match=r"wrt index 3 .* \(out of range\)"):
        gradcheck(p.forward, p.backward, p.inputs, wrt=[3])


def test_a_jvp_returning_something_else_than_arrays_is_a_type_error_naming_it():
    p = oracle_problem("rms_norm", (2, 4))
    with pytest.raises(TypeError, match=r"jvp returned str 'dy'; expected a floating array"):
        p.check(jvp=lambda inputs, tangents: "dy", second_order=False)
    with pytest.raises(TypeError, match=r"jvp returned a tuple of 2: \(an array of shape "
                                        r"\(2, 4\) and dtype float64, int 3\)"):
        p.check(jvp=lambda inputs, tangents: (p.jvp(inputs, tangents), 3), second_order=False)


def test_a_missing_check_is_a_key_error_listing_the_checks_there_are():
    r = oracle_problem("rms_norm", (2, 4)).check(second_order=False)
    with pytest.raises(KeyError, match=r"no check 'hessian' on input None; have \[\('shapes'"):
        r.check("hessian")


def test_check_results_as_dicts_carry_every_figure():
    c = CheckResult("vjp", "x", True, 1e-15, 1e-13, 0.01, note="n")
    assert c.to_dict() == {"check": "vjp", "input": "x", "passed": True, "observed": 1e-15,
                           "tolerance": 1e-13, "ratio": 0.01, "worst": [], "note": "n"}


def test_a_result_whose_comparisons_were_all_skipped_says_not_checked():
    checks = [CheckResult("shapes", None, True, 0.0, 0.0, 0.0),
              CheckResult("vjp", "x", None, note="skipped: its scale overflows")]
    r = GradcheckResult(checks, "complex", [], {}, {"rtol": 1e-13})
    assert r.report().splitlines()[0].startswith(
        "gradcheck: NOT CHECKED (every comparison was skipped; see the notes)   method: complex")


# ------------------------------------------------------------------------------------------------
# the oracle's own configurations
# ------------------------------------------------------------------------------------------------
def test_check_oracle_passes_every_option_to_the_op(monkeypatch):
    seen = []
    real = rmsref.rms_norm_forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("partial"))
        return real(*args, **kwargs)

    monkeypatch.setattr(rmsref, "rms_norm_forward", spy)
    assert check_oracle("rms_norm", (2, 8), partial=0.5, second_order=False)
    assert seen and set(seen) == {0.5}


def test_the_oracle_configurations_cover_each_op_with_and_without_its_parameters():
    cfgs = oracle_configs()
    for op in ("rms_norm", "layer_norm", "unit_norm"):
        mine = [c for c in cfgs if c["op"] == op]
        assert any(c.get("bias") for c in mine), op
        assert any(not c.get("bias") for c in mine), op
    assert any(c["op"] == "rms_norm" and c.get("weight") is False for c in cfgs)
    assert any(c["op"] == "layer_norm" and c.get("weight") is False for c in cfgs)


# ------------------------------------------------------------------------------------------------
# third sample: defaults, the record of a run, finite-difference error estimates, small weights
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("op", "default"), [("layer_norm", 1e-5), ("unit_norm", 0.0)])
def test_oracle_problems_default_to_their_ops_eps(op, default):
    p = oracle_problem(op, (3, 4))
    x, w, b = p.inputs
    fwd = rmsref.layer_norm_forward if op == "layer_norm" else rmsref.unit_norm_forward
    want = (fwd(x, (4,), w, b, default) if op == "layer_norm" else
            fwd(x, (4,), w, default, bias=b))[0]
    np.testing.assert_array_equal(p.forward(*p.inputs), want)


def test_a_run_records_its_settings_and_says_passed():
    r = oracle_problem("rms_norm", (2, 4)).check(second_order=False, seed=7, n_directions=3)
    assert r.report().startswith("gradcheck: PASSED   method: complex")
    assert r.settings == {"rtol": r.settings["rtol"], "atol": 0.0, "seed": 7, "n_directions": 3,
                          "requested_method": "complex", "full": False}
    d = r.to_dict()
    assert d["settings"] == r.settings and d["passed"] is True
    assert set(d) == {"passed", "method", "notes", "evaluations", "settings", "checks"}


@pytest.mark.parametrize("method", ["central", "richardson"])
def test_the_full_jacobian_by_finite_differences_finds_a_wrong_column(method):
    """Each finite-difference column carries its error estimate into the entry tolerances; a
    lost estimate (NaN) would make every comparison pass."""
    from tests.test_gradcheck import _problem_with_bug

    r = gradcheck(*_problem_with_bug("column_127", (2, 256)), full=True, method=method,
                  second_order=False, names=("x", "weight", "bias"))
    c = r.check("jacobian", "x")
    assert c.passed is False and c.worst and c.worst[0].input_index[1] == 127


def test_a_wrong_weight_gradient_is_caught_when_the_outputs_are_tiny():
    """The cancellation floor is relative: an op whose outputs are near 1e-8 (RMSNorm times
    1e-8) has derivatives near 1e-8, and a dweight off by 1e-6 (relative) is still caught."""
    p = oracle_problem("rms_norm", (2, 8))

    def forward(x, w, b):
        return 1e-8 * p.forward(x, w, b)

    def backward(dy, x, w, b, bug=0.0):
        dx, dw, db = p.backward(1e-8 * dy, x, w, b)
        return dx, dw * (1 + bug), db

    def wrong(dy, x, w, b):
        return backward(dy, x, w, b, bug=1e-6)

    ok = gradcheck(forward, backward, p.inputs, names=p.names, second_order=False)
    assert ok, ok.report()
    bad = gradcheck(forward, wrong, p.inputs, names=p.names, second_order=False)
    assert bad.check("vjp", "weight").passed is False, bad.report()
