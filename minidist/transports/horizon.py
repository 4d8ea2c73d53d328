"""When a receive from ANY_SOURCE may take a message, on virtual time (``virtual.py``).

A rank that receives from any source must take the message that arrives first in *virtual*
time, not the one that reached it first in wall time: a parameter server that answers a
later push before an earlier pull answers the pull late (its clock has moved on). But a
message with an earlier stamp may still be on its way, or not yet sent. So the receive
waits until no other rank can still send one: the conservative rule of parallel
discrete-event simulation (Chandy and Misra, IEEE TSE 1979; SimGrid's SMPI orders every
event in one simulation instead). Rank s's next send happens at virtual time >= L(s), and
arrives at least the link's alpha later, so a candidate arriving at ``a`` is safe when

    a <= min over s != me of  L(s) + alpha(s, me),

and no message is in flight to me (every message sent to me has been read off its ring).

Each rank's main thread publishes on a shared board what bounds its next send:

* RUNNING at t: its clock at its last communication event (its clock only moves on, so
  every later send is at >= t);
* NAMED(s) at t: blocked on a receive from s that nothing sent has matched: it can send
  again only after s sends to it, so L = max(t, L(s) + alpha(s, r));
* ANY(c) at t: blocked on a receive from any source whose earliest candidate arrives at c
  (inf: none yet): L = max(t, min(c, min over s of L(s) + alpha(s, r)));
* DONE: it sends nothing more (its transport closed, or the launcher marked it dead).

A blocked state counts only while it is still true: every rank counts the messages it
sends to each peer (before writing them) and the messages it reads off each ring; a
blocked state is trusted only if nothing was read since it was published and nothing is in
flight to that rank, else L = t, which is always a bound. All of it is read as one
consistent snapshot: the board copied twice until both copies agree (counters and
versions only grow, so equal copies hold what the board held at one instant between
them); read rank by rank instead, a worker seen blocked on a server could have been
freed, and have sent, after that server's state was read. The bounds are the greatest
fixpoint of those equations, found by iterating down from infinity (a cycle of blocked
ranks with nothing in flight and no candidate is a true deadlock, whose bound is inf). The
rank holding the globally earliest candidate is always safe, so the rule cannot deadlock a
program that the wall-clock order would not.

Only the main thread publishes: a rank whose other threads send to a receiver that takes
ANY_SOURCE (none of minidist's strategies do; DDP's and ZeRO's threads name their peers)
is bounded by its main thread's clock alone. Each state is written under a sequence
counter (odd while being written), so a snapshot never holds a torn state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

RUNNING, NAMED, ANY, DONE = 0, 1, 2, 3
_FIELDS = 5  # version, mode, t, aux (the named source, or the candidate), read-count


class Board:
    """The shared board of ``world_size`` ranks over a flat array of doubles: each rank's
    state, then ``sent[s][d]`` and ``read[s][d]`` (messages s -> d written / read off)."""

    def __init__(self, array, world_size: int):
        self.a, self.n = array, world_size
        self._sent = world_size * _FIELDS
        self._read = self._sent + world_size * world_size

    @staticmethod
    def size(world_size: int) -> int:
        return world_size * _FIELDS + 2 * world_size * world_size

    # -- counters (each written by one rank only) ---------------------------------------------
    def count_sent(self, src: int, dst: int) -> None:
        self.a[self._sent + src * self.n + dst] += 1

    def count_read(self, src: int, dst: int) -> None:
        self.a[self._read + src * self.n + dst] += 1

    def sent(self, src: int, dst: int) -> float:
        return self.a[self._sent + src * self.n + dst]

    def read(self, src: int, dst: int) -> float:
        return self.a[self._read + src * self.n + dst]

    def read_total(self, dst: int) -> float:
        return sum(self.read(s, dst) for s in range(self.n))

    def in_flight(self, dst: int) -> bool:
        """Whether some message sent to ``dst`` has not been read off its ring yet."""
        return any(self.sent(s, dst) != self.read(s, dst) for s in range(self.n))

    # -- states ---------------------------------------------------------------------------------
    def publish(self, rank: int, mode: int, t: float, aux: float = 0.0) -> None:
        """Rank ``rank``'s state (only its main thread writes it). The read-count it keeps
        is what a reader checks the state against (module docstring)."""
        i, a = rank * _FIELDS, self.a
        seen = self.read(int(aux), rank) if mode == NAMED else self.read_total(rank)
        a[i] += 1  # odd: being written
        a[i + 1], a[i + 2], a[i + 3], a[i + 4] = mode, t, aux, seen
        a[i] += 1

    def state(self, rank: int) -> tuple[int, float, float, float]:
        """(mode, t, aux, read-count) of ``rank`` (on a snapshot: never torn)."""
        i, a = rank * _FIELDS, self.a
        return int(a[i + 1]), a[i + 2], a[i + 3], a[i + 4]

    def snapshot(self) -> Board:
        """The whole board at one instant (module docstring), as a Board of its own."""
        while True:
            first = self.a[:]
            if first == self.a[:] and all(int(first[r * _FIELDS]) % 2 == 0
                                          for r in range(self.n)):
                return Board(first, self.n)

    def trusted(self, rank: int, mode: int, aux: float, seen: float) -> bool:
        """Whether a blocked state of ``rank`` still holds: nothing read since it was
        published (from the named source, or at all) and nothing in flight to it."""
        if mode == NAMED:
            s = int(aux)
            return self.read(s, rank) == seen and self.sent(s, rank) == seen
        return self.read_total(rank) == seen and not self.in_flight(rank)


def bounds(states: Sequence[tuple[int, float, float]], alpha) -> list[float]:
    """The greatest fixpoint of the bounds L(r) (module docstring). ``states[r]``:
    ``(mode, t, aux)`` with untrusted blocked states already turned into RUNNING at t;
    ``alpha(s, r)``: the latency of the link from s to r."""
    n = len(states)
    low = [math.inf if m in (NAMED, ANY, DONE) else t for m, t, _ in states]
    for _ in range(2 * n + 2):
        changed = False
        for r, (mode, t, aux) in enumerate(states):
            if mode == NAMED:
                s = int(aux)
                new = max(t, low[s] + alpha(s, r))
            elif mode == ANY:
                new = max(t, min([aux] + [low[s] + alpha(s, r) for s in range(n) if s != r]))
            else:
                continue
            if new < low[r]:
                low[r], changed = new, True
        if not changed:
            break
    return low


def safe(board: Board, me: int, t: float, candidate: float, alpha, gone) -> bool:
    """Whether rank ``me`` (blocked on ANY_SOURCE at ``t``, earliest candidate arriving at
    ``candidate``) may take it: no earlier message can still come (module docstring).
    ``gone(r)``: rank r's process has left (its state may be stale)."""
    board = board.snapshot()
    states = []
    for r in range(board.n):
        if r == me:
            states.append((ANY, t, candidate))
            continue
        mode, tr, aux, seen = board.state(r)
        if gone(r):
            mode = DONE
        elif mode in (NAMED, ANY) and not board.trusted(r, mode, aux, seen):
            mode = RUNNING
        states.append((mode, tr, aux))
    if board.in_flight(me):
        return False
    low = bounds(states, alpha)
    return all(candidate <= low[s] + alpha(s, me) for s in range(board.n) if s != me)
