"""Bad input gets a clear error that names the mistake; deadlocks become CommTimeout."""

from __future__ import annotations

import time

import pytest
import torch

import minidist as md


def _expect(comm, what):
    """Run one mistake on rank 0; return the exception type and message it raised."""
    peer = 1 - comm.rank
    try:
        if what == "dst_outside":
            comm.send(torch.zeros(1), 5)
        elif what == "src_outside":
            comm.recv(torch.zeros(1), -3)
        elif what == "noncontiguous":
            comm.send(torch.zeros(4, 4).t(), peer)
        elif what == "not_a_tensor":
            comm.send([1, 2, 3], peer)
        elif what == "bad_tag":
            comm.send(torch.zeros(1), peer, tag="x")
        elif what == "bad_color":
            comm.split(-2)
    except Exception as e:
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("what,exc,words", [
    ("dst_outside", "ValueError", ["dst=5", "world_size is 2", "0..1"]),
    ("src_outside", "ValueError", ["src=-3", "0..1"]),
    ("noncontiguous", "ValueError", ["not contiguous", ".contiguous()"]),
    ("not_a_tensor", "TypeError", ["torch.Tensor", "list"]),
    ("bad_tag", "TypeError", ["tag must be an int"]),
    ("bad_color", "ValueError", ["color"]),
])
def test_bad_arguments(what, exc, words):
    got = md.launch(lambda comm: _expect(comm, what) if comm.rank == 0 else None, 2,
                    timeout=5)[0]
    assert got is not None and got[0] == exc
    for w in words:
        assert w in got[1], got[1]


def _mismatch(comm, kind):
    if comm.rank == 1:
        comm.send(torch.zeros(10, dtype=torch.float32), 0)
        return None
    buf = {"smaller": torch.empty(8), "larger": torch.empty(12),
           "dtype": torch.empty(10, dtype=torch.int32)}[kind]
    try:
        comm.recv(buf, 1)
    except md.MessageMismatchError as e:
        return str(e)
    return None


@pytest.mark.parametrize("kind", ["smaller", "larger", "dtype"])
def test_size_and_dtype_mismatch(backend, kind):
    msg = md.launch(_mismatch, 2, args=(kind,), backend=backend, timeout=10)[0]
    assert msg is not None, "the mismatch was not reported"
    assert "rank 1" in msg and "40 bytes of float32" in msg
    assert ("int32" in msg) if kind == "dtype" else (f"{4 * (8 if kind == 'smaller' else 12)}"
                                                     in msg)


def _deadlock(comm):
    comm.recv(torch.empty(3), 1 - comm.rank, tag=7)  # both wait, nobody sends


def test_deadlock_becomes_comm_timeout(backend):
    t = time.perf_counter()
    with pytest.raises(md.CommTimeout) as info:
        md.launch(_deadlock, 2, backend=backend, timeout=1.0)
    assert time.perf_counter() - t < 30
    err = info.value
    assert isinstance(err, md.WorkerError)
    text = str(err)
    assert "recv" in text and "tag 7" in text and "timed out after 1 s" in text
    assert "deadlock" in text


def test_timeout_names_the_peer():
    def fn(comm):
        if comm.rank == 0:
            try:
                comm.recv(torch.empty(1), 2, tag=4)
            except md.CommTimeout as e:
                return e.op, e.peer, e.tag, e.timeout
        return None

    assert md.launch(fn, 3, timeout=0.3)[0] == ("recv", 2, 4, 0.3)


@pytest.mark.parametrize("world_size,exc", [(0, ValueError), (-1, ValueError),
                                            ("4", TypeError), (2.0, TypeError)])
def test_bad_world_size(world_size, exc):
    with pytest.raises(exc, match="world_size"):
        md.launch(lambda comm: None, world_size)


def test_bad_backend_and_device():
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        md.launch(lambda comm: None, 2, backend="mpi")
    with pytest.raises(ValueError, match="device"):
        md.launch(lambda comm: None, 2, device="tpu")
    with pytest.raises(ValueError, match="timeout"):
        md.launch(lambda comm: None, 2, timeout=0)


def _any_then_named(comm):
    if comm.rank == 1:
        comm.send(torch.ones(2), 0, tag=3)
        return None
    comm.recv(torch.empty(2), md.ANY_SOURCE, tag=3)  # takes rank 1's only message
    try:
        comm.recv(torch.empty(2), 1, tag=3)
    except md.CommTimeout as e:
        return str(e)


def test_timeout_after_any_source_says_what_arrived():
    text = md.launch(_any_then_named, 2, timeout=1.0)[0]
    assert "rank 1 never sent a matching message" in text
    assert "1 message from rank 1 arrived" in text and "ANY_SOURCE" in text, text
