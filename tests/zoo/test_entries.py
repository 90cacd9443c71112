"""The zoo's entries are well formed (no package is imported, nothing is built): names unique,
a verdict for every dtype, known conventions and cause codes. Runs in the default test suite;
the entries themselves run under ``pytest -m zoo``."""

from __future__ import annotations

import pytest

from rmsref import conventions
from zoo.entry import ZooEntry
from zoo.registry import DIAGNOSIS_CODES, Broken, discover, entry_modules

ENTRIES = [e for e in discover() if isinstance(e, ZooEntry)]


def test_every_entry_module_imports_without_its_package():
    """Entry modules import their packages inside ``build`` only."""
    broken = [b for b in discover() if isinstance(b, Broken)]
    assert not broken, broken
    assert "zoo.entries.torch_core" in entry_modules()
    assert "zoo.entries.hf_transformers" in entry_modules()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_states_a_verdict_per_dtype(entry):
    assert entry.convention in conventions.names()
    assert set(entry.expected) == set(entry.dtypes), (entry.expected, entry.dtypes)
    for dname, verdict in entry.expected.items():
        kind, _, code = verdict.partition(":")
        assert kind in ("pass", "fail") and (code == "") == (kind == "pass"), (dname, verdict)
        assert kind == "pass" or code in DIAGNOSIS_CODES, (dname, verdict)
    assert entry.notes and entry.title and entry.source


def test_the_zoo_has_torch_and_six_distinct_transformers_classes():
    names = {e.name for e in ENTRIES}
    assert {"torch-f-rms-norm", "torch-rmsnorm-class", "torch-rmsnorm-instance"} <= names
    hf_classes = {e.source for e in ENTRIES if e.package == "transformers"}
    assert len(hf_classes) >= 6, hf_classes
