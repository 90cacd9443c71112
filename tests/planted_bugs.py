"""RMSNorm implementations with the bugs real code has, written the way real code goes wrong.

Each is a torch function ``f(x, normalized_shape, weight, eps)`` (the signature of
``F.rms_norm``) or a NumPy one, sometimes with a hand-written backward (a
``torch.autograd.Function``), and the diagnosis code validation must name for it. They are not
mutations of the diagnosis engine's hypotheses: each bug is a line a person writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rmsref._shapes import bfloat16


@dataclass(frozen=True)
class Planted:
    name: str
    code: str                         # the diagnosis validation must give first
    build: Callable[[], tuple]        # () -> (forward, backward) NumPy callables
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    convention: str = "torch"
    probes: tuple[str, ...] | str = "all"
    also: tuple[str, ...] = field(default=())     # further codes that must be reported


def _torch():
    import torch
    return torch


# ---- torch forwards --------------------------------------------------------------------------


def _dims(shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return tuple(range(-len(shape), 0))


def _std_eps(x, eps):
    torch = _torch()
    return torch.finfo(torch.float32 if x.dtype != torch.float64 else x.dtype).eps \
        if eps is None else eps


def hf_default_eps(x, shape, weight=None, eps=None):
    """A module default carried into a functional API: eps=None means 1e-6, not finfo.eps."""
    torch = _torch()
    eps = 1e-6 if eps is None else eps
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True) + eps)
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def eps_ignored(x, shape, weight=None, eps=None):
    """The eps argument is accepted and then ignored: a hard-coded 1e-5."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True) + 1e-5)
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def eps_outside(x, shape, weight=None, eps=None):
    """The RMSNorm paper's code: x / (rms + eps)."""
    h = x.float()
    h = h / (h.pow(2).mean(_dims(shape), keepdim=True).sqrt() + _std_eps(x, eps))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def variance_norm(x, shape, weight=None, eps=None):
    """Normalises by the variance (x.var), as if RMS were the standard deviation."""
    torch = _torch()
    h = x.float()
    var = h.var(dim=_dims(shape), keepdim=True, unbiased=False)
    h = h * torch.rsqrt(var + _std_eps(x, eps))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def sum_of_squares(x, shape, weight=None, eps=None):
    """The square norm instead of the mean square: x / sqrt(Σx² + eps)."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).sum(_dims(shape), keepdim=True) + _std_eps(x, eps))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def n_minus_1(x, shape, weight=None, eps=None):
    """Σx²/(N − 1): the sample-variance habit."""
    torch = _torch()
    h = x.float()
    n = int(np.prod([x.shape[d] for d in _dims(shape)]))
    ms = h.pow(2).sum(_dims(shape), keepdim=True) / (n - 1)
    h = h * torch.rsqrt(ms + _std_eps(x, eps))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def last_dim_only(x, shape, weight=None, eps=None):
    """normalized_shape is accepted but the statistic is always over the last dim."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + _std_eps(x, eps))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def no_upcast(x, shape, weight=None, eps=None):
    """Mixed precision without the float32 upcast: the whole computation in bf16/fp16."""
    torch = _torch()
    var = x.pow(2).mean(_dims(shape), keepdim=True)
    h = x * torch.rsqrt(var + _std_eps(x, eps))
    return h * weight if weight is not None else h


def truncating_cast(x, shape, weight=None, eps=None):
    """float32 -> bfloat16 by dropping the low 16 bits (a hand-written pack), not by rounding."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True) + _std_eps(x, eps))
    y = h * weight.float() if weight is not None else h
    if x.dtype != torch.bfloat16:
        return y.to(x.dtype)
    return (y.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def llama_order(x, shape, weight=None, eps=None):
    """HF Llama's forward, validated as F.rms_norm: x̂ is rounded before the weight."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True) + _std_eps(x, eps))
    return weight * h.to(x.dtype) if weight is not None else h.to(x.dtype)


def one_plus_w(x, shape, weight=None, eps=None):
    """Gemma's (1 + w) scale in code that claims plain RMSNorm."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True) + _std_eps(x, eps))
    return (h * (1.0 + weight.float()) if weight is not None else h).to(x.dtype)


def always_float32(x, shape, weight=None, eps=None):
    """Upcast to float32 'for stability', also when the input is float64."""
    torch = _torch()
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True)
                        + (torch.finfo(x.dtype).eps if eps is None else eps))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


def wobbly(x, shape, weight=None, eps=None):
    """Something no known mistake explains: a data-dependent 1 % wobble."""
    torch = _torch()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(_dims(shape), keepdim=True) + _std_eps(x, eps))
    h = h * (1.0 + 0.01 * torch.sin(37.0 * h))
    return (h * weight.float() if weight is not None else h).to(x.dtype)


# ---- torch custom backwards (autograd.Function with a hand-written backward) ----------------


def custom_backward(bug: str, eps_default: float | None = None):
    """F.rms_norm's forward with a hand-written backward that has ``bug``."""
    torch = _torch()

    class RMSNormFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            h = x.float()
            rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)   # saved: O(rows)
            ctx.save_for_backward(x, weight, rstd)
            y = h * rstd
            return (y * weight.float() if weight is not None else y).to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, weight, rstd = ctx.saved_tensors
            h, g = x.float(), dy.float()
            n = x.shape[-1]
            w = weight.float() if weight is not None else torch.ones(n)
            xhat = h * rstd
            dxhat = g * w
            c = (dxhat * xhat).mean(-1, keepdim=True)
            if bug == "no_projection":
                dx = rstd * dxhat
            elif bug == "sum_c":
                dx = rstd * (dxhat - xhat * (dxhat * xhat).sum(-1, keepdim=True))
            elif bug == "half_terms":            # terms stored in the input dtype, then subtracted
                t1 = (rstd * dxhat).to(x.dtype)
                t2 = (rstd * xhat * c).to(x.dtype)
                dx = t1 - t2
            else:
                dx = rstd * (dxhat - xhat * c)
            rows = (g * xhat).reshape(-1, n)
            if bug == "dw_from_x":
                dw = (g * h).reshape(-1, n).sum(0)
            elif bug == "dw_from_y":             # dy·y (y = x̂·w) in place of dy·x̂
                dw = (g * xhat * w).reshape(-1, n).sum(0)
            elif bug == "dw_last_block" and rows.shape[0] % 4 == 0:
                dw = rows.reshape(-1, 4, n).sum(1)[-1]      # forgot to add the block partials
            else:
                dw = rows.sum(0)
            dw = None if weight is None else dw.to(weight.dtype)
            return dx.to(x.dtype), dw, None

    def f(x, shape, weight=None, eps=None):
        if eps is None:
            eps = eps_default if eps_default is not None else _std_eps(x, None)
        if isinstance(shape, (tuple, list)) and len(shape) > 1:
            flat = RMSNormFn.apply(x.reshape(*x.shape[: x.ndim - len(shape)], -1),
                                   None if weight is None else weight.reshape(-1), eps)
            return flat.reshape(x.shape)
        return RMSNormFn.apply(x, weight, eps)

    return f


def _torch_pair(fn):
    from rmsref.adapters.torch import wrap
    return lambda: wrap(fn, name=getattr(fn, "__name__", "f"))


# ---- NumPy implementations ------------------------------------------------------------------


def numpy_rms_norm(bug: str | None = None):
    """A float32 NumPy forward (the way a kernel author prototypes), with ``bug``."""

    def fwd(x, shape, weight=None, eps=None):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape))
        x2 = np.asarray(x).reshape(-1, n)
        if eps is None:
            # the common slip: finfo of the *input* dtype (2^-7 for bfloat16)
            eps = float(np.finfo(x.dtype).eps) if bug == "finfo_input" else 2.0**-23
        if bug == "bf16_acc":                       # acc += x*x in the input dtype
            ms = np.zeros((x2.shape[0], 1), x.dtype)
            for j in range(n):
                ms += x2[:, j:j + 1] * x2[:, j:j + 1]
            ms = ms.astype(np.float32) / np.float32(n)
        else:
            xf = x2.astype(np.float32)
            ms = np.mean(xf * xf, axis=1, keepdims=True, dtype=np.float32)
        rstd = np.float32(1) / np.sqrt(ms + np.float32(eps))
        y = x2.astype(np.float32) * rstd
        if weight is not None:
            y = y * np.asarray(weight).reshape(n).astype(np.float32)
        if bug == "truncate" and x.dtype == bfloat16:   # >> 16 packing
            y = (np.ascontiguousarray(y).view(np.uint32) & np.uint32(0xFFFF0000)).view(
                np.float32)
        return y.astype(x.dtype).reshape(np.shape(x))

    fwd.__name__ = f"numpy_{bug}"
    return lambda: (fwd, None)


# ---- the suite -------------------------------------------------------------------------------

_FWD = ("gaussian", "offset", "tiny", "zero_rows", "n1", "tails", "eps_default",
        "eps_explicit", "multidim", "no_weight")
_BWD = ("gaussian", "cancel", "square", "tails", "no_weight")
_HALF = ("bfloat16", "float16")

PLANTED: list[Planted] = [
    Planted("torch_hf_default_eps", "eps_value", _torch_pair(hf_default_eps), probes=_FWD),
    Planted("torch_eps_ignored", "eps_value", _torch_pair(eps_ignored), probes=_FWD),
    Planted("numpy_finfo_input_eps", "eps_value", numpy_rms_norm("finfo_input"), probes=_FWD),
    Planted("torch_eps_outside", "eps_outside_sqrt", _torch_pair(eps_outside), probes=_FWD),
    Planted("torch_variance", "centred_statistic", _torch_pair(variance_norm), probes=_FWD),
    Planted("torch_sum_of_squares", "sum_not_mean", _torch_pair(sum_of_squares), probes=_FWD),
    Planted("torch_n_minus_1", "n_minus_1", _torch_pair(n_minus_1), probes=_FWD),
    Planted("torch_last_dim_only", "wrong_axis", _torch_pair(last_dim_only), probes=_FWD),
    Planted("torch_no_upcast", "low_precision_accumulation", _torch_pair(no_upcast),
            dtypes=_HALF, probes=_FWD),
    Planted("numpy_bf16_accumulator", "low_precision_accumulation", numpy_rms_norm("bf16_acc"),
            dtypes=("bfloat16",), probes=("gaussian", "offset", "tails")),
    Planted("torch_truncating_cast", "truncation", _torch_pair(truncating_cast),
            dtypes=("bfloat16",), probes=_FWD),
    Planted("numpy_truncating_pack", "truncation", numpy_rms_norm("truncate"),
            dtypes=("bfloat16",), probes=_FWD),
    Planted("torch_llama_order", "double_rounding", _torch_pair(llama_order), dtypes=_HALF,
            probes=_FWD),
    Planted("torch_one_plus_w", "offset_weight", _torch_pair(one_plus_w), probes=_FWD),
    Planted("torch_always_float32", "float64_as_float32", _torch_pair(always_float32),
            dtypes=("float32", "float64"), probes=_FWD),
    Planted("torch_bwd_no_projection", "missing_projection",
            _torch_pair(custom_backward("no_projection")), probes=_BWD),
    Planted("torch_bwd_sum_c", "projection_scale", _torch_pair(custom_backward("sum_c")),
            probes=_BWD),
    Planted("torch_bwd_half_terms", "separately_rounded_terms",
            _torch_pair(custom_backward("half_terms")), dtypes=_HALF, probes=_BWD),
    Planted("torch_bwd_dw_last_block", "dweight_reduction",
            _torch_pair(custom_backward("dw_last_block")), probes=_BWD),
    Planted("torch_bwd_dw_from_x", "dweight_from_x", _torch_pair(custom_backward("dw_from_x")),
            probes=_BWD),
    Planted("torch_bwd_dw_from_y", "dweight_times_weight",
            _torch_pair(custom_backward("dw_from_y")), probes=_BWD),
    Planted("torch_wobble", "no_known_cause", _torch_pair(wobbly), probes=("gaussian", "tails")),
    # two bugs at once: a module default eps and a backward without the projection
    Planted("torch_default_eps_and_no_projection", "eps_value",
            _torch_pair(custom_backward("no_projection", eps_default=1e-6)),
            probes=("gaussian", "eps_default", "tiny", "cancel"), also=("missing_projection",)),
]
