"""Shared fixtures: the dtype table, a seeded generator, and the backend registry."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import backends
from rmsref._shapes import bfloat16

#: dtype name -> dtype, the table every parametrised test walks.
DTYPES = {
    "float16": np.dtype(np.float16),
    "bfloat16": bfloat16,
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


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
