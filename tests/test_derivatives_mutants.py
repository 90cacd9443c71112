"""Tests written from the mutation survivors of rmsref/derivatives.py: each one pins a behaviour
of the gradient checker a user can observe (a verdict, a number in the report, the path taken)."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref.derivatives import FD_SAFETY, CheckResult, GradcheckResult, WorstEntry, _localize

# ------------------------------------------------------------------------------------------------
# GradcheckResult.report: the table a user reads
# ------------------------------------------------------------------------------------------------
# Every figure below has at most three significant digits, so the report's rounding (2 decimals
# of observed and tolerance, 3 significant digits of the ratio) prints it exactly and the text
# parses back to the same float.
VJP_WORST = WorstEntry((0, 3), None, analytic=1.0, numerical=1.5, error=0.5, tolerance=0.25)
JAC_WORST = WorstEntry((1,), (0, 2), analytic=2.0, numerical=2.5, error=0.5, tolerance=0.125)
CHECKS = [
    CheckResult("shapes", None, True),
    CheckResult("vjp", "x", False, 2.5e-09, 1.25e-13, 20000.0, worst=[VJP_WORST],
                note="worst entries below"),
    CheckResult("second_order", "weight", None, note="skipped: the backward is real only"),
    CheckResult("jvp", "x", True, 1e-15, 1.25e-13, 0.008, note="a passing check's note"),
    CheckResult("double_backward", None, None, note="skipped: no double backward"),
    CheckResult("jacobian", None, False, 3e-12, 1e-13, 30.0, worst=[JAC_WORST]),
]


def _report(checks=CHECKS, settings=None, evaluations=None) -> list[str]:
    r = GradcheckResult(list(checks), "central", ["first note", "second note"],
                        {"forward": 3, "forward_complex": 0, "backward": 2}
                        if evaluations is None else evaluations,
                        {"rtol": 1.25e-13} if settings is None else settings)
    return r.report().split("\n")


def test_the_report_head_counts_the_failures_among_the_checks_that_ran():
    """Four checks ran (the two skipped ones did not), two of them failed."""
    lines = _report()
    assert lines[0] == "gradcheck: FAILED (2 of 4)   method: central   rtol: 1.25e-13"
    assert lines[1:3] == ["  note: first note", "  note: second note"]


def test_a_report_without_an_rtol_setting_says_rtol_0():
    """A result built by hand, without settings, still reports (rtol 0: none was recorded)."""
    assert _report(settings={})[0].endswith("   rtol: 0")


def _header_and_rows(lines):
    header = lines[3]
    rows = {line.split()[0]: line for line in lines[4:] if line.startswith("  ") and
            not line.startswith("   ")}
    return header, rows


def test_the_report_columns_stand_under_their_headings():
    """The header names the six columns; each check's name and input start where their
    headings start, each figure ends where its heading ends, and the status starts under
    'status'. The figures read back as the check's own values."""
    lines = _report()
    header, rows = _header_and_rows(lines)
    assert header.split() == ["check", "input", "observed", "tolerance", "ratio", "status"]
    assert header.startswith("  check")
    end = {h: header.index(h) + len(h) for h in ("observed", "tolerance", "ratio")}
    for c in CHECKS:
        row = rows[c.name]
        assert row.index(c.name) == header.index("check")
        assert row.index(c.input or "-", len("  " + c.name)) == header.index("input")
        status_at = header.index("status")
        if c.passed is None:
            assert row[len("  " + c.name):status_at].strip() == (c.input or "-")
            # "skipped" once: before the reason, or as the reason's own first word
            assert row[status_at:] == (c.note if c.note.startswith("skipped: ")
                                       else f"skipped: {c.note}")
            continue
        assert row[status_at:] == ("ok" if c.passed else "FAIL")
        for h, value in (("observed", c.observed), ("tolerance", c.tolerance),
                         ("ratio", c.ratio)):
            field = row[:end[h]].split()[-1]
            assert row[end[h]] == " " and float(field) == value, (h, row)


def test_a_failing_check_is_followed_by_its_note_and_worst_entries_a_passing_one_is_not():
    lines = _report()
    i = lines.index(_header_and_rows(lines)[1]["vjp"])
    assert lines[i + 1] == "      worst entries below"
    assert lines[i + 2] == "      " + VJP_WORST.describe("x")
    assert lines[i + 2].startswith("      x[0, 3]: analytic 1.000000000e+00")
    assert lines[i + 3].split()[0] == "second_order"
    assert not any("a passing check's note" in line for line in lines)
    # a check on no particular input names its entries 'input'
    j = lines.index(_header_and_rows(lines)[1]["jacobian"])
    assert lines[j + 1] == "      " + JAC_WORST.describe("input")
    assert lines[j + 1].startswith("      d out[0, 2] / d input[1]: ")


def test_the_report_ends_with_the_calls_made_leaving_out_those_never_made():
    lines = _report()
    assert lines[-1] == "  evaluations: forward 3, backward 2"
    checks = [line for line in lines if line.split() and line.split()[0] in
              {c.name for c in CHECKS}]
    assert len(checks) == len(CHECKS)  # a skipped check in the middle does not end the table
    assert len(lines) == 1 + 2 + 1 + len(CHECKS) + 2 + 1 + 1


# ------------------------------------------------------------------------------------------------
# _localize: the bisection that names the wrong entries of a gradient
# ------------------------------------------------------------------------------------------------
# The function differentiated is linear, y = J x, so that (Jᵀu)_j is known exactly; g is that
# gradient with planted errors delta. jv_of(v) plays the numerical JVP: J·v along the direction
# actually taken, v_eff = taken·v (a finite difference takes a rounded step), and, when fd is
# given, an error estimate fd·|J|·|v_eff| per output.


def _linear(J, taken=1.0, fd=None):
    calls = []

    def jv_of(v):
        calls.append(v)
        v_eff = taken * v
        err = None if fd is None else [fd * (np.abs(J) @ np.abs(v_eff))]
        return [J @ v_eff], v_eff, err

    return jv_of, calls


def _no_floor(v):
    return 0.0


class _Ones:
    """A stand-in for the Generator whose Gaussian weights are all 1: a block's discrepancy is
    then the plain sum of its entries' errors."""

    def standard_normal(self, size=None):
        return 1.0 if size is None else np.ones(size)


def _planted(J, u, delta):
    """(Jᵀu, the gradient with the errors delta = {index: error})."""
    exact = J.T @ u
    g = exact.copy()
    for j, e in delta.items():
        g[j] += e
    return exact, g


RNG = np.random.default_rng(5)
J8 = RNG.standard_normal((3, 8))
U3 = RNG.standard_normal(3)


def test_a_found_entry_carries_the_exact_entry_its_error_and_the_tolerance_of_one_unit_step():
    """One wrong entry of eight: found in 2·log2(8) + 1 evaluations, each counted. Its figures
    are per unit of x_j, whatever step the numerical JVP took (here half the one asked for):
    numerical (Jᵀu)_j, error |g_j - (Jᵀu)_j|, tolerance rtol·Σ_i |u_i J_ij|."""
    rtol = 1e-12
    exact, g = _planted(J8, U3, {5: 1e-6})
    jv_of, calls = _linear(J8, taken=0.5)
    found, spent = _localize(jv_of, [U3], g, (8,), np.random.default_rng(0), rtol, 0.0,
                             budget=64, max_worst=5, floor_of=_no_floor)
    assert spent == len(calls) == 2 * 3 + 1
    [w] = found
    assert w.input_index == (5,) and w.output_index is None
    assert w.analytic == g[5]
    assert w.numerical == pytest.approx(exact[5], rel=1e-14)
    assert w.error == pytest.approx(1e-6, rel=1e-8)
    assert w.tolerance == pytest.approx(rtol * np.sum(np.abs(U3 * J8[:, 5])), rel=1e-14)


def test_a_found_entry_s_tolerance_adds_atol_and_the_finite_difference_error():
    """atol is absolute per entry (a unit step), and a finite-difference JVP's error estimate
    err enters as FD_SAFETY·Σ_i |u_i err_i|."""
    rtol, atol, fd = 1e-12, 1e-9, 1e-10
    exact, g = _planted(J8, U3, {2: 1e-3})
    jv_of, _ = _linear(J8, fd=fd)
    [w], _ = _localize(jv_of, [U3], g, (8,), np.random.default_rng(0), rtol, atol, 64, 5,
                       _no_floor)
    col = np.sum(np.abs(U3 * J8[:, 2]))
    assert w.input_index == (2,)
    assert w.tolerance == pytest.approx((rtol + FD_SAFETY * fd) * col + atol, rel=1e-12)


def test_an_error_within_the_finite_difference_estimate_is_not_chased():
    """An entry wrong by less than the finite difference's own error: neither half of the input
    fails, so nothing is bisected (two evaluations) and nothing reported."""
    fd = 1e-6
    _, g = _planted(J8, U3, {2: 1e-8})
    jv_of, _ = _linear(J8, fd=fd)
    found, spent = _localize(jv_of, [U3], g, (8,), np.random.default_rng(0), 1e-13, 0.0, 64, 5,
                             _no_floor)
    assert found == [] and spent == 2


@pytest.mark.parametrize("n", [1, 8])
def test_the_cancellation_floor_widens_every_tolerance_of_the_search(n):
    """floor_of(v) is added to the scale of each comparison (the single index included, n = 1):
    an error below rtol·floor is not reported, and not chased."""
    J = J8[:, :n]
    _, g = _planted(J, U3, {0: 1e-9})
    jv_of, _ = _linear(J)
    args = ([U3], g, (n,), np.random.default_rng(0), 1e-13, 0.0, 64, 5)
    found, spent = _localize(jv_of, *args, floor_of=lambda v: 1e5)
    assert found == [] and spent == min(n, 2)
    found, _ = _localize(jv_of, *args, floor_of=_no_floor)
    assert [w.input_index for w in found] == [(0,)]


def test_a_backward_that_returned_none_has_analytic_entries_zero():
    exact = J8.T @ U3
    jv_of, _ = _linear(J8)
    found, _ = _localize(jv_of, [U3], None, (8,), np.random.default_rng(0), 1e-13, 0.0, 64, 8,
                         _no_floor)
    assert len(found) == 8
    for w in found:
        (j,) = w.input_index
        assert w.analytic == 0.0
        assert w.numerical == pytest.approx(exact[j], rel=1e-14)
        assert w.error == pytest.approx(abs(exact[j]), rel=1e-14)


# With rtol = 0 and atol = 1 every comparison's tolerance is 1; with J = I, u = 1 and weights 1
# every discrepancy is an exact small integer: the sum of the planted errors in the block.
EYE8, ONES8 = np.eye(8), np.ones(8)


def _search(delta, *, budget=64, max_worst=5, rng=None):
    _, g = _planted(EYE8, ONES8, delta)
    jv_of, calls = _linear(EYE8)
    found, spent = _localize(jv_of, [ONES8], g, (8,), _Ones() if rng is None else rng, 0.0,
                             1.0, budget, max_worst, _no_floor)
    assert spent == len(calls)
    return [w.input_index[0] for w in found], [w.ratio for w in found], spent


def test_the_worst_block_is_split_first_and_the_entries_come_worst_first():
    """Errors 10 at x[1], 4 at x[6], 2 at x[3]: with room for two entries, the two worst are
    reported, worst first."""
    idx, ratios, _ = _search({1: 10.0, 6: 4.0, 3: 2.0}, max_worst=2)
    assert idx == [1, 6] and ratios == [10.0, 4.0]
    assert _search({1: 10.0, 6: 4.0, 3: 2.0})[0] == [1, 6, 3]


def test_a_block_or_an_entry_at_exactly_its_tolerance_passes():
    """ratio <= 1 passes: a lone error of exactly the tolerance is neither chased nor reported;
    one of 1.5 times it is found (and one of 2.5, beyond a doubled threshold)."""
    assert _search({4: 1.0}) == ([], [], 2)
    assert _search({4: 1.5})[:2] == ([4], [1.5])
    assert _search({4: 2.5})[:2] == ([4], [2.5])
    _, g = _planted(EYE8[:, :1], ONES8, {0: 1.0})  # one input entry: the single-index test
    found, spent = _localize(_linear(EYE8[:, :1])[0], [ONES8], g, (1,), _Ones(), 0.0, 1.0, 64,
                             5, _no_floor)
    assert found == [] and spent == 1


@pytest.mark.parametrize("budget", range(1, 12))
def test_the_search_spends_at_most_its_budget(budget):
    """One wrong entry of 8 takes 7 evaluations; a smaller budget stops the search early, never
    beyond the budget (a block costs two, a single index one)."""
    idx, _, spent = _search({6: 3.0}, budget=budget)
    assert spent <= budget
    assert idx == ([6] if budget >= 7 else [])
    assert spent == min(budget - budget % 2, 6) + (budget >= 7)


def test_errors_that_cancel_in_a_sum_are_found():
    """+100 at x[2] and -100 at x[3]: equal weights would see no error in any block holding
    both; the Gaussian weights of the real search do."""
    idx, _, _ = _search({2: 100.0, 3: -100.0}, rng=np.random.default_rng(0))
    assert sorted(idx) == [2, 3]
