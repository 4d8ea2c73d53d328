"""Top-k sparsification with error feedback, as a DDP comm hook.

Each rank sends only the k = ceil(ratio n) largest-magnitude entries of its bucket (their
indices and values); every rank adds up what all ranks sent and divides by p. Dropping the
rest outright biases training: small coordinates that are consistently in the same
direction are never applied. *Error feedback* (Stich, Cordonnier and Jaggi, "Sparsified SGD
with Memory", NeurIPS 2018; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019;
Lin et al., "Deep Gradient Compression", ICLR 2018) keeps what was not sent as a residual and
adds it to the next step's gradient::

    x        = g_t + e_{t-1}          # this rank's gradient, corrected
    sent     = top_k(x)               # k entries: what goes on the wire
    e_t      = x - sent               # the residual, carried to the next step

so nothing is lost, only delayed: sum_t sent_t + e_T = sum_t g_t, exactly (every entry of x
is either in ``sent`` or in ``e_t``). That identity is what the tests check.

Bytes (ring all_gather of indices and values): each rank sends

    (p - 1) k (4 + element size)        # int32 index + value, for each of the p-1 others

against 2 (p-1)/p n (element size) for the dense ring all_reduce (``topk_bytes`` below).
The sparse sum grows with p (p k entries arrive) while the dense ring does not, so top-k
pays when k (4 + s) < 2 n s / p, i.e. ratio < 2 s / ((4 + s) p): below 1/(2p) for float32.

``topk_naive`` is the version written first: zero all but the top k and all-reduce the
dense vector. It gives the same average as ``TopK(error_feedback=False)`` and saves no byte.

    ddp.register_comm_hook(md.compression.TopK(ratio=0.01))
"""

from __future__ import annotations

import math

import torch

from ..collectives import all_gather, all_reduce
from .hook_reports import StepLog, dense_bytes, squared_norm

INDEX_BYTES = 4  # indices travel as int32


def check_ratio(ratio) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"ratio must be a number in (0, 1] (the share of entries each rank "
                         f"sends), got {ratio!r}")
    return float(ratio)


def topk_count(n: int, ratio: float) -> int:
    """k = ceil(ratio n): the same on every rank, since the buckets are the same."""
    return min(n, math.ceil(ratio * n))


def topk_bytes(n: int, element_size: int, world_size: int, ratio: float) -> int:
    """Bytes one rank sends for a bucket of n elements: (p-1) k (4 + element size)."""
    return (world_size - 1) * topk_count(n, ratio) * (INDEX_BYTES + element_size)


def topk_compress(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (int32) and values of the k largest-magnitude entries of flat ``x``."""
    indices = x.abs().topk(k, sorted=False).indices
    return indices.to(torch.int32), x[indices]


class TopK:
    """A comm hook: all-gather each rank's top ``ratio`` share of (gradient + residual).

    ``error_feedback``: keep what was not sent and add it to the next step's gradient
    (True), or drop it. Per-bucket state, keyed by ``bucket.index``: ``residual(index)``
    and ``last_sent[index]`` (this rank's indices and values of its latest call).
    ``report()``: bytes sent and relative error ||x - sent|| / ||x|| of the last step."""

    def __init__(self, ratio: float, error_feedback: bool = True):
        self.ratio = check_ratio(ratio)
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be True or False, got {error_feedback!r}")
        self.error_feedback = error_feedback
        self.residuals: dict[int, torch.Tensor] = {}
        self.last_sent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.log = StepLog()
        self.__name__ = f"topk({self.ratio:g})"

    def __call__(self, comm, bucket) -> torch.Tensor:
        x = bucket.buffer  # this rank's own gradients (a comm hook's input)
        if self.error_feedback and bucket.index in self.residuals:
            x.add_(self.residuals[bucket.index])
        indices, values = topk_compress(x, topk_count(x.numel(), self.ratio))
        left = x.clone()
        left[indices.long()] = 0  # x - sent: exactly the entries not sent
        if self.error_feedback:
            self.residuals[bucket.index] = left
        self.last_sent[bucket.index] = (indices, values)
        self._record(comm, bucket, squared_norm(left), squared_norm(x))
        every_index = all_gather(comm, indices).long()  # (p, k)
        every_value = all_gather(comm, values)
        x.zero_()
        # rank by rank, in the same order on every rank: one rank's indices are distinct, so
        # no two adds meet on one element in a call (on a GPU, index_add_ adds colliding
        # indices with atomics, in no fixed order, and the replicas would part by roundings)
        for index, value in zip(every_index, every_value):
            x.index_add_(0, index, value)
        return x.div_(comm.world_size)

    def _record(self, comm, bucket, error_sq: float, norm_sq: float) -> None:
        n, size, p = bucket.buffer.numel(), bucket.buffer.element_size(), comm.world_size
        self.log.record(bucket.index, bytes_sent=topk_bytes(n, size, p, self.ratio),
                        dense=dense_bytes(n, size, p, comm.rank), error_sq=error_sq,
                        norm_sq=norm_sq)

    def residual(self, index: int) -> torch.Tensor:
        """A copy of bucket ``index``'s residual (zeros before its first call)."""
        if index not in self.residuals:
            raise KeyError(f"no residual for bucket {index}: it has not been reduced yet "
                           "(or error_feedback is False)")
        return self.residuals[index].clone()

    def report(self) -> dict:
        return self.log.summary()

    def __repr__(self) -> str:
        return f"TopK(ratio={self.ratio:g}, error_feedback={self.error_feedback})"


def topk_naive(ratio: float, algorithm: str = "ring"):
    """The naive version: zero all but each rank's top k, then all-reduce the *dense* vector.
    The same average as ``TopK(ratio, error_feedback=False)``, and the same bytes as no
    compression at all: sparsifying saves bytes only if the message is sparse."""
    ratio = check_ratio(ratio)

    def hook(comm, bucket) -> torch.Tensor:
        x = bucket.buffer
        indices, values = topk_compress(x, topk_count(x.numel(), ratio))
        x.zero_()[indices.long()] = values
        return all_reduce(comm, x, op="avg", algorithm=algorithm)

    hook.__name__ = f"topk_naive({ratio:g})"
    return hook
