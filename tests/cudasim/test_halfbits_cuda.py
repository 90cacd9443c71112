"""Device-side float16/bfloat16 bit conversions against NumPy and ml_dtypes (the references).

Decoding is checked on all 65536 bit patterns of each type; encoding (round to nearest-even) on
random float32 bit patterns plus the boundary cases named in ``f32_to_f16``'s docstring. In the
simulator the device functions are called directly; on a GPU through a one-thread-per-element
kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from rmsref._shapes import bfloat16

EDGES = np.array(
    [
        0x00000000, 0x00000001, 0x007FFFFF, 0x00800000,  # zero, f32 subnormals, smallest normal
        0x33000000, 0x33000001, 0x337FFFFF, 0x33800000,  # around half the smallest f16 subnormal
        0x33C00000, 0x34200000, 0x387FC000, 0x387FE000,  # subnormal ties (to even up and down)
        0x387FFFFF, 0x38800000, 0x38801000, 0x38803000,  # the f16 normal boundary, normal ties
        0x3F800000, 0x3F808000, 0x3F818000, 0x3F801000,  # 1.0 and bf16 / f16 ties around it
        0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FFFFF,  # the largest half and the inf threshold
        0x7F7FFFFF, 0x7F7F8000, 0x7F800000, 0x7FC00000,  # f32 max, bf16 overflow tie, inf, NaN
        0x7F800001, 0x7FFFFFFF,                          # signalling and all-ones NaN
    ],
    dtype=np.uint32,
)


@pytest.fixture(scope="module")
def hb(kcuda):
    from rmsref.kernels import _halfbits_cuda

    return _halfbits_cuda


def _apply(hb, fn_name: str, values: np.ndarray, out_dtype) -> np.ndarray:
    """fn(values[i]) for every i: directly in the simulator, by a kernel on a GPU."""
    fn = getattr(hb, fn_name)
    if hb.SIMULATOR:
        # the simulator's device-function wrapper swaps module globals on every call; these
        # functions use no ``cuda.*``, so call the wrapped Python function itself
        py = getattr(fn, "__wrapped__", fn)
        return np.array([py(v) for v in values], dtype=out_dtype)
    from numba import cuda

    @cuda.jit
    def apply(inp, out):
        i = cuda.grid(1)
        if i < inp.shape[0]:
            out[i] = fn(inp[i])

    d_out = cuda.device_array(values.shape, out_dtype)
    apply[(values.size + 255) // 256, 256](cuda.to_device(values), d_out)
    return d_out.copy_to_host()


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal bit patterns, or both NaN (payloads may differ between libraries)."""
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name,dtype", [("f16", np.float16), ("bf16", bfloat16)])
def test_decode_every_bit_pattern(hb, name, dtype):
    bits = np.arange(65536, dtype=np.uint16)
    got = _apply(hb, f"{name}_to_f32", bits, np.float32)
    want = bits.view(dtype).astype(np.float32)
    bad = np.flatnonzero(~_same(got, want))
    assert bad.size == 0, (
        f"{name} bits {bits[bad[:5]]} decode to {got[bad[:5]]}, want {want[bad[:5]]}"
    )


@pytest.mark.parametrize("name,dtype", [("f16", np.float16), ("bf16", bfloat16)])
def test_encode_rounds_to_nearest_even(hb, name, dtype):
    rng = np.random.default_rng(7)
    rand = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    near = rng.integers(0x33000000 - 8, 0x47800000 + 8, 4000).astype(np.uint32)  # f16 range
    bits = np.concatenate([EDGES, rand, near])
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])  # and the negatives
    f = bits.view(np.float32)
    got = _apply(hb, f"f32_to_{name}", f, np.uint16).view(dtype).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(dtype).astype(np.float32)
    bad = np.flatnonzero(~_same(got, want))
    assert bad.size == 0, (
        f"{name}: float32 bits {[hex(b) for b in bits[bad[:5]]]} encode to {got[bad[:5]]}, "
        f"want {want[bad[:5]]}"
    )
