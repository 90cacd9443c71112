"""bench/suite_compiles.py: the compile events of a pytest run, charged to the test that caused
them (run on a test file written here, which compiles one small function for two types)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="bench/suite_compiles.py times Numba's compilations")
pytest.importorskip("xdist", reason="bench/suite_compiles.py runs pytest with -n 0 (pytest-xdist)")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "suite_compiles.py"

TESTS = '''
import numpy as np
from numba import njit


@njit
def twice(a):
    return a * 2


def test_float64():
    assert twice(np.ones(3))[0] == 2.0


def test_float64_again():  # the same types: no compilation
    assert twice(np.ones(4))[0] == 2.0


def test_int16_view():
    assert twice(np.ones(3, np.int16)[::2])[0] == 2
'''


def _load():
    spec = importlib.util.spec_from_file_location("suite_compiles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_specialisation_is_charged_to_the_test_that_compiled_it(tmp_path, capfd):
    script = _load()
    tests = tmp_path / "test_twice.py"
    tests.write_text(TESTS)
    assert script.main([str(tests), "--top", "5"]) == 0
    out = capfd.readouterr().out
    assert "2 compilations" in out
    assert "| `twice` | 2 |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "`twice`" in line]
    assert any("float64[1C]" in r and r.endswith("| test_float64 |") for r in rows), rows
    assert any("int16[1A]" in r and r.endswith("| test_int16_view |") for r in rows), rows


def test_short_types_names_dtype_rank_and_layout():
    script = _load()
    assert (script.short_types("(Array(int16, 3, 'C', False, aligned=True), none, "
                               "Array(float64, 1, 'A', True, aligned=True))")
            == "(int16[3C], none, ro float64[1A])")
