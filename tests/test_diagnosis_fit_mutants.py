"""rmsref.diagnosis, the fits and the predictions: a mistake planted in a few lines of NumPy, the
parameter fitted back from its output (an eps, a weight offset, the scale of the path through
rstd, the rows dweight covers) and the mutated reference's prediction of what the planted code
returns. Reference: the float64 oracle (rmsref.comparison.Reference); bounds: the convention's
rmsref.tolerance model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import rmsref
from rmsref import diagnosis
from rmsref import tolerance as tol
from rmsref._shapes import bfloat16

from .test_diagnosis_mutants import observe

H = diagnosis.Hypothesis


def rms64(x, w, eps, offset=0.0):
    """A float64 forward with the given eps and weight offset (the planted mistake)."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * (w + offset)


def planted_y(x, w, eps, *, outside=False, centred=False, centred_num=False, divisor=None):
    """A float64 forward with mistakes planted: eps outside the root, the mean removed from
    the statistic (and from the numerator), a divisor other than N."""
    mu = np.mean(x, axis=-1, keepdims=True)
    b = x - mu if centred else x                                  # what is squared
    a = x - mu if centred_num else x                              # the numerator
    s = np.sum(b * b, axis=-1, keepdims=True) / (x.shape[-1] if divisor is None else divisor)
    r = 1.0 / (np.sqrt(s) + eps) if outside else 1.0 / np.sqrt(s + eps)
    return a * r * w


def planted_dx(x, w, dy, eps, scale):
    """A float64 backward whose path through rstd is scaled by ``scale`` (1: correct)."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    g = dy * w                                                    # dxhat
    c = np.mean(g * xhat, axis=-1, keepdims=True)                 # the path through rstd
    return rstd * (g - scale * xhat * c)


#: (hypothesis, the keywords of planted_y that plant it)
FORWARD_MUTATIONS = [
    (H(eps_outside=True), {"outside": True}),
    (H(centre_stat=True), {"centred": True}),
    (H(centre_stat=True, centre_num=True), {"centred": True, "centred_num": True}),
    (H(divisor="N-1"), {"divisor": 63}),
    (H(divisor="1"), {"divisor": 1}),
]


# ---- fit_eps -----------------------------------------------------------------------------------


def test_fit_eps_recovers_a_planted_eps_from_rows_where_it_shows(rng):
    """Rows of mean square ~1e-4 with eps 1e-5 planted (1e-6 asked): the fitted eps is the
    planted one to 1e-9 relative (float64 outputs)."""
    x = 1e-2 * rng.standard_normal((6, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-5), x, 64, w, eps=1e-6)
    assert not obs.passed
    fitted = diagnosis.fit_eps([obs], diagnosis.CORRECT)
    assert abs(fitted - 1e-5) <= 1e-9 * 1e-5


def test_fit_eps_is_the_median_over_the_y_cases_only(rng):
    """A dx case listed first and one listed between two y cases are skipped, not the end of
    the fit: the eps comes from the y cases alone (their rows pin it to 1e-9 relative)."""
    x = 1e-2 * rng.standard_normal((6, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    dy = rng.standard_normal((6, 64))
    y = observe(rms64(x, w, 1e-5), x, 64, w, eps=1e-6)
    dx = observe(planted_dx(x, w, dy, 1e-6, 0.0), x, 64, w, eps=1e-6, quantity="dx", dy=dy)
    fitted = diagnosis.fit_eps([dx, y, dx, y], diagnosis.CORRECT)
    assert abs(fitted - 1e-5) <= 1e-9 * 1e-5
    assert diagnosis.fit_eps([dx], diagnosis.CORRECT) is None


def test_fit_eps_uses_only_rows_where_eps_is_visible(rng):
    """Rows of mean square ~1e-4 (eps 1e-5 is a tenth of it) pin eps; rows of mean square ~1e12
    give 1/rstd² − s = eps ± 1e-4, noise larger than eps: they outnumber the others and must
    be left out (the planted eps is recovered to 1e-9 relative)."""
    small = 1e-2 * rng.standard_normal((4, 64))
    big = 1e6 * rng.standard_normal((8, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    cases = [observe(rms64(x, w, 1e-5), x, 64, w, eps=1e-6) for x in (small, big)]
    v = diagnosis.fit_eps(cases, diagnosis.CORRECT)
    assert abs(v - 1e-5) <= 1e-9 * 1e-5
    # the big rows alone carry no eps at all
    assert diagnosis.fit_eps(cases[1:], diagnosis.CORRECT) is None


def test_fit_eps_on_rows_whose_squares_overflow_warns_nothing(rng):
    """Rows of |x| ~ 1e160 (x² overflows float64; the oracle's output for them, which is right)
    next to rows that pin eps: the fit leaves the huge rows out without a RuntimeWarning
    reaching the caller, and still finds the eps."""
    import warnings

    small = 1e-2 * rng.standard_normal((4, 64))
    huge = 1e160 * rng.standard_normal((2, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    cases = [observe(rms64(small, w, 1e-5), small, 64, w, eps=1e-6),
             observe(rmsref.rms_norm(huge, 64, w, 1e-6), huge, 64, w, eps=1e-6)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = diagnosis.fit_eps(cases, diagnosis.CORRECT)
    assert abs(v - 1e-5) <= 1e-9 * 1e-5


@pytest.mark.parametrize("ms_scale", [1e-6, 1e-4, 1e-3])
def test_fit_eps_needs_eps_above_a_thousandth_of_the_statistic(rng, ms_scale):
    """eps = 1e-5 on rows of mean square ms: seen when eps > 1e-3·ms (ms up to 1e-2), whatever
    the ratio of eps to ms below that (from 10 to 1e-2)."""
    x = np.sqrt(ms_scale) * rng.standard_normal((6, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-5), x, 64, w, eps=1e-6)
    v = diagnosis.fit_eps([obs], diagnosis.CORRECT)
    assert abs(v - 1e-5) <= 1e-8 * 1e-5


def test_a_negative_fitted_eps_is_no_eps(rng):
    """A kernel that subtracts 1e-5 from the mean of squares (rows of ms ~1e-4): the fit is
    negative, which no eps is, so there is no eps to report."""
    x = 1e-2 * rng.standard_normal((6, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, -1e-5), x, 64, w, eps=1e-6)
    assert diagnosis.fit_eps([obs], diagnosis.CORRECT) is None


@pytest.mark.parametrize("h,planted", FORWARD_MUTATIONS, ids=lambda v: "-".join(v.codes())
                         if isinstance(v, H) else "")
def test_fit_eps_recovers_eps_under_each_forward_mutation(rng, h, planted):
    """The eps of a planted kernel that also has mutation ``h``: the fit inverts the mutated
    rstd (eps outside the root, the variance, N − 1 or 1 for N) and finds 1e-5 to 1e-8."""
    x = 1e-2 * rng.standard_normal((6, 64)) + 3e-3
    w = 1 + 0.25 * rng.standard_normal(64)
    got = planted_y(x, w, 1e-5, **planted)
    obs = observe(got, x, 64, w, eps=1e-6)
    v = diagnosis.fit_eps([obs], h)
    assert abs(v - 1e-5) <= 1e-8 * 1e-5


def test_fit_eps_with_n_minus_1_on_two_columns_divides_by_one(rng):
    """N = 2: N − 1 = 1, so the planted kernel's statistic is the plain sum of squares."""
    x = 1e-3 * rng.standard_normal((8, 2))
    w = np.array([1.25, 0.75])
    got = x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-5) * w
    obs = observe(got, x, 2, w, eps=1e-6)
    v = diagnosis.fit_eps([obs], H(divisor="N-1"))
    assert abs(v - 1e-5) <= 1e-8 * 1e-5


# ---- _readback_rstd ----------------------------------------------------------------------------


def test_the_readback_is_the_rstd_the_kernel_used_row_by_row(rng):
    """y = x·rstd·w read back as y / (x·w): the planted rstd of each row, to 1e-14, on rows of
    small values (every |x·w| < 1) and with a zero element (0/0 is skipped)."""
    x = 1e-2 * rng.standard_normal((5, 32))
    x[2, 7] = 0.0
    w = 1 + 0.25 * rng.standard_normal(32)
    rstd = 10.0 ** np.arange(5)[:, None]
    obs = observe(x * rstd * w, x, 32, w, eps=1e-6)
    r = diagnosis._readback_rstd(obs, diagnosis.CORRECT)
    assert r.shape == (5, 1)
    np.testing.assert_allclose(r, rstd, rtol=1e-14)


def test_the_readback_of_an_all_zero_row_is_nan(rng):
    """A row of zeros carries no rstd: nan there, the planted value on the other rows."""
    x = rng.standard_normal((3, 16))
    x[1] = 0.0
    w = 1 + 0.25 * rng.standard_normal(16)
    obs = observe(2.0 * x * w, x, 16, w, eps=1e-6)
    r = diagnosis._readback_rstd(obs, diagnosis.CORRECT)
    assert np.isnan(r[1, 0])
    np.testing.assert_allclose(r[[0, 2], 0], 2.0, rtol=1e-14)


def test_the_readback_divides_by_the_mutation_s_numerator_and_weight(rng):
    """Under the mean removed from the numerator and a weight offset of one, y = (x − μ)·r·(w+1)
    reads back r exactly, where plain x·w would not."""
    x = rng.standard_normal((4, 16)) + 0.5
    w = 0.25 * rng.standard_normal(16)
    r = np.array([[0.5], [1.0], [2.0], [4.0]])
    got = (x - x.mean(axis=-1, keepdims=True)) * r * (w + 1.0)
    obs = observe(got, x, 16, w, eps=1e-6)
    back = diagnosis._readback_rstd(obs, H(centre_num=True, offset=1.0))
    np.testing.assert_allclose(back, r, rtol=1e-13)


def test_the_readback_skips_vanishing_denominators_and_non_finite_quotients(rng):
    """Ten of sixteen weights are 1e-300. Row 0: where x·w underflows to a subnormal (1e-320)
    the kernel left a subnormal 1e-310 (a finite but meaningless quotient 1e10); row 1: the
    kernel returned nan in four of the other places. Both are skipped, and each row reads back
    its rstd, 3, from what is left."""
    x = rng.standard_normal((2, 16))
    w = 1 + 0.25 * rng.standard_normal(16)
    w[:10] = 1e-300
    x[0, :10] = 1e-20                                         # x·w = 1e-320, a subnormal
    got = 3.0 * x * w
    got[0, :10] = 1e-310                                      # what a kernel left there
    got[1, 10:14] = np.nan
    obs = observe(3.0 * x * w, x, 16, w, eps=1e-6)
    obs.got = got
    np.testing.assert_allclose(diagnosis._readback_rstd(obs, diagnosis.CORRECT), 3.0,
                               rtol=1e-14)


def test_the_readback_divides_by_the_convention_s_own_offset(rng):
    """Gemma's convention stores w and multiplies by 1 + w; a kernel that used 2 + w reads
    back its rstd under the hypothesis offset = 1 (1 + 1 + w), not under 0 + 1 + w."""
    x = rng.standard_normal((3, 16))
    w = 0.25 * rng.standard_normal(16)
    r = np.array([[0.5], [1.0], [2.0]])
    obs = observe(x * r * (w + 2.0), x, 16, w, eps=1e-6, convention="gemma")
    assert obs.offset == 1.0
    np.testing.assert_allclose(diagnosis._readback_rstd(obs, H(offset=1.0)), r, rtol=1e-13)


def test_the_fits_warn_of_nothing_on_zero_rows_and_zero_outputs(rng):
    """A row of zeros (0/0 in the readback, x̂ = 0 in the offset fit) and a kernel that returns
    zeros for a row of ordinary values (rstd read back as 0: 1/0 in the eps fit): the fits
    judge those elements themselves and spill no RuntimeWarning; the other rows still give
    eps = 1e-5 and δ = 1."""
    import warnings

    x = 1e-2 * rng.standard_normal((6, 64))
    x[1] = 0.0
    w = 0.25 * rng.standard_normal(64)
    got = rms64(x, w, 1e-5, offset=1.0)
    got[4] = 0.0
    obs = observe(got, x, 64, w, eps=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = diagnosis._readback_rstd(obs, diagnosis.CORRECT)
        eps = diagnosis.fit_eps([obs], H(offset=1.0))
        offset = diagnosis.fit_offset([obs])
    assert np.isnan(r[1, 0]) and r[4, 0] == 0.0
    assert abs(eps - 1e-5) <= 1e-9 * 1e-5
    assert offset == 1.0


def test_a_row_without_an_rstd_to_read_is_left_out_of_the_eps_fit(rng):
    """A row of zeros reads back no rstd (nan): it is no evidence, and the eps fitted from the
    other rows is the planted 1e-5 to 1e-9, as without it."""
    x = 1e-2 * rng.standard_normal((5, 64))
    x[2] = 0.0
    w = 1 + 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-5), x, 64, w, eps=1e-6)
    v = diagnosis.fit_eps([obs], diagnosis.CORRECT)
    assert abs(v - 1e-5) <= 1e-9 * 1e-5


# ---- fit_offset --------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [1.0, -1.0, 2.0])
def test_fit_offset_recovers_a_whole_offset_on_the_weight(rng, offset):
    """y = x̂·(w + δ): δ recovered exactly, as the whole number it is."""
    x = rng.standard_normal((6, 64))
    w = 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-6, offset=offset), x, 64, w, eps=1e-6)
    assert diagnosis.fit_offset([obs]) == offset


def test_fit_offset_uses_the_reference_eps(rng):
    """Rows of mean square ~1e-5 with eps 1e-5: x̂ depends on eps as much as on x, so δ = 1 is
    found only when x̂ is formed with the eps the reference used."""
    x = 3e-3 * rng.standard_normal((6, 64))
    w = 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-5, offset=1.0), x, 64, w, eps=1e-5)
    assert diagnosis.fit_offset([obs]) == 1.0


def test_a_correct_weight_or_a_fractional_offset_is_no_offset(rng):
    """No offset (δ = 0), and δ = 1.3, 0.5 or 0.9 (0.05 or more from a whole number: not the
    1 + w convention) fit no offset."""
    x = rng.standard_normal((6, 64))
    w = 0.25 * rng.standard_normal(64) + 1.0
    for offset in (0.0, 1.3, 0.5, 0.9):
        obs = observe(rms64(x, w, 1e-6, offset=offset), x, 64, w, eps=1e-6)
        assert diagnosis.fit_offset([obs]) is None, offset


def test_fit_offset_skips_cases_without_a_weight_and_backward_cases(rng):
    """A larger correct case without a weight (no offset to get wrong), a dx case and a y case
    listed first or between: the offset of the one weighted y case is found all the same."""
    x = rng.standard_normal((6, 64))
    w = 0.25 * rng.standard_normal(64)
    dy = rng.standard_normal((6, 64))
    xs = rng.standard_normal((24, 64))
    plain = observe(rms64(xs, 1.0, 1e-6), xs, 64, None, eps=1e-6)
    dx = observe(planted_dx(x, w, dy, 1e-6, 1.0), x, 64, w, eps=1e-6, quantity="dx", dy=dy)
    y = observe(rms64(x, w, 1e-6, offset=1.0), x, 64, w, eps=1e-6)
    assert diagnosis.fit_offset([plain, dx, y, plain]) == 1.0
    assert diagnosis.fit_offset([plain, dx]) is None


def test_fit_offset_reads_only_where_x_hat_is_not_small(rng):
    """A kernel y = x̂·(w + 1) that flushes its small outputs to zero, on rows where most
    elements have |x̂| < 0.1: those elements say nothing of the offset and are skipped."""
    x = rng.standard_normal((4, 64))
    x[:, :40] *= 1e-3
    w = 0.25 * rng.standard_normal(64)
    got = rms64(x, w, 1e-6, offset=1.0)
    got[:, :40] = 0.0
    obs = observe(got, x, 64, w, eps=1e-6)
    assert diagnosis.fit_offset([obs]) == 1.0


def test_fit_offset_forms_x_hat_with_each_row_s_own_rstd(rng):
    """Rows of magnitudes 1e-2 to 1e2: x̂ uses each row's mean square (one mean over the batch
    would be off by up to 1e4 on a row) and δ = 1 is found."""
    x = rng.standard_normal((5, 64)) * 10.0 ** np.arange(-2, 3)[:, None]
    w = 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-6, offset=1.0), x, 64, w, eps=1e-6)
    assert diagnosis.fit_offset([obs]) == 1.0


def test_fit_offset_is_measured_from_the_convention_s_own_offset(rng):
    """Under Gemma's convention (1 + w expected) a kernel that used 2 + w is one off: δ = 1;
    one that used 1 + w as expected is not off at all."""
    x = rng.standard_normal((4, 64))
    w = 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-6, offset=2.0), x, 64, w, eps=1e-6, convention="gemma")
    assert diagnosis.fit_offset([obs]) == 1.0
    obs = observe(rms64(x, w, 1e-6, offset=1.0), x, 64, w, eps=1e-6, convention="gemma")
    assert diagnosis.fit_offset([obs]) is None


def test_fit_offset_on_rows_of_equal_magnitudes(rng):
    """Rows of ±c (a sign pattern): |x̂| = 1 in every element, all of them evidence, δ = 1."""
    x = np.sign(rng.standard_normal((4, 64))) * np.array([[0.5], [1.0], [2.0], [3.0]])
    w = 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-6, offset=1.0), x, 64, w, eps=1e-6)
    assert diagnosis.fit_offset([obs]) == 1.0


# ---- fit_projection ----------------------------------------------------------------------------


def _dx_case(rng, rows, n, scale, eps=1e-6):
    x = rng.standard_normal((rows, n))
    w = 1 + 0.25 * rng.standard_normal(n)
    dy = rng.standard_normal((rows, n))
    return observe(planted_dx(x, w, dy, eps, scale), x, n, w, eps=eps, quantity="dx", dy=dy)


@pytest.mark.parametrize("scale", [0.0, 2.0, 0.5, -1.0, 64.0, 1.0])
def test_fit_projection_recovers_the_planted_scale(rng, scale):
    """dx = direct − s·through planted with s: the least-squares s over two dx cases of
    different sizes is s to 1e-12 (float64 dx)."""
    cases = [_dx_case(rng, 6, 64, scale), _dx_case(rng, 3, 48, scale)]
    assert abs(diagnosis.fit_projection(cases, diagnosis.CORRECT) - scale) <= 1e-12


def test_fit_projection_pools_the_cases_it_can_predict(rng):
    """A y case listed first, and a case the base mutation does not apply to (the last-dim
    statistic on a 1-D shape), are skipped; the two dx cases after them give s."""
    y = observe(rms64(np.ones((2, 8)), 1.0, 1e-6), np.ones((2, 8)), 8, None, eps=1e-6)
    flat = _dx_case(rng, 4, 16, 2.0)
    x = rng.standard_normal((3, 4, 8))
    w = 1 + 0.25 * rng.standard_normal((4, 8))
    dy = rng.standard_normal((3, 4, 8))
    # the statistic over the last dim only: per (row, group of 8)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    xhat, g = x * rstd, dy * w
    dx = rstd * (g - 2.0 * xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    grouped = observe(dx, x, (4, 8), w, eps=1e-6, quantity="dx", dy=dy)
    base = H(stat_group="last")
    assert abs(diagnosis.fit_projection([y, flat, grouped, grouped], base) - 2.0) <= 1e-12


def test_fit_projection_has_nothing_to_fit_without_a_dx_case(rng):
    """Only y cases, or none: no scale."""
    x = rng.standard_normal((2, 8))
    y = observe(rms64(x, 1.0, 1e-6), x, 8, None, eps=1e-6)
    assert diagnosis.fit_projection([y], diagnosis.CORRECT) is None
    assert diagnosis.fit_projection([], diagnosis.CORRECT) is None


def test_fit_projection_skips_rows_the_kernel_returned_nan_for(rng):
    """A row of zeros with eps = 0 is 0/0 in every formula (predictions and kernel alike), and
    the kernel returned nan on a row the predictions have numbers for: both are left out and
    the other rows give s = 2 to 1e-12."""
    x = rng.standard_normal((5, 16))
    x[1] = 0.0
    w = 1 + 0.25 * rng.standard_normal(16)
    dy = rng.standard_normal((5, 16))
    with np.errstate(all="ignore"):
        got = planted_dx(x, w, dy, 0.0, 2.0)
        got[3] = np.nan
        obs = observe(got, x, 16, w, eps=0.0, quantity="dx", dy=dy)
    assert np.isnan(got[1]).all()
    assert abs(diagnosis.fit_projection([obs], diagnosis.CORRECT) - 2.0) <= 1e-12


# ---- _snap_scale -------------------------------------------------------------------------------


@pytest.mark.parametrize("s,ns,expected", [
    (63.7, [64], [64.0, 2.0, 64 / 63]),                      # N
    (1.0161, [64], [64 / 63, 63 / 64, 0.5]),             # N/(N−1) first
    (0.9843, [64], [63 / 64, 64 / 63, 0.5]),             # (N−1)/N first
    (0.0158, [64], [1 / 64, 0.0, 0.5]),                  # 1/N
    (-0.9, [8, 64], [-1.0, 0.0, 1 / 64]),                # the fixed scales, any N
    (1.9, [2], [2.0, 0.5, 0.0]),                         # N = 2: N/(N−1) = N = 2, (N−1)/N = ½
    (0.9, [1], [1.0, 0.5, 0.0]),                         # N = 1: N/max(N−1, 1) = 1
])
def test_snap_scale_offers_the_three_nearest_exact_scales_then_the_fit(s, ns, expected):
    """The candidates near a fitted scale s are the three values real bugs produce nearest to
    it (for every N of the cases), then s itself."""
    assert diagnosis._snap_scale(s, ns) == [*expected, s]


def test_snap_scale_does_not_repeat_a_fit_that_is_exact():
    """A fit equal to an exact scale is offered once."""
    assert diagnosis._snap_scale(2.0, [64]) == [2.0, 64 / 63, 63 / 64]
    assert diagnosis._snap_scale(64.0, [64]) == [64.0, 2.0, 64 / 63]


# ---- fit_dweight_rows --------------------------------------------------------------------------


def _dweight_case(rng, rows, n, keep, eps=1e-6, scale=1.0):
    """dweight summed over the rows ``keep`` selects (a slice), of x scaled by ``scale``."""
    x = scale * rng.standard_normal((rows, n))
    w = 1 + 0.25 * rng.standard_normal(n)
    dy = rng.standard_normal((rows, n))
    xhat = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    dw = np.sum((dy * xhat)[keep], axis=0)
    return observe(dw, x, n, w, eps=eps, quantity="dweight", dy=dy)


def test_dweight_over_a_prefix_of_the_rows_is_found(rng):
    """dweight summed over the first 4 of 6 rows: "prefix:4" is among the fits, and the
    hypothesis it names reproduces the kernel's dweight inside the bound."""
    obs = _dweight_case(rng, 6, 32, slice(0, 4))
    fits = diagnosis.fit_dweight_rows([obs])
    assert "prefix:4" in fits
    assert diagnosis.score(H(dweight="prefix:4"), obs).ratio <= 1.0
    assert fits == sorted(set(fits))


def test_dweight_over_a_suffix_of_the_rows_is_found(rng):
    """dweight summed over the last 2 of 6 rows, on rows of mean square 1e-6 with eps 1e-6
    (x̂ depends on eps): "suffix:2" is among the fits."""
    obs = _dweight_case(rng, 6, 32, slice(4, 6), scale=1e-3)
    fits = diagnosis.fit_dweight_rows([obs])
    assert "suffix:2" in fits
    assert diagnosis.score(H(dweight="suffix:2"), obs).ratio <= 1.0


def test_dweight_over_a_suffix_of_rows_of_growing_magnitude_is_that_suffix_alone(rng):
    """Rows of magnitudes 1e-3 to 1e2, dweight over the last 2: the suffix is read from the
    last row up, with each row's own rstd, and no prefix comes close (the best is all rows)."""
    x = rng.standard_normal((6, 32)) * 10.0 ** np.arange(-3, 3)[:, None]
    w = 1 + 0.25 * rng.standard_normal(32)
    dy = rng.standard_normal((6, 32)) * 10.0 ** np.arange(6)[:, None]
    xhat = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    obs = observe(np.sum((dy * xhat)[4:], axis=0), x, 32, w, eps=1e-6, quantity="dweight",
                  dy=dy)
    assert diagnosis.fit_dweight_rows([obs]) == ["suffix:2"]


def test_dweight_on_rows_far_below_eps_is_fitted_with_eps(rng):
    """Rows of mean square 1e-10 with eps = 1e-6: x̂ = x/sqrt(eps) nearly, and the last two
    rows are found (without eps, or with −eps, x̂ is off by orders of magnitude or nan)."""
    obs = _dweight_case(rng, 6, 32, slice(4, 6), scale=1e-5)
    assert "suffix:2" in diagnosis.fit_dweight_rows([obs])


def test_dweight_over_the_first_row_alone_is_a_prefix_of_one(rng):
    """dweight of row 0 only: "prefix:1"."""
    obs = _dweight_case(rng, 5, 16, slice(0, 1))
    assert "prefix:1" in diagnosis.fit_dweight_rows([obs])


def test_a_dweight_over_every_row_names_no_partial_reduction(rng):
    """The correct sum over all rows fits no prefix or suffix (both best at k = rows); y and
    dx cases are not read."""
    obs = _dweight_case(rng, 6, 32, slice(0, 6))
    dx = _dx_case(rng, 6, 32, 1.0)
    assert diagnosis.fit_dweight_rows([obs, dx]) == []
    assert diagnosis.fit_dweight_rows([dx, _dweight_case(rng, 6, 32, slice(0, 3))])[0] == \
        "prefix:3"


# ---- predict: the mutated forward against the same mistake planted in NumPy --------------------


def _stat_block_y(x, w, eps):
    """The statistic skips the last partial block of 32 columns (N = 72: columns 64..71)."""
    ms = np.sum(x[:, :64] ** 2, axis=-1, keepdims=True) / x.shape[-1]
    return x / np.sqrt(ms + eps) * w


def _batch_axis_y(x, w, eps):
    """The statistic over the batch axis: one mean of squares per column."""
    return x / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps) * w


#: (hypothesis, planted float64 forward f(x, w, eps) of x (6, 72) and w (72,), eps 1e-3)
PLANTED_Y = [
    (H(eps_outside=True), lambda x, w, e: planted_y(x, w, e, outside=True)),
    (H(centre_stat=True), lambda x, w, e: planted_y(x, w, e, centred=True)),
    (H(centre_stat=True, centre_num=True),
     lambda x, w, e: planted_y(x, w, e, centred=True, centred_num=True)),
    (H(centre_num=True), lambda x, w, e: planted_y(x, w, e, centred_num=True)),
    (H(divisor="N-1"), lambda x, w, e: planted_y(x, w, e, divisor=71)),
    (H(divisor="1"), lambda x, w, e: planted_y(x, w, e, divisor=1)),
    (H(eps=1e-5, eps_scope="all"), lambda x, w, e: planted_y(x, w, 1e-5)),
    (H(eps=0.0, eps_scope="all"), lambda x, w, e: planted_y(x, w, 0.0)),
    (H(offset=1.0), lambda x, w, e: planted_y(x, w + 1.0, e)),
    (H(offset=-1.0), lambda x, w, e: planted_y(x, w - 1.0, e)),
    (H(stat_block=32), _stat_block_y),
    (H(stat_group="rows"), _batch_axis_y),
]


def _ids(cases):
    return ["-".join(c[0].codes()) + f"-{i}" for i, c in enumerate(cases)]


@pytest.mark.parametrize("h,planted", PLANTED_Y, ids=_ids(PLANTED_Y))
def test_the_mutated_forward_is_the_planted_one(rng, h, planted):
    """In float64, the prediction of mutation ``h`` is the planted kernel's output to 1e-13
    relative, and it explains the case (ratio <= 1) where the correct reference does not.
    Rows of mean 0.5 (so removing the mean matters) and mean square ~1e-2 (so eps 1e-3
    matters)."""
    x = 0.1 * (rng.standard_normal((6, 72)) + 0.5)
    w = 1 + 0.25 * rng.standard_normal(72)
    got = planted(x, w, 1e-3)
    obs = observe(got, x, 72, w, eps=1e-3)
    assert not obs.passed
    pred = diagnosis.predict(h, obs)
    np.testing.assert_allclose(pred.exact, got, rtol=1e-13, atol=0)
    assert pred.emulated is None                                  # no bits to emulate in float64
    assert diagnosis.score(h, obs).ratio <= 1.0
    if not (h.centre_stat or h.centre_num):                       # no cancellation to allow for
        np.testing.assert_allclose(pred.bound, tol.bound_y(pred.exact, obs.model), rtol=1e-12)


def test_the_last_dim_statistic_is_one_mean_per_group_of_the_last_dim(rng):
    """normalized_shape (4, 8) with the statistic over the last 8 only: predicted exactly."""
    x = rng.standard_normal((3, 4, 8)) + 0.5
    w = 1 + 0.25 * rng.standard_normal((4, 8))
    got = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-3) * w
    obs = observe(got, x, (4, 8), w, eps=1e-3)
    assert not obs.passed
    pred = diagnosis.predict(H(stat_group="last"), obs)
    np.testing.assert_allclose(pred.exact, got.reshape(3, 32), rtol=1e-13, atol=0)


def test_a_weightless_kernel_has_no_offset_to_get_wrong(rng):
    """Without a weight the offset mutation predicts x̂ itself (the correct output)."""
    x = rng.standard_normal((4, 16))
    got = planted_y(x, 1.0, 1e-6)
    obs = observe(got, x, 16, None, eps=1e-6)
    np.testing.assert_allclose(diagnosis.predict(H(offset=1.0), obs).exact, got, rtol=1e-14)


def test_float64_computed_in_float32_is_predicted_in_float32(rng):
    """A float64 kernel that computes in float32: its output, to float32's bound; the same
    mutation does not apply to a float32 case."""
    x = rng.standard_normal((6, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    got = (x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(1e-6)) * w32)
    obs = observe(got.astype(np.float64), x, 64, w, eps=1e-6)
    assert not obs.passed
    h = H(as_float32=True)
    pred = diagnosis.predict(h, obs)
    exact = x32.astype(np.float64) / np.sqrt(np.mean(x32.astype(np.float64) ** 2, axis=-1,
                                                     keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(pred.exact, exact, rtol=1e-14)
    assert diagnosis.score(h, obs).ratio <= 1.0
    f32 = np.dtype(F32)                                           # float32's bound, not float64's
    model = replace(obs.model, out_dtype=f32, acc_dtype=f32)
    np.testing.assert_allclose(pred.bound, tol.bound_y(pred.exact, model), rtol=1e-12)
    obs32 = observe(got, x32, 64, w32, eps=1e-6)
    assert diagnosis.predict(h, obs32) is None


# ---- predict: the mutated backward is the derivative of the mutated forward --------------------


def _perturbed(obs, x=None, w=None):
    return replace(obs, x=obs.x if x is None else x, weight=obs.weight if w is None else w,
                   _cache={})


#: the forward mutations whose backward the family derives (float64: no roundings)
DERIVED = [H(), H(eps_outside=True), H(centre_stat=True), H(centre_num=True),
           H(centre_stat=True, centre_num=True), H(divisor="N-1"), H(divisor="1"),
           H(offset=1.0), H(stat_block=32), H(stat_group="rows"), H(eps=0.0, eps_scope="all")]


@pytest.mark.parametrize("h", DERIVED, ids=lambda h: "-".join(h.codes()) or "correct")
def test_the_mutated_backward_is_the_derivative_of_the_mutated_forward(rng, h):
    """For L = Σ dy·y(x, w) with y the mutation's predicted forward: the predicted dx and
    dweight match central differences of L along a random direction (to 1e-7 relative)."""
    x = 0.1 * (rng.standard_normal((5, 72)) + 0.5)
    w = 1 + 0.25 * rng.standard_normal(72)
    dy = rng.standard_normal((5, 72))
    y_obs = observe(planted_y(x, w, 1e-3), x, 72, w, eps=1e-3)
    zero = np.zeros((5, 72))
    dx = diagnosis.predict(h, observe(zero, x, 72, w, eps=1e-3, quantity="dx", dy=dy)).exact
    dw = diagnosis.predict(h, observe(zero[:1], x, 72, w, eps=1e-3, quantity="dweight",
                                      dy=dy)).exact

    def loss(xv, wv):
        return float(np.sum(dy * diagnosis.predict(h, _perturbed(y_obs, xv, wv)).exact))

    step = 1e-6
    vx, vw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    fd_x = (loss(x + step * vx, w) - loss(x - step * vx, w)) / (2 * step)
    fd_w = (loss(x, w + step * vw) - loss(x, w - step * vw)) / (2 * step)
    assert abs(np.sum(dx * vx) - fd_x) <= 1e-7 * np.sum(np.abs(dx * vx))
    assert abs(np.sum(dw * vw) - fd_w) <= 1e-7 * np.sum(np.abs(dw * vw))


# ---- predict on 16-bit outputs: the roundings a mutation adds, emulated bit for bit -----------

BF16 = np.dtype(bfloat16)
F32 = np.float32


def _half_case(rng, dtype=BF16, rows=64, n=256, scale=1.0):
    x = (scale * rng.standard_normal((rows, n))).astype(dtype)
    w = (1 + 0.25 * rng.standard_normal(n)).astype(dtype)
    return x, w


def _xhat32(x, eps):
    xf = x.astype(F32)
    return xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + F32(eps))


def _llama_order(x, w, eps):
    """x̂ rounded to the input dtype before the weight multiplies it."""
    return (_xhat32(x, eps).astype(x.dtype).astype(F32) * w.astype(F32)).astype(x.dtype)


def _truncating_pack(x, w, eps):
    """float32 -> bfloat16 by dropping the low 16 bits (a hand-written pack)."""
    y = np.ascontiguousarray(_xhat32(x, eps) * w.astype(F32))
    return (y.view(np.uint32) & np.uint32(0xFFFF0000)).view(F32).astype(x.dtype)


def _no_upcast(rsqrt_of_rounded_sqrt):
    """The whole forward in the input dtype (each operation rounded to it), the mean's sum in
    float32; rsqrt rounded once, or sqrt rounded and then 1/· rounded (torch's half rsqrt)."""
    def f(x, w, eps):
        dt = x.dtype
        x2 = x * x                                                  # R_t(x²)
        ms = (np.sum(x2.astype(F32), axis=-1, keepdims=True) / F32(x.shape[-1])).astype(dt)
        s_eps = (ms.astype(F32) + F32(eps)).astype(dt)
        q = np.sqrt(s_eps.astype(F32))
        r = (F32(1) / q.astype(dt).astype(F32) if rsqrt_of_rounded_sqrt
             else F32(1) / q).astype(dt)
        return (x * r) * w                                          # R_t(x·r), then R_t(·w)
    return f


def _sequential_acc(x, w, eps):
    """acc += x·x in the input dtype, then a float32 rstd and output (bf16_acc)."""
    acc = np.zeros((x.shape[0], 1), x.dtype)
    for j in range(x.shape[-1]):
        acc += x[:, j:j + 1] * x[:, j:j + 1]
    ms = acc.astype(F32) / F32(x.shape[-1])
    return (x.astype(F32) / np.sqrt(ms + F32(eps)) * w.astype(F32)).astype(x.dtype)


#: (hypothesis, planted 16-bit forward f(x, w, eps), the output roundings it adds)
PLANTED_HALF = [
    (H(rounding="double"), _llama_order, 1),
    (H(rounding="trunc"), _truncating_pack, 1),
    (H(precision="native"), _no_upcast(False), 2),
    (H(precision="native_div"), _no_upcast(True), 2),
    (H(precision="sequential"), _sequential_acc, 0),
]


@pytest.mark.parametrize("h,planted,k_extra", PLANTED_HALF, ids=_ids(PLANTED_HALF))
def test_a_16_bit_mutation_reproduces_the_planted_kernel_s_bits(rng, h, planted, k_extra):
    """bfloat16, N = 256: the mutation's emulated output equals the planted kernel's on at
    least 95 % of the elements (the correct computation's on fewer), its exact value is inside
    its bound, and that bound is the tolerance model's with the mutation's extra roundings (and
    the statistic's sums in bfloat16 for a low-precision statistic)."""
    x, w = _half_case(rng)
    eps = 2.0**-23
    got = planted(x, w, eps)
    obs = observe(got, x, 256, w)
    pred = diagnosis.predict(h, obs)
    same = np.mean(pred.emulated == obs.got)
    assert same >= 0.95
    s, correct = diagnosis.score(h, obs), diagnosis.score(diagnosis.CORRECT, obs)
    assert s.ratio <= 1.0 and s.match == same > correct.match
    model = replace(obs.model, k_out=obs.model.k_out + k_extra,
                    acc_dtype=BF16 if h.precision else obs.model.acc_dtype)
    np.testing.assert_array_equal(pred.bound, tol.bound_y(pred.exact, model))


@pytest.mark.parametrize("h", [H(rounding="double"), H(rounding="trunc"),
                               H(precision="native"), H(precision="sequential")], ids=str)
def test_16_bit_mutations_do_not_apply_to_float32(rng, h):
    """Last-bit effects of 16-bit types: no prediction for a float32 case."""
    x = rng.standard_normal((4, 32)).astype(F32)
    obs = observe(_xhat32(x, 1e-6), x, 32, None, eps=1e-6)
    assert diagnosis.predict(h, obs) is None


def test_the_correct_16_bit_output_is_emulated_by_one_rounding(rng):
    """The correct computation on bfloat16: the float64 value rounded once, which a float32
    kernel reproduces on at least 95 % of the elements; its bound is the model's own."""
    x, w = _half_case(rng)
    got = (_xhat32(x, 2.0**-23) * w.astype(F32)).astype(BF16)
    obs = observe(got, x, 256, w)
    pred = diagnosis.predict(diagnosis.CORRECT, obs)
    assert np.mean(pred.emulated == obs.got) >= 0.95
    np.testing.assert_array_equal(pred.bound, tol.bound_y(pred.exact, obs.model))


def test_a_weight_offset_rounded_in_the_weight_s_dtype_is_reproduced(rng):
    """Gemma's 1 + w formed in bfloat16 (rounded) where the convention keeps it exact: the
    mutation predicts the kernel's bits (>= 95 %) and one more rounding in its bound."""
    x, w = _half_case(rng)
    w = (0.05 * rng.standard_normal(256)).astype(BF16)             # 1 + w loses w's low bits
    got = (_xhat32(x, 1e-6) * (F32(1) + w.astype(F32)).astype(BF16).astype(F32)).astype(BF16)
    obs = observe(got, x, 256, w, eps=1e-6, convention="gemma")
    h = H(offset_rounded=True)
    pred = diagnosis.predict(h, obs)
    assert np.mean(pred.emulated == obs.got) >= 0.95
    assert diagnosis.score(h, obs).ratio <= 1.0
    # no offset to round: without a weight, with a float32 weight, or with offset 0
    assert diagnosis.predict(h, observe(got, x, 256, None, eps=1e-6, convention="gemma")) is None
    w32 = w.astype(F32)
    assert diagnosis.predict(h, observe(got, x, 256, w32, eps=1e-6, convention="gemma")) is None
    assert diagnosis.predict(h, observe(got, x, 256, w, eps=1e-6)) is None


def test_a_centred_statistic_s_bound_grows_with_the_cancellation(rng):
    """A float32 LayerNorm-style kernel (x − μ, the variance) on rows of mean 10 and deviation
    0.1: removing the mean cancels about 10 bits, and the centred mutation's bound widens to
    hold the kernel's float32 output (ratio <= 1) where the plain bound would not."""
    x = (10.0 + 0.1 * rng.standard_normal((8, 256))).astype(F32)
    w = (1 + 0.25 * rng.standard_normal(256)).astype(F32)
    mu = np.mean(x, axis=-1, keepdims=True, dtype=F32)
    a = x - mu
    var = np.mean(a * a, axis=-1, keepdims=True, dtype=F32)
    got = a / np.sqrt(var + F32(1e-6)) * w
    obs = observe(got, x, 256, w, eps=1e-6)
    h = H(centre_stat=True, centre_num=True)
    pred = diagnosis.predict(h, obs)
    assert diagnosis.score(h, obs).ratio <= 1.0
    plain = tol.bound_y(pred.exact, obs.model)
    assert np.max(tol.abs_error(obs.got, pred.exact) / plain) > 1.0


# ---- predict: the backward's bound and the backward's own 16-bit mistakes ----------------------


def _bwd_half_case(rng, rows=16, n=128):
    x, w = _half_case(rng, rows=rows, n=n)
    dy = rng.standard_normal((rows, n)).astype(BF16)
    return x, w, dy


def _terms_size(x, w, dy, eps, scale=1.0):
    """M_i = rstd·|w_i·dy_i| + |s|·rstd·|x̂_i|·Σ_j |x̂_j·w_j·dy_j| / N: the size of dx's two
    terms before they cancel (rmsref.tolerance's M, the path through rstd scaled by s)."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat, g = x * rstd, dy * w
    return rstd * np.abs(g) + abs(scale) * rstd * np.abs(xhat) * np.mean(np.abs(g * xhat),
                                                                          axis=-1, keepdims=True)


@pytest.mark.parametrize("h,k_extra,scale", [
    (diagnosis.CORRECT, 0, 1.0), (H(rounding="double"), 1, 1.0), (H(rounding="trunc"), 1, 1.0),
    (H(projection=2.0), 0, 2.0), (H(projection=-1.0), 0, -1.0), (H(projection="N"), 0, 128.0),
    (H(separate_terms=True), 1, 1.0),
], ids=lambda v: str(v) if not isinstance(v, H) else "-".join(v.codes()) or "correct")
def test_the_dx_bound_is_the_model_s_for_the_size_of_the_mutation_s_terms(rng, h, k_extra,
                                                                          scale):
    """bfloat16 dx: the bound is rmsref.tolerance's eq. (dx) for the size of the mutation's own
    two terms (the path through rstd scaled by |s|) with one more output rounding per rounding
    the mutation adds (autograd replays the forward's roundings; dx's terms rounded apart)."""
    x, w, dy = _bwd_half_case(rng)
    eps = 2.0**-23
    obs = observe(np.zeros((16, 128)), x, 128, w, quantity="dx", dy=dy)
    pred = diagnosis.predict(h, obs)
    model = replace(obs.model, k_out=obs.model.k_out + k_extra)
    m = _terms_size(x, w, dy, eps, scale)
    np.testing.assert_allclose(pred.bound, tol.bound_dx_of_magnitude(pred.exact, m, model),
                               rtol=1e-12)


def test_a_rounded_offset_adds_a_rounding_to_the_backward_too(rng):
    """Gemma's 1 + w rounded in bfloat16: dx is predicted with the rounded scale and one more
    output rounding in its bound."""
    x, _, dy = _bwd_half_case(rng)
    w = (0.05 * rng.standard_normal(128)).astype(BF16)
    obs = observe(np.zeros((16, 128)), x, 128, w, quantity="dx", dy=dy, convention="gemma")
    pred = diagnosis.predict(H(offset_rounded=True), obs)
    w_used = (F32(1) + w.astype(F32)).astype(BF16)                # R_w(1 + w)
    m = _terms_size(x, w_used, dy, 1e-6)
    model = replace(obs.model, k_out=obs.model.k_out + 1)
    np.testing.assert_allclose(pred.exact, planted_dx(x.astype(np.float64), w_used.astype(
        np.float64), dy.astype(np.float64), 1e-6, 1.0), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(pred.bound, tol.bound_dx_of_magnitude(pred.exact, m, model),
                               rtol=1e-12)


@pytest.mark.parametrize("precision", ["native", "native_div", "sequential"])
def test_a_low_precision_statistic_widens_the_backward_s_bound(rng, precision):
    """The statistic in bfloat16: dx is the correct one at the rounded statistic (within a few
    percent of the correct dx's size: 128 squares summed in bfloat16), and its bound is eq.
    (dx) for the size of its own terms (rstd r, q = sqrt(s + eps) of the mutated statistic)
    with two more output roundings and the sums in bfloat16."""
    x, w, dy = _bwd_half_case(rng)
    obs = observe(np.zeros((16, 128)), x, 128, w, quantity="dx", dy=dy)
    h = H(precision=precision)
    pred = diagnosis.predict(h, obs)
    correct = diagnosis.predict(diagnosis.CORRECT, obs)
    m_correct = _terms_size(x, w, dy, 2.0**-23)
    assert np.max(np.abs(pred.exact - correct.exact)) <= 2.0**-4 * np.max(m_correct)
    xf, g = obs.xrows, obs.dyrows * obs.w
    fam = diagnosis._family(h, xf, 2.0**-23, BF16)
    m = fam.r * np.abs(g) + fam.r**2 * np.sum(np.abs(g * xf), axis=-1, keepdims=True) \
        * np.abs(xf) / (fam.q * 128)
    model = replace(obs.model, k_out=obs.model.k_out + 2, acc_dtype=BF16)
    np.testing.assert_allclose(pred.bound, tol.bound_dx_of_magnitude(pred.exact, m, model),
                               rtol=1e-12)


def _half_terms_dx(x, w, dy, eps):
    """dx's two terms computed in float32, each rounded to bfloat16, then subtracted in
    bfloat16 (where they cancel, their rounding errors are the result)."""
    x, w, dy = (a.astype(F32) for a in (x, w, dy))
    rstd = F32(1) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))
    xhat, g = x * rstd, dy * w
    c = np.mean(g * xhat, axis=-1, keepdims=True)
    return (rstd * g).astype(BF16) - (rstd * xhat * c).astype(BF16)


def test_separately_rounded_terms_reproduce_the_planted_bits(rng):
    """The planted kernel's bfloat16 dx is reproduced bit for bit on >= 99 % of the elements,
    inside the mutation's bound; on float32 and float64 (no 16-bit rounding) it does not
    apply, and the correct computation emulates float32 dx by no bits at all."""
    x, w, dy = _bwd_half_case(rng)
    got = _half_terms_dx(x, w, dy, 2.0**-23)
    obs = observe(got, x, 128, w, quantity="dx", dy=dy)
    h = H(separate_terms=True)
    pred = diagnosis.predict(h, obs)
    assert np.mean(pred.emulated == obs.got) >= 0.99             # measured: every element
    assert diagnosis.score(h, obs).ratio <= 1.0
    correct = diagnosis.predict(diagnosis.CORRECT, obs)
    np.testing.assert_array_equal(correct.emulated, diagnosis._rt(correct.exact, BF16))
    x32, w32, dy32 = (a.astype(F32) for a in (x, w, dy))
    obs32 = observe(np.zeros((16, 128)), x32, 128, w32, quantity="dx", dy=dy32)
    assert diagnosis.predict(h, obs32) is None
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    assert diagnosis.predict(h, observe(np.zeros((16, 128)), x64, 128, w64, quantity="dx",
                                        dy=dy64)) is None
    assert diagnosis.predict(diagnosis.CORRECT, obs32).emulated is None


# ---- predict: dweight ---------------------------------------------------------------------------


def test_dweight_mutations_are_the_planted_sums(rng):
    """float64 dweight: Σ dy·x (rstd missing), Σ dy·x̂·w (times the weight), and each
    prediction's bound is eq. (dw) of the model."""
    x = rng.standard_normal((6, 32))
    w = 1 + 0.25 * rng.standard_normal(32)
    dy = rng.standard_normal((6, 32))
    xhat = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    for h, planted in ((H(dweight="from_x"), np.sum(dy * x, axis=0)),
                       (H(dweight="times_w"), np.sum(dy * xhat * w, axis=0)),
                       (diagnosis.CORRECT, np.sum(dy * xhat, axis=0))):
        obs = observe(planted, x, 32, w, eps=1e-6, quantity="dweight", dy=dy)
        pred = diagnosis.predict(h, obs)
        np.testing.assert_allclose(pred.exact, planted[None, :], rtol=1e-13)
        assert pred.emulated is None
        np.testing.assert_allclose(
            pred.bound, tol.bound_dweight(pred.exact.reshape(-1), dy, xhat, obs.model)[None, :],
            rtol=1e-12)
        assert diagnosis.score(h, obs).ratio <= 1.0


def test_a_half_dweight_is_emulated_and_its_row_sum_in_the_input_dtype_is_a_mutation(rng):
    """bfloat16 dweight: the prediction's bits are the exact sum rounded once (a float32 sum
    reproduces most of them); summing the rows in bfloat16 is the half_sum mutation, whose bound
    sums in bfloat16, and which does not apply to float32."""
    x, w, dy = _bwd_half_case(rng, rows=64, n=32)
    xhat = np.asarray(_xhat32(x, 2.0**-23), np.float64)
    terms = (dy.astype(F32) * xhat.astype(F32))
    got32 = np.sum(terms, axis=0).astype(BF16)
    obs = observe(got32, x, 32, w, quantity="dweight", dy=dy)
    pred = diagnosis.predict(diagnosis.CORRECT, obs)
    np.testing.assert_array_equal(pred.emulated, diagnosis._rt(pred.exact, BF16))
    assert np.mean(pred.emulated == obs.got) >= 0.9
    h = H(dweight="half_sum")
    acc = np.zeros(32, BF16)
    for row in terms.astype(BF16):
        acc = (acc + row).astype(BF16)
    obs_half = observe(acc, x, 32, w, quantity="dweight", dy=dy)
    ph = diagnosis.predict(h, obs_half)
    assert diagnosis.score(h, obs_half).ratio <= 1.0
    dyf = dy.astype(np.float64)
    xhat_ref = x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1,
                                                      keepdims=True) + 2.0**-23)
    model = replace(obs.model, acc_dtype=BF16)
    np.testing.assert_allclose(
        ph.bound, tol.bound_dweight(ph.exact.reshape(-1), dyf, xhat_ref, model)[None, :],
        rtol=1e-12)
    x32, w32, dy32 = (a.astype(F32) for a in (x, w, dy))
    assert diagnosis.predict(h, observe(got32.astype(F32), x32, 32, w32, quantity="dweight",
                                        dy=dy32)) is None


# ---- predict: the bound of a statistic that removes the mean -----------------------------------


def _offset_rows(rng, rows=6, n=64):
    """Rows of different means and deviations (cancellation (μ² + σ²)/σ² from 1 to 1e4), and
    one row of zeros (no statistic to cancel)."""
    mean = np.array([[0.0], [10.0], [1.0], [100.0], [0.5], [0.0]])[:rows]
    x = (mean + rng.standard_normal((rows, n))).astype(F32)
    x[-1] = 0.0
    return x


def test_a_centred_statistic_widens_the_y_bound_by_its_cancellation(rng):
    """y's bound under the variance is the model's times (Σx²)/(Σ(x − μ)²) of its row, and
    the plain bound on a row of zeros (0/0: no cancellation); removing the mean from the
    numerator too adds the error of forming x − μ, (2u·|x| + γ(N)·mean|x|)·rstd·|w|."""
    x = _offset_rows(rng)
    w = (1 + 0.25 * rng.standard_normal(64)).astype(F32)
    obs = observe(np.zeros((6, 64)), x, 64, w, eps=1e-6)
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    dev = xf - xf.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        cond = np.sum(xf * xf, axis=-1, keepdims=True) / np.sum(dev * dev, axis=-1, keepdims=True)
    cond[-1] = 1.0
    pred = diagnosis.predict(H(centre_stat=True), obs)
    np.testing.assert_allclose(pred.bound, tol.bound_y(pred.exact, obs.model) * cond, rtol=1e-12)
    pred = diagnosis.predict(H(centre_stat=True, centre_num=True), obs)
    model = obs.model
    rstd = 1.0 / np.sqrt(np.mean(dev * dev, axis=-1, keepdims=True) + 1e-6)
    extra = (2.0 * model.u_acc * np.abs(xf) + model.gamma(64) * np.mean(
        np.abs(xf), axis=-1, keepdims=True)) * rstd * np.abs(wf)
    np.testing.assert_allclose(pred.bound, (tol.bound_y(pred.exact, model) + extra) * cond,
                               rtol=1e-12)


def test_the_numerator_s_cancellation_alone_is_held_by_its_bound(rng):
    """A float32 kernel y = (x − μ)·rstd(x)·w (the mean removed from the numerator only) on rows
    of mean 10 and deviation 0.1: the error of x − μ (about 10 bits lost) is inside the
    mutation's bound, and outside the plain one."""
    x = (10.0 + 0.1 * rng.standard_normal((8, 256))).astype(F32)
    w = (1 + 0.25 * rng.standard_normal(256)).astype(F32)
    rstd = F32(1) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=F32) + F32(1e-6))
    got = (x - np.mean(x, axis=-1, keepdims=True, dtype=F32)) * rstd * w
    obs = observe(got, x, 256, w, eps=1e-6)
    h = H(centre_num=True)
    pred = diagnosis.predict(h, obs)
    assert diagnosis.score(h, obs).ratio <= 1.0
    assert np.max(tol.abs_error(obs.got, pred.exact) / tol.bound_y(pred.exact, obs.model)) > 1


def test_a_centred_statistic_widens_each_dweight_column_by_its_worst_row(rng):
    """dweight sums over rows: its bound is the model's times the largest cancellation of any
    row (the rows of mean 100 here)."""
    x = _offset_rows(rng)
    w = (1 + 0.25 * rng.standard_normal(64)).astype(F32)
    dy = rng.standard_normal((6, 64)).astype(F32)
    obs = observe(np.zeros(64), x, 64, w, eps=1e-6, quantity="dweight", dy=dy)
    xf = x.astype(np.float64)
    dev = xf - xf.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        cond = np.sum(xf * xf, axis=-1) / np.sum(dev * dev, axis=-1)
    h = H(centre_stat=True)
    pred = diagnosis.predict(h, obs)
    xhat = xf / np.sqrt(np.mean(dev * dev, axis=-1, keepdims=True) + 1e-6)
    plain = tol.bound_dweight(pred.exact.reshape(-1), dy.astype(np.float64), xhat, obs.model)
    np.testing.assert_allclose(pred.bound, plain[None, :] * np.nanmax(cond), rtol=1e-12)
    assert pred.bound.shape == (1, 64)
    # rows of mean ~0 cancel little (cond ~1.05): the widening is that, not a floor of 2
    xz = rng.standard_normal((6, 64)).astype(F32)
    obs = observe(np.zeros(64), xz, 64, w, eps=1e-6, quantity="dweight", dy=dy)
    xf = xz.astype(np.float64)
    dev = xf - xf.mean(axis=-1, keepdims=True)
    cond = np.max(np.sum(xf * xf, axis=-1) / np.sum(dev * dev, axis=-1))
    assert cond < 1.5
    pred = diagnosis.predict(h, obs)
    xhat = xf / np.sqrt(np.mean(dev * dev, axis=-1, keepdims=True) + 1e-6)
    plain = tol.bound_dweight(pred.exact.reshape(-1), dy.astype(np.float64), xhat, obs.model)
    np.testing.assert_allclose(pred.bound, plain[None, :] * cond, rtol=1e-12)
    # an empty batch: dweight is zero, with the plain bound (no row to widen it)
    empty = observe(np.zeros(64), xz[:0], 64, w, eps=1e-6, quantity="dweight", dy=dy[:0])
    pred = diagnosis.predict(h, empty)
    np.testing.assert_array_equal(pred.exact, 0.0)
    assert pred.bound.shape == (1, 64) and np.all(np.isfinite(pred.bound))


def test_a_centred_statistic_widens_dx_by_its_row_s_cancellation(rng):
    """dx's bound under the variance: the model's for the mutation's terms, times the row's
    cancellation (element by element, not the batch's worst)."""
    x = _offset_rows(rng)[:5]
    w = (1 + 0.25 * rng.standard_normal(64)).astype(F32)
    dy = rng.standard_normal((5, 64)).astype(F32)
    obs = observe(np.zeros((5, 64)), x, 64, w, eps=1e-6, quantity="dx", dy=dy)
    xf = x.astype(np.float64)
    dev = xf - xf.mean(axis=-1, keepdims=True)
    cond = np.sum(xf * xf, axis=-1, keepdims=True) / np.sum(dev * dev, axis=-1, keepdims=True)
    plain = diagnosis.predict(diagnosis.CORRECT, replace(obs, _cache={}))
    h = H(centre_stat=True)
    pred = diagnosis.predict(h, obs)
    fam = diagnosis._family(h, xf, 1e-6, np.dtype(F32))
    g = obs.dyrows * obs.w
    m = fam.r * np.abs(g) + fam.r**2 * np.sum(np.abs(g * fam.a), axis=-1, keepdims=True) \
        * np.abs(fam.b) / (fam.q * 64)
    np.testing.assert_allclose(pred.bound,
                               tol.bound_dx_of_magnitude(pred.exact, m, obs.model) * cond,
                               rtol=1e-12)
    assert plain.bound.shape == pred.bound.shape


def test_the_low_precision_statistic_uses_the_eps_on_rows_it_dominates(rng):
    """bfloat16 rows of mean square ~1e-6 with eps = 1e-4 asked: the whole forward in bfloat16
    is reproduced bit for bit (>= 95 %), eps added to the rounded statistic, not subtracted."""
    x = (1e-3 * rng.standard_normal((64, 128))).astype(BF16)
    w = (1 + 0.25 * rng.standard_normal(128)).astype(BF16)
    got = _no_upcast(False)(x, w, 1e-4)
    obs = observe(got, x, 128, w, eps=1e-4)
    pred = diagnosis.predict(H(precision="native"), obs)
    assert np.mean(pred.emulated == obs.got) >= 0.95


# ---- the candidates: every known cause is tried, fitted values included ------------------------


def _singles(failing):
    singles, _ = diagnosis._forward_candidates(failing, diagnosis._Scores())
    return singles


def test_every_forward_mutation_of_the_family_is_a_candidate(rng):
    """A failing float32 case: each single mutation the engine knows is tried (eps outside the
    root, the variance, N − 1, a sum, either wrong axis, either rounding, the offset rounded,
    each tail block, offsets ±1, the low-precision statistic on 16-bit cases)."""
    x = rng.standard_normal((4, 8, 16)).astype(F32)
    w = (1 + 0.25 * rng.standard_normal((8, 16))).astype(F32)
    obs = observe(np.zeros((4, 128)), x, (8, 16), w, eps=1e-5)
    singles = _singles([obs])
    for h in (H(eps_outside=True), H(centre_stat=True), H(centre_stat=True, centre_num=True),
              H(divisor="N-1"), H(divisor="1"), H(stat_group="last"), H(stat_group="rows"),
              H(rounding="double"), H(rounding="trunc"), H(offset_rounded=True),
              H(offset=1.0), H(offset=-1.0), *(H(stat_block=b) for b in diagnosis._BLOCKS)):
        assert h in singles, h
    assert H(as_float32=True) not in singles                       # float64 inputs only
    xb = x.astype(BF16)
    half = observe(np.zeros((4, 128)), xb, (8, 16), w.astype(BF16), eps=1e-5)
    half_singles = _singles([half])
    for p in ("native", "native_div", "sequential"):             # 16-bit inputs only
        assert H(precision=p) in half_singles and H(precision=p) not in singles
    assert H(eps_outside=True) in half_singles and H(rounding="double") in half_singles
    x64 = x.astype(np.float64)
    wide = observe(np.zeros((4, 128)), x64, (8, 16), w.astype(np.float64), eps=1e-5)
    assert H(as_float32=True) in _singles([wide])


def test_every_named_eps_but_the_reference_s_is_a_candidate_in_both_scopes(rng):
    """eps = 1e-5 asked: each other named eps (and finfo of the input dtype) is tried, both
    where eps was left to its default and everywhere; 1e-5 itself is no mistake."""
    x = rng.standard_normal((4, 16)).astype(F32)
    obs = observe(np.zeros((4, 16)), x, 16, None, eps=1e-5)
    singles = _singles([obs])
    for e in (0.0, 1e-6, 1e-8, 2.0**-23, 1e-3, diagnosis._INPUT_EPS):
        for scope in ("default", "all"):
            assert H(eps=e, eps_scope=scope) in singles, (e, scope)
    assert not [h for h in singles if h.eps == 1e-5]


def test_a_fitted_eps_off_the_grid_is_a_candidate(rng):
    """A kernel that hard-codes eps = 3e-5 (no named value), on rows where it shows: 3e-5 is
    tried; and an eps outside the root of 3e-4, fitted as such, is tried too."""
    x = 1e-2 * rng.standard_normal((6, 64))
    w = 1 + 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 3e-5), x, 64, w, eps=1e-6)
    assert H(eps=3e-5, eps_scope="all") in _singles([obs])
    outside = observe(planted_y(x, w, 3e-4, outside=True), x, 64, w, eps=1e-6)
    assert H(eps=3e-4, eps_scope="all") in _singles([outside])


def test_a_fitted_whole_offset_is_a_candidate(rng):
    """A kernel that uses w + 2: the offset 2 is fitted and tried, besides ±1."""
    x = rng.standard_normal((6, 64))
    w = 0.25 * rng.standard_normal(64)
    obs = observe(rms64(x, w, 1e-6, offset=2.0), x, 64, w, eps=1e-6)
    singles = _singles([obs])
    assert [h.offset for h in singles if h.offset] == [-1.0, 1.0, 2.0]


@pytest.mark.parametrize("scale", [2.0, 3.0, 64 / 63])
def test_a_fitted_projection_scale_is_a_backward_candidate(rng, scale):
    """dx planted with its path through rstd scaled by s: s is among the backward candidates
    (a named scale as itself, an unnamed one as the fitted number)."""
    obs = _dx_case(rng, 6, 64, scale)
    cands = diagnosis._backward_candidates([obs], [diagnosis.CORRECT])
    fitted = [h.projection for h in cands if isinstance(h.projection, float)]
    assert any(abs(p - scale) <= 1e-12 for p in fitted), fitted
    assert diagnosis.CORRECT in cands and H(projection=0.0) in cands
    assert diagnosis.score(H(projection=min(fitted, key=lambda p: abs(p - scale))),
                           obs).ratio <= 1.0


def test_mutations_that_bring_a_case_twice_as_close_are_paired(rng):
    """Pairs are formed from the mutations that bring some sampled failing case at least 2x
    closer (ratio 10 -> 4: yes; -> 5, exactly 2x: no; -> 6: no), in the candidates' order,
    each pair once; the sample sees up to 16 kinds of case (a mutation that helps only the
    ninth kind is paired too)."""
    cases = [_dx_case(rng, 2, 8, 1.0) for _ in range(9)]
    for i, o in enumerate(cases):
        o.probe, o.ratio = f"probe{i}", 10.0
    helps = {H(eps_outside=True): 4.0, H(divisor="N-1"): 4.0, H(centre_stat=True): 5.0,
             H(divisor="1"): 6.0}

    def scores(h, o):
        if h == H(stat_group="last") and o is cases[8]:
            return diagnosis.Score(1.0, None)
        return diagnosis.Score(helps.get(h, 20.0), None)

    _, pairs = diagnosis._forward_candidates(cases, scores)
    assert pairs == [H(eps_outside=True, divisor="N-1"), H(eps_outside=True, stat_group="last"),
                     H(divisor="N-1", stat_group="last")]


def test_the_backward_candidates_hold_every_backward_cause(rng):
    """Each base gets the missing projection, the named scales, separately rounded terms and
    each dweight mistake, with the rows a partial dweight was fitted to; with no dx case
    (nothing to fit a scale from) the search still runs."""
    dw = _dweight_case(rng, 6, 32, slice(0, 4))
    dx = _dx_case(rng, 6, 32, 1.0)
    base = H(eps=1e-5, eps_scope="all")
    cands = diagnosis._backward_candidates([dw, dx], [diagnosis.CORRECT, base])
    for b in (diagnosis.CORRECT, base):
        assert b in cands
        for h in (replace(b, projection=0.0), replace(b, projection="N"),
                  replace(b, separate_terms=True), replace(b, dweight="prefix:4"),
                  *(replace(b, dweight=d) for d in ("from_x", "times_w", "features",
                                                    "half_sum"))):
            assert h in cands, h
    assert len(cands) == len(set(cands))
    only_dw = diagnosis._backward_candidates([dw], [diagnosis.CORRECT])
    assert H(dweight="prefix:4") in only_dw and H(projection=0.0) in only_dw


def test_two_offset_causes_at_once_are_predicted(rng):
    """Gemma's convention (1 + w) and a kernel that forms 2 + w in bfloat16: the offset one off
    and rounded, both at once, reproduce its bits."""
    x, _ = _half_case(rng)
    w = (0.05 * rng.standard_normal(256)).astype(BF16)
    got = (_xhat32(x, 1e-6) * (F32(2) + w.astype(F32)).astype(BF16).astype(F32)).astype(BF16)
    obs = observe(got, x, 256, w, eps=1e-6, convention="gemma")
    h = H(offset=1.0, offset_rounded=True)
    pred = diagnosis.predict(h, obs)
    assert np.mean(pred.emulated == obs.got) >= 0.95
    assert diagnosis.predict(H(offset=-1.0, offset_rounded=True), obs) is None  # 1 − 1 = 0


def test_predict_warns_of_nothing_on_zero_rows_and_overflowing_squares(rng):
    """A row of zeros with eps = 0 (0/0), and float16 inputs of 2e3 whose squares overflow
    float16 (65504) in the low-precision statistic: predict judges them itself and spills no
    RuntimeWarning; a kernel without the upcast returns zeros there (rstd = 1/inf)."""
    import warnings

    x = rng.standard_normal((4, 16))
    x[1] = 0.0
    with np.errstate(all="ignore"):
        obs = observe(np.zeros((4, 16)), x, 16, None, eps=0.0)
    xh = (2e3 * rng.standard_normal((4, 64))).astype(np.float16)
    huge = observe(np.zeros((4, 64)), xh, 64, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for h in (diagnosis.CORRECT, H(centre_stat=True), H(eps_outside=True)):
            diagnosis.predict(h, obs)
        pred = diagnosis.predict(H(precision="native"), huge)
    np.testing.assert_array_equal(pred.emulated, 0.0)


@pytest.mark.parametrize("rsqrt_of_rounded_sqrt", [False, True], ids=["native", "native_div"])
def test_every_rounding_of_the_16_bit_statistic_is_emulated(rng, rsqrt_of_rounded_sqrt):
    """Rows of N = 4 bfloat16 values of size 1e-2 with eps = 1e-4 (eps and the statistic of
    one size): x², the mean, the mean + eps, the rsqrt are each rounded to bfloat16 by the
    planted kernel, and the mutation's emulated output reproduces >= 99 % of its bits
    (measured: all of them; dropping any one of those roundings loses 1.5 to 9 %)."""
    x = (1e-2 * rng.standard_normal((256, 4))).astype(BF16)
    w = (1 + 0.25 * rng.standard_normal(4)).astype(BF16)
    got = _no_upcast(rsqrt_of_rounded_sqrt)(x, w, 1e-4)
    obs = observe(got, x, 4, w, eps=1e-4)
    h = H(precision="native_div" if rsqrt_of_rounded_sqrt else "native")
    assert np.mean(diagnosis.predict(h, obs).emulated == obs.got) >= 0.99


def test_truncation_is_emulated_on_the_float32_result_not_on_the_exact_value():
    """y = w/sqrt(1 + eps) = 1 + 2^-7 − 2^-30 exactly: a float32 kernel computes 1 + 2^-7 (the
    exact value is within half a float32 ulp of it) and its truncating pack keeps 1 + 2^-7;
    truncating the exact value would give 1. The emulation truncates the float32 value."""
    x = np.ones((4, 1), BF16)
    w = np.array([1 + 2.0**-7], BF16)
    eps = 2.0**-29 / (1 + 2.0**-7)
    got = _truncating_pack(x, w, eps)
    np.testing.assert_array_equal(got.astype(np.float64), 1 + 2.0**-7)
    obs = observe(got, x, 1, w, eps=eps)
    pred = diagnosis.predict(H(rounding="trunc"), obs)
    assert np.all(pred.exact < 1 + 2.0**-7)
    np.testing.assert_array_equal(pred.emulated, 1 + 2.0**-7)
