"""``parallelize_gpt``: the small GPT of ``md.models`` laid out as Megatron-LM does it.

Per block (Shoeybi et al. 2019, figure 3):

* MLP: ``c_fc`` column-parallel (each rank a 1/p slice of the 4h hidden units, GELU
  applied locally), ``c_proj`` row-parallel: one all-reduce forward (g), one backward (f).
* Attention split by heads: rank r holds heads [r n_head/p, (r+1) n_head/p), i.e. the q, k
  and v rows of those heads in ``c_attn`` (:func:`qkv_rows`) and the matching input columns of
  ``c_proj``; softmax(q k^T) v runs on local heads only. Again one all-reduce each way.

So 4 all-reduces of b*s*h elements per block per training step. The token embedding and the
head are split by vocabulary (``VocabParallelEmbedding``; the head a column-parallel linear
whose weight stays tied to the embedding shard, as the full model's), and the loss is
``vocab_parallel_cross_entropy``: the full b*s*V logits never exist on any rank. LayerNorms
and the position embedding are replicated; their gradients agree on every rank without
communication, since their inputs and output gradients already do. With
``sequence_parallel=True`` they work on s/p tokens per rank instead (``sequence.py``).

Dropout would need the same random mask on every rank in the replicated regions and different
ones on the shards (Megatron's RNG tracker); this module refuses ``dropout > 0``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ...models.gpt import GPT
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_divisible,
)
from .mappings import gather_from_parallel
from .naive_mlp import gather_output_mlp
from .sequence import sequence_parallel_blocks

SHARDED = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)


def qkv_rows(n_embd: int, n_head: int, rank: int, world_size: int) -> torch.Tensor:
    """The output rows of nanoGPT's ``c_attn`` ([q; k; v], each n_head blocks of head_dim
    rows) that hold rank's heads: its q rows, then its k rows, then its v rows."""
    local = n_embd // world_size  # n_head / p heads of head_dim rows
    start = rank * local
    return torch.cat([torch.arange(part * n_embd + start, part * n_embd + start + local)
                      for part in range(3)])


class TensorParallelGPT(nn.Module):
    """A ``GPT`` whose layers are sharded over ``comm``; built by :func:`parallelize_gpt`.

    ``forward(idx, targets=None)`` returns ``(logits, loss)`` like ``GPT``, but ``logits`` is
    this rank's vocabulary slice (b, s, V/p) unless ``gather_logits=True``, and ``loss`` is the
    vocabulary-parallel cross-entropy. ``full_parameters()`` gathers the full model back.
    """

    def __init__(self, model: GPT, comm, algorithm: str = "auto") -> None:
        super().__init__()
        self.model, self.comm, self.algorithm = model, comm, algorithm

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                gather_logits: bool = False):
        x = idx
        for stage in self.model.stages():
            x = stage(x)
        loss = None if targets is None else vocab_parallel_cross_entropy(
            x, targets, self.comm, algorithm=self.algorithm)
        if gather_logits:
            x = gather_from_parallel(x, self.comm)
        return x, loss

    def full_parameters(self, grad: bool = False) -> dict[str, torch.Tensor]:
        """Every parameter (or its gradient) of the full GPT, gathered, by the full model's
        names and in its ``named_parameters()`` order. Collective: call it on every rank."""
        out: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for prefix, module in self.model.named_modules():
            for name, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue  # a tied weight is listed once, as GPT.named_parameters does
                seen.add(id(p))
                key = f"{prefix}.{name}" if prefix else name
                if isinstance(module, SHARDED):
                    full = module.full_weight(grad) if name == "weight" else module.full_bias(
                        grad)
                else:
                    t = p.grad if grad else p
                    if t is None:
                        raise ValueError(f"{key}.grad is None (no backward has run yet?)")
                    full = t.detach().clone()
                out[key] = full
        return out


def _check_model(gpt, comm) -> None:
    if not isinstance(gpt, GPT):
        raise TypeError(f"parallelize_gpt: expected an md.models.GPT, got {type(gpt).__name__}")
    cfg = gpt.config
    check_divisible(cfg.n_head, comm, "n_head")
    check_divisible(cfg.vocab_size, comm, "vocab_size")
    if cfg.dropout > 0:
        raise ValueError(f"parallelize_gpt: dropout={cfg.dropout} is not supported (ranks "
                         "would need matching dropout masks); use dropout=0.0")


def parallelize_gpt(gpt: GPT, comm, algorithm: str = "auto", naive_mlp: bool = False,
                    sequence_parallel: bool = False) -> TensorParallelGPT:
    """A tensor-parallel copy of ``gpt`` (which is left alone) over ``comm``, as
    Megatron-LM lays it out (module docstring). ``naive_mlp=True`` splits each MLP the naive
    way instead (``naive_mlp.gather_output_mlp``: every linear gathers its output).
    ``sequence_parallel=True`` adds sequence parallelism (``sequence.py``; the sequence length
    must be divisible by the world size). ``algorithm``: the all-reduce algorithm of every f
    and g (``md.ALL_REDUCE_ALGORITHMS``)."""
    _check_model(gpt, comm)
    if naive_mlp and sequence_parallel:
        raise ValueError("parallelize_gpt: naive_mlp and sequence_parallel do not combine")
    cfg, p, r = gpt.config, comm.world_size, comm.rank
    kw = {"algorithm": algorithm, "sequence_parallel": sequence_parallel}
    model = copy.deepcopy(gpt)
    t, full = model.transformer, gpt.transformer
    t.wte = VocabParallelEmbedding.from_full(full.wte, comm, **kw)
    for block, full_block in zip(t.h, full.h):
        attn, full_attn = block.attn, full_block.attn
        attn.c_attn = ColumnParallelLinear.from_full(
            full_attn.c_attn, comm, rows=qkv_rows(cfg.n_embd, cfg.n_head, r, p), **kw)
        attn.c_proj = RowParallelLinear.from_full(full_attn.c_proj, comm, **kw)
        attn.n_head = cfg.n_head // p  # the attention runs on this rank's heads only
        if naive_mlp:
            block.mlp = gather_output_mlp(full_block.mlp, comm, algorithm)
        else:
            block.mlp.c_fc = ColumnParallelLinear.from_full(full_block.mlp.c_fc, comm, **kw)
            block.mlp.c_proj = RowParallelLinear.from_full(full_block.mlp.c_proj, comm, **kw)
    model.lm_head = ColumnParallelLinear.from_full(gpt.lm_head, comm, **kw)
    if cfg.tie_weights:
        model.lm_head.weight = t.wte.weight  # the same vocabulary rows on this rank
    if sequence_parallel:
        sequence_parallel_blocks(model, comm, algorithm)
    return TensorParallelGPT(model, comm, algorithm)
