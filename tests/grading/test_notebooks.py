"""The graded notebooks as a whole: full points for solutions/, zero for exercises/.

(nbval runs every notebook in lessons/ and solutions/ top to bottom: see pyproject.toml.)
"""

from __future__ import annotations

import pathlib

import pytest

from minidist.grading.notebook_grader import grade_notebook
from minidist.grading.registry import EXERCISES, stored_tests

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRESENT = [name for name in EXERCISES if (ROOT / "solutions" / f"{name}.ipynb").exists()]


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESENT)
def test_solution_gets_full_points(name):
    report = grade_notebook(ROOT / "solutions" / f"{name}.ipynb")
    failed = {r["grade_id"]: r["feedback"] for r in report.results if not r["passed"]}
    assert not failed and report.error is None, failed or report.error
    assert report.earned == report.points == sum(t.points for t in stored_tests(name).values())


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESENT)
def test_untouched_exercise_gets_zero_on_every_test(name):
    report = grade_notebook(ROOT / "exercises" / f"{name}.ipynb")
    assert [r["grade_id"] for r in report.results] == list(stored_tests(name))
    for r in report.results:
        assert r["earned"] == 0, r
        assert "is not written yet" in r["feedback"], r  # the stub, not a timeout or crash


def test_every_exercise_has_its_notebooks():
    # an exercise has its notebook under its own name; its lesson shares the number (lesson
    # 10 is the capstone, exercise 10 the bug zoo)
    for name in PRESENT:
        assert (ROOT / "exercises" / f"{name}.ipynb").exists(), f"exercises/{name}.ipynb"
        lessons = list((ROOT / "lessons").glob(f"{name[:2]}_*.ipynb"))
        assert lessons, f"no lessons/{name[:2]}_*.ipynb for exercise {name}"
