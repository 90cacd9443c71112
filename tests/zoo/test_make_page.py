"""docs/real-systems.md is generated from a zoo run's JSON: one row per entry, verdicts marked
against the expectation, unavailable entries shown with their reason (default test suite)."""

from __future__ import annotations

import json

from zoo.make_page import load_results, page

RAN = {
    "name": "a-norm", "title": "A RMSNorm", "package": "apkg", "version": "1.2.3",
    "source": "apkg:RMSNorm", "convention": "llama",
    "expected": {"float32": "pass", "bfloat16": "fail:double_rounding"},
    "verdicts": {"float32": "pass", "bfloat16": "pass"},
    "codes": {"float32": [], "bfloat16": []}, "backward": "pass",
    "identified": [{"name": "llama", "rate": 1.0, "rates": {"bfloat16/w=float32": 1.0}},
                   {"name": "t5", "rate": 0.5, "rates": {"bfloat16/w=float32": 0.5}}],
    "eps_default": "1e-06 (read from the module)", "out_dtype": "bfloat16",
    "float64": "float64 output, computed in float32 (max rel err 1.8e-07)",
    "notes": "x̂ | rounded twice", "unavailable": "",
}
MISSING = {"name": "b-norm", "title": "B norm", "package": "bpkg", "version": "not installed",
           "source": "bpkg:f", "convention": "torch", "expected": {"float32": "pass"},
           "verdicts": {}, "codes": {}, "notes": "n", "unavailable": "pip install bpkg"}


def test_page_has_one_row_per_result_and_marks_unexpected_verdicts(tmp_path):
    for r in (RAN, MISSING):
        (tmp_path / f"{r['name']}.json").write_text(json.dumps(r))
    results = load_results(tmp_path)
    text = page(results)
    assert text.startswith("# How real systems compute RMSNorm")
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "Implementation" not in ln]
    assert len(rows) == 2
    assert "`llama` 100.0%, `t5` 50.0%" in rows[0]
    assert "bfloat16: pass — expected fail:double_rounding" in rows[0]
    assert "x̂ \\| rounded twice" in rows[0]                       # a pipe cannot break the row
    assert "`y = w · R_in(f32(x)·rstd)" in rows[0]                # the identified order
    assert "unavailable: pip install bpkg" in rows[1]
    assert "1 of 2 verdicts (entry × dtype) as expected" in text
    assert "- apkg 1.2.3" in text and "bfloat16/w=float32 100.0%" in text
