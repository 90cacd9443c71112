"""Kernel versions that taught us how to reach the defaults; the library ships only the defaults.

``numba_cpu_history`` holds the Numba CPU RMSNorm variants (forward v1-v4, backward v1-v5) with
the library's public signatures, for ``bench/cpu.py`` and ``tests/test_variants.py``.
"""
