"""The pipeline's message layer (``p2p.py``): every buffer a stage receives into, and every
flag and header it sends, is on the stage's device, so a CUDA stage after the first gets CUDA
tensors. No GPU here: a stage on torch's ``meta`` device (tensors with a shape and no data),
and stages in one process joined by an in-memory wire, with ``torch.empty`` recording the
device each buffer is asked for."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest
import torch
from torch import nn

import minidist as md
from minidist.parallel.pipeline.p2p import ACT, FLAG, GRAD, HEADER, tag
from minidist.trace import Timeline

CPU, META, FAKE_GPU = torch.device("cpu"), torch.device("meta"), torch.device("cuda", 1)


class Wire:
    """Messages in flight between fake ranks of one process, by (src, dst, tag)."""

    def __init__(self):
        self.queues: dict[tuple, deque] = defaultdict(deque)
        self.log: list[tuple] = []  # (src, dst, tag, tensor) as sent


class Received:
    """A receive posted on the wire: ``wait`` copies the message in; one not sent is a bug
    of the test's order (a real rank would block), so it fails at once."""

    def __init__(self, wire: Wire, key: tuple, buf: torch.Tensor):
        self.wire, self.key, self.buf = wire, key, buf

    def test(self) -> bool:
        return bool(self.wire.queues[self.key])

    def wait(self) -> None:
        assert self.test(), f"receive {self.key} waits for a message never sent"
        self.buf.copy_(self.wire.queues[self.key].popleft())


class Done:
    def test(self) -> bool:
        return True

    def wait(self) -> None:
        pass


class FakeComm:
    """What a stage uses of a Communicator: rank, world_size, device, timeline, and
    isend / irecv / recv of its ``strategy`` channel over a :class:`Wire` (``wire=None``:
    sends kept, receives never complete, for data-less meta tensors)."""

    def __init__(self, rank: int, world_size: int, wire: Wire | None = None,
                 device: torch.device = CPU):
        self.rank, self.world_size, self.wire, self.device = rank, world_size, wire, device
        self.timeline = Timeline(rank)
        self.sent: list[tuple] = []  # (dst, tag, tensor)
        self.posted: list[tuple] = []  # (src, tag, buffer)

    def isend(self, t, dst, tag):
        self.sent.append((dst, tag, t))
        if self.wire is not None:
            self.wire.queues[self.rank, dst, tag].append(t.clone())
            self.wire.log.append((self.rank, dst, tag, t.clone()))
        return Done()

    def irecv(self, buf, src, tag):
        self.posted.append((src, tag, buf))
        return Received(self.wire, (src, self.rank, tag), buf) if self.wire else Done()

    def recv(self, buf, src, tag):
        self.irecv(buf, src, tag).wait()

    @property
    def strategy(self):  # the channel the stage's messages travel on: this fake itself
        return self


def test_a_meta_stage_sends_and_receives_on_meta():
    """Stage 0 of 2 with its module on meta: its flag, header and activation go out on
    meta, and the gradient it receives lands on meta, so its backward runs (a CPU buffer
    here: "invalid gradient at index 0 - expected device meta but got cpu")."""
    comm = FakeComm(0, 2)
    stage = md.PipelineStage(nn.Linear(4, 5, device=META), comm)
    stage.begin_step()
    out = stage.forward(0, torch.empty(3, 4, device=META))
    stage.backward(0)
    stage.end_step()
    assert [(dst, t) for dst, t, _ in comm.sent] == [
        (1, tag(-1, FLAG, 1, 2)), (1, tag(0, HEADER, 1, 2)), (1, tag(0, ACT, 1, 2))]
    assert [t.device for *_, t in comm.sent] == [META] * 3
    assert [(src, t, b.shape, b.device) for src, t, b in comm.posted] == [
        (1, tag(0, GRAD, 0, 2), out.shape, META)]
    assert stage.submodule.weight.grad.device == META
    assert stage.device == META


@pytest.fixture
def empty_calls(monkeypatch) -> list:
    """Every device asked of ``torch.empty``; the buffer itself is made on the CPU, so a
    stage can believe it is on a GPU this machine does not have."""
    calls, real = [], torch.empty

    def recording_empty(*shape, device=None, **kw):
        calls.append(None if device is None else torch.device(device))
        return real(*shape, **kw)

    monkeypatch.setattr(torch, "empty", recording_empty)
    return calls


def _one_microbatch(stages, x: torch.Tensor, prefetch: bool) -> None:
    """Micro-batch 0 forward through stages 0 and 1 and back, as two ranks would run it."""
    first, last = stages
    first.begin_step()
    last.begin_step()
    first.forward(0, x)
    if prefetch:
        last.prefetch(0)
    last.backward(0, last.forward(0).sum())
    first.backward(0)
    first.end_step()
    last.end_step()


def test_a_later_stage_receives_on_its_own_device(empty_calls):
    """Stage 1 (no parameters) is on its rank's device, a GPU as far as it knows: its
    flag, header and activation buffers are asked for there; stage 0's gradient buffer
    on stage 0's CPU. The wire carries the flag, the header on a step whose shapes are
    new, and the activation, then the gradient; the result is one process's."""
    wire = Wire()
    linear = nn.Linear(4, 5).double()
    stages = [md.PipelineStage(linear, FakeComm(0, 2, wire)),
              md.PipelineStage(nn.Tanh(), FakeComm(1, 2, wire, device=FAKE_GPU))]
    empty_calls.clear()  # nn.Linear's own
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _one_microbatch(stages, x, prefetch=False)  # the first step: headers
    _one_microbatch(stages, x, prefetch=True)  # same shapes: no header, receive posted early
    assert empty_calls == [FAKE_GPU, CPU, FAKE_GPU, FAKE_GPU,  # flag, grad, header, act
                           FAKE_GPU, CPU, FAKE_GPU]  # flag, grad, act (prefetched)
    kinds = [(src, t % 4) for src, _, t, _ in wire.log]
    assert kinds == [(0, FLAG), (0, HEADER), (0, ACT), (1, GRAD), (0, FLAG), (0, ACT), (1, GRAD)]
    assert [s.device for s in stages] == [CPU, FAKE_GPU]
    assert [int(t[0]) for src, _, k, t in wire.log if k % 4 == FLAG] == [1, 0]
    header = next(t for _, _, k, t in wire.log if k % 4 == HEADER)
    assert header.tolist() == [1, 2, 3, 5, 0, 0, 0, 0, 0, 0]  # float64, 2 dims, (3, 5)
    reference = nn.Linear(4, 5).double()
    reference.load_state_dict(linear.state_dict())
    (2 * torch.tanh(reference(x)).sum()).backward()  # two steps' gradients accumulated
    assert torch.equal(linear.weight.grad, reference.weight.grad)


def test_the_device_comes_from_the_argument_then_the_module_then_the_comm():
    comm = FakeComm(0, 1, device=FAKE_GPU)
    assert md.PipelineStage(nn.Linear(2, 2), comm, device="meta").device == META
    assert md.PipelineStage(nn.Linear(2, 2, device=META), comm).device == META
    assert md.PipelineStage(nn.Tanh(), comm).device == FAKE_GPU
    assert md.PipelineStage(nn.BatchNorm1d(2, affine=False, device=META), comm).device == META
    with pytest.raises(ValueError, match="device='gpu0' is not a torch device"):
        md.PipelineStage(nn.Tanh(), comm, device="gpu0")
