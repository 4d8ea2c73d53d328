"""Timelines: what each rank did when, as Chrome trace JSON and as a Gantt chart.

Recording is off unless asked for (``md.launch(..., trace=True)`` or ``comm.timeline.enable()``)
and then costs one tuple per operation. Times come from the rank's clock (``comm.now()``):
by default ``time.perf_counter``, which on Linux reads CLOCK_MONOTONIC, a clock shared by
all processes of one machine, so the ranks' events line up; under ``md.launch(...,
clock="virtual")`` the ranks' virtual clocks (``transports/clock.py``), which start at 0 on
every rank. Each event says which (``"clock"``), and the chart and the trace label their
axis with it. Later lessons use this to show buckets overlapping backward and pipeline
bubbles.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import contextmanager

from .transports.clock import WALL


class Timeline:
    """One rank's events: ``(name, category, start, end, bytes, peer)`` in seconds of
    ``clock`` (the rank's: ``comm.now()``; the wall clock by default)."""

    def __init__(self, rank: int, enabled: bool = False, clock=WALL):
        self.rank, self.enabled, self.clock = rank, enabled, clock
        self.events: list[tuple] = []

    def enable(self, on: bool = True) -> None:
        self.enabled = on

    def clear(self) -> None:
        self.events.clear()

    def record(self, name: str, cat: str, start: float, end: float,
               nbytes: int = 0, peer: int | None = None) -> None:
        if self.enabled:
            self.events.append((name, cat, start, end, nbytes, peer))

    @contextmanager
    def span(self, name: str, cat: str = "compute"):
        """Record the enclosed block, e.g. ``with comm.timeline.span("backward"): ...``."""
        start = self.clock.now()
        try:
            yield
        finally:
            self.record(name, cat, start, self.clock.now())

    def as_dicts(self) -> list[dict]:
        keys = ("name", "cat", "start", "end", "bytes", "peer")
        return [dict(zip(keys, e), rank=self.rank, clock=self.clock.kind) for e in self.events]


def _flatten(timelines) -> list[dict]:
    """Accept Timelines, lists of event dicts, or a mix; return one list of event dicts."""
    out: list[dict] = []
    for tl in timelines:
        out.extend(tl.as_dicts() if isinstance(tl, Timeline) else tl)
    return out


def clock_of(events: list[dict]) -> str:
    """``"wall"`` or ``"virtual"``: the clock all ``events`` were taken on (events without
    the key, e.g. the pipeline simulator's, count as wall). Mixing them is an error: the
    two clocks share no origin."""
    kinds = {e.get("clock", "wall") for e in events}
    if len(kinds) > 1:
        raise ValueError("these events mix wall-clock and virtual times, which share no "
                         "origin: draw or export the runs of each clock separately")
    return kinds.pop() if kinds else "wall"


def to_chrome_trace(timelines: Iterable, path: str | None = None) -> dict:
    """Chrome trace-event JSON (opens in https://ui.perfetto.dev or chrome://tracing).

    One row (thread) per rank; complete events ("ph": "X") with microsecond timestamps;
    under virtual time the process is named "minidist (virtual time)".
    """
    events = _flatten(timelines)
    kind = clock_of(events)
    t0 = min((e["start"] for e in events), default=0.0)
    trace = [{"name": e["name"], "cat": e["cat"], "ph": "X", "pid": 0, "tid": e["rank"],
              "ts": (e["start"] - t0) * 1e6, "dur": max(e["end"] - e["start"], 0) * 1e6,
              "args": {"bytes": e["bytes"], "peer": e["peer"]}} for e in events]
    ranks = sorted({e["rank"] for e in events})
    trace += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
               "args": {"name": f"rank {r}"}} for r in ranks]
    if kind == "virtual":
        trace.append({"name": "process_name", "ph": "M", "pid": 0,
                      "args": {"name": "minidist (virtual time)"}})
    doc = {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {"clock": kind}}
    if path is not None:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc


_COLORS = {"send": "tab:blue", "recv": "tab:orange", "sendrecv": "tab:purple",
           "wait": "tab:gray", "barrier": "tab:red", "compute": "tab:green",
           "collective": "tab:cyan", "forward": "tab:olive", "backward": "tab:brown"}


def plot_gantt(timelines: Iterable, ax=None, title: str | None = None):
    """Draw one horizontal lane per rank, one bar per event, coloured by category."""
    import matplotlib.pyplot as plt

    events = _flatten(timelines)
    kind = clock_of(events)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1 + 0.5 * len({e["rank"] for e in events})))
    t0 = min((e["start"] for e in events), default=0.0)
    seen = set()
    for e in events:
        color = _COLORS.get(e["cat"], "lightgray")
        label = e["cat"] if e["cat"] not in seen else None
        seen.add(e["cat"])
        ax.barh(e["rank"], (e["end"] - e["start"]) * 1e3, left=(e["start"] - t0) * 1e3,
                height=0.6, color=color, edgecolor="black", linewidth=0.3, label=label)
    ranks = sorted({e["rank"] for e in events})
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("virtual time (ms)" if kind == "virtual" else "time (ms)")
    ax.tick_params(labelbottom=True)  # keep the time labels under every lane of a sharex stack
    if title:
        ax.set_title(title)
    if seen:  # outside the lanes, so that it hides no bar
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small",
                  frameon=False)
    return ax
