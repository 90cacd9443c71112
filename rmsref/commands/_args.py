"""Argument types shared by the subcommands: a bad value is refused by argparse, before any
check runs, with exit status 2 and a message naming the flag (never a traceback)."""

from __future__ import annotations

import argparse
import math
import os


def seed(text: str) -> int:
    """A seed: a non-negative integer (NumPy's generators refuse negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def eps(text: str) -> float:
    """eps: a finite non-negative real number (the library's own rule for eps)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a real number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"must be a finite non-negative real number, got {text!r}"
        )
    return value


def writable_file(text: str) -> str:
    """A file that can be written, checked now rather than after every check has run."""
    existed = os.path.exists(text)
    try:
        with open(text, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {exc.strerror}") from None
    if not existed:
        os.remove(text)  # leave nothing behind if the run stops before writing it
    return text
