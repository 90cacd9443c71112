"""The documentation runs: every ```python block of docs/ and README.md, and the Sphinx build.

Blocks of one page run in order in one namespace (docs/_ext/rmsref_docs.py, the same code the
Sphinx build uses to show their output). A block is skipped only when its first line is the
visible marker ``# not run: <reason>``. The Sphinx build (``-W``: warnings are errors) runs when
Sphinx and the docs extensions are installed (``pip install -e ".[docs]"``) and is skipped with
that reason otherwise.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
sys.path.insert(0, os.path.join(DOCS, "_ext"))
sys.path.insert(0, os.path.join(DOCS, "scripts"))

import rmsref_docs  # noqa: E402  (pure Python: no Sphinx needed to extract and run blocks)


def _pages() -> list[str]:
    pages = [os.path.join(ROOT, "README.md")]
    for path in sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)):
        if os.sep + "_build" + os.sep not in path:
            pages.append(path)
    return pages


PAGES = _pages()
PAGES_WITH_CODE = [p for p in PAGES if rmsref_docs.python_blocks(open(p, encoding="utf-8").read())]


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_rel)
def test_page_code_runs(page):
    """Every ```python block of the page runs, in order, without raising (asserts included)."""
    with open(page, encoding="utf-8") as f:
        blocks = rmsref_docs.python_blocks(f.read())
    outputs = rmsref_docs.run_page(blocks, _rel(page))
    ran = [b for b, out in zip(blocks, outputs, strict=True) if out is not None]
    assert ran, f"{_rel(page)}: every code block was skipped"


def test_pages_are_found_and_the_centrepiece_has_code():
    rels = {_rel(p) for p in PAGES_WITH_CODE}
    for page in ("README.md", "docs/derivation/rmsnorm.md", "docs/derivation/layernorm.md",
                 "docs/derivation/unitnorm.md", "docs/identities.md", "docs/semantics.md",
                 "docs/validating-your-kernel.md", "docs/tolerances.md", "docs/kernels.md"):
        assert page in rels, f"{page} has no executed python block"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_opt_outs_are_visible_and_give_a_reason(page):
    with open(page, encoding="utf-8") as f:
        blocks = rmsref_docs.fenced_blocks(f.read())
    for b in blocks:
        first = b.code.strip().splitlines()[0] if b.code.strip() else ""
        if re.match(r"#\s*not\s*run", first, re.I) and b.language in ("python", "py", "python3"):
            assert rmsref_docs.SKIP_MARKER.match(first), (
                f"{_rel(page)}:{b.line}: opt-out marker without a reason: {first!r}")
        # a python block with a misspelled language would silently escape execution
        assert b.language not in ("Python", "python3 ", "pycon"), f"{_rel(page)}:{b.line}"


def test_worked_example_numbers_are_printed_by_code_not_typed():
    """The centrepiece's numbers come out of a block that computes and asserts them."""
    page = os.path.join(DOCS, "derivation", "rmsnorm.md")
    with open(page, encoding="utf-8") as f:
        blocks = rmsref_docs.python_blocks(f.read())
    outputs = rmsref_docs.run_page(blocks, "rmsnorm.md")
    text = "\n".join(o for o in outputs if o)
    assert "[[ 0.5132 -0.1283 -0.1283]]" in text
    assert "dweight = [0.5774 0.     0.    ]" in text
    m = re.search(r"9\*sqrt\(3\)\*dx = \[([^\]]*)\]", text)
    assert m, text
    np.testing.assert_allclose([float(v) for v in m.group(1).split()], [8.0, -2.0, -2.0],
                               rtol=1e-14)


# ------------------------------------------------------------------------------------------------
# the extractor and runner themselves (they decide what "every block" means)
# ------------------------------------------------------------------------------------------------

SAMPLE = '''\
# Title

```python
a = 1
```

````markdown
```python
this is an example of markdown, not code to run
```
````

:::{note}
```python
b = a + 1
```
:::

~~~python
c = b + 1
~~~

```{code-block} python
not_run_by_design = "a directive block is not a ```python fence"
```

```python
# not run: needs a GPU
raise SystemExit
```

```bash
echo not python
```
'''


def test_extractor_finds_exactly_the_python_fences():
    blocks = rmsref_docs.python_blocks(SAMPLE)
    assert [b.code for b in blocks] == [
        "a = 1", "b = a + 1", "c = b + 1", "# not run: needs a GPU\nraise SystemExit"]
    assert [b.line for b in blocks] == [4, 15, 20, 28]
    assert [b.skip_reason for b in blocks] == [None, None, None, "needs a GPU"]


def test_runner_shares_one_namespace_and_skips_marked_blocks():
    blocks = rmsref_docs.python_blocks(SAMPLE + "\n```python\nprint(a, b, c)\n```\n")
    outputs = rmsref_docs.run_page(blocks, "sample.md")
    assert outputs == ["", "", "", None, "1 2 3\n"]


def test_runner_names_the_page_and_line_of_a_failing_block():
    blocks = rmsref_docs.python_blocks("text\n\n```python\nx = 1\nassert x == 2\n```\n")
    with pytest.raises(rmsref_docs.BlockError, match=r"broken\.md, code block at line 4 raised "
                                                       r"AssertionError"):
        rmsref_docs.run_page(blocks, "broken.md")


def test_marker_needs_a_reason():
    blocks = rmsref_docs.python_blocks("```python\n# not run:\nx = 1\n```\n")
    assert blocks[0].skip_reason is None  # no reason: the block runs


def test_docstring_section_extraction():
    doc = "Intro.\n\nVariants\n--------\nv1 first\nv2 second\n\nNotes\n-----\nmore\n"
    assert rmsref_docs.docstring_section(doc, "Variants") == "v1 first\nv2 second"
    assert rmsref_docs.docstring_section(doc, "Notes") == "more"
    with pytest.raises(KeyError):
        rmsref_docs.docstring_section(doc, "Missing")


def test_kernel_docstring_sections_used_by_the_docs_exist():
    """kernels.md shows these sections of the kernel modules' docstrings (read without import)."""
    import ast

    with open(os.path.join(DOCS, "kernels.md"), encoding="utf-8") as f:
        wanted = re.findall(r"```\{rmsref-docstring\} (\S+) (.+)", f.read())
    assert wanted
    for module, title in wanted:
        path = os.path.join(ROOT, *module.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read()))
        assert rmsref_docs.docstring_section(doc, title.strip())


def test_variant_rows_become_a_definition_list():
    """Kernel docstrings' ``term  description`` rows render as a definition list, not as text
    with raw markup; a heading line above them becomes bold, bullets and ``::`` code stay."""
    text = ("RMSNorm forward\n"
            "    v1  first variant, which takes\n"
            "        two lines\n"
            "    v2  as v1, but faster\n"
            "backward ``block`` one line\n"
            "                   and its continuation\n"
            "Plain prose after the rows.\n"
            "- a bullet with ``code``\n"
            "Forcing::\n")
    md = rmsref_docs.docstring_as_markdown(text).splitlines()
    assert "**RMSNorm forward**" in md
    i = md.index("v1")
    assert md[i + 1:i + 3] == [": first variant, which takes", "  two lines"]
    j = md.index("backward ``block``")
    assert md[j + 1:j + 3] == [": one line", "  and its continuation"]
    assert md[md.index("v2") + 1] == ": as v1, but faster"
    assert "Plain prose after the rows." in md and "- a bullet with ``code``" in md
    assert md[-1] == "Forcing:"


def test_verbatim_docstring_list_names_real_objects():
    """Docstrings shown verbatim (their reST does not parse yet) must exist, so the list is
    pruned when they are renamed; see docs/_ext/rmsref_docs.py for what each needs."""
    for name in rmsref_docs.VERBATIM_DOCSTRINGS:
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name


# ------------------------------------------------------------------------------------------------
# API pages and figures
# ------------------------------------------------------------------------------------------------


def test_every_public_name_has_an_api_entry():
    import rmsref

    text = ""
    for path in glob.glob(os.path.join(DOCS, "api", "*.md")):
        with open(path, encoding="utf-8") as f:
            text += f.read()
    documented = set(re.findall(r"\.\. auto(?:function|class|module):: ([\w.]+)", text))
    missing = []
    for name in rmsref.__all__:
        obj = getattr(rmsref, name)
        if isinstance(obj, type(rmsref)):  # a module: documented with automodule
            ok = obj.__name__ in documented
        else:
            ok = name in documented or f"rmsref.{name}" in documented or any(
                d.startswith("rmsref.") and d == getattr(obj, "__module__", "") for d in documented)
        if not ok and name not in ("bfloat16",):  # bfloat16 is ml_dtypes' type, re-exported
            missing.append(name)
    assert not missing, f"public names without an API entry in docs/api/: {missing}"


def test_every_image_referenced_exists():
    refs = []
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for ref in re.findall(r"```\{image\} (\S+)", text) + re.findall(r"!\[[^\]]*\]\(([^)]+)\)",
                                                                          text):
            refs.append(os.path.normpath(os.path.join(os.path.dirname(page), ref)))
    assert refs
    for path in refs:
        assert os.path.isfile(path), f"missing {_rel(path)}: python docs/scripts/make_figures.py"


def test_figure_data_is_what_the_figures_claim():
    make_figures = importlib.import_module("make_figures")
    d = make_figures.jacobian_data(n=8)
    n = d["x"].size
    formula = d["w"][:, None] * d["rstd"] * (np.eye(n) - np.outer(d["xhat"], d["xhat"]) / n)
    np.testing.assert_allclose(d["jac"], formula, atol=1e-14)
    eig0 = d["eig"][0.0]
    assert abs(eig0[0]) < 1e-13 and np.allclose(eig0[1:], 1.0)
    e = make_figures.error_vs_n_data(exponents=(4, 10), elements=1 << 14)
    for i in range(2):
        assert e["sequential"][i] <= e["bound_prob"][i]
        assert e["pairwise"][i] <= e["bound_prob_pairwise"][i]
    assert e["sequential"][1] > e["sequential"][0]  # the sequential error grows with N


# ------------------------------------------------------------------------------------------------
# the Sphinx build
# ------------------------------------------------------------------------------------------------

_SPHINX_NEEDS = ("sphinx", "myst_parser", "pydata_sphinx_theme", "numpydoc")


def build_docs(out) -> str:
    """The built HTML pages: ``RMSREF_DOCS_HTML`` when set (CI builds the docs once, with
    ``sphinx-build -W``, and hands the pages to the tests), else built into ``out`` here with
    warnings as errors. Returns the HTML directory."""
    given = os.environ.get("RMSREF_DOCS_HTML")
    if given:
        assert os.path.isfile(os.path.join(given, "index.html")), (
            f"RMSREF_DOCS_HTML={given!r} holds no built pages (sphinx-build -W -b html docs DIR)")
        return given
    for mod in _SPHINX_NEEDS:
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed: pip install -e '.[docs]' to build the docs")
    out = str(out)
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           "-d", os.path.join(out, "doctrees"), DOCS, os.path.join(out, "html")]
    # Every block already ran (test_page_code_runs); the build executes two cheap pages, enough
    # to check that executed output is placed under its block, and halves the build time.
    env = dict(os.environ, RMSREF_DOCS_EXECUTE="index,derivation/rmsnorm")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    return os.path.join(out, "html")


@pytest.mark.slow
def test_sphinx_build_has_no_warnings(tmp_path):
    html_dir = build_docs(tmp_path)
    page = os.path.join(html_dir, "derivation", "rmsnorm.html")
    assert os.path.isfile(page)
    with open(page, encoding="utf-8") as f:
        html = f.read()
    # the worked example's output, printed by the executed block, sits in the page
    assert "9*sqrt(3)*dx = [ 8. -2. -2.]" in html.replace("&quot;", '"'), "executed output missing"


def test_bandwidth_figure_reads_the_cpu_benchmark_table(tmp_path):
    """bench_rows parses bench/cpu.py's markdown table (ratios and refusals left out)."""
    make_figures = importlib.import_module("make_figures")
    table = tmp_path / "cpu.md"
    table.write_text(
        "| case | candidate | time (ms) | GB/s | x copy | vs oracle | torch / ours |\n"
        "|---|---|---:|---:|---:|---:|---:|\n"
        "| float32:8192x4096 | parallel copy (prange) | 20.00 | 13.4 | 1.00 | | |\n"
        "| float32:8192x4096 | numba fwd v2 (default) | 22.00 | 12.2 | 1.10 | 10.0x | |\n"
        "| float32:8192x4096 | RMSNorm/LayerNorm time ratio (fwd) | | | | | **0.85** |\n"
        "| bfloat16:8192x4096 | numba fwd v1 | REFUSED: wrong | | | | |\n",
        encoding="utf-8")
    rows = make_figures.bench_rows(str(table))
    assert [(r["dtype"], r["n"], r["kernel"], r["gbps"]) for r in rows] == [
        ("float32", 4096, "parallel copy (prange)", 13.4),
        ("float32", 4096, "numba fwd v2 (default)", 12.2)]
    assert make_figures.bench_rows(str(tmp_path / "absent.md")) == []
