"""The measurements of docs/claims.md: the residual stack's hand-written backward, and the numbers
the page's verdicts rest on (docs/scripts/claims_stack.py, docs/scripts/claims_data.py).

The reference for the backward is ``rmsref.gradcheck`` (complex step against the forward); the
reference for the gradient-flow numbers is the mean-field estimate the page derives.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import rmsref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs", "scripts"))

import claims_data as cd  # noqa: E402
import claims_stack as cs  # noqa: E402


def _point(placement: str, residual: bool = True, activation: str = "tanh", depth: int = 3):
    stack = cs.init_stack(depth, 8, placement, seed=0, residual=residual, activation=activation)
    x = np.random.default_rng(1).standard_normal((4, 8))
    return stack, x


@pytest.mark.parametrize("activation", cs.ACTIVATIONS)
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("placement", cs.PLACEMENTS)
def test_stack_backward_passes_gradcheck(placement, residual, activation):
    stack, x = _point(placement, residual, activation)
    result = cs.check_backward(stack, x)
    assert result.passed, result.report()
    assert result.method == "complex"  # the forward is holomorphic: no finite differences used
    n_inputs = 1 + len(stack.params())
    assert sum(c.passed is True for c in result.checks) >= n_inputs


def test_gradcheck_catches_a_stack_backward_without_the_tanh_derivative(monkeypatch):
    """The check has teeth: drop tanh' from the sublayer's backward and it fails."""

    def broken(df, lay, cache):
        dw2 = cache.a.T @ df
        dz = df @ lay.w2.T  # missing: * (1 - a²)
        return dz @ lay.w1.T, cache.h.T @ dz, dw2

    monkeypatch.setattr(cs, "mlp_backward", broken)
    stack, x = _point("pre")
    result = cs.check_backward(stack, x)
    assert not result.passed
    failing = {c.input for c in result.failures()}
    # the last layer's W2 gets its gradient before the broken line; everything below it after
    assert {"x", "w1[2]", "w2[1]", "gamma[0]"} <= failing and "w2[2]" not in failing


@pytest.mark.parametrize("placement", cs.PLACEMENTS)
def test_gradient_at_every_layer_is_that_of_the_stack_above_it(placement):
    """Grads.dxs[l] (what the page plots) is ∂L/∂x_l: it equals the input gradient of the stack
    made of layers l..L-1 run on x_l."""
    stack = cs.init_stack(6, 16, placement, seed=3)
    x = np.random.default_rng(0).standard_normal((5, 16))
    dy = np.random.default_rng(1).standard_normal((5, 16))
    fwd = cs.stack_forward(stack, x)
    grads = cs.stack_backward(stack, dy, fwd)
    assert len(grads.dxs) == 7
    for lay in range(6):
        top = cs.Stack(placement, stack.layers[lay:], stack.gamma_final)
        top_grads = cs.stack_backward(top, dy, cs.stack_forward(top, fwd.xs[lay]))
        np.testing.assert_allclose(grads.dxs[lay], top_grads.dx, rtol=1e-13, atol=1e-15)


def test_init_names_what_it_received():
    with pytest.raises(ValueError, match=r"placement must be one of \('pre', 'post'\); got 'mid'"):
        cs.init_stack(2, 4, "mid", 0)
    with pytest.raises(ValueError, match=r"activation must be one of .*; got 'relu'"):
        cs.init_stack(2, 4, "pre", 0, activation="relu")


def _mean_field(depth: int, placement: str) -> float:
    z, w = np.polynomial.hermite_e.hermegauss(80)
    w = w / w.sum()
    a2, b2 = np.sum(w * np.tanh(z) ** 2), np.sum(w * (1 - np.tanh(z) ** 2) ** 2)
    if placement == "pre":
        return float(np.sqrt(np.prod([1 + b2 / (1 + lay * a2) for lay in range(depth - 1)])))
    return float(np.sqrt((1 + b2) / (1 + a2)) ** (depth - 1))


def test_gradient_flow_numbers_behave_as_the_page_states():
    flow = cd.flow_ratios((2, 32, 64), range(5))
    pre, post = flow["pre"]["dx"], flow["post"]["dx"]
    # shallow: both nearly flat
    assert np.all(np.abs(np.log(np.median(pre[0]))) < np.log(1.4))
    assert np.all(np.abs(np.log(np.median(post[0]))) < np.log(1.15))
    # L = 32: pre-norm's first layer gets several times the last layer's gradient, as the
    # mean-field estimate predicts, and more than post-norm's with this sublayer
    pre32, post32 = np.median(pre[1]), np.median(post[1])
    assert 3.0 < pre32 < 8.0 and pre32 > post32 > 1.0
    assert abs(np.log(pre32 / _mean_field(32, "pre"))) < np.log(1.3)
    assert abs(np.log(post32 / _mean_field(32, "post"))) < np.log(1.5)
    # pre-norm is predictable across seeds; post-norm's spread grows with depth
    assert cd.geometric_spread(pre[2]) < 1.15 < cd.geometric_spread(post[2])
    assert cd.geometric_spread(post[2]) > cd.geometric_spread(post[1])
    # weights' gradients follow the inputs' gradients
    assert np.median(flow["pre"]["dw"][1]) > 2.5
    # a linear sublayer (backward gain = forward gain): post-norm flat, pre-norm not
    linear = cd.flow_ratios((32,), range(5), activation="linear")
    assert np.median(linear["post"]["dx"]) < 2.0 < 4.0 < np.median(linear["pre"]["dx"])


def test_centring_comes_from_the_weights_not_the_residual_path():
    floor = np.sqrt(2 / np.pi) / np.sqrt(64)
    c = cd.centring_by_depth(16, offset=2.0, seeds=range(2))
    assert c[("pre", True)][0] > 0.85  # inputs with mu/sigma = 2: |mu|/RMS = 2/sqrt(5)
    assert c[("pre", False)][1] < 2 * floor and c[("post", False)][1] < 2 * floor
    assert c[("pre", True)][16] > 4 * floor
    centred = cd.centring_by_depth(8, offset=0.0, seeds=range(2))
    assert all(np.all(v < 2 * floor) for v in centred.values())


def test_large_mean_follows_the_identity():
    ratios = np.array([0.0, 0.5, 3.0, 300.0])
    lm = cd.large_mean(ratios, n=256)
    np.testing.assert_allclose(lm["cos"], 1 / np.sqrt(1 + ratios**2), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(lm["const"], ratios**2 / (1 + ratios**2), rtol=1e-12, atol=1e-15)
    assert lm["rms2_identity"].max() < 1e-14
    # bfloat16 keeps the centred signal to ~u at mu = 0, loses a share ~ mu/sigma beyond
    assert lm["keep_rms_bfloat16"][0] < 2**-8
    assert lm["keep_rms_bfloat16"][-1] > 100 * lm["keep_ln_bfloat16"][-1]


def test_training_is_deterministic_and_pre_norm_learns_at_the_larger_step():
    a, _ = cs.train("post", steps=20, depth=4)
    b, _ = cs.train("post", steps=20, depth=4)
    assert np.array_equal(a, b)
    pre, _ = cs.train("pre", lr=3e-2, steps=120)
    post, _ = cs.train("post", lr=3e-2, steps=120)
    assert np.mean(pre[-20:]) < 0.5 * np.mean(post[-20:])
    assert np.mean(pre[-20:]) < 0.3 * pre[0]


def test_cpu_benchmark_reader(tmp_path):
    table = tmp_path / "cpu.md"
    table.write_text(
        "# bench/cpu.py: x86_64, 2 CPUs\n\n"
        "| case | candidate | time (ms) | GB/s | x copy |\n|---|---|---:|---:|---:|\n"
        "| float32:8192x4096 | numba rms_norm fwd v2 | 26.48 | 10.1 | 2.05 |\n"
        "| float32:8192x4096 | numba layer_norm fwd | 39.55 | 6.8 | 2.81 |\n"
        "| float32:8192x4096 | numba rms_norm bwd v1 | REFUSED: wrong | | |\n"
        "| float32:8192x4096 | RMSNorm v2/LayerNorm time ratio (fwd) | | | **0.67** |\n",
        encoding="utf-8")
    b = cd.cpu_benchmark(str(table))
    assert b["run"] == "bench/cpu.py: x86_64, 2 CPUs"
    assert b["cases"] == {"float32:8192x4096": {
        "numba rms_norm fwd v2": 26.48, "numba layer_norm fwd": 39.55,
        "RMSNorm v2/LayerNorm time ratio (fwd)": 0.67}}
    assert cd.cpu_benchmark(str(tmp_path / "absent.md")) == {"run": None, "cases": {}}


def test_stack_code_is_not_imported_by_rmsref():
    assert "claims_stack" not in rmsref.__dict__
    assert not any(name.startswith("claims") for name in sys.modules["rmsref"].__dict__)
