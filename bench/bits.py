"""The bits of every default kernel and of the oracle, hashed, to compare two trees.

    python bench/bits.py                          # hashes of this tree's outputs
    python bench/bits.py --against c246a39        # the same script on another commit, then a diff

A refactoring that means to keep the numbers (the input contract, the kernel history moved out,
the shared row helpers) must leave every output bit as it was. The tests check bits *within* one
tree (thread counts, batch prefixes, repeats); this script checks them *across* two trees: it
runs the RMSNorm forward, backward (with and without a saved rstd), LayerNorm forward and
backward and the fused residual add (its backward with and without a dresidual_out and a saved
rstd; both meanings of the sum) of the oracle and of each fast backend that can run here on
fixed inputs, for each dtype, and prints one SHA-256 prefix per output. With
``--against REV`` it checks REV out in a temporary worktree, runs this same script there (its
own rmsref imported, a fresh Numba cache) and lists what differs; the exit status is 1 when
anything does.

The inputs are ordinary (unit-scale normal rows, weights in [0.5, 1.5]): a bug fix for extreme
rows between the two trees does not show here, a change of ordinary results does.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the tree whose rmsref is imported: this checkout, or the other commit's worktree (--against)
TREE = os.environ.get("RMSREF_BITS_TREE", str(ROOT))


def _hash(*arrays) -> str:
    import numpy as np

    m = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        m.update(f"{a.dtype}{a.shape}".encode())
        m.update(a.tobytes())
    return m.hexdigest()[:16]


def _inputs(dtype, m: int = 37, n: int = 200):
    """x, w, b, dy, residual: (m, n) rows (several per thread, a ragged tail), seeded."""
    import numpy as np

    rng = np.random.default_rng(20261203)
    x = (rng.standard_normal((m, n)) * 3).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    r = rng.standard_normal((m, n)).astype(dtype)
    return x, w, b, dy, r


def hashes(names: list[str], dtypes: list[str]) -> dict[str, str]:
    """``{"backend:dtype:function": hash}`` for every backend in ``names`` and dtype."""
    import numpy as np

    import rmsref
    from rmsref._shapes import FLOAT_DTYPES

    out: dict[str, str] = {}
    for name in names:
        mod = rmsref if name == "oracle" else rmsref.backend(name)
        for dname in dtypes:
            x, w, b, dy, r = _inputs(np.dtype(FLOAT_DTYPES[dname]))
            n = x.shape[-1]
            key = f"{name}:{dname}"
            y, rstd = mod.rms_norm_forward(x, n, w)
            out[f"{key}:rms_norm_forward"] = _hash(y, rstd)
            g = mod.rms_norm_backward(dy, x, n, w)
            out[f"{key}:rms_norm_backward"] = _hash(g.dx, g.dweight)
            g = mod.rms_norm_backward(dy, x, n, w, rstd=rstd)
            out[f"{key}:rms_norm_backward(rstd)"] = _hash(g.dx, g.dweight)
            y, mean, rstd = mod.layer_norm_forward(x, n, w, b)
            out[f"{key}:layer_norm_forward"] = _hash(y, mean, rstd)
            g = mod.layer_norm_backward(dy, x, n, w, b)
            out[f"{key}:layer_norm_backward"] = _hash(*[v for v in g if v is not None])
            if hasattr(mod, "add_rms_norm"):
                res = mod.add_rms_norm(x, r, n, w)
                res = res if isinstance(res, tuple) else (res,)
                out[f"{key}:add_rms_norm"] = _hash(*[v for v in res if v is not None])
            if hasattr(mod, "add_rms_norm_backward"):
                _, new_res, rstd = mod.add_rms_norm_forward(x, r, n, w)
                for dro, saved in ((new_res, None), (new_res, rstd), (None, None), (None, rstd)):
                    g = mod.add_rms_norm_backward(dy, dro, x, r, n, w, rstd=saved)
                    call = ("dresidual_out" if dro is not None else "") + (
                        ",rstd" if saved is not None else "")
                    out[f"{key}:add_rms_norm_backward({call.strip(',')})"] = _hash(*g)
                # the other meaning of the sum, h rounded to x's dtype first (its own loops)
                y, new_res, rstd = mod.add_rms_norm_forward(x, r, n, w, rounding="rounded-sum")
                out[f"{key}:add_rms_norm_forward(rounded-sum)"] = _hash(y, new_res, rstd)
                g = mod.add_rms_norm_backward(dy, new_res, x, r, n, w, rounding="rounded-sum",
                                              rstd=rstd)
                out[f"{key}:add_rms_norm_backward(rounded-sum,dresidual_out,rstd)"] = _hash(*g)
    return out


def _parse(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def _run_on(tree: Path, argv: list[str], env: dict[str, str] | None = None) -> str:
    """This script's output with ``tree``'s rmsref imported; its stderr shown if it fails."""
    env = dict(os.environ if env is None else env, RMSREF_BITS_TREE=str(tree))
    done = subprocess.run([sys.executable, __file__, *argv], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bits.py failed on {tree}:\n{done.stderr}")
    return done.stdout


def against(rev: str, argv: list[str]) -> int:
    """Run this script on ``rev`` (a temporary worktree) and here; print the differences."""
    known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                            f"{rev}^{{commit}}"], capture_output=True, text=True)
    if known.returncode != 0:
        print(f"bits.py: --against {rev!r} is not a commit of {ROOT}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rmsref-bits-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree),
                        rev], check=True)
        try:
            env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "numba-cache"))
            theirs = _run_on(tree, argv, env)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)
    ours = _run_on(ROOT, argv)
    old, new = _parse(theirs), _parse(ours)
    differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
    only = sorted(old.keys() ^ new.keys())
    for k in differ:
        print(f"differs  {k}: {rev} {old[k]}, here {new[k]}")
    for k in only:
        print(f"only in {'here' if k in new else rev}: {k}")
    same = len(old.keys() & new.keys()) - len(differ)
    print(f"{same} outputs with the same bits, {len(differ)} differ, {len(only)} in one tree only")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="compare with this commit's outputs")
    parser.add_argument("--backends", default=None,
                        help="comma-separated (default: oracle and every available fast backend)")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16,float64",
                        help="comma-separated (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.backends is None:
        from rmsref import backends

        args.backends = ",".join(["oracle"] + [n for n in backends.fast_backend_names()
                                               if backends.is_available(n)])
    passed = ["--backends", args.backends, "--dtypes", args.dtypes]
    if args.against:
        return against(args.against, passed)
    for key, value in hashes(args.backends.split(","), args.dtypes.split(",")).items():
        print(key, value)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, TREE)  # this tree's rmsref, whatever is installed
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
