"""Fault injection (``minidist/faults.py``): a delay happens on the named ranks only, at the
named point of a strategy's step, shows on the timeline, and bad arguments say what is
wrong."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minidist as md
from minidist.faults import maybe_delay

SLOW = 0.05


def fake_comm(rank: int = 0, world_size: int = 2):
    return SimpleNamespace(rank=rank, world_size=world_size,
                           timeline=md.Timeline(rank, enabled=True))


def delays(events) -> list[dict]:
    return [e for e in events if e["name"] == "straggler delay"]


# -- on one process: the configuration and the hook ---------------------------------------------
def test_maybe_delay_sleeps_only_where_configured():
    one, zero = fake_comm(rank=1), fake_comm(rank=0)
    for comm in (one, zero):
        with md.slow_rank(comm, rank=1, seconds=0.01, where="backward"):
            got = {p: maybe_delay(comm, p) for p in md.faults.POINTS}
        assert got == ({"forward": 0.0, "backward": 0.01, "step": 0.0} if comm is one
                       else dict.fromkeys(md.faults.POINTS, 0.0))
        assert maybe_delay(comm, "backward") == 0.0  # removed on leaving the block
        assert comm.faults.delays == []
    (event,) = delays(one.timeline.as_dicts())
    assert event["cat"] == "straggler" and event["end"] - event["start"] >= 0.01
    assert delays(zero.timeline.as_dicts()) == []


def test_delays_nest_and_add_up():
    comm = fake_comm(rank=2, world_size=4)
    with md.inject_delay(comm, 0.01, ranks=[0, 2], where=["forward", "step"]) as d:
        assert d.seconds == 0.01 and d.ranks == {0, 2} and d.points == {"forward", "step"}
        with md.inject_delay(comm, 0.02, where="step"):  # every rank
            assert math.isclose(maybe_delay(comm, "step"), 0.03)
            assert maybe_delay(comm, "forward") == 0.01
        assert maybe_delay(comm, "step") == 0.01
    assert maybe_delay(comm, "step") == 0.0
    assert len(delays(comm.timeline.as_dicts())) == 3


def test_bad_arguments():
    comm = fake_comm(rank=0, world_size=2)
    bad = [
        (lambda: md.slow_rank(comm, rank=2, seconds=0.1), ValueError,
         r"rank 2 is not a rank of this communicator, whose ranks are 0\.\.1"),
        (lambda: md.slow_rank(comm, rank=-1, seconds=0.1), ValueError, "rank -1 is not"),
        (lambda: md.slow_rank(comm, rank="1", seconds=0.1), TypeError, "rank must be an int"),
        (lambda: md.inject_delay(comm, 0.1, ranks=[0, 5]), ValueError, "rank 5 is not"),
        (lambda: md.inject_delay(comm, 0.1, ranks="0"), TypeError, "ranks must be a rank"),
        (lambda: md.slow_rank(comm, rank=0, seconds=-1), ValueError,
         "seconds must be a finite number >= 0, got -1"),
        (lambda: md.inject_delay(comm, float("nan")), ValueError, "seconds must be"),
        (lambda: md.inject_delay(comm, float("inf")), ValueError, "seconds must be"),
        (lambda: md.inject_delay(comm, "1"), ValueError, "seconds must be"),
        (lambda: md.slow_rank(comm, rank=0, seconds=0.1, where="fwd"), ValueError,
         "unknown fault point 'fwd'; the points strategies call are 'forward', 'backward', "
         "'step'"),
        (lambda: md.inject_delay(comm, 0.1, where=["forward", "optimizer"]), ValueError,
         "unknown fault point 'optimizer'"),
        (lambda: md.inject_delay(comm, 0.1, where=[]), ValueError, "names no point"),
        (lambda: md.inject_delay(comm, 0.1, where=3), TypeError, "where must be"),
        (lambda: maybe_delay(comm, "sideways"), ValueError, "unknown fault point 'sideways'"),
    ]
    for fn, exc, match in bad:
        with pytest.raises(exc, match=match):
            fn()  # raised by the call itself, before any `with`
    assert getattr(comm, "faults", None) is None or comm.faults.delays == []


# -- in a strategy, on several ranks -----------------------------------------------------------
def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _step(ddp) -> None:
    F.mse_loss(ddp(torch.randn(6, 4)), torch.randn(6, 2)).backward()


def _strategies_rank(comm):
    comm.timeline.enable()
    out = {}
    ddp = md.DistributedDataParallel(_model(), comm)
    for point in ("forward", "backward"):
        comm.timeline.clear()
        with md.slow_rank(comm, rank=1, seconds=SLOW, where=point):
            _step(ddp)
        out["ddp", point] = comm.timeline.as_dicts()
    naive = md.DataParallelNaive(_model(), comm)
    comm.timeline.clear()
    with md.inject_delay(comm, SLOW, ranks=[0, 2], where="backward"):
        _step(naive)
    out["naive"] = comm.timeline.as_dicts()
    out["left"] = list(comm.faults.delays)
    return out


def _span(events, name) -> dict:
    (event,) = [e for e in events if e["name"] == name]
    return event


def test_delay_on_the_named_rank_at_the_named_point():
    results = md.launch(_strategies_rank, 3)
    for rank, out in enumerate(results):
        for point in ("forward", "backward"):
            events = out["ddp", point]
            slept = delays(events)
            if rank != 1:
                assert slept == []
                continue
            (d,) = slept
            assert d["end"] - d["start"] >= SLOW
            forward, backward = _span(events, "forward"), _span(events, "backward")
            if point == "forward":  # before the forward pass
                assert d["end"] <= forward["start"]
            else:  # after forward, before the backward computation
                assert forward["end"] <= d["start"] and d["end"] <= backward["start"]
        assert len(delays(out["naive"])) == (1 if rank in (0, 2) else 0)
        assert out["left"] == []
