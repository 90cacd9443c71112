"""``rmsref conventions``: what real systems compute, with their formulas."""

from __future__ import annotations

import argparse

NAME = "conventions"
HELP = "list the RMSNorm conventions of real systems with their formulas"
DESCRIPTION = """\
List the conventions rmsref.conventions emulates bit for bit (torch, llama, gemma, t5, ...):
who uses each, its formula with every rounding, its eps default and output dtype.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="show only this convention")


def run(args: argparse.Namespace) -> int:
    from rmsref import conventions

    if args.name is None:
        print(conventions.describe())
        return 0
    try:
        c = conventions.get(args.name)
    except ValueError as exc:
        print(f"rmsref conventions: {exc}")
        return 2
    print(f"{c.name}\n    y      : {c.formula}\n    who    : {c.who}\n    eps    : {c.eps_default}"
          f"\n    output : {c.out_dtype}\n    note   : {c.notes}")
    return 0
