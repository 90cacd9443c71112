"""Tests written from the mutation survivors of rmsref/derivatives.py: each one pins a behaviour
of the gradient checker a user can observe (a verdict, a number in the report, the path taken)."""

from __future__ import annotations

from rmsref.derivatives import CheckResult, GradcheckResult, WorstEntry

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
            assert row[status_at:] == f"skipped: {c.note}"
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
