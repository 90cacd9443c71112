"""The validator on modules written the way real libraries write them (HF-style Llama, Gemma and
an unweighted norm, copied here so no download is needed): adapters never touch the user's
module, a module's own declarations (eps attribute, last-dim normalisation, 1 + w weight, no
weight) are respected, and what does not apply is reported as not applicable, never as FAIL.
Reference: the float64 oracle on the implementation's own inputs; bounds: rmsref.tolerance."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from rmsref._shapes import bfloat16
from rmsref.validation import validate
from tests.test_validate import llama_module_class  # transformers' LlamaRMSNorm, written out


def _torch():
    return pytest.importorskip("torch", reason="torch not installed: real-module tests")


def hf_gemma():
    torch = _torch()

    class GemmaRMSNorm(torch.nn.Module):
        """transformers' GemmaRMSNorm: the weight is used as 1 + w, initialised to zeros."""

        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            xf = x.float()
            output = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            output = output * (1.0 + self.weight.float())
            return output.type_as(x)

    return GemmaRMSNorm


def unweighted():
    torch = _torch()

    class UnweightedRMSNorm(torch.nn.Module):
        """A norm with no weight whose only constructor argument is eps (as DeepSeek-V4's)."""

        def __init__(self, eps: float = 1.0e-6):
            super().__init__()
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)).type_as(x)

    return UnweightedRMSNorm


# ---- (1) adapters never mutate the user's module -------------------------------------------------


def test_wrapping_an_instance_never_changes_it():
    torch = _torch()
    from rmsref.adapters.torch import wrap

    module = llama_module_class()(256, eps=1e-5)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        module.weight.copy_(1.0 + 0.1 * torch.randn(256, generator=g))
    before = module.weight.detach().clone()
    fwd, bwd = wrap(module)
    report = validate(fwd, bwd, convention="llama", dtypes=["float32", "bfloat16"])
    assert module.variance_epsilon == 1e-5
    assert module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"
    assert torch.equal(module.weight.detach().view(torch.int32), before.view(torch.int32))
    assert module.weight.grad is None
    # and, the module untouched, its own eps (1e-5) is used for every eps=None probe
    assert report, report.table()


# ---- (2) (1 + w) modules: identify and the order check ---------------------------------------


def test_gemma_style_module_is_identified_and_its_order_checked():
    from rmsref.adapters.torch import wrap
    from rmsref.conventions import identify

    fwd, bwd = wrap(hf_gemma()(768))
    ranking = identify(fwd)
    assert ranking[0].name == "gemma" and ranking[0].rate > 0.99, ranking[:3]
    report = validate(fwd, bwd, convention="gemma", dtypes=["bfloat16"], probes=["gaussian"])
    order = [c for c in report.cases if c.probe == "order"]
    assert order and order[0].passed, report.table()
    assert "with 'gemma' 100.0%" in order[0].message, order[0].message


# ---- (3) the implementation declares, the validator respects ----------------------------------


def test_declared_eps_and_last_dim_are_respected_and_reported_not_applicable():
    from rmsref.adapters.torch import wrap

    fwd, bwd = wrap(llama_module_class()(512, eps=1e-5))
    assert fwd.rmsref_declared.eps_default == 1e-5
    assert fwd.rmsref_declared.normalized_dims == "last"
    assert fwd.rmsref_declared.offset == 0.0
    report = validate(fwd, bwd, convention="llama")          # nothing beyond its convention
    assert report, report.table()
    na = [c for c in report.cases if c.status == "n/a"]
    assert {c.probe for c in na} == {"multidim"}
    assert all("last dimension" in c.not_applicable for c in na)
    assert "n/a" in report.table()
    doc = report.to_json()
    assert '"status": "n/a"' in doc
    gemma_fwd, _ = wrap(hf_gemma()(64))
    assert gemma_fwd.rmsref_declared.offset == 1.0


def test_caller_overrides_eps_default_and_normalized_dims():
    """A plain function declares nothing: the caller says what it computes."""

    def last_dim_norm(x, shape, weight=None, eps=None):
        x32 = np.asarray(x, np.float32)
        e = np.float32(1e-5 if eps is None else eps)
        ms = np.mean(x32 * x32, axis=-1, keepdims=True)
        y = x32 / np.sqrt(ms + e)
        if weight is not None:
            y = y * np.asarray(weight, np.float32)
        return y.astype(np.asarray(x).dtype)

    probes = ["gaussian", "eps_default", "multidim"]
    plain = validate(last_dim_norm, dtypes=["float32"], probes=probes, repeat=False)
    assert not plain
    told = validate(last_dim_norm, dtypes=["float32"], probes=probes, repeat=False,
                    eps_default=1e-5, normalized_dims="last")
    assert told, told.table()
    assert [c.probe for c in told.cases if c.status == "n/a"] == ["multidim"]


# ---- (4) float64 gradient check only when float64 was asked for ------------------------------


def test_no_float64_gradient_check_unless_float64_requested():
    import rmsref

    def fwd(x, shape, w=None, eps=None):
        return rmsref.rms_norm(x, shape, w, eps)

    def bwd(dy, x, shape, w=None, eps=None):
        g = rmsref.rms_norm_backward(dy, x, shape, w, eps)
        return g.dx, g.dweight

    only32 = validate(fwd, bwd, dtypes=["float32"], probes=["gaussian"], repeat=False)
    assert not [c for c in only32.cases if c.probe == "gradcheck"]
    with64 = validate(fwd, bwd, dtypes=["float32", "float64"], probes=["gaussian"], repeat=False)
    assert [c.passed for c in with64.cases if c.probe == "gradcheck"] == [True]


# ---- (5) classes built from their signature; a dropped weight is said -------------------------


def test_class_without_weight_is_built_with_its_own_eps_and_the_dropped_weight_is_said():
    torch = _torch()
    from rmsref.adapters.torch import wrap

    fwd, bwd = wrap(unweighted())
    d = fwd.rmsref_declared
    assert d.has_weight is False and d.eps_default == 1e-6
    x = np.random.default_rng(0).standard_normal((4, 768)).astype(np.float32)
    expect = torch.nn.functional.rms_norm(torch.from_numpy(x), [768], None, 1e-6).numpy()
    np.testing.assert_array_equal(fwd(x, 768, None, None), expect)     # not eps = 768
    with pytest.warns(UserWarning, match="has no weight"):
        fwd(x, 768, np.ones(768, np.float32), None)
    report = validate(fwd, bwd, dtypes=["float32"])
    assert report, report.table()
    assert any("weight" in note and "dropped" in note for note in report.notes), report.notes
    assert "weight" in report.table().split("PASS")[-1]


# ---- (6) identify: rates per dtype and weight dtype; float32-only implementations ranked ------


def test_identify_reports_rates_per_case_and_ranks_float32_only():
    from rmsref.conventions import emulate, identify

    def t5_like(x, shape, w=None, eps=None):
        return emulate("t5", x, w, eps, normalized_shape=shape)

    ranking = identify(t5_like)
    best = ranking[0]
    assert set(best.rates) == {"bfloat16/w=bfloat16", "bfloat16/w=float32",
                               "float16/w=float16", "float16/w=float32"}
    llama = next(m for m in ranking if m.name == "llama")
    assert llama.rates["bfloat16/w=bfloat16"] == 1.0 > llama.rates["bfloat16/w=float32"]

    def float32_only(x, shape, w=None, eps=None):
        if np.asarray(x).dtype != np.float32:
            raise TypeError(f"float32 only, got {np.asarray(x).dtype}")
        return emulate("flax", x, w, eps, normalized_shape=shape)    # rstd·w formed first

    ranking = identify(float32_only)
    assert ranking[0].name == "flax" and ranking[0].rate == 1.0
    assert set(ranking[0].rates) == {"float32/w=float32"}
    assert ranking[1].rate < 0.9          # in float32 the x·rstd·w order still stands apart


# ---- (7) framework arrays, any dtype, into rmsref.testing --------------------------------------


def test_assert_rms_norm_close_takes_torch_bfloat16_and_jax_arrays():
    torch = _torch()
    from rmsref.testing import assert_rms_norm_close

    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 256, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(256, generator=g)).to(torch.bfloat16)
    y = torch.nn.functional.rms_norm(x, [256], w, 1e-5)
    assert_rms_norm_close(y, x, 256, w, 1e-5)
    with pytest.raises(AssertionError, match="not within"):
        assert_rms_norm_close(y * 1.01, x, 256, w, 1e-5)
    jnp = pytest.importorskip("jax.numpy", reason="jax not installed")
    xj = jnp.asarray(np.asarray(x.float().numpy()).astype(bfloat16))
    assert_rms_norm_close(jnp.asarray(y.float().numpy()).astype(jnp.bfloat16), xj, 256,
                          jnp.asarray(w.float().numpy()).astype(jnp.bfloat16), 1e-5)


# ---- (8) the CLI finds the working directory, the framework, and says what went wrong ----------

USER_TORCH = textwrap.dedent('''
    import torch

    def my_norm(x, shape, weight=None, eps=None):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + (eps or 1e-6))
        return (y * (1.0 if weight is None else weight.float())).to(x.dtype)

    def numpy_only_by_mistake(x, shape, weight=None, eps=None):
        return x.float()
''')


def test_cli_finds_cwd_module_detects_torch_and_explains_failures(tmp_path, monkeypatch, capsys):
    _torch()
    import sys

    from rmsref.cli import main

    (tmp_path / "user_norm_cwd.py").write_text(USER_TORCH)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    rc = main(["validate", "user_norm_cwd:my_norm", "--convention", "llama", "--dtype", "float32",
               "--probes", "gaussian,tails", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    rc = main(["validate", "user_norm_cwd:numpy_only_by_mistake", "--framework", "numpy",
               "--dtype", "float32", "--probes", "gaussian,tails", "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 1
    rows = [ln for ln in text.splitlines() if ln.startswith(("gaussian", "tails"))]
    assert rows and all("has no attribute 'float'" in ln for ln in rows), text
    assert "--framework torch" in text


def test_errors_name_the_callable_and_what_it_returned():
    def returns_none(x, shape, w=None, eps=None):
        return None

    def one_gradient(dy, x, shape, w=None, eps=None):
        return np.asarray(dy)

    import rmsref

    rep = validate(returns_none, dtypes=["float32"], probes=["gaussian"], repeat=False)
    msg = rep.cases[0].message
    assert "returns_none" in msg and "returned None" in msg, msg
    rep = validate(lambda x, s, w=None, eps=None: rmsref.rms_norm(x, s, w, eps), one_gradient,
                   dtypes=["float32"], probes=["gaussian"], repeat=False)
    dx = next(c for c in rep.cases if c.quantity == "dx")
    assert "one_gradient" in dx.message and "(dx, dweight)" in dx.message, dx.message


def test_cli_overrides_what_a_plain_function_cannot_declare(tmp_path, monkeypatch, capsys):
    from rmsref.cli import main

    (tmp_path / "last_dim_user.py").write_text(textwrap.dedent('''
        import numpy as np

        def norm(x, shape, weight=None, eps=None):
            x32 = np.asarray(x, np.float32)
            ms = np.mean(x32 * x32, axis=-1, keepdims=True)
            y = x32 / np.sqrt(ms + np.float32(1e-5 if eps is None else eps))
            return (y if weight is None else y * weight.astype(np.float32)).astype(x.dtype)
    '''))
    monkeypatch.chdir(tmp_path)
    args = ["validate", "last_dim_user:norm", "--dtype", "float32", "--probes",
            "gaussian,eps_default,multidim", "--no-progress"]
    assert main(args) == 1
    capsys.readouterr()
    assert main(args + ["--eps-default", "1e-5", "--normalized-dims", "last"]) == 0
    text = capsys.readouterr().out
    assert "n/a (normalises the last dimension only" in text, text


def test_wrap_succeeds_for_a_module_that_cannot_run_here_and_reads_an_offset_attribute():
    """Declarations are read at wrap time; a module that raises (a GPU-only kernel) must still
    wrap, its calls raising later. Liger-style modules state their offset as an attribute."""
    torch = _torch()
    from rmsref.adapters.torch import wrap

    class GpuOnly(torch.nn.Module):
        def __init__(self, hidden_size, eps=1e-6, offset=1.0):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(hidden_size))
            self.variance_epsilon, self.offset = eps, offset

        def forward(self, x):
            raise RuntimeError("no GPU here")

    fwd, _ = wrap(GpuOnly)
    assert fwd.rmsref_declared.offset == 1.0 and fwd.rmsref_declared.eps_default == 1e-6
    with pytest.raises(RuntimeError, match="no GPU"):
        fwd(np.ones((1, 8), np.float32), 8)


def test_identify_and_validate_take_a_forward_that_returns_torch_bfloat16():
    """A NumPy-in, torch-out function: its bfloat16 tensors are read bit for bit."""
    torch = _torch()
    from rmsref.adapters.torch import to_torch
    from rmsref.conventions import identify

    def numpy_in_torch_out(x, shape, w=None, eps=None):
        return torch.nn.functional.rms_norm(to_torch(x), [shape], None if w is None else
                                            to_torch(w), eps)

    assert identify(numpy_in_torch_out)[0].name == "torch"
    rep = validate(numpy_in_torch_out, dtypes=["bfloat16"], probes=["gaussian"], repeat=False)
    assert rep, rep.table()
