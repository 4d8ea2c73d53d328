"""Exercise 05, part 1: which piece of an MLP's two linears each rank keeps (``shard_mlp``),
against Megatron's split: ``c_fc`` column-parallel (block r of its output features: rows
of ``nn.Linear``'s weight, and of its bias), ``c_proj`` row-parallel (block r of its input
features: columns of its weight; the whole bias). The test weights hold numbers that say
where they sit, so the feedback can name the slice the learner took instead."""

from __future__ import annotations

import torch

from ..engine.compare import as_tensor
from ..engine.feedback import Mistake, values
from .tp_feedback import close, describe
from .tp_probe import shard_of

SHARD_CASES = [(8, 4, 1), (8, 4, 2), (12, 5, 3), (16, 4, 4)]  # (hidden, h, world size)


def _shard_inputs(hidden: int, h: int) -> tuple[torch.Tensor, ...]:
    """Weights whose every value says where it sits (c_fc's 1000s, c_proj's 2000s)."""
    w1 = 1000 + torch.arange(hidden * h, dtype=torch.float64).reshape(hidden, h)
    w2 = 2000 + torch.arange(h * hidden, dtype=torch.float64).reshape(h, hidden)
    return w1, -1 - torch.arange(hidden, dtype=torch.float64), w2, \
        -100 - torch.arange(h, dtype=torch.float64)


def check_shard_mlp(learner) -> str:
    calls, labels = [], []
    for hidden, h, p in SHARD_CASES:
        case = f"c_fc = nn.Linear({h}, {hidden}), c_proj = nn.Linear({hidden}, {h}), " \
               f"world_size={p}"
        calls += [(*_shard_inputs(hidden, h), r, p) for r in range(p)]
        labels += [f"{case}, rank {r}" for r in range(p)]
    results = iter(learner.call_each("shard_mlp", calls, labels))
    for (hidden, h, p) in SHARD_CASES:
        full = _shard_inputs(hidden, h)
        for r in range(p):
            got = next(results)
            where = f"with c_fc = nn.Linear({h}, {hidden}), c_proj = nn.Linear({hidden}, " \
                    f"{h}), world_size={p}: rank {r}"
            _check_pieces(got, full, r, p, where)
    return ("c_fc split by output features (rows of its weight, and its bias), c_proj by "
            "input features (columns of its weight, whole bias), block r on rank r, in "
            f"{len(SHARD_CASES)} shapes")


def _check_pieces(got, full, r: int, p: int, where: str) -> None:
    if not (isinstance(got, (list, tuple)) and len(got) == 4):
        raise Mistake(f"{where}: shard_mlp returned {got!r:.100}; return the four pieces "
                      "(fc_weight, fc_bias, proj_weight, proj_bias) as a tuple")
    want = shard_of(*full, r, p)
    names = ("c_fc's weight", "c_fc's bias", "c_proj's weight", "c_proj's bias")
    for k, (g, w, name) in enumerate(zip(got, want, names)):
        g = as_tensor(g, w)  # a list of the right numbers is the same answer
        if not close(g, w):
            raise Mistake(f"{where}: {name} piece is {describe(g)}, expected the "
                          f"{tuple(w.shape)} block {values(w, 4)}; "
                          f"{_piece_hint(k, g, full[k], r, p)}")


def _piece_hint(k: int, g, full: torch.Tensor, r: int, p: int) -> str:
    dim = 0 if k < 2 else 1  # the dimension this piece is split along
    if k == 3:
        if close(g, full / p) or close(g, full.chunk(p)[r]):
            return ("c_proj's bias is not split: its output is the sum of every rank's "
                    "partial result, and the bias is added once, to the sum, so every rank "
                    "keeps the whole bias")
        return "c_proj's bias is the whole bias, on every rank"
    if k == 1 and close(g, full):
        return ("c_fc's bias belongs to its output features: each rank adds the bias of "
                "the features it computes, so split it like the weight's rows")
    if isinstance(g, torch.Tensor) and g.dim() == 2 and close(g, full.chunk(p, 1 - dim)[r]):
        return _wrong_dimension(k)
    if isinstance(g, torch.Tensor) and g.dim() == 2 and close(g.t(), full.chunk(p, dim)[r]):
        return ("that is the right block, transposed: keep nn.Linear's (out_features, "
                "in_features) layout, so that F.linear(x, weight, bias) uses it as is")
    if p > 1 and close(g, full[r::p] if dim == 0 else full[:, r::p]):
        return ("rank r takes every p-th row or column; take block r instead "
                "(tensor.chunk(world_size, dim)[rank]), as Megatron does, so that the "
                "shards line up with the other layer's")
    if close(g, full):
        return "that is the whole tensor: each rank keeps only its 1/world_size block"
    return "rank r keeps block r of world_size equal blocks (tensor.chunk(world_size, dim)[r])"


def _wrong_dimension(k: int) -> str:
    if k < 2:
        return ("split along the wrong dimension: a column-parallel linear splits its OUTPUT "
                "features (the columns of A in Y = X A), and nn.Linear stores A transposed, "
                "as weight of shape (out_features, in_features): split weight's rows, dim 0")
    return ("split along the wrong dimension: a row-parallel linear splits its INPUT "
            "features (the rows of A in Y = X A, to match the column-parallel layer's "
            "output slices), which are weight's columns in nn.Linear's (out_features, "
            "in_features) layout: split dim 1")
