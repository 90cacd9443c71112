"""``rmsref derive``: the worked example of docs/derivation/rmsnorm.md as a command.

Reference: the closed form dx = (8, −2, −2)/(9√3), dweight = (1/√3, 0, 0) derived by hand for
x = (1, 2, 2), w = 1, eps = 0, dy = (1, 0, 0), and the NumPy oracle for other inputs.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from rmsref.cli import main
from rmsref.commands import derive


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["derive", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def values_on(line_start: str, text: str) -> np.ndarray:
    """The tuple printed on the first line whose formula starts with ``line_start``."""
    for line in text.splitlines():
        body = line[8:] if len(line) > 8 else ""
        if body.startswith(line_start):
            tail = line.rsplit("=", 1)[1].strip()
            return np.array([float(v) for v in tail.strip("()").split(",")])
    raise AssertionError(f"no line starting with {line_start!r} in:\n{text}")


def test_worked_example_prints_the_closed_form_numbers(capsys):
    status, out, err = run_cli(capsys, "--x", "1,2,2", "--dy", "1,0,0", "--digits", "12")
    assert status == 0, err
    expected_dx = np.array([8.0, -2.0, -2.0]) / (9.0 * np.sqrt(3.0))
    np.testing.assert_allclose(values_on("dx      = rstd", out), expected_dx, rtol=1e-11)
    np.testing.assert_allclose(values_on("dx     = dx_direct", out), expected_dx, rtol=1e-11)
    np.testing.assert_allclose(values_on("dweight = dy", out), [1 / np.sqrt(3.0), 0, 0],
                               rtol=1e-11)
    # the two paths, each printed on its own line, sum to dx
    direct = values_on("dx_direct", out)
    via_rstd = values_on("dx_rstd", out)
    np.testing.assert_allclose(direct, [1 / np.sqrt(3.0), 0, 0], rtol=1e-11)
    np.testing.assert_allclose(via_rstd, [-1, -2, -2] / (9.0 * np.sqrt(3.0)), rtol=1e-11)
    np.testing.assert_allclose(values_on("fd dx", out), expected_dx, rtol=1e-8)
    assert "all checks agree" in out
    assert out.count("\n  ok  ") == 5


def test_derivation_matches_oracle_on_random_rows():
    import rmsref

    rng = np.random.default_rng(8)
    for n in (1, 2, 5, 17):
        x = rng.standard_normal(n) * 3.0
        dy = rng.standard_normal(n)
        w = rng.standard_normal(n)
        eps = float(rng.uniform(0, 0.1))
        d = derive.derive(x, dy, w, eps)
        ref = rmsref.rms_norm_backward(dy[None], x[None], n, w, eps)
        scale = d.rstd * (np.abs(d.dxhat) + np.abs(d.xhat) * abs(d.c))
        assert np.all(np.abs(d.dx - ref.dx[0]) <= 1e-13 * scale.max()), n
        assert np.all(np.abs(d.dx_staged - ref.dx[0]) <= 1e-13 * scale.max()), n
        np.testing.assert_allclose(d.dweight, ref.dweight, rtol=1e-14, atol=1e-300)
        fd_dx, fd_dw, _ = derive.finite_differences(x, dy, w, eps)
        np.testing.assert_allclose(fd_dx, d.dx, atol=1e-7 * scale.max())
        np.testing.assert_allclose(fd_dw, d.dweight, atol=1e-7 * max(1.0, np.abs(d.dweight).max()))
        text, ok = derive.report(d, with_jacobian=True)
        assert ok, text


def test_jacobian_eigenvalues_and_orthogonality(capsys):
    status, out, _ = run_cli(capsys, "--x", "1,2,2", "--dy", "1,0,0", "--jacobian")
    assert status == 0
    m = re.search(r"eigenvalues: \(([^)]*)\)", out)
    assert m, out
    eig = np.array([float(v) for v in m.group(1).split(",")])
    # eps = 0: one zero eigenvalue (along x), N-1 equal to rstd·w = 1/√3
    np.testing.assert_allclose(np.sort(eig), [0, 1 / np.sqrt(3), 1 / np.sqrt(3)], atol=1e-5)
    m = re.search(r"⟨dx, x⟩ = (\S+)", out)
    assert m and abs(float(m.group(1))) < 1e-14


def test_eps_breaks_orthogonality_by_the_predicted_amount():
    x, dy, w = np.array([1.0, -2.0, 3.5]), np.array([0.3, -1.0, 2.0]), np.array([0.5, 2.0, 1.0])
    eps = 0.25
    d = derive.derive(x, dy, w, eps)
    inner = float(np.dot(d.dx, x))
    predicted = eps / (d.ms + eps) * d.rstd * float(np.sum(dy * w * x))
    assert abs(inner - predicted) <= 1e-14 * abs(predicted)
    assert abs(inner) > 1e-3  # not orthogonal any more


def test_a_wrong_backward_is_flagged(monkeypatch):
    """The checks can fail: an oracle without the projection term makes `derive` exit 1."""
    import rmsref

    def no_projection(dy, x, normalized_shape, weight=None, eps=None):
        rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return rmsref.RMSNormGrads(dy * weight * rstd, np.sum(dy * x * rstd, axis=0), None)

    monkeypatch.setattr(rmsref, "rms_norm_backward", no_projection)
    d = derive.derive(np.array([1.0, 2.0, 2.0]), np.array([1.0, 0.0, 0.0]), np.ones(3), 0.0)
    text, ok = derive.report(d)
    assert not ok
    assert "FAIL  oracle rms_norm_backward dx" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--x", "1,2,2", "--dy", "1,0"], "--x and --dy must have the same length; got --x with 3"),
        (["--x", "1,2", "--dy", "1,0", "--w", "1,2,3"], "--w must have the same length as --x"),
        (["--x", "1,two", "--dy", "1,0"], "--x: 'two' is not a number"),
        (["--x", "1,,2", "--dy", "1,0,0"], "--x must be comma-separated numbers"),
        (["--x", "1,nan", "--dy", "1,0"], "--x must be finite"),
        (["--x", "0,0", "--dy", "1,0"], "mean(x²) + eps = 0"),
        (["--x", "1,2", "--dy", "1,0", "--eps", "-1"], "--eps must be finite and >= 0"),
        (["--x", "1,2", "--dy", "1,0", "--eps", "tiny"], "--eps must be a number"),
        (["--x", "1e200,1", "--dy", "1,0"], "overflows float64"),
        (["--x", "1,2", "--dy", "1,0", "--digits", "0"], "--digits must be in 1..17"),
    ],
)
def test_bad_input_is_named(capsys, argv, message):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2
    assert out == ""
    assert message in err
    assert err.startswith("rmsref derive: error:")


def test_zero_x_with_eps_works(capsys):
    status, out, _ = run_cli(capsys, "--x", "0,0,0", "--dy", "1,2,3", "--eps", "1e-6")
    assert status == 0
    # x = 0: xhat = 0, so dx = rstd·dxhat = dy/sqrt(eps)
    np.testing.assert_allclose(values_on("dx      = rstd", out), [1e3, 2e3, 3e3], rtol=1e-5)


def test_console_script_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "rmsref.cli", "derive", "--x", "1,2,2", "--dy", "1,0,0"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "0.5132" in proc.stdout and "-0.1283" in proc.stdout
    help_proc = subprocess.run(
        [sys.executable, "-m", "rmsref.cli", "derive", "--help"],
        capture_output=True, text=True, timeout=60,
    )
    assert help_proc.returncode == 0
    assert "worked example" in help_proc.stdout
