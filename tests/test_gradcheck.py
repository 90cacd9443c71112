"""Tests of rmsref.gradcheck: it must catch every planted bug and never cry wolf on the oracle.

The reference here is the NumPy oracle (rmsref.rms_norm_forward and friends): gradcheck's ground
truth is the complex step through the oracle's forward. Tolerances are gradcheck's own defaults
(rtol = 2^10 unit roundoffs of the gradient dtype); no test widens them.

Measured with default settings, float64 (observed/tolerance ratio of the failing check; the
figures are printed by ``pytest -s -k planted``):

    bug                                        shape     caught by      ratio
    missing projection (dx = rstd·w·dy)        8 x 64    vjp x          1.1e11
    1/(N-1) instead of 1/N                     8 x 64    vjp x          1.8e9
    eps outside the sqrt, backward only (1e-5) 8 x 64    vjp weight     8.0e6  (vjp x 1.8e6)
    dweight not summed over rows (last row)    8 x 64    vjp weight     1.7e12
    dweight from x instead of xhat             8 x 64    vjp weight     6.5e10
    wrong column 127 of N = 4096               2 x 4096  vjp x          6.1e8  (x[0,127], x[1,127])
    1e-6 relative error in dx[0, 1000]         2 x 4096  vjp x          855    (x[0,1000] localised)
    backward ignores offset (offset = 1)       8 x 64    vjp x          2.1e11

Correct code: the worst ratio over the no-false-alarm sweep (200 seeds) is printed by
``test_no_false_alarm_sweep``; measured 0.14 (seed 0: N = 1, one row, the second_order check,
where every derivative is rounding noise and the cancellation floor carries the tolerance).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import rmsref
from rmsref._shapes import resolve_eps
from rmsref.derivatives import (
    ORACLE_OPS,
    GradcheckResult,
    check_oracle,
    check_oracle_all,
    gradcheck,
    oracle_problem,
)

# ------------------------------------------------------------------------------------------------
# A hand-written RMSNorm backward with switchable bugs (the planted-bug suite)
# ------------------------------------------------------------------------------------------------

BUGS = {
    # name: (shape, oracle_problem kwargs, check expected to fail, input it fails on)
    "no_projection": ((8, 64), {}, "vjp", "x"),
    "n_minus_1": ((8, 64), {}, "vjp", "x"),
    "eps_outside_sqrt": ((8, 64), {"eps": 1e-5}, "vjp", "x"),
    "dweight_not_summed": ((8, 64), {}, "vjp", "weight"),
    "dweight_from_x": ((8, 64), {}, "vjp", "weight"),
    "column_127": ((2, 4096), {}, "vjp", "x"),
    "single_entry_1e-6": ((2, 4096), {}, "vjp", "x"),
    "ignores_offset": ((8, 64), {"offset": 1.0}, "vjp", "x"),
}


def rms_backward_with_bug(bug: str | None, *, eps=None, offset=0.0):
    """backward(dy, x, w, b) for RMSNorm over the last dim, eqs. (5)-(9) of rmsnorm.py, + a bug."""

    def backward(dy, x, w, b):
        n = x.shape[-1]
        e = resolve_eps(eps, x.dtype)
        ms = np.mean(x * x, axis=-1, keepdims=True)  # (M, 1)  eq. (1)
        rstd = 1.0 / np.sqrt(ms + e)  # (M, 1)  eq. (2)
        if bug == "eps_outside_sqrt":
            rstd = 1.0 / (np.sqrt(ms) + e)
        xhat = x * rstd  # (M, N)  eq. (3)
        weff = w if bug == "ignores_offset" else offset + w
        dxhat = dy * weff  # (M, N)  eq. (5)
        k = n - 1 if bug == "n_minus_1" else n
        c = np.sum(dxhat * xhat, axis=-1, keepdims=True) / k  # (M, 1)  eq. (6)
        dx = rstd * (dxhat - xhat * c)  # (M, N)  eq. (7)
        if bug == "no_projection":
            dx = rstd * weff * dy
        if bug == "column_127":  # a tail/block-boundary bug: that column lost its projection
            dx[..., 127] = (rstd * dxhat)[..., 127]
        if bug == "single_entry_1e-6":
            dx[0, 1000] *= 1 + 1e-6
        dw = np.sum(dy * xhat, axis=0)  # (N,)  eq. (8)
        if bug == "dweight_not_summed":  # overwritten per row instead of accumulated
            dw = (dy * xhat)[-1]
        if bug == "dweight_from_x":
            dw = np.sum(dy * x, axis=0)
        db = None if b is None else np.sum(dy, axis=0)  # (N,)  eq. (9)
        return dx, dw, db

    return backward


def planted(bug: str | None, shape, **kw) -> GradcheckResult:
    p = oracle_problem("rms_norm", shape, **kw)
    bwd = rms_backward_with_bug(bug, eps=kw.get("eps"), offset=kw.get("offset", 0.0))
    return gradcheck(p.forward, bwd, p.inputs, names=p.names)


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_is_caught(bug):
    shape, kw, check, inp = BUGS[bug]
    # the same hand-written backward without the bug passes at the same point
    assert planted(None, shape, **kw), planted(None, shape, **kw).report()
    r = planted(bug, shape, **kw)
    c = r.check(check, inp)
    print(f"\n{bug}: caught by {check} {inp} at ratio {c.ratio:.3g}; "
          f"all failures: {[(f.name, f.input, f'{f.ratio:.3g}') for f in r.failures()]}")
    assert not r
    assert c.passed is False and c.ratio > 1
    assert "FAIL" in r.report()


def test_localised_bugs_name_their_coordinates():
    r = planted("column_127", (2, 4096))
    c = r.check("vjp", "x")
    assert {w.input_index for w in c.worst} == {(0, 127), (1, 127)}
    r = planted("single_entry_1e-6", (2, 4096))
    c = r.check("vjp", "x")
    assert c.worst and c.worst[0].input_index == (0, 1000)
    w = c.worst[0]
    assert math.isclose(w.analytic / w.numerical - 1, 1e-6, rel_tol=1e-6)
    assert "x[0, 1000]" in r.report()


def test_single_entry_bug_with_full_jacobian():
    r = gradcheck(*_problem_with_bug("single_entry_1e-6", (1, 1024)), full=True,
                  second_order=False, names=("x", "weight", "bias"))
    c = r.check("jacobian", "x")
    assert c.passed is False
    # column 1000 of row 0 is wrong for every output of row 0
    assert all(w.input_index == (0, 1000) and w.output_index[0] == 0 for w in c.worst)


def _problem_with_bug(bug, shape):
    p = oracle_problem("rms_norm", shape)
    return p.forward, rms_backward_with_bug(bug), p.inputs


# ------------------------------------------------------------------------------------------------
# No false alarm on the correct oracle
# ------------------------------------------------------------------------------------------------

N_SEEDS = 200


def sweep_case(seed: int) -> tuple[dict, tuple, float]:
    """A random configuration: mostly small, a few large, all ops and options, scales 1e-3..1e3."""
    rng = np.random.default_rng(10_000 + seed)
    fixed = {0: (1, 1), 1: (64, 1), 2: (2, 4096), 3: (64, 4096), 4: (1, 4096), 5: (64, 2)}
    if seed in fixed:
        rows, n = fixed[seed]
    else:
        n = int(np.clip(round(2 ** rng.uniform(0, 12)), 1, 4096))
        rows = int(np.clip(round(2 ** rng.uniform(0, 6)), 1, 64))
        rows = max(1, min(rows, 4096 // n))  # keep most cases small: M·N <= 4096
    op = rng.choice(ORACLE_OPS, p=[0.6, 0.15, 0.1, 0.15]) if seed >= len(fixed) else "rms_norm"
    cfg: dict = {"weight": bool(rng.random() < 0.75)}
    if op in ("rms_norm", "layer_norm", "unit_norm"):
        cfg["bias"] = bool(rng.random() < 0.4)
    if op in ("rms_norm", "add_rms_norm") and cfg["weight"] and rng.random() < 0.3:
        cfg["offset"] = 1.0
    if op == "rms_norm" and rng.random() < 0.2 and n >= 2:
        cfg["partial"] = float(rng.choice([0.25, 0.5, 0.75]))
    if op in ("rms_norm", "add_rms_norm") and rng.random() < 0.3:
        cfg["eps"] = float(rng.choice([1e-5, 1e-6]))
    scale = float(10 ** rng.uniform(-3, 3))
    return {"op": str(op), **cfg}, (rows, n), scale


def test_no_false_alarm_sweep():
    worst, worst_case, worst_check = 0.0, None, None
    for seed in range(N_SEEDS):
        cfg, shape, scale = sweep_case(seed)
        cfg = dict(cfg)
        op = cfg.pop("op")
        p = oracle_problem(op, shape, seed=seed, **cfg)
        x = p.inputs[0] * scale
        if op == "add_rms_norm":  # residual on the same scale as x
            p = dataclasses.replace(p, inputs=(x, p.inputs[1] * scale, p.inputs[2]))
        else:
            p = dataclasses.replace(p, inputs=(x, *p.inputs[1:]))
        r = p.check(seed=seed)
        assert r, f"false alarm: seed {seed} {op} {shape} {cfg} scale {scale:.3g}\n{r.report()}"
        for c in r.checks:
            if c.passed is not None and c.ratio > worst:
                worst, worst_case, worst_check = c.ratio, (seed, op, shape, cfg), (c.name, c.input)
    print(f"\nworst ratio on correct code over {N_SEEDS} seeds: {worst:.3g} at {worst_case} "
          f"{worst_check}")
    assert worst < 1


def test_every_oracle_op_passes_including_full_jacobian():
    for desc, r in check_oracle_all(full=True):
        assert r, f"{desc}\n{r.report()}"
        names = {c.name for c in r.checks if c.passed is not None}
        assert {"vjp", "jacobian", "reentrancy", "shapes"} <= names, desc


def test_complex_step_agreement_with_oracle_backward():
    """The oracle's backward agrees with the complex step to ~1e-16 relative (Σ|u·Jv| scale)."""
    r = check_oracle("rms_norm", (16, 256), bias=True, offset=0.0)
    obs = max(c.observed for c in r.checks if c.name == "vjp")
    print(f"\ncomplex-step agreement of the oracle's backward: {obs:.2e}")
    assert r.method == "complex"
    assert obs < 1e-15


# ------------------------------------------------------------------------------------------------
# Methods, non-holomorphic forwards
# ------------------------------------------------------------------------------------------------


def _norm_problem(forward_kind: str):
    """y = x / ||x|| per row, with a correct backward, written with a non-holomorphic op."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8))

    if forward_kind == "linalg":
        def forward(x):
            return x / np.linalg.norm(x, axis=-1, keepdims=True)
    elif forward_kind == "abs":
        def forward(x):
            return x / np.sqrt(np.sum(np.abs(x) ** 2, axis=-1, keepdims=True))
    else:  # holomorphic
        def forward(x):
            return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True))

    def backward(dy, x):
        r = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
        xh = x * r
        return (r * (dy - xh * np.sum(dy * xh, axis=-1, keepdims=True)),)

    return forward, backward, (x,)


@pytest.mark.parametrize("kind", ["linalg", "abs"])
def test_non_holomorphic_forward_is_detected(kind):
    f, b, inputs = _norm_problem(kind)
    r = gradcheck(f, b, inputs)
    assert r.method == "richardson"
    assert any("not holomorphic" in n for n in r.notes), r.notes
    assert r, r.report()  # the correct backward still passes, against Richardson
    # ... and a wrong one still fails
    def wrong(dy, x):
        return (b(dy, x)[0] * (1 + 1e-6),)
    assert not gradcheck(f, wrong, inputs)


def test_forward_that_drops_imaginary_parts_is_detected():
    f, b, inputs = _norm_problem("holo")
    r = gradcheck(lambda x: f(x.real.copy()) if np.iscomplexobj(x) else f(x), b, inputs)
    assert r.method == "richardson" and r, r.report()
    r = gradcheck(lambda x: f(np.asarray(x, dtype=np.float64)), b, inputs)
    assert r.method == "richardson" and any("imaginary" in n for n in r.notes), r.notes


@pytest.mark.parametrize("method", ["central", "richardson"])
def test_finite_difference_methods(method):
    p = oracle_problem("rms_norm", (4, 32), bias=True)
    r = p.check(method=method)
    assert r and r.method == method, r.report()
    bad = gradcheck(p.forward, rms_backward_with_bug("n_minus_1"), p.inputs, method=method)
    assert not bad and bad.check("vjp", "input0").passed is False


# ------------------------------------------------------------------------------------------------
# jvp, double backward, reentrancy, shapes, None gradients
# ------------------------------------------------------------------------------------------------


def test_wrong_jvp_is_caught_without_finite_differences():
    p = oracle_problem("rms_norm", (4, 64))

    def jvp(inputs, tangents):
        return p.jvp(inputs, tangents) * (1 + 1e-9)

    r = p.check(jvp=jvp)
    assert r.check("jvp", "x").passed is False and r.check("vjp", "x").passed


def test_wrong_double_backward_is_caught():
    p = oracle_problem("rms_norm", (4, 64), bias=True)

    def dbl(dd, dy, x, w, b):
        ddy, dx, dw, db = p.double_backward(dd, dy, x, w, b)
        dx = dx.copy()
        dx[2, 5] *= 1 + 1e-7
        return ddy, dx, dw, db

    r = p.check(double_backward=dbl)
    assert r.check("double_backward", "x").passed is False
    assert r.check("double_backward", "dy").passed and r.check("double_backward", "weight").passed


@pytest.mark.parametrize("cfg", [
    {}, {"bias": True}, {"offset": 1.0}, {"partial": 0.5}, {"weight": False},
    {"partial": 0.75, "bias": True, "offset": 1.0, "eps": 1e-5},
])
def test_oracle_double_backward_agrees_with_complex_step(cfg):
    p = oracle_problem("rms_norm", (5, 24), seed=7, **cfg)
    r = p.check(seed=7)
    db = [c for c in r.checks if c.name == "double_backward"]
    assert db and all(c.passed for c in db), r.report()
    assert r.check("hessian_symmetry").passed and r.check("second_order").passed


def test_reentrancy_and_input_mutation():
    p = oracle_problem("rms_norm", (3, 16))
    calls = []

    def stateful(dy, x, w, b):
        calls.append(1)
        dx, dw, db = p.backward(dy, x, w, b)
        return dx * (1 + 1e-15 * len(calls)), dw, db  # drifts by one ulp-ish per call

    assert gradcheck(p.forward, stateful, p.inputs, second_order=False).check(
        "reentrancy").passed is False

    def mutating(dy, x, w, b):
        g = p.backward(dy, x, w, b)
        x[0, 0] += 1e-3  # scribbles on its input
        return g

    r = gradcheck(p.forward, mutating, [a.copy() if a is not None else None for a in p.inputs],
                  second_order=False)
    assert r.check("reentrancy").passed is False and "modified" in r.check("reentrancy").note


def test_wrong_gradient_dtype_or_shape():
    p = oracle_problem("rms_norm", (3, 16))

    def f32(dy, x, w, b):
        dx, dw, db = p.backward(dy, x, w, b)
        return dx.astype(np.float32), dw, db

    r = gradcheck(p.forward, f32, p.inputs)
    assert not r and "dtype float32" in r.check("shapes").note

    def shape(dy, x, w, b):
        dx, dw, db = p.backward(dy, x, w, b)
        return dx, dw[None], db

    assert gradcheck(p.forward, shape, p.inputs).check("shapes").passed is False


def test_none_gradient_is_checked_and_wrt_excludes():
    p = oracle_problem("rms_norm", (3, 16))

    def forgets_dweight(dy, x, w, b):
        return p.backward(dy, x, w, b)[0], None, None

    r = gradcheck(p.forward, forgets_dweight, p.inputs, names=p.names)
    c = r.check("vjp", "weight")
    assert c.passed is False and "None" in c.note
    assert gradcheck(p.forward, forgets_dweight, p.inputs, wrt=[0])


def test_float32_gradients_get_float32_tolerance():
    p = oracle_problem("rms_norm", (4, 128), dtype=np.float32, bias=True)
    r = p.check()
    assert r, r.report()
    assert r.settings["rtol"] == pytest.approx(2.0**10 * 2.0**-24, abs=0)


# ------------------------------------------------------------------------------------------------
# cost, result object, module
# ------------------------------------------------------------------------------------------------


def test_evaluation_counts_do_not_depend_on_n():
    counts = [check_oracle("rms_norm", (2, n), bias=True).evaluations for n in (8, 64, 512)]
    assert counts[0] == counts[1] == counts[2], counts
    big = check_oracle("rms_norm", (2, 4096), bias=True).evaluations
    # the only difference above 4096 elements: 1 instead of 3 draws of the dependence probe
    assert {k: v for k, v in big.items() if k != "backward"} == {
        k: v for k, v in counts[0].items() if k != "backward"}
    assert big["backward"] == counts[0]["backward"] - 2 * 3 * 2
    # the docstring's formula: K = 3 inputs (x, weight, bias; one shaped like the output),
    # D = 4 directions, P = 2 pairs
    c = counts[0]
    assert c["forward"] == 1 + 4 + 1
    assert c["forward_complex"] == 1 + 3 * 4 + (1 + 6 * 2)
    assert c["backward"] == (4 + 1) + (1 + 4 + 2 * 3 * 3)
    assert c["backward_complex"] == 1 + 2 * 2 + (3 + 1) * 2
    assert c["jvp"] == 3 * 4 and c["double_backward"] == (3 + 1) * 2


def test_result_object():
    r = check_oracle("rms_norm", (2, 8))
    assert bool(r) is True and r.passed and not r.failures()
    d = r.to_dict()
    json.dumps(d)  # machine-readable
    assert d["passed"] and {c["check"] for c in d["checks"]} >= {"vjp", "jvp", "shapes"}
    text = r.report()
    assert "PASSED" in text and "observed" in text and "ratio" in text
    bad = planted("no_projection", (4, 32))
    dd = bad.to_dict()
    json.dumps(dd)
    assert not dd["passed"] and any(c["worst"] for c in dd["checks"])


def test_the_function_stays_bound_after_its_module_is_imported():
    """The module is rmsref.derivatives: importing it cannot hide the function rmsref.gradcheck."""
    import rmsref.derivatives as mod

    f, b, inputs = _norm_problem("holo")
    assert rmsref.gradcheck is mod.gradcheck
    assert isinstance(rmsref.gradcheck(f, b, inputs), GradcheckResult)
    assert rmsref.gradcheck(f, b, inputs)


def test_bad_arguments():
    f, b, inputs = _norm_problem("holo")
    with pytest.raises(ValueError, match="method"):
        gradcheck(f, b, inputs, method="forward")
    with pytest.raises(ValueError, match="wrt"):
        gradcheck(f, b, inputs, wrt=[3])
    with pytest.raises(ValueError, match="op must be"):
        oracle_problem("batch_norm")


# ------------------------------------------------------------------------------------------------
# torch's fast mode misses what we catch
# ------------------------------------------------------------------------------------------------


def test_torch_fast_mode_misses_single_entry_bug():
    """torch.autograd.gradcheck(fast_mode=True) scales its tolerance by Σu·Σv (u, v >= 0) and
    compares against a finite difference (eps 1e-6, atol 1e-5, rtol 1e-3): a 1e-6 relative error
    in one entry of dx at N = 4096 is far below that. Its verdict is recorded, not asserted (it
    is torch's business); ours must catch the bug."""
    torch = pytest.importorskip("torch")
    shape = (2, 4096)
    p = oracle_problem("rms_norm", shape)
    bwd = rms_backward_with_bug("single_entry_1e-6")

    class BuggyRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return torch.from_numpy(p.forward(x.detach().numpy(), w.detach().numpy(), None))

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            dx, dw, _ = bwd(dy.numpy(), x.detach().numpy(), w.detach().numpy(), None)
            return torch.from_numpy(np.ascontiguousarray(dx)), torch.from_numpy(dw)

    x = torch.from_numpy(p.inputs[0].copy()).requires_grad_()
    w = torch.from_numpy(p.inputs[1].copy()).requires_grad_()
    torch_verdict = torch.autograd.gradcheck(BuggyRMSNorm.apply, (x, w), fast_mode=True,
                                             raise_exception=False)
    ours = gradcheck(p.forward, bwd, p.inputs, names=p.names)
    print(f"\ntorch fast-mode gradcheck on the 1e-6 single-entry bug: passed={torch_verdict}; "
          f"rmsref.gradcheck: passed={bool(ours)}, ratio {ours.check('vjp', 'x').ratio:.3g}")
    assert not ours


# ------------------------------------------------------------------------------------------------
# What a sampled mutation run of rmsref.derivatives showed no test would notice
# ------------------------------------------------------------------------------------------------


def test_a_backward_that_scribbles_on_its_dy_fails_reentrancy():
    p = oracle_problem("rms_norm", (4, 16))

    def scribbling(dy, *inputs):
        grads = p.backward(dy.copy(), *inputs)
        dy *= 2.0                                   # the caller's dy, modified in place
        return grads

    r = gradcheck(p.forward, scribbling, p.inputs, names=p.names, second_order=False)
    c = r.check("reentrancy")
    assert c.passed is False and "modified its dy in place" in c.note
    assert r.check("vjp", "x").passed                # the gradients themselves are right


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "unit_norm", "add_rms_norm"])
def test_oracle_problem_passes_its_eps_to_every_callable(op):
    """At eps = 0.5 every callable must use it: a JVP or backward falling back to the default
    eps would disagree with the forward far beyond rtol."""
    p = oracle_problem(op, (3, 8), eps=0.5)
    r = p.check(full=True)
    assert r, r.report()
    assert {c.name for c in r.checks} >= {"vjp", "jacobian"} | ({"jvp"} if p.jvp else set())


def test_a_backward_returning_one_array_is_named():
    p = oracle_problem("rms_norm", (4, 16))
    with pytest.raises(TypeError, match=r"expected a tuple of 3 gradients \(one per input, None "
                       r"where there is none\)"):
        gradcheck(p.forward, lambda dy, x, w, b: p.backward(dy, x, w, b)[0], p.inputs)


def test_a_forward_with_nan_names_the_forward():
    p = oracle_problem("rms_norm", (4, 16))
    r = gradcheck(lambda x, w, b: p.forward(x, w, b) * np.nan, p.backward, p.inputs)
    assert not r and r.checks[0].name == "forward" and "NaN/Inf" in r.checks[0].note


def test_relative_figures_are_relative_at_small_scale():
    """observed and tolerance are reported relative to the comparison's scale, also when that
    scale is below 1 (outputs of 1e-6): a 1 % error in dx reads as ~1e-2, not 1e-8."""
    p = oracle_problem("rms_norm", (4, 16))

    def small_forward(x, w, b):
        return 1e-6 * p.forward(x, w, b)

    def off_by_1_percent(dy, x, w, b):
        dx, dw, db = p.backward(1e-6 * dy, x, w, b)
        return 1.01 * dx, dw, db

    c = gradcheck(small_forward, off_by_1_percent, p.inputs, names=p.names).check("vjp", "x")
    assert c.passed is False
    assert 1e-4 < c.observed < 1e-1, c.observed


def test_a_wrong_first_entry_is_localised():
    """Entry 0 of the input is searched like any other (the bisection starts at index 0)."""
    p = oracle_problem("rms_norm", (2, 64))

    def first_entry_off(dy, x, w, b):
        dx, dw, db = p.backward(dy, x, w, b)
        dx = dx.copy()
        dx[0, 0] += 1e-3 * np.max(np.abs(dx))
        return dx, dw, db

    r = gradcheck(p.forward, first_entry_off, p.inputs, names=p.names, second_order=False)
    worst = r.check("vjp", "x").worst
    assert worst and worst[0].input_index == (0, 0)
    d = worst[0].to_dict()
    assert set(d) == {"input_index", "output_index", "analytic", "numerical", "error",
                      "tolerance", "ratio"}
    assert d["input_index"] == [0, 0] and d["ratio"] == worst[0].ratio > 1


def test_the_full_jacobian_counts_its_complex_forward_calls():
    p = oracle_problem("rms_norm", (2, 8))
    r = p.check(full=True, second_order=False)
    plain = p.check(full=False, second_order=False)
    # the Jacobian's columns are complex steps of the forward, counted as such
    assert r.evaluations["forward_complex"] > plain.evaluations["forward_complex"]
    assert r.evaluations["forward"] == plain.evaluations["forward"]


def test_second_order_asked_for_on_a_real_only_backward_fails_with_an_infinite_ratio():
    p = oracle_problem("rms_norm", (3, 8))

    def real_only(dy, x, w, b):
        if np.iscomplexobj(dy) or np.iscomplexobj(x):
            raise TypeError("real inputs only")
        return p.backward(dy, x, w, b)

    c = gradcheck(p.forward, real_only, p.inputs, second_order=True).check("second_order")
    assert c.passed is False and c.ratio == math.inf and "cannot be complex-stepped" in c.note
