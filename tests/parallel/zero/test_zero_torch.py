"""ZeRO against torch's own implementations on gloo, in one torch-backend launch: stage 1
against ``torch.distributed.optim.ZeroRedundancyOptimizer`` (with torch's DDP averaging the
gradients, as it is meant to be used), stage 3 against FSDP2's ``fully_shard``; and the
plain whole-tensor stage 1 (``ShardedOptimizerNaive``) against one process."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from oracles import assert_params_close, params_of, train_single
from test_zero import ATOL, OPTIMIZERS, batches, mlp, train
from torch import nn

import minidist as md
from minidist.parallel.zero import ShardedOptimizerNaive, ZeRO
from minidist.parallel.zero.zero_naive import assign_owners


def _torch_loop(model, opt, comm, data) -> None:
    for x, y in data:
        opt.zero_grad()
        F.mse_loss(model(x.chunk(comm.world_size)[comm.rank]),
                   y.chunk(comm.world_size)[comm.rank]).backward()
        opt.step()


def _torch_rank(comm):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    out = {}
    for opt_name, (cls, kwargs, _) in OPTIMIZERS.items():
        ddp = nn.parallel.DistributedDataParallel(mlp())
        zro = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, **kwargs)
        _torch_loop(ddp, zro, comm, batches())
        ours = ZeRO(mlp(), comm, stage=1, optimizer_class=cls, **kwargs)
        train(ours, comm, batches())
        out["zro", opt_name] = (params_of(ddp.module).values(), ours.full_parameters())
        model = mlp()
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer)
        fully_shard(model)
        opt = cls(model.parameters(), **kwargs)
        _torch_loop(model, opt, comm, batches())
        theirs = [p.full_tensor().detach() for p in model.parameters()]
        ours = ZeRO(mlp(), comm, stage=3, optimizer_class=cls, **kwargs)
        train(ours, comm, batches())
        out["fsdp", opt_name] = (theirs, ours.full_parameters())
    return out


def test_stage1_matches_zero_redundancy_optimizer_and_stage3_fully_shard():
    for rank_out in md.launch(_torch_rank, 2, backend="torch", timeout=120):
        for theirs, ours in rank_out.values():
            assert_params_close(list(ours), list(theirs), atol=ATOL)


def _naive_rank(comm):
    model = mlp()
    opt = ShardedOptimizerNaive(model.parameters(), comm, torch.optim.AdamW, lr=0.01,
                                weight_decay=0.1)
    for x, y in batches():
        F.mse_loss(model(x.chunk(comm.world_size)[comm.rank]),
                   y.chunk(comm.world_size)[comm.rank]).backward()
        opt.step()
        opt.zero_grad()
    return params_of(model)


def test_naive_stage1_matches_single_process():
    want = train_single(mlp, batches(), optimizer_class=torch.optim.AdamW, lr=0.01,
                        weight_decay=0.1).params
    for world_size in (2, 3):
        for got in md.launch(_naive_rank, world_size, timeout=60):
            assert_params_close(got, want, atol=ATOL)


def test_naive_owners_balance_whole_tensors():
    sizes = [80, 16, 256, 16, 48, 3]  # mlp()'s parameters: largest first, least loaded rank
    params = [nn.Parameter(torch.zeros(n)) for n in sizes]
    assert assign_owners(params, 2) == [1, 1, 0, 1, 1, 1]
    assert assign_owners(params, 1) == [0] * 6
