"""What real systems compute: emulations of their order of operations and roundings.

The conventions are described in docs/semantics.md.

Every RMSNorm computes y = x·rstd·w with rstd = 1/sqrt(mean(x²) + eps), and yet two correct
libraries disagree in the last bits of bfloat16 output on a quarter of the elements, because they
round at different places. Each convention below replays one system's steps in NumPy float32 /
float16 / bfloat16 (ml_dtypes), rounding exactly where that system rounds. Notation:

    R_t(v)  round v to dtype t (nearest, ties to even);   f32(v)  exact upcast to float32
    x̂ = x·rstd;   opmath = float32 for float16/bfloat16/float32 inputs, float64 for float64

The statistic. ``rstd`` is computed here as the correctly rounded opmath value
R(1/sqrt(R(R(mean(x²)) + eps))); a real system sums in its own order and its rstd may differ in the
last bit or two. Pass the system's own saved rstd (``emulate(..., rstd=saved)``) and the elementwise
epilogue, where the conventions differ, is reproduced bit for bit (tests/test_conventions.py checks
this against torch 2.13 for ``torch``, ``llama``, ``gemma``, ``t5``).

Facts checked on torch 2.13 CPU (by running it; see tests/test_conventions.py):
  * ``F.rms_norm`` rounds once: y = R_in((f32(x)·rstd)·f32(w)), in that order (x·(rstd·w) differs
    in fp32 on ~35 % of elements); the fused kernel (no autograd) and the autograd composite give
    identical bits, rstd included.
  * its output dtype is the input's, whatever the weight's dtype (weight is cast to opmath).
  * eps=None means finfo(opmath).eps: 2^-23 for float16/bfloat16/float32, 2^-52 for float64.
Fused residual add (:func:`emulate_add`): "rounded-sum" normalises R_in(x + residual), "fp32-sum"
the float32 sum (docs/semantics.md); both store R_res(x + residual) as the new residual.

History (from PyTorch's sources, not re-run here): the 2.4 composite rounded x̂ to the input dtype
before multiplying by the weight (the ``llama`` order); eps=None meant finfo(input dtype).eps
(2^-7 for bfloat16) until PyTorch PR #142848 (January 2025) switched to the opmath eps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rmsref import tolerance as tol
from rmsref._declared import declared_by
from rmsref._shapes import (
    as_array,
    bfloat16,
    check_input,
    check_param,
    normalize_shape,
    opmath_dtype,
    rows_view,
    to_numpy,
)

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def promote(a, b) -> np.dtype:
    """torch/JAX type promotion for floating dtypes: float16 with bfloat16 gives float32."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    if {a, b} == {_F16, bfloat16}:
        return _F32
    return a if a.itemsize > b.itemsize else b


def _statistic(xf: np.ndarray, eps: float, *, rsqrt: bool = True) -> np.ndarray:
    """Correctly rounded opmath rstd per row of ``xf`` (M, N), shape (M, 1).

    ms = R(mean(x²)) (x² is exact in float64 for float32 x; the float64 sum is then correctly
    rounded to float32 except in pathological cases), s = R(ms + eps), rstd = R(1/sqrt(s)) with
    ``rsqrt``, else R(1 / R(sqrt(s))) (two roundings, as in code that writes 1/sqrt).
    """
    op = xf.dtype
    x64 = xf.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ms = np.mean(x64 * x64, axis=1, keepdims=True).astype(op)   # (M, 1)  eq. (1)
        s = (ms + op.type(eps)).astype(op)                            # (M, 1)  ms + eps in opmath
        if rsqrt:
            return (1.0 / np.sqrt(s.astype(np.float64))).astype(op)   # (M, 1)  eq. (2) one rounding
        return (op.type(1.0) / np.sqrt(s)).astype(op)                 # sqrt rounded, then 1/·


def _given_rstd(rstd: Any, m: int, op: np.dtype) -> np.ndarray:
    r = np.asarray(rstd)
    if r.size != m:
        raise ValueError(f"rstd has {r.size} values (shape {tuple(r.shape)}); expected one per row "
                         f"({m} rows)")
    return r.reshape(m, 1).astype(op)


# Each rule gets x as rows (M, N) in the input dtype, w (N,) or None, eps (float), rstd (M, 1)
# in opmath or None, offset (float), and returns y (M, N) in the convention's output dtype.

def _torch(x, w, eps, rstd, offset, rsqrt=True):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)                                              # (M, N) upcast, exact
    r = _statistic(xf, eps, rsqrt=rsqrt) if rstd is None else rstd
    h = xf * r                                                     # (M, N) x̂ in opmath
    if w is not None:
        h = h * (w.astype(op) + op.type(offset)) if offset else h * w.astype(op)
    return h.astype(x.dtype)                                       # one rounding


def _fused_div(x, w, eps, rstd, offset):
    return _torch(x, w, eps, rstd, offset, rsqrt=False)


def _llama(x, w, eps, rstd, offset):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)
    r = _statistic(xf, eps) if rstd is None else rstd
    h = (xf * r).astype(x.dtype)                                   # first rounding: R_in(x̂)
    if w is None:
        return h
    if offset:
        w = (w.astype(opmath_dtype(w.dtype)) + offset).astype(w.dtype)   # offset in w's dtype
    out = promote(w.dtype, x.dtype)
    opo = opmath_dtype(out)
    return (w.astype(opo) * h.astype(opo)).astype(out)            # second rounding: R(w·h)


def _gemma(x, w, eps, rstd, offset):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)
    r = _statistic(xf, eps) if rstd is None else rstd
    scale = op.type(offset) + (np.ones(x.shape[1], op) if w is None else w.astype(op))
    return ((xf * r) * scale).astype(x.dtype)                     # (1 + w) in fp32, one rounding


def _gemma_wdtype(x, w, eps, rstd, offset):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)
    r = _statistic(xf, eps) if rstd is None else rstd
    if w is None:
        w = np.ones(x.shape[1], x.dtype)                             # a missing weight is w = 1
    scale = (w.astype(opmath_dtype(w.dtype)) + offset).astype(w.dtype)   # R_w(1 + w)
    return ((xf * r) * scale.astype(op)).astype(x.dtype)


def _t5(x, w, eps, rstd, offset):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)
    r = _statistic(xf, eps) if rstd is None else rstd
    h = xf * r                                                     # x̂ in fp32
    if w is None:
        return h.astype(x.dtype)
    if offset:
        w = (w.astype(opmath_dtype(w.dtype)) + offset).astype(w.dtype)
    if w.dtype in (_F16, bfloat16):
        h = h.astype(w.dtype)                                      # R_w(x̂): to the weight dtype
    out = promote(w.dtype, h.dtype)
    opo = opmath_dtype(out)
    return (w.astype(opo) * h.astype(opo)).astype(out)


def _native(x, w, eps, rstd, offset):
    t = x.dtype
    op = opmath_dtype(t)
    xf = x.astype(op)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if rstd is None:
            sq = (xf * xf).astype(t).astype(op)                    # R_t(x²)
            ms = (np.sum(sq, axis=1, keepdims=True, dtype=op) / op.type(x.shape[1])).astype(t)
            s = (ms.astype(op) + op.type(eps)).astype(t)           # R_t(ms + eps)
            r = (1.0 / np.sqrt(s.astype(np.float64))).astype(t)    # R_t(rsqrt)
        else:
            r = rstd.astype(t)
        h = (xf * r.astype(op)).astype(t)                          # R_t(x·rstd)
        if w is None:
            return h
        if offset:
            w = (w.astype(op) + offset).astype(t)
        out = promote(t, w.dtype)
        opo = opmath_dtype(out)
        return (h.astype(opo) * w.astype(opo)).astype(out)        # R_t(h·w)


def _flax(x, w, eps, rstd, offset):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)
    r = _statistic(xf, eps) if rstd is None else rstd
    if w is None:
        return (xf * r).astype(x.dtype)
    wdt = w.dtype
    opw = promote(op, opmath_dtype(wdt))
    ws = w.astype(opw) + opw.type(offset) if offset else w.astype(opw)
    mul = r.astype(opw) * ws                                       # (M, N) rstd·scale, rounded
    y = xf.astype(opw) * mul                                       # x·(rstd·scale)
    return y.astype(promote(x.dtype, wdt))                         # result_type(x, scale)


def _paper(x, w, eps, rstd, offset, partial=None):
    op = opmath_dtype(x.dtype)
    xf = x.astype(op)
    n = x.shape[1]
    k = n if partial is None else max(int(np.floor(n * partial)), 1)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if rstd is None:
            x64 = xf[:, :k].astype(np.float64)
            ms = np.mean(x64 * x64, axis=1, keepdims=True).astype(op)
            rms = np.sqrt(ms)                                      # R(sqrt(ms))
            d = (rms + op.type(eps)).astype(op)                    # R(rms + eps): eps OUTSIDE
            h = xf / d                                             # R(x / d)
        else:
            h = xf * rstd                                          # rstd = 1/(rms + eps) given
    if w is not None:
        h = h * (w.astype(op) + op.type(offset)) if offset else h * w.astype(op)
    return h.astype(x.dtype)


@dataclass(frozen=True)
class Convention:
    """One system's RMSNorm: who uses it, its formula, eps default, output dtype, its rule, and
    its error model.

    The error model is what :mod:`rmsref.tolerance` needs to bound a correct implementation of
    the convention: ``k_out``, the roundings to the output dtype (1: one rounding at the end; 2:
    x̂ rounded before the weight; 3: every step in the input dtype), and ``accumulation``, the
    dtype the sums run in ("opmath": float32 for half inputs; "input": the input's own dtype).
    ``order_rival`` is the convention whose rounding order a half-precision output is told
    apart from (the ``order`` check of :func:`rmsref.validate`), None when there is none.
    """

    name: str
    who: str
    formula: str
    eps_default: str
    out_dtype: str
    notes: str
    rule: Callable[..., np.ndarray]
    default_eps: Callable[[np.dtype], float]
    default_offset: float = 0.0
    k_out: int = 1
    accumulation: Literal["opmath", "input"] = "opmath"
    order_rival: str | None = None

    def error_model(self, dtype, n: int, rows: int = 1, form: tol.Form = "probabilistic"
                    ) -> tol.ErrorModel:
        """The tolerance model of a correct implementation of this convention."""
        dt = np.dtype(dtype)
        acc = tol.accumulation_dtype(dt) if self.accumulation == "opmath" else dt
        return tol.ErrorModel(dt, int(n), max(int(rows), 1), acc, self.k_out, form=form)


def _opmath_eps(dt: np.dtype) -> float:
    return float(np.finfo(opmath_dtype(dt)).eps)


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        Convention(
            "torch", "torch.nn.functional.rms_norm, torch.nn.RMSNorm (current; checked on 2.13)",
            "y = R_in((f32(x)·rstd)·f32(w))",
            "finfo(opmath).eps: 2^-23 for fp16/bf16/fp32, 2^-52 for fp64",
            "input dtype, whatever the weight dtype",
            "PyTorch 2.4's composite rounded x̂ before the weight (llama order); eps=None used "
            "finfo(input dtype).eps until PR #142848 (Jan 2025).",
            _torch, _opmath_eps, order_rival="llama"),
        Convention(
            "llama", "HF Llama/Mistral/Qwen/DeepSeek, Apex FusedRMSNorm, Liger 'llama'",
            "y = w · R_in(f32(x)·rstd)   (two roundings when w is half)",
            "1e-6 (HF config rms_norm_eps)", "torch promotion of (weight, input)",
            "The product w·h is rounded to the promoted dtype: a second rounding.",
            _llama, lambda dt: 1e-6, k_out=2, order_rival="torch"),
        Convention(
            "gemma", "HF Gemma 1-3, Qwen3-Next, Liger 'gemma'",
            "y = R_in((f32(x)·rstd)·(1 + f32(w)))", "1e-6", "input dtype",
            "Weights are stored as w = scale − 1; the 1 is added in fp32.",
            _gemma, lambda dt: 1e-6, 1.0, order_rival="gemma_wdtype"),
        Convention(
            "gemma_wdtype", "vLLM bf16 kernels, Transformer Engine zero-centred-gamma option",
            "y = R_in(f32(x)·rstd·f32(R_w(1 + w)))", "1e-6", "input dtype",
            "1 + w is rounded to the weight dtype first (loses w's low bits in bf16).",
            _gemma_wdtype, lambda dt: 1e-6, 1.0, k_out=2, order_rival="gemma"),
        Convention(
            "t5", "HF T5 family, Apex manual_rms_norm",
            "h = f32(x)·rstd; if w is half: h = R_w(h); y = w·h", "1e-6",
            "weight dtype when half, else float32",
            "Casts to the *weight's* dtype, not the input's.",
            _t5, lambda dt: 1e-6, k_out=2),
        Convention(
            "native", "Haiku RMSNorm, Liger casting mode 'none'",
            "everything rounded to the input dtype t: ms = R_t(Σ R_t(x²)/N), "
            "rstd = R_t(rsqrt(R_t(ms+eps))), y = R_t(R_t(x·rstd)·w)",
            "1e-5 (Haiku)", "input dtype",
            "Our choice for the sum: squares rounded to t, summed in fp32 (XLA and Triton reduce "
            "half types in fp32).",
            _native, lambda dt: 1e-5, k_out=3, accumulation="input"),
        Convention(
            "flax", "Flax linen/nnx RMSNorm",
            "y = R_out(f32(x)·R(rstd·scale)),  out = result_type(x, scale)", "1e-6",
            "result_type(x, scale): float32 for bf16 x with the default fp32 scale",
            "rstd·scale is formed (and rounded) before multiplying x.",
            _flax, lambda dt: 1e-6),
        Convention(
            "fused_fp32", "Transformer Engine, flash-attn, quack (rsqrt)",
            "y = R_out(f32(x)·rsqrt(ms + eps)·f32(w))", "1e-5 (TE) / model config",
            "input dtype", "One rounding; same epilogue as torch.",
            _torch, lambda dt: 1e-5, order_rival="llama"),
        Convention(
            "fused_fp32_div", "flash-attn and llm.c CPU reference paths (1/sqrt)",
            "y = R_out(f32(x)·R(1/R(sqrt(ms + eps)))·f32(w))", "1e-5", "input dtype",
            "rstd gets two roundings (sqrt, then the division).",
            _fused_div, lambda dt: 1e-5),
        Convention(
            "paper", "original RMSNorm code (Zhang & Sennrich 2019, PyTorch)",
            "y = R_in(R(f32(x)/R(rms + eps))·f32(w)),  rms = sqrt(mean(x²)) (over the first "
            "floor(pN) features with partial p)", "1e-8", "input dtype",
            "eps is OUTSIDE the square root.",
            _paper, lambda dt: 1e-8),
    )
}


def names() -> list[str]:
    """The convention names, in the order they are listed."""
    return list(CONVENTIONS)


def get(name: str) -> Convention:
    """The :class:`Convention` called ``name`` (ValueError listing the known ones otherwise)."""
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise ValueError(f"unknown convention {name!r}; known: {', '.join(CONVENTIONS)}") from None


def emulate(
    name: str,
    x: Any,
    weight: Any = None,
    eps: float | None = None,
    *,
    rstd: Any = None,
    offset: float | None = None,
    normalized_shape: Any = None,
    partial: float | None = None,
) -> np.ndarray:
    """What convention ``name`` computes for ``x`` and ``weight``, bit for bit.

    Parameters
    ----------
    name : str
        A key of :data:`CONVENTIONS` (``rmsref conventions`` lists them with their formulas).
    x : array, shape ``(..., *normalized_shape)``
        Input in the dtype the system sees (float16, bfloat16, float32 or float64).
    weight : array or None
        Per-feature weight, in its own dtype (the dtype matters: see ``llama``, ``t5``).
    eps : float or None
        None means the convention's own default (see ``Convention.eps_default``).
    rstd : array or None
        The system's own saved statistic, one value per row. When given, the elementwise epilogue
        is reproduced bit for bit even though the system sums in a different order.
    offset : float or None
        Added to the weight (``offset + w``) where the convention adds it; None means the
        convention's default (1 for ``gemma`` and ``gemma_wdtype``, else 0). (A departure from the
        oracle signature's ``offset=0.0``: with it, ``emulate("gemma", ...)`` would drop the 1.)
    normalized_shape : int or tuple, optional
        Defaults to ``weight.shape`` when a weight is given, else the last dimension.
    partial : float, optional
        pRMSNorm's p, for ``paper`` only.

    Returns
    -------
    numpy.ndarray
        y with the shape of x, in the convention's output dtype.
    """
    conv = get(name)
    x = as_array(x, "x")
    if normalized_shape is None:
        normalized_shape = np.shape(weight) if weight is not None else (x.shape[-1],)
    shape = normalize_shape(normalized_shape)
    check_input(x, shape, "x")
    w = check_param(weight, "weight", shape)
    n = int(np.prod(shape))
    x2 = rows_view(x, shape)                                       # (M, N)
    w1 = None if w is None else w.reshape(n)
    off = conv.default_offset if offset is None else float(offset)
    if w1 is None and off:
        w1 = np.ones(n, x.dtype)      # as the oracle: a missing weight is w = 1, used as offset + 1
    op = opmath_dtype(x.dtype)
    r = None if rstd is None else _given_rstd(rstd, x2.shape[0], op)
    e = conv.default_eps(x.dtype) if eps is None else float(eps)
    if partial is not None and name != "paper":
        raise ValueError(f"partial is only defined for the 'paper' convention, not {name!r}")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # NaN/Inf rows propagate
        y = _paper(x2, w1, e, r, off, partial) if name == "paper" else conv.rule(x2, w1, e, r, off)
    return y.reshape(x.shape)


#: Conventions that round y once; only these have an "fp32-sum" fused-add form.
_SINGLE_ROUNDING = ("torch", "gemma", "fused_fp32", "fused_fp32_div")
ROUNDINGS = ("rounded-sum", "fp32-sum")


def emulate_add(
    name: str,
    x: Any,
    residual: Any,
    weight: Any = None,
    eps: float | None = None,
    *,
    rounding: str = "rounded-sum",
    rstd: Any = None,
    offset: float | None = None,
    normalized_shape: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fused residual add + RMSNorm as convention ``name`` runs it: ``(y, new_residual)``.

    h = f32(x) + f32(residual), rounded to float32 (the sum is formed in opmath). Then

    - ``"rounded-sum"`` (HF eager ``residual + hidden_states``, Liger fused-add, llm.c): h is
      rounded to x's dtype and normalised by convention ``name``;
    - ``"fp32-sum"`` (flash-attn, quack, vLLM native): the float32 h is normalised and y rounded
      once to x's dtype (single-rounding conventions only).

    ``new_residual`` is h rounded to the residual's dtype in both. For float32 x the two agree.
    ``rstd``, when given, is the system's statistic of the h it normalised.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    x = as_array(x, "x")
    r = as_array(residual, "residual")
    if r.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(r.shape)} but x has shape {tuple(x.shape)}")
    op = promote(opmath_dtype(x.dtype), opmath_dtype(r.dtype))
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(op) + r.astype(op)                  # the sum, rounded once in opmath
    new_residual = h.astype(r.dtype)
    if rounding == "rounded-sum":
        y = emulate(name, h.astype(x.dtype), weight, eps, rstd=rstd, offset=offset,
                    normalized_shape=normalized_shape)
        return y, new_residual
    if name not in _SINGLE_ROUNDING:
        raise ValueError(f"'fp32-sum' is defined for the single-rounding conventions "
                         f"{_SINGLE_ROUNDING}, not {name!r}")
    if eps is None:
        eps = get(name).default_eps(x.dtype)            # the input's default, not float32's
    y = emulate(name, h, weight, eps, rstd=rstd, offset=offset, normalized_shape=normalized_shape)
    return y.astype(x.dtype), new_residual               # y was formed in opmath: one rounding


@dataclass(frozen=True)
class Match:
    """One line of :func:`identify`: a convention and how often it reproduced the output."""

    name: str
    rate: float            # fraction of elements bit-identical (NaN matching NaN)
    dtype_match: bool      # whether the output dtype is the convention's
    #: The rate per case, keyed "input dtype/w=weight dtype" ("bfloat16/w=float32"): behaviour
    #: that depends on the weight's dtype shows here and is hidden by the pooled rate.
    rates: dict[str, float] = field(default_factory=dict, compare=False, hash=False)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64 = np.asarray(a).astype(np.float64)
    b64 = np.asarray(b).astype(np.float64)
    return (a64 == b64) | (np.isnan(a64) & np.isnan(b64))


def identify(
    forward: Callable[..., Any],
    *,
    dtypes: Sequence[str] = ("bfloat16", "float16"),
    shape: tuple[int, int] = (64, 768),
    eps: float = 1e-5,
    weight_dtypes: Sequence[str | None] = (None, "float32"),
    offset: float = 0.0,
    seed: int = 0,
    candidates: Sequence[str] | None = None,
    share_statistic: bool = True,
) -> list[Match]:
    """Rank conventions by how often they reproduce ``forward``'s output bit for bit.

    ``forward(x, normalized_shape, weight, eps) -> y`` (the signature of :func:`rmsref.rms_norm`)
    runs on Gaussian rows with a random weight for each input dtype and each weight dtype (None:
    the input's; a float32 weight separates ``llama`` from ``t5``, which agree when the weight has
    the input's dtype); every convention is emulated on the same inputs with the same explicit
    ``eps``. A dtype the implementation refuses (raises) is skipped. Half dtypes separate the
    conventions; in float32 most coincide (those forming rstd·w first, ``flax``, still stand
    apart). An implementation that refuses every requested dtype is ranked on float32 inputs.
    With ``share_statistic`` the implementation's own rstd is read back from a float32 run
    (:func:`estimate_rstd`, with the neutral weight of a module that declares 1 + w) and shared
    by the conventions that compute it the standard way, so the epilogues are compared bit for
    bit; otherwise our correctly rounded rstd is used and even the right convention may miss the
    elements of rows where the implementation's rstd differs in its last bit.

    Returns
    -------
    list of Match
        Best first; ties keep the listing order of :data:`CONVENTIONS`. Each carries its rate
        per case (``Match.rates``).
    """
    rng = np.random.default_rng(seed)
    pool = list(candidates) if candidates is not None else [
        n for n in CONVENTIONS if n not in ("paper",)]
    m, n = shape
    hits = {name: {} for name in pool}                 # name -> case -> bit-identical elements
    sizes: dict[str, int] = {}                          # case -> elements
    dt_ok = dict.fromkeys(pool, True)
    errors: list[str] = []
    # The statistic of a module that declares a 1 + w weight is read back with w = 0; a module
    # without a weight runs without one.
    declared = declared_by(forward)
    neutral = offset or declared.offset or 0.0
    if not declared.has_weight:
        weight_dtypes = ("none",)
    for dname in dtypes:
        _identify_dtype(forward, dname, weight_dtypes, rng, m, n, eps, offset, neutral, pool,
                        share_statistic, hits, sizes, dt_ok, errors)
    if not sizes and "float32" not in dtypes:           # a float32-only implementation
        _identify_dtype(forward, "float32", weight_dtypes, rng, m, n, eps, offset, neutral, pool,
                        share_statistic, hits, sizes, dt_ok, errors)
    total = sum(sizes.values())
    if total == 0:
        raise ValueError("identify: the implementation ran on none of the inputs: "
                         + "; ".join(errors))
    ranking = [Match(name, sum(hits[name].values()) / total, dt_ok[name],
                     {case: hits[name][case] / size for case, size in sizes.items()})
               for name in pool]
    order = {name: i for i, name in enumerate(pool)}
    ranking.sort(key=lambda mt: (-mt.rate, not mt.dtype_match, order[mt.name]))
    return ranking


def _weight_dtype(wname: str | None, dt: np.dtype) -> np.dtype | None:
    """identify's weight dtype names: None is the input's dtype, "none" no weight at all."""
    if wname == "none":
        return None
    return dt if wname is None else np.dtype(bfloat16 if wname == "bfloat16" else wname)


def _identify_dtype(forward, dname, weight_dtypes, rng, m, n, eps, offset, neutral, pool,
                    share_statistic, hits, sizes, dt_ok, errors) -> None:
    """One input dtype of :func:`identify`: run each weight dtype, count bit-exact elements."""
    dt = np.dtype(bfloat16 if dname == "bfloat16" else dname)
    x = (rng.standard_normal((m, n)) * 2.0).astype(np.float32).astype(dt)
    rstd = estimate_rstd(forward, x, eps, offset=neutral) if share_statistic else None
    for wname in weight_dtypes:
        wdt = _weight_dtype(wname, dt)
        w = None if wdt is None else (1.0 + 0.3 * rng.standard_normal(n)).astype(
            np.float32).astype(wdt)
        case = f"{dname}/w={'none' if wdt is None else wdt.name}"
        if case in sizes:                                # float32 x: None and "float32" agree
            continue
        try:
            y = to_numpy(forward(x, n, w, eps))
        except Exception as exc:  # e.g. a kernel that wants weight and input dtypes equal
            errors.append(f"{dname} x with {wdt} weight: {exc}")
            continue
        sizes[case] = y.size
        for name in pool:
            r = rstd if name in _STANDARD_STATISTIC else None
            ye = emulate(name, x, w, eps, rstd=r, offset=offset if offset else None)
            hits[name][case] = int(np.count_nonzero(_bits_equal(y, ye)))
            dt_ok[name] &= ye.dtype == y.dtype


#: Conventions whose statistic is rsqrt(fp32 mean(x²) + eps): they can share an estimated rstd.
_STANDARD_STATISTIC = ("torch", "llama", "gemma", "gemma_wdtype", "t5", "flax", "fused_fp32")


def estimate_rstd(forward: Callable[..., Any], x: np.ndarray, eps: float | None,
                  offset: float = 0.0) -> np.ndarray | None:
    """The implementation's own float32 rstd per row, read back from a float32 run.

    ``forward(f32(x), N, w0, eps)`` with the neutral weight w0 (None, i.e. w = 1, for a plain
    weight; w = 1 − offset for a weight used as offset + w: zeros for Gemma's 1 + w) returns
    R_f32(x·rstd) for a standard implementation; for each row the float32 value of y/x that
    occurs most often is its rstd (each element pins rstd to within an ulp; the mode is exact in
    practice). Returns None when the forward refuses float32 input or the neutral weight. Using
    it lets :func:`identify` compare epilogues bit for bit instead of being blurred by last-bit
    differences of the sum.
    """
    x32 = np.asarray(x).astype(np.float32)
    n = x32.shape[-1]
    w0 = None if not offset else np.full(n, 1.0 - offset, np.float32)
    try:
        y32 = to_numpy(forward(x32, n, w0, eps)).astype(np.float64)
    except Exception:
        return None
    x64 = x32.astype(np.float64)
    out = np.empty((x32.shape[0], 1), np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (y32 / x64).astype(np.float32)
    for i in range(x32.shape[0]):
        v = q[i][np.isfinite(q[i]) & (x64[i] != 0)]
        if v.size == 0:
            return None
        vals, counts = np.unique(v, return_counts=True)
        out[i, 0] = vals[np.argmax(counts)]
    return out


def describe() -> str:
    """A plain-text table of the conventions with formulas (``rmsref conventions`` prints it)."""
    lines = ["R_t = round to dtype t, f32 = upcast, x̂ = x·rstd, rstd = 1/sqrt(mean(x²) + eps); "
             "mean(x²) in fp32 unless noted.", ""]
    for c in CONVENTIONS.values():
        lines.append(f"{c.name}")
        lines.append(f"    y      : {c.formula}")
        lines.append(f"    who    : {c.who}")
        lines.append(f"    eps    : {c.eps_default}")
        lines.append(f"    output : {c.out_dtype}")
        lines.append(f"    note   : {c.notes}")
    lines += ["", "fused residual add (emulate_add): h = f32(x) + f32(residual), new_residual = "
              "R_res(h), then", "    rounded-sum : y = convention(R_in(h))     (HF eager, Liger "
              "fused-add, llm.c)", "    fp32-sum    : y = R_in(convention_f32(h)) (flash-attn, "
              "quack, vLLM native; single-rounding conventions)"]
    return "\n".join(lines)
