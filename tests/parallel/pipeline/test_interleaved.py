"""Interleaved 1F1B (Megatron-LM): each rank holds v model chunks, virtual stage c p + r;
it trains like one process on the whole batch and runs its action list."""

from __future__ import annotations

import pytest
import torch
from oracles import assert_params_close, train_single
from test_pipeline import SGD, gpt_loss
from torch import nn

import minidist as md

P = md.pipeline
ATOL = 1e-12
B, BLOCK, VOCAB = 8, 6, 16
CFG = md.models.GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=4, n_head=2, n_embd=8,
                          tie_weights=False, seed=5)  # stages(): 6 layers
DATA = md.models.synthetic_tokens(2, B, BLOCK, VOCAB, seed=2)


def gpt() -> nn.Module:
    return md.models.GPT(CFG).double()


def _rank(comm, v: int, m: int):
    p = comm.world_size
    parts = P.split_model(gpt(), p * v)
    stages = [md.PipelineStage(parts[c * p + comm.rank], comm, c * p + comm.rank, v * p)
              for c in range(v)]
    sched = P.ScheduleInterleaved1F1B(stages, m, md.models.lm_loss)
    params = [q for s in stages for q in s.submodule.parameters()]
    opt = torch.optim.SGD(params, **SGD)
    comm.timeline.enable()
    for x, y in DATA:
        opt.zero_grad()
        comm.timeline.clear()
        kwargs = {"target": y} if sched.is_last else {}
        sched.step(*([x] if sched.is_first else []), **kwargs)
        opt.step()
    names = [e[0] for e in comm.timeline.events if e[1] in ("forward", "backward")]
    return [(c * p + comm.rank, [q.detach() for q in s.submodule.parameters()])
            for c, s in enumerate(stages)], names


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 3, 4), (3, 2, 3)])
def test_interleaved_matches_single_process(p, v, m):
    ref = train_single(gpt, DATA, loss_fn=gpt_loss, **SGD)
    results = md.launch(_rank, p, args=(v, m), timeout=60)
    by_stage = dict(kv for chunks, _ in results for kv in chunks)
    params = [q for s in range(p * v) for q in by_stage[s]]
    assert_params_close(params, list(ref.params.values()), atol=ATOL)
    lists = P.actions("interleaved", p, m, chunks=v)
    for r, (_, names) in enumerate(results):
        assert names == [f"{k}{i}" + (f".{c}" if c else "") for k, i, c in lists[r]]


def _bad(comm):
    part = nn.Identity()
    errors = []
    for attempt in (lambda: md.PipelineStage(part, comm, stage_index=comm.rank + 1,
                                             num_stages=4),
                    lambda: P.ScheduleInterleaved1F1B(
                        [md.PipelineStage(part, comm, comm.rank + 2, 4),
                         md.PipelineStage(part, comm, comm.rank, 4)], 2, md.models.lm_loss)):
        try:
            attempt()
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_virtual_stage_errors():
    errors = md.launch(_bad, 2, timeout=30)[0]
    assert errors[0].startswith("stage_index=1 does not live on rank 0")
    assert errors[1].startswith("chunk 0 of rank 0 must be stage 0 of 4")
