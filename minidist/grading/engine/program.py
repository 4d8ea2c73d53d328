"""The learner's code as the grader sees it: the notebook's code cells, read from the file.

The grader does not run the notebook to get the learner's functions, and does not take them
from a kernel the learner's code controls. It parses the code cells (IPython syntax such as
``%timeit`` is translated first; test cells are left out) and, for a test that needs
``ring_shift``, keeps only the top-level statements that define ``ring_shift`` and, in turn,
what those use (imports, helper functions, constants), in notebook order. Benchmarks, plots
and demo launches are left out: they define nothing a test needs. :meth:`Program.load` runs
the kept statements in a fresh namespace, in a child process (``isolation.py``), each
compiled as ``<cell N>`` so that tracebacks and feedback name the cell and line.
"""

from __future__ import annotations

import ast
import builtins
import linecache
import symtable
from dataclasses import dataclass, field


@dataclass
class Statement:
    cell: int  # 1-based position of its cell in the notebook
    node: ast.stmt
    binds: set[str]
    uses: set[str]
    star: bool = False  # ``from x import *``: binds names we cannot know


@dataclass
class Program:
    statements: list[Statement] = field(default_factory=list)
    sources: dict[int, str] = field(default_factory=dict)  # cell -> source as compiled
    notes: list[str] = field(default_factory=list)  # cells that could not be parsed

    @classmethod
    def from_cells(cls, cells: list[tuple[int, str]]) -> Program:
        """``cells``: (1-based cell number, source) of every code cell to consider."""
        program = cls()
        for number, source in cells:
            program.add_cell(number, source)
        return program

    def add_cell(self, number: int, source: str) -> None:
        text = _python_source(source)
        try:
            tree = ast.parse(text, filename=cell_filename(number))
        except SyntaxError as e:
            self.notes.append(f"cell {number} is not valid Python (line {e.lineno}: {e.msg}); "
                              "the grader skipped it")
            return
        self.sources[number] = text
        for node in tree.body:
            self.statements.append(_statement(number, node))

    def defines(self, name: str) -> bool:
        return any(name in s.binds for s in self.statements)

    def select(self, needs) -> list[Statement]:
        """The statements that define ``needs`` and what they use, in notebook order."""
        needed, chosen = set(needs), set()
        changed = True
        while changed:
            changed = False
            for i, s in enumerate(self.statements):
                if i not in chosen and (s.star or s.binds & needed):
                    chosen.add(i)
                    needed |= s.uses
                    changed = True
        return [s for i, s in enumerate(self.statements) if i in chosen]

    def load(self, needs) -> dict:
        """Run the statements ``needs`` takes in a fresh namespace; return the namespace.
        Meant for a child process: this runs the learner's code."""
        for number, text in self.sources.items():
            lines = text.splitlines(keepends=True)
            linecache.cache[cell_filename(number)] = (len(text), None, lines,
                                                      cell_filename(number))
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        for s in self.select(needs):
            module = ast.Module(body=[s.node], type_ignores=[])
            exec(compile(module, cell_filename(s.cell), "exec"), namespace)
        return namespace


def cell_filename(number: int) -> str:
    return f"<cell {number}>"


def _python_source(source: str) -> str:
    """IPython's syntax (magics, ``!shell``) as the plain Python IPython would run."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - IPython comes with the dev extra
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # leave it to ast.parse to report
        return source


def _statement(number: int, node: ast.stmt) -> Statement:
    star = isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
    if star:
        return Statement(number, node, set(), set(), star=True)
    try:
        table = symtable.symtable(ast.unparse(node), "<statement>", "exec")
    except SyntaxError:  # e.g. a top-level ``return``: compiles to nothing useful
        return Statement(number, node, set(), set())
    binds = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    uses = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    return Statement(number, node, binds, uses | _globals_used(table))


def _globals_used(table) -> set[str]:
    """Names the nested functions and classes of a statement read from the module."""
    found = set()
    for child in table.get_children():
        found |= {s.get_name() for s in child.get_symbols() if s.is_global() and
                  s.is_referenced()}
        found |= _globals_used(child)
    return found
