"""``md.ZeRO``: data parallelism that stops keeping p copies of the model state.

Plain data parallelism keeps on every rank the parameters, the gradients and the optimizer
state: with mixed-precision Adam 2 + 2 + 12 = 16 bytes per parameter, of which ZeRO
(Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020) observes that every rank only *needs* 1/Nd. It partitions the parameters
into one padded flat buffer per group (``flat_shards.py``) and rank r owns shard r:

* stage 0: plain data parallelism on the flat buffer (all-reduce, full update), to compare;
* stage 1 (P_os): the optimizer state sharded. Gradients are reduce-scattered at ``step``,
  each rank updates only its shard, the updated parameters are all-gathered.
* stage 2 (P_os+g): gradients too; reduce-scattered bucket by bucket during backward into a
  persistent gradient shard (``grad_buckets.py``);
* stage 3 (P_os+g+p, FSDP's idea): parameters too; gathered one unit (submodule) at a time
  just before its forward and its backward and freed after (``param_units.py``).

Bytes per rank: (2 + 2 + K) Psi, 4 Psi + K Psi/Nd, 2 Psi + (2 + K) Psi/Nd,
(2 + 2 + K) Psi/Nd; communication 2 Psi per step for stages 0-2 and 3 Psi for stage 3
(``zero_costs.py``; ``md.costmodel.zero_memory``).

The optimizer runs on each shard as one flat 1-D parameter. That is exactly the
single-process optimizer for optimizers whose state and update are per element (SGD with
momentum, Adam, AdamW, Adagrad, RMSprop): element i's update reads only element i of the
parameter, gradient and state. It is NOT for optimizers that use a whole tensor's norm
(LAMB, LARS, Adafactor's factored moments) or ``foreach``-free tricks across tensors: on a
shard the "tensor" is an arbitrary slice of several tensors, so those would compute other
norms. Gradient clipping by global norm also needs an all-reduce of the shards' squared
norms; it is not done here.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_gather, all_reduce, reduce_scatter
from ..data.buckets import assign_buckets
from ..data.replicas import check_args, sync_module_states
from .flat_shards import group_parameters, point_params_at, storage_bytes
from .grad_buckets import BackwardCounter, GradientShards
from .param_units import ParameterGatherer, PrefetchingGatherer, default_units, plan_units
from .zero_costs import STAGES, zero_step_bytes


class ZeRO(nn.Module):
    """ZeRO stage 0-3 data parallelism around ``module``; the optimizer is built inside.

    ``z = ZeRO(module, comm, stage=2, optimizer_class=torch.optim.AdamW, lr=1e-3)``, then
    ``loss_fn(z(x), y).backward(); z.step(); z.zero_grad()``. ``bucket_cap_mb``: stage 2's
    bucket size (buckets in reverse registration order, as DDP's). ``units``: stage 3's
    gathering units (submodules; default ``param_units.default_units``); ``prefetch``:
    gather stage 3's next unit on a thread while the current one computes. Remaining keyword
    arguments go to ``optimizer_class``. Every rank starts from rank 0's parameters."""

    def __init__(self, module: nn.Module, comm, stage: int = 2,
                 optimizer_class: type = torch.optim.AdamW, *, bucket_cap_mb: float = 25,
                 units: list[nn.Module] | None = None, prefetch: bool = False,
                 **optimizer_kwargs):
        super().__init__()
        check_args(module, comm)
        _check_options(stage, optimizer_class, bucket_cap_mb, units)
        if prefetch and stage != 3:
            raise ValueError(f"prefetch=True gathers stage 3's next unit early; stage {stage} "
                             "keeps whole parameters and has nothing to prefetch")
        self.module, self.comm, self.stage = module, comm, stage
        sync_module_states(comm, module)
        params = [p for p in module.parameters() if p.requires_grad]
        groups, modules = self._plan(module, params, bucket_cap_mb, units)
        self.groups = group_parameters(params, groups, comm.world_size, comm.rank)
        self.gatherer = None
        if stage == 3:
            gatherer = PrefetchingGatherer if prefetch else ParameterGatherer
            self.gatherer = gatherer(comm, self.groups, modules)
            self.shards = self.gatherer.shards
        else:
            self.flats = [g.empty() for g in self.groups]
            for g, flat in zip(self.groups, self.flats):
                point_params_at(g, flat)
            self.shards = [nn.Parameter(flat if stage == 0 else g.shard_of(flat))
                           for g, flat in zip(self.groups, self.flats)]
        self._setup_gradients()
        self.optimizer = optimizer_class(self.shards, **optimizer_kwargs)

    def _plan(self, module, params, bucket_cap_mb, units):
        """Groups of parameter indices, and for stage 3 the module of each (None: root)."""
        if self.stage == 2:
            return assign_buckets(params, bucket_cap_mb * 2**20), []
        if self.stage == 3:
            units = default_units(module) if units is None else list(units)
            inside = {id(m) for m in module.modules()}
            if any(id(u) not in inside for u in units):
                raise ValueError("units must be submodules of the module ZeRO wraps; one of "
                                 "them is not")
            groups, order = plan_units(params, units)
            return groups, [None if u is None else units[u] for u in order]
        return [list(range(len(params)))], []

    def _setup_gradients(self) -> None:
        """Stages 0/1: one full flat gradient buffer per group, ``param.grad`` views of it
        (autograd accumulates in place). Stages 2/3: only this rank's gradient shard."""
        if self.stage <= 1:
            self.flat_grads = [g.empty() for g in self.groups]
            for g, flat in zip(self.groups, self.flat_grads):
                for p, view in zip(g.params, g.views(flat)):
                    p.grad = view
            self.grad_sync = BackwardCounter([p for g in self.groups for p in g.params])
        else:
            self.grad_shards = [torch.zeros(g.shard_numel, dtype=g.dtype, device=g.device)
                                for g in self.groups]
            on_reduced = self.gatherer.release if self.gatherer is not None else None
            thread = getattr(self.gatherer, "thread", None)  # prefetch: one FIFO for all
            self.grad_sync = GradientShards(self.comm, self.groups, self.grad_shards,
                                            on_reduced, thread)

    def forward(self, *args, **kwargs):
        if self.gatherer is None:
            return self.module(*args, **kwargs)
        self.gatherer.before_forward()
        out = self.module(*args, **kwargs)
        self.gatherer.after_forward(out)
        return out

    @torch.no_grad()
    def step(self) -> None:
        """Average the gradients, update this rank's shard, share the new parameters."""
        if self.grad_sync.backwards == 0:
            raise RuntimeError(f"ZeRO.step() was called before backward: stage {self.stage} "
                               "has no gradients to apply. Run loss.backward() on the output "
                               "of this ZeRO module first")
        with self.comm.timeline.span("step"):
            for k, shard in enumerate(self.shards):
                shard.grad = self._averaged_gradient(k)
            self.optimizer.step()
            if self.stage in (1, 2):
                for g, flat, shard in zip(self.groups, self.flats, self.shards):
                    if g.padded:
                        flat.copy_(all_gather(self.comm, shard.detach()).reshape(-1))
        if self.stage == 1:  # the reduce-scattered shard was temporary
            for shard in self.shards:
                shard.grad = None
        self.grad_sync.backwards = 0
        if self.gatherer is not None:
            self.gatherer.peak_bytes = 0

    def _averaged_gradient(self, k: int) -> torch.Tensor:
        if self.stage >= 2:
            return self.grad_shards[k]
        g, flat = self.groups[k], self.flat_grads[k]
        for p, view in zip(g.params, g.views(flat)):  # someone may have replaced p.grad
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad) if p.grad is not None else view.zero_()
                p.grad = view
        if self.stage == 0:
            return all_reduce(self.comm, flat, op="avg") if g.padded else flat
        return reduce_scatter(self.comm, flat, op="avg") if g.padded else flat

    def zero_grad(self) -> None:
        """Zero the gradients where they are kept (the flat buffer or this rank's shard)."""
        if self.stage <= 1:
            for g, flat in zip(self.groups, self.flat_grads):
                flat.zero_()
                for p, view in zip(g.params, g.views(flat)):
                    p.grad = view
        else:
            for shard in self.grad_shards:
                shard.zero_()

    def memory(self) -> dict[str, int]:
        """This rank's bytes of parameters, gradients and optimizer state, measured from
        the storages actually held now (a view counts once, a freed buffer 0); ``total``,
        their sum; ``params_peak``: the most parameter bytes held at once since the last
        ``step`` (stage 3: shards + root + the gathered units; otherwise ``params``)."""
        params = list(self.module.parameters()) + list(self.shards)
        grads = [p.grad for p in self.module.parameters()]
        grads += self.flat_grads if self.stage <= 1 else self.grad_shards
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        out = {"params": storage_bytes(params), "grads": storage_bytes(grads),
               "optimizer": storage_bytes(state)}
        out["total"] = sum(out.values())
        peak = self.gatherer.peak_bytes if self.gatherer is not None else 0
        out["params_peak"] = max(peak, out["params"])
        return out

    def predicted_step_bytes(self) -> int:
        """Bytes this rank should send per step on rings (``zero_costs.zero_step_bytes``
        for this layout: its groups, and stage 3's root unit gathered once)."""
        root = [self.gatherer is not None and k == self.gatherer.root
                for k in range(len(self.groups))]
        elem = self.groups[0].params[0].element_size() if self.groups else 0
        return zero_step_bytes([g.numel for g in self.groups], self.comm.world_size,
                               self.stage, elem, root)

    def full_parameters(self) -> list[torch.Tensor]:
        """The full parameters, in ``module.parameters()`` order (collective for stage 3)."""
        if self.gatherer is not None:
            full = {id(p): v.clone() for g, flat in zip(self.groups, self.gatherer.full_flats())
                    for p, v in zip(g.params, g.views(flat))}
        else:
            full = {}
        return [full[id(p)] if id(p) in full else p.detach().clone()
                for p in self.module.parameters()]

    def __repr__(self) -> str:
        return (f"ZeRO(stage={self.stage}, world_size={self.comm.world_size}, "
                f"groups={len(self.groups)}, optimizer={type(self.optimizer).__name__})")


def _check_options(stage, optimizer_class, bucket_cap_mb, units) -> None:
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage must be one of 0, 1, 2, 3 (ZeRO's stages), got {stage!r}")
    if not (isinstance(optimizer_class, type)
            and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError("optimizer_class must be a torch.optim.Optimizer subclass (the class, "
                        f"e.g. torch.optim.AdamW, not an instance), got {optimizer_class!r}")
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
            or not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb!r}")
    if units is not None and not all(isinstance(u, nn.Module) for u in units):
        raise TypeError("units must be a list of submodules (nn.Module) of the model")
