"""How small an error rmsref.gradcheck sees, and the blind spots of other tools it does not share.

Reference: the NumPy oracle's forward, differentiated by complex step. Tolerances: gradcheck's
defaults. Measured (seed 0, rows = 2, one entry dx[0, 200] scaled by 1 + δ; ratio of the vjp check
on x, second_order=False):

    N        δ = 1e-6   1e-8    1e-9    1e-10
    256      5.7e4      571     57      5.7
    1024     836        8.4     0.84    0.08
    4096     436        4.4     0.44    0.04
    16384    277        2.8     0.28    0.03

so a single wrong entry is seen down to δ ≈ N·1e-13 (the tolerance is 2^10·u relative to
Σ|u_i (Jv)_i|, a sum of ~N terms), and δ = 1e-7 is caught with a ratio >= 25 up to N = 16384.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from rmsref.derivatives import gradcheck, oracle_problem

sys.path.insert(0, str(Path(__file__).parent))
from test_gradcheck import rms_backward_with_bug, sweep_case  # noqa: E402


def _one_entry_wrong(delta: float):
    correct = rms_backward_with_bug(None)

    def backward(dy, x, w, b):
        dx, dw, db = correct(dy, x, w, b)
        dx = dx.copy()
        dx[0, 200] *= 1 + delta
        return dx, dw, db

    return backward


@pytest.mark.parametrize("n", [256, 4096, 16384])
def test_single_entry_1e7_is_caught_at_every_n(n):
    p = oracle_problem("rms_norm", (2, n))
    r = gradcheck(p.forward, _one_entry_wrong(1e-7), p.inputs, names=p.names,
                  second_order=False)
    c = r.check("vjp", "x")
    assert c.passed is False and c.ratio > 10, c.ratio
    assert c.worst[0].input_index == (0, 200)


def test_float32_jvp_ten_times_too_large_is_caught():
    """jax's check_grads multiplies its float32 tolerance by the array size: with 8192 outputs a
    JVP 10x too large passes there. Here the JVP is compared with the VJP directly."""
    p = oracle_problem("rms_norm", (2, 4096), dtype=np.float32)

    def jvp(inputs, tangents):
        return p.jvp(inputs, tangents) * np.float32(10)

    r = p.check(jvp=jvp)
    assert r.check("jvp", "x").passed is False and r.check("jvp", "weight").passed is False
    assert r.check("vjp", "x").passed and r.check("vjp", "weight").passed


@pytest.mark.parametrize("method", ["central", "richardson"])
def test_no_false_alarm_with_finite_differences(method):
    """The fallback methods, on the first small cases of the main sweep (N = 1 rows included)."""
    worst = 0.0
    for seed in range(40):
        cfg, shape, scale = sweep_case(seed)
        if shape[0] * shape[1] > 1024:
            continue
        cfg = dict(cfg)
        op = cfg.pop("op")
        p = oracle_problem(op, shape, seed=seed, **cfg)
        x = p.inputs[0] * scale
        rest = (p.inputs[1] * scale, p.inputs[2]) if op == "add_rms_norm" else p.inputs[1:]
        p = dataclasses.replace(p, inputs=(x, *rest))
        r = p.check(seed=seed, method=method)
        assert r, f"seed {seed} {op} {shape} {cfg}\n{r.report()}"
        worst = max(worst, r.max_ratio())
    print(f"\n{method}: worst ratio on correct code {worst:.3g}")


SCALES = [1e-160, 1e-20, 1.0, 1e20, 1e150]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "unit_norm", "add_rms_norm"])
def test_no_false_alarm_across_scales(op):
    """Inputs from 1e-160 to 1e150, N = 1 (where every derivative is rounding noise: the
    cancellation floor) and N = 3, with and without the options; the oracle is overflow-safe,
    so gradcheck must stay quiet. Checks whose scale leaves float64's normal range are skipped,
    not passed."""
    cfgs = {"rms_norm": [{}, {"bias": True, "offset": 1.0, "partial": 0.5}],
            "layer_norm": [{}, {"bias": True}], "unit_norm": [{}, {"bias": True}],
            "add_rms_norm": [{}, {"offset": 1.0}]}[op]
    for shape in [(64, 3), (3, 1)]:
        for scale in SCALES:
            for cfg in cfgs:
                if shape[1] == 1 and "partial" in cfg:
                    continue
                p = oracle_problem(op, shape, seed=3, **cfg)
                ins = list(p.inputs)
                ins[0] = ins[0] * scale
                if op == "add_rms_norm":
                    ins[1] = ins[1] * scale
                r = dataclasses.replace(p, inputs=tuple(ins)).check(seed=3)
                assert r, f"{op} {shape} scale {scale:g} {cfg}\n{r.report()}"
