"""What a Communicator does with one message: ``comm._p2p``, the one internal interface
that ``Request`` and ``Channel`` (``request.py``) use.

It owns the transport, the group (local rank -> transport rank), the base context and the
eager limit's rendezvous state, and it does, for a send or a receive: check the buffer,
the peer and the tag, stage a CUDA tensor through host memory when the transport cannot
carry it, count it in ``stats``, post it on the transport with its channel's context,
and, when the communicator's ``eager_limit`` asks for it, post or send the
acknowledgement (a rendezvous, as MPI's standard-mode send above its eager threshold).
A completed receive is checked (size and dtype, an error naming both sides), logged for
timeout texts, and acknowledged.
"""

from __future__ import annotations

import logging

import torch

from .. import checks
from ..errors import MessageMismatchError
from ..transports.clock import bracketed
from . import tensors
from .contexts import ACK, ACK_CODE, ANY_SOURCE, PAYLOAD, Ch, ack_tag, check_tag
from .request import Request

log = logging.getLogger("minidist")


class PointToPoint:
    """The message engine of ``comm`` over ``transport`` for ranks ``group`` (module
    docstring); ``ctx``: the communicator's base context (``contexts.py``)."""

    def __init__(self, comm, transport, group: tuple[int, ...], ctx: int):
        self.comm, self.transport, self.ctx = comm, transport, ctx
        self.group = tuple(group)
        self.local = {g: i for i, g in enumerate(self.group)}
        self.unacked: list[Request] = []  # posted receives whose sender awaits an ack
        self.clock = comm.clock  # ``bracketed`` brackets the posting calls on it

    def wait(self, raw, timeout: float) -> bool:
        return self.transport.wait(raw, timeout)

    def test(self, raw) -> bool:
        return self.transport.test(raw)

    def _wire_tensor(self, t: torch.Tensor, receive: bool = False) -> torch.Tensor:
        """What the transport carries for ``t``: ``t`` itself, or a staged copy (a receive:
        an empty buffer, copied into ``t`` when it completes). The local transport and gloo
        carry host memory, so a CUDA tensor goes through the host; NCCL carries only CUDA
        tensors (``cuda_native``), so a CPU tensor goes through the communicator's device:
        the library's own small messages (flags, shape headers, agreement checks, split's
        table) are CPU tensors, whatever the model's device."""
        native = self.transport.cuda_native
        if t.is_cuda == native:
            return t
        device = self.comm.device if native else torch.device("cpu")
        if receive:
            return torch.empty(t.shape, dtype=t.dtype, device=device)
        return t.to(device)

    @bracketed
    def isend(self, tensor, dst: int, tag: int, ctx: int, count: bool) -> Request:
        t = tensors.as_tensor(tensor, "send buffer")
        self._check_peer(dst, "dst")
        check_tag(tag)
        t = self._wire_tensor(t)
        n, start = tensors.nbytes(t), self.comm.clock.now()  # before the transport copies
        if count:
            self.comm.stats.on_send(dst, n)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d -> %d: %s %s (%d bytes), tag %d", self.comm.rank, dst,
                      str(t.dtype).replace("torch.", ""), tuple(t.shape), n, tag)
        raw = self.transport.isend(t, self.group[dst], ctx, tag, tensors.DTYPE_CODE[t.dtype])
        req = Request(self.comm, raw, "isend", dst, tag, n, count=count, start=start)
        if self.rendezvous(ctx, n):
            self._check_rendezvous_backend()
            req.ack = self.transport.irecv(ACK, self.group[dst], self.ctx + Ch.ACK,
                                            ack_tag(Ch(ctx - self.ctx), tag), ACK_CODE)
        return req

    @bracketed
    def irecv(self, tensor, src: int, tag: int, ctx: int, count: bool) -> Request:
        t = tensors.as_tensor(tensor, "receive buffer")
        if src != ANY_SOURCE:
            self._check_peer(src, "src")
        check_tag(tag)
        target, unstage = self._wire_tensor(t, receive=True), None
        if target is not t:
            unstage = lambda: t.copy_(target)  # noqa: E731
        gsrc = self.group[src] if src != ANY_SOURCE else ANY_SOURCE
        raw = self.transport.irecv(target, gsrc, ctx, tag, tensors.DTYPE_CODE[t.dtype])
        peer = None if src == ANY_SOURCE else src
        req = Request(self.comm, raw, "irecv", peer, tag, tensors.nbytes(t), unstage, count)
        req.ctx = ctx
        if self.rendezvous(ctx, req.nbytes):
            self._check_rendezvous_backend()
            self.unacked.append(req)
        return req

    def finish_receive(self, req: Request) -> int:
        """A receive has completed: check it matched (an error names both sides), log it,
        acknowledge it if its sender waits for that; its source, as a local rank."""
        req.source = source = self._check_received(req)
        self.comm.received.note(source, req.tag, req.peer is None)
        self._acknowledge(req)
        return source

    def _check_received(self, req: Request) -> int:
        raw = req.raw
        source = self.local.get(raw.source, raw.source)
        if raw.mismatch:
            raise MessageMismatchError(
                f"rank {self.comm.rank}: the message from rank {source} (tag {req.tag}) holds "
                f"{raw.msg_nbytes} bytes of {tensors.dtype_name(raw.msg_code)}, but the "
                f"receive buffer holds {raw.nbytes} bytes of {tensors.dtype_name(raw.code)}; "
                "sender and receiver must use the same dtype and number of elements")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d <- %d: %d bytes, tag %d", self.comm.rank, source, raw.nbytes,
                      req.tag)
        return source

    def rendezvous(self, ctx: int, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` on ``ctx`` is acknowledged (payload channels'
        traffic above the eager limit: user, collective, strategy; never control)."""
        return (self.comm.eager_limit is not None and nbytes > self.comm.eager_limit
                and ctx - self.ctx in PAYLOAD)

    def _check_rendezvous_backend(self) -> None:
        if self.transport.name == "torch":
            raise ValueError("eager_limit works on the local backend and the emulated network; "
                             "on the torch backend leave it None (gloo and NCCL apply their "
                             "own eager and rendezvous protocols)")

    def flush_acks(self) -> None:
        """Finish (and so acknowledge) every large receive that has arrived."""
        for req in list(self.unacked):
            if req._finished or req.raw.mismatch:  # a mismatch is reported by its own wait
                self.unacked.remove(req)
            elif self.transport.test(req.raw):
                req._finish()

    def _acknowledge(self, req: Request) -> None:
        """The receiving side of a rendezvous: tell the sender its message has arrived.
        Both sides know the size (a mismatched one is an error), so they agree on it."""
        if req in self.unacked:
            self.unacked.remove(req)
        if not req.raw.mismatch and self.rendezvous(req.ctx, req.nbytes):
            self.transport.isend(ACK, self.group[req.source], self.ctx + Ch.ACK,
                                  ack_tag(Ch(req.ctx - self.ctx), req.tag), ACK_CODE)

    def numbering(self, peer: int | None) -> str:
        """On a split communicator, errors use its own (local) ranks: say which world ranks
        they are, since the launcher reports world ranks."""
        if self.comm.is_world:
            return ""
        me, n = self.comm.rank, self.comm.world_size
        theirs = "" if peer is None else f", its rank {peer} is world rank {self.group[peer]}"
        return (f"(Ranks here are those of a split communicator of {n}: its rank {me} is "
                f"world rank {self.group[me]}{theirs}.)")

    def _check_peer(self, peer, what: str) -> None:
        checks.rank(peer, self.comm.world_size, what)
