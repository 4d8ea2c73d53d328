"""minidist's GPipe and 1F1B against torch.distributed.pipelining on gloo: the same split GPT,
the same micro-batches, the same call shape; the same losses, gradients and parameters.

Both run in one ``md.launch(backend="torch")``: torch's stages over the default gloo process
group, minidist's over the same group through its torch transport. torch scales the
accumulated gradients by 1/m (``scale_grads=True``), minidist each micro-batch's loss by
n_i / N; with equal micro-batches the two are the same sum in a different order, so the
gradients agree to ~1e-16 relative (float64); we allow 1e-12.
"""

from __future__ import annotations

import pytest
import torch
from test_interleaved import DATA as DATA6
from test_interleaved import gpt as gpt6
from test_pipeline import DATA, SGD, gpt, step

import minidist as md

pipelining = pytest.importorskip("torch.distributed.pipelining")
ATOL = 1e-12
STEPS = 3


def run(stage, sched, submodule, data) -> tuple[list, list]:
    """STEPS optimizer steps; returns (losses, gradients of the first step)."""
    opt = torch.optim.SGD(submodule.parameters(), **SGD)
    losses, first_grads = [], None
    for x, y in data[:STEPS]:
        opt.zero_grad()
        losses.append(step(sched, stage, x, y))
        if first_grads is None:
            first_grads = [p.grad.clone() for p in submodule.parameters()]
        opt.step()
    return losses, first_grads


class _Roles:
    """torch's stage has no is_first/is_last: the same roles for ``step``."""

    def __init__(self, rank: int, world: int):
        self.is_first, self.is_last = rank == 0, rank == world - 1


def _both_rank(comm, schedule: str, m: int):
    assert comm.capability("process_group") is not None
    rank, p = comm.rank, comm.world_size
    ours_part = md.pipeline.split_model(gpt(), p)[rank]
    theirs_part = md.pipeline.split_model(gpt(), p)[rank]
    theirs_stage = pipelining.PipelineStage(theirs_part, rank, p, torch.device("cpu"))
    cls = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
    theirs = run(_Roles(rank, p), cls(theirs_stage, m, loss_fn=md.models.lm_loss),
                 theirs_part, DATA)
    ours_cls = {"gpipe": md.ScheduleGPipe, "1f1b": md.Schedule1F1B}[schedule]
    stage = md.PipelineStage(ours_part, comm)
    ours = run(stage, ours_cls(stage, m, md.models.lm_loss), ours_part, DATA)
    return theirs, ours, list(theirs_part.parameters()), list(ours_part.parameters())


@pytest.mark.parametrize("schedule,stages,m", [("gpipe", 2, 4), ("1f1b", 2, 4),
                                               ("1f1b", 4, 8), ("gpipe", 3, 2)])
def test_same_losses_gradients_and_parameters_as_torch(schedule, stages, m):
    results = md.launch(_both_rank, stages, args=(schedule, m), backend="torch", timeout=120)
    for r, ((t_losses, t_grads), (o_losses, o_grads), t_params, o_params) in enumerate(results):
        if r == stages - 1:
            assert len(o_losses) == STEPS and all(len(mb) == m for mb in o_losses)
            torch.testing.assert_close(o_losses, t_losses, rtol=0, atol=ATOL)
        else:
            assert t_losses == o_losses == [[]] * STEPS
        for g_ours, g_theirs in zip(o_grads, t_grads, strict=True):
            torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=ATOL)
        for p_ours, p_theirs in zip(o_params, t_params, strict=True):
            torch.testing.assert_close(p_ours, p_theirs, rtol=0, atol=ATOL)


def _interleaved_rank(comm, v: int, m: int):
    """torch's ScheduleInterleaved1F1B and minidist's on the same v chunks per rank."""
    rank, p = comm.rank, comm.world_size
    out = []
    for impl in ("torch", "minidist"):
        parts = md.pipeline.split_model(gpt6(), p * v)
        mine = [parts[c * p + rank] for c in range(v)]
        if impl == "torch":
            stages = [pipelining.PipelineStage(part, c * p + rank, p * v, torch.device("cpu"))
                      for c, part in enumerate(mine)]
            sched = pipelining.ScheduleInterleaved1F1B(stages, m, loss_fn=md.models.lm_loss)
        else:
            stages = [md.PipelineStage(part, comm, c * p + rank, p * v)
                      for c, part in enumerate(mine)]
            sched = md.pipeline.ScheduleInterleaved1F1B(stages, m, md.models.lm_loss)
        out.append(run(_Roles(rank, p), sched, torch.nn.ModuleList(mine), DATA6))
    return out


def test_interleaved_same_as_torch():
    results = md.launch(_interleaved_rank, 2, args=(2, 4), backend="torch", timeout=120)
    assert [len(mb) for mb in results[1][1][0]] == [4, 4]  # the last rank's losses
    for (t_losses, t_grads), (o_losses, o_grads) in results:
        torch.testing.assert_close(o_losses, t_losses, rtol=0, atol=ATOL)
        for g_ours, g_theirs in zip(o_grads, t_grads, strict=True):
            torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=ATOL)
