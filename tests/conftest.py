"""Shared fixtures: the dtype table, a seeded generator, and the backend registry."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import backends
from rmsref._shapes import FLOAT_DTYPES

#: dtype name -> dtype, the table every parametrised test walks (the library's own table).
DTYPES = FLOAT_DTYPES


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)


def backend_params(exclude: tuple[str, ...] = ()) -> list:
    """pytest params over the registry; an unavailable backend is skipped with its reason."""
    params = []
    for name in backends.backend_names():
        if name in exclude:
            continue
        reason = backends.why_unavailable(name)
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture(params=backend_params())
def backend_name(request) -> str:
    return request.param


def pytest_addoption(parser, pluginmanager) -> None:
    """Without pytest-xdist (the ``test`` extra installs it), accept the ``-n 2 --dist
    loadfile`` of the default options and run in one process, saying so in the header, rather
    than stop at "unrecognized arguments"."""
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist", "pytest-xdist is not loaded: one process")
    add = getattr(group, "_addoption", None)  # -n is a short option, as xdist declares it
    if add is not None:
        add("-n", "--numprocesses", dest="numprocesses", default=None,
            help="ignored: pytest-xdist is not loaded (pip install -e '.[test]')")
        add("--dist", dest="dist", default="no", help="ignored, as -n")


def pytest_report_header(config) -> str | None:
    if config.pluginmanager.has_plugin("xdist") or not config.getoption("numprocesses", None):
        return None
    return ("pytest-xdist is not loaded: the tests run in one process, about twice as long "
            "on a cold Numba cache (pip install -e '.[test]' installs it)")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Skips counted by reason, one line each (``pytest -rs`` lists every skipped test): the
    reasons name what to install, and a reason shared by forty tests is said once."""
    from collections import Counter

    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons and "s" not in (config.option.reportchars or ""):
        terminalreporter.section("skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.line(f"{count:4d}  {reason}")
