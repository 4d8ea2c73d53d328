"""What an exercise declares: its graded tests, in notebook order (``Exercise``), each one
a ``GradedTest``. An exercise's package exposes one as ``EXERCISE``; the registry finds it
there (``registry.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PARTS = ("core", "stretch", "practice")


@dataclass(frozen=True)
class GradedTest:
    """One graded test. ``needs`` names the learner's functions it takes from the notebook,
    in the order a test cell passes them (``check("test_x", x)``); by convention each name is
    also the ``grade_id`` of the solution cell that defines it. ``check(learner)`` runs in
    the grader's process and reaches those functions only through ``learner`` (child
    processes: ``learner.py``); it raises ``Mistake`` or returns a note. ``rules`` say what
    is out of reach while it runs (``sandbox.py``); ``part`` is "core", "stretch" or
    "practice": a check worth no points, for a step the notebook's text spells out (index
    arithmetic, a rule quoted from the paper), so that copying the text earns nothing."""

    grade_id: str
    points: int
    needs: tuple[str, ...]
    check: Callable[..., str | None]
    rules: tuple[str, ...] = ()
    part: str = "core"

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"{self.grade_id}: part {self.part!r} is none of {PARTS}")
        if (self.points == 0) != (self.part == "practice"):
            raise ValueError(f"{self.grade_id}: a practice check has 0 points, a graded test "
                             f"more (here part={self.part!r}, points={self.points})")


@dataclass(frozen=True)
class Exercise:
    """A graded notebook: ``name`` is its file name without ``.ipynb`` (``00_getting_started``),
    ``tests`` its graded tests in notebook order."""

    name: str
    tests: tuple[GradedTest, ...]

    def __post_init__(self) -> None:
        ids = [t.grade_id for t in self.tests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"exercise {self.name} declares a grade_id twice: {ids}")
