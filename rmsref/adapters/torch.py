"""PyTorch as plain array callables: ``F.rms_norm``, any ``nn.Module``, autograd for the backward.

``validate`` and ``identify`` speak NumPy; this adapter converts at the edges. bfloat16 crosses as
its 16 bits (ml_dtypes ↔ torch.bfloat16 through an int16 view), so nothing is rounded on the way.
torch is imported when an adapter is built, never by ``import rmsref``.

    fwd, bwd = rmsref.adapters.torch.wrap(torch.nn.functional.rms_norm)
    fwd, bwd = rmsref.adapters.torch.wrap(torch.nn.RMSNorm)          # a class: built per call
    fwd, bwd = rmsref.adapters.torch.wrap(my_hf_llama_rms_norm)      # an instance: weight and
                                                                     # eps set per call
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from rmsref._shapes import bfloat16, normalize_shape


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError("the torch adapter needs PyTorch: pip install 'rmsref[torch]'") from exc
    return torch


def to_torch(a: np.ndarray | None):
    """NumPy (incl. ml_dtypes bfloat16) -> torch tensor with the same bits (a copy)."""
    torch = _torch()
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype == bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def to_numpy(t) -> np.ndarray | None:
    """torch tensor -> NumPy with the same bits (bfloat16 as ml_dtypes)."""
    torch = _torch()
    if t is None:
        return None
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(bfloat16).copy()
    return t.numpy().copy()


def _strided_like(a: np.ndarray, t):
    """Give ``t`` the strides of ``a`` (non-contiguous probes stay non-contiguous in torch)."""
    torch = _torch()
    if a.flags.c_contiguous or a.size == 0 or any(s < 0 for s in a.strides):
        return t
    base_len = sum((d - 1) * s // a.itemsize for d, s in zip(a.shape, a.strides, strict=True)) + 1
    buf = torch.zeros(base_len, dtype=t.dtype)
    view = torch.as_strided(buf, a.shape, tuple(s // a.itemsize for s in a.strides))
    view.copy_(t)
    return view


def _is_module_class(obj) -> bool:
    torch = _torch()
    return inspect.isclass(obj) and issubclass(obj, torch.nn.Module)


def _set_eps(module, eps: float | None) -> None:
    if eps is None:
        return
    for attr in ("eps", "variance_epsilon", "epsilon"):
        if hasattr(module, attr):
            setattr(module, attr, float(eps))
            return


def _build(cls, shape: tuple[int, ...], eps: float | None):
    arg: Any = shape[0] if len(shape) == 1 else shape
    kwargs = {} if eps is None else {"eps": float(eps)}
    try:
        return cls(arg, **kwargs)
    except TypeError:
        return cls(shape, **kwargs)


def wrap(obj: Any, *, name: str | None = None) -> tuple[Callable[..., np.ndarray], Callable]:
    """(forward, backward) array callables for a torch function, module class or module.

    Parameters
    ----------
    obj : callable or torch.nn.Module class or instance
        A function with the signature of ``F.rms_norm(input, normalized_shape, weight, eps)``;
        or a module class built as ``cls(normalized_shape, eps=eps)``; or a module instance whose
        ``weight`` is replaced and whose ``eps`` / ``variance_epsilon`` is set on each call.

    Returns
    -------
    (forward, backward)
        ``forward(x, normalized_shape, weight=None, eps=None) -> y`` and
        ``backward(dy, x, normalized_shape, weight=None, eps=None) -> (dx, dweight)``, both on
        NumPy arrays; the backward is torch autograd through the forward.
    """
    torch = _torch()
    is_cls = _is_module_class(obj)
    is_mod = isinstance(obj, torch.nn.Module)

    def run(x, normalized_shape, weight, eps, grad: bool):
        shape = normalize_shape(normalized_shape)
        xt = _strided_like(np.asarray(x), to_torch(x))
        wt = None if weight is None else _strided_like(np.asarray(weight), to_torch(weight))
        if grad:
            xt.requires_grad_(True)
            if wt is not None:
                wt.requires_grad_(True)
        if is_cls or is_mod:
            module = _build(obj, shape, eps) if is_cls else obj
            w_param = None
            if hasattr(module, "weight") and module.weight is not None:
                w_new = wt if wt is not None else torch.ones(shape, dtype=xt.dtype)
                w_param = torch.nn.Parameter(w_new.detach().clone(), requires_grad=grad)
                module.weight = w_param
            _set_eps(module, eps)
            y = module(xt)
            return y, xt, w_param
        y = obj(xt, list(shape), wt, eps)
        return y, xt, wt

    def forward(x, normalized_shape, weight=None, eps=None):
        with torch.no_grad():
            y, _, _ = run(x, normalized_shape, weight, eps, grad=False)
        return to_numpy(y)

    def backward(dy, x, normalized_shape, weight=None, eps=None):
        y, xt, wt = run(x, normalized_shape, weight, eps, grad=True)
        gt = to_torch(dy).to(y.dtype)
        inputs = [xt] + ([wt] if wt is not None and weight is not None else [])
        grads = torch.autograd.grad(y, inputs, gt, allow_unused=True)
        dx = to_numpy(grads[0])
        dw = to_numpy(grads[1]) if len(grads) > 1 and grads[1] is not None else None
        if dw is not None and weight is not None:
            dw = dw.reshape(np.shape(weight))
        return dx, dw

    label = name or getattr(obj, "__qualname__", None) or type(obj).__name__
    forward.__name__ = backward.__name__ = str(label)
    return forward, backward


def wrap_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch function on tensors as a NumPy callable: arrays in, tensors' bits out.

    For a hand-written backward ``fn(dy, x, normalized_shape, weight, eps) -> (dx, dweight)``.
    """

    def call(*args, **kwargs):
        conv = [to_torch(a) if isinstance(a, np.ndarray) else a for a in args]
        out = fn(*conv, **kwargs)
        if isinstance(out, (tuple, list)):
            return tuple(to_numpy(t) if t is not None else None for t in out)
        return to_numpy(out)

    call.__name__ = getattr(fn, "__name__", "torch_function")
    return call


def rms_norm():
    """(forward, backward) of ``torch.nn.functional.rms_norm`` (autograd backward)."""
    torch = _torch()
    return wrap(torch.nn.functional.rms_norm, name="torch.nn.functional.rms_norm")


def is_torch_object(obj: Any) -> bool:
    """Whether ``obj`` is a torch function or module (class or instance)."""
    mod = getattr(obj, "__module__", "") or ""
    if mod.startswith("torch"):
        return True
    try:
        torch = _torch()
    except ImportError:
        return False
    return isinstance(obj, torch.nn.Module) or _is_module_class(obj)
