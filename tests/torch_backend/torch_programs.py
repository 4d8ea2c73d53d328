"""torch programs run unchanged over minidist, over gloo and in one process.

Each ``train_*`` takes the rank's view (``rank``, ``world``; ``world=1`` with no process
group is the single-process oracle) and returns the trained parameters as float64
tensors by name, whole (sharded ones gathered back), so the three runs compare directly.
``run_rank`` starts the run's process group: minidist's (optionally with a plugged-in
learner's ring) or gloo's, which ``md.launch(..., backend="torch")`` has already made.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import minidist as md

IN, HIDDEN, OUT, BATCH, STEPS, LR = 8, 16, 4, 16, 3, 0.1


def data(step: int):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
    return x, torch.randn(BATCH, OUT, generator=g, dtype=torch.float64)


def mlp(layers: int = 2) -> nn.Sequential:
    torch.manual_seed(0)
    dims = [IN] + [HIDDEN] * (layers - 1) + [OUT]
    mods = []
    for i in range(layers):
        mods.append(nn.Linear(dims[i], dims[i + 1]))
        if i < layers - 1:
            mods.append(nn.Tanh())
    return nn.Sequential(*mods).double()


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return t.chunk(world)[rank]


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.replace("module.", "").replace("_fsdp_wrapped_module.", "")] = \
            full.detach().clone()
    return out


class LearnerRing:
    """A learner's ring all-reduce (lesson 01's shape), counting its calls: reduce-scatter
    then all-gather around the ring with sendrecv; sum (and avg), as a first version is."""

    def __init__(self):
        self.calls = 0

    def __call__(self, comm, t, op="sum"):
        if op not in ("sum", "avg"):
            raise ValueError(f"this ring sums; got op={op!r}")
        self.calls += 1
        ring_all_reduce(comm, t)
        if op == "avg":
            t.div_(comm.world_size)
        return t


def ring_all_reduce(comm, t):
    p, r = comm.world_size, comm.rank
    flat = t.view(-1)
    bounds = [len(flat) * i // p for i in range(p + 1)]
    piece = lambda i: flat[bounds[i % p]:bounds[i % p + 1]]  # noqa: E731
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):  # reduce-scatter: after p-1 steps rank r owns piece r+1
        send, recv = piece(r - s), piece(r - s - 1)
        got = torch.empty_like(recv)
        comm.sendrecv(send.clone(), right, got, left)
        recv.add_(got)
    for s in range(p - 1):  # all-gather the reduced pieces
        send, recv = piece(r + 1 - s), piece(r - s)
        got = torch.empty_like(recv)
        comm.sendrecv(send.clone(), right, got, left)
        recv.copy_(got)
    return t


def train_ddp(rank: int, world: int, bucket_cap_mb: float = 0.0005) -> dict:
    model = mlp(3)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank, world)), shard(y, rank, world)).backward()
        opt.step()
    return params(model)


def train_zero(rank: int, world: int) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = mlp(3)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=0.01)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank, world)), shard(y, rank, world)).backward()
        opt.step()
    return params(model)


def train_fsdp2(rank: int, world: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = mlp(3)
    if world > 1:
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank, world)), shard(y, rank, world)).backward()
        opt.step()
    return params(model)


def train_tp(rank: int, world: int) -> dict:
    """Megatron's MLP split: fc1 by columns, fc2 by rows; every rank sees the whole batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = mlp(2)
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return params(model)


def train_2d(rank: int, world: int) -> dict:
    """A 2-D mesh (dp, tp): tensor parallel within a row, data parallel across rows (the
    tp gradients averaged over dp by an all-reduce on the mesh's dp group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model, dp, dp_rank, group = mlp(2), 1, 0, None
    if world > 1:
        dp = 2
        mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        dp_rank, group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        F.mse_loss(model(shard(x, dp_rank, dp)), shard(y, dp_rank, dp)).backward()
        for p in model.parameters():
            if dp > 1:
                dist.all_reduce(p.grad.to_local(), op=dist.ReduceOp.AVG, group=group)
        opt.step()
    return params(model)


def train_1f1b(rank: int, world: int, stages: int | None = None,
               microbatches: int = 4) -> dict:
    """One Linear(+Tanh) per stage; stage r holds layer r. One process: the whole stack."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(IN, IN), nn.Tanh()).double()
              for _ in range(stages or world)]
    loss_fn = F.mse_loss
    if world == 1:
        model = nn.Sequential(*layers)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            x, _ = data(step)
            opt.zero_grad()
            loss_fn(model(x), x.flip(1)).backward()
            opt.step()
        return {f"{i}.{k}": v.detach().clone() for i, layer in enumerate(layers)
                for k, v in layer.named_parameters()}
    stage_mod = layers[rank]
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=LR)
    for step in range(STEPS):
        x, _ = data(step)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=x.flip(1))
        else:
            schedule.step()
        opt.step()
    return {f"{rank}.{k}": v.detach().clone() for k, v in stage_mod.named_parameters()}


PROGRAMS = {"ddp": train_ddp, "zero": train_zero, "fsdp2": train_fsdp2, "tp": train_tp,
            "2d": train_2d, "1f1b": train_1f1b}


def run_rank(comm, program: str, backend: str, plug: bool = False) -> dict:
    """One rank of ``program`` over ``backend`` ("minidist", or "gloo": the group
    ``md.launch(..., backend="torch")`` made); its parameters, and what minidist saw."""
    ring = LearnerRing() if plug else None
    if backend == "minidist":
        md.torch_backend.init_process_group(comm, all_reduce=ring)
    got = PROGRAMS[program](comm.rank, comm.world_size)
    calls = md.torch_backend.call_counts() if backend == "minidist" else {}
    dist.destroy_process_group()
    return {"params": got, "calls": calls, "ring_calls": ring.calls if ring else 0}
