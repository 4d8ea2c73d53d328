"""What time it is on a rank: the wall clock, or a virtual clock (``md.launch(clock=...)``).

The virtual clock follows SimGrid's SMPI (Degomme et al., "Simulating MPI applications: the
SMPI approach", IEEE TPDS 2017): the program runs for real, but time is modelled. Every
rank (process) keeps one clock per *thread*, in seconds from 0 at launch (DDP's
communication thread has its own: it runs beside the main thread, as a GPU's copy engine
runs beside its compute units). The library brackets each communication call:

* ``enter()`` at its entry charges the computation since the previous call: the thread's
  CPU time (``time.thread_time()``: what this thread ran, whatever else shares the core),
  or, with an ``md.Compute`` model, the FLOPs torch ran in that interval divided by the
  model's rate (``compute.py``: then it does not depend on this machine at all);
* ``at_least(t)`` while inside: a receive completes at its modelled arrival, a send once
  its bytes have left (``virtual.py``); a hand-off to another thread carries the sender's
  time (``CommThread``);
* ``exit()`` at its exit restarts the compute meter, so the CPU the library itself spends
  (copies, matching, polling) is never charged as computation.

Calls nest (``send`` is ``isend`` then ``wait``; a collective is many of them): only the
outermost pair charges and restarts. ``now()`` is the thread's clock plus the computation
not yet charged. A straggler's delay is ``advance(seconds)``, not a sleep.

``WallClock`` has the same interface over ``time.perf_counter()`` (a clock shared by every
process of the machine), with no-op brackets, so callers never branch on the kind.
Timeouts stay on the wall clock under both.
"""

from __future__ import annotations

import functools
import threading
import time

from .compute import Compute, FlopCount

CLOCKS = ("wall", "virtual")


class WallClock:
    """``time.perf_counter()``; brackets and hand-offs do nothing."""

    kind = "wall"
    compute = None

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def enter(self) -> None:
        pass

    def exit(self) -> None:
        pass

    def at_least(self, t: float) -> None:
        pass

    def advance(self, seconds: float) -> None:
        """Wall time passes by itself: sleep."""
        time.sleep(seconds)

    def count_flops_here(self) -> None:
        pass


WALL = WallClock()


class _ThreadClock:
    """One thread's virtual time ``t``, the compute meter's reading at the last restart, how
    deep in communication calls the thread is, and its FLOP counter (FLOP model only)."""

    __slots__ = ("t", "mark", "depth", "counter")

    def __init__(self):
        self.t, self.mark, self.depth, self.counter = 0.0, 0.0, 0, None


class VirtualClock:
    """A rank's virtual clock (module docstring); ``compute``: an ``md.Compute`` (charge
    FLOPs at its rate) or None (charge CPU time)."""

    kind = "virtual"

    def __init__(self, compute: Compute | None = None):
        self.compute = compute
        self._local = threading.local()

    def _thread(self) -> _ThreadClock:
        s = getattr(self._local, "clock", None)
        if s is None:  # a thread's first use: its clock starts at 0 (a hand-off moves it)
            s = self._local.clock = _ThreadClock()
            s.mark = self._meter(s)
        return s

    def _meter(self, s: _ThreadClock) -> float:
        """The compute meter: CPU seconds, or FLOPs counted on this thread."""
        if self.compute is None:
            return time.thread_time()
        return 0.0 if s.counter is None else float(s.counter.flops)

    def _pending(self, s: _ThreadClock) -> float:
        """Seconds of computation since the meter last restarted."""
        done = self._meter(s) - s.mark
        return done if self.compute is None else self.compute.seconds(done)

    def count_flops_here(self) -> None:
        """Count this thread's FLOPs from now on (FLOP model only; the rank's main thread,
        at connect). Other threads are not counted: the library's communication threads
        only copy and add, which the FLOP model does not charge anyway."""
        s = self._thread()
        if self.compute is not None and s.counter is None:
            s.counter = FlopCount()
            s.counter.__enter__()  # for the rest of the rank's life
            s.mark = self._meter(s)

    def now(self) -> float:
        s = self._thread()
        return s.t if s.depth else s.t + self._pending(s)

    def _commit(self, s: _ThreadClock) -> None:
        meter = self._meter(s)
        done = meter - s.mark
        s.t += done if self.compute is None else self.compute.seconds(done)
        s.mark = meter

    def enter(self) -> None:
        s = self._thread()
        if s.depth == 0:
            self._commit(s)
        s.depth += 1

    def exit(self) -> None:
        s = self._thread()
        s.depth -= 1
        if s.depth == 0:
            s.mark = self._meter(s)

    def at_least(self, t: float) -> None:
        """Move this thread's clock forward to ``t`` (an arrival, a hand-off's stamp)."""
        s = self._thread()
        if s.depth == 0:
            self._commit(s)
        if t > s.t:
            s.t = t

    def advance(self, seconds: float) -> None:
        """``seconds`` pass on this thread without computing (a straggler's delay)."""
        s = self._thread()
        if s.depth == 0:
            self._commit(s)
        s.t += seconds


def make_clock(kind: str, compute: Compute | None = None) -> WallClock | VirtualClock:
    """The clock a rank keeps under ``md.launch(clock=kind)``."""
    return WALL if kind == "wall" else VirtualClock(compute)


def bracketed(fn):
    """Decorator of a communication call: a method of an object with a ``clock`` (a
    Communicator, Channel or Request) or a function whose first argument is a communicator
    (a collective). The call is bracketed by ``enter``/``exit`` of that clock."""

    @functools.wraps(fn)
    def call(owner, *args, **kwargs):
        clock = getattr(owner, "clock", WALL)
        clock.enter()
        try:
            return fn(owner, *args, **kwargs)
        finally:
            clock.exit()

    return call
