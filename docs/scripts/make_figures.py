"""Make the documentation's figures: ``python docs/scripts/make_figures.py [--only NAME ...]``.

Writes PNGs to docs/_static/figures/ (committed, so the docs build needs no matplotlib):

- ``jacobian.png``   RMSNorm's Jacobian diag(w)·rstd·(I − x̂x̂ᵀ/N) for one row of N = 16, and the
                     eigenvalues of I − x̂x̂ᵀ/N at eps = 0 and eps > 0 (docs/derivation/rmsnorm.md).
- ``error_vs_n.png`` the measured relative error of float32 RMSNorm forward pipelines against the
                     float64 oracle, in units of u = 2^-24, for N = 2^4 .. 2^16, next to the
                     probabilistic and deterministic bounds of rmsref.tolerance and a √N line
                     (docs/tolerances.md).
- ``bandwidth.png``  GB/s against N of the float32 cases of the CPU benchmark's table
                     (bench/results/cpu.md, written by bench/cpu.py), when it is there
                     (docs/kernels.md); skipped with a message otherwise.

Deterministic (fixed seeds); takes a few seconds. Needs matplotlib (the ``docs`` extra).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "docs", "_static", "figures")
sys.path.insert(0, ROOT)

import rmsref  # noqa: E402
from rmsref import tolerance  # noqa: E402

U32 = 2.0**-24


# ------------------------------------------------------------------------------------------------
# data (importable: tests/test_docs.py checks these functions on small sizes)
# ------------------------------------------------------------------------------------------------


def jacobian_data(n: int = 16, seed: int = 0) -> dict:
    """The Jacobian of one row (by forward mode, one basis vector at a time) and its pieces."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 1.5 + 0.5
    w = 1.0 + 0.3 * rng.standard_normal(n)
    jac = np.stack([rmsref.rms_norm_jvp(x, e, n, w, 0.0) for e in np.eye(n)], axis=1)
    _, rstd = rmsref.rms_norm_forward(x, n, w, 0.0)
    xhat = x * rstd
    eig = {}
    for eps in (0.0, 0.25 * float(np.mean(x * x))):
        _, r = rmsref.rms_norm_forward(x, n, None, eps)
        xh = x * r
        eig[eps] = np.sort(np.linalg.eigvalsh(np.eye(n) - np.outer(xh, xh) / n))
    return {"x": x, "w": w, "jac": jac, "rstd": float(rstd[0]), "xhat": xhat, "eig": eig,
            "ms": float(np.mean(x * x))}


def fp32_forward(x: np.ndarray, w: np.ndarray, eps: float, reduction: str) -> np.ndarray:
    """A float32 RMSNorm forward as a plain kernel computes it (rows of ``x``, float32 in/out).

    ``sequential``: one running float32 sum per row (``np.cumsum`` accumulates in order), as a
    serial loop does; ``pairwise``: NumPy's float32 ``sum`` (blocked pairwise summation).
    Then rstd = 1/sqrt(ms + eps) and y = (x·rstd)·w, each rounded to float32.
    """
    x2 = x * x  # (M, N) float32, rounded squares
    if reduction == "sequential":
        ss = np.cumsum(x2, axis=1, dtype=np.float32)[:, -1:]
    elif reduction == "pairwise":
        ss = np.sum(x2, axis=1, dtype=np.float32, keepdims=True)
    else:
        raise ValueError(reduction)
    ms = ss / np.float32(x.shape[1])  # (M, 1)
    rstd = np.float32(1.0) / np.sqrt(ms + np.float32(eps))  # (M, 1)
    return (x * rstd) * w  # (M, N) float32


def error_vs_n_data(exponents=range(4, 17), elements: int = 1 << 21, seed: int = 0) -> dict:
    """Max relative error of y (units of u = 2^-24) of the float32 pipelines, per N.

    Each N gets max(16, elements // N) Gaussian rows and a weight 1 + 0.3·randn; the reference is
    the float64 oracle on the same float32 inputs (rmsref.tolerance's convention: a kernel is
    judged on its own inputs).
    """
    rng = np.random.default_rng(seed)
    eps = 1e-6
    out: dict = {"n": [], "sequential": [], "pairwise": [], "bound_prob": [], "bound_det": [],
                 "bound_prob_pairwise": []}
    for e in exponents:
        n = 1 << e
        m = max(16, elements // n)
        x = rng.standard_normal((m, n)).astype(np.float32)
        w = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)
        y_ref = rmsref.rms_norm_forward(x, n, w, eps, out_dtype=np.float64)[0]
        scale = np.abs(y_ref)
        out["n"].append(n)
        for red in ("sequential", "pairwise"):
            y = fp32_forward(x, w, eps, red).astype(np.float64)
            out[red].append(float(np.max(np.abs(y - y_ref) / scale)) / U32)
        for key, form, red in (("bound_prob", "probabilistic", "sequential"),
                               ("bound_det", "deterministic", "sequential"),
                               ("bound_prob_pairwise", "probabilistic", "pairwise")):
            model = tolerance.ErrorModel(np.dtype(np.float32), n, reduction=red, form=form)
            out[key].append(model.y_rel() / U32)
    return out


def bench_rows(path: str | None = None) -> list[dict]:
    """Rows (case dtype, n, candidate, gbps) of the CPU benchmark's table, bench/results/cpu.md.

    bench/cpu.py writes a markdown table ``| case | candidate | time (ms) | GB/s | ... |`` with
    cases like ``float32:8192x4096``; rows without a GB/s value (ratios, refused candidates) are
    left out. Empty when the benchmark has not been run and committed.
    """
    path = path or os.path.join(ROOT, "bench", "results", "cpu.md")
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 4:
                continue
            m = re.match(r"(\w+)\W+(\d+)x(\d+)$", cells[0])
            try:
                gbps = float(cells[3])
            except ValueError:
                continue
            if m:
                rows.append({"dtype": m.group(1), "m": int(m.group(2)), "n": int(m.group(3)),
                             "kernel": cells[1], "gbps": gbps})
    return rows


# ------------------------------------------------------------------------------------------------
# figures
# ------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "savefig.bbox": "tight",
                         "svg.hashsalt": "rmsref", "path.simplify": False})
    return plt


def _save(fig, name: str) -> str:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    fig.savefig(path, metadata={"Software": None})
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return path


def make_jacobian() -> str:
    plt = _plt()
    d = jacobian_data()
    n = d["x"].size
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.8), width_ratios=[1.15, 1])
    lim = float(np.max(np.abs(d["jac"])))
    im = ax0.imshow(d["jac"], cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax0.set_title(r"$J = \mathrm{diag}(w)\,\mathrm{rstd}\,(I - \hat x\hat x^\top/N)$"
                  + f", N = {n}")
    ax0.set_xlabel("j (input feature)")
    ax0.set_ylabel("i (output feature)")
    fig.colorbar(im, ax=ax0, shrink=0.85)
    for (eps, eig), marker in zip(d["eig"].items(), ("o", "s"), strict=True):
        label = "eps = 0" if eps == 0 else f"eps = ms/4: {eps / (d['ms'] + eps):.2f} = eps/(ms+eps)"
        ax1.plot(np.arange(1, n + 1), eig, marker, label=label, ms=5, mfc="none")
    ax1.set_title(r"eigenvalues of $I - \hat x\hat x^\top/N$")
    ax1.set_xlabel("index (sorted)")
    ax1.set_ylim(-0.08, 1.12)
    ax1.legend(loc="center right", fontsize=8)
    ax1.grid(alpha=0.3)
    return _save(fig, "jacobian.png")


def make_error_vs_n() -> str:
    plt = _plt()
    d = error_vs_n_data()
    n = np.array(d["n"], dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.loglog(n, d["sequential"], "o-", label="measured: sequential float32 sum")
    ax.loglog(n, d["pairwise"], "s-", label="measured: pairwise float32 sum (NumPy)")
    ax.loglog(n, d["bound_prob"], "--",
              label=r"bound, probabilistic ($\lambda\sqrt{N}u$), sequential")
    ax.loglog(n, d["bound_prob_pairwise"], ":", label="bound, probabilistic, pairwise")
    ax.loglog(n, d["bound_det"], "-.", label=r"bound, deterministic ($N u$), sequential")
    ref = d["sequential"][-1] * np.sqrt(n / n[-1])  # through the largest N, where the sum dominates
    ax.loglog(n, ref, color="0.6", lw=0.8, label=r"$\propto\sqrt{N}$ (through the last point)")
    ax.set_xlabel("N (features per row)")
    ax.set_ylabel("max |ŷ − y| / |y|  in units of u = 2⁻²⁴")
    ax.set_title("float32 RMSNorm forward: error against the float64 oracle")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5)
    return _save(fig, "error_vs_n.png")


def make_bandwidth() -> str | None:
    rows = [r for r in bench_rows() if r["dtype"] == "float32" and (
        r["kernel"].startswith(("parallel copy (", "torch", "jax")) and not r["kernel"].endswith(
            "new array") or "(default)" in r["kernel"])]
    if not rows:
        print("bandwidth.png: no float32 rows in bench/results/cpu.md; run python bench/cpu.py "
              "first (skipped)")
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    styles = ("o-", "s--", "^-.", "D:")  # more lines than colours: each colour once per style
    for i, k in enumerate(sorted({r["kernel"] for r in rows})):
        pts = sorted((r["n"], r["gbps"]) for r in rows if r["kernel"] == k)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[i // 10 % len(styles)],
                label=k, color=f"C{i % 10}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (features per row)")
    ax.set_ylabel("GB/s (bytes formula in bench/cpu.py)")
    ax.set_title("float32 RMSNorm on CPU against N (bench/results/cpu.md)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, "bandwidth.png")


FIGURES = {"jacobian": make_jacobian, "error_vs_n": make_error_vs_n, "bandwidth": make_bandwidth}


def make(figures: dict, description: str, argv=None) -> int:
    """The figure scripts' command line: make every figure, or those named by ``--only``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", nargs="*", choices=sorted(figures), help="make only these")
    args = parser.parse_args(argv)
    for name in args.only or figures:
        figures[name]()
    return 0


def main(argv=None) -> int:
    return make(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
