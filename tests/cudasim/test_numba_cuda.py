"""numba_cuda kernels against the float64 oracle, in the CUDA simulator (or on a GPU).

Reference: the float64 oracle on exactly the (already rounded) inputs the kernel saw, compared
through the library's one engine (``rmsref.comparison.Reference`` / ``compare``). Tolerance: the
model of docs/tolerances.md (``rmsref.tolerance``) for float32 accumulation with a blocked
reduction over T threads (sequential over rows for dweight and dbias).

Grids are tiny (the simulator runs ~0.35 s per 128-thread block): threads per block are forced
to 32 and 64 so that N ∈ {1, 7, 33, 64, 130} covers one partial block (N < T), exact multiples
(N = 64) and multi-pass rows with a tail (N = 130 > 2T); dw_blocks is forced below M so blocks
own several rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np
import pytest

import rmsref
from rmsref import tolerance
from rmsref._shapes import bfloat16, resolve_eps
from rmsref.comparison import Reference, compare, compare_rounded
from rmsref.rmsnorm import _residual_sum

DT = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": bfloat16}
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

# Options cycle against rows so that every (rows, options) pair appears (5 and 3 are coprime).
OPTIONS = [
    {},
    {"weight": True},
    {"weight": True, "bias": True},
    {"weight": True, "bias": True, "offset": 1.0},
    {"offset": 0.5, "partial": 0.5},
]


def _cases() -> list:
    cases = []
    for i, (dname, threads, n) in enumerate(
        itertools.product(DT, (32, 64), (1, 7, 33, 64, 130))
    ):
        m = (1, 3, 5)[i % 3]
        opt = dict(OPTIONS[i % len(OPTIONS)])
        if n < 2:
            opt.pop("partial", None)  # floor(1 * p) = 0 features: rejected by design
        dw_blocks = 2 if (m > 2 and i % 2) else None
        saved = bool(i % 2)  # pass the forward's rstd to the backward, or let it recompute
        tag = "".join(k[0] for k in opt) or "plain"
        cases.append(
            pytest.param(dname, threads, n, m, opt, dw_blocks, saved,
                         id=f"{dname}-T{threads}-N{n}-M{m}-{tag}-G{dw_blocks or 'auto'}")
        )
    return cases


def _model(out_dtype, n: int, rows: int = 1, threads: int = 32) -> tolerance.ErrorModel:
    """float32 sums over T threads (a block's tree; T = 32 for a warp per row)."""
    return tolerance.ErrorModel(np.dtype(out_dtype), n, rows, acc_dtype=F32,
                                reduction="blocked", block=threads)


def _column_model(model: tolerance.ErrorModel) -> tolerance.ErrorModel:
    """dweight and dbias: each column is summed over the rows in order (block by block)."""
    return dataclasses.replace(model, reduction="sequential")


def _f64(a):
    return None if a is None else np.asarray(a).astype(np.float64)


def _assert_close(quantity: str, got, ref: Reference, model: tolerance.ErrorModel,
                  label: str = "") -> None:
    """``got`` within the bound of the oracle (``rmsref.comparison.compare``); on failure name
    the worst element and its ratio."""
    c = compare(quantity, got, ref, model)
    if c.passed:
        return
    worst = c.worst
    actual = np.asarray(got, np.float64).reshape(c.reference.shape)[worst]
    raise AssertionError(
        f"{label or quantity}: worst element {worst}: got {actual!r}, exact "
        f"{c.reference[worst]!r}, bound {c.bound[worst]:.3g} (ratio {c.ratio:.3g})"
    )


def _assert_rounded(name: str, got, exact, dtype, roundings: int) -> None:
    """``got`` is ``exact`` after at most ``roundings`` roundings to ``dtype`` (no norm here:
    the fused add's new_residual is h itself, rounded)."""
    c = compare_rounded(name, got, exact, dtype, roundings)
    assert c.passed, f"{name}: worst element {c.worst}, error/bound {c.ratio:.3g}"


def _data(rng, dtype, m: int, n: int, opt: dict):
    x = (rng.standard_normal((m, n)) * 2.0).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    w = (1.0 + 0.5 * rng.standard_normal(n)).astype(dtype) if opt.get("weight") else None
    b = (0.5 * rng.standard_normal(n)).astype(dtype) if opt.get("bias") else None
    return x, dy, w, b


@pytest.mark.parametrize("dname,threads,n,m,opt,dw_blocks,saved", _cases())
def test_forward_backward_vs_oracle(kcuda, rng, dname, threads, n, m, opt, dw_blocks, saved):
    dtype = DT[dname]
    x, dy, w, b = _data(rng, dtype, m, n, opt)
    offset, partial = opt.get("offset", 0.0), opt.get("partial")
    eps = resolve_eps(None, dtype)
    launch = kcuda.Launch(threads=threads, variant="block", dw_blocks=dw_blocks)

    y, rstd = kcuda.rms_norm_forward(x, n, w, bias=b, offset=offset, partial=partial,
                                     launch=launch)
    assert y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == F32 and rstd.shape == (m, 1)

    # reference: the oracle in float64 on the kernel's own inputs, eps given explicitly
    ref = Reference(x, (n,), w, eps, dy=dy, offset=offset, bias=b, partial=partial)
    model = _model(dtype, n, m, threads)
    _assert_close("y", y, ref, model)
    _assert_close("rstd", rstd, ref, model)

    grads = kcuda.rms_norm_backward(dy, x, n, w, rstd=rstd if saved else None, bias=b,
                                    offset=offset, partial=partial, launch=launch)
    assert grads.dx.dtype == dtype and grads.dx.shape == x.shape
    _assert_close("dx", grads.dx, ref, model)
    if w is None:
        assert grads.dweight is None
    else:
        assert grads.dweight.dtype == dtype and grads.dweight.shape == (n,)
        _assert_close("dweight", grads.dweight, ref, _column_model(model))
    if b is None:
        assert grads.dbias is None
    else:
        assert grads.dbias.dtype == dtype
        _assert_close("dbias", grads.dbias, ref, _column_model(model))


def _residual_cases() -> list:
    cases = []
    combos = [(d, d) for d in DT] + [("bf16", "f32"), ("f16", "f32"), ("f32", "bf16")]
    for i, ((dx_name, dr_name), rounding) in enumerate(
        itertools.product(combos, ("fp32-sum", "rounded-sum"))
    ):
        if rounding == "rounded-sum" and dx_name != dr_name:
            continue  # mixed dtypes are the fp32-residual-stream case, which sums in fp32
        n = (7, 130, 33)[i % 3]
        threads = (32, 64)[i % 2]
        cases.append(pytest.param(dx_name, dr_name, rounding, n, threads, bool(i % 2),
                                  id=f"{dx_name}+{dr_name}-{rounding}-N{n}-T{threads}"))
    return cases


@pytest.mark.parametrize("dx_name,dr_name,rounding,n,threads,with_dro", _residual_cases())
def test_add_rms_norm_vs_oracle(kcuda, rng, dx_name, dr_name, rounding, n, threads, with_dro):
    xdt, rdt = DT[dx_name], DT[dr_name]
    m = 3
    x = rng.standard_normal((m, n)).astype(xdt)
    res = (2.0 * rng.standard_normal((m, n))).astype(rdt)
    w = (1.0 + 0.5 * rng.standard_normal(n)).astype(xdt)
    dy = rng.standard_normal((m, n)).astype(xdt)
    dro = rng.standard_normal((m, n)).astype(rdt) if with_dro else None
    offset = 1.0 if with_dro else 0.0
    eps = resolve_eps(None, xdt)
    launch = kcuda.Launch(threads=threads, dw_blocks=2)

    y, new_res, rstd = kcuda.add_rms_norm_forward(x, res, n, w, rounding=rounding,
                                                  offset=offset, launch=launch)
    assert (y.dtype, new_res.dtype, rstd.dtype) == (xdt, rdt, F32)

    # reference: the oracle on the exact h, which the fused add normalises
    h = _residual_sum(x, res, rounding, F64)  # formed as the oracle forms it
    ref = Reference(h, (n,), w, eps, dy=dy, offset=offset, dresidual_out=dro)
    model = _model(xdt, n, m, threads)
    _assert_close("y", y, ref, model)
    _assert_close("rstd", rstd, ref, model)
    # new_residual: h rounded to the residual's dtype; fl32(x + r) first, so at most two
    # roundings (one when x and r share a dtype, or r is float32)
    _assert_rounded("new_residual", new_res, h, rdt, roundings=2)

    grads = kcuda.add_rms_norm_backward(dy, dro, x, res, n, w, rounding=rounding,
                                        rstd=rstd if with_dro else None, offset=offset,
                                        launch=launch)
    for name, got, dt in (("dx", grads.dx, xdt), ("dresidual", grads.dresidual, rdt)):
        assert got.dtype == dt and got.shape == x.shape
        _assert_close("dx", got, ref, _model(dt, n, m, threads), label=name)  # both are dh
    _assert_close("dweight", grads.dweight, ref, _column_model(model))


def test_dweight_bitwise_reproducible(kcuda, rng):
    """Two runs, same inputs and launch: the same bits (no atomics, fixed summation order)."""
    m, n = 5, 33
    x = rng.standard_normal((m, n)).astype(bfloat16)
    dy = rng.standard_normal((m, n)).astype(bfloat16)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    launch = kcuda.Launch(threads=32, dw_blocks=2)
    runs = [kcuda.rms_norm_backward(dy, x, n, w, bias=b, launch=launch) for _ in range(2)]
    for name in ("dx", "dweight", "dbias"):
        a, c = (getattr(r, name) for r in runs)
        assert a.dtype == c.dtype
        assert a.tobytes() == c.tobytes(), f"{name} differs between two identical runs"


def test_multidim_normalized_shape(kcuda, rng):
    """normalized_shape (5, 7) over x (2, 3, 5, 7): 6 rows of 35, rstd shaped (2, 3, 1, 1)."""
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    y, rstd = kcuda.rms_norm_forward(x, (5, 7), w, launch=kcuda.Launch(threads=32))
    assert y.shape == x.shape and rstd.shape == (2, 3, 1, 1)
    ref = Reference(x, (5, 7), w, resolve_eps(None, x.dtype))
    _assert_close("y", y, ref, _model(F32, 35, 6, 32))
    g = kcuda.rms_norm_backward(x, x, (5, 7), w, launch=kcuda.Launch(threads=32))
    assert g.dx.shape == x.shape and g.dweight.shape == (5, 7)


def test_non_contiguous_host_input(kcuda, rng):
    """A strided / Fortran-ordered NumPy input gives the same bits as its contiguous copy."""
    big = rng.standard_normal((3, 66)).astype(np.float32)
    x = big[:, ::2]  # (3, 33), stride 2
    w = rng.standard_normal(66).astype(np.float32)[::2]
    launch = kcuda.Launch(threads=32)
    y, rstd = kcuda.rms_norm_forward(x, 33, w, launch=launch)
    y_c, rstd_c = kcuda.rms_norm_forward(np.ascontiguousarray(x), 33, np.ascontiguousarray(w),
                                         launch=launch)
    assert y.tobytes() == y_c.tobytes() and rstd.tobytes() == rstd_c.tobytes()
    g = kcuda.rms_norm_backward(np.asfortranarray(x), x, 33, w, launch=launch)
    xc = np.ascontiguousarray(x)
    g_c = kcuda.rms_norm_backward(xc, xc, 33, np.ascontiguousarray(w), launch=launch)
    assert g.dx.tobytes() == g_c.dx.tobytes() and g.dweight.tobytes() == g_c.dweight.tobytes()


def test_context_manager_forces_launch(kcuda, rng):
    """launch_config(...) applies inside the block only; explicit launch= wins over it."""
    with kcuda.launch_config(threads=64, dw_blocks=3):
        assert kcuda.plan_forward(33, 5).threads == 64
        assert kcuda.plan_backward(33, 5).blocks == 3
        assert kcuda.plan_forward(33, 5, kcuda.Launch(threads=32)).threads == 32
    assert kcuda.plan_forward(33, 5).threads == 256  # automatic: warp variant, 8 rows/block
    assert kcuda.plan_backward(33, 5).threads == 32  # automatic: N/8 -> clamped to 32
    assert kcuda.plan_backward(33, 5).blocks == 5  # automatic: min(M, 1024)


def test_launch_plan_rules(kcuda):
    """The documented choices: T = pow2 >= N/8 in [32, 1024]; G = min(M, 1024); C = ceil(N/T);
    the row held in registers up to C = min(32, 8192 / T) forward, min(16, 512 / T) backward."""
    for n, t in ((1, 32), (256, 32), (257, 64), (4096, 512), (8192, 1024), (16384, 1024)):
        assert kcuda.plan_backward(n, 7).threads == t
        c = -(-n // t)
        if n > 1024:
            assert kcuda.plan_forward(n, 7) == kcuda.Plan("block", t, 1, 7, c, c <= 8192 // t)
        assert kcuda.plan_forward(n, 7, kcuda.Launch(variant="block")).threads == t
        assert kcuda.plan_backward(n, 7).held == (c <= min(16, 512 // t))
    assert kcuda.plan_backward(16384, 5000).blocks == 1024
    assert kcuda.plan_backward(16384, 5000).cols_per_thread == 16
    assert kcuda.plan_backward(512, 5).held  # T = 64, C = 8
    assert not kcuda.plan_backward(1024, 5).held  # T = 128, C = 8
    assert kcuda.plan_forward(4096, 5).held  # T = 512, C = 8
    assert kcuda.plan_forward(8192, 5).held  # T = 1024, C = 8
    assert not kcuda.plan_forward(16384, 5).held  # C = 16 > 8192 / 1024
    assert kcuda.plan_forward(512, 100) == kcuda.Plan("warp", 256, 8, 13, 16, True)
    assert kcuda.plan_forward(1024, 100).cols_per_thread == 32  # a warp per row: C = N / 32
    assert kcuda.plan_forward(1024, 100).held
    assert not kcuda.plan_forward(4096, 1, kcuda.Launch(held=False)).held
    assert kcuda.plan_backward(16384, 1, kcuda.Launch(held=True)).held
    assert not kcuda.plan_backward(16384, 1, kcuda.Launch(threads=32)).held  # C = 512
    with pytest.raises(TypeError, match="held must be"):
        kcuda.plan_forward(33, 1, kcuda.Launch(held="yes"))
    assert kcuda.plan_forward(1025, 100).variant == "block"
    with pytest.raises(ValueError, match="multiple of 32"):
        kcuda.plan_forward(33, 1, kcuda.Launch(variant="warp", threads=16))
    with pytest.raises(ValueError, match="power of two"):
        kcuda.plan_forward(33, 1, kcuda.Launch(threads=48))
    with pytest.raises(ValueError, match="variant"):
        kcuda.plan_forward(33, 1, kcuda.Launch(variant="tile"))
    with pytest.raises(ValueError, match="dw_blocks"):
        kcuda.plan_backward(33, 4, kcuda.Launch(dw_blocks=0))


@pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
    reason="the real shfl_xor_sync needs a GPU (the simulator has no warp shuffles; the warp "
    "variant's indexing runs there with an emulated shuffle in test_warp_variant_emulated)",
)
@pytest.mark.parametrize("threads", [32, 64, 256])
@pytest.mark.parametrize("dname", list(DT))
def test_warp_variant_vs_oracle(kcuda, rng, dname, threads):
    dtype = DT[dname]
    for n, m in ((1, 3), (33, 5), (130, 9), (1024, 17)):
        x = rng.standard_normal((m, n)).astype(dtype)
        w = rng.standard_normal(n).astype(dtype)
        res = rng.standard_normal((m, n)).astype(dtype)
        launch = kcuda.Launch(threads=threads, variant="warp")
        eps = resolve_eps(None, dtype)
        model = _model(dtype, n, m, 32)  # a warp per row: the butterfly over 32 lanes
        y, rstd = kcuda.rms_norm_forward(x, n, w, launch=launch)
        _assert_close("y", y, Reference(x, (n,), w, eps), model, label=f"y N={n}")
        y2, r2, _ = kcuda.add_rms_norm_forward(x, res, n, w, launch=launch)
        ref = Reference(_residual_sum(x, res, "fp32-sum", F64), (n,), w, eps)
        _assert_close("y", y2, ref, model, label=f"add y N={n}")


@pytest.mark.parametrize("dname", list(DT))
def test_warp_variant_emulated(kcuda, rng, dname):
    """Warp per row at tiny sizes: rows per block = T/32, lanes striding over N, the tail, and
    warps past the last row (M = 3 with 2 rows per block). In the simulator the shuffle is
    emulated (same additions, same order); on a GPU this runs the real one."""
    dtype = DT[dname]
    m = 3
    for n, threads in ((1, 64), (33, 32), (130, 64)):
        x = rng.standard_normal((m, n)).astype(dtype)
        w = (1.0 + 0.5 * rng.standard_normal(n)).astype(dtype)
        launch = kcuda.Launch(threads=threads, variant="warp")
        eps = resolve_eps(None, dtype)
        model = _model(dtype, n, m, 32)  # a warp per row: the butterfly over 32 lanes
        y, rstd = kcuda.rms_norm_forward(x, n, w, launch=launch)
        ref = Reference(x, (n,), w, eps)
        _assert_close("y", y, ref, model, label=f"y N={n}")
        _assert_close("rstd", rstd, ref, model, label=f"rstd N={n}")
        if n == 130:  # the fused residual add through the same kernel
            res = rng.standard_normal((m, n)).astype(dtype)
            y2, r2, _ = kcuda.add_rms_norm_forward(x, res, n, w, launch=launch)
            h = _residual_sum(x, res, "fp32-sum", F64)
            _assert_close("y", y2, Reference(h, (n,), w, eps), model, label="add y")
            _assert_rounded("new_residual", r2, h, dtype, roundings=2)


@pytest.mark.parametrize("variant,dname", [("block", "bf16"), ("warp", "bf16"),
                                           ("block", "f16"), ("warp", "f32")])
def test_held_rows_same_bits_as_reread(kcuda, rng, variant, dname):
    """A row held in registers between the passes gives the bits of the row read twice: the
    forward (plain, and the fused add with weight, bias, offset and partial), the backward with
    and without a saved rstd (weight, bias, the fused add's dresidual_out). N = 70 over 32
    threads: C = 3 with a tail, and dw_blocks = 2 so a block holds several rows in turn."""
    m, n = 3, 70
    dtype = DT[dname]
    x = rng.standard_normal((m, n)).astype(dtype)
    res = rng.standard_normal((m, n)).astype(np.float32)
    dy = rng.standard_normal((m, n)).astype(dtype)
    dro = rng.standard_normal((m, n)).astype(np.float32)
    w = (1.0 + 0.5 * rng.standard_normal(n)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)

    def run(held: bool) -> list[np.ndarray]:
        launch = kcuda.Launch(threads=32, variant=variant, dw_blocks=2, held=held)
        assert kcuda.plan_forward(n, m, launch).held is held
        assert kcuda.plan_backward(n, m, launch).held is held
        y, rstd = kcuda.rms_norm_forward(x, n, w, bias=b, offset=0.5, partial=0.6,
                                         launch=launch)
        g = kcuda.rms_norm_backward(dy, x, n, w, bias=b, offset=0.5, partial=0.6,
                                    launch=launch)
        g_saved = kcuda.rms_norm_backward(dy, x, n, w, rstd=rstd, bias=b, offset=0.5,
                                          partial=0.6, launch=launch)
        y2, r2, rstd2 = kcuda.add_rms_norm_forward(x, res, n, w, launch=launch)
        g2 = kcuda.add_rms_norm_backward(dy, dro, x, res, n, w, rstd=rstd2, launch=launch)
        return [y, rstd, g.dx, g.dweight, g.dbias, g_saved.dx, g_saved.dweight, y2, r2, rstd2,
                g2.dx, g2.dresidual, g2.dweight]

    names = ["y", "rstd", "dx", "dweight", "dbias", "dx (saved rstd)", "dweight (saved rstd)",
             "add y", "new_residual", "add rstd", "add dx", "dresidual", "add dweight"]
    for name, held, reread in zip(names, run(True), run(False), strict=True):
        assert held.tobytes() == reread.tobytes(), f"{name}: held and re-read rows differ"


@pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
    reason="simulator only (NUMBA_ENABLE_CUDASIM=1): the emulation rounds a·a + acc twice, as "
    "the simulator does, where a GPU fuses them into one fma",
)
@pytest.mark.parametrize("threads", [16, 32, 64, 128])
def test_block_sum_is_the_documented_tree(kcuda, rng, threads):
    """rstd's bits are those of the documented order: thread t sums h_j² for j = t, t+T, …;
    then the halving tree (slot t += slot t+s, s = T/2 … 1), whose last five steps run as a
    warp butterfly from T = 32 on. Emulated here in NumPy float32, step by step."""
    import math

    m, n = 4, 300
    x = rng.standard_normal((m, n)).astype(np.float32)
    eps = np.float32(1e-5)
    _, rstd = kcuda.rms_norm_forward(x, n, eps=1e-5,
                                     launch=kcuda.Launch(threads=threads, variant="block"))
    for i in range(m):
        slots = []
        for t in range(threads):
            acc = np.float32(0.0)
            for j in range(t, n, threads):
                acc = np.float32(acc + np.float32(x[i, j] * x[i, j]))
            slots.append(acc)
        s = threads // 2
        while s >= 1:
            for t in range(s):
                slots[t] = np.float32(slots[t] + slots[t + s])
            s //= 2
        want = np.float32(np.float32(1.0) / math.sqrt(slots[0] / np.float32(n) + eps))
        assert rstd[i, 0].tobytes() == want.tobytes(), f"row {i}: {rstd[i, 0]!r} != {want!r}"


def test_device_arrays_in_place(kcuda, rng):
    """CUDA-array inputs: results stay on the device, same bits as the NumPy path."""
    from numba import cuda

    m, n = 3, 33
    launch = kcuda.Launch(threads=32)
    for dtype in DT.values():
        x = rng.standard_normal((m, n)).astype(dtype)
        w = rng.standard_normal(n).astype(dtype)
        y_host, rstd_host = kcuda.rms_norm_forward(x, n, w, launch=launch)
        bits = (lambda a: a.view(np.uint16)) if dtype == bfloat16 else (lambda a: a)
        y_dev, rstd_dev = kcuda.rms_norm_forward(cuda.to_device(bits(x)), n,
                                                 cuda.to_device(bits(w)), launch=launch)
        assert not isinstance(y_dev, np.ndarray) and hasattr(y_dev, "copy_to_host")
        y_back = y_dev.copy_to_host()
        if dtype == bfloat16:
            assert y_back.dtype == np.uint16  # bfloat16 stays as bits on the device
            y_back = y_back.view(bfloat16)
        assert y_back.dtype == dtype
        assert y_back.tobytes() == y_host.tobytes()
        assert rstd_dev.copy_to_host().tobytes() == rstd_host.tobytes()


def test_out_host_arrays(kcuda, rng):
    """``out=`` (host calls): y and dx land in the caller's array, the same bits as without it;
    a device call with ``out=`` is refused with the reason."""
    from numba import cuda

    m, n = 3, 33
    launch = kcuda.Launch(threads=32)
    x = rng.standard_normal((m, n)).astype(bfloat16)
    dy = rng.standard_normal((m, n)).astype(bfloat16)
    y_ref, rstd = kcuda.rms_norm_forward(x, n, launch=launch)
    out = np.empty((n, m), bfloat16).T  # a transposed out: the copy-back must follow its strides
    assert kcuda.rms_norm(x, n, out=out, launch=launch) is out
    assert np.ascontiguousarray(out).tobytes() == y_ref.tobytes()
    dx_ref = kcuda.rms_norm_backward(dy, x, n, rstd=rstd, launch=launch).dx
    out = np.empty_like(x)
    assert kcuda.rms_norm_backward(dy, x, n, rstd=rstd, out=out, launch=launch).dx is out
    assert out.tobytes() == dx_ref.tobytes()
    with pytest.raises(ValueError, match="shares memory with x"):
        kcuda.rms_norm_forward(x, n, out=x)
    xd = cuda.to_device(x.view(np.uint16))
    with pytest.raises(TypeError, match="device arrays"):
        kcuda.rms_norm_forward(xd, n, out=np.empty_like(x))


def test_bad_inputs_name_what_they_got(kcuda, rng):
    from numba import cuda

    x = rng.standard_normal((2, 5)).astype(np.float32)
    with pytest.raises(TypeError, match="float64"):
        kcuda.rms_norm_forward(x.astype(np.float64), 5)
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\).*\(2, 5\)"):
        kcuda.rms_norm_forward(x, 4)
    with pytest.raises(ValueError, match=r"weight has shape \(4,\)"):
        kcuda.rms_norm_forward(x, 5, np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"dy has shape \(2, 4\)"):
        kcuda.rms_norm_backward(np.ones((2, 4), np.float32), x, 5)
    with pytest.raises(ValueError, match="rounding"):
        kcuda.add_rms_norm(x, x, 5, rounding="bf16-sum")
    with pytest.raises(ValueError, match="partial"):
        kcuda.rms_norm_forward(x, 5, partial=0.1)
    with pytest.raises(TypeError, match="same side"):
        kcuda.rms_norm_forward(cuda.to_device(x), 5, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="rstd has shape"):
        kcuda.rms_norm_backward(x, x, 5, rstd=np.ones(3, np.float32))


#: Bad calls, as (name, call): each is made once with NumPy arrays to the oracle and once with
#: device arrays to numba_cuda; ``a(...)`` marks an array argument.
_BAD_CALLS = [
    ("normalized_shape", lambda f, a: f.rms_norm_forward(a(_X), 4)),
    ("empty normalized_shape", lambda f, a: f.rms_norm_forward(a(_X), ())),
    ("integer x", lambda f, a: f.rms_norm_forward(a(_X.astype(np.int32)), 5)),
    ("weight shape", lambda f, a: f.rms_norm_forward(a(_X), 5, a(np.ones(4, np.float32)))),
    ("bias dtype", lambda f, a: f.rms_norm_forward(a(_X), 5, bias=a(np.ones(5, np.int64)))),
    ("eps", lambda f, a: f.rms_norm_forward(a(_X), 5, eps="abc")),
    ("negative eps", lambda f, a: f.rms_norm_forward(a(_X), 5, eps=-1.0)),
    ("partial", lambda f, a: f.rms_norm_forward(a(_X), 5, partial=0.1)),
    ("offset", lambda f, a: f.rms_norm_forward(a(_X), 5, offset=None)),
    ("dy shape", lambda f, a: f.rms_norm_backward(a(np.ones((2, 4), np.float32)), a(_X), 5)),
    ("dy None", lambda f, a: f.rms_norm_backward(None, a(_X), 5)),
    ("rstd shape", lambda f, a: f.rms_norm_backward(a(_X), a(_X), 5,
                                                     rstd=a(np.ones(3, np.float32)))),
    ("rstd dtype", lambda f, a: f.rms_norm_backward(a(_X), a(_X), 5,
                                                     rstd=a(np.ones(2, np.int32)))),
    ("residual shape", lambda f, a: f.add_rms_norm(a(_X), a(np.ones((3, 5), np.float32)), 5)),
]
_X = np.ones((2, 5), np.float32)


@pytest.mark.parametrize("call", [c for _, c in _BAD_CALLS], ids=[n for n, _ in _BAD_CALLS])
def test_device_arrays_meet_the_oracles_contract(kcuda, call):
    """Device arrays are checked by the oracle's own input contract: the same error, word for
    word, as the oracle gives for the same NumPy arguments."""
    from numba import cuda

    with pytest.raises((TypeError, ValueError)) as oracle:
        call(rmsref, lambda a: a)
    with pytest.raises(oracle.type) as device:
        call(kcuda, cuda.to_device)
    assert str(device.value) == str(oracle.value)


def test_device_array_restrictions_name_what_they_got(kcuda):
    """What the contract allows but these kernels cannot do on the device, refused by name."""
    from numba import cuda

    x = cuda.to_device(_X)
    with pytest.raises(TypeError, match="input has dtype float64; the numba_cuda backend"):
        kcuda.rms_norm_forward(cuda.to_device(_X.astype(np.float64)), 5)
    with pytest.raises(TypeError, match="rstd .device array. has dtype float64"):
        kcuda.rms_norm_backward(x, x, 5, rstd=cuda.to_device(np.ones((2, 1))))
    with pytest.raises(TypeError, match="weight is a host array but x is a device array"):
        kcuda.rms_norm_forward(x, 5, np.ones(5, np.float32))


def test_empty_input(kcuda):
    x = np.zeros((0, 7), np.float32)
    y, rstd = kcuda.rms_norm_forward(x, 7)
    assert y.shape == (0, 7) and rstd.shape == (0, 1)
    g = kcuda.rms_norm_backward(x, x, 7, np.ones(7, np.float32), launch=kcuda.Launch(threads=32))
    assert g.dx.shape == (0, 7) and np.array_equal(g.dweight, np.zeros(7, np.float32))


def test_registry_reports_backend_available():
    assert rmsref.available_backends()["numba_cuda"] is None
