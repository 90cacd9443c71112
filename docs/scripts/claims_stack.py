"""A residual stack of RMSNorm and MLP sublayers, forward and backward by hand, in NumPy.

docs/claims.md uses it to measure how gradients flow through pre-norm and post-norm stacks and
how centred their activations are. Each layer l has an MLP sublayer

    f_l(h) = φ(h·W1) · W2          h (B, d), W1 (d, k), W2 (k, d),  φ = tanh (or identity)

and an RMSNorm with weight γ_l (rmsref's oracle, forward and analytic backward). The two
placements of the norm:

    pre-norm    x_{l+1} = x_l + f_l(RMSNorm(x_l))        output y = RMSNorm_final(x_L)
    post-norm   x_{l+1} = RMSNorm(x_l + f_l(x_l))         output y = x_L

``residual=False`` drops the ``x_l +`` (a plain deep MLP with norms), for comparison. Every
backward line sits under the forward line it undoes (``dX`` means ∂L/∂X); ``+=`` where a value
feeds two consumers (the residual stream feeds the norm and the skip). The stack's backward is
checked against its forward by ``rmsref.gradcheck`` (``check_backward``). NumPy only; nothing here
is imported by ``import rmsref``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import rmsref

PLACEMENTS = ("pre", "post")
ACTIVATIONS = ("tanh", "linear")


@dataclass
class Layer:
    """The parameters of one layer: the sublayer's two matrices and the norm's weight."""

    w1: np.ndarray  # (d, k)
    w2: np.ndarray  # (k, d)
    gamma: np.ndarray  # (d,)


@dataclass
class Stack:
    """A residual stack; ``gamma_final`` is pre-norm's last norm (None for post-norm)."""

    placement: str
    layers: list[Layer]
    gamma_final: np.ndarray | None
    residual: bool = True
    eps: float = 1e-6
    activation: str = "tanh"

    @property
    def d(self) -> int:
        return self.layers[0].w1.shape[0]

    def params(self) -> list[np.ndarray]:
        """Every parameter array, in a fixed order (w1, w2, γ per layer, then γ_final)."""
        out = [p for lay in self.layers for p in (lay.w1, lay.w2, lay.gamma)]
        return out + ([self.gamma_final] if self.gamma_final is not None else [])

    def with_params(self, params: list[np.ndarray]) -> Stack:
        """A stack of the same shape holding ``params`` (the order of :meth:`params`)."""
        layers = [Layer(*params[3 * i:3 * i + 3]) for i in range(len(self.layers))]
        final = params[-1] if self.gamma_final is not None else None
        return Stack(self.placement, layers, final, self.residual, self.eps, self.activation)


def init_stack(depth: int, d: int, placement: str, seed: int, *, hidden: int | None = None,
               residual: bool = True, eps: float = 1e-6, activation: str = "tanh") -> Stack:
    """A stack at initialisation: W ~ N(0, 1/fan_in) (LeCun), γ = 1."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}; got {placement!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if depth < 1:
        raise ValueError(f"depth must be a positive integer; got {depth!r}")
    k = hidden or d
    rng = np.random.default_rng(seed)
    layers = [Layer(rng.standard_normal((d, k)) / np.sqrt(d),
                    rng.standard_normal((k, d)) / np.sqrt(k),
                    np.ones(d))
              for _ in range(depth)]
    final = np.ones(d) if placement == "pre" else None
    return Stack(placement, layers, final, residual, eps, activation)


# ------------------------------------------------------------------------------------------------
# the sublayer
# ------------------------------------------------------------------------------------------------


@dataclass
class MLPCache:
    """What the sublayer's backward needs: its input and the activation's output."""

    h: np.ndarray  # (B, d)  input of the sublayer
    a: np.ndarray  # (B, k)  φ(h·W1)
    activation: str


def mlp_forward(h: np.ndarray, lay: Layer, activation: str) -> tuple[np.ndarray, MLPCache]:
    """f(h) = φ(h·W1)·W2, and what its backward needs."""
    z = h @ lay.w1  # (B, k)  pre-activation
    a = np.tanh(z) if activation == "tanh" else z  # (B, k)
    f = a @ lay.w2  # (B, d)
    return f, MLPCache(h, a, activation)


def mlp_backward(df: np.ndarray, lay: Layer, cache: MLPCache):
    """(dh, dw1, dw2) from df = ∂L/∂f."""
    dw2 = cache.a.T @ df  # (k, d)  f = a·W2
    da = df @ lay.w2.T  # (B, k)
    # (B, k)  tanh' = 1 − tanh², read from the saved output; the identity's derivative is 1
    dz = da * (1.0 - cache.a * cache.a) if cache.activation == "tanh" else da
    dw1 = cache.h.T @ dz  # (d, k)  z = h·W1
    dh = dz @ lay.w1.T  # (B, d)
    return dh, dw1, dw2


# ------------------------------------------------------------------------------------------------
# the stack
# ------------------------------------------------------------------------------------------------


@dataclass
class LayerCache:
    """One layer's saved values: the input of its norm and the norm's rstd (O(rows)), and the
    sublayer's cache."""

    norm_in: np.ndarray  # (B, d)  x_l (pre-norm) or s_l = x_l + f_l(x_l) (post-norm)
    rstd: np.ndarray  # (B, 1)
    mlp: MLPCache


@dataclass
class Forward:
    """The output, the residual stream x_0..x_L and what the backward needs."""

    y: np.ndarray  # (B, d)
    xs: list[np.ndarray]  # L + 1 arrays (B, d): the input of each layer, then x_L
    caches: list[LayerCache]
    final: tuple[np.ndarray, np.ndarray] | None = None  # pre-norm: (x_L, rstd_final)


@dataclass
class Grads:
    """dx: ∂L/∂x_0; dxs: ∂L/∂x_l for l = 0..L; dlayers: per-layer (dw1, dw2, dgamma)."""

    dx: np.ndarray
    dxs: list[np.ndarray]
    dlayers: list[Layer]
    dgamma_final: np.ndarray | None = None

    def flat(self) -> list[np.ndarray]:
        """The parameter gradients in the order of ``Stack.params``."""
        out = [g for lay in self.dlayers for g in (lay.w1, lay.w2, lay.gamma)]
        return out + ([self.dgamma_final] if self.dgamma_final is not None else [])


def stack_forward(stack: Stack, x: np.ndarray) -> Forward:
    """Run the stack on x (B, d)."""
    d, eps = stack.d, stack.eps
    xs, caches = [x], []
    for lay in stack.layers:
        if stack.placement == "pre":
            h, rstd = rmsref.rms_norm_forward(x, d, lay.gamma, eps)  # (B, d), (B, 1)
            f, mc = mlp_forward(h, lay, stack.activation)  # (B, d)
            caches.append(LayerCache(x, rstd, mc))
            x = x + f if stack.residual else f  # (B, d)  the residual add
        else:
            f, mc = mlp_forward(x, lay, stack.activation)  # (B, d)
            s = x + f if stack.residual else f  # (B, d)  the residual add, then the norm
            x, rstd = rmsref.rms_norm_forward(s, d, lay.gamma, eps)
            caches.append(LayerCache(s, rstd, mc))
        xs.append(x)
    if stack.gamma_final is None:
        return Forward(x, xs, caches)
    y, rstd_final = rmsref.rms_norm_forward(x, d, stack.gamma_final, eps)
    return Forward(y, xs, caches, (x, rstd_final))


def stack_backward(stack: Stack, dy: np.ndarray, fwd: Forward) -> Grads:
    """∂L/∂x_0 and every parameter's gradient from dy = ∂L/∂y, layer by layer in reverse."""
    d, eps = stack.d, stack.eps
    dx = dy
    dgamma_final = None
    if fwd.final is not None:
        x_last, rstd_final = fwd.final
        g = rmsref.rms_norm_backward(dy, x_last, d, stack.gamma_final, eps, rstd=rstd_final)
        dx, dgamma_final = g.dx, g.dweight  # (B, d), (d,)
    dxs = [dx]
    dlayers = []
    for lay, c in zip(reversed(stack.layers), reversed(fwd.caches), strict=True):
        if stack.placement == "pre":
            df = dx  # (B, d)  x_{l+1} = x_l + f: the sublayer gets dx_{l+1} as is
            dh, dw1, dw2 = mlp_backward(df, lay, c.mlp)
            g = rmsref.rms_norm_backward(dh, c.norm_in, d, lay.gamma, eps, rstd=c.rstd)
            # x_l feeds the skip and the norm: skip term dx_{l+1} + sublayer term (through norm)
            dx = dx + g.dx if stack.residual else g.dx  # (B, d)
        else:
            g = rmsref.rms_norm_backward(dx, c.norm_in, d, lay.gamma, eps, rstd=c.rstd)
            ds = g.dx  # (B, d)  x_{l+1} = RMSNorm(s): every path to x_l goes through the norm
            dh, dw1, dw2 = mlp_backward(ds, lay, c.mlp)
            # s = x_l + f(x_l): skip term ds + sublayer term dh, both behind this layer's norm
            dx = ds + dh if stack.residual else dh  # (B, d)
        dlayers.append(Layer(dw1, dw2, g.dweight))
        dxs.append(dx)
    return Grads(dx, dxs[::-1], dlayers[::-1], dgamma_final)


# ------------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------------


def check_backward(stack: Stack, x: np.ndarray, seed: int = 0):
    """``rmsref.gradcheck`` of the stack's backward (wrt x and every parameter)."""

    def forward(x, *params):
        return stack_forward(stack.with_params(list(params)), x).y

    def backward(dy, x, *params):
        s = stack.with_params(list(params))
        grads = stack_backward(s, dy, stack_forward(s, x))
        return (grads.dx, *grads.flat())

    names = ["x"] + [f"{p}[{i}]" for i in range(len(stack.layers)) for p in ("w1", "w2", "gamma")]
    names += ["gamma_final"] if stack.gamma_final is not None else []
    return rmsref.gradcheck(forward, backward, [x, *stack.params()], names=names, seed=seed,
                            second_order=False)


@dataclass
class Flow:
    """Gradient norms at initialisation: per layer l = 0..L-1 (first to last)."""

    dx: np.ndarray  # (L,)  ‖∂L/∂x_l‖, the gradient reaching layer l's input
    dw: np.ndarray  # (L,)  ‖(∂L/∂W1_l, ∂L/∂W2_l)‖, the sublayer's weights


def gradient_flow(depth: int, placement: str, seed: int, *, d: int = 64, batch: int = 32,
                  activation: str = "tanh") -> Flow:
    """Gradient norms of a fresh stack for L = sum(y·g), x and g standard Gaussian."""
    stack = init_stack(depth, d, placement, seed, activation=activation)
    rng = np.random.default_rng([seed, 1])
    x = rng.standard_normal((batch, d))  # (B, d)
    dy = rng.standard_normal((batch, d))  # (B, d)  ∂L/∂y for L = Σ y·g
    grads = stack_backward(stack, dy, stack_forward(stack, x))
    dx = np.array([np.linalg.norm(g) for g in grads.dxs[:-1]])
    dw = np.array([np.hypot(np.linalg.norm(g.w1), np.linalg.norm(g.w2)) for g in grads.dlayers])
    return Flow(dx, dw)


def mean_over_rms(x: np.ndarray) -> float:
    """The average over rows of |μ|/RMS: 0 for centred rows, 1 for constant rows."""
    mu = np.mean(x, axis=-1)  # (B,)
    rms = np.sqrt(np.mean(x * x, axis=-1))  # (B,)
    return float(np.mean(np.abs(mu) / rms))


# ------------------------------------------------------------------------------------------------
# a short training run
# ------------------------------------------------------------------------------------------------


@dataclass
class Adam:
    """Adam's two moments for a list of arrays (the optimizer state RMSNorm halves per norm)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: list = field(default_factory=list)
    v: list = field(default_factory=list)

    def step(self, params: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        if not self.m:
            self.m = [np.zeros_like(p) for p in params]
            self.v = [np.zeros_like(p) for p in params]
        self.t += 1
        out = []
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            self.m[i] = self.beta1 * self.m[i] + (1 - self.beta1) * g
            self.v[i] = self.beta2 * self.v[i] + (1 - self.beta2) * g * g
            mhat = self.m[i] / (1 - self.beta1**self.t)
            vhat = self.v[i] / (1 - self.beta2**self.t)
            out.append(p - self.lr * mhat / (np.sqrt(vhat) + self.eps))
        return out


def train(placement: str, *, depth: int = 16, d: int = 32, steps: int = 300, lr: float = 3e-3,
          batch: int = 64, seed: int = 0) -> tuple[np.ndarray, Stack]:
    """Loss per step of a toy regression: fit y = RMSNorm-ish target of a fixed random teacher.

    The teacher is a fixed random 2-layer tanh network followed by a per-row normalisation (so
    its targets have RMS 1, like the stack's outputs); inputs are fresh Gaussian batches drawn
    from one seeded stream, so every run is the same bits. Loss = mean squared error. Returns
    the loss per step and the trained stack.
    """
    rng = np.random.default_rng([seed, 2])
    t1 = rng.standard_normal((d, 4 * d)) / np.sqrt(d)
    t2 = rng.standard_normal((4 * d, d)) / np.sqrt(4 * d)
    stack = init_stack(depth, d, placement, seed)
    opt = Adam(lr)
    losses = np.empty(steps)
    for step in range(steps):
        x = rng.standard_normal((batch, d))  # (B, d)
        target = rmsref.rms_norm(np.tanh(2.0 * x @ t1) @ t2, d, eps=0.0)  # (B, d)
        fwd = stack_forward(stack, x)
        err = fwd.y - target  # (B, d)
        losses[step] = float(np.mean(err * err))
        dy = 2.0 * err / err.size  # (B, d)  ∂(mean err²)/∂y
        grads = stack_backward(stack, dy, fwd)
        stack = stack.with_params(opt.step(stack.params(), grads.flat()))
    return losses, stack
