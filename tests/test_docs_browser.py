"""The built documentation in a real browser: headless Chromium, with the network off.

What a reader sees is checked, not assumed:

- the math is typeset: after the page's scripts ran, MathJax's output elements (``mjx-container``)
  are in the page, one per math span Sphinx wrote, no TeX error (``mjx-merror``), and no raw
  ``\\(``, ``\\[`` or ``$$`` left in the text (code blocks aside);
- nothing is requested off the machine: Chromium's own network log of the page load holds no
  http(s) request, and no built page or stylesheet points a script, style, image or frame at one.
- the home page has no empty "Section Navigation" sidebar; group pages have one.

The pages come from ``RMSREF_DOCS_HTML`` when set (CI builds the docs once, with ``-W``, and
points the tests at them), else they are built here (slow: every code block runs). Chromium is
Debian's ``chromium`` (``apt-get install chromium``); without it the tests skip with that reason.
``RMSREF_DOCS_SCREENSHOTS=DIR`` also writes 1400 px and 800 px screenshots of each page, to look at.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess

import pytest

from .test_docs import build_docs

pytestmark = pytest.mark.slow

#: The pages whose math must render: the derivation, the tolerance model, the home page.
MATH_PAGES = ("derivation/rmsnorm.html", "tolerances.html", "index.html")
#: Every request a page makes must stay on the machine (the math pages are checked with their math).
OFFLINE_PAGES = MATH_PAGES + ("kernels.html", "validating-your-kernel.html", "api/rmsnorm.html")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium: apt-get install chromium (CI installs it) to run the browser tests")


@pytest.fixture(scope="module")
def html_dir(tmp_path_factory) -> str:
    return build_docs(tmp_path_factory.mktemp("docs"))


def _browse(html: str, tmp: str, *, extra: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """Load ``html`` (a file path) in headless Chromium with the network unreachable, let its
    scripts run (20 s of virtual time), and return the DOM and every http(s) URL the page asked
    for (from Chromium's network log; Chromium's own background requests left out)."""
    netlog = os.path.join(tmp, "net.json")
    cmd = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={os.path.join(tmp, 'profile')}",
        # the network is off: a proxy that refuses, and no name resolves
        "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--log-net-log={netlog}", "--virtual-time-budget=20000", *extra,
        "--dump-dom", "file://" + os.path.abspath(html),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"chromium failed on {html}:\n{proc.stderr[-2000:]}"
    return proc.stdout, _page_requests(netlog)


def _page_requests(netlog: str) -> list[str]:
    """http(s) URLs that a file:// page started loading, from a Chromium net log."""
    with open(netlog, encoding="utf-8") as f:
        text = f.read()
    try:
        log = json.loads(text)
    except json.JSONDecodeError:  # a log cut short when the browser exits: close it
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log.get("events", []):
        params = event.get("params", {})
        if event["type"] == start_job and params.get("network_isolation_key", "").startswith(
                "file://") and re.match(r"https?:", params.get("url", "")):
            urls.append(params["url"])
    return urls


def _text_outside_code(dom: str) -> str:
    """The page's text, without scripts, styles, code blocks and inline code."""
    dom = re.sub(r"(?is)<(script|style|pre|code|mjx-assistive-mml)\b.*?</\1>", " ", dom)
    return re.sub(r"(?s)<[^>]+>", " ", dom)


# ------------------------------------------------------------------------------------------------
# the checks are themselves checked: each must fail on a page that is wrong
# ------------------------------------------------------------------------------------------------


def test_the_network_check_sees_a_page_that_reaches_out(tmp_path):
    page = tmp_path / "reaches_out.html"
    page.write_text('<html><body><img src="https://example.com/x.png">'
                    '<script src="http://cdn.example.org/a.js"></script></body></html>')
    _, requests = _browse(str(page), str(tmp_path))
    assert set(requests) == {"https://example.com/x.png", "http://cdn.example.org/a.js"}


def test_the_math_check_sees_untypeset_math(tmp_path):
    page = tmp_path / "raw.html"
    page.write_text(r'<html><body><p><span class="math">\(x^2\)</span></p></body></html>')
    dom, _ = _browse(str(page), str(tmp_path))
    assert "<mjx-container" not in dom and r"\(" in _text_outside_code(dom)


# ------------------------------------------------------------------------------------------------
# the documentation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", MATH_PAGES)
def test_math_is_typeset_offline(html_dir, page, tmp_path):
    path = os.path.join(html_dir, page)
    with open(path, encoding="utf-8") as f:
        spans = len(re.findall(r'class="math notranslate nohighlight"', f.read()))
    assert spans >= 1, f"{page} has no math to typeset"
    dom, requests = _browse(path, str(tmp_path))
    assert not requests, f"{page} asked the network for {requests}"
    typeset = dom.count("<mjx-container")
    assert typeset >= spans, f"{page}: {typeset} of {spans} math spans typeset by MathJax"
    assert "<mjx-merror" not in dom, f"{page}: MathJax reports a TeX error"
    text = _text_outside_code(dom)
    for raw in (r"\(", r"\[", "$$"):
        assert raw not in text, f"{page}: raw {raw} left in the text: ...{_around(text, raw)}..."


@pytest.mark.parametrize("page", [p for p in OFFLINE_PAGES if p not in MATH_PAGES])
def test_pages_request_nothing_off_the_machine(html_dir, page, tmp_path):
    _, requests = _browse(os.path.join(html_dir, page), str(tmp_path))
    assert not requests, f"{page} asked the network for {requests}"


_FETCHING_TAG = re.compile(
    r"<(?:script|img|iframe|source|video|audio|embed)\b[^>]*\bsrc=\"(https?:)?//"
    r"|<link\b(?=[^>]*\brel=\"(?:stylesheet|preload|icon|modulepreload|prefetch)\")"
    r"[^>]*\bhref=\"(https?:)?//", re.I)


def test_no_built_page_or_stylesheet_points_off_the_machine(html_dir):
    pages = glob.glob(os.path.join(html_dir, "**", "*.html"), recursive=True)
    assert len(pages) > 10
    bad = []
    for path in pages:
        with open(path, encoding="utf-8") as f:
            m = _FETCHING_TAG.search(f.read())
        if m:
            bad.append(f"{os.path.relpath(path, html_dir)}: {m.group(0)[:120]}")
    for path in glob.glob(os.path.join(html_dir, "_static", "**", "*.css"), recursive=True):
        with open(path, encoding="utf-8", errors="replace") as f:
            m = re.search(r"(?:url\(\s*['\"]?|@import\s+['\"])(?:https?:)?//", f.read())
        if m:
            bad.append(f"{os.path.relpath(path, html_dir)}: {m.group(0)}")
    assert not bad, "\n".join(bad)


def test_mathjax_is_shipped_with_its_licence(html_dir):
    mathjax = os.path.join(html_dir, "_static", "mathjax")
    assert os.path.isfile(os.path.join(mathjax, "tex-chtml-full.js"))
    assert os.path.isfile(os.path.join(mathjax, "LICENSE"))
    fonts = glob.glob(os.path.join(mathjax, "output", "chtml", "fonts", "woff-v2", "*.woff"))
    assert len(fonts) >= 20


def test_sidebar_only_where_there_is_something_to_navigate(html_dir, tmp_path):
    home, _ = _browse(os.path.join(html_dir, "index.html"), str(tmp_path))
    assert "Section Navigation" not in _text_outside_code(home)
    group, _ = _browse(os.path.join(html_dir, "kernels.html"), str(tmp_path))
    nav = re.search(r'(?s)<nav class="bd-docs-nav[^>]*>(.*?)</nav>', group)
    assert nav and "Validating your kernel" in nav.group(1) and "Tolerances" in nav.group(1)


def test_screenshots_when_asked(request, tmp_path):
    """Screenshots at 1400 px and 800 px, for a person to look at (RMSREF_DOCS_SCREENSHOTS)."""
    out = os.environ.get("RMSREF_DOCS_SCREENSHOTS")
    if not out:
        pytest.skip("set RMSREF_DOCS_SCREENSHOTS=DIR to write screenshots of the pages")
    html_dir = request.getfixturevalue("html_dir")
    os.makedirs(out, exist_ok=True)
    for page in OFFLINE_PAGES:
        for width, height in ((1400, 2000), (800, 1600)):
            png = os.path.join(out, f"{page.replace('/', '_')[:-5]}-{width}.png")
            _browse(os.path.join(html_dir, page), str(tmp_path),
                    extra=(f"--window-size={width},{height}", "--hide-scrollbars",
                           f"--screenshot={png}"))
            assert os.path.getsize(png) > 10_000, png


def _around(text: str, needle: str, width: int = 60) -> str:
    i = text.find(needle)
    return " ".join(text[max(0, i - width):i + width].split())
