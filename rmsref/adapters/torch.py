"""PyTorch as plain array callables: ``F.rms_norm``, any ``nn.Module``, autograd for the backward.

``validate`` and ``identify`` speak NumPy; this adapter converts at the edges. bfloat16 crosses as
its 16 bits (ml_dtypes ↔ torch.bfloat16 through an int16 view), so nothing is rounded on the way.
torch is imported when an adapter is built, never by ``import rmsref``.

    fwd, bwd = rmsref.adapters.torch.wrap(torch.nn.functional.rms_norm)
    fwd, bwd = rmsref.adapters.torch.wrap(torch.nn.RMSNorm)          # a class: built per call
    fwd, bwd = rmsref.adapters.torch.wrap(my_hf_llama_rms_norm)      # an instance: run as a
                                                                     # private copy, never changed
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from rmsref._declared import EPS_NAMES, Declared, eps_attribute
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


#: Constructor parameter names that take the normalised shape (torch, HF, flax-style names).
_SHAPE_NAMES = ("normalized_shape", "hidden_size", "dim", "d_model", "features", "num_features",
                "size", "hidden_dim", "n_embd", "embed_dim", "channels")


class _ClassBuilder:
    """Builds a module class from its signature: the shape and eps by the names it accepts.

    ``cls(768)`` would be wrong for a class whose only parameter is eps (it would set eps = 768),
    so the signature is read once: the shape goes to a parameter named like one (or to a first
    required one that is not an eps), eps to the parameter of that name, or to the attribute after
    construction when the constructor has none.
    """

    def __init__(self, cls) -> None:
        self.cls = cls
        try:
            sig = inspect.signature(cls)
            params = [p for p in sig.parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):      # no signature to read: the classic cls(shape, eps=)
            params = []
        names = [p.name for p in params]
        self.shape_name = next((n for n in names if n in _SHAPE_NAMES), None)
        if self.shape_name is None and params and params[0].name not in EPS_NAMES \
                and params[0].default is inspect.Parameter.empty:
            self.shape_name = params[0].name
        self.eps_name = next((n for n in names if n in EPS_NAMES), None)
        default = sig.parameters[self.eps_name].default if self.eps_name else None
        self.eps_default = float(default) if isinstance(default, (int, float)) else None
        self.classic = not params

    def build(self, shape: tuple[int, ...], eps: float | None):
        arg: Any = shape[0] if len(shape) == 1 else shape
        if self.classic:
            return self.cls(arg, **({} if eps is None else {"eps": float(eps)}))
        kwargs: dict[str, Any] = {} if self.shape_name is None else {self.shape_name: arg}
        if eps is not None and self.eps_name is not None:
            kwargs[self.eps_name] = float(eps)
        module = self.cls(**kwargs)
        if eps is not None and self.eps_name is None:
            _set_eps(module, eps)
        return module


def _set_eps(module, eps: float | None) -> None:
    attr, _ = eps_attribute(module)
    if attr is not None:
        setattr(module, attr, eps)


def _weight_of(module):
    torch = _torch()
    w = getattr(module, "weight", None)
    return w if isinstance(w, torch.Tensor) else None


def _offset_of(module) -> float | None:
    """1.0 when ``module`` uses its weight as 1 + w, 0.0 when as w, None when neither fits.

    A numeric ``offset`` attribute (Liger's modules) says it; otherwise it is read by running the
    module once with a zero weight: y = 0 for w, y = x̂ for 1 + w. A module that cannot run
    here declares nothing (its calls will say why).
    """
    torch = _torch()
    offset = getattr(module, "offset", None)
    if isinstance(offset, (int, float)) and not isinstance(offset, bool):
        return float(offset)
    w = _weight_of(module)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, *w.shape), generator=g, dtype=torch.float32)
    try:
        with torch.no_grad():
            y = torch.func.functional_call(module, {"weight": torch.zeros_like(x[0])}, (x,))
    except Exception:
        return None
    xhat = torch.nn.functional.rms_norm(x, list(w.shape), None, 1e-6)
    if not torch.any(y):
        return 0.0
    if torch.allclose(y.float(), xhat, rtol=1e-2, atol=1e-3):
        return 1.0
    return None


def _declare(module, eps_default: float | None, takes_eps: bool) -> Declared:
    """What a built module declares: eps, normalised dims, weight offset, parameter dtype."""
    w = _weight_of(module)
    return Declared(
        eps_default=eps_default,
        # torch.nn.RMSNorm keeps a normalized_shape (any number of dims); HF-style modules
        # reduce over dim -1 only.
        normalized_dims="any" if hasattr(module, "normalized_shape") else "last",
        offset=None if w is None else _offset_of(module),
        param_dtype=None if w is None else str(w.dtype).removeprefix("torch."),
        has_weight=w is not None,
        takes_eps=takes_eps,
    )


def _module_declaration(obj, builder: _ClassBuilder | None) -> Declared:
    if builder is not None:
        try:
            module = builder.build((64,), None)
        except Exception:  # not buildable from its signature: each call will say why
            return Declared()
        takes_eps = builder.eps_name is not None or eps_attribute(module)[0] is not None
        return _declare(module, builder.eps_default, takes_eps)
    attr, value = eps_attribute(obj)
    eps_default = float(value) if isinstance(value, (int, float)) else None
    return _declare(obj, eps_default, attr is not None)


def wrap(obj: Any, *, name: str | None = None) -> tuple[Callable[..., np.ndarray], Callable]:
    """(forward, backward) array callables for a torch function, module class or module.

    The user's object is never changed. An instance is copied once, privately, and each call
    runs the copy through ``torch.func.functional_call`` with the probe's weight; its eps is set
    on the copy (the instance's own eps when the call passes None). A class is built per call
    from its signature (:class:`_ClassBuilder`).

    Parameters
    ----------
    obj : callable or torch.nn.Module class or instance
        A function with the signature of ``F.rms_norm(input, normalized_shape, weight, eps)``;
        or a module class; or a module instance.

    Returns
    -------
    (forward, backward)
        ``forward(x, normalized_shape, weight=None, eps=None) -> y`` and
        ``backward(dy, x, normalized_shape, weight=None, eps=None) -> (dx, dweight)``, both on
        NumPy arrays; the backward is torch autograd through the forward. For a module, the
        forward carries what the module declares (``forward.rmsref_declared``, a
        :class:`rmsref._declared.Declared`: its eps, normalised dims, 1 + w weight, ...), which
        :func:`rmsref.validate` respects. Without a weight, the module computes with w = 1
        (1 + 1 for a 1 + w module, as the oracle reads weight=None); a module that has none
        drops a weight passed to it, with a warning.
    """
    torch = _torch()
    builder = _ClassBuilder(obj) if _is_module_class(obj) else None
    private = copy.deepcopy(obj) if isinstance(obj, torch.nn.Module) else None
    is_module = builder is not None or private is not None
    declared = _module_declaration(private, builder) if is_module else Declared()
    label = str(name or getattr(obj, "__qualname__", None) or type(obj).__name__)
    eps_attr, own_eps = eps_attribute(private) if private is not None else (None, None)

    def run_module(xt, wt, shape, eps):
        module = builder.build(shape, eps) if builder is not None else private
        if private is not None:
            if eps_attr is not None:
                setattr(private, eps_attr, own_eps if eps is None else float(eps))
            if isinstance(getattr(private, "normalized_shape", None), (tuple, list)):
                private.normalized_shape = tuple(shape)
        if not declared.has_weight:
            if wt is not None:
                warnings.warn(f"{label} has no weight: the weight passed is dropped (the module "
                              "computes x·rstd)", UserWarning, stacklevel=4)
            return module(xt)
        if wt is None:                   # weight=None means w = 1, as for rmsref.rms_norm
            wt = torch.ones(shape, dtype=xt.dtype)
        return torch.func.functional_call(module, {"weight": wt}, (xt,))

    def run(x, normalized_shape, weight, eps, grad: bool):
        shape = normalize_shape(normalized_shape)
        xt = _strided_like(np.asarray(x), to_torch(x))
        wt = None if weight is None else _strided_like(np.asarray(weight), to_torch(weight))
        if grad:
            xt.requires_grad_(True)
            if wt is not None:
                wt.requires_grad_(True)
        if is_module:
            return run_module(xt, wt, shape, eps), xt, wt
        return obj(xt, list(shape), wt, eps), xt, wt

    def forward(x, normalized_shape, weight=None, eps=None):
        with torch.no_grad():
            y, _, _ = run(x, normalized_shape, weight, eps, grad=False)
        return to_numpy(y)

    def backward(dy, x, normalized_shape, weight=None, eps=None):
        y, xt, wt = run(x, normalized_shape, weight, eps, grad=True)
        gt = to_torch(dy).to(y.dtype)
        use_w = wt is not None and declared.has_weight
        grads = torch.autograd.grad(y, [xt] + ([wt] if use_w else []), gt, allow_unused=True)
        dx = to_numpy(grads[0])
        dw = to_numpy(grads[1]) if use_w and grads[1] is not None else None
        if dw is not None:
            dw = dw.reshape(np.shape(weight))
        return dx, dw

    forward.__name__ = backward.__name__ = label
    forward.rmsref_declared = declared  # type: ignore[attr-defined]
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
