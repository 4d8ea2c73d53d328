"""The ``local`` transport: messages between processes through shared-memory rings.

A message on a channel is a 64-byte header followed by its payload, padded to 64 bytes:

    header = (marker, ctx, tag, dtype code, nbytes, sequence number, stamp, 0)

``stamp`` (a float64, 0.0 unless the sender gives one) travels to the receive that matches:
the virtual-time network (``virtual.py``) carries each message's modelled delivery time in
it, so no message of its own is needed for that.

Messages larger than the ring stream through it in chunks, so any size works and the
receiver copies chunk k while the sender writes chunk k+1 (two cores, two memcpys in flight).

Matching follows MPI: a message matches the earliest posted receive with the same
communicator context, the same tag and the same source (or ANY_SOURCE); messages from one
source with one tag arrive in the order they were sent. A message that arrives before its
receive is posted waits in the ring, or, when the receiver must get past it (an earlier
message on the same channel is wanted, or the receiver is about to sleep and the sender may
be blocked on a full ring), it is copied into a private "unexpected" buffer.

Everything runs on the caller's thread: ``progress()`` moves whatever bytes can move now, and
``wait()`` calls it until the request is done, spinning briefly and then sleeping on the
rank's doorbell (see ``shm_segment.py``), so ranks never busy-wait while other ranks need
the core. Several threads may share one transport (DDP's communication thread and the main
thread, or a user's threads): one lock guards the queues and the rings, taken for each
post and each progress step and released while a waiter sleeps, so one thread's wait never
stops another from sending.

A rank that has gone says so in the segment: a closing transport marks itself left, and the
launcher marks a rank whose process ended without closing dead (``md.launch(...,
on_rank_failure="continue")``). A receive from a rank that has gone fails at once
(``md.PeerLeftError``) once what it sent is drained; sends to a dead rank are discarded.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from collections import deque

import torch

from .scratch import SharedScratch
from .shm_segment import Segment, SharedBuffer

ANY = -1
HDR = 64
_HEADER = struct.Struct("<6qdq")
_MARKER = 0x4D4D  # sanity check that sender and receiver agree on the stream position
CHUNK = 1 << 20  # publish progress at least every MiB so the receiver can start copying
_memmove = ctypes.memmove


def _padded(nbytes: int) -> int:
    return HDR + (nbytes + 63) // 64 * 64


class SendRequest:
    __slots__ = ("dst", "ptr", "nbytes", "header", "pos", "total", "done", "keep")

    def __init__(self, dst, ptr, nbytes, header, keep):
        self.dst, self.ptr, self.nbytes, self.header, self.keep = dst, ptr, nbytes, header, keep
        self.pos, self.total, self.done = 0, _padded(nbytes), False


class RecvRequest:
    """A posted receive. After completion ``source``, ``msg_code`` and ``msg_nbytes`` describe
    the message that matched; ``mismatch`` is True when its size or dtype differed (then the
    payload was discarded and the Communicator raises a clear error)."""

    __slots__ = ("src", "ctx", "tag", "code", "ptr", "nbytes", "done", "source",
                 "msg_code", "msg_nbytes", "mismatch", "keep", "peer_left", "stamp")

    def __init__(self, src, ctx, tag, code, ptr, nbytes, keep):
        self.src, self.ctx, self.tag, self.code = src, ctx, tag, code
        self.ptr, self.nbytes, self.keep = ptr, nbytes, keep
        self.done = self.mismatch = self.peer_left = False
        self.source = self.msg_code = self.msg_nbytes = -1
        self.stamp = 0.0  # the matched message's header stamp (module docstring)


class _Incoming:
    """A message being read off a channel (into a matched receive, or a private buffer)."""

    __slots__ = ("src", "ctx", "tag", "code", "nbytes", "pos", "total", "ptr", "buf",
                 "recv", "done", "stamp")

    def __init__(self, src, ctx, tag, code, nbytes, stamp=0.0):
        self.src, self.ctx, self.tag, self.code, self.nbytes = src, ctx, tag, code, nbytes
        self.stamp = stamp
        self.pos, self.total = HDR, _padded(nbytes)
        self.ptr, self.buf, self.recv, self.done = 0, None, None, False


class _Channel:
    """This rank's end of one ring: local copies of the counters plus the shared words."""

    __slots__ = ("peer", "base", "head", "tail", "head_word", "tail_word", "bell", "msg",
                 "queue", "seq")

    def __init__(self, seg: Segment, src: int, dst: int, peer: int):
        c = seg.channel(src, dst)
        self.peer, self.base = peer, seg.base + seg.ring_offset(c)
        self.head_word, self.tail_word = seg.head_tail(c)
        self.head, self.tail = self.head_word.value, self.tail_word.value
        self.bell = seg.bell(peer)  # the doorbell of the rank at the other end
        self.msg: _Incoming | None = None  # receiving side: message being streamed
        self.queue: deque[SendRequest] = deque()  # sending side: messages in order
        self.seq = 0


class LocalTransport:
    name = "local"
    cuda_native = False  # CUDA tensors are staged through host memory by the Communicator

    def __init__(self, seg: Segment, rank: int, spin_us: float | None = None):
        self.seg, self.rank, self.world_size = seg, rank, seg.world_size
        self.R = seg.ring_bytes
        p = self.world_size
        self.tx = [_Channel(seg, rank, d, d) for d in range(p)]
        self.rx = [_Channel(seg, s, rank, s) for s in range(p)]
        self.my_bell = seg.bell(rank)
        self.posted: list[RecvRequest] = []
        self.unexpected: list[_Incoming] = []
        if spin_us is None:  # spinning only pays when every rank has a core of its own
            default = 200.0 if p <= (os.cpu_count() or 1) else 0.0
            spin_us = float(os.environ.get("MINIDIST_SPIN_US", default))
        self.spin = spin_us * 1e-6
        self.lock = threading.RLock()  # see the module docstring
        self.on_read = None  # called with the source of each message read off a ring
        seg.mark_attached(rank)

    # -- posting ----------------------------------------------------------------------------
    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int,
              stamp: float = 0.0) -> SendRequest:
        with self.lock:
            return self._isend(t, dst, ctx, tag, code, stamp)

    def _isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int,
               stamp: float) -> SendRequest:
        ch = self.tx[dst]
        n = t.numel() * t.element_size()
        header = (_MARKER, ctx, tag, code, n, ch.seq, stamp, 0)
        ch.seq += 1
        req = SendRequest(dst, t.data_ptr(), n, header, t)
        ch.queue.append(req)
        if len(ch.queue) == 1:
            self._push_all(ch)
        return req

    def irecv(self, t: torch.Tensor, src: int, ctx: int, tag: int, code: int) -> RecvRequest:
        with self.lock:
            return self._irecv(t, src, ctx, tag, code)

    def _irecv(self, t: torch.Tensor, src: int, ctx: int, tag: int, code: int) -> RecvRequest:
        req = RecvRequest(src, ctx, tag, code, t.data_ptr(), t.numel() * t.element_size(), t)
        for i, msg in enumerate(self.unexpected):
            if _matches(req, msg):
                del self.unexpected[i]
                self._claim(msg, req)
                return req
        self.posted.append(req)
        self.progress()
        return req

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, req, timeout: float) -> bool:
        """Make progress until ``req`` is done; False if ``timeout`` seconds pass first."""
        if req.done:
            return True
        now = time.perf_counter()
        deadline, spin_until = now + timeout, now + self.spin
        while True:
            seen = self.my_bell.value
            with self.lock:
                self.progress(drain=now >= spin_until)
            if req.done:
                return True
            now = time.perf_counter()
            if now < spin_until:
                continue
            if now >= deadline or self._sender_left(req):
                return False
            self.seg.sleep_on_bell(self.my_bell, seen, min(0.05, deadline - now))

    def test(self, req) -> bool:
        if not req.done:
            with self.lock:
                self.progress()
        return req.done

    # -- progress ---------------------------------------------------------------------------
    def progress(self, drain: bool = False) -> None:
        for ch in self.tx:
            if ch.queue:
                self._push_all(ch)
        for ch in self.rx:
            if ch.msg is not None or ch.head_word.value != ch.tail:
                self._pull(ch, drain)

    def _push_all(self, ch: _Channel) -> None:
        while ch.queue:
            req = ch.queue[0]
            if not self._push(ch, req):
                if self.seg.has_died(ch.peer):  # checked only on a full ring: never hot
                    self._drop_sends(ch)
                return
            req.done = True
            req.keep = None
            ch.queue.popleft()

    @staticmethod
    def _drop_sends(ch: _Channel) -> None:
        """The receiver's process has ended (the launcher marked it dead): nobody will ever
        drain the ring, so the sends queued to it complete now, discarded, as a buffered
        send completes whether or not it is received; a sender waiting on a full ring
        would otherwise wait for the timeout."""
        for req in ch.queue:
            req.done, req.keep = True, None
        ch.queue.clear()

    def _push(self, ch: _Channel, req: SendRequest) -> bool:
        """Write as much of ``req`` as the ring has room for; True when all of it is written."""
        R = self.R
        while req.pos < req.total:
            space = R - (ch.head - ch.tail_word.value)
            if space == 0:
                return False
            if req.pos == 0:
                _HEADER.pack_into(self.seg.mm, ch.base - self.seg.base + ch.head % R,
                                  *req.header)
                ch.head += HDR
                req.pos = HDR
                space -= HDR
            n = min(space, req.total - req.pos, CHUNK)
            done = req.pos - HDR
            self._copy_to_ring(ch, req.ptr + done, min(n, req.nbytes - done))
            ch.head += n
            req.pos += n
            ch.head_word.value = ch.head
            self.seg.ring_bell(ch.bell)
        return True

    def _copy_to_ring(self, ch: _Channel, src_ptr: int, n: int) -> None:
        if n <= 0:
            return
        off = ch.head % self.R
        first = min(n, self.R - off)
        _memmove(ch.base + off, src_ptr, first)
        if n > first:
            _memmove(ch.base, src_ptr + first, n - first)

    def _pull(self, ch: _Channel, drain: bool) -> None:
        """Read what has arrived on ``ch``: stream into matched receives, or park it."""
        moved = False
        while True:
            avail = ch.head_word.value - ch.tail
            msg = ch.msg
            if msg is None:
                if avail < HDR:
                    break
                msg = self._read_header(ch, drain)
                if msg is None:
                    break
                ch.tail += HDR
                avail -= HDR
                moved = True
            n = min(avail, msg.total - msg.pos)
            if n > 0:
                if msg.ptr:
                    done = msg.pos - HDR
                    self._copy_from_ring(ch, msg.ptr + done, min(n, msg.nbytes - done))
                ch.tail += n
                msg.pos += n
                moved = True
            if msg.pos < msg.total:
                break
            self._finish(msg)
            ch.msg = None
        if moved:
            ch.tail_word.value = ch.tail
            self.seg.ring_bell(ch.bell)

    def _copy_from_ring(self, ch: _Channel, dst_ptr: int, n: int) -> None:
        if n <= 0:
            return
        off = ch.tail % self.R
        first = min(n, self.R - off)
        _memmove(dst_ptr, ch.base + off, first)
        if n > first:
            _memmove(dst_ptr + first, ch.base, n - first)

    def _read_header(self, ch: _Channel, drain: bool) -> _Incoming | None:
        marker, ctx, tag, code, nbytes, seq, stamp, _ = _HEADER.unpack_from(
            self.seg.mm, ch.base - self.seg.base + ch.tail % self.R)
        if marker != _MARKER or seq != ch.seq:
            raise RuntimeError(f"rank {self.rank}: corrupt stream from rank {ch.peer} "
                               f"(marker {marker:#x}, sequence {seq}, expected {ch.seq})")
        msg = _Incoming(ch.peer, ctx, tag, code, nbytes, stamp)
        req = next((r for r in self.posted if _matches(r, msg)), None)
        if req is None and not (drain or self._wanted_from(ch.peer)):
            return None  # leave it in the ring until someone asks for it
        ch.seq += 1
        if self.on_read is not None:  # virtual time counts them (horizon.py)
            self.on_read(ch.peer)
        ch.msg = msg
        if req is not None:
            self.posted.remove(req)
            self._bind(msg, req)
        else:  # park it: an earlier-posted receive wants something behind it
            msg.buf = torch.empty(nbytes, dtype=torch.uint8)
            msg.ptr = msg.buf.data_ptr()
            self.unexpected.append(msg)
        return msg

    def _wanted_from(self, src: int) -> bool:
        return any(r.src == src or r.src == ANY for r in self.posted)

    # -- matching ---------------------------------------------------------------------------
    def _bind(self, msg: _Incoming, req: RecvRequest) -> None:
        """Point ``msg``'s stream at ``req``'s buffer (or at nothing, on a mismatch)."""
        req.source, req.msg_code, req.msg_nbytes = msg.src, msg.code, msg.nbytes
        req.stamp = msg.stamp
        msg.recv = req
        if msg.code != req.code or msg.nbytes != req.nbytes:
            req.mismatch = True
            msg.ptr = 0  # discard the payload; the receiver gets an error naming both sides
        else:
            msg.ptr = req.ptr

    def _claim(self, msg: _Incoming, req: RecvRequest) -> None:
        """A newly posted receive takes a parked message (complete or still arriving)."""
        self._bind(msg, req)
        got = min(msg.pos - HDR, msg.nbytes)
        if msg.ptr and got > 0:
            _memmove(msg.ptr, msg.buf.data_ptr(), got)
        msg.buf = None
        if msg.done:
            req.done, req.keep = True, None

    def _finish(self, msg: _Incoming) -> None:
        msg.done = True
        if msg.recv is not None:
            msg.recv.done, msg.recv.keep = True, None

    def capability(self, name: str):
        """``"shared_scratch"``: the segment's scratch area (``SharedScratch``), if sized;
        ``"shared_memory"``: ``SharedBuffer`` (every rank is on this machine, so a block of
        shared memory made by one can be mapped by the others)."""
        if name == "shared_scratch" and self.seg.scratch_bytes > 0:
            return SharedScratch(self)
        if name == "shared_memory":
            return SharedBuffer
        return None

    def close(self) -> None:
        with self.lock:
            self.progress()  # push what is still queued, if the rings have room
            self.seg.mark_left(self.rank)
            self.tx = self.rx = []

    def _sender_left(self, req) -> bool:
        """A receive from a named rank that has closed its transport, with nothing of its
        left in the ring: no message can come any more (the rank returned from its
        function, or the launcher marked it dead). Checked before sleeping, so the receiver
        learns it at once instead of after the timeout."""
        if not isinstance(req, RecvRequest) or req.src == ANY or req.src == self.rank \
                or not self.seg.has_left(req.src):
            return False
        with self.lock:
            self.progress(drain=True)  # whatever it sent before leaving is in the ring
        req.peer_left = not req.done
        return req.peer_left


def _matches(req: RecvRequest, msg: _Incoming) -> bool:
    return (req.tag == msg.tag and req.ctx == msg.ctx
            and (req.src == ANY or req.src == msg.src))
