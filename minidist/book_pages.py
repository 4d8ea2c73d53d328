"""The web book's pages made from the README and the code (``minidist.book`` stages them).

The README's ``##`` sections become the guide's pages and its lesson map the home page, so
the book and the README cannot drift apart; the API page is ``minidist.apidoc``'s tables (the
same lists ``docs/api.md`` is made from) with autodoc's full docstrings after each.
"""

from __future__ import annotations

import importlib
import re

from .book import RAW, BookError, Notebook, rewrite_links

MAP_SECTION = "Lessons and exercises"
CONF = f'''\
# Written by minidist.book: the Sphinx configuration of the web book.
project = "minidist"
author = "the minidist authors"
html_title = "minidist"
extensions = ["myst_nb", "sphinx.ext.autodoc"]
exclude_patterns = ["{RAW}/**"]  # the notebooks as committed: downloads, not pages
nb_execution_mode = "off"  # the committed outputs of the lessons' real runs, as they are
# an interact widget saved its picture beside its view: show the picture (no kernel here)
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {{}}
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]  # a notebook may step from # to ### on purpose
autodoc_member_order = "bysource"
toc_object_entries = False  # the API page's contents list its namespaces, not 200 names
html_theme = "sphinx_book_theme"
html_theme_options = {{"use_download_button": False, "home_page_in_toc": True,
                      "show_navbar_depth": 1}}
html_copy_source = False
html_show_sourcelink = False
html_static_path = ["_static"]
html_css_files = ["book.css"]
# MathJax 2 from the book extra (jupyter-server-mathjax), so the site needs no CDN
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
# the fonts that package ships (Jupyter's own MathJax setting), no image fonts; MyST marks
# its pages' sections ignored and its math nodes processed (its setting for MathJax 3 and 4)
mathjax2_config = {{"HTML-CSS": {{"availableFonts": [], "imageFont": None,
                                 "webFont": "STIX-Web"}},
                   "tex2jax": {{"ignoreClass": "tex2jax_ignore|mathjax_ignore",
                               "processClass": "tex2jax_process|mathjax_process|math"}}}}
'''

# the API tables' first column holds whole signatures: fixed columns and wrapped code, so
# the meaning column stays on the page instead of past a horizontal scroll
CSS = """\
.api-table table { table-layout: fixed; width: 100%; }
.api-table th:nth-child(1) { width: 40%; }
.api-table th:nth-child(2) { width: 12%; }
.api-table td code, .api-table td code span { white-space: normal; overflow-wrap: anywhere; }
"""


def sections(markdown: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines before the first ``## `` heading, and each ``##`` section's title and lines
    (headings inside fenced code do not count)."""
    preamble: list[str] = []
    found: list[tuple[str, list[str]]] = []
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            found.append((line[3:].strip(), []))
        else:
            (found[-1][1] if found else preamble).append(line)
    return preamble, found


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower().replace("'", "")).strip("-")


def _promote(lines: list[str]) -> list[str]:
    """``### x`` -> ``## x`` outside fenced code: a section's subheadings on its own page."""
    out, fenced = [], False
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        out.append(line[1:] if not fenced and re.match(r"###+ ", line) else line)
    return out


def _table(lines: list[str]) -> tuple[int, int]:
    """The first markdown table's line range in ``lines``."""
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        raise BookError(f"the README's '{MAP_SECTION}' section has no lesson table")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def guide_pages(readme: str, architecture: str) -> dict[str, str]:
    """Page name -> MyST text: the guide's index (the README's opening), one page per
    ``##`` section, and docs/architecture.md."""
    preamble, found = sections(readme)
    names = [slug(title) for title, _ in found]
    body = [line for line in preamble if not line.startswith("# ")]
    pages = {"index": "\n".join(["# Guide", *body, "", "```{toctree}", ":maxdepth: 1", "",
                                 *names, "architecture", "```", ""])}
    for name, (title, lines) in zip(names, found):
        if title == MAP_SECTION:  # its table is the home page
            start, end = _table(lines)
            lines = [*lines[:start], "The lesson map is the [home page](README.md).",
                     *lines[end:]]
        text = "\n".join([f"# {title}", *_promote(lines), ""])
        pages[name] = rewrite_links(text, "", depth=1)
    pages["architecture"] = rewrite_links(architecture, "docs", depth=1)
    return pages


def home_page(readme: str, lessons: list[Notebook], exercises: list[Notebook]) -> str:
    """The lesson map as the home page, with each row's exercise linked, and the contents."""
    preamble, found = sections(readme)
    lines = next((body for title, body in found if title == MAP_SECTION), None)
    if lines is None:
        raise BookError(f"the README has no '## {MAP_SECTION}' section (the lesson map)")
    start, end = _table(lines)
    by_number = {nb.number: nb for nb in exercises}
    table = [_link_exercise(rewrite_links(row, "", depth=0), by_number)
             for row in lines[start:end]]
    tagline = next((line for line in preamble if line.startswith("**")), "")
    intro = rewrite_links(" ".join(line for line in lines[:start] if line.strip()), "", 0)
    return "\n".join([
        "# minidist: distributed training from send/recv up", "", tagline, "", intro, "",
        *table, "",
        "Each page shows a notebook as committed, with the outputs of a real run; its first "
        "line links to the notebook to download and run, and to the ones before and after. "
        "The [guide](guide/index.md) is the README's, page by page; the "
        "[API reference](api.md) lists every public name.", "",
        _toctree("Lessons", [nb.page.removesuffix(".ipynb") for nb in lessons]),
        _toctree("Exercises", [nb.page.removesuffix(".ipynb") for nb in exercises]),
        _toctree("Guide", ["guide/index"]), _toctree("Reference", ["api"])])


def _link_exercise(row: str, exercises: dict[str, Notebook]) -> str:
    """Prefix the exercise column of a lesson-map row with a link to its exercise page."""
    m = re.match(r"^\| (\d\d) \| (.*?) \| (.*) \| ([^|]*) \|$", row)
    if not m or m.group(1) not in exercises or "](" in m.group(3):
        return row
    nb = exercises[m.group(1)]
    return (f"| {m.group(1)} | {m.group(2)} | [exercise {nb.number}]({nb.page}): "
            f"{m.group(3)} | {m.group(4)} |")


def _toctree(caption: str, entries: list[str]) -> str:
    return "\n".join(["```{toctree}", ":hidden:", f":caption: {caption}", "", *entries,
                      "```", ""])


def api_page() -> str:
    """Each namespace's table from ``minidist.apidoc``, then every name's full docstring."""
    import minidist as md

    from . import apidoc

    by_name = ", ".join(f"`minidist.{s}`" for s in apidoc.STANDALONE)
    lines = ["# API reference", "",
             "Every public name: `md.NAME` (`import minidist as md`), then the subpackages "
             f"reached through `md`, then the modules imported by name ({by_name}). Each "
             "table is `minidist.apidoc`'s (the lists `docs/api.md` is generated from: "
             "signatures and each docstring's first sentence); each name's full docstring "
             "follows its table.", ""]
    spaces = [("md", md)] + [(f"md.{s}", getattr(md, s)) for s in apidoc.SUBPACKAGES]
    spaces += [(f"minidist.{s}", importlib.import_module(f"minidist.{s}"))
               for s in apidoc.STANDALONE]
    documented: dict[int, str] = {}
    for shown, module in spaces:
        heading, blank, *table = apidoc.section(f"`{shown}`", f"{shown}.", module)
        lines += [heading, blank, "```{container} api-table", *table, "```", ""]
        lines += _autodoc(shown, module, apidoc, documented)
    return "\n".join(lines)


def _autodoc(shown: str, module, apidoc, documented: dict[int, str]) -> list[str]:
    """An ``eval-rst`` block: autodoc's rendering of each public name's docstring; a name
    documented already (``md.pipeline.ScheduleGPipe`` is ``md.ScheduleGPipe``) says so, a
    constant shows its value (autodoc would show its type's docstring), and a module is
    skipped (each subpackage has its own table)."""
    directive = {"function": "autofunction", "class": "autoclass", "exception": "autoexception"}
    prefix = shown + "."
    dotted = "minidist." + prefix.removeprefix("md.").removeprefix("minidist.")
    out = ["```{eval-rst}"]
    for name in apidoc.public_names(module):
        obj = getattr(module, name)
        k = apidoc.kind(obj)
        if k == "module":
            continue
        if id(obj) in documented and k != "constant":
            out += [f"``{prefix}{name}`` is ``{documented[id(obj)]}``.", ""]
            continue
        documented[id(obj)] = prefix + name
        if k == "constant":
            value = apidoc._default(obj)
            out += [f".. py:data:: {dotted}{name}",
                    f"   :value: {value if len(value) <= 300 else type(obj).__name__}", ""]
            continue
        out.append(f".. {directive[k]}:: {dotted}{name}")
        out += ["   :members:", ""] if k in ("class", "exception") else [""]
    return out + ["```", ""]
