"""Sphinx extension of the rmsref docs: executed code blocks and pages generated from the code.

1. Every ```python block of a Markdown page is executed when the page is read, in page order, in
   one namespace per page, with the repository root as working directory; what it prints is shown
   under it. An exception is a build warning (so ``sphinx-build -W`` fails), naming the page and
   line. A block whose first line is ``# not run: <reason>`` is shown but not executed; the reason
   is required. tests/test_docs.py uses the same functions (``python_blocks``, ``run_page``), so
   the tests and the built pages run exactly the same code. The environment variable
   ``RMSREF_DOCS_EXECUTE=page1,page2`` (docnames) limits execution at build time to those pages;
   the tests set it for their build because they have run every block already.
2. Directives that build content from the code, so that a page cannot drift from it:
   ``rmsref-identities`` (one section per entry of ``rmsref.identities.REGISTRY``),
   ``rmsref-conventions`` (the table of ``rmsref.conventions.CONVENTIONS``), ``rmsref-docstring``
   (a module docstring verbatim, or one of its sections as prose, read without importing the
   module) and
   ``rmsref-figure-if-made`` (an image once its data exists, a visible "pending" note before).

This module imports Sphinx and docutils only inside ``setup`` and the directive factory, so the
tests can import the block extraction without Sphinx installed.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import traceback
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: ``# not run: reason`` as the first line of a block opts it out of execution (visibly).
SKIP_MARKER = re.compile(r"^#\s*not run:\s*(?P<reason>\S.*)$")
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass
class Block:
    """One fenced code block: its first code line (1-based), language, code and opt-out reason."""

    line: int
    language: str
    code: str
    skip_reason: str | None = None


def fenced_blocks(text: str) -> list[Block]:
    """All fenced blocks of a Markdown text (CommonMark fences; nested colon fences are fine)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        start = i + 1
        j = start
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if (close and close.group("fence")[0] == fence[0]
                    and len(close.group("fence")) >= len(fence)
                    and not close.group("info").strip()):
                break
            j += 1
        body = "\n".join(lines[start:j])
        if m.group("indent"):
            body = "\n".join(ln[len(m.group("indent")):] for ln in lines[start:j])
        language = info.split()[0] if info else ""
        blocks.append(Block(start + 1, language, body))
        i = j + 1
    return blocks


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, with their opt-out reason when marked."""
    out = []
    for b in fenced_blocks(text):
        if b.language not in ("python", "py", "python3"):
            continue
        first = b.code.splitlines()[0].strip() if b.code.strip() else ""
        m = SKIP_MARKER.match(first)
        b.skip_reason = m.group("reason").strip() if m else None
        out.append(b)
    return out


class BlockError(RuntimeError):
    """A docs code block raised; the message names the page, the line and the traceback."""


def run_page(blocks: list[Block], page: str) -> list[str | None]:
    """Execute ``blocks`` in order in one namespace; the printed output of each (None: skipped)."""
    namespace: dict = {"__name__": "__docs__"}
    outputs: list[str | None] = []
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for b in blocks:
            if b.skip_reason is not None:
                outputs.append(None)
                continue
            buf = io.StringIO()
            try:
                code = compile(b.code, f"{page}:{b.line}", "exec")
                with contextlib.redirect_stdout(buf):
                    exec(code, namespace)  # noqa: S102  (running the docs is the point)
            except Exception as exc:
                tb = traceback.format_exc(limit=-3)
                raise BlockError(
                    f"{page}, code block at line {b.line} raised {type(exc).__name__}: {exc}\n{tb}"
                ) from exc
            outputs.append(buf.getvalue())
    finally:
        os.chdir(cwd)
    return outputs


# ------------------------------------------------------------------------------------------------
# Sphinx side
# ------------------------------------------------------------------------------------------------


def _execute_blocks(app, doctree) -> None:
    from docutils import nodes
    from sphinx.util import logging

    logger = logging.getLogger("rmsref_docs")
    docname = app.env.docname
    only = os.environ.get("RMSREF_DOCS_EXECUTE")
    if only is not None and docname not in only.split(","):
        return  # the tests run every block themselves and build with a subset (see below)
    path = str(app.env.doc2path(docname))
    if not path.endswith(".md"):
        return
    with open(path, encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    if not blocks:
        return
    try:
        outputs = run_page(blocks, os.path.relpath(path, ROOT))
    except BlockError as exc:
        logger.warning(str(exc), location=docname)
        return
    candidates = [
        n for n in doctree.findall(nodes.literal_block)
        if n.get("language") in ("python", "py", "python3") and n.source == path
    ]
    pos = 0
    for block, out in zip(blocks, outputs, strict=True):
        want = block.code.strip("\n")
        while pos < len(candidates) and candidates[pos].astext().strip("\n") != want:
            pos += 1
        if pos == len(candidates):
            logger.warning(f"executed block at line {block.line} not found in the doctree",
                           location=docname)
            return
        node = candidates[pos]
        pos += 1
        if out:
            shown = nodes.literal_block(out, out.rstrip("\n"), classes=["rmsref-output"])
            shown["language"] = "none"
            node.parent.insert(node.parent.index(node) + 1, shown)


def _text_nodes(text: str):
    """Paragraph children: text with ``code`` spans as literals."""
    from docutils import nodes

    parts = re.split(r"``([^`]+)``", text)
    out = []
    for i, p in enumerate(parts):
        if not p:
            continue
        out.append(nodes.literal(p, p) if i % 2 else nodes.Text(p))
    return out


def _table(headers: list[str], rows: list[list[str]], widths: list[int]):
    from docutils import nodes

    table = nodes.table(classes=["rmsref-generated"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    for w in widths:
        group += nodes.colspec(colwidth=w)
    head = nodes.thead()
    group += head
    hrow = nodes.row()
    for h in headers:
        hrow += nodes.entry("", nodes.paragraph(h, h))
    head += hrow
    body = nodes.tbody()
    group += body
    for r in rows:
        row = nodes.row()
        for cell in r:
            row += nodes.entry("", nodes.paragraph("", "", *_text_nodes(cell)))
        body += row
    return table


def _directives():
    from docutils import nodes
    from docutils.parsers.rst import Directive, directives

    class IdentitiesDirective(Directive):
        """One section per registered identity: statement, formula, source, bound, the check."""

        has_content = False

        def run(self):
            from rmsref import identities

            sections = []
            for ident in identities.REGISTRY.values():
                sid = f"identity-{ident.name.replace('_', '-')}"
                sec = nodes.section(ids=[sid], names=[sid])
                title = f"{ident.title}"
                sec += nodes.title(title, title)
                sec += nodes.paragraph("", "", *_text_nodes(ident.statement))
                sec += nodes.math_block(ident.latex, ident.latex, nowrap=False, number=None)
                meta = [
                    ("name", f"``{ident.name}``"),
                    ("kind", ident.kind),
                    ("source", ident.source),
                    ("uses", ", ".join(f"``{u}``" for u in ident.uses)),
                ]
                flist = nodes.field_list()
                for key, value in meta:
                    field = nodes.field()
                    field += nodes.field_name(key, key)
                    field += nodes.field_body("", nodes.paragraph("", "", *_text_nodes(value)))
                    flist += field
                sec += flist
                if ident.derivation:
                    sec += nodes.paragraph("", "", nodes.strong("Why, and the bound", "Why, and "
                                                                "the bound"))
                    text = inspect.cleandoc(ident.derivation)
                    block = nodes.literal_block(text, text,
                                                classes=["rmsref-derivation"])
                    block["language"] = "none"
                    sec += block
                check = f"rmsref.identities.run([{ident.name!r}])"
                sec += nodes.paragraph("", "", nodes.Text("The check: "),
                                       nodes.literal(check, check))
                self.state.document.note_implicit_target(sec, sec)
                sections.append(sec)
            return sections

    class ConventionsDirective(Directive):
        """The conventions table, straight from ``rmsref.conventions.CONVENTIONS``."""

        has_content = False

        def run(self):
            from rmsref import conventions

            rows = [
                [f"``{c.name}``", c.who, c.formula, c.eps_default, c.out_dtype, c.notes]
                for c in conventions.CONVENTIONS.values()
            ]
            headers = ["name", "who", "y", "eps default", "output dtype", "notes"]
            return [_table(headers, rows, [10, 22, 26, 14, 14, 24])]

    class DocstringSectionDirective(Directive):
        """A module docstring, verbatim, or one of its sections, as prose (see
        ``docstring_as_markdown``): ``module [heading start]``.

        Sections are the docstring's own headings (a line underlined with dashes); the text runs
        to the next heading. Kernel pages use it so the variant lists are the code's own.
        """

        required_arguments = 1
        optional_arguments = 1
        final_argument_whitespace = True
        has_content = False

        def run(self):
            import ast
            import importlib.util

            # Read the docstring from the source, without importing the module: a kernel module
            # imports numba (or numba.cuda), which the docs build does not need.
            spec = importlib.util.find_spec(self.arguments[0])
            if spec is None or spec.origin is None:
                raise self.error(f"module {self.arguments[0]} not found")
            with open(spec.origin, encoding="utf-8") as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            title = self.arguments[1] if len(self.arguments) > 1 else None
            try:
                text = docstring_section(doc, title)
            except KeyError as exc:
                raise self.error(str(exc)) from None
            if title is None:  # a whole module docstring: aligned equation displays, verbatim
                block = nodes.literal_block(text, text, classes=["rmsref-derivation"])
                block["language"] = "none"
                return [block]
            # A section (variant lists, contracts) is prose: parsed as MyST, the pages' markup.
            from docutils.statemachine import StringList

            container = nodes.container(classes=["rmsref-docstring"])
            source = f"{self.arguments[0]} docstring"
            lines = StringList(docstring_as_markdown(text).splitlines(), source=source)
            self.state.nested_parse(lines, self.content_offset, container)
            return [container]

    class FigureIfMadeDirective(Directive):
        """An image that exists only once its data does (e.g. benchmark results): the image when
        the file is there, else a visible "pending" note with the content as its text."""

        required_arguments = 1
        has_content = True
        option_spec = {"alt": directives.unchanged}

        def run(self):
            env = self.state.document.settings.env
            src_dir = os.path.dirname(env.doc2path(env.docname))
            path = os.path.normpath(os.path.join(src_dir, self.arguments[0]))
            if os.path.isfile(path):
                alt = self.options.get("alt", os.path.basename(self.arguments[0]))
                return [nodes.image(uri=self.arguments[0], alt=alt)]
            text = "Pending: " + " ".join(self.content)
            return [nodes.note("", nodes.paragraph("", "", *_text_nodes(text)))]

    return {"rmsref-identities": IdentitiesDirective, "rmsref-conventions": ConventionsDirective,
            "rmsref-docstring": DocstringSectionDirective,
            "rmsref-figure-if-made": FigureIfMadeDirective}


def docstring_section(doc: str, title: str | None) -> str:
    """The whole docstring (title None) or the section whose heading starts with ``title``."""
    import textwrap

    lines = textwrap.dedent(doc).strip("\n").splitlines()
    if title is None:
        return "\n".join(lines)

    def is_heading(i: int) -> bool:
        return (i + 1 < len(lines) and lines[i].strip() != ""
                and set(lines[i + 1].strip()) == {"-"} and len(lines[i + 1].strip()) >= 3)

    starts = [i for i in range(len(lines)) if is_heading(i) and lines[i].strip().startswith(title)]
    if not starts:
        raise KeyError(f"no section {title!r} in the docstring")
    start = starts[0] + 2
    end = next((i for i in range(start, len(lines)) if is_heading(i)), len(lines))
    return "\n".join(lines[start:end]).strip("\n")


_TERM_ROW = re.compile(r"^ *\S(?:[^ ]| (?! ))*?  +(?P<desc>\S.*)$")


def docstring_as_markdown(text: str) -> str:
    """A docstring section, written for plain-text readers, as MyST Markdown for the pages.

    The kernel modules list their variants as rows ``term  description`` (continuation lines
    aligned under the description), grouped under a plain heading line: rows become a
    definition list, the heading line above them a bold paragraph. Bullets, ``literal`` spans and
    indented code read the same in Markdown; a reST ``::`` before a code block becomes ``:``.
    """
    lines = text.splitlines()
    out: list[str] = []

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    def row_at(i: int, prev_col: int | None = None):
        """(term, description, column) when line i starts a row (aligned with the next line, or
        with the previous row, prev_col), else None."""
        if i >= len(lines) or not lines[i].strip() or lines[i].lstrip()[:1] in ("*", "-", ">"):
            return None
        line, nxt = lines[i], lines[i + 1] if i + 1 < len(lines) else ""
        col = indent(nxt) if nxt.strip() else 0
        if col <= indent(line) or len(line) <= col or line[col - 1] != " " or line[col] == " ":
            m = _TERM_ROW.match(line)  # a row without continuation, aligned with the next row
            nxt_m = _TERM_ROW.match(nxt)
            col = len(line) - len(m.group("desc")) if m else -1
            if not (m and (col == prev_col
                           or nxt_m and col == len(nxt) - len(nxt_m.group("desc")))):
                return None
        term = line[:col].strip()
        if not term or len(term) > 24 or ". " in term:
            return None
        return term, line[col:], col

    i, prev_col = 0, None
    while i < len(lines):
        row = row_at(i, prev_col)
        prev_col = row[2] if row else None
        if (row is None and lines[i].strip() and not lines[i].startswith(" ")
                and row_at(i + 1) is not None):
            out += ["", f"**{lines[i].strip()}**", ""]
            i += 1
            continue
        if row is None:
            out.append(lines[i][:-1] if lines[i].endswith("::") else lines[i])
            i += 1
            continue
        term, first, col = row
        desc = [first]
        i += 1
        while i < len(lines) and lines[i].strip() and indent(lines[i]) >= col:
            desc.append(lines[i].strip())
            i += 1
        out += ["", term, ": " + desc[0]] + ["  " + d for d in desc[1:]]
        if i < len(lines) and lines[i].strip() and row_at(i, col) is None:
            out.append("")  # the rows end: a paragraph follows
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# Docstrings
# ------------------------------------------------------------------------------------------------

#: Docstrings whose reST does not parse yet, shown verbatim with a visible note until the source
#: is fixed (each entry says what is wrong and how to fix it; tests/test_docs.py lists them).
VERBATIM_DOCSTRINGS: dict[str, str] = {}

_stash: dict[tuple[str, str], list[str]] = {}
_BAR = re.compile(r"(?<!\\)\|")


def _escape_bars(line: str) -> str:
    """``|x|`` means an absolute value in rmsref's docstrings, never a reST substitution."""
    if line.lstrip().startswith((">>>", "...")):
        return line
    parts = line.split("``")
    for i in range(0, len(parts), 2):  # outside ``literal`` spans only
        parts[i] = _BAR.sub(r"\\|", parts[i])
    return "``".join(parts)


def _docstring_before(app, what, name, obj, options, lines) -> None:
    """Runs before numpydoc. Module docstrings of rmsref are plain-text essays (aligned equation
    displays, their own headings): they are stashed and shown verbatim afterwards, so numpydoc
    does not read their headings as sections. Docstrings listed in VERBATIM_DOCSTRINGS likewise.
    Elsewhere '|' is escaped (absolute values, not substitutions)."""
    if not name.startswith("rmsref"):
        return
    if what == "module" or name in VERBATIM_DOCSTRINGS:
        _stash[(what, name)] = list(lines)
        lines[:] = []
        return
    lines[:] = [_escape_bars(ln) for ln in lines]


def _docstring_after(app, what, name, obj, options, lines) -> None:
    """Runs after numpydoc: puts the stashed docstrings back as literal blocks."""
    text = _stash.pop((what, name), None)
    if text is None:
        return
    while text and not text[-1].strip():
        text.pop()
    out = []
    if name in VERBATIM_DOCSTRINGS:
        out += [".. note::", "", "   Shown verbatim until its reST is fixed: "
                + VERBATIM_DOCSTRINGS[name].replace("*", "\\*") + ".", ""]
    out += ["::", ""] + [("    " + ln) if ln.strip() else "" for ln in text] + [""]
    lines[:] = out


def setup(app):
    for name, cls in _directives().items():
        app.add_directive(name, cls)
    app.connect("doctree-read", _execute_blocks)
    app.connect("autodoc-process-docstring", _docstring_before, priority=100)
    app.connect("autodoc-process-docstring", _docstring_after, priority=900)
    app.add_css_file("rmsref.css")
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
