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
        out = None
        if comm.rank == 0:
            try:
                comm.recv(torch.empty(1), 2, tag=4)
            except md.CommTimeout as e:
                out = e.op, e.peer, e.tag, e.timeout
        comm.barrier()  # rank 2 stays alive (not returned) while rank 0 waits
        return out

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
    assert "rank 1 has already returned from its function without sending a matching" in text
    assert "1 message from rank 1 arrived" in text and "ANY_SOURCE" in text, text


# -- issue 10, item 7: inputs a launch gets wrong -----------------------------------------------
def test_minidist_timeout_is_read_at_launch_time(monkeypatch):
    monkeypatch.setenv("MINIDIST_TIMEOUT", "7.5")  # set after `import minidist`
    assert md.launch(lambda comm: comm.timeout, 1) == [7.5]
    monkeypatch.setenv("MINIDIST_TIMEOUT", "")  # empty: the default
    assert md.launch(lambda comm: comm.timeout, 1) == [60.0]
    for bad in ("abc", "-3"):
        monkeypatch.setenv("MINIDIST_TIMEOUT", bad)
        with pytest.raises(ValueError, match=f"MINIDIST_TIMEOUT='{bad}'"):
            md.launch(lambda comm: None, 1)
    assert md.launch(lambda comm: comm.timeout, 1, timeout=2) == [2.0]  # explicit wins


def test_invalid_minidist_timeout_does_not_break_import():
    import os
    import subprocess
    import sys

    code = ("import minidist as md\ntry:\n    md.launch(lambda comm: None, 1)\n"
            "except ValueError as e:\n    print(e)\n")
    for bad in ("", "abc"):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, MINIDIST_TIMEOUT=bad))
        assert proc.returncode == 0, proc.stderr
        assert ("MINIDIST_TIMEOUT='abc' is not a number" in proc.stdout) == (bad == "abc")


@pytest.mark.parametrize("kwargs,exc,words", [
    ({"timeout": "5"}, TypeError, ["timeout must be a number of seconds", "str"]),
    ({"timeout": float("nan")}, ValueError, ["timeout must be a positive number"]),
    ({"timeout": True}, TypeError, ["timeout"]),
    ({"args": 5}, TypeError, ["args must be a tuple", "args=(5,)"]),
    ({"kwargs": [1]}, TypeError, ["kwargs must be a dict"]),
    ({"start_method": "thread"}, ValueError, ["start_method must be one of"]),
])
def test_bad_launch_inputs_get_clear_errors(kwargs, exc, words):
    with pytest.raises(exc) as info:
        md.launch(lambda comm, *a: None, 2, **kwargs)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_numpy_world_size_and_infinite_timeout_work(backend):
    import numpy as np

    def fn(comm):
        comm.sendrecv(torch.ones(2), 1 - comm.rank, torch.empty(2), 1 - comm.rank)
        return comm.timeout

    out = md.launch(fn, np.int64(2), backend=backend, timeout=float("inf"))
    assert out == [float("inf")] * 2


def test_generator_argument_under_spawn_names_the_argument():
    """In a subprocess: spawn starts multiprocess's resource tracker, which stays."""
    import subprocess
    import sys

    code = ("import minidist as md\n"
            "gen = (i for i in range(3))\n"
            "try:\n"
            "    md.launch(lambda comm, g, k=None: None, 2, args=(gen,), kwargs={'k': 1},\n"
            "              start_method='spawn')\n"
            "except TypeError as e:\n"
            "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "args[0] (a generator) cannot be sent to the ranks" in proc.stdout, proc.stdout
    assert "start_method='spawn'" in proc.stdout


def _recv_from_returned(comm):
    if comm.rank == 1:
        return "gone"
    start = time.perf_counter()
    try:
        comm.recv(torch.empty(3), 1, tag=4)
    except md.PeerLeftError as e:
        return str(e), time.perf_counter() - start


def test_receive_from_a_rank_that_returned_fails_at_once():
    """Rank 1 returns without sending: rank 0's receive says so within a moment, not after
    the whole timeout."""
    out = md.launch(_recv_from_returned, 2, timeout=30)
    text, waited = out[0]
    assert "rank 1 has already returned from its function" in text
    assert waited < 5


def _sent_then_returned(comm):
    if comm.rank == 1:
        comm.send(torch.arange(3.0), 0, tag=4)
        return None
    time.sleep(0.3)  # rank 1 has surely returned by now; its message is in the ring
    got = torch.empty(3)
    comm.recv(got, 1, tag=4)
    return got.tolist()


def test_a_message_sent_before_returning_still_arrives():
    assert md.launch(_sent_then_returned, 2)[0] == [0.0, 1.0, 2.0]
