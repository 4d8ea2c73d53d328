"""ZeRO stage 1 (P_os): the optimizer state sharded, everything else whole.

Plain data parallelism has every rank keep the optimizer state of the whole model (Adam's
two moments: K bytes per parameter, the largest part) and apply the same update to all of
it. Stage 1 (Rajbhandari et al., SC 2020, section 5.1) gives each rank 1/p of the update
and lets the ranks share the result::

    flat       [ every parameter end to end, padded to a multiple of p ]   (flat_shards.py)
    shard r    rank r's 1/p of flat (a view of it): the optimizer's only parameter
    step:      g_r   = reduce_scatter(flat gradient, avg)   the average of my piece only
               optimizer.step()                              updates my shard (state: 1/p)
               flat  = all_gather(shard)                     everyone gets every new piece

What the module sees stays whole: its parameters are views of ``flat`` (so the all-gather
updates them in place) and its gradients are views of one full flat gradient buffer
(autograd accumulates into it, the reduce-scatter reads it). Memory per rank: 2 Psi of
parameters + 2 Psi of gradients + K Psi / p (ZeRO's 4 Psi + K Psi / Nd); communication
2 Psi per step, the same as one all-reduce: a ring all-reduce *is* a reduce-scatter then an
all-gather, and stage 1 only moves the update in between. ``zero_naive.py`` is the same
stage by whole tensors (``ZeroRedundancyOptimizer``'s way), beside this flat one.

``ZeRO.__init__`` (``zero_optimizer.py``) checks the arguments, gives every rank rank 0's
parameters, calls ``_shard`` below, and builds the optimizer over ``self.shards``.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_gather, reduce_scatter
from .flat_shards import (
    flat_gradients,
    flat_parameters,
    group_parameters,
    point_grads_at,
    take_grads,
)
from .grad_buckets import BackwardCounter
from .zero_optimizer import ZeRO


class ZeROStage1(ZeRO):
    """ZeRO stage 1: ``md.ZeRO(module, comm, stage=1, ...)``; the arguments are ``ZeRO``'s."""

    stage = 1

    def _shard(self, params: list[nn.Parameter], **_other_stages_options) -> None:
        """One group (the whole model): parameters and gradients whole, the shard a view."""
        everything = [list(range(len(params)))]
        self.groups = group_parameters(params, everything, self.comm.world_size,
                                       self.comm.rank)
        self.flats = flat_parameters(self.groups)  # the module's parameters: views of these
        self.shards = [nn.Parameter(g.shard_of(flat))
                       for g, flat in zip(self.groups, self.flats)]
        self.flat_grads = flat_gradients(self.groups)  # every param.grad: a view of these
        self.grad_sync = BackwardCounter([p for g in self.groups for p in g.params])

    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter the gradients, update this rank's shard, all-gather the shards."""
        with self._stepping():
            for g, flat_grad, shard in zip(self.groups, self.flat_grads, self.shards):
                take_grads(g, flat_grad)
                shard.grad = reduce_scatter(self.comm, flat_grad, op="avg") if g.padded \
                    else flat_grad
            self.optimizer.step()
            for g, flat, shard in zip(self.groups, self.flats, self.shards):
                if g.padded:
                    flat.copy_(all_gather(self.comm, shard.detach()).reshape(-1))
        for shard in self.shards:  # the reduce-scattered piece was temporary
            shard.grad = None

    def zero_grad(self) -> None:
        """Zero the full flat gradient buffer, every ``param.grad`` a view of it again."""
        for g, flat in zip(self.groups, self.flat_grads):
            flat.zero_()
            point_grads_at(g, flat)

    def _gradient_buffers(self) -> list[torch.Tensor]:
        """The gradients this stage keeps: one full flat buffer per group."""
        return self.flat_grads
