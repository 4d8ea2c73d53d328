"""Gradient buckets: which parameters share one all-reduce, and the default comm hook.

Why buckets, and why in reverse registration order: see ``reducer.py`` (Li et al., VLDB 2020).
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_reduce


class Bucket:
    """One flat buffer holding the gradients of a few parameters, reduced by one all-reduce.

    A comm hook receives the Bucket: ``bucket.buffer`` (the flat gradients), ``bucket.index``
    (its position in the reduction order, stable across steps, for per-bucket state such as
    error feedback), ``bucket.params`` and ``bucket.names``."""

    def __init__(self, index: int, params: list[nn.Parameter], names: list[str],
                 members: list[int]):
        self.index, self.params, self.names = index, params, names
        self.members = members  # the parameters' positions in registration order
        sizes = [p.numel() for p in params]
        self.buffer = torch.zeros(sum(sizes), dtype=params[0].dtype, device=params[0].device)
        self.views = [chunk.view_as(p) for chunk, p in zip(self.buffer.split(sizes), params)]
        self.temps: dict[int, torch.Tensor] = {}  # slot k -> stand-in for a missing .grad

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def __repr__(self) -> str:
        return f"Bucket({self.index}, {len(self.params)} params, {self.nbytes} bytes)"


def assign_buckets(params: list[torch.Tensor], cap_bytes: float) -> list[list[int]]:
    """Group parameter indices into buckets: reverse registration order, one dtype and device
    per bucket, a bucket closed once it holds ``cap_bytes`` or more (so a parameter larger
    than the cap gets a bucket of its own), as ``_compute_bucket_assignment_by_size`` does."""
    open_buckets: dict[tuple, tuple[list[int], int]] = {}
    buckets: list[list[int]] = []
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, p.device)
        members, size = open_buckets.pop(key, ([], 0))
        members.append(i)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:
            buckets.append(members)
        else:
            open_buckets[key] = (members, size)
    buckets.extend(members for members, _ in open_buckets.values())
    # a bucket is complete when its first-registered parameter has its gradient: reduce the
    # buckets in the order backward completes them (torch sorts by minimum index too)
    return sorted(buckets, key=lambda members: -min(members))


def allreduce_hook(comm, bucket: Bucket, algorithm: str = "auto") -> torch.Tensor:
    """What DDP does without a hook, written as one (torch's ``allreduce_hook``): divide by
    the world size, then sum over the ranks (dividing first keeps float16 sums in range).

    A comm hook gets the bucket with each rank's own gradients and returns the averaged
    tensor (same shape and dtype as ``bucket.buffer``, or ``bucket.buffer`` itself), so a
    compressor can reduce something smaller and return its decompressed result."""
    bucket.buffer.div_(comm.world_size)
    all_reduce(comm, bucket.buffer, op="sum", algorithm=algorithm)
    return bucket.buffer
