"""rmsref.conventions: each emulation reproduces the real system bit for bit when the statistic
is shared (reference: torch 2.13 CPU, running F.rms_norm and the HF-style module forwards written
out in torch below), and identify() ranks conventions by bit-exact match."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import conventions as C
from rmsref._shapes import bfloat16

DTS = {"float32": np.dtype(np.float32), "bfloat16": bfloat16, "float16": np.dtype(np.float16)}


def data(rng, m, n, dt, wdt=None):
    x = (3.0 * rng.standard_normal((m, n))).astype(np.float32).astype(dt)
    w = (1 + 0.3 * rng.standard_normal(n)).astype(np.float32).astype(wdt or dt)
    return x, w


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        a.astype(np.float64), b.astype(np.float64), equal_nan=True)


# ---- NumPy-only behaviour ----------------------------------------------------------------------


def test_every_convention_runs_and_documents_itself(rng):
    x, w = data(rng, 4, 33, bfloat16)
    for name in C.names():
        c = C.get(name)
        assert c.who and c.formula and c.eps_default and c.out_dtype
        y = C.emulate(name, x, w, 1e-5)
        assert y.shape == x.shape
    text = C.describe()
    for name in C.names():
        assert f"\n{name}\n" in text or text.startswith(name)


def test_gemma_adds_one_in_fp32_and_gemma_wdtype_in_the_weight_dtype(rng):
    x, w = data(rng, 8, 256, bfloat16)
    w = (0.05 * rng.standard_normal(256)).astype(np.float32).astype(bfloat16)   # stored w = s - 1
    g = C.emulate("gemma", x, w, 1e-6)
    as_torch = C.emulate("torch", x, w.astype(np.float32) + np.float32(1), 1e-6)  # fp32 weight
    assert same_bits(g, as_torch)
    gw = C.emulate("gemma_wdtype", x, w, 1e-6)
    assert not same_bits(g, gw)                       # R_w(1 + w) loses w's low bits
    assert same_bits(C.emulate("gemma", x, w, 1e-6, offset=0.0), C.emulate("torch", x, w, 1e-6))


def test_llama_rounds_twice_torch_once(rng):
    x, w = data(rng, 32, 768, bfloat16)
    t = C.emulate("torch", x, w, 1e-6).astype(np.float64)
    ll = C.emulate("llama", x, w, 1e-6).astype(np.float64)
    differ = np.mean(t != ll)
    assert 0.1 < differ < 0.5, differ
    # float32: one rounding either way
    x32, w32 = data(rng, 8, 256, np.float32)
    assert same_bits(C.emulate("torch", x32, w32, 1e-6), C.emulate("llama", x32, w32, 1e-6))


def test_output_dtype_rules(rng):
    x, _ = data(rng, 4, 64, bfloat16)
    w32 = (1 + 0.3 * rng.standard_normal(64)).astype(np.float32)
    assert C.emulate("torch", x, w32, 1e-6).dtype == bfloat16
    assert C.emulate("llama", x, w32, 1e-6).dtype == np.float32      # torch promotion
    assert C.emulate("t5", x, w32, 1e-6).dtype == np.float32         # fp32 weight: no cast back
    assert C.emulate("flax", x, w32, 1e-6).dtype == np.float32       # result_type(x, scale)
    w16 = w32.astype(np.float16)
    assert C.emulate("llama", x, w16, 1e-6).dtype == np.float32      # bf16 * fp16 -> fp32
    assert C.emulate("t5", x, w16, 1e-6).dtype == np.float16         # cast to the weight dtype


def test_paper_puts_eps_outside_the_sqrt():
    x = np.array([[0.03, -0.03, 0.03, -0.03]], np.float32)
    y = C.emulate("paper", x, None, 1e-2)
    np.testing.assert_allclose(y, x / (0.03 + 1e-2), rtol=1e-6)
    yt = C.emulate("torch", x, None, 1e-2)
    np.testing.assert_allclose(yt, x / np.sqrt(0.03**2 + 1e-2), rtol=1e-6)


def test_default_eps_per_convention():
    assert C.get("torch").default_eps(bfloat16) == 2.0**-23
    assert C.get("torch").default_eps(np.dtype(np.float64)) == 2.0**-52
    assert C.get("llama").default_eps(bfloat16) == 1e-6
    x = np.full((1, 8), 1e-4, np.float32)        # ms = 1e-8: eps matters
    assert not same_bits(C.emulate("torch", x), C.emulate("llama", x))


def test_given_rstd_is_used_and_checked(rng):
    x, w = data(rng, 4, 16, np.float32)
    r = np.full((4, 1), 0.5, np.float32)
    y = C.emulate("torch", x, w, rstd=r)
    assert same_bits(y, (x * np.float32(0.5) * w).astype(np.float32))
    with pytest.raises(ValueError, match="one per row"):
        C.emulate("torch", x, w, rstd=np.ones(3))
    with pytest.raises(ValueError, match="unknown convention 'lama'"):
        C.emulate("lama", x, w)
    with pytest.raises(ValueError, match="partial is only defined"):
        C.emulate("torch", x, w, partial=0.5)
    with pytest.raises(ValueError, match="does not match the trailing dims"):
        C.emulate("torch", x, w, normalized_shape=17)


def test_identify_ranks_a_numpy_llama_first(rng):
    def llama_like(x, n, w, eps):
        return C.emulate("llama", x, w, eps)

    ranking = C.identify(llama_like)
    assert ranking[0].name == "llama" and ranking[0].rate == 1.0
    assert ranking[1].rate < 0.9
    torch_rate = next(m.rate for m in ranking if m.name == "torch")
    assert torch_rate < 0.9


# ---- against torch 2.13 ------------------------------------------------------------------------


def _tt(a):
    torch = pytest.importorskip("torch", reason="torch not installed: bit-exactness vs torch")
    from rmsref.adapters.torch import to_torch

    return torch, to_torch(a)


@pytest.mark.parametrize("dname", list(DTS))
@pytest.mark.parametrize("n", [7, 1000, 4096])
def test_torch_convention_is_bit_exact_vs_f_rms_norm(dname, n, rng):
    torch, _ = _tt(np.zeros(1))
    from rmsref.adapters.torch import to_numpy, to_torch

    x, w = data(rng, 16, n, DTS[dname])
    for eps in (None, 1e-5):
        y, rstd = torch.ops.aten._fused_rms_norm(to_torch(x), [n], to_torch(w), eps)
        ye = C.emulate("torch", x, w, eps, rstd=rstd.numpy())
        assert same_bits(to_numpy(y), ye)
        # the public F.rms_norm gives the same bits as the fused op (no autograd) ...
        assert same_bits(to_numpy(torch.nn.functional.rms_norm(to_torch(x), [n], to_torch(w),
                                                               eps)), ye)
    # ... and so does the autograd path (a composite), rstd included
    xt = to_torch(x).requires_grad_(True)
    yg = torch.nn.functional.rms_norm(xt, [n], to_torch(w), 1e-5)     # rstd is eps=1e-5's
    assert yg.grad_fn is not None
    assert same_bits(to_numpy(yg), C.emulate("torch", x, w, 1e-5, rstd=rstd.numpy()))


@pytest.mark.parametrize("dname", list(DTS))
def test_hf_module_forwards_are_bit_exact(dname, rng):
    torch, _ = _tt(np.zeros(1))
    from rmsref.adapters.torch import to_numpy, to_torch

    eps = 1e-6
    for wname in (dname, "float32"):
        x, w = data(rng, 16, 1000, DTS[dname], DTS[wname])
        xt, wt = to_torch(x), to_torch(w)
        xf = xt.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        r = rstd.numpy()
        llama = wt * (xf * rstd).to(xt.dtype)                        # HF LlamaRMSNorm
        gemma = ((xf * rstd) * (1.0 + wt.float())).type_as(xt)       # HF GemmaRMSNorm
        h = xt * torch.rsqrt(xt.to(torch.float32).pow(2).mean(-1, keepdim=True) + eps)
        if wt.dtype in (torch.float16, torch.bfloat16):              # HF T5LayerNorm
            h = h.to(wt.dtype)
        t5 = wt * h
        assert same_bits(to_numpy(llama), C.emulate("llama", x, w, eps, rstd=r))
        assert same_bits(to_numpy(gemma), C.emulate("gemma", x, w, eps, rstd=r))
        assert same_bits(to_numpy(t5), C.emulate("t5", x, w, eps, rstd=r))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_torch_2_13_facts(rng):
    """What docs/semantics.md states about torch, checked by running it."""
    torch, _ = _tt(np.zeros(1))
    from rmsref.adapters.torch import to_numpy, to_torch

    n = 256
    # eps=None is finfo(float32).eps for half inputs (not the input dtype's eps)
    x = (1e-4 * rng.standard_normal((8, n))).astype(np.float32).astype(bfloat16)
    _, rstd = torch.ops.aten._fused_rms_norm(to_torch(x), [n], None, None)
    ms = np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True)
    np.testing.assert_allclose(rstd.numpy(), 1 / np.sqrt(ms + 2.0**-23), rtol=1e-6)
    # output dtype = input dtype whatever the weight dtype; one rounding with the weight in fp32
    for wd in (torch.float32, torch.float16, torch.float64):
        xb = (2 * rng.standard_normal((8, n))).astype(np.float32).astype(bfloat16)
        wt = torch.randn(n, dtype=torch.float32).to(wd)
        y = torch.nn.functional.rms_norm(to_torch(xb), [n], wt)
        assert y.dtype == torch.bfloat16
        _, r = torch.ops.aten._fused_rms_norm(to_torch(xb), [n], None, None)
        assert same_bits(to_numpy(y), C.emulate("torch", xb, wt.float().numpy(), rstd=r.numpy()))


def test_identify_ranks_torch_first_for_f_rms_norm():
    torch, _ = _tt(np.zeros(1))
    from rmsref.adapters.torch import wrap

    ranking = C.identify(wrap(torch.nn.functional.rms_norm)[0])
    assert ranking[0].name == "torch" and ranking[0].rate == 1.0


def test_fused_add_two_meanings(rng):
    x, w = data(rng, 16, 512, bfloat16)
    res = (3.0 * rng.standard_normal((16, 512))).astype(np.float32).astype(bfloat16)
    y_r, nr_r = C.emulate_add("torch", x, res, w, 1e-6, rounding="rounded-sum")
    y_f, nr_f = C.emulate_add("torch", x, res, w, 1e-6, rounding="fp32-sum")
    assert same_bits(nr_r, nr_f)                     # the stored residual is the same
    assert 0.01 < np.mean(y_r.astype(np.float64) != y_f.astype(np.float64)) < 0.5
    h = (x.astype(np.float32) + res.astype(np.float32)).astype(bfloat16)
    assert same_bits(y_r, C.emulate("torch", h, w, 1e-6))
    x32, w32 = data(rng, 4, 64, np.float32)
    r32 = x32[::-1].copy()
    a = C.emulate_add("torch", x32, r32, w32, rounding="rounded-sum")
    b = C.emulate_add("torch", x32, r32, w32, rounding="fp32-sum")
    assert same_bits(a[0], b[0])
    with pytest.raises(ValueError, match="single-rounding"):
        C.emulate_add("llama", x, res, w, rounding="fp32-sum")
    with pytest.raises(ValueError, match="rounding must be"):
        C.emulate_add("torch", x, res, w, rounding="bf16-sum")


def test_fused_add_is_bit_exact_vs_torch(rng):
    torch, _ = _tt(np.zeros(1))
    from rmsref.adapters.torch import to_numpy, to_torch

    n, eps = 1000, 1e-6
    x, w = data(rng, 16, n, bfloat16)
    res = (3.0 * rng.standard_normal((16, n))).astype(np.float32).astype(bfloat16)
    xt, rt, wt = to_torch(x), to_torch(res), to_torch(w)
    # HF eager decoder layer: hidden = residual + hidden (bf16), then LlamaRMSNorm(hidden)
    h = rt + xt
    hf = h.float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    y_hf = wt * (hf * rstd).to(h.dtype)
    y, nr = C.emulate_add("llama", x, res, w, eps, rounding="rounded-sum", rstd=rstd.numpy())
    assert same_bits(to_numpy(y_hf), y) and same_bits(to_numpy(h), nr)
    # fp32-sum: normalise the float32 sum, round y once
    h32 = xt.float() + rt.float()
    y32, r32 = torch.ops.aten._fused_rms_norm(h32, [n], wt.float(), eps)
    y, nr = C.emulate_add("torch", x, res, w, eps, rounding="fp32-sum", rstd=r32.numpy())
    assert same_bits(to_numpy(y32.to(torch.bfloat16)), y)
    assert same_bits(to_numpy(h32.to(torch.bfloat16)), nr)


def test_each_convention_owns_its_error_model():
    """The tolerance model comes from the convention record; rivals are conventions too."""
    from rmsref import conventions as C

    for conv in C.CONVENTIONS.values():
        model = conv.error_model(np.float16, 768, 4)
        assert model.k_out == conv.k_out >= 1 and model.n == 768 and model.rows == 4
        assert conv.order_rival is None or conv.order_rival in C.CONVENTIONS
    assert C.get("llama").k_out == 2 and C.get("torch").k_out == 1
    assert C.get("native").error_model(np.float16, 8).acc_dtype == np.float16
    assert C.get("torch").error_model(np.float16, 8).acc_dtype == np.float32


def test_error_model_passes_dtype_rows_and_form_on():
    """error_model(dtype, n, rows, form) is the tolerance ErrorModel of those values, with the
    convention's k_out and accumulation dtype; rows defaults to 1 and counts at least one."""
    from rmsref import tolerance as T

    llama = C.get("llama")
    assert llama.error_model(bfloat16, 64) == T.ErrorModel(bfloat16, 64, 1, np.dtype(np.float32),
                                                            2, form="probabilistic")
    model = llama.error_model(np.float16, 64, rows=0, form="deterministic")
    assert model == T.ErrorModel(np.dtype(np.float16), 64, 1, np.dtype(np.float32), 2,
                                 form="deterministic")
    assert model.out_dtype == np.float16 and model.rows == 1


def test_torch_with_offset_one_is_gemma(rng):
    """torch's epilogue with offset = 1 forms (w + 1) in fp32 and rounds once: the gemma formula
    y = R_in((f32(x)·rstd)·(1 + f32(w))), bit for bit; without the offset it is x̂·w."""
    for dt in (bfloat16, np.dtype(np.float16)):
        x, w = data(rng, 8, 48, dt)
        assert same_bits(C.emulate("torch", x, w, 1e-6, offset=1.0), C.emulate("gemma", x, w, 1e-6))
        assert same_bits(C.emulate("torch", x, w, 1e-6, offset=0.0), C.emulate("torch", x, w, 1e-6))
        assert not same_bits(C.emulate("torch", x, w, 1e-6, offset=1.0),
                             C.emulate("torch", x, w, 1e-6))


def test_fused_div_rounds_rstd_twice(rng):
    """fused_fp32_div: R(1/R(sqrt(ms + eps))) in float32, the formula written out here; it
    differs from the one-rounding rsqrt of fused_fp32 in some rows."""
    x, w = data(rng, 256, 64, np.dtype(np.float32))
    x64 = x.astype(np.float64)
    ms = np.mean(x64 * x64, axis=1, keepdims=True).astype(np.float32)
    s = ms + np.float32(1e-5)                                  # float32 + float32: rounded
    rstd = np.float32(1.0) / np.sqrt(s)                         # sqrt rounded, then 1/·
    assert rstd.dtype == np.float32
    expect = (x * rstd * w).astype(np.float32)
    got = C.emulate("fused_fp32_div", x, w, 1e-5)
    assert same_bits(got, expect)
    assert not same_bits(got, C.emulate("fused_fp32", x, w, 1e-5))


def test_unknown_convention_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        C.get("pytorch")
    assert str(info.value) == f"unknown convention 'pytorch'; known: {', '.join(C.names())}"


def test_promotion_of_weight_and_input_dtypes():
    f16, f32, f64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
    assert C.promote(f16, bfloat16) == C.promote(bfloat16, f16) == f32
    assert C.promote(bfloat16, f32) == C.promote(f32, bfloat16) == f32
    assert C.promote(f16, f64) == f64 and C.promote(bfloat16, bfloat16) == bfloat16


# ---- each rule is its documented formula, written out here in NumPy -----------------------------


def _ms(xf):
    """R_f32(mean(x²)): x² and the mean in float64, rounded once to float32."""
    x64 = xf.astype(np.float64)
    return np.mean(x64 * x64, axis=1, keepdims=True).astype(np.float32)


def _rsqrt(s):
    return (1.0 / np.sqrt(s.astype(np.float64))).astype(np.float32)


def _by_hand(name, x, w, eps, partial=None):
    f32 = np.float32
    xf, wf = x.astype(f32), w.astype(f32)
    if name == "paper":  # y = R_in(R(f32(x)/R(rms + eps))·f32(w)), rms over the first k features
        k = x.shape[1] if partial is None else max(int(np.floor(x.shape[1] * partial)), 1)
        d = np.sqrt(_ms(xf[:, :k])) + f32(eps)
        return ((xf / d) * wf).astype(x.dtype)
    if name == "native":  # every step rounded to t; squares rounded to t, summed in fp32
        t = x.dtype
        sq = (xf * xf).astype(t).astype(f32)
        ms = (np.sum(sq, axis=1, keepdims=True, dtype=f32) / f32(x.shape[1])).astype(t)
        r = _rsqrt((ms.astype(f32) + f32(eps)).astype(t)).astype(t)
        h = (xf * r.astype(f32)).astype(t)
        return (h.astype(f32) * wf).astype(t)  # w has x's dtype here
    r = _rsqrt(_ms(xf) + f32(eps))
    if name == "flax":  # y = R_out(f32(x)·R(rstd·scale)), out = result_type(x, scale)
        return (xf * (r * wf)).astype(C.promote(x.dtype, w.dtype))
    if name == "t5":  # h = f32(x)·rstd, rounded to w's dtype when half; y = w·h
        h = (xf * r).astype(w.dtype)
        return (wf * h.astype(f32)).astype(w.dtype)
    if name == "gemma_wdtype":  # y = R_in(f32(x)·rstd·f32(R_w(1 + w)))
        scale = (wf + f32(1.0)).astype(w.dtype).astype(f32)
        return ((xf * r) * scale).astype(x.dtype)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["paper", "native", "flax", "t5", "gemma_wdtype"])
@pytest.mark.parametrize("dname", ["bfloat16", "float16"])
def test_rule_is_its_documented_formula(name, dname, rng):
    x, w = data(rng, 16, 40, DTS[dname])
    eps = 1e-3  # large enough that an eps placed or scaled wrongly shows
    got = C.emulate(name, x, w, eps)
    assert same_bits(got, _by_hand(name, x, w, eps)), name
    if name == "paper":
        assert same_bits(C.emulate(name, x, w, eps, partial=0.25),
                         _by_hand(name, x, w, eps, partial=0.25))
