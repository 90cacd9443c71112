"""rmsref.diagnosis, the engine's parts one at a time: what a user reads (the evidence line, the
codes' texts with their fitted values), and the decisions behind the cause named (predictions of
each mutation, the fits, the search). Each mistake is planted in a few lines of NumPy; the
reference is the float64 oracle and the bounds are the convention's rmsref.tolerance model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rmsref import diagnosis
from rmsref._shapes import FLOAT_DTYPES, bfloat16

from .test_diagnosis_mutants import Case, cover, observe

Ev = diagnosis.Evidence


def test_a_code_missing_a_field_reads_a_question_mark_not_a_key_error():
    d = diagnosis.make("wrong_axis")
    assert d.code == "wrong_axis"
    assert d.text == "the statistic is taken over the wrong axes (?)"
    assert d.fix == "reduce over exactly the normalised (trailing) dims: ?"


# ---- the decisions: explains, consistent -------------------------------------------------------

H = diagnosis.Hypothesis
S = diagnosis.Score


def test_a_case_without_bits_to_compare_is_judged_by_its_ratio_alone():
    """match None (no emulated bits for this hypothesis) explains by the bound, even when the
    correct computation's bits are known."""
    assert diagnosis._explains(H(eps=1e-6), S(0.5, None), S(3.0, 0.8))
    assert not diagnosis._explains(H(eps=1e-6), S(1.5, None), S(3.0, 0.8))


def test_consistency_is_judged_with_the_hypothesis_under_test():
    """The scores asked for are the candidate's own: the correct computation passing the case
    says nothing of whether the mutated one stays inside the bound there."""
    a = object()
    h = H(divisor="N-1")

    def scores(hyp, o):
        return S(0.3, None) if hyp == diagnosis.CORRECT else S(4.0, None)

    assert not diagnosis._consistent(h, [a], scores)
    assert diagnosis._consistent(diagnosis.CORRECT, [a], scores)


# ---- which eps a hypothesis uses ---------------------------------------------------------------


class _EpsCase:
    """What _eps_used reads of a case: the dtype, what was passed, what the reference used."""

    def __init__(self, dtype, eps_asked, eps=2.0**-23):
        self.dtype, self.eps_asked, self.eps = np.dtype(dtype), eps_asked, eps


@pytest.mark.parametrize("dname,eps", [("bfloat16", 2.0**-7), ("float16", 2.0**-10),
                                       ("float32", 2.0**-23), ("float64", 2.0**-52)])
def test_finfo_of_the_input_dtype_resolves_per_case(dname, eps):
    h = H(eps=diagnosis._INPUT_EPS)
    assert diagnosis._eps_used(h, _EpsCase(FLOAT_DTYPES[dname], None)) == eps


def test_an_eps_mistake_scoped_to_the_default_leaves_a_passed_eps_alone():
    passed, default = _EpsCase(np.float32, 1e-3, eps=1e-3), _EpsCase(np.float32, None)
    assert diagnosis._eps_used(H(eps=1e-6), default) == 1e-6
    assert diagnosis._eps_used(H(eps=1e-6), passed) == 1e-3        # the eps asked for is used
    assert diagnosis._eps_used(H(eps=1e-6, eps_scope="all"), passed) == 1e-6   # it is ignored
    assert diagnosis._eps_used(diagnosis.CORRECT, default) == 2.0**-23
    assert diagnosis._eps_used(diagnosis.CORRECT, passed) == 1e-3


# ---- pairs of mutations ------------------------------------------------------------------------


def test_two_mutations_merge_when_they_touch_different_fields():
    eps, n1 = H(eps=1e-6), H(divisor="N-1")
    assert diagnosis._merge(eps, n1) == H(eps=1e-6, divisor="N-1")
    assert diagnosis._merge(n1, eps) == H(eps=1e-6, divisor="N-1")
    assert diagnosis._merge(H(eps=1e-5, eps_scope="all"), H(rounding="double")) == \
        H(eps=1e-5, eps_scope="all", rounding="double")


def test_two_mutations_of_one_field_do_not_merge():
    assert diagnosis._merge(H(divisor="N-1"), H(divisor="1")) is None
    assert diagnosis._merge(H(eps=1e-6), H(eps=1e-5, eps_scope="all")) is None
    assert diagnosis._merge(H(rounding="double"), H(rounding="trunc")) is None


# ---- scoring one hypothesis on one case ---------------------------------------------------------


def _unit_rows(rows=4, n=8):
    """Rows of ±1 with eps = 0 passed: mean(x²) = 1, so rstd = 1 and y = x·w exactly."""
    x = np.where(np.arange(rows * n).reshape(rows, n) % 3, 1.0, -1.0).astype(np.float32)
    return x, np.ones(n, np.float32)


def test_an_output_equal_to_the_mutated_reference_scores_zero():
    x, w = _unit_rows()
    obs = observe(x * w, x, 8, w, eps=0.0)
    s = diagnosis.score(diagnosis.CORRECT, obs)
    assert s.ratio == 0.0 and s.match is None and s.exact_output


def test_an_error_of_exactly_one_counts():
    """err == 0 is what scores 0 (0/0 where the bound vanishes); an element off by exactly 1.0
    is as wrong as any other."""
    x, w = _unit_rows()
    got = (x * w).astype(np.float64)
    got[1, 2] += 1.0                                   # |1 − (−1)| or |2 − 1|: exactly 1 off
    obs = observe(got, x, 8, w, eps=0.0)
    assert diagnosis.score(diagnosis.CORRECT, obs).ratio > 1e6


def test_a_nan_output_scores_inf_so_it_never_passes_for_consistent():
    x, w = _unit_rows()
    got = (x * w).astype(np.float64)
    got[0, 0] = np.nan
    obs = observe(got, x, 8, w, eps=0.0)
    s = diagnosis.score(diagnosis.CORRECT, obs)
    assert s.ratio == np.inf and not s.explains
    assert not diagnosis._consistent(diagnosis.CORRECT, [obs], lambda h, o: diagnosis.score(h, o))



def test_on_an_unmasked_nan_row_a_nan_is_reproduced_and_a_number_is_not():
    """Where x holds a NaN the reference row is NaN (and so is its bound): a NaN there is the
    reference's answer (error 0, as tolerance.abs_error counts it); a number there is no
    answer the reference could give: inf, never a NaN ratio that every comparison lets by."""
    x, w = _unit_rows()
    x[1, 3] = np.nan
    got = (x * w).astype(np.float64)
    got[1] = np.nan
    obs = observe(got, x, 8, w, eps=0.0)
    assert diagnosis.score(diagnosis.CORRECT, obs).ratio == 0.0
    got[1, 5] = 1.0
    s = diagnosis.score(diagnosis.CORRECT, replace(obs, got=got))
    assert s.ratio == np.inf
    assert not diagnosis._consistent(diagnosis.CORRECT, [replace(obs, got=got)],
                                     lambda h, o: diagnosis.score(h, o))

def test_rows_outside_the_mask_are_not_scored_on_y_and_dx():
    """Rows whose x holds NaN/Inf may return anything (validation masks them); the others count."""
    x, w = _unit_rows()
    got = (x * w).astype(np.float64)
    got[0] = 1e30                                      # the masked row: anything goes
    obs = observe(got, x, 8, w, eps=0.0)
    masked = replace(obs, mask_rows=np.array([False, True, True, True]))
    assert diagnosis.score(diagnosis.CORRECT, masked).ratio == 0.0
    assert diagnosis.score(diagnosis.CORRECT, obs).ratio > 1e6
    got[1, 0] = 1e30                                   # a kept row is still judged
    assert diagnosis.score(diagnosis.CORRECT, replace(masked, got=got)).ratio > 1e6


def test_dweight_is_one_row_whatever_the_mask(rng):
    """dweight sums every row: the row mask of its case does not apply to its single row."""
    from rmsref.comparison import Reference

    x, w = _unit_rows()
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dw = Reference(x, (8,), w, 0.0, dy=dy).exact("dweight")
    obs = observe(dw, x, 8, w, eps=0.0, quantity="dweight", dy=dy)
    masked = replace(obs, mask_rows=np.array([False, True, True, True]))
    s = diagnosis.score(diagnosis.CORRECT, masked)
    assert s.ratio <= 1.0 and not s.exact_output      # the correct dweight, judged whole


def test_an_empty_batch_scores_zero_with_no_bits():
    x = np.zeros((0, 8), np.float32)
    w = np.ones(8, np.float32)
    obs = observe(np.zeros((0, 8)), x, 8, w)
    s = diagnosis.score(diagnosis.CORRECT, obs)
    assert s.ratio == 0.0 and s.match is None


def test_the_bit_match_counts_a_lone_nan_as_a_mismatch(rng):
    """On bfloat16 the fraction of elements reproduced bit for bit: a NaN where the emulation
    has a number is one element not reproduced."""
    x = rng.standard_normal((4, 16)).astype(bfloat16)
    w = np.ones(16, bfloat16)
    obs = observe(np.zeros((4, 16)), x, 16, w)
    emulated = diagnosis.predict(diagnosis.CORRECT, obs).emulated
    got = emulated.copy()
    assert diagnosis.score(diagnosis.CORRECT, replace(obs, got=got)).match == 1.0
    got[2, 3] = np.nan
    assert diagnosis.score(diagnosis.CORRECT, replace(obs, got=got)).match == 63 / 64


# ---- how rows are grouped for the statistic ---------------------------------------------------


class _GroupCase:
    """What _groups reads of a case: its rows and normalized_shape."""

    def __init__(self, rows, shape):
        self.shape = shape
        self.xrows = np.arange(rows * int(np.prod(shape)), dtype=float).reshape(rows, -1)


def test_the_batch_axis_statistic_needs_two_rows_and_transposes():
    assert diagnosis._groups(H(stat_group="rows"), _GroupCase(1, (8,))) is None
    case = _GroupCase(2, (8,))
    g = diagnosis._groups(H(stat_group="rows"), case)
    np.testing.assert_array_equal(g.to_view(case.xrows), case.xrows.T)        # (N, R)
    np.testing.assert_array_equal(g.from_view(case.xrows.T), case.xrows)


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 5)])
def test_the_last_dim_statistic_groups_by_the_last_normalised_dim(shape):
    case = _GroupCase(3, shape)
    g = diagnosis._groups(H(stat_group="last"), case)
    k = shape[-1]
    view = g.to_view(case.xrows)
    assert view.shape == (3 * int(np.prod(shape)) // k, k)                       # (R·N/k, k)
    np.testing.assert_array_equal(view[1], case.xrows[0, k:2 * k])
    np.testing.assert_array_equal(g.from_view(view), case.xrows)
    assert diagnosis._groups(H(stat_group="last"), _GroupCase(3, (8,))) is None


def test_the_correct_grouping_is_one_statistic_per_row():
    case = _GroupCase(3, (4, 2))
    g = diagnosis._groups(diagnosis.CORRECT, case)
    np.testing.assert_array_equal(g.to_view(case.xrows), case.xrows)
    np.testing.assert_array_equal(g.from_view(case.xrows), case.xrows)


# ---- which rows dweight sums -------------------------------------------------------------------


def test_dweight_reductions_sum_the_rows_they_name():
    terms = 10.0 ** np.arange(4)[:, None] * np.arange(1, 5)[None, :]     # (4, 4): row i is 10^i·j
    col = terms.sum(axis=0, keepdims=True)
    for how in ("rows", "from_x", "times_w", "half_sum"):
        out = diagnosis._reduce_rows(terms, how)
        assert out.shape == (1, 4)
        np.testing.assert_array_equal(out, col)
    np.testing.assert_array_equal(diagnosis._reduce_rows(terms, "prefix:2"), terms[:2].sum(0)[None])
    np.testing.assert_array_equal(diagnosis._reduce_rows(terms, "suffix:1"), terms[3:])
    assert diagnosis._reduce_rows(terms, "prefix:2").shape == (1, 4)
    assert diagnosis._reduce_rows(terms, "suffix:3").shape == (1, 4)
    np.testing.assert_array_equal(diagnosis._reduce_rows(terms, "features"),
                                  terms.sum(axis=1)[None, :])             # rows = N only
    assert diagnosis._reduce_rows(terms[:3], "features") is None
    with pytest.raises(ValueError, match="sideways"):
        diagnosis._reduce_rows(terms, "sideways:1")


# ---- the greedy cover --------------------------------------------------------------------------


def test_an_exact_tie_goes_to_the_candidate_listed_first():
    """The candidates come simplest first (the grid's order): a tie in every key keeps the
    earlier one, so the same failure always gets the same name."""
    c1, c2 = Case("a"), Case("b")
    a, b = H(divisor="N-1"), H(eps_outside=True)
    t = {(h, c): S(0.5, None) for h in (a, b) for c in (c1, c2)}
    assert cover([a, b], [c1, c2], [], t)[0] == [(a, [c1, c2])]
    assert cover([b, a], [c1, c2], [], t)[0] == [(b, [c1, c2])]


def test_with_equal_counts_the_cause_with_bits_reproduced_comes_first():
    """A cause that explains a case bit for bit outranks one explaining a case of equal count
    without bits to compare (no match: 0, not a perfect score)."""
    c32, c16 = Case("a", "float32"), Case("b")
    a, b = H(divisor="N-1"), H(eps_outside=True)
    t = {(a, c32): S(0.5, None), (b, c16): S(0.5, 0.9)}
    chosen, rest = cover([a, b], [c32, c16], [], t)
    assert chosen == [(b, [c16]), (a, [c32])] and rest == []


# ---- what the user reads: the evidence line ----------------------------------------------------


def test_the_evidence_line_gives_ratios_bits_named_eps_fits_and_the_first_four_cases():
    ev = diagnosis.Evidence(cases=["a/float32/y", "b/float32/y", "c/bfloat16/y", "d/bfloat16/dx",
                                   "e/float16/y"],
                            ratio_before=12.5, ratio_after=0.5, match_rate=0.912,
                            params={"eps": 1e-6, "block": 32, "projection_scale": 0.25})
    assert ev.brief() == ("ratio 12.5 -> 0.5; bit-exact 91.2%; eps=1e-06 (HF's rms_norm_eps "
                          "default); block=32; projection_scale=0.25; "
                          "in a/float32/y, b/float32/y, c/bfloat16/y, d/bfloat16/dx ...")
    four = replace(ev, cases=ev.cases[:4], ratio_after=None, match_rate=None, params={})
    assert four.brief() == ("ratio 12.5; in a/float32/y, b/float32/y, c/bfloat16/y, "
                            "d/bfloat16/dx")
    # an eps off the named grid is the number alone; a name like "finfo(input dtype).eps" as is
    assert "eps=3e-06;" in replace(four, params={"eps": 3e-6}).brief()
    assert "eps=finfo(input dtype).eps;" in replace(
        four, params={"eps": diagnosis._INPUT_EPS}).brief()


def test_a_diagnosis_line_carries_its_fix_on_a_second_line_only_when_it_has_one():
    ev = diagnosis.Evidence(cases=["gaussian/float32/y"], ratio_before=3.0, ratio_after=0.2)
    d = diagnosis.make("n_minus_1", ev)
    assert d.evidence is ev
    assert d.line() == (
        "DIAGNOSIS [n_minus_1] the mean of squares divides by N − 1 instead of N (a variance "
        "formula) (evidence: ratio 3 -> 0.2; in gaussian/float32/y)\n"
        "    fix: divide by N (unbiased=False / correction=0 if you use a variance routine)")
    bare = replace(d, fix="")
    assert bare.line() == d.line().split("\n")[0]
    assert diagnosis.make("n_minus_1").evidence == diagnosis.Evidence()


def test_seen_in_names_each_probe_and_dtype_once_in_order():
    ev = diagnosis.Evidence(cases=["tails/bfloat16/y N=65", "gaussian/float32/dx",
                                   "tails/bfloat16/dx N=65", "gaussian/float32/y"])
    assert diagnosis.Diagnosis("x", "t", ev).seen_in == ["tails/bfloat16", "gaussian/float32"]


def test_one_diagnosis_per_code_with_the_evidence_of_all_its_cases_most_cases_first():
    def d(code, cases, before, after):
        return diagnosis.make(code, diagnosis.Evidence(cases=list(cases), ratio_before=before,
                                                       ratio_after=after))

    merged = diagnosis._merge_diagnoses([
        d("eps_value", ["a/float32/y"], 4.0, 0.9), d("missing_projection", ["a/float32/dx",
          "b/float32/dx"], 9.0, 0.5), d("eps_value", ["a/float32/y", "b/float32/y"], 2.0, 0.3),
        d("eps_value", ["c/float32/y"], 3.0, None)])
    assert [m.code for m in merged] == ["eps_value", "missing_projection"]
    ev = merged[0].evidence
    assert ev.cases == ["a/float32/y", "b/float32/y", "c/float32/y"]
    assert ev.ratio_before == 4.0 and ev.ratio_after == 0.9            # the worst of each
    # a first diagnosis without an after-ratio takes the next one's, not a made-up 1
    later = diagnosis._merge_diagnoses([d("tail", ["a/float32/y"], 4.0, None),
                                        d("tail", ["b/float32/y"], 2.0, 0.3)])
    assert later[0].evidence.ratio_after == 0.3
    # most cases first; equal counts keep the order they were found in (a stable sort)
    order = diagnosis._merge_diagnoses([d("tail", ["a"], 1.0, None), d("n_minus_1", ["a", "b"],
                                        1.0, None), d("truncation", ["c"], 1.0, None)])
    assert [m.code for m in order] == ["n_minus_1", "tail", "truncation"]


def test_codes_are_recorded_once_on_the_cases_that_collect_them():
    class Seen:
        def __init__(self, codes):
            self.codes = codes

    a, b = Seen(["eps_value"]), Seen(None)
    diagnosis._record([a, b], "eps_value", "missing_projection")
    assert a.codes == ["eps_value", "missing_projection"] and b.codes is None


def test_the_fitted_parameters_reported_are_the_mutation_s_own():
    h = H(eps=1e-6, offset=1.0, projection="N", stat_block=32, dweight="prefix:3")
    assert diagnosis._params(h, []) == {"eps": 1e-6, "offset": 1.0, "projection_scale": "N",
                                        "block": 32, "dweight": "prefix:3"}
    assert diagnosis._params(H(eps=diagnosis._INPUT_EPS), []) == {"eps": diagnosis._INPUT_EPS}
    assert diagnosis._params(H(eps=0.0, projection=0.0), []) == {"eps": 0.0,
                                                                 "projection_scale": 0.0}
    assert diagnosis._params(diagnosis.CORRECT, []) == {}


def test_a_candidate_that_explains_nothing_does_not_end_the_search():
    c1, c2 = Case("a"), Case("b")
    none, h = H(divisor="1"), H(divisor="N-1")
    t = {(none, c1): S(3.0, None), (none, c2): S(2.0, None), (h, c1): S(0.5, None),
         (h, c2): S(0.5, None)}
    assert cover([none, h], [c1, c2], [], t) == ([(h, [c1, c2])], [])


def test_scoring_a_wrong_eps_on_every_probe_warns_of_nothing():
    """Scores divide errors by bounds that can be 0 or inf (zero rows, overflowing probes): the
    engine judges those elements itself and must not spill NumPy's RuntimeWarnings on the user."""
    import warnings

    from rmsref.validation import validate

    def fwd(x, shape, w=None, eps=None):             # HF's default eps, computed in float32
        x32 = x.astype(np.float32)
        eps32 = np.float32(1e-6 if eps is None else eps)
        y = x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + eps32)
        return (y * w.astype(np.float32) if w is not None else y).astype(x.dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rep = validate(fwd, dtypes=["float32", "float64"], repeat=False)
    assert "eps_value" in [d.code for d in rep.diagnoses], "\n".join(rep.lines())


def test_the_cover_compares_a_cause_s_bits_with_the_correct_computation_s():
    """Inside the bound but reproducing fewer bits than the correct computation does is no
    explanation, in the sample check and in the count alike."""
    c1 = Case("a")
    h = H(divisor="N-1")
    t = {(h, c1): S(0.5, 0.8), (diagnosis.CORRECT, c1): S(3.0, 0.9)}
    assert cover([h], [c1], [], t) == ([], [c1])
    c2 = Case("b")
    t.update({(h, c2): S(0.5, 0.95), (diagnosis.CORRECT, c2): S(3.0, 0.9)})
    assert cover([h], [c1, c2], [], t) == ([(h, [c2])], [c1])
