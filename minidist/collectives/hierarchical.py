"""Two-level all_reduce for a cluster of nodes: hierarchical, and a ring in node order.

On a cluster the links inside a node (NVLink: 450 GB/s per GPU each way) are ten times or
more faster than the links between nodes (InfiniBand NDR: 50 GB/s, 100 GbE: 12.5 GB/s). A
flat ring over p = N k ranks (N nodes of k) moves 2(p-1)/p n bytes per rank and every one
of its 2(p-1) steps waits for the hops that cross nodes, so it runs at the slow link's
speed. Two remedies, both in NCCL and Horovod:

* ``topology_ring``: the same ring, visiting the ranks node by node, so only N of its p
  hops cross nodes (a ring in rank order over ranks placed round-robin crosses at every
  hop). The bytes are the ring's; what changes is which link each hop uses. NCCL builds its
  rings this way from the topology it detects (NVLink, PCIe switches, NICs).
* ``hierarchical``: reduce-scatter inside each node, all_reduce across nodes between the
  ranks with the same local rank (each carrying 1/k of the tensor), all-gather inside each
  node: Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (Sergeev and Del Balso, "Horovod",
  2018), the hierarchical all-reduce of Jia et al. (2018, ImageNet in four minutes) and the
  2D-torus all-reduce of Mikami et al. (2018); NCCL 2.4's trees likewise keep the traffic
  inside a node on its chains and send across nodes only on a double binary tree (Jeaugey,
  "Massively scale your deep learning training with NCCL 2.4", 2019). The slow link now
  carries 2(N-1)/N n/k bytes per rank instead of 2(p-1)/p n:

      t = 2(k-1) alpha_intra + 2 (k-1)/k n / B_intra          reduce-scatter + all-gather
        + 2(N-1) alpha_inter + 2 (N-1)/N (n/k) / B_inter      ring across nodes

  (``costs.hierarchical_time``; bytes each rank sends across nodes:
  ``costs.hierarchical_inter_bytes``, exactly per rank: ``costs.hierarchical_link_bytes``).
  With N=2, k=4 and B_inter = B_intra / 8 that is 0.44 n / B_inter against the flat ring's
  1.75 n / B_inter: 4x less time on the wire.

Built on ``comm.split``: the node layout and the sub-communicators come from
``topology.topology_of(comm)`` (the emulated network, ``LOCAL_WORLD_SIZE``, else one node),
made once and kept on ``comm.topology``. Nodes of unequal size: with k the smallest node's
size, local ranks k, k+1, ... of a bigger node first fold onto local rank i % k (send their
tensor, get the result back at the end: 2n more bytes on the fast link), as MPICH folds a
world size that is not a power of two. Every element's final value is computed on one rank
and copied to the others, so every rank ends with the same bits.
"""

from __future__ import annotations

import torch

from . import ops
from .allreduce import ring, ring_all_gather, ring_reduce_scatter
from .tags import TAG, chunk_bounds
from .topology import topology_of

_TAG = TAG["ring"]  # the sub-communicators carry nothing else, so any tag would do


def hierarchical(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce-scatter in the node, ring all_reduce of my 1/k across nodes, all-gather in the
    node; in place. Cost and bytes: module docstring."""
    groups = topology_of(comm).groups()
    try:
        if groups.active is None:
            _fold_out(groups, x)
        else:
            _fold_in(groups, x, op)
            _two_level(groups, x, op)
            _unfold(groups, x)
    finally:
        groups.charge()
    return x


def _two_level(groups, x: torch.Tensor, op: str) -> None:
    node, k = groups.active, groups.active.world_size
    bounds = chunk_bounds(x.numel(), k)
    if k > 1:
        ring_reduce_scatter(node, x, bounds, op, _TAG)
    mine = x[bounds[node.rank]:bounds[node.rank + 1]]
    if groups.cross.world_size > 1:
        ring(groups.cross, mine, op)
    if k > 1:
        ring_all_gather(node, x, bounds, _TAG)


def _extras(groups) -> range:
    """Local ranks of my node that fold onto me (none when every node has k ranks)."""
    topo = groups.topology
    k, size = topo.per_node, len(topo.members[topo.node])
    return range(topo.local_rank + k, size, k)


def _fold_out(groups, x: torch.Tensor) -> None:
    """A rank beyond the first k of its node: hand my tensor to local rank i % k, then
    receive the result from it."""
    partner = groups.node.rank % groups.topology.per_node
    groups.node.collective.send(x, partner, _TAG)
    groups.node.collective.recv(x, partner, _TAG)


def _fold_in(groups, x: torch.Tensor, op: str) -> None:
    extras = _extras(groups)
    if not extras:
        return
    buf = torch.empty_like(x)
    for e in extras:  # in rank order: the same rounding on every run
        groups.node.collective.recv(buf, e, _TAG)
        ops.combine(x, buf, op, out=x)


def _unfold(groups, x: torch.Tensor) -> None:
    for req in [groups.node.collective.isend(x, e, _TAG) for e in _extras(groups)]:
        req.wait()


def topology_ring(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """The ring all_reduce around the ranks in node order (``Topology.ring_order``): only
    ``nodes`` hops cross nodes. Bytes: the ring's, ``costs.ring_bytes`` at this rank's
    place in that order; time: ``ring`` with the crossing hops paying the inter-node link."""
    groups = topology_of(comm).groups()
    try:
        ring(groups.ring, x, op)
    finally:
        groups.charge()
    return x
