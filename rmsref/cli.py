"""The ``rmsref`` command: a thin dispatcher over ``rmsref.commands.*``.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status), so the CLI can grow without one file holding everything.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Subcommand modules, in the order ``rmsref --help`` lists them.
COMMANDS = ("check", "validate", "conventions", "derive")


def _load(name: str):
    try:
        return importlib.import_module(f"rmsref.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"rmsref.commands.{name}":
            return None
        raise


def build_parser(prog: str = "rmsref") -> argparse.ArgumentParser:
    from rmsref import __version__

    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "rmsref: the reference implementation of RMSNorm.\n\n"
            "A float64 NumPy oracle with analytic backward passes, fast kernels checked\n"
            "against it, gradient checks, executable identities, and a validator for other\n"
            "implementations (PyTorch, JAX, your own kernel).\n\n"
            "Start with `rmsref check`: the library verifies itself and prints what it\n"
            "measured."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rmsref {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        if mod is None:
            continue
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "rmsref") -> int:
    """Entry point of the ``rmsref`` console script (and of ``python -m rmsref``); returns the
    exit status."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        print("rmsref: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
