"""rmsref.diagnosis, case by case: one observation (or a few) built by hand, the mistake planted
in a few lines of NumPy, and what the engine must conclude: the code, the fitted parameter, the
text the user reads, and no cause where none holds. Reference: the float64 oracle
(rmsref.comparison.Reference); bounds: the convention's rmsref.tolerance model."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import conventions, diagnosis
from rmsref._shapes import bfloat16
from rmsref.comparison import Reference, compare


def observe(got, x, shape, w=None, eps=None, *, quantity="y", dy=None, convention="torch",
            probe="gaussian"):
    """The Observation validation records for one compared quantity, judged by the convention's
    own error model against the float64 oracle."""
    conv = conventions.get(convention)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    eps_val = conv.default_eps(x.dtype) if eps is None else float(eps)
    ref = Reference(x, shape, w, eps_val, dy=dy, offset=conv.default_offset)
    model = conv.error_model(x.dtype, ref.n, ref.rows)
    expected = ref.exact(quantity)
    got_rows = np.asarray(got, np.float64).reshape(expected.shape)
    c = compare(quantity, got_rows, ref, model)
    return diagnosis.Observation(probe, quantity, x, shape, w, dy, eps, eps_val,
                                 conv.default_offset, got_rows, model, c.ratio, c.passed)


@pytest.fixture
def xw32(rng):
    x = rng.standard_normal((6, 64)).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(64)).astype(np.float32)
    return x, w


def rms32(x, w, eps=2.0**-23, divisor=None):
    """A float32 forward; ``divisor`` plants a wrong count (N − 1, 1) in the mean of squares."""
    n = x.shape[-1]
    ms = np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32) / np.float32(divisor or n)
    return (x / np.sqrt(ms + np.float32(eps)) * w).astype(np.float32)


def test_n_minus_1_is_named_and_falls_back_inside_the_bound(xw32):
    x, w = xw32
    obs = observe(rms32(x, w, divisor=x.shape[-1] - 1), x, 64, w)
    assert not obs.passed
    (d,) = diagnosis.diagnose([obs])
    assert d.code == "n_minus_1"
    assert d.evidence.ratio_after <= 1.0 < d.evidence.ratio_before
    assert d.evidence.cases == ["gaussian/float32/y"]


# ---- what each mutation is called ---------------------------------------------------------------

H = diagnosis.Hypothesis

_ONE_CODE = [
    (H(eps=1e-6), "eps_value"), (H(eps=0.0), "eps_value"),
    (H(eps_outside=True), "eps_outside_sqrt"),
    (H(centre_stat=True), "centred_statistic"),
    (H(divisor="N-1"), "n_minus_1"), (H(divisor="1"), "sum_not_mean"),
    (H(offset=1.0), "offset_weight"), (H(offset=-1.0), "offset_weight"),
    (H(stat_block=32), "tail_statistic"),
    (H(stat_group="last"), "wrong_axis"), (H(stat_group="rows"), "wrong_axis"),
    (H(precision="native"), "low_precision_accumulation"),
    (H(precision="sequential"), "low_precision_accumulation"),
    (H(as_float32=True), "float64_as_float32"),
    (H(rounding="double"), "double_rounding"), (H(rounding="trunc"), "truncation"),
    (H(offset_rounded=True), "offset_rounding"),
    (H(projection=0.0), "missing_projection"),
    (H(projection="N"), "projection_scale"), (H(projection=2.0), "projection_scale"),
    (H(projection=-1.0), "projection_scale"),
    (H(separate_terms=True), "separately_rounded_terms"),
    (H(dweight="from_x"), "dweight_from_x"), (H(dweight="times_w"), "dweight_times_weight"),
    (H(dweight="half_sum"), "low_precision_accumulation"),
    (H(dweight="prefix:3"), "dweight_reduction"), (H(dweight="suffix:2"), "dweight_reduction"),
    (H(dweight="features"), "dweight_reduction"),
]


@pytest.mark.parametrize("h,code", _ONE_CODE, ids=[f"{c}-{i}" for i, (_, c) in
                                                    enumerate(_ONE_CODE)])
def test_each_mutation_stands_for_its_code(h, code):
    assert h.codes() == [code]
    assert code in diagnosis.CODES


def test_the_correct_computation_has_no_code_and_codes_keep_the_family_order():
    assert diagnosis.CORRECT.codes() == []
    assert H(eps="a", eps_scope="all").codes() == ["eps_value"]       # scope alone: no code
    both = H(eps=1e-6, eps_outside=True, centre_stat=True, centre_num=True, divisor="N-1",
             offset=1.0, stat_block=64, stat_group="last", precision="native",
             as_float32=True, rounding="double", offset_rounded=True, projection=0.0,
             separate_terms=True, dweight="from_x")
    assert both.codes() == [
        "eps_value", "eps_outside_sqrt", "centred_statistic", "n_minus_1", "offset_weight",
        "tail_statistic", "wrong_axis", "low_precision_accumulation", "float64_as_float32",
        "double_rounding", "offset_rounding", "missing_projection", "separately_rounded_terms",
        "dweight_from_x"]


def test_the_backward_inherits_only_the_forward_fields():
    h = H(eps=1e-6, eps_scope="all", rounding="double", precision="native", offset=1.0,
          projection=0.0, separate_terms=True, dweight="prefix:2")
    assert h.forward_part() == H(eps=1e-6, eps_scope="all", rounding="double",
                                 precision="native", offset=1.0)


# ---- the decisions: explains, consistent, the greedy cover -------------------------------------

S = diagnosis.Score


@pytest.mark.parametrize("h,s,correct,expected", [
    (H(eps=1e-6), None, S(0.1, None), False),
    (H(eps=1e-6), S(1.5, None), S(3.0, None), False),              # closer is not inside
    (H(eps=1e-6), S(1.0, None), S(3.0, None), True),               # on the bound is inside
    (H(eps=1e-6), S(0.5, 0.9), None, True),                        # nothing to compare bits with
    (H(eps=1e-6), S(0.5, 0.9), S(3.0, None), True),
    (H(eps=1e-6), S(0.5, 0.8), S(3.0, 0.8), True),                 # as many bits as the correct
    (H(eps=1e-6), S(0.5, 0.79), S(3.0, 0.8), False),
    (H(eps=1e-6), S(0.5, 0.5, False), S(3.0, 0.6, False), False),
    # a cause that only adds a rounding must reproduce clearly more bits (2 points)
    (H(rounding="double"), S(0.5, 0.8 + 0.02), S(3.0, 0.8), True),
    (H(rounding="double"), S(0.5, 0.81), S(3.0, 0.8), False),
    (H(precision="native"), S(0.5, 0.81), S(3.0, 0.8), False),
    # on dx the forward's roundings do not change the bits; the backward's own ones must
    (H(rounding="double"), S(0.5, 0.5, False), S(3.0, 0.5, False), True),
    (H(separate_terms=True), S(0.5, 0.51, False), S(3.0, 0.5, False), False),
    (H(separate_terms=True), S(0.5, 0.5 + 0.02, False), S(3.0, 0.5, False), True),
    (H(dweight="half_sum"), S(0.5, 0.51, False), S(3.0, 0.5, False), False),
    (H(dweight="half_sum"), S(0.5, 0.5 + 0.02, False), S(3.0, 0.5, False), True),
])
def test_explains_means_inside_the_bound_and_at_least_the_bits_of_the_correct(h, s, correct,
                                                                               expected):
    assert diagnosis._explains(h, s, correct) is expected


def test_explains_on_half_y_needs_most_bits_reproduced():
    """On y (whose bits are expected to match) below MIN_MATCH explains nothing."""
    assert not diagnosis._explains(H(eps=1e-6), S(0.5, 0.74), S(3.0, 0.5))
    assert diagnosis._explains(H(eps=1e-6), S(0.5, 0.75), S(3.0, 0.5))
    assert diagnosis._explains(H(eps=1e-6), S(0.5, 0.2, False), S(3.0, 0.2, False))


def test_a_cause_must_stay_inside_the_bound_on_what_passed():
    a, b = object(), object()
    table = {a: S(1.0, None), b: S(0.2, None)}
    assert diagnosis._consistent(H(eps=1e-6), [a, b], lambda h, o: table[o])
    table[b] = S(1.01, None)
    assert not diagnosis._consistent(H(eps=1e-6), [a, b], lambda h, o: table[o])
    # a case the mutation does not apply to (None) does not contradict it
    assert diagnosis._consistent(H(eps=1e-6), [a, b], lambda h, o: None)
    assert diagnosis._consistent(H(eps=1e-6), [], lambda h, o: S(9.0, None))


class Case:
    """A stand-in for an Observation where only the search looks at it (its kind and dtype)."""

    def __init__(self, probe, dname="bfloat16", quantity="y"):
        self.probe, self.dname, self.quantity = probe, dname, quantity
        self.dtype = np.dtype(bfloat16) if dname == "bfloat16" else np.dtype(dname)


def table_scores(table):
    """scores(h, o) from {(h, o): Score}; the correct computation explains nothing."""
    return lambda h, o: table.get((h, o), S(5.0, None) if h == diagnosis.CORRECT else None)


def cover(cands, failing, passing, table):
    chosen, rest = diagnosis._cover(cands, failing, passing, table_scores(table))
    return [(c.h, c.explained) for c in chosen], rest


def test_cover_takes_the_cause_that_explains_most_then_the_next():
    c1, c2, c3 = Case("a"), Case("b"), Case("c")
    h1, h2, h3 = H(divisor="N-1"), H(eps_outside=True), H(divisor="1")
    t = {(h1, c1): S(0.5, None), (h1, c2): S(0.5, None), (h2, c1): S(0.5, None),
         (h3, c3): S(0.5, None), (h3, c1): S(2.0, None)}
    chosen, rest = cover([h2, h3, h1], [c1, c2, c3], [], t)
    assert chosen == [(h1, [c1, c2]), (h3, [c3])] and rest == []
    # nothing explains c3 any more: it is left over, and the correct computation is never a cause
    del t[(h3, c3)]
    t[(diagnosis.CORRECT, c3)] = S(0.1, None)
    chosen, rest = cover([diagnosis.CORRECT, h2, h3, h1], [c1, c2, c3], [], t)
    assert chosen == [(h1, [c1, c2])] and rest == [c3]


def _tie(first, second, s_first, s_second):
    c1, c2 = Case("a"), Case("b")
    t = {(first, c1): s_first, (first, c2): s_first, (second, c1): s_second,
         (second, c2): s_second}
    chosen, _ = cover([first, second], [c1, c2], [], t)
    return chosen[0][0]


def test_cover_breaks_ties_by_bits_then_simplicity_then_real_values_then_ratio():
    a, b = H(divisor="N-1"), H(eps_outside=True)
    assert _tie(a, b, S(0.5, 0.8), S(0.5, 0.9)) == b              # more bits reproduced
    assert _tie(a, b, S(0.5, 0.9), S(0.5, 0.8)) == a
    assert _tie(H(eps=1e-6, divisor="N-1"), a, S(0.5, None), S(0.5, None)) == a   # simpler
    assert _tie(H(eps=1.2345e-6), H(eps=1e-6), S(0.5, None), S(0.5, None)) == H(eps=1e-6)
    assert _tie(H(offset=0.7), H(offset=1.0), S(0.5, None), S(0.5, None)) == H(offset=1.0)
    assert _tie(a, b, S(0.9, None), S(0.3, None)) == b            # further inside the bound
    assert _tie(a, b, S(0.3, None), S(0.9, None)) == a


def test_cover_rejects_a_cause_that_breaks_a_passing_case_of_its_dtype():
    c1, c2 = Case("a"), Case("b")
    ok32, ok16 = Case("p", "float32"), Case("q")
    h1, h2 = H(divisor="N-1"), H(eps_outside=True)
    t = {(h1, c1): S(0.5, None), (h1, c2): S(0.5, None), (h2, c1): S(0.5, None),
         (h1, ok32): S(7.0, None), (h1, ok16): S(0.5, None), (h2, ok16): S(0.5, None)}
    # a float32 case it breaks says nothing about bfloat16 failures
    chosen, _ = cover([h2, h1], [c1, c2], [ok32, ok16], t)
    assert chosen == [(h1, [c1, c2])]
    t[(h1, ok16)] = S(1.5, None)
    chosen, rest = cover([h2, h1], [c1, c2], [ok32, ok16], t)
    assert chosen == [(h2, [c1])] and rest == [c2]


def test_spread_samples_every_kind_of_case_first():
    cases = [Case(p, d, q) for p in ("a", "b") for d in ("float32", "bfloat16")
             for q in ("y", "dx")]
    again = [Case(c.probe, c.dname, c.quantity) for c in cases]
    assert diagnosis._spread(cases + again) == cases             # one of each kind, the first
    many = [Case(f"p{i}") for i in range(20)]
    assert diagnosis._spread(many) == many[0:16:2]
    assert diagnosis._spread(many[:9]) == many[:8]
    assert diagnosis._spread(many, 16) == many[:16]
    assert diagnosis._spread(many[:8]) == many[:8]


@pytest.mark.parametrize("p,n,scale", [
    ("N", 64, 64.0), ("N/(N-1)", 64, 64 / 63), ("(N-1)/N", 64, 63 / 64), ("1/N", 64, 1 / 64),
    ("N/(N-1)", 2, 2.0), ("N/(N-1)", 1, np.inf), (0.5, 64, 0.5), (-1.0, 7, -1.0),
])
def test_projection_scales_resolve_per_case(p, n, scale):
    """The named scales of the path through rstd are the factors real mistakes put there."""
    assert diagnosis._projection(H(projection=p), n) == scale


def test_a_fitted_eps_snaps_to_a_named_value_within_one_percent():
    assert diagnosis._snap(1.009e-6) == 1e-6 and diagnosis._snap(0.991e-6) == 1e-6
    assert diagnosis._snap(1.011e-6) == 1.01e-6                   # 1.1 % away: kept, 3 digits
    assert diagnosis._snap(2.0**-23 * 1.005) == 2.0**-23
    assert diagnosis._snap(3.14159e-4) == 3.14e-4                 # no name near: 3 digits
    assert diagnosis._snap(0.0) == 0.0 and diagnosis._snap(5e-15) == 5e-15   # 0 has no 1 % band
