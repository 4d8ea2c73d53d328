"""The emulated network in virtual time: ``md.launch(..., network=net, clock="virtual")``.

The link model of ``emulated.py`` (each rank an egress and an ingress port per link class;
a message occupies both for n / bandwidth and arrives alpha later), on each rank's virtual
clock (``clock.py``) instead of the wall clock, and nobody sleeps:

* ``isend`` at virtual time t reserves the sender's egress and the receiver's ingress port
  together at the first gap >= t both share (``intervals.py``: free gaps are back-filled),
  and the message carries its delivery time ``start + n / B + alpha`` in its header's
  stamp (``local.py``); the send's wait completes at ``start + n / B``. The reservation is
  fixed at the send, so a non-blocking operation progresses while the rank computes: its
  wait costs only what is left.
* a receive waits (in wall time) for the bytes, then moves the clock to the stamp:
  ``at_least(delivery)``. A rank waits in virtual time only for what the model says.
* ``test`` is true once the bytes are in and the delivery time has come on this thread's
  clock. A thread that only polls (its clock does not move between two tests of the same
  request: FLOP-model compute with no FLOPs in between) would poll forever, so its second
  such test completes the request at its delivery time, as a wait would.

Messages to oneself cost nothing, and so do the agreement checks (``Ch.CHECK``,
``collectives/agreement.py``): they arrive the instant they are sent, so they wait for the
slowest rank as the collective itself would, but add no latency NCCL would not. A
message whose own modelled time is infinite can never arrive and is refused at its send
(``SlowLinkTimeout``); finite ones of any length are fine, since the launch's ``timeout``
bounds *wall* time, which a long modelled message does not take. A rank waiting for a
message nobody sends still gets ``CommTimeout`` after ``timeout`` seconds of wall time.

A receive from ANY_SOURCE takes the message that arrives first in *virtual* time: it is
posted, naming its source, only once no other rank can still send an earlier one
(``horizon.py``: the ranks publish what bounds their next send on a shared board, the
conservative rule of parallel discrete-event simulation). So a parameter server answers
its pulls and pushes in the order a cluster would, on every run and under any load. What
it still does not do is order *reservations* globally: SMPI (Degomme et al., IEEE TPDS
2017) runs every rank inside one discrete-event simulation; here two messages that want
the same port at once book it in wall-clock order (back-filling makes that matter only
where their intervals overlap).

The ports' intervals are shared by every rank, in one small array (``PortIntervals``); the
ingress ports of each rank are guarded by a lock of their own (a pipe holding one token
byte, as the wall-clock ports'), a rank's egress by a thread lock. Per message the
bookkeeping is one lock, two ports read and written, and an 8-byte stamp in the header:
an 8-rank step costs about what the bare local backend costs (``minidist bench
emulation``).
"""

from __future__ import annotations

import math
import os
import threading
import time

import torch

from ..comm.contexts import Ch, channel_of
from ..errors import SlowLinkTimeout
from .clock import VirtualClock
from .emulated import _takes
from .horizon import ANY, DONE, NAMED, RUNNING, Board, safe
from .intervals import CAPACITY, book, earliest_start, pack, unpack
from .local import ANY as ANY_SOURCE
from .local import LocalTransport, RecvRequest
from .network import Network

_WIDTH = 2 + 2 * CAPACITY  # floats per port (``intervals.pack``)


class PortIntervals:
    """The busy intervals of every rank's ports, ``(rank, link class, egress|ingress)``,
    shared by all ranks: ``md.launch`` creates it under ``clock="virtual"`` and passes it
    in the ``WorldSpec``. ``locks[d]`` (a pipe: read the token to hold it) guards rank d's
    ingress ports; a rank's own egress is only ever booked by its threads (``_egress``)."""

    def __init__(self, array, locks, board_array):
        self._array, self.locks, self._board_array = array, locks, board_array
        self._egress = threading.Lock()
        self.board = Board(board_array, len(locks))  # ANY_SOURCE's horizon (horizon.py)

    @classmethod
    def create(cls, ctx, world_size: int) -> PortIntervals:
        """``ctx``: the multiprocess context the ranks start with; the arrays come from its
        heap, a file in /dev/shm unlinked as soon as it is created."""
        array = ctx.RawArray("d", world_size * 4 * _WIDTH)
        locks = [ctx.Pipe(duplex=False) for _ in range(world_size)]
        for _, w in locks:
            os.write(w.fileno(), b"\0")  # the token: whoever reads it holds the lock
        return cls(array, locks, ctx.RawArray("d", Board.size(world_size)))

    def __getstate__(self):
        return {"_array": self._array, "locks": self.locks, "_board_array": self._board_array}

    def __setstate__(self, state):
        self.__init__(state["_array"], state["locks"], state["_board_array"])

    def _port(self, i: int):
        a = self._array
        n = int(a[i + 1])
        return unpack(a[i:i + 2 + 2 * n])

    def _store(self, i: int, port) -> None:
        flat = pack(port, len(port.busy))
        self._array[i:i + len(flat)] = flat

    def _free_after(self, i: int) -> float:
        """When port ``i``'s last booked interval ends (its floor if it has none)."""
        a, n = self._array, int(self._array[i + 1])
        return a[i + 2 * n + 1] if n else a[i]

    def _append(self, i: int, start: float, end: float) -> None:
        """``book`` for an interval after every booked one, on the array itself (the same
        result, without unpacking the port)."""
        a, n = self._array, int(self._array[i + 1])
        if n and a[i + 2 * n + 1] == start:
            a[i + 2 * n + 1] = end
        elif n < CAPACITY:
            a[i + 2 + 2 * n], a[i + 3 + 2 * n], a[i + 1] = start, end, n + 1
        else:
            self._store(i, book(self._port(i), start, end))

    def reserve(self, src: int, dst: int, link_class: int, t: float, busy: float) -> float:
        """Reserve ``src``'s egress and ``dst``'s ingress port of ``link_class`` for
        ``busy`` seconds at the first gap from ``t`` on both share; return its start."""
        out_i = ((src * 2 + link_class) * 2) * _WIDTH
        in_i = ((dst * 2 + link_class) * 2 + 1) * _WIDTH
        lock_r, lock_w = self.locks[dst]
        with self._egress:
            os.read(lock_r.fileno(), 1)
            try:
                if t >= self._free_after(out_i) and t >= self._free_after(in_i):
                    start = t  # the usual case: after everything booked on both
                    self._append(out_i, t, t + busy)
                    self._append(in_i, t, t + busy)
                else:
                    egress, ingress = self._port(out_i), self._port(in_i)
                    start = earliest_start((egress, ingress), t, busy)
                    self._store(out_i, book(egress, start, start + busy))
                    self._store(in_i, book(ingress, start, start + busy))
            finally:
                os.write(lock_w.fileno(), b"\0")
        return start

    def close(self) -> None:
        """Close this process's ends of the lock pipes (the launcher, after the ranks end)."""
        for r, w in self.locks:
            r.close()
            w.close()


class _Sent:
    """A send on virtual time: done (for its wait) at ``due``, once its bytes are written."""

    __slots__ = ("inner", "due")

    def __init__(self, inner, due: float):
        self.inner, self.due = inner, due

    done = property(lambda self: self.inner.done)


class _AnyRecv:
    """A receive from ANY_SOURCE on virtual time: posted to the local transport, naming its
    source, once the board says which message arrives first (``horizon.py``). Until then
    it reads as a receive nothing has matched."""

    __slots__ = ("t", "ctx", "tag", "code", "nbytes", "inner")
    src, peer_left = ANY_SOURCE, False

    def __init__(self, t: torch.Tensor, ctx: int, tag: int, code: int):
        self.t, self.ctx, self.tag, self.code = t, ctx, tag, code
        self.nbytes = t.numel() * t.element_size()
        self.inner: RecvRequest | None = None

    def _get(self, name: str, unbound):
        return unbound if self.inner is None else getattr(self.inner, name)

    done = property(lambda self: self._get("done", False))
    mismatch = property(lambda self: self._get("mismatch", False))
    source = property(lambda self: self._get("source", -1))
    msg_code = property(lambda self: self._get("msg_code", -1))
    msg_nbytes = property(lambda self: self._get("msg_nbytes", -1))
    stamp = property(lambda self: self._get("stamp", 0.0))


class VirtualTransport:
    """A ``LocalTransport`` whose messages take the time ``network`` says on ``clock``
    (module docstring). Receives are the local transport's own requests (their ``stamp``
    is the delivery time), except from ANY_SOURCE (``_AnyRecv``)."""

    name = "emulated"
    cuda_native = False
    ANY_SLICE = 0.001  # seconds an ANY_SOURCE receive sleeps between looks at the board

    def __init__(self, inner: LocalTransport, network: Network, ports: PortIntervals,
                 clock: VirtualClock, timeout: float = math.inf):
        self.inner, self.network, self.ports, self.clock = inner, network, ports, clock
        self.timeout = timeout
        self.rank, self.world_size = inner.rank, inner.world_size
        self.board = ports.board
        inner.on_read = lambda src: self.board.count_read(src, self.rank)
        self._last_poll: tuple[int, float] | None = None  # (request id, clock) of a test

    def capability(self, name: str):
        """``"network"``: the emulated ``Network`` (``auto`` predicts from its links). No
        ``"shared_scratch"`` nor ``"shared_memory"``: they would bypass the links."""
        return self.network if name == "network" else None

    # -- the board (horizon.py): only the rank's main thread speaks for it ----------------------
    @staticmethod
    def _main() -> bool:
        return threading.current_thread() is threading.main_thread()

    def _publish(self, mode: int, t: float | None = None, aux: float = 0.0) -> None:
        if self._main():
            self.board.publish(self.rank, mode, self.clock.now() if t is None else t, aux)

    @staticmethod
    def _alpha(src: int, dst: int) -> float:
        """The lookahead the board may count on: none, since an agreement check arrives
        the instant it is sent (it is not on the network)."""
        return 0.0

    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int) -> _Sent:
        now = self.clock.now()
        sent = delivered = now  # to oneself, or an agreement check: not on the network
        if dst != self.rank and channel_of(ctx) != Ch.CHECK:
            sent, delivered = self._reserve(dst, t.numel() * t.element_size(), now, tag)
        with self.inner.lock:  # counted before it can be read: the board's invariant
            self.board.count_sent(self.rank, dst)
            req = _Sent(self.inner.isend(t, dst, ctx, tag, code, stamp=delivered), sent)
        self._publish(RUNNING, now)
        return req
    def _reserve(self, dst: int, nbytes: int, now: float, tag: int) -> tuple[float, float]:
        """(when the bytes have left this rank, when they are delivered at ``dst``)."""
        link = self.network.link(self.rank, dst)
        if math.isinf(link.time(nbytes)):
            raise SlowLinkTimeout("send", dst, tag, self.timeout, self.rank,
                                  _takes(link, nbytes) + ": it never arrives.")
        busy = nbytes / link.bandwidth
        if busy > 0:  # a latency-only link holds no port
            now = self.ports.reserve(self.rank, dst, self.network.link_class(self.rank, dst),
                                     now, busy) + busy
        return now, now + link.alpha

    def irecv(self, t: torch.Tensor, src: int, ctx: int, tag: int, code: int):
        if src == ANY_SOURCE:
            return _AnyRecv(t, ctx, tag, code)
        return self.inner.irecv(t, src, ctx, tag, code)

    @staticmethod
    def _due(req) -> float:
        return req.due if isinstance(req, _Sent) else req.stamp

    def wait(self, req, timeout: float) -> bool:
        """Wait (wall time, at most ``timeout`` seconds) for the bytes, then move the clock
        to the request's modelled completion."""
        if isinstance(req, _AnyRecv):
            return self._wait_any(req, timeout)
        raw = req.inner if isinstance(req, _Sent) else req
        if not raw.done:
            self._publish_blocked(raw)
        try:
            if not self.inner.wait(raw, timeout):
                return False
            self.clock.at_least(self._due(req))
            return True
        finally:
            self._publish(RUNNING)

    def _publish_blocked(self, raw) -> None:
        """Before a wait: blocked on a named source that nothing has matched yet, or (a
        send, a receive already matched) still running to a known time."""
        if not self._main():
            return
        with self.inner.lock:
            if isinstance(raw, RecvRequest) and raw.source == -1 and raw.src != self.rank:
                self._publish(NAMED, aux=raw.src)
            elif isinstance(raw, RecvRequest) and raw.source != -1:
                self._publish(RUNNING, max(self.clock.now(), raw.stamp))

    def _wait_any(self, req: _AnyRecv, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        bell = self.inner.my_bell
        while req.inner is None:
            seen = bell.value
            if self._take_first(req, blocking=True):
                break
            left = deadline - time.perf_counter()
            if left <= 0:
                self._publish(RUNNING)
                return False
            self.inner.seg.sleep_on_bell(bell, seen, min(self.ANY_SLICE, left))
        return self.wait(req.inner, max(0.0, deadline - time.perf_counter()))

    def _take_first(self, req: _AnyRecv, blocking: bool) -> bool:
        """Post ``req`` for the message that arrives first in virtual time, if no earlier
        one can still come (``horizon.safe``); ``blocking``: say so on the board."""
        with self.inner.lock:
            self.inner.progress(drain=True)  # every message that is here, read off its ring
            if self.board.in_flight(self.rank):
                return False
            first = self._first_candidate(req)
            now, arrives = self.clock.now(), math.inf if first is None else first[0]
            if blocking:
                self._publish(ANY, now, arrives)
            if first is None or not safe(self.board, self.rank, now, arrives, self._alpha,
                                         self.inner.seg.has_left):
                return False
            req.inner = self.inner.irecv(req.t, first[1], req.ctx, req.tag, req.code)
            return True

    def _first_candidate(self, req: _AnyRecv) -> tuple[float, int] | None:
        """(arrival, source) of the earliest message that matches ``req`` among those read
        off the rings: each source's first match only (one source's messages keep their
        order, as MPI requires)."""
        best, sources = None, set()
        for msg in self.inner.unexpected:
            if msg.ctx == req.ctx and msg.tag == req.tag and msg.src not in sources:
                sources.add(msg.src)
                if best is None or (msg.stamp, msg.src) < best:
                    best = (msg.stamp, msg.src)
        return best

    def test(self, req) -> bool:
        if isinstance(req, _AnyRecv):
            if req.inner is None and not self._take_first(req, blocking=False):
                return False
            req = req.inner
        if not self.inner.test(req.inner if isinstance(req, _Sent) else req):
            return False
        due, now = self._due(req), self.clock.now()
        if due > now and self._last_poll != (id(req), now):
            self._last_poll = (id(req), now)
            return False
        self.clock.at_least(due)  # due already, or only polling: completes at due
        return True

    def close(self) -> None:
        self._publish(DONE)
        self.inner.close()
