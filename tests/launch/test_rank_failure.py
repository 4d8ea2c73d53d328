"""``md.launch(..., on_rank_failure="continue")``: a rank that dies does not stop the others;
they are told (receives from it fail at once, sends to it are dropped), launch returns their
results with an ``md.RankFailed`` in its slot; a failure they cannot survive still raises,
naming the rank that died. Only the local backend can do this."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import minidist as md


def _kill(comm, then: str):
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if then == "recv_catch":  # rank 0 waits for a message the dead rank never sent
        if comm.rank == 0:
            try:
                comm.recv(torch.empty(4), 1)
            except md.PeerLeftError:
                return "told"
            return "got a message"
    if then == "recv" and comm.rank == 0:
        comm.recv(torch.empty(4), 1)
    if then == "big_send" and comm.rank == 0:  # far more than the ring holds
        comm.send(torch.zeros(8 << 20), 1)
    if then == "all_reduce":
        md.all_reduce(comm, torch.ones(4))
    return comm.rank * 10


def test_survivors_return_and_the_dead_rank_is_reported():
    out = md.launch(_kill, 3, args=("nothing",), on_rank_failure="continue", timeout=20)
    failed = out[1]
    assert out[0] == 0 and out[2] == 20 and out.failures == (failed,)
    assert isinstance(out, md.Results) and isinstance(out, list) and len(out) == 3
    assert (failed.rank, failed.signal, failed.exitcode) == (1, "SIGKILL", -9)
    assert repr(failed) == "RankFailed(rank=1, 'killed by signal SIGKILL')"
    assert str(failed) == "rank 1 failed: killed by signal SIGKILL"
    assert repr(out) == "[0, RankFailed(rank=1, 'killed by signal SIGKILL'), 20]"
    error = failed.as_error()
    assert isinstance(error, md.WorkerError) and error.rank == 1 and "SIGKILL" in str(error)


def test_default_launch_has_no_failures():
    out = md.launch(_kill, 1, args=("nothing",))
    assert out == [0] and out.failures == ()


def test_a_receive_from_the_dead_rank_fails_at_once():
    """The caller marks the dead rank in the segment: rank 0's receive raises PeerLeftError
    (without the mark it would wait the full timeout and fail with CommTimeout)."""
    out = md.launch(_kill, 2, args=("recv_catch",), on_rank_failure="continue", timeout=20)
    assert out[0] == "told" and out.failures[0].rank == 1


def test_a_send_to_the_dead_rank_is_dropped():
    """32 MiB into a ring of at most 8: nobody will drain it, so the send completes."""
    out = md.launch(_kill, 2, args=("big_send",), on_rank_failure="continue", timeout=20)
    assert out[0] == 0 and isinstance(out[1], md.RankFailed)


def test_a_failure_the_others_cannot_survive_raises_naming_the_dead_rank():
    with pytest.raises(md.WorkerError) as info:
        md.launch(_kill, 2, args=("recv",), on_rank_failure="continue", timeout=20)
    text = str(info.value)
    assert info.value.rank == 1 and "killed by signal SIGKILL" in text
    assert "could not do without it: rank 0 then failed with PeerLeftError" in text


def test_ranks_stuck_in_a_collective_without_the_dead_rank_are_stopped():
    with pytest.raises(md.WorkerError) as info:
        md.launch(_kill, 3, args=("all_reduce",), on_rank_failure="continue", timeout=20)
    text = str(info.value)
    assert info.value.rank == 1 and "killed by signal SIGKILL" in text
    assert "waited for it in a collective" in text  # (rank 0, 2 or both, by then)


def _raise_on_one(comm):
    if comm.rank == 1:
        raise ValueError("bad batch")
    return comm.rank


def test_an_exception_is_kept_with_its_traceback():
    out = md.launch(_raise_on_one, 3, on_rank_failure="continue", timeout=20)
    failed = out[1]
    assert out[0] == 0 and out[2] == 2
    assert (failed.exc_type, failed.error, failed.signal) == ("ValueError", "ValueError: bad "
                                                               "batch", None)
    assert 'raise ValueError("bad batch")' in failed.traceback


@pytest.mark.parametrize("kwargs,text", [
    ({"on_rank_failure": "ignore"},
     r"on_rank_failure must be one of 'error', 'continue' \('error': "),
    ({"on_rank_failure": "continue", "backend": "torch"},
     r"on_rank_failure='continue' needs backend='local', not 'torch'"),
])
def test_bad_on_rank_failure(kwargs, text):
    with pytest.raises(ValueError, match=text):
        md.launch(_raise_on_one, 2, **kwargs)
