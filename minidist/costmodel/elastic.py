"""What elasticity costs, as code: commits, failures and the best commit interval.

With a step of ``t_step`` seconds, a commit every ``k`` steps costing ``t_commit`` and a
restart (fresh processes, rendezvous, restore) costing ``t_restart``:

* commit overhead per step: ``t_commit / k``;
* a failure at a uniformly random step loses the steps since the last commit, ``(k - 1) / 2``
  on average (``lost_steps``; at most ``k - 1``), plus the restart:
  ``t_fail = t_restart + (k - 1) / 2 * t_step``;
* with failures every ``mtbf`` seconds on average, the expected overhead per second of
  training is ``t_commit / (k t_step) + t_fail / mtbf`` (``overhead``).

Minimising over the interval ``tau = k t_step`` gives Young's formula (J. W. Young, "A first
order approximation to the optimum checkpoint interval", CACM 1974):
``tau* = sqrt(2 t_commit mtbf)`` (``young_interval``). Commit too often and the commits
dominate; too rarely and each failure throws away more work.
"""

from __future__ import annotations

import math


def lost_steps(fail_step: int, commit_every: int) -> int:
    """Steps redone when a failure strikes during step ``fail_step`` (0-based count of
    completed steps): those since the last commit at a multiple of ``commit_every``."""
    return fail_step % commit_every


def failure_seconds(commit_every: int, t_step: float, t_restart: float) -> float:
    """Expected seconds one failure costs: the restart and half an interval of steps."""
    return t_restart + (commit_every - 1) / 2 * t_step


def overhead(commit_every: int, t_step: float, t_commit: float, t_restart: float,
             mtbf: float) -> float:
    """Expected fraction of time spent on commits and failures (per second of training)."""
    return t_commit / (commit_every * t_step) + \
        failure_seconds(commit_every, t_step, t_restart) / mtbf


def young_interval(t_commit: float, mtbf: float) -> float:
    """Young's optimal seconds between commits: ``sqrt(2 t_commit mtbf)``."""
    if t_commit < 0 or mtbf <= 0:
        raise ValueError(f"need t_commit >= 0 and mtbf > 0, got {t_commit!r}, {mtbf!r}")
    return math.sqrt(2 * t_commit * mtbf)
