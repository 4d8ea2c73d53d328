"""Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.2.2): the parts of a block tensor parallelism leaves whole on
every rank (LayerNorms, dropout, the residual stream) run on s/p tokens per rank instead.

Between the regions the f and g of tensor parallelism become:

* before a column-parallel linear: all-gather along the sequence (``mappings.gather_sequence``),
  reduce-scatter backward: here the LayerNorm that feeds it gathers its output
  (:class:`GatheringLayerNorm`);
* after a row-parallel linear: reduce-scatter along the sequence instead of all-reduce
  (``RowParallelLinear(sequence_parallel=True)``), all-gather backward.

An all-gather plus a reduce-scatter send the bytes of one all-reduce, (p-1)/p n each, so the
communication is unchanged while the residual stream, LayerNorm and dropout activations are
1/p per rank. The price: parameters that see only this rank's tokens (LayerNorms, the
position embedding, the row-parallel biases) get partial gradients, summed over ranks by a
hook as they are produced (:func:`sum_partial_gradients`; Megatron all-reduces them after
backward).
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import all_reduce
from .mappings import gather_sequence


class GatheringLayerNorm(nn.LayerNorm):
    """LayerNorm over this rank's s/p tokens, then all-gathered along the sequence for the
    column-parallel linear that follows (reduce-scatter of the gradient backward)."""

    def __init__(self, normalized_shape, comm, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(normalized_shape, eps=eps, bias=bias)
        self.comm = comm

    @classmethod
    def from_full(cls, ln: nn.LayerNorm, comm) -> GatheringLayerNorm:
        if not isinstance(ln, nn.LayerNorm):
            raise TypeError(f"GatheringLayerNorm.from_full: expected a torch.nn.LayerNorm, got "
                            f"{type(ln).__name__}")
        new = cls(ln.normalized_shape, comm, eps=ln.eps, bias=ln.bias is not None)
        new.load_state_dict(ln.state_dict())
        return new.to(ln.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_sequence(super().forward(x), self.comm)


class SequenceSlicedEmbedding(nn.Embedding):
    """The position embedding under sequence parallelism: looks up the positions it is given
    and keeps this rank's s/p of them, to add to this rank's tokens."""

    def __init__(self, num_embeddings: int, embedding_dim: int, comm) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.comm = comm

    @classmethod
    def from_full(cls, emb: nn.Embedding, comm) -> SequenceSlicedEmbedding:
        new = cls(emb.num_embeddings, emb.embedding_dim, comm)
        new.load_state_dict(emb.state_dict())
        return new.to(emb.weight.dtype)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        p = self.comm.world_size
        if pos.shape[0] % p:
            raise ValueError(f"sequence parallelism: the sequence length {pos.shape[0]} is "
                             f"not divisible by the tensor-parallel world size {p}")
        return super().forward(pos.chunk(p)[self.comm.rank])


def sum_partial_gradients(params, comm, algorithm: str = "auto") -> None:
    """Register on each parameter a hook that all-reduces (sums) its gradient over ``comm``
    when backward produces it: these parameters saw only this rank's tokens. Every rank
    runs the same backward graph in the same order, so the all-reduces match up."""
    def summed(grad: torch.Tensor) -> torch.Tensor:
        return all_reduce(comm, grad.contiguous().clone(), op="sum", algorithm=algorithm)

    for p in params:
        p.register_hook(summed)


def sequence_parallel_blocks(model: nn.Module, comm, algorithm: str = "auto") -> None:
    """Turn the LayerNorms and the position embedding of a GPT already split by
    ``parallelize_gpt`` into their sequence-parallel forms, in place, and hook the partial
    gradients (LayerNorms, position embedding, row-parallel biases)."""
    t = model.transformer
    t.wpe = SequenceSlicedEmbedding.from_full(t.wpe, comm)
    for block in t.h:
        block.ln_1 = GatheringLayerNorm.from_full(block.ln_1, comm)
        block.ln_2 = GatheringLayerNorm.from_full(block.ln_2, comm)
    t.ln_f = GatheringLayerNorm.from_full(t.ln_f, comm)
    partial = [*t.wpe.parameters(), *t.ln_f.parameters()]
    for block in t.h:
        partial += [*block.ln_1.parameters(), *block.ln_2.parameters()]
        partial += [lin.bias for lin in (block.attn.c_proj, block.mlp.c_proj)
                    if lin.bias is not None]
    sum_partial_gradients(partial, comm, algorithm)
