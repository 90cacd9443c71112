"""Terminal output for the ``rmsref`` commands: a progress display and result tables.

Uses `rich <https://rich.readthedocs.io>`_ when it is importable (``pip install 'rmsref[cli]'``;
the ``test`` extra has it too) and plain aligned text otherwise. rich is imported here, lazily,
never by ``import rmsref``. Any command can reuse this::

    out = Output()
    with out.progress(total=3, description="checking") as bar:
        for name in ("a", "b", "c"):
            bar.update(name)          # what is running now
            ...
            bar.advance()
    out.table("results", [Column("check"), Column("ratio", "right")], [["a", "0.1"], ...],
              styles=["green", ...])
    out.print("3 passed", style="bold green")

The live display goes to stderr and only when stderr is a terminal, so piped or captured output
holds just the tables and lines; ``bar.note(text)`` lines (why a run pauses) go to stderr always.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Column", "Output", "rich_available"]


def rich_available() -> bool:
    """True when rich can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("rich") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class Column:
    """A table column: header, justification ("left" or "right"), and whether its cells may
    wrap on a narrow terminal (text) or must stay whole (numbers: ``no_wrap=True``)."""

    header: str
    justify: str = "left"
    no_wrap: bool = False


class _Bar:
    """What a progress context hands out: ``update(label)`` and ``advance(steps=1)``."""

    def __init__(self, total: int, description: str, backend: Any = None, stream=None) -> None:
        self.total = total
        self.done = 0
        self.description = description
        self.label = ""
        self._rich = backend  # (Progress, task id) when rich renders, else None
        self._stream = stream  # plain text on a terminal, else None

    def update(self, label: str) -> None:
        """Say what is running now."""
        self.label = label
        self._render()

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` items as done."""
        self.done += steps
        self._render()

    def note(self, text: str) -> None:
        """A line the user must see now (e.g. why the run pauses), on stderr and flushed: above
        the live display on a terminal, a plain line when stderr is a pipe or a file."""
        if self._rich is not None:
            progress, _ = self._rich
            progress.console.print(text, markup=False, highlight=False)
        elif self._stream is not None:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self._stream.write("\r" + text.ljust(width) + "\n")
            self._render()
        else:
            print(text, file=sys.stderr, flush=True)

    def _render(self) -> None:
        if self._rich is not None:
            progress, task = self._rich
            progress.update(task, completed=self.done,
                            description=f"{self.description}: {self.label}")
        elif self._stream is not None:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            text = f"[{self.done}/{self.total}] {self.description}: {self.label}"
            self._stream.write("\r" + text[:width].ljust(width))
            self._stream.flush()


class Output:
    """Tables, lines and a progress display, through rich when available.

    Parameters
    ----------
    plain : bool, optional
        Force plain text (True) or rich (False; ImportError when it is missing). Default: rich
        when importable.
    file : file object, optional
        Where tables and lines go (default ``sys.stdout`` at the time of each call).
    """

    def __init__(self, *, plain: bool | None = None, file: IO[str] | None = None) -> None:
        self.use_rich = rich_available() if plain is None else not plain
        if self.use_rich and not rich_available():
            raise ImportError("rich is not installed; pip install 'rmsref[cli]' (or use plain)")
        self._file = file

    @property
    def file(self) -> IO[str]:
        return self._file if self._file is not None else sys.stdout

    def _console(self, stderr: bool = False):
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                # rich points stdout at /dev/null and exits with status 1; a reader that
                # closed the pipe (``| head``) is not a failure: raise what plain printing
                # raises, which the CLI's entry point turns into status 0
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                raise BrokenPipeError

        stream = sys.stderr if stderr else self.file
        is_tty = bool(getattr(stream, "isatty", lambda: False)())
        # Off a terminal rich assumes 80 columns and would wrap the tables; give them room.
        width = None if is_tty else max(120, shutil.get_terminal_size((120, 20)).columns)
        return _Console(file=stream, width=width, highlight=False, soft_wrap=False)

    def print(self, text: str = "", *, style: str | None = None) -> None:
        """One line (rich markup is not interpreted, so any text is safe)."""
        if self.use_rich:
            from rich.text import Text

            self._console().print(Text(text, style=style or ""))
        else:
            print(text, file=self.file)

    def table(
        self,
        title: str | None,
        columns: Sequence[Column],
        rows: Sequence[Sequence[str]],
        *,
        styles: Sequence[str | None] | None = None,
    ) -> None:
        """A table of strings; ``styles`` gives one rich style per row (ignored in plain text)."""
        if self.use_rich:
            from rich import box
            from rich.table import Table

            table = Table(title=title, title_justify="left", header_style="bold",
                          box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
            for col in columns:
                longest = max([len(col.header)] + [len(r[len(table.columns)]) for r in rows])
                if col.no_wrap:  # numbers are never cut: give them their full width
                    table.add_column(col.header, justify=col.justify, no_wrap=True,
                                     min_width=longest)
                else:  # text folds onto a second line on a narrow terminal
                    table.add_column(col.header, justify=col.justify, overflow="fold")
            for i, row in enumerate(rows):
                table.add_row(*row, style=(styles[i] if styles else None))
            self._console().print(table)
            return
        widths = [max([len(c.header)] + [len(r[j]) for r in rows]) for j, c in enumerate(columns)]

        def fmt(cells: Sequence[str]) -> str:
            out = [
                cell.rjust(w) if col.justify == "right" else cell.ljust(w)
                for cell, w, col in zip(cells, widths, columns, strict=True)
            ]
            return "  ".join(out).rstrip()

        if title:
            print(title, file=self.file)
        print(fmt([c.header for c in columns]), file=self.file)
        print("  ".join("-" * w for w in widths), file=self.file)
        for row in rows:
            print(fmt(row), file=self.file)

    @contextmanager
    def progress(self, total: int, description: str) -> Iterator[_Bar]:
        """A progress display on stderr while the block runs (nothing when stderr is not a
        terminal); yields an object with ``update(label)`` and ``advance()``."""
        interactive = bool(getattr(sys.stderr, "isatty", lambda: False)())
        if not interactive:
            yield _Bar(total, description)
            return
        if self.use_rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self._console(stderr=True), transient=True,
            )
            with progress:
                task = progress.add_task(description, total=total)
                yield _Bar(total, description, backend=(progress, task))
            return
        bar = _Bar(total, description, stream=sys.stderr)
        try:
            yield bar
        finally:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            sys.stderr.write("\r" + " " * width + "\r")
            sys.stderr.flush()
