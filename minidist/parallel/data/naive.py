"""``DataParallelNaive``: one blocking all-reduce per gradient, inside backward (picotron's
``DataParallelNaive``), the baseline ``DistributedDataParallel`` (``ddp.py``) improves on.

Cost per step, for a model of k parameter tensors and n bytes of gradients, with the ring:
k (2(p-1) alpha) + 2(p-1)/p n beta, and none of it overlaps the backward computation.
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

from ...collectives import all_reduce
from .replicas import check_args, sync_module_states


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
        self.require_backward_grad_sync = True
        sync_module_states(comm, module)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._all_reduce_grad)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _all_reduce_grad(self, param: nn.Parameter) -> None:
        # every rank runs the same graph, so the hooks fire in the same order everywhere
        if self.require_backward_grad_sync:
            all_reduce(self.comm, param.grad, op="avg", algorithm=self.algorithm)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block averages them."""
        before, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before
