"""The backend registry: one place that names every implementation.

Tests parametrise over it, ``rmsref check`` and the benchmarks walk it. Nothing is chosen behind the
user's back: ``rmsref.rms_norm`` is always the NumPy oracle, and a fast path is asked for by name::

    fast = rmsref.backend("numba_cpu")
    y, rstd = fast.rms_norm_forward(x, 4096, w)

A backend is a module exposing the oracle's function names with the oracle's signatures
(docs/kernels.md). Optional dependencies are imported only when a backend is asked for or probed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

#: The functions of the oracle a backend may offer, grouped by norm.
RMS_FUNCTIONS = ("rms_norm", "rms_norm_forward", "rms_norm_backward")
ADD_RMS_FUNCTIONS = ("add_rms_norm", "add_rms_norm_forward", "add_rms_norm_backward")
LAYER_FUNCTIONS = ("layer_norm", "layer_norm_forward", "layer_norm_backward")
#: Every real floating dtype a backend may take.
ALL_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class BackendSpec:
    """What one backend offers, how to load it, and how to tell why it cannot be loaded.

    ``rmsref check``, ``tests/test_backends.py`` and the benchmarks read these fields instead of
    knowing backends by name: a new backend is one module plus one entry here.
    """

    name: str
    module: str
    description: str
    requires: tuple[str, ...] = ()
    install_hint: str = ""
    probe: Callable[[], str | None] | None = None
    #: the oracle's functions it implements (same names and signatures)
    functions: tuple[str, ...] = RMS_FUNCTIONS
    #: input dtypes it accepts (by name); complex inputs are the oracle's alone
    dtypes: tuple[str, ...] = ALL_DTYPES
    #: the convention (rmsref.conventions) whose error model bounds its outputs
    convention: str = "torch"
    #: True for the float64 oracle every other backend is compared with
    reference: bool = False
    #: the thread knob whose count must not change any bit ("numba"), or None
    threads: str | None = None
    #: environment variable that turns the backend into a simulator running at Python speed
    #: (checks then use small shapes), or None
    simulator_env: str | None = None
    #: True when the first call of each kernel compiles it (a cold cache takes seconds)
    compiles: bool = False

    def simulated(self) -> bool:
        """True when the backend runs in its simulator here (small shapes only)."""
        return self.simulator_env is not None and os.environ.get(self.simulator_env, "0") == "1"


def _probe_cuda() -> str | None:
    """Why numba.cuda cannot run here, or None when a GPU (or the simulator) is usable."""
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda missing or broken
        return f"numba.cuda cannot be imported ({exc}); pip install 'rmsref[cuda]'"
    if simulator:
        return None
    try:
        if cuda.is_available():
            return _cuda_compiler_problem()
    except Exception as exc:  # driver errors surface here
        return f"no usable CUDA driver ({exc}); set NUMBA_ENABLE_CUDASIM=1 to use the simulator"
    return (
        "no CUDA GPU or driver found; set NUMBA_ENABLE_CUDASIM=1 before numba is imported to run "
        "the kernels in Numba's CUDA simulator (slow, for testing)"
    )


def _cuda_compiler_problem() -> str | None:
    """Why numba-cuda's compiler cannot load here, or None.

    The first kernel compile loads numba-cuda's NumPy overloads (``numba.cuda.cudaimpl``); with
    a NumPy it does not support that import fails, deep inside the first call. numba-cuda 0.30.4
    refers to ``np.row_stack``, which NumPy 2.5 removed (seen on a GPU machine whose image paired
    them). The simulator compiles nothing, so it is not asked.
    """
    try:
        importlib.import_module("numba.cuda.cudaimpl")
    except Exception as exc:  # noqa: BLE001 - any failure here is a compile that cannot work
        import numpy as np

        hint = " (NumPy 2.5 removed it): pip install 'numpy<2.5'" if "row_stack" in str(exc) else ""
        return (f"numba-cuda's compiler cannot load with NumPy {np.__version__}: "
                f"{type(exc).__name__}: {exc}{hint}")
    return None


_REGISTRY: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec(
            name="numpy",
            module="rmsref",
            description="the float64 NumPy oracle (reference semantics, overflow-safe)",
            functions=RMS_FUNCTIONS + ADD_RMS_FUNCTIONS + LAYER_FUNCTIONS,
            reference=True,
        ),
        BackendSpec(
            name="numba_cpu",
            module="rmsref.kernels.numba_cpu",
            description="Numba-parallel CPU kernels (rows in parallel, deterministic)",
            requires=("numba",),
            install_hint="pip install 'rmsref[numba]'",
            functions=RMS_FUNCTIONS + ADD_RMS_FUNCTIONS + LAYER_FUNCTIONS,
            threads="numba",
            compiles=True,
        ),
        BackendSpec(
            name="numba_cuda",
            module="rmsref.kernels.numba_cuda",
            description="numba.cuda kernels (block per row; runs in the CUDA simulator too)",
            requires=("numba", "numba.cuda"),
            install_hint="pip install 'rmsref[cuda]'",
            probe=_probe_cuda,
            functions=RMS_FUNCTIONS + ADD_RMS_FUNCTIONS,
            dtypes=("float16", "bfloat16", "float32"),  # float32 arithmetic on the device
            simulator_env="NUMBA_ENABLE_CUDASIM",
            compiles=True,
        ),
    )
}


def backend_names() -> list[str]:
    """Every registered backend name, available or not."""
    return list(_REGISTRY)


def why_unavailable(name: str) -> str | None:
    """None when backend ``name`` can be used here, else the reason and how to fix it.

    A backend is available when its optional dependencies are installed, its probe (a GPU, the
    simulator) finds what it needs, and its module loads: a backend that is installed but fails
    to load (e.g. a Numba cache directory that cannot be written) is reported with the error, as
    :func:`why_broken` gives it, never as usable.
    """
    spec = _spec(name)
    for mod in spec.requires:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{mod} is not installed; {spec.install_hint}".rstrip("; ")
    if spec.probe is not None:
        reason = spec.probe()
        if reason is not None:
            return reason
    return why_broken(name)


def why_broken(name: str) -> str | None:
    """The error when backend ``name``'s module fails to load although what it needs is here
    (None when it loads, or when it is merely not installed: see :func:`why_unavailable`)."""
    spec = _spec(name)
    try:
        importlib.import_module(spec.module)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the reason
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] in {r.split(".")[0] for r in spec.requires}:
            return None  # not installed: why_unavailable says so
        return f"{spec.module} is installed but cannot be loaded: {type(exc).__name__}: {exc}"
    return None


def is_available(name: str) -> bool:
    """True when backend ``name`` can be loaded here."""
    return why_unavailable(name) is None


def available_backends() -> dict[str, str | None]:
    """Map every backend name to None (available) or the reason it is not."""
    return {name: why_unavailable(name) for name in _REGISTRY}


def backend(name: str) -> ModuleType:
    """The module implementing backend ``name`` (same function names and signatures as rmsref).

    Raises ``ValueError`` for an unknown name and ``RuntimeError`` (with the reason and an install
    hint) for a backend that cannot run here.
    """
    spec = _spec(name)
    reason = why_unavailable(name)
    if reason is not None:
        raise RuntimeError(f"backend {name!r} is unavailable: {reason}")
    return importlib.import_module(spec.module)


def describe(name: str) -> str:
    """One line saying what backend ``name`` is."""
    return _spec(name).description


def spec(name: str) -> BackendSpec:
    """The registry entry of backend ``name`` (what it offers; see :class:`BackendSpec`)."""
    return _spec(name)


def fast_backend_names() -> list[str]:
    """Every registered backend but the reference oracle, in registry order."""
    return [name for name, s in _REGISTRY.items() if not s.reference]


def max_threads(name: str) -> int:
    """The most threads backend ``name`` can run with (1 when it has no thread knob)."""
    if _spec(name).threads != "numba":
        return 1
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def set_threads(name: str, n: int) -> int:
    """Set the thread count of backend ``name``; return the count it had before."""
    knob = _spec(name).threads
    if knob != "numba":
        raise ValueError(f"backend {name!r} has no thread count to set (threads={knob!r})")
    import numba

    before = int(numba.get_num_threads())
    numba.set_num_threads(int(n))
    return before


def _spec(name: str) -> BackendSpec:
    if not isinstance(name, str):
        raise TypeError(
            f"backend name must be a str (one of {', '.join(_REGISTRY)}); "
            f"got {name!r} ({type(name).__name__})"
        )
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown backend {name!r}; registered backends: {', '.join(_REGISTRY)}"
        ) from None
