"""A cluster described by numbers: nodes of GPUs, their FLOP/s and memory, and two links.

Ranks are numbered as torchrun does: rank r sits on node r // per_node. A plan's mesh is
row-major (dp, pp, tp), tp fastest (as ``md.DeviceMesh`` and Megatron-LM), so a group along
a dimension is ``size`` ranks ``stride`` apart (tp: stride 1; pp: stride tp; dp: stride
pp tp) and uses the ``inter`` link as soon as it spans two nodes: the PTD-P rule of keeping
tp inside a node falls out of the numbers.

Compute: a GPU sustains ``efficiency`` x its datasheet peak on the model's matrix products
(the peak depends on the precision). One efficiency per cluster, never per model or plan:
it stands for everything the cost model does not see (kernel launch, memory-bound
element-wise work, imperfect GEMM shapes, optimizer step, data loading).

Figures (one direction, per GPU):

* DGX A100 (NVIDIA A100 Tensor Core GPU datasheet; DGX A100 user guide): 312 TFLOP/s dense
  bf16/fp16, 19.5 TFLOP/s fp32, 80 GB; NVLink 3, 600 GB/s both directions = 300 GB/s each
  way; eight 200 Gb/s HDR InfiniBand ports per node, one per GPU (``Link.infiniband_hdr``).
  NVIDIA's Selene, where Megatron-LM's Table 1 ran, is built of these.
* DGX H100 (NVIDIA H100 Tensor Core GPU datasheet, SXM): 989 TFLOP/s dense bf16/fp16,
  67 TFLOP/s fp32, 80 GB; NVLink 4 (``Link.nvlink4``); one 400 Gb/s NDR port per GPU
  (``Link.infiniband_ndr``).

All_reduce on such a cluster (the second half of this module): each path's time when the
hops that cross nodes pay the inter-node link, and a comparison on clusters described with
real link figures.

A path is a list of rounds; in a round some pairs of ranks exchange messages of m bytes at
once, each rank on its own ports (one NIC per GPU, as on a DGX, and as the emulated network
models it), so the round takes as long as its slowest hop: max over its pairs of
alpha + m / B, with (alpha, B) the intra-node link for a pair on one node and the inter-node
link otherwise. Summed over the rounds (Hockney's alpha-beta model, as in ``collectives.py``):

* ring: 2(p-1) rounds of n/p; if any hop crosses nodes every round pays the inter link:
  2(p-1) (alpha_inter + n/p / B_inter). ``topology_ring`` is the same when the ranks of a
  node are already neighbours; over ranks placed round-robin, rank order crosses at every
  hop and node order at only N, which changes the bytes on the slow link, not the time of a
  round (the slowest hop still sets it);
* tree (binomial): 2 ceil(lg p) rounds of n; a round pays the inter link once its partners
  are 2^d >= k apart (block placement);
* recursive doubling, halving-doubling: their rounds (and the folding rounds) likewise;
* naive: rank 0 receives and sends p-1 messages of n one after the other;
* hierarchical: ring rounds inside the node, then across it:
  ``collectives.hierarchical_time`` for equal nodes (the tests check the two agree), plus
  two rounds of n to fold bigger nodes.

``auto`` (``minidist/collectives/auto.py``) chooses with these on an emulated cluster
network of two or more nodes. ``compare_all_reduce`` and ``cluster_table`` compare flat
ring, tree and hierarchical on the named ``CLUSTERS`` (figures and sources in
``transports/network.py``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..checks import positive_int
from ..collectives.topology import group_by_node, node_order
from ..transports.network import Link

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes of one value

# Fitted once, on Megatron-LM's Table 1 first row (1.7B, 32 GPUs, data parallel only: the
# row where the model has the least to predict beyond compute), and then used for every
# row and plan: ``validation.calibrated_efficiency()`` recomputes it (a test checks).
A100_EFFICIENCY = 0.4735

NVLINK3 = Link(alpha=3e-6, bandwidth=300e9, name="NVLink 3 (A100)")
# Datasheet peak FLOP/s per GPU by precision (dense; see the module docstring). One place:
# ``md.Compute.a100()`` / ``h100()`` (``transports/compute.py``) import them.
A100_PEAK_FLOPS = {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}
H100_PEAK_FLOPS = {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}


def check_precision(precision) -> str:
    if precision not in PRECISION_BYTES:
        raise ValueError(f"unknown precision {precision!r}; known: "
                         f"{', '.join(PRECISION_BYTES)}")
    return precision


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``per_node`` GPUs, ``intra`` link inside a node, ``inter``
    between nodes; ``peak_flops``: datasheet FLOP/s per GPU by precision; ``memory``: bytes
    per GPU; ``efficiency``: the share of peak the matrix products sustain."""

    nodes: int
    per_node: int
    intra: Link
    inter: Link
    peak_flops: Mapping[str, float] = field(hash=False)
    memory: float
    efficiency: float = 1.0
    name: str = ""

    def __post_init__(self) -> None:
        for name in ("nodes", "per_node"):
            positive_int(getattr(self, name), f"Cluster {name}")
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), Link):
                raise TypeError(f"Cluster {name} must be an md.Link, got "
                                f"{type(getattr(self, name)).__name__}")
        if not isinstance(self.peak_flops, Mapping) or not self.peak_flops:
            raise ValueError(f"Cluster peak_flops must map precisions to FLOP/s, got "
                             f"{self.peak_flops!r}")
        for precision, flops in self.peak_flops.items():
            check_precision(precision)
            if not flops > 0:
                raise ValueError(f"Cluster peak_flops[{precision!r}] must be > 0, got {flops!r}")
        if not (self.memory > 0 and 0 < self.efficiency <= 1):
            raise ValueError(f"Cluster needs memory > 0 bytes and 0 < efficiency <= 1, got "
                             f"memory={self.memory!r}, efficiency={self.efficiency!r}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.per_node

    def flops(self, precision: str = "bf16") -> float:
        """Sustained FLOP/s of one GPU: peak at ``precision`` x efficiency."""
        if check_precision(precision) not in self.peak_flops:
            raise ValueError(f"cluster {self.name or ''} gives no peak FLOP/s for "
                             f"{precision!r}; it has {', '.join(self.peak_flops)}")
        return self.peak_flops[precision] * self.efficiency

    def link(self, size: int, stride: int) -> Link:
        """The link a group of ``size`` ranks ``stride`` apart waits on: ``inter`` if any
        such group spans two nodes, else ``intra``."""
        return self.inter if spans_nodes(size, stride, self.per_node, self.gpus) else \
            self.intra

    def with_nodes(self, nodes: int) -> Cluster:
        return replace(self, nodes=nodes)

    @classmethod
    def dgx_a100(cls, nodes: int, efficiency: float = A100_EFFICIENCY) -> Cluster:
        return cls(nodes, 8, NVLINK3, Link.infiniband_hdr(),
                   dict(A100_PEAK_FLOPS), 80e9, efficiency,
                   f"{nodes} x DGX A100 80GB (NVLink 3, HDR InfiniBand)")

    @classmethod
    def dgx_h100(cls, nodes: int, efficiency: float = A100_EFFICIENCY) -> Cluster:
        """The A100's efficiency is assumed, not measured, for the H100."""
        return cls(nodes, 8, Link.nvlink4(), Link.infiniband_ndr(),
                   dict(H100_PEAK_FLOPS), 80e9, efficiency,
                   f"{nodes} x DGX H100 (NVLink 4, NDR InfiniBand)")

    @classmethod
    def this_machine(cls, ranks: int, flops_per_rank: float, alpha: float, beta: float,
                     memory: float = 16e9) -> Cluster:
        """``ranks`` processes on one machine: each computes at ``flops_per_rank`` (measured
        with that many ranks busy at once, so that sharing the cores is in the figure) and
        every message costs alpha + n / beta (fitted), whoever the peers are."""
        link = Link(alpha=alpha, bandwidth=beta, name="this machine (fitted)")
        peak = {"fp32": flops_per_rank, "bf16": flops_per_rank, "fp16": flops_per_rank}
        return cls(1, ranks, link, link, peak, memory, 1.0, f"this machine: {ranks} ranks")


@functools.lru_cache(maxsize=4096)
def spans_nodes(size: int, stride: int, per_node: int, world: int) -> bool:
    """Whether some group {base + k stride : k < size} of the row-major mesh has ranks on two
    nodes (rank r on node r // per_node). Bases are the ranks whose index along the group's
    dimension is 0."""
    if size == 1:
        return False
    last = (size - 1) * stride
    return any(b // per_node != (b + last) // per_node
               for b in range(world) if (b // stride) % size == 0)


def nodes_for(gpus: int, per_node: int = 8) -> int:
    """Nodes of ``per_node`` GPUs that hold ``gpus`` GPUs."""
    return math.ceil(gpus / per_node)


DIMS = ("dp", "pp", "tp")


def crossing_dims(layout: tuple[int, int, int], per_node: int) -> tuple[str, ...]:
    """The dimensions of the row-major (dp, pp, tp) mesh whose groups span two nodes of
    ``per_node`` GPUs: tp's groups are adjacent ranks, pp's ``tp`` apart, dp's ``pp tp``."""
    dp, pp, tp = layout
    groups = {"dp": (dp, pp * tp), "pp": (pp, tp), "tp": (tp, 1)}
    return tuple(d for d in DIMS if spans_nodes(*groups[d], per_node, dp * pp * tp))


# --- all_reduce on a cluster of nodes: every hop pays the link it crosses --------------

PATHS = ("naive", "tree", "ring", "recursive_doubling", "halving_doubling", "hierarchical",
         "topology_ring")

Round = tuple[float, list[tuple[int, int]]]  # (bytes per message, pairs (src, dst))


def _ring_rounds(n: float, order: Sequence[int]) -> Iterator[Round]:
    p = len(order)
    hops = [(order[i], order[(i + 1) % p]) for i in range(p)]
    for _ in range(2 * (p - 1)):
        yield n / p, hops


def _tree_rounds(n: float, p: int) -> Iterator[Round]:
    up = [[(v + d, v) for v in range(0, p, 2 * d) if v + d < p]
          for d in (1 << i for i in range((p - 1).bit_length()))]
    for pairs in up + [[(b, a) for a, b in pairs] for pairs in reversed(up)]:
        yield n, pairs


def _fold_pairs(p: int) -> tuple[int, list[tuple[int, int]]]:
    pp = 1 << (p.bit_length() - 1)
    return pp, [(2 * i, 2 * i + 1) for i in range(p - pp)]


def _doubling_rounds(n: float, p: int, halving: bool) -> Iterator[Round]:
    """Recursive doubling (whole n every round) or halving-doubling (n d / p' per round),
    folded onto p' = 2^floor(lg p) as ``allreduce._fold`` does."""
    pp, fold = _fold_pairs(p)
    real = [2 * v + 1 if v < p - pp else v + p - pp for v in range(pp)]
    ds = [1 << i for i in range(pp.bit_length() - 1)]
    sizes = [(d, n * d / pp) for d in reversed(ds)] + [(d, n * d / pp) for d in ds] \
        if halving else [(d, n) for d in ds]
    if fold:
        yield n, fold
    for d, m in sizes:
        yield m, [(real[v], real[v ^ d]) for v in range(pp)]
    if fold:
        yield n, [(b, a) for a, b in fold]


def _naive_rounds(n: float, p: int) -> Iterator[Round]:
    for src in range(1, p):
        yield n, [(src, 0)]
    for dst in range(1, p):
        yield n, [(0, dst)]


def _hierarchical_rounds(n: float, node_of: Sequence[int]) -> Iterator[Round]:
    members = group_by_node(node_of)
    k, nodes = min(len(m) for m in members), len(members)
    fold = [(m[i], m[i % k]) for m in members for i in range(k, len(m))]
    if fold:
        yield n, fold
    in_node = [(m[i], m[(i + 1) % k]) for m in members for i in range(k)]
    across = [(members[j][i], members[(j + 1) % nodes][i])
              for i in range(k) for j in range(nodes)]
    yield from [(n / k, in_node)] * (k - 1)  # reduce-scatter inside every node at once
    yield from [(n / k / nodes, across)] * (2 * (nodes - 1))  # every local rank's ring
    yield from [(n / k, in_node)] * (k - 1)  # all-gather inside every node
    if fold:
        yield n, [(b, a) for a, b in fold]


def rounds(name: str, n: float, node_of: Sequence[int]) -> Iterator[Round]:
    """The rounds of all_reduce path ``name`` (``PATHS``) on n bytes, ranks on ``node_of``."""
    p = len(node_of)
    if name == "ring":
        return _ring_rounds(n, range(p))
    if name == "topology_ring":
        return _ring_rounds(n, node_order(node_of))
    if name == "tree":
        return _tree_rounds(n, p)
    if name in ("recursive_doubling", "halving_doubling"):
        return _doubling_rounds(n, p, name == "halving_doubling")
    if name == "naive":
        return _naive_rounds(n, p)
    if name == "hierarchical":
        return _hierarchical_rounds(n, node_of)
    raise ValueError(f"no two-level cost for {name!r}; known: {', '.join(PATHS)}")


def cluster_time(name: str, n: float, node_of: Sequence[int], intra: Link,
                 inter: Link) -> float:
    """Seconds for path ``name`` on n bytes: each round's slowest hop, summed (module
    docstring). ``node_of[r]``: rank r's node."""
    if n < 0:
        raise ValueError(f"size n must be >= 0 bytes, got {n!r}")
    if len(node_of) < 2:
        return 0.0
    return sum(max((intra if node_of[a] == node_of[b] else inter).time(m) for a, b in pairs)
               for m, pairs in rounds(name, n, node_of) if pairs)


def cross_node_bytes(name: str, n: float, node_of: Sequence[int]) -> float:
    """Bytes that cross nodes in all, summed over every rank (what the slow links carry)."""
    return sum(m * sum(node_of[a] != node_of[b] for a, b in pairs)
               for m, pairs in rounds(name, n, node_of))


def block_layout(nodes: int, per_node: int) -> list[int]:
    """Rank r on node r // per_node (torchrun's numbering)."""
    positive_int(nodes, "nodes"), positive_int(per_node, "per_node")
    return [r // per_node for r in range(nodes * per_node)]


def compare_all_reduce(n_bytes: float, nodes: int, per_node: int, intra: Link, inter: Link,
                       paths: Sequence[str] = ("ring", "tree", "halving_doubling",
                                               "hierarchical")) -> dict[str, float]:
    """Predicted seconds of each all_reduce path for ``n_bytes`` on ``nodes`` nodes of
    ``per_node`` ranks (block placement) joined by ``intra`` and ``inter`` links."""
    for what, link in (("intra", intra), ("inter", inter)):
        if not isinstance(link, Link):
            raise TypeError(f"{what} must be an md.Link, got {type(link).__name__}")
    layout = block_layout(nodes, per_node)
    return {name: cluster_time(name, n_bytes, layout, intra, inter) for name in paths}


CLUSTERS = {  # name -> (nodes, per_node, intra, inter): figures in transports/network.py
    # (NVLink 3 in the module docstring)
    "8x H100, NVLink 4 + IB NDR": (8, 8, Link.nvlink4(), Link.infiniband_ndr()),
    "8x A100, NVLink 3 + IB HDR": (8, 8, NVLINK3, Link.infiniband_hdr()),
    "4x 8 GPUs, PCIe 4 + 100 GbE": (4, 8, Link.pcie4_x16(), Link.ethernet_100g()),
    "4x 4 GPUs, PCIe 4 + 25 GbE": (4, 4, Link.pcie4_x16(), Link.ethernet_25g()),
}


def cluster_table(n_bytes: float = 1 << 30, clusters: dict | None = None) -> list[dict]:
    """One row per cluster: predicted seconds of ring, tree, halving-doubling and
    hierarchical for ``n_bytes`` (default 1 GiB, a 500M-parameter model's fp16 gradients),
    and hierarchical's speed-up over the ring."""
    rows = []
    for name, (nodes, k, intra, inter) in (clusters or CLUSTERS).items():
        t = compare_all_reduce(n_bytes, nodes, k, intra, inter)
        rows.append({"cluster": name, "ranks": nodes * k, **t,
                     "best": min(t, key=t.get), "ring / hierarchical": t["ring"] /
                     t["hierarchical"]})
    return rows
