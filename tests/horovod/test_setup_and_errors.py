"""hvd.init and what it knows (ranks by host), hvd.run, objects, and every bad input."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import minidist as md
import minidist.horovod as hvd


def _hosts(comm, names):
    os.environ["HOROVOD_HOSTNAME"] = names[comm.rank]  # as Horovod's launcher sets it
    hvd.init(comm)
    out = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
           hvd.cross_size(), hvd.is_homogeneous(), hvd.is_initialized())
    hvd.shutdown()
    return out + (hvd.is_initialized(),)


def test_local_and_cross_ranks_follow_hosts():
    got = md.launch(_hosts, 4, args=(["a", "a", "b", "b"],))
    assert [g[2:6] for g in got] == [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
    assert [g[:2] for g in got] == [(r, 4) for r in range(4)]
    assert all(g[6] and g[7] and not g[8] for g in got)
    uneven = md.launch(_hosts, 3, args=(["a", "b", "a"],))
    assert [g[2:7] for g in uneven] == [(0, 2, 0, 2, False), (0, 1, 1, 2, False),
                                        (1, 2, 0, 1, False)]


def test_built_flags():
    assert hvd.mpi_built() is False
    assert hvd.gloo_built() == dist.is_gloo_available()
    assert hvd.nccl_built() == dist.is_nccl_available()
    assert hvd.cuda_built() == (torch.version.cuda is not None)


def _work(scale):
    return hvd.allreduce(torch.tensor([float(hvd.rank()) * scale]), op=hvd.Sum).item()


def test_run_returns_results_by_rank():
    assert hvd.run(_work, args=(2.0,), np=3) == [6.0, 6.0, 6.0]
    assert hvd.run(_work, kwargs={"scale": 1.0}, np=2, hosts="localhost:2",
                   use_gloo=True) == [1.0, 1.0]


def test_run_refuses_what_it_cannot_do():
    with pytest.raises(NotImplementedError, match="MPI"):
        hvd.run(_work, args=(1.0,), np=2, use_mpi=True)
    with pytest.raises(NotImplementedError, match="this machine only"):
        hvd.run(_work, args=(1.0,), np=2, hosts="node1:2,node2:2")
    with pytest.raises(NotImplementedError, match="ssh_port"):
        hvd.run(_work, args=(1.0,), np=2, ssh_port=22)


class Opaque:
    pass


def _objects(comm):
    hvd.init(comm)
    out = {"obj": hvd.broadcast_object({"epoch": 3 + comm.rank, "t": torch.ones(2)}, 1),
           "all": hvd.allgather_object([comm.rank, "x" * comm.rank])}
    for what, call in (("bcast", lambda: hvd.broadcast_object(Opaque(), root_rank=0)),
                       ("gather", lambda: hvd.allgather_object(
                           Opaque() if comm.rank == 1 else 1))):
        try:
            call()
        except TypeError as e:
            out[what] = str(e)
    out["after"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()  # still in step
    hvd.shutdown()
    return out


def test_objects_travel_as_plain_types_only():
    for out in md.launch(_objects, 2):
        assert out["obj"]["epoch"] == 4 and torch.equal(out["obj"]["t"], torch.ones(2))
        assert out["all"] == [[0, ""], [1, "x"]]
        assert "rank 0's object" in out["bcast"] and "weights_only" in out["bcast"]
        assert "rank 1's object" in out["gather"]
        assert out["after"] == 2.0


def _mismatch(comm):
    hvd.init(comm)
    try:
        hvd.allreduce(torch.zeros(3), name=f"grad.{comm.rank}")
    except hvd.HorovodInternalError as e:
        return str(e)
    finally:
        hvd.shutdown()


def test_different_collectives_on_different_ranks_are_an_error_naming_them():
    for r, text in enumerate(md.launch(_mismatch, 2)):
        assert "ranks 0 and 1 submitted different collectives" in text
        assert f"name 'grad.{r}'" in text and "same order" in text


def _bad_inputs(comm):
    hvd.init(comm)
    errors = []
    calls = [lambda: hvd.broadcast(torch.zeros(1), root_rank=5),
             lambda: hvd.allgather(torch.tensor(1.0)),
             lambda: hvd.alltoall(torch.zeros(3)),
             lambda: hvd.alltoall(torch.zeros(3), splits=[1, 1]),
             lambda: hvd.allreduce_(torch.zeros(4, 4).t()),
             lambda: hvd.allreduce([1.0]),
             lambda: hvd.allreduce(torch.zeros(1), op=99),
             lambda: hvd.allreduce(torch.zeros(1), op=hvd.Sum, average=True),
             lambda: hvd.synchronize(12345)]
    for call in calls:
        try:
            call()
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    hvd.shutdown()
    return errors


def test_bad_inputs_are_clear_errors():
    errors = md.launch(_bad_inputs, 2)[0]
    wanted = ["root_rank must be a rank in 0..1", "at least one dimension",
              "do not split equally over 2 ranks", "2 non-negative row counts summing to 3",
              "must be contiguous", "expected a torch.Tensor", "unknown op 99",
              "not both", "unknown handle 12345"]
    assert len(errors) == len(wanted)
    for text, want in zip(errors, wanted):
        assert want in text


def test_adasum_and_uninitialized():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.zeros(1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="hvd.init"):
        hvd.rank()
    model = torch.nn.Linear(2, 1)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
