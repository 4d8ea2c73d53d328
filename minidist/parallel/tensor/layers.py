"""Megatron-LM's parallel layers: a linear split by output columns, a linear split by input
rows, and an embedding split by vocabulary (Shoeybi et al. 2019, section 3; torch's
``ColwiseParallel`` / ``RowwiseParallel``; picotron's ``tensor_parallel/tensor_parallel.py``).

Each is built from a full layer (``from_full``) so that tests compare it with that layer, and
gathers its full weight back (``full_weight``, ``full_bias``; ``grad=True`` for gradients).

Y = X A with A split by columns [A_1 .. A_p]: rank r computes Y_r = X A_r, no communication
forward; the input's gradient is a sum over ranks (the f operator). With A split by rows and X
already split by columns, rank r computes the partial sum X_r A_r and one all-reduce (the g
operator) adds them: column-then-row costs one all-reduce forward and one backward, each of
the b*s*h activation, 2 (p-1)/p b s h element_size bytes per rank with the ring
(``costmodel.tp.megatron_mlp_bytes``; the whole step in ``costmodel.tp.step_bytes``).
Weight memory per rank is 1/p of the full layer's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...checks import token_ids
from ...collectives import all_gather
from .mappings import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    reduce_scatter_sequence,
    split_to_parallel,
)


def check_divisible(size: int, comm, what: str) -> int:
    """size // p, or a clear error when the tensor-parallel world size does not divide it."""
    if size % comm.world_size:
        raise ValueError(f"{what}={size} is not divisible by the tensor-parallel world size "
                         f"{comm.world_size}")
    return size // comm.world_size


def _check_layer(layer, kind: type, what: str) -> None:
    if not isinstance(layer, kind):
        raise TypeError(f"{what}: expected a torch.nn.{kind.__name__}, got "
                        f"{type(layer).__name__}")


def _gather(comm, t: torch.Tensor | None, what: str) -> torch.Tensor:
    if t is None:
        raise ValueError(f"{what} is None (no backward has run yet?)")
    return all_gather(comm, t.detach().contiguous())


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's output rows (the columns of Y) split over ranks.

    ``rows``: which of the full layer's output rows this rank holds (contiguous block r by
    default; attention picks q, k and v rows per head). The input goes through f (all-reduce
    of its gradient backward); ``gather_output=True`` all-gathers the output so every rank
    holds all of Y, else each keeps its slice Y_r (for a row-parallel layer to consume).
    ``sequence_parallel=True``: the input arrives already all-gathered along the sequence by
    ``mappings.gather_sequence`` (whose backward reduce-scatters the gradient), so no f here.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor,
                 comm, gather_output: bool = False, algorithm: str = "auto",
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        self.comm, self.gather_output, self.algorithm = comm, gather_output, algorithm
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        # on the weight's device: _place all-gathers it (NCCL sends CUDA tensors only)
        self.register_buffer("rows", rows.to(self.weight.device, copy=True), persistent=False)

    @classmethod
    def from_full(cls, linear: nn.Linear, comm, gather_output: bool = False,
                  algorithm: str = "auto", rows: torch.Tensor | None = None,
                  sequence_parallel: bool = False) -> ColumnParallelLinear:
        """This rank's output rows of ``linear`` (copied; ``linear`` is left alone)."""
        _check_layer(linear, nn.Linear, "ColumnParallelLinear.from_full")
        local = check_divisible(linear.out_features, comm, "out_features")
        if rows is None:
            rows = torch.arange(comm.rank * local, (comm.rank + 1) * local,
                                device=linear.weight.device)
        if rows.numel() != local or rows.unique().numel() != local or \
                not 0 <= int(rows.min()) <= int(rows.max()) < linear.out_features:
            raise ValueError(f"ColumnParallelLinear.from_full: rows must be {local} distinct "
                             f"output rows in [0, {linear.out_features}), got "
                             f"{rows.tolist()[:8]}...")
        bias = None if linear.bias is None else linear.bias[rows]
        return cls(linear.weight[rows], bias, rows, comm, gather_output, algorithm,
                   sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            x = copy_to_parallel(x, self.comm, self.algorithm)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_parallel(y, self.comm) if self.gather_output else y

    def _place(self, shards: torch.Tensor) -> torch.Tensor:
        """Put the ranks' stacked shards (p, out/p, ...) back in the full layer's order."""
        rows = all_gather(self.comm, self.rows).reshape(-1)
        full = torch.empty((rows.numel(), *shards.shape[2:]), dtype=shards.dtype,
                           device=shards.device)
        full[rows] = shards.reshape(rows.numel(), *shards.shape[2:])
        return full

    def full_weight(self, grad: bool = False) -> torch.Tensor:
        """The full (out, in) weight (or its gradient), gathered; collective."""
        w = self.weight.grad if grad else self.weight
        return self._place(_gather(self.comm, w, "ColumnParallelLinear weight.grad"))

    def full_bias(self, grad: bool = False) -> torch.Tensor | None:
        if self.bias is None:
            return None
        b = self.bias.grad if grad else self.bias
        return self._place(_gather(self.comm, b, "ColumnParallelLinear bias.grad"))

    def extra_repr(self) -> str:
        return (f"in={self.weight.shape[1]}, out_local={self.weight.shape[0]}, "
                f"p={self.comm.world_size}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's input columns split over ranks: each rank multiplies its
    slice of x, g all-reduces the partial sums, and the bias is added once, after it.
    ``input_is_parallel=False`` first splits a full x (all-gather of its gradient back).
    ``sequence_parallel=True``: a reduce-scatter along the sequence instead of g, each rank
    keeping s/p tokens of the sum (the bias's gradient is then partial on each rank).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, comm,
                 input_is_parallel: bool = True, algorithm: str = "auto",
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        self.comm, self.input_is_parallel, self.algorithm = comm, input_is_parallel, algorithm
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @classmethod
    def from_full(cls, linear: nn.Linear, comm, input_is_parallel: bool = True,
                  algorithm: str = "auto", sequence_parallel: bool = False
                  ) -> RowParallelLinear:
        _check_layer(linear, nn.Linear, "RowParallelLinear.from_full")
        local = check_divisible(linear.in_features, comm, "in_features")
        cols = slice(comm.rank * local, (comm.rank + 1) * local)
        return cls(linear.weight[:, cols], linear.bias, comm, input_is_parallel, algorithm,
                   sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = split_to_parallel(x, self.comm)
        elif x.shape[-1] != self.weight.shape[1]:
            raise ValueError(f"RowParallelLinear: input's last dimension is {x.shape[-1]}, "
                             f"expected this rank's slice of {self.weight.shape[1]} "
                             "(input_is_parallel=True)")
        y = F.linear(x, self.weight)
        y = reduce_scatter_sequence(y, self.comm) if self.sequence_parallel else \
            reduce_from_parallel(y, self.comm, self.algorithm)
        return y if self.bias is None else y + self.bias

    def full_weight(self, grad: bool = False) -> torch.Tensor:
        w = self.weight.grad if grad else self.weight
        return torch.cat(_gather(self.comm, w, "RowParallelLinear weight.grad").unbind(0), -1)

    def full_bias(self, grad: bool = False) -> torch.Tensor | None:
        """The bias is whole on every rank (and its gradient the same on every rank)."""
        if self.bias is None:
            return None
        b = self.bias.grad if grad else self.bias
        if b is None:
            raise ValueError("RowParallelLinear bias.grad is None (no backward has run yet?)")
        return b.detach().clone()

    def extra_repr(self) -> str:
        return (f"in_local={self.weight.shape[1]}, out={self.weight.shape[0]}, "
                f"p={self.comm.world_size}, input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(nn.Module):
    """An embedding table split by vocabulary rows: rank r holds tokens
    [r V/p, (r+1) V/p). Each rank looks up the tokens it holds, writes zeros for the others,
    and g all-reduces: one all-reduce of b*s*h forward, none backward (Megatron-LM 3).
    ``sequence_parallel=True``: a reduce-scatter along the sequence instead (s/p tokens each).
    """

    def __init__(self, weight: torch.Tensor, comm, vocab_start: int,
                 algorithm: str = "auto", sequence_parallel: bool = False) -> None:
        super().__init__()
        self.comm, self.algorithm = comm, algorithm
        self.sequence_parallel = sequence_parallel
        self.vocab_start = vocab_start
        self.vocab_end = vocab_start + weight.shape[0]
        self.weight = nn.Parameter(weight.detach().clone())

    @classmethod
    def from_full(cls, embedding: nn.Embedding, comm, algorithm: str = "auto",
                  sequence_parallel: bool = False) -> VocabParallelEmbedding:
        _check_layer(embedding, nn.Embedding, "VocabParallelEmbedding.from_full")
        local = check_divisible(embedding.num_embeddings, comm, "vocab_size (num_embeddings)")
        start = comm.rank * local
        return cls(embedding.weight[start:start + local], comm, start, algorithm,
                   sequence_parallel)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        token_ids(idx, self.weight.shape[0] * self.comm.world_size,
                  "VocabParallelEmbedding: token ids")
        outside = (idx < self.vocab_start) | (idx >= self.vocab_end)
        local = (idx - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_sequence(out, self.comm)
        return reduce_from_parallel(out, self.comm, self.algorithm)

    def full_weight(self, grad: bool = False) -> torch.Tensor:
        w = self.weight.grad if grad else self.weight
        return _gather(self.comm, w, "VocabParallelEmbedding weight.grad").flatten(0, 1)

    def extra_repr(self) -> str:
        return (f"vocab=[{self.vocab_start}, {self.vocab_end}), dim={self.weight.shape[1]}, "
                f"p={self.comm.world_size}")
