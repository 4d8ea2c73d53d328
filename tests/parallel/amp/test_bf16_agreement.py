"""bfloat16 needs no loss scale, but still the agreement: a NaN in one rank's gradients must
make every rank skip that step. ``md.GradScaler(comm, loss_scaling=False)`` checks and agrees
without scaling.

The setting. A NaN only one rank holds: written into one gradient after DDP's all-reduce
(standing in for a rank-local step between the all-reduce and the optimizer), or, under
ZeRO, one element of one rank's gradient, which the reduce-scatter hands to one shard's
owner only. Without any check (bfloat16's default, and torch's without a scaler) the
replicas differ for one step, then the NaN reaches every rank through the next all-reduce.

The oracle is exact. Every rank trains on the same batch, so the average of p equal
bfloat16 gradients (p a power of two; the naive all_reduce and 2-rank reduce-scatter sum in
float32 and round once) is that gradient bit for bit: one process that skips the bad step
must give bitwise the same parameters after every step.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minidist as md
from minidist.parallel.amp import MasterWeightOptimizer, MixedPrecision

STEPS, BAD_STEP, WIDTH = 6, 2, 8
OPT = {"lr": 0.1, "momentum": 0.9}


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, WIDTH, generator=g).bfloat16(), torch.randn(8, 4, generator=g))
            for _ in range(STEPS)]


def _model() -> torch.nn.Module:
    return md.models.mlp(WIDTH, 1, classes=4, seed=0)


def _bits(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's bit pattern (so NaNs compare too)."""
    return torch.cat([p.detach().reshape(-1).view(torch.int16) for p in model.parameters()])


def _scaler(kind: str, comm):
    """"none": bfloat16's default; "local": check alone; "agreed": check and agree."""
    if kind == "none":
        return None
    return md.GradScaler(comm if kind == "agreed" else None, loss_scaling=False)


def _ddp_rank(comm, kind: str):
    scaler = _scaler(kind, comm)
    mp = MixedPrecision(_model(), torch.optim.SGD, dtype=torch.bfloat16, scaler=scaler, **OPT)
    ddp = md.DistributedDataParallel(mp.model, comm, algorithm="naive")
    first = next(mp.model.parameters())
    trace = []
    for step, (x, y) in enumerate(_batches()):
        mp.backward(F.mse_loss(ddp(x).float(), y))
        if step == BAD_STEP and comm.rank == comm.world_size - 1:
            first.grad[0, 0] = float("nan")  # after the all-reduce: only this rank has it
        mp.step()
        mp.zero_grad()
        trace.append(_bits(mp.model))
    return trace, (scaler.skipped_at if scaler is not None else None)


def _one_process(skip: int | None) -> list[torch.Tensor]:
    """The oracle: one process, the same batches, no step at ``skip``."""
    mp = MixedPrecision(_model(), torch.optim.SGD, dtype=torch.bfloat16, scaler=None, **OPT)
    trace = []
    for step, (x, y) in enumerate(_batches()):
        mp.backward(F.mse_loss(mp.model(x).float(), y))
        if step != skip:
            mp.step()
        mp.zero_grad()
        trace.append(_bits(mp.model))
    return trace


def _finite(bits: torch.Tensor) -> bool:
    return bool(torch.isfinite(bits.view(torch.bfloat16)).all())


@pytest.mark.parametrize("world_size,backend", [(2, "local"), (4, "local"), (2, "torch")])
def test_nan_on_one_rank_every_rank_skips_that_step(world_size, backend):
    out = md.launch(_ddp_rank, world_size, args=("agreed",), backend=backend, timeout=90)
    want = _one_process(skip=BAD_STEP)
    for rank, (trace, skipped_at) in enumerate(out):
        assert skipped_at == [BAD_STEP], f"rank {rank} skipped steps {skipped_at}"
        assert torch.equal(trace[BAD_STEP], trace[BAD_STEP - 1]), f"rank {rank} stepped"
        for step, (got, ref) in enumerate(zip(trace, want)):
            assert torch.equal(got, out[0][0][step]), f"step {step}: rank {rank} != rank 0"
            assert torch.equal(got, ref), f"step {step}: rank {rank} != one process"
    assert _finite(out[0][0][-1]) and not torch.equal(out[0][0][-1], out[0][0][BAD_STEP])


def test_without_a_check_the_replicas_differ_then_every_rank_is_nan():
    """The problem (torch without a scaler does the same): bfloat16's default steps on."""
    (trace0, _), (trace1, _) = md.launch(_ddp_rank, 2, args=("none",), timeout=90)
    assert torch.equal(trace0[BAD_STEP - 1], trace1[BAD_STEP - 1])
    assert _finite(trace0[BAD_STEP]) and not _finite(trace1[BAD_STEP])  # they differ
    assert not _finite(trace0[BAD_STEP + 1])  # the next all-reduce carried the NaN over


def test_a_local_check_alone_leaves_the_replicas_apart():
    (trace0, skipped0), (trace1, skipped1) = md.launch(_ddp_rank, 2, args=("local",),
                                                       timeout=90)
    assert (skipped0, skipped1) == ([], [BAD_STEP])  # rank 0 stepped on the bad step
    assert all(not torch.equal(a, b) for a, b in zip(trace0[BAD_STEP:], trace1[BAD_STEP:]))
    assert _finite(trace0[-1]) and _finite(trace1[-1])  # finite, but no longer one model


def _zero_rank(comm, agree: bool):
    """ZeRO stage 1 with bfloat16 shards: rank 1's NaN lands in rank 0's shard only."""
    scaler = md.GradScaler(comm if agree else None, loss_scaling=False)
    z = md.ZeRO(_model().bfloat16(), comm, stage=1, optimizer_class=MasterWeightOptimizer,
                base_optimizer=torch.optim.SGD, scaler=scaler, **OPT)
    first, trace = next(z.module.parameters()), []
    for step, (x, y) in enumerate(_batches()):
        F.mse_loss(z(x).float(), y).backward()
        if step == BAD_STEP and comm.rank == 1:
            first.grad[0, 0] = float("nan")  # before the reduce-scatter
        z.step()
        z.zero_grad()
        trace.append(_bits(z.module))
    return trace, scaler.skipped_at


@pytest.mark.parametrize("agree", [True, False])
def test_zero_shards_skip_together(agree):
    out = md.launch(_zero_rank, 2, args=(agree,), timeout=90)
    want = _one_process(skip=BAD_STEP)
    skipped = [s for _, s in out]
    if not agree:  # rank 0 owns the NaN and skips; rank 1 steps its shard
        assert skipped == [[BAD_STEP], []]
        assert not torch.equal(out[0][0][-1], want[-1])
        return
    assert skipped == [[BAD_STEP], [BAD_STEP]]
    for rank, (trace, _) in enumerate(out):
        for step, (got, ref) in enumerate(zip(trace, want)):
            assert torch.equal(got, ref), f"step {step}: rank {rank} != one process"


# -- the scaler without scaling, in one process ------------------------------------------------
def test_no_scaling_checks_without_dividing():
    scaler = md.GradScaler(loss_scaling=False)
    loss = torch.tensor(3.0, dtype=torch.bfloat16)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    w = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))  # no master copy: no division,
    opt = torch.optim.SGD([w], lr=0.5)                            # so float16 is fine here
    for step, g in enumerate(([3.0, 5.0], [float("inf"), 1.0], [1.0, 1.0])):
        w.grad = torch.tensor(g, dtype=torch.float16)
        scaler.unscale_(opt)
        assert w.grad.tolist() == g  # checked, not divided
        scaler.step(opt)
        scaler.update()
        assert scaler.get_scale() == 1.0 and scaler.found_inf == (step == 1)
    assert scaler.skipped_at == [1] and scaler.skipped_steps == 1
    assert w.tolist() == [1.0 - 1.5 - 0.5, 1.0 - 2.5 - 0.5]  # steps 0 and 2 only
    assert scaler.state_dict()["scale"] == 1.0 and "loss_scaling=False" in repr(scaler)


def test_no_scaling_refuses_a_scale():
    scaler = md.GradScaler(loss_scaling=False)
    with pytest.raises(ValueError, match="loss_scaling=False.*scale 1024"):
        scaler.update(1024.0)
    with pytest.raises(ValueError, match="loss_scaling=False.*scale 65536"):
        scaler.load_state_dict(md.GradScaler().state_dict())
    scaler.load_state_dict(md.GradScaler(loss_scaling=False).state_dict())
    assert md.GradScaler(enabled=False, loss_scaling=False).state_dict() == {}
