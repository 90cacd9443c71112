"""The bounds of rmsref.tolerance are tight, tested both ways.

(a) On adversarial *correct* pipelines the worst observed error reaches a stated fraction of the
    bound, so a bound loosened by 3x (and a fortiori 10x) fails here.
(b) The same pipelines with a small systematic error added (a relative bias a few times the
    correct pipeline's worst error, a 1-ulp bias on every output, dweight summed in the half type)
    break the bound.

Reference: the float64 oracle on the pipeline's own rounded inputs (as :func:`rmsref.validate`
judges). The correct pipeline is :func:`pipeline`: every step in the accumulation dtype, sums
left to right (sequential, the model's default reduction), results rounded once to the output
dtype. Adversarial inputs:

* ``biased_rows``: x = (1, t, t, ..., t) with t² just above half an ulp of 1 in float32, so every
  step of the sequential sum of squares rounds up: the computed mean square is (N-1)·u too large,
  the worst case the deterministic γ(N) = N·u describes. rstd, and with it y and dx, inherit half
  of it (dx three times over: through x̂, through c and the final product).
* ``biased_columns``: dweight's column sum over rows, each step rounding up the same way.
* Gaussian rows in the half types, where the bound is essentially the final rounding (half an
  ulp) and enough elements land near a tie just above a power of two to reach it.

The fractions reached are stated in docs/tolerances.md ("How tight the bounds are").
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsref
from rmsref import conventions
from rmsref import tolerance as T
from rmsref._rounding import round_to
from rmsref._shapes import bfloat16

F32 = np.dtype(np.float32)
HALVES = {"bfloat16": bfloat16, "float16": np.dtype(np.float16)}


# ------------------------------------------------------------------------------------------------
# A correct pipeline, the exact reference, and the observed/bound ratios
# ------------------------------------------------------------------------------------------------


def pipeline(x, w, dy, eps, out, acc=F32):
    """A correct RMSNorm forward/backward: every step in ``acc``, sums left to right (cumsum),
    results rounded once to ``out``. Returns (y, dx, dweight) in ``out``."""
    t = acc.type
    xa, wa, g = x.astype(acc), w.astype(acc), dy.astype(acc)
    n = x.shape[1]
    ms = np.cumsum(xa * xa, axis=1, dtype=acc)[:, -1:] / t(n)             # (M, 1)  eq. (1)
    rstd = (t(1) / np.sqrt(ms + t(eps))).astype(acc)                       # (M, 1)  eq. (2)
    xhat = xa * rstd                                                       # (M, N)  eq. (3)
    dxhat = g * wa                                                         # (M, N)  eq. (5)
    c = np.cumsum(dxhat * xhat, axis=1, dtype=acc)[:, -1:] / t(n)          # (M, 1)  eq. (6)
    dx = rstd * (dxhat - xhat * c)                                         # (M, N)  eq. (7)
    dw = np.cumsum(g * xhat, axis=0, dtype=acc)[-1]                        # (N,)    eq. (8)
    return (xhat * wa).astype(out), dx.astype(out), dw.astype(out)


class Judge:
    """The exact values and the three bounds for one input, as rmsref.validate computes them."""

    def __init__(self, x, w, dy, eps, out, form, k_out=1):
        x64, w64, g64 = (a.astype(np.float64) for a in (x, w, dy))
        self.n, self.rows = x.shape[1], x.shape[0]
        self.y, rstd = rmsref.rms_norm_forward(x64, self.n, w64, eps)
        grads = rmsref.rms_norm_backward(g64, x64, self.n, w64, eps)
        self.dx, self.dw = grads.dx, grads.dweight
        xhat = x64 * rstd
        model = T.ErrorModel(np.dtype(out), self.n, self.rows, k_out=k_out, form=form)
        self.scale = {
            "y": np.abs(self.y),
            "dx": T.dx_magnitude(g64, xhat, rstd, w64, self.n),
            "dweight": np.sum(np.abs(g64 * xhat), axis=0),
        }
        self.bound = {
            "y": T.bound_y(self.y, model),
            "dx": T.bound_dx(self.dx, g64, xhat, rstd, w64, model),
            "dweight": T.bound_dweight(self.dw, g64, xhat, model),
        }

    def exact(self, quantity: str) -> np.ndarray:
        return {"y": self.y, "dx": self.dx, "dweight": self.dw}[quantity]

    def ratio(self, quantity: str, got: np.ndarray) -> float:
        """max |got − exact| / bound: at most 1 for a correct implementation."""
        err = np.abs(got.astype(np.float64) - self.exact(quantity))
        return float(np.max(err / self.bound[quantity]))

    def worst_scaled_error(self, quantity: str, got: np.ndarray) -> float:
        """max |got − exact| / |exact| over the elements whose |exact| is at least half the
        scale the bound grows with (|y|; M_i for dx; Σ_rows |g·x̂| for dweight): the relative
        error where no cancellation hides it."""
        exact = self.exact(quantity)
        err = np.abs(got.astype(np.float64) - exact)
        plain = np.abs(exact) >= 0.5 * self.scale[quantity]
        return float(np.max(err / np.abs(exact), where=plain, initial=0.0))


QUANTITIES = ("y", "dx", "dweight")


def outputs(got) -> dict[str, np.ndarray]:
    return dict(zip(QUANTITIES, got, strict=True))


# ------------------------------------------------------------------------------------------------
# Adversarial inputs
# ------------------------------------------------------------------------------------------------


def _just_above_half_ulp(acc: np.dtype) -> float:
    """u·(1 + 2^-(p−4)) for acc's p-bit significand: just above half an ulp of numbers in [1, 2)."""
    p = np.finfo(acc).nmant + 1
    return T.unit_roundoff(acc) * (1 + 2.0 ** -(p - 4))


def biased_rows(rows: int, n: int, acc=F32):
    """x = (1, t, ..., t) in ``acc`` with t² (rounded) just above half an ulp of the running sum
    of squares (in [1, 2)): each of the N−1 additions rounds up by ~u. dy = (1, 0, ..., 0), w = 1:
    then dx_j = −rstd·x̂_j·c for j ≥ 1 is all projection (M_j = |dx_j|)."""
    t = np.sqrt(np.float64(_just_above_half_ulp(acc)))
    t = np.nextafter(acc.type(t), acc.type(1))            # round up: t² stays above half an ulp
    assert t * t > T.unit_roundoff(acc)
    x = np.full((rows, n), t, acc)
    x[:, 0] = 1
    dy = np.zeros((rows, n), acc)
    dy[:, 0] = 1
    return x, np.ones(n, acc), dy


def biased_columns(rows: int, n: int, acc=F32):
    """dweight = Σ_rows dy (x = w = 1, eps = 0: x̂ = 1 exactly): the first row 1, then terms just
    above half an ulp of the running sum, so each of the rows−1 additions rounds up by ~u."""
    x = np.ones((rows, n), acc)
    dy = np.full((rows, n), _just_above_half_ulp(acc), acc)
    dy[0] = 1
    return x, np.ones(n, acc), dy


def gaussian(rng, rows: int, n: int, dtype):
    x = rng.standard_normal((rows, n)).astype(np.float32).astype(dtype)
    w = (1 + 0.5 * rng.standard_normal(n)).astype(np.float32).astype(dtype)
    dy = rng.standard_normal((rows, n)).astype(np.float32).astype(dtype)
    return x, w, dy


# ------------------------------------------------------------------------------------------------
# (a) correct pipelines reach a stated fraction of each bound
# ------------------------------------------------------------------------------------------------

F64 = np.dtype(np.float64)
DET, PROB = "deterministic", "probabilistic"


def case(quantity, dtype, form, rng):
    """(inputs, eps) of the adversarial correct case for one (quantity, dtype, form).

    Single precision and float64: the biased sums (N = 4096 rows / 4096 rows for dweight under the
    deterministic form; under the probabilistic form the largest sizes the form still covers, see
    test_probabilistic_form_is_not_a_worst_case_bound). Half types: Gaussian rows, where the
    final rounding near ties is what reaches the bound (for dweight with dy·x̂ > 0, so that the
    column sums do not cancel and the final rounding is most of the bound).
    """
    if dtype in HALVES.values():
        if quantity != "dweight":
            return gaussian(rng, 64, 1024, dtype), 1e-6
        x, w, dy = gaussian(rng, 32, 2048, dtype)
        return (x, w, np.abs(dy) * np.sign(x)), 1e-6   # dy·x̂ > 0: no cancellation in dweight
    if quantity == "dweight":
        return biased_columns(4096 if form == DET else 48, 8, dtype), 0.0
    n = 4096 if form == DET else {"y": 49, "dx": 96}[quantity]
    return biased_rows(4, n, dtype), 0.0


#: (quantity, dtype name, form) -> the fraction of the bound the correct case must reach.
#: Measured (seed 0): see docs/tolerances.md. Each is below the observed value by a margin for
#: the seed, and above 1/3 so that a bound loosened 3x fails.
FRACTION = {
    ("y", "float32", DET): 0.95, ("dx", "float32", DET): 0.55, ("dweight", "float32", DET): 0.95,
    ("y", "float32", PROB): 0.8, ("dx", "float32", PROB): 0.75, ("dweight", "float32", PROB): 0.75,
    ("y", "float64", DET): 0.95, ("dx", "float64", DET): 0.55, ("dweight", "float64", DET): 0.95,
}
for _name in HALVES:
    for _form in (DET, PROB):
        FRACTION.update({("y", _name, _form): 0.9, ("dx", _name, _form): 0.65,
                         ("dweight", _name, _form): 0.7})
DTYPES = {"float32": F32, "float64": F64, **HALVES}


def correct_and_judge(quantity, dname, form, rng):
    dtype = DTYPES[dname]
    (x, w, dy), eps = case(quantity, dtype, form, rng)
    acc = F64 if dtype == F64 else F32
    got = outputs(pipeline(x, w, dy, eps, dtype, acc))[quantity]
    return got, Judge(x, w, dy, eps, dtype, form), (x, w, dy, eps)


@pytest.mark.parametrize("key", sorted(FRACTION), ids=lambda k: "-".join(k))
def test_correct_pipeline_reaches_stated_fraction_of_bound(key, rng):
    quantity, dname, form = key
    got, judge, _ = correct_and_judge(quantity, dname, form, rng)
    r = judge.ratio(quantity, got)
    assert r <= 1.0, f"{key}: a correct pipeline exceeds the bound (observed/bound {r:.3f})"
    assert r >= FRACTION[key], (f"{key}: observed/bound {r:.3f} < the stated {FRACTION[key]}: "
                                "the bound is looser than documented")


def test_probabilistic_form_is_not_a_worst_case_bound():
    """The probabilistic γ = λ√N·u assumes rounding errors of random sign. The biased sums round
    the same way every time: a correct sequential float32 pipeline then exceeds the
    probabilistic bound from N ≈ 64 (y) and 128 (dx) on, and 64 rows (dweight), by ~10x at 4096,
    while staying within the deterministic one."""
    x, w, dy = biased_rows(4, 4096)
    got = outputs(pipeline(x, w, dy, 0.0, F32))
    prob, det = Judge(x, w, dy, 0.0, F32, PROB), Judge(x, w, dy, 0.0, F32, DET)
    for q in ("y", "dx"):
        assert prob.ratio(q, got[q]) > 5 and det.ratio(q, got[q]) <= 1
    x, w, dy = biased_columns(4096, 8)
    got = outputs(pipeline(x, w, dy, 0.0, F32))
    prob, det = Judge(x, w, dy, 0.0, F32, PROB), Judge(x, w, dy, 0.0, F32, DET)
    assert prob.ratio("dweight", got["dweight"]) > 5 and det.ratio("dweight", got["dweight"]) <= 1


@pytest.mark.parametrize("dname", sorted(HALVES))
@pytest.mark.parametrize("name,k_out", [("torch", 1), ("llama", 2)])
def test_conventions_roundings_reach_the_y_bound(dname, name, k_out, rng):
    """The conventions' own roundings (one for torch, two for llama's x̂-then-weight order) on
    Gaussian rows: within the y bound with the matching k_out, and near it."""
    dtype = HALVES[dname]
    x, w, _ = gaussian(rng, 64, 1024, dtype)
    y = conventions.emulate(name, x, w, 1e-6)
    for form in (DET, PROB):
        r = Judge(x, w, x, 1e-6, dtype, form, k_out=k_out).ratio("y", y)
        assert 0.7 <= r <= 1.0, f"{name} {dname} {form}: observed/bound {r:.3f}"


# ------------------------------------------------------------------------------------------------
# (b) a small systematic error on top of a correct pipeline is caught
# ------------------------------------------------------------------------------------------------


def bias_relative(got: np.ndarray, beta: float) -> np.ndarray:
    """got·(1 + beta), rounded once to got's dtype."""
    return round_to(got.astype(np.float64) * (1 + beta), got.dtype)


def bias_one_ulp(got: np.ndarray) -> np.ndarray:
    """Every output moved up by one ulp of its dtype."""
    v = got.astype(np.float64)
    return round_to(v + T.ulp(v, got.dtype), got.dtype)


@pytest.mark.parametrize("key", sorted(FRACTION), ids=lambda k: "-".join(k))
def test_relative_bias_three_times_the_correct_error_is_caught(key, rng):
    """A relative bias of ±3x the correct pipeline's worst relative error (measured against the
    scale the bound grows with) breaks the bound: the worst correct case sits at least 1/2 of the
    bound (dx: 0.55), so 3x of it, either sign, lands beyond."""
    quantity, dname, form = key
    got, judge, _ = correct_and_judge(quantity, dname, form, rng)
    beta = 3 * judge.worst_scaled_error(quantity, got)
    for sign in (1, -1):
        r = judge.ratio(quantity, bias_relative(got, sign * beta))
        assert r > 1.0, f"{key}: a {sign * beta:.3g} relative bias passes (observed/bound {r:.3f})"


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize("dname", sorted(HALVES))
@pytest.mark.parametrize("form", [DET, PROB])
def test_one_ulp_bias_is_caught_in_half_types(quantity, dname, form, rng):
    got, judge, _ = correct_and_judge(quantity, dname, form, rng)
    r = judge.ratio(quantity, bias_one_ulp(got))
    assert r > 1.0, f"{quantity} {dname} {form}: a 1-ulp bias passes (observed/bound {r:.3f})"


@pytest.mark.parametrize("dname", sorted(HALVES))
def test_dweight_summed_in_the_half_type_is_caught(dname, rng):
    dtype = HALVES[dname]
    x, w, dy = gaussian(rng, 256, 1024, dtype)
    xa, g = x.astype(F32), dy.astype(F32)
    rstd = 1 / np.sqrt(np.mean(xa * xa, axis=1, keepdims=True) + np.float32(1e-6))
    dw_half = np.cumsum((g * xa * rstd).astype(dtype), axis=0, dtype=dtype)[-1]
    r = Judge(x, w, dy, 1e-6, dtype, PROB).ratio("dweight", dw_half)
    assert r > 1.0, f"{dname}: dweight summed in {dname} passes (observed/bound {r:.3f})"
