"""The authoritative tests of every graded notebook, by exercise and ``grade_id``.

A graded notebook's test cells call these same tests, but the grader never runs a learner's
test cell: it runs the test stored here for each ``grade_id``, so editing, deleting or
reordering test cells in a notebook changes nothing.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

# exercise name (the notebook's file name without .ipynb) -> module holding its TESTS
EXERCISES = {
    "00_getting_started": "minidist.grading.checks.getting_started",
    "01_collectives": "minidist.grading.checks.collectives",
    "02_data_parallel": "minidist.grading.checks.data_parallel",
    "03_parameter_server": "minidist.grading.checks.param_server",
    "04_pipeline_parallel": "minidist.grading.checks.pipeline",
    "05_tensor_parallel": "minidist.grading.checks.tensor_parallel",
    "06_zero_sharding": "minidist.grading.checks.zero_sharding",
    "07_hybrid_parallelism": "minidist.grading.checks.hybrid",
    "08_mixed_precision": "minidist.grading.checks.mixed_precision",
    "09_communication_efficiency": "minidist.grading.checks.comm_efficiency",
    "10_bug_zoo": "minidist.grading.checks.bug_zoo",
}


@dataclass(frozen=True)
class GradedTest:
    """One graded test. ``needs`` names the learner's functions it takes from the notebook,
    in the order a test cell passes them (``check("test_x", x)``); by convention each name is
    also the ``grade_id`` of the solution cell that defines it. ``check(learner)`` runs in
    the grader's process and reaches those functions only through ``learner`` (child
    processes: ``learner.py``); it raises ``Mistake`` or returns a note. ``rules`` say what
    is out of reach while it runs (``sandbox.py``); ``part`` is "core" or "stretch"."""

    grade_id: str
    points: int
    needs: tuple[str, ...]
    check: Callable[..., str | None]
    rules: tuple[str, ...] = ()
    part: str = "core"


def stored_tests(exercise: str) -> dict[str, GradedTest]:
    """The tests of ``exercise``, by grade_id, in notebook order."""
    if exercise not in EXERCISES:
        raise KeyError(f"no graded exercise named {exercise!r}; known: {sorted(EXERCISES)}")
    module = importlib.import_module(EXERCISES[exercise])
    return {t.grade_id: t for t in module.TESTS}


def exercise_of(path: str | pathlib.Path, metadata: dict | None = None) -> str | None:
    """Which exercise a notebook is: its ``minidist.exercise`` metadata, else its file name
    (``00_getting_started.ipynb``, also with a prefix or suffix such as ``ana_00_...``)."""
    declared = ((metadata or {}).get("minidist") or {}).get("exercise")
    if declared in EXERCISES:
        return declared
    stem = pathlib.Path(path).stem
    matches = [name for name in EXERCISES if name in stem]
    return matches[0] if len(matches) == 1 else None
