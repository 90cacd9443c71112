"""The numba_cuda tests: in Numba's CUDA simulator, or on a real GPU.

The simulator must be switched on before numba is first imported, so these tests run in their own
pytest process (``.ci/run``)::

    NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim -q

In the plain ``pytest`` run numba has already been imported without it; there every test here is
skipped with the reason (unless a real CUDA GPU is present, where they run on the device).
The simulator runs each thread as a Python thread (~0.35 s per 128-thread block), so every test
uses tiny grids: 32 or 64 threads per block, a handful of rows.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rmsref import backends

HERE = Path(__file__).parent


def why_skipped() -> str | None:
    """None when the numba_cuda backend can run here (simulator or GPU), else why not."""
    reason = backends.why_unavailable("numba_cuda")
    if reason is None:
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        return (
            f"numba_cuda unavailable ({reason}). These tests run in their own process: "
            "NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim -q"
        )
    return f"numba_cuda unavailable: {reason}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = why_skipped()
    if reason is None:
        return
    mark = pytest.mark.skip(reason=reason)
    for item in items:
        needs = getattr(getattr(item, "module", None), "NEEDS_BACKEND", True)
        if needs and HERE in Path(str(item.path)).parents:
            item.add_marker(mark)


@pytest.fixture(scope="session")
def kcuda():
    """The numba_cuda backend module (imported only when a test here runs)."""
    import rmsref

    return rmsref.backend("numba_cuda")
