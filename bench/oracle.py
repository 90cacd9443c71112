"""Time the NumPy oracle's forward against torch's F.rms_norm (CPU), in one run.

    python bench/oracle.py [--shape 8192x4096] [--repeat 5]

Target: the oracle should be within 2x of torch CPU F.rms_norm forward, with bounded memory.
Prints the best-of-repeat wall time of each and their ratio, and the oracle's peak temporary
memory (tracemalloc). torch is optional: without it only the oracle is timed.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc

import numpy as np

import rmsref


def best_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192x4096", help="MxN (default 8192x4096)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    m, n = (int(v) for v in args.shape.lower().split("x"))
    x = np.random.default_rng(0).standard_normal((m, n)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal(n).astype(np.float32)

    t_oracle = best_time(lambda: rmsref.rms_norm(x, n, w), args.repeat)
    tracemalloc.start()
    y = rmsref.rms_norm(x, n, w)
    peak = tracemalloc.get_traced_memory()[1] - y.nbytes
    tracemalloc.stop()
    print(f"shape {m}x{n} float32, best of {args.repeat}")
    print(
        f"oracle rms_norm forward : {t_oracle * 1e3:8.1f} ms   "
        f"temporaries peak {peak / 2**20:.0f} MiB"
    )
    try:
        import torch
    except ImportError:
        print("torch not installed: no comparison", file=sys.stderr)
        return 0
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    t_torch = best_time(lambda: torch.nn.functional.rms_norm(xt, (n,), wt), args.repeat)
    print(
        f"torch F.rms_norm forward: {t_torch * 1e3:8.1f} ms   "
        f"({torch.get_num_threads()} threads, torch {torch.__version__})"
    )
    print(f"ratio oracle / torch    : {t_oracle / t_torch:8.2f}x   (target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
