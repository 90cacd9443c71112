"""The torch-like module skeleton shared by RMSNorm, LayerNorm and UnitNorm (parameters only).

Each subclass adds ``forward(x)`` and ``backward(dy, x)``; this base holds the parameters and the
``state_dict`` / ``repr`` plumbing so the three classes differ only in their math.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rmsref._shapes import ShapeLike, check_param, normalize_shape, resolve_eps


class NormModule:
    """Parameters (weight, optional bias) and bookkeeping of a normalisation module."""

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float | None,
        elementwise_affine: bool = True,
        bias: bool = False,
        *,
        dtype: Any = np.float32,
        offset: float = 0.0,
    ) -> None:
        self.normalized_shape = normalize_shape(normalized_shape)
        self.eps = None if eps is None else resolve_eps(eps, np.dtype(np.float64))
        self.elementwise_affine = bool(elementwise_affine)
        self.offset = float(offset)
        self.dtype = np.dtype(dtype)
        self.weight: np.ndarray | None = None
        self.bias: np.ndarray | None = None
        if self.elementwise_affine:
            self.weight = np.empty(self.normalized_shape, self.dtype)
            if bias:
                self.bias = np.empty(self.normalized_shape, self.dtype)
        self.reset_parameters()

    @property
    def num_parameters(self) -> int:
        """Number of learnable scalars: N for the weight, N more with a bias."""
        return sum(p.size for p in (self.weight, self.bias) if p is not None)

    def reset_parameters(self) -> None:
        """weight = 1 (0 with an offset, so that offset + weight = 1); bias = 0."""
        if self.weight is not None:
            self.weight[...] = 0.0 if self.offset else 1.0
        if self.bias is not None:
            self.bias[...] = 0.0

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the parameters by name (``weight``, ``bias``)."""
        params = (("weight", self.weight), ("bias", self.bias))
        return {name: p.copy() for name, p in params if p is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load parameters by name; keys and shapes must match exactly (values are copied)."""
        expected = sorted(self.state_dict())
        if sorted(state) != expected:
            raise KeyError(f"state_dict has keys {sorted(state)}; expected {expected}")
        for name, value in state.items():
            getattr(self, name)[...] = check_param(value, name, self.normalized_shape)

    def forward(self, x: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, x: Any) -> np.ndarray:
        return self.forward(x)

    def extra_repr(self) -> str:
        text = (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )
        if self.bias is not None:
            text += ", bias=True"
        if self.offset:
            text += f", offset={self.offset}"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"
