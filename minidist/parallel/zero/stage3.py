"""ZeRO stage 3 (P_os+g+p, FSDP's idea): the parameters sharded too, gathered when used.

Stage 2 (``stage2.py``) still keeps every parameter whole on every rank. Stage 3
(Rajbhandari et al., SC 2020, section 5.3; FSDP, Zhao et al. VLDB 2023) keeps between steps
only this rank's shard of each parameter. The model is cut into *units* (submodules: a
GPT's blocks, a Sequential's layers; ``param_units.default_units``), one padded flat group
each, and a unit's parameters exist in full only while the unit computes
(``param_units.ParameterGatherer``)::

    forward:   before unit i runs: flat[i] = all_gather(shard[i]);  after it: free flat[i]
    backward:  before unit i's backward: gather flat[i] again
               unit i's gradients done -> grad_shard[i] += reduce_scatter(them, avg);
                                          free flat[i]                 (grad_buckets.py)
    step:      optimizer.step()                 updates my shards; nothing to all-gather:
                                                the next forward gathers what it needs

Parameters outside every unit (and ones two units share, a tied embedding) form the *root*
unit, gathered from the start of forward to the end of backward. With ``prefetch=True`` a
communication thread gathers the next unit while the current one computes
(``param_units.PrefetchingGatherer``), holding two units at once. Memory per rank:
(2 + 2 + K) Psi / p plus the root and the units gathered at the moment; communication
3 Psi per step (two all-gathers and one reduce-scatter), 1.5x stages 1 and 2.

``ZeRO.__init__`` (``zero_optimizer.py``) checks the arguments, gives every rank rank 0's
parameters, calls ``_shard`` below, and builds the optimizer over ``self.shards``.
"""

from __future__ import annotations

import torch
from torch import nn

from .flat_shards import group_parameters
from .grad_buckets import GradientShards
from .param_units import ParameterGatherer, PrefetchingGatherer, plan_units, units_of
from .zero_optimizer import ZeRO


class ZeROStage3(ZeRO):
    """ZeRO stage 3: ``md.ZeRO(module, comm, stage=3, ...)``; the arguments are ``ZeRO``'s
    (``units`` and ``prefetch`` are this stage's). ``gatherer`` holds the units."""

    stage = 3

    def _shard(self, params: list[nn.Parameter], *, units: list[nn.Module] | None,
               prefetch: bool, **_other_stages_options) -> None:
        """One group per unit, the root's last; only the shards persist."""
        units = units_of(self.module, units)
        groups, order = plan_units(params, units)
        self.groups = group_parameters(params, groups, self.comm.world_size, self.comm.rank)
        gatherer = PrefetchingGatherer if prefetch else ParameterGatherer
        self.gatherer = gatherer(self.comm, self.groups,
                                 [None if u is None else units[u] for u in order])
        self.shards = self.gatherer.shards
        self.grad_shards = [torch.zeros(g.shard_numel, dtype=g.dtype, device=g.device)
                            for g in self.groups]  # filled by the reduce-scatters in backward
        thread = getattr(self.gatherer, "thread", None)  # prefetch: one FIFO for all
        self.grad_sync = GradientShards(self.comm, self.groups, self.grad_shards,
                                        self.gatherer.release, thread)

    def forward(self, *args, **kwargs):
        """The root unit gathered around the module's forward; the units gather themselves
        (hooks)."""
        self.gatherer.before_forward()
        out = self.module(*args, **kwargs)
        self.gatherer.after_forward(out)
        return out

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shards with the gradient shards backward filled."""
        with self._stepping():
            for shard, grad in zip(self.shards, self.grad_shards):
                shard.grad = grad
            self.optimizer.step()
        self.gatherer.peak_bytes = 0

    def zero_grad(self) -> None:
        """Zero this rank's gradient shards (the full gradients are already gone)."""
        for grad in self.grad_shards:
            grad.zero_()

    def _gradient_buffers(self) -> list[torch.Tensor]:
        """The gradients this stage keeps: this rank's shard of each unit."""
        return self.grad_shards

    def memory(self) -> dict[str, int]:
        """``ZeRO.memory``; ``params_peak`` here is the most the gatherer held at once since
        the last step (shards + root + the gathered units), as measured at each gather."""
        out = super().memory()
        out["params_peak"] = max(self.gatherer.peak_bytes, out["params"])
        return out

    def _root_groups(self) -> list[bool]:
        """The root unit is gathered once per step (forward to the end of backward)."""
        return [k == self.gatherer.root for k in range(len(self.groups))]

    def full_parameters(self) -> list[torch.Tensor]:
        """The full parameters, in ``module.parameters()`` order, gathered (collective)."""
        full = {id(p): v.clone() for g, flat in zip(self.groups, self.gatherer.full_flats())
                for p, v in zip(g.params, g.views(flat))}
        return [full[id(p)] if id(p) in full else p.detach().clone()
                for p in self.module.parameters()]
