"""Reproduce the LayerNorm backward's slow state: the same call, on the same arrays in cache, on
one thread, getting several times slower after some seconds, while RMSNorm's kernels do not.

    python bench/slow_state.py                  # 90 s, float32, N = 4096, 64 rows
    python bench/slow_state.py --seconds 30 --no-sleep

Every round times each default kernel (the best of three batches of ``--calls`` calls) on the
same small arrays, then sleeps ``--sleep`` seconds; the process never allocates between rounds.
Each kernel's first reading is its reference: a round is marked when a kernel takes over twice
that. On the machine ``bench/results/cpu-summary.md`` describes, the LayerNorm backward
(``_ln_bwd_pipelined``) went from 0.24 ms to 0.6-2.1 ms within 15-60 s while RMSNorm's backward
kept 0.21 ms; its outputs keep their bits throughout (checked here every round). With
``--no-sleep`` (back-to-back rounds) it did not happen in 45 s. A copy of the kernel compiled
anew in the slow state was as slow, and setting FTZ/DAZ did not help: the cause is not found.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from rmsref.kernels import numba_cpu as K


def _kernels(n: int, rows: int) -> dict:
    """name -> (call, outputs): the default float32 kernels on (1, rows, n) arrays."""
    rng = np.random.default_rng(0)
    x3 = rng.standard_normal((1, rows, n)).astype(np.float32)
    dy3 = rng.standard_normal((1, rows, n)).astype(np.float32)
    x64 = x3[0].astype(np.float64)
    mean = x64.mean(axis=1)
    rstd = 1.0 / np.sqrt(x64.var(axis=1) + 1e-5)
    w = 1.0 + 0.1 * rng.standard_normal(n)
    out3, parts, no_db = np.empty_like(x3), np.empty((1, n)), np.empty((1, 0))
    rstd_out = np.empty(rows)
    redo = np.empty(rows, np.bool_)  # rows to write again (none in these)
    redo_dw = np.empty(1, np.bool_)  # parts whose dweight to sum again (none: float32)
    blocks = -(-rows // K.ROWS_PER_BLOCK)
    return {
        "LayerNorm bwd": (lambda: K._ln_bwd_pipelined(dy3, x3, w, mean, rstd, out3, False, parts,
                                                       no_db, redo, None, 0, 1), (out3, parts)),
        "RMSNorm bwd": (lambda: K._rms_bwd_pipelined(dy3, x3, w, None, True, None, None,
                                                     rstd, out3, parts, redo, redo_dw, 0, 1),
                        (out3, parts)),
        "LayerNorm fwd": (lambda: K._ln_fwd(x3, w, None, w, 1e-5, out3, rstd_out, rstd_out, redo,
                                            None, 0, blocks), (out3, rstd_out)),
        "RMSNorm fwd": (lambda: K._rms_fwd_pipelined(x3, w, 1e-6, out3, rstd_out, redo,
                                                     K._weight_floor(w, x3, out3), 0, blocks),
                        (out3, rstd_out)),
    }


def _best_ms(call, calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0, help="how long to watch")
    p.add_argument("--sleep", type=float, default=1.0, help="seconds between rounds")
    p.add_argument("--no-sleep", action="store_true", help="rounds back to back")
    p.add_argument("--n", type=int, default=4096, help="row length")
    p.add_argument("--rows", type=int, default=64, help="rows (one part of the backward)")
    p.add_argument("--calls", type=int, default=20, help="calls per timed batch")
    args = p.parse_args(argv)
    for name in ("n", "rows", "calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    kernels = _kernels(args.n, args.rows)
    ref: dict[str, float] = {}
    bits: dict[str, list[np.ndarray]] = {}
    for name, (call, outs) in kernels.items():
        call()  # compile (or load from the cache)
        bits[name] = [o.copy() for o in outs]
    t_start = time.time()
    slow_rounds = 0
    print(f"float32, N = {args.n}, {args.rows} rows, one thread; ms per call (x its first)")
    while time.time() < t_start + args.seconds:
        cells = []
        for name, (call, outs) in kernels.items():
            ms = _best_ms(call, args.calls)
            ref.setdefault(name, ms)
            same = all(np.array_equal(o.view(np.uint8), b.view(np.uint8))  # bits, NaN too
                       for o, b in zip(outs, bits[name], strict=True))
            flag = " SLOW" if ms > 2 * ref[name] else ""
            cells.append(f"{name} {ms:.3f} ({ms / ref[name]:.1f}x){flag}"
                         + ("" if same else " BITS CHANGED"))
            if not same:
                print("outputs changed between calls on the same inputs: a bug, not the slow state")
                return 1
        slow_rounds += any("SLOW" in c for c in cells)
        print(f"{time.time() - t_start:5.1f}s  " + " | ".join(cells), flush=True)
        if not args.no_sleep:
            time.sleep(args.sleep)
    print(f"rounds with a kernel over 2x its first reading: {slow_rounds}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
