"""The exceptions minidist raises. Each one names the mistake, the rank and the peer."""

from __future__ import annotations


class MinidistError(Exception):
    """Base class of every minidist error."""


class CommError(MinidistError):
    """A communication operation failed."""


class CommTimeout(CommError, TimeoutError):
    """A blocking operation waited longer than the communicator's timeout.

    Carries ``op`` (``"recv"``, ``"send"``, ``"barrier"``...), ``peer`` (a rank, or ``None``
    for any source), ``tag`` and ``timeout`` so that a deadlock reads as a sentence.
    """

    def __init__(self, op: str, peer: int | None, tag: int | None, timeout: float, rank: int = -1,
                 detail: str = ""):
        self.op, self.peer, self.tag, self.timeout, self.rank = op, peer, tag, timeout, rank
        self.detail = detail
        who = "any rank" if peer is None else f"rank {peer}"
        where = f"rank {rank}: " if rank >= 0 else ""
        if "recv" in op:
            hint = f"{who} never sent a matching message (same tag, same communicator)"
        elif "send" in op:
            hint = f"{who} never received it"
        else:
            hint = "not every rank reached it"
        with_who = "" if peer is None and "barrier" in op else f" with {who}"
        tag_txt = "" if tag is None else f" (tag {tag})"
        super().__init__(
            f"{where}{op}{with_who}{tag_txt} timed out after {timeout:g} s: {hint}. "
            "Is every rank waiting for another one (a deadlock)?" + (f" {detail}" if detail else "")
        )

    def __reduce__(self):
        return (CommTimeout, (self.op, self.peer, self.tag, self.timeout, self.rank,
                              self.detail))


class PeerLeftError(CommTimeout):
    """A receive named a rank that has already returned from its function (its transport is
    closed) without sending a matching message: nothing can arrive any more, so the wait
    ends at once instead of at the timeout. A ``CommTimeout`` (a wait that cannot end), so
    code that catches deadlocks catches this too."""

    def __init__(self, op: str, peer: int, tag: int, rank: int, detail: str = ""):
        self.op, self.peer, self.tag, self.timeout, self.rank = op, peer, tag, 0.0, rank
        self.detail = detail
        CommError.__init__(
            self, f"rank {rank}: {op} from rank {peer} (tag {tag}) can never complete: rank "
                  f"{peer} has already returned from its function without sending a matching "
                  "message." + (f" {detail}" if detail else ""))

    def __reduce__(self):
        return (PeerLeftError, (self.op, self.peer, self.tag, self.rank, self.detail))


class SlowLinkTimeout(CommTimeout):
    """On the emulated network, a message the link model makes take longer than the
    timeout: its own ``alpha + n / bandwidth`` (raised at the send, before anything is
    sent), or its wait behind earlier messages on the same ports (raised when the wait runs
    out). A slow link, not a deadlock; a ``CommTimeout``, so code that catches timeouts
    catches this too. ``detail`` gives the link, the message's size and its modelled time."""

    def __init__(self, op: str, peer: int | None, tag: int | None, timeout: float,
                 rank: int = -1, detail: str = ""):
        self.op, self.peer, self.tag, self.timeout, self.rank = op, peer, tag, timeout, rank
        self.detail = detail
        who = "any rank" if peer is None else f"rank {peer}"
        where = f"rank {rank}: " if rank >= 0 else ""
        tag_txt = "" if tag is None else f" (tag {tag})"
        CommError.__init__(
            self, f"{where}{op} with {who}{tag_txt} cannot finish within the timeout of "
                  f"{timeout:g} s: {detail} This is the emulated link's model, not a "
                  "deadlock: raise the timeout (md.launch(..., timeout=...) or "
                  "MINIDIST_TIMEOUT) or the link's bandwidth.")

    def __reduce__(self):
        return (SlowLinkTimeout, (self.op, self.peer, self.tag, self.timeout, self.rank,
                                  self.detail))


class MessageMismatchError(CommError, ValueError):
    """Sender and receiver disagree on a message's size or dtype."""


class CollectiveMismatchError(MessageMismatchError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


class WorkerError(MinidistError):
    """A rank started by :func:`minidist.launch` raised or died.

    ``rank`` is the failing rank, ``exc_type`` the name of its exception (or ``None`` when the
    process died without raising) and ``remote_traceback`` the rank's formatted traceback.
    """

    def __init__(self, rank: int, message: str, exc_type: str | None = None,
                 remote_traceback: str = ""):
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        self.message = message
        text = f"rank {rank} failed: {message}"
        if remote_traceback:
            text += f"\n\n--- traceback of rank {rank} ---\n{remote_traceback.rstrip()}"
        Exception.__init__(self, text)


class WorkerCommTimeout(WorkerError, CommTimeout):
    """A rank failed with :class:`CommTimeout`; catchable as either exception."""

    def __init__(self, rank: int, message: str, exc_type: str | None = None,
                 remote_traceback: str = ""):
        WorkerError.__init__(self, rank, message, exc_type, remote_traceback)
        self.op = self.peer = self.tag = None
        self.timeout = 0.0

    __reduce__ = Exception.__reduce__


class WorkerLeftError(MinidistError):
    """In ``mode="sync"`` with ``on_worker_exit="error"``, a worker closed or died while the
    others still needed its gradient for a step. Carries ``worker`` (its rank), ``reason``
    (``"closed"`` or ``"died"``) and ``step`` (the step it never pushed)."""

    def __init__(self, server: int, worker: int, reason: str, step: int):
        self.server, self.worker, self.reason, self.step = server, worker, reason, step
        how = ("called close()" if reason == "closed"
               else "returned without calling close() (it died)")
        super().__init__(
            f"rank {server} (parameter server, mode='sync'): worker rank {worker} {how} after "
            f"{step} steps, but the other workers went on to step {step + 1}, which needs its "
            "gradient. Make every worker run the same number of steps, or pass "
            "on_worker_exit='continue' to average over the workers that remain.")

    def __reduce__(self):
        return (WorkerLeftError, (self.server, self.worker, self.reason, self.step))
