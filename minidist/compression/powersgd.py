"""PowerSGD: rank-r gradient compression by one step of power iteration, as a DDP comm hook.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019); torch's ``powerSGD_hook``
(torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook), whose design this follows.

A weight's gradient is a matrix M (m x n; a conv kernel is viewed as shape[0] x the rest),
and gradients are close to low rank. With a shared random n x r matrix Q::

    P  = M Q                 # m x r, on every rank
    P  = all_reduce(P)       # sum over the ranks: (sum_w M_w) Q
    P^ = orthogonalize(P)    # Gram-Schmidt: an orthonormal basis of M's main column space
    Q  = M^T P^              # n x r
    Q  = all_reduce(Q) / p   # the average
    M ~ P^ Q^T               # = P^ P^T mean(M): the average projected onto span(P^)

Both all_reduces are linear, so the ranks never need the dense average. Per m x n matrix
the wire carries (m + n) r elements instead of m n (``powersgd_elements``); a ring
all_reduce of N elements sends 2 (p-1)/p N elements per rank, so the bytes shrink by
m n / ((m + n) r). Tensors where that gain is small are all-reduced as they are: 1-D tensors
(biases, norms) and matrices with (m + n) r min_compression_rate >= m n.

* error feedback: what the approximation missed, e = M_w - P^ Q^T (this rank's corrected
  gradient minus the decompressed average, as torch and the paper's code compute it), is
  added to the next step's gradient (``topk.py`` explains why);
* warm start: Q is kept from the previous step, so each step is one more power-iteration
  step on a slowly changing gradient and one iteration is enough; the first Q is drawn from
  ``seed`` (the same on every rank);
* ``start_iter``: the first steps all-reduce as they are: early training is most sensitive
  to gradient error (torch's ``start_powerSGD_iter``; its default 1000 suits long runs, 10
  suits the short runs here).

Step counts are per bucket (each bucket is reduced once per synchronizing backward).
Gram-Schmidt runs twice ("twice is enough", Giraud et al. 2005), so that a gradient of rank
below r, whose extra columns of P are rounding noise, still gets an orthonormal P^ and is
reproduced exactly.

    ddp.register_comm_hook(md.compression.PowerSGD(rank=2))
"""

from __future__ import annotations

import torch

from ..collectives import all_reduce
from ..costmodel.collectives import ring_bytes
from .hook_reports import StepLog, dense_bytes, squared_norm


def should_compress(m: int, n: int, rank: int, min_compression_rate: float) -> bool:
    """Worth compressing an m x n matrix at this rank: (m + n) r rate < m n."""
    r = min(m, n, rank)
    return (m + n) * r * min_compression_rate < m * n


def matrix_shape(shape: torch.Size) -> tuple[int, int] | None:
    """The m x n view of a gradient (shape[0] x the rest), None for 0-D and 1-D tensors."""
    if len(shape) < 2:
        return None
    return shape[0], int(torch.Size(shape[1:]).numel())


def powersgd_elements(shapes, rank: int, min_compression_rate: float) -> tuple[int, int, int]:
    """(elements of the P all_reduce, of the Q all_reduce, of the uncompressed tensors) for
    gradients of these shapes: sum m r, sum n r over the compressed m x n matrices (so
    (m + n) r each, r = min(m, n, rank)), and the numel of the rest."""
    p_elems = q_elems = plain = 0
    for shape in shapes:
        mn = matrix_shape(torch.Size(shape))
        if mn is not None and should_compress(*mn, rank, min_compression_rate):
            r = min(*mn, rank)
            p_elems, q_elems = p_elems + mn[0] * r, q_elems + mn[1] * r
        else:
            plain += int(torch.Size(shape).numel())
    return p_elems, q_elems, plain


def powersgd_bytes(shapes, rank: int, min_compression_rate: float, element_size: int,
                   world_size: int, my_rank: int = 0) -> int:
    """Bytes ``my_rank`` sends for one compressed step with ring all_reduces: one of the
    uncompressed tensors and the P's together, one of the Q's."""
    p_elems, q_elems, plain = powersgd_elements(shapes, rank, min_compression_rate)
    return (ring_bytes(plain + p_elems, element_size, world_size, my_rank)
            + ring_bytes(q_elems, element_size, world_size, my_rank))


def orthogonalize_(p: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns of ``p`` (m x r), in place, applied twice; an all-zero
    column stays zero (a zero gradient has nothing to send)."""
    tiny = torch.finfo(p.dtype).tiny
    for _ in range(2):
        for i in range(p.shape[1]):
            col = p[:, i:i + 1]
            col.div_(col.norm().clamp_min(tiny))
            if i + 1 < p.shape[1]:
                rest = p[:, i + 1:]
                rest.sub_(col * (col * rest).sum(dim=0, keepdim=True))
    return p


class _BucketState:
    def __init__(self) -> None:
        self.steps = 0
        self.error: torch.Tensor | None = None
        self.qs: list[torch.Tensor] | None = None


class PowerSGD:
    """A comm hook: rank-``rank`` PowerSGD with error feedback and warm start.

    ``start_iter``: plain all_reduce for each bucket's first steps. ``min_compression_rate``:
    compress an m x n matrix only if m n > (m + n) r times this. ``seed``: the first random
    Q (every rank draws the same). ``algorithm``: the all_reduce (ring: bytes exactly
    ``powersgd_bytes``). ``report()``: bytes sent and relative error ||x - P^ Q_w^T|| / ||x||
    of this rank's corrected gradient x (Q_w = x^T P^, its own share) in the last step."""

    def __init__(self, rank: int = 2, start_iter: int = 10, min_compression_rate: float = 2.0,
                 warm_start: bool = True, error_feedback: bool = True, seed: int = 0,
                 algorithm: str = "ring"):
        _check_args(rank, start_iter, min_compression_rate, seed)
        self.rank, self.start_iter = rank, start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start, self.error_feedback = bool(warm_start), bool(error_feedback)
        self.seed, self.algorithm = seed, algorithm
        self.states: dict[int, _BucketState] = {}
        self.log = StepLog()
        self.__name__ = f"powersgd(rank={rank})"

    def __call__(self, comm, bucket) -> torch.Tensor:
        state = self.states.setdefault(bucket.index, _BucketState())
        state.steps += 1
        x = bucket.buffer
        if state.steps <= self.start_iter:
            return self._plain(comm, bucket)
        if self.error_feedback and state.error is not None:
            x.add_(state.error)
        corrected = x.clone() if self.error_feedback else None
        norm_sq = squared_norm(x)  # before the uncompressed parts are overwritten
        matrices, plain = self._split(bucket.views)
        qs = self._initial_qs(state, matrices, bucket.index, x)
        ps = [m @ q for m, q in zip(matrices, qs)]
        self._all_reduce_parts(comm, plain + ps, divide=[True] * len(plain) + [False] * len(ps))
        for p in ps:
            orthogonalize_(p)
        qs = [m.T @ p for m, p in zip(matrices, ps)]
        error_sq = sum(squared_norm(m - p @ q.T) for m, p, q in zip(matrices, ps, qs))
        self._all_reduce_parts(comm, qs, divide=[True] * len(qs))
        for m, p, q in zip(matrices, ps, qs):
            torch.matmul(p, q.T, out=m)  # writes the bucket's view: the buffer
        if corrected is not None:
            state.error = corrected.sub_(x)
        state.qs = qs if self.warm_start else None
        self._record(comm, bucket, error_sq, norm_sq, compressed=True)
        return x

    # -- the pieces ------------------------------------------------------------------------
    def _plain(self, comm, bucket) -> torch.Tensor:
        """A step before ``start_iter``: the uncompressed average."""
        all_reduce(comm, bucket.buffer, op="avg", algorithm=self.algorithm)
        self._record(comm, bucket, 0.0, 0.0, compressed=False)
        return bucket.buffer

    def _split(self, views) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The bucket's gradients as (m x n views to compress, tensors sent as they are)."""
        matrices, plain = [], []
        for v in views:
            mn = matrix_shape(v.shape)
            if mn is not None and should_compress(*mn, self.rank, self.min_compression_rate):
                matrices.append(v.view(mn))
            else:
                plain.append(v)
        return matrices, plain

    def _initial_qs(self, state: _BucketState, matrices, index: int, x: torch.Tensor):
        """Last step's Q's (warm start, re-orthogonalized as torch does), or fresh random
        ones drawn from a generator every rank seeds alike."""
        if state.qs is not None:
            return [orthogonalize_(q) for q in state.qs]
        gen = torch.Generator().manual_seed(self.seed + 1_000_003 * index + state.steps)
        qs = [torch.randn(m.shape[1], min(*m.shape, self.rank), generator=gen,
                          dtype=torch.float64) for m in matrices]
        return [orthogonalize_(q.to(dtype=x.dtype, device=x.device)) for q in qs]

    def _all_reduce_parts(self, comm, parts: list[torch.Tensor], divide: list[bool]) -> None:
        """One all_reduce (sum) of the parts' concatenation, copied back; parts with
        ``divide`` are divided by p (averages). Empty lists are skipped."""
        if not parts:
            return
        flat = torch.cat([t.reshape(-1) for t in parts])
        all_reduce(comm, flat, op="sum", algorithm=self.algorithm)
        for t, piece, div in zip(parts, flat.split([t.numel() for t in parts]), divide):
            t.copy_(piece.view_as(t).div_(comm.world_size) if div else piece.view_as(t))

    def _record(self, comm, bucket, error_sq: float, norm_sq: float, compressed: bool) -> None:
        x, p = bucket.buffer, comm.world_size
        shapes = [v.shape for v in bucket.views]
        sent = (powersgd_bytes(shapes, self.rank, self.min_compression_rate, x.element_size(),
                               p, comm.rank) if compressed
                else dense_bytes(x.numel(), x.element_size(), p, comm.rank))
        self.log.record(bucket.index, bytes_sent=sent, error_sq=error_sq, norm_sq=norm_sq,
                        dense=dense_bytes(x.numel(), x.element_size(), p, comm.rank),
                        compressed=compressed)

    def report(self) -> dict:
        return self.log.summary()

    def __repr__(self) -> str:
        return (f"PowerSGD(rank={self.rank}, start_iter={self.start_iter}, "
                f"min_compression_rate={self.min_compression_rate:g}, "
                f"warm_start={self.warm_start}, error_feedback={self.error_feedback})")


def _check_args(rank, start_iter, min_compression_rate, seed) -> None:
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_int(rank) or rank < 1:
        raise ValueError(f"rank must be an integer >= 1 (the approximation's rank), got "
                         f"{rank!r}")
    if not is_int(start_iter) or start_iter < 0:
        raise ValueError(f"start_iter must be an integer >= 0 (plain all_reduce steps "
                         f"first), got {start_iter!r}")
    if isinstance(min_compression_rate, bool) or \
            not isinstance(min_compression_rate, (int, float)) or min_compression_rate <= 0:
        raise ValueError(f"min_compression_rate must be a positive number, got "
                         f"{min_compression_rate!r}")
    if not is_int(seed):
        raise TypeError(f"seed must be an integer, got {seed!r}")
