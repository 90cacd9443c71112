"""Load an implementation from a ``"package.module:function"`` path and make array callables of it.

``rmsref validate`` names what to check by such a path; this module imports it and picks the
adapter: torch functions and modules go through :mod:`rmsref.adapters.torch` (autograd gives the
backward), JAX functions through :mod:`rmsref.adapters.jax` (``jax.vjp``), anything else is taken
as a plain NumPy callable with the signature of :func:`rmsref.rms_norm`.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Framework = Literal["auto", "numpy", "torch", "jax"]

#: Short names accepted in place of a path.
ALIASES = {
    "torch": "torch.nn.functional:rms_norm",
    "torch.nn.functional.rms_norm": "torch.nn.functional:rms_norm",
    "rmsref": "rmsref:rms_norm",
}


@dataclass
class Loaded:
    """What :func:`resolve` returns: the two callables and a display name."""

    forward: Callable[..., Any]
    backward: Callable[..., Any] | None
    name: str
    framework: str


def load(spec: str) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted) and return the object.

    Raises ValueError naming the spec when it has no ``:`` or the attribute is missing, and
    ImportError (with the module name) when the module cannot be imported.
    """
    spec = ALIASES.get(spec, spec)
    if ":" not in spec:
        raise ValueError(f"{spec!r} is not a 'package.module:function' path (e.g. "
                         "'torch.nn:RMSNorm' or 'mypkg.kernels:rms_norm')")
    module_name, _, attr = spec.partition(":")
    module = _import_from_cwd_first(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _import_from_cwd_first(module_name: str) -> Any:
    """Import ``module_name`` searching the working directory first, as ``python -m`` does."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    finally:
        if added:
            sys.path.remove(cwd)


_JAX_PACKAGES = ("jax", "flax", "haiku", "equinox")


def _package_framework(name: str) -> str | None:
    if name == "torch" or name.startswith("torch."):
        return "torch"
    if name.startswith(_JAX_PACKAGES):
        return "jax"
    return None


def _framework_of_globals(obj: Any) -> str | None:
    """The framework a user's function is written in, read from the modules it can see.

    First the names its own code uses (``torch.rsqrt`` in its body), then every module imported
    into its module's globals; None when neither torch nor a JAX package appears, or both do.
    """
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    namespace = getattr(obj, "__globals__", None) or (vars(module) if module else {})

    def framework_of_value(v: Any) -> str | None:
        name = v.__name__ if isinstance(v, types.ModuleType) else (
            getattr(v, "__module__", "") or "")
        return _package_framework(name)

    code = getattr(obj, "__code__", None)
    used = {framework_of_value(namespace[n]) for n in getattr(code, "co_names", ())
            if n in namespace} - {None}
    if len(used) == 1:
        return used.pop()
    seen = {framework_of_value(v) for v in namespace.values()
            if isinstance(v, types.ModuleType)} - {None}
    return seen.pop() if len(seen) == 1 else None


def _framework_of(obj: Any, spec: str) -> str:
    mod = getattr(obj, "__module__", "") or ""
    if mod.startswith("torch") or spec.startswith("torch"):
        return "torch"
    if "torch" in sys.modules:  # a torch nn.Module defined elsewhere has imported torch already
        from rmsref.adapters import torch as torch_adapter

        if torch_adapter.is_torch_object(obj):
            return "torch"
    if mod.startswith(_JAX_PACKAGES) or spec.startswith(_JAX_PACKAGES):
        return "jax"
    return _framework_of_globals(obj) or "numpy"


#: Fragments of the errors a function raises when it gets arrays of another framework.
_ARRAY_TYPE_ERRORS = ("numpy.ndarray", "must be Tensor", "expected Tensor", "jaxlib",
                      "ArrayImpl", "not a Tensor")


def framework_hint(messages: list[str], framework: str) -> str | None:
    """A ``--framework`` suggestion when the calls failed on the array type they were given."""
    if not any(frag in m for m in messages for frag in _ARRAY_TYPE_ERRORS):
        return None
    others = [f for f in ("torch", "jax", "numpy") if f != framework]
    return (f"hint: the calls failed on the array type: the implementation was given "
            f"{'NumPy arrays' if framework == 'numpy' else framework + ' arrays'} (framework "
            f"'{framework}'); if it expects another kind, pass "
            + " or ".join(f"--framework {f}" for f in others))


def resolve(spec: str, backward: str | None = None, *, framework: Framework = "auto") -> Loaded:
    """Forward and backward array callables for the implementation named by ``spec``.

    Parameters
    ----------
    spec : str
        ``"package.module:function"`` or an alias (``"torch"`` = ``F.rms_norm``).
    backward : str, optional
        Path of a separate backward ``(dy, x, normalized_shape, weight, eps) -> (dx, dweight)``.
        Without it, torch and JAX implementations get autograd / ``jax.vjp``; plain NumPy ones
        are checked forward only.
    framework : {"auto", "numpy", "torch", "jax"}
        Which adapter; "auto" decides from the object (torch module classes and instances,
        functions defined in ``torch``/``jax`` packages).
    """
    obj = load(spec)
    fw = _framework_of(obj, ALIASES.get(spec, spec)) if framework == "auto" else framework
    name = ALIASES.get(spec, spec)
    if fw == "torch":
        from rmsref.adapters import torch as torch_adapter

        fwd, bwd = torch_adapter.wrap(obj, name=name)
        if backward is not None:
            bwd = torch_adapter.wrap_function(load(backward))
        return Loaded(fwd, bwd, name, fw)
    if fw == "jax":
        from rmsref.adapters import jax as jax_adapter

        fwd, bwd = jax_adapter.wrap(obj)
        if backward is not None:
            bwd = jax_adapter.wrap_function(load(backward))
        return Loaded(fwd, bwd, name, fw)
    if not callable(obj):
        raise TypeError(f"{spec!r} is a {type(obj).__name__}, not a callable")
    bwd_obj = load(backward) if backward is not None else None
    return Loaded(obj, bwd_obj, name, "numpy")
