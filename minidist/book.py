"""``minidist book``: the course as a static web site (lessons, exercises, guide, API reference).

    pip install -e ".[book]"
    minidist book [--out DIR]          # default build/book; open DIR/index.html or serve DIR

Sphinx with myst-nb renders the committed notebooks as they are (no cell is executed), so the
pages show the outputs of the lessons' real runs; an interact widget shows the picture it
saved beside its widget view (``minidist.notebook.interact``). The README's guide becomes one
page per ``##`` section, its lesson map the home page, and the API page holds the tables of
``minidist.apidoc`` followed by autodoc's rendering of every name's full docstring. Every
notebook page links to its ``.ipynb`` (a download) and to the notebook before and after.
Why Sphinx rather than Jupyter Book 2: the README's "The web book" section.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LESSONS, EXERCISES = "lessons", "exercises"
RAW = "notebooks"  # the unmodified notebooks, offered as downloads (not pages)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SOLUTION_MARK = "### BEGIN SOLUTION"
# checkout files that are pages of the book -> their path in the book's source
PAGES = {"README.md": "index.md", "docs/architecture.md": "guide/architecture.md",
         "docs/api.md": "api.md"}
LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Notebook:
    kind: str  # LESSONS or EXERCISES
    path: Path  # in the checkout
    title: str

    @property
    def number(self) -> str:
        return self.path.name.split("_", 1)[0]

    @property
    def page(self) -> str:  # the page's path in the book's source, as links name it
        return f"{self.kind}/{self.path.name}"


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, default=None,
                   help="folder to write the site into (default: build/book in the checkout)")
    p.add_argument("--root", type=Path, default=None,
                   help="the minidist checkout to read (default: the one this package is in)")


def main(args) -> int:
    root = (args.root or Path(__file__).resolve().parent.parent).resolve()
    out = (args.out or root / "build" / "book").resolve()
    try:
        start = time.perf_counter()
        build(root, out)
    except (BookError, subprocess.CalledProcessError) as e:
        print(f"minidist book: {e}", file=sys.stderr)
        return 2
    print(f"minidist book: {out}/index.html ({time.perf_counter() - start:.0f} s); serve it with"
          f" python -m http.server -d {out} -b 127.0.0.1")
    return 0


class BookError(Exception):
    """The book cannot be built: the message says what is missing or wrong."""


def build(root: Path, out: Path) -> Path:
    """Write the site into ``out`` (replacing an earlier book there) and return ``out``."""
    for module in ("sphinx", "myst_nb", "sphinx_book_theme", "jupyter_server_mathjax"):
        try:
            __import__(module)
        except ImportError:
            raise BookError(f"{module} is missing: install the book extra, "
                            "pip install -e \".[book]\"") from None
    _check_out(out)
    with tempfile.TemporaryDirectory(prefix="minidist-book-") as tmp:
        src = Path(tmp) / "src"
        stage(root, src)
        shutil.rmtree(out, ignore_errors=True)
        # -j 2: reading the notebooks in parallel halves the build on a 2-core CI machine
        subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "2",
                        "-d", str(Path(tmp) / "doctrees"), str(src), str(out)], check=True)
    (out / ".nojekyll").touch()  # GitHub Pages: serve the _static/ and _images/ folders
    return out


def _check_out(out: Path) -> None:
    """Refuse to replace a folder that holds anything but an earlier book."""
    if out.exists() and any(out.iterdir()) and not (out / ".buildinfo").exists():
        raise BookError(f"{out} exists and is not a minidist book; name an empty or new --out")


def stage(root: Path, src: Path) -> None:
    """Write the book's Sphinx source tree into ``src``: notebooks, guide, API page, conf.py."""
    from . import book_pages as pages

    if not (root / LESSONS).is_dir() or not (root / "README.md").is_file():
        raise BookError(f"{root} is not a minidist checkout (no lessons/ or README.md); "
                        "name one with --root")
    lessons, exercises = notebooks(root, LESSONS), notebooks(root, EXERCISES)
    for series in (lessons, exercises):
        for i, nb in enumerate(series):
            before = series[i - 1] if i else None
            after = series[i + 1] if i + 1 < len(series) else None
            partner = _partner(nb, exercises if nb.kind == LESSONS else lessons)
            stage_notebook(nb, src, before, after, partner)
    readme = (root / "README.md").read_text()
    guide = pages.guide_pages(readme, (root / "docs" / "architecture.md").read_text())
    for name, text in guide.items():
        _write(src / "guide" / f"{name}.md", text)
    _write(src / "index.md", pages.home_page(readme, lessons, exercises))
    _write(src / "api.md", pages.api_page())
    _write(src / "conf.py", pages.CONF)
    _write(src / "_static" / "book.css", pages.CSS)
    import jupyter_server_mathjax  # its static folder is MathJax 2: the site needs no CDN

    shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static",
                    src / "_static" / "mathjax")


def notebooks(root: Path, kind: str) -> list[Notebook]:
    found = sorted((root / kind).glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise BookError(f"no notebooks in {root / kind}")
    return [Notebook(kind, p, _title(p)) for p in found]


def _title(path: Path) -> str:
    """The notebook's first ``# `` heading, else its file name."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def _partner(nb: Notebook, others: list[Notebook]) -> Notebook | None:
    return next((o for o in others if o.number == nb.number), None)


def stage_notebook(nb: Notebook, src: Path, before, after, partner) -> None:
    """The page's notebook: widget views dropped (their saved picture shows), links added."""
    text = nb.path.read_text()
    if nb.kind == EXERCISES and SOLUTION_MARK in text:
        raise BookError(f"{nb.path} holds a solution ({SOLUTION_MARK}); the book shows "
                        "exercises without solutions: regenerate exercises/")
    _write(src / RAW / nb.page, text)
    data = json.loads(text)
    data["metadata"].pop("widgets", None)  # the widget state would load a widget manager
    for cell in data["cells"]:
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_VIEW, None)
        if cell["cell_type"] == "markdown":
            cell["source"] = rewrite_links("".join(cell["source"]), nb.kind, depth=1)
    nav = _nav(nb, before, after, partner)
    data["cells"][:1] = _after_title(data["cells"][0], nav)
    data["cells"].append(_markdown(nav, "book-nav-end"))
    _write(src / nb.page, json.dumps(data, indent=1))


def _after_title(first: dict, nav: str) -> list[dict]:
    """The first cell with ``nav`` put after its ``# `` title line (before it if none)."""
    source = "".join(first["source"])
    title, _, rest = source.partition("\n")
    if first["cell_type"] != "markdown" or not title.startswith("# "):
        return [_markdown(nav, "book-nav"), first]
    return [_markdown(title, "book-title"), _markdown(nav, "book-nav"), {**first, "source": rest}]


def _nav(nb: Notebook, before, after, partner) -> str:
    """Links: the notebook before, this one's .ipynb, its lesson or exercise, the one after."""
    run = (f"{{download}}`Run it: download {nb.path.name} <../{RAW}/{nb.page}>` and open it "
           f"in JupyterLab (`jupyter lab {nb.page}`)")
    parts = [f"[← {before.title}]({before.path.name})" if before else None,
             run,
             f"[{partner.title}]"
             f"(../{partner.page})" if partner else None,
             f"[{after.title} →]({after.path.name})" if after else None]
    return " · ".join(p for p in parts if p)


def _markdown(text: str, cell_id: str) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": text}


def rewrite_links(text: str, where: str, depth: int) -> str:
    """Re-point the relative links of a file in checkout folder ``where`` to the book's pages,
    for a page ``depth`` folders below the book's root.

    A link to a lesson or an exercise keeps its path (the book keeps those folders); one to
    a guide page moves; one to anything else in the checkout (a module, a solution) would be
    broken on the site, so it becomes its path in code. Fenced code is left as it is."""
    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(lambda m: _relink(m, where, depth), line))
    return "".join(out)


def _relink(m: re.Match, where: str, depth: int) -> str:
    label, target = m.group(1), m.group(2)
    if "://" in target or target.startswith(("#", "mailto:")):
        return m.group(0)
    path, _, anchor = target.partition("#")
    parts: list[str] = [] if where in ("", ".") else where.split("/")
    for piece in path.split("/"):
        if piece == "..":
            parts = parts[:-1]
        elif piece not in ("", "."):
            parts.append(piece)
    resolved = "/".join(parts)
    page = PAGES.get(resolved) or (resolved if re.fullmatch(
        rf"({LESSONS}|{EXERCISES})/\d\d_\w+\.ipynb", resolved) else None)
    if page is None:
        return f"{label} (`{resolved}`)" if label and label != resolved else f"`{resolved}`"
    return f"[{label}]({'../' * depth}{page}{'#' + anchor if anchor else ''})"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
