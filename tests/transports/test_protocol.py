"""Every transport satisfies the Transport protocol (transports/protocol.py), and the
Communicator exposes what collectives need through public calls only."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import minidist as md
from minidist.transports.protocol import Transport

TRANSPORTS = [("minidist.transports.local", "LocalTransport"),
              ("minidist.transports.torch_dist", "TorchTransport"),
              ("minidist.transports.emulated", "EmulatedTransport"),
              ("minidist.transports.virtual", "VirtualTransport")]


def _protocol_members() -> list[str]:
    hints = inspect.get_annotations(Transport)
    methods = [n for n, v in vars(Transport).items()
               if callable(v) and not n.startswith("_")]
    return sorted(set(hints) | set(methods))


@pytest.mark.parametrize("module,cls", TRANSPORTS)
def test_transport_has_every_member_of_the_protocol(module, cls):
    klass = getattr(importlib.import_module(module), cls)
    instance_attrs = inspect.getsource(klass)
    for name in _protocol_members():
        # methods on the class; data members set on the class or in __init__
        assert hasattr(klass, name) or f"self.{name}" in instance_attrs, (cls, name)


def _surface(comm):
    sub = comm.split(0 if comm.rank < 2 else 1)
    return (comm.is_world, comm.capability("shared_scratch") is not None,
            comm.capability("process_group") is not None, comm.capability("nonsense"),
            sub.is_world)


def test_local_world_offers_shared_scratch():
    for is_world, scratch, pg, other, sub_world in md.launch(_surface, 4):
        assert is_world and scratch and not pg and other is None and not sub_world


def test_torch_world_offers_its_process_group():
    for is_world, scratch, pg, other, sub_world in md.launch(_surface, 3, backend="torch"):
        assert is_world and not scratch and pg and other is None and not sub_world


def _control_is_uncounted(comm):
    x = torch.arange(5.0)
    peer = 1 - comm.rank
    req = comm.control.irecv(torch.empty(5), peer, tag=7)
    comm.control.send(x, peer, tag=7)
    req.wait()
    comm.send(x, peer, tag=7) if comm.rank == 0 else comm.recv(torch.empty(5), 0, tag=7)
    return comm.stats.bytes_sent, comm.stats.bytes_received


def test_control_channel_is_not_in_stats():
    assert md.launch(_control_is_uncounted, 2) == [(20, 0), (0, 20)]
