r"""``rmsref derive``: the worked example of docs/derivation/rmsnorm.md as a tool.

For one row x (N features), upstream gradient dy, weight w and eps, it prints

1. the forward, one node per line, with every intermediate value (eqs. (1)-(4));
2. the staged backward, the forward's nodes reversed one chain-rule step at a time, ending with the
   two paths from x (direct, and through rstd) added;
3. the closed form dx = rstd·(dxhat − xhat·c), c = mean(dxhat ⊙ xhat), dweight = dy ⊙ xhat, and
   how far it is from the staged values and from the oracle (``rmsref.rms_norm_backward``);
4. a central finite-difference check of dx and dweight on L = ⟨dy, y⟩;
5. optionally (``--jacobian``) the Jacobian diag(w)·rstd·(I − xhat·xhatᵀ/N) and its eigenvalues.

Everything is float64. The exit status is 0 when the staged backward, the closed form, the oracle
and the finite differences agree (within the stated tolerances), 1 when they do not, and 2 for bad
input.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np

NAME = "derive"
HELP = "print RMSNorm's backward for one row, step by step, with a finite-difference check"
DESCRIPTION = """\
Derive RMSNorm's backward pass for one row, printing every intermediate value.

  rmsref derive --x 1,2,2 --dy 1,0,0
      the worked example of docs/derivation/rmsnorm.md: x = (1, 2, 2), w = 1, eps = 0,
      dy = (1, 0, 0) gives dx = (8, -2, -2)/(9*sqrt(3)) and dweight = (1/sqrt(3), 0, 0).

Values are comma-separated (spaces allowed; quote them). eps defaults to 0 here (the
derivation's case), not to the library's finfo(float32).eps. Exit status: 0 when the staged
backward, the closed form, the oracle and the finite differences agree; 1 when they do not;
2 for bad input.
"""

#: Agreement required between the staged backward, the closed form and the oracle, relative to the
#: size of the terms of dx (both are float64 evaluations of the same formula: a few ulps apart).
ALGEBRA_RTOL = 1e-12


class InputError(ValueError):
    """Bad command-line input; the message says what was received."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``rmsref derive``'s options on ``parser``."""
    parser.add_argument("--x", required=True, metavar="X1,X2,...", help="the input row x")
    parser.add_argument("--dy", required=True, metavar="G1,G2,...",
                        help="the upstream gradient dL/dy (same length as --x)")
    parser.add_argument("--w", default=None, metavar="W1,W2,...",
                        help="the weight (same length as --x; default all ones)")
    parser.add_argument("--eps", default="0", metavar="EPS",
                        help="added to the mean of squares (default 0)")
    parser.add_argument("--digits", type=int, default=6, metavar="D",
                        help="significant digits printed (default 6)")
    parser.add_argument("--jacobian", action="store_true",
                        help="also print the Jacobian dy/dx and its eigenvalues")


def parse_vector(text: str, name: str) -> np.ndarray:
    """``"1, 2,2"`` -> float64 array; InputError naming ``name`` and the bad item otherwise."""
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(s == "" for s in items):
        raise InputError(f"{name} must be comma-separated numbers like 1,2,2; got {text!r}")
    values = []
    for s in items:
        try:
            values.append(float(s))
        except ValueError:
            raise InputError(f"{name}: {s!r} is not a number (in {text!r})") from None
    v = np.array(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise InputError(f"{name} must be finite; got {text!r}")
    return v


def parse_inputs(
    x_text: str, dy_text: str, w_text: str | None, eps_text: str | float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Validate the command-line values: (x, dy, w, eps), or InputError saying what is wrong."""
    x = parse_vector(x_text, "--x")
    dy = parse_vector(dy_text, "--dy")
    if dy.shape != x.shape:
        raise InputError(
            f"--x and --dy must have the same length; got --x with {x.size} values "
            f"({x_text!r}) and --dy with {dy.size} ({dy_text!r})"
        )
    w = np.ones_like(x) if w_text is None else parse_vector(w_text, "--w")
    if w.shape != x.shape:
        raise InputError(
            f"--w must have the same length as --x; got --w with {w.size} values ({w_text!r}) "
            f"and --x with {x.size}"
        )
    try:
        eps = float(eps_text)
    except ValueError:
        raise InputError(f"--eps must be a number; got {eps_text!r}") from None
    if not math.isfinite(eps) or eps < 0:
        raise InputError(f"--eps must be finite and >= 0; got {eps_text!r}")
    with np.errstate(over="ignore", under="ignore"):
        ms = float(np.mean(x * x))
    if not math.isfinite(ms):
        raise InputError(f"mean(x²) overflows float64 for x = ({x_text}); use smaller values "
                         "(this teaching tool does not rescale rows as the oracle does)")
    if ms + eps == 0.0:
        raise InputError(
            f"mean(x²) + eps = 0 for x = ({x_text}) and eps = {eps:g}: rstd = 1/sqrt(0) is "
            "infinite; pass --eps > 0 or a non-zero x"
        )
    return x, dy, w, eps


@dataclass
class Derivation:
    """Every intermediate of the forward, the staged and the closed-form backward, for one row."""

    x: np.ndarray
    dy: np.ndarray
    w: np.ndarray
    eps: float
    # forward
    x2: np.ndarray
    ms: float
    v: float
    std: float
    rstd: float
    xhat: np.ndarray
    y: np.ndarray
    # staged backward
    dxhat: np.ndarray
    dweight_staged: np.ndarray
    dx_direct: np.ndarray
    drstd: float
    dstd: float
    dv: float
    dms: float
    dx2: np.ndarray
    dx_via_rstd: np.ndarray
    dx_staged: np.ndarray
    # closed form
    c: float
    dx: np.ndarray
    dweight: np.ndarray


def derive(x: np.ndarray, dy: np.ndarray, w: np.ndarray, eps: float) -> Derivation:
    """Compute every value ``rmsref derive`` prints (one row, float64; see the module docstring)."""
    n = x.size
    # forward, one node per line (rmsref.rmsnorm.rms_norm_backward_staged's numbering)
    x2 = x * x  # (N,)  node 1
    ms = float(np.sum(x2) / n)  # ()  node 2, eq. (1)
    v = ms + eps  # ()  node 3
    std = math.sqrt(v)  # ()  node 4
    rstd = 1.0 / std  # ()  node 5, eq. (2)
    xhat = x * rstd  # (N,)  node 6, eq. (3)
    y = xhat * w  # (N,)  node 8, eq. (4) (no offset, no bias here: node 7 is w itself)
    # backward, nodes reversed
    dxhat = dy * w  # (N,)  node 8 -> xhat, eq. (5)
    dweight_staged = dy * xhat  # (N,)  node 8 -> w, eq. (8) for one row
    dx_direct = dxhat * rstd  # (N,)  node 6 -> x: the direct path
    drstd = float(np.sum(dxhat * x))  # ()  node 6 -> rstd
    dstd = -drstd / (std * std)  # ()  node 5: d(1/s)/ds = -1/s^2
    dv = dstd / (2.0 * std)  # ()  node 4: d sqrt(v)/dv = 1/(2 sqrt(v))
    dms = dv  # ()  node 3: d(ms + eps)/dms = 1
    dx2 = np.full(n, dms / n)  # (N,)  node 2: the mean spreads dms over N squares
    dx_via_rstd = 2.0 * x * dx2  # (N,)  node 1 -> x: the path through rstd
    dx_staged = dx_direct + dx_via_rstd  # (N,)  x feeds two nodes: the paths add
    # closed form
    c = float(np.mean(dxhat * xhat))  # ()  eq. (6)
    dx = rstd * (dxhat - xhat * c)  # (N,)  eq. (7)
    dweight = dy * xhat  # (N,)  eq. (8)
    return Derivation(x, dy, w, eps, x2, ms, v, std, rstd, xhat, y, dxhat, dweight_staged,
                      dx_direct, drstd, dstd, dv, dms, dx2, dx_via_rstd, dx_staged, c, dx, dweight)


def loss(x: np.ndarray, dy: np.ndarray, w: np.ndarray, eps: float) -> float:
    """L = ⟨dy, y(x, w)⟩, whose gradient is (dx, dweight): what finite differences probe."""
    rstd = 1.0 / math.sqrt(float(np.mean(x * x)) + eps)
    return float(np.sum(dy * (x * rstd) * w))


def finite_differences(
    x: np.ndarray, dy: np.ndarray, w: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Central differences of L w.r.t. x and w: (fd_dx, fd_dweight, h).

    y changes on the length scale sqrt(ms + eps) (the RMS of x, or sqrt(eps) for tiny x), so
    h = cbrt(u)·sqrt(ms + eps) balances the O(h²) truncation error against the O(u/h) rounding
    error of the difference quotient: both are ~u^(2/3) ≈ 4e-11 relative. L is linear in w, so
    for w only rounding matters; the same cbrt(u) relative step is used.
    """
    cbrt_u = float(np.finfo(np.float64).eps) ** (1.0 / 3.0)
    h = cbrt_u * math.sqrt(float(np.mean(x * x)) + eps)
    hw = cbrt_u * max(1.0, float(np.max(np.abs(w))))
    fd_dx = np.empty_like(x)
    fd_dw = np.empty_like(w)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        fd_dx[i] = (loss(x + e, dy, w, eps) - loss(x - e, dy, w, eps)) / (2.0 * h)
        e[i] = hw
        fd_dw[i] = (loss(x, dy, w + e, eps) - loss(x, dy, w - e, eps)) / (2.0 * hw)
    return fd_dx, fd_dw, h


def jacobian(d: Derivation) -> np.ndarray:
    """J[i, j] = ∂y_i/∂x_j = w_i·rstd·(δ_ij − xhat_i·xhat_j/N), for any eps."""
    n = d.x.size
    return d.w[:, None] * d.rstd * (np.eye(n) - np.outer(d.xhat, d.xhat) / n)


def _fmt(v: float, digits: int) -> str:
    v = float(v)
    if v == 0.0:
        return "0"
    return f"{v:.{digits}g}"


def _vec(a: np.ndarray, digits: int) -> str:
    return "(" + ", ".join(_fmt(v, digits) for v in np.ravel(a)) + ")"


def report(d: Derivation, digits: int = 6, with_jacobian: bool = False) -> tuple[str, bool]:
    """The text ``rmsref derive`` prints, and whether every check agreed."""
    import rmsref

    n = d.x.size
    f = lambda v: _fmt(v, digits)  # noqa: E731  (local shorthand, keeps the table readable)
    V = lambda a: _vec(a, digits)  # noqa: E731
    lines: list[str] = []
    add = lines.append

    def row(eq: str, formula: str, value: str) -> None:
        add(f"  {eq:<6}{formula:<40} = {value}")

    add(f"RMSNorm backward for one row, N = {n}, eps = {f(d.eps)} (float64)")
    add(f"  x  = {V(d.x)}")
    add(f"  dy = {V(d.dy)}   (dL/dy)")
    add(f"  w  = {V(d.w)}")
    add("")
    add("forward, one node per line")
    row("(1)", "ms   = mean(x²)", f(d.ms))
    row("", "v    = ms + eps", f(d.v))
    row("", "std  = sqrt(v)", f(d.std))
    row("(2)", "rstd = 1 / std", f(d.rstd))
    row("(3)", "xhat = x · rstd", V(d.xhat))
    row("(4)", "y    = xhat ⊙ w", V(d.y))
    add("")
    add("staged backward, the nodes reversed (dX means dL/dX)")
    row("(5)", "dxhat   = dy ⊙ w", V(d.dxhat))
    row("(8)", "dweight = dy ⊙ xhat", V(d.dweight_staged))
    row("", "dx_direct = dxhat · rstd     [path 1]", V(d.dx_direct))
    row("", "drstd  = Σ dxhat ⊙ x", f(d.drstd))
    row("", "dstd   = −drstd / std²", f(d.dstd))
    row("", "dv     = dstd / (2·std)", f(d.dv))
    row("", "dms    = dv", f(d.dms))
    row("", "dx2    = dms / N  (each square)", V(d.dx2))
    row("", "dx_rstd = 2x ⊙ dx2           [path 2]", V(d.dx_via_rstd))
    row("", "dx     = dx_direct + dx_rstd", V(d.dx_staged))
    add("")
    add("closed form")
    row("(6)", "c       = mean(dxhat ⊙ xhat)", f(d.c))
    row("(7)", "dx      = rstd · (dxhat − xhat·c)", V(d.dx))
    row("(8)", "dweight = dy ⊙ xhat", V(d.dweight))

    # How big the terms of dx are before they cancel: the scale its rounding errors follow.
    scale = d.rstd * (np.abs(d.dxhat) + np.abs(d.xhat) * abs(d.c))
    scale_max = max(float(np.max(scale)), float(np.max(np.abs(d.dx))), np.finfo(float).tiny)
    dw_scale = max(float(np.max(np.abs(d.dweight))), np.finfo(float).tiny)

    oracle = rmsref.rms_norm_backward(d.dy[None, :], d.x[None, :], n, d.w, d.eps)
    staged_err = float(np.max(np.abs(d.dx_staged - d.dx)))
    oracle_dx_err = float(np.max(np.abs(oracle.dx[0] - d.dx)))
    oracle_dw_err = float(np.max(np.abs(oracle.dweight - d.dweight)))
    fd_dx, fd_dw, h = finite_differences(d.x, d.dy, d.w, d.eps)
    fd_dx_err = float(np.max(np.abs(fd_dx - d.dx)))
    fd_dw_err = float(np.max(np.abs(fd_dw - d.dweight)))
    # Central differences: truncation ~h²·|L'''| plus rounding ~u·|L|/h. With h = cbrt(u)·RMS
    # both are ~u^(2/3) ≈ 4e-11 of the scale; 1e-6 leaves room for unlucky constants.
    fd_rtol = 1e-6
    checks = [
        ("staged vs closed form", staged_err, ALGEBRA_RTOL * scale_max),
        ("oracle rms_norm_backward dx vs closed form", oracle_dx_err, ALGEBRA_RTOL * scale_max),
        ("oracle dweight vs closed form", oracle_dw_err, ALGEBRA_RTOL * dw_scale),
        (f"central differences dx (h = {h:.2g})", fd_dx_err, fd_rtol * scale_max),
        ("central differences dweight", fd_dw_err, fd_rtol * max(dw_scale, 1.0)),
    ]
    add("")
    add("checks (max |difference| against the tolerance)")
    row("", "fd dx   = ∂⟨dy, y⟩/∂x  by differences", V(fd_dx))
    row("", "fd dw   = ∂⟨dy, y⟩/∂w  by differences", V(fd_dw))
    ok = True
    for label, err, tol in checks:
        good = err <= tol
        ok &= good
        verdict, rel = ("ok  ", "<=") if good else ("FAIL", "> ")
        add(f"  {verdict}  {label:<46} {err:.2e} {rel} {tol:.1e}")
    inner = float(np.dot(d.dx, d.x))
    if d.eps == 0.0:
        add(f"  ⟨dx, x⟩ = {inner:.3g}   (0 up to rounding when eps = 0: scaling x leaves y alone)")
    else:
        predicted = d.eps / d.v * d.rstd * float(np.sum(d.dxhat * d.x))
        add(f"  ⟨dx, x⟩ = {inner:.3g}   (eps > 0: not 0 but eps/(ms+eps)·rstd·Σ dxhat⊙x "
            f"= {predicted:.3g})")

    if with_jacobian:
        jac = jacobian(d)
        add("")
        add("Jacobian J = dy/dx = diag(w) · rstd · (I − xhat·xhatᵀ/N)")
        for r in jac:
            add("  [" + "  ".join(f"{_fmt(v, digits):>12}" for v in r) + " ]")
        if np.all(d.w == d.w[0]):
            eig = np.sort(np.linalg.eigvalsh(jac))
            add(f"  eigenvalues: {V(eig)}")
            add(f"  (w constant: rstd·w = {f(d.rstd * d.w[0])} on the {n - 1} directions ⟂ x, "
                f"rstd·w·eps/(ms+eps) = {f(d.rstd * d.w[0] * d.eps / d.v)} along x)")
        else:
            eig = np.sort(np.linalg.eigvals(jac).real)
            add(f"  eigenvalues (real parts): {V(eig)}")
        add(f"  dx = Jᵀ·dy = {V(jac.T @ d.dy)}")
    add("")
    add("all checks agree" if ok else "CHECKS DISAGREE: see FAIL lines above")
    return "\n".join(lines), ok


def run(args: argparse.Namespace) -> int:
    """Run ``rmsref derive``; 0 all checks agree, 1 a check failed, 2 bad input."""
    try:
        x, dy, w, eps = parse_inputs(args.x, args.dy, args.w, args.eps)
    except InputError as exc:
        print(f"rmsref derive: error: {exc}", file=sys.stderr)
        return 2
    digits = getattr(args, "digits", 6)
    if not 1 <= digits <= 17:
        print(f"rmsref derive: error: --digits must be in 1..17; got {digits}", file=sys.stderr)
        return 2
    text, ok = report(derive(x, dy, w, eps), digits, getattr(args, "jacobian", False))
    print(text)
    return 0 if ok else 1
