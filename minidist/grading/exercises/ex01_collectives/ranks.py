"""What runs on each rank in exercise 01's tests, and the result every rank must end with:
the sum (or its chunk, or the gathered chunks) of every rank's ``engine.data.pattern``."""

from __future__ import annotations

import torch

from ...engine.data import pattern

WORLD_SIZES = (1, 2, 3, 4, 5)
POWERS_OF_TWO = (1, 2, 4, 8)
CASES_1D = [(7, torch.float32), (1000, torch.float64), (2, torch.int64), (1, torch.float32),
            (0, torch.float32)]
CASES_2D = [((4, 3), torch.float32), ((3, 5), torch.float64)]
CASES_HD = [(1000, torch.float64), (13, torch.float32), (6, torch.int64), (0, torch.float32),
            ((4, 6), torch.float32)]
KINDS = {  # kind: (function name, cases)
    "naive": ("naive_all_reduce", CASES_1D + CASES_2D),
    "reduce_scatter": ("ring_reduce_scatter", CASES_1D),
    "all_gather": ("ring_all_gather", CASES_1D),
    "ring_all_reduce": ("ring_all_reduce", CASES_1D + CASES_2D),
    "halving_doubling": ("halving_doubling_all_reduce", CASES_HD),
}
IN_PLACE = ("naive", "ring_all_reduce", "halving_doubling")  # they take t, not chunks


def case(comm, namespace, kind, n, dtype):
    p = comm.world_size
    t = pattern(comm.rank, n, dtype, p)
    chunks = list(t.tensor_split(p))
    if kind == "all_gather":
        for j, c in enumerate(chunks):
            if j != comm.rank:
                c.fill_(-1)  # not known yet: the all-gather must fill it
    views = list(chunks)  # the caller's views of t: judged after the call, not the list
    namespace[KINDS[kind][0]](comm, t if kind in IN_PLACE else chunks)
    replaced = [j for j, (c, v) in enumerate(zip(chunks, views)) if c is not v]
    if kind == "reduce_scatter":
        return views[comm.rank], replaced
    return (torch.cat(views), replaced) if kind == "all_gather" else (t, replaced)


def expected(kind, rank, n, dtype, p):
    every = [pattern(r, n, dtype, p) for r in range(p)]
    if kind == "all_gather":
        return torch.cat([every[j].tensor_split(p)[j] for j in range(p)])
    total = torch.stack(every).sum(0).to(dtype)
    return total.tensor_split(p)[rank] if kind == "reduce_scatter" else total


def label(p, kind, n, dtype) -> str:
    size = f"n={n}" if isinstance(n, int) else f"shape={tuple(n)}"
    return f"world_size={p}, {size}, dtype={str(dtype)[6:]}"
