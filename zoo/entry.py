"""What a zoo entry states about a real implementation, before anything is run.

An entry names the implementation, how to build it (lazily: its package is imported only by
``build``), what it declares (its convention, default eps, which dims it normalises, which dtypes
it takes) and the verdict its author *expects*, derived from reading its source: per input dtype,
``"pass"`` or ``"fail:<code>"`` with the diagnosis code that names the cause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

#: ``forward(x, normalized_shape, weight=None, eps=None) -> y`` on NumPy arrays, and
#: ``backward(dy, x, normalized_shape, weight=None, eps=None) -> (dx, dweight)`` (or None).
Callables = tuple[Callable[..., Any], Callable[..., Any] | None]


class ZooUnavailable(Exception):
    """Raised by ``build`` when the entry cannot run here (package or compiler missing); the
    message says what is missing and how to install it. Tests skip the entry with that reason."""


@dataclass(frozen=True)
class ZooEntry:
    """One real implementation and the verdict expected for it.

    Attributes
    ----------
    name : str
        Short identifier, unique in the zoo (``"hf-llama"``).
    title : str
        What a reader sees in the docs table (``"transformers LlamaRMSNorm (instance)"``).
    package : str
        The pip distribution whose installed version is recorded with the verdict.
    source : str
        Where the implementation lives
        (``"transformers.models.llama.modeling_llama:LlamaRMSNorm"``).
    convention : str
        The :mod:`rmsref.conventions` name it is validated against.
    build : callable
        ``build() -> (forward, backward)``: imports the package, builds the implementation and
        wraps it exactly as the docs tell users to. Raises :class:`ZooUnavailable` when it cannot.
    dtypes : tuple of str
        The input dtypes it is run in.
    expected : dict
        Per dtype in ``dtypes``: ``"pass"`` or ``"fail:<diagnosis code>"``.
    eps_default : float or None
        The default eps the implementation declares, when it differs from the convention's and
        the adapter cannot read it from the object itself. None: nothing to declare.
    normalized_dims : {"any", "last"}
        ``"last"`` when it normalises the last dimension only (most modules).
    notes : str
        How it departs from ``torch.nn.functional.rms_norm``, from reading its source.
    """

    name: str
    title: str
    package: str
    source: str
    convention: str
    build: Callable[[], Callables]
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    expected: dict[str, str] = field(default_factory=dict)
    eps_default: float | None = None
    normalized_dims: Literal["any", "last"] = "any"
    notes: str = ""
