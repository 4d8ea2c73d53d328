"""The ``torch`` transport: minidist messages over a ``torch.distributed`` process group.

gloo on CPU, NCCL on GPU: what real clusters run, launched by ``torchrun``, ``minidist run``
or ``md.launch(..., backend="torch")``. Each message travels as two torch messages, on two
torch tags derived from ``(ctx, tag)``:

* a header ``(ctx, tag, dtype code, nbytes)``, so the receiver can refuse a message of the
  wrong size or dtype with a clear error (gloo alone aborts the process when a message is
  larger than the buffer, and silently accepts a smaller one), and so that the messages of
  split communicators, which share the world's process group, are told apart;
* the payload, received only after the header has been checked.

Sends are eager, as the local backend's are: the payload is copied and the send request
is complete at once, while the copy travels. gloo completes a send only when the receiver
has posted the matching receive, and a payload receive is posted only after its header
has arrived, so without the copy two ranks that both send before they receive would wait
on each other forever. At most 64 messages per rank stay in flight; the 65th send waits for
the oldest one to be received.

torch.distributed does not let a rank send to itself; such messages stay in this process.

gloo's tags are 31-bit; ``_wire_tags`` folds (context, tag) into them so that, within one
communicator, user tags in ``USER_TAGS`` ([-2**27, 2**27)) never share a gloo tag, and user,
control and collective traffic never do. A user tag outside that range is refused. Split
communicators are told apart by a hash, so two of them can meet on one gloo tag (about one
chance in 2**28 per pair of tags in flight at once); the header check then names both.

A process group left to the interpreter's exit aborts the process now and then ("terminate
called without an active exception", signal 6): gloo's threads meet static destructors. So
a transport that owns its group also tears it down at exit (``atexit``), for scripts that
never call ``comm.close()``.
"""

from __future__ import annotations

import atexit
import datetime
import sys
from collections import deque

import torch
import torch.distributed as dist

from ..comm.contexts import SLOTS, Ch, base_of, channel_of
from ..errors import CommError

ANY = -1
_MAX_INFLIGHT = 64  # payload sends kept in flight before waiting on the oldest
_TAG_BITS = 27
USER_TAGS = (-(1 << (_TAG_BITS - 1)), 1 << (_TAG_BITS - 1))  # [low, high)


def _wire_tags(ctx: int, tag: int) -> tuple[int, int]:
    """gloo's tags (31-bit) for a message's header and payload: bit 0 tells them apart,
    bits 1-27 hold (a hash of the communicator + tag) mod 2**27, bits 28-30 the channel
    (``channel_of(ctx)``, ``comm/contexts.py``)."""
    offset = ((base_of(ctx) // SLOTS) * 0x9E3779B1) >> 7  # the communicator, hashed
    base = (channel_of(ctx) << _TAG_BITS) | ((offset + tag) & ((1 << _TAG_BITS) - 1))
    return 2 * base, 2 * base + 1  # header tag, payload tag


def _check_user_tag(ctx: int, tag: int) -> None:
    if channel_of(ctx) == Ch.USER and not USER_TAGS[0] <= tag < USER_TAGS[1]:
        raise ValueError(f"tag {tag} is out of range for the torch backend, which carries "
                         f"tags in gloo's 31-bit tags: use tags in [{USER_TAGS[0]}, "
                         f"{USER_TAGS[1]})")


def as_timedelta(seconds: float) -> datetime.timedelta:
    """Seconds for torch.distributed, which cannot take ``inf``: a year stands for it."""
    return datetime.timedelta(seconds=min(seconds, 365 * 86400.0))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class _Send:
    done = True  # eager: the message is on its way (see the module docstring)


class _Recv:
    __slots__ = ("src", "ctx", "tag", "code", "buf", "nbytes", "header", "hwork", "pwork",
                 "done", "source", "msg_code", "msg_nbytes", "mismatch")

    def __init__(self, src, ctx, tag, code, buf):
        self.src, self.ctx, self.tag, self.code, self.buf = src, ctx, tag, code, buf
        self.nbytes = buf.numel() * buf.element_size()
        self.header = self.hwork = self.pwork = None
        self.done = self.mismatch = False
        self.source = self.msg_code = self.msg_nbytes = -1


class TorchTransport:
    name = "torch"

    def __init__(self, device: torch.device, owns_group: bool):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device, self.owns_group = device, owns_group
        self.cuda_native = dist.get_backend() == "nccl"
        self.self_msgs: deque = deque()  # (ctx, tag, code, payload) sent to ourselves
        self.self_recvs: list[_Recv] = []
        self.pending: list[_Recv] = []  # receives whose header has not been read yet
        self.inflight: deque = deque()  # (work, payload copy) of payload sends
        if owns_group:
            atexit.register(self.close_at_exit)

    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int) -> _Send:
        _check_user_tag(ctx, tag)
        n = t.numel() * t.element_size()
        if dst == self.rank:
            self.self_msgs.append((ctx, tag, code, _bytes(t).clone()))
            self._match_self()
            return _Send()
        htag, ptag = _wire_tags(ctx, tag)
        header = torch.tensor([ctx, tag, code, n], dtype=torch.int64, device=self._dev(t))
        works, keep = [dist.isend(header, dst, tag=htag)], [header]
        if n:
            keep.append(_bytes(t).clone())
            works.append(dist.isend(keep[-1], dst, tag=ptag))
        self.inflight.append((works, keep))
        while len(self.inflight) > _MAX_INFLIGHT:
            for w in self.inflight.popleft()[0]:
                w.wait()
        return _Send()

    def irecv(self, t: torch.Tensor, src: int, ctx: int, tag: int, code: int) -> _Recv:
        _check_user_tag(ctx, tag)
        req = _Recv(src, ctx, tag, code, t)
        if src == self.rank:
            self.self_recvs.append(req)
            self._match_self()
            return req
        if src == ANY and self.device.type == "cuda":
            raise ValueError("NCCL cannot receive from ANY_SOURCE; name the source rank")
        req.header = torch.empty(4, dtype=torch.int64, device=self._dev(t))
        req.hwork = dist.irecv(req.header, src=None if src == ANY else src,
                               tag=_wire_tags(ctx, tag)[0])
        self.pending.append(req)
        return req

    def wait(self, req, timeout: float) -> bool:
        """Block until ``req`` is done; False on timeout (gloo then closes the connection,
        so a timed-out transport is not usable any more: the rank reports and stops)."""
        limit = as_timedelta(max(timeout, 0.001))
        try:
            if isinstance(req, _Send):
                return True
            if req.src == self.rank:
                return req.done  # only this rank could send it, and it has not
            else:
                self._read_headers_up_to(req, limit)
                if req.pwork is not None:
                    req.pwork.wait(limit)
        except RuntimeError as e:
            if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                return False
            raise
        req.done = True
        return True

    def test(self, req) -> bool:
        return req.done  # gloo's point-to-point works only report completion from wait()

    def _read_headers_up_to(self, req: _Recv, limit) -> None:
        """Read headers in the order receives were posted, up to ``req``, and post payloads.

        Payload receives on one (source, tag) must be posted in message order, so an earlier
        receive that may match the same messages is resolved first.
        """
        if req not in self.pending:
            return
        for r in list(self.pending):
            if r is req or (r.tag == req.tag and r.ctx == req.ctx and
                            (r.src == req.src or ANY in (r.src, req.src))):
                r.hwork.wait(limit)
                self.pending.remove(r)
                self._post_payload(r)
            if r is req:
                return

    def _post_payload(self, req: _Recv) -> None:
        ctx, tag, code, n = req.header.tolist()
        req.source = req.hwork._source_rank() if req.src == ANY else req.src
        req.msg_code, req.msg_nbytes = code, n
        if (ctx, tag) != (req.ctx, req.tag):
            raise CommError(
                f"world rank {self.rank}: a message from world rank {req.source} for context "
                f"{ctx}, tag {tag} arrived where one for context {req.ctx}, tag {req.tag} was "
                f"awaited: the torch backend folds (communicator, tag) into gloo's 31-bit tags "
                f"and these two met on one (two split communicators using tags at the same "
                f"time); change the tag on one of them")
        req.mismatch = code != req.code or n != req.nbytes
        target = _bytes(req.buf) if not req.mismatch else torch.empty(
            n, dtype=torch.uint8, device=req.buf.device)  # drain it, then report the mismatch
        if n:
            req.pwork = dist.irecv(target, src=req.source, tag=_wire_tags(ctx, tag)[1])

    def _match_self(self) -> None:
        for req in list(self.self_recvs):
            for i, (ctx, tag, code, payload) in enumerate(self.self_msgs):
                if (ctx, tag) == (req.ctx, req.tag):
                    del self.self_msgs[i]
                    req.source, req.msg_code, req.msg_nbytes = self.rank, code, payload.numel()
                    req.mismatch = code != req.code or payload.numel() != req.nbytes
                    if not req.mismatch and payload.numel():
                        _bytes(req.buf).copy_(payload)
                    req.done = True
                    self.self_recvs.remove(req)
                    break

    def _dev(self, t: torch.Tensor) -> torch.device:
        return t.device if self.cuda_native else torch.device("cpu")

    def capability(self, name: str):
        """``"process_group"``: the default ``torch.distributed`` group (the whole world)."""
        return dist.group.WORLD if name == "process_group" else None

    def close(self) -> None:
        if self.owns_group:
            atexit.unregister(self.close_at_exit)
        while self.inflight:
            for w in self.inflight.popleft()[0]:
                w.wait()
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def close_at_exit(self) -> None:
        """``close`` at interpreter exit (see the module docstring); after an uncaught
        exception, without waiting for the sends still in flight."""
        if getattr(sys, "last_value", None) is not None:
            self.inflight.clear()
        try:
            self.close()
        except Exception:  # a peer is gone already: nothing left to tear down cleanly
            pass
