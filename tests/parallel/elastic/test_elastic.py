"""Elastic training survives a rank killed for real (SIGKILL) and a rank joining, and ends
where a fault-free run ends.

The scenario (``KILL_AND_JOIN``): 3 ranks, a commit every 3 steps, 2 epochs of 37 samples
in global batches of 6 (7 steps per epoch, the last one of a single sample, so at world 3
two ranks hold none). Rank 1 is killed during step 5: the survivors' run rolls back to the
commit of step 3 (steps 3 and 4 are lost) and goes on at world 2; at the commit of step 9
the rendezvous offers 3 slots again and a rank joins. The reference (``SAME_WORLDS``) has
no failure: it shrinks to 2 at the commit of step 3 and grows back at step 9, so both runs
train steps 0-2 at world 3, 3-8 at world 2, 9-13 at world 3.

What must hold: (1) the parameters equal the reference's bit for bit (same arithmetic in
the same order: the rollback left no trace); (2) they equal one process training on the
same global batches within 1e-13 (float64: only the order of the gradient sums differs);
(3) the samples the ranks actually trained on (gathered from all ranks each step and
rolled back with the model) are each epoch's permutation, every sample exactly once.
Tolerances as for DDP and ZeRO (tests/parallel/zero/test_zero.py). DDP runs on both
backends (on ``torch``, gloo's all-reduce: the reference runs there too).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close
from torch import nn

import minidist as md
from minidist.parallel.elastic import ElasticSampler, TorchState

ATOL = 1e-13
N, B, D, EPOCHS, K = 37, 6, 4, 2, 3
G = torch.Generator().manual_seed(1)
X = torch.randn(N, D, generator=G, dtype=torch.float64)
Y = torch.randn(N, 2, generator=G, dtype=torch.float64)
KILL_AND_JOIN = lambda step: 2 if 6 <= step < 9 else 3  # noqa: E731  (slots offered)
SAME_WORLDS = lambda step: 2 if 3 <= step < 9 else 3  # noqa: E731
WORLDS = [3] * 3 + [2] * 6 + [3] * 5  # world size of each step in both runs


def make_model() -> nn.Module:
    """31 parameters (prime: ZeRO's shards are padded at every world size > 1)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 4), nn.Tanh(), nn.Linear(4, 2), nn.Tanh(),
                         nn.Linear(2, 1, bias=False), nn.Linear(1, 2)).double()


def make_trainer(comm, strategy: str):
    """(wrapped model, optimizer or None, one optimizer step)."""
    model = make_model()
    if strategy == "ddp":
        ddp = md.DistributedDataParallel(model, comm)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        return ddp, opt, opt.step
    stage = int(strategy[-1])
    z = md.ZeRO(model, comm, stage=stage, optimizer_class=torch.optim.AdamW, lr=0.05,
                bucket_cap_mb=0.0002)  # several stage-2 buckets
    return z, None, z.step


def train(comm, rdzv, strategy: str, kill: tuple[int, int] | None, hang: bool = False):
    """One attempt on one rank. ``kill = (step, rank)``: SIGKILL that rank during that step
    of the first attempt (``hang``: sleep there instead, a stuck rank)."""
    wrapped, opt, step_fn = make_trainer(comm, strategy)
    state = TorchState(rdzv.store, wrapped, opt, sampler=ElasticSampler(N, B), seen=[],
                       worlds=[])

    def step(batch):
        if kill is not None and rdzv.attempt == 0 and (state.step, comm.rank) == kill:
            time.sleep(3600) if hang else os.kill(os.getpid(), signal.SIGKILL)
        wrapped.zero_grad() if opt is None else opt.zero_grad()
        out = wrapped(X[batch.ids])
        batch.mean(F.mse_loss(out, Y[batch.ids], reduction="none").mean(1)).backward()
        step_fn()
        width = -(-batch.global_size // comm.world_size)
        mine = torch.full((width,), -1, dtype=torch.int64)
        mine[:len(batch.ids)] = batch.ids
        state.seen += [(batch.epoch, int(i)) for i in md.all_gather(comm, mine).reshape(-1)
                       if i >= 0]
        state.worlds.append(comm.world_size)

    md.elastic.run(step, comm, state, rdzv, epochs=EPOCHS, commit_every=K)
    params = wrapped.full_parameters() if opt is None else list(wrapped.module.parameters())
    return [p.detach().clone() for p in params], state.seen, state.worlds


def single_process(strategy: str) -> list[torch.Tensor]:
    """One process, the same global batches (the sampler's permutation in chunks of B)."""
    model = make_model()
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if strategy == "ddp"
           else torch.optim.AdamW(model.parameters(), lr=0.05))
    sampler = ElasticSampler(N, B)
    for epoch in range(EPOCHS):
        perm = sampler.permutation(epoch)
        for i in range(0, N, B):
            ids = torch.tensor(perm[i:i + B])
            opt.zero_grad()
            F.mse_loss(model(X[ids]), Y[ids]).backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def elastic(strategy, discover, kill=None, **kw):
    options = dict(min_ranks=2, max_ranks=3, discover=discover, timeout=20)
    options.update(kw)
    return md.elastic.launch(train, 3, args=(strategy, kill), **options)


def assert_each_sample_once(seen):
    for epoch in range(EPOCHS):
        ids = sorted(i for e, i in seen if e == epoch)
        assert ids == list(range(N)), f"epoch {epoch}: seen {ids}"


@pytest.mark.parametrize("strategy, backend", [("ddp", "local"), ("ddp", "torch"),
                                               ("zero1", "local"), ("zero2", "local"),
                                               ("zero3", "local")])
def test_kill_and_join_end_like_the_fault_free_run(strategy, backend):
    got = elastic(strategy, KILL_AND_JOIN, kill=(5, 1), backend=backend)
    ref = elastic(strategy, SAME_WORLDS, backend=backend)
    a = got.attempts
    assert [(x.world_size, x.start_step, x.outcome) for x in a] == \
        [(3, None, "failed"), (2, 3, "resized"), (3, 9, "done")]
    assert a[0].failed_rank == 1 and "SIGKILL" in a[0].error and a[0].end_step == 3
    assert [x.world_size for x in ref.attempts] == [3, 2, 3]
    params, seen, worlds = got[0]
    assert worlds == WORLDS == ref[0][2]
    assert_each_sample_once(seen)
    for mine, theirs in zip(params, ref[0][0]):
        assert torch.equal(mine, theirs), "the rollback changed the arithmetic"
    assert_params_close(params, single_process(strategy), atol=ATOL)
    for rank_result in got[1:]:  # every rank ends with the same state
        assert all(torch.equal(p, q) for p, q in zip(rank_result[0], params))


def test_fewer_than_min_ranks_left_is_an_error_naming_them():
    with pytest.raises(md.elastic.NotEnoughRanksError,
                       match=r"min_ranks=3 .* only 2 are left \(ranks 0, 2 of the last world\);"
                             r" rank 1 failed.*SIGKILL") as info:
        elastic("ddp", None, kill=(2, 1), min_ranks=3)
    assert info.value.left == [0, 2] and info.value.attempts[0].failed_rank == 1


def test_discover_offering_fewer_than_min_ranks_is_an_error():
    with pytest.raises(md.elastic.NotEnoughRanksError, match="discover offered 1 slots at "
                                                             "step 3"):
        elastic("ddp", lambda step: 1 if step >= 3 else 3)


def _rank0_dies(comm, rdzv):
    if comm.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600)


def test_max_restarts_bounds_the_failures():
    with pytest.raises(md.elastic.ElasticError, match="gave up after max_restarts=1") as info:
        md.elastic.launch(_rank0_dies, 3, max_restarts=1, timeout=20)
    assert [x.world_size for x in info.value.attempts] == [3, 2]


def test_a_stuck_rank_times_out_and_the_job_goes_on_without_it():
    t0 = time.monotonic()
    got = md.elastic.launch(train, 2, min_ranks=1, args=("ddp", (4, 1), True), timeout=2)
    assert time.monotonic() - t0 < 30
    first = got.attempts[0]
    assert first.outcome == "failed" and "CommTimeout" in first.error, first
    assert [x.world_size for x in got.attempts] == [2, 1] and got.attempts[1].start_step == 3
    assert_each_sample_once(got[0][1])
    assert_params_close(got[0][0], single_process("ddp"), atol=ATOL)


def _commit_then_restore(comm, directory, writer):
    """Commit from DDP at world 3 (ranks 0-2), restore into ZeRO-2 on a world of 2."""
    store = md.elastic.CommitStore(directory)
    if writer:
        model, opt, step = make_trainer(comm, "ddp")
        F.mse_loss(model(X), Y).backward()
        step()
        TorchState(store, model, opt).commit(comm)
        return md.elastic.export_state(model, opt, comm)
    z = md.ZeRO(make_model(), comm, stage=2, optimizer_class=torch.optim.SGD, lr=0.1,
                momentum=0.9, bucket_cap_mb=0.0002)
    assert TorchState(store, z).restore(comm)
    return md.elastic.export_state(z, None, comm)


def test_a_ddp_commit_restores_into_zero_at_another_world_size(tmp_path):
    written = md.launch(_commit_then_restore, 3, args=(str(tmp_path), True), timeout=20)[0]
    for restored in md.launch(_commit_then_restore, 2, args=(str(tmp_path), False),
                              timeout=20):
        assert all(torch.equal(a, b) for a, b in zip(restored["params"], written["params"]))
        for mine, theirs in zip(restored["optim"], written["optim"]):
            assert mine.keys() == theirs.keys() == {"momentum_buffer"}
            assert torch.equal(mine["momentum_buffer"], theirs["momentum_buffer"])


def test_bad_arguments_name_the_mistake(tmp_path):
    with pytest.raises(ValueError, match="world_size=4 must lie between min_ranks=1 and "
                                         "max_ranks=3"):
        md.elastic.launch(train, 4, max_ranks=3)
    with pytest.raises(ValueError, match="max_restarts must be a non-negative integer, got -1"):
        md.elastic.launch(train, 2, max_restarts=-1)
    store = md.elastic.CommitStore(tmp_path)
    with pytest.raises(ValueError, match="optimizer is required"):
        TorchState(store, make_model())
    with pytest.raises(TypeError, match="store must be a CommitStore"):
        TorchState(str(tmp_path), make_model())
    with pytest.raises(ValueError, match="commit_every must be a positive integer, got 0"):
        md.elastic.run(print, None, TorchState(store, make_model(), torch.optim.SGD(
            make_model().parameters(), lr=0.1), sampler=ElasticSampler(4, 2)), None, 1, 0)


def test_buffers_and_optimizer_settings_are_committed_and_checked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    model(torch.randn(8, 3, dtype=torch.float64))  # moves the running statistics
    opt.param_groups[0]["lr"] = 0.07  # a scheduler's change
    saved = md.elastic.export_state(model, opt, None)
    fresh = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.3)
    md.elastic.import_state(fresh, fresh_opt, saved)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                  model.state_dict().values()))
    assert fresh_opt.param_groups[0]["lr"] == 0.07
    with pytest.raises(ValueError, match="state of optimizer SGD; it cannot be restored "
                                         "into optimizer Adam"):
        md.elastic.import_state(fresh, torch.optim.Adam(fresh.parameters()), saved)
