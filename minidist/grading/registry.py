"""The authoritative tests of every graded notebook, by exercise and ``grade_id``.

Each exercise is a package of ``minidist.grading.exercises`` that declares its tests as
``EXERCISE`` (``engine.spec.Exercise``); the registry finds them by scanning that package,
so adding an exercise is adding its folder. A graded notebook's test cells call these same
tests, but the grader never runs a learner's test cell: it runs the test stored here for
each ``grade_id``, so editing, deleting or reordering test cells in a notebook changes
nothing.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil

from . import exercises
from .engine.spec import Exercise, GradedTest

__all__ = ["EXERCISES", "GradedTest", "exercise_of", "stored_tests"]


def discover() -> dict[str, Exercise]:
    """Every exercise declared in ``minidist.grading.exercises``, by name, in name order
    (the notebooks' order)."""
    found: dict[str, Exercise] = {}
    for info in pkgutil.iter_modules(exercises.__path__, exercises.__name__ + "."):
        declared = getattr(importlib.import_module(info.name), "EXERCISE", None)
        if not isinstance(declared, Exercise):
            continue
        if declared.name in found:
            raise ValueError(f"two packages declare the exercise {declared.name!r}; the "
                             f"second is {info.name}")
        found[declared.name] = declared
    return dict(sorted(found.items()))


EXERCISES = discover()  # exercise name (the notebook's file name without .ipynb) -> Exercise


def stored_tests(exercise: str) -> dict[str, GradedTest]:
    """The tests of ``exercise``, by grade_id, in notebook order."""
    if exercise not in EXERCISES:
        raise KeyError(f"no graded exercise named {exercise!r}; known: {sorted(EXERCISES)}")
    return {t.grade_id: t for t in EXERCISES[exercise].tests}


def exercise_of(path: str | pathlib.Path, metadata: dict | None = None) -> str | None:
    """Which exercise a notebook is: its ``minidist.exercise`` metadata, else its file name
    (``00_getting_started.ipynb``, also with a prefix or suffix such as ``ana_00_...``)."""
    declared = ((metadata or {}).get("minidist") or {}).get("exercise")
    if declared in EXERCISES:
        return declared
    stem = pathlib.Path(path).stem
    matches = [name for name in EXERCISES if name in stem]
    return matches[0] if len(matches) == 1 else None
