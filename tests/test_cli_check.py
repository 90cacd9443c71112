"""`rmsref check`, run in-process through rmsref.cli.main for speed.

Most runs use --backend numpy (the oracle alone) so that no Numba compilation happens here; the
backend checks are exercised with fake backends built from the oracle (one correct, one wrong, one
non-deterministic), and once on numba_cpu (marked slow: a cold Numba cache compiles).
"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

import rmsref
from rmsref.cli import main

pytest.importorskip("scipy", reason="the statistical identities use scipy.stats")


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    status = main(["check", *argv])
    out = capsys.readouterr()
    return status, out.out + out.err


# ----------------------------------------------------------------------------------------------
# help
# ----------------------------------------------------------------------------------------------


def test_help_is_written_for_a_newcomer(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "check" in text and "rmsref check" in text
    with pytest.raises(SystemExit) as exc:
        main(["check", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--quick", "--json", "--backend", "--only", "--seed", "-v", "--full"):
        assert flag in text
    assert "ratio <= 1" in text and "Exit status" in text


# ----------------------------------------------------------------------------------------------
# the oracle alone
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "rich"])
def test_quick_run_passes_and_prints_every_identity(capsys, plain):
    if not plain:
        pytest.importorskip("rich")
    args = ["--quick", "--backend", "numpy"] + (["--plain"] if plain else [])
    status, text = run_cli(capsys, *args)
    assert status == 0, text
    for name in rmsref.identities.names():
        assert name in text
    assert "gradcheck" in text and "rms_norm 3x16" in text
    summary = text.strip().splitlines()[-1]
    assert summary.startswith("rmsref check: PASSED") and " 0 failed" in summary


def test_only_selects_and_json_records_everything(capsys, tmp_path):
    path = tmp_path / "report.json"
    status, text = run_cli(capsys, "--quick", "--backend", "numpy", "--plain",
                           "--only", "identities: shift", "--only", "*jacobian",
                           "--json", str(path), "--seed", "5")
    assert status == 0, text
    doc = json.loads(path.read_text())  # strict JSON: NaN/Infinity would not parse in strict mode
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert doc["seed"] == 5 and doc["quick"] is True and doc["passed"] is True
    assert [(r["group"], r["check"]) for r in doc["results"]] == [
        ("identities", "shift"), ("identities", "jacobian")]
    assert doc["summary"] == {"passed": 2, "failed": 0, "skipped": 0}
    for r in doc["results"]:
        assert r["status"] == "pass" and 0 <= r["ratio"] <= 1 and r["bound"] > 0
        assert r["parts"] and all(p["residual"] <= p["bound"] for p in r["parts"])
    assert "2 passed" in text


def test_verbose_prints_details(capsys):
    status, text = run_cli(capsys, "--quick", "--backend", "numpy", "--plain", "-v",
                           "--only", "identities: shift")
    assert status == 0
    assert "a shift moves RMSNorm by up to" in text


def test_usage_errors_exit_2(capsys):
    status, text = run_cli(capsys, "--backend", "numpy", "--only", "no-such-check")
    assert status == 2 and "no check matches" in text
    status, text = run_cli(capsys, "--backend", "nonexistent")
    assert status == 2 and "unknown backend" in text


def test_a_broken_oracle_fails_the_check(capsys, monkeypatch, tmp_path):
    """The forced failure path: LayerNorm with ddof=1 makes two identities fail, exit 1."""

    def ln_ddof1(x, normalized_shape, weight=None, bias=None, eps=1e-5, **kw):
        x = np.asarray(x, np.float64)
        mu = np.mean(x, axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True, ddof=1) + eps)
        y = (x - mu) * rstd * (1.0 if weight is None else weight)
        return (y if bias is None else y + bias), mu, rstd

    monkeypatch.setattr(rmsref, "layer_norm_forward", ln_ddof1)
    path = tmp_path / "fail.json"
    status, text = run_cli(capsys, "--quick", "--backend", "numpy", "--plain",
                           "--only", "identities", "--json", str(path))
    assert status == 1
    assert text.strip().splitlines()[-1].startswith("rmsref check: FAILED")
    doc = json.loads(path.read_text())
    failed = {r["check"] for r in doc["results"] if r["status"] == "FAIL"}
    assert failed == {"rms2_var_mean2", "layernorm_is_centred_rmsnorm"}
    assert doc["passed"] is False and doc["summary"]["failed"] == 2
    assert "FAIL  identities: rms2_var_mean2" in text


# ----------------------------------------------------------------------------------------------
# backends, faked from the oracle so that nothing compiles
# ----------------------------------------------------------------------------------------------


def _fake_backend(forward=None):
    """A backend namespace with the oracle's functions (forward replaceable)."""
    return types.SimpleNamespace(
        rms_norm_forward=forward or rmsref.rms_norm_forward,
        rms_norm_backward=rmsref.rms_norm_backward,
    )


def _install(monkeypatch, module) -> None:
    """A registry of the oracle and one fake backend (an entry like any other's)."""
    from rmsref import backends

    fake = backends.BackendSpec(name="fake", module="rmsref", description="a test double")
    monkeypatch.setattr(backends, "_REGISTRY", {"numpy": backends.spec("numpy"), "fake": fake})
    monkeypatch.setattr(rmsref, "available_backends", lambda: {"numpy": None, "fake": None})
    monkeypatch.setattr(rmsref, "backend", lambda name: module)


def test_a_correct_backend_agrees_and_is_deterministic(capsys, monkeypatch, tmp_path):
    _install(monkeypatch, _fake_backend())
    path = tmp_path / "fake.json"
    status, text = run_cli(capsys, "--quick", "--plain", "--only", "fake", "--json", str(path))
    assert status == 0, text
    doc = json.loads(path.read_text())
    checks = {r["check"]: r for r in doc["results"]}
    assert set(checks) == {"forward y float32", "forward rstd float32", "backward dx float32",
                           "backward dweight float32", "bitwise repeat", "bitwise batch size"}
    assert doc["backends"] == ["fake"]
    assert all(r["status"] == "pass" for r in doc["results"])
    # the oracle rounds once: its float32 error is at most half an ulp, well inside the bound
    assert "0.50 ulp" in checks["forward y float32"]["detail"] or checks[
        "forward y float32"]["ratio"] < 0.6


def test_a_wrong_backend_fails_agreement(capsys, monkeypatch):
    def off_by_a_bit(x, ns, weight=None, eps=None, **kw):
        y, rstd = rmsref.rms_norm_forward(x, ns, weight, eps, **kw)
        return (y.astype(np.float64) * (1 + 2.0**-12)).astype(y.dtype), rstd

    _install(monkeypatch, _fake_backend(off_by_a_bit))
    status, text = run_cli(capsys, "--quick", "--plain", "--only", "fake: forward y")
    assert status == 1
    assert "FAIL  fake: forward y float32" in text


def test_a_nondeterministic_backend_fails_bitwise(capsys, monkeypatch):
    calls = {"n": 0}

    def wobbly(x, ns, weight=None, eps=None, **kw):
        calls["n"] += 1
        y, rstd = rmsref.rms_norm_forward(x, ns, weight, eps, **kw)
        if calls["n"] % 2:  # every other call rounds the last bit differently
            y = np.nextafter(y, np.inf).astype(y.dtype)
        return y, rstd

    _install(monkeypatch, _fake_backend(wobbly))
    status, text = run_cli(capsys, "--quick", "--plain", "--only", "fake: bitwise repeat")
    assert status == 1
    assert "y:" in text and "elements differ" in text


def test_a_backend_that_cannot_import_is_skipped(capsys, monkeypatch):
    def missing(name):
        raise RuntimeError("backend 'fake' is unavailable: fakelib is not installed")

    _install(monkeypatch, None)
    monkeypatch.setattr(rmsref, "backend", missing)
    status, text = run_cli(capsys, "--quick", "--plain", "--only", "fake")
    assert status == 0
    assert "skip" in text and "fakelib is not installed" in text


@pytest.mark.slow
def test_numba_cpu_backend_quick(capsys):
    pytest.importorskip("numba")
    if rmsref.available_backends().get("numba_cpu") is not None:
        pytest.skip(rmsref.available_backends()["numba_cpu"])
    status, text = run_cli(capsys, "--quick", "--plain", "--backend", "numba_cpu",
                           "--only", "numba_cpu")
    assert status == 0, text
    assert "bitwise thread count" in text and "bitwise batch size" in text


def test_json_stays_strict_when_a_ratio_is_infinite(capsys, monkeypatch, tmp_path):
    """A module with running statistics breaks a bit-for-bit identity (bound 0, ratio inf)."""

    class RunningRMSNorm(rmsref.RMSNorm):
        def forward(self, x):
            self.running_scale = getattr(self, "running_scale", 1.0) * 0.5
            return super().forward(x) * (1.0 + self.running_scale)

    monkeypatch.setattr(rmsref, "RMSNorm", RunningRMSNorm)
    path = tmp_path / "inf.json"
    status, text = run_cli(capsys, "--quick", "--backend", "numpy", "--plain",
                           "--only", "row_independence", "--json", str(path))
    assert status == 1
    doc = json.loads(path.read_text())
    (row,) = doc["results"]
    assert row["status"] == "FAIL" and row["ratio"] is None
    assert any(p["ratio"] is None for p in row["parts"])
    assert "inf" in text


def test_a_reader_closing_the_pipe_is_not_a_failure():
    """``rmsref check | head -1``: when the reader closes the pipe the command stops quietly
    with status 0 (rich, which writes the output, would exit with 1), and says nothing on
    stderr."""
    import subprocess
    import sys

    pytest.importorskip("rich", reason="the closed-pipe path under test is rich's")
    proc = subprocess.Popen([sys.executable, "-m", "rmsref", "check", "--quick", "--only",
                             "identities"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"rmsref")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == ""
