"""Timelines: recorded per rank, exported as Chrome trace JSON, drawn as a Gantt chart."""

from __future__ import annotations

import json

import matplotlib
import torch

import minidist as md

matplotlib.use("Agg")


def _traced(comm):
    with comm.timeline.span("forward"):
        torch.randn(100, 100).sum()
    comm.sendrecv(torch.ones(1000), 1 - comm.rank, torch.empty(1000), 1 - comm.rank)
    comm.barrier()
    return None


def test_chrome_trace_and_gantt(tmp_path):
    out = md.launch(_traced, 2, trace=True)
    path = tmp_path / "trace.json"
    doc = md.to_chrome_trace(out.timelines, str(path))
    assert json.loads(path.read_text()) == doc
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in events} == {0, 1}
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in events)
    sr = [e for e in events if e["name"] == "sendrecv"]
    assert len(sr) == 2 and all(e["args"]["bytes"] == 4000 for e in sr)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"rank 0", "rank 1"}
    ax = md.plot_gantt(out.timelines, title="two ranks")
    assert ax.get_title() == "two ranks" and len(ax.patches) == len(events)


def test_timeline_off_by_default():
    out = md.launch(_traced, 2)
    assert out.timelines is None


def test_timeline_object():
    tl = md.Timeline(rank=3)
    tl.record("x", "send", 0.0, 1.0)
    assert tl.events == []  # disabled: recording costs nothing
    tl.enable()
    with tl.span("work"):
        pass
    tl.record("x", "send", 1.0, 2.0, nbytes=8, peer=1)
    d = tl.as_dicts()
    assert [e["name"] for e in d] == ["work", "x"] and d[1]["rank"] == 3 and d[1]["peer"] == 1
