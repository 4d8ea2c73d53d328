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
between global ranks; messages carry a context id (``ctx``, one per channel:
``contexts.py``) so that traffic on a split-off communicator never matches a receive on its
parent. What happens to one message (checks, staging, counting, the eager limit's
acknowledgements) is ``point_to_point.py``; a pending message and a channel are ``request.py``.
"""

from __future__ import annotations

import torch

from ..trace import Timeline
from ..transports.clock import WALL, bracketed
from .contexts import ANY_SOURCE, PAYLOAD, WORLD_CTX, Ch, child_ctx
from .point_to_point import PointToPoint
from .receive_log import ReceiveLog
from .request import Channel, Request
from .stats import CommStats

__all__ = ["ANY_SOURCE", "UNDEFINED", "Communicator", "Channel", "Request"]
UNDEFINED = None  # split(color=UNDEFINED) leaves the rank out, as MPI_UNDEFINED does
_EMPTY = torch.empty(0, dtype=torch.uint8)


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
        self.clock = clock  # comm.now(); shared with split-off communicators
        self._rank = rank
        self.timeout = float(timeout)
        self.device = torch.device(device)
        self.stats = CommStats(len(group))
        self.timeline = timeline if timeline is not None else Timeline(transport.rank)
        self._n_splits = 0
        self.eager_limit: int | None = None  # see ``eager_limit`` in the class docstring
        self.received = ReceiveLog()  # what arrived from whom, for timeout texts
        self._p2p = PointToPoint(self, transport, group, ctx)  # request.py's one interface

    # -- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self._p2p.group)

    @property
    def backend(self) -> str:
        return self._p2p.transport.name

    @property
    def is_world(self) -> bool:
        """True for the communicator ``md.launch`` or ``md.init`` returned. A split that kept
        everyone in place is not: the transport's own resources (the shared scratch area,
        the torch process group) belong to one communicator, and a copy using them from
        another thread at the same time would mix the two communicators' collectives."""
        return self._p2p.ctx == WORLD_CTX

    def channel(self, which: Ch) -> Channel:
        """This communicator's channel ``which`` (``md.comm.contexts.Ch``: USER, CONTROL,
        COLLECTIVE, STRATEGY, CHECK): point-to-point calls on its own context, counted in
        ``stats`` when it carries payload (``contexts.py``'s table)."""
        return Channel(self, self._p2p.ctx + Ch(which), count=Ch(which) in PAYLOAD)

    @property
    def control(self) -> Channel:
        """The library's uncounted channel: point-to-point on this communicator's control
        context, apart from user and collective traffic and not in ``stats``. Barrier,
        split and the collectives' agreement check talk here."""
        return self.channel(Ch.CONTROL)

    @property
    def collective(self) -> Channel:
        """The collectives' channel: point-to-point on a context of its own, counted in
        ``stats`` and on the timeline like user messages, but apart from them, so a user's
        message can never be taken by a collective (or the reverse), whatever its tag."""
        return self.channel(Ch.COLLECTIVE)

    @property
    def strategy(self) -> Channel:
        """The strategies' channel: their point-to-point payload (the parameter server's
        pushes and pulls, the pipeline's activations and gradients), counted in ``stats``
        like user messages but on a context of its own, so neither a user's message nor a
        collective's can be taken for one (``contexts.py``)."""
        return self.channel(Ch.STRATEGY)

    def capability(self, name: str):
        """An optional capability of the transport (``transports/protocol.py``), or None:
        ``"shared_scratch"`` (the local transport's shared-memory scratch area),
        ``"shared_memory"`` (shared memory blocks ranks map by name, local transport),
        ``"process_group"`` (the torch transport's ``torch.distributed`` group)."""
        get = getattr(self._p2p.transport, "capability", None)
        return None if get is None else get(name)

    def wrap_transport(self, wrap):
        """Put ``wrap(transport)`` (the same protocol) between this communicator and its
        transport, e.g. to observe traffic or refuse capabilities, as the grader does;
        returns the wrapper. Communicators split off afterwards share it."""
        self._p2p.transport = wrap(self._p2p.transport)
        return self._p2p.transport

    def now(self) -> float:
        """This rank's time in seconds: ``time.perf_counter()``, or under ``md.launch(...,
        clock="virtual")`` the calling thread's virtual time since launch (the same clock on
        every communicator split from this one)."""
        return self.clock.now()

    @property
    def global_rank(self) -> int:
        """This rank's number in the world communicator it was split from."""
        return self._p2p.transport.rank

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
        return self._p2p.isend(tensor, dst, tag, self._p2p.ctx + Ch.USER, count=True)

    def irecv(self, tensor, src: int = ANY_SOURCE, tag: int = 0) -> Request:
        """Start receiving into ``tensor``; ``wait()`` returns the source rank."""
        return self._p2p.irecv(tensor, src, tag, self._p2p.ctx + Ch.USER, count=True)

    def sendrecv(self, send_tensor, dst: int, recv_tensor, src: int = ANY_SOURCE,
                 send_tag: int = 0, recv_tag: int | None = None) -> int:
        """Send to ``dst`` and receive from ``src`` at once, without deadlock (a ring step)."""
        user = self.channel(Ch.USER)
        return user.sendrecv(send_tensor, dst, recv_tensor, src, send_tag, recv_tag)

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
        ctx = child_ctx(self._p2p.ctx, self._n_splits, color)
        child = Communicator(self._p2p.transport, tuple(self._p2p.group[r] for r in ranks),
                             ranks.index(self.rank), ctx, self.timeout, self.device,
                             self.timeline, self.clock)
        child.eager_limit = self.eager_limit
        return child

    def close(self) -> None:
        self._p2p.transport.close()
