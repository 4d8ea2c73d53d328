"""The caller blames the rank that left first, with what it did (issue 10, item 4): not a
survivor's "Connection reset by peer" on the torch backend, not a full timeout on the
local one."""

from __future__ import annotations

import importlib
import os
import signal
import time

import pytest
import torch

import minidist as md


def _leave_early(comm, how):
    x = torch.ones(8)
    md.all_reduce(comm, x)
    if comm.rank == 2:
        if how in ("return", "recv"):
            return "early"  # with "recv", the others wait for a message from it
        if how == "exit":
            os._exit(0)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    if how == "recv":
        comm.recv(torch.empty(1), 2)
    for _ in range(3):
        md.all_reduce(comm, x)
    return "done"


@pytest.mark.parametrize("how,words", [
    ("return", "returned from its function"), ("exit", "exit code 0"),
    ("kill", "SIGKILL"), ("recv", "returned from its function")])
def test_torch_backend_blames_the_rank_that_left(how, words):
    with pytest.raises(md.WorkerError) as info:
        md.launch(_leave_early, 4, args=(how,), backend="torch", timeout=30)
    assert info.value.rank == 2, str(info.value)
    assert words in str(info.value)


def test_local_backend_sees_a_returned_rank_at_once():
    """The others wait at a shared-memory barrier the returned rank never reached: the
    caller stops them at once, naming it, instead of letting them time out."""
    t = time.perf_counter()
    with pytest.raises(md.WorkerError) as info:
        md.launch(_leave_early, 4, args=("return",), timeout=30)
    assert time.perf_counter() - t < 10
    assert info.value.rank == 2 and "returned from its function" in str(info.value)
    assert "waited for it in a collective" in str(info.value)  # those already there


def _skip_one(comm):
    if comm.rank != 1:
        md.all_reduce(comm, torch.ones(4))
    else:
        time.sleep(3)


def test_local_barrier_timeout_names_the_collective_and_the_missing_rank():
    with pytest.raises(md.WorkerError) as info:
        md.launch(_skip_one, 3, timeout=1)
    text = str(info.value)
    assert "all_reduce(float32[4]" in text and "shared-memory barrier" in text
    assert "Rank 1 never reached it (ranks 0, 2 did)" in text


def _split_timeout(comm):
    sub = comm.split(comm.rank % 2)
    if comm.rank == 2:
        return None
    try:
        sub.recv(torch.empty(1), 1 - sub.rank)
    except md.CommTimeout as e:
        return str(e)
    return None


def test_split_communicator_errors_say_which_world_ranks():
    out = md.launch(_split_timeout, 4, timeout=0.5)
    assert "its rank 0 is world rank 0, its rank 1 is world rank 2" in out[0]


# -- issue 23, item 9: a rank's own report wins over the failures it causes ---------------------
def _raise_on_rank_two(comm):
    if comm.rank == 2:
        raise KeyError("the missing key")
    comm.recv(torch.empty(1), 2)  # fails at once (local: PeerLeftError; torch: connection lost)


@pytest.fixture
def busy_caller(monkeypatch):
    """A caller that looks at its ranks only every 0.2 s, as a loaded machine's does: by then
    the raising rank's report and the survivors' PeerLeftError are all waiting at once, and
    the pipes are read in rank order, survivors first."""
    watch = importlib.import_module("minidist.launch.watch")  # md.launch is the function
    real = watch.wait_any

    def slow(objects, timeout=None):
        time.sleep(0.2)
        return real(objects, timeout=timeout)

    monkeypatch.setattr(watch, "wait_any", slow)


@pytest.mark.parametrize("backend", ["local", "torch"])
def test_a_busy_caller_blames_the_rank_that_raised(backend, busy_caller):
    with pytest.raises(md.WorkerError) as info:
        md.launch(_raise_on_rank_two, 4, backend=backend, timeout=30)
    assert info.value.rank == 2 and info.value.exc_type == "KeyError", str(info.value)


@pytest.mark.parametrize("how,words", [
    ("return", "returned from its function"), ("exit", "exit code 0"),
    ("kill", "SIGKILL"), ("recv", "returned from its function")])
def test_local_backend_blames_the_rank_that_left(how, words, busy_caller):
    with pytest.raises(md.WorkerError) as info:
        md.launch(_leave_early, 4, args=(how,), timeout=30)
    assert info.value.rank == 2, str(info.value)
    assert words in str(info.value)


def test_peer_left_is_a_consequence_not_a_cause():
    from minidist.launch.watch import failure_kind

    left = md.PeerLeftError("recv", 2, 0, 0, "")
    assert failure_kind(left, True) == "lost"
    assert failure_kind(md.CommTimeout("recv", 2, 0, 1.0), True) == "timeout"
    assert failure_kind(KeyError("x"), False) is None
