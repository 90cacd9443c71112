#!/usr/bin/env bash
# One lease of a CUDA GPU machine, in one call: what the machine is, bench/gpu_check.py (checks
# against the oracle, determinism, timings), then the numba_cuda tests on the real device
# (tests/cudasim run on a GPU when one is present, and the backend suite's numba_cuda cases).
#
#   OUT=/some/folder bash bench/gpu_session.sh     # writes env.txt, gpu_check.{json,log},
#                                                   # pytest_cuda.log there
#
# Each step has its own time limit (CHECK_S, TESTS_S seconds; gpu_check's --budget BUDGET), so a
# hang in one still leaves the others' output; the whole stays under ~8 minutes. On an H200 the
# checks take ~130 s and the timings ~50 s without --sweep (BUDGET counts from
# gpu_check's start); the tests ~120 s.
set -u
OUT=${OUT:-/tmp/rmsref-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
unset NUMBA_ENABLE_CUDASIM
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem \
        --format=csv
    nproc
    $PY -c "import sys, numpy, numba, numba_cuda, ml_dtypes
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__,
      'numba_cuda', numba_cuda.__version__, 'ml_dtypes', ml_dtypes.__version__)"
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"
timeout "${CHECK_S:-330}" $PY bench/gpu_check.py --budget "${BUDGET:-240}" \
    --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
echo "gpu_check.py exit status ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_check.log"
timeout "${TESTS_S:-150}" $PY -m pytest -q -p no:cacheprovider -rs tests/cudasim \
    tests/test_backends.py -k "numba_cuda or cudasim" 2>&1 | tee "$OUT/pytest_cuda.log"
echo "pytest exit status ${PIPESTATUS[0]}" | tee -a "$OUT/pytest_cuda.log"
