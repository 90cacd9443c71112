"""Sphinx configuration of the rmsref documentation.

Build (offline; warnings are errors):  sphinx-build -W -b html docs docs/_build/html

Markdown pages are MyST; API pages come from the numpydoc docstrings (autodoc). Every ```python
block of a page is executed at build time, in order, in one namespace per page, and its printed
output is shown under it (docs/_ext/rmsref_docs.py); tests/test_docs.py runs the same blocks.
No intersphinx: nothing is fetched at build time. MathJax 3 is shipped under _static/mathjax (its
LICENSE is there), so the pages render their math with no network at read time either.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # the rmsref package of this checkout, installed or not
sys.path.insert(0, os.path.join(HERE, "_ext"))

import rmsref  # noqa: E402

project = "rmsref"
author = "rmsref developers"
copyright = "rmsref developers"  # noqa: A001
version = release = rmsref.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "rmsref_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "scripts", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# numpydoc: no autosummary tables of class members (they would need stub pages), no cross-linking
# of parameter types (that needs intersphinx to resolve "array_like" and friends).
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_class_members_toctree = False

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}

# The MathJax shipped with these pages (npm package mathjax 3.2.2: the es5/tex-chtml-full.js
# bundle, all TeX extensions in it, and its CHTML fonts, loaded relative to the script).
mathjax_path = "mathjax/tex-chtml-full.js"

html_theme = "pydata_sphinx_theme"
html_title = f"rmsref {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc", "sourcelink"],
    # The navbar lists the groups of index.md's toctree (short titles), never a "More" menu.
    "header_links_before_dropdown": 6,
    "navbar_align": "left",
}
# The home page has no section of its own to navigate: no left sidebar there (an empty "Section
# Navigation" otherwise). Group pages and the pages under them keep it.
html_sidebars = {"index": []}
html_last_updated_fmt = None
