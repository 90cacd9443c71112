"""`rmsref validate` and `rmsref conventions`: exit status 0 only on pass, tables, JSON."""

from __future__ import annotations

import json
import textwrap

import pytest

from rmsref.cli import main

KERNELS = textwrap.dedent('''
    """A user's kernels: correct torch-style and llama-style ones, and a buggy backward."""
    import numpy as np
    import rmsref
    from rmsref import conventions

    def rms_norm(x, shape, weight=None, eps=None):
        return rmsref.rms_norm(x, shape, weight, eps)

    def rms_norm_bwd(dy, x, shape, weight=None, eps=None):
        g = rmsref.rms_norm_backward(dy, x, shape, weight, eps)
        return g.dx, g.dweight

    def llama_bwd(dy, x, shape, weight=None, eps=None):
        g = rmsref.rms_norm_backward(dy, x, shape, weight, 1e-6 if eps is None else eps)
        return g.dx, g.dweight

    def llama_style(x, shape, weight=None, eps=None):
        return conventions.emulate("llama", x, weight, 1e-6 if eps is None else eps,
                                   normalized_shape=shape)

    def no_projection_bwd(dy, x, shape, weight=None, eps=None):
        x64 = x.astype(np.float64)
        e = 1e-6 if eps is None else eps
        rstd = 1 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + e)
        w = np.ones(x.shape[-1]) if weight is None else weight.astype(np.float64)
        dx = (rstd * w * dy.astype(np.float64)).astype(x.dtype)
        dw = None if weight is None else np.sum(dy.astype(np.float64) * x64 * rstd,
                                               axis=tuple(range(x.ndim - 1))).astype(weight.dtype)
        return dx, dw
''')


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    (tmp_path / "user_kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_kernels"


def test_validate_a_path_with_backward_convention_dtype_json(kernels, tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(["validate", f"{kernels}:llama_style", "--backward", f"{kernels}:llama_bwd",
               "--convention", "llama", "--dtype", "bfloat16", "--json", str(out),
               "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "PASS" in text and "bfloat16" in text and "float32" not in text.split("---")[-1]
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["convention"] == "llama" and doc["dtypes"] == ["bfloat16"]


def test_failing_implementation_exits_1_with_diagnosis(kernels, capsys):
    rc = main(["validate", f"{kernels}:llama_style", "--dtype", "bfloat16", "--eps", "1e-6",
               "--probes", "gaussian,tails", "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "FAIL" in text and "DIAGNOSIS [double_rounding]" in text
    assert "closest conventions (bit-exact share of half-precision outputs): llama 100.0%" in text
    assert "llama per input/weight dtype: bfloat16/w=bfloat16 100.0%, bfloat16/w=float32" in text
    assert main(["validate", f"{kernels}:rms_norm", "--backward", f"{kernels}:rms_norm_bwd",
                 "--no-progress"]) == 0
    capsys.readouterr()
    rc = main(["validate", f"{kernels}:rms_norm", "--backward", f"{kernels}:no_projection_bwd",
               "--dtype", "float32", "--probes", "gaussian", "--no-progress"])
    assert rc == 1 and "DIAGNOSIS [missing_projection]" in capsys.readouterr().out


def test_validate_torch_exits_0():
    pytest.importorskip("torch", reason="torch not installed: `rmsref validate torch`")
    assert main(["validate", "torch"]) == 0      # with the progress display (not a tty here)


def test_validate_torch_module_class(capsys):
    pytest.importorskip("torch", reason="torch not installed: `rmsref validate torch.nn:RMSNorm`")
    rc = main(["validate", "torch.nn:RMSNorm", "--dtype", "bfloat16", "--probes",
               "gaussian,multidim,no_weight", "--no-progress"])
    assert rc == 0, capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    assert main(["validate", "no_such_pkg_xyz:fn", "--no-progress"]) == 2
    assert "cannot load" in capsys.readouterr().err
    assert main(["validate", "rmsref:rms_norm", "--probes", "gauss", "--no-progress"]) == 2
    with pytest.raises(SystemExit):
        main(["validate", "rmsref:rms_norm", "--convention", "megatron"])


def test_conventions_lists_every_convention_with_formula(capsys):
    from rmsref.conventions import names

    assert main(["conventions"]) == 0
    text = capsys.readouterr().out
    for name in names():
        assert f"\n{name}\n" in text or text.startswith(name)
    assert "R_in((f32(x)·rstd)·f32(w))" in text
    assert main(["conventions", "gemma"]) == 0
    assert "1 + f32(w)" in capsys.readouterr().out
    assert main(["conventions", "megatron"]) == 2
