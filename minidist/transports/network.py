"""Describing a network to emulate: links (latency, bandwidth) and which ranks share a node.

A ``Link`` is the alpha-beta model of one hop: a message of n bytes takes

    alpha + n / bandwidth        (alpha in seconds, bandwidth in bytes per second)

A ``Network`` says which link joins two ranks. ``Network.uniform(link)`` joins every pair of
ranks through the same link (every rank a node of its own: a flat switched network).
``Network.cluster(nodes, per_node, intra, inter)`` puts rank r on node r // per_node (as
torchrun numbers ranks): ranks on one node talk over ``intra`` (NVLink, PCIe), ranks on
different nodes over ``inter`` (InfiniBand, Ethernet). ``placement="round_robin"`` puts rank
r on node r % nodes instead (as a scheduler that deals ranks out one node at a time does), or
pass one node per rank; a ring in rank order then crosses nodes at every hop, which is what
topology-aware ring ordering (``collectives/topology.py``) repairs. Each rank has one egress
and one ingress port per link class (one NIC per GPU, as on a DGX); how messages share them
is in ``emulated.py``.

``compute=md.Compute(...)`` (``compute.py``) says how fast the described devices compute:
under ``md.launch(..., clock="virtual")`` a rank's computation is then charged as the FLOPs
it ran at that rate (without it, as its CPU time). It is part of the network's description:
the described cluster's devices, not this machine's.

Only the description lives here; ``md.launch(fn, n, network=net)`` runs it. The named links
are rough public figures, one direction of one GPU's or one NIC's port; real software adds
latency on top, and a laptop cannot emulate a link faster than its own memory copies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import positive_int
from .compute import Compute

INTRA, INTER = 0, 1  # link classes: each rank has one egress and one ingress port per class


def _si(x: float, unit: str) -> str:
    """``20e9, "B/s"`` -> ``"20 GB/s"``; ``5e-6, "s"`` -> ``"5 µs"``: readable in a notebook."""
    if math.isinf(x):
        return f"inf {unit}"
    prefixes = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""),
                (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
    for scale, p in prefixes:
        if abs(x) >= scale:
            return f"{x / scale:.4g} {p}{unit}"
    return f"{x:.3g} {unit}"


@dataclass(frozen=True, repr=False)
class Link:
    """One hop: ``alpha`` seconds of latency, ``bandwidth`` bytes per second.

    ``bandwidth=math.inf`` makes a latency-only link; ``name`` is a label for display.
    """

    alpha: float
    bandwidth: float
    name: str = ""

    def __post_init__(self):
        for field, value in (("alpha", self.alpha), ("bandwidth", self.bandwidth)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Link {field} must be a number, got {type(value).__name__}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"Link alpha is a latency in seconds and must be finite and >= 0, "
                             f"got {self.alpha}")
        if not self.bandwidth > 0:  # also rejects NaN
            raise ValueError(f"Link bandwidth is in bytes per second and must be > 0, "
                             f"got {self.bandwidth}; for a link with latency only, pass "
                             "bandwidth=math.inf")

    def time(self, nbytes: float) -> float:
        """Seconds for one message of ``nbytes`` on an idle link: alpha + n / bandwidth."""
        return self.alpha + nbytes / self.bandwidth

    def __repr__(self) -> str:
        label = f", {self.name!r}" if self.name else ""
        return f"Link(alpha={_si(self.alpha, 's')}, bandwidth={_si(self.bandwidth, 'B/s')}{label})"

    # Named links: per direction, per GPU or per port, from vendor figures. alpha is a
    # typical small-message latency with the usual software stack (NCCL, MPI, TCP).
    @classmethod
    def nvlink4(cls) -> Link:
        """H100 SXM: 18 NVLink 4 links, 900 GB/s in both directions together per GPU (NVIDIA
        H100 Tensor Core GPU datasheet), so 450 GB/s each way; NCCL latency a few µs."""
        return cls(alpha=3e-6, bandwidth=450e9, name="NVLink 4 (H100)")

    @classmethod
    def pcie4_x16(cls) -> Link:
        """PCIe 4.0 (PCI-SIG PCI Express Base Specification 4.0): 16 GT/s per lane,
        128b/130b coding, so 16 lanes carry ~31.5 GB/s each way."""
        return cls(alpha=5e-6, bandwidth=31.5e9, name="PCIe 4.0 x16")

    @classmethod
    def infiniband_hdr(cls) -> Link:
        """InfiniBand HDR (IBTA specification 1.4; NVIDIA ConnectX-6 datasheet): 200 Gb/s per
        port = 25 GB/s; MPI ping-pong latency ~1-2 µs."""
        return cls(alpha=2e-6, bandwidth=25e9, name="InfiniBand HDR")

    @classmethod
    def infiniband_ndr(cls) -> Link:
        """InfiniBand NDR (IBTA specification 1.5; NVIDIA ConnectX-7 datasheet): 400 Gb/s per
        port = 50 GB/s; DGX H100 has one such port per GPU (NVIDIA DGX H100 user guide)."""
        return cls(alpha=2e-6, bandwidth=50e9, name="InfiniBand NDR")

    @classmethod
    def ethernet_25g(cls) -> Link:
        """25 GbE (IEEE 802.3by): 3.125 GB/s on the wire; TCP through the kernel adds tens
        of µs of latency."""
        return cls(alpha=30e-6, bandwidth=3.125e9, name="25 GbE (TCP)")

    @classmethod
    def ethernet_100g(cls) -> Link:
        """100 GbE (IEEE 802.3bj / 802.3cd): 12.5 GB/s on the wire; TCP latency ~10-20 µs
        (RoCE gets a few µs)."""
        return cls(alpha=15e-6, bandwidth=12.5e9, name="100 GbE (TCP)")


@dataclass(frozen=True, repr=False)
class Network:
    """Which link joins two ranks. Build one with ``uniform`` or ``cluster``.

    ``nodes`` is None for ``uniform`` (any number of ranks, one per node). ``placement`` is
    None (rank r on node r // per_node) or the node of each rank. ``compute``: how fast each
    rank's device computes, for virtual time (None: charge CPU time).
    """

    intra: Link
    inter: Link
    per_node: int = 1
    nodes: int | None = None
    placement: tuple[int, ...] | None = None
    compute: Compute | None = None

    def __post_init__(self):
        for field in ("intra", "inter"):
            if not isinstance(getattr(self, field), Link):
                raise TypeError(f"Network {field} must be an md.Link, got "
                                f"{type(getattr(self, field)).__name__}")
        for field in ("per_node", "nodes"):
            value = getattr(self, field)
            if value is None and field == "nodes":
                continue
            positive_int(value, f"Network {field}")
        if self.placement is not None:
            _check_placement(self.placement, self.nodes or 1, self.per_node)
        if self.compute is not None and not isinstance(self.compute, Compute):
            raise TypeError(f"Network compute must be an md.Compute (e.g. md.Compute.a100()) "
                            f"or None, got {type(self.compute).__name__}")

    @classmethod
    def uniform(cls, link: Link, compute: Compute | None = None) -> Network:
        """Every pair of ranks over ``link``; each rank has its own ports (a flat switch)."""
        return cls(intra=link, inter=link, compute=compute)

    @classmethod
    def cluster(cls, nodes: int, per_node: int, intra: Link, inter: Link,
                placement: str | Sequence[int] = "block",
                compute: Compute | None = None) -> Network:
        """``nodes`` machines of ``per_node`` ranks. ``placement``: ``"block"`` (rank r on
        node r // per_node, torchrun's numbering), ``"round_robin"`` (rank r on node
        r % nodes) or a sequence giving each rank's node (each node at most per_node times)."""
        if placement == "block":
            return cls(intra=intra, inter=inter, per_node=per_node, nodes=nodes,
                       compute=compute)
        if placement == "round_robin":
            if isinstance(nodes, int) and isinstance(per_node, int) and nodes * per_node > 0:
                placement = [r % nodes for r in range(nodes * per_node)]
        elif isinstance(placement, str) or not isinstance(placement, Sequence):
            raise ValueError(f"Network placement must be 'block', 'round_robin' or a sequence "
                             f"of node numbers, one per rank; got {placement!r}")
        return cls(intra=intra, inter=inter, per_node=per_node, nodes=nodes,
                   placement=tuple(placement), compute=compute)

    @property
    def max_ranks(self) -> int | None:
        """How many ranks the network holds (None: any number)."""
        return None if self.nodes is None else self.nodes * self.per_node

    def node_of(self, rank: int) -> int:
        """The node rank ``rank`` sits on."""
        if self.placement is not None:
            return self.placement[rank]
        return rank // self.per_node

    def link_class(self, src: int, dst: int) -> int:
        """``INTRA`` (same node) or ``INTER``: which of its ports a message uses."""
        return INTRA if self.node_of(src) == self.node_of(dst) else INTER

    def link(self, src: int, dst: int) -> Link:
        return self.intra if self.link_class(src, dst) == INTRA else self.inter

    def check_world(self, world_size: int) -> None:
        """Raise ValueError unless ``world_size`` ranks fit in this network."""
        held = self.max_ranks if self.placement is None else len(self.placement)
        if held is not None and world_size > held:
            raise ValueError(
                f"world_size={world_size} does not fit {self!r}: its {self.nodes} nodes of "
                f"{self.per_node} ranks hold {held}; launch at most that many ranks "
                "or describe a bigger cluster")

    def __repr__(self) -> str:
        speed = "" if self.compute is None else f", compute={self.compute!r}"
        if self.nodes is None:
            return f"Network.uniform({self.inter!r}{speed})"
        where = "" if self.placement is None else f", placement={list(self.placement)}"
        return (f"Network.cluster(nodes={self.nodes}, per_node={self.per_node}, "
                f"intra={self.intra!r}, inter={self.inter!r}{where}{speed})")


def _check_placement(placement: tuple, nodes: int, per_node: int) -> None:
    """Each entry a node number in [0, nodes), no node holding more than per_node ranks."""
    for r, node in enumerate(placement):
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < nodes:
            raise ValueError(f"Network placement[{r}] must be a node number in 0..{nodes - 1}, "
                             f"got {node!r}")
    for node in set(placement):
        if placement.count(node) > per_node:
            raise ValueError(f"Network placement puts {placement.count(node)} ranks on node "
                             f"{node}, which holds per_node={per_node}")
