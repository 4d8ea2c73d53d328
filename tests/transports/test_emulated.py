"""The emulated network (transports/emulated.py, transports/network.py): messages take the
time the described links say, results stay bitwise the same, bad arguments are refused.

The emulation sleeps: it can only add time, never remove it, and a busy machine adds more.
So a test asserts the lower bound alone (measured / expected >= 0.9; 0.85 where the model
lets a schedule beat the simple formula), which load cannot break and which a network that
skipped its model (no sleep, no queueing at a port) would fail. How close to the model the
wall-clock emulation runs is a measurement of this machine: ``minidist bench emulation``
and the virtual clock (test_virtual_time.py), whose figures are exact on any machine.
The links are slow enough (100-200 MB/s, 0.5-2 ms) for the modelled time to dominate, and
every timed phase starts at one agreed instant on every rank.
"""

from __future__ import annotations

import math
import os
import sys
import time

import pytest
import torch

import minidist as md

LO = 0.9


def _together(comm, margin: float = 0.05) -> float:
    """Rank 0 names an instant ``margin`` seconds ahead; every rank sleeps until it. The
    barrier first: a rank still starting up must not eat into the margin."""
    comm.barrier()
    t = torch.tensor([time.perf_counter() + margin], dtype=torch.float64)
    md.broadcast(comm, t, src=0)
    time.sleep(max(0.0, t.item() - time.perf_counter()))
    return t.item()


def _at_least(measured: float, expected: float, lo: float = LO) -> bool:
    return measured / expected >= lo


# -- describing links and networks ---------------------------------------------------------
def test_links_and_networks_describe_themselves():
    fast, slow = md.Link(alpha=5e-6, bandwidth=20e9), md.Link(alpha=50e-6, bandwidth=1e9)
    net = md.Network.cluster(nodes=2, per_node=4, intra=fast, inter=slow)
    assert [net.node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert net.link(1, 3) == fast and net.link(3, 4) == slow and net.max_ranks == 8
    assert repr(net) == ("Network.cluster(nodes=2, per_node=4, intra=Link(alpha=5 µs, "
                         "bandwidth=20 GB/s), inter=Link(alpha=50 µs, bandwidth=1 GB/s))")
    flat = md.Network.uniform(slow)
    assert flat.link(0, 99) == slow and flat.max_ranks is None
    assert repr(flat) == "Network.uniform(Link(alpha=50 µs, bandwidth=1 GB/s))"
    assert slow.time(1e9) == pytest.approx(1.00005)
    ib = md.Link.infiniband_hdr()
    assert ib.bandwidth == 25e9 and "InfiniBand HDR" in repr(ib)
    assert md.Link.nvlink4().bandwidth > md.Link.pcie4_x16().bandwidth > md.Link.ethernet_25g(
        ).bandwidth
    if sys.platform.startswith("linux"):  # one clock for every process of the machine
        assert "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation


def _never(comm):
    return comm.rank


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match="bandwidth .* must be > 0, got -1"):
        md.Link(alpha=1e-6, bandwidth=-1)
    with pytest.raises(ValueError, match="alpha .* >= 0, got -0.001"):
        md.Link(alpha=-1e-3, bandwidth=1e9)
    with pytest.raises(TypeError, match="bandwidth must be a number"):
        md.Link(alpha=1e-6, bandwidth="fast")
    with pytest.raises(ValueError, match="per_node must be a positive int"):
        md.Network.cluster(nodes=2, per_node=0, intra=md.Link(0, 1e9), inter=md.Link(0, 1e9))
    net = md.Network.cluster(nodes=2, per_node=2, intra=md.Link(1e-6, 1e10),
                             inter=md.Link(1e-5, 1e9))
    with pytest.raises(ValueError, match="backend='torch'"):
        md.launch(_never, 2, backend="torch", network=net)
    with pytest.raises(ValueError, match=r"world_size=5 does not fit .* hold 4"):
        md.launch(_never, 5, network=net)
    with pytest.raises(TypeError, match="network must be an md.Network"):
        md.launch(_never, 2, network=md.Link(1e-6, 1e9))


# -- timing ----------------------------------------------------------------------------------
def _pingpong(comm, sizes, reps):
    best = {}
    for n in sizes:
        x, y = torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
        for _ in range(reps):
            comm.timeline.enable(False)  # record the ping-pongs only
            t0 = _together(comm, 0.01)
            comm.timeline.enable(True)
            if comm.rank == 0:
                reply = comm.irecv(y, 1)  # posted first: its span covers the round trip
                comm.send(x, 1)
                reply.wait()
            else:
                comm.recv(x, 0)
                comm.send(x, 0)
            best[n] = min(best.get(n, math.inf), (time.perf_counter() - t0) / 2)
    return best


def test_pingpong_takes_alpha_plus_n_over_bandwidth():
    link = md.Link(alpha=2e-3, bandwidth=200e6)
    sizes = [0, 1 << 16, 1 << 19, 1 << 21]
    res = md.launch(_pingpong, 2, args=(sizes, 3), network=md.Network.uniform(link),
                    trace=True)
    ratios = {n: res[0][n] / link.time(n) for n in sizes}
    assert all(r >= LO for r in ratios.values()), ratios
    # the timeline shows the emulated time: rank 0's receive of the reply, posted before
    # its own send, lasts at least the round trip 2 (alpha + n / bandwidth)
    recvs = [e for e in res.timelines[0] if e["name"] == "irecv"]
    assert len(recvs) == 3 * len(sizes)
    assert all(e["end"] - e["start"] >= 2 * link.time(e["bytes"]) for e in recvs), recvs


def _timed_all_reduce(comm, n, algorithm):
    x = torch.ones(n // 4)
    md.all_reduce(comm, x, algorithm=algorithm)  # warm up: allocations, first-touch pages
    t0 = _together(comm)
    md.all_reduce(comm, x, algorithm=algorithm)
    return time.perf_counter() - t0


def _ring_time(p: int, n: int, link) -> float:
    """2(p-1)(alpha + (n/p)/bandwidth), plus the collective's agreement check beforehand
    (ceil(lg p) rounds of a 16-byte message: ``collectives/agreement.py``)."""
    return 2 * (p - 1) * link.time(n / p) + math.ceil(math.log2(p)) * link.alpha


def test_ring_all_reduce_follows_the_alpha_beta_formula():
    p, n, link = 4, 4 << 20, md.Link(alpha=1e-3, bandwidth=100e6)
    res = md.launch(_timed_all_reduce, p, args=(n, "ring"), network=md.Network.uniform(link))
    assert _at_least(max(res), _ring_time(p, n, link)), (max(res), _ring_time(p, n, link))


def _incast(comm, n):
    x, times = torch.zeros(n, dtype=torch.uint8), []
    for senders in (1, 4):
        t0 = _together(comm)
        if comm.rank == 0:
            for _ in range(senders):
                comm.recv(x, md.ANY_SOURCE)
        elif comm.rank <= senders:
            comm.send(x, 0)
        times.append(time.perf_counter() - t0)
    return times


def test_incast_queues_at_the_receivers_port():
    """Four senders share the receiver's one ingress port: alpha + 4n/bw, not alpha + n/bw
    (3.7 times longer here: a network without the port would fail the second check)."""
    n, link = 1 << 20, md.Link(alpha=1e-3, bandwidth=100e6)
    one, four = md.launch(_incast, 5, args=(n,), network=md.Network.uniform(link))[0]
    assert _at_least(one, link.time(n)), (one, link.time(n))
    assert _at_least(four, link.alpha + 4 * n / link.bandwidth), (four, link.time(4 * n))


def test_flat_ring_on_two_nodes_runs_at_the_inter_link_speed():
    """Eight ranks on two cores (2 nodes x 4): the ring crosses the slow link twice per
    revolution, and every step waits for it. Its alpha can overlap the next step's transfer
    (the chunk that crosses next came over a fast link), so the run may beat the formula
    by up to one alpha per step: hence 0.85."""
    p, n = 8, 4 << 20
    intra, inter = md.Link(alpha=20e-6, bandwidth=5e9), md.Link(alpha=0.5e-3, bandwidth=50e6)
    net = md.Network.cluster(nodes=2, per_node=4, intra=intra, inter=inter)
    took = max(md.launch(_timed_all_reduce, p, args=(n, "ring"), network=net))
    assert _at_least(took, _ring_time(p, n, inter), lo=0.85), (took, _ring_time(p, n, inter))
    assert took > 10 * _ring_time(p, n, intra)


# -- same results, same matching -------------------------------------------------------------
def _results(comm):
    out = {"surface": (comm.backend, comm.capability("shared_scratch") is None)}
    for algorithm in ("naive", "tree", "ring", "halving_doubling"):
        g = torch.Generator().manual_seed(comm.rank)
        x = torch.randn(10_007, generator=g)
        out[algorithm] = md.all_reduce(comm, x, algorithm=algorithm)
    # matching: ANY_SOURCE, a specific source among them, waits in reverse order
    if comm.rank == 0:
        tags = [2, 1, 1, 1, 2, 1, 1, 2, 1]
        bufs = [torch.empty(2) for _ in tags]
        reqs = [comm.irecv(b, 2 if i == 1 else md.ANY_SOURCE, tag=t)
                for i, (b, t) in enumerate(zip(bufs, tags))]
        sources = [r.wait() for r in reqs[::-1]][::-1]
        out["matching"] = [(s, t, int(b[0]), int(b[1])) for s, t, b in zip(sources, tags, bufs)]
    else:
        for tag, k in ((1, 0), (2, 0), (1, 1)):
            comm.send(torch.tensor([comm.rank, k], dtype=torch.float32), 0, tag)
    return out


def _check_matching(got):
    """Each receive got a message from the source it reports, with its tag; rank 2's first
    tag-1 message went to the receive posted for rank 2; per source, FIFO per tag."""
    assert all(s == sender for s, _, sender, _ in got), got
    assert got[1][0] == 2 and got[1][3] == 0, got
    for src in (1, 2, 3):
        assert [k for s, t, _, k in got if s == src and t == 1] == [0, 1], got
        assert [k for s, t, _, k in got if s == src and t == 2] == [0], got


def test_results_are_bitwise_the_same_as_without_network():
    net = md.Network.uniform(md.Link(alpha=1e-5, bandwidth=1e9))
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    plain, emulated = md.launch(_results, 4), md.launch(_results, 4, network=net)
    for a, b in zip(plain, emulated):
        for algorithm in ("naive", "tree", "ring", "halving_doubling"):
            assert torch.equal(a[algorithm], b[algorithm]), algorithm
            assert torch.equal(b[algorithm], emulated[0][algorithm]), algorithm
    # no shared-memory shortcut around the links
    assert {r["surface"] for r in emulated} == {("emulated", True)}
    _check_matching(plain[0]["matching"])
    _check_matching(emulated[0]["matching"])
    md.launch(_results, 4, network=net)
    if fds is not None:  # the lock pipe is closed; the multiprocess heap keeps one arena
        assert len(os.listdir("/proc/self/fd")) <= fds + 1


def _stuck(comm, sender_stays: bool):
    if comm.rank == 0:
        comm.recv(torch.empty(1), 1, tag=5)
    elif sender_stays:
        time.sleep(10)  # there, sending nothing: rank 0's receive can only time out
    return comm.rank


def test_a_receive_that_never_comes_times_out():
    net = md.Network.uniform(md.Link(alpha=1e-3, bandwidth=1e9))
    with pytest.raises(md.WorkerError, match=r"rank 0.*recv.*timed out"):
        md.launch(_stuck, 2, args=(True,), network=net, timeout=0.5)


def test_a_receive_from_a_rank_that_returned_fails_at_once():
    """As on the local transport: md.PeerLeftError, not the timeout (the launch's is 60 s)."""
    net = md.Network.uniform(md.Link(alpha=1e-3, bandwidth=1e9))
    with pytest.raises(md.WorkerError, match=r"rank 1 failed: returned from its function.*"
                                             r"rank 0 then failed with PeerLeftError"):
        md.launch(_stuck, 2, args=(False,), network=net)


def _auto_picks(comm, sizes):
    from minidist.collectives.auto import choose

    return [choose(comm, torch.empty(n // 4)) for n in sizes]


def test_auto_predicts_from_the_emulated_links():
    """On an emulated network, `auto` uses the links' alpha and bandwidth: a high-latency
    link favours the fewest messages for small tensors and a bandwidth-optimal algorithm
    for large ones, as costs.time predicts with the link's figures."""
    from minidist.costmodel import collectives as costs

    link = md.Link(alpha=1e-3, bandwidth=1e8)
    sizes = [64, 1 << 24]
    picks = md.launch(_auto_picks, 4, args=(sizes,), network=md.Network.uniform(link))[0]
    for n, pick in zip(sizes, picks):
        best = min((a for a in costs.ALL_REDUCE_PATHS if a != "shm"),
                   key=lambda a: costs.time(a, n, 4, link.alpha, link.bandwidth))
        assert pick == best, (n, pick, best)
    assert picks[0] != picks[1]


def _rendezvous(comm):
    comm.eager_limit = 0  # a send waits for its receive's acknowledgement
    x = torch.arange(1000.0) if comm.rank == 0 else torch.empty(1000)
    if comm.rank == 0:
        time.sleep(0.2)  # rank 1 waits for the stamp first
        comm.send(x, 1)
    else:
        comm.recv(x, 0)
    return x.sum().item()


def test_the_eager_limit_works_on_the_emulated_network():
    """Its acknowledgement loop reads a receive whose stamp is still on its way (it raised
    AttributeError)."""
    net = md.Network.uniform(md.Link(alpha=1e-3, bandwidth=1e8))
    assert md.launch(_rendezvous, 2, network=net) == [499500.0, 499500.0]
