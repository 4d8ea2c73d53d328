"""Watching the ranks of one ``md.launch``: their results, the first failure and whom it is
to blame, and the teardown that leaves nothing behind.

Blame: when a rank leaves (returns early, skips a collective, exits or is killed), the ranks
still talking to it fail too, on gloo with a "Connection reset by peer" that says nothing of
the cause, and often before the caller has even seen the rank go. So a lost connection is a
consequence: the caller waits a moment (``CAUSE_WINDOW``) for the cause and reports the rank
that left first: one that died, else one whose error is not a lost connection, else the
first rank that returned while others were still running. On the local backend a rank that
returned makes the others wait at a shared-memory barrier it will never reach; the caller
sees that in the barrier counters and stops them at once, naming the rank.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from contextlib import contextmanager

from multiprocess.connection import wait as wait_any

from ..errors import PeerLeftError, WorkerCommTimeout, WorkerError

CAUSE_WINDOW = 1.0  # seconds to wait for the cause after a rank lost a connection
LOST = re.compile(r"Connection (?:reset|closed|refused) by peer|Connection refused|"
                  r"Broken pipe|Socket closed", re.IGNORECASE)
_HELD = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


class Results(list):
    """The per-rank return values, in rank order. With ``trace=True``, ``timelines`` holds
    each rank's recorded events (see ``minidist.trace``). Under ``on_rank_failure=
    "continue"``, a failed rank's slot holds an ``md.RankFailed`` and ``failures`` lists
    them (``failures.py``); otherwise it is empty."""

    timelines: list[list[dict]] | None = None
    failures: tuple = ()


def failure_kind(e: BaseException, is_timeout: bool) -> str | None:
    """How the caller weighs a rank's exception: ``"lost"`` (a consequence of another rank
    leaving: a broken connection, or a receive from a rank whose transport had closed,
    ``PeerLeftError``), ``"timeout"`` or None (a cause in itself).

    ``PeerLeftError`` is checked first: it is a ``CommTimeout`` too, but a rank that raised
    closes its transport right after sending its own report, so a survivor's PeerLeftError
    can reach the caller in the same instant as the report that caused it, and must never
    be taken for the cause."""
    if isinstance(e, PeerLeftError):
        return "lost"
    if is_timeout:
        return "timeout"
    return "lost" if isinstance(e, RuntimeError) and LOST.search(str(e)) else None


class _Watch:
    """What the caller has learned so far about each rank."""

    def __init__(self, procs, conns, owned):
        n = len(procs)
        self.procs, self.conns, self.owned = procs, conns, owned
        self.results, self.timelines = [None] * n, [None] * n
        self.pending = set(range(n))
        self.returned: list[int] = []  # ranks that returned while others still ran, in order
        self.failures: list[tuple[int, tuple]] = []  # (rank, message), in arrival order

    def note(self, rank: int, msg: tuple) -> None:
        self.pending.discard(rank)
        if msg[0] == "ok":
            self.results[rank], self.timelines[rank] = msg[1], msg[2]
            if self.pending:
                self.returned.append(rank)
        else:
            self.failures.append((rank, msg))

    def cause(self):
        """The first failure that is a cause (a death or an error other than a lost
        connection), or None."""
        return next(((r, m) for r, m in self.failures if m[0] == "died" or m[4] != "lost"),
                    None)

    def error(self) -> WorkerError:
        cause = self.cause()
        if cause is not None:
            return _worker_error(*cause, self._note_returned(cause[0]))
        rank, msg = self.failures[0]
        if self.returned:
            left = self.returned[0]
            found = LOST.search(msg[2])
            phrase = found.group(0) if found else "its peer had left"
            return WorkerError(left, f"returned from its function while the other ranks still "
                                     f"needed it; rank {rank} then failed with {msg[1]} "
                                     f"({phrase})")
        return _worker_error(rank, msg)

    def _note_returned(self, rank: int) -> str:
        others = [r for r in self.returned if r != rank]
        if not others:
            return ""
        many = len(others) > 1
        return (f" (rank{'s' if many else ''} {_ranks(others)} had already returned from "
                f"{'their functions' if many else 'its function'})")

    def stuck_at_barrier(self) -> WorkerError | None:
        """Ranks that wait at a shared-memory barrier a returned rank never reached."""
        counts = getattr(self.owned, "barrier_counts", None)
        if not (self.returned and self.pending) or counts is None or self.owned.mm.closed:
            return None
        counts = counts()
        for r in self.returned:
            waiting = sorted(k for k in self.pending if counts[k] > counts[r])
            if waiting:
                return WorkerError(r, (
                    f"returned from its function while rank{'s' if len(waiting) > 1 else ''} "
                    f"{_ranks(waiting)} waited for it in a collective (their shared-memory "
                    f"barrier number {max(counts[k] for k in waiting)}; it had entered only "
                    f"{counts[r]}); the other ranks were stopped"))
        return None

    def results_(self) -> Results:
        out = Results(self.results)
        if any(t is not None for t in self.timelines):
            out.timelines = self.timelines
        return out


def collect(procs, conns, owned) -> Results:
    """Wait for every rank's result; raise WorkerError for the rank to blame."""
    w = _Watch(procs, conns, owned)
    by_conn = {c: r for r, c in enumerate(conns)}
    by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}
    give_up = None
    while True:
        _unlink_when_attached(owned)
        if w.failures:
            give_up = give_up or time.monotonic() + CAUSE_WINDOW
            if w.cause() or not w.pending or time.monotonic() >= give_up:
                raise w.error()
        elif not w.pending:
            return w.results_()
        stuck = w.stuck_at_barrier()
        if stuck is not None:
            raise stuck
        wait = 0.02 if w.failures else 0.002 if getattr(owned, "name", None) else 0.1
        ready = wait_any([conns[r] for r in w.pending] + [procs[r].sentinel for r in w.pending],
                         timeout=wait)
        for obj in ready:
            rank = by_conn.get(obj, by_sentinel.get(obj))
            if rank in w.pending:
                msg = _read_result(conns[rank], procs[rank], obj in by_conn)
                if msg is not None:
                    w.note(rank, msg)


def _read_result(conn, proc, from_pipe: bool):
    """The rank's message, None if there is none yet, or a 'died' error if it is gone."""
    if conn.poll():
        try:
            return conn.recv()
        except (EOFError, OSError):
            pass
    elif from_pipe is False and proc.exitcode is None:
        return None
    proc.join(1.0)
    return ("died", proc.exitcode)


def _worker_error(rank: int, msg, note: str = "") -> WorkerError:
    if msg[0] == "died":
        return WorkerError(rank, f"the process died without raising ({_describe_exit(msg[1])})"
                                 f"{note}")
    _, exc_type, text, tb, kind = msg
    cls = WorkerCommTimeout if kind == "timeout" else WorkerError
    return cls(rank, f"{exc_type}: {text}{note}", exc_type, tb)


def _describe_exit(code) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _unlink_when_attached(owned) -> None:
    """Remove the segment's name once every rank has mapped it: nothing can leak after."""
    if getattr(owned, "owner", False) and owned.name and owned.all_attached():
        owned.unlink()
        owned.name = None


@contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP while ranks are started or torn down, so that an
    interrupt (or two, 20 ms apart) cannot cut either in half: a rank started but not yet
    recorded, or ranks left running, unjoined, with the segment mapped. A signal that
    arrives meanwhile is delivered as the section ends. (Only the main thread can.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {}
    for s in _HELD:
        if signal.getsignal(s) not in (signal.SIG_IGN, None):
            old[s] = signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(got):
            signal.raise_signal(s)


def teardown(procs, conns, owned, grace: float) -> None:
    """Let finished ranks exit (``grace`` seconds), stop the rest (SIGTERM, then SIGKILL),
    close the pipes and release the shared segment."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    for c in conns:
        c.close()
    if hasattr(owned, "all_attached"):  # a shared segment
        owned.unlink()
        owned.close()
