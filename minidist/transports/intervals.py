"""When a port is busy, as pure functions: the reservation logic of virtual time.

A port (one rank's egress or ingress of one link class) is a ``Port``: a ``floor`` (busy
from the beginning of time until then) and a short sorted list of busy ``(start, end)``
intervals after it. A message of n bytes over a link of bandwidth B needs its sender's
egress and its receiver's ingress port free together for n / B seconds, from its send time
t on:

    start = earliest_start([egress, ingress], t, n / B)   # the first gap both share
    book(egress, start, start + n / B); book(ingress, ...)

Gaps are back-filled: a reply sent at virtual time 3 fits before a reservation another
rank already made for time 5, as it would on the cluster, where nothing is reserved ahead
(a single "free at" time per port would queue it behind). Ranks make their reservations in
wall-clock order, not in virtual-time order, so a message that reaches a port's list
first keeps its interval even if a message of earlier virtual time later wants it: SMPI
orders them by a global event queue; here every rank runs freely and the ports decide.

Bounded: a port keeps at most ``capacity`` intervals; booking one more folds the earliest
into the floor (its gap before is forgotten, so a very late back-fill queues behind it
instead: conservative, never a double booking).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

CAPACITY = 16  # intervals kept per port (see the module docstring)


class Port(NamedTuple):
    floor: float
    busy: tuple[tuple[float, float], ...] = ()


def earliest_start(ports: Sequence[Port], t: float, duration: float) -> float:
    """The earliest time >= ``t`` at which every port in ``ports`` is free for
    ``duration`` seconds (> 0)."""
    start = max([t] + [p.floor for p in ports])
    if all(not p.busy or p.busy[-1][1] <= start for p in ports):
        return start  # the usual case: after everything booked so far
    for s, e in sorted(iv for p in ports for iv in p.busy):
        if e <= start:
            continue
        if s >= start + duration:
            break  # the gap before this interval is long enough
        start = e
    return start


def book(port: Port, start: float, end: float, capacity: int = CAPACITY) -> Port:
    """``port`` with [start, end) busy as well (free there: ``earliest_start`` said so);
    touching intervals merge; past ``capacity`` the earliest folds into the floor."""
    busy = port.busy
    if busy and busy[-1][1] == start:  # the usual case: right after the last one
        busy = busy[:-1] + ((busy[-1][0], end),)
    elif not busy or busy[-1][1] < start:
        busy = busy + ((start, end),)
    else:
        busy = _merged(sorted(busy + ((start, end),)))
    floor = port.floor
    if len(busy) > capacity:
        floor = max(floor, busy[len(busy) - capacity - 1][1])
        busy = busy[len(busy) - capacity:]
    return Port(floor, busy)


def _merged(busy: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    out: list[list[float]] = []
    for s, e in busy:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return tuple((s, e) for s, e in out)


def pack(port: Port, capacity: int = CAPACITY) -> list[float]:
    """A port as ``2 + 2 * capacity`` floats: floor, count, then the intervals."""
    flat = [port.floor, float(len(port.busy))]
    for s, e in port.busy:
        flat += [s, e]
    return flat + [0.0] * (2 * capacity - 2 * len(port.busy))


def unpack(flat: Sequence[float]) -> Port:
    n = int(flat[1])
    return Port(flat[0], tuple((flat[2 + 2 * i], flat[3 + 2 * i]) for i in range(n)))
