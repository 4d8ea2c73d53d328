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
"""

from __future__ import annotations

import datetime
from collections import deque

import torch
import torch.distributed as dist

ANY = -1
_MAX_INFLIGHT = 64  # payload sends kept in flight before waiting on the oldest


def _wire_tags(ctx: int, tag: int) -> tuple[int, int]:
    base = ((ctx * 1_000_003) ^ (tag * 7919)) & 0x3FFFFFFF
    return 2 * base, 2 * base + 1  # header tag, payload tag


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

    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int) -> _Send:
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
        limit = datetime.timedelta(seconds=max(timeout, 0.001))
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
            raise RuntimeError(f"rank {self.rank}: message from rank {req.source} has context "
                               f"{ctx} tag {tag}, expected {req.ctx} tag {req.tag}")
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
        while self.inflight:
            for w in self.inflight.popleft()[0]:
                w.wait()
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
