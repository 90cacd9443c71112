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
    assert identities.gamma(1) == pytest.approx(u / (1 - u), rel=1e-15)
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
    assert r.passed and 0.0 <= r.seconds < 60.0
