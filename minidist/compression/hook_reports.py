"""What a compression hook costs and what it loses: bytes sent and relative error, per step.

A compressor is worth its error only if it saves enough bytes, so every hook here keeps the
same two figures, for the lesson's "loss against bytes" plots:

* bytes this rank sent in the last step, beside what DDP's uncompressed ring all_reduce
  would have sent for the same buckets: ``dense_bytes`` = 2 (p-1)/p x N x element size
  (``costmodel.collectives.ring_bytes``, exact for any N and p);
* the relative error of this rank's contribution, ||C(x) - x|| / ||x||, where x is what the
  rank wanted to send (its gradient plus the residual carried from earlier steps) and C(x)
  what its compressed message stands for. It is computed from local tensors, so measuring
  it costs no message.

A hook records one entry per bucket per call (``StepLog.record``); the latest entry of each
bucket is "the last step". ``Measured`` wraps any hook (``fp16_hook``, ``allreduce_hook``)
and counts its bytes with ``comm.stats`` instead of a formula.
"""

from __future__ import annotations

import math

import torch

from ..collectives import all_reduce
from ..costmodel.collectives import ring_bytes


def dense_bytes(numel: int, element_size: int, world_size: int, rank: int = 0) -> int:
    """Bytes ``rank`` sends in an uncompressed ring all_reduce of ``numel`` elements:
    2 (p-1)/p x N x element size (exactly ``costs.ring_bytes``)."""
    return ring_bytes(numel, element_size, world_size, rank)


class StepLog:
    """The latest call's figures for each bucket, and the running total of bytes."""

    def __init__(self) -> None:
        self.latest: dict[int, dict] = {}
        self.calls: dict[int, int] = {}
        self.total_bytes_sent = 0

    def record(self, index: int, *, bytes_sent: int, dense: int, error_sq: float,
               norm_sq: float, compressed: bool = True) -> None:
        """One bucket's figures for this step (``error_sq`` = ||C(x) - x||^2, ``norm_sq`` =
        ||x||^2; ``compressed``: False for a plain all_reduce step)."""
        self.latest[index] = {"bytes_sent": bytes_sent, "dense_bytes": dense,
                              "error_sq": error_sq, "norm_sq": norm_sq,
                              "compressed": compressed}
        self.calls[index] = self.calls.get(index, 0) + 1
        self.total_bytes_sent += bytes_sent

    def summary(self) -> dict:
        """``steps`` (calls of the most-called bucket), ``bytes_sent`` and ``dense_bytes``
        of the last step (all buckets), ``compression`` (dense / sent), ``relative_error``
        of the last step, ``compressed`` (did every bucket compress in the last step?),
        ``total_bytes_sent`` (every step so far)."""
        rows = self.latest.values()
        sent = sum(r["bytes_sent"] for r in rows)
        dense = sum(r["dense_bytes"] for r in rows)
        err, norm = sum(r["error_sq"] for r in rows), sum(r["norm_sq"] for r in rows)
        return {"steps": max(self.calls.values(), default=0), "bytes_sent": sent,
                "dense_bytes": dense, "compression": dense / sent if sent else None,
                "relative_error": math.sqrt(err / norm) if norm > 0 else 0.0,
                "compressed": bool(rows) and all(r["compressed"] for r in rows),
                "total_bytes_sent": self.total_bytes_sent}


def squared_norm(t: torch.Tensor) -> float:
    """||t||^2 as a Python float, accumulated in float64."""
    return float(t.double().square().sum())


class Measured:
    """Any comm hook, with its bytes counted by ``comm.stats`` and, if ``exact_error``, the
    relative error of its *result* against the true average of the ranks' gradients.

    The true average costs one extra ring all_reduce per bucket; its bytes are not counted
    (they are the measurement, not the method). ``report()`` as the compressing hooks."""

    def __init__(self, hook, exact_error: bool = False):
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        self.hook, self.exact_error, self.log = hook, bool(exact_error), StepLog()
        self.__name__ = f"measured({getattr(hook, '__name__', type(hook).__name__)})"

    def __call__(self, comm, bucket) -> torch.Tensor:
        buffer = bucket.buffer
        mine = buffer.clone() if self.exact_error else None
        before = comm.stats.bytes_sent
        out = self.hook(comm, bucket)
        sent = comm.stats.bytes_sent - before
        error_sq = norm_sq = 0.0
        if mine is not None:
            true = all_reduce(comm, mine, op="avg", algorithm="ring")
            error_sq, norm_sq = squared_norm(out - true), squared_norm(true)
        self.log.record(bucket.index, bytes_sent=sent, error_sq=error_sq, norm_sq=norm_sq,
                        dense=dense_bytes(buffer.numel(), buffer.element_size(),
                                          comm.world_size, comm.rank))
        return out

    def report(self) -> dict:
        return self.log.summary()
