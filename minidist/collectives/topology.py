"""Which node each rank sits on, and the sub-communicators a two-level collective runs on.

A cluster has two kinds of link: fast ones inside a node (NVLink, PCIe) and slower ones
between nodes (InfiniBand, Ethernet). A collective that knows which ranks share a node can
keep most of its bytes on the fast links: hierarchical all_reduce (``hierarchical.py``)
and a ring that visits the ranks node by node (``topology_ring``).

Where the layout comes from (``Topology.detect``), first match wins:

1. the emulated network, ``comm.capability("network")``: each member's world rank mapped to
   its node by ``Network.node_of``;
2. ``LOCAL_WORLD_SIZE`` in the environment (torchrun sets it: ranks per node, numbered
   node by node), node = world rank // LOCAL_WORLD_SIZE;
3. otherwise one node holding every rank (a hierarchical all_reduce is then a plain ring).

Every rank must take the same path, so the layout is agreed: each rank says its node (and
where it learned it) in one small all-gather on ``comm.control``, and all build the same
table from it; ranks that learned their layout from different sources all raise the same
error. A world communicator on an emulated network needs no message: every rank reads the
same ``Network``.

Where it is kept. A split is a collective (an all-gather of colors), so the sub-
communicators are made once per communicator and kept on it as the public attribute
``comm.topology`` (as ``comm.faults`` holds fault plans): ``topology_of(comm)`` returns it,
detecting it on first use; no module-level state. To describe a layout yourself, set
``comm.topology = md.Topology(comm, node_of=[0, 0, 1, 1])`` on every rank before the first
call. Its sub-communicators' byte counters are moved into ``comm.stats`` after every call
(``NodeGroups.charge``), so ``comm.stats`` shows every byte, peer by peer, in ``comm``'s ranks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

SOURCES = ("network", "LOCAL_WORLD_SIZE", "one node", "invalid")


def group_by_node(node_of: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The ranks of each node, nodes numbered by their lowest rank: ``[1, 1, 0, 0, 1]`` ->
    ``((0, 1, 4), (2, 3))``. Pure: the cost functions use it too."""
    nodes: dict[int, list[int]] = {}
    for rank, node in enumerate(node_of):
        nodes.setdefault(node, []).append(rank)
    return tuple(tuple(ranks) for ranks in nodes.values())


def node_order(node_of: Sequence[int]) -> tuple[int, ...]:
    """The ranks node by node: the ring ``topology_ring`` follows."""
    return tuple(r for ranks in group_by_node(node_of) for r in ranks)


def cross_node_hops(node_of: Sequence[int], order: Sequence[int] | None = None) -> int:
    """How many hops of the ring visiting ranks in ``order`` (default: rank order) join two
    nodes: ``nodes`` for a ring in node order, up to p for ranks placed round-robin."""
    order = list(range(len(node_of))) if order is None else list(order)
    p = len(order)
    return sum(node_of[order[i]] != node_of[order[(i + 1) % p]] for i in range(p)) if p > 1 \
        else 0


class Topology:
    """The node of every rank of ``comm``: ``node_of[r]``. Build it with ``detect`` (or give
    the layout), on every rank alike; ``topology_of(comm)`` keeps one on ``comm.topology``.

    ``members[j]``: the ranks on node j (nodes numbered by their lowest rank);
    ``per_node``: the smallest node's size k, the ranks per node a hierarchical collective
    uses (on a bigger node, local ranks k, k+1, ... fold onto local rank i % k first);
    ``node``, ``local_rank``: this rank's node and place in it.
    """

    def __init__(self, comm, node_of: Sequence[int], source: str = "given"):
        if isinstance(node_of, (str, bytes)) or not isinstance(node_of, Sequence):
            raise TypeError(f"Topology node_of must be a sequence of node numbers, one per "
                            f"rank, got {type(node_of).__name__}")
        if len(node_of) != comm.world_size:
            raise ValueError(f"Topology node_of has {len(node_of)} entries but the "
                             f"communicator has {comm.world_size} ranks: give one per rank")
        for r, node in enumerate(node_of):
            if isinstance(node, bool) or not isinstance(node, int) or node < 0:
                raise ValueError(f"Topology node_of[{r}] must be a node number >= 0, got "
                                 f"{node!r}")
        self.comm, self.source = comm, source
        self.members = group_by_node(node_of)
        index = {r: j for j, ranks in enumerate(self.members) for r in ranks}
        self.node_of = tuple(index[r] for r in range(comm.world_size))
        self.nodes = len(self.members)
        self.per_node = min(len(m) for m in self.members)
        self.node = self.node_of[comm.rank]
        self.local_rank = self.members[self.node].index(comm.rank)
        self.ring_order = node_order(self.node_of)
        self._groups: NodeGroups | None = None

    @classmethod
    def detect(cls, comm, env: Mapping[str, str] | None = None) -> Topology:
        """The layout from the emulated network, else ``LOCAL_WORLD_SIZE`` in ``env``
        (default ``os.environ``), else one node (module docstring). Collective unless
        ``comm`` is a world communicator on an emulated network."""
        net = comm.capability("network")
        if net is not None and comm.is_world:
            return cls(comm, [net.node_of(r) for r in range(comm.world_size)], "network")
        node, source = _my_node(comm, net, os.environ if env is None else env)
        table = comm.control.all_gather_ints([node, SOURCES.index(source)], op="topology")
        sources = {SOURCES[s] for _, s in table}
        if len(sources) > 1 or "invalid" in sources:
            raise ValueError(
                f"Topology.detect: the ranks do not agree where the node layout comes from "
                f"(by rank: {[SOURCES[s] for _, s in table]}); LOCAL_WORLD_SIZE must be a "
                "positive integer, set alike on every rank, or absent everywhere")
        return cls(comm, [n for n, _ in table], source)

    @property
    def even(self) -> bool:
        """Whether every node holds the same number of ranks (no folding needed)."""
        return all(len(m) == self.per_node for m in self.members)

    def groups(self) -> NodeGroups:
        """The sub-communicators, split on first use (collective: every rank calls it, as
        every rank calls the collective that needs it) and kept for later calls."""
        if self._groups is None:
            self._groups = NodeGroups(self)
        return self._groups

    def __repr__(self) -> str:
        return (f"Topology({self.nodes} nodes of {[len(m) for m in self.members]} ranks, "
                f"from {self.source}; rank {self.comm.rank} is local rank {self.local_rank} "
                f"of node {self.node})")


def _my_node(comm, net, env: Mapping[str, str]) -> tuple[int, str]:
    if net is not None:
        return net.node_of(comm.global_rank), "network"
    if "LOCAL_WORLD_SIZE" not in env:
        return 0, "one node"
    text = str(env["LOCAL_WORLD_SIZE"])
    if not text.isdigit() or int(text) < 1:
        return -1, "invalid"
    return comm.global_rank // int(text), "LOCAL_WORLD_SIZE"


class NodeGroups:
    """The split-off communicators of a ``Topology`` (one split each, made once):

    * ``node``: the ranks of my node, by rank (local rank = ``topology.local_rank``);
    * ``active``: the first ``per_node`` ranks of my node (``node`` itself when every node
      is that size); None on the ranks beyond them, which fold onto a partner;
    * ``cross``: the ranks with my local rank, one per node, by node; None off ``active``;
    * ``ring``: every rank in node order (``comm`` itself when that is rank order).
    """

    def __init__(self, topo: Topology):
        comm, k, i, j = topo.comm, topo.per_node, topo.local_rank, topo.node
        self.comm, self.topology = comm, topo
        self.node = comm.split(color=j, key=comm.rank)
        self.active = self.node if topo.even else \
            comm.split(color=j if i < k else None, key=comm.rank)
        self.cross = comm.split(color=i if i < k else None, key=j)
        order = topo.ring_order
        self.ring = comm if order == tuple(range(comm.world_size)) else \
            comm.split(color=0, key=order.index(comm.rank))
        mine = topo.members[j]
        self._ranks = [(self.node, mine), (self.active, mine[:k]), (self.ring, order),
                       (self.cross, [m[i] for m in topo.members] if i < k else [])]

    def charge(self) -> None:
        """Move the sub-communicators' byte and message counts into ``comm.stats``, peer by
        peer (their ranks translated to ``comm``'s), and zero them."""
        seen = set()
        for sub, ranks in self._ranks:
            if sub is None or sub is self.comm or id(sub) in seen:
                continue
            seen.add(id(sub))
            for peer, s in sub.stats.per_peer.items():
                t = self.comm.stats.per_peer[ranks[peer]]
                t.bytes_sent += s.bytes_sent
                t.bytes_received += s.bytes_received
                t.messages_sent += s.messages_sent
                t.messages_received += s.messages_received
            sub.stats.reset()


def topology_of(comm) -> Topology:
    """``comm.topology``, detected (``Topology.detect``) and kept there on first use."""
    topo = getattr(comm, "topology", None)
    if topo is None:
        topo = comm.topology = Topology.detect(comm)
    elif not isinstance(topo, Topology) or topo.comm is not comm:
        raise ValueError("comm.topology must be a Topology built for this communicator "
                         "(md.Topology(comm, node_of=...)); a split-off communicator needs "
                         "its own")
    return topo
