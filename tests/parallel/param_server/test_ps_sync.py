"""Synchronous parameter server: the same trajectory as one process on the full batch and as
minidist's DDP, with 1, 2 and 3 servers and 1 to 4 workers; bytes into each server per step
= W*N/S; the timeline shows pushes, pulls and updates.

Tolerance. float64. A sync step applies the mean of the W workers' mean gradients, which
differs from the full-batch gradient only in the order terms are summed (~1e-16 relative);
four steps of SGD with momentum (and of Adam) on an O(1) MLP keep parameters within ~1e-16
(largest seen 1.1e-16). We allow 1e-12, four orders above that and far below what a real bug
(a missing 1/W, a gradient applied twice, a stale pull, a piece unpacked at the wrong offset)
causes (>= 1e-3 here).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close, params_of, train_single, train_steps
from torch import nn

import minidist as md
from minidist.costmodel.ps import ps_server_ingress_bytes
from minidist.parallel.param_server import plan_shards

ATOL = 1e-12
B, STEPS = 12, 4  # the global batch divides by every worker count tested (1..4)
SGD = {"lr": 0.1, "momentum": 0.9}
SLICE = 40  # elements: the 6x16 and 16x16 weights are sliced across servers, the rest whole


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3)).double()


def batches(steps: int = STEPS) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(B, 6, generator=g, dtype=torch.float64),
             torch.randn(B, 3, generator=g, dtype=torch.float64)) for _ in range(steps)]


def ps_train(comm, ps, model, data) -> None:
    """The worker loop: pull, forward/backward on this worker's slice, push; a last pull."""
    w, n = comm.rank - ps.num_servers, ps.num_workers
    for x, y in data:
        ps.pull()
        model.zero_grad()
        F.mse_loss(model(x.chunk(n)[w]), y.chunk(n)[w]).backward()
        ps.push()
    ps.pull()
    ps.close()


def _sync_rank(comm, num_servers: int, opt_name: str):
    model = mlp(seed=comm.rank)  # ranks start different: the PS starts all from rank 0's
    opt_class, kwargs = (torch.optim.SGD, SGD) if opt_name == "sgd" else \
        (torch.optim.Adam, {"lr": 0.01})
    ps = md.ParameterServer(comm, model, num_servers=num_servers, mode="sync",
                            optimizer_class=opt_class, slice_threshold=SLICE, **kwargs)
    if ps.is_server:
        report = ps.serve()
        mine = ps.plan.pack(comm.rank, [p.detach() for p in model.parameters()])
        return "server", mine, report
    ps_train(comm, ps, model, batches())
    return "worker", params_of(model), ps.report()


@pytest.mark.parametrize("num_servers", [1, 2, 3])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_sync_matches_single_process(num_servers, workers):
    opt = "adam" if (num_servers + workers) % 2 else "sgd"  # both optimizers, across cases
    kwargs = SGD if opt == "sgd" else {"lr": 0.01}
    opt_class = torch.optim.SGD if opt == "sgd" else torch.optim.Adam
    want = train_single(lambda: mlp(seed=0), batches(), optimizer_class=opt_class, **kwargs)
    out = md.launch(_sync_rank, num_servers + workers, args=(num_servers, opt), timeout=30)
    plan = plan_shards([tuple(p.shape) for p in mlp().parameters()], num_servers, SLICE)
    for rank, (role, got, report) in enumerate(out):
        if role == "worker":
            assert_params_close(got, want.params, atol=ATOL)
            assert report.steps == STEPS and report.staleness == [0] * STEPS
            assert report.versions == list(range(STEPS + 1))
        else:  # each server ends holding its shard of the final parameters
            expected = plan.pack(rank, list(want.params.values()))
            torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
            assert report.updates == STEPS and report.pushes == STEPS * workers
            assert set(report.staleness) == {0}
            assert report.departed == {w: "closed" for w in range(num_servers, len(out))}


def _ddp_rank(comm):
    ddp = md.DistributedDataParallel(mlp(seed=comm.rank), comm)
    train_steps(ddp, batches(), rank=comm.rank, world=comm.world_size, **SGD)
    return params_of(ddp.module)


@pytest.mark.parametrize("workers", [2, 3])
def test_sync_matches_minidist_ddp(workers):
    ddp = md.launch(_ddp_rank, workers, timeout=30)[0]
    out = md.launch(_sync_rank, 2 + workers, args=(2, "sgd"), timeout=30)
    for role, got, _ in out:
        if role == "worker":
            assert_params_close(got, ddp, atol=ATOL)


# -- bytes into each server: W * N / S ----------------------------------------------------------
def _bytes_rank(comm, num_servers: int, steps: int):
    model = mlp()
    ps = md.ParameterServer(comm, model, num_servers=num_servers, lr=0.1, slice_threshold=SLICE)
    comm.stats.reset()  # leave out the construction's broadcast
    if ps.is_server:
        ps.serve()
        return comm.stats.bytes_received, comm.stats.bytes_sent, ps.report()
    ps_train(comm, ps, model, batches(steps))
    return None


@pytest.mark.parametrize("num_servers,workers", [(1, 3), (2, 3), (3, 2)])
def test_server_ingress_is_w_n_over_s(num_servers, workers):
    steps = 3
    out = md.launch(_bytes_rank, num_servers + workers, args=(num_servers, steps), timeout=30)
    shapes = [tuple(p.shape) for p in mlp().parameters()]
    n_bytes = sum(torch.Size(s).numel() for s in shapes) * 8
    biggest_whole = max(torch.Size(s).numel() for s in shapes
                        if torch.Size(s).numel() <= SLICE) * 8
    for received, sent, report in out[:num_servers]:
        per_step = received / steps
        predicted = ps_server_ingress_bytes(workers, n_bytes, num_servers)
        assert abs(per_step - predicted) <= workers * biggest_whole  # one tensor's rounding
        assert per_step == workers * report.numel * 8  # exactly its shard from each worker
        assert received == report.bytes_in and sent == report.bytes_out
        assert sent == (steps + 1) * workers * report.numel * 8  # steps + 1 pulls each
    assert sum(r.numel for _, _, r in out[:num_servers]) * 8 == n_bytes


# -- the timeline ---------------------------------------------------------------------------
def _traced_rank(comm):
    model = mlp()
    ps = md.ParameterServer(comm, model, num_servers=1, lr=0.1)
    if ps.is_server:
        ps.serve()
    else:
        ps_train(comm, ps, model, batches(2))


def test_timeline_shows_pushes_pulls_updates():
    res = md.launch(_traced_rank, 3, trace=True, timeout=30)
    server = [e["name"] for e in res.timelines[0]]
    worker = [e["name"] for e in res.timelines[1]]
    assert server.count("ps.update") == 2 and server.count("ps.push") == 4
    assert server.count("ps.pull") == 6
    assert worker.count("ps.pull") == 3 and worker.count("ps.push") == 2


def _torch_backend_rank(comm):
    return _sync_rank(comm, 1, "sgd")


def test_sync_on_torch_backend():
    """The same protocol over gloo (minidist's torch transport)."""
    want = train_single(lambda: mlp(seed=0), batches(), **SGD)
    for role, got, _ in md.launch(_torch_backend_rank, 3, backend="torch", timeout=60):
        if role == "worker":
            assert_params_close(got, want.params, atol=ATOL)


# -- big tensors travel in place ------------------------------------------------------------
def wide(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # 256 x 300 = 76800 elements: above sharding.BIG_PIECE
    return nn.Sequential(nn.Linear(6, 256), nn.Tanh(), nn.Linear(256, 300), nn.Tanh(),
                         nn.Linear(300, 3)).double()


def _wide_rank(comm, num_servers: int, threshold: int | None):
    model = wide(seed=comm.rank)
    ps = md.ParameterServer(comm, model, num_servers=num_servers, slice_threshold=threshold,
                            **SGD)
    if ps.is_server:
        return ps.serve()
    ps_train(comm, ps, model, batches())
    return params_of(model)


@pytest.mark.parametrize("num_servers,threshold", [(1, None), (2, None), (2, 50_000)])
def test_sync_big_tensors_in_place(num_servers, threshold):
    """Segments sent from p.grad and received into p.data where they lie (whole, and, with
    the threshold, as two in-place slices at an offset), beside the packed small ones."""
    plan = plan_shards([tuple(p.shape) for p in wide().parameters()], num_servers, threshold)
    assert any(g.in_place for s in range(num_servers) for g in plan.segments(s))
    want = train_single(lambda: wide(seed=0), batches(), **SGD)
    out = md.launch(_wide_rank, num_servers + 2, args=(num_servers, threshold), timeout=30)
    for got in out[num_servers:]:
        assert_params_close(got, want.params, atol=ATOL)


def _no_final_pull(comm):
    model = mlp()
    ps = md.ParameterServer(comm, model, num_servers=2, slice_threshold=SLICE, **SGD)
    if ps.is_server:
        return ps.serve()
    w, n = comm.rank - 2, ps.num_workers
    for x, y in batches():
        ps.pull()
        model.zero_grad()
        F.mse_loss(model(x.chunk(n)[w]), y.chunk(n)[w]).backward()
        ps.push()  # in sync mode this also asks for the next parameters...
    ps.close()  # ...which close() receives: the model ends at the final parameters
    return params_of(model), ps.report()


def test_sync_close_leaves_final_parameters():
    want = train_single(lambda: mlp(seed=0), batches(), **SGD)
    out = md.launch(_no_final_pull, 4, timeout=30)
    for got, report in out[2:]:
        assert_params_close(got, want.params, atol=ATOL)
        assert report.pulls == STEPS
    assert all(r.pulls == STEPS * 2 + 2 for r in out[:2])  # the prefetched last one too
