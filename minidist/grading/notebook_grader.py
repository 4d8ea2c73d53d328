"""Grading one notebook: the stored test of every grade_id, on the notebook's code.

The grader reads the notebook file and takes its code cells, minus the test cells (any cell
whose grade_id names a stored test, or that nbgrader metadata marks as a test): editing,
deleting or reordering test cells changes nothing. For each stored test it loads what the
test needs from those cells into fresh child processes (``engine/program.py``,
``engine/learner.py``) and judges their plain results in this process, which never runs the
learner's code: so a patched grading module, an IPython hook or a printed "passed" in the
notebook earns nothing.

Each test has a time limit of its own: a function that loops forever zeroes the tests that
call it, and no other. With ``execute=True`` the notebook is also run top to bottom in a
fresh kernel (``notebook_run.py``) and cells that raise are reported as notes; that run
does not affect the score.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import nbformat

from .engine.fresh import warm
from .engine.learner import Learner
from .engine.program import Program
from .engine.spec import GradedTest
from .kernel import TEST_TIME_LIMIT, evaluate
from .registry import exercise_of, stored_tests


@dataclass
class Report:
    """The outcome for one notebook: per-test results and notes about the run."""

    path: str
    exercise: str | None = None
    results: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # why the notebook could not be graded at all

    @property
    def earned(self) -> int:
        return sum(r["earned"] for r in self.results)

    @property
    def points(self) -> int:
        return sum(r["points"] for r in self.results)

    def as_dict(self) -> dict:
        return {"notebook": self.path, "exercise": self.exercise, "earned": self.earned,
                "points": self.points, "tests": self.results, "notes": self.notes,
                "error": self.error}


def grade_notebook(path, timeout: float = TEST_TIME_LIMIT, quick: bool = True,
                   execute: bool = False, cell_timeout: float = 120.0,
                   only: list[str] | None = None) -> Report:
    """Grade the notebook at ``path``; never raises for anything the notebook does.

    ``timeout``: seconds one test may take; ``only``: grade just these grade_ids (the
    others are left out of the report)."""
    report = Report(str(path))
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as e:  # unreadable, not JSON, not a notebook
        report.error = f"cannot read the notebook: {e}"
        return report
    report.exercise = exercise_of(path, nb.metadata)
    if report.exercise is None:
        report.error = ("not a graded minidist exercise: name it like 00_getting_started.ipynb "
                        "or keep its `minidist.exercise` metadata")
        return report
    tests = stored_tests(report.exercise)
    program = program_of(nb, tests)
    report.notes += program.notes
    if execute:
        from .notebook_run import run_for_notes

        report.notes += run_for_notes(nb, tests, path, cell_timeout, quick)
    warm()  # the fork server's start is no test's time
    for test in tests.values():
        if only is None or test.grade_id in only:
            report.results.append(grade_test(test, program, timeout, quick))
    return report


def program_of(nb, tests: dict[str, GradedTest]) -> Program:
    """The notebook's code as the grader runs it: its code cells but the test cells."""
    return Program.from_cells([(i + 1, c.source) for i, c in enumerate(nb.cells)
                               if c.cell_type == "code" and not is_test_cell(c, tests)])


def grade_test(test: GradedTest, program: Program, timeout: float, quick: bool) -> dict:
    missing = [name for name in test.needs if not program.defines(name)]
    if missing:
        return _zero(test, f"`{missing[0]}` is not defined in the notebook: write it (keep "
                           "its name) in the cell that asks for it")
    learner = Learner(test.needs, functools.partial(program.load, test.needs),
                      limit=timeout, quiet=True, quick=quick, fresh=True)
    return evaluate(test, learner)


def is_test_cell(cell, tests: dict[str, GradedTest]) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta.get("grade_id") in tests or bool(meta.get("grade") and not meta.get("solution"))


def _zero(test: GradedTest, feedback: str) -> dict:
    return {"grade_id": test.grade_id, "points": test.points, "part": test.part, "earned": 0,
            "passed": False, "feedback": feedback}
