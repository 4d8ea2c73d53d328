"""Fault injection: make some ranks slow at a named point of every training step.

A synchronous strategy runs at the pace of its slowest rank. To see it, configure a delay
and train as usual::

    with md.slow_rank(comm, rank=1, seconds=0.05):            # rank 1, before each forward
        for x, y in data:
            loss_fn(ddp(x), y).backward()

    with md.inject_delay(comm, 0.05, ranks=[1, 3], where=["forward", "backward"]):
        ...

Strategies make this work by calling ``maybe_delay(comm, point)`` at the named points
(``POINTS``): ``"forward"`` before the forward pass, ``"backward"`` when backward starts,
``"step"`` before the optimizer step. It sleeps if a delay is configured for this rank and
point (under ``md.launch(..., clock="virtual")`` it moves the rank's virtual clock on by the
delay instead: the straggler costs exactly its delay, whatever the machine's load), and
records a ``straggler delay`` span on ``comm.timeline``; otherwise it costs an attribute
look-up. A new strategy needs nothing more than those calls::

    def step(self):
        md.faults.maybe_delay(self.comm, "step")
        ...

Where the configuration lives: on the communicator, as the public attribute ``comm.faults``
(a ``FaultPlan``, created on first use), so there is no global state; each rank's process
has its own communicator and so its own plan, and the context managers add a delay to it on
entry and remove it on exit. Delays that match add up. A communicator made by
``comm.split`` has a plan of its own: configure the communicator the strategy is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

from .transports.clock import WALL

POINTS = ("forward", "backward", "step")


@dataclass(frozen=True, eq=False)
class Delay:
    """Sleep ``seconds`` at each of ``points`` on each of ``ranks`` (None: every rank)."""

    seconds: float
    ranks: frozenset[int] | None
    points: frozenset[str]

    def applies(self, rank: int, point: str) -> bool:
        return point in self.points and (self.ranks is None or rank in self.ranks)


class FaultPlan:
    """The faults configured on one communicator (``comm.faults``): a list of ``Delay``."""

    def __init__(self):
        self.delays: list[Delay] = []

    def seconds_at(self, rank: int, point: str) -> float:
        return sum(d.seconds for d in self.delays if d.applies(rank, point))

    def __repr__(self) -> str:
        return f"FaultPlan({self.delays!r})"


def faults_of(comm) -> FaultPlan:
    """``comm.faults``, created empty on first use."""
    plan = getattr(comm, "faults", None)
    if plan is None:
        plan = comm.faults = FaultPlan()
    return plan


def make_delay(comm, seconds: float, ranks=None, where="forward") -> Delay:
    """Check the arguments and build a ``Delay``; ``ranks``: a rank, a list of ranks or None
    (every rank); ``where``: a point or a list of points (``POINTS``)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
    return Delay(float(seconds), _check_ranks(comm, ranks), _check_points(where))


def inject_delay(comm, seconds: float, ranks=None, where="forward"):
    """A context manager: within the block, ranks ``ranks`` (None: all) sleep ``seconds`` at
    the points ``where`` ("forward", "backward", "step" or a list of them) of every strategy
    that runs on ``comm``. Checks its arguments at once; the block gets the ``Delay``."""
    return _installed(comm, make_delay(comm, seconds, ranks, where))


@contextmanager
def _installed(comm, delay: Delay):
    plan = faults_of(comm)
    plan.delays.append(delay)
    try:
        yield delay
    finally:
        plan.delays.remove(delay)


def slow_rank(comm, rank: int, seconds: float, where="forward"):
    """``inject_delay`` for one rank: ``with md.slow_rank(comm, rank=1, seconds=0.05): ...``"""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {type(rank).__name__}")
    return inject_delay(comm, seconds, ranks=[rank], where=where)


def maybe_delay(comm, point: str) -> float:
    """Called by strategies at a named point: sleep (virtual time: advance the clock) if this
    rank is configured to be slow there, recording a ``straggler delay`` span on
    ``comm.timeline``. Returns the seconds of delay (0.0 when nothing is configured)."""
    if not (isinstance(point, str) and point in POINTS):
        _check_points(point)  # raises, naming the points
    plan = getattr(comm, "faults", None)
    seconds = plan.seconds_at(comm.rank, point) if plan is not None else 0.0
    if seconds > 0:
        with comm.timeline.span("straggler delay", "straggler"):
            getattr(comm, "clock", WALL).advance(seconds)
    return seconds


def _check_ranks(comm, ranks) -> frozenset[int] | None:
    if ranks is None:
        return None
    items = [ranks] if isinstance(ranks, int) else ranks
    if not isinstance(items, Iterable) or isinstance(items, str):
        raise TypeError(f"ranks must be a rank, a list of ranks or None, got {ranks!r}")
    items = list(items)
    for r in items:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < comm.world_size:
            raise ValueError(f"rank {r!r} is not a rank of this communicator, whose ranks "
                             f"are 0..{comm.world_size - 1}")
    return frozenset(items)


def _check_points(where) -> frozenset[str]:
    items = [where] if isinstance(where, str) else where
    if not isinstance(items, Iterable):
        raise TypeError(f"where must be a point name or a list of them, got {where!r}")
    items = list(items)
    if not items:
        raise ValueError(f"where names no point; the points are {', '.join(map(repr, POINTS))}")
    for p in items:
        if p not in POINTS:
            raise ValueError(f"unknown fault point {p!r}; the points strategies call are "
                             f"{', '.join(map(repr, POINTS))}")
    return frozenset(items)
