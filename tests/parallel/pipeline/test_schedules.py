"""Schedules as data: ``md.pipeline.actions`` against the papers, and the simulator that runs
action lists against each other (no processes, so these tests are instant)."""

from __future__ import annotations

from fractions import Fraction

import pytest

import minidist as md

P = md.pipeline
SIZES = [(p, m) for p in range(1, 6) for m in range(1, 10)]


def test_bubble_fraction_formula():
    assert md.costmodel.bubble_fraction(4, 8) == 3 / 11
    assert Fraction(md.costmodel.bubble_fraction(4, 8)).limit_denominator(100) == Fraction(3, 11)
    assert md.pipeline.bubble_fraction is md.costmodel.bubble_fraction


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b"])
def test_every_microbatch_forward_then_backward_once_per_stage(name):
    for p, m in SIZES:
        lists = P.actions(name, stages=p, microbatches=m)
        assert len(lists) == p
        for acts in lists:
            assert sorted(acts) == sorted([("F", i) for i in range(m)]
                                          + [("B", i) for i in range(m)])
            for i in range(m):
                assert acts.index(("F", i)) < acts.index(("B", i))
        report = P.simulate(lists)
        assert report.ok, str(report)
        assert len(report.timeline) == 2 * m * p


def test_gpipe_all_forwards_then_all_backwards():
    assert P.actions("gpipe", 3, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 3


def test_1f1b_matches_pipedream_flush():
    """Narayanan et al. 2021: stage r warms up with p - r - 1 forwards, then alternates one
    forward and one backward, then drains; it never holds more than p - r micro-batches."""
    assert P.actions("1f1b", 4, 8)[1] == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4), ("B", 2),
        ("F", 5), ("B", 3), ("F", 6), ("B", 4), ("F", 7), ("B", 5), ("B", 6), ("B", 7)]
    for p, m in SIZES:
        lists = P.actions("1f1b", p, m)
        report = P.simulate(lists)
        for r, acts in enumerate(lists):
            warmup = min(p - r - 1, m)
            assert [k for k, _ in acts[:warmup]] == ["F"] * warmup
            steady = acts[warmup:warmup + 2 * (m - warmup)]
            assert [k for k, _ in steady] == ["F", "B"] * (m - warmup)
            assert report.in_flight[r] == min(p - r, m) == P.peak_in_flight("1f1b", r, p, m)
        assert report.in_flight == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("b_cost", [1.0, 2.0])
def test_simulated_bubble_is_the_formula(name, b_cost):
    for p, m in SIZES:
        report = P.simulate(P.actions(name, p, m), b_cost=b_cost)
        assert report.bubble == pytest.approx(md.costmodel.bubble_fraction(p, m), abs=1e-12)
        assert report.makespan == pytest.approx((m + p - 1) * (1 + b_cost))
    gpipe = P.simulate(P.actions("gpipe", 4, 8))
    assert gpipe.in_flight == [8, 8, 8, 8]


def test_naive_idles_all_but_one_stage():
    for p, m in SIZES:
        report = P.simulate(P.actions("naive", p, m))
        assert report.bubble == pytest.approx((p - 1) / p, abs=1e-12)
        assert report.in_flight == [1] * p


@pytest.mark.parametrize("p,v", [(2, 2), (2, 3), (4, 2), (3, 2)])
def test_interleaved_divides_the_bubble_by_v(p, v):
    """Megatron-LM (SC 2021): v chunks per stage, warm-up 2 (p - r - 1) + (v - 1) p."""
    for m in (p, 2 * p, 3 * p):
        lists = P.actions("interleaved", p, m, chunks=v)
        report = P.simulate(lists, f_cost=1 / v, b_cost=1 / v)
        assert report.ok, str(report)
        assert report.bubble == pytest.approx(md.costmodel.bubble_fraction(p, m, v), abs=1e-12)
        for r, acts in enumerate(lists):
            warmup = min(2 * (p - r - 1) + (v - 1) * p, m * v)
            assert [a[0] for a in acts[:warmup]] == ["F"] * warmup
            assert acts[warmup][0] == ("B" if warmup == m * v else "F")


def test_deadlock_is_reported_with_stage_and_action():
    lists = P.actions("1f1b", 4, 8)
    lists[1] = P.actions("gpipe", 4, 8)[1]  # stage 1 forwards on, its neighbours do not
    report = P.simulate(lists)
    assert not report.ok and not report.errors
    waits = {w.stage: w for w in report.deadlock}
    assert waits[0].index == 4 and waits[0].action == ("B", 0)
    assert waits[0].on_stage == 1 and waits[0].on_action == ("B", 0)
    assert waits[1].action == ("F", 4) and waits[1].on_stage == 0
    assert "stage 0 waits at action 4 ('B', 0) for stage 1's ('B', 0)" in str(report)


def test_missing_and_repeated_and_backward_before_forward():
    lists = P.actions("gpipe", 2, 2)
    lists[1] = [("F", 0), ("B", 1), ("F", 1), ("B", 0), ("B", 0)]
    report = P.simulate(lists)
    text = str(report)
    assert "stage 1 backwards micro-batch 1 (chunk 0) at action 1 before forwarding it" in text
    assert "stage 1 runs ('B', 0, 0) twice" in text
    assert P.simulate([[("F", 0)], [("F", 0), ("B", 0)]]).errors == [
        "stage 0 never runs B of micro-batch 0"]
    never = P.simulate([[("F", 0), ("B", 0)], [("B", 0)]])
    assert any(w.on_action == ("F", 0) and w.on_stage == 1 for w in never.deadlock)
    assert P.simulate([[("X", 0)]]).errors[0].startswith("stage 0 action 0 is ('X', 0)")


def test_timeline_events_draw_as_gantt():
    report = P.simulate(P.actions("1f1b", 3, 4))
    events = report.events()
    assert {e["cat"] for e in events} == {"forward", "backward"}
    assert {e["rank"] for e in events} == {0, 1, 2}
    first = min(events, key=lambda e: (e["rank"], e["start"]))
    assert first["name"] == "F0" and first["start"] == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown schedule name='pipedream'"):
        P.actions("pipedream", 4, 8)
    with pytest.raises(ValueError, match="microbatches must be a positive integer, got 0"):
        P.actions("1f1b", 4, 0)
    with pytest.raises(TypeError, match="stages must be a positive integer"):
        P.actions("1f1b", 2.0, 4)
    with pytest.raises(ValueError, match="chunks=2 needs the 'interleaved' schedule"):
        P.actions("gpipe", 2, 4, chunks=2)
    with pytest.raises(ValueError, match="multiple of stages"):
        P.actions("interleaved", 4, 6, chunks=2)
    with pytest.raises(TypeError, match="action_lists"):
        P.simulate([])
