"""Check, then time, the numba_cuda RMSNorm kernels on a CUDA GPU.

    python bench/gpu_check.py [--quick] [--json PATH] [--budget SECONDS] [--no-torch] [--sweep]
    python bench/gpu_check.py --simulate-tiny      # the same pipeline, tiny, in the simulator
    python bench/gpu_check.py --compile-only       # PTX for sm_90 of every kernel, no GPU needed

Order of work (every variant is checked against the oracle at every launch
configuration before anything is timed):

1. Checks. For N in {512, 1024, 4096, 8192, 16384} and float32 / bfloat16, M = 2^24 / N rows
   (--quick: 2^20): y, rstd, dx, dweight of every launch configuration against the float64 oracle
   run on the same (already rounded) inputs, through ``rmsref.comparison`` (the bounds of
   ``rmsref.tolerance``, docs/tolerances.md; float32 accumulation, blocked reduction over T
   threads). Reported as worst observed/bound ratio (pass: <= 1). Plus bias/offset and the
   fused residual add (both meanings) at N = 4096.
2. Determinism: dweight (and dx) bitwise equal across two backward runs.
3. Timings at M·N in {2^24, 2^26, 2^28} (--quick: 2^24, 2^26): forward and backward of the
   automatic configuration (and the alternatives at the largest size), median of 3 batches of
   CUDA-event-timed launches, as GB/s of compulsory traffic and as a fraction of the measured
   device-to-device copy bandwidth (target: >= 70 % for M·N >= 2^26); and
   ``torch.nn.functional.rms_norm`` (forward, and autograd backward) on the same device memory
   when torch with CUDA is present. 64 rows of every timed shape are checked against the oracle.

Prints a table and writes JSON (default bench/results/gpu_check.json). Exit status 0 when every
check passes (timings are reported, not enforced), 1 otherwise, 3 when no GPU/toolchain is usable.
Wall time on an H100/H200 is meant to stay under ~5 minutes (--quick ~1.5); ``--budget`` stops
starting new timings past that many seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import rmsref  # noqa: E402
from rmsref import tolerance  # noqa: E402
from rmsref._shapes import bfloat16, resolve_eps  # noqa: E402
from rmsref.comparison import Reference, compare, compare_rounded  # noqa: E402
from rmsref.rmsnorm import _residual_sum  # noqa: E402

F32 = np.dtype(np.float32)
DTYPES = {"fp32": F32, "bf16": bfloat16}


# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------


@dataclass
class Sizes:
    ns: tuple[int, ...]
    check_elems: int  # M·N of the full oracle comparison
    time_elems: tuple[int, ...]  # M·N of the timed shapes
    reps: int  # launches per timed batch
    sample_rows: int = 64
    tiny: bool = False

    def rows(self, elems: int, n: int) -> int:
        """M for N features: elems // N, or a few rows in the simulator."""
        return 3 if self.tiny else max(1, elems // n)


# The full oracle comparison runs at 2^22 elements (the float64 oracle on the host dominates the
# check time); the timed shapes, up to 2^28, are checked on sampled rows.
FULL = Sizes((512, 1024, 4096, 8192, 16384), 2**22, (2**24, 2**26, 2**28), 20)
QUICK = Sizes((512, 4096, 16384), 2**20, (2**24, 2**26), 10)
TINY = Sizes((33,), 3 * 33, (3 * 33,), 1, sample_rows=2, tiny=True)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Report:
    device: dict = field(default_factory=dict)
    copy_gbps: float | None = None
    checks: list = field(default_factory=list)
    determinism: list = field(default_factory=list)
    timings: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def ok(self) -> bool:
        return all(c["pass"] for c in self.checks) and all(d["pass"] for d in self.determinism)

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "copy_GBps": self.copy_gbps,
            "checks": self.checks,
            "determinism": self.determinism,
            "timings": self.timings,
            "notes": self.notes,
            "all_checks_pass": self.ok(),
        }


def _check(quantity: str, got: Any, ref: Reference, model: tolerance.ErrorModel,
           name: str | None = None) -> dict:
    """One comparison with the float64 oracle (``rmsref.comparison.compare``) as a report row:
    the worst observed/bound ratio (a non-finite result counts as an infinite error)."""
    c = compare(quantity, got, ref, model)
    return {"quantity": name or quantity, "max_ratio": c.ratio, "pass": c.passed}


def _rounded(name: str, got: np.ndarray, exact: np.ndarray, dtype: np.dtype,
             roundings: int) -> dict:
    """``got`` is ``exact`` rounded at most ``roundings`` times to ``dtype``, as a report row."""
    c = compare_rounded(name, got, exact, dtype, roundings)
    return {"quantity": name, "max_ratio": c.ratio, "pass": c.passed}


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------


class Device:
    """numba.cuda plus the few device utilities this script needs (data, timing, copy)."""

    def __init__(self, k: Any) -> None:
        from numba import cuda

        self.cuda = cuda
        self.k = k
        self.sim = k.SIMULATOR
        self._fill = {}

    # -- data ----------------------------------------------------------------------------
    def random(self, n_elems: int, dtype: np.dtype, seed: int, scale: float = 1.0) -> Any:
        """A flat device array of ~N(0, scale²) values in ``dtype``'s storage (bits for bf16)."""
        kind = self.k._KIND_OF_DTYPE[np.dtype(dtype)]
        storage = self.k._STORAGE_OF_KIND[kind]
        if self.sim:  # tiny: host RNG, then copy
            v = np.random.default_rng(seed).standard_normal(n_elems) * scale
            return self.cuda.to_device(v.astype(dtype).view(storage))
        out = self.cuda.device_array(n_elems, storage)
        self.fill_kernel(kind)[min(65535, max(1, (n_elems + 255) // 256)), 256](
            out, np.uint64(seed), np.float32(scale))
        return out

    def fill_kernel(self, kind: int) -> Any:
        if kind not in self._fill:
            self._fill[kind] = _make_fill_kernel(self.cuda, self.k._STORE[kind])
        return self._fill[kind]

    # -- timing --------------------------------------------------------------------------
    def time_ms(self, fn, reps: int, batches: int = 3) -> float:
        """Median over ``batches`` of (time of ``reps`` back-to-back launches) / reps, in ms.

        In the simulator (tiny mode) one untimed-quality run: the figure means nothing there.
        """
        if self.sim:
            batches = 1
        else:
            fn()
            self.cuda.synchronize()  # warm-up (and compile)
        times = []
        for _ in range(batches):
            if self.sim:
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                times.append((time.perf_counter() - t0) * 1e3 / reps)
                continue
            start, end = self.cuda.event(), self.cuda.event()
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        return float(np.median(times))

    def copy_gbps(self, n_bytes: int) -> float:
        """Device-to-device copy bandwidth (bytes read + written per second), cuMemcpy DtoD."""
        src = self.cuda.device_array(n_bytes // 4, np.float32)
        dst = self.cuda.device_array(n_bytes // 4, np.float32)
        ms = self.time_ms(lambda: dst.copy_to_device(src), reps=10)
        return 2 * n_bytes / (ms * 1e-3) / 1e9


def _make_fill_kernel(cuda: Any, store: Any) -> Any:
    """Counter-based pseudo-normal fill (splitmix64 hash + Box-Muller): fast, no host data."""

    @cuda.jit
    def fill(out, seed, scale):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        stride = cuda.gridDim.x * cuda.blockDim.x
        while i < out.shape[0]:
            z = np.uint64(i) * np.uint64(0x9E3779B97F4A7C15) + seed
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            u1 = (np.float32(z >> np.uint64(40)) + np.float32(0.5)) * np.float32(2.0**-24)
            u2 = np.float32((z >> np.uint64(16)) & np.uint64(0xFFFFFF)) * np.float32(2.0**-24)
            g = math.sqrt(np.float32(-2.0) * math.log(u1)) * math.cos(np.float32(6.2831855) * u2)
            out[i] = store(g * scale)
            i += stride

    return fill


def _host(dev: Any, dtype: np.dtype) -> np.ndarray:
    return dev.copy_to_host().view(dtype)


# --------------------------------------------------------------------------------------------
# Launch configurations
# --------------------------------------------------------------------------------------------


def configurations(k: Any, n: int, tiny: bool) -> list:
    """Every launch configuration worth checking at N: automatic, then forced alternatives."""
    if tiny:
        return [k.Launch(threads=32, variant="block", dw_blocks=2)]
    out = [k.Launch()]
    out.append(k.Launch(held=False))  # the row read twice instead of held in registers
    out.append(k.Launch(variant="block"))  # automatic T, block variant (auto may be warp)
    out.append(k.Launch(variant="block", threads=128))  # many elements per thread at large N
    if n <= k.WARP_ROW_LIMIT:
        out.append(k.Launch(variant="warp", threads=64))
    return _unique(k, n, out)


def timed_configurations(k: Any, n: int, tiny: bool, sweep: bool) -> list:
    """The configurations timed at the largest size: those checked, and with ``sweep`` half and
    twice the block variant's T (each also checked, on sampled rows, when it is timed)."""
    out = configurations(k, n, tiny)
    if sweep and not tiny:
        auto = k.plan_forward(n, 1, k.Launch(variant="block")).threads
        out += [k.Launch(variant="block", threads=t) for t in (auto // 2, 2 * auto)
                if 32 <= t <= k.MAX_THREADS]  # half and twice the automatic T
        if n <= k.WARP_ROW_LIMIT:
            out.append(k.Launch(variant="warp", threads=128))
    return _unique(k, n, out)


def _unique(k: Any, n: int, out: list) -> list:
    """``out`` without the configurations whose plans repeat an earlier one's."""
    seen, unique = set(), []
    for lc in out:
        key = (k.plan_forward(n, 4096, lc), k.plan_backward(n, 4096, lc))
        if key not in seen:
            seen.add(key)
            unique.append(lc)
    return unique


def _label(k: Any, lc: Any, n: int, m: int) -> dict:
    pf, pb = k.plan_forward(n, m, lc), k.plan_backward(n, m, lc)
    return {"variant": pf.variant, "threads": pf.threads, "bwd_threads": pb.threads,
            "dw_blocks": pb.blocks, "held": pf.held, "bwd_held": pb.held}


# --------------------------------------------------------------------------------------------
# 1. checks against the oracle
# --------------------------------------------------------------------------------------------


def _model(dtype: np.dtype, n: int, rows: int, block: int) -> tolerance.ErrorModel:
    """float32 sums, a tree over ``block`` threads (32 for a warp per row)."""
    return tolerance.ErrorModel(dtype, n, rows, acc_dtype=F32, reduction="blocked", block=block)


def _column_model(model: tolerance.ErrorModel) -> tolerance.ErrorModel:
    """dweight and dbias: each column is summed over the rows in order (block by block)."""
    return replace(model, reduction="sequential")


def _forward_block(k: Any, n: int, m: int, lc: Any) -> int:
    """The threads one forward sum is spread over: T for a block per row, 32 for a warp."""
    pf = k.plan_forward(n, m, lc)
    return pf.threads if pf.variant == "block" else k.WARP


def check_shape(dev: Device, rep: Report, n: int, m: int, dtype: np.dtype, dname: str,
                x_d: Any, dy_d: Any, w_d: Any, configs: list) -> None:
    """All configurations at one (N, M, dtype): y, rstd, dx, dweight vs the float64 oracle."""
    k = dev.k
    x, dy = _host(_rows(x_d, m, n), dtype), _host(_rows(dy_d, m, n), dtype)
    ref = Reference(x, (n,), _host(w_d, dtype), resolve_eps(None, dtype), dy=dy)
    for lc in configs:
        label = {"N": n, "M": m, "dtype": dname, **_label(k, lc, n, m)}
        y, rstd = k.rms_norm_forward(_rows(x_d, m, n), n, w_d, launch=lc)
        model = _model(dtype, n, m, _forward_block(k, n, m, lc))
        for r in (_check("y", _host(y, dtype), ref, model),
                  _check("rstd", rstd.copy_to_host(), ref, model)):
            rep.checks.append({**label, "kernel": "forward", **r})
        # the automatic configuration recomputes rstd in the backward; the others take the
        # forward's (as training does, and as the timed backward does)
        saved = None if lc == configs[0] else rstd
        g = k.rms_norm_backward(_rows(dy_d, m, n), _rows(x_d, m, n), n, w_d, rstd=saved,
                                launch=lc)
        model = _model(dtype, n, m, k.plan_backward(n, m, lc).threads)
        for r in (_check("dx", _host(g.dx, dtype), ref, model),
                  _check("dweight", _host(g.dweight, dtype), ref, _column_model(model))):
            rep.checks.append({**label, "kernel": "backward", **r})


def _rows(flat: Any, m: int, n: int) -> Any:
    """The first M·N elements of a flat device buffer as (M, N) rows (a view, no copy)."""
    return flat[: m * n].reshape(m, n)


def check_extras(dev: Device, rep: Report, n: int, m: int, dtype: np.dtype, dname: str,
                 seed: int, lc: Any) -> None:
    """bias + offset (Gemma-style weight), and the fused residual add in both meanings."""
    k = dev.k
    x_d, dy_d, r_d = (dev.random(m * n, dtype, seed + i) for i in range(3))
    w_d = dev.random(n, dtype, seed + 3, 0.3)
    b_d = dev.random(n, dtype, seed + 4, 0.3)
    x, dy, res = (_host(a, dtype).reshape(m, n) for a in (x_d, dy_d, r_d))
    w, b = _host(w_d, dtype), _host(b_d, dtype)
    eps = resolve_eps(None, dtype)
    pf = k.plan_forward(n, m, lc)
    base = {"N": n, "M": m, "dtype": dname, "variant": pf.variant, "threads": pf.threads}
    model_f = _model(dtype, n, m, _forward_block(k, n, m, lc))
    model_b = _model(dtype, n, m, k.plan_backward(n, m, lc).threads)

    ref = Reference(x, (n,), w, eps, dy=dy, offset=1.0, bias=b)
    y, _ = k.rms_norm_forward(_rows(x_d, m, n), n, w_d, bias=b_d, offset=1.0, launch=lc)
    rep.checks.append({**base, "kernel": "forward+bias+offset",
                       **_check("y", _host(y, dtype), ref, model_f)})
    g = k.rms_norm_backward(_rows(dy_d, m, n), _rows(x_d, m, n), n, w_d, bias=b_d, offset=1.0,
                            launch=lc)
    for r in (_check("dx", _host(g.dx, dtype), ref, model_b),
              _check("dbias", _host(g.dbias, dtype), ref, _column_model(model_b))):
        rep.checks.append({**base, "kernel": "backward+bias+offset", **r})

    for rounding in ("fp32-sum", "rounded-sum"):
        y, new_res, rstd = k.add_rms_norm_forward(_rows(x_d, m, n), _rows(r_d, m, n), n, w_d,
                                                  rounding=rounding, launch=lc)
        # the fused add normalises h: its reference is the oracle on h, formed as the oracle does
        h = _residual_sum(x, res, rounding, np.dtype(np.float64))
        ref = Reference(h, (n,), w, eps, dy=dy, dresidual_out=dy)
        rep.checks.append({**base, "kernel": f"add_rms_norm {rounding}",
                           **_check("y", _host(y, dtype), ref, model_f)})
        # new_residual: h itself (no norm), fl32(x + r) then rounded to the residual's dtype
        rep.checks.append({**base, "kernel": f"add_rms_norm {rounding}",
                           **_rounded("new_residual", _host(new_res, dtype), h, dtype, 2)})
        g = k.add_rms_norm_backward(_rows(dy_d, m, n), _rows(dy_d, m, n), _rows(x_d, m, n),
                                    _rows(r_d, m, n), n, w_d, rounding=rounding, rstd=rstd,
                                    launch=lc)
        for r in (_check("dx", _host(g.dx, dtype), ref, model_b),
                  _check("dx", _host(g.dresidual, dtype), ref, model_b, name="dresidual")):
            rep.checks.append({**base, "kernel": f"add_rms_norm_backward {rounding}", **r})


def check_determinism(dev: Device, rep: Report, n: int, m: int, dname: str, x_d: Any,
                      dy_d: Any, w_d: Any, lc: Any) -> None:
    k = dev.k
    runs = [k.rms_norm_backward(_rows(dy_d, m, n), _rows(x_d, m, n), n, w_d, launch=lc)
            for _ in range(2)]
    same_dw = runs[0].dweight.copy_to_host().tobytes() == runs[1].dweight.copy_to_host().tobytes()
    same_dx = runs[0].dx.copy_to_host().tobytes() == runs[1].dx.copy_to_host().tobytes()
    rep.determinism.append({"N": n, "M": m, "dtype": dname, **_label(k, lc, n, m),
                            "dweight_bitwise_equal": same_dw, "dx_bitwise_equal": same_dx,
                            "pass": same_dw and same_dx})


def check_sampled_rows(dev: Device, rep: Report, n: int, m: int, dtype: np.dtype, dname: str,
                       x: Any, dy: Any, w_d: Any, y: Any, dx: Any, lc: Any,
                       rows: int) -> None:
    """At a timed size: the oracle on ``rows`` evenly spaced rows (rows are independent)."""
    k = dev.k
    idx = np.unique(np.linspace(0, m - 1, min(rows, m)).astype(np.int64))
    host = {name: np.stack([_host(a[i], dtype) for i in idx]).astype(np.float64)
            for name, a in (("x", x), ("dy", dy), ("y", y), ("dx", dx))}
    ref = Reference(host["x"], (n,), _host(w_d, dtype), resolve_eps(None, dtype), dy=host["dy"])
    label = {"N": n, "M": m, "dtype": dname, **_label(k, lc, n, m), "sampled_rows": len(idx)}
    model_f = _model(dtype, n, m, _forward_block(k, n, m, lc))
    model_b = _model(dtype, n, m, k.plan_backward(n, m, lc).threads)
    rep.checks.append({**label, "kernel": "forward (timed shape)",
                       **_check("y", host["y"], ref, model_f)})
    rep.checks.append({**label, "kernel": "backward (timed shape)",
                       **_check("dx", host["dx"], ref, model_b)})


# --------------------------------------------------------------------------------------------
# 3. timings
# --------------------------------------------------------------------------------------------


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _as_torch(torch: Any, dev_arr: Any, dtype: np.dtype) -> Any:
    if dtype == bfloat16:
        return torch.as_tensor(dev_arr.view(np.int16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(dev_arr, device="cuda")


def time_shape(dev: Device, rep: Report, n: int, m: int, dtype: np.dtype, dname: str,
               x: Any, dy: Any, w_d: Any, lc: Any, sizes: Sizes, torch: Any) -> None:
    k = dev.k
    fwd = k.prepare_forward(x, n, w_d, launch=lc)
    t_f = dev.time_ms(fwd.run, sizes.reps)
    rstd = fwd.outputs["rstd"]
    bwd = k.prepare_backward(dy, x, n, w_d, rstd=rstd, launch=lc)
    t_b = dev.time_ms(bwd.run, sizes.reps)
    row = {"N": n, "M": m, "elems": m * n, "dtype": dname, **_label(k, lc, n, m),
           "automatic": lc == k.Launch(),
           "fwd_ms": t_f, "fwd_GBps": fwd.bytes_moved / (t_f * 1e-3) / 1e9,
           "bwd_ms": t_b, "bwd_GBps": bwd.bytes_moved / (t_b * 1e-3) / 1e9}
    if rep.copy_gbps:
        row["fwd_frac_copy"] = row["fwd_GBps"] / rep.copy_gbps
        row["bwd_frac_copy"] = row["bwd_GBps"] / rep.copy_gbps
    if torch is not None:
        import torch.nn.functional as F

        xt, dyt, wt = _as_torch(torch, x, dtype), _as_torch(torch, dy, dtype), \
            _as_torch(torch, w_d, dtype)
        eps = resolve_eps(None, dtype)
        row["torch_fwd_ms"] = dev.time_ms(lambda: F.rms_norm(xt, (n,), wt, eps), sizes.reps)
        xg, wg = xt.detach().requires_grad_(), wt.detach().requires_grad_()
        yt = F.rms_norm(xg, (n,), wg, eps)
        row["torch_bwd_ms"] = dev.time_ms(
            lambda: torch.autograd.grad(yt, (xg, wg), dyt, retain_graph=True), sizes.reps)
        row["speedup_fwd_vs_torch"] = row["torch_fwd_ms"] / t_f
        row["speedup_bwd_vs_torch"] = row["torch_bwd_ms"] / t_b
    rep.timings.append(row)
    check_sampled_rows(dev, rep, n, m, dtype, dname, x, dy, w_d, fwd.outputs["y"],
                       bwd.outputs["dx"], lc, sizes.sample_rows)


# --------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------


def _pct(row: dict, key: str) -> str:
    return f"{100 * row[key]:6.0f}" if key in row else f"{'-':>6}"


def _variant(row: dict) -> str:
    """The variant, with "+h" when the forward holds the row in registers and "/h" when the
    backward does (``Launch.held``)."""
    return (row["variant"] + ("+h" if row.get("held") else "")
            + ("/h" if row.get("bwd_held") else ""))


def print_table(rep: Report) -> None:
    print(f"\ndevice: {rep.device}")
    if rep.copy_gbps:
        print(f"measured device copy bandwidth: {rep.copy_gbps:.0f} GB/s (read + write)")
    print("\nchecks vs float64 oracle (worst observed/bound; pass <= 1)")
    print(f"{'N':>6} {'M':>8} {'dtype':>5} {'variant':>9} {'T':>5} {'kernel':<34} "
          f"{'quantity':<13} {'ratio':>9}  ok")
    for c in rep.checks:
        print(f"{c['N']:>6} {c['M']:>8} {c['dtype']:>5} {_variant(c):>9} {c['threads']:>5} "
              f"{c['kernel']:<34} {c['quantity']:<13} {c['max_ratio']:>9.3g}  "
              f"{'ok' if c['pass'] else 'FAIL'}")
    print("\ndeterminism (two backward runs)")
    for d in rep.determinism:
        print(f"  N={d['N']} M={d['M']} {d['dtype']} T={d['bwd_threads']} G={d['dw_blocks']}: "
              f"dweight {'same bits' if d['dweight_bitwise_equal'] else 'DIFFERS'}, "
              f"dx {'same bits' if d['dx_bitwise_equal'] else 'DIFFERS'}")
    if rep.timings:
        print("\ntimings (median of 3 batches; GB/s of compulsory traffic)")
        print(f"{'N':>6} {'M':>8} {'dtype':>5} {'variant':>9} {'T':>5} {'fwd ms':>8} "
              f"{'GB/s':>6} {'%copy':>6} {'bwd ms':>8} {'GB/s':>6} {'%copy':>6} "
              f"{'torch f':>8} {'torch b':>8}")
        for t in rep.timings:
            tf = f"{t['torch_fwd_ms']:8.3f}" if "torch_fwd_ms" in t else f"{'-':>8}"
            tb = f"{t['torch_bwd_ms']:8.3f}" if "torch_bwd_ms" in t else f"{'-':>8}"
            print(f"{t['N']:>6} {t['M']:>8} {t['dtype']:>5} {_variant(t):>9} {t['threads']:>5} "
                  f"{t['fwd_ms']:8.3f} {t['fwd_GBps']:6.0f} {_pct(t, 'fwd_frac_copy')} "
                  f"{t['bwd_ms']:8.3f} {t['bwd_GBps']:6.0f} {_pct(t, 'bwd_frac_copy')} {tf} {tb}")
    for note in rep.notes:
        print(f"note: {note}")


# --------------------------------------------------------------------------------------------
# --compile-only: PTX for every kernel specialisation, without a GPU
# --------------------------------------------------------------------------------------------


def _allow_compile_without_driver(cc: tuple[int, int]) -> str | None:
    """Let numba-cuda compile to PTX where there is no driver and no NVRTC (only libNVVM).

    numba-cuda asks the driver for the current device's compute capability and NVRTC for the
    supported architectures even when only PTX is wanted; here both are answered with ``cc``,
    and libdevice is found next to libNVVM. Returns None, or why compiling is impossible.
    """
    os.environ.setdefault("NUMBA_FORCE_CUDA_CC", f"{cc[0]}.{cc[1]}")
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import libs, nvvm

    try:
        libs.get_libdevice()
        found = True
    except Exception:  # noqa: BLE001 - NVRTC or CUDA paths missing
        found = False
    if not found:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        path = Path(home) / "nvvm" / "libdevice" / "libdevice.10.bc"
        if not path.exists():
            return f"libdevice not found (looked in {path}); install the CUDA toolkit's NVVM"
        data = path.read_bytes()
        libs.get_libdevice = nvvm.get_libdevice = lambda: str(path)
        libs.open_libdevice = nvvm.open_libdevice = lambda: data

    try:
        nvvm.NVVM()  # loads libNVVM
    except Exception as exc:  # noqa: BLE001
        return f"libNVVM cannot be loaded ({str(exc).splitlines()[0]})"

    class _Dev:
        compute_capability = cc

    try:
        from numba import cuda

        has_gpu = cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    if not has_gpu:
        dispatcher.get_current_device = lambda: _Dev()
    return None


def ptx_fingerprint(ptx: str) -> str:
    """A short hash of the generated code, equal across processes and checkouts when the code is.

    Left out: what numba varies from one process to the next without changing the code, the
    version tags of its mangled names (``B2v6``) and the order of its environment-pointer
    declarations (``.common .global ... NumbaEnv...``).
    """
    lines = [line for line in ptx.splitlines()
             if not (line.startswith(".common .global") and "NumbaEnv" in line)]
    text = re.sub(r"B\d+v\d+(?=B)", "Bv", "\n".join(lines))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_only(quick: bool) -> int:
    from numba import cuda, types

    cc = (9, 0)
    why = _allow_compile_without_driver(cc)
    if why:
        print(f"cannot compile: {why}")
        return 3
    from rmsref.kernels import numba_cuda as k

    def arr(kind: int | None, nd: int) -> Any:  # an absent array: a float32 placeholder
        return types.Array(types.float32 if kind in (None, k.F32) else types.uint16, nd, "C")

    f32, i64 = types.float32, types.int64
    # --quick: one specialisation per kernel (bfloat16, every option on), as a smoke test
    kinds = (k.BF16,) if quick else (k.F32, k.F16, k.BF16)
    jobs = []
    for kx in kinds:
        # which optional arrays exist: weight, bias, residual (and "rounded-sum")
        fwd_opts = [(True, True, True, True)]
        if not quick:
            fwd_opts += [(False, False, False, False), (True, False, False, False),
                         (True, True, True, False)]
        # cols > 0: the row held in registers (N = 2048 over 256 threads; N = 512 over a warp)
        layouts = (("block", 0), ("block", 8), ("warp", 0), ("warp", 16))
        for (variant, cols), (has_w, has_b, has_r, rounded) in itertools.product(layouts,
                                                                                 fwd_opts):
            o = k.ForwardOptions(variant=variant, threads=256, x=kx, y=kx,
                                 weight=kx if has_w else None, bias=kx if has_b else None,
                                 residual=kx if has_r else None, rounded=rounded, cols=cols)
            sig = (arr(o.x, 2), arr(o.residual, 2), arr(o.weight, 1), arr(o.bias, 1),
                   arr(o.y, 2), arr(o.residual, 2), types.Array(f32, 1, "C"), i64, i64, f32,
                   f32, f32)
            jobs.append((f"forward {variant}: {o}", k._forward_kernel(o), sig,
                         "shfl.sync.bfly" if variant == "warp" else None))
        # weight, bias, residual, dresidual_out, "rounded-sum", saved rstd
        bwd_opts = [(True, True, True, True, True, False)]
        if not quick:
            bwd_opts += [(False, False, False, False, False, False),
                         (True, False, False, False, False, True)]
        # held: N = 4096 over 512 threads, h and dy held in registers; else N = 16384 over 1024
        for (held, threads, cols), (has_w, has_b, has_r, has_dro, rounded, saved) in \
                itertools.product(((False, 1024, 16), (True, 512, 8)), bwd_opts):
            o = k.BackwardOptions(threads=threads, cols=cols, x=kx, dy=kx,
                                  weight=kx if has_w else None, bias=has_b,
                                  residual=kx if has_r else None,
                                  dresidual_out=kx if has_dro else None, rounded=rounded,
                                  saved_rstd=saved, held=held)
            sig = (arr(o.dy, 2), arr(o.x, 2), arr(o.residual, 2), arr(o.weight, 1),
                   arr(o.dresidual_out, 2), types.Array(f32, 1, "C"), arr(o.x, 2),
                   arr(o.residual, 2), types.Array(f32, 2, "C"), types.Array(f32, 2, "C"), i64,
                   i64, i64, f32, f32, f32)
            jobs.append((f"backward: {o}", k._backward_kernel(o), sig, None))
        if not quick:
            jobs.append((f"column_sum kind={kx}", k._column_sum_kernel(kx),
                         (types.Array(f32, 2, "C"), arr(kx, 1), i64), None))
        jobs.append((f"fill kind={kx}", _make_fill_kernel(cuda, k._STORE[kx]),
                     (arr(kx, 1), types.uint64, f32), None))
    t0 = time.perf_counter()
    failures = 0
    for name, kern, sig, must in jobs:
        try:
            # the kernel's own launch bound (numba_cuda._kernel_jit), as its launches compile it
            bound = getattr(kern, "targetoptions", {}).get("launch_bounds")
            ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc, launch_bounds=bound)
        except Exception as exc:  # noqa: BLE001 - report every failing kernel, then fail
            failures += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        problems = []
        if "atom." in ptx:
            problems.append("uses atomics")
        if must and must not in ptx:
            problems.append(f"missing {must}")
        if bound is not None and f".maxntid {bound}" not in ptx:
            problems.append(f"no launch bound of {bound} threads (.maxntid) in the PTX")
        if problems:
            failures += 1
        bounded = f", launch bound {bound} threads" if bound is not None else ""
        print(f"{'FAIL' if problems else 'ok  '} {name} ({len(ptx)} chars of PTX{bounded}, "
              f"fingerprint {ptx_fingerprint(ptx)}) {'; '.join(problems)}")
    print(f"compiled {len(jobs) - failures}/{len(jobs)} kernels to PTX for sm_{cc[0]}{cc[1]} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 1 if failures else 0


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer N, smaller sizes (~1.5 min)")
    p.add_argument("--simulate-tiny", action="store_true",
                   help="run the pipeline on tiny shapes in Numba's CUDA simulator (for tests)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every kernel to PTX (sm_90); needs libNVVM, not a GPU")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "gpu_check.json"))
    p.add_argument("--budget", type=float, default=270.0,
                   help="seconds after which no new timing is started (default 270)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    p.add_argument("--sweep", action="store_true",
                   help="also time half and twice the automatic threads per block")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.simulate_tiny:
        if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            print("--simulate-tiny: numba was imported without NUMBA_ENABLE_CUDASIM=1; run in a "
                  "fresh process")
            return 3
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if args.compile_only:
        return compile_only(args.quick)
    reason = rmsref.backends.why_unavailable("numba_cuda")
    if reason is not None:
        print(f"numba_cuda backend unavailable: {reason}")
        return 3
    k = rmsref.backend("numba_cuda")
    if k.SIMULATOR and not args.simulate_tiny:
        print("the simulator is on (NUMBA_ENABLE_CUDASIM=1): use --simulate-tiny, or unset it "
              "on a GPU machine")
        return 3
    sizes = TINY if args.simulate_tiny else (QUICK if args.quick else FULL)
    t_start = time.perf_counter()
    dev = Device(k)
    rep = Report()
    rep.device = _device_info(dev)
    torch = None if (args.no_torch or sizes.tiny) else _torch_cuda()
    if sizes.tiny:
        rep.notes.append("simulator (--simulate-tiny): the pipeline ran, timings mean nothing")
    if torch is None and not sizes.tiny and not args.no_torch:
        rep.notes.append("torch with CUDA not available: no torch comparison")

    if not sizes.tiny:
        rep.copy_gbps = dev.copy_gbps(2**30 if not args.quick else 2**28)
    # One flat buffer per operand and dtype, sized for the largest shape; every (M, N) is a view.
    n_extra = 4096 if not sizes.tiny else sizes.ns[-1]
    check_need = max(sizes.rows(sizes.check_elems, n) * n for n in (*sizes.ns, n_extra))
    biggest = max(sizes.rows(e, n) * n for e in sizes.time_elems for n in sizes.ns)
    for di, (dname, dtype) in enumerate(DTYPES.items()):
        seed = 1000 * (di + 1)
        x_d = dev.random(check_need, dtype, seed)
        dy_d = dev.random(check_need, dtype, seed + 1)
        for n in sizes.ns:
            w_d = dev.random(n, dtype, seed + 2 + n, 0.5)
            m = sizes.rows(sizes.check_elems, n)
            configs = configurations(k, n, sizes.tiny)
            check_shape(dev, rep, n, m, dtype, dname, x_d, dy_d, w_d, configs)
            check_determinism(dev, rep, n, m, dname, x_d, dy_d, w_d, configs[0])
            _progress(t_start, f"checked N={n} {dname} ({len(configs)} configurations)")
        check_extras(dev, rep, n_extra, sizes.rows(sizes.check_elems, n_extra), dtype, dname,
                     seed + 7, configurations(k, n_extra, sizes.tiny)[0])
        _progress(t_start, f"checked bias/offset/residual {dname}")

    # timings: only once every check above has been made; bfloat16 first, so that a budget
    # cut falls on float32
    for dname, dtype in reversed(DTYPES.items()):
        x_d = dev.random(biggest, dtype, 77)
        dy_d = dev.random(biggest, dtype, 78)
        for n in sizes.ns:
            w_d = dev.random(n, dtype, 79, 0.5)
            for elems in sizes.time_elems:
                m = sizes.rows(elems, n)
                largest = elems == max(sizes.time_elems) and not sizes.tiny
                configs = timed_configurations(k, n, sizes.tiny, args.sweep) if largest else [
                    configurations(k, n, sizes.tiny)[0]]
                for lc in configs:
                    if time.perf_counter() - t_start > args.budget:
                        rep.notes.append(f"budget of {args.budget:.0f} s reached: timings "
                                         f"from N={n} M={m} {dname} on were skipped")
                        break
                    # torch once per shape, next to the automatic configuration
                    time_shape(dev, rep, n, m, dtype, dname, _rows(x_d, m, n),
                               _rows(dy_d, m, n), w_d, lc, sizes,
                               torch if lc == k.Launch() else None)
                    if largest:
                        check_determinism(dev, rep, n, m, dname, x_d, dy_d, w_d, lc)
            _progress(t_start, f"timed N={n} {dname}")
    _summarise_target(rep)
    rep.notes.append(f"wall time {time.perf_counter() - t_start:.0f} s")
    print_table(rep)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep.to_json(), indent=1, default=float) + "\n")
    print(f"\nwrote {out}; all checks {'pass' if rep.ok() else 'DO NOT pass'}")
    return 0 if rep.ok() else 1


def _device_info(dev: Device) -> dict:
    info = {"simulator": dev.sim, "python": platform.python_version(), "numpy": np.__version__}
    try:
        import numba_cuda

        info["numba_cuda"] = getattr(numba_cuda, "__version__", "?")
    except ImportError:
        pass
    if not dev.sim:
        d = dev.cuda.get_current_device()
        name = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
        info.update(name=name, compute_capability=list(d.compute_capability),
                    multiprocessors=int(d.MULTIPROCESSOR_COUNT))
    return info


def _summarise_target(rep: Report) -> None:
    """Target: >= 70 % of copy bandwidth for M·N >= 2^26, for the automatic configuration (the
    forced alternatives are timed to compare with it, not judged)."""
    rows = [t for t in rep.timings
            if t["elems"] >= 2**26 and t.get("automatic") and "fwd_frac_copy" in t]
    if not rows:
        return
    worst = min(min(t["fwd_frac_copy"], t["bwd_frac_copy"]) for t in rows)
    rep.notes.append(f"worst fraction of copy bandwidth at M·N >= 2^26, automatic "
                     f"configuration: {100 * worst:.0f} % "
                     f"(target 70 %: {'met' if worst >= 0.7 else 'NOT met'})")


def _progress(t0: float, what: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {what}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
