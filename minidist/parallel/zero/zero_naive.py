"""ZeRO stage 1 written plainly: whole tensors per rank, no flat buffer.

This is the version one writes first, and what ``torch.distributed.optim.
ZeroRedundancyOptimizer`` does: give each parameter *tensor* to one rank (greedily, the
largest first to the least loaded rank, so the ranks hold about equal bytes), let that rank
alone keep its optimizer state and update it, then broadcast it from its owner::

    for p in params: all_reduce(p.grad, op="avg")          # every rank: the full gradient
    optimizer.step()                                        # only over the tensors I own
    for p in params: broadcast(p, src=owner[p])             # everyone gets the new values

Why the flat version (``zero_optimizer.ZeRO``) beside it: here the balance is only as good
as the tensor sizes allow (one huge embedding on one rank), it sends one message per
tensor (p latencies each), and the all-reduce plus broadcasts move 2 Psi + Psi = 3 Psi per
rank against 2 Psi for reduce-scatter + all-gather. It is the right tool when the
optimizer needs whole tensors (LAMB's and LARS's per-tensor norms), which a flat shard
cannot give.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_reduce, broadcast


def assign_owners(params: list[nn.Parameter], world_size: int) -> list[int]:
    """Owner rank of each parameter: largest first, to the rank holding the fewest elements
    so far (ties to the lower rank), as ZeroRedundancyOptimizer partitions."""
    load = [0] * world_size
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class ShardedOptimizerNaive:
    """Stage 1 by whole tensors: ``opt = ShardedOptimizerNaive(model.parameters(), comm,
    torch.optim.AdamW, lr=1e-3)``; after ``loss.backward()`` call ``opt.step()``. The
    parameters must start equal on every rank (broadcast them, or seed alike)."""

    def __init__(self, params, comm, optimizer_class: type = torch.optim.AdamW, **kwargs):
        if not (isinstance(optimizer_class, type)
                and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError("optimizer_class must be a torch.optim.Optimizer subclass, got "
                            f"{optimizer_class!r}")
        self.comm = comm
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ShardedOptimizerNaive needs at least one parameter that "
                             "requires a gradient")
        self.owner = assign_owners(self.params, comm.world_size)
        mine = [p for p, r in zip(self.params, self.owner) if r == comm.rank]
        # a rank that owns no tensor (more ranks than tensors) still steps nothing
        self.optimizer = optimizer_class(mine or [nn.Parameter(torch.zeros(0))], **kwargs)

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            all_reduce(self.comm, p.grad, op="avg")
        self.optimizer.step()
        for p, r in zip(self.params, self.owner):
            broadcast(self.comm, p.data, src=r)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
