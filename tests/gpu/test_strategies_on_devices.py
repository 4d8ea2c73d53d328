"""Every strategy on ``device`` (the CPU, and a CUDA GPU where torch sees one: ``pytest -m
gpu``), with the same assertions: it trains like one process on the whole batch (the
oracle, run on the CPU in float64), its replicas agree bit for bit, and what it keeps
(shards, masters, received parameters, optimizer state) lives on the module's device. On
CUDA the local backend's ranks share one GPU, their messages staged through host memory.
Kept small: the whole CUDA suite must run in minutes on one GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close, assert_replicas_bitwise, params_of, train_single
from torch import nn

import minidist as md
from minidist.models import GPT, GPTConfig, synthetic_tokens
from minidist.parallel.amp import MixedPrecision
from minidist.parallel.hybrid import HybridGPT

ATOL = 1e-10  # float64 on two devices: the sums' order differs (~1e-16 per step), not more
B, STEPS = 8, 3


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


class WithSpare(nn.Module):
    """``mlp()`` and a layer no loss reaches (DDP's ``find_unused_parameters``)."""

    def __init__(self):
        super().__init__()
        self.net, self.spare = mlp(), nn.Linear(2, 2).double()

    def forward(self, x):
        return self.net(x)


def batches(device="cpu") -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(B, 5, generator=g, dtype=torch.float64).to(device),
             torch.randn(B, 3, generator=g, dtype=torch.float64).to(device))
            for _ in range(STEPS)]


def _mine(t: torch.Tensor, comm) -> torch.Tensor:
    return t.chunk(comm.world_size)[comm.rank]


def _devices(tensors) -> set[str]:
    return {t.device.type for t in tensors}


def _cpu(params: dict) -> dict:
    return {n: t.cpu() for n, t in params.items()}


# -- ZeRO, stages 0 to 3 --------------------------------------------------------------------
def _zero_rank(comm):
    out = {}
    for stage in range(4):
        z = md.ZeRO(mlp().to(comm.device), comm, stage=stage,
                    optimizer_class=torch.optim.AdamW, lr=1e-2)
        for x, y in batches(comm.device):
            F.mse_loss(z(_mine(x, comm)), _mine(y, comm)).backward()
            z.step()
            z.zero_grad()
        state = [v for s in z.optimizer.state.values() for k, v in s.items() if k != "step"]
        kept = _devices(list(z.shards) + state)
        out[stage] = [t.cpu() for t in z.full_parameters()], kept
    return out


def test_zero_every_stage(device):
    want = list(train_single(mlp, batches(), optimizer_class=torch.optim.AdamW, lr=1e-2)
                .params.values())
    for rank_out in md.launch(_zero_rank, 2, device=device, timeout=60):
        for stage, (got, kept) in rank_out.items():
            assert kept == {torch.device(device).type}, (stage, kept)
            assert_params_close(got, want, atol=ATOL)


# -- the hybrid GPT: pipeline x tensor parallelism; ZeRO 3 over dp ----------------------------
CFG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, tie_weights=False)
DATA = synthetic_tokens(2, 4, 8, CFG.vocab_size, seed=1)  # 2 steps of 4 sequences
SGD = {"optimizer_class": torch.optim.SGD, "lr": 0.2, "momentum": 0.9}


def _gpt_single() -> tuple[list[float], dict]:
    model = GPT(CFG).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for x, y in DATA:
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _hybrid_rank(comm, shape: dict, options: dict):
    model = HybridGPT(CFG, md.DeviceMesh(comm, shape), dtype=torch.float64, **SGD, **options)
    kept = _devices(model.params)
    losses = [model.step(x, y) for x, y in DATA]  # the batch stays on the CPU: moved
    return losses, _cpu(model.full_parameters()), kept


@pytest.mark.parametrize("shape, options", [
    ({"pp": 2, "tp": 2}, {"microbatches": 2}),
    ({"dp": 2}, {"zero_stage": 3})], ids=["pp2 x tp2", "zero3 dp2"])
def test_hybrid_gpt(device, shape, options):
    want_losses, want = _gpt_single()
    world = 4 if "pp" in shape else 2
    for losses, params, kept in md.launch(_hybrid_rank, world, args=(shape, options),
                                          device=device, timeout=90):
        assert kept == {torch.device(device).type}
        torch.testing.assert_close(losses, want_losses, rtol=1e-10, atol=ATOL)
        assert list(params) == list(want)
        for name, p in params.items():
            torch.testing.assert_close(p, want[name], rtol=1e-10, atol=ATOL, msg=name)


# -- mixed precision: float16 with float32 masters and an agreed GradScaler, under DDP ----------
AMP_CFG = GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
AMP_DATA = synthetic_tokens(3, 4, 8, AMP_CFG.vocab_size, seed=2)


def _fp16(device, comm=None) -> MixedPrecision:
    # SGD, not Adam: a gradient off by a factor (a lost 1/p, a scale not divided out)
    # moves SGD's weights by that factor, and Adam's hardly at all
    return MixedPrecision(GPT(AMP_CFG).to(device), torch.optim.SGD, dtype=torch.float16,
                          scaler=md.GradScaler(comm=comm, init_scale=2.0**10), lr=1.0)


def _amp_rank(comm):
    mp = _fp16(comm.device, comm)
    ddp = md.DistributedDataParallel(mp.model, comm, algorithm="naive")
    for x, y in AMP_DATA:
        logits, _ = ddp(_mine(x, comm).to(comm.device))
        mp.backward(md.models.lm_loss(logits.float(), _mine(y, comm).to(comm.device)))
        mp.step()
        mp.zero_grad()
    assert_replicas_bitwise(comm, mp.model)
    kept = _devices(list(mp.model.parameters()) + mp.optimizer.master_grads())
    return [p.detach().cpu() for p in mp.model.parameters()], mp.scaler.get_scale(), kept


def _amp_one_process(device: str, world: int) -> list[torch.Tensor]:
    """What 16-bit DDP computes, in one process: each slice's float16 gradient divided by
    p, the p parts summed in float32 and rounded once (the naive all_reduce's root)."""
    mp = _fp16(device)
    params = list(mp.model.parameters())
    for x, y in AMP_DATA:
        acc = [torch.zeros(p.shape, device=device) for p in params]
        for xs, ys in zip(x.chunk(world), y.chunk(world)):
            logits, _ = mp.model(xs.to(device))
            mp.backward(md.models.lm_loss(logits.float(), ys.to(device)))
            for a, p in zip(acc, params):
                a.add_(torch.div(p.grad, world))
                p.grad = None
        for a, p in zip(acc, params):
            p.grad = a.half()
        mp.step()
        mp.zero_grad()
    return [p.detach().cpu() for p in params]


def test_mixed_precision_ddp(device):
    want = _amp_one_process(device, 2)
    for got, scale, kept in md.launch(_amp_rank, 2, device=device, timeout=90):
        assert scale == 2.0**10 and kept == {torch.device(device).type}
        for g, w in zip(got, want):  # the same arithmetic; matmul kernels (the ranks' one
            # thread, a GPU's blocks) may round a float16 weight one or two ulps apart
            torch.testing.assert_close(g, w, rtol=2e-3, atol=1e-4)


# -- the parameter server: messages and shared memory -------------------------------------------
def _ps_rank(comm, shared):
    model = mlp(seed=comm.rank).to(comm.device)
    ps = md.ParameterServer(comm, model, num_servers=1, mode="sync", shared_memory=shared,
                            lr=0.1, momentum=0.9)
    if ps.is_server:
        ps.serve()
        return None
    w, n = comm.rank - ps.num_servers, ps.num_workers
    for x, y in batches(comm.device):
        ps.pull()
        model.zero_grad()
        F.mse_loss(model(x.chunk(n)[w]), y.chunk(n)[w]).backward()
        ps.push()
    ps.pull()
    ps.close()
    return _cpu(params_of(model)), _devices(model.parameters())


@pytest.mark.parametrize("shared", [False, None], ids=["messages", "shared memory"])
def test_parameter_server_sync(device, shared):
    want = train_single(mlp, batches(), lr=0.1, momentum=0.9).params
    for out in md.launch(_ps_rank, 3, args=(shared,), device=device, timeout=60)[1:]:
        got, kept = out
        assert kept == {torch.device(device).type}
        assert_params_close(got, want, atol=ATOL)


# -- DDP with unused parameters, local SGD, PowerSGD ---------------------------------------------
def _data_rank(comm):
    dev, out = comm.device, {}
    model = WithSpare().to(dev)
    ddp = md.DistributedDataParallel(model, comm, find_unused_parameters=True)
    _sgd_steps(ddp, comm)
    out["ddp unused"] = _cpu(params_of(model.net)), _cpu(params_of(model.spare))
    model = mlp().to(dev)
    local = md.LocalSGD(model, comm, period=1)  # averaging every step: DDP's result
    _sgd_steps(local, comm, after=local.step)
    out["local sgd"] = _cpu(params_of(model))
    model = mlp().to(dev)
    ddp = md.DistributedDataParallel(model, comm, comm_hook=md.compression.PowerSGD(
        rank=1, start_iter=0, min_compression_rate=1.0))
    _sgd_steps(ddp, comm)
    assert_replicas_bitwise(comm, model)
    out["powersgd"] = _cpu(params_of(model))
    return out


def _sgd_steps(model, comm, after=lambda: None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(comm.device):
        opt.zero_grad()
        F.mse_loss(model(_mine(x, comm)), _mine(y, comm)).backward()
        opt.step()
        after()


def test_data_parallel_variants(device):
    want = train_single(mlp, batches(), lr=0.1).params
    cpu = md.launch(_data_rank, 2, timeout=60) if device != "cpu" else None
    for rank, out in enumerate(md.launch(_data_rank, 2, device=device, timeout=60)):
        used, spare = out["ddp unused"]
        assert_params_close(used, want, atol=ATOL)
        assert_params_close(spare, params_of(WithSpare().spare), atol=0)  # no grad, no step
        assert_params_close(out["local sgd"], want, atol=ATOL)
        if cpu is not None:  # PowerSGD is lossy: the oracle is the same hook on the CPU
            assert_params_close(out["powersgd"], cpu[rank]["powersgd"], atol=1e-8)


# -- elastic: commit on the device, restore there -----------------------------------------------
def _elastic_rank(comm, directory):
    model = mlp().to(comm.device)
    ddp = md.DistributedDataParallel(model, comm)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    state = md.elastic.TorchState(md.elastic.CommitStore(directory, warn=False), ddp, opt)
    data = batches(comm.device)
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        F.mse_loss(ddp(_mine(x, comm)), _mine(y, comm)).backward()
        opt.step()
        if i == 0:
            state.commit(comm)
            committed = _cpu(params_of(model))
    assert state.restore(comm)
    kept = _devices(v for s in opt.state.values() for k, v in s.items() if k != "step")
    return committed, _cpu(params_of(model)), kept


def test_elastic_commit_and_restore(device, tmp_path):
    for committed, restored, kept in md.launch(_elastic_rank, 2, args=(str(tmp_path),),
                                               device=device, timeout=60):
        assert kept == {torch.device(device).type}
        assert_params_close(restored, committed, atol=0)


# -- the torch backend on CUDA: NCCL, one rank per GPU ------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_over_nccl(world):
    """ZeRO 0-3 and the data-parallel variants on the torch backend with NCCL (every message
    a CUDA tensor). One GPU runs the world of 1 only: NCCL refuses two ranks on one GPU."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"NCCL needs one GPU per rank: {world} wanted, "
                    f"{torch.cuda.device_count()} here")
    want = list(train_single(mlp, batches(), optimizer_class=torch.optim.AdamW, lr=1e-2)
                .params.values())
    for rank_out in md.launch(_zero_rank, world, backend="torch", device="cuda", timeout=120):
        for stage, (got, kept) in rank_out.items():
            assert kept == {"cuda"}, (stage, kept)
            assert_params_close(got, want, atol=ATOL)
    want = train_single(mlp, batches(), lr=0.1).params
    cpu = md.launch(_data_rank, world, timeout=60)
    for rank, out in enumerate(md.launch(_data_rank, world, backend="torch", device="cuda",
                                         timeout=120)):
        assert_params_close(out["ddp unused"][0], want, atol=ATOL)
        assert_params_close(out["local sgd"], want, atol=ATOL)
        assert_params_close(out["powersgd"], cpu[rank]["powersgd"], atol=1e-8)
