"""The four communication operators of tensor parallelism, as autograd functions.

Megatron-LM (Shoeybi et al. 2019, section 3) makes a transformer layer model-parallel with
two conjugate operators placed around each split matrix multiply:

* ``f`` (:func:`copy_to_parallel`): identity forward, all-reduce backward. It stands before a
  column-parallel linear: every rank reads the same input, but each rank's slice of the
  output only sees part of the input's gradient, so the gradients are summed going back.
* ``g`` (:func:`reduce_from_parallel`): all-reduce forward, identity backward. It stands after
  a row-parallel linear, whose ranks each hold a partial sum of the output.

and two that change how a tensor is laid out along its last dimension (picotron's
``tensor_parallel/tp_communications.py``; torch's ``Shard(-1)`` / ``Replicate()``):

* :func:`split_to_parallel`: keep this rank's slice forward, all-gather backward;
* :func:`gather_from_parallel`: all-gather forward, keep this rank's slice backward.

Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models") replaces each f by :func:`gather_sequence` (all-gather along the sequence
forward, reduce-scatter backward) and each g by :func:`reduce_scatter_sequence` (its
conjugate), so LayerNorm and dropout run on s/p tokens per rank. An all-gather plus a
reduce-scatter move what one all-reduce moves: the bytes stay, the activations shrink.

Costs, alpha-beta, n the bytes of the full tensor, p ranks, ring algorithm: an all-reduce is
2(p-1) alpha + 2 (p-1)/p n beta; an all-gather of pieces of n/p bytes is (p-1) alpha +
(p-1)/p n beta, and so is a reduce-scatter (plus its reduction); a split is free.
``md.costmodel``'s ``tp.op_cost`` gives each operator's as code.
"""

from __future__ import annotations

import torch

from ...collectives import all_gather, all_reduce, reduce_scatter

OPERATORS = ("copy", "reduce", "split", "gather", "gather_sequence", "reduce_scatter_sequence")


def _all_reduce(comm, x: torch.Tensor, algorithm: str) -> torch.Tensor:
    """A summed copy of ``x`` (the input is left alone: autograd may still need it)."""
    out = x.contiguous().clone()
    return all_reduce(comm, out, op="sum", algorithm=algorithm)


def _split_last(comm, x: torch.Tensor) -> torch.Tensor:
    """This rank's slice of ``x`` along its last dimension (which p must divide)."""
    p = comm.world_size
    if x.shape[-1] % p:
        raise ValueError(f"split_to_parallel: the last dimension ({x.shape[-1]}) is not "
                         f"divisible by the tensor-parallel world size {p}")
    return x.chunk(p, dim=-1)[comm.rank].contiguous()


def _gather_last(comm, x: torch.Tensor) -> torch.Tensor:
    """The ranks' slices joined along the last dimension, in rank order."""
    if comm.world_size == 1:
        return x
    stacked = all_gather(comm, x.contiguous())  # (p, *x.shape)
    return torch.cat(stacked.unbind(0), dim=-1)


def _gather_seq(comm, x: torch.Tensor) -> torch.Tensor:
    """(b, s/p, ...) slices joined along dimension 1, in rank order: (b, s, ...)."""
    if comm.world_size == 1:
        return x
    stacked = all_gather(comm, x.contiguous())  # (p, b, s/p, ...)
    return stacked.transpose(0, 1).flatten(1, 2)


def _reduce_scatter_seq(comm, x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of (b, s, ...), this rank's slice s/p along dimension 1."""
    p = comm.world_size
    if x.shape[1] % p:
        raise ValueError(f"sequence parallelism: the sequence length {x.shape[1]} is not "
                         f"divisible by the tensor-parallel world size {p}")
    if p == 1:
        return x
    shard = reduce_scatter(comm, x.transpose(0, 1).contiguous())  # (s/p, b, ...)
    return shard.transpose(0, 1).contiguous()


class CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce of the input's gradient backward."""

    @staticmethod
    def forward(ctx, x, comm, algorithm):
        ctx.comm, ctx.algorithm = comm, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(ctx.comm, grad, ctx.algorithm), None, None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce (sum of partial results) forward; identity backward."""

    @staticmethod
    def forward(ctx, x, comm, algorithm):
        return _all_reduce(comm, x, algorithm)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class SplitToParallel(torch.autograd.Function):
    """Keep this rank's last-dimension slice forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _split_last(comm, x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(ctx.comm, grad), None


class GatherFromParallel(torch.autograd.Function):
    """All-gather the slices along the last dimension forward; keep this rank's slice of
    the gradient backward (every rank holds the whole gradient already)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _gather_last(comm, x)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(ctx.comm, grad), None


class GatherSequence(torch.autograd.Function):
    """All-gather along the sequence forward; reduce-scatter the gradient backward (the
    sequence-parallel f: every rank's slice of the next linear's output saw all tokens)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _gather_seq(comm, x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(ctx.comm, grad), None


class ReduceScatterSequence(torch.autograd.Function):
    """Reduce-scatter along the sequence forward; all-gather the gradient backward (the
    sequence-parallel g: partial sums added, each rank keeps s/p tokens)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _reduce_scatter_seq(comm, x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(ctx.comm, grad), None


def copy_to_parallel(x: torch.Tensor, comm, algorithm: str = "auto") -> torch.Tensor:
    """f: identity forward, all-reduce backward (before a column-parallel linear)."""
    return CopyToParallel.apply(x, comm, algorithm)


def reduce_from_parallel(x: torch.Tensor, comm, algorithm: str = "auto") -> torch.Tensor:
    """g: all-reduce forward, identity backward (after a row-parallel linear)."""
    return ReduceFromParallel.apply(x, comm, algorithm)


def split_to_parallel(x: torch.Tensor, comm) -> torch.Tensor:
    """Last-dimension slice forward, all-gather backward."""
    return SplitToParallel.apply(x, comm)


def gather_from_parallel(x: torch.Tensor, comm) -> torch.Tensor:
    """All-gather along the last dimension forward, slice backward."""
    return GatherFromParallel.apply(x, comm)


def gather_sequence(x: torch.Tensor, comm) -> torch.Tensor:
    """(b, s/p, h) -> (b, s, h): all-gather forward, reduce-scatter backward."""
    return GatherSequence.apply(x, comm)


def reduce_scatter_sequence(x: torch.Tensor, comm) -> torch.Tensor:
    """(b, s, h) partial sums -> (b, s/p, h) summed: reduce-scatter forward, all-gather
    backward."""
    return ReduceScatterSequence.apply(x, comm)
