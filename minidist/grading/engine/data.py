"""Test data every exercise shares: rank-specific values whose sums say who contributed, and
how a learner's returned flag is read."""

from __future__ import annotations

import torch


def pattern(rank: int, n, dtype, world_size: int):
    """Rank ``rank``'s test data: rank-specific, position-specific, exact in every dtype.

    Element i of rank r is 2^r + 2^p * i, so any sum over ranks stays an exact integer and
    its low bits say which ranks contributed (see ``contributors``). ``n`` is a length or a
    shape (the values run along the flattened tensor).
    """
    shape = (n,) if isinstance(n, int) else tuple(n)
    numel = 1
    for s in shape:
        numel *= s
    flat = 2 ** rank + (2 ** world_size) * torch.arange(numel, dtype=torch.float64)
    return flat.to(dtype).reshape(shape)


def contributors(value: float, index: int, world_size: int) -> list[int] | None:
    """The ranks whose ``pattern`` values sum to ``value`` at ``index``, each counted once;
    None if no such set exists (a value counted twice, or from another position)."""
    v = round(float(value))
    if v != float(value):
        return None
    ranks = [r for r in range(world_size) if (v % 2 ** world_size) >> r & 1]
    expected = sum(2 ** r for r in ranks) + len(ranks) * 2 ** world_size * index
    return ranks if expected == v else None


def flag_value(got):
    """A returned flag as a bool (a bool, a number or a one-element tensor); else its repr."""
    if isinstance(got, bool):
        return got
    if isinstance(got, (int, float)) or (isinstance(got, torch.Tensor) and got.numel() == 1):
        return bool(got)
    return {"returned": repr(got)[:120]}
