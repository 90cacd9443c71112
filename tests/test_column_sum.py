"""dweight and dbias sum over rows, chunk after chunk: they are checked here against the exact sum.

Reference: ``math.fsum`` per column (exact, then rounded once) on inputs whose terms the oracle
forms exactly, so any difference is the oracle's summation error and nothing else:

* dbias = Σ_rows dy: the terms are dy itself;
* dweight = Σ_rows dy ⊙ x̂ with eps = 0 and rows whose mean square is a power of four, so that
  rstd is a power of two, x̂ is exact and dy·x̂ (x̂ in {0, ±1, ±2}) is exact too.

The oracle sums each chunk of rows pairwise and carries the chunk sums in a compensated (TwoSum)
running sum. With one row per chunk the whole sum is that running sum, whose error is at most
u·|s| + (m·u)²·Σ|p| (Ogita, Rump & Oishi's Sum2; u = 2^-53, m rows): one rounding of the result.
The columns below cancel (each large term meets its negative somewhere else in the column), so an
uncompensated running sum is off by ~u·(the large terms), many ulps of the small exact result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import rmsref
from rmsref import _sumsq

U64 = 2.0**-53


def exact_column_sums(terms: np.ndarray) -> np.ndarray:
    """math.fsum down each column of ``terms`` (M, N): the correctly rounded exact sums."""
    return np.array([math.fsum(col) for col in terms.T])


def cancelling_columns(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    """(m, n) float64 columns of ±large pairs (1e6 scale) shuffled among small terms (1e-3)."""
    big = rng.standard_normal((m // 4, n)) * 10.0 ** rng.uniform(3, 9, (m // 4, n))
    small = rng.standard_normal((m - 2 * (m // 4), n)) * 1e-3
    cols = np.concatenate([big, -big, small])                           # (m, n)
    return rng.permuted(cols, axis=0)


def exact_rows(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    """(m, n) rows with Σ x² = n·4^k (k per row): with eps = 0, rstd = 2^-k and x̂ = x·2^-k exactly.

    Each row is a signed permutation of a pattern with Σ x² = n (twos, ones and zeros), scaled by
    a random power of two.
    """
    assert n % 8 == 0
    eights = ([1.0] * 8, [2.0, 1, 1, 1, 1, 0, 0, 0], [2.0, 2, 0, 0, 0, 0, 0, 0])   # Σ x² = 8
    patterns = [np.tile(p, n // 8) for p in eights]
    x = np.stack([patterns[i] for i in rng.integers(0, len(patterns), m)])   # (m, n)
    x = rng.permuted(x, axis=1) * rng.choice([-1.0, 1.0], (m, n))
    return np.ldexp(x, rng.integers(-20, 20, (m, 1)))


def sum2_bound(terms: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Error bound of a compensated running sum of ``terms`` down each column: u|s| + (m·u)²Σ|p|."""
    m = terms.shape[0]
    return U64 * np.abs(s) + (m * U64) ** 2 * np.sum(np.abs(terms), axis=0)


@pytest.fixture
def one_row_per_chunk(monkeypatch):
    """Chunks of one row each (for rows of up to 8 features): the chunk sums are the terms."""
    monkeypatch.setattr(_sumsq, "CHUNK_ELEMENTS", 8)


def assert_within(got: np.ndarray, ref: np.ndarray, bnd: np.ndarray, what: str) -> None:
    err = np.abs(got - ref)
    j = int(np.argmax(err / bnd))
    assert np.all(err <= bnd), (f"{what}: column {j} is off by {err[j]:.3g} (exact {ref[j]:.17g}, "
                                f"got {got[j]:.17g}); bound {bnd[j]:.3g}")


def test_dbias_across_chunks_is_one_rounding_of_the_exact_sum(rng, one_row_per_chunk):
    m, n = 4000, 8
    dy = cancelling_columns(rng, m, n)
    x = rng.standard_normal((m, n))
    ref = exact_column_sums(dy)
    for name, backward in (
        ("rms_norm", lambda: rmsref.rms_norm_backward(dy, x, n, np.ones(n), bias=np.zeros(n))),
        ("layer_norm", lambda: rmsref.layer_norm_backward(dy, x, n, np.ones(n), np.zeros(n))),
        ("unit_norm", lambda: rmsref.unit_norm_backward(dy, x, n, np.ones(n), bias=np.zeros(n))),
    ):
        assert_within(backward().dbias, ref, sum2_bound(dy, ref), f"{name} dbias")


def test_dweight_across_chunks_is_one_rounding_of_the_exact_sum(rng, one_row_per_chunk):
    m, n = 4000, 8
    x = exact_rows(rng, m, n)
    dy = cancelling_columns(rng, m, n)
    xhat = rmsref.rms_norm(x, n, eps=0.0)
    terms = dy * xhat                                                   # (m, n) exact products
    np.testing.assert_array_equal(xhat, x / np.sqrt(np.mean(x * x, axis=1, keepdims=True)))
    ref = exact_column_sums(terms)
    g = rmsref.rms_norm_backward(dy, x, n, np.ones(n), 0.0)
    assert_within(g.dweight, ref, sum2_bound(terms, ref), "rms_norm dweight")
    ga = rmsref.add_rms_norm_backward(dy, None, x, np.zeros_like(x), n, np.ones(n), 0.0)
    assert_within(ga.dweight, ref, sum2_bound(terms, ref), "add_rms_norm dweight")


def test_a_column_sum_that_overflows_is_inf_not_nan(rng, one_row_per_chunk):
    """float64 terms near the largest value: a column whose exact sum exceeds it is ±inf (the
    correctly rounded sum, what a plain running sum gives), not NaN (the compensated sum's
    error term is inf − inf there); a column of +inf and -inf terms is NaN; columns of
    alternating signs keep their one-rounding bound. dbias of every oracle backward that has
    one, and dweight where x̂ >= 0 (x >= 0 here; not LayerNorm's, whose x̂ has both signs)."""
    m, n = 80, 8
    x = np.abs(exact_rows(rng, m, n))
    dy = rng.uniform(0.5, 1.0, (m, n)) * 4e307
    dy[:, 1] *= -1.0                    # columns 0, 1: exact sums beyond ±1.8e308
    dy[:, 2:] *= 0.025                  # columns 2 ... 7: below 1e306, alternating signs:
    dy[::2, 2:] *= -1.0                 # finite sums, and a finite bound
    dy[0, 3], dy[1, 3] = np.inf, -np.inf  # column 3: NaN
    ref = exact_column_sums(dy[:, 4:])
    w, b = np.ones(n), np.zeros(n)
    with np.errstate(all="ignore"):
        grads = {
            "rms_norm": rmsref.rms_norm_backward(dy, x, n, w, 0.0, bias=b),
            "layer_norm": rmsref.layer_norm_backward(dy, x, n, w, b),
            "unit_norm": rmsref.unit_norm_backward(dy, x, n, w, bias=b),
            "add_rms_norm": rmsref.add_rms_norm_backward(dy, None, x, np.zeros_like(x), n, w, 0.0),
        }
    for name, g in grads.items():
        sums = {} if name == "layer_norm" else {"dweight": g.dweight}  # LayerNorm's x̂ has signs
        if getattr(g, "dbias", None) is not None:
            sums["dbias"] = g.dbias
            assert_within(g.dbias[4:], ref, sum2_bound(dy[:, 4:], ref), f"{name} dbias")
        for what, got in sums.items():
            assert got[0] == np.inf and got[1] == -np.inf, f"{name} {what}: {got[:2]}"
            assert np.isnan(got[3]), f"{name} {what}: {got[3]}"
    assert len([g for g in grads.values() if getattr(g, "dbias", None) is not None]) == 3


def test_cancelling_columns_defeat_an_uncompensated_running_sum(rng):
    """The inputs above are not benign: a plain running sum is off by far more than the bound."""
    m, n = 4000, 8
    dy = cancelling_columns(rng, m, n)
    ref = exact_column_sums(dy)
    plain = np.zeros(n)
    for row in dy:
        plain = plain + row
    assert np.all(np.abs(plain - ref) > 100 * sum2_bound(dy, ref))


def pairwise_bound(terms: np.ndarray, ref: np.ndarray, chunk_rows: int) -> np.ndarray:
    """Chunks summed pairwise (depth ⌈log2 R⌉), chunk sums compensated:
    ⌈log2 R⌉·u·Σ|p| + u|s| (+ the second-order term of the compensated sum)."""
    depth = math.ceil(math.log2(max(chunk_rows, 2)))
    return depth * U64 * np.sum(np.abs(terms), axis=0) + sum2_bound(terms, ref)


def test_dweight_dbias_over_a_million_rows_across_the_64_mib_boundary(rng):
    """M = 2^20 + 4099 rows of 8 features: 64 MiB of float64 and then some, five chunks."""
    n = 8
    m = (1 << 20) + 4099
    x = exact_rows(rng, m, n)
    dy = cancelling_columns(rng, m, n)
    chunk_rows = _sumsq.CHUNK_ELEMENTS // n
    assert m * n * 8 > 64 * 2**20 and m > 4 * chunk_rows
    g = rmsref.rms_norm_backward(dy, x, n, np.ones(n), 0.0, bias=np.zeros(n))
    terms = dy * (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True)))   # (m, n) exact
    ref_w, ref_b = exact_column_sums(terms), exact_column_sums(dy)
    assert_within(g.dweight, ref_w, pairwise_bound(terms, ref_w, chunk_rows), "dweight")
    assert_within(g.dbias, ref_b, pairwise_bound(dy, ref_b, chunk_rows), "dbias")
    err_ulps = np.abs(g.dweight - ref_w) / np.spacing(np.abs(ref_w))
    print(f"\nM = {m}: worst dweight error {np.max(err_ulps):.1f} float64 ulps of dweight")
