"""Tensors staged for a transport that carries another device's memory (comm/point_to_point.py):
NCCL carries only CUDA tensors, so the library's CPU messages (flags, headers, agreement
checks) go through the communicator's device; the local transport and gloo carry host
memory. A fake NCCL-like transport, on ``meta`` for the device, shows it without a GPU."""

from __future__ import annotations

import torch

import minidist as md


class _Raw:
    done, mismatch, source, msg_code, msg_nbytes = True, False, 1, 0, 0


class DeviceOnlyTransport:
    """Records what it is given; like NCCL, it claims to carry device tensors only."""

    name, rank, world_size, cuda_native = "fake-nccl", 0, 2, True

    def __init__(self):
        self.sent, self.posted = [], []

    def isend(self, t, dst, ctx, tag, code):
        self.sent.append(t)
        return _Raw()

    def irecv(self, t, src, ctx, tag, code):
        self.posted.append(t)
        return _Raw()


def test_a_cpu_tensor_goes_through_the_communicators_device_on_a_device_only_transport():
    tr = DeviceOnlyTransport()
    comm = md.Communicator(tr, (0, 1), 0, device="meta")
    comm.isend(torch.arange(3.0), 1)
    comm.control.isend(torch.zeros(2, dtype=torch.int64), 1)  # the library's own traffic
    assert [t.device.type for t in tr.sent] == ["meta", "meta"]
    assert [(t.shape, t.dtype) for t in tr.sent] == [((3,), torch.float32),
                                                     ((2,), torch.int64)]
    comm.irecv(torch.empty(4), 1)
    assert tr.posted[0].device.type == "meta" and tr.posted[0].shape == (4,)


def test_a_host_transport_gets_the_callers_cpu_tensor_itself():
    sent = []

    class HostTransport(DeviceOnlyTransport):
        cuda_native = False

        def isend(self, t, dst, ctx, tag, code):
            sent.append(t)
            return _Raw()

    x = torch.arange(3.0)
    md.Communicator(HostTransport(), (0, 1), 0).isend(x, 1)
    assert sent[0] is x  # no copy
