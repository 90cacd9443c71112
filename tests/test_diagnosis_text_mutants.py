"""rmsref.diagnosis, what the user reads: each cause's text and fix as the report prints them
(the fields `_fields` fills in, formatted by `make`), the evidence line, the cases nothing
explains (`tail`, `no_known_cause`) and the merging of one code's cases. The observations are
judged by the convention's rmsref.tolerance model against the float64 oracle
(rmsref.comparison.Reference), as validate records them."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import diagnosis
from rmsref._shapes import bfloat16
from rmsref.comparison import Reference

from .test_diagnosis_mutants import observe

H = diagnosis.Hypothesis
EV = diagnosis.Evidence(cases=["gaussian/float32/y"], ratio_before=12.5, ratio_after=0.75,
                        match_rate=0.998765)


def an_observation(dtype=np.float32, shape=(64,), eps=None, convention="torch", got=None,
                   seed=0, probe="gaussian"):
    """One case of 4 rows, the output all zeros unless ``got`` is given (the text does not
    depend on it)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, *shape)).astype(dtype)
    w = (1 + 0.25 * rng.standard_normal(shape)).astype(dtype)
    return observe(np.zeros_like(x) if got is None else got(x, w), x, shape, w, eps,
                   convention=convention, probe=probe)


def told(h, obs=None, ev=EV):
    """(code, text, fix) of every diagnosis ``h`` stands for, as the report prints them."""
    obs = obs or [an_observation()]
    fields = diagnosis._fields(h, obs, ev)
    return [(c, d.text, d.fix) for c in h.codes() for d in [diagnosis.make(c, ev, **fields)]]


F32_EPS = "1.19209e-07 (finfo(float32).eps)"
USE_DEFAULT = f"use the convention's default eps when eps=None is passed ({F32_EPS})"
STAT_FIX = "compute the sum of squares (and rstd) in float32: x.float().pow(2).mean(-1)"
PROJ_FIX = "c = mean(w·dy·x̂) over the N normalised elements: divide the sum by N"
ROWS_FIX = "sum dy·x̂ over every leading (row) axis, all rows"

TEXTS = [
    (H(eps=1e-6), "eps differs from the one asked for: the output is reproduced with eps = "
     f"1e-06 (HF's rms_norm_eps default) where eps=None was passed; the reference used {F32_EPS}",
     USE_DEFAULT),
    (H(eps=1e-6, eps_scope="all"), "eps differs from the one asked for: the output is reproduced"
     " with eps = 1e-06 (HF's rms_norm_eps default) whatever eps was passed (the eps argument is "
     f"ignored); the reference used {F32_EPS}", "pass the eps argument through to the computation"),
    (H(eps=0.0), "eps differs from the one asked for: the output is reproduced with eps = 0 (eps "
     f"ignored) where eps=None was passed; the reference used {F32_EPS}", USE_DEFAULT),
    (H(eps="finfo(input dtype).eps"), "eps differs from the one asked for: the output is "
     "reproduced with eps = finfo(input dtype).eps where eps=None was passed; the reference used "
     f"{F32_EPS}", USE_DEFAULT),
    (H(eps=3.25e-4), "eps differs from the one asked for: the output is reproduced with eps = "
     f"0.000325 where eps=None was passed; the reference used {F32_EPS}", USE_DEFAULT),
    (H(centre_stat=True), "the statistic is the variance (the mean is removed, numerator left as"
     " x) in place of the mean of squares: this is LayerNorm's statistic, not RMSNorm's",
     "use mean(x²), not x.var(): RMSNorm does not subtract the mean"),
    (H(centre_stat=True, centre_num=True), "the statistic is the variance (the mean is removed "
     "from the numerator too) in place of the mean of squares: this is LayerNorm's statistic, "
     "not RMSNorm's", "use mean(x²), not x.var(): RMSNorm does not subtract the mean"),
    (H(stat_group="last"), "the statistic is taken over the wrong axes (the last dim only, where "
     "normalized_shape (64,) was asked)",
     "reduce over exactly the normalised (trailing) dims: all of (64,)"),
    (H(stat_group="rows"), "the statistic is taken over the wrong axes (the batch axis (over rows)"
     " instead of the features)", "reduce over exactly the normalised (trailing) dims: the "
     "trailing (feature) dims, one statistic per row"),
    (H(precision="native"), "the statistic is computed in the input's 16-bit type (x², the mean, "
     "rstd and x·rstd each rounded to the input dtype): its rounding errors reach the output",
     STAT_FIX),
    (H(precision="native_div"), "the statistic is computed in the input's 16-bit type (x², the "
     "mean, rstd and x·rstd each rounded to the input dtype): its rounding errors reach the "
     "output", STAT_FIX),
    (H(projection=0.81234567), "the path through rstd is scaled by 0.8123 (fitted): dx = "
     "rstd·(w·dy − 0.8123·x̂·c)", PROJ_FIX),
    (H(precision="sequential"), "the statistic is computed in the input's 16-bit type (x² summed "
     "in a 16-bit accumulator): its rounding errors reach the output", STAT_FIX),
    (H(dweight="half_sum"), "dweight's sum over rows is computed in the input's 16-bit type (each"
     " partial sum rounded to the input dtype): its rounding errors reach the output",
     "accumulate dweight over the rows in float32 and round once: (dy.float() * x̂).sum(0)"
     ".to(dtype)"),
    (H(offset=1.0), "the weight is used as 1 + w where w was expected (fitted offset 1)",
     "validate against the 'gemma' convention if your weights are stored as scale − 1; else "
     "multiply by w itself"),
    (H(offset=-1.0), "the weight is used as w − 1 where w was expected (fitted offset -1)",
     "multiply by w itself, not by w − 1"),
    (H(as_float32=True), "float64 input is computed in float32: the errors are float32's (ratio "
     "0.75 to a float32 computation's bound)",
     "compute float64 inputs in float64 (opmath of float64 is float64)"),
    (H(projection=0.0), "dx lacks the path through rstd: dx = rstd·w·dy instead of "
     "rstd·(w·dy − x̂·mean(w·dy·x̂))",
     "subtract the projection x̂·mean(w·dy·x̂) before scaling by rstd"),
    (H(projection="N"), "the path through rstd is scaled by N (a sum where the mean belongs): dx ="
     " rstd·(w·dy − N·x̂·c)", PROJ_FIX),
    (H(projection="N/(N-1)"), "the path through rstd is scaled by N/(N-1) (N − 1 in the "
     "projection's mean): dx = rstd·(w·dy − N/(N-1)·x̂·c)", PROJ_FIX),
    (H(projection="(N-1)/N"), "the path through rstd is scaled by (N-1)/N (a stray factor "
     "(N − 1)/N): dx = rstd·(w·dy − (N-1)/N·x̂·c)", PROJ_FIX),
    (H(projection="1/N"), "the path through rstd is scaled by 1/N (divided by N twice): dx = "
     "rstd·(w·dy − 1/N·x̂·c)", PROJ_FIX),
    (H(projection=2.0), "the path through rstd is scaled by 2 (counted twice): dx = rstd·(w·dy − "
     "2·x̂·c)", PROJ_FIX),
    (H(projection=0.5), "the path through rstd is scaled by 0.5 (halved): dx = rstd·(w·dy − "
     "0.5·x̂·c)", PROJ_FIX),
    (H(projection=-1.0), "the path through rstd is scaled by -1 (added instead of subtracted): dx"
     " = rstd·(w·dy − -1·x̂·c)", PROJ_FIX),
    (H(projection=0.8125), "the path through rstd is scaled by 0.8125 (fitted): dx = rstd·(w·dy −"
     " 0.8125·x̂·c)", PROJ_FIX),
    (H(dweight="prefix:3"), "dweight is not reduced over all rows (only the first 3 rows)",
     ROWS_FIX),
    (H(dweight="suffix:2"), "dweight is not reduced over all rows (only the last 2 rows)",
     ROWS_FIX),
    (H(dweight="features"), "dweight is not reduced over all rows (summed over the features "
     "instead of the rows (it has the right shape only because rows = N))", ROWS_FIX),
    (H(stat_block=32), "the sum of squares skips the columns of the last partial block (a block "
     "of 32 columns)", "include the last, partial block of the row in the sum of squares"),
    (H(offset_rounded=True), "the offset 1 + w is rounded to the weight dtype before it "
     "multiplies: R_w(1 + w) (99.9% of elements reproduced bit for bit that way)",
     "add the 1 in float32: (1 + w.float()), or validate against 'gemma_wdtype'"),
    (H(rounding="trunc"), "the output is rounded toward zero instead of to nearest-even (99.9% of "
     "elements reproduced bit for bit by truncation)",
     "round float32 -> float32 to nearest-even (a plain cast), not by dropping bits"),
    (H(rounding="double"), "an intermediate is rounded to the input dtype where one rounding was "
     "expected: x̂ = x·rstd is rounded before the weight multiplies it (99.9% of elements "
     "reproduced bit for bit by that order)", "multiply by the weight in float32 and round once "
     "at the end: (x.float() * rstd * w.float()).to(dtype)"),
    (H(eps_outside=True), "eps is added outside the square root: rstd = 1/(sqrt(mean(x²)) + eps) "
     "instead of 1/sqrt(mean(x²) + eps)",
     "compute rstd = 1/sqrt(mean(x²) + eps) (or rsqrt(mean(x²) + eps))"),
    (H(divisor="N-1"), "the mean of squares divides by N − 1 instead of N (a variance formula)",
     "divide by N (unbiased=False / correction=0 if you use a variance routine)"),
    (H(divisor="1"), "the sum of squares is not divided by N (a √N scale on rstd)",
     "divide the sum of squares by N (use mean(x²))"),
    (H(separate_terms=True), "dx's two terms are rounded to float32 before they are subtracted: "
     "where they cancel, their rounding errors are the result",
     "subtract in float32 and round dx once: rstd·(dxhat − x̂·c) in float32, then cast"),
]


@pytest.mark.parametrize("h, text, fix", TEXTS, ids=[repr(t[0].codes()) + str(i)
                                                     for i, t in enumerate(TEXTS)])
def test_each_cause_reads_in_full_with_its_fitted_values_and_its_fix(h, text, fix):
    """The whole sentence and fix of each cause, for a float32 case of 64 features under the
    torch convention: every fitted value, scope, named eps and scale name in place, no '?' left
    by a field that was not filled."""
    ((code, got_text, got_fix),) = told(h)
    assert (got_text, got_fix) == (text, fix)
    assert "?" not in got_text + got_fix


def test_the_offset_is_read_against_the_conventions_own_one():
    """Under 'gemma' (weights stored as scale − 1, used as 1 + w) a kernel that adds 1 twice, or
    forgets it, is told so in the convention's terms."""
    g = [an_observation(bfloat16, convention="gemma")]
    assert told(H(offset=1.0), g)[0][1:] == (
        "the weight is used as 2 + w where 1 + w was expected (fitted offset 1)",
        "add the convention's 1 once: (1 + w)")
    assert told(H(offset=-1.0), g)[0][1:] == (
        "the weight is used as 0 + w where 1 + w was expected (fitted offset -1)",
        "add the 1 to the weight (the convention stores w = scale − 1), or validate against "
        "'torch' if your weights are the scale itself")


def test_the_fields_name_every_dtype_and_every_eps_of_the_cases():
    """Cases in two dtypes with two reference eps: both dtypes (sorted, joined by '/'), both eps
    (sorted) in the text; the fix names the first; no match rate reads 'most'; a missing ratio
    reads '-'."""
    obs = [an_observation(bfloat16), an_observation(np.float32, eps=1e-5, seed=1)]
    ev = diagnosis.Evidence(ratio_before=3.0)
    assert told(H(eps=1e-6), obs, ev)[0][1:] == (
        "eps differs from the one asked for: the output is reproduced with eps = 1e-06 (HF's "
        f"rms_norm_eps default) where eps=None was passed; the reference used {F32_EPS}, 1e-05 "
        "(a common default)", USE_DEFAULT)
    assert told(H(rounding="trunc"), obs, ev)[0][1:] == (
        "the output is rounded toward zero instead of to nearest-even (most of elements "
        "reproduced bit for bit by truncation)",
        "round float32 -> bfloat16/float32 to nearest-even (a plain cast), not by dropping bits")
    assert told(H(as_float32=True), obs, ev)[0][1] == (
        "float64 input is computed in float32: the errors are float32's (ratio - to a float32 "
        "computation's bound)")


def test_a_multi_dimensional_shape_is_named_as_asked():
    """normalized_shape (4, 16) reduced over its last dim only: both the text and the fix give
    the shape that was asked for."""
    assert told(H(stat_group="last"), [an_observation(shape=(4, 16))])[0][1:] == (
        "the statistic is taken over the wrong axes (the last dim only, where normalized_shape "
        "(4, 16) was asked)", "reduce over exactly the normalised (trailing) dims: all of (4, 16)")


def test_two_causes_at_once_each_read_their_own_fields():
    """A pair (eps outside the root with an eps of 1e-6): two diagnoses from one fit, each with
    its own sentence."""
    out = told(H(eps=1e-6, eps_outside=True))
    assert [c for c, _, _ in out] == ["eps_value", "eps_outside_sqrt"]
    assert "eps = 1e-06 (HF's rms_norm_eps default)" in out[0][1]
    assert out[1][1].startswith("eps is added outside the square root")


# ---- the evidence line -------------------------------------------------------------------------


def test_the_evidence_line_gives_the_ratios_the_match_the_fit_and_at_most_four_cases():
    ev = diagnosis.Evidence(cases=[f"p{i}/float32/y" for i in range(6)], ratio_before=12.5,
                            ratio_after=0.75, match_rate=0.998765,
                            params={"eps": 1e-6, "offset": 1.0, "block": 32})
    assert ev.brief() == ("ratio 12.5 -> 0.75; bit-exact 99.9%; eps=1e-06 (HF's rms_norm_eps "
                          "default); offset=1; block=32; in p0/float32/y, p1/float32/y, "
                          "p2/float32/y, p3/float32/y ...")
    # only eps is named after the default it equals: a projection scale of 0 is just 0
    zero = diagnosis.Evidence(cases=["a/float32/dx"], ratio_before=2.0,
                              params={"projection_scale": 0.0, "eps": 0.0})
    assert zero.brief() == "ratio 2; projection_scale=0; eps=0 (eps ignored); in a/float32/dx"
    short = diagnosis.Evidence(cases=["a/float32/y"], ratio_before=2.0)
    assert short.brief() == "ratio 2; in a/float32/y"
    d = diagnosis.make("sum_not_mean", short)
    assert d.line() == ("DIAGNOSIS [sum_not_mean] the sum of squares is not divided by N (a √N "
                        "scale on rstd) (evidence: ratio 2; in a/float32/y)\n    fix: divide "
                        "the sum of squares by N (use mean(x²))")
    assert diagnosis.Diagnosis("x", "t", short).line() == (
        "DIAGNOSIS [x] t (evidence: ratio 2; in a/float32/y)")


def test_seen_in_lists_each_probe_and_dtype_once_in_order():
    d = diagnosis.make("sum_not_mean", diagnosis.Evidence(
        cases=["b/float32/y", "a/bfloat16/dx", "b/float32/dx", "a/bfloat16/y"]))
    assert d.seen_in == ["b/float32", "a/bfloat16"]


@pytest.mark.parametrize("v, text", [
    (None, "-"), (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan"),
    (0.0, "0"), (0.75, "0.75"), (1e-3, "0.001"), (9.9e-4, "9.9e-04"), (9999.0, "1e+04"),
    (1e4, "1.0e+04"), (123.456, "123"), (-2.5, "-2.5"), (-1e-5, "-1.0e-05")])
def test_format_ratio_keeps_every_figure_short(v, text):
    """At most 8 characters (one more for a sign), -inf with its sign (it read 'nan')."""
    assert diagnosis.format_ratio(v) == text


def test_a_template_field_that_was_not_filled_reads_as_a_question_mark():
    assert diagnosis._format("a {x} b {y}", {"x": 0.1234567891}) == "a 0.123457 b ?"
    assert diagnosis._fmt_num(3) == "3" and diagnosis._fmt_num("s") == "s"
    assert diagnosis._fmt_param(1e-5) == "1e-05 (a common default)"
    assert diagnosis._fmt_param(1e-4) == "0.0001" and diagnosis._fmt_param("x") == "x"


# ---- the fitted parameters, and one diagnosis per code -----------------------------------------


def test_the_params_hold_exactly_what_was_fitted():
    assert diagnosis._params(H(), []) == {}
    assert diagnosis._params(H(eps=1e-6, offset=1.0, projection=2.0, stat_block=32,
                               dweight="prefix:3"), []) == {
        "eps": 1e-6, "offset": 1.0, "projection_scale": 2.0, "block": 32, "dweight": "prefix:3"}
    assert diagnosis._params(H(eps="finfo(input dtype).eps"), []) == {
        "eps": "finfo(input dtype).eps"}
    assert diagnosis._params(H(eps=0.0), []) == {"eps": 0.0}


def test_one_code_seen_twice_is_one_diagnosis_with_all_its_cases_and_the_worst_ratios():
    a = diagnosis.make("sum_not_mean", diagnosis.Evidence(cases=["p/float32/y"],
                                                          ratio_before=5.0, ratio_after=0.5))
    b = diagnosis.make("sum_not_mean", diagnosis.Evidence(
        cases=["p/float32/y", "q/float32/y"], ratio_before=7.0, ratio_after=0.25))
    c = diagnosis.make("eps_outside_sqrt", diagnosis.Evidence(cases=["r/float32/y"],
                                                              ratio_before=9.0))
    d = diagnosis.make("eps_outside_sqrt", diagnosis.Evidence(cases=["s/float32/y"],
                                                              ratio_before=3.0, ratio_after=0.5))
    out = diagnosis._merge_diagnoses([c, a, b, d])
    assert [x.code for x in out] == ["eps_outside_sqrt", "sum_not_mean"] or \
        [x.code for x in out] == ["sum_not_mean", "eps_outside_sqrt"]
    merged = {x.code: x.evidence for x in out}
    s = merged["sum_not_mean"]
    assert (s.cases, s.ratio_before, s.ratio_after) == (["p/float32/y", "q/float32/y"], 7.0, 0.5)
    e = merged["eps_outside_sqrt"]
    assert (e.cases, e.ratio_before, e.ratio_after) == (["r/float32/y", "s/float32/y"], 9.0, 0.5)
    three = diagnosis._merge_diagnoses([a, diagnosis.make("n_minus_1", diagnosis.Evidence(
        cases=["x/float32/y", "y/float32/y", "z/float32/y"], ratio_before=2.0))])
    assert [x.code for x in three] == ["n_minus_1", "sum_not_mean"]  # most cases first


def test_a_diagnosis_records_its_codes_on_each_case_once():
    o = an_observation()
    o.codes = ["eps_value"]
    diagnosis._record([o], "eps_value", "n_minus_1", "n_minus_1")
    assert o.codes == ["eps_value", "n_minus_1"]
    other = an_observation(seed=1)
    other.codes = None
    diagnosis._record([other], "n_minus_1")  # a case that keeps no codes is left alone
    assert other.codes is None


# ---- what nothing explains ---------------------------------------------------------------------


def correct_y(x, w):
    """The float64 RMSNorm rounded once to x's dtype (torch's convention, eps = finfo eps)."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w64
    return y.astype(x.dtype)


def spoiled(cols):
    """The correct y with the columns ``cols`` (a slice) doubled plus one: a bug there only."""
    def got(x, w):
        y = correct_y(x, w).astype(np.float64)
        y[:, cols] = 2 * y[:, cols] + 1
        return y.astype(x.dtype)
    return got


def test_errors_in_the_last_partial_block_are_a_tail_naming_the_largest_such_block():
    """N = 72: errors only in columns 64..71 sit in the last partial block of 16, 32 and 64 (72
    is no multiple of them; it is of 8, which has no partial block), and there is no full block
    of 128 or more: the tail names 64."""
    o = an_observation(shape=(72,), got=spoiled(slice(64, 72)))
    assert not o.passed
    assert diagnosis._tail_blocks(o) == {16, 32, 64}
    o.codes = []
    (d,) = diagnosis._unexplained([o], ["eps_value"])
    assert (d.code, d.evidence.params, d.evidence.cases) == ("tail", {"block": 64},
                                                             ["gaussian/float32/y"])
    assert d.text == ("errors are confined to the columns of the last partial block (consistent "
                      "with a block of 64 columns): a block/tail-handling bug, e.g. masking or "
                      "indexing of the last partial block")
    assert d.evidence.ratio_before == o.ratio and o.codes == ["tail"]


def test_the_tail_block_is_the_largest_one_every_tail_case_shares():
    """Two tail cases, N = 72 (blocks 16, 32, 64) and N = 40 with errors in 32..39 (blocks 16,
    32): the largest block they share is 32."""
    a = an_observation(shape=(72,), got=spoiled(slice(64, 72)))
    b = an_observation(shape=(40,), got=spoiled(slice(32, 40)), seed=1, probe="other")
    assert diagnosis._tail_blocks(b) == {16, 32}
    for order in ([a, b], [b, a]):  # the blocks every case shares, whatever the order
        (d,) = diagnosis._unexplained(order, [])
        assert d.evidence.params == {"block": 32} and "a block of 32 columns" in d.text
    (d,) = diagnosis._unexplained([a, b], [])
    assert d.evidence.cases == ["gaussian/float32/y", "other/float32/y"]
    assert d.evidence.ratio_before == max(a.ratio, b.ratio)


def test_tail_cases_that_share_no_block_are_a_tail_of_no_named_block():
    """N = 12 with errors in 8..11 (a partial block of 8 only) and N = 40 with errors in 32..39
    (16 or 32): no block size fits both, so the tail names none and fits none."""
    a = an_observation(shape=(12,), got=spoiled(slice(8, 12)))
    b = an_observation(shape=(40,), got=spoiled(slice(32, 40)), seed=1, probe="other")
    assert diagnosis._tail_blocks(a) == {8}
    (d,) = diagnosis._unexplained([a, b], [])
    assert (d.code, d.evidence.params) == ("tail", {})
    assert d.text == ("errors are confined to the columns of the last partial block (consistent "
                      "with a block): a block/tail-handling bug, e.g. masking or indexing of the "
                      "last partial block")


def test_dweight_errors_are_never_a_tail():
    """dweight is one row summed over the rows: errors in its last columns say nothing of a
    row's blocks, so they are no tail even where y's would be."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 72)).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(72)).astype(np.float32)
    dy = rng.standard_normal((4, 72)).astype(np.float32)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    xhat = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    dw = np.sum(dy64 * xhat, axis=0)
    dw[64:] = 2 * dw[64:] + 1  # wrong in the last partial block of 64
    o = observe(dw.astype(np.float32), x, 72, w, quantity="dweight", dy=dy)
    assert not o.passed
    assert diagnosis._tail_blocks(o) == set()


def test_a_failing_element_just_past_the_bound_before_the_tail_makes_it_no_tail():
    """The first failing column decides: one element at 1.5 bounds in column 60 (before the
    partial block of 64 at N = 72), the rest of the errors in 64..71: no tail. Exact elements
    (a zero column: y = 0 exactly) are no failures."""
    first = an_observation(shape=(72,), got=correct_y)
    x = first.x.copy()
    x[:, 0] = 0.0  # y is exactly 0 there: an error of 0 against a bound of 0
    base = observe(correct_y(x, first.weight), x, 72, first.weight)
    pred = diagnosis.predict(diagnosis.CORRECT, base)
    got = pred.exact.copy()
    got[:, 64:] = 2 * got[:, 64:] + 1
    tail = observe(got, x, 72, first.weight)
    assert diagnosis._tail_blocks(tail) == {16, 32, 64}
    got[1, 60] = pred.exact[1, 60] + 1.5 * pred.bound[1, 60]
    assert diagnosis._tail_blocks(observe(got, x, 72, first.weight)) == set()


def test_errors_before_the_last_partial_block_are_no_tail():
    """Errors from column 60 in N = 72 (before 64, where the last partial block of 16, 32 and 64
    starts), or in N = 64 (a multiple of every block up to 64: no partial block), are not a
    tail; a correct case has no failing element at all."""
    assert diagnosis._tail_blocks(an_observation(shape=(72,), got=spoiled(slice(60, 72)))) \
        == set()
    assert diagnosis._tail_blocks(an_observation(shape=(64,), got=spoiled(slice(56, 64)))) \
        == set()
    assert diagnosis._tail_blocks(an_observation(shape=(72,), got=correct_y)) == set()


def test_what_no_known_mistake_explains_names_four_cases_and_everything_tried():
    """Errors spread over the row: no tail. The text names up to four cases (then '...') and
    every code tried; the evidence counts them and keeps the worst ratio."""
    spread = [an_observation(got=spoiled(slice(0, 64, 3)), seed=i, probe=f"p{i}")
              for i in range(5)]
    (d,) = diagnosis._unexplained(spread, ["eps_value", "n_minus_1"])
    assert d.code == "no_known_cause"
    assert d.text == ("no known mistake explains p0/float32/y, p1/float32/y, p2/float32/y, "
                      "p3/float32/y ...; tried: eps_value, n_minus_1")
    assert d.evidence.params == {"tried": 2} and len(d.evidence.cases) == 5
    assert d.evidence.ratio_before == max(o.ratio for o in spread)
    (one,) = diagnosis._unexplained(spread[:1], [])
    assert one.text == "no known mistake explains p0/float32/y; tried: "
    (four,) = diagnosis._unexplained(spread[:4], [])
    assert four.text.endswith("p3/float32/y; tried: ")  # four named: no '...'
    for o in spread:
        o.codes = []
    diagnosis._unexplained(spread, [])
    assert all(o.codes == ["no_known_cause"] for o in spread)


def test_tails_and_the_rest_are_reported_apart_tail_first():
    tail = an_observation(shape=(72,), got=spoiled(slice(64, 72)), probe="t")
    rest = an_observation(got=spoiled(slice(0, 64, 3)), probe="r")
    out = diagnosis._unexplained([rest, tail], ["x"])
    assert [(d.code, d.evidence.cases) for d in out] == [
        ("tail", ["t/float32/y"]), ("no_known_cause", ["r/float32/y"])]


# ---- diagnose, end to end ----------------------------------------------------------------------


def test_diagnose_names_nothing_when_every_case_passes():
    assert diagnosis.diagnose([an_observation(got=correct_y)]) == []


def test_diagnose_reports_a_forward_cause_with_its_evidence_and_leaves_passing_cases_out():
    """eps = 1e-6 where the reference used float32's eps, on tiny rows where eps shows: one
    eps_value diagnosis, its evidence from the failing case only, the fit in the params."""
    def eps_1e6(x, w):
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-6) * w
        return y.astype(x.dtype)

    def tiny(dtype=np.float32, **kw):
        o = an_observation(dtype, **kw)
        x = (o.x.astype(np.float64) * 1e-3).astype(dtype)
        return observe(eps_1e6(x, o.weight), x, o.shape, o.weight, None, probe=o.probe)

    bad = tiny(probe="tiny")
    good = an_observation(got=correct_y, probe="ok")
    assert not bad.passed and good.passed
    (d,) = diagnosis.diagnose([good, bad])
    assert d.code == "eps_value" and d.evidence.cases == ["tiny/float32/y"]
    assert d.evidence.params["eps"] == pytest.approx(1e-6, rel=1e-3)
    assert d.evidence.ratio_after <= 1 < d.evidence.ratio_before == bad.ratio
    assert d.text.startswith("eps differs from the one asked for: the output is reproduced with "
                             "eps = 1e-06 (HF's rms_norm_eps default)")


def test_each_diagnosis_of_a_fit_owns_its_evidence_and_records_its_codes_on_the_cases():
    """A fit of two causes at once (eps = 1e-6 outside the root) gives two diagnoses with the
    same evidence: the cases, the worst ratio before and after, the mean bit-exact rate, the
    fitted eps. Each owns its lists (merging more cases into one leaves the other alone), and
    each case records both codes."""
    obs = [an_observation(bfloat16, probe="a"), an_observation(bfloat16, probe="b", seed=1)]
    for o in obs:
        o.codes = []
    h = H(eps=1e-6, eps_outside=True)
    scores = [diagnosis.Score(0.5, 0.99), diagnosis.Score(0.25, 0.97)]
    ds = diagnosis._diagnoses_of(diagnosis._Choice(h, obs, scores))
    assert [d.code for d in ds] == ["eps_value", "eps_outside_sqrt"]
    for d in ds:
        ev = d.evidence
        assert (ev.cases, ev.ratio_after, ev.params) == (["a/bfloat16/y", "b/bfloat16/y"], 0.5,
                                                         {"eps": 1e-6})
        assert ev.ratio_before == max(o.ratio for o in obs)
        assert ev.match_rate == pytest.approx(0.98)
    assert all(o.codes == ["eps_value", "eps_outside_sqrt"] for o in obs)
    more = diagnosis.make("eps_value", diagnosis.Evidence(cases=["c/bfloat16/y"],
                                                          ratio_before=1.0))
    diagnosis._merge_diagnoses([*ds, more])
    assert ds[0].evidence.cases == ["a/bfloat16/y", "b/bfloat16/y", "c/bfloat16/y"]
    assert ds[1].evidence.cases == ["a/bfloat16/y", "b/bfloat16/y"]
    ds[0].evidence.params["eps"] = 2.0
    assert ds[1].evidence.params == {"eps": 1e-6}
    (d,) = diagnosis._diagnoses_of(diagnosis._Choice(H(divisor="1"), obs[:1],
                                                     [diagnosis.Score(0.5, None)]))
    assert d.evidence.match_rate is None  # no bit-exact rate where no case has one


def test_cases_neither_pass_explains_are_all_reported():
    """A y nothing explains (every third column spoiled) and a dx of noise: the forward's
    unexplained case is kept when the backward's is added, in one no_known_cause."""
    y = an_observation(got=spoiled(slice(0, 64, 3)), probe="fwd")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(64)).astype(np.float32)
    dy = rng.standard_normal((4, 64)).astype(np.float32)
    noise = rng.standard_normal((4, 64)).astype(np.float32)
    dx = observe(noise, x, 64, w, quantity="dx", dy=dy, probe="bwd")
    assert not y.passed and not dx.passed
    out = diagnosis.diagnose([y, dx])
    assert [d.code for d in out] == ["no_known_cause"]
    assert out[0].evidence.cases == ["fwd/float32/y", "bwd/float32/dx"]


# ---- the evidence of one choice, locating the tail, the truncation rounding ---------------------
# (what the mutants of _diagnoses_of, Evidence.brief, _unexplained, _tail_blocks and _trunc
# showed unpinned by the tests above)


@pytest.fixture(scope="module")
def cases():
    """Two cases that differ in everything _fields reads: a float32 case under torch (eps=None:
    finfo(float32).eps, offset 0, normalized_shape (2, 8)) and a bfloat16 case under gemma
    (eps=1e-5 passed, offset 1, normalized_shape (16,))."""
    rng = np.random.default_rng(7)
    x32 = rng.standard_normal((4, 2, 8)).astype(np.float32)
    o32 = observe(np.zeros((4, 16)), x32, (2, 8), np.ones((2, 8), np.float32))
    xb = rng.standard_normal((4, 16)).astype(bfloat16)
    ob = observe(np.zeros((4, 16)), xb, 16, None, 1e-5, convention="gemma")
    return o32, ob


def _diagnosis(h, obs, match=None):
    """The one diagnosis of ``h`` explaining ``obs`` with a quarter of the bound left."""
    choice = diagnosis._Choice(h, list(obs), [diagnosis.Score(0.25, match)] * len(obs))
    (d,) = diagnosis._diagnoses_of(choice)
    return d


def test_the_evidence_of_a_cause_is_its_cases_worst_ratios_bits_and_fit(cases):
    """_diagnoses_of: the cases it explains (labels, in order), the worst ratio before (over
    the cases) and after (over the scores), the mean bit match, the fitted values; and the
    codes recorded on each case."""
    o32, ob = cases
    o32.codes, ob.codes = [], []
    choice = diagnosis._Choice(H(eps=1e-6, divisor="N-1"), [ob, o32],
                               [diagnosis.Score(0.25, 0.7), diagnosis.Score(0.5, 0.9)])
    d1, d2 = diagnosis._diagnoses_of(choice)
    assert [d1.code, d2.code] == ["eps_value", "n_minus_1"]
    for d in (d1, d2):
        ev = d.evidence
        assert ev.cases == ["gaussian/bfloat16/y", "gaussian/float32/y"]
        assert ev.ratio_before == max(o32.ratio, ob.ratio) and ev.ratio_before > 1
        assert ev.ratio_after == 0.5
        assert ev.match_rate == pytest.approx(0.8)
        assert ev.params == {"eps": 1e-6}
    # each diagnosis owns its evidence: merging one's cases leaves the other's alone
    assert d1.evidence is not d2.evidence and d1.evidence.cases is not d2.evidence.cases
    assert d1.evidence.params is not d2.evidence.params
    assert o32.codes == ob.codes == ["eps_value", "n_minus_1"]
    o32.codes = ob.codes = None
    # no bits counted on any case: no match rate (not 0, not nan)
    d = _diagnosis(H(divisor="N-1"), [o32])
    assert d.evidence.match_rate is None and "bit-exact" not in d.line()


def test_named_eps_values_read_with_their_names_only_where_a_name_is_wanted():
    """Evidence.brief names an eps (0 is "eps ignored") and writes every other fitted number
    plainly: a projection scale of 0 is "0", not "0 (eps ignored)"."""
    ev = diagnosis.Evidence(cases=["a/float32/dx"], ratio_before=3.0,
                            params={"eps": 0.0, "projection_scale": 0.0, "offset": 1e-6})
    assert ev.brief() == ("ratio 3; eps=0 (eps ignored); projection_scale=0; offset=1e-06; "
                          "in a/float32/dx")


def _tail_case(n, lo, probe="tails", rows=3, seed=0):
    """A float32 case whose y is exact except columns lo.. of every row (off by 1 %)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    y = Reference(x, (n,), None, 2.0**-23).exact("y")
    y[:, lo:] *= 1.01
    return observe(y.astype(np.float32), x, n, probe=probe)


def test_tail_blocks_are_the_block_sizes_whose_last_partial_block_holds_every_error():
    """With N = 40 and errors from column 32 on, blocks of 16 and 32 leave 32.. as the partial
    block; 8 divides 40 (no partial block) and 64 exceeds N (no full block)."""
    assert diagnosis._tail_blocks(_tail_case(40, 32)) == {16, 32}
    assert diagnosis._tail_blocks(_tail_case(40, 31)) == set()      # column 31 is in a full one
    assert diagnosis._tail_blocks(_tail_case(24, 16)) == {16}
    assert diagnosis._tail_blocks(_tail_case(48, 32)) == {32}


def test_an_error_just_past_its_bound_locates_the_tail_and_one_on_it_does_not():
    """A tail error of 1.5 bounds counts (a small error, not only a gross one); an element
    exactly on its bound is inside it, as everywhere else in rmsref, so it does not pull the
    first bad column out of the tail. float32 has a (tiny) bound even where y is 0."""
    x = np.ones((3, 40), np.float32)
    x[1] = 0.0
    o = observe(np.zeros((3, 40)), x, 40)
    pred = diagnosis.predict(diagnosis.CORRECT, o)
    got = pred.exact.copy()
    got[:, 32:] += 1.5 * pred.bound[:, 32:]
    got[1, 0] = pred.bound[1, 0]                    # exact is 0 there: the error is the bound
    assert pred.exact[1, 0] == 0.0 and pred.bound[1, 0] > 0.0
    assert diagnosis._tail_blocks(observe(got, x, 40)) == {16, 32}


def test_an_error_of_exactly_one_is_located_like_any_other():
    """err == 1 is not "no error": with y = 1 exactly (rows of ones, eps = 0, float64) an
    output of 2 in the tail places the tail."""
    x = np.ones((2, 40))
    got = np.ones((2, 40))
    got[:, 32:] = 2.0
    assert diagnosis._tail_blocks(observe(got, x, 40, eps=0.0)) == {16, 32}


def test_locating_the_tail_among_zero_bounds_warns_of_nothing():
    """float64 y that is exactly 0 has a bound of 0: an exact 0 there (0/0) and an error there
    (x/0, in the tail) are judged without NumPy warnings reaching the user."""
    import warnings

    x = np.ones((3, 40))
    x[1] = 0.0
    o = observe(np.zeros((3, 40)), x, 40, eps=1e-6)
    pred = diagnosis.predict(diagnosis.CORRECT, o)
    assert (pred.bound[1] == 0.0).all()
    got = pred.exact.copy()
    got[1, 32:] = 1e-300
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert diagnosis._tail_blocks(observe(got, x, 40, eps=1e-6)) == {16, 32}


def test_errors_in_the_tail_read_as_a_tail_bug_with_the_block_every_case_shares():
    """Two tail cases share only B = 16 ({16} and {16, 32}): the text names 16, whichever case
    comes first; a case with errors elsewhere is no_known_cause, listing what was tried. Each
    case records the code it is reported under."""
    a, b, other = _tail_case(24, 16), _tail_case(40, 32, seed=1), _tail_case(40, 3, "gaussian")
    a.codes, b.codes, other.codes = [], [], []
    for order in ([a, b, other], [b, a, other]):
        tail, unknown = diagnosis._unexplained(order, ["eps_value", "n_minus_1"])
        assert tail.code == "tail"
        assert tail.text == ("errors are confined to the columns of the last partial block "
                             "(consistent with a block of 16 columns): a block/tail-handling "
                             "bug, e.g. masking or indexing of the last partial block")
        assert tail.evidence.params == {"block": 16}
        assert tail.evidence.cases == [o.label for o in order if o is not other]
        assert tail.evidence.ratio_before == max(a.ratio, b.ratio)
        assert unknown.code == "no_known_cause"
        assert unknown.text == ("no known mistake explains gaussian/float32/y; tried: "
                                "eps_value, n_minus_1")
        assert unknown.evidence.cases == ["gaussian/float32/y"]
        assert unknown.evidence.params == {"tried": 2}
        assert unknown.evidence.ratio_before == other.ratio
        assert a.codes == b.codes == ["tail"] and other.codes == ["no_known_cause"]


def test_dweight_and_exact_cases_have_no_tail():
    """dweight has no columns of a row to locate; an output with no element out of bound has
    nowhere to place a block."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    dy = rng.standard_normal((3, 40)).astype(np.float32)
    w = np.ones(40, np.float32)
    dw = Reference(x, (40,), w, 2.0**-23, dy=dy).exact("dweight")
    dw[:, 32:] *= 1.01
    assert diagnosis._tail_blocks(observe(dw, x, 40, w, quantity="dweight", dy=dy)) == set()
    assert diagnosis._tail_blocks(_tail_case(40, 40)) == set()


@pytest.mark.parametrize("dt", [np.dtype(bfloat16), np.dtype(np.float16), np.dtype(np.float32)])
def test_truncation_rounds_toward_zero_and_never_overflows(dt):
    """_trunc, the rounding the ``truncation`` cause predicts with: a value of ``dt`` stays, any
    other goes to its neighbour nearer zero, on both signs; inf and nan stay; and a finite value
    past ``dt``'s largest number is that number (dropping bits never reaches inf), where
    rounding to nearest overflows."""
    big = float(np.finfo(dt).max)
    one_ulp = float(np.finfo(dt).eps)                         # the spacing of [1, 2)
    v = np.array([1.0, 1 + 0.75 * one_ulp, 1 + 0.25 * one_ulp, 2 - 0.25 * one_ulp, 0.0,
                  1.5 * big, big * (1 + 0.75 * one_ulp), np.inf, np.nan])
    want = np.array([1.0, 1.0, 1.0, 2 - one_ulp, 0.0, big, big, np.inf, np.nan])
    np.testing.assert_array_equal(diagnosis._trunc(v, dt), want)
    np.testing.assert_array_equal(diagnosis._trunc(-v, dt), -want)
    assert np.isinf(diagnosis._rt(np.array([1.5 * big]), dt)).all()  # nearest: overflows
    # outside [1, 2) the step back is that binade's own spacing (2 ulps of 1 at 3, 1/4 at 0.375)
    v = np.array([3 + 1.5 * one_ulp, 0.375 + 0.1875 * one_ulp, 768 * (1 + 0.5 * one_ulp)])
    np.testing.assert_array_equal(diagnosis._trunc(v, dt), [3.0, 0.375, 768.0])


# ---- diagnose: which forward causes it may name ------------------------------------------------


def _fwd32(x, eps, div=0):
    """A float32 forward with eps ``eps`` and the mean of squares divided by N − ``div``."""
    ms = np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32) / np.float32(x.shape[-1] - div)
    return (x / np.sqrt(ms + np.float32(eps))).astype(np.float32)


def test_two_forward_causes_that_no_single_one_explains_are_named_together():
    """eps = 1e-6 (for eps=None) and N − 1 at once: N − 1 alone explains the unit-scale case,
    nothing single explains the small one (where the eps shows); the pair explains both, so
    both codes are reported over both cases, with nothing left unexplained."""
    rng = np.random.default_rng(1)
    obs = []
    for scale, probe in ((1e-3, "small"), (1.0, "gaussian")):
        x = (scale * rng.standard_normal((6, 64))).astype(np.float32)
        obs.append(observe(_fwd32(x, 1e-6, div=1), x, 64, probe=probe))
    ds = diagnosis.diagnose(obs)
    assert [d.code for d in ds] == ["eps_value", "n_minus_1"]
    for d in ds:
        assert d.evidence.cases == ["small/float32/y", "gaussian/float32/y"]
        assert d.evidence.params == {"eps": 1e-6}


def test_a_forward_cause_that_breaks_a_passing_output_is_not_named():
    """eps = 1e-6 explains a failing case, but the kernel got another case of the same kind
    (eps=None, float32, small values) right, which that eps would break: no eps_value."""
    rng = np.random.default_rng(1)
    xa, xb = (1e-3 * rng.standard_normal((2, 6, 64))).astype(np.float32)
    bad = observe(_fwd32(xa, 1e-6), xa, 64, probe="small")
    good = observe(_fwd32(xb, 2.0**-23), xb, 64, probe="small2")
    assert not bad.passed and good.passed
    assert [d.code for d in diagnosis.diagnose([bad])] == ["eps_value"]
    assert "eps_value" not in [d.code for d in diagnosis.diagnose([bad, good])]


def _dx_case(rng, probe, project=True):
    """A float32 dx computed in float64 from the derivation, without the path through rstd
    (the projection) unless ``project``; x, w, dy drawn from ``rng``."""
    x = rng.standard_normal((6, 64)).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(64)).astype(np.float32)
    dy = rng.standard_normal((6, 64)).astype(np.float32)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    rstd = 1 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 2.0**-23)   # (M, 1)
    xhat = x64 * rstd                                                       # (M, N)
    g = dy64 * w64                                                          # (M, N) w·dy
    c = np.mean(g * xhat, -1, keepdims=True) if project else 0.0            # (M, 1)
    dx = (rstd * (g - xhat * c)).astype(np.float32)
    return observe(dx, x, 64, w, quantity="dx", dy=dy, probe=probe)


def test_a_forward_case_nothing_explains_is_reported_once_beside_the_backward_cause():
    """A y case no mistake explains and a dx case missing its projection: the backward cause is
    named, and the y case is still reported, once, as no_known_cause with every code tried on
    the forward and the backward, alphabetically."""
    rng = np.random.default_rng(2)
    y, dx = _tail_case(40, 3, "ybad"), _dx_case(rng, "gaussian", project=False)
    first, unknown = diagnosis.diagnose([y, dx])
    assert first.code == "missing_projection" and first.evidence.cases == ["gaussian/float32/dx"]
    assert unknown.text == (
        "no known mistake explains ybad/float32/y; tried: centred_statistic, double_rounding, "
        "dweight_from_x, dweight_reduction, dweight_times_weight, eps_outside_sqrt, eps_value, "
        "low_precision_accumulation, missing_projection, n_minus_1, offset_rounding, "
        "offset_weight, projection_scale, separately_rounded_terms, sum_not_mean, "
        "tail_statistic, truncation, wrong_axis")
    assert unknown.evidence.cases == ["ybad/float32/y"]


def test_a_backward_cause_that_breaks_a_passing_dx_is_not_named():
    """The projection dropped on one dx case but kept on another that passed: missing_projection
    explains the first alone, and is not named once the passing case contradicts it."""
    rng = np.random.default_rng(2)
    bad, good = _dx_case(rng, "gaussian", project=False), _dx_case(rng, "other")
    assert not bad.passed and good.passed
    assert [d.code for d in diagnosis.diagnose([bad])] == ["missing_projection"]
    assert [d.code for d in diagnosis.diagnose([bad, good])] == ["no_known_cause"]
