"""Hierarchical all_reduce and the ring in node order: the same results as the numpy/float64
reference on every cluster shape up to 8 ranks (even and uneven nodes, round-robin
placement), every dtype and op, lengths 0, 1, primes and p-divisible; every rank the same
bits; bytes on each link exactly ``costs.hierarchical_link_bytes`` (so across nodes
2(N-1)/N n/k per rank); the layout from ``LOCAL_WORLD_SIZE`` on the torch backend; errors."""

from __future__ import annotations

import pytest
import torch
from collectives_ref import assert_same_bits, check, run_case

import minidist as md
from minidist.collectives.topology import Topology, topology_of
from minidist.costmodel import collectives as costs

FAST = md.Link(alpha=0.0, bandwidth=1e12)  # the layout matters here, not the time
ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
              torch.int64]
LENGTHS = [0, 1, 7, 24, 1031]
ALGOS = ("hierarchical", "topology_ring")


def _cases(full: bool):
    """Integer inputs (exact in every dtype) for every dtype and op; random floats for the
    float ops. ``full``: every dtype; otherwise float32, float16 and int64."""
    dtypes = ALL_DTYPES if full else [torch.float32, torch.float16, torch.int64]
    cases = []
    for algo in ALGOS:
        for dtype in dtypes:
            ops = ["sum", "max", "min", "prod"] + (["avg"] if dtype.is_floating_point else [])
            for n in LENGTHS:
                cases.append(dict(fn="all_reduce", shape=(n,), dtype=dtype, values="int",
                                  kw={"op": "sum", "algorithm": algo}, seed=len(cases)))
            for op in ops:
                cases.append(dict(fn="all_reduce", shape=(3, 5), dtype=dtype, values="int",
                                  kw={"op": op, "algorithm": algo}, seed=len(cases)))
            if dtype.is_floating_point:
                cases.append(dict(fn="all_reduce", shape=(100,), dtype=dtype, values="float",
                                  kw={"op": "avg", "algorithm": algo}, seed=len(cases)))
    return cases


def _run(comm, cases):
    """Each case's output and, per case, (bytes sent inside the node, across nodes)."""
    topo = topology_of(comm)
    outs, traffic = [], []
    for case in cases:
        comm.stats.reset()
        outs.append(run_case(comm, case))
        peers = comm.stats.per_peer
        across = sum(s.bytes_sent for q, s in peers.items() if topo.node_of[q] != topo.node)
        traffic.append((comm.stats.bytes_sent - across, across))
    return outs, traffic, topo.node_of


SHAPES = [  # (nodes, per_node, world size, placement)
    (1, 4, 4, "block"), (4, 1, 4, "block"), (2, 2, 4, "block"), (2, 3, 6, "block"),
    (2, 4, 8, "block"), (4, 2, 8, "block"), (3, 2, 6, "block"), (1, 1, 1, "block"),
    (1, 8, 8, "block"), (8, 1, 8, "block"), (2, 4, 8, "round_robin"),
    # unequal nodes: the world does not fill the cluster, or the placement leaves holes
    (2, 2, 3, "block"), (2, 4, 6, "block"), (2, 4, 5, "block"), (3, 2, 5, "block"),
    (3, 3, 7, [0, 0, 0, 1, 2, 2, 1]),
]


@pytest.mark.parametrize("nodes,per_node,p,placement", SHAPES,
                         ids=[f"{s[0]}x{s[1]}-p{s[2]}-{s[3] if isinstance(s[3], str) else 'list'}"
                              for s in SHAPES])
def test_equals_the_reference_and_the_byte_formula(nodes, per_node, p, placement):
    net = md.Network.cluster(nodes, per_node, FAST, FAST, placement=placement)
    cases = _cases(full=(nodes, per_node, p) in ((2, 4, 8), (2, 4, 6), (3, 2, 5)))
    out = md.launch(_run, p, args=(cases,), network=net, timeout=60)
    layout = [net.node_of(r) for r in range(p)]
    assert all(o[2] == out[0][2] for o in out)  # one layout, agreed by every rank
    for i, case in enumerate(cases):
        outs = [o[0][i] for o in out]
        check(case, outs, p)
        assert_same_bits(outs)
        n, size = outs[0].numel(), case["dtype"].itemsize
        got = [o[1][i] for o in out]
        if case["kw"]["algorithm"] == "hierarchical":
            want = [costs.hierarchical_link_bytes(n, size, layout, r) for r in range(p)]
            assert got == want, (case, got, want)
        total = costs.bytes_sent(case["kw"]["algorithm"], n, size, p, 0, node_of=layout)
        assert sum(got[0]) == total, case


def _inter_bytes(comm, n):
    x = torch.ones(n, dtype=torch.float32)
    topo = topology_of(comm)
    out = {}
    for algo in ("hierarchical", "ring", "topology_ring"):
        comm.stats.reset()
        md.all_reduce(comm, x, algorithm=algo)
        out[algo] = sum(s.bytes_sent for q, s in comm.stats.per_peer.items()
                        if topo.node_of[q] != topo.node)
    return out


@pytest.mark.parametrize("nodes,per_node", [(2, 4), (4, 2), (2, 2)])
def test_bytes_across_nodes_are_the_headline_formula(nodes, per_node):
    """n divisible by p: every rank sends 2(N-1)/N n/k across nodes (p times less than a
    flat ring crossing nodes at every hop would; here the flat ring crosses at N hops)."""
    n = 840 * 4  # elements
    net = md.Network.cluster(nodes, per_node, FAST, FAST)
    out = md.launch(_inter_bytes, nodes * per_node, args=(n,), network=net)
    want = costs.hierarchical_inter_bytes(n * 4, nodes, per_node)
    assert [o["hierarchical"] for o in out] == [want] * (nodes * per_node)
    ring_crossing = 2 * (nodes * per_node - 1) * n * 4 // (nodes * per_node)
    assert sorted(o["ring"] for o in out)[-nodes:] == [ring_crossing] * nodes
    assert sum(o["ring"] for o in out) == nodes * ring_crossing


def _one_node(comm, n):
    x = torch.arange(n, dtype=torch.float64) + comm.rank
    comm.stats.reset()
    md.all_reduce(comm, x, algorithm="hierarchical")
    return topology_of(comm).source, comm.stats.bytes_sent, x


def test_without_a_layout_it_is_one_node_and_the_ring(monkeypatch):
    """No network and no LOCAL_WORLD_SIZE: one node, so the bytes are the ring's."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    p, n = 3, 1031
    out = md.launch(_one_node, p, args=(n,))
    want = torch.arange(n, dtype=torch.float64) * p + sum(range(p))
    for r, (source, sent, x) in enumerate(out):
        assert source == "one node" and torch.equal(x, want)
        assert sent == costs.ring_bytes(n, 8, p, r)


def _from_env(comm, n, local_world_size):
    comm.topology = Topology.detect(comm, env={"LOCAL_WORLD_SIZE": str(local_world_size)})
    x = torch.arange(n, dtype=torch.float64) * (comm.rank + 1)
    comm.stats.reset()
    md.all_reduce(comm, x, algorithm="hierarchical")
    topo = comm.topology
    across = sum(s.bytes_sent for q, s in comm.stats.per_peer.items()
                 if topo.node_of[q] != topo.node)
    sub = comm.split(color=comm.rank % 2)  # a split-off communicator detects its own layout
    sub.topology = Topology.detect(sub, env={"LOCAL_WORLD_SIZE": str(local_world_size)})
    y = torch.ones(5, dtype=torch.float64)
    md.all_reduce(sub, y, algorithm="hierarchical")
    return topo.source, topo.node_of, across, x, sub.topology.node_of, y


@pytest.mark.parametrize("backend", ["local", "torch"])
def test_layout_from_local_world_size(backend):
    """As under torchrun: LOCAL_WORLD_SIZE=2 on 4 ranks makes 2 nodes of 2 (on gloo too)."""
    p, n = 4, 1001
    out = md.launch(_from_env, p, args=(n, 2), backend=backend, timeout=60)
    want = torch.arange(n, dtype=torch.float64) * sum(range(1, p + 1))
    for r, (source, node_of, across, x, sub_nodes, y) in enumerate(out):
        assert source == "LOCAL_WORLD_SIZE" and node_of == (0, 0, 1, 1)
        assert torch.equal(x, want)
        assert across == costs.hierarchical_link_bytes(n, 8, node_of, r)[1]
        assert sub_nodes == (0, 1)  # world ranks 0, 2 (or 1, 3): one per node
        assert torch.equal(y, torch.full((5,), 2.0, dtype=torch.float64))


def _disagree(comm):
    env = {"LOCAL_WORLD_SIZE": "2"} if comm.rank == 0 else {}
    Topology.detect(comm, env=env)


def _bad_value(comm):
    Topology.detect(comm, env={"LOCAL_WORLD_SIZE": "two"})


def _bad_layouts(comm):
    errors = []
    for bad in ([0, 0], "0011", [0, -1, 1, 1], [0, 1.5, 1, 1]):
        try:
            Topology(comm, bad)
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    comm.topology = "2 nodes"
    try:
        md.all_reduce(comm, torch.ones(3), algorithm="hierarchical")
    except ValueError as e:
        errors.append(str(e))
    return errors


def test_bad_layouts_give_clear_errors():
    with pytest.raises(md.WorkerError, match="do not agree where the node layout comes from"):
        md.launch(_disagree, 2, timeout=20)
    with pytest.raises(md.WorkerError, match="LOCAL_WORLD_SIZE must be a positive integer"):
        md.launch(_bad_value, 2, timeout=20)
    errors = md.launch(_bad_layouts, 4, timeout=20)[0]
    assert len(errors) == 5, errors
    assert "has 2 entries but the communicator has 4 ranks" in errors[0]
    assert "sequence of node numbers" in errors[1]
    assert "node_of[1] must be a node number >= 0, got -1" in errors[2]
    assert "node_of[1] must be a node number >= 0, got 1.5" in errors[3]
    assert "comm.topology must be a Topology" in errors[4]
    with pytest.raises(md.WorkerError, match="unknown algorithm 'hierarchic'"):
        md.launch(_misspelt, 1, timeout=20)


def _misspelt(comm):
    md.all_reduce(comm, torch.ones(2), algorithm="hierarchic")
