"""What runs on each rank in exercise 05's tests: the test MLP, its data, its reference
shards, and a record of every collective the learner's code calls and whether forward or
backward called it (``Calls``, through ``engine.calls``, so however
the learner imported ``md.all_reduce``).

Everything is float64 and drawn from fixed generators, so the grader's process rebuilds the
same tensors to compute its oracle: the full layer, in one process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...engine.calls import record_collectives
from ...engine.data import pattern

H, HIDDEN, BATCH, SEQ = 8, 32, 2, 3  # the MLP: h -> 4h -> h on a (batch, seq, h) input
POSITIONS, VOCAB = 12, 32  # the cross-entropy: 12 positions over 32 words
OPERATOR_SHAPE = (2, 3, 4)


def mlp_weights() -> tuple[torch.Tensor, ...]:
    """(c_fc weight, c_fc bias, c_proj weight, c_proj bias) of the test MLP, as nn.Linear
    stores them: weight is (out_features, in_features)."""
    g = torch.Generator().manual_seed(5)
    w1 = torch.randn(HIDDEN, H, generator=g, dtype=torch.float64) / H ** 0.5
    b1 = torch.randn(HIDDEN, generator=g, dtype=torch.float64)
    w2 = torch.randn(H, HIDDEN, generator=g, dtype=torch.float64) / HIDDEN ** 0.5
    b2 = torch.randn(H, generator=g, dtype=torch.float64)
    return w1, b1, w2, b2


def mlp_data() -> tuple[torch.Tensor, torch.Tensor]:
    """The input x (the same on every rank) and the gradient of the loss w.r.t. the output
    (the same on every rank too: everything after the MLP is replicated)."""
    g = torch.Generator().manual_seed(6)
    return (torch.randn(BATCH, SEQ, H, generator=g, dtype=torch.float64),
            torch.randn(BATCH, SEQ, H, generator=g, dtype=torch.float64))


def full_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def shard_of(w1, b1, w2, b2, rank: int, p: int) -> tuple[torch.Tensor, ...]:
    """Rank ``rank``'s pieces, as Megatron splits them: c_fc column-parallel (block ``rank``
    of the output features: rows of its weight, and of its bias), c_proj row-parallel
    (block ``rank`` of the input features: columns of its weight; the whole bias)."""
    return w1.chunk(p, 0)[rank], b1.chunk(p)[rank], w2.chunk(p, 1)[rank], b2


def ce_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Full logits (positions x vocabulary) and targets. One position's logits are near 800,
    where exp overflows in float64 unless the maximum is taken out first; the targets fall
    in every rank's slice of the vocabulary."""
    g = torch.Generator().manual_seed(7)
    logits = 3 * torch.randn(POSITIONS, VOCAB, generator=g, dtype=torch.float64)
    logits[5] += 800.0
    targets = torch.randperm(VOCAB, generator=g)[:POSITIONS]
    targets[:4] = torch.tensor([0, VOCAB - 1, VOCAB // 2, VOCAB // 2 - 1])
    return logits, targets


class Calls:
    """Every collective call of this rank, with its size, its op (all_reduce's, else "sum")
    and the phase it was made in."""

    def __init__(self) -> None:
        self.phase, self.calls = "forward", []
        record_collectives(lambda c: self.calls.append(
            {"name": c.name, "phase": self.phase, "numel": c.numel, "op": c.op}))


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def _returned(y, shape) -> dict | None:
    """None if the learner's function returned a tensor of ``shape``; else what it was."""
    if isinstance(y, torch.Tensor) and tuple(y.shape) == tuple(shape):
        return None
    return {"returned": y if isinstance(y, torch.Tensor) else repr(y)[:120],
            "shape": list(y.shape) if isinstance(y, torch.Tensor) else None}


def operator_case(comm, namespace, name: str) -> dict:
    """f or g on this rank. f gets the same input on every rank (a replicated activation);
    g gets this rank's partial sum, through a multiply so that it is not a leaf (as the
    output of a matrix multiply). Backward starts from a rank-specific gradient for f (each
    rank's slice of the next layer sends back its own) and from the same gradient on every
    rank for g (what follows g is replicated)."""
    p, rank = comm.world_size, comm.rank
    record = Calls()
    if name == "CopyToParallel":
        x = _leaf(pattern(0, OPERATOR_SHAPE, torch.float64, 1))
        upstream = pattern(rank, OPERATOR_SHAPE, torch.float64, p)
        given = x
    else:
        x = _leaf(pattern(rank, OPERATOR_SHAPE, torch.float64, p))
        upstream = pattern(0, OPERATOR_SHAPE, torch.float64, 1) + 1
        given = x * 1
    y = namespace[name].apply(given, comm)
    wrong = _returned(y, OPERATOR_SHAPE)
    if wrong:
        return wrong
    y_value = y.detach().clone()
    record.phase = "backward"
    y.backward(upstream)
    return {"y": y_value, "grad": x.grad, "calls": record.calls}


def mlp_case(comm, namespace) -> dict:
    """The learner's parallel_mlp on this rank's shards (the grader's, as leaves); backward
    from the same output gradient on every rank."""
    x, dy = mlp_data()
    x = _leaf(x)
    pieces = [_leaf(t) for t in shard_of(*mlp_weights(), comm.rank, comm.world_size)]
    record = Calls()
    y = namespace["parallel_mlp"](x, *pieces, comm)
    wrong = _returned(y, dy.shape)
    if wrong:
        return wrong
    y_value = y.detach().clone()
    record.phase = "backward"
    if y.requires_grad:
        (y * dy).sum().backward()
    return {"y": y_value, "x_grad": x.grad, "grads": [t.grad for t in pieces],
            "calls": record.calls}


def ce_case(comm, namespace) -> dict:
    """The learner's vocab_parallel_cross_entropy on this rank's slice of the logits."""
    logits, targets = ce_data()
    mine = _leaf(logits.chunk(comm.world_size, 1)[comm.rank])
    record = Calls()
    loss = namespace["vocab_parallel_cross_entropy"](mine, targets.clone(), comm)
    wrong = _returned(loss, ())
    if wrong:
        return wrong
    value = loss.detach().clone()
    record.phase = "backward"
    if loss.requires_grad:
        loss.backward()
    return {"loss": value, "grad": mine.grad, "calls": record.calls}
