"""Exercise 05, part 5 (stretch): the vocabulary-parallel cross-entropy
(``vocab_parallel_cross_entropy``), against ``F.cross_entropy`` on the whole logits: the
loss on every rank, the gradient of each rank's slice, logits near 800 (where exp
overflows without the maximum), and no collective larger than one value per position (the
full logits must never travel)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.feedback import Mistake, values
from .tp_feedback import close, collective_names, describe, grad_text, number
from .tp_probe import ce_case, ce_data

WORLD_SIZES = (1, 2, 4)


def check_vocab_parallel_cross_entropy(learner) -> str:
    logits, targets = ce_data()
    full = logits.clone().requires_grad_()
    loss = F.cross_entropy(full, targets)
    loss.backward()
    for p in WORLD_SIZES:
        label = f"world_size={p}"
        ranks = learner.run_ranks(ce_case, p, [()], "vocab_parallel_cross_entropy", [label])
        got_all = [r[0]["value"] for r in ranks]
        for rank in range(p):
            got, where = got_all[rank], f"with {label}: rank {rank}"
            if "returned" in got:
                raise Mistake(f"{where}: vocab_parallel_cross_entropy returned "
                              f"{describe(got['returned'])}; expected the mean loss, a "
                              "tensor of shape () (the same on every rank)")
            _check_loss(got["loss"], loss.detach(), [g.get("loss") for g in got_all], where)
            want = full.grad.chunk(p, 1)[rank]
            if not close(got["grad"], want):
                raise Mistake(f"{where}: the gradient of this rank's logits is "
                              f"{grad_text(got['grad'])}, expected {values(want)} (softmax "
                              f"minus one-hot, over the number of positions, this rank's "
                              f"columns); {_ce_grad_hint(got['grad'], want, p)}")
            big = [c for c in got["calls"] if c["numel"] > logits.shape[0]]
            if big and p > 1:
                raise Mistake(f"{where}: the loss is right, but you called "
                              f"{collective_names(big)}: whole slices of logits travelled. "
                              "Only per-position numbers "
                              f"need to ({logits.shape[0]} values each): the maximum, the sum "
                              "of exponentials and the target's logit")
    return ("F.cross_entropy's loss and gradient from vocabulary slices, on 1, 2 and 4 ranks, "
            "with logits near 800, and no collective larger than one value per position")


def _check_loss(got, want, every_rank: list, where: str) -> None:
    if close(got, want):
        return
    head = f"{where}: the loss is {number(got)}, expected {want.item():.6g}"
    if isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        raise Mistake(f"{head}; exp overflowed (one position's logits are near 800): take "
                      "the maximum over the whole vocabulary first (this rank's maximum, "
                      "then md.all_reduce with op=\"max\") and subtract it before exp")
    if any(not close(other, got) for other in every_rank):
        shown = ", ".join(number(other) for other in every_rank)
        raise Mistake(f"{head}; the loss differs between ranks ({shown}): each rank used "
                      "only its own slice of the vocabulary. The sum of exponentials and "
                      "the target's logit must be summed over ranks (g)")
    raise Mistake(f"{head}; the loss per position is log(sum over the whole vocabulary of "
                  "exp(logit)) - logit[target], where the target's logit lives on one rank "
                  f"(rank r holds words [r * V/p, (r+1) * V/p)); the mean over positions")


def _ce_grad_hint(grad, want, p: int) -> str:
    if not isinstance(grad, torch.Tensor):
        return ("no gradient reached the logits: md.all_reduce is not differentiable; sum "
                "through your ReduceFromParallel (g), whose backward is the identity, or "
                "write the backward yourself")
    if p > 1 and close(grad, want * p):
        return ("it is world_size times too large: the gradient was summed over ranks on "
                "its way back (an all-reduce in g's backward?)")
    return ("the gradient is (softmax(logits) - one_hot(target)) / positions: is the "
            "one-hot on the rank that holds the target word, and is the maximum (which only "
            "keeps exp in range) taken from logits.detach()?")
