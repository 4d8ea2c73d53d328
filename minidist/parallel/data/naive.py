"""``DataParallelNaive``: one blocking all-reduce per gradient, inside backward (picotron's
``DataParallelNaive``), the baseline ``DistributedDataParallel`` (``ddp.py``) improves on.

Cost per step, for a model of k parameter tensors and n bytes of gradients, with the ring:
k (2(p-1) alpha) + 2(p-1)/p n beta, and none of it overlaps the backward computation.

It shares two things with ``DistributedDataParallel`` rather than repeating them:
``no_sync()`` (``scheduler.SyncSwitch``) and the fault points ``"forward"`` and
``"backward"`` (``minidist/faults.py``), so ``with md.slow_rank(comm, rank=1, seconds=0.05):``
slows either wrapper the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_reduce
from ...faults import maybe_delay
from .graph import on_backward_start
from .replicas import check_args, sync_module_states
from .scheduler import SyncSwitch


# -- the naive version ---------------------------------------------------------------------------
class DataParallelNaive(nn.Module):
    """Average every gradient the moment autograd has computed it: one blocking all-reduce
    per parameter, inside backward (picotron's ``DataParallelNaive``). Correct, and the
    baseline the bucketed version improves on: backward stops while each gradient travels,
    and a model with n parameter tensors pays n message latencies per step."""

    def __init__(self, module: nn.Module, comm, algorithm: str = "auto"):
        super().__init__()
        check_args(module, comm)
        self.module, self.comm, self.algorithm = module, comm, algorithm
        self.sync = SyncSwitch()
        sync_module_states(comm, module)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._all_reduce_grad)

    def forward(self, *args, **kwargs):
        maybe_delay(self.comm, "forward")  # fault points (minidist/faults.py)
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled():
            on_backward_start(out, lambda: maybe_delay(self.comm, "backward"))
        return out

    def _all_reduce_grad(self, param: nn.Parameter) -> None:
        # every rank runs the same graph, so the hooks fire in the same order everywhere
        if self.sync.require_backward_grad_sync:
            all_reduce(self.comm, param.grad, op="avg", algorithm=self.algorithm)

    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block averages them
        (``SyncSwitch.no_sync``, shared with ``DistributedDataParallel``)."""
        return self.sync.no_sync()

    @property
    def require_backward_grad_sync(self) -> bool:
        """False inside ``no_sync()``."""
        return self.sync.require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.sync.require_backward_grad_sync = bool(value)
