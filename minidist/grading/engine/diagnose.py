"""Naming a wrong answer by the known mistake that produces it.

An exercise declares its known mistakes as data: rows of ``(variant, hint)``, where the
variant says how to replay the mistake on the grader's own reference (a flag of the
reference function, a weighting, a wrong rule) and the hint is what to tell a learner whose
answer is exactly what that mistake gives. :func:`diagnose` replays the rows in order and
returns the first hint whose replay matches; adding a mistake is adding a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .compare import FLOAT64, Tolerance, close

Hint = str | Callable[[], str]  # a callable hint is worded only once its row matches


def _replayed(variant):
    return variant() if callable(variant) else variant


def diagnose(known_mistakes: Iterable[tuple[Any, Hint]], got,
             replay: Callable[[Any], Any] = _replayed, *, tol: Tolerance = FLOAT64,
             same: Callable[[Any, Any], bool] | None = None) -> str | None:
    """The hint of the first known mistake whose ``replay(variant)`` gives ``got``; None if
    none does. By default a row's variant is what the mistake gives, or a function of no
    arguments that computes it (only when the rows before it did not match); a replay that
    gives None says the mistake cannot show in this case and skips its row. ``got`` matches
    when ``same(got, replayed)``, by default when it is ``close`` within ``tol``."""
    matches = same or (lambda a, b: close(a, b, tol))
    for variant, hint in known_mistakes:
        replayed = replay(variant)
        if replayed is not None and matches(got, replayed):
            return hint() if callable(hint) else hint
    return None
