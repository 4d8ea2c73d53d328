"""The web book (``minidist book``): built from the checkout, served on loopback only, read in
headless Chromium (Debian's ``chromium`` through Playwright).

Skipped when the book extra (``pip install -e ".[book]"``) or chromium is missing; CI has both.
``MINIDIST_BOOK_ROOT`` names another checkout to build (e.g. a ``git archive`` of HEAD while
the working tree's lessons are mid-edit); ``MINIDIST_BOOK_SHOTS`` a folder for the three
screenshots (default: the test's temporary folder).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import threading
import urllib.request
from collections import deque
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

for _module in ("sphinx", "myst_nb", "sphinx_book_theme", "jupyter_server_mathjax"):
    pytest.importorskip(_module, reason="the book extra: pip install -e '.[book]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="apt-get install -y chromium")]

import minidist as md  # noqa: E402
from minidist import apidoc  # noqa: E402
from minidist.book import build  # noqa: E402

ROOT = Path(os.environ.get("MINIDIST_BOOK_ROOT") or Path(__file__).resolve().parents[2])
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")
PAGE_JS = """() => ({
  hrefs: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  text: (document.querySelector('article') || document.body).innerText,
  images: [...document.querySelectorAll('article img')].map(
      i => ({src: i.src, complete: i.complete, width: i.naturalWidth})),
  downloads: [...document.querySelectorAll('a.download')].map(a => a.href),
  math: [...document.querySelectorAll('article .math.notranslate')].map(
      e => e.querySelector('.MathJax, .MathJax_Display') ? null : e.innerText.slice(0, 60)),
})"""
# MathJax 2 typesets after the load event: wait for the end of its start-up (at once if over)
MATH_DONE_JS = """() => new Promise(done => window.MathJax && MathJax.Hub
    ? MathJax.Hub.Register.StartupHook("End", done) : done())"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the crawl's hundreds of requests are not test output
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build(ROOT, tmp_path_factory.mktemp("book") / "site")


@pytest.fixture(scope="module")
def base(site):
    """The site on 127.0.0.1, a free port, for this module's tests only."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def context(browser, base):
    """A browser context that lets no request leave the local server (and records any)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.outside, ctx.failed = [], []

    def route(r):
        if r.request.url.startswith(base):
            r.continue_()
        else:
            ctx.outside.append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    ctx.on("response", lambda resp: resp.status >= 400 and ctx.failed.append(
        f"{resp.status} {resp.url}"))
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def crawl(context, base):
    """Every page reachable from the home page: url -> what PAGE_JS reads off it."""
    page, seen, queue = context.new_page(), {}, deque([base + "index.html"])
    while queue:
        url = queue.popleft()
        if url in seen:
            continue
        page.goto(url, wait_until="load")
        page.evaluate(MATH_DONE_JS)
        seen[url] = page.evaluate(PAGE_JS)
        for href in seen[url]["hrefs"]:
            target = urldefrag(href).url
            if target.startswith(base) and target.endswith(".html") and target not in seen:
                queue.append(target)
    page.close()
    return seen


def _notebooks(kind: str) -> list[Path]:
    return sorted((ROOT / kind).glob("[0-9][0-9]_*.ipynb"))


def _figures(nb: dict) -> int:
    """Pictures the notebook holds: image outputs (a widget's saved picture among them) and
    images in markdown cells."""
    outputs = sum(any(t in o.get("data", {}) for t in IMAGE_TYPES)
                  for c in nb["cells"] for o in c.get("outputs", []))
    marked = sum(len(re.findall(r"!\[|<img ", "".join(c["source"])))
                 for c in nb["cells"] if c["cell_type"] == "markdown")
    return outputs + marked


def _page(base: str, nb: Path) -> str:
    return f"{base}{nb.parent.name}/{nb.stem}.html"


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def test_every_notebook_and_guide_page_is_reachable(crawl, base):
    pages = set(crawl)
    for nb in _notebooks("lessons") + _notebooks("exercises"):
        assert _page(base, nb) in pages, f"{nb.name} is not reachable from the home page"
    assert base + "api.html" in pages
    guide = [u for u in pages if "/guide/" in u]
    assert len(guide) >= 10, f"the guide has {len(guide)} pages"
    assert not any("/solutions/" in u for u in pages), "a solution is part of the site"


def test_lesson_pages_show_their_figures(crawl, base):
    for nb in _notebooks("lessons"):
        # the notebook the site was built from: its download (the checkout may move on)
        info = crawl[_page(base, nb)]
        source = json.loads(_fetch(next(d for d in info["downloads"] if d.endswith(nb.name))))
        images = info["images"]
        assert len(images) == _figures(source) > 0, (nb.name, len(images), _figures(source))
        broken = [i["src"] for i in images if not i["complete"] or i["width"] == 0]
        assert not broken, f"{nb.name}: figures that did not load: {broken}"


def test_math_is_typeset(crawl):
    """MathJax (served from the site itself) replaced every formula's TeX."""
    pages_with_math = {u: info["math"] for u, info in crawl.items() if info["math"]}
    assert pages_with_math, "no page has a formula: the lessons have some"
    raw = {u: [m for m in found if m is not None] for u, found in pages_with_math.items()}
    assert not any(raw.values()), {u: m for u, m in raw.items() if m}


def test_no_internal_link_is_broken(crawl, base, context):
    missing, checked = [], set()
    for url, info in crawl.items():
        for href in info["hrefs"]:
            target, fragment = urldefrag(href)
            if not target.startswith(base) or (target, fragment) in checked:
                continue
            checked.add((target, fragment))
            if target.endswith(".html"):
                if target not in crawl:
                    missing.append(f"{url} -> {href}")
                elif fragment and fragment not in crawl[target]["ids"]:
                    missing.append(f"{url} -> {href} (no id {fragment!r})")
            elif target.rstrip("/") + "/" != base:
                try:
                    _fetch(target)
                except OSError as e:
                    missing.append(f"{url} -> {href} ({e})")
    assert not missing, "\n".join(missing[:20])
    assert not context.failed, context.failed[:20]
    assert not context.outside, f"requests that left the site: {sorted(set(context.outside))}"


def test_every_notebook_page_links_its_notebook_and_neighbours(crawl, base):
    for kind in ("lessons", "exercises"):
        series = _notebooks(kind)
        for i, nb in enumerate(series):
            info = crawl[_page(base, nb)]
            notebook = [d for d in info["downloads"] if urlparse(d).path.endswith("/" + nb.name)]
            assert notebook, f"{nb.name}: no link to its notebook"
            assert json.loads(_fetch(notebook[0]))["nbformat"] == 4
            links = {urldefrag(h).url for h in info["hrefs"]}
            for j in (i - 1, i + 1):
                if 0 <= j < len(series):
                    assert _page(base, series[j]) in links, f"{nb.name}: no link to {series[j]}"


def test_api_page_lists_every_public_name(crawl, base):
    text = crawl[base + "api.html"]["text"]
    names = [f"md.{n}" for n in md.__all__]
    names += [f"md.{s}.{n}" for s in apidoc.SUBPACKAGES
              for n in apidoc.public_names(getattr(md, s))]
    names += [f"minidist.{s}.{n}" for s in apidoc.STANDALONE
              for n in apidoc.public_names(importlib.import_module(f"minidist.{s}"))]
    absent = [n for n in names if not re.search(re.escape(n) + r"\b", text)]
    assert not absent, absent


def test_search_finds_ring_all_reduce(context, crawl, base):
    """Sphinx's search runs in the browser: type the words in the theme's search box."""
    expected = {u for u, info in crawl.items()
                if "ring all-reduce" in info["text"].lower() and "search.html" not in u}
    assert expected, "no page says 'ring all-reduce'"
    page = context.new_page()
    page.goto(base + "index.html")
    page.keyboard.press("Control+k")
    page.fill("#pst-search-dialog input[name=q]", "ring all-reduce")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"search\.html\?q=ring"))
    page.wait_for_function("document.querySelector('#search-results')?.innerText"
                           ".includes('Search finished')", timeout=60_000)
    found = {urldefrag(h).url for h in page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.href)")}
    page.close()
    assert expected <= found, sorted(expected - found)


def test_three_screenshots(context, base, tmp_path):
    """Home, a lesson with a figure, the API page: pictures for a person to look at."""
    folder = Path(os.environ.get("MINIDIST_BOOK_SHOTS") or tmp_path)
    page = context.new_page()
    for name, url in (("home", "index.html"), ("lesson", "lessons/02_data_parallel.html"),
                      ("api", "api.html")):
        page.goto(base + url, wait_until="load")
        if name == "lesson":
            page.locator("article img").first.scroll_into_view_if_needed()
        shot = folder / f"book_{name}.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
    page.close()
