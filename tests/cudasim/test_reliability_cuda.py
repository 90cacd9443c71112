"""numba_cuda's argument checks: a bad argument is an error naming it, before any launch.

Each call here fails in validation, so no kernel runs (fast in the simulator too); the last test
runs one tiny call (32 threads, 2 rows) to show a good call still works.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def args():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    return x, rng.standard_normal((2, 8)).astype(np.float32), np.ones(8, np.float32)


@pytest.mark.parametrize("bad", [[1.0, 2.0, 3.0], None, 1.5], ids=["list", "None", "float"])
def test_dy_residual_and_rstd_that_are_not_arrays_are_named(kcuda, args, bad):
    x, dy, w = args
    with pytest.raises((TypeError, ValueError), match="^dy "):
        kcuda.rms_norm_backward(bad, x, 8, w)
    with pytest.raises((TypeError, ValueError), match="^residual "):
        kcuda.add_rms_norm_forward(x, bad, 8, w)
    if bad is not None:  # rstd=None means "recompute"
        with pytest.raises((TypeError, ValueError), match="^rstd "):
            kcuda.rms_norm_backward(dy, x, 8, w, rstd=bad)


def test_launch_must_be_a_launch(kcuda, args):
    x, _, w = args
    with pytest.raises(TypeError, match="launch must be a numba_cuda.Launch"):
        kcuda.rms_norm(x, 8, w, launch="nope")


@pytest.mark.parametrize("kw, name", [({"eps": "1e-5"}, "eps"), ({"eps": float("nan")}, "eps"),
                                      ({"offset": "1"}, "offset"), ({"partial": 1j}, "partial")])
def test_the_shared_rules_for_eps_offset_partial(kcuda, args, kw, name):
    x, _, w = args
    with pytest.raises((TypeError, ValueError), match=name):
        kcuda.rms_norm_forward(x, 8, w, **kw)


def test_masked_input_is_refused(kcuda, args):
    x, _, w = args
    with pytest.raises(TypeError, match="input is a masked array"):
        kcuda.rms_norm(np.ma.masked_array(x, mask=x > 1), 8, w)


def test_a_good_call_still_runs(kcuda, args):
    x, _, w = args
    y = kcuda.rms_norm(x, 8, w, 1e-5, launch=kcuda.Launch(threads=32))
    assert y.shape == x.shape and np.all(np.isfinite(y))
