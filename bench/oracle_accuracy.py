"""Measure the oracle's own error against mpmath, and its float64 distance to PyTorch.

    python bench/oracle_accuracy.py [--rows 3] [--seed 0]

Prints the worst error of ``rmsref.rms_norm`` in float64 ulps against a 200-bit mpmath evaluation
over random rows (N up to 4096, magnitudes 1, 1e-200 and 1e200), and the worst difference to
``torch.nn.functional.rms_norm`` in float64 (in ulps of the result) when torch is installed.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import rmsref


def ulps_vs_mpmath(x: np.ndarray, w: np.ndarray, eps: float) -> float:
    import mpmath

    mpmath.mp.prec = 200
    n = x.size
    y = rmsref.rms_norm(x, n, w, eps=eps)
    xm = [mpmath.mpf(float(v)) for v in x]
    rstd = 1 / mpmath.sqrt(mpmath.fsum(v * v for v in xm) / n + mpmath.mpf(eps))
    exact = np.array([float(v * rstd * mpmath.mpf(float(wi))) for v, wi in zip(xm, w, strict=True)])
    return float(np.max(np.abs(y - exact) / np.spacing(np.abs(exact))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3, help="random rows per (N, scale)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    worst = 0.0
    for n in (1, 7, 64, 1000, 4096):
        for scale, eps in ((1.0, 1e-6), (1.0, 0.0), (1e-200, 0.0), (1e200, 0.0)):
            for _ in range(args.rows):
                x, w = rng.standard_normal(n) * scale, rng.standard_normal(n)
                worst = max(worst, ulps_vs_mpmath(x, w, eps))
    print(f"oracle vs mpmath (200 bits): worst {worst:.2f} float64 ulps on y")

    try:
        import torch
    except ImportError:
        print("torch not installed: no comparison", file=sys.stderr)
        return 0
    worst_t, worst_abs = 0.0, 0.0
    for n in (1, 16, 512, 4096):
        for eps in (None, 1e-6, 0.5):
            x = rng.uniform(-1000, 1000, (8, n))
            w = rng.standard_normal(n)
            ours = rmsref.rms_norm(x, n, w, eps)
            theirs = torch.nn.functional.rms_norm(
                torch.from_numpy(x), (n,), torch.from_numpy(w), eps
            ).numpy()
            worst_abs = max(worst_abs, float(np.max(np.abs(ours - theirs))))
            worst_t = max(worst_t, float(np.max(np.abs(ours - theirs) / np.spacing(np.abs(ours)))))
    print(
        f"oracle vs torch {torch.__version__} F.rms_norm, float64: worst {worst_t:.1f} ulps "
        f"(max abs difference {worst_abs:.2e})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
