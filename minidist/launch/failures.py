"""``md.launch(..., on_rank_failure="continue")``: a rank that fails does not stop the others.

By default the first rank that raises or dies stops every rank (``watch.py``), as
``mpirun`` does under MPI's default error handler (``MPI_ERRORS_ARE_FATAL``) and torchrun
does (it restarts the whole group; ``md.elastic`` is that model). Some programs can do
without a rank: the workers of an asynchronous parameter server are the textbook case
(Dean et al., NIPS 2012; Li et al., OSDI 2014 name fault tolerance as a reason for the
design). Whether a death is survivable is known to the program, not to the launcher, so
the caller says so: ``on_rank_failure="continue"``, as a ULFM MPI job is started with
``mpiexec --with-ft ulfm`` (the survivors are told, not killed). Then:

* A failed rank (killed, ``os._exit``, or an exception, reported as usual) is marked dead
  in the shared segment once its process has ended, and every rank is woken: receives from
  it fail at once with ``md.PeerLeftError`` (after what it sent is drained), sends to it
  are discarded (``transports/local.py``). A parameter server sees the death and carries on.
* The others run to the end; launch returns ``Results`` with a ``RankFailed`` in each
  failed rank's slot, and ``results.failures`` lists them.
* If a survivor then fails *because* a rank is gone (``PeerLeftError``, any
  ``CommTimeout``, a lost connection, ``WorkerLeftError``), or waits at a shared-memory
  barrier that a gone rank never reached, the program could not do without it after all:
  launch stops everyone and raises ``WorkerError`` for the rank that left, as by default.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass

from multiprocess.connection import wait as wait_any

from ..checks import one_of
from ..errors import WorkerError
from .watch import (
    CAUSE_WINDOW,
    Results,
    _describe_exit,
    _read_result,
    _unlink_when_attached,
    _worker_error,
)

ON_RANK_FAILURE = ("error", "continue")
# exceptions that say "a rank I needed has gone", whatever failure_kind calls them
_NEEDED_GONE = ("PeerLeftError", "WorkerLeftError")
_NAMED_PEER = re.compile(r"from rank (\d+)|worker rank (\d+)")


@dataclass(frozen=True)
class RankFailed:
    """What ``md.launch(..., on_rank_failure="continue")`` puts in a failed rank's slot
    (``results.failures`` lists them). ``error``: one line ("killed by signal SIGKILL",
    "exit code 3", "ValueError: ..."); ``exc_type``: the exception's class name, None if
    the process died without raising; ``signal``: the signal that killed it ("SIGKILL"),
    if one did; ``exitcode``: the process's exit status, if it died; ``traceback``: the
    rank's formatted traceback, if it raised. ``as_error()`` is the ``WorkerError`` the
    default launch would have raised."""

    rank: int
    error: str
    exc_type: str | None = None
    signal: str | None = None
    exitcode: int | None = None
    traceback: str = ""

    @classmethod
    def from_message(cls, rank: int, msg: tuple) -> RankFailed:
        if msg[0] == "died":
            return cls(rank, _describe_exit(msg[1]), signal=_signal_name(msg[1]),
                       exitcode=msg[1])
        _, exc_type, text, tb, _ = msg
        return cls(rank, f"{exc_type}: {text}", exc_type=exc_type, traceback=tb)

    def as_error(self) -> WorkerError:
        if self.exc_type is None:
            return WorkerError(self.rank, f"the process died without raising ({self.error})")
        return WorkerError(self.rank, self.error, self.exc_type, self.traceback)

    def __str__(self) -> str:
        return f"rank {self.rank} failed: {self.error}"

    def __repr__(self) -> str:
        return f"RankFailed(rank={self.rank}, {self.error!r})"


def check_on_rank_failure(value, backend: str) -> bool:
    """Whether failures are tolerated; only the local backend can tell survivors of a death."""
    one_of(value, ON_RANK_FAILURE, "on_rank_failure",
           "'error': the first failure stops every rank; 'continue': the others run on")
    if value == "continue" and backend != "local":
        raise ValueError(
            f"on_rank_failure='continue' needs backend='local', not {backend!r}: there the "
            "launcher marks a dead rank in the shared segment, so the survivors' receives "
            "from it fail at once and sends to it are dropped. A torch.distributed process "
            "group has no such notice and cannot go on without a member (gloo fails the "
            "survivors' operations with lost connections, NCCL aborts the communicator; "
            "torchrun restarts everyone instead, as md.elastic does)")
    return value == "continue"


def collect_tolerating(procs, conns, owned) -> Results:
    """``watch.collect`` for ``on_rank_failure="continue"``: wait for every rank, telling the
    others of each failure; raise only when a failure turns out not to be survivable."""
    t = _Tolerant(procs, conns, owned)
    while True:
        _unlink_when_attached(owned)
        t.tell_survivors()
        fatal = t.fatal()
        if fatal is not None:
            raise fatal
        if not t.pending:
            return t.results_()
        t.wait(0.002 if getattr(owned, "name", None) else 0.05)


class _Tolerant:
    """What the caller has learned so far about each rank, failures kept, not raised."""

    def __init__(self, procs, conns, owned):
        n = len(procs)
        self.procs, self.conns, self.owned = procs, conns, owned
        self.results, self.timelines = [None] * n, [None] * n
        self.pending = set(range(n))
        self.returned: list[int] = []  # ranks that returned while others still ran
        self.failures: list[tuple[int, tuple]] = []  # (rank, message), in arrival order
        self.unmarked: list[int] = []  # failed ranks not yet marked dead in the segment
        self.give_up: float | None = None  # a consequence with no cause yet: wait until

    def note(self, rank: int, msg: tuple) -> None:
        self.pending.discard(rank)
        if msg[0] == "ok":
            self.results[rank], self.timelines[rank] = msg[1], msg[2]
            if self.pending:
                self.returned.append(rank)
        else:
            self.failures.append((rank, msg))
            self.unmarked.append(rank)

    def wait(self, seconds: float) -> None:
        by_obj = {self.conns[r]: r for r in self.pending}
        by_obj.update({self.procs[r].sentinel: r for r in self.pending | set(self.unmarked)})
        for obj in wait_any(list(by_obj), timeout=seconds):
            rank = by_obj[obj]
            if rank in self.pending:
                msg = _read_result(self.conns[rank], self.procs[rank], obj is self.conns[rank])
                if msg is not None:
                    self.note(rank, msg)

    def tell_survivors(self) -> None:
        """Mark each failed rank whose process has ended dead in the segment (not before:
        a rank that raised still pushes its queued sends as it closes), and wake everyone."""
        ended = [r for r in self.unmarked if self.procs[r].exitcode is not None]
        seg = self.owned
        if not ended or not hasattr(seg, "mark_dead") or seg.mm.closed:
            return
        for r in ended:
            seg.mark_dead(r)
            self.unmarked.remove(r)
        seg.wake_all()

    def fatal(self) -> WorkerError | None:
        """The error to raise now, if a failure has shown the others could not go on."""
        consequences = [(r, m) for r, m in self.failures if _needs_the_gone(m)]
        if not consequences:
            return self._stuck_at_barrier()
        blamed = self._blame(consequences)
        if blamed is None:  # the cause may be on its way (a pipe read later): a moment
            self.give_up = self.give_up or time.monotonic() + CAUSE_WINDOW
            if self.pending and time.monotonic() < self.give_up:
                return None
            return _worker_error(*consequences[0])
        (rank, msg), (r, m) = blamed
        first = m[2].strip().splitlines()[0] if m[2].strip() else ""
        return _worker_error(rank, msg, f" (under on_rank_failure='continue' the others could "
                                        f"not do without it: rank {r} then failed with {m[1]}: "
                                        f"{first[:200]})")

    def _blame(self, consequences: list) -> tuple[tuple, tuple] | None:
        """(cause, consequence): a consequence that names a failed rank as the one it
        needed, else the last cause noted before the first consequence (else any cause)."""
        causes = {r: m for r, m in self.failures if not _needs_the_gone(m)}
        for c in consequences:
            peer = _named_peer(c[1][2])
            if peer in causes:
                return (peer, causes[peer]), c
        if not causes:
            return None
        before = self.failures[:self.failures.index(consequences[0])]
        earlier = [(r, m) for r, m in before if r in causes]
        return (earlier[-1] if earlier else next(iter(causes.items()))), consequences[0]

    def _stuck_at_barrier(self) -> WorkerError | None:
        """Ranks that wait at a shared-memory barrier a gone rank (failed or returned)
        never reached: they could never finish."""
        seg = self.owned
        gone = [r for r, _ in self.failures] + self.returned
        if not (gone and self.pending) or not hasattr(seg, "barrier_counts") or seg.mm.closed:
            return None
        counts = seg.barrier_counts()
        for r in gone:
            waiting = sorted(k for k in self.pending if counts[k] > counts[r])
            if waiting:
                who = ", ".join(map(str, waiting))
                note = (f"; rank{'s' if len(waiting) > 1 else ''} {who} waited for it in a "
                        f"collective (shared-memory barrier number "
                        f"{max(counts[k] for k in waiting)}; it had entered only {counts[r]}), "
                        "so the others could not go on without it and were stopped")
                failed = dict(self.failures)
                if r in failed:
                    return _worker_error(r, failed[r], note)
                return WorkerError(r, f"returned from its function{note}")
        return None

    def results_(self) -> Results:
        failed = dict(self.failures)
        out = Results(RankFailed.from_message(r, failed[r]) if r in failed else v
                      for r, v in enumerate(self.results))
        out.failures = tuple(x for x in out if isinstance(x, RankFailed))
        if any(t is not None for t in self.timelines):
            out.timelines = self.timelines
        return out


def _needs_the_gone(msg: tuple) -> bool:
    """A failure that is a consequence of another rank leaving."""
    return msg[0] == "error" and (msg[4] in ("lost", "timeout") or msg[1] in _NEEDED_GONE)


def _named_peer(text: str) -> int | None:
    """The rank a PeerLeftError or WorkerLeftError says it needed."""
    found = _NAMED_PEER.search(text)
    return int(next(g for g in found.groups() if g)) if found else None


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
