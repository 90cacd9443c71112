"""bench/gpu_check.py, exercised without a GPU.

* ``--simulate-tiny`` runs the whole pipeline (device data, every check against the oracle,
  determinism, prepared launches, sampled-row checks, table, JSON) on tiny shapes in the
  simulator; only the timings are meaningless there.
* ``--compile-only`` is tested in test_ptx_compile.py (in the plain pytest run).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_simulate_tiny_runs_the_pipeline(kcuda, tmp_path, capsys):
    if not kcuda.SIMULATOR:
        pytest.skip("on a GPU, run bench/gpu_check.py itself")
    out = tmp_path / "gpu_check.json"
    rc = _load_script().main(["--simulate-tiny", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads(out.read_text())
    assert report["all_checks_pass"] is True
    checks = report["checks"]
    assert {c["dtype"] for c in checks} == {"fp32", "bf16"}
    assert {c["quantity"] for c in checks} >= {"y", "rstd", "dx", "dweight", "dbias",
                                               "new_residual", "dresidual"}
    assert {c["threads"] for c in checks} == {32}  # the forced tiny configuration
    assert all(0.0 <= c["max_ratio"] <= 1.0 for c in checks)
    assert report["determinism"] and all(d["pass"] for d in report["determinism"])
    assert report["timings"] and all(t["fwd_ms"] > 0 for t in report["timings"])
    assert "checks vs float64 oracle" in printed

