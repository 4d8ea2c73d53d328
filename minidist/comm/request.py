"""A pending message (``Request``) and a communicator's channel (``Channel``).

Both talk to their Communicator through one internal object, ``comm._p2p``
(``point_to_point.py``: post, wait, test, finish a receive, flush acknowledgements, number
the ranks), and
otherwise read only its public attributes (``clock``, ``stats``, ``timeline``,
``eager_limit``, ``timeout``, ``received``, ``rank``, ``world_size``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ..errors import CommTimeout, PeerLeftError, SlowLinkTimeout
from ..transports.clock import bracketed
from .contexts import ANY_SOURCE

if TYPE_CHECKING:
    from .communicator import Communicator

_ALLGATHER_TAG = -(1 << 40)  # a tag of the control channel apart from barrier's rounds


class Request:
    """A pending ``isend``/``irecv``; ``wait()`` blocks until done (returns the source rank
    for a receive) and ``test()`` says whether it is done without blocking."""

    def __init__(self, comm, raw, op: str, peer: int | None, tag: int, nbytes: int,
                 unstage=None, count: bool = True, start: float | None = None):
        self.comm, self.raw, self.op, self.peer, self.tag = comm, raw, op, peer, tag
        self.nbytes, self.unstage, self.count = nbytes, unstage, count
        self.is_recv = op == "irecv"
        self.record = count  # control traffic and sendrecv's halves stay off the timeline
        self.clock = comm.clock
        self.start = comm.clock.now() if start is None else start
        self.source: int | None = None
        self.ack = None  # a send above the eager limit waits for the receiver's acknowledgement
        self._finished = False

    @bracketed
    def test(self) -> bool:
        p2p = self.comm._p2p
        if self.comm.eager_limit is not None:
            p2p.flush_acks()
        if not self._finished and p2p.test(self.raw) and (self.ack is None or p2p.test(self.ack)):
            self._finish()
        return self._finished

    @bracketed
    def wait(self, timeout: float | None = None, op: str | None = None) -> int | None:
        """Block until done; raises ``CommTimeout`` after ``timeout`` (default: the comm's).

        ``op`` names the blocking call in the error (``"recv"`` rather than ``"irecv"``).
        """
        if op is not None:
            self.op = op
        if not self._finished:
            limit = self.comm.timeout if timeout is None else timeout
            if self.comm.eager_limit is None:
                done = self.comm._p2p.wait(self.raw, limit)
            else:
                done = self._wait_acknowledging(limit)
            if not done and getattr(self.raw, "peer_left", False):
                detail = " ".join(filter(None, [self.comm.received.describe(self.peer),
                                                self.comm._p2p.numbering(self.peer)]))
                raise PeerLeftError(self.op, self.peer, self.tag, self.comm.rank, detail)
            if not done and getattr(self.raw, "too_slow", "") and not self.raw.done:
                raise SlowLinkTimeout(self.op, self.peer, self.tag, limit, self.comm.rank,
                                      self.raw.too_slow)  # a slow emulated link
            if not done:
                received = self.comm.received
                detail = received.describe(self.peer) if self.is_recv else self._rendezvous()
                detail = " ".join(filter(None, [detail, self.comm._p2p.numbering(self.peer)]))
                raise CommTimeout(self.op, self.peer, self.tag, limit, self.comm.rank, detail)
            self._finish()
        return self.source

    def _wait_acknowledging(self, limit: float) -> bool:
        """Wait in short slices, acknowledging every large message that has arrived in the
        meantime, as an MPI progress engine does: a rank blocked here must not keep a sender
        elsewhere waiting for its acknowledgement (that would deadlock a ring of sendrecvs)."""
        p2p = self.comm._p2p
        deadline = time.perf_counter() + limit
        while True:
            p2p.flush_acks()
            if p2p.test(self.raw) and (self.ack is None or p2p.test(self.ack)):
                return True
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            # the receive may complete between the test above and this one: never wait on
            # a missing acknowledgement (a receive, or a send below the eager limit)
            pending = self.ack if self.ack is not None and p2p.test(self.raw) else self.raw
            p2p.wait(pending, min(0.002, left))

    def _rendezvous(self) -> str:
        if self.ack is None:
            return ""
        return (f"(This send of {self.nbytes} bytes is above the eager limit of "
                f"{self.comm.eager_limit} bytes, so it waits until rank {self.peer} receives "
                "it, as MPI's standard-mode send does for large messages: post the receive "
                "first, or use sendrecv / isend.)")

    def _finish(self) -> None:
        if self._finished:  # already finished by flush_acks: a second ack would release
            return          # the sender's *next* large send before it is received
        self._finished = True
        comm = self.comm
        if self.is_recv:
            self.source = comm._p2p.finish_receive(self)
            if self.unstage is not None:
                self.unstage()
            if self.count:
                comm.stats.on_recv(self.source, self.nbytes)
        if self.record:
            peer = self.peer if self.peer is not None else self.source
            comm.timeline.record(self.op, self.op, self.start, comm.clock.now(),
                                 self.nbytes, peer)


class Channel:
    """A communicator's point-to-point calls on another of its contexts, counted in ``stats``
    or not. ``comm.control`` is one: the library's coordination traffic."""

    def __init__(self, comm: Communicator, ctx: int, count: bool):
        self.comm, self.ctx, self.count = comm, ctx, count
        self.clock = comm.clock

    def isend(self, tensor, dst: int, tag: int = 0) -> Request:
        return self.comm._p2p.isend(tensor, dst, tag, self.ctx, self.count)

    def irecv(self, tensor, src: int = ANY_SOURCE, tag: int = 0) -> Request:
        return self.comm._p2p.irecv(tensor, src, tag, self.ctx, self.count)

    def send(self, tensor, dst: int, tag: int = 0, op: str = "send") -> None:
        self.isend(tensor, dst, tag).wait(op=op)

    def recv(self, tensor, src: int = ANY_SOURCE, tag: int = 0, op: str = "recv") -> int:
        return self.irecv(tensor, src, tag).wait(op=op)

    @bracketed
    def sendrecv(self, send_tensor, dst: int, recv_tensor, src: int = ANY_SOURCE,
                 tag: int = 0, recv_tag: int | None = None) -> int:
        """Send to ``dst`` and receive from ``src`` at once, without deadlock (a ring step)."""
        comm, start = self.comm, self.clock.now()
        rreq = self.irecv(recv_tensor, src, tag if recv_tag is None else recv_tag)
        sreq = self.isend(send_tensor, dst, tag)
        rreq.record = sreq.record = False
        sreq.wait(op="sendrecv")
        source = rreq.wait(op="sendrecv")
        if self.count:
            comm.timeline.record("sendrecv", "sendrecv", start, self.clock.now(),
                                 sreq.nbytes, comm._p2p.group[dst])
        return source

    @bracketed
    def all_gather_ints(self, values: list[int], op: str = "split") -> list[list[int]]:
        """Every rank's small int vector (same length everywhere), by rank."""
        comm = self.comm
        mine = torch.tensor(values, dtype=torch.int64)
        out = [mine.clone() if r == comm.rank else torch.empty_like(mine)
               for r in range(comm.world_size)]
        recvs = [self.irecv(out[r], r, _ALLGATHER_TAG)
                 for r in range(comm.world_size) if r != comm.rank]
        sends = [self.isend(mine, r, _ALLGATHER_TAG)
                 for r in range(comm.world_size) if r != comm.rank]
        for req in sends + recvs:
            req.wait(op=op)
        return [t.tolist() for t in out]
