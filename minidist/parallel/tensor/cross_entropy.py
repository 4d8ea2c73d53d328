"""Cross-entropy over logits split by vocabulary, never gathering the full logits.

A language model's last layer is the widest: b*s*V logits, V tens of thousands. Gathering
them to call ``F.cross_entropy`` would move (p-1)/p b s V elements per rank and hold all of
them on each; Megatron-LM (Shoeybi et al. 2019, section 3) instead reduces three numbers per
token over the ranks, each rank working on its V/p columns:

1. the maximum logit (all-reduce max), subtracted for a stable exp;
2. the sum of exp over the vocabulary (all-reduce sum): log of it is the log-partition;
3. the target's logit, taken by the one rank that holds the target (all-reduce sum).

loss = log(sum exp(z - m)) - (z_target - m). Backward is local: softmax minus one-hot on
this rank's columns. Cost: 3 all-reduces of b*s elements, against an all-gather of b*s*V
for the naive path (``md.costmodel``'s ``tp.cross_entropy_bytes`` and
``tp.gathered_logits_bytes``).
torch's counterpart is ``torch.distributed.tensor.parallel.loss_parallel``.
"""

from __future__ import annotations

import torch

from ...checks import token_ids
from ...collectives import all_reduce


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, comm, vocab_start, algorithm):
        m = logits.detach().max(dim=-1).values.contiguous()
        all_reduce(comm, m, op="max", algorithm=algorithm)
        shifted = logits.detach() - m.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1).contiguous()
        all_reduce(comm, sum_exp, op="sum", algorithm=algorithm)
        inside = (targets >= vocab_start) & (targets < vocab_start + logits.shape[-1])
        local = (targets - vocab_start).masked_fill(~inside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        picked = picked.contiguous()
        all_reduce(comm, picked, op="sum", algorithm=algorithm)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, inside)
        return (sum_exp.log() - picked).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, inside = ctx.saved_tensors
        g = softmax.clone()  # d loss / d z = softmax - one_hot(target), on this rank's columns
        rows = g.view(-1, g.shape[-1])
        hit = inside.reshape(-1).nonzero().squeeze(-1)
        rows[hit, local.reshape(-1)[hit]] -= 1.0
        return g * (grad / local.numel()), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, comm,
                                 vocab_start: int | None = None,
                                 algorithm: str = "auto") -> torch.Tensor:
    """Mean cross-entropy of ``targets`` (any shape, token ids of the full vocabulary) under
    ``logits`` (same shape plus this rank's V/p vocabulary columns, starting at
    ``vocab_start``, rank * V/p by default); equals ``F.cross_entropy`` on the gathered logits.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_cross_entropy: logits {tuple(logits.shape)} and "
                         f"targets {tuple(targets.shape)} disagree (logits = targets' shape "
                         "plus a vocabulary dimension)")
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"vocab_parallel_cross_entropy: targets must be integer token ids, "
                        f"got {targets.dtype}")
    token_ids(targets, logits.shape[-1] * comm.world_size, "vocab_parallel_cross_entropy: targets")
    start = comm.rank * logits.shape[-1] if vocab_start is None else vocab_start
    return _VocabParallelCrossEntropy.apply(logits, targets.long(), comm, start, algorithm)
