"""Typical wrong answers, bypasses and grade-faking cells, as notebooks the grader must see
through. Each :class:`Wrong` is a solved (or untouched) notebook with some cells replaced or
added; ``expect`` names the tests it must fail and a piece of the feedback each must give.
Every other test keeps the points of the notebook it started from: full on a solution
(so a wrong answer earns partial points), zero on the stubs."""

from __future__ import annotations

import copy
import pathlib
from dataclasses import dataclass, field

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Wrong:
    name: str
    exercise: str
    cells: dict[str, str] = field(default_factory=dict)  # solution cell grade_id -> source
    expect: dict[str, str] = field(default_factory=dict)  # test grade_id -> feedback piece
    base: str = "solutions"  # or "exercises": the untouched stubs
    extra: tuple[str, ...] = ()  # cells added right after the setup cell
    passes: bool = False  # a right answer in another form: full points expected
    timeout: float = 30.0  # seconds each test may take


def notebook(wrong: Wrong, root: pathlib.Path = ROOT):
    """The notebook of a wrong answer."""
    nb = nbformat.read(str(root / wrong.base / f"{wrong.exercise}.ipynb"), as_version=4)
    nb = copy.deepcopy(nb)
    missing = set(wrong.cells)
    for i, cell in enumerate(list(nb.cells)):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in wrong.cells:
            cell.source = wrong.cells[gid]
            missing.discard(gid)
        if gid == "setup":
            at = i + 1
    assert not missing, f"{wrong.name}: no cells {missing}"
    nb.cells[at:at] = [nbformat.v4.new_code_cell(src) for src in wrong.extra]
    return nb


def all_wrong() -> list[Wrong]:
    from . import (
        bypasses,
        contracts,
        exact_counts,
        exercise_00,
        exercise_01,
        exercise_02,
        exercise_02_buckets,
        exercise_03,
        exercise_04,
        exercise_05,
        exercise_06,
        exercise_07,
        exercise_08,
        exercise_09,
        exercise_10,
        isolation_cheats,
    )

    return [*exercise_00.WRONG, *exercise_01.WRONG, *exercise_02.WRONG,
            *exercise_02_buckets.WRONG, *exercise_03.WRONG, *exercise_04.WRONG,
            *exercise_05.WRONG, *exercise_06.WRONG, *exercise_07.WRONG, *exercise_08.WRONG,
            *exercise_09.WRONG, *exercise_10.WRONG, *bypasses.WRONG,
            *exact_counts.WRONG, *contracts.WRONG, *isolation_cheats.WRONG]
