"""The ``torch`` transport: minidist messages over a ``torch.distributed`` process group.

gloo on CPU, NCCL on GPU: what real clusters run, launched by ``torchrun``, ``minidist run``
or ``md.launch(..., backend="torch")``. Each message is sent as two torch messages: a small
header ``(ctx, tag, dtype code, nbytes)`` and the payload, so that the receiver can refuse a
message of the wrong size or dtype with a clear error (gloo alone would fail obscurely or
fill the buffer with garbage) and so that messages of split communicators, which share the
world's process group, are told apart. ``(ctx, tag)`` is folded into the torch tag.

torch.distributed does not let a rank send to itself; such messages stay in this process.
"""

from __future__ import annotations

import datetime
from collections import deque

import torch
import torch.distributed as dist

ANY = -1


def _wire_tag(ctx: int, tag: int) -> int:
    return ((ctx * 1_000_003) ^ (tag * 7919)) & 0x7FFFFFFF


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class _Send:
    __slots__ = ("works", "keep", "done")

    def __init__(self, works, keep):
        self.works, self.keep, self.done = works, keep, not works


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

    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int) -> _Send:
        n = t.numel() * t.element_size()
        if dst == self.rank:
            self.self_msgs.append((ctx, tag, code, _bytes(t).clone()))
            self._match_self()
            return _Send([], None)
        header = torch.tensor([ctx, tag, code, n], dtype=torch.int64, device=self._dev(t))
        wtag = _wire_tag(ctx, tag)
        works = [dist.isend(header, dst, tag=wtag)]
        if n:
            works.append(dist.isend(_bytes(t), dst, tag=wtag))
        return _Send(works, (header, t))

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
                               tag=_wire_tag(ctx, tag))
        return req

    def wait(self, req, timeout: float) -> bool:
        limit = datetime.timedelta(seconds=max(timeout, 0.001))
        try:
            if isinstance(req, _Send):
                for w in req.works:
                    w.wait(limit)
            elif not req.done:
                if req.src == self.rank:
                    return False  # nobody will ever send it: we are the sender
                req.hwork.wait(limit)
                self._post_payload(req)
                if req.pwork is not None:
                    req.pwork.wait(limit)
        except RuntimeError as e:
            if "imed out" in str(e) or "timeout" in str(e).lower():
                return False
            raise
        req.done = True
        return True

    def test(self, req) -> bool:
        if req.done:
            return True
        if isinstance(req, _Send):
            req.done = all(w.is_completed() for w in req.works)
            return req.done
        if req.src == self.rank or not req.hwork.is_completed():
            return False
        self._post_payload(req)
        req.done = req.pwork is None or req.pwork.is_completed()
        return req.done

    def _post_payload(self, req: _Recv) -> None:
        if req.pwork is not None or req.source >= 0:
            return
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
            req.pwork = dist.irecv(target, src=req.source, tag=_wire_tag(ctx, tag))

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
        return t.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
