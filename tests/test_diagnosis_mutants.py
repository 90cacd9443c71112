"""rmsref.diagnosis, case by case: one observation (or a few) built by hand, the mistake planted
in a few lines of NumPy, and what the engine must conclude: the code, the fitted parameter, the
text the user reads, and no cause where none holds. Reference: the float64 oracle
(rmsref.comparison.Reference); bounds: the convention's rmsref.tolerance model."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import conventions, diagnosis
from rmsref.comparison import Reference, compare


def observe(got, x, shape, w=None, eps=None, *, quantity="y", dy=None, convention="torch",
            probe="gaussian"):
    """The Observation validation records for one compared quantity, judged by the convention's
    own error model against the float64 oracle."""
    conv = conventions.get(convention)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    eps_val = conv.default_eps(x.dtype) if eps is None else float(eps)
    ref = Reference(x, shape, w, eps_val, dy=dy, offset=conv.default_offset)
    model = conv.error_model(x.dtype, ref.n, ref.rows)
    expected = ref.exact(quantity)
    got_rows = np.asarray(got, np.float64).reshape(expected.shape)
    c = compare(quantity, got_rows, ref, model)
    return diagnosis.Observation(probe, quantity, x, shape, w, dy, eps, eps_val,
                                 conv.default_offset, got_rows, model, c.ratio, c.passed)


@pytest.fixture
def xw32(rng):
    x = rng.standard_normal((6, 64)).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(64)).astype(np.float32)
    return x, w


def rms32(x, w, eps=2.0**-23, divisor=None):
    """A float32 forward; ``divisor`` plants a wrong count (N − 1, 1) in the mean of squares."""
    n = x.shape[-1]
    ms = np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32) / np.float32(divisor or n)
    return (x / np.sqrt(ms + np.float32(eps)) * w).astype(np.float32)


def test_n_minus_1_is_named_and_falls_back_inside_the_bound(xw32):
    x, w = xw32
    obs = observe(rms32(x, w, divisor=x.shape[-1] - 1), x, 64, w)
    assert not obs.passed
    (d,) = diagnosis.diagnose([obs])
    assert d.code == "n_minus_1"
    assert d.evidence.ratio_after <= 1.0 < d.evidence.ratio_before
    assert d.evidence.cases == ["gaussian/float32/y"]
