"""Grading one notebook: run it in a fresh kernel, then the stored test of every grade_id.

The plan: the learner's code cells in their order, minus their test cells (any cell whose
grade_id names a stored test, or that nbgrader metadata marks as a test), with each stored
test inserted right after the cell that defines what it needs (found by the solution cell's
grade_id, else by a ``def name(``), or at the end. Cells that raise are noted and grading
goes on, as nbgrader does. A cell that runs past the time limit, or a kernel that dies,
stops the run: every test not yet passed scores zero, with the reason.
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass, field

import nbformat

from .kernel import MIME
from .registry import GradedTest, exercise_of, stored_tests


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


def grade_notebook(path, cell_timeout: float = 120.0, quick: bool = True) -> Report:
    """Grade the notebook at ``path``; never raises for anything the notebook does."""
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
    steps = plan(nb, tests)
    _Run(report, tests, cell_timeout, quick).execute(
        steps, pathlib.Path(path).resolve().parent)
    return report


def is_test_cell(cell, tests: dict[str, GradedTest]) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta.get("grade_id") in tests or (meta.get("grade") and not meta.get("solution"))


def plan(nb, tests: dict[str, GradedTest]) -> list[tuple[str, object]]:
    """The execution plan: ("cell", (index, cell)) and ("test", GradedTest) steps, in order."""
    cells = [(i, c) for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and c.source.strip() and not is_test_cell(c, tests)]
    after: dict[int, list[GradedTest]] = {}
    for test in tests.values():
        positions = [_defining_cell(cells, name) for name in test.needs]
        pos = -1 if None in positions else max(positions)
        after.setdefault(pos, []).append(test)
    steps: list[tuple[str, object]] = []
    for k, item in enumerate(cells):
        steps.append(("cell", item))
        steps.extend(("test", t) for t in after.get(k, []))
    steps.extend(("test", t) for t in after.get(-1, []))
    return steps


def _defining_cell(cells, name: str) -> int | None:
    """Position (in ``cells``) of the cell with grade_id ``name``, else of the last cell
    that defines ``name``."""
    for k, (_, c) in enumerate(cells):
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == name:
            return k
    defines = re.compile(rf"^\s*(def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=", re.M)
    found = [k for k, (_, c) in enumerate(cells) if defines.search(c.source)]
    return found[-1] if found else None


def current_env_kernel():
    """A kernel manager that starts this Python (the one minidist is installed in), whatever
    kernel named "python3" the user's Jupyter setup may point at."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class _ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=_ThisPython())


class _Run:
    """One kernel, one pass over the plan."""

    def __init__(self, report: Report, tests, cell_timeout, quick):
        self.report, self.tests = report, tests
        self.cell_timeout, self.quick = cell_timeout, quick
        self.stopped: str | None = None

    def execute(self, steps, cwd: pathlib.Path) -> None:
        from nbclient import NotebookClient

        cells = [_as_code_cell(step, self.report.exercise) for step in steps]
        nb = nbformat.v4.new_notebook(cells=cells)
        client = NotebookClient(nb, km=current_env_kernel(), timeout=self.cell_timeout,
                                allow_errors=True, interrupt_on_timeout=False,
                                shutdown_kernel="immediate", record_timing=False,
                                extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                resources={"metadata": {"path": str(cwd)}})
        env = dict(os.environ, MINIDIST_QUICK="1") if self.quick else dict(os.environ)
        try:
            with client.setup_kernel(env=env, cleanup_kc=True):
                for index, (step, cell) in enumerate(zip(steps, cells)):
                    if self.stopped:
                        break
                    self._step(client, index, step, cell)
        except Exception as e:  # the kernel failed to start or to shut down
            self.stopped = self.stopped or f"the kernel failed: {type(e).__name__}: {e}"
        self._score_the_rest()

    def _step(self, client, index, step, cell) -> None:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        kind, payload = step
        where = _where(kind, payload)
        try:
            client.execute_cell(cell, index)
        except CellTimeoutError:
            self.stopped = (f"{where} ran longer than {self.cell_timeout:g} s and was stopped; "
                            "is something waiting forever?")
            return
        except DeadKernelError:
            self.stopped = f"the kernel died while running {where}"
            return
        if kind == "test":
            self.report.results.append(_result_of(payload, cell))
        else:
            error = _error_of(cell)
            if error:
                self.report.notes.append(f"{where} raised {error}")

    def _score_the_rest(self) -> None:
        done = {r["grade_id"] for r in self.report.results}
        for test in self.tests.values():
            if test.grade_id not in done:
                reason = self.stopped or "the test did not run"
                self.report.results.append(_zero(test, f"not run: {reason}"))
        order = list(self.tests)
        self.report.results.sort(key=lambda r: order.index(r["grade_id"]))
        if self.stopped:
            self.report.notes.append(f"stopped: {self.stopped}")


def _as_code_cell(step, exercise: str):
    kind, payload = step
    if kind == "cell":
        return nbformat.v4.new_code_cell(payload[1].source)
    return nbformat.v4.new_code_cell(
        "from minidist.grading.kernel import run_test as _minidist_run_test\n"
        f"_minidist_run_test({exercise!r}, {payload.grade_id!r}, globals())")


def _where(kind, payload) -> str:
    if kind == "test":
        return f"the test {payload.grade_id}"
    index, cell = payload
    first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")[:60]
    return f"cell {index + 1} (`{first.strip()}`)"


def _result_of(test: GradedTest, cell) -> dict:
    for out in cell.get("outputs", []):
        if MIME in out.get("data", {}):
            result = dict(out["data"][MIME])
            result["points"], result["grade_id"] = test.points, test.grade_id  # never trusted
            result["earned"] = test.points if result.get("passed") is True else 0
            return result
    error = _error_of(cell) or "no output"
    return _zero(test, f"the test could not run: {error}")


def _error_of(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            evalue = (out.get("evalue") or "").strip().splitlines()
            return f"{out.get('ename')}: {evalue[0] if evalue else ''}".strip()
    return None


def _zero(test: GradedTest, feedback: str) -> dict:
    return {"grade_id": test.grade_id, "points": test.points, "earned": 0, "passed": False,
            "feedback": feedback}
