"""The validator's report, verdicts and order check, on inputs built to show each decision.

Reports are built from hand-made case results (what each line and cell must then say follows
from the cases), or come from ``validate`` on float32 / bfloat16 with the float64 oracle as the
implementation, broken on purpose in one way (a wrong shape, a raised error, a second rounding).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import rmsref
from rmsref import conventions as conv_mod
from rmsref import diagnosis
from rmsref._declared import Declared
from rmsref._shapes import bfloat16
from rmsref.diagnosis import format_ratio
from rmsref.validation import (
    CaseResult,
    ValidationReport,
    _Diagnoser,
    _order_diagnosis,
    _Run,
    validate,
)


def fwd(x, shape, weight=None, eps=None):
    return rmsref.rms_norm(x, shape, weight, eps)


def bwd(dy, x, shape, weight=None, eps=None):
    g = rmsref.rms_norm_backward(dy, x, shape, weight, eps)
    return g.dx, g.dweight


def small(forward=fwd, backward=bwd, probes=("gaussian",), dtypes=("float32",), **kw):
    """validate on a few small cases (4 x 64 Gaussian rows), no repeat check unless asked."""
    kw.setdefault("repeat", False)
    return validate(forward, backward, probes=list(probes), dtypes=list(dtypes),
                    shapes=[(4, 64)], **kw)


def by(report, probe, quantity):
    [c] = [c for c in report.cases if c.probe == probe and c.quantity == quantity]
    return c


# ---- ValidationReport.lines -----------------------------------------------------------------


def _case(quantity="y", passed=True, probe="gaussian", **kw):
    return CaseResult(probe, "float32", quantity, (4, 64), passed, **kw)


def _nondet():
    ev = diagnosis.Evidence(cases=["repeat/float32"], ratio_before=0.0)
    return diagnosis.make("nondeterministic", ev, what="dx")


def test_lines_head_counts_checks_and_failures_and_says_pass_or_fail():
    passing = ValidationReport("torch", ("float32",), [_case(), _case("dx")], [], name="mine")
    assert passing.lines() == ["mine: PASS against convention 'torch' (2 checks, 0 failed)"]
    failing = ValidationReport("llama", ("float32",), [_case(), _case("dx", False, ratio=3.5)],
                               [], name="mine", notes=["first note", "second note"])
    lines = failing.lines()
    assert lines[0] == "mine: FAIL against convention 'llama' (2 checks, 1 failed)"
    assert lines[1:3] == ["  note: first note", "  note: second note"]


def test_lines_name_each_failure_with_its_figures_and_message_then_the_diagnoses():
    bad = _case("dx", False, ratio=3.5, max_abs=0.25, max_ulp=7.0, worst=(2, 5))
    raised = _case("y", False, probe="tiny", ratio=math.inf, message="forward f raised E")
    warn = _case("y", False, probe="overflow", ratio=9.0, advisory=True)
    na = _case("y", False, probe="multidim", not_applicable="last dim only")
    d = _nondet()
    rep = ValidationReport("torch", ("float32",), [_case(), bad, raised, warn, na], [d])
    lines = rep.lines()
    assert lines[0] == "implementation: FAIL against convention 'torch' (5 checks, 2 failed)"
    # the advisory warning and the n/a case are not failures: two FAIL lines, in case order
    assert lines[1] == "  FAIL gaussian/float32 dx: ratio 3.5, max abs 0.25, max ulp 7 at (2, 5)"
    assert lines[2] == "  FAIL tiny/float32 y: ratio inf, max abs 0, max ulp 0 at None — " \
                       "forward f raised E"
    assert lines[3:] == [d.line()]


def test_lines_show_at_most_twelve_failures():
    cases = [_case("y", False, probe=f"p{i}", ratio=2.0 + i) for i in range(13)]
    lines = ValidationReport("torch", ("float32",), cases, []).lines()
    fails = [ln for ln in lines if ln.startswith("  FAIL ")]
    assert [ln.split()[1] for ln in fails] == [f"p{i}/float32" for i in range(12)]
    assert lines[0].endswith("(13 checks, 13 failed)")


# ---- ValidationReport.table -----------------------------------------------------------------

HEADERS = ["probe", "dtype", "y", "dx", "dweight", "ulp(y)", "worst (q,row,col)", "status"]


def _cells(table: str) -> tuple[list[str], list[dict[str, str]], list[str]]:
    """The table's title, rows as {header: cell} (cells cut at the header's columns: probe and
    dtype left-aligned, the figures right-aligned under their header), and the lines below."""
    lines = table.splitlines()
    title, hdr, rule = lines[:3]
    assert rule == "-" * len(hdr)
    end = lines.index(rule, 3)
    assert hdr.split() == ["probe", "dtype", "y", "dx", "dweight", "ulp(y)", "worst",
                           "(q,row,col)", "status"]
    cols = {}
    starts = {"probe": 0, "dtype": hdr.index("dtype"), "worst (q,row,col)": hdr.index("worst"),
              "status": hdr.index("status")}
    for h in ("y", "dx", "dweight", "ulp(y)"):
        stop = hdr.index(f" {h} ") + len(h) + 1 if h != "ulp(y)" else hdr.index(h) + len(h)
        cols[h] = (stop - 9, stop)
    cols["probe"] = (0, starts["dtype"])
    cols["dtype"] = (starts["dtype"], starts["dtype"] + 9)
    cols["worst (q,row,col)"] = (starts["worst (q,row,col)"], starts["status"])
    rows = []
    for ln in lines[3:end]:
        row = {h: ln[a:b].strip() for h, (a, b) in cols.items()}
        row["status"] = ln[starts["status"]:]
        assert ln[cols["y"][0]:cols["ulp(y)"][1]].split() == [row[h] for h in
                                                             ("y", "dx", "dweight", "ulp(y)")]
        rows.append(row)
    return [title, hdr], rows, lines[end + 1:]


def test_table_title_header_and_rules():
    rep = ValidationReport("gemma", ("float32",), [_case()], [], name="mine")
    lines = rep.table().splitlines()
    assert lines[0] == ("rmsref validate: mine as 'gemma' (ratio = max |error| / bound; "
                        "pass when <= 1)")
    [_, hdr], rows, tail = _cells(rep.table())
    assert [h for h in HEADERS if h in hdr] == HEADERS
    assert tail == ["PASS: 1 checks, 0 failed, 0 advisory warnings"]


def test_table_cells_figures_dashes_and_err():
    y = _case("y", True, ratio=0.5, max_ulp=0.75, worst=(1, 2))
    dx = _case("dx", False, ratio=3.0, worst=(4, 5))                  # worse: not ok
    dw = _case("dweight", False, ratio=0.0, message="backward returned no dweight")
    na_y = _case("y", False, probe="multidim", not_applicable="last dim only")
    raised = _case("y", False, probe="tiny", ratio=math.inf,
                   message="forward f raised ValueError: no")
    odd = _case("y", False, probe="huge", ratio=2.0, message="y has dtype float64")
    _, rows, _ = _cells(ValidationReport("torch", ("float32",), [y, dx, dw, na_y, raised, odd],
                                         []).table())
    g, m, t, h = rows
    assert (g["probe"], g["dtype"]) == ("gaussian", "float32")
    assert (g["y"], g["dx"], g["dweight"], g["ulp(y)"]) == (
        format_ratio(0.5), format_ratio(3.0), "ERR", format_ratio(0.75))
    assert g["worst (q,row,col)"] == "dx,4,5"        # the failing quantity, row 4, column 5
    assert g["status"] == "FAIL"
    # n/a: no figures, the reason as the status
    assert (m["y"], m["dx"], m["ulp(y)"]) == ("-", "-", "-")
    assert m["status"] == "n/a (last dim only)"
    assert m["worst (q,row,col)"] == ""
    # a raised error: its ratio inf, and the error text in the status
    assert t["y"] == "inf" and t["status"] == "FAIL — forward f raised ValueError: no"
    # a message without " raised " keeps the figure and a plain FAIL
    assert h["y"] == format_ratio(2.0) and h["status"] == "FAIL"


def test_table_worst_prefers_a_failing_quantity_over_a_larger_passing_ratio():
    # an advisory failure is ok; a failure with the smaller ratio still names the worst cell
    y = _case("y", False, ratio=50.0, worst=(0, 1), advisory=True)
    dx = _case("dx", False, ratio=2.0, worst=(3, 7))
    _, [row], _ = _cells(ValidationReport("torch", ("float32",), [y, dx], []).table())
    assert row["worst (q,row,col)"] == "dx,3,7"


def test_table_status_ok_warn_and_the_summary_counts():
    ok = [_case("y", True, probe="gaussian"), _case("dx", True, probe="gaussian")]
    warn = [_case("y", False, probe="overflow", ratio=5.0, advisory=True),
            _case("dx", True, probe="overflow")]
    na = [_case("y", False, probe="multidim", not_applicable="last dim only")]
    fail = [_case("y", False, probe="tiny", ratio=2.0)]
    rep = ValidationReport("torch", ("float32",), ok + warn + na + fail, [_nondet()],
                           notes=["a note"])
    _, rows, tail = _cells(rep.table())
    assert [r["status"] for r in rows] == ["ok", "WARN", "n/a (last dim only)", "FAIL"]
    assert tail[0] == "FAIL: 6 checks, 1 failed, 1 advisory warnings, 1 not applicable"
    assert tail[1] == "note: a note"
    assert tail[2:] == _nondet().line().splitlines()
    # n/a cases count apart; a passing report with none says nothing of them
    only_ok = ValidationReport("torch", ("float32",), ok + warn, [])
    assert only_ok.table().splitlines()[-1] == "PASS: 4 checks, 0 failed, 1 advisory warnings"
    assert ValidationReport("torch", ("float32",), ok + na, []).table().splitlines()[-1] == \
        "PASS: 3 checks, 0 failed, 0 advisory warnings, 1 not applicable"


def test_table_ulp_column_is_that_of_y_only():
    dx = _case("dx", True, ratio=0.5, max_ulp=3.0)
    _, [row], _ = _cells(ValidationReport("torch", ("float32",), [dx], []).table())
    assert row["ulp(y)"] == "-" and row["y"] == "-" and row["dx"] == format_ratio(0.5)


def test_table_order_and_repeat_rows_carry_their_message():
    order = CaseResult("order", "bfloat16", "order", (32, 768), True,
                       message="bit-exact with 'torch' 99.0%, with 'llama' 60.0%")
    same = CaseResult("repeat", "bfloat16", "repeat", (64, 1024), True)
    differ = CaseResult("repeat", "float16", "repeat", (64, 1024), False,
                        message="two identical calls gave different bits in y")
    raised = CaseResult("repeat", "float32", "repeat", (64, 1024), False,
                        message="forward f raised RuntimeError: no")
    gauss = _case("y", True, ratio=0.5, message="a gaussian note")
    _, rows, _ = _cells(ValidationReport("torch", ("bfloat16",),
                                         [order, same, differ, raised, gauss], []).table())
    assert [r["status"] for r in rows] == [
        "ok (bit-exact with 'torch' 99.0%, with 'llama' 60.0%)",
        "ok (identical bits)",
        "FAIL (two identical calls gave different bits in y)",
        "FAIL — forward f raised RuntimeError: no",      # said once
        "ok",                                             # a probe's message stays out
    ]
    assert [r["y"] for r in rows[:3]] == ["-", "-", "-"]


# ---- compare_case: what each probe case reports ---------------------------------------------


def test_case_results_name_the_quantity_shape_and_a_false_verdict_in_json():
    def raising_fwd(x, shape, weight=None, eps=None):
        raise ValueError("no kernel for this shape")

    def raising_bwd(dy, x, shape, weight=None, eps=None):
        raise ValueError("no backward")

    rep = small(raising_fwd, raising_bwd)
    doc = json.loads(rep.to_json())
    assert [(c["quantity"], c["shape"], c["passed"], c["status"]) for c in doc["cases"]] == [
        ("y", [4, 64], False, "fail"), ("dx", [4, 64], False, "fail")]
    y, dx = by(rep, "gaussian", "y"), by(rep, "gaussian", "dx")
    assert y.message == "forward raising_fwd raised ValueError: no kernel for this shape"
    assert dx.message == "backward raising_bwd raised ValueError: no backward"
    assert y.ratio == math.inf and dx.ratio == math.inf
    assert not rep


def test_a_correct_implementation_fills_each_quantity():
    rep = small()
    assert rep
    assert [(c.quantity, c.shape) for c in rep.cases] == [("y", (4, 64)), ("dx", (4, 64)),
                                                           ("dweight", (64,))]
    _, [row], _ = _cells(rep.table())
    assert "-" not in (row["y"], row["dx"], row["dweight"])


@pytest.mark.parametrize("returned, says", [
    (lambda dx, dw: (dx, dw, None), "returned a tuple of 3 item(s)"),
    (lambda dx, dw: dx, "returned a ndarray of shape (4, 64)"),
    (lambda dx, dw: None, "returned None"),
])
def test_backward_that_does_not_return_the_pair_is_told_what_it_returned(returned, says):
    def odd_bwd(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return returned(dx, dw)

    rep = small(backward=odd_bwd)
    dx = by(rep, "gaussian", "dx")
    assert dx.message == (f"backward odd_bwd {says}; expected the pair (dx, dweight) "
                          "(dweight None when there is no weight)")
    assert dx.ratio == math.inf and dx.status == "fail"
    assert [c.quantity for c in rep.cases] == ["y", "dx"]      # no dweight without the pair


def test_wrong_shapes_and_dtypes_fail_with_what_was_received():
    def fwd_flat(x, shape, weight=None, eps=None):
        return fwd(x, shape, weight, eps).reshape(-1)

    y = by(small(fwd_flat), "gaussian", "y")
    assert (y.message, y.ratio, y.passed) == ("y has shape (256,), expected (4, 64)", math.inf,
                                              False)

    def fwd64(x, shape, weight=None, eps=None):
        return fwd(x, shape, weight, eps).astype(np.float64)

    rep = small(fwd64)
    y = by(rep, "gaussian", "y")
    assert y.message == "y has dtype float64, expected float32 (the input dtype)"
    assert y.passed is False and json.loads(rep.to_json())["cases"][0]["passed"] is False
    assert y.ratio <= 1.0                       # the values are right; the dtype is not

    def bwd_flat(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx.reshape(-1), dw

    dx = by(small(backward=bwd_flat), "gaussian", "dx")
    assert (dx.message, dx.ratio, dx.passed) == ("dx has shape (256,), expected (4, 64)",
                                                 math.inf, False)

    def bwd64(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx.astype(np.float64), dw

    rep = small(backward=bwd64)
    dx = by(rep, "gaussian", "dx")
    assert dx.message == "dx has dtype float64, expected float32"
    assert dx.passed is False and dx.status == "fail" and dx.ratio <= 1.0
    assert json.loads(rep.to_json())["cases"][1]["passed"] is False


def test_missing_dweight_fails_but_a_flat_dweight_of_a_2d_weight_is_accepted():
    def no_dw(dy, x, shape, weight=None, eps=None):
        return bwd(dy, x, shape, weight, eps)[0], None

    rep = small(backward=no_dw)
    dw = by(rep, "gaussian", "dweight")
    assert (dw.message, dw.ratio, dw.status, dw.shape) == (
        "backward returned no dweight", math.inf, "fail", (64,))
    assert json.loads(rep.to_json())["cases"][2]["passed"] is False

    def flat_dw(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx, dw.reshape(-1)

    rep = validate(fwd, flat_dw, probes=["multidim"], dtypes=["float32"], repeat=False)
    dw = by(rep, "multidim", "dweight")
    assert dw.shape == (4, 16) and dw.passed and rep


@pytest.mark.parametrize("dw_shape", [(64, 1), (4,)])
def test_dweight_of_the_wrong_shape_is_diagnosed_as_a_wrong_reduction(dw_shape):
    def bad_dw(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        if dw_shape == (4,):                       # summed over the columns, not the rows
            g = rmsref.rms_norm(x, shape, None, eps).astype(np.float64)
            return dx, np.sum(np.asarray(dy, np.float64) * g, axis=1).astype(dw.dtype)
        return dx, dw.reshape(dw_shape)

    rep = small(backward=bad_dw)
    dw = by(rep, "gaussian", "dweight")
    assert dw.message == f"dweight has shape {dw_shape}, expected (64,)"
    assert dw.ratio == math.inf and not dw.passed and dw.diagnoses == ["dweight_reduction"]
    [d] = [d for d in rep.diagnoses if d.code == "dweight_reduction"]
    assert d.seen_in == ["gaussian/float32"] and d.evidence.ratio_before == math.inf
    assert f"dweight has shape {dw_shape}, the weight (64,): summed over the wrong axes" in d.text


def test_nan_inf_rows_may_hold_anything_but_must_not_leak():
    def zero_bad_rows(x, shape, weight=None, eps=None):
        y = fwd(x, shape, weight, eps)
        y[~np.all(np.isfinite(x), axis=-1)] = 0.0        # the rows holding NaN/Inf
        return y

    rep = validate(zero_bad_rows, None, probes=["nan_inf"], dtypes=["float32"], repeat=False)
    assert rep and by(rep, "nan_inf", "y").message == ""

    def leaking(x, shape, weight=None, eps=None):
        y = fwd(x, shape, weight, eps)
        y[0, 0] = np.nan                                   # row 0 holds no NaN
        return y

    rep = validate(leaking, None, probes=["nan_inf"], dtypes=["float32"], repeat=False)
    y = by(rep, "nan_inf", "y")
    assert y.message == "NaN/Inf leaked out of its row" and y.passed is False and not rep


def test_the_deterministic_form_judges_by_the_larger_bound():
    def coarse(x, shape, weight=None, eps=None):       # y rounded to 12 bits, in float32
        y = fwd(x, shape, weight, eps)
        return (np.round(y.astype(np.float64) * 4096) / 4096).astype(np.float32)

    prob = by(small(coarse, None), "gaussian", "y")
    det = by(small(coarse, None, form="deterministic"), "gaussian", "y")
    assert det.max_abs == prob.max_abs and 0 < det.ratio < prob.ratio


def test_observations_leave_the_nan_inf_rows_out_of_the_diagnosis():
    def n_minus_1(x, shape, weight=None, eps=None):    # mean(x²) over N − 1; zeros where
        n = x.shape[-1]                                 # a row holds NaN/Inf (allowed)
        y = (fwd(x, shape, weight, eps).astype(np.float64) * np.sqrt((n - 1) / n)
             ).astype(x.dtype)
        y[~np.all(np.isfinite(x), axis=-1)] = 0.0
        return y

    rep = validate(n_minus_1, None, probes=["nan_inf"], dtypes=["float32"], repeat=False)
    assert [d.code for d in rep.diagnoses] == ["n_minus_1"]


def test_a_dweight_times_the_weight_is_diagnosed():
    def dw_times_w(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx, (dw * weight).astype(dw.dtype)

    rep = small(backward=dw_times_w)
    assert by(rep, "gaussian", "dweight").diagnoses == ["dweight_times_weight"]
    assert [d.code for d in rep.diagnoses] == ["dweight_times_weight"]


# ---- check_order: the rounding order on half types ------------------------------------------

BF16 = np.dtype(bfloat16)
F32 = np.dtype("float32")
PLAIN = Declared()          # what a bare function declares: nothing


def _order(forward, convention="torch", declared=PLAIN, dname="bfloat16", dt=BF16):
    run = _Run(forward, None, conv_mod.get(convention), 0.0, "probabilistic", 0, declared)
    run.check_order(convention, dname, dt)
    [res] = run.cases
    return res, run.diag


class Recorder:
    """A forward in one convention's rounding order, with its own rstd ``scale`` times the
    correctly rounded one; records the half-precision calls it gets."""

    def __init__(self, order, scale=1.0, eps_none=0.5, float32=True):
        self.order, self.scale, self.eps_none, self.float32 = order, scale, eps_none, float32
        self.calls = []
        self.__name__ = f"{order}_order"

    def rstd(self, x, eps):
        x64 = np.asarray(x, np.float64)
        e = self.eps_none if eps is None else eps
        r = self.scale / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + e)
        return r.astype(np.float32)

    def __call__(self, x, shape, weight=None, eps=None):
        if x.dtype == np.float32:
            if not self.float32:
                raise TypeError("half types only")
            return (x * self.rstd(x, eps)).astype(np.float32)
        self.calls.append((x, shape, weight, eps))
        e = self.eps_none if eps is None else eps
        return conv_mod.emulate(self.order, x, weight, e, rstd=self.rstd(x, eps))


def _rate(y, ye):
    return float(np.mean(np.asarray(y, np.float64) == np.asarray(ye, np.float64)))


def test_order_check_draws_gaussian_rows_in_the_dtype_with_a_small_explicit_eps():
    f = Recorder("torch")
    res, _ = _order(f)
    [(x, shape, w, eps)] = f.calls
    assert x.dtype == BF16 and w.dtype == BF16 and x.shape == (32, 768) and shape == 768
    assert res.shape == (32, 768)
    # the gaussian probe's kind of input: rows of σ = 2, a weight 1 ± 0.3
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert abs(np.std(x64) - 2.0) < 0.05 and abs(np.mean(x64)) < 0.05
    assert abs(np.mean(w64) - 1.0) < 0.05 and abs(np.std(w64) - 0.3) < 0.05
    # an explicit eps, negligible against mean(x²) ≈ 4: the check is about rounding, not eps
    assert eps is not None and 0 < eps < 1e-3

    g = Recorder("torch")
    _order(g, declared=Declared(has_weight=False, takes_eps=False))
    [(x, shape, w, eps)] = g.calls
    assert w is None and eps is None


def test_order_check_is_reproducible_from_the_seed():
    f, g = Recorder("torch"), Recorder("torch")
    _order(f), _order(g)
    assert np.array_equal(f.calls[0][0].view(np.uint16), g.calls[0][0].view(np.uint16))


def test_the_expected_order_passes_with_the_rates_in_the_message():
    f = Recorder("torch", scale=1.0 + 2.0**-9)           # its own, slightly off rstd
    res, diag = _order(f)
    x, _, w, eps = f.calls[0]
    r = f.rstd(x, eps)
    alt = _rate(f(x, 768, w, eps), conv_mod.emulate("llama", x, w, eps, rstd=r))
    assert res.passed and res.ratio == 0.0 and res.max_rel == 0.0
    assert res.message == f"bit-exact with 'torch' 100.0%, with 'llama' {alt:.1%}"
    assert 0.5 < alt < 0.95 and not diag.direct


def test_the_rival_order_fails_with_the_ratio_of_mismatches_and_a_diagnosis():
    f = Recorder("llama", scale=1.0 + 2.0**-9)
    res, diag = _order(f)
    x, _, w, eps = f.calls[0]
    r = f.rstd(x, eps)
    own = _rate(f(x, 768, w, eps), conv_mod.emulate("torch", x, w, eps, rstd=r))
    assert not res.passed
    assert res.message == f"bit-exact with 'torch' {own:.1%}, with 'llama' 100.0%"
    assert res.max_rel == 1.0 - own
    assert res.ratio > 1e9                     # the rival reproduces every element
    [d] = diag.direct
    assert d.code == "double_rounding" and d.evidence.cases == ["order/bfloat16"]
    assert res.diagnoses == ["double_rounding"]


def test_mostly_the_rival_order_fails_with_the_ratio_of_the_two_mismatch_rates():
    class Mixed(Recorder):                             # 3 rows in 4 in the rival's order
        def __call__(self, x, shape, weight=None, eps=None):
            y = super().__call__(x, shape, weight, eps)
            if x.dtype == np.float32:
                return y
            e = self.eps_none if eps is None else eps
            y_own = conv_mod.emulate("torch", x, weight, e, rstd=self.rstd(x, eps))
            y[::4] = y_own[::4]
            return y

    f = Mixed("llama")
    res, _ = _order(f)
    x, _, w, eps = f.calls[0]
    y, r = f(x, 768, w, eps), f.rstd(x, eps)
    own = _rate(y, conv_mod.emulate("torch", x, w, eps, rstd=r))
    alt = _rate(y, conv_mod.emulate("llama", x, w, eps, rstd=r))
    assert 0.5 < own < alt < 1.0 and not res.passed
    assert res.ratio == pytest.approx((1.0 - own) / (1.0 - alt), rel=1e-12)
    assert res.max_rel == pytest.approx(1.0 - own, rel=1e-12)


class Blend(Recorder):
    """Rows in the rival's order where ``rival_rows``, the expected order where ``own_rows``,
    elsewhere the expected order but with every element where the two orders differ set to a
    value of neither (the next representable number above both)."""

    def __init__(self, expected, rival, rival_rows=slice(0, 0), own_rows=slice(0, 0)):
        super().__init__(expected)
        self.rival, self.rival_rows, self.own_rows = rival, rival_rows, own_rows

    def __call__(self, x, shape, weight=None, eps=None):
        y = super().__call__(x, shape, weight, eps)
        if x.dtype == np.float32:
            return y
        y_alt = conv_mod.emulate(self.rival, x, weight, eps, rstd=self.rstd(x, eps))
        out = y.copy()
        split = y != y_alt
        out[split] = np.maximum(np.nextafter(y, np.inf), np.nextafter(y_alt, np.inf))[split]
        out[self.rival_rows] = y_alt[self.rival_rows]
        out[self.own_rows] = y[self.own_rows]
        return out


def test_a_tie_between_the_orders_goes_to_the_expected_one():
    f = Blend("torch", "llama")                     # matches both exactly where they agree
    res, diag = _order(f)
    own = float(res.message.split()[3].rstrip("%,"))
    assert res.message.endswith(f"with 'llama' {own:.1f}%") and own > 50.0
    assert res.passed and res.ratio == 0.0 and not diag.direct


def test_more_own_than_rival_matches_passes_with_ratio_zero():
    f = Blend("torch", "llama", rival_rows=slice(0, 8), own_rows=slice(8, 32))
    res, _ = _order(f)
    assert 0.5 < 1.0 - res.max_rel < 1.0 and res.passed and res.ratio == 0.0


def test_half_the_elements_in_the_rival_order_and_none_in_the_expected_one_fails():
    def half_rival(x, shape, weight=None, eps=None):
        if x.dtype == np.float32:
            return Recorder("torch")(x, shape, weight, eps)
        y = conv_mod.emulate("llama", x, weight, eps)
        y[16:] = np.nan                                 # matches neither order
        return y

    res, _ = _order(half_rival)
    assert res.message.endswith("with 'llama' 50.0%") and not res.passed


def test_neither_order_fitting_is_left_to_the_other_checks():
    def noisy(x, shape, weight=None, eps=None):
        y = rmsref.rms_norm(x, shape, weight, eps).astype(np.float64)
        return (y * (1 + 0.01 * np.sin(np.arange(y.size)).reshape(y.shape))).astype(x.dtype)

    res, diag = _order(noisy)
    assert res.passed and not diag.direct
    assert float(res.message.split()[-1].rstrip("%")) < 50.0


def test_an_implementation_refusing_float32_is_emulated_with_its_declared_eps():
    # no read-back of its rstd: the emulation's own rstd, with the eps it declares
    f = Recorder("torch", eps_none=0.5, float32=False)
    res, _ = _order(f, declared=Declared(eps_default=0.5, takes_eps=False))
    assert f.calls[0][3] is None and res.passed and res.max_rel == 0.0
    g = Recorder("torch", float32=False)                # eps given: the emulation's too
    res, _ = _order(g)
    assert res.passed and res.max_rel == 0.0
    h = Recorder("llama", eps_none=0.5, float32=False)   # the rival's emulation's too
    res, _ = _order(h, declared=Declared(eps_default=0.5, takes_eps=False))
    assert not res.passed and res.ratio > 1e9
    k = Recorder("llama", float32=False)
    res, _ = _order(k)
    assert not res.passed and res.ratio > 1e9


def test_order_check_reports_a_forward_that_raises_or_returns_nothing():
    def raising(x, shape, weight=None, eps=None):
        raise RuntimeError("bf16 unsupported")

    res, _ = _order(raising)
    assert (res.message, res.ratio, res.passed) == (
        "forward raising raised RuntimeError: bf16 unsupported", math.inf, False)
    assert res.status == "fail"

    def nothing(x, shape, weight=None, eps=None):
        return None

    res, _ = _order(nothing)
    assert (res.message, res.ratio, res.passed) == ("forward nothing returned None", math.inf,
                                                    False)
    report = ValidationReport("torch", ("bfloat16",), [res], [])
    assert json.loads(report.to_json())["cases"][0]["quantity"] == "order"


# ---- _order_diagnosis: which rounding the rival order names ---------------------------------


@pytest.mark.parametrize("expected, rival, code, says, fix", [
    ("torch", "llama", "double_rounding", "(40.0% of elements reproduced bit for bit",
     "round once at the end"),
    ("llama", "torch", "single_rounding", "(matches the 'torch' order on 40.0% of elements, the "
     "expected order on 10.0%)", "or validate against the 'torch' convention"),
    ("gemma", "gemma_wdtype", "offset_rounding", "is rounded to the weight dtype before it "
     "multiplies (R_w(1 + w)) (40.0% of elements", "add the 1 in float32: (1 + w.float())"),
    ("gemma_wdtype", "gemma", "offset_rounding", "is added in float32 where the weight dtype was "
     "expected (40.0% of elements", "round 1 + w to the weight dtype first, or validate against "
     "'gemma'"),
])
def test_order_diagnosis_names_the_rounding_of_the_rival_order(expected, rival, code, says, fix):
    assert conv_mod.get(expected).order_rival == rival
    diag = _Diagnoser()
    res = CaseResult("order", "float16", "order", (32, 768), False, ratio=12.5)
    _order_diagnosis(diag, expected, rival, 0.1, 0.4, "order/float16", res)
    [d] = diag.direct
    assert d.code == code and says in d.text
    # offset_rounding's fix is all the check's; the others' fix is their code's own text
    assert d.fix == fix if code == "offset_rounding" else fix in d.fix
    assert "?" not in d.text + d.fix                 # every field of the text was given
    assert d.evidence.cases == ["order/float16"] and d.evidence.ratio_before == 12.5
    assert res.diagnoses == [code]


# ---- check_repeat: two identical calls, identical bits ---------------------------------------


def _repeat(forward, backward=None, declared=PLAIN, dname="float32", dt=F32):
    run = _Run(forward, backward, conv_mod.get("torch"), 0.0, "probabilistic", 0, declared)
    run.check_repeat(dname, dt)
    [res] = run.cases
    return res, run.diag


class Flaky:
    """Calls ``f``; on every second call nudges by one ulp the outputs named in ``which``
    (0: y or dx, 1: dweight), or raises on the call numbered ``raise_on``."""

    def __init__(self, f, which=(), raise_on=None):
        self.f, self.which, self.raise_on, self.n = f, which, raise_on, 0
        self.seen = []
        self.__name__ = "flaky"

    def __call__(self, *args):
        self.n += 1
        self.seen.append(args)
        if self.n == self.raise_on:
            raise RuntimeError(f"call {self.n} failed")
        out = self.f(*args)
        pair = isinstance(out, tuple)
        outs = list(out) if pair else [out]
        if self.n % 2 == 0:
            for i in self.which:
                o = outs[i].copy()
                o.reshape(-1)[3] = np.nextafter(o.reshape(-1)[3], np.inf)
                outs[i] = o
        return tuple(outs) if pair else outs[0]


def _four_positional(x, shape, weight, eps):          # no defaults: every argument passed
    return fwd(x, shape, weight, eps)


def _bwd_positional(dy, x, shape, weight, eps):
    return bwd(dy, x, shape, weight, eps)


def test_repeat_passes_a_deterministic_implementation_called_with_eps_none():
    f, b = Flaky(_four_positional), Flaky(_bwd_positional)
    res, diag = _repeat(f, b)
    assert res.passed and res.message == "" and not diag.direct
    assert (res.probe, res.quantity, res.shape) == ("repeat", "repeat", (64, 1024))
    assert [a[-1] for a in f.seen] == [None, None] and [a[-1] for a in b.seen] == [None, None]
    # the same inputs twice, in the dtype; dy too
    (x1, n1, w1, _), (x2, _, w2, _) = f.seen
    assert x1 is x2 and w1 is w2 and n1 == 1024 and x1.shape == (64, 1024)
    dy, xb = b.seen[0][:2]
    assert dy.dtype == x1.dtype == w1.dtype == np.float32 and xb is x1
    assert abs(np.std(x1) - 2.0) < 0.05 and abs(np.std(dy) - 1.0) < 0.05
    assert abs(np.mean(w1) - 1.0) < 0.05 and abs(np.std(w1) - 0.3) < 0.05


def test_repeat_inputs_follow_the_seed():
    f, g, other = Flaky(fwd), Flaky(fwd), Flaky(fwd)
    _repeat(f), _repeat(g)
    assert np.array_equal(f.seen[0][0], g.seen[0][0])
    assert np.array_equal(f.seen[0][2], g.seen[0][2])
    run = _Run(other, None, conv_mod.get("torch"), 0.0, "probabilistic", 1, Declared())
    run.check_repeat("float32", np.dtype("float32"))
    assert np.std(f.seen[0][0] - other.seen[0][0]) > 1.0


def test_repeat_without_a_weight_passes_none():
    f = Flaky(fwd)
    _repeat(f, declared=Declared(has_weight=False))
    assert f.seen[0][2] is None


@pytest.mark.parametrize("fwhich, bwhich, bad, what", [
    ((0,), (), "y", "y"),
    ((), (0,), "dx", "dx"),
    ((), (1,), "dweight", "dweight"),
    ((0,), (0, 1), "y, dx, dweight", "y/dx/dweight"),
])
def test_repeat_names_what_differed(fwhich, bwhich, bad, what):
    res, diag = _repeat(Flaky(fwd, fwhich), Flaky(bwd, bwhich))
    assert not res.passed and res.passed is False
    assert res.message == f"two identical calls gave different bits in {bad}"
    [d] = diag.direct
    assert d.code == "nondeterministic" and d.seen_in == ["repeat/float32"]
    assert d.text.startswith(f"non-deterministic {what}: two calls")
    assert res.diagnoses == ["nondeterministic"]


@pytest.mark.parametrize("raise_on", [1, 2])
def test_repeat_reports_a_forward_that_raises_once(raise_on):
    res, diag = _repeat(Flaky(fwd, raise_on=raise_on))
    assert res.passed is False
    assert res.message == f"forward flaky raised RuntimeError: call {raise_on} failed"
    assert not diag.direct


@pytest.mark.parametrize("raise_on", [1, 2])
def test_repeat_leaves_a_raising_backward_to_the_probes(raise_on):
    res, _ = _repeat(Flaky(fwd), Flaky(bwd, raise_on=raise_on))
    assert res.passed and res.message == ""


def test_repeat_accepts_a_backward_returning_dx_alone():
    def dx_only(dy, x, shape, weight=None, eps=None):
        return (bwd(dy, x, shape, weight, eps)[0],)

    res, _ = _repeat(fwd, dx_only)
    assert res.passed


# ---- check_float64_gradient: the backward is the derivative of its own forward --------------


def _gradcheck(forward, backward, declared=PLAIN):
    run = _Run(forward, backward, conv_mod.get("torch"), 0.0, "probabilistic", 0, declared)
    run.check_float64_gradient()
    return run.cases, run.diag


def test_gradcheck_passes_the_oracle_in_float64_with_an_explicit_eps():
    f, b = Flaky(_four_positional), Flaky(_bwd_positional)
    [res], diag = _gradcheck(f, b)
    assert res.passed and res.ratio < 1e-2 and not diag.direct
    assert (res.probe, res.dtype, res.quantity, res.shape) == ("gradcheck", "float64", "dx",
                                                               (4, 64))
    # one explicit eps for every call of both, small against mean(x²) ≈ 4
    assert {a[-1] for a in f.seen + b.seen} == {f.seen[0][-1]}
    assert 0 < f.seen[0][-1] < 1e-3
    x, _, w, _ = f.seen[0]
    assert x.dtype == w.dtype == np.float64 and x.shape == (4, 64) and w.shape == (64,)
    # the gaussian probe's kind of input: rows of σ = 2, a weight 1 ± 0.3
    assert abs(np.std(x) - 2.0) < 0.4 and abs(np.mean(w) - 1.0) < 0.2
    assert 0.15 < np.std(w) < 0.5
    # x ± h·v along a direction v of every element, and w ± h·v_w
    dxs = f.seen[1][0] - f.seen[2][0]
    assert np.all(dxs != 0) and len({round(float(v), 12) for v in dxs.reshape(-1)}) > 200
    assert np.all(f.seen[1][2] != f.seen[2][2])
    assert res.message.startswith("<dy, J v> by central differences ")
    assert ", from the backward " in res.message


def test_gradcheck_without_a_weight_or_an_eps():
    f, b = Flaky(fwd), Flaky(bwd)
    [res], _ = _gradcheck(f, b, Declared(has_weight=False, takes_eps=False))
    assert res.passed
    assert all(a[2] is None and a[3] is None for a in f.seen)
    assert all(a[3] is None and a[4] is None for a in b.seen)


def test_gradcheck_with_a_weight_passes_it_to_every_call():
    f = Flaky(fwd)
    [res], _ = _gradcheck(f, bwd)
    assert res.passed and all(a[2] is not None for a in f.seen)


def test_gradcheck_catches_a_dx_error_whose_rows_sum_to_zero():
    def centred_error(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        t = np.sin(np.arange(dx.size).reshape(dx.shape))
        return dx + 1e-3 * (t - t.mean(axis=-1, keepdims=True)), dw

    [res], diag = _gradcheck(fwd, centred_error)
    assert not res.passed and res.ratio > 1.0
    [d] = diag.direct
    assert d.code == "inconsistent_backward" and d.seen_in == ["gradcheck/float64"]
    assert d.evidence.ratio_before == res.ratio and res.diagnoses == ["inconsistent_backward"]


def test_gradcheck_ratio_is_the_directional_error_over_1e_7_of_the_terms_and_turns_at_one():
    # the check's inputs, read from the calls: x ± h·v, w ± h·v_w, dy = g
    f, b = Flaky(fwd), Flaky(bwd)
    _gradcheck(f, b)
    (x, n, w, eps), (xp, _, wp, _), (xm, _, wm, _) = f.seen
    g = b.seen[0][0]
    h = 1e-6
    v, vw = (xp - xm) / (2 * h), (wp - wm) / (2 * h)
    yp, ym = fwd(xp, n, wp, eps), fwd(xm, n, wm, eps)
    fd = float(np.sum(g * (yp - ym)) / (2 * h))
    scale = float(np.sum(np.abs(g * (yp - ym))) / (2 * h))
    dx, dw = bwd(g, x, n, w, eps)
    a_dx, a_dw = float(np.sum(dx * v)), float(np.sum(dw * vw))

    def scaled(delta):                                # dx off by a relative delta
        def bwd_delta(dy, x, shape, weight=None, eps=None):
            dx, dw = bwd(dy, x, shape, weight, eps)
            return dx * (1 + delta), dw
        return bwd_delta

    for target in (0.9, 1.1, 5.0):
        delta = (fd - a_dx - a_dw + target * 1e-7 * scale) / a_dx
        [res], diag = _gradcheck(fwd, scaled(delta))
        assert res.ratio == pytest.approx(target, rel=1e-3)
        assert res.passed is (target <= 1.0) and bool(diag.direct) is (target > 1.0)


def test_gradcheck_of_a_large_float64_output_is_still_done():
    def big(x, shape, weight=None, eps=None):
        return 1e5 * fwd(x, shape, weight, eps)

    def big_bwd(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(1e5 * np.asarray(dy), x, shape, weight, eps)
        return dx, dw

    [res], _ = _gradcheck(big, big_bwd)
    assert res.passed


def test_gradcheck_skips_float64_in_name_only():
    def via_float32(x, shape, weight=None, eps=None):
        w = None if weight is None else weight.astype(np.float32)
        return fwd(x.astype(np.float32), shape, w, eps).astype(np.float64)

    def bwd32(dy, x, shape, weight=None, eps=None):
        w = None if weight is None else weight.astype(np.float32)
        dx, dw = bwd(dy.astype(np.float32), x.astype(np.float32), shape, w, eps)
        return dx.astype(np.float64), dw.astype(np.float64)

    cases, diag = _gradcheck(via_float32, bwd32)
    assert cases == [] and not diag.direct


def test_gradcheck_is_not_run_without_float64_support():
    def float32_out(x, shape, weight=None, eps=None):
        w = None if weight is None else weight.astype(np.float32)
        return fwd(x.astype(np.float32), shape, w, eps)

    def refuses(dy, x, shape, weight=None, eps=None):
        raise TypeError("float64 not supported")

    cases, diag = _gradcheck(float32_out, refuses)      # backward never called: no failure
    assert cases == [] and not diag.direct


def test_gradcheck_reports_a_backward_that_raises_in_float64():
    def refuses(dy, x, shape, weight=None, eps=None):
        raise TypeError("float64 not supported")

    [res], _ = _gradcheck(fwd, refuses)
    assert (res.passed, res.ratio) == (False, math.inf)
    assert res.message == "backward raised TypeError: float64 not supported in float64"


def test_gradcheck_reports_a_backward_that_returns_nothing_in_float64():
    def nothing(dy, x, shape, weight=None, eps=None):
        return None

    [res], _ = _gradcheck(fwd, nothing)
    assert (res.passed, res.ratio) == (False, math.inf)
    assert res.message == "backward returned None in float64"


def test_gradcheck_reads_the_values_of_a_column_dweight():
    def column_dw(dy, x, shape, weight=None, eps=None):    # (N, 1): the probes flag the shape
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx, dw.reshape(-1, 1)

    [res], _ = _gradcheck(fwd, column_dw)
    assert res.passed and res.ratio < 1e-2


def test_gradcheck_leaves_wrong_shapes_to_the_probes():
    def flat_dx(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx.reshape(-1)[:-1], dw

    [res], diag = _gradcheck(fwd, flat_dx)
    assert res.passed is True and res.status == "pass" and not diag.direct
    assert res.message == "gradcheck skipped: dx or dweight has the wrong shape (reported above)"

    def short_dw(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx, dw[:-1]

    [res], _ = _gradcheck(fwd, short_dw)
    assert res.passed and res.message.startswith("gradcheck skipped")


def test_gradcheck_of_a_constant_forward_needs_a_zero_backward():
    def zeros(x, shape, weight=None, eps=None):
        return np.zeros_like(np.asarray(x, np.float64))

    def nonzero(dy, x, shape, weight=None, eps=None):
        return np.ones_like(x), None

    [res], _ = _gradcheck(zeros, nonzero)
    assert not res.passed and res.ratio > 1e100


# ---- validate's arguments, the declared implementation's notes ------------------------------


class Calls:
    """A correct forward that records the (probe-less) arguments of each call."""

    def __init__(self):
        self.seen = []
        self.__name__ = "calls"

    def __call__(self, x, shape, weight=None, eps=None):
        self.seen.append((x, shape, weight, eps))
        return fwd(x, shape, weight, eps)


def test_validate_defaults_seed_zero_and_names_the_implementation():
    f, g = Calls(), Calls()
    rep = validate(f, None, probes="gaussian", dtypes=["float32"], repeat=False)
    validate(g, None, probes="gaussian", dtypes=["float32"], repeat=False, seed=0)
    assert rep.name == "implementation" and rep.lines()[0].startswith("implementation: PASS")
    assert [c.probe for c in rep.cases] == ["gaussian"]        # one probe given as a string
    assert np.array_equal(f.seen[0][0], g.seen[0][0])
    named = validate(fwd, None, probes="gaussian", dtypes=["float32"], repeat=False, name="mine")
    assert named.name == "mine" and named.table().splitlines()[0].startswith(
        "rmsref validate: mine as 'torch'")


def test_validate_is_reproducible_and_the_seed_changes_every_probe():
    def inputs(seed):
        f = Calls()
        validate(f, None, probes=["gaussian", "offset"], dtypes=["float32"], repeat=False,
                 seed=seed)
        return [a[0] for a in f.seen]

    a, b, c = inputs(3), inputs(3), inputs(4)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    assert not any(np.array_equal(u, v) for u, v in zip(a, c, strict=True))


def test_validate_takes_numpy_dtypes_and_names_them():
    f = Calls()
    rep = validate(f, None, probes=["gaussian"], dtypes=[np.float32, np.dtype(np.float16)],
                   repeat=True, shapes=[(4, 64)])
    assert rep.dtypes == ("float32", "float16")
    assert {c.dtype for c in rep.cases} == {"float32", "float16"}
    # the repeat check's two calls (64 x 1024) get inputs in the dtype asked for
    assert [a[0].dtype.name for a in f.seen if a[0].shape == (64, 1024)] == [
        "float32", "float32", "float16", "float16"]


def test_validate_progress_counts_probe_and_dtype_pairs():
    seen = []
    validate(fwd, None, probes=["gaussian", "offset"], dtypes=["float32", "float16"],
             repeat=False, shapes=[(4, 64)], progress=lambda *a: seen.append(a))
    assert seen == [(1, 4, "gaussian/float32"), (2, 4, "offset/float32"),
                    (3, 4, "gaussian/float16"), (4, 4, "offset/float16")]


def test_validate_passes_the_eps_given_except_where_a_probe_sets_its_own():
    f = Calls()
    validate(f, None, probes=["gaussian", "eps_default", "underflow", "eps_explicit"],
             dtypes=["float32"], repeat=False, eps=2e-3)
    assert [a[3] for a in f.seen] == [2e-3, None, 0.0, 2e-3]
    g = Calls()
    validate(g, None, probes=["gaussian", "eps_explicit"], dtypes=["float32"], repeat=False)
    assert [a[3] for a in g.seen] == [None, 1e-3]


def test_probes_draw_weights_around_one():
    f = Calls()
    validate(f, None, probes=["gaussian"], dtypes=["float32"], repeat=False)
    w = f.seen[0][2].astype(np.float64)
    assert w.shape == (768,) and abs(np.mean(w) - 1.0) < 0.05 and abs(np.std(w) - 0.3) < 0.05


def test_validate_refuses_the_paper_convention_and_unknown_names():
    with pytest.raises(ValueError) as e:
        validate(fwd, convention="paper")
    assert str(e.value) == (
        "validate checks RMSNorm with eps inside the square root; the 'paper' convention "
        "(x / (rms + eps)) is a different function: compare it with "
        "rmsref.conventions.emulate('paper', ...) instead")
    known = ", ".join(rmsref.validation.ALL_PROBES)
    with pytest.raises(ValueError) as e:
        validate(fwd, probes=["gaussian", "nope"])
    assert str(e.value) == f"unknown probe 'nope'; known: {known}"
    with pytest.raises(ValueError) as e:
        rmsref.validation._make_cases("nope", np.dtype("float32"), np.random.default_rng(0),
                                      None, None)
    assert str(e.value) == f"unknown probe 'nope'; known: {known}"
    with pytest.raises(ValueError) as e:
        validate(fwd, dtypes=["float8"])
    names = ", ".join(rmsref._shapes.FLOAT_DTYPES)
    assert str(e.value) == f"dtype 'float8' not supported; use {names}"


def test_the_probe_registry():
    probes = rmsref.validation.PROBES
    assert all(p.name == k and p.what and callable(p.make) for k, p in probes.items())
    assert rmsref.validation.ADVISORY == ("overflow", "underflow")
    assert [k for k, p in probes.items() if p.advisory] == ["overflow", "underflow"]


def _declaring(**fields):
    def f(x, shape, weight=None, eps=None):
        return fwd(x, shape, weight, 1e-6 if eps is None else eps)
    f.rmsref_declared = Declared(**fields)
    return f


def test_notes_say_what_the_implementation_declared():
    rep = validate(_declaring(eps_default=1e-6, normalized_dims="last", param_dtype="bfloat16",
                              has_weight=False, takes_eps=False, offset=1.0),
                   None, probes=["gaussian", "multidim", "eps_explicit"], dtypes=["float32"],
                   repeat=False)
    assert rep.notes == [
        "eps=None probes use the implementation's declared eps 1e-06 (the 'torch' "
        "convention's default is not used)",
        "the implementation normalises the last dimension only",
        "its own parameters are bfloat16; each probe passes its weight in the probe's dtype",
        "the implementation has no weight: the probes' weights are dropped and y = x·rstd "
        "is checked",
        "the implementation takes no eps: probes with an explicit eps do not apply",
        "the implementation uses its weight as 1 + w, the 'torch' convention as 0 + w",
    ]
    assert [(c.probe, c.status) for c in rep.cases] == [
        ("gaussian", "pass"), ("multidim", "n/a"), ("eps_explicit", "n/a")]
    na = by(rep, "eps_explicit", "y")
    assert na.not_applicable == "takes no eps; this probe passes eps=0.001"
    assert (na.quantity, na.shape, na.passed) == ("y", (8, 512), False)
    assert by(rep, "multidim", "y").not_applicable == (
        "normalises the last dimension only; this probe normalises 2 dims")
    assert json.loads(rep.to_json())["cases"][1]["passed"] is False
    plain = validate(_declaring(offset=0.0), None, probes=["gaussian"], dtypes=["float32"],
                     repeat=False)
    assert plain.notes == []


def test_a_declaration_of_the_default_eps_sets_the_reference_eps():
    # the forward's own default is 0.1; declared, the reference uses it and the probe passes
    def big_eps(x, shape, weight=None, eps=None):
        return fwd(x, shape, weight, 0.1 if eps is None else eps)

    assert not validate(big_eps, None, probes=["eps_default"], dtypes=["float32"], repeat=False)
    big_eps.rmsref_declared = Declared(eps_default=0.1)
    assert validate(big_eps, None, probes=["eps_default"], dtypes=["float32"], repeat=False)


# ---- to_json, _Diagnoser --------------------------------------------------------------------


def test_to_json_keeps_numbers_spells_non_finite_ones_and_writes_the_file(tmp_path):
    d = _nondet()
    rep = ValidationReport("torch", ("float32",), [
        _case("y", True, ratio=0.5, worst=(1, 2)), _case("dx", False, ratio=math.inf,
                                                        max_abs=math.nan, message="m")],
        [d], name="mine", notes=["a note"])
    path = tmp_path / "r.json"
    text = rep.to_json(str(path))
    assert path.read_text(encoding="utf-8") == text
    doc = json.loads(text)
    assert (doc["name"], doc["convention"], doc["dtypes"], doc["passed"], doc["notes"]) == (
        "mine", "torch", ["float32"], False, ["a note"])
    y, dx = doc["cases"]
    assert (y["ratio"], y["worst"], y["status"], y["probe"]) == (0.5, [1, 2], "pass", "gaussian")
    assert (dx["ratio"], dx["max_abs"], dx["message"]) == ("inf", "nan", "m")
    assert doc["diagnoses"] == [{"code": "nondeterministic", "text": d.text, "fix": d.fix,
                                 "evidence": {"cases": ["repeat/float32"], "ratio_before": 0.0,
                                              "ratio_after": None, "match_rate": None,
                                              "params": {}}}]


def test_diagnoser_collects_one_diagnosis_per_code_with_every_place():
    diag = _Diagnoser()
    r1 = _case("dx", False, ratio=4.0)
    diag.add("nondeterministic", "repeat/float32", r1, what="y")
    diag.add("nondeterministic", "repeat/float16", None, what="dx")
    diag.add("nondeterministic", "repeat/float32", r1, what="y")
    diag.add("inconsistent_backward", "gradcheck/float64")
    first, second = diag.direct
    assert first.code == "nondeterministic" and first.text.startswith("non-deterministic y:")
    assert first.evidence.cases == ["repeat/float32", "repeat/float16"]
    assert first.evidence.ratio_before == 4.0 and r1.diagnoses == ["nondeterministic"]
    assert second.code == "inconsistent_backward" and second.evidence.ratio_before == 0.0
    assert second.evidence.cases == ["gradcheck/float64"]


def test_diagnoser_merges_a_direct_finding_into_the_fitted_one(monkeypatch):
    def fitted_of(*codes):
        return lambda obs: [diagnosis.make(c, diagnosis.Evidence(cases=["gaussian/bfloat16/y"]))
                            for c in codes]

    def direct():
        diag = _Diagnoser()
        diag.add("double_rounding", "order/bfloat16", match="90%")
        diag.add("nondeterministic", "repeat/bfloat16", what="y")
        diag.add("nondeterministic", "repeat/float16", what="y")
        return diag

    monkeypatch.setattr(diagnosis, "diagnose", fitted_of("double_rounding"))
    out = direct().finish()
    assert [d.code for d in out] == ["double_rounding", "nondeterministic"]
    assert out[0].evidence.cases == ["gaussian/bfloat16/y", "order/bfloat16"]
    assert out[1].evidence.cases == ["repeat/bfloat16", "repeat/float16"]
    # a 16-bit statistic rounds x̂ before w too: the direct double rounding is not a second cause
    monkeypatch.setattr(diagnosis, "diagnose", fitted_of("low_precision_accumulation"))
    out = direct().finish()
    assert [d.code for d in out] == ["low_precision_accumulation", "nondeterministic"]
    monkeypatch.setattr(diagnosis, "diagnose", fitted_of("n_minus_1"))
    assert [d.code for d in direct().finish()] == ["n_minus_1", "double_rounding",
                                                   "nondeterministic"]


# ---- what the messages call the user's objects ------------------------------------------------


def test_messages_name_a_callable_object_by_its_type():
    class Kernel:                                      # no __name__: its type names it
        def __call__(self, x, shape, weight=None, eps=None):
            raise RuntimeError("not compiled")

    y = by(small(Kernel(), None), "gaussian", "y")
    assert y.message == "forward Kernel raised RuntimeError: not compiled"


def test_order_check_counts_nan_as_matching_no_order():
    def nan_out(x, shape, weight=None, eps=None):
        return np.full(x.shape, np.nan, x.dtype)

    res, _ = _order(nan_out)
    assert res.message == "bit-exact with 'torch' 0.0%, with 'llama' 0.0%"
    assert res.max_rel == 1.0 and res.passed         # neither order fits: left to the probes
    assert res.ratio == 0.0


@pytest.mark.parametrize("second", [
    lambda y: y.astype(np.float64),                  # the same values, another dtype
    lambda y: y.reshape(y.shape[1], y.shape[0]),      # the same bytes, another shape
])
def test_repeat_outputs_must_agree_in_dtype_and_shape_too(second):
    class Changing:
        __name__ = "changing"

        def __init__(self):
            self.n = 0

        def __call__(self, x, shape, weight=None, eps=None):
            self.n += 1
            y = fwd(x, shape, weight, eps)
            return second(y) if self.n == 2 else y

    res, _ = _repeat(Changing())
    assert res.message == "two identical calls gave different bits in y" and not res.passed


def test_fitted_diagnoses_name_the_probe_dtype_and_quantity_they_explain():
    def dw_times_w(dy, x, shape, weight=None, eps=None):
        dx, dw = bwd(dy, x, shape, weight, eps)
        return dx, (dw * weight).astype(dw.dtype)

    rep = validate(fwd, dw_times_w, probes=["gaussian", "square"], dtypes=["float32"],
                   shapes=[(4, 64)], repeat=False)
    [d] = rep.diagnoses
    assert d.code == "dweight_times_weight"
    assert d.evidence.cases == ["gaussian/float32/dweight", "square/float32/dweight"]


def test_a_failure_just_over_the_bound_is_still_diagnosed():
    def eps_off(k):                                  # eps·(1 + k) in place of the eps given
        def f(x, shape, weight=None, eps=None):
            return fwd(x, shape, weight, eps * (1 + k))
        return f

    def run(k):
        return validate(eps_off(k), None, probes=["eps_explicit"], dtypes=["float32"],
                        repeat=False)

    r = by(run(1e-3), "eps_explicit", "y").ratio      # the ratio grows linearly with k
    rep = run(1e-3 * 1.5 / r)
    y = by(rep, "eps_explicit", "y")
    assert 1.0 < y.ratio < 2.0 and not rep
    # every failure gets a diagnosis line: a known cause, or no_known_cause naming the case
    assert [d.evidence.cases for d in rep.diagnoses] == [["eps_explicit/float32/y"]]


def test_probe_registration(monkeypatch):
    registry = {}
    monkeypatch.setattr(rmsref.validation, "PROBES", registry)

    def make(p):
        return []

    assert rmsref.validation._probe("mine", "what it looks for")(make) is make
    assert rmsref.validation._probe("adv", "x", advisory=True)(make) is make
    assert registry == {
        "mine": rmsref.validation.Probe("mine", "what it looks for", make, False),
        "adv": rmsref.validation.Probe("adv", "x", make, True)}


def test_a_row_of_passing_and_not_applicable_cases_is_ok():
    rows = [_case("y", False, not_applicable="why"), _case("dx", True)]
    _, [row], _ = _cells(ValidationReport("torch", ("float32",), rows, []).table())
    assert row["status"] == "ok"


def test_diagnoser_marks_every_result_that_shows_a_cause():
    diag = _Diagnoser()
    r1, r2 = _case("y", False, ratio=3.0), _case("y", False, probe="tiny", ratio=5.0)
    diag.add("nondeterministic", "repeat/float32", r1, what="y")
    diag.add("nondeterministic", "repeat/float16", r2, what="y")
    assert r1.diagnoses == r2.diagnoses == ["nondeterministic"]
