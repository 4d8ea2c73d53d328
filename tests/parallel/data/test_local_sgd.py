"""Synchronising less: local SGD (periodic model averaging) and gradient accumulation.

Tolerance. Models and data are float64. Local SGD with period 1 averages parameters
x - lr m_w instead of gradients; the two differ only in rounding (a few ulps of O(1)
parameters per step), so we allow DDP's 1e-13 (``test_data_parallel.py`` explains it).
"""

from __future__ import annotations

import pytest
import torch
from oracles import assert_params_close, assert_replicas_bitwise, mse, params_of, train_single
from test_data_parallel import SGD, batches, mlp

import minidist as md
from minidist.costmodel.collectives import ring_bytes
from minidist.parallel.data import accumulate_gradients, local_sgd_bytes

ATOL = 1e-13
HUGE = 1000.0  # one bucket: DDP's warm-up all_reduce is one ring of the whole model


def local_train(comm, local: md.LocalSGD, data) -> list[dict]:
    """SGD with momentum on this rank's slice; after each step: did it average, are the
    replicas bitwise equal, bytes sent in the step."""
    opt = torch.optim.SGD(local.parameters(), **SGD)
    log = []
    for x, y in data:
        before = comm.stats.bytes_sent
        opt.zero_grad()
        mse(local, x.chunk(comm.world_size)[comm.rank], y.chunk(comm.world_size)[comm.rank]
            ).backward()
        opt.step()
        averaged = local.step()
        sent = comm.stats.bytes_sent - before
        mine = list(params_of(local.module).values())
        equal = all([torch.equal(t, md.broadcast(comm, t.clone())) for t in mine])  # rank 0's
        same = md.all_reduce(comm, torch.tensor([int(equal)]), op="min").item() == 1
        log.append({"averaged": averaged, "same": same, "sent": sent})
    return log


def _period_one_rank(comm, warmup: int):
    model = mlp(seed=comm.rank)  # replicas start different: DDP copies rank 0's
    local = md.LocalSGD(model, comm, period=1, warmup_steps=warmup)
    local_train(comm, local, batches("mlp"))
    assert_replicas_bitwise(comm, model)
    return params_of(model)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("warmup", [0, 2])
def test_period_one_is_ddp(world_size, warmup):
    """Averaging parameters after every step == averaging gradients (SGD with momentum is
    linear in the gradient): one process's training on the whole batch, float64, 1e-13."""
    want = train_single(mlp, batches("mlp"), **SGD).params
    for got in md.launch(_period_one_rank, world_size, args=(warmup,), timeout=60):
        assert_params_close(got, want, atol=ATOL)


PERIOD, WARMUP, STEPS = 3, 2, 9


def _periodic_rank(comm):
    model = mlp(seed=comm.rank)
    local = md.LocalSGD(model, comm, period=PERIOD, warmup_steps=WARMUP, algorithm="ring",
                        bucket_cap_mb=HUGE)
    log = local_train(comm, local, batches("mlp", steps=STEPS))
    total = sum(p.numel() for p in model.parameters())
    counted = sum(r["sent"] for r in log)  # comm.stats, inside the training steps
    return log, local.bytes_sent(), counted, total, local.averagings


def test_periodic_averaging_replicas_and_bytes():
    """period 3 after 2 warm-up steps, 9 steps: the replicas are equal after every warm-up
    step and every averaging, differ between averagings (the local steps are local), send
    nothing in local steps, one ring all_reduce of the model otherwise; total bytes == the
    formula (W + floor((S - W) / H)) 2 (p-1)/p N s."""
    p = 2
    for rank, (log, formula, counted, n, averagings) in enumerate(
            md.launch(_periodic_rank, p, timeout=60)):
        one = ring_bytes(n, 8, p, rank)
        assert [r["averaged"] for r in log] == [False, False, False, False, True,
                                                False, False, True, False]
        for step, r in enumerate(log, start=1):
            synced = step <= WARMUP or r["averaged"]
            assert r["same"] == synced, f"step {step}: replicas equal={r['same']}"
            assert r["sent"] == (one if synced else 0), f"step {step}"
        assert averagings == 2
        assert counted == formula == local_sgd_bytes(n, 8, p, STEPS, PERIOD, WARMUP, rank) \
            == (WARMUP + 2) * one


ACCUM = 3


def _accumulate_rank(comm):
    model = mlp(seed=comm.rank)
    ddp = md.DistributedDataParallel(model, comm, algorithm="ring", bucket_cap_mb=HUGE)
    opt = torch.optim.SGD(model.parameters(), **SGD)
    sent = []
    for x, y in batches("mlp", steps=2):
        xs = x.chunk(comm.world_size)[comm.rank].chunk(ACCUM)
        ys = y.chunk(comm.world_size)[comm.rank].chunk(ACCUM)
        opt.zero_grad()
        before = comm.stats.bytes_sent
        accumulate_gradients(ddp, list(zip(xs, ys)), mse)
        sent.append(comm.stats.bytes_sent - before)
        opt.step()
    return params_of(model), sent, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("world_size", [1, 2])
def test_accumulation_is_one_large_batch(world_size):
    """3 micro-batches per step, the first two under no_sync: the large batch's training
    (float64, 1e-13) for one all_reduce per step."""
    want = train_single(mlp, batches("mlp", steps=2), **SGD).params
    for rank, (got, sent, n) in enumerate(md.launch(_accumulate_rank, world_size,
                                                    timeout=60)):
        assert_params_close(got, want, atol=ATOL)
        assert sent == [ring_bytes(n, 8, world_size, rank)] * 2


@pytest.mark.parametrize("kwargs,match", [
    ({"period": 0}, "period must be a positive integer, got 0"),
    ({"period": 1.5}, "period must be a positive integer"),
    ({"period": 2, "warmup_steps": -1}, "warmup_steps must be a non-negative integer, got -1"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        md.LocalSGD(mlp(), None, **kwargs)  # checked before any communication


def test_empty_accumulation_is_an_error():
    with pytest.raises(ValueError, match="micro_batches is empty"):
        accumulate_gradients(None, [], mse)
