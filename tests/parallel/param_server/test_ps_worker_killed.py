"""A parameter-server worker that dies for real (SIGKILL, ``os._exit``, an exception) under
``md.launch(..., on_rank_failure="continue")``: in async and ssp the servers and the other
workers train to the end, launch returns their results with an ``md.RankFailed`` in the
dead worker's slot, and each server's report names the worker and its last step heard.

Oracle: every worker pushes a constant gradient (worker w: all elements equal to w) with
SGD at lr 1 from dyadic initial values, so a server's final shard is exactly its initial
shard minus the sum over workers of (pushes it applied from w) * w, whatever the order the
pushes arrived in; the dead worker's count is the step it was killed in.

sync mode fails fast: the server raises ``WorkerLeftError`` naming the dead worker and
launch raises a ``WorkerError`` for it (with ``on_worker_exit="continue"`` sync averages
over the workers that remain, as it does for a worker that returns without closing).
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

import minidist as md

STEPS = 6


def model() -> nn.Module:
    m = nn.Linear(5, 3).double()
    with torch.no_grad():
        for p in m.parameters():  # multiples of 1/8: every update below is exact
            p.copy_(torch.arange(p.numel(), dtype=torch.float64).view_as(p) / 8)
    return m


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(3)
    raise RuntimeError("worker fell over")


def _train(comm, mode: str, servers: int, kill_at: int, how: str, on_exit: str):
    """The last rank dies in step ``kill_at``, after its pull and before its push."""
    m = model()
    ps = md.ParameterServer(comm, m, num_servers=servers, mode=mode,
                            staleness=int(mode == "ssp"), lr=1.0, on_worker_exit=on_exit,
                            slice_threshold=4)  # the weight is sliced across 2 servers
    if ps.is_server:
        start = ps.plan.pack(comm.rank, [p.detach().clone() for p in m.parameters()])
        report = ps.serve()
        return report, start, ps.plan.pack(comm.rank, [p.detach() for p in m.parameters()])
    for k in range(STEPS):
        ps.pull()
        if comm.rank == comm.world_size - 1 and k == kill_at:
            die(how)
        ps.push([torch.full_like(p, float(comm.rank)) for p in m.parameters()])
    ps.close()
    return "done", ps.report().steps


def check_servers(out, servers: int, dead: int, kill_at: int) -> None:
    survivors = range(servers, dead)
    for report, start, final in out[:servers]:
        assert report.departed == {**{w: "closed" for w in survivors}, dead: "died"}
        assert report.departed_step[dead] == kill_at
        assert f"worker {dead} died after {kill_at} push" in report.departures()[-1]
        assert {w: report.pushes_by_worker.get(w, 0) for w in range(servers, dead + 1)} == \
            {**{w: STEPS for w in survivors}, dead: kill_at}
        expected = start - sum(n * float(w) for w, n in report.pushes_by_worker.items())
        assert torch.equal(final, expected)


@pytest.mark.parametrize("kill_at", [0, STEPS // 2, STEPS - 1], ids=["first", "middle", "last"])
@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_killed_worker_leaves_the_others_training(mode, servers, kill_at):
    world = servers + 3
    dead = world - 1
    out = md.launch(_train, world, args=(mode, servers, kill_at, "kill", "continue"),
                    timeout=30, on_rank_failure="continue")
    assert out[servers:dead] == [("done", STEPS)] * (dead - servers)
    failed = out[dead]
    assert isinstance(failed, md.RankFailed) and out.failures == (failed,)
    assert (failed.rank, failed.signal, failed.exc_type) == (dead, "SIGKILL", None)
    assert "killed by signal SIGKILL" in repr(out)
    check_servers(out, servers, dead, kill_at)
    if mode == "ssp":  # the bound held, and did not wait for the dead worker
        assert all(report.max_ahead <= 1 for report, _, _ in out[:servers])


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_killed_worker_on_an_emulated_network(mode):
    """The emulated network's receives say a sender has gone, as the local transport's do."""
    net = md.Network.uniform(md.Link(alpha=1e-5, bandwidth=1e9))
    out = md.launch(_train, 4, args=(mode, 1, 2, "kill", "continue"), timeout=30,
                    on_rank_failure="continue", network=net)
    assert out[1:3] == [("done", STEPS)] * 2 and out.failures == (out[3],)
    check_servers(out, 1, 3, 2)


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_worker_that_exits_or_raises(how):
    out = md.launch(_train, 4, args=("async", 1, 2, how, "continue"), timeout=30,
                    on_rank_failure="continue")
    failed = out[3]
    assert out[1:3] == [("done", STEPS)] * 2 and out.failures == (failed,)
    if how == "exit":
        assert (failed.exitcode, failed.signal, failed.exc_type) == (3, None, None)
        assert failed.error == "exit code 3"
    else:
        assert failed.exc_type == "RuntimeError" and "worker fell over" in failed.error
        assert "die(how)" in failed.traceback
    check_servers(out, 1, 3, 2)


def test_sync_fails_fast_naming_the_killed_worker():
    with pytest.raises(md.WorkerError) as info:
        md.launch(_train, 4, args=("sync", 1, 2, "kill", "error"), timeout=30,
                  on_rank_failure="continue")
    text = str(info.value)
    assert info.value.rank == 3 and "killed by signal SIGKILL" in text
    assert "rank 0 then failed with WorkerLeftError" in text and "worker rank 3" in text


def test_sync_continues_with_the_others_when_told():
    out = md.launch(_train, 4, args=("sync", 2, 3, "kill", "continue"), timeout=30,
                    on_rank_failure="continue")
    assert out[2] == ("done", STEPS) and isinstance(out[3], md.RankFailed)
    for report, start, final in out[:2]:
        assert report.updates == STEPS
        assert report.departed == {2: "closed", 3: "died"} and report.departed_step[3] == 3
        # three averages of workers 2 and 3, then three steps of worker 2 alone
        assert torch.equal(final, start - 3 * (2.0 + 3.0) / 2 - 3 * 2.0)
