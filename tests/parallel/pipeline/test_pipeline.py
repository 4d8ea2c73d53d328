"""The pipeline runtime: GPipe, 1F1B and the naive split train exactly like one process on
the whole batch; they run the action list they were given, hold the memory the papers say,
combine with data parallelism, and fail with errors that name the mistake.

Tolerance. Models and data are float64. A pipeline changes only the order in which the
per-sample gradient terms are summed (micro-batch by micro-batch, each scaled by n_i / N,
instead of one mean over the batch), so a gradient element differs by a few ulps of its
terms: ~1e-16 relative. After three SGD steps with momentum on O(1) parameters the largest
difference observed over every configuration here is 1.7e-17; we allow 1e-12 absolute.
A real bug (a loss scaled by 1/m on uneven micro-batches, a gradient accumulated twice, a
micro-batch dropped) moves parameters by 1e-4 or more.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close, train_single
from torch import nn

import minidist as md

P = md.pipeline
ATOL = 1e-12
B, STEPS, VOCAB, BLOCK = 8, 3, 16, 6
SGD = {"lr": 0.1, "momentum": 0.9}
CFG = md.models.GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=2, n_embd=8,
                          tie_weights=False, seed=3)  # stages(): 4 layers


def gpt() -> nn.Module:
    return md.models.GPT(CFG).double()


def gpt_loss(model, x, y):
    return model(x, y)[1]


DATA = md.models.synthetic_tokens(STEPS, B, BLOCK, VOCAB, seed=1)
# (schedule, micro-batches): even and uneven splits (8 = 3+3+2 = 2+2+2+1+1), fewer than stages
CONFIGS = [("naive", 1), ("naive", 3)] + [(s, m) for s in ("gpipe", "1f1b") for m in (1, 3, 5, 8)]


def step(sched, stage, x, y) -> list[float]:
    """The three call shapes of ``sched.step``; returns the last stage's losses."""
    losses: list = []
    if stage.is_first and stage.is_last:
        sched.step(x, target=y, losses=losses)
    elif stage.is_first:
        sched.step(x)
    elif stage.is_last:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    return [float(v) for v in losses]


def train(comm, parts, schedule, m, data, loss_fn=md.models.lm_loss, **kw):
    stage = md.PipelineStage(parts[comm.rank], comm)
    sched = P.PipelineSchedule(stage, m, loss_fn, schedule=schedule, **kw)
    params = list(stage.submodule.parameters())  # a stage may have none (a Tanh)
    opt = torch.optim.SGD(params, **SGD) if params else None
    losses = []
    for x, y in data:
        stage.submodule.zero_grad()
        losses.append(step(sched, stage, x, y))
        if opt is not None:
            opt.step()
    return losses, [p.detach().clone() for p in stage.submodule.parameters()], stage


def _equivalence_rank(comm):
    out = {}
    for schedule, m in CONFIGS:
        losses, params, _ = train(comm, P.split_model(gpt(), comm.world_size), schedule, m, DATA)
        out[schedule, m] = losses, params
    return out


def full_batch_loss(losses: list[float], m: int) -> float:
    """The full batch's mean loss from the micro-batches' (weights n_i / N)."""
    sizes = [len(c) for c in torch.tensor_split(torch.empty(B), m)]
    return sum(v * n / B for v, n in zip(losses, sizes))


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_matches_single_process(stages):
    ref = train_single(gpt, DATA, loss_fn=gpt_loss, **SGD)
    results = md.launch(_equivalence_rank, stages, timeout=120)
    for config in CONFIGS:
        params = [p for r in range(stages) for p in results[r][config][1]]
        assert_params_close(params, list(ref.params.values()), atol=ATOL)
        losses = results[-1][config][0]
        assert all(len(mb) == config[1] for mb in losses)
        got = [full_batch_loss(mb, config[1]) for mb in losses]
        assert got == pytest.approx(ref.losses, abs=1e-13, rel=0)
        assert all(results[r][config][0] == [[]] * STEPS for r in range(stages - 1))


# -- stages with no parameters, a hand-written schedule, a deadlocking one ------------------------
def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 2)).double()


MLP_DATA = [(torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(s)),
             torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9)))
            for s in range(STEPS)]


def _parameterless_rank(comm):
    parts = P.split_model(mlp(), comm.world_size)  # stages 1 and 3: a Tanh, no parameters
    hand = [acts[::-1] for acts in P.actions("gpipe", comm.world_size, 3)]  # not runnable
    try:
        P.PipelineSchedule(md.PipelineStage(parts[comm.rank], comm), 3, F.mse_loss,
                           schedule=hand)
    except ValueError as e:
        refused = str(e)
    # a valid order no named schedule has: backwards in reverse micro-batch order
    lists = [[("F", i) for i in range(3)] + [("B", i) for i in (2, 1, 0)]] * comm.world_size
    losses, params, stage = train(comm, parts, lists, 3, MLP_DATA, loss_fn=F.mse_loss)
    sched = P.PipelineSchedule(stage, 3, F.mse_loss, schedule=lists)
    naive = P.ScheduleNaive(stage, 3, F.mse_loss)
    return (losses, params), refused, sched.predicted_bubble(), naive.predicted_bubble()


def test_parameterless_stages_and_hand_written_schedules():
    ref = train_single(mlp, MLP_DATA, loss_fn=lambda mod, x, y: F.mse_loss(mod(x), y), **SGD)
    results = md.launch(_parameterless_rank, 5, timeout=60)
    assert [len(params) for (_, params), *_ in results] == [2, 0, 2, 0, 2]
    params = [p for (_, params), *_ in results for p in params]
    assert_params_close(params, list(ref.params.values()), atol=ATOL)
    for _, refused, simulated, naive in results:
        assert simulated == pytest.approx(4 / 7)  # GPipe's (p-1)/(m+p-1) by simulation
        assert naive == pytest.approx(4 / 5)
        assert refused.startswith("schedule is not runnable:")
        assert "stage 0 waits at action 0 ('B', 2) for its own ('F', 2)" in refused


# -- the timeline, memory, and the data-parallel hook ---------------------------------------------
def _traced_rank(comm, schedule, m):
    parts = P.split_model(gpt(), comm.world_size)
    seen = []

    def after_backward(stage):  # runs after the last backward, before the step returns
        seen.append(sum(1 for e in comm.timeline.events if e[1] == "backward"))

    comm.timeline.enable()
    _, _, stage = train(comm, parts, schedule, m, DATA[:1], after_backward=after_backward)
    names = [e[0] for e in comm.timeline.events if e[1] in ("forward", "backward")]
    predicted = P.PipelineSchedule(stage, m, md.models.lm_loss, schedule).predicted_bubble()
    return names, stage.peak_in_flight, stage.peak_activation_bytes, seen, predicted


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_runs_its_action_list_and_holds_the_papers_memory(schedule):
    p, m = 4, 8
    results = md.launch(_traced_rank, p, args=(schedule, m), timeout=60, trace=True)
    lists = P.actions(schedule, p, m)
    for r, (names, in_flight, nbytes, seen, _) in enumerate(results):
        assert names == [f"{k}{i}" for k, i in lists[r]]
        assert in_flight == (m if schedule == "gpipe" else p - r)
        assert nbytes > 0 and seen == [m]
    bubble = P.measured_bubble(results.timelines)
    assert 0 <= bubble < 1
    assert results[0][4] == pytest.approx(3 / 11)  # the schedule's predicted_bubble()
    if schedule == "1f1b":  # stage 1 holds 3 of the 8 micro-batches GPipe would hold
        gpipe = md.launch(_traced_rank, p, args=("gpipe", m), timeout=60)
        assert results[1][2] * 8 == pytest.approx(gpipe[1][2] * 3, rel=0.05)


def _hybrid_rank(comm):
    """Two pipelines of two stages (dp=2 x pp=2): each pipeline takes half the batch, and
    the gradients are averaged across pipelines once, after the last micro-batch."""
    pp = comm.split(color=comm.rank // 2, key=comm.rank)
    dp = comm.split(color=comm.rank % 2, key=comm.rank)
    parts = P.split_model(gpt(), 2)

    def all_reduce_grads(stage):
        for prm in stage.submodule.parameters():
            prm.grad = md.all_reduce(dp, prm.grad) / dp.world_size

    half = [(x.chunk(2)[comm.rank // 2], y.chunk(2)[comm.rank // 2]) for x, y in DATA]
    return train(pp, parts, "1f1b", 2, half, after_backward=all_reduce_grads)[1]


def test_combines_with_data_parallelism():
    ref = train_single(gpt, DATA, loss_fn=gpt_loss, **SGD)
    got = md.launch(_hybrid_rank, 4, timeout=60)
    for first, second in ((got[0], got[1]), (got[2], got[3])):
        assert_params_close(first + second, list(ref.params.values()), atol=ATOL)


# -- bad input ----------------------------------------------------------------------------------
def _errors_rank(comm):
    parts = P.split_model(gpt(), 2)
    stage = md.PipelineStage(parts[comm.rank], comm)
    x, y = DATA[0]
    attempts = {
        "stage_index": lambda: md.PipelineStage(parts[0], comm, stage_index=comm.rank + 1),
        "num_stages": lambda: md.PipelineStage(parts[0], comm, num_stages=3),
        "lists": lambda: P.PipelineSchedule(stage, 2, md.models.lm_loss,
                                            schedule=P.actions("gpipe", 3, 2)),
        "zero": lambda: md.ScheduleGPipe(stage, 0, md.models.lm_loss),
        "name": lambda: P.PipelineSchedule(stage, 2, md.models.lm_loss, schedule="zigzag"),
        "no loss": lambda: md.Schedule1F1B(stage, 2),
        "split": lambda: step(md.Schedule1F1B(stage, 9, md.models.lm_loss), stage, x, y),
        "role": lambda: md.Schedule1F1B(stage, 2, md.models.lm_loss).step(x, target=y),
        "type": lambda: md.PipelineStage(lambda t: t, comm),
    }
    out = {}
    for key, attempt in attempts.items():
        try:
            attempt()
            out[key] = None
        except (ValueError, TypeError) as e:
            out[key] = f"{type(e).__name__}: {e}"
    return out


def test_bad_input_names_the_mistake():
    last = md.launch(_errors_rank, 2, timeout=60)[1]
    assert last["stage_index"].startswith("ValueError: stage_index=2 does not live on rank 1")
    assert last["num_stages"].startswith("ValueError: num_stages=3 must be a multiple of "
                                         "comm.world_size=2")
    assert "comm.world_size=2 stages but got 3" in last["lists"]
    assert "n_microbatches must be a positive integer, got 0" in last["zero"]
    assert "unknown schedule name='zigzag'" in last["name"]
    assert "the last stage needs loss_fn" in last["no loss"]
    assert "target of shape (8, 6) cannot be split into n_microbatches=9" in last["split"]
    assert "stage 1 of 2 takes no input" in last["role"]
    assert last["type"].startswith("TypeError: submodule must be a torch.nn.Module")


def test_split_model():
    model = gpt()
    x = DATA[0][0]
    for by in P.SPLIT_BY:
        parts = P.split_model(model, 2, by=by, sample=x)
        assert sum(len(p) for p in parts) == 4
        assert [q for p in parts for q in p.parameters()] == list(model.parameters())
    assert P.partition([1, 1, 1, 10, 1, 1], 3) == [0, 3, 4, 6]
    assert P.partition([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    report = P.stage_report(P.split_model(model, 2), x)
    assert [r["params"] for r in report] == [
        sum(p.numel() for p in part.parameters()) for part in P.split_model(model, 2)]
    assert report[-1]["output_shape"] == (B, BLOCK, VOCAB)
    assert all(r["activation_bytes"] > 0 and r["seconds"] > 0 for r in report)
    with pytest.raises(ValueError, match="tied weights"):
        P.split_model(md.models.GPT(md.models.GPTConfig(VOCAB, BLOCK, 2, 2, 8)), 2)
    with pytest.raises(ValueError, match="stages must be between 1 and the number of layers"):
        P.split_model(model, 5)
    with pytest.raises(ValueError, match="by='cost' measures each layer"):
        P.split_model(model, 2, by="cost")
