"""16-bit gradient communication: the same all_reduce moves half the bytes (counted by
``comm.stats``), DDP on a 16-bit model sends half of what it sends for float32, and the
fp16/bf16 comm hooks halve a float32 model's traffic at the cost of 16-bit rounding only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import minidist as md
from minidist.parallel.amp import all_reduce_bytes

ALGORITHMS = ["naive", "tree", "ring", "recursive_doubling", "halving_doubling"]
N = 1001  # not divisible by any world size below: uneven chunks


def _bytes_rank(comm):
    out = {}
    for algorithm in ALGORITHMS:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            comm.stats.reset()
            x = torch.full((N,), float(comm.rank + 1), dtype=dtype)
            md.all_reduce(comm, x, op="sum", algorithm=algorithm)
            assert x[0].item() == comm.world_size * (comm.world_size + 1) / 2
            out[algorithm, dtype] = comm.stats.bytes_sent
    return out


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_16bit_all_reduce_sends_half_the_bytes(world_size):
    for rank, sent in enumerate(md.launch(_bytes_rank, world_size, timeout=60)):
        for algorithm in ALGORITHMS:
            full = sent[algorithm, torch.float32]
            assert full > 0
            assert sent[algorithm, torch.float16] * 2 == full, (algorithm, rank)
            assert sent[algorithm, torch.bfloat16] * 2 == full, (algorithm, rank)
        assert sent["ring", torch.float16] == all_reduce_bytes(N, world_size, torch.float16,
                                                               rank)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))


def _data(rank: int, dtype) -> torch.Tensor:
    return torch.randn(6, 8, generator=torch.Generator().manual_seed(rank)).to(dtype)


def _ddp_rank(comm, dtype, hook_name):
    model = _model().to(dtype)
    ddp = md.DistributedDataParallel(model, comm, algorithm="ring")
    if hook_name:
        ddp.register_comm_hook(getattr(md.compression, hook_name))
    x = _data(comm.rank, dtype)
    comm.stats.reset()
    ddp(x).float().pow(2).mean().backward()
    return comm.stats.bytes_sent, [p.grad.float() for p in model.parameters()]


def test_ddp_on_a_16bit_model_sends_half():
    sent32, grads32 = md.launch(_ddp_rank, 2, args=(torch.float32, None), timeout=60)[0]
    for dtype in (torch.float16, torch.bfloat16):
        sent16, grads16 = md.launch(_ddp_rank, 2, args=(dtype, None), timeout=60)[0]
        assert sent16 * 2 == sent32
        for a, b in zip(grads16, grads32):  # a different model precision: loose
            assert torch.allclose(a, b, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("hook_name,dtype", [("fp16_hook", torch.float16),
                                             ("bf16_hook", torch.bfloat16)])
def test_cast_hooks_halve_a_float32_models_bytes(hook_name, dtype):
    sent32, exact = md.launch(_ddp_rank, 2, args=(torch.float32, None), timeout=60)[0]
    out = md.launch(_ddp_rank, 2, args=(torch.float32, hook_name), timeout=60)
    sent16, cast = out[0]
    assert sent16 * 2 == sent32
    assert all(torch.equal(a, b) for a, b in zip(cast, out[1][1]))  # replicas agree
    local = []
    for rank in range(2):  # what each rank computed before the hook
        model = _model()
        model(_data(rank, torch.float32)).pow(2).mean().backward()
        local.append([p.grad for p in model.parameters()])
    for a, b, g0, g1 in zip(cast, exact, *local):
        # the hook's arithmetic: each part / p rounded to 16 bits, summed in float32 and
        # rounded once (2 ranks: the ring's one combine) -- bit for bit
        want = ((g0 / 2).to(dtype).float() + (g1 / 2).to(dtype).float()).to(dtype).float()
        assert torch.equal(a, want)
        assert (a - b).abs().max() <= torch.finfo(dtype).eps * b.abs().max()


def test_cast_hook_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        md.compression.cast_hook(torch.float64)
