"""The Communicator: point-to-point messages between the ranks of a group.

Names follow torch.distributed (``send``, ``recv``, ``dst``, ``src``) and mpi4py
(``split(color, key)``, ``ANY_SOURCE``, ranks local to their communicator). A Communicator
checks what the user passed, translates local ranks to the transport's global ranks, keeps
the byte counters (``stats``) and the timeline, and turns a wait that lasts too long into a
``CommTimeout`` that names the operation, the peer and the tag.

Time: ``comm.now()`` is the rank's clock (``transports/clock.py``): the wall clock, or under
``md.launch(..., clock="virtual")`` the calling thread's virtual time. Every communication
call is ``@bracketed`` by it (the computation since the previous call is charged at entry;
what the library does inside is not), and the timeline records its times. Timeouts are
always wall-clock seconds.

The transport underneath (``transports/local.py`` or ``transports/torch_dist.py``) moves bytes
between global ranks; messages carry a context id (``ctx``) so that traffic on a split-off
communicator never matches a receive on its parent.
"""

from __future__ import annotations

import logging
import time

import torch

from ..errors import CommTimeout, MessageMismatchError, PeerLeftError, SlowLinkTimeout
from ..trace import Timeline
from ..transports.clock import WALL, bracketed
from . import tensors
from .contexts import ACK, ACK_CODE, PAYLOAD, WORLD_CTX, Ch, ack_tag, check_tag, child_ctx
from .receive_log import ReceiveLog
from .stats import CommStats

ANY_SOURCE = -1
UNDEFINED = None  # split(color=UNDEFINED) leaves the rank out, as MPI_UNDEFINED does
# A communicator's four contexts (user, control, collectives, acknowledgements): contexts.py.
_EMPTY = torch.empty(0, dtype=torch.uint8)
# Tags of the control context (ctx + 1): barrier rounds use -1, -2, -4, ...; these are apart.
_ALLGATHER_TAG = -(1 << 40)
log = logging.getLogger("minidist")


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
        tr = self.comm._transport
        if self.comm.eager_limit is not None:
            self.comm._flush_acks()
        if not self._finished and tr.test(self.raw) and (self.ack is None or tr.test(self.ack)):
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
                done = self.comm._transport.wait(self.raw, limit)
            else:
                done = self._wait_acknowledging(limit)
            if not done and getattr(self.raw, "peer_left", False):
                detail = " ".join(filter(None, [self.comm.received.describe(self.peer),
                                                self.comm._numbering(self.peer)]))
                raise PeerLeftError(self.op, self.peer, self.tag, self.comm.rank, detail)
            if not done and getattr(self.raw, "too_slow", "") and not self.raw.done:
                raise SlowLinkTimeout(self.op, self.peer, self.tag, limit, self.comm.rank,
                                      self.raw.too_slow)  # a slow emulated link
            if not done:
                received = self.comm.received
                detail = received.describe(self.peer) if self.is_recv else self._rendezvous()
                detail = " ".join(filter(None, [detail, self.comm._numbering(self.peer)]))
                raise CommTimeout(self.op, self.peer, self.tag, limit, self.comm.rank, detail)
            self._finish()
        return self.source

    def _wait_acknowledging(self, limit: float) -> bool:
        """Wait in short slices, acknowledging every large message that has arrived in the
        meantime, as an MPI progress engine does: a rank blocked here must not keep a sender
        elsewhere waiting for its acknowledgement (that would deadlock a ring of sendrecvs)."""
        comm, tr = self.comm, self.comm._transport
        deadline = time.perf_counter() + limit
        while True:
            comm._flush_acks()
            if tr.test(self.raw) and (self.ack is None or tr.test(self.ack)):
                return True
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            # the receive may complete between the test above and this one: never wait on
            # a missing acknowledgement (a receive, or a send below the eager limit)
            pending = self.ack if self.ack is not None and tr.test(self.raw) else self.raw
            tr.wait(pending, min(0.002, left))

    def _rendezvous(self) -> str:
        if self.ack is None:
            return ""
        return (f"(This send of {self.nbytes} bytes is above the eager limit of "
                f"{self.comm.eager_limit} bytes, so it waits until rank {self.peer} receives "
                "it, as MPI's standard-mode send does for large messages: post the receive "
                "first, or use sendrecv / isend.)")

    def _finish(self) -> None:
        if self._finished:  # already finished by _flush_acks: a second ack would release
            return          # the sender's *next* large send before it is received
        self._finished = True
        comm = self.comm
        if self.is_recv:
            self.source = comm._check_received(self)
            comm.received.note(self.source, self.tag, self.peer is None)
            comm._acknowledge(self)
            if self.unstage is not None:
                self.unstage()
            if self.count:
                comm.stats.on_recv(self.source, self.nbytes)
        if self.record:
            peer = self.peer if self.peer is not None else self.source
            comm.timeline.record(self.op, self.op, self.start, comm.clock.now(),
                                 self.nbytes, peer)


class Communicator:
    """A group of ranks that exchange messages. Create one with ``md.launch`` or ``md.init``.

    ``eager_limit`` (bytes, default None: every send is eager): a send of more bytes than
    this completes only once the receiver has received it, as MPI's standard-mode send does
    above its eager threshold (rendezvous). A program whose ranks all send before they
    receive then deadlocks, as it would on a real cluster, instead of working by luck
    because messages are buffered. Set it on every rank (``comm.eager_limit = 0``); split-off
    communicators inherit it. The acknowledgement travels on its own context and is not
    counted in ``stats``.
    """

    def __init__(self, transport, group: tuple[int, ...], rank: int, ctx: int = WORLD_CTX,
                 timeout: float = 60.0, device: torch.device | str = "cpu",
                 timeline: Timeline | None = None, clock=WALL):
        self._transport = transport
        self.clock = clock  # comm.now(); shared with split-off communicators
        self._group = tuple(group)
        self._local = {g: i for i, g in enumerate(self._group)}
        self._rank, self._ctx = rank, ctx
        self.timeout = float(timeout)
        self.device = torch.device(device)
        self.stats = CommStats(len(self._group))
        self.timeline = timeline if timeline is not None else Timeline(transport.rank)
        self._n_splits = 0
        self.eager_limit: int | None = None  # see ``eager_limit`` in the class docstring
        self._unacked: list[Request] = []  # posted receives whose sender awaits an ack
        self.received = ReceiveLog()  # what arrived from whom, for timeout texts

    # -- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self._group)

    @property
    def backend(self) -> str:
        return self._transport.name

    @property
    def is_world(self) -> bool:
        """True for the communicator ``md.launch`` or ``md.init`` returned. A split that kept
        everyone in place is not: the transport's own resources (the shared scratch area,
        the torch process group) belong to one communicator, and a copy using them from
        another thread at the same time would mix the two communicators' collectives."""
        return self._ctx == WORLD_CTX

    @property
    def control(self) -> Channel:
        """The library's uncounted channel: point-to-point on this communicator's control
        context, apart from user and collective traffic and not in ``stats``. Barrier,
        split and the collectives' agreement check talk here."""
        return Channel(self, self._ctx + Ch.CONTROL, count=False)

    @property
    def collective(self) -> Channel:
        """The collectives' channel: point-to-point on a context of its own, counted in
        ``stats`` and on the timeline like user messages, but apart from them, so a user's
        message can never be taken by a collective (or the reverse), whatever its tag."""
        return Channel(self, self._ctx + Ch.COLLECTIVE, count=True)

    @property
    def strategy(self) -> Channel:
        """The strategies' channel: their point-to-point payload (the parameter server's
        pushes and pulls, the pipeline's activations and gradients), counted in ``stats``
        like user messages but on a context of its own, so neither a user's message nor a
        collective's can be taken for one (``contexts.py``)."""
        return Channel(self, self._ctx + Ch.STRATEGY, count=True)

    def capability(self, name: str):
        """An optional capability of the transport (``transports/protocol.py``), or None:
        ``"shared_scratch"`` (the local transport's shared-memory scratch area),
        ``"shared_memory"`` (shared memory blocks ranks map by name, local transport),
        ``"process_group"`` (the torch transport's ``torch.distributed`` group)."""
        get = getattr(self._transport, "capability", None)
        return None if get is None else get(name)

    def wrap_transport(self, wrap):
        """Put ``wrap(transport)`` (the same protocol) between this communicator and its
        transport, e.g. to observe traffic or refuse capabilities, as the grader does;
        returns the wrapper. Communicators split off afterwards share it."""
        self._transport = wrap(self._transport)
        return self._transport

    def now(self) -> float:
        """This rank's time in seconds: ``time.perf_counter()``, or under ``md.launch(...,
        clock="virtual")`` the calling thread's virtual time since launch (the same clock on
        every communicator split from this one)."""
        return self.clock.now()

    @property
    def global_rank(self) -> int:
        """This rank's number in the world communicator it was split from."""
        return self._transport.rank

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend!r}, device={str(self.device)!r})")

    # -- point to point ---------------------------------------------------------------------
    def send(self, tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to rank ``dst``; returns once the tensor may be reused."""
        self.isend(tensor, dst, tag).wait(op="send")

    def recv(self, tensor, src: int = ANY_SOURCE, tag: int = 0) -> int:
        """Receive into ``tensor`` (same dtype and size as the message); returns the source."""
        return self.irecv(tensor, src, tag).wait(op="recv")

    def isend(self, tensor, dst: int, tag: int = 0) -> Request:
        """Start sending; the tensor must stay unchanged until ``wait()`` returns."""
        return self._isend(tensor, dst, tag, self._ctx + Ch.USER, count=True)

    def irecv(self, tensor, src: int = ANY_SOURCE, tag: int = 0) -> Request:
        """Start receiving into ``tensor``; ``wait()`` returns the source rank."""
        return self._irecv(tensor, src, tag, self._ctx + Ch.USER, count=True)

    def sendrecv(self, send_tensor, dst: int, recv_tensor, src: int = ANY_SOURCE,
                 send_tag: int = 0, recv_tag: int | None = None) -> int:
        """Send to ``dst`` and receive from ``src`` at once, without deadlock (a ring step)."""
        user = Channel(self, self._ctx + Ch.USER, count=True)
        return user.sendrecv(send_tensor, dst, recv_tensor, src, send_tag, recv_tag)

    @bracketed
    def _isend(self, tensor, dst: int, tag: int, ctx: int, count: bool) -> Request:
        t = tensors.as_tensor(tensor, "send buffer")
        self._check_peer(dst, "dst")
        check_tag(tag)
        if t.is_cuda and not self._transport.cuda_native:  # staged through host memory
            t = t.cpu()
        n, start = tensors.nbytes(t), self.clock.now()  # before the transport copies
        if count:
            self.stats.on_send(dst, n)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d -> %d: %s %s (%d bytes), tag %d", self.rank, dst,
                      str(t.dtype).replace("torch.", ""), tuple(t.shape), n, tag)
        raw = self._transport.isend(t, self._group[dst], ctx, tag, tensors.DTYPE_CODE[t.dtype])
        req = Request(self, raw, "isend", dst, tag, n, count=count, start=start)
        if self._rendezvous(ctx, n):
            self._check_rendezvous_backend()
            req.ack = self._transport.irecv(ACK, self._group[dst], self._ctx + Ch.ACK,
                                            ack_tag(Ch(ctx - self._ctx), tag), ACK_CODE)
        return req

    @bracketed
    def _irecv(self, tensor, src: int, tag: int, ctx: int, count: bool) -> Request:
        t = tensors.as_tensor(tensor, "receive buffer")
        if src != ANY_SOURCE:
            self._check_peer(src, "src")
        check_tag(tag)
        target, unstage = t, None
        if t.is_cuda and not self._transport.cuda_native:
            target = torch.empty(t.shape, dtype=t.dtype)
            unstage = lambda: t.copy_(target)  # noqa: E731
        gsrc = self._group[src] if src != ANY_SOURCE else ANY_SOURCE
        raw = self._transport.irecv(target, gsrc, ctx, tag, tensors.DTYPE_CODE[t.dtype])
        peer = None if src == ANY_SOURCE else src
        req = Request(self, raw, "irecv", peer, tag, tensors.nbytes(t), unstage, count)
        req.ctx = ctx
        if self._rendezvous(ctx, req.nbytes):
            self._check_rendezvous_backend()
            self._unacked.append(req)
        return req

    def _check_received(self, req: Request) -> int:
        raw = req.raw
        source = self._local.get(raw.source, raw.source)
        if raw.mismatch:
            raise MessageMismatchError(
                f"rank {self.rank}: the message from rank {source} (tag {req.tag}) holds "
                f"{raw.msg_nbytes} bytes of {tensors.dtype_name(raw.msg_code)}, but the "
                f"receive buffer holds {raw.nbytes} bytes of {tensors.dtype_name(raw.code)}; "
                "sender and receiver must use the same dtype and number of elements")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d <- %d: %d bytes, tag %d", self.rank, source, raw.nbytes, req.tag)
        return source

    def _rendezvous(self, ctx: int, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` on ``ctx`` is acknowledged (payload channels'
        traffic above the eager limit: user, collective, strategy; never control)."""
        return (self.eager_limit is not None and nbytes > self.eager_limit
                and ctx - self._ctx in PAYLOAD)

    def _check_rendezvous_backend(self) -> None:
        if self._transport.name == "torch":
            raise ValueError("eager_limit works on the local backend and the emulated network; "
                             "on the torch backend leave it None (gloo and NCCL apply their "
                             "own eager and rendezvous protocols)")

    def _flush_acks(self) -> None:
        """Finish (and so acknowledge) every large receive that has arrived."""
        for req in list(self._unacked):
            if req._finished or req.raw.mismatch:  # a mismatch is reported by its own wait
                self._unacked.remove(req)
            elif self._transport.test(req.raw):
                req._finish()

    def _acknowledge(self, req: Request) -> None:
        """The receiving side of a rendezvous: tell the sender its message has arrived.
        Both sides know the size (a mismatched one is an error), so they agree on it."""
        if req in self._unacked:
            self._unacked.remove(req)
        if not req.raw.mismatch and self._rendezvous(req.ctx, req.nbytes):
            self._transport.isend(ACK, self._group[req.source], self._ctx + Ch.ACK,
                                  ack_tag(Ch(req.ctx - self._ctx), req.tag), ACK_CODE)

    def _numbering(self, peer: int | None) -> str:
        """On a split communicator, errors use its own (local) ranks: say which world ranks
        they are, since the launcher reports world ranks."""
        if self.is_world:
            return ""
        theirs = "" if peer is None else f", its rank {peer} is world rank {self._group[peer]}"
        return (f"(Ranks here are those of a split communicator of {self.world_size}: its rank "
                f"{self.rank} is world rank {self._group[self.rank]}{theirs}.)")

    def _check_peer(self, peer, what: str) -> None:
        if isinstance(peer, bool) or not isinstance(peer, int):
            if not hasattr(peer, "__index__"):
                raise TypeError(f"{what} must be an integer rank, got {type(peer).__name__}")
        if not 0 <= int(peer) < self.world_size:
            raise ValueError(f"{what}={peer} is outside the communicator: world_size is "
                             f"{self.world_size}, so valid ranks are 0..{self.world_size - 1}")

    # -- group operations -------------------------------------------------------------------
    @bracketed
    def barrier(self) -> None:
        """Wait until every rank has reached the barrier.

        Dissemination barrier (Hensgen, Finkel and Manber 1988): in round k, rank r signals
        r + 2^k and waits for r - 2^k; after ceil(log2 p) rounds everyone has heard, directly
        or not, from everyone. Cost: ceil(log2 p) * alpha.
        """
        start, p, k, control = self.clock.now(), self.world_size, 1, self.control
        while k < p:
            dst, src = (self.rank + k) % p, (self.rank - k) % p
            r = control.irecv(_EMPTY, src, -k)
            control.isend(_EMPTY, dst, -k).wait(op="barrier")
            r.wait(op="barrier")
            k *= 2
        self.timeline.record("barrier", "barrier", start, self.clock.now())

    @bracketed
    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """Partition the ranks by ``color``; order each part by ``(key, rank)`` (mpi4py).

        Every rank must call it. A rank passing ``color=None`` (``md.UNDEFINED``) gets None.
        """
        if color is not None and (not isinstance(color, int) or color < 0):
            raise ValueError(f"color must be a non-negative int or None, got {color!r}")
        key = self.rank if key is None else key
        if not isinstance(key, int):
            raise TypeError(f"key must be an int, got {type(key).__name__}")
        table = self.control.all_gather_ints([-1 if color is None else color, key])
        self._n_splits += 1
        if color is None:
            return None
        members = sorted((k, r) for r, (c, k) in enumerate(table) if c == color)
        ranks = [r for _, r in members]
        ctx = child_ctx(self._ctx, self._n_splits, color)
        child = Communicator(self._transport, tuple(self._group[r] for r in ranks),
                             ranks.index(self.rank), ctx, self.timeout, self.device,
                             self.timeline, self.clock)
        child.eager_limit = self.eager_limit
        return child

    def close(self) -> None:
        self._transport.close()


class Channel:
    """A communicator's point-to-point calls on another of its contexts, counted in ``stats``
    or not. ``comm.control`` is one: the library's coordination traffic."""

    def __init__(self, comm: Communicator, ctx: int, count: bool):
        self.comm, self.ctx, self.count = comm, ctx, count
        self.clock = comm.clock

    def isend(self, tensor, dst: int, tag: int = 0) -> Request:
        return self.comm._isend(tensor, dst, tag, self.ctx, self.count)

    def irecv(self, tensor, src: int = ANY_SOURCE, tag: int = 0) -> Request:
        return self.comm._irecv(tensor, src, tag, self.ctx, self.count)

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
                                 sreq.nbytes, comm._group[dst])
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
