"""Gradient buckets: which parameters share one reduction, and how gradients get into a
bucket and back out of it.

Why buckets, and why in reverse registration order: see ``scheduler.py`` (Li et al., VLDB
2020). A bucket has one of two layouts, chosen per bucket from the reduction's
``needs_flat`` (``reductions.py``):

* flat: each gradient is copied into its slot of ``bucket.buffer`` when it is ready, the
  reduction works on the buffer, and the result is copied back into ``param.grad``;
* in place: the gradients stay in ``param.grad`` and the reduction works on them where they
  lie (``bucket.grads``), which saves two passes over every gradient.

A reduction can ignore the difference by reducing ``bucket.grads``: the slot views of the
buffer in the flat layout, the gradients themselves (or zero stand-ins) in place::

    class Summing(BucketReduction):
        def needs_flat(self, bucket): return False
        def reduce(self, comm, bucket): all_reduce_coalesced(comm, bucket.grads, op="sum")
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_reduce


class Bucket:
    """One flat buffer holding the gradients of a few parameters, reduced together.

    A reduction (or comm hook) receives the Bucket: ``bucket.buffer`` (the flat gradients),
    ``bucket.grads`` (the tensors to reduce in place, in slot order), ``bucket.flat`` (the
    layout), ``bucket.index`` (its position in the reduction order, stable across steps, for
    per-bucket state such as error feedback), ``bucket.params`` and ``bucket.names``."""

    def __init__(self, index: int, params: list[nn.Parameter], names: list[str],
                 members: list[int]):
        self.index, self.params, self.names = index, params, names
        self.members = members  # the parameters' positions in registration order
        sizes = [p.numel() for p in params]
        self.buffer = torch.zeros(sum(sizes), dtype=params[0].dtype, device=params[0].device)
        self.views = [chunk.view_as(p) for chunk, p in zip(self.buffer.split(sizes), params)]
        self.flat = True  # the layout; the scheduler sets it from its reduction
        self.grads: list[torch.Tensor] = self.views  # what an in-place reduction reduces
        self.temps: dict[int, torch.Tensor] = {}  # slot k -> stand-in for a missing .grad

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def __repr__(self) -> str:
        layout = "flat" if self.flat else "in place"
        return f"Bucket({self.index}, {len(self.params)} params, {self.nbytes} bytes, {layout})"

    # -- flat layout: in and out of the buffer ----------------------------------------------
    def copy_in(self, k: int, divisor: int = 1, as_view: bool = False) -> None:
        """Put slot ``k``'s gradient into the buffer, divided by ``divisor`` on the way (the
        default average divides by p here, as torch does: the all-reduce then just sums).
        ``as_view``: from now on autograd accumulates straight into the slot."""
        p, view = self.params[k], self.views[k]
        if p.grad is None:  # an unused parameter contributes zeros
            view.zero_()
        elif p.grad.data_ptr() == view.data_ptr():  # autograd accumulated into the slot
            if divisor > 1:
                view.div_(divisor)
        else:
            if divisor > 1:
                torch.div(p.grad, divisor, out=view)
            else:
                view.copy_(p.grad)
            if as_view:
                p.grad = view

    # -- either layout: what to reduce, and writing the result back -------------------------
    def gather(self, unused: set[int]) -> list[torch.Tensor]:
        """Point ``self.grads`` at the tensors a reduction should reduce in place: the slot
        views (flat), or each ``param.grad`` where it lies, with a zero stand-in for a
        missing one and a contiguous copy for an unused or non-contiguous one (written back
        by ``write_back``). ``unused``: registration indices the forward did not reach."""
        self.temps = {}
        if self.flat:
            self.grads = self.views
            return self.grads
        grads = []
        for k, (i, p) in enumerate(zip(self.members, self.params)):
            g = p.grad
            if g is None or i in unused or not g.is_contiguous():
                g = torch.zeros_like(p) if g is None else g.contiguous().clone()
                self.temps[k] = g
            grads.append(g)
        self.grads = grads
        return grads

    def write_back(self, skip: set[int], as_view: bool = False) -> None:
        """Make ``param.grad`` hold the reduced values, except for the registration indices
        in ``skip`` (parameters no rank used keep their ``.grad``, as in PyTorch)."""
        if not self.flat:
            for k, g in self.temps.items():
                p = self.params[k]
                if self.members[k] in skip:
                    continue
                if p.grad is None:
                    p.grad = g.view_as(p)
                else:
                    p.grad.copy_(g.view_as(p))
            self.temps = {}
            return
        for i, p, view in zip(self.members, self.params, self.views):
            if i in skip:
                continue
            if p.grad is None:
                p.grad = view if as_view else view.clone()
            elif p.grad.data_ptr() != view.data_ptr():
                p.grad.copy_(view)


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
