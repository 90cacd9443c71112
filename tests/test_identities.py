"""The executable identities (rmsref.identities): they hold on the oracle, and they can fail.

Reference: the identities' bounds come from the float64 error model documented in
rmsref/identities.py (statistical ones from scipy.stats intervals). Each broken implementation
below changes one function of the oracle and must be flagged by exactly the identities that
depend on what it broke -- no more (the others still pass), no fewer.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import rmsref
from rmsref import identities
from rmsref.identities import k_dx, k_dx_ln, k_rstd, k_rstd_ln, k_y, k_y_ln

pytest.importorskip("scipy", reason="the statistical identities use scipy.stats")

ALL = set(identities.names())


# ----------------------------------------------------------------------------------------------
# broken implementations, each with one classic mistake
# ----------------------------------------------------------------------------------------------


def ln_forward_ddof1(x, normalized_shape, weight=None, bias=None, eps=1e-5, **kw):
    """LayerNorm with the unbiased variance (ddof=1), as torch.var's default would give."""
    x = np.asarray(x, np.float64)
    mu = np.mean(x, axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True, ddof=1) + eps)
    y = (x - mu) * rstd
    y = y if weight is None else y * weight
    return (y if bias is None else y + bias), mu, rstd


def rms_forward_paper(x, normalized_shape, weight=None, eps=None, **kw):
    """eps outside the square root: x / (rms + eps), the original RMSNorm code's form."""
    x = np.asarray(x, np.float64)
    eps = 0.0 if eps is None else eps
    rstd = 1.0 / (np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + eps)
    y = x * rstd
    return (y if weight is None else y * weight), rstd


def rms_forward_no_sqrt_n(x, normalized_shape, weight=None, eps=None, **kw):
    """Divides by the norm instead of the RMS (forgets the √N)."""
    x = np.asarray(x, np.float64)
    eps = 0.0 if eps is None else eps
    rstd = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)
    y = x * rstd
    return (y if weight is None else y * weight), rstd


def rms_forward_batch_statistic(x, normalized_shape, weight=None, eps=None, **kw):
    """One statistic for the whole batch (BatchNorm-like): rows are no longer independent."""
    x = np.asarray(x, np.float64)
    eps = 0.0 if eps is None else eps
    rstd = np.full((x.shape[0], 1), 1.0 / np.sqrt(np.mean(x * x) + eps))
    y = x * rstd
    return (y if weight is None else y * weight), rstd


def rms_backward_no_projection(dy, x, normalized_shape, weight=None, eps=None, **kw):
    """dx = rstd·dxhat: forgets the path through rstd (the projection term)."""
    x = np.asarray(x, np.float64)
    eps = 0.0 if eps is None else eps
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    w = 1.0 if weight is None else weight
    dweight = None if weight is None else np.sum(dy * x * rstd, axis=0)
    return rmsref.RMSNormGrads(dy * w * rstd, dweight, None)


def ln_backward_no_mean_path(dy, x, normalized_shape, weight=None, bias=None, eps=1e-5, **kw):
    """LayerNorm backward that forgets the c1 = mean(dxhat) path through the mean."""
    x = np.asarray(x, np.float64)
    rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
    xhat = (x - np.mean(x, axis=-1, keepdims=True)) * rstd
    dxhat = dy * (1.0 if weight is None else weight)
    dx = rstd * (dxhat - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True))
    return rmsref.LayerNormGrads(dx, None, None)


class RMSNormWithBias(rmsref.RMSNorm):
    """An RMSNorm module that also learns a bias: 2N parameters."""

    def __init__(self, normalized_shape, eps=None, **kw):
        super().__init__(normalized_shape, eps, bias=True, **kw)


class RMSNormRunningStat(rmsref.RMSNorm):
    """Normalises by a running mean of squares, as BatchNorm's running statistics do."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.running_ms = None

    def forward(self, x):
        ms = float(np.mean(np.asarray(x, np.float64) ** 2))
        self.running_ms = ms if self.running_ms is None else 0.9 * self.running_ms + 0.1 * ms
        return np.asarray(x) / np.sqrt(self.running_ms) * self.weight


def rms_forward_clamped_ms(x, normalized_shape, weight=None, eps=None, **kw):
    """Clamps the mean square at 1e-6 ("safe" division): no longer scale invariant for small x."""
    x = np.asarray(x, np.float64)
    eps = 0.0 if eps is None else eps
    rstd = 1.0 / np.sqrt(np.maximum(np.mean(x * x, axis=-1, keepdims=True), 1e-6) + eps)
    y = x * rstd
    return (y if weight is None else y * weight), rstd


def rms_forward_ulp_off_in_big_batches(x, normalized_shape, weight=None, eps=None, **kw):
    """One ulp off when the batch has more than 16 rows (a batch-size-dependent reduction)."""
    y, rstd = rmsref.rms_norm_forward(x, normalized_shape, weight, eps, **kw)
    return (np.nextafter(y, np.inf) if np.shape(x)[0] > 16 else y), rstd


class RMSNormUnusedRunningStat(rmsref.RMSNorm):
    """Keeps a running mean of squares it never uses: the outputs are right, the state is not."""

    def forward(self, x):
        self.running_ms = float(np.mean(np.asarray(x, np.float64) ** 2))
        return super().forward(x)


BREAKS = {
    "layernorm ddof=1": (
        {"layer_norm_forward": ln_forward_ddof1},
        {"rms2_var_mean2", "layernorm_is_centred_rmsnorm"},
    ),
    "rmsnorm eps outside sqrt": (
        {"rms_norm_forward": rms_forward_paper},
        {"rms_is_scaled_unit_norm", "scale_invariance", "output_rms", "shift", "rms2_var_mean2",
         "layernorm_is_centred_rmsnorm"},
    ),
    "rmsnorm without sqrt(N)": (
        {"rms_norm_forward": rms_forward_no_sqrt_n},
        {"rms_is_scaled_unit_norm", "scale_invariance", "output_rms", "shift", "rms2_var_mean2",
         "layernorm_is_centred_rmsnorm", "rotation_equivariance", "attention_scale", "xavier"},
    ),
    "rmsnorm batch statistic": (
        {"rms_norm_forward": rms_forward_batch_statistic},
        {"row_independence", "rms_is_scaled_unit_norm", "scale_invariance", "output_rms",
         "shift", "rms2_var_mean2", "layernorm_is_centred_rmsnorm", "rotation_equivariance"},
    ),
    "backward without projection": (
        {"rms_norm_backward": rms_backward_no_projection},
        {"backward_orthogonality", "jacobian"},
    ),
    "layernorm backward without mean path": (
        {"layer_norm_backward": ln_backward_no_mean_path},
        {"backward_orthogonality"},
    ),
    "rmsnorm clamps the mean square": (
        {"rms_norm_forward": rms_forward_clamped_ms}, {"scale_invariance"},
    ),
    "rmsnorm one ulp off in big batches": (
        {"rms_norm_forward": rms_forward_ulp_off_in_big_batches}, {"row_independence"},
    ),
    "rmsnorm module with unused running statistics": (
        {"RMSNorm": RMSNormUnusedRunningStat}, {"row_independence"},
    ),
    "rmsnorm module with a bias": ({"RMSNorm": RMSNormWithBias}, {"parameter_count"}),
    "rmsnorm module with running statistics": (
        {"RMSNorm": RMSNormRunningStat}, {"row_independence"},
    ),
}


@pytest.fixture(scope="module")
def oracle_results() -> list[identities.IdentityResult]:
    return identities.run(quick=True)


# ----------------------------------------------------------------------------------------------
# the identities hold on the oracle
# ----------------------------------------------------------------------------------------------


def test_registry_has_the_fourteen_identities_with_their_metadata():
    assert len(ALL) == 14
    for name in identities.names():
        ident = identities.get(name)
        assert ident.statement and ident.latex and ident.source and ident.title
        assert ident.kind in ("float64", "statistical", "exact")
        assert ident.uses, name
        # every bound is derived in the check function's docstring: it names the bound and
        # what it is made of (rounding terms γ(k), an exact 0, or a confidence interval)
        d = ident.derivation
        assert re.search(r"\bbounds?\b", d, re.IGNORECASE), f"{name}: no bound in {d!r}"
        made_of = {"float64": r"γ\(", "exact": r"\bbound 0\b", "statistical": r"confidence"}
        assert re.search(made_of[ident.kind], d, re.IGNORECASE), f"{name}: not derived: {d!r}"


def test_every_identity_holds_on_the_oracle(oracle_results):
    failed = [(r.name, r.ratio, r.detail) for r in oracle_results if r.passed is not True]
    assert not failed, failed
    for r in oracle_results:
        assert r.ratio <= 1.0 and r.parts
        assert all(p.residual <= p.bound for p in r.parts), r.name
        if identities.get(r.name).kind == "float64":
            # derived float64 bounds are tens of ulps, never loose enough to hide a 1e-12 bug
            assert 0 < r.bound < 1e-13, (r.name, r.bound)


def test_statistical_identities_report_their_interval(oracle_results):
    by_name = {r.name: r for r in oracle_results}
    for name in ("attention_scale", "xavier"):
        r = by_name[name]
        assert "interval" in r.detail
        assert 0.001 < r.bound < 0.2  # a half-width, not a rounding bound


def test_measured_non_identities_are_reported(oracle_results):
    by_name = {r.name: r for r in oracle_results}
    assert "a shift moves RMSNorm by up to" in by_name["shift"].detail
    assert "mean(y)" in by_name["output_rms"].detail
    assert "as predicted" in by_name["rotation_equivariance"].detail


def test_gamma_is_highams():
    u = 2.0**-53
    assert identities.gamma(1) == pytest.approx(u / (1 - u), rel=1e-15, abs=0.0)
    assert identities.gamma(10) > 10 * u
    # counts grow with N as the error model says: about N/2 for forward, N for backward
    assert identities.k_rstd(64) == 37 and identities.k_rstd(7) == 8
    assert identities.k_dx(64) > 64 + 2 * 37


# ----------------------------------------------------------------------------------------------
# and they can fail: each break is flagged by exactly the identities it violates
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_broken_implementation_is_flagged_by_the_right_identities(name):
    impl, expected = BREAKS[name]
    results = identities.run(impl=impl, quick=True)
    flagged = {r.name for r in results if r.passed is False}
    assert flagged == expected, f"{name}: flagged {sorted(flagged)}"
    for r in results:
        if r.name in expected:
            assert r.ratio > 10.0, (r.name, r.ratio)  # far out, not a borderline call
            assert "residual" in r.detail or "raised" in r.detail
        else:
            assert r.passed is True, (r.name, r.detail)


def test_a_small_error_in_dx_is_caught():
    """A backward off by 1e-12 relative (a few thousand ulps) fails the float64 identities."""

    def slightly_wrong(dy, x, normalized_shape, weight=None, eps=None, **kw):
        g = rmsref.rms_norm_backward(dy, x, normalized_shape, weight, eps, **kw)
        return g._replace(dx=g.dx * (1.0 + 1e-12))

    (r,) = identities.run(["jacobian"], impl={"rms_norm_backward": slightly_wrong}, quick=True)
    assert r.passed is False


# ----------------------------------------------------------------------------------------------
# the API
# ----------------------------------------------------------------------------------------------


def test_seed_reproducible_and_per_identity_streams():
    a = identities.run(["shift", "jacobian"], seed=3, quick=True)
    b = identities.run(["jacobian"], seed=3, quick=True)  # alone: same inputs, same residual
    c = identities.run(["jacobian"], seed=4, quick=True)
    assert a[1].residual == b[0].residual
    assert c[0].residual != b[0].residual
    assert all(r.passed for r in a + b + c)


def test_unknown_identity_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown identity 'nope'.*rms2_var_mean2"):
        identities.run(["nope"])


def test_an_implementation_missing_functions_skips_with_the_reason():
    impl = types.SimpleNamespace(rms_norm_forward=rmsref.rms_norm_forward)
    results = {r.name: r for r in identities.run(impl=impl, quick=True)}
    assert results["scale_invariance"].passed is True
    assert results["xavier"].passed is True
    skipped = results["layernorm_is_centred_rmsnorm"]
    assert skipped.passed is None and skipped.status == "skip"
    assert "layer_norm_forward" in skipped.detail
    assert math.isnan(skipped.ratio)


def test_an_implementation_that_raises_fails_with_its_message():
    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    (r,) = identities.run(["output_rms"], impl={"rms_norm_forward": boom}, quick=True)
    assert r.passed is False and "kernel exploded" in r.detail


def test_on_result_callback_and_to_dict():
    seen = []
    results = identities.run(["parameter_count"], on_result=seen.append)
    assert seen == results
    d = results[0].to_dict()
    assert d["name"] == "parameter_count" and d["passed"] is True
    assert [p["label"] for p in d["parts"]][0] == "RMSNorm(64)"


def test_importing_identities_loads_neither_scipy_nor_rich():
    code = ("import sys, rmsref, rmsref.identities, rmsref.commands.check, rmsref._progress; "
            "bad = [m for m in ('scipy', 'rich', 'numba', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_markdown_lists_every_identity_with_its_derivation():
    md = identities.to_markdown(identities.run(["parameter_count"]))
    for name in identities.names():
        assert f"(`{name}`)" in md
        assert identities.get(name).derivation.splitlines()[0] in md
    assert "*Measured:* residual 0" in md


def test_the_worst_part_is_the_worst_element_even_next_to_exact_ones():
    """Exact elements (error 0) have ratio 0: the element reported is the one that is off."""
    part = identities._worst("y", err=np.array([0.0, 3e-17, 0.0, 1e-17]), scale=1.0,
                             bound=np.array([1e-16, 1e-16, 1e-16, 2e-17]))
    assert part.residual == 1e-17 and part.bound == 2e-17     # ratio 0.5, the largest
    assert part.passed


def test_a_result_says_how_long_it_took():
    r = identities.run_one("rms2_var_mean2", quick=True)
    assert r.passed and 0.0 < r.seconds < 60.0


# ----------------------------------------------------------------------------------------------
# the registry, the result records and the Markdown page, read exactly
# ----------------------------------------------------------------------------------------------


def _toy_check(impl, rng, quick):
    """Bound 0: a toy identity for the registry tests."""
    return [identities.Part("toy part", 0.0, 0.0)]


def test_registering_an_identity_keeps_every_field_and_refuses_a_name_twice(monkeypatch):
    monkeypatch.setattr(identities, "REGISTRY", {})
    register = identities._identity("toy", title="T", statement="S", latex="L", source="Src",
                                    uses=("rms_norm_forward",))
    assert register(_toy_check) is _toy_check
    ident = identities.get("toy")
    assert (ident.name, ident.title, ident.statement, ident.latex, ident.source, ident.kind,
            ident.uses, ident.func) == ("toy", "T", "S", "L", "Src", "float64",
                                        ("rms_norm_forward",), _toy_check)
    assert ident.derivation == "Bound 0: a toy identity for the registry tests."
    with pytest.raises(ValueError, match=r"^identity 'toy' registered twice$"):
        identities._identity("toy", title="T2", statement="S", latex="L", source="Src",
                             uses=("rms_norm_forward",), kind="exact")(_toy_check)
    assert identities.get("toy").title == "T"  # the first registration stands


def test_the_registry_kinds_are_the_documented_ones():
    kinds = {name: identities.get(name).kind for name in identities.names()}
    assert {n for n, k in kinds.items() if k == "statistical"} == {"attention_scale", "xavier"}
    assert {n for n, k in kinds.items() if k == "exact"} == {"row_independence",
                                                            "parameter_count"}
    assert all(k == "float64" for n, k in kinds.items()
               if n not in {"attention_scale", "xavier", "row_independence", "parameter_count"})


def test_unknown_identity_lists_every_known_name():
    with pytest.raises(ValueError) as info:
        identities.get("nope")
    assert str(info.value) == ("unknown identity 'nope'; known identities: "
                               + ", ".join(identities.names()))


def test_to_dict_is_the_result_field_by_field():
    part = identities.Part("N=8", 1e-17, 2e-16, note="a note")
    r = identities.IdentityResult("toy", 1e-17, 2e-16, 0.05, True, "1 parts, worst N=8",
                                  (part,), 0.25)
    assert r.to_dict() == {
        "name": "toy", "residual": 1e-17, "bound": 2e-16, "ratio": 0.05, "passed": True,
        "detail": "1 parts, worst N=8", "seconds": 0.25,
        "parts": [{"label": "N=8", "residual": 1e-17, "bound": 2e-16, "ratio": 1e-17 / 2e-16,
                   "note": "a note"}],
    }


def test_markdown_page_reads_exactly(monkeypatch):
    monkeypatch.setattr(identities, "REGISTRY", {})
    for name, kind in (("toy_a", "float64"), ("toy_b", "exact")):
        identities._identity(name, title=f"Title {name}", statement=f"Statement {name}.",
                             latex=r"a = b", source="Src", uses=("rms_norm_forward", "RMSNorm"),
                             kind=kind)(_toy_check)
    head = ["# Executable identities", "",
            "Generated by `rmsref.identities.to_markdown()`; run them with `rmsref check` or "
            "`rmsref.identities.run()`.", ""]

    def section(i, name, kind):
        return [f"## {i}. Title {name} (`{name}`)", "", f"Statement {name}.", "", "$$ a = b $$",
                "", "*Source:* Src  ", f"*Kind:* {kind}; *uses:* `rms_norm_forward`, `RMSNorm`",
                "", "*Bound:*", "", "```", "Bound 0: a toy identity for the registry tests.",
                "```", ""]

    sections = section(1, "toy_a", "float64") + section(2, "toy_b", "exact")
    assert identities.to_markdown() == "\n".join(head + sections)
    r = identities.IdentityResult("toy_b", 1.5e-17, 2e-16, 0.075, True, "1 parts, worst x")
    measured = ["*Measured:* residual 1.5e-17, bound 2e-16, ratio 0.075 (pass); 1 parts, worst x",
                ""]
    assert identities.to_markdown([r]) == "\n".join(head + sections + measured)


@pytest.mark.parametrize(("n", "counts"), [
    # N: k_rstd, k_y, k_dx, k_rstd_ln, k_xhat_ln, k_y_ln, k_dx_ln, written out from the module
    # docstring's counts: ⌈(N + 3)/2⌉ + 3, + 2, 2·k_rstd + N + 6; ⌈(N + 4)/2⌉ + 3,
    # (N + 1) + k_rstd_ln + 2, + 2, k_xhat_ln + N + k_rstd_ln + 6
    (7, (8, 10, 29, 9, 19, 21, 41)),
    (8, (9, 11, 32, 9, 20, 22, 43)),
    (64, (37, 39, 144, 37, 104, 106, 211)),
    (1000, (505, 507, 2016, 505, 1508, 1510, 3019)),
])
def test_rounding_counts_are_the_documented_ones(n, counts):
    got = tuple(f(n) for f in (identities.k_rstd, identities.k_y, identities.k_dx,
                               identities.k_rstd_ln, identities.k_xhat_ln, identities.k_y_ln,
                               identities.k_dx_ln))
    assert got == counts


# ----------------------------------------------------------------------------------------------
# the helpers the bounds and inputs are built from, against formulas written out
# ----------------------------------------------------------------------------------------------


def test_weights_have_both_signs_and_magnitudes_spread_over_half_to_two():
    """A kernel that drops w's sign or assumes |w| = 1 must meet weights that expose it."""
    w = identities._weight(np.random.default_rng(0), 1000)
    assert w.shape == (1000,)
    mag = np.abs(w)
    assert 0.5 <= mag.min() < 0.55 and 1.95 < mag.max() <= 2.0
    assert 0.3 < np.std(mag) < 0.6  # uniform on [0.5, 2]: std 1.5/√12 ≈ 0.43
    assert 400 < np.sum(w < 0) < 600


def test_a_per_row_statistic_is_read_as_float64_column():
    got = identities._col(np.array([1.5, 2.5, 3.5], np.float32), 3)
    assert got.dtype == np.float64 and got.shape == (3, 1)
    assert got[:, 0].tolist() == [1.5, 2.5, 3.5]


def test_eta_is_half_the_squared_mean_error_over_the_variance_per_row():
    # rows of 5 features (N != M, so a wrong axis shows): one with a mean 1e4 times its spread
    x = np.array([[1e4 - 1, 1e4 + 1, 1e4 - 1, 1e4 + 1, 1e4],
                  [-2.0, 2.0, -2.0, 2.0, 0.0],
                  [3.0, 1.0, 2.0, 2.0, 2.0]])
    eps = 1e-5
    got = identities._eta(x, eps)
    assert got.shape == (3, 1)
    for r in range(3):
        row = x[r]
        mu = sum(row) / 5
        var = sum((v - mu) ** 2 for v in row) / 5
        dmu = identities.gamma(6) * sum(abs(v) for v in row) / 5   # γ(N + 1)·mean|x|
        assert got[r, 0] == pytest.approx(0.5 * dmu * dmu / (var + eps), rel=1e-12, abs=0.0)
    assert got[0, 0] > 1e6 * got[1, 0]  # the large-mean row is the one that needs η


def test_rms_dx_scale_is_the_size_of_both_terms_per_element():
    rng = np.random.default_rng(1)
    dxhat, xhat = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    rstd = np.array([[0.5], [2.0], [3.0]])
    got = identities._rms_dx_scale(dxhat, xhat, rstd)
    for r in range(3):
        s = sum(abs(dxhat[r, j] * xhat[r, j]) for j in range(5)) / 5
        for i in range(5):
            expected = rstd[r, 0] * (abs(dxhat[r, i]) + abs(xhat[r, i]) * s)
            assert got[r, i] == pytest.approx(expected, rel=1e-14, abs=0.0)


@pytest.mark.parametrize("exact_chi2", [True, False])
def test_confidence_intervals_are_scipys(exact_chi2):
    from scipy import stats

    samples = np.random.default_rng(2).chisquare(1, 500)
    mean, lo, hi = identities._mean_ci(samples, exact_chi2)
    n = samples.size
    assert mean == pytest.approx(np.mean(samples), rel=1e-15, abs=0.0)
    if exact_chi2:  # n·mean ~ χ²_n under H0
        lo_ref, hi_ref = np.array(stats.chi2.interval(identities.CONFIDENCE, n)) / n
    else:  # Student's t around 1, with the sample's standard error
        sem = stats.sem(samples)
        lo_ref, hi_ref = stats.t.interval(identities.CONFIDENCE, n - 1, loc=1.0, scale=sem)
    assert lo == pytest.approx(lo_ref, rel=1e-12, abs=0.0)
    assert hi == pytest.approx(hi_ref, rel=1e-12, abs=0.0)


@pytest.mark.parametrize(("mean", "side"), [(1.05, "hi"), (1.0, "hi"), (0.95, "lo")])
def test_a_confidence_part_is_judged_on_the_side_the_mean_lies(mean, side):
    lo, hi = 0.8, 1.3  # asymmetric, as χ² intervals are
    part = identities._ci_part("N=4", mean, lo, hi)
    assert part.label == "N=4"
    assert part.residual == abs(mean - 1.0)
    assert part.bound == pytest.approx({"hi": 0.3, "lo": 0.2}[side], rel=1e-15, abs=0.0)
    assert part.note == f"N=4: mean {mean:.4f}, 99.99% interval [0.8000, 1.3000]"


def test_rows_mix_powers_of_two_and_offsets_per_row():
    """_rows: Gaussian noise plus the row's offset (cycling), times a power of two 2^k per row,
    k in [-4, 4]: each row's spread reads k, its mean (in units of 2^k) the offset."""
    offsets = (0.0, 0.5, 3.0, -20.0)
    x = identities._rows(np.random.default_rng(3), 400, 256)
    assert x.shape == (400, 256) and x.dtype == np.float64
    k = np.round(np.log2(np.std(x, axis=-1)))
    assert k.min() == -4 and k.max() == 4 and len(set(k.tolist())) == 9
    centre = np.mean(x, axis=-1) / 2.0**k
    assert np.all(np.abs(centre - np.resize(offsets, 400)) < 0.4)


def test_worst_reports_the_element_that_is_off_and_keeps_label_and_note():
    part = identities._worst("y", err=np.array([[0.0, 2e-17], [1e-17, 0.0]]), scale=1.0,
                             bound=1e-16)
    assert part == identities.Part("y", 2e-17, 1e-16, "")
    part = identities._worst("dx", [3e-16], 1.0, 1e-16, note="N=8")  # a single element
    assert part == identities.Part("dx", 3e-16, 1e-16, "N=8") and not part.passed


def test_worst_of_no_elements_holds_with_bound_zero():
    assert identities._worst("empty", np.empty((0, 3)), 1.0, 1e-16, note="n") == \
        identities.Part("empty", 0.0, 0.0, "n")


@pytest.mark.parametrize(("note", "expected"), [("", "non-finite values"),
                                                ("N=8", "N=8; non-finite values"),
                                                ("Xavier", "Xavier; non-finite values")])
def test_worst_fails_on_non_finite_errors_and_says_so(note, expected):
    part = identities._worst("y", np.array([1e-17, np.nan]), 1.0, np.array([1e-16, 3e-16]),
                             note=note)
    assert part == identities.Part("y", math.inf, 3e-16, expected)
    assert part.ratio == math.inf and not part.passed


def test_worst_exact_elements_pass_even_against_a_zero_scale_or_bound_without_warnings():
    """An exact element (error 0) is exact whatever its scale or bound (0 included); an error
    where the scale is 0 is infinitely off. None of this prints a NumPy RuntimeWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact = identities._worst("y", np.array([0.0, 1e-17]), np.array([0.0, 1.0]),
                                  np.array([0.0, 1e-16]))
        off = identities._worst("y", np.array([1e-17, 0.0]), np.array([0.0, 1.0]), 1e-16)
    assert exact == identities.Part("y", 1e-17, 1e-16, "")
    assert off.residual == math.inf and not off.passed


@pytest.mark.parametrize(("residual", "bound", "ratio"), [
    (0.0, 0.0, 0.0),          # bit for bit, and it is
    (0.0, 1e-16, 0.0),
    (1e-17, 0.0, math.inf),   # bit for bit, and it is not
    (math.nan, 1e-16, math.inf),
    (math.inf, 1e-16, math.inf),
    (1e-17, 1e-16, 1e-17 / 1e-16),
])
def test_part_ratio_and_verdict(residual, bound, ratio):
    part = identities.Part("p", residual, bound)
    assert part.ratio == ratio
    assert part.passed is (ratio <= 1.0)


def test_a_measured_note_goes_on_the_last_part_only():
    parts = [identities.Part(f"p{i}", i * 1e-17, 1e-16, f"n{i}") for i in range(3)]
    assert identities._noted(parts, "moved") == parts[:2] + [
        identities.Part("p2", 2e-17, 1e-16, "moved")]


def _sizes_in(result):
    return {int(re.match(r"N=(\d+)", p.label).group(1)) for p in result.parts}


def test_quick_checks_two_sizes_and_the_full_run_an_odd_a_power_of_two_and_a_large_one():
    assert _sizes_in(identities.run_one("output_rms", quick=True)) == {8, 64}
    (r,) = identities.run("output_rms", quick=True)  # a single name may be given as a str
    assert _sizes_in(r) == {8, 64}
    assert _sizes_in(identities.run_one("output_rms")) == {7, 64, 1000}  # quick defaults off
    (r,) = identities.run(["output_rms"])
    assert _sizes_in(r) == {7, 64, 1000}


def test_the_default_seed_is_zero():
    assert identities.run_one("output_rms", quick=True).residual == \
        identities.run_one("output_rms", quick=True, seed=0).residual
    assert identities.run(["output_rms"], quick=True)[0].residual == \
        identities.run(["output_rms"], quick=True, seed=0)[0].residual
    assert identities.run(["output_rms"], quick=True)[0].residual != \
        identities.run(["output_rms"], quick=True, seed=1)[0].residual


def test_run_one_checks_the_implementation_it_is_given():
    r = identities.run_one("parameter_count", impl={"RMSNorm": RMSNormWithBias})
    assert r.passed is False and "RMSNorm(64): residual 64 > bound 0" in r.detail


def test_a_skipped_result_names_the_missing_function_of_the_implementation():
    impl = types.SimpleNamespace(rms_norm_forward=rmsref.rms_norm_forward)
    r = identities.run_one("shift", impl=impl)
    (r_run,) = identities.run(["shift"], impl=impl)
    (r_wrapped,) = identities.run(["shift"], impl=identities.Implementation(impl))  # as is
    for res in (r, r_run, r_wrapped):
        assert res.name == "shift" and res.passed is None and res.parts == ()
        assert res.detail == "skipped: SimpleNamespace has no layer_norm_forward"
        assert all(math.isnan(v) for v in (res.residual, res.bound, res.ratio))
        assert 0.0 < res.seconds < 60.0  # measured, even for a skip


def test_without_scipy_the_statistical_identities_skip_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)  # `from scipy import stats` fails
    r = identities.run_one("xavier", quick=True)
    assert r.name == "xavier" and r.passed is None and r.parts == ()
    assert r.detail.startswith("skipped: ") and r.detail.endswith(" (pip install scipy)")
    assert all(math.isnan(v) for v in (r.residual, r.bound, r.ratio))
    assert 0.0 < r.seconds < 60.0


def test_an_implementation_that_raises_is_an_infinite_failure_with_its_message():
    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    r = identities.run_one("output_rms", impl={"rms_norm_forward": boom}, quick=True)
    assert (r.name, r.residual, r.ratio, r.passed, r.parts) == (
        "output_rms", math.inf, math.inf, False, ())
    assert math.isnan(r.bound)
    assert r.detail == "raised RuntimeError: kernel exploded"
    assert 0.0 < r.seconds < 60.0


def _toy_registry(monkeypatch, parts):
    monkeypatch.setattr(identities, "REGISTRY", {})
    identities._identity("toy", title="T", statement="S", latex="L", source="Src",
                         uses=("rms_norm_forward",))(lambda impl, rng, quick: list(parts))


@pytest.mark.parametrize(("failing", "suffix"), [(3, ""), (4, " (+1 more)"), (6, " (+3 more)")])
def test_a_failure_detail_names_the_first_three_failed_parts_and_counts_the_rest(
        monkeypatch, failing, suffix):
    parts = [identities.Part("ok", 1e-17, 1e-16, "a note")]
    parts += [identities.Part(f"p{i}", (i + 2) * 1e-16, 1e-16) for i in range(failing)]
    _toy_registry(monkeypatch, parts)
    (r,) = identities.run(["toy"])
    assert r.passed is False
    assert r.detail == ("p0: residual 2e-16 > bound 1e-16; p1: residual 3e-16 > bound 1e-16; "
                        "p2: residual 4e-16 > bound 1e-16" + suffix)
    worst = parts[-1]
    assert (r.residual, r.bound, r.ratio) == (worst.residual, worst.bound, worst.ratio)


def test_a_passing_detail_names_the_worst_part_and_each_note_once(monkeypatch):
    parts = [identities.Part("a", 1e-17, 1e-16, "shift moved y"),
             identities.Part("b", 5e-17, 1e-16),
             identities.Part("c", 2e-17, 1e-16, "shift moved y"),
             identities.Part("d", 0.0, 0.0, "mean(y) 0.1")]
    _toy_registry(monkeypatch, parts)
    (r,) = identities.run(["toy"])
    assert r.passed is True
    assert r.detail == "4 parts, worst b; shift moved y; mean(y) 0.1"
    assert (r.residual, r.bound) == (5e-17, 1e-16)


def test_implementation_labels_name_what_is_checked():
    assert identities.Implementation().label == "numpy oracle"
    assert identities.Implementation("numpy").label == "backend numpy"
    replaced = identities.Implementation({"rms_norm_forward": rms_forward_paper,
                                          "layer_norm_forward": ln_forward_ddof1})
    assert replaced.label == "oracle with layer_norm_forward, rms_norm_forward replaced"
    assert replaced.rms_norm_forward is rms_forward_paper
    assert replaced.rms_norm_backward is rmsref.rms_norm_backward
    assert identities.Implementation(rmsref).label == "rmsref"  # a module: its name
    assert identities.Implementation(types.SimpleNamespace()).label == "SimpleNamespace"


def test_a_backend_name_checks_that_backend():
    pytest.importorskip("numba", reason="the numba_cpu backend needs numba")
    impl = identities.Implementation("numba_cpu")
    assert impl.rms_norm_forward is rmsref.backend("numba_cpu").rms_norm_forward
    with pytest.raises(identities.MissingFunction, match="^backend numba_cpu has no RMSNorm$"):
        impl.RMSNorm  # noqa: B018  (a kernel backend has functions, not modules)


def test_an_implementation_never_looks_up_private_names_and_can_be_copied():
    import copy

    impl = identities.Implementation({"rms_norm_forward": rms_forward_paper})
    with pytest.raises(AttributeError, match="^_shapes$"):
        impl._shapes  # noqa: B018  (a private rmsref module: not part of what is checked)
    clone = copy.copy(impl)
    assert clone.rms_norm_forward is rms_forward_paper and clone.label == impl.label


# ----------------------------------------------------------------------------------------------
# each float64 bound is the total its derivation states (the identity checks are the part of the
# module a mutation run cannot reach: mutmut does not mutate decorated functions)
# ----------------------------------------------------------------------------------------------

G = identities.gamma
U64 = 2.0**-53

#: identity -> (label pattern, K(N) of the documented total γ(K)); η-free parts only.
DOCUMENTED_TOTALS = {
    "rms_is_scaled_unit_norm": [(r"eps=", lambda n: k_y(n) + math.ceil((n + 2) / 2) + 8)],
    "scale_invariance": [
        (r"alpha=\S+ eps=0$|-x eps=", lambda n: 2 * k_y(n) + 3),
        (r"eps=0.01 predicted$", lambda n: 2 * k_y(n) + n + 11),
    ],
    "output_rms": [(r"eps=", lambda n: k_rstd(n) + math.ceil((n + 1) / 2) + n + 8)],
    "backward_orthogonality": [
        (r"RMSNorm eps=", lambda n: k_dx(n) + 2 * n + 3 * k_rstd(n) + 6),
    ],
    "dweight_linearity": [  # M = 12 rows
        (r"^N=\d+ dweight$", lambda n: 2 * (k_rstd(n) + 1) + 2 * 12 + 1),
        (r"linearity dx$", lambda n: 2 * k_dx(n) + 5),
        (r"linearity dweight$", lambda n: 2 * (k_rstd(n) + 1 + 12) + 5),
    ],
    "jacobian": [
        (r"backward rows|JVP columns", lambda n: k_dx(n) + 2 * (k_rstd(n) + 1)
         + k_rstd(n) + 6),
    ],
}


@pytest.mark.parametrize("name", list(DOCUMENTED_TOTALS))
def test_float64_bounds_are_their_documented_totals(name):
    (r,) = identities.run([name], quick=True)
    checked = 0
    for part in r.parts:
        n = int(re.match(r"N=(\d+)", part.label).group(1))
        for pattern, k in DOCUMENTED_TOTALS[name]:
            if re.search(pattern, part.label):
                assert part.bound == G(k(n)), (part.label, part.bound, G(k(n)))
                checked += 1
    assert checked >= 2 * len(DOCUMENTED_TOTALS[name]), [p.label for p in r.parts]


def test_rotation_bounds_add_half_the_rotations_departure_from_orthogonality():
    """τ = c² + s² − 1 of the rounded (cos, sin) is at most a few u: the bound is γ(K) + τ/2."""
    (r,) = identities.run(["rotation_equivariance"], quick=True)
    for part in r.parts:
        n = int(re.match(r"N=(\d+)", part.label).group(1))
        k = 2 * k_y(n) + 9 + (k_rstd(n) + 6 if "general w" in part.label else 0)
        assert G(k) <= part.bound <= G(k) + 2 * U64, part.label


class _Recorder:
    """The oracle's functions, recording the arguments of every call."""

    def __init__(self, *names):
        self.calls = {name: [] for name in names}

    def impl(self):
        def recording(name):
            def call(*args, **kwargs):
                self.calls[name].append(args)
                return getattr(rmsref, name)(*args, **kwargs)
            return call
        return {name: recording(name) for name in self.calls}


def _eta_rows(x, eps):
    """η per row written out: ½·(γ(N + 1)·mean|x|)² / (var + eps)."""
    n = x.shape[-1]
    return 0.5 * (G(n + 1) * np.mean(np.abs(x), axis=1)) ** 2 / (np.var(x, axis=1) + eps)


@pytest.mark.parametrize(("name", "function", "x_arg", "label", "k"), [
    ("rms2_var_mean2", "layer_norm_forward", 0, r"^N=\d+$",
     lambda n: 2 * k_rstd(n) + 2 * k_rstd_ln(n) + 2 * n + 10),
    ("layernorm_is_centred_rmsnorm", "layer_norm_forward", 0, r"^N=\d+$",
     lambda n: k_y_ln(n) + n + 3 + k_y(n)),
    ("backward_orthogonality", "layer_norm_backward", 1, r"LayerNorm sum\(dx\)$",
     lambda n: k_dx_ln(n) + n),
])
def test_layernorm_bounds_add_twice_eta_of_the_worst_row(name, function, x_arg, label, k):
    """η (the mean's error, second order) is per row: the worst element's bound is γ(K) + 2η of
    a row, η computed from the inputs the identity drew (recorded on the way in)."""
    rec = _Recorder(function)
    (r,) = identities.run([name], impl=rec.impl(), quick=True)
    assert r.passed
    inputs = {}  # N -> the rows of the first call at that N (the bound's η is theirs)
    for args in rec.calls[function]:
        inputs.setdefault(np.asarray(args[x_arg]).shape[-1], np.asarray(args[x_arg]))
    parts = [p for p in r.parts if re.search(label, p.label)]
    assert len(parts) == 2
    for part in parts:
        n = int(re.match(r"N=(\d+)", part.label).group(1))
        candidates = G(k(n)) + 2 * _eta_rows(inputs[n], 1e-5)
        assert np.min(np.abs(candidates - part.bound)) <= U64 * part.bound, part.label
        # on these rows (means up to 20 spreads) η is second order indeed: ~1e-26 against γ(K)
        assert G(k(n)) <= part.bound < G(k(n)) * (1.0 + 1e-9), part.label


def test_shift_bounds_are_their_documented_totals():
    """LayerNorm: γ(2·k_y_ln + 2) + 2η (η negligible on these rows); RMSNorm: γ(k_y + 2) +
    ½·(γ(N + 5) + 2γ(N + 2)·ρ) + γ(4), ρ = mean|x|·|μ + c|/ms' ≤ mean|x|/(2σ) ≤ 25 here."""
    (r,) = identities.run(["shift"], quick=True)
    assert len(r.parts) == 8
    for part in r.parts:
        n = int(re.match(r"N=(\d+)", part.label).group(1))
        if "LayerNorm" in part.label:
            base, top = G(2 * k_y_ln(n) + 2), G(2 * k_y_ln(n) + 2) * (1 + 1e-9)
        else:
            base = G(k_y(n) + 2) + 0.5 * G(n + 5) + G(4)
            top = base + 25 * G(n + 2)
        assert base <= part.bound <= top, part.label


def test_a_shift_really_moves_rmsnorm_and_not_layernorm():
    """The measured non-identity the user reads: shifts of 1σ and 30σ move RMSNorm's output by
    a large fraction of max|y|, LayerNorm's only by rounding."""
    (r,) = identities.run(["shift"], quick=True)
    moved = re.search(r"moves RMSNorm by up to (\S+) of max\|y\| \(LayerNorm: (\S+)\)", r.detail)
    assert moved, r.detail
    assert float(moved.group(1)) > 0.5 and float(moved.group(2)) < 1e-13


def test_jacobian_eigenvalue_bounds_follow_weyl():
    """Relative to rstd: (γ(k_dx + 2) + N·u)·‖S‖_F/rstd + γ(3·k_rstd + 3), where
    √N ≤ ‖S‖_F/rstd = ‖I + |x̂x̂ᵀ|/N‖_F ≤ √N + mean(x̂²) ≤ √N + 1."""
    (r,) = identities.run(["jacobian"], quick=True)
    (part,) = [p for p in r.parts if "eigenvalues" in p.label]
    n = 16
    a, b = G(k_dx(n) + 2) + n * U64, G(3 * k_rstd(n) + 3)
    assert a * math.sqrt(n) + b <= part.bound <= a * (math.sqrt(n) + 1) + b
    assert "eps·rstd³, is down to" in r.detail


def test_xavier_interval_is_the_exact_chi2_one():
    from scipy import stats

    (r,) = identities.run(["xavier"], quick=True)
    (part,) = r.parts
    size = 400 * 16  # trials × outputs
    assert part.label == f"N=64, {size} outputs"
    lo, hi = np.array(stats.chi2.interval(identities.CONFIDENCE, size)) / size
    assert f"99.99% interval [{lo:.4f}, {hi:.4f}]" in part.note
    assert part.bound in (pytest.approx(hi - 1.0, rel=1e-12, abs=0.0),
                          pytest.approx(1.0 - lo, rel=1e-12, abs=0.0))


def test_parameter_counts_are_reported_for_flat_and_nested_shapes():
    (r,) = identities.run(["parameter_count"])
    assert r.detail.endswith("RMSNorm(64): 64, LayerNorm(64): 128, RMSNorm((4, 16)): 64, "
                             "LayerNorm((4, 16)): 128")


def test_residuals_are_the_worst_errors_computed_independently():
    """The residual reported is max |error|/scale over the elements, recomputed here from the
    recorded inputs and outputs: RMSNorm − √N·UnitNorm relative to |x·w|/sqrt(ms + eps), and
    ⟨dx, x⟩ − eps·rstd²·⟨dx̂, x̂⟩ relative to Σ|x_i|·M_i."""
    rec = _Recorder("rms_norm_forward", "unit_norm_forward")
    (r,) = identities.run(["rms_is_scaled_unit_norm"], impl=rec.impl(), quick=True)
    calls = zip(rec.calls["rms_norm_forward"], rec.calls["unit_norm_forward"], strict=True)
    for part, ((x, n, w, eps), (_, _, _, n_eps)) in zip(r.parts, calls, strict=True):
        assert n_eps == n * eps and part.label == f"N={n} eps={eps:g}"
        y_r = rmsref.rms_norm_forward(x, n, w, eps)[0]
        y_u = rmsref.unit_norm_forward(x, n, w, n * eps)[0]
        err = np.abs(y_r - math.sqrt(n) * y_u)
        scale = np.abs(x * w) / np.sqrt(np.sum(x * x, axis=1, keepdims=True) / n + eps)
        assert part.residual == pytest.approx(np.max(err / scale), rel=1e-12, abs=0.0)

    rec = _Recorder("rms_norm_backward")
    (r,) = identities.run(["backward_orthogonality"], impl=rec.impl(), quick=True)
    rms_parts = [p for p in r.parts if "RMSNorm" in p.label]
    for part, (dy, x, n, w, eps) in zip(rms_parts, rec.calls["rms_norm_backward"], strict=True):
        assert part.label == f"N={n} RMSNorm eps={eps:g}"
        dx = rmsref.rms_norm_backward(dy, x, n, w, eps)[0]
        rstd = 1.0 / np.sqrt(np.sum(x * x, axis=1) / n + eps)  # (M,)
        xhat, dxhat = x * rstd[:, None], dy * w
        big_m = rstd[:, None] * (np.abs(dxhat) + np.abs(xhat)
                                 * np.mean(np.abs(dxhat * xhat), axis=1, keepdims=True))
        err = np.abs(np.sum(dx * x, axis=1) - eps * rstd**2 * np.sum(dxhat * xhat, axis=1))
        s = np.sum(np.abs(x) * big_m, axis=1)
        if eps == 0.0:  # ⟨dx, x⟩ alone: the same sum, the same bits
            assert part.residual == pytest.approx(np.max(err / s), rel=1e-12, abs=0.0)
        else:  # the right side cancels the left: our rstd² (a few ulps off theirs) shows, by
            # at most 4u·eps·rstd²·|⟨dx̂, x̂⟩| ≤ 4u·Σ|x_i|·M_i
            assert abs(part.residual - np.max(err / s)) <= 4 * U64, part.label
