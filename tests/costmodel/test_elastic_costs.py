"""``costmodel.elastic``, the cost formulas of elasticity: lost steps, the expected cost of a
failure, and Young's interval is where the overhead formula has its minimum (``md.elastic``
re-exports them)."""

from __future__ import annotations

import math

import pytest

import minidist as md
from minidist.costmodel.elastic import failure_seconds, lost_steps, overhead, young_interval


def test_lost_steps_are_those_since_the_last_commit():
    assert [lost_steps(s, 4) for s in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert lost_steps(15, 1) == 0 and lost_steps(15, 8) == 7
    k = 6  # a failure at a uniformly random step loses (k - 1) / 2 steps on average
    assert sum(lost_steps(s, k) for s in range(60)) / 60 == (k - 1) / 2
    assert failure_seconds(k, t_step=0.2, t_restart=3.0) == 3.0 + 2.5 * 0.2


def test_young_interval_minimises_the_overhead():
    t_step, t_commit, t_restart, mtbf = 0.01, 0.5, 30.0, 3600.0
    best_k = min(range(1, 100000), key=lambda k: overhead(k, t_step, t_commit, t_restart, mtbf))
    assert best_k * t_step == pytest.approx(young_interval(t_commit, mtbf), rel=1e-3)
    assert young_interval(t_commit, mtbf) == math.sqrt(2 * 0.5 * 3600)
    with pytest.raises(ValueError, match="mtbf > 0"):
        young_interval(1.0, 0)


def test_md_elastic_shows_the_same_functions():
    assert (md.elastic.lost_steps, md.elastic.failure_seconds, md.elastic.overhead,
            md.elastic.young_interval) == (lost_steps, failure_seconds, overhead, young_interval)
