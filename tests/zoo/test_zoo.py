"""The zoo: every real implementation in ``zoo/entries/`` gets the verdict its entry expects from
reading its source, per dtype (``pytest -m zoo``; CI installs ``zoo/requirements.txt`` first).

An entry that cannot run here (package or compiler missing) is skipped with its reason. The
diagnosis code of an expected failure is asserted when the diagnosis engine
(``rmsref.diagnosis``) is present, and skipped visibly otherwise. Each run is written as JSON to
``$RMSREF_ZOO_RESULTS`` (default ``build/zoo-results``), from which ``python -m zoo.make_page``
generates docs/real-systems.md.
"""

from __future__ import annotations

import os

import pytest

from zoo.entry import ZooEntry, ZooUnavailable
from zoo.registry import Broken, discover, run, unavailable, write_result

pytestmark = pytest.mark.zoo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.environ.get("RMSREF_ZOO_RESULTS", os.path.join(ROOT, "build", "zoo-results"))
_RUNS: dict[str, tuple] = {}


def _params() -> list:
    params = []
    for item in discover():
        if isinstance(item, Broken):
            params.append(pytest.param(item, None, id=item.module))
            continue
        for dname in item.dtypes:
            params.append(pytest.param(item, dname, id=f"{item.name}-{dname}"))
    return params


def _outcome(entry: ZooEntry):
    """Run ``entry`` once (the dtypes of one entry share the run) and record the result."""
    if entry.name not in _RUNS:
        try:
            result, report = run(entry)
        except (ZooUnavailable, ImportError) as exc:
            result, report = unavailable(entry, str(exc)), None
        write_result(result, RESULTS)
        _RUNS[entry.name] = (result, report)
    return _RUNS[entry.name]


def _failures(report, dname: str) -> str:
    lines = [f"  {c.probe}/{c.quantity}: ratio {c.ratio:.3g} {c.message}"
             for c in report.cases if c.dtype == dname and not c.ok]
    return "\n".join(lines[:15] + [f"  notes: {report.notes}"])


@pytest.mark.parametrize(("entry", "dname"), _params())
def test_entry_gets_its_expected_verdict(entry, dname):
    if isinstance(entry, Broken):
        if entry.error.startswith(("ImportError", "ModuleNotFoundError")):
            pytest.skip(f"{entry.module}: {entry.error}")
        pytest.fail(f"zoo entry module {entry.module} does not import: {entry.error}")
    result, report = _outcome(entry)
    if result.unavailable:
        pytest.skip(f"{entry.name} unavailable here: {result.unavailable}")
    expected = entry.expected[dname]
    verdict, _, code = expected.partition(":")
    assert result.verdicts[dname] == verdict, (
        f"{entry.title} in {dname}: expected {expected}, got {result.verdicts[dname]} "
        f"(codes {result.codes[dname]})\n{_failures(report, dname)}")
    if verdict == "fail":          # the cause the entry's author read in the source, first
        assert result.codes[dname][:1] == [code], (
            f"{entry.title} in {dname}: expected the cause {code!r}, diagnosed "
            f"{result.codes[dname]}\n{_failures(report, dname)}")
    elif all(v.startswith("pass") for v in entry.expected.values()):
        assert report.diagnoses == [], (      # correct code: no diagnosis at all
            f"{entry.title}: diagnosed {[d.code for d in report.diagnoses]} on correct code")
