"""Every registered fast backend, run through one suite driven by its registry entry.

``rmsref.backends.BackendSpec`` says what a backend offers (functions, dtypes, a thread knob,
a simulator); this module reads it and checks each backend the same way: the oracle's signatures,
agreement with the oracle through :func:`rmsref.comparison.compare` (the engine ``validate`` and
``rmsref check`` use), the bits of repeated calls, of batch prefixes and of thread counts, and
the oracle's errors for bad arguments. A new backend is covered by adding its registry entry.
Tests of one backend's internals (kernel variants, launch plans) stay in that backend's file.

The CUDA backend runs here only in Numba's simulator (``NUMBA_ENABLE_CUDASIM=1`` before numba is
imported; CI's simulator step runs this file with ``-k numba_cuda``), on tiny shapes.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import rmsref
from rmsref import backends, conventions
from rmsref._shapes import FLOAT_DTYPES, default_eps
from rmsref.comparison import Reference, compare


def _params(per_dtype: bool) -> list:
    """(backend[, dtype]) params over the fast backends; unavailable ones skip with the reason."""
    params = []
    for name in backends.fast_backend_names():
        reason = backends.why_unavailable(name)
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        dtypes = backends.spec(name).dtypes if per_dtype else (None,)
        for dt in dtypes:
            ident = name if dt is None else f"{name}-{dt}"
            values = (name,) if dt is None else (name, dt)
            # each further dtype of a compiling backend is a cold compile: slow (CI runs them)
            extra = [pytest.mark.slow] if backends.spec(name).compiles and dt in (
                "float16", "float64") else []
            params.append(pytest.param(*values, marks=marks + extra, id=ident))
    return params


def _shape(name: str) -> tuple[int, int]:
    """(rows, features): several rows per thread and a ragged tail; tiny in a simulator."""
    return (5, 24) if backends.spec(name).simulated() else (37, 200)


def _inputs(name: str, dtype: np.dtype, seed: int = 0):
    m, n = _shape(name)
    rng = np.random.default_rng([seed, dtype.num, dtype.itemsize])
    x = rng.standard_normal((m, n)).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    r = rng.standard_normal((m, n)).astype(dtype)
    return x, w, dy, r


@pytest.mark.parametrize("name", _params(per_dtype=False))
def test_the_spec_names_the_oracles_functions_and_signatures(name):
    spec = backends.spec(name)
    module = rmsref.backend(name)
    offered = set(backends.RMS_FUNCTIONS + backends.ADD_RMS_FUNCTIONS + backends.LAYER_FUNCTIONS)
    exported = offered & set(getattr(module, "__all__", dir(module)))
    assert exported == set(spec.functions), (
        f"{name} exports {sorted(exported)} but its registry entry says {sorted(spec.functions)}")
    for fn in spec.functions:
        ours = list(inspect.signature(getattr(module, fn)).parameters.values())
        oracle = list(inspect.signature(getattr(rmsref, fn)).parameters.values())
        # the oracle's parameters, in order, then only optional keyword-only extras (launch=)
        assert [p.name for p in ours[:len(oracle)]] == [q.name for q in oracle], fn
        for p, q in zip(ours[:len(oracle)], oracle, strict=True):
            assert (p.kind, p.default) == (q.kind, q.default), (fn, p.name)
        for p in ours[len(oracle):]:
            assert p.kind is p.KEYWORD_ONLY and p.default is not p.empty, (fn, p.name)


@pytest.mark.parametrize("name, dtype", _params(per_dtype=True))
def test_rms_norm_agrees_with_the_oracle_within_the_bound(name, dtype):
    dtype = FLOAT_DTYPES[dtype]
    module = rmsref.backend(name)
    x, w, dy, _ = _inputs(name, dtype)
    m, n = x.shape
    y, rstd = module.rms_norm_forward(x, n, w)
    g = module.rms_norm_backward(dy, x, n, w, rstd=rstd)
    ref = Reference(x, (n,), w, default_eps(dtype), dy=dy)
    model = conventions.get(backends.spec(name).convention).error_model(dtype, n, m)
    for quantity, got in (("y", y), ("dx", g.dx), ("dweight", g.dweight)):
        assert got.dtype == dtype and got.shape == (x.shape if quantity != "dweight" else w.shape)
        c = compare(quantity, got, ref, model)
        assert c.passed, f"{name} {quantity} {dtype.name}: ratio {c.ratio:.3g} at {c.worst}"
    # rstd: within rho and one rounding to the dtype it is stored in
    u_stat = np.finfo(np.asarray(rstd).dtype).eps / 2
    err = np.abs(np.asarray(rstd, np.float64).reshape(-1) - ref.rstd.reshape(-1))
    assert np.all(err <= (model.rho + u_stat) * ref.rstd.reshape(-1))
    # y of the one-call form is the forward's y, bit for bit
    np.testing.assert_array_equal(module.rms_norm(x, n, w).view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("name, dtype", _params(per_dtype=True))
def test_add_rms_norm_forward_agrees_with_the_oracle(name, dtype):
    if "add_rms_norm_forward" not in backends.spec(name).functions:
        pytest.skip(f"{name} does not offer add_rms_norm (its registry entry)")
    dtype = FLOAT_DTYPES[dtype]
    module = rmsref.backend(name)
    x, w, _, r = _inputs(name, dtype)
    m, n = x.shape
    y, h, rstd = module.add_rms_norm_forward(x, r, n, w)
    y0, h0, _ = rmsref.add_rms_norm_forward(x, r, n, w)
    # the stored sum is rounded once to the dtype by both: the same bits
    np.testing.assert_array_equal(h.view(np.uint8), h0.view(np.uint8))
    # y normalises the unrounded sum (the default rounding, "fp32-sum"): exact in float64
    h64 = x.astype(np.float64) + r.astype(np.float64)
    c = compare("y", y, Reference(h64, (n,), w, default_eps(dtype)),
                conventions.get(backends.spec(name).convention).error_model(dtype, n, m))
    assert c.passed, f"{name} add_rms_norm y {dtype.name}: ratio {c.ratio:.3g}"


def _calls(name: str, module, x, w, dy, r) -> dict[str, np.ndarray]:
    """Every offered forward and the RMSNorm backward, by output name."""
    n = x.shape[-1]
    funcs = backends.spec(name).functions
    out: dict[str, np.ndarray] = {}
    y, rstd = module.rms_norm_forward(x, n, w)
    g = module.rms_norm_backward(dy, x, n, w, rstd=rstd)
    out.update(y=y, rstd=rstd, dx=g.dx, dweight=g.dweight)
    if "add_rms_norm_forward" in funcs:
        out["add_y"], out["add_h"], _ = module.add_rms_norm_forward(x, r, n, w)
    if "layer_norm_forward" in funcs:
        out["ln_y"], out["ln_mean"], out["ln_rstd"] = module.layer_norm_forward(x, n, w, None)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("name", _params(per_dtype=False))
def test_the_same_call_gives_the_same_bits_whatever_the_batch(name):
    module = rmsref.backend(name)
    for dtype in (FLOAT_DTYPES["float32"], FLOAT_DTYPES["bfloat16"]):
        x, w, dy, r = _inputs(name, dtype, seed=1)
        full = _calls(name, module, x, w, dy, r)
        again = _calls(name, module, x, w, dy, r)
        assert all(_same_bits(full[k], again[k]) for k in full), dtype
        for k_rows in (1, x.shape[0] - 1):
            part = _calls(name, module, x[:k_rows], w, dy[:k_rows], r[:k_rows])
            for k in part:
                if k == "dweight":
                    continue  # a sum over the rows: a prefix has a different one
                assert _same_bits(part[k], np.asarray(full[k])[:k_rows]), (dtype, k, k_rows)


@pytest.mark.parametrize("name", _params(per_dtype=False))
def test_the_thread_count_changes_no_bit(name):
    spec = backends.spec(name)
    if spec.threads is None:
        pytest.skip(f"{name} has no thread knob (its registry entry)")
    most = backends.max_threads(name)
    if most < 2:
        pytest.skip(f"{name} has a single thread here")
    module = rmsref.backend(name)
    x, w, dy, r = _inputs(name, FLOAT_DTYPES["bfloat16"], seed=2)
    before = backends.set_threads(name, 1)
    try:
        one = _calls(name, module, x, w, dy, r)
        backends.set_threads(name, most)
        many = _calls(name, module, x, w, dy, r)
    finally:
        backends.set_threads(name, before)
    assert all(_same_bits(one[k], many[k]) for k in one)


BAD_CALLS = [
    ("eps -1", lambda f, x, w: f(x, x.shape[-1], w, -1.0)),
    ("eps nan", lambda f, x, w: f(x, x.shape[-1], w, math.nan)),
    ("weight shape", lambda f, x, w: f(x, x.shape[-1], w[:-1])),
    ("normalized_shape", lambda f, x, w: f(x, x.shape[-1] + 1, w)),
    ("offset str", lambda f, x, w: f(x, x.shape[-1], w, offset="1")),
]


@pytest.mark.parametrize("name", _params(per_dtype=False))
@pytest.mark.parametrize("what, call", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_arguments_raise_the_oracles_error(name, what, call):
    module = rmsref.backend(name)
    x, w, _, _ = _inputs(name, FLOAT_DTYPES["float32"])
    with pytest.raises((TypeError, ValueError)) as oracle_error:
        call(rmsref.rms_norm_forward, x, w)
    with pytest.raises(oracle_error.type) as ours:
        call(module.rms_norm_forward, x, w)
    assert str(ours.value) == str(oracle_error.value)


def test_a_numba_cuda_that_cannot_compile_with_this_numpy_is_unavailable_saying_why(monkeypatch):
    """On a GPU, numba-cuda's compiler must load: numba-cuda 0.30.4 with NumPy 2.5 fails at the
    first kernel compile (np.row_stack is gone). The probe loads it first and names the cause and
    the fix instead of letting the first call raise deep inside numba-cuda."""
    pytest.importorskip("numba_cuda", reason="numba-cuda is not installed: pip install "
                        "'rmsref[cuda]'")
    import importlib

    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        pytest.skip("numba.cuda is the simulator in this process: it compiles nothing")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    assert backends._probe_cuda() is None  # this NumPy: the compiler loads

    real = importlib.import_module

    def numpy_without_row_stack(name, *args, **kwargs):
        if name == "numba.cuda.cudaimpl":
            raise AttributeError("module 'numpy' has no attribute 'row_stack'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(backends.importlib, "import_module", numpy_without_row_stack)
    assert backends._probe_cuda() == (
        f"numba-cuda's compiler cannot load with NumPy {np.__version__}: AttributeError: module "
        "'numpy' has no attribute 'row_stack' (NumPy 2.5 removed it): pip install 'numpy<2.5'")
