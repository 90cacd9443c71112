"""The GPU code compiles: ``bench/gpu_check.py --compile-only --quick`` makes PTX for sm_90.

No GPU is needed, only libNVVM (numba-cuda's compiler), so this runs in the plain ``pytest`` run
(the conftest does not skip this module: NEEDS_BACKEND = False). It covers what the simulator
cannot: the real ``shfl_xor_sync`` butterfly of the warp forward, the libdevice bit casts of the
half-precision conversions, the backward with every option, and the device data generator of
the GPU script; the PTX is also checked for atomics (there must be none).

Each kernel's line carries a fingerprint of its PTX (numba's per-process naming left out), so
two checkouts can be compared kernel by kernel: a refactoring that must not change the generated
code runs ``bench/gpu_check.py --compile-only`` on both and diffs the fingerprints.
"""

from __future__ import annotations

import importlib.util
import os
import re
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
    assert "forward warp" in proc.stdout and "compiled 7/7 kernels" in proc.stdout
    kernels = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    fingerprints = [re.search(r"fingerprint ([0-9a-f]{16})", line) for line in kernels]
    assert len(kernels) == 7 and all(fingerprints), proc.stdout
    # rows held in registers and rows read twice, forward (block, warp) and backward
    assert sum("ForwardOptions" in k and "cols=0" not in k for k in kernels) == 2
    assert sum("held=True" in k for k in kernels) == 1
    # distinct kernels, distinct code (held or not, the warp variant's shuffle, the fill)
    assert len({f.group(1) for f in fingerprints}) == 7
    # every rmsref kernel declares the threads it is launched with (.maxntid in its PTX): without
    # the bound the compiler may use more registers than 1024 threads can have, and the launch
    # fails on a GPU (the backward at N = 4096 did on an H200)
    for line in kernels:
        if line.startswith("ok   fill"):
            continue
        bound = re.search(r"launch bound (\d+) threads", line)
        threads = re.search(r"threads=(\d+)", line)
        assert bound and threads and bound.group(1) == threads.group(1), line


def test_ptx_fingerprint_ignores_numbas_naming_only():
    """The fingerprint leaves out the version tags numba puts in mangled names and the order of
    its environment-pointer declarations, and nothing else."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up there
    spec.loader.exec_module(gpu_check)
    env = ".common .global .align 8 .u64 _ZN08NumbaEnv6rmsref{}B2v{}B5cw51cE;"
    body = "call _ZN6rmsref10_block_sumB2v{}B5cw51cEf;\nadd.f32 %f1, %f2, %f3;"
    ptx = "\n".join([env.format("a", 4), env.format("b", 6), body.format(6)])
    renamed = "\n".join([env.format("b", 9), env.format("a", 3), body.format(7)])
    changed = ptx.replace("add.f32", "sub.f32")
    fingerprint = gpu_check.ptx_fingerprint
    assert fingerprint(ptx) == fingerprint(renamed)
    assert fingerprint(ptx) != fingerprint(changed)
