"""The GPU code compiles: ``bench/gpu_check.py --compile-only --quick`` makes PTX for sm_90.

No GPU is needed, only libNVVM (numba-cuda's compiler), so this runs in the plain ``pytest`` run
(the conftest does not skip this module: NEEDS_BACKEND = False). It covers what the simulator
cannot: the real ``shfl_xor_sync`` butterfly of the warp forward, the libdevice bit casts of the
half-precision conversions, the backward with every option, and the device data generator of
the GPU script; the PTX is also checked for atomics (there must be none).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NEEDS_BACKEND = False  # read by tests/cudasim/conftest.py
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
    reason="runs in the plain pytest run (compiling needs a process without the simulator)",
)
def test_compile_only_makes_ptx_for_gpu_only_kernels():
    # the numba-cuda package (Numba's own deprecated numba.cuda cannot compile these kernels)
    pytest.importorskip("numba_cuda", reason="numba-cuda is not installed: pip install "
                        "'rmsref[cuda]'")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--compile-only", "--quick"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode == 3:
        pytest.skip(f"no CUDA compiler toolchain here: {proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "forward warp" in proc.stdout and "compiled 4/4 kernels" in proc.stdout
