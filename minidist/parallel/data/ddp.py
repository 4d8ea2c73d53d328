"""Data parallelism: every rank holds the whole model, trains on its own slice of the batch,
and the ranks average their gradients so that all replicas take the same step.

If the loss is a mean over the batch, p ranks with B/p samples each whose gradients are
averaged compute exactly the gradient of one process on all B samples (the mean of means
of equal-sized parts is the mean), so data-parallel training follows the single-process
trajectory up to floating-point rounding. Two versions, side by side as in picotron:

* ``DataParallelNaive``: every gradient is all-reduced on its own, inside backward, and
  backward waits for each one. Simple and correct, but it pays one latency per parameter
  and computes nothing while communicating.
* ``DistributedDataParallel``: PyTorch DDP's design (Li et al., VLDB 2020): gradients in
  buckets, each bucket's all-reduce started by autograd hooks as soon as it is full, on a
  communication thread, so it overlaps the rest of backward. *When* a bucket is reduced is
  the ``BucketScheduler``'s business (``scheduler.py``); *what* reducing it means is a
  pluggable ``BucketReduction`` (``reductions.py``), so other strategies reuse the
  scheduler with their own reduction::

      ddp = md.DistributedDataParallel(model, comm, reduction=MyReduction())

Both start by checking that every rank holds the same parameters, then copy rank 0's
parameters and buffers to all ranks, so that the replicas start identical.
"""

from __future__ import annotations

import torch
from torch import nn

from ...checks import positive_number
from ...faults import maybe_delay
from .graph import at_backward_end, on_backward_start
from .reductions import Average, BucketReduction, CommHook
from .replicas import broadcast_tensors, check_args, sync_module_states
from .scheduler import BucketScheduler


# -- the fast version ----------------------------------------------------------------------------
class DistributedDataParallel(nn.Module):
    """PyTorch-style DDP: bucketed gradient averaging that overlaps backward.

    ``bucket_cap_mb``: bucket size (MiB). ``overlap``: start each bucket's all-reduce from the
    autograd hooks on a communication thread (True) or reduce all buckets after backward
    (False); the results are identical. ``find_unused_parameters``: allow parameters that get
    no gradient in a step (costs a graph walk per forward and one tiny all-reduce per step).
    ``broadcast_buffers``: copy rank 0's buffers (e.g. BatchNorm statistics) to every rank at
    each synchronizing forward. ``gradient_as_bucket_view``: make ``param.grad`` a view into
    its bucket, which saves copying every gradient back after the all-reduce.
    ``comm_hook(comm, bucket) -> tensor`` replaces the default averaging (see
    ``register_comm_hook``). ``algorithm``: which all_reduce (``md.ALL_REDUCE_ALGORITHMS``).
    ``reduction``: a ``BucketReduction`` (``reductions.py``) replacing the average
    altogether (not with ``comm_hook``).

    To study load imbalance, slow a rank down around the training loop (every strategy
    offers the same points): ``with md.slow_rank(comm, rank=1, seconds=0.05): ...``
    (``minidist/faults.py``); DDP sleeps there at "forward" and "backward".

    Differences from torch's DDP, kept out for clarity: torch uses a 1 MiB first bucket and,
    after the first step, re-buckets in the order gradients actually arrived; here buckets
    always follow reverse registration order. Timeline (``comm.timeline``): spans
    ``forward``, ``backward``, ``bucket i`` (each bucket's reduction), ``wait for buckets``
    (the communication backward could not hide) and ``straggler delay``."""

    def __init__(self, module: nn.Module, comm, bucket_cap_mb: float = 25, overlap: bool = True,
                 find_unused_parameters: bool = False, broadcast_buffers: bool = True,
                 gradient_as_bucket_view: bool = False, comm_hook=None, algorithm: str = "auto",
                 reduction: BucketReduction | None = None):
        super().__init__()
        check_args(module, comm)
        _check_options(bucket_cap_mb, comm_hook, reduction)
        self.module, self.comm = module, comm
        self.broadcast_buffers = broadcast_buffers
        sync_module_states(comm, module)
        if reduction is None:
            reduction = Average(algorithm) if comm_hook is None else CommHook(comm_hook)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.scheduler = BucketScheduler(comm, named, bucket_cap_mb * 2**20, reduction,
                                         overlap, find_unused_parameters,
                                         gradient_as_bucket_view)

    def forward(self, *args, **kwargs):
        maybe_delay(self.comm, "forward")
        sync = self.scheduler.will_sync()
        buffers = list(self.module.buffers())
        if sync and self.broadcast_buffers and buffers and self.comm.world_size > 1:
            broadcast_tensors(self.comm, buffers)
        with self.comm.timeline.span("forward"):
            out = self.module(*args, **kwargs)
        if torch.is_grad_enabled():
            self.scheduler.prepare(out, sync)
            on_backward_start(out, self._backward_started)
        return out

    def _backward_started(self) -> None:
        """At the start of backward: the ``"backward"`` fault point, and a ``backward`` span
        that ends when the autograd engine finishes the pass (callbacks run in the order
        queued, so it ends before the scheduler's wait begins)."""
        maybe_delay(self.comm, "backward")
        timeline = self.comm.timeline
        if timeline.enabled:
            start = self.comm.now()
            at_backward_end(lambda: timeline.record("backward", "compute", start,
                                                    self.comm.now()))

    def no_sync(self):
        """Skip the all-reduce for backward passes of forwards run inside the block: gradients
        accumulate locally in ``.grad``, and the first synchronizing backward after it
        averages the accumulated sum (gradient accumulation at the cost of one all-reduce).
        The scheduler's ``no_sync`` (``SyncSwitch``)."""
        return self.scheduler.no_sync()

    @property
    def require_backward_grad_sync(self) -> bool:
        """False inside ``no_sync()`` (torch's attribute of the same name)."""
        return self.scheduler.require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.scheduler.require_backward_grad_sync = bool(value)

    def register_comm_hook(self, hook) -> None:
        """Replace how a bucket is reduced (torch: ``register_comm_hook``). ``hook(comm,
        bucket)`` gets this rank's gradients in ``bucket.buffer`` and returns their average
        over the ranks (``bucket.buffer`` itself, or a tensor of its shape and dtype); it runs
        on the communication thread when overlapping. ``buckets.allreduce_hook`` is the
        default written as a hook. Gradient compression plugs in here (``CommHook``)."""
        self.scheduler.reduction = CommHook(hook)

    @property
    def reduction(self) -> BucketReduction:
        """What reducing one bucket means (``reductions.py``); assignable between steps."""
        return self.scheduler.reduction

    @reduction.setter
    def reduction(self, reduction: BucketReduction) -> None:
        self.scheduler.reduction = reduction

    @property
    def buckets(self):
        """The gradient buckets, in reduction order."""
        return self.scheduler.buckets

    @property
    def last_sync(self) -> dict:
        """Timing of the last synchronizing backward: ``comm_s`` (seconds the bucket
        all-reduces took), ``wait_s`` (seconds backward waited for them at its end, i.e. the
        communication overlap did not hide) and ``buckets``."""
        return dict(self.scheduler.stats)


def _check_options(bucket_cap_mb, comm_hook, reduction) -> None:
    positive_number(bucket_cap_mb, "bucket_cap_mb", unit="MiB")
    if comm_hook is not None and not callable(comm_hook):
        raise TypeError(f"comm_hook must be callable, got {type(comm_hook).__name__}")
    if reduction is not None and not isinstance(reduction, BucketReduction):
        raise TypeError("reduction must be a BucketReduction (minidist.parallel.data."
                        f"reductions), got {type(reduction).__name__}")
    if reduction is not None and comm_hook is not None:
        raise ValueError("pass comm_hook or reduction, not both (a comm hook is one kind of "
                         "reduction: CommHook(hook))")
