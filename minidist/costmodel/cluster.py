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
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..transports.network import Link

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes of one value

# Fitted once, on Megatron-LM's Table 1 first row (1.7B, 32 GPUs, data parallel only: the
# row where the model has the least to predict beyond compute), and then used for every
# row and plan: ``validation.calibrated_efficiency()`` recomputes it (a test checks).
A100_EFFICIENCY = 0.4735

NVLINK3 = Link(alpha=3e-6, bandwidth=300e9, name="NVLink 3 (A100)")


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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"Cluster {name} must be a positive integer, got {value!r}")
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
                   {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}, 80e9, efficiency,
                   f"{nodes} x DGX A100 80GB (NVLink 3, HDR InfiniBand)")

    @classmethod
    def dgx_h100(cls, nodes: int, efficiency: float = A100_EFFICIENCY) -> Cluster:
        """The A100's efficiency is assumed, not measured, for the H100."""
        return cls(nodes, 8, Link.nvlink4(), Link.infiniband_ndr(),
                   {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, 80e9, efficiency,
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
