"""The kernel history (bench/variants/numba_cpu_history.py) against the NumPy oracle.

Reference: the oracle on the same inputs, with the tolerances of tests/test_numba_cpu.py (float32
y: >= 99.9 % equal to the oracle's, the rest within 1 ulp; dx: the docs/tolerances.md bound
through rmsref.comparison.compare). Every variant is checked before ``bench/cpu.py`` times it,
and the pipelined ones (forward v4-v5, backward v4-v6) against v3 bit for bit: they claim v3's
bits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="the Numba kernels need numba (pip install 'rmsref[numba]')")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: it is imported from the checkout
    sys.path.insert(0, str(ROOT))

import rmsref  # noqa: E402
from bench.variants.numba_cpu_history import VARIANTS, variant  # noqa: E402
from rmsref.kernels import numba_cpu as K  # noqa: E402

from .test_numba_cpu import _check_close, _data, _model, _reference, _within_bound  # noqa: E402


@pytest.mark.slow  # compiles every variant; CI runs it (pytest -m slow)
@pytest.mark.parametrize("name", ["rms_norm_forward", "rms_norm_backward"])
def test_every_variant_matches_oracle(name, rng):
    """Each numbered variant checked against the oracle before anyone times it."""
    m, n = 33, 4097
    x, dy, w = _data(rng, (m, n), np.float32), _data(rng, (m, n), np.float32), _data(
        rng, n, np.float32)
    oracle = _reference(x, n, w, dy)
    for number in VARIANTS[name]:
        f = variant(name, number)
        if name == "rms_norm_forward":
            _check_close(f(x, n, w)[0], rmsref.rms_norm_forward(x, n, w)[0], np.float32,
                         f"v{number}")
        else:
            _within_bound("dx", f(dy, x, n, w).dx, oracle, _model(np.float32, n, rows=m),
                          f"v{number}")
    # the pipelined loops (v4, and the kernels of their own that forward v5 and backward v5, v6
    # give the common call) claim v3's bits (same lanes, same order); m = 33 rows make a part
    # whose last row runs through that loop too, and blocks of 16 rows that v5 pipelines as one
    # run
    for number in VARIANTS[name]:
        if number < 4:
            continue
        v3, vk = variant(name, 3), variant(name, number)
        if name == "rms_norm_forward":
            assert np.array_equal(v3(x, n, w)[0], vk(x, n, w)[0]), f"v{number}"
        else:
            _, rstd = K.rms_norm_forward(x, n, w)
            a, b = v3(dy, x, n, w, rstd=rstd), vk(dy, x, n, w, rstd=rstd)
            assert np.array_equal(a.dx, b.dx), f"v{number}"
            assert np.array_equal(a.dweight, b.dweight), f"v{number}"
            # without a saved rstd: v6 computes rstd first (``_rms_rstd``), then pipelines
            a, b = v3(dy, x, n, w), vk(dy, x, n, w)
            assert np.array_equal(a.dx, b.dx), f"v{number}, rstd recomputed"
            assert np.array_equal(a.dweight, b.dweight), f"v{number}, rstd recomputed"
    with pytest.raises(ValueError, match="variants"):
        variant(name, 99)


def test_the_highest_variant_is_the_library_default(rng):
    """The history's last variants are what ``rmsref.backend("numba_cpu")`` runs: same bits."""
    m, n = 40, 130
    x, dy, w = (_data(rng, s, np.float32) for s in ((m, n), (m, n), n))
    fwd = variant("rms_norm_forward", max(VARIANTS["rms_norm_forward"]))
    bwd = variant("rms_norm_backward", max(VARIANTS["rms_norm_backward"]))
    y, rstd = K.rms_norm_forward(x, n, w)
    assert np.array_equal(fwd(x, n, w)[0], y)
    a, b = bwd(dy, x, n, w, rstd=rstd), K.rms_norm_backward(dy, x, n, w, rstd=rstd)
    assert np.array_equal(a.dx, b.dx) and np.array_equal(a.dweight, b.dweight)
    assert not hasattr(K, "variant") and not hasattr(K, "VARIANTS")  # the library ships no history
