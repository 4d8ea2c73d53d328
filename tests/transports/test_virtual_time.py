"""Virtual time on the emulated network (transports/clock.py, virtual.py, intervals.py):
every figure against its formula, asserted exactly (to float rounding) where the FLOP model
makes computation exact, the bad inputs refused, timeouts still on the wall clock, results
bitwise those of the plain local backend.

Virtual times are deterministic, so they may be asserted; no wall time is.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

import minidist as md
from minidist.collectives import allreduce
from minidist.costmodel import collectives as costs
from minidist.transports.intervals import Port, book, earliest_start

# Computation in these scenarios is free (no matrix products): only the links take time.
FREE = md.Compute(flops=1e12, efficiency=1.0)
LINK = md.Link(alpha=1e-3, bandwidth=1e8, name="slow")


def _net(link=LINK, compute=FREE) -> md.Network:
    return md.Network.uniform(link, compute=compute)


# -- the reservation logic, pure --------------------------------------------------------------
def test_earliest_start_back_fills_gaps_both_ports_share():
    egress = Port(0.0, ((1.0, 2.0), (5.0, 6.0)))
    ingress = Port(0.0, ((2.5, 3.0),))
    assert earliest_start([egress, ingress], 0.0, 1.0) == 0.0    # before everything
    assert earliest_start([egress, ingress], 0.5, 1.0) == 3.0    # 2.0-2.5 too short
    assert earliest_start([egress, ingress], 1.2, 0.5) == 2.0    # fits between the two
    assert earliest_start([egress, ingress], 3.0, 2.0) == 3.0    # back-filled before 5.0
    assert earliest_start([egress, ingress], 3.5, 2.0) == 6.0    # queued behind it
    assert earliest_start([Port(4.0), ingress], 0.0, 1.0) == 4.0  # the floor: busy until 4


def test_book_merges_and_stays_bounded_without_double_booking():
    port = Port(0.0)
    for k in range(10):
        port = book(port, 2.0 * k, 2.0 * k + 1, capacity=4)  # ten disjoint intervals
    assert len(port.busy) == 4 and port.floor == 11.0  # the six earliest folded in
    assert earliest_start([port], 0.0, 0.5) == 11.0    # the forgotten gaps are busy
    assert earliest_start([port], 13.2, 0.5) == 13.2   # a kept gap is still free
    merged = book(book(Port(0.0), 1.0, 2.0), 2.0, 3.0)
    assert merged.busy == ((1.0, 3.0),)


# -- messages against alpha + n / bandwidth -----------------------------------------------------
def _ping_pong(comm, n: int):
    x = torch.zeros(n, dtype=torch.uint8)
    comm.barrier()
    start = comm.now()
    if comm.rank == 0:
        comm.send(x, 1)
        one_way = None
        comm.recv(x, 1)
    else:
        comm.recv(x, 0)
        one_way = comm.now() - start
        comm.send(x, 0)
    return start, one_way, comm.now() - start


def test_ping_pong_is_alpha_plus_n_over_bandwidth():
    n = 250_000
    out = md.launch(_ping_pong, 2, args=(n,), network=_net(), clock="virtual")
    assert out[0][0] == out[1][0] == pytest.approx(LINK.alpha)  # the barrier: one round
    assert out[1][1] == pytest.approx(LINK.time(n), rel=1e-12)
    assert out[0][2] == pytest.approx(2 * LINK.time(n), rel=1e-12)


def _ring(comm, n: int, via_api: bool):
    x = torch.full((n,), float(comm.rank + 1))
    comm.barrier()
    start = comm.now()
    if via_api:
        md.all_reduce(comm, x, algorithm="ring")
    else:
        allreduce.ring(comm, x, "sum")
    return comm.now() - start, x[:3].tolist()


@pytest.mark.parametrize("p", [2, 4])
def test_ring_all_reduce_follows_its_alpha_beta_formula(p):
    n = 40_000  # float32, divisible by p
    ring = costs.ring_time(4 * n, p, LINK.alpha, LINK.bandwidth)
    for via_api in (False, True):
        out = md.launch(_ring, p, args=(n, via_api), network=_net(), clock="virtual")
        # the public call first agrees on the arguments (ceil(lg p) rounds of 16 bytes),
        # which costs nothing on virtual time: NCCL makes no such check
        for took, head in out:
            assert took == pytest.approx(ring, rel=1e-9)
            assert head == [p * (p + 1) / 2] * 3


def _incast(comm, n: int, senders: int):
    x = torch.zeros(n, dtype=torch.uint8)
    comm.barrier()
    start = comm.now()
    if comm.rank == 0:
        reqs = [comm.irecv(torch.empty_like(x), src) for src in range(1, senders + 1)]
        for r in reqs:
            r.wait()
        return comm.now() - start
    if comm.rank <= senders:
        comm.send(x, 0)
    return None


def test_four_senders_into_one_port_take_four_times_one():
    n = 100_000
    link = md.Link(alpha=1e-4, bandwidth=1e8)
    one = md.launch(_incast, 5, args=(n, 1), network=_net(link), clock="virtual")[0]
    four = md.launch(_incast, 5, args=(n, 4), network=_net(link), clock="virtual")[0]
    assert one == pytest.approx(link.time(n), rel=1e-9)
    assert four - link.alpha == pytest.approx(4 * (one - link.alpha), rel=1e-9)


def test_a_flat_ring_across_two_nodes_runs_at_the_inter_node_pace():
    intra, inter = md.Link(alpha=1e-6, bandwidth=1e10), md.Link(alpha=1e-6, bandwidth=1e8)
    net = md.Network.cluster(nodes=2, per_node=2, intra=intra, inter=inter, compute=FREE)
    n = 100_000
    took = md.launch(_ring, 4, args=(n, False), network=net, clock="virtual")[0][0]
    across = costs.ring_time(4 * n, 4, inter.alpha, inter.bandwidth)
    inside = costs.ring_time(4 * n, 4, intra.alpha, intra.bandwidth)
    assert took == pytest.approx(across, rel=0.01)  # every round waits for the slow hop
    assert took > 50 * inside


def _straggling(comm, seconds: float, steps: int):
    x = torch.ones(1000)
    comm.barrier()
    steps_s, waits_s = [], []
    for _ in range(steps):
        start = comm.now()
        with md.slow_rank(comm, rank=1, seconds=seconds):
            md.faults.maybe_delay(comm, "forward")
        before = comm.now()
        md.all_reduce(comm, x, algorithm="ring")
        steps_s.append(comm.now() - start)
        waits_s.append(comm.now() - before)
    return steps_s[-1], waits_s[-1]  # a step in the steady state


def test_a_straggler_costs_its_delay_on_every_rank_and_p_minus_1_delays_of_idle():
    p, d = 4, 0.05
    fast = md.launch(_straggling, p, args=(0.0, 3), network=_net(), clock="virtual")
    slow = md.launch(_straggling, p, args=(d, 3), network=_net(), clock="virtual")
    # every rank's step grows by the delay: the collective's agreement check (free on
    # virtual time, as NCCL has none) holds the others until the straggler arrives
    for r in range(p):
        assert slow[r][0] - fast[r][0] == pytest.approx(d, rel=1e-9)
    idle = sum(slow[r][1] - fast[r][1] for r in range(p) if r != 1)
    assert idle == pytest.approx((p - 1) * d, rel=1e-9)  # wasted by the others
    assert slow[1][1] == pytest.approx(fast[1][1], rel=1e-9)  # the straggler waits for none


def _rendezvous(comm, n: int):
    comm.eager_limit = 0  # every send waits for its receive, as the grader runs learners
    x = torch.zeros(n, dtype=torch.uint8)
    comm.barrier()
    start = comm.now()
    if comm.rank == 0:
        comm.send(x, 1)
    else:
        comm.recv(x, 0)
    return comm.now() - start


def test_a_rendezvous_send_completes_when_the_acknowledgement_arrives():
    n = 100_000
    sender, receiver = md.launch(_rendezvous, 2, args=(n,), network=_net(), clock="virtual")
    assert receiver == pytest.approx(LINK.time(n), rel=1e-12)
    assert sender == pytest.approx(LINK.time(n) + LINK.alpha, rel=1e-12)  # + the ack


def _split_clock(comm):
    sub = comm.split(comm.rank % 2)
    sub.barrier()  # time spent on the child shows on the parent's clock
    return sub.clock is comm.clock and sub.now() == comm.now() > 0


def test_split_communicators_share_the_ranks_clock():
    assert md.launch(_split_clock, 4, network=_net(), clock="virtual") == [True] * 4


def test_timelines_say_they_are_virtual():
    import matplotlib

    matplotlib.use("Agg")
    out = md.launch(_ping_pong, 2, args=(1000,), network=_net(), clock="virtual", trace=True)
    events = [e for tl in out.timelines for e in tl]
    assert events and all(e["clock"] == "virtual" for e in events)
    sends = [e for e in out.timelines[0] if e["name"] == "send"]
    assert sends[0]["end"] - sends[0]["start"] == pytest.approx(1000 / LINK.bandwidth)
    doc = md.to_chrome_trace(out.timelines)
    assert doc["otherData"] == {"clock": "virtual"}
    assert {"name": "minidist (virtual time)"} in [e.get("args") for e in doc["traceEvents"]]
    assert md.plot_gantt(out.timelines).get_xlabel() == "virtual time (ms)"
    wall = md.launch(_ping_pong, 2, args=(1000,), trace=True)
    assert md.plot_gantt(wall.timelines).get_xlabel() == "time (ms)"
    with pytest.raises(ValueError, match="mix wall-clock and virtual times"):
        md.plot_gantt(out.timelines + wall.timelines)


# -- results, errors, timeouts --------------------------------------------------------------------
def _train(comm):
    torch.manual_seed(comm.rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        ddp(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_results_are_bitwise_those_of_the_local_backend():
    plain = md.launch(_train, 3)
    for clock, compute in (("wall", None), ("virtual", None), ("virtual", FREE)):
        fast = md.Network.uniform(md.Link(alpha=1e-6, bandwidth=1e10), compute=compute)
        out = md.launch(_train, 3, network=fast, clock=clock)
        for a, b in zip(plain, out):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), (clock, compute)


def test_bad_clocks_and_rates_are_refused_naming_the_mistake():
    with pytest.raises(ValueError, match=r"clock must be one of 'wall', 'virtual', got 'sim'"):
        md.launch(_ping_pong, 2, args=(1,), network=_net(), clock="sim")
    with pytest.raises(ValueError, match="clock='virtual' .* none was given: pass network="):
        md.launch(_ping_pong, 2, args=(1,), clock="virtual")
    with pytest.raises(ValueError, match="threads=2 with clock='virtual'"):
        md.launch(_ping_pong, 2, args=(1,), network=_net(), clock="virtual", threads=2,
                  start_method="spawn")
    for bad in (0, -1e12, math.inf, math.nan):
        with pytest.raises(ValueError, match=f"md.Compute flops must be a positive finite "
                                             f"number, got {bad}"):
            md.Compute(flops=bad)
    with pytest.raises(ValueError, match="efficiency is a fraction of the peak"):
        md.Compute(flops=1e12, efficiency=1.5)
    with pytest.raises(ValueError, match="efficiency must be a positive finite number, got 0"):
        md.Compute(flops=1e12, efficiency=0)
    with pytest.raises(TypeError, match="Network compute must be an md.Compute"):
        md.Network.uniform(LINK, compute=312e12)
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        md.Compute.a100("fp8")


def test_presets_are_the_cost_models_figures():
    from minidist.costmodel.cluster import A100_EFFICIENCY, Cluster

    a100 = md.Compute.a100()
    assert a100.rate == Cluster.dgx_a100(1).flops("bf16") and a100.efficiency == A100_EFFICIENCY
    assert md.Compute.h100("fp32").rate == Cluster.dgx_h100(1).flops("fp32")
    assert md.Compute(flops=1e12, efficiency=0.5).seconds(1e12) == 2.0


def test_flop_count_is_torchs_count_per_thread_plus_cpu_attention():
    import threading

    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    from minidist.transports.compute import FlopCount

    mlp = md.models.mlp(32, 2)
    x = torch.randn(4, 32)
    with FlopCounterMode(display=False) as theirs:
        mlp(x).sum().backward()
    with FlopCount() as mine:
        mlp(x).sum().backward()
        other = threading.Thread(target=lambda: mlp(x))  # another thread: not counted
        other.start()
        other.join()
    assert mine.flops == theirs.get_total_flops() > 0
    q = torch.randn(1, 2, 8, 4)
    with FlopCount() as mine, torch.inference_mode():  # composite ops decompose
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert mine.flops == sdpa_flop_count(q.shape, q.shape, q.shape)


def _wait_for_nobody(comm):
    if comm.rank == 0:
        comm.recv(torch.empty(4), src=1, tag=7)
    else:
        time.sleep(5)  # alive, sending nothing (the caller stops it after rank 0 fails)
    return comm.now()


def test_a_receive_nobody_sends_times_out_on_the_wall_clock():
    with pytest.raises(md.WorkerError, match=r"CommTimeout.*recv.*rank 1.*tag 7"):
        md.launch(_wait_for_nobody, 2, network=_net(), clock="virtual", timeout=0.5)
