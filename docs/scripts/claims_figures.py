"""Make the figures of docs/claims.md: ``python docs/scripts/claims_figures.py [--only NAME ...]``.

Writes PNGs to docs/_static/figures/ (committed, so the docs build needs no matplotlib), from the
functions the page itself runs (claims_data.py, claims_stack.py), on more depths and seeds:

- ``claims_gradient_flow.png``  first-layer/last-layer gradient ratio against depth, pre-norm and
                                post-norm, tanh and linear sublayers, every seed a point; and the
                                per-layer gradient profile at L = 64.
- ``claims_training.png``       the toy regression's loss for both placements at two step sizes.
- ``claims_centring.png``       |μ|/RMS of the residual stream by depth, with and without the
                                residual path, for centred inputs and inputs with μ/σ = 2.
- ``claims_large_mean.png``     RMSNorm against LayerNorm as μ/σ grows: the cosine of the two
                                outputs, the constant direction's share, and what a float16 or
                                bfloat16 output keeps of the centred signal.

Deterministic (fixed seeds); about ten seconds. Needs matplotlib (the ``docs`` extra).
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from claims_data import ROOT, centring_by_depth, flow_ratios, large_mean  # noqa: E402
from claims_stack import gradient_flow, train  # noqa: E402

OUT = os.path.join(ROOT, "docs", "_static", "figures")
DEPTHS = (2, 4, 8, 16, 32, 64, 128)
COLORS = {"pre": "C0", "post": "C3"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, name: str) -> str:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    print("wrote", os.path.relpath(path, ROOT))
    return path


def make_gradient_flow() -> str:
    plt = _plt()
    seeds = range(8)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.2))
    for activation, style in (("tanh", "-"), ("linear", ":")):
        r = flow_ratios(DEPTHS, seeds, activation=activation)
        for placement in ("pre", "post"):
            dx = r[placement]["dx"]
            label = f"{placement}-norm, {activation} sublayer"
            ax0.plot(DEPTHS, np.median(dx, axis=1), style, color=COLORS[placement], label=label)
            if activation == "tanh":
                for i, depth in enumerate(DEPTHS):
                    ax0.plot([depth] * dx.shape[1], dx[i], ".", color=COLORS[placement], ms=3,
                             alpha=0.6)
    ax0.axhline(1.0, color="0.5", lw=0.8)
    ax0.set_xscale("log", base=2)
    ax0.set_yscale("log")
    ax0.set_xlabel("depth L (layers)")
    ax0.set_ylabel("‖∂L/∂x_0‖ / ‖∂L/∂x_{L-1}‖  (first / last layer)")
    ax0.set_title("gradient ratio at initialisation (dots: 8 seeds, tanh)")
    ax0.grid(alpha=0.3, which="both")
    ax0.legend(fontsize=8)
    for placement in ("pre", "post"):
        for seed in range(4):
            f = gradient_flow(64, placement, seed)
            ax1.plot(np.arange(64), f.dx / f.dx[-1], color=COLORS[placement], lw=1,
                     alpha=0.8, label=f"{placement}-norm" if seed == 0 else None)
    ax1.set_yscale("log")
    ax1.set_xlabel("layer l (0 = first)")
    ax1.set_ylabel("‖∂L/∂x_l‖ / ‖∂L/∂x_{L-1}‖")
    ax1.set_title("per-layer profile, L = 64, tanh (4 seeds)")
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    return _save(fig, "claims_gradient_flow.png")


def make_training() -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for lr, style in ((3e-3, "-"), (3e-2, "--")):
        for placement in ("pre", "post"):
            losses, _ = train(placement, lr=lr)
            ax.plot(losses, style, color=COLORS[placement], lw=1,
                    label=f"{placement}-norm, Adam lr = {lr:g}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("mean squared error")
    ax.set_title("toy regression, L = 16, d = 32")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, "claims_training.png")


def make_centring() -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.0), sharey=True)
    floor = np.sqrt(2 / np.pi) / np.sqrt(64)
    for ax, offset in zip(axes, (0.0, 2.0), strict=True):
        c = centring_by_depth(32, offset=offset)
        for (placement, residual), v in c.items():
            ax.plot(v, "-" if residual else ":", color=COLORS[placement],
                    label=f"{placement}-norm, {'with' if residual else 'without'} residual")
        ax.axhline(floor, color="0.5", lw=0.8, label=r"random rows: $\sqrt{2/\pi}/\sqrt{d}$")
        ax.set_xlabel("depth l (0 = input)")
        ax.set_title(f"inputs with μ/σ = {offset:g}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("|μ| / RMS of x_l (mean over rows)")
    axes[1].legend(fontsize=8)
    return _save(fig, "claims_centring.png")


def make_large_mean() -> str:
    plt = _plt()
    ratios = np.logspace(-2, 3, 26)
    d = large_mean(ratios)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.0))
    ax0.semilogx(d["ratio"], d["cos"], "o-", ms=3, label="cos(RMSNorm(x), LayerNorm(x))")
    ax0.semilogx(d["ratio"], 1 / np.sqrt(1 + d["ratio"] ** 2), "k:", lw=1,
                 label=r"$\sigma/\mathrm{RMS} = 1/\sqrt{1 + (\mu/\sigma)^2}$")
    ax0.semilogx(d["ratio"], d["const"], "s-", ms=3, label="share of ‖x̂‖² along (1, …, 1)")
    ax0.set_xlabel("μ/σ of the row")
    ax0.set_title("RMSNorm against LayerNorm")
    ax0.grid(alpha=0.3, which="both")
    ax0.legend(fontsize=8)
    for name, marker, color in (("float16", "o", "C0"), ("bfloat16", "s", "C2")):
        ax1.loglog(d["ratio"], d[f"keep_rms_{name}"], marker + "-", ms=3, color=color,
                   label=f"RMSNorm output in {name}")
        ax1.loglog(d["ratio"], d[f"keep_ln_{name}"], ":", color=color,
                   label=f"LayerNorm output in {name}")
    ax1.set_xlabel("μ/σ of the row")
    ax1.set_ylabel("‖c̃ − c‖ / ‖c‖   (c: centred part of the output)")
    ax1.set_title("what a rounded output keeps of the centred signal")
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    return _save(fig, "claims_large_mean.png")


FIGURES = {"gradient_flow": make_gradient_flow, "training": make_training,
           "centring": make_centring, "large_mean": make_large_mean}


def main(argv=None) -> int:
    from make_figures import make

    return make(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
