"""ZeRO stage 2 (P_os+g): the gradients sharded too, reduce-scattered during backward.

Stage 1 (``stage1.py``) still holds a full gradient on every rank until ``step``
reduce-scatters it. Stage 2 (Rajbhandari et al., SC 2020, section 5.2) never lets the full
gradient pile up: the parameters are cut into buckets (DDP's rule, ``assign_buckets``:
reverse registration order, closed at ``bucket_cap_mb``), each laid out as its own padded
flat group, and as soon as backward has produced a bucket's gradients they are
reduce-scattered into this rank's persistent gradient shard and dropped
(``grad_buckets.GradientShards``)::

    bucket k   [ its parameters end to end, padded ]            one group per bucket
    backward:  bucket k complete -> grad_shard[k] += reduce_scatter(its gradients, avg)
                                    param.grad = None            (the full ones are gone)
    step:      optimizer.step()                                  updates my shards
               flat[k] = all_gather(shard[k])                    everyone gets every piece

Parameters stay whole (views of the flat buffers, as in stage 1). Memory per rank: 2 Psi of
parameters + (2 + K) Psi / p, plus one bucket of full gradients at a time during backward;
communication 2 Psi per step, as stage 1 (the reduce-scatters only moved into backward,
where they can overlap the computation of earlier layers).

``ZeRO.__init__`` (``zero_optimizer.py``) checks the arguments, gives every rank rank 0's
parameters, calls ``_shard`` below, and builds the optimizer over ``self.shards``.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_gather
from ..data.buckets import assign_buckets
from .flat_shards import flat_parameters, group_parameters
from .grad_buckets import GradientShards
from .zero_optimizer import ZeRO


class ZeROStage2(ZeRO):
    """ZeRO stage 2: ``md.ZeRO(module, comm, stage=2, ...)``; the arguments are ``ZeRO``'s
    (``bucket_cap_mb`` is this stage's)."""

    stage = 2

    def _shard(self, params: list[nn.Parameter], *, bucket_cap_mb: float,
               **_other_stages_options) -> None:
        """One group per bucket; parameters whole, gradients only as this rank's shards."""
        buckets = assign_buckets(params, bucket_cap_mb * 2**20)
        self.groups = group_parameters(params, buckets, self.comm.world_size, self.comm.rank)
        self.flats = flat_parameters(self.groups)  # the module's parameters: views of these
        self.shards = [nn.Parameter(g.shard_of(flat))
                       for g, flat in zip(self.groups, self.flats)]
        self.grad_shards = [torch.zeros(g.shard_numel, dtype=g.dtype, device=g.device)
                            for g in self.groups]  # filled by the reduce-scatters in backward
        self.grad_sync = GradientShards(self.comm, self.groups, self.grad_shards)

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shards with the gradient shards backward filled, all-gather."""
        with self._stepping():
            for shard, grad in zip(self.shards, self.grad_shards):
                shard.grad = grad
            self.optimizer.step()
            for g, flat, shard in zip(self.groups, self.flats, self.shards):
                if g.padded:
                    flat.copy_(all_gather(self.comm, shard.detach()).reshape(-1))

    def zero_grad(self) -> None:
        """Zero this rank's gradient shards (the full gradients are already gone)."""
        for grad in self.grad_shards:
            grad.zero_()

    def _gradient_buffers(self) -> list[torch.Tensor]:
        """The gradients this stage keeps: this rank's shard of each bucket."""
        return self.grad_shards
