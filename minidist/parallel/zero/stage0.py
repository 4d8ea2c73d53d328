"""ZeRO stage 0: plain data parallelism on the flat buffer, the baseline the stages shrink.

Nothing is sharded. Every rank holds the whole model's parameters, gradients and optimizer
state, (2 + 2 + K) Psi bytes, all-reduces the gradients and applies the same update to all
of it, as ``md.DistributedDataParallel`` does; only the layout is ZeRO's (one padded flat
buffer, ``flat_shards.py``), so that the four stages differ in what they shard and nothing
else::

    flat       [ every parameter end to end, padded to a multiple of p ]
    step:      g = all_reduce(flat gradient, avg)   every rank: the whole average
               optimizer.step()                      every rank: the whole update

Communication: one all-reduce, 2 Psi per step on a ring (``costmodel/zero.py`` counts it as the
reduce-scatter plus all-gather a ring does). Stage 1 (``stage1.py``) moves the same bytes
and keeps 1/p of the optimizer state; this file is stage 1's line for line, so that
``diff stage0.py stage1.py`` shows exactly what sharding the optimizer state changes.

``ZeRO.__init__`` (``zero_optimizer.py``) checks the arguments, gives every rank rank 0's
parameters, calls ``_shard`` below, and builds the optimizer over ``self.shards``.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_reduce
from .flat_shards import (
    flat_gradients,
    flat_parameters,
    group_parameters,
    point_grads_at,
    take_grads,
)
from .grad_buckets import BackwardCounter
from .zero_optimizer import ZeRO


class ZeROStage0(ZeRO):
    """ZeRO stage 0: ``md.ZeRO(module, comm, stage=0, ...)``; the arguments are ``ZeRO``'s."""

    stage = 0

    def _shard(self, params: list[nn.Parameter], **_other_stages_options) -> None:
        """One group (the whole model); the optimizer's parameter is the whole flat buffer."""
        everything = [list(range(len(params)))]
        self.groups = group_parameters(params, everything, self.comm.world_size,
                                       self.comm.rank)
        self.flats = flat_parameters(self.groups)  # the module's parameters: views of these
        self.shards = [nn.Parameter(flat) for flat in self.flats]  # not sharded: all of it
        self.flat_grads = flat_gradients(self.groups)  # every param.grad: a view of these
        self.grad_sync = BackwardCounter([p for g in self.groups for p in g.params])

    @torch.no_grad()
    def step(self) -> None:
        """All-reduce the gradients, update the whole model (the same on every rank)."""
        with self._stepping():
            for g, flat_grad, shard in zip(self.groups, self.flat_grads, self.shards):
                take_grads(g, flat_grad)
                shard.grad = all_reduce(self.comm, flat_grad, op="avg") if g.padded \
                    else flat_grad
            self.optimizer.step()

    def zero_grad(self) -> None:
        """Zero the full flat gradient buffer, every ``param.grad`` a view of it again."""
        for g, flat in zip(self.groups, self.flat_grads):
            flat.zero_()
            point_grads_at(g, flat)

    def _gradient_buffers(self) -> list[torch.Tensor]:
        """The gradients this stage keeps: one full flat buffer per group."""
        return self.flat_grads
