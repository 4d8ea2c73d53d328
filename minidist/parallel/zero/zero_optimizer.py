"""``md.ZeRO``: data parallelism that stops keeping p copies of the model state.

Plain data parallelism keeps on every rank the parameters, the gradients and the optimizer
state: with mixed-precision Adam 2 + 2 + 12 = 16 bytes per parameter, of which ZeRO
(Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020) observes that every rank only *needs* 1/Nd. It partitions the parameters
into one padded flat buffer per group (``flat_shards.py``) and rank r owns shard r. Each
stage is a class of its own, to be read on its own:

* ``stage0.py``: plain data parallelism on the flat buffer (all-reduce, full update), to
  compare;
* ``stage1.py`` (P_os): the optimizer state sharded. Gradients are reduce-scattered at
  ``step``, each rank updates only its shard, the updated parameters are all-gathered;
* ``stage2.py`` (P_os+g): gradients too; reduce-scattered bucket by bucket during backward
  into a persistent gradient shard (``grad_buckets.py``);
* ``stage3.py`` (P_os+g+p, FSDP's idea): parameters too; gathered one unit (submodule) at a
  time just before its forward and its backward and freed after (``param_units.py``).

``md.ZeRO(module, comm, stage=k, ...)`` is the one way in: ``ZeRO.__new__`` builds the
stage's class, every one of which is a ``ZeRO`` (so ``isinstance(z, md.ZeRO)`` holds).
This base holds what the stages share: the checks of the arguments, rank 0's parameters
given to every rank, the optimizer built over ``self.shards``, the bookkeeping around a
step, and the measured memory. A stage supplies ``_shard`` (its layout of parameters and
gradients), ``step``, ``zero_grad`` and ``_gradient_buffers``.

Bytes per rank: (2 + 2 + K) Psi, 4 Psi + K Psi/Nd, 2 Psi + (2 + K) Psi/Nd,
(2 + 2 + K) Psi/Nd; communication 2 Psi per step for stages 0-2 and 3 Psi for stage 3
(``costmodel/zero.py``; ``md.costmodel.zero_memory``).

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

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ...checks import positive_number, zero_stage
from ...costmodel.zero import ZERO_STAGES, zero_step_bytes
from ..data.replicas import check_args, sync_module_states
from .flat_shards import storage_bytes


class ZeRO(nn.Module):
    """ZeRO stage 0-3 data parallelism around ``module``; the optimizer is built inside.

    ``z = ZeRO(module, comm, stage=2, optimizer_class=torch.optim.AdamW, lr=1e-3)``, then
    ``loss_fn(z(x), y).backward(); z.step(); z.zero_grad()``. ``bucket_cap_mb``: stage 2's
    bucket size (buckets in reverse registration order, as DDP's). ``units``: stage 3's
    gathering units (submodules; default ``param_units.default_units``); ``prefetch``:
    gather stage 3's next unit on a thread while the current one computes. Remaining keyword
    arguments go to ``optimizer_class``. Every rank starts from rank 0's parameters.

    ``ZeRO(...)`` returns the stage's own class (``ZeROStage0`` ... ``ZeROStage3``); ``stage``
    defaults to 2 there, and to the class's own stage when a stage's class is called."""

    stage: int | None = None  # each stage's class: 0, 1, 2 or 3

    def __new__(cls, module=None, comm=None, stage=2, *args, **kwargs):
        """The stage's class for ``md.ZeRO(...)``. A stage that is not one of 0-3 builds the
        base, whose ``__init__`` then names the mistake (after checking the module)."""
        if cls is ZeRO and _is_stage(stage):
            cls = _stage_classes()[stage]
        return super().__new__(cls)

    def __init__(self, module: nn.Module, comm, stage: int | None = None,
                 optimizer_class: type = torch.optim.AdamW, *, bucket_cap_mb: float = 25,
                 units: list[nn.Module] | None = None, prefetch: bool = False,
                 **optimizer_kwargs):
        super().__init__()
        check_args(module, comm)
        stage = self.stage if stage is None else stage
        _check_options(stage, optimizer_class, bucket_cap_mb, units, prefetch)
        if stage != self.stage:
            raise ValueError(f"{type(self).__name__} is ZeRO stage {self.stage}, got "
                             f"stage={stage!r}: call md.ZeRO(module, comm, stage={stage!r}) "
                             "for that stage's class")
        self.module, self.comm = module, comm
        sync_module_states(comm, module)
        params = [p for p in module.parameters() if p.requires_grad]
        self._shard(params, bucket_cap_mb=bucket_cap_mb, units=units, prefetch=prefetch)
        self.optimizer = optimizer_class(self.shards, **optimizer_kwargs)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def _stepping(self) -> Iterator[None]:
        """Around every stage's step: refuse a step with no backward since the last one (it
        would apply stale or no gradients), show the step on the timeline, and count the
        backward passes afresh once it is done."""
        if self.grad_sync.backwards == 0:
            raise RuntimeError(f"ZeRO.step() was called before backward: stage {self.stage} "
                               "has no gradients to apply. Run loss.backward() on the output "
                               "of this ZeRO module first")
        with self.comm.timeline.span("step"):
            yield
        self.grad_sync.backwards = 0

    def memory(self) -> dict[str, int]:
        """This rank's bytes of parameters, gradients and optimizer state, measured from
        the storages actually held now (a view counts once, a freed buffer 0); ``total``,
        their sum; ``params_peak``: the most parameter bytes held at once since the last
        ``step`` (stage 3: shards + root + the gathered units; otherwise ``params``)."""
        params = list(self.module.parameters()) + list(self.shards)
        grads = [p.grad for p in self.module.parameters()] + list(self._gradient_buffers())
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        out = {"params": storage_bytes(params), "grads": storage_bytes(grads),
               "optimizer": storage_bytes(state)}
        out["total"] = sum(out.values())
        out["params_peak"] = out["params"]
        return out

    def predicted_step_bytes(self) -> int:
        """Bytes this rank should send per step on rings (``costmodel.zero.zero_step_bytes``
        for this layout: its groups, and stage 3's root unit gathered once)."""
        elem = self.groups[0].params[0].element_size() if self.groups else 0
        return zero_step_bytes([g.numel for g in self.groups], self.comm.world_size,
                               self.stage, elem, self._root_groups())

    def _root_groups(self) -> list[bool] | None:
        """Per group, whether it is gathered once per step rather than twice (stage 3's
        root unit); None: no such group."""
        return None

    def full_parameters(self) -> list[torch.Tensor]:
        """The full parameters, in ``module.parameters()`` order (collective for stage 3)."""
        return [p.detach().clone() for p in self.module.parameters()]

    def __repr__(self) -> str:
        return (f"ZeRO(stage={self.stage}, world_size={self.comm.world_size}, "
                f"groups={len(self.groups)}, optimizer={type(self.optimizer).__name__})")


def _is_stage(stage) -> bool:
    return not isinstance(stage, bool) and stage in ZERO_STAGES


def _stage_classes() -> dict[int, type[ZeRO]]:
    """Imported here, not at the top: each stage's module imports this base."""
    from .stage0 import ZeROStage0
    from .stage1 import ZeROStage1
    from .stage2 import ZeROStage2
    from .stage3 import ZeROStage3

    return {0: ZeROStage0, 1: ZeROStage1, 2: ZeROStage2, 3: ZeROStage3}


def _check_options(stage, optimizer_class, bucket_cap_mb, units, prefetch) -> None:
    zero_stage(stage)
    if not (isinstance(optimizer_class, type)
            and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError("optimizer_class must be a torch.optim.Optimizer subclass (the class, "
                        f"e.g. torch.optim.AdamW, not an instance), got {optimizer_class!r}")
    positive_number(bucket_cap_mb, "bucket_cap_mb", unit="MiB")
    if units is not None and not all(isinstance(u, nn.Module) for u in units):
        raise TypeError("units must be a list of submodules (nn.Module) of the model")
    if prefetch and stage != 3:
        raise ValueError(f"prefetch=True gathers stage 3's next unit early; stage {stage} "
                         "keeps whole parameters and has nothing to prefetch")
