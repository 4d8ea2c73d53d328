"""The stored tests as a notebook's test cells run them (``check``, on the kernel's own
objects): the worked solutions pass, wrong answers get feedback that names the mistake, and
the learner's code still runs only in child processes, under the test's rules."""

from __future__ import annotations

import math
import pathlib

import nbformat
import numpy as np
import pytest
import torch

import minidist as md
from minidist.grading import learner
from minidist.grading.feedback import Mistake
from minidist.grading.kernel import checker
from minidist.grading.registry import EXERCISES, stored_tests

ROOT = pathlib.Path(__file__).resolve().parents[2]


def solution_namespace(name: str) -> dict:
    """Run the setup cell and the solution cells that define what the stored tests need
    (each such cell's grade_id names its function) of solutions/<name>.ipynb; return their
    globals."""
    nb = nbformat.read(str(ROOT / "solutions" / f"{name}.ipynb"), as_version=4)
    needed = {"setup"} | {n for t in stored_tests(name).values() for n in t.needs}
    ns: dict = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade_id") in needed:
            exec(compile(cell.source, f"<{meta['grade_id']}>", "exec"), ns)
    return ns


def feedback(exercise: str, grade_id: str, fn) -> str:
    with pytest.raises(Mistake) as info:
        checker(exercise)(grade_id, fn)
    return str(info.value)


@pytest.fixture
def quick_deadlocks(monkeypatch):
    monkeypatch.setattr(learner, "COMM_TIMEOUT", 2.0)


@pytest.mark.parametrize("name", list(EXERCISES))
def test_worked_solutions_pass_every_stored_test(name, capsys):
    ns, check = solution_namespace(name), checker(name)
    for test in stored_tests(name).values():
        check(test.grade_id, *[ns[n] for n in test.needs])
        assert f"{test.grade_id}: passed, {test.points}/{test.points} points" in \
            capsys.readouterr().out


def test_check_wants_what_the_test_needs():
    with pytest.raises(TypeError, match="takes ring_shift"):
        checker("00_getting_started")("test_ring_shift")
    with pytest.raises(KeyError, match="no test 'test_nothing'"):
        checker("00_getting_started")("test_nothing", print)


# -- exercise 00 ----------------------------------------------------------------------------
def recv_first_shift(comm, t):
    out = torch.empty_like(t)
    comm.recv(out, (comm.rank - 1) % comm.world_size)
    comm.send(t, (comm.rank + 1) % comm.world_size)
    return out


def backwards_shift(comm, t):
    out = torch.empty_like(t)
    p = comm.world_size
    req = comm.irecv(out, (comm.rank + 1) % p)
    comm.send(t, (comm.rank - 1) % p)
    req.wait()
    return out


def round_trip_ping_pong(comm, nbytes, iters):
    import time

    comm.barrier()
    buf, start = torch.zeros(nbytes, dtype=torch.uint8), time.perf_counter()
    for _ in range(iters if comm.rank < 2 else 0):
        if comm.rank == 0:
            comm.send(buf, 1)
            comm.recv(buf, 1)
        else:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    return (time.perf_counter() - start) / iters


def plain_least_squares(sizes, seconds):
    a = np.stack([np.ones(len(sizes)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, slope), *_ = np.linalg.lstsq(a, np.asarray(seconds), rcond=None)
    return float(alpha), float(1 / slope)


def test_feedback_for_exercise_00(quick_deadlocks):
    text = feedback("00_getting_started", "test_ring_shift", recv_first_shift)
    assert text.startswith("deadlock in ring_shift at `comm.recv(out, (comm.rank - 1) % "
                           "comm.world_size)` (world_size=2, n=1, dtype=float32): rank 0 waits "
                           "in recv from rank 1; rank 1 waits in recv from rank 0"), text
    text = feedback("00_getting_started", "test_ring_shift", backwards_shift)
    assert "that is the tensor of rank 1" in text and "left neighbour" in text
    text = feedback("00_getting_started", "test_ping_pong", round_trip_ping_pong)
    assert "that is the round trip" in text
    text = feedback("00_getting_started", "test_fit_alpha_beta", plain_least_squares)
    assert "relative error" in text


# -- exercise 01 ----------------------------------------------------------------------------
def everyone_to_everyone(comm, t):
    others = [r for r in range(comm.world_size) if r != comm.rank]
    bufs = [torch.empty_like(t) for _ in others]
    reqs = [comm.irecv(b, r) for b, r in zip(bufs, others)]
    for r in others:
        comm.send(t, r)
    for req, b in zip(reqs, bufs):
        req.wait()
        t += b
    return t


def wrong_owner_reduce_scatter(comm, chunks):
    p, r = comm.world_size, comm.rank
    for s in range(p - 1):
        send_i, recv_i = (r - s) % p, (r - s - 1) % p
        got = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], (r + 1) % p, got, (r - 1) % p)
        chunks[recv_i] += got


def library_all_reduce(comm, t):
    return md.all_reduce(comm, t, algorithm="ring")


def test_feedback_for_exercise_01():
    text = feedback("01_collectives", "test_naive_all_reduce", everyone_to_everyone)
    assert "rank 1 sent 28 bytes to rank 0, 28 bytes to rank 2" in text
    text = feedback("01_collectives", "test_ring_all_reduce", everyone_to_everyone)
    assert "more than the 2(p-1)/p·n = 36 bytes of a ring all_reduce" in text
    text = feedback("01_collectives", "test_ring_reduce_scatter", wrong_owner_reduce_scatter)
    assert "rank 0: 4 of 4 values wrong" in text and "missing rank(s) [1]" in text
    text = feedback("01_collectives", "test_ring_all_reduce", library_all_reduce)
    assert "minidist.collectives.api.all_reduce is not allowed in this exercise" in text
    assert md.all_reduce.__code__.co_name == "all_reduce"  # only the child was changed


# -- exercise 02 ----------------------------------------------------------------------------
def contiguous_shards(n, rank, world_size, shuffle=True, seed=0, epoch=0):
    per = math.ceil(n / world_size)
    idx = list(range(n)) * 2
    return idx[rank * per:(rank + 1) * per]


def summed_gradient_hooks(model, comm):
    def add_up(param):
        md.all_reduce(comm, param.grad, op="sum")

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(add_up)


def forward_buckets(sizes, cap):
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        if filled >= cap:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


def test_feedback_for_exercise_02():
    text = feedback("02_data_parallel", "test_shard_indices", contiguous_shards)
    assert "rank 0 got [0, 1, 2, 3], expected [0, 3, 6, 9]" in text
    assert "indices[rank::world_size]" in text
    text = feedback("02_data_parallel", "test_register_allreduce_hooks", summed_gradient_hooks)
    assert "2 times too large" in text and "divide by world_size" in text
    text = feedback("02_data_parallel", "test_assign_buckets", forward_buckets)
    assert "fill buckets in reverse order" in text
