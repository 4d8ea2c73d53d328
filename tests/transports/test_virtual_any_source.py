"""A receive from ANY_SOURCE on virtual time takes the message that arrives first in virtual
time, whatever order they reach it in wall time (transports/horizon.py, virtual.py).

The bounds are checked as a pure function first, then on launched ranks where wall-clock
order and virtual order are made to disagree on purpose (a sleep before the earlier send).
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from array import array

import pytest
import torch

import minidist as md
from minidist.transports.horizon import ANY, DONE, NAMED, RUNNING, Board, bounds, safe

FREE = md.Compute(flops=1e12, efficiency=1.0)
LINK = md.Link(alpha=1e-3, bandwidth=1e8)


def _alpha(s, r):
    return 0.0 if s == r else 1e-3


# -- the bounds, pure ---------------------------------------------------------------------------
def test_a_running_rank_is_bounded_by_its_clock_and_a_done_one_by_nothing():
    assert bounds([(RUNNING, 2.0, 0), (DONE, 9.0, 0)], _alpha) == [2.0, math.inf]


def test_workers_waiting_on_the_server_are_bounded_by_its_candidate_plus_alpha():
    states = [(ANY, 1.0, 5.0), (NAMED, 2.0, 0), (NAMED, 0.5, 0)]
    low = bounds(states, _alpha)
    assert low == [5.0, 5.0 + 1e-3, 5.0 + 1e-3]


def test_a_cycle_of_blocked_ranks_with_nothing_to_take_is_a_deadlock_bounded_by_nothing():
    assert bounds([(NAMED, 1.0, 1), (NAMED, 2.0, 0)], _alpha) == [math.inf, math.inf]
    assert bounds([(ANY, 1.0, math.inf), (ANY, 2.0, math.inf)], _alpha) == [math.inf] * 2


def test_two_servers_the_earlier_candidate_is_the_bound_of_both():
    # server 0 holds a message arriving at 3, server 1 one at 4; worker 2 waits on server
    # 0: server 0 could send to server 1 straight after taking its message, or free worker 2
    low = bounds([(ANY, 0.0, 3.0), (ANY, 0.0, 4.0), (NAMED, 1.0, 0)], _alpha)
    assert low == [3.0, 3.0 + 1e-3, 3.0 + 1e-3]


def _board(n):
    return Board(array("d", [0.0] * Board.size(n)), n)


def test_a_blocked_state_is_trusted_only_while_nothing_was_read_or_is_in_flight():
    b = _board(3)
    b.publish(1, NAMED, 2.0, aux=0)
    mode, t, aux, seen = b.state(1)
    assert (mode, t, aux) == (NAMED, 2.0, 0) and b.trusted(1, mode, aux, seen)
    b.count_sent(0, 1)  # rank 0 has sent it something: it may already be unblocked
    assert not b.trusted(1, mode, aux, seen)
    b.count_read(0, 1)  # and it has read it: still not trusted until it publishes again
    assert not b.trusted(1, mode, aux, seen)
    b.publish(1, NAMED, 3.0, aux=0)  # blocked again, having read it
    mode, _, aux, seen = b.state(1)
    assert b.trusted(1, mode, aux, seen)


def test_safe_waits_for_a_running_rank_that_could_still_send_earlier():
    b = _board(3)
    b.publish(1, RUNNING, 0.5)
    b.publish(2, NAMED, 1.0, aux=0)
    alone = dict(alpha=_alpha, gone=lambda r: False)
    assert not safe(b, 0, 1.0, 2.0, **alone)      # rank 1 may still send for 0.5 + alpha
    assert safe(b, 0, 1.0, 0.5 + 1e-3, **alone)   # nothing can arrive before that
    assert safe(b, 0, 1.0, 2.0, _alpha, gone=lambda r: r == 1)  # rank 1 has left
    b.count_sent(2, 0)
    assert not safe(b, 0, 1.0, 0.5, **alone)      # a message to me is still on its ring


# -- launched: wall-clock order against virtual order -------------------------------------------
def _late_but_early(comm, n: int):
    """Rank 1 sends at once in wall time but at virtual 10 ms; rank 2 sends 0.3 s later in
    wall time but at virtual 0. Rank 0 must take rank 2's message first."""
    x = torch.full((n,), float(comm.rank))
    if comm.rank == 1:
        with md.slow_rank(comm, 1, 0.010):
            md.faults.maybe_delay(comm, "forward")  # as a strategy's forward would
        comm.send(x, 0)
    elif comm.rank == 2:
        time.sleep(0.3)
        comm.send(x, 0)
    else:
        got = []
        for _ in range(2):
            src = comm.recv(x, md.ANY_SOURCE)
            got.append((src, comm.now(), float(x[0])))
        return got


def test_any_source_takes_the_message_that_arrives_first_in_virtual_time():
    n = 25_000  # 100 KB: 1 ms on the link
    got = md.launch(_late_but_early, 3, args=(n,), network=md.Network.uniform(LINK, compute=FREE),
                    clock="virtual")[0]
    assert [s for s, _, _ in got] == [2, 1] and [v for _, _, v in got] == [2.0, 1.0]
    one = LINK.alpha + n * 4 / LINK.bandwidth
    assert got[0][1] == pytest.approx(one, rel=1e-9)
    assert got[1][1] == pytest.approx(0.010 + one, rel=1e-6)


def _nobody_sends(comm):
    if comm.rank == 0:
        with pytest.raises(md.CommTimeout, match="recv"):
            comm.recv(torch.zeros(1), md.ANY_SOURCE)
        return True
    time.sleep(1.5)  # rank 1 sends nothing, and is still there when rank 0 gives up


def test_an_any_source_receive_nobody_answers_times_out_on_the_wall_clock():
    t0 = time.perf_counter()
    out = md.launch(_nobody_sends, 2, network=md.Network.uniform(LINK), clock="virtual",
                    timeout=1.0)
    assert out[0] is True and time.perf_counter() - t0 < 30


def _ps_steps(comm, steps: int):
    from test_virtual_strategies import _ps_pulls  # tests/ is on the ranks' path (rootdir)
    return _ps_pulls(comm, 1, steps)


def _many_senders(comm, per_rank: int):
    """Every rank but 0 sends ``per_rank`` messages, each after a random wall-clock pause
    and a random virtual delay, so wall order and virtual order disagree."""
    import random
    rng = random.Random(comm.rank)
    x = torch.zeros(64)
    if comm.rank:
        for _ in range(per_rank):
            time.sleep(rng.uniform(0, 0.02))
            comm.clock.advance(rng.uniform(0, 0.005))  # what a straggler's delay does
            comm.send(x, 0)
        return None
    taken = []
    for _ in range(per_rank * (comm.world_size - 1)):
        comm.recv(x, md.ANY_SOURCE)
        taken.append(comm.now())
    return taken


@pytest.mark.parametrize("p", [3, 6])
def test_any_source_takes_every_message_in_virtual_order(p):
    taken = md.launch(_many_senders, p, args=(6,), network=md.Network.uniform(LINK, compute=FREE),
                      clock="virtual")[0]
    assert len(taken) == 6 * (p - 1) and taken == sorted(taken)


@pytest.mark.parametrize("hogs", [0, 2])
def test_a_sync_server_answers_in_virtual_order_beside_cpu_hogs(hogs):
    """A one-server sync parameter server, alone and beside two processes that keep both
    cores busy: its steps follow (W/S + 1) N / B and are never faster. Not every step is
    the formula: the server takes its messages in virtual order now, but the workers'
    pushes meet on its ingress port at the same virtual instant, and book it in the order
    they reach it in wall time (transports/virtual.py): a different order from one step
    to the next costs a step about 10% now and then."""
    from test_virtual_strategies import COMPUTE, RATE, ps_step_time
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        link, workers, steps = md.Link(alpha=2e-5, bandwidth=2e8), 4, 8
        out = md.launch(_ps_steps, 1 + workers, args=(steps,),
                        network=md.Network.uniform(link, compute=COMPUTE), clock="virtual")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    last = [max(pulls[k] for pulls in out[1:]) for k in range(steps)]
    took = [b - a for a, b in zip(last[1:], last[2:])]
    n = (256 * 256 + 256) * 2 * 4
    predicted = 5 * 2 * 8 * 256 * 256 / RATE + ps_step_time(workers, n, 1, link.bandwidth,
                                                            link.alpha, pipelined=True)
    assert min(took) == pytest.approx(predicted, rel=0.002)
    assert all(t > 0.998 * predicted for t in took), [t / predicted for t in took]
