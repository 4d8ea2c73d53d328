"""Bad input gets a clear error that names the mistake: no workers, an unknown mode, a negative
staleness, a gradient of the wrong shape, ranks that disagree, a role's call on the other
role. Argument checks run before any message, so most are tested on a stand-in comm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import minidist as md


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()


COMM = SimpleNamespace(world_size=3, rank=0)  # fails before any communication


@pytest.mark.parametrize("kwargs,error,text", [
    ({"num_servers": 3}, ValueError, r"num_servers=3 leaves no worker: world_size is 3"),
    ({"num_servers": 5}, ValueError, r"num_servers=5 leaves no worker"),
    ({"num_servers": 0}, ValueError, r"num_servers must be a positive integer, got 0"),
    ({"mode": "hogwild"}, ValueError, r"unknown mode 'hogwild'; the modes are 'sync', "
                                      r"'async', 'ssp'"),
    ({"mode": "ssp", "staleness": -1}, ValueError,
     r"staleness .* must be a non-negative integer, got -1"),
    ({"mode": "sync", "staleness": 2}, ValueError, r"staleness=2 only means something with "
                                                   r"mode='ssp'"),
    ({"on_worker_exit": "ignore"}, ValueError, r"on_worker_exit must be one of"),
    ({"slice_threshold": 0}, ValueError, r"slice_threshold \(elements, or None\) must be a "
                                                r"positive integer, got 0"),
    ({"optimizer_class": "sgd"}, TypeError, r"optimizer_class must be a torch.optim.Optimizer"),
    ({"momentum": 0.9, "lr": -1.0}, ValueError, r"optimizer_class=SGD rejects the optimizer "
                                                r"arguments .*lr"),
])
def test_bad_arguments(kwargs, error, text):
    with pytest.raises(error, match=text):
        md.ParameterServer(COMM, model(), **kwargs)


def test_model_checks():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        md.ParameterServer(COMM, [torch.zeros(2)])
    with pytest.raises(ValueError, match="model has no parameters"):
        md.ParameterServer(COMM, nn.ReLU())
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="one dtype .* torch.float32, torch.float64"):
        md.ParameterServer(COMM, mixed)


def test_no_workers_under_launch():
    def fn(comm):
        md.ParameterServer(comm, model(), num_servers=2)

    with pytest.raises(md.WorkerError, match="num_servers=2 leaves no worker"):
        md.launch(fn, 2, timeout=10)


def _wrong_shape(comm):
    m = model()
    ps = md.ParameterServer(comm, m, lr=0.1)
    if ps.is_server:
        return ps.serve()
    ps.pull()
    grads = [torch.zeros_like(p) for p in m.parameters()]
    grads[2] = torch.zeros(2, 5, dtype=torch.float64)  # the second layer's weight is 2x4
    ps.push(grads)


def test_wrong_gradient_shape_names_the_parameter():
    with pytest.raises(md.WorkerError, match=r"gradient pushed for parameter '1.weight' has "
                                             r"shape \(2, 5\) .* parameter has shape \(2, 4\)"):
        md.launch(_wrong_shape, 2, timeout=10)


def _wrong_count(comm):
    m = model()
    ps = md.ParameterServer(comm, m, lr=0.1)
    if ps.is_server:
        return ps.serve()
    ps.push([torch.zeros(4, 3, dtype=torch.float64)])


def test_wrong_gradient_count():
    with pytest.raises(md.WorkerError, match="push got 1 gradients, but the model has 4"):
        md.launch(_wrong_count, 2, timeout=10)


def _disagree(comm):
    md.ParameterServer(comm, model(), mode="sync" if comm.rank < 2 else "async")


def test_ranks_must_agree():
    with pytest.raises(md.WorkerError, match="mode is 'sync' on rank 0 and 'async' on rank 2"):
        md.launch(_disagree, 3, timeout=10)


def _other_model(comm):
    m = model() if comm.rank == 0 else nn.Linear(3, 4).double()
    md.ParameterServer(comm, m)


def test_models_must_match():
    with pytest.raises(md.WorkerError, match="number of parameter tensors is 4 on rank 0 and "
                                             "2 on rank 1"):
        md.launch(_other_model, 2, timeout=10)


def _misuse(comm, what: str):
    ps = md.ParameterServer(comm, model(), lr=0.1)
    if what == "worker serves" and not ps.is_server:
        ps.serve()
    if what == "server pulls" and ps.is_server:
        ps.pull()
    if what == "push after close":
        if ps.is_server:
            return ps.serve()
        ps.close()
        ps.push()


@pytest.mark.parametrize("what,text", [
    ("worker serves", r"rank 1 is a worker .* call pull/push/close, not serve\(\)"),
    ("server pulls", r"rank 0 is a server .* call serve\(\), not pull\(\)"),
    ("push after close", r"rank 1: push\(\) after close\(\)"),
])
def test_role_misuse(what, text):
    with pytest.raises(md.WorkerError, match=text):
        md.launch(_misuse, 2, args=(what,), timeout=10)
