"""What happens to one bucket: the pluggable half of DDP's reducer.

The scheduler (``scheduler.py``) decides *when* a bucket is reduced (as soon as its last
gradient is in, strictly in bucket order, on the communication thread) and writes the result
into ``param.grad``. A ``BucketReduction`` decides *what* reducing a bucket means. It
answers four questions, each with a default:

* ``needs_flat(bucket)``: copy the gradients into ``bucket.buffer`` first (True), or reduce
  them where they lie, as ``bucket.grads``?
* ``divisor(comm, bucket)``: divide each gradient by this on its way into the buffer (the
  average divides by p there, which saves a pass over the bucket).
* ``reduce(comm, bucket)``: the communication, on the communication thread. The result is
  left in ``bucket.buffer`` (flat) or in ``bucket.grads`` (in place; in the flat layout
  those are views of the buffer, so in-place code works for both).
* ``finish(comm, buckets)``: once per synchronizing backward, after every bucket, on the
  caller's thread, before the results are written back (``write_back = False``: the
  scheduler leaves ``param.grad`` alone, for reductions whose result lives elsewhere).

The later strategies plug in here, without a branch in the scheduler::

    class ShardedGradients(BucketReduction):        # ZeRO-2: keep only my shard
        write_back = False                          # the result is the shard, not .grad
        def __init__(self): self.shards = {}        # bucket index -> my averaged slice
        def divisor(self, comm, bucket): return comm.world_size
        def reduce(self, comm, bucket):
            self.shards[bucket.index] = reduce_scatter(comm, bucket.buffer, op="sum")

    class ErrorFeedback(BucketReduction):           # compression, state per bucket
        def __init__(self, compress): self.compress, self.error = compress, {}
        def reduce(self, comm, bucket):
            x = bucket.buffer + self.error.get(bucket.index, 0.0)
            sent = self.compress(x)                 # what this rank contributes
            self.error[bucket.index] = x - sent     # carried into the next step
            bucket.buffer.copy_(all_reduce(comm, sent, op="avg"))

    class Unscale(Wrapped):                         # mixed precision, after any reduction
        def __init__(self, inner, scaler): super().__init__(inner); self.scaler = scaler
        def reduce(self, comm, bucket):
            super().reduce(comm, bucket)            # now bitwise the same on every rank,
            for g in bucket.grads:                  # so found_inf agrees without a message
                g.mul_(1.0 / self.scaler.scale)
                self.scaler.found_inf |= not bool(g.isfinite().all())

    ddp = md.DistributedDataParallel(model, comm, reduction=ShardedGradients())
    ddp.reduction = Unscale(Average(), scaler)      # or swap it between steps

Synchronizing only on a pipeline's last micro-batch is not a reduction: that is
``no_sync()``, which lives in the scheduler (``SyncSwitch``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ...collectives import all_reduce, all_reduce_coalesced
from .buckets import Bucket

_COALESCE_DTYPES = (torch.float32, torch.float64)


class BucketReduction(ABC):
    """How one bucket of this rank's gradients becomes the gradients every rank uses."""

    #: write the result (``bucket.buffer`` or ``bucket.grads``) into ``param.grad``
    write_back = True

    def needs_flat(self, bucket: Bucket) -> bool:
        """Copy the gradients into ``bucket.buffer`` before ``reduce`` (the default), or
        leave them in ``param.grad`` and reduce ``bucket.grads`` in place?"""
        return True

    def divisor(self, comm, bucket: Bucket) -> int:
        """Divide every gradient by this when copying it into the flat buffer (1: copy)."""
        return 1

    @abstractmethod
    def reduce(self, comm, bucket: Bucket) -> None:
        """Reduce one bucket across the ranks, in place. Runs on the communication thread
        for buckets started during backward, in the same bucket order on every rank."""

    def finish(self, comm, buckets: list[Bucket]) -> None:  # noqa: B027 (optional hook)
        """After every bucket of a synchronizing backward, before the write-back."""


class Average(BucketReduction):
    """DDP's default: the mean of the ranks' gradients.

    32- and 64-bit buckets are averaged where the gradients lie by one
    ``all_reduce_coalesced(avg)``: on a local-backend world communicator that goes through
    shared memory straight from ``param.grad`` and back, skipping the copy into the bucket
    and out of it (two passes over every gradient, which cost as much as the reduction
    itself here); elsewhere it packs them into ``bucket.buffer``, as torch does. 16-bit
    buckets (and every bucket with ``gradient_as_bucket_view``) are flat: each gradient is
    divided by p on its way into the buffer (so float16 sums stay in range), and the buffer
    is summed by one ``all_reduce``."""

    def __init__(self, algorithm: str = "auto"):
        self.algorithm = algorithm

    def needs_flat(self, bucket: Bucket) -> bool:
        return bucket.buffer.dtype not in _COALESCE_DTYPES

    def divisor(self, comm, bucket: Bucket) -> int:
        return comm.world_size

    def reduce(self, comm, bucket: Bucket) -> None:
        if bucket.flat:  # divided by p in copy_in: summing averages
            all_reduce(comm, bucket.buffer, op="sum", algorithm=self.algorithm)
        else:
            all_reduce_coalesced(comm, bucket.grads, op="avg", algorithm=self.algorithm,
                                 buffer=bucket.buffer)

    def __repr__(self) -> str:
        return f"Average(algorithm={self.algorithm!r})"


class CommHook(BucketReduction):
    """A torch-style comm hook as a reduction: ``hook(comm, bucket)`` gets this rank's own
    gradients in ``bucket.buffer`` and returns their average over the ranks
    (``bucket.buffer`` itself, or a tensor of its shape, copied into it). Per-bucket state
    (error feedback) is keyed by ``bucket.index``."""

    def __init__(self, hook):
        if not callable(hook):
            raise TypeError(f"comm hook must be callable, got {type(hook).__name__}")
        self.hook = hook

    def reduce(self, comm, bucket: Bucket) -> None:
        out = self.hook(comm, bucket)
        if out is bucket.buffer:
            return
        if not isinstance(out, torch.Tensor) or out.shape != bucket.buffer.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"the comm hook must return a tensor shaped like bucket.buffer "
                             f"{tuple(bucket.buffer.shape)}, got {got}")
        bucket.buffer.copy_(out)

    def __repr__(self) -> str:
        return f"CommHook({getattr(self.hook, '__name__', self.hook)!r})"


class Wrapped(BucketReduction):
    """A reduction that adds a step around another one (``inner``): everything is passed
    on to ``inner`` unless a subclass overrides it (and calls ``super()``)."""

    def __init__(self, inner: BucketReduction):
        if not isinstance(inner, BucketReduction):
            raise TypeError(f"inner must be a BucketReduction, got {type(inner).__name__}")
        self.inner = inner

    @property
    def write_back(self) -> bool:  # type: ignore[override]
        return self.inner.write_back

    def needs_flat(self, bucket: Bucket) -> bool:
        return self.inner.needs_flat(bucket)

    def divisor(self, comm, bucket: Bucket) -> int:
        return self.inner.divisor(comm, bucket)

    def reduce(self, comm, bucket: Bucket) -> None:
        self.inner.reduce(comm, bucket)

    def finish(self, comm, buckets: list[Bucket]) -> None:
        self.inner.finish(comm, buckets)
