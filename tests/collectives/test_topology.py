"""The topology half of communication efficiency: placement on the emulated network, the
ring in node order (hops that cross nodes, counted), the two-level cost functions against
the one-link formulas and against each other, ``auto`` choosing with the topology, and the
comparison on clusters described with real link figures."""

from __future__ import annotations

import math

import pytest
import torch

import minidist as md
from minidist.collectives.auto import choose
from minidist.collectives.topology import cross_node_hops, group_by_node, node_order
from minidist.costmodel import cluster as cluster_costs
from minidist.costmodel import collectives as costs

INTRA = md.Link(alpha=20e-6, bandwidth=1e9)
SLOW = md.Link(alpha=160e-6, bandwidth=1e9 / 8)  # 8x slower inter-node link


# -- placement -----------------------------------------------------------------------------
def test_placements_and_their_errors():
    rr = md.Network.cluster(2, 4, INTRA, SLOW, placement="round_robin")
    assert [rr.node_of(r) for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert rr.link(0, 1) == SLOW and rr.link(0, 2) == INTRA
    assert repr(rr).endswith("placement=[0, 1, 0, 1, 0, 1, 0, 1])")
    given = md.Network.cluster(3, 2, INTRA, SLOW, placement=[2, 0, 1, 0])
    assert [given.node_of(r) for r in range(4)] == [2, 0, 1, 0]
    given.check_world(4)
    with pytest.raises(ValueError, match=r"world_size=5 does not fit .* hold 4"):
        given.check_world(5)
    with pytest.raises(ValueError, match="placement must be 'block', 'round_robin' or a seq"):
        md.Network.cluster(2, 2, INTRA, SLOW, placement="random")
    with pytest.raises(ValueError, match=r"placement\[1\] must be a node number in 0..1, got 2"):
        md.Network.cluster(2, 2, INTRA, SLOW, placement=[0, 2])
    with pytest.raises(ValueError, match="puts 3 ranks on node 0, which holds per_node=2"):
        md.Network.cluster(2, 2, INTRA, SLOW, placement=[0, 0, 0, 1])
    with pytest.raises(ValueError, match="per_node must be a positive int"):
        md.Network.cluster(2, 0, INTRA, SLOW, placement="round_robin")


def test_layout_helpers():
    assert group_by_node([1, 1, 0, 0, 1]) == ((0, 1, 4), (2, 3))
    assert node_order([0, 1, 0, 1]) == (0, 2, 1, 3)
    rr = [r % 2 for r in range(8)]
    assert cross_node_hops(rr) == 8  # rank order over round-robin ranks: every hop
    assert cross_node_hops(rr, node_order(rr)) == 2  # node order: one hop per node
    assert cross_node_hops([r // 4 for r in range(8)]) == 2
    assert cross_node_hops([0]) == 0


# -- the ring in node order, measured --------------------------------------------------------
def _crossings(comm, n):
    x = torch.ones(n, dtype=torch.float32)
    net, out = comm.capability("network"), {}
    for algo in ("ring", "topology_ring"):
        comm.stats.reset()
        md.all_reduce(comm, x, algorithm=algo)
        peers = comm.stats.per_peer
        out[algo] = (sum(s.messages_sent for q, s in peers.items()
                         if s.messages_sent and net.node_of(q) != net.node_of(comm.rank)),
                     sum(s.bytes_sent for q, s in peers.items()
                         if net.node_of(q) != net.node_of(comm.rank)),
                     comm.stats.bytes_sent)
    return out


def test_ring_in_node_order_crosses_nodes_only_between_nodes():
    """Round-robin placement, 2 nodes x 4: the ring in rank order sends every message across
    nodes (8 crossing hops); in node order only 2 ranks send across, and the total bytes
    are the ring's, at each rank's place in node order."""
    p, n = 8, 840
    net = md.Network.cluster(2, 4, INTRA, INTRA, placement="round_robin")
    out = md.launch(_crossings, p, args=(n,), network=net)
    layout = [net.node_of(r) for r in range(p)]
    ring_hops = [1 if o["ring"][0] else 0 for o in out]
    topo_hops = [1 if o["topology_ring"][0] else 0 for o in out]
    assert sum(ring_hops) == cross_node_hops(layout) == 8
    assert sum(topo_hops) == cross_node_hops(layout, node_order(layout)) == 2
    step = 2 * (p - 1) * n * 4 // p  # one rank's ring bytes, all to its right neighbour
    assert sum(o["ring"][1] for o in out) == 8 * step
    assert sum(o["topology_ring"][1] for o in out) == 2 * step
    assert [o["topology_ring"][2] for o in out] == [
        costs.bytes_sent("topology_ring", n, 4, p, r, node_of=layout) for r in range(p)]


# -- cost functions --------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_one_link_everywhere_gives_the_one_link_formulas(p):
    """With intra == inter the rounds add up to ``costs.time`` of every flat path."""
    link, n = md.Link(alpha=3e-6, bandwidth=2e9), 8 * 1024 * 8
    layout = [r // 2 for r in range(p)]
    for name in ("naive", "tree", "ring", "recursive_doubling", "halving_doubling",
                 "topology_ring"):
        want = costs.time("ring" if name == "topology_ring" else name, n, p, link.alpha,
                          link.bandwidth)
        got = cluster_costs.cluster_time(name, n, layout, link, link)
        assert got == pytest.approx(want, rel=1e-12), name


@pytest.mark.parametrize("nodes,k", [(1, 4), (4, 1), (2, 4), (4, 2), (3, 3), (8, 8)])
def test_hierarchical_rounds_are_its_formula(nodes, k):
    n = 1 << 22
    layout = [r // k for r in range(nodes * k)]
    rounds = cluster_costs.cluster_time("hierarchical", n, layout, INTRA, SLOW)
    assert rounds == pytest.approx(costs.hierarchical_time(n, nodes, k, INTRA, SLOW))
    a_i, b_i, a_e, b_e = INTRA.alpha, INTRA.bandwidth, SLOW.alpha, SLOW.bandwidth
    textbook = (2 * (k - 1) * a_i + 2 * (k - 1) / k * n / b_i
                + 2 * (nodes - 1) * a_e + 2 * (nodes - 1) / nodes * (n / k) / b_e)
    assert rounds == pytest.approx(textbook)
    inter = costs.hierarchical_inter_bytes(n, nodes, k)
    assert inter == 2 * (nodes - 1) / nodes * n / k
    assert cluster_costs.cross_node_bytes("hierarchical", n, layout) == pytest.approx(
        nodes * k * inter)
    if nodes > 1 and k > 1:  # the flat ring waits on the slow link at every step
        ring = cluster_costs.cluster_time("ring", n, layout, INTRA, SLOW)
        assert ring == pytest.approx(costs.ring_time(n, nodes * k, a_e, b_e))
        assert ring > rounds


def test_the_headline_prediction():
    """2 nodes x 4, inter link 8x slower: hierarchical spends 0.44 n / B_inter on the wire
    against the ring's 1.75 n / B_inter, a 4x prediction for large tensors (alpha aside)."""
    intra, inter = md.Link(0.0, 8e9), md.Link(0.0, 1e9)
    t = cluster_costs.compare_all_reduce(1e8, 2, 4, intra, inter)
    assert t["ring"] == pytest.approx(1.75 * 1e8 / 1e9)
    assert t["hierarchical"] == pytest.approx((1.5 / 8 + 0.25) * 1e8 / 1e9)
    assert t["ring"] / t["hierarchical"] == pytest.approx(4.0)


def test_real_clusters_prefer_hierarchical_for_large_gradients():
    rows = cluster_costs.cluster_table(1 << 30)
    assert {r["cluster"] for r in rows} == set(cluster_costs.CLUSTERS)
    for row in rows:
        assert row["best"] == "hierarchical" and row["ring / hierarchical"] > 2, row
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("ring", "tree",
                                                                 "hierarchical"))
    small = cluster_costs.compare_all_reduce(64, 8, 8, md.Link.nvlink4(),
                                             md.Link.infiniband_ndr())
    assert min(small, key=small.get) != "ring"  # 126 latencies: not for a tiny tensor


def test_cost_errors():
    with pytest.raises(ValueError, match="no two-level cost for 'rings'"):
        cluster_costs.cluster_time("rings", 10, [0, 1], INTRA, SLOW)
    with pytest.raises(ValueError, match="size n must be >= 0 bytes, got -1"):
        cluster_costs.cluster_time("ring", -1, [0, 1], INTRA, SLOW)
    with pytest.raises(TypeError, match="inter must be an md.Link, got float"):
        cluster_costs.compare_all_reduce(10, 2, 2, INTRA, 1e9)
    with pytest.raises(ValueError, match="per_node must be a positive integer, got 0"):
        cluster_costs.compare_all_reduce(10, 2, 0, INTRA, SLOW)
    with pytest.raises(ValueError, match="world size p must be a positive integer"):
        costs.hierarchical_time(10, 0, 2, INTRA, SLOW)


# -- auto ------------------------------------------------------------------------------------
SIZES = [64, 4 << 10, 64 << 10, 1 << 20, 16 << 20]


def _picks(comm):
    sub = comm.split(color=comm.rank % 2)  # one rank of every pair: 2 per node
    return ([choose(comm, torch.empty(n // 4)) for n in SIZES],
            [choose(sub, torch.empty(n // 4)) for n in SIZES])


def test_auto_chooses_with_the_topology():
    """2 nodes x 4 with an 8x slower inter-node link: a latency-bound path for a tiny
    tensor, hierarchical for large ones, exactly where the two-level rounds say; a split-off
    communicator is judged on its own layout."""
    net = md.Network.cluster(2, 4, INTRA, SLOW)
    out = md.launch(_picks, 8, network=net)
    picks, sub_picks = out[0]
    assert all(o == out[0] for o in out[::2])
    layout = [r // 4 for r in range(8)]
    for n, pick in zip(SIZES, picks):
        best = min(cluster_costs.PATHS,
                   key=lambda a: cluster_costs.cluster_time(a, n, layout, INTRA, SLOW))
        assert pick == best, (n, pick, best)
    assert picks[0] not in ("hierarchical", "ring", "topology_ring")
    assert picks[-1] == "hierarchical" and picks[-2] == "hierarchical"
    sub_layout = [0, 0, 1, 1]  # ranks 0, 2 | 4, 6 (or 1, 3 | 5, 7)
    for n, pick in zip(SIZES, sub_picks):
        best = min(cluster_costs.PATHS,
                   key=lambda a: cluster_costs.cluster_time(a, n, sub_layout, INTRA, SLOW))
        assert pick == best, (n, pick, best)
