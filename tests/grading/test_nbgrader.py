"""Real nbgrader grades the exercises as a course would (issue 27): ``solutions/`` is the
course's source, ``nbgrader generate_assignment`` releases it, and ``nbgrader autograde``
runs two submissions in a kernel, a worked solution and the stub ``exercises/`` holds
(``python -m minidist.grading.build``). Read back from nbgrader's gradebook: the solution
earns every point of every stored test, the stub none, and nbgrader knows exactly the
stored tests with their points (the nbgrader metadata ``build.py`` checks).

Exercises 00 and 03 (which has a 0-point practice check) by default (about 2 min idle);
``MINIDIST_NBGRADER_ALL=1`` grades all eleven (about 5 min). Skipped where nbgrader is not
installed (it is in the dev extra)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from minidist.grading.registry import EXERCISES, stored_tests

pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[dev]'")
from nbgrader.api import Gradebook  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASSIGNMENT = "ps1"
STUDENTS = {"solution": "solutions", "stub": "exercises"}  # student id: the folder handed in
NAMES = list(EXERCISES) if os.environ.get("MINIDIST_NBGRADER_ALL", "") not in ("", "0") \
    else ["00_getting_started", "03_parameter_server"]  # 03: a 0-point practice check too
TIMEOUT = 600.0  # one nbgrader command, every notebook


def _nbgrader(course: pathlib.Path, *args: str) -> None:
    env = {**os.environ, "MINIDIST_QUICK": "1"}  # the notebooks' sweeps shrink, as in CI
    out = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force",
                          f"--CourseDirectory.root={course}",
                          "--ExecutePreprocessor.timeout=300"],
                         cwd=course, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, f"nbgrader {' '.join(args)}:\n{out.stdout}\n{out.stderr}"


@pytest.fixture(scope="module")
def grades(tmp_path_factory) -> dict[str, dict[str, dict[str, tuple[float, float]]]]:
    """{student: {notebook: {grade_id: (score, max score)}}} from nbgrader's gradebook."""
    course = tmp_path_factory.mktemp("course")
    for folder, student in [("source", None), *[("submitted", s) for s in STUDENTS]]:
        where = course / folder / (student or "") / ASSIGNMENT
        where.mkdir(parents=True)
        for name in NAMES:
            shutil.copy(ROOT / STUDENTS.get(student, "solutions") / f"{name}.ipynb", where)
    _nbgrader(course, "generate_assignment", ASSIGNMENT)
    assert sorted(p.stem for p in (course / "release" / ASSIGNMENT).glob("*.ipynb")) == NAMES
    _nbgrader(course, "autograde", ASSIGNMENT)
    out: dict = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in STUDENTS:
            for nb in gb.find_submission(ASSIGNMENT, student).notebooks:
                out.setdefault(student, {})[nb.name] = {
                    g.name: (g.score, g.max_score) for g in nb.grades}
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_earns_full_marks(grades, name):
    tests = stored_tests(name)
    assert grades["solution"][name] == {gid: (t.points, t.points) for gid, t in tests.items()}


@pytest.mark.parametrize("name", NAMES)
def test_the_stub_earns_nothing(grades, name):
    tests = stored_tests(name)
    assert grades["stub"][name] == {gid: (0, t.points) for gid, t in tests.items()}
