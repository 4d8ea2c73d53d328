"""Asynchronous and stale-synchronous parameter servers, and workers that leave or come late.

* ssp: under an injected straggler no worker ever runs more than s steps ahead of the
  slowest, checked twice: by the server's own record and, independently, from timestamps
  (a fast worker's pull returned at time t at clock c; the straggler had called push at
  most k times by t; c - k <= s), and the bound is reached (so the check could fail);
* async: converges on a noise-free least-squares problem to the exact optimum (every worker's
  gradient vanishes there) within 1e-6, with stale updates;
* a worker that dies (returns without close) in async or ssp: the others finish, the server
  reports it; in sync: a WorkerLeftError naming it, or training on with on_worker_exit=
  "continue"; a worker that starts late pulls the current parameters.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import minidist as md

D, ROWS = 5, 24  # least squares: x in R^5, 24 rows per worker


def problem(workers: int):
    g = torch.Generator().manual_seed(0)
    w_star = torch.randn(D, 1, generator=g, dtype=torch.float64)
    xs = [torch.randn(ROWS, D, generator=g, dtype=torch.float64) for _ in range(workers)]
    return w_star, [(x, x @ w_star) for x in xs]  # noise-free: w_star is the optimum


def linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(D, 1, bias=False).double()


def _lsq_rank(comm, mode: str, staleness: int, steps: int, slow: float, stop_early: int,
              base: float = 0.0):
    """Workers do ``steps`` gradient steps on their rows; every worker sleeps ``base`` s per
    step and worker rank 1 (the straggler) ``slow`` s more; the last worker dies after
    ``stop_early`` steps (-1: never). Workers return their (clock, pull returned at, push
    called at) per step."""
    model = linear()
    ps = md.ParameterServer(comm, model, num_servers=1, mode=mode, staleness=staleness,
                            lr=0.05, on_worker_exit="continue")
    if ps.is_server:
        ps.serve()
        return model.weight.detach().clone().T, ps.report()
    workers = comm.world_size - 1
    x, y = problem(workers)[1][comm.rank - 1]
    last = comm.rank == comm.world_size - 1
    steps_log = []
    with md.slow_rank(comm, rank=1, seconds=slow), md.inject_delay(comm, base):
        for k in range(steps):
            if last and k == stop_early:
                return "died", steps_log, None  # no close(): a death
            ps.pull()
            returned = time.perf_counter()
            model.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            steps_log.append((k, returned, time.perf_counter()))
            ps.push()
    ps.close()
    return "done", steps_log, ps.report()


def ahead_of_straggler(out, rank: int) -> int:
    """The most steps ``rank`` was ahead of the straggler (rank 1) when a pull returned,
    counting every straggler push *called* before that moment (at least as many as the
    server had received when it admitted the pull, so an SSP bound must hold for this)."""
    called = [t for _, _, t in out[1][1]]
    return max(clock - sum(t < returned for t in called) for clock, returned, _ in out[rank][1])


def test_ssp_never_more_than_s_ahead():
    s, steps = 2, 12
    out = md.launch(_lsq_rank, 4, args=("ssp", s, steps, 0.02, -1), timeout=30)
    _, server = out[0]
    assert server.max_ahead == s  # reached, never exceeded, by the server's own record
    assert ahead_of_straggler(out, 2) <= s and ahead_of_straggler(out, 3) <= s
    assert all(out[r][0] == "done" for r in (1, 2, 3))


def test_async_runs_ahead_where_ssp_would_block():
    """The same straggler without a bound: the fast workers get far ahead (the server's
    max_ahead stays 0 outside ssp, so the check uses timestamps)."""
    out = md.launch(_lsq_rank, 3, args=("async", 0, 10, 0.03, -1), timeout=30)
    assert ahead_of_straggler(out, 2) > 2


def test_async_converges_to_least_squares_optimum():
    """Noise-free least squares: each worker's gradient is zero at w*, so asynchronous SGD
    with lr 0.05 (curvature about 2) converges linearly despite stale gradients; 60 steps
    for each of 3 workers bring ||w - w*|| from ~2 to below 1e-6."""
    workers = 3
    # every worker 2 ms per step (so that the three overlap however late each starts),
    # the straggler 3 ms more: pushes land between other workers' pulls and pushes
    out = md.launch(_lsq_rank, workers + 1, args=("async", 0, 60, 0.003, -1, 0.002),
                    timeout=30)
    w, server = out[0]
    w_star, _ = problem(workers)
    assert (w - w_star).norm() < 1e-6
    assert server.updates == server.pushes == 60 * workers
    histogram = server.staleness_histogram()
    assert sum(histogram.values()) == 60 * workers
    assert any(k > 0 for k in histogram), histogram  # some updates were stale


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_worker_dies_training_goes_on(mode):
    out = md.launch(_lsq_rank, 4, args=(mode, int(mode == "ssp"), 15, 0.0, 4), timeout=30)
    _, server = out[0]
    assert out[3][0] == "died"
    assert server.departed == {1: "closed", 2: "closed", 3: "died"}
    assert server.pushes_by_worker == {1: 15, 2: 15, 3: 4}
    assert out[1][2].steps == 15 and out[2][2].steps == 15


def step(ps, model, x, y) -> None:
    model.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    ps.push()


def _sync_leaver(comm, on_exit: str, close: bool):
    model = linear()
    ps = md.ParameterServer(comm, model, num_servers=1, mode="sync", lr=0.05,
                            on_worker_exit=on_exit)
    if ps.is_server:
        return ps.serve()
    x, y = problem(2)[1][comm.rank - 1]
    steps = 2 if comm.rank == 2 else 5
    for _ in range(steps):
        ps.pull()
        step(ps, model, x, y)
    if close:
        ps.close()
    elif comm.rank == 1:
        ps.close()
    return ps.report().steps


@pytest.mark.parametrize("close", [True, False])
def test_sync_worker_leaving_early_is_an_error_naming_it(close):
    how = "called close" if close else "died"
    with pytest.raises(md.WorkerError, match=rf"worker rank 2 .*{how}.* after 2 steps") as e:
        md.launch(_sync_leaver, 3, args=("error", close), timeout=30)
    assert e.value.rank == 0 and e.value.exc_type == "WorkerLeftError"


def test_sync_continues_with_fewer_when_told():
    report, *steps = md.launch(_sync_leaver, 3, args=("continue", False), timeout=30)
    assert steps == [5, 2]
    assert report.updates == 5 and report.departed == {1: "closed", 2: "died"}


def _late_joiner(comm):
    model = linear()
    ps = md.ParameterServer(comm, model, num_servers=1, mode="async", lr=0.05)
    if ps.is_server:
        return ps.serve()
    x, y = problem(2)[1][comm.rank - 1]
    if comm.rank == 2:
        time.sleep(0.5)  # starts late: the other worker has trained meanwhile
    first = ps.pull()
    for _ in range(10):
        step(ps, model, x, y)
        ps.pull()
    ps.close()
    return first


def test_late_worker_pulls_current_parameters():
    report, first_early, first_late = md.launch(_late_joiner, 3, timeout=30)
    assert first_early == 0 and first_late > 0  # the current parameters, not the initial
    assert report.updates == 20
