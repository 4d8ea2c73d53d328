"""The ``emulated`` transport: the local transport with a latency/bandwidth model per link.

``md.launch(fn, n, network=md.Network...)`` wraps each rank's ``LocalTransport`` in an
``EmulatedTransport``. Payloads travel through shared memory exactly as without a network
(results are bitwise the same); the emulation only decides *when* a send or a receive may
complete, so a laptop shows what the described cluster would.

Cost model. Every rank has one egress and one ingress port per link class (``intra``,
``inter``: see ``network.py``). A message of n bytes from s to d over link (alpha, bw):

    start     = max(now, egress_free[s], ingress_free[d])   # queue behind earlier traffic
    egress_free[s] = ingress_free[d] = start + n / bw       # both ports busy meanwhile
    send done    at start + n / bw                          # the bytes have left the NIC
    delivered at    start + n / bw + alpha                  # the receive may complete

``now`` is taken when ``isend`` is called, so traffic between idle ranks costs alpha + n / bw,
four senders into one receiver (incast, a parameter server) queue on its one ingress port,
and a ring that crosses a slow inter-node link runs at that link's speed. Messages to
oneself are not on the network and cost nothing. Times are ``time.perf_counter()``, which
on Linux reads CLOCK_MONOTONIC, one clock for every process of the machine (the same clock
as ``comm.timeline``, whose send and receive spans therefore show the emulated delays).

Shared ports. A receiver's ingress port is shared by all its senders, so the "free at"
times of every port live in one small shared array (``PortClocks``) that ``md.launch``
creates and hands to every rank. A reservation reads three clocks and writes two under a
lock, so two senders can never both reserve the same interval of one ingress port. The lock
is a pipe holding one token byte (whoever reads it holds the lock): it needs no name, so
nothing can leak, and works under fork and spawn alike.

Delivery stamps. Each message is preceded, on the same channel, by an 8-byte stamp (its
delivery time, float64) sent on a mirrored context ``-1 - ctx`` with the same tag. A
receive first receives the stamp (with the user's ``src``, which may be ANY_SOURCE), then
receives the payload from the stamp's actual source. This is exact, ANY_SOURCE included:
the local transport matches MPI-style (earliest posted receive first; FIFO per source, ctx
and tag), so the k-th stamp from s goes to the same receive as the k-th payload from s
would have, provided payload receives are posted in the order their stamps arrived; they
are, because ``_match`` posts them walking the receives in posting order, and a later
receive cannot get a stamp from s before an earlier one that also matches s.

Waiting is sleeping. A request waits for its bytes (the local transport's futex sleeps),
then until its emulated time, while still moving this rank's other traffic (``_sleep_until``
waits on any pending request of the local transport, so big sends keep streaming). No core
is burnt, so eight ranks on two cores still overlap communication with computation. The
emulation can only slow things down: a link faster than this machine's memory copies shows
this machine's speed. The local transport's shared-memory all_reduce would bypass the
links, so this transport offers no capabilities and collectives pass messages.

Virtual time. ``md.launch(..., clock="virtual")`` runs the same link model on each rank's
virtual clock instead, without sleeping and without competing for the cores
(``virtual.py``, ``clock.py``); this module is the wall-clock path, as it always was.

Slower than the timeout. A message whose own ``alpha + n / bandwidth`` exceeds the
launch's timeout can never be waited for: its send raises ``SlowLinkTimeout`` at once,
naming the link, the size and the modelled time, before anything is sent or slept. A wait
that runs out while its bytes are in but their modelled time is still ahead (queued behind
earlier messages) says the same (``too_slow`` on the request), not "deadlock?".
"""

from __future__ import annotations

import math
import os
import time

import torch

from ..errors import SlowLinkTimeout
from .local import LocalTransport
from .network import Link, Network

_STAMP_CODE = -0x57  # dtype code of stamp messages: only ever compared with itself
_EGRESS, _INGRESS = 0, 1
_SLEEP_SLICE = 1.0  # seconds: time.sleep overflows on a modelled time of 1e300 s


def _stamp_ctx(ctx: int) -> int:
    """Contexts are >= 0 (``comm/communicator.py``); stamps use the negative mirror."""
    return -1 - ctx


class PortClocks:
    """When each rank's ports are next free: ``(rank, link class, egress|ingress)`` -> time.

    Created once by ``md.launch`` (``create``) and passed to every rank in its ``WorldSpec``.
    """

    def __init__(self, array, lock_r, lock_w):
        self._array, self._lock_r, self._lock_w = array, lock_r, lock_w

    @classmethod
    def create(cls, ctx, world_size: int) -> PortClocks:
        """``ctx`` is the multiprocess context the ranks start with. The shared array comes
        from its heap, a file in /dev/shm unlinked as soon as it is created."""
        array = ctx.RawArray("d", world_size * 4)
        lock_r, lock_w = ctx.Pipe(duplex=False)
        os.write(lock_w.fileno(), b"\0")  # the token: whoever reads it holds the lock
        return cls(array, lock_r, lock_w)

    def reserve(self, src: int, dst: int, link_class: int, busy: float) -> float:
        """Reserve ``src``'s egress and ``dst``'s ingress port of ``link_class`` for ``busy``
        seconds, as soon as both are free; return when they become free again."""
        a = self._array
        out_i = (src * 2 + link_class) * 2 + _EGRESS
        in_i = (dst * 2 + link_class) * 2 + _INGRESS
        os.read(self._lock_r.fileno(), 1)
        try:
            end = max(time.perf_counter(), a[out_i], a[in_i]) + busy
            a[out_i] = a[in_i] = end
        finally:
            os.write(self._lock_w.fileno(), b"\0")
        return end

    def close(self) -> None:
        """Close this process's ends of the lock pipe (the launcher, after the ranks end)."""
        self._lock_r.close()
        self._lock_w.close()


class _Send:
    """A send: done once the local transport wrote it and its bytes left the egress port.
    ``too_slow``: why a wait on it ran out, when the link model is the reason."""

    __slots__ = ("inner", "due", "link", "nbytes", "too_slow")

    def __init__(self, inner, due: float, link: Link | None, nbytes: int):
        self.inner, self.due, self.link, self.nbytes = inner, due, link, nbytes
        self.too_slow = ""

    @property
    def done(self) -> bool:
        return self.inner.done and time.perf_counter() >= self.due


class _Recv:
    """A receive: first its stamp, then its payload, then done at the stamped time."""

    __slots__ = ("stamp_req", "stamp", "buf", "ctx", "tag", "code", "inner", "due",
                 "too_slow")

    def __init__(self, stamp_req, stamp: torch.Tensor, buf: torch.Tensor, ctx, tag, code):
        self.stamp_req, self.stamp, self.buf = stamp_req, stamp, buf
        self.ctx, self.tag, self.code = ctx, tag, code
        self.inner, self.due, self.too_slow = None, float("inf"), ""

    @property
    def done(self) -> bool:
        return (self.inner is not None and self.inner.done
                and time.perf_counter() >= self.due)

    # What the Communicator reads once done (``RawRequest`` in ``protocol.py``).
    source = property(lambda self: self.inner.source)
    # not yet, while only the stamp is awaited (read early by the eager limit's ack loop)
    mismatch = property(lambda self: self.inner is not None and self.inner.mismatch)
    nbytes = property(lambda self: self.inner.nbytes)
    msg_nbytes = property(lambda self: self.inner.msg_nbytes)
    msg_code = property(lambda self: self.inner.msg_code)
    # the sender has left without sending it (``md.PeerLeftError``), stamp or payload
    peer_left = property(lambda self: (self.inner or self.stamp_req).peer_left)


class EmulatedTransport:
    """A ``LocalTransport`` whose messages take the time ``network`` says (module docstring).

    ``timeout``: the launch's; a send whose message alone takes longer than that on its link
    raises ``SlowLinkTimeout`` at once instead of timing out later like a deadlock.
    """

    name = "emulated"
    cuda_native = False

    def __init__(self, inner: LocalTransport, network: Network, clocks: PortClocks,
                 timeout: float = math.inf):
        self.inner, self.network, self.clocks = inner, network, clocks
        self.timeout = timeout
        self.rank, self.world_size = inner.rank, inner.world_size
        self._unmatched: list[_Recv] = []  # stamp not in yet; in posting order
        self._active: list = []  # local-transport requests that may still need progress

    def capability(self, name: str):
        """``"network"``: the emulated ``Network`` (``auto`` predicts from its links). No
        ``"shared_scratch"``: the shared-memory fast paths would bypass the links."""
        return self.network if name == "network" else None

    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int) -> _Send:
        nbytes = t.numel() * t.element_size()
        link = None if dst == self.rank else self.network.link(self.rank, dst)
        if link is not None and _never_in_time(link.time(nbytes), self.timeout):
            raise SlowLinkTimeout("send", dst, tag, self.timeout, self.rank,
                                  _takes(link, nbytes) + ".")
        sent, due = self._reserve(dst, nbytes, link)
        stamp = torch.tensor([due], dtype=torch.float64)
        self.inner.isend(stamp, dst, _stamp_ctx(ctx), tag, _STAMP_CODE)
        req = _Send(self.inner.isend(t, dst, ctx, tag, code), sent, link, nbytes)
        self._track(req.inner)
        return req

    def _reserve(self, dst: int, nbytes: int, link: Link | None) -> tuple[float, float]:
        """(when the bytes have left this rank, when they are delivered at ``dst``)."""
        if link is None:  # to oneself: not on the network
            now = time.perf_counter()
            return now, now
        sent = self.clocks.reserve(self.rank, dst, self.network.link_class(self.rank, dst),
                                   nbytes / link.bandwidth)
        return sent, sent + link.alpha

    def irecv(self, t: torch.Tensor, src: int, ctx: int, tag: int, code: int) -> _Recv:
        stamp = torch.empty(1, dtype=torch.float64)
        inner = self.inner.irecv(stamp, src, _stamp_ctx(ctx), tag, _STAMP_CODE)
        req = _Recv(inner, stamp, t, ctx, tag, code)
        self._unmatched.append(req)
        self._track(inner)
        self._match()
        return req

    def _match(self) -> None:
        """Post the payload receive of each receive whose stamp is in, in posting order, from
        the stamp's source: the order that keeps stamps and payloads paired."""
        if not any(r.stamp_req.done for r in self._unmatched):
            return
        waiting = []
        for r in self._unmatched:
            if not r.stamp_req.done:
                waiting.append(r)
                continue
            r.inner = self.inner.irecv(r.buf, r.stamp_req.source, r.ctx, r.tag, r.code)
            r.due, r.buf = float(r.stamp[0]), None
            self._track(r.inner)
        self._unmatched = waiting

    def _track(self, inner_req) -> None:
        self._active.append(inner_req)
        if len(self._active) > 64:
            self._active = [r for r in self._active if not r.done]

    def wait(self, req, timeout: float) -> bool:
        """Wait for the bytes (local transport), then for the emulated time; False if
        ``timeout`` seconds pass first."""
        deadline = time.perf_counter() + timeout
        self._match()
        if req.inner is None:  # a receive whose stamp has not arrived
            if not self.inner.wait(req.stamp_req, timeout):
                return False
            self._match()
        if not self.inner.wait(req.inner, max(0.0, deadline - time.perf_counter())):
            return False
        if self._sleep_until(req.due, deadline):
            return True
        req.too_slow = self._late(req, req.due - deadline, timeout)  # the model, not a peer
        return False

    def _late(self, req, late: float, timeout: float) -> str:
        """Why a wait whose bytes are in ran out: the message is modelled to complete ``late``
        seconds after its deadline."""
        if isinstance(req, _Send):
            link, nbytes = req.link, req.nbytes
        else:
            link, nbytes = self.network.link(req.inner.source, self.rank), req.inner.msg_nbytes
        if link is None:
            return ""
        queued = ("; the rest is its wait behind earlier messages on the same ports"
                  if link.time(nbytes) <= timeout else "")
        return (f"it is modelled to complete {late:.3g} s after the wait ran out: "
                f"{_takes(link, nbytes)}{queued}.")

    def _sleep_until(self, t: float, deadline: float) -> bool:
        """Sleep until time ``t`` (False if ``deadline`` comes first) while the local
        transport keeps moving this rank's other messages."""
        end = min(t, deadline)
        while (now := time.perf_counter()) < end:
            self._active = [r for r in self._active if not r.done]
            if self._active:
                self.inner.wait(self._active[0], end - now)
            else:
                time.sleep(min(end - now, _SLEEP_SLICE))
            self._match()
        return t <= deadline

    def test(self, req) -> bool:
        self._match()
        self.inner.test(req.inner if req.inner is not None else req.stamp_req)
        self._match()
        return req.done

    def close(self) -> None:
        self.inner.close()


def _never_in_time(took: float, timeout: float) -> bool:
    """A message of ``took`` modelled seconds outlasts the timeout (inf: it never arrives,
    whatever the timeout)."""
    return took > timeout or math.isinf(took)


def _takes(link: Link, nbytes: int) -> str:
    return (f"on the emulated network its message of {nbytes} bytes takes "
            f"{link.time(nbytes):.3g} s on {link!r} (alpha + n / bandwidth)")
