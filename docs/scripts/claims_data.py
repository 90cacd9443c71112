"""The measurements behind docs/claims.md, as functions the page and its figures share.

The page calls them on the sizes it prints; ``claims_figures.py`` calls them on the sizes it
draws. Deterministic (fixed seeds), NumPy only (plus ml_dtypes, through rmsref, for bfloat16).
"""

from __future__ import annotations

import os
import re

import numpy as np
from claims_stack import gradient_flow, init_stack, mean_over_rms, stack_forward

import rmsref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------------------------------------
# pre-norm against post-norm
# ------------------------------------------------------------------------------------------------


def flow_ratios(depths, seeds, *, activation: str = "tanh", d: int = 64) -> dict:
    """First-layer/last-layer gradient ratios per placement: ``{placement: (len(depths), seeds)}``
    arrays for the input gradient ("dx") and the sublayer weights' gradient ("dw")."""
    out: dict = {}
    for placement in ("pre", "post"):
        dx = np.empty((len(depths), len(seeds)))
        dw = np.empty_like(dx)
        for i, depth in enumerate(depths):
            for j, seed in enumerate(seeds):
                f = gradient_flow(depth, placement, seed, activation=activation, d=d)
                dx[i, j] = f.dx[0] / f.dx[-1]
                dw[i, j] = f.dw[0] / f.dw[-1]
        out[placement] = {"dx": dx, "dw": dw}
    return out


def geometric_spread(r: np.ndarray) -> np.ndarray:
    """Per row (depth): the geometric standard deviation over seeds, exp(std(log r))."""
    return np.exp(np.std(np.log(r), axis=-1))


# ------------------------------------------------------------------------------------------------
# centring
# ------------------------------------------------------------------------------------------------


def centring_by_depth(depth: int = 32, *, offset: float = 0.0, seeds=range(4), d: int = 64,
                      batch: int = 64) -> dict:
    """|μ|/RMS of the residual stream x_l, l = 0..depth, for pre- and post-norm stacks with and
    without the residual path, at initialisation, for inputs x = offset + z (z ~ N(0, 1)).
    Averaged over seeds. Keys ``(placement, residual)``."""
    out = {}
    for placement in ("pre", "post"):
        for residual in (True, False):
            curves = []
            for seed in seeds:
                stack = init_stack(depth, d, placement, seed, residual=residual)
                x = offset + np.random.default_rng([seed, 3]).standard_normal((batch, d))
                curves.append([mean_over_rms(xl) for xl in stack_forward(stack, x).xs])
            out[(placement, residual)] = np.mean(curves, axis=0)
    return out


def centring_of(stack, *, offset: float = 0.0, seed: int = 0, batch: int = 64) -> np.ndarray:
    """|μ|/RMS of the residual stream of ``stack`` (a trained one, say) by depth."""
    x = offset + np.random.default_rng([seed, 4]).standard_normal((batch, stack.d))
    return np.array([mean_over_rms(xl) for xl in stack_forward(stack, x).xs])


# ------------------------------------------------------------------------------------------------
# large mean
# ------------------------------------------------------------------------------------------------


def rows_with_mean(ratio: float, m: int = 64, n: int = 512, seed: int = 0) -> np.ndarray:
    """Rows x = ratio + z with z centred exactly and σ(z) = 1 per row: μ/σ is ``ratio``."""
    z = np.random.default_rng(seed).standard_normal((m, n))
    z -= z.mean(axis=1, keepdims=True)
    z /= z.std(axis=1, keepdims=True)
    return ratio + z


def large_mean(ratios, *, n: int = 512) -> dict:
    """RMSNorm against LayerNorm as μ/σ grows (no weight, eps = 0).

    cos: the cosine of the two outputs (mean over rows); const: the share of ‖x̂_RMS‖² in the
    constant direction, mean(x̂)²/mean(x̂²); keep[dtype]: the relative error of the centred signal
    read from an output rounded to dtype, ‖c̃ − c‖/‖c‖ with c = x̂ − mean(x̂) (float64) and
    c̃ the same from the rounded output, for RMSNorm ("rms") and LayerNorm ("ln").
    """
    out: dict = {"ratio": np.asarray(ratios, float), "cos": [], "const": [], "rms2_identity": []}
    dtypes = {"float16": np.float16, "bfloat16": rmsref.bfloat16}
    for name in dtypes:
        out[f"keep_rms_{name}"] = []
        out[f"keep_ln_{name}"] = []
    for r in ratios:
        x = rows_with_mean(r, n=n)
        y_rms, rstd_rms = rmsref.rms_norm_forward(x, n, eps=0.0)  # (M, N), (M, 1)
        y_ln, mu, rstd_ln = rmsref.layer_norm_forward(x, n, eps=0.0)
        cos = np.sum(y_rms * y_ln, axis=1) / np.linalg.norm(y_rms, axis=1) / np.linalg.norm(
            y_ln, axis=1)
        out["cos"].append(float(np.mean(cos)))
        out["const"].append(float(np.mean(np.mean(y_rms, axis=1) ** 2 / np.mean(y_rms**2, axis=1))))
        # RMS² = σ² + μ²: 1/rstd_rms² against 1/rstd_ln² + μ², relative
        lhs, rhs = 1.0 / rstd_rms**2, 1.0 / rstd_ln**2 + mu.reshape(-1, 1) ** 2
        out["rms2_identity"].append(float(np.max(np.abs(lhs - rhs) / lhs)))
        for name, dt in dtypes.items():
            for key, y in (("rms", y_rms), ("ln", y_ln)):
                c = y - y.mean(axis=1, keepdims=True)  # the centred signal, float64
                y_low = y.astype(dt).astype(np.float64)  # the output a low-precision kernel stores
                c_low = y_low - y_low.mean(axis=1, keepdims=True)
                out[f"keep_{key}_{name}"].append(float(np.linalg.norm(c_low - c)
                                                       / np.linalg.norm(c)))
    return {k: np.asarray(v) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------
# speed: the committed CPU benchmark
# ------------------------------------------------------------------------------------------------


def cpu_benchmark(path: str | None = None) -> dict:
    """The committed CPU benchmark (bench/results/cpu.md, written by bench/cpu.py): its header
    line (the run) and, per case, the time in ms of each candidate and the ratio rows."""
    path = path or os.path.join(ROOT, "bench", "results", "cpu.md")
    out: dict = {"run": None, "cases": {}}
    if not os.path.isfile(path):
        return out
    with open(path, encoding="utf-8") as f:
        text = f.read()
    first = text.splitlines()[0] if text else ""
    out["run"] = first.lstrip("# ").strip()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.match(r"^\w+:\d+x\d+$", cells[0]):
            continue
        case = out["cases"].setdefault(cells[0], {})
        if cells[2]:
            try:
                case[cells[1]] = float(cells[2])
            except ValueError:
                continue  # a refused candidate
        elif "ratio" in cells[1]:
            case[cells[1]] = float(cells[-1].strip("*"))
    return out
