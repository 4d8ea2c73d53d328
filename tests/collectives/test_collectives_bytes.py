"""Communication volume from ``comm.stats`` through the public calls: every algorithm and
collective sends exactly the bytes ``costmodel/collectives.py`` (the one source of byte counts)
gives for each rank, ``auto`` included whichever path it takes (payload only: the agreement
check is control traffic and not counted). ``test_costs.py`` covers more lengths, dtypes
and roots; ``test_collectives_torch.py`` reuses these helpers on gloo."""

from __future__ import annotations

import pytest
import torch

import minidist as md
from minidist.collectives.auto import choose
from minidist.costmodel import collectives as costs

LENGTHS = [0, 1, 7, 24, 840, 1031]  # 24 and 840 are divisible by every p <= 8
BIG = 300_007  # large enough for auto to take the shared-memory path


def _traffic(comm, cases):
    out = []
    for fn, n, dtype, kw in cases:
        rows = comm.world_size if fn in ("all_to_all", "scatter") else None
        shape = (n,) if rows is None else (rows, n)
        x = torch.ones(shape, dtype=dtype)
        if fn == "scatter" and comm.rank != kw["src"]:
            x = torch.empty(n, dtype=dtype)
        picked = choose(comm, x) if kw.get("algorithm") == "auto" else None
        comm.stats.reset()
        if fn == "all_reduce_coalesced":  # the bytes of one all_reduce of the concatenation
            md.all_reduce_coalesced(comm, list(x.split(max(1, n // 3))), **kw)
        else:
            getattr(md, fn)(comm, x, **kw)
        out.append((comm.stats.bytes_sent, comm.stats.bytes_received, picked,
                    comm.stats.native_bytes))
    return out


def expected_sent(fn, algo, p, r, n, size, root=0):
    """Bytes rank r sends (n elements of ``size`` bytes), from ``costs.bytes_sent``."""
    if fn in ("all_reduce", "all_reduce_coalesced"):
        return costs.bytes_sent(algo, n, size, p, r)
    kw = {"root": root} if fn in ("broadcast", "reduce", "gather", "scatter") else {}
    return costs.bytes_sent(fn, n, size, p, r, **kw)


def _cases(p):
    cases = []
    for n in LENGTHS:
        for dtype in (torch.float32, torch.float16):
            for algo in md.ALL_REDUCE_ALGORITHMS:
                cases.append(("all_reduce", n, dtype, {"algorithm": algo}))
            cases.append(("all_reduce_coalesced", n, dtype, {"algorithm": "auto"}))
        root = p - 1
        cases += [("broadcast", n, torch.int64, {"src": root}),
                  ("reduce", n, torch.int64, {"dst": root}),
                  ("gather", n, torch.int64, {"dst": root}),
                  ("scatter", n, torch.int64, {"src": root}),
                  ("all_gather", n, torch.int64, {}), ("all_to_all", n, torch.int64, {}),
                  ("reduce_scatter", n, torch.int64, {})]
    cases += [(fn, BIG, torch.float32, {"algorithm": "auto"})
              for fn in ("all_reduce", "all_reduce_coalesced")]
    return cases


@pytest.mark.parametrize("world_size", range(1, 9))
def test_bytes_sent_match_the_formulas(world_size):
    p, cases = world_size, _cases(world_size)
    out = md.launch(_traffic, p, args=(cases,))
    for i, (fn, n, dtype, kw) in enumerate(cases):
        algo = kw.get("algorithm")
        sent = [o[i][0] for o in out]
        received = [o[i][1] for o in out]
        assert sum(sent) == sum(received), (fn, kw, n)
        if algo == "auto":
            algo = out[0][i][2]
            assert all(o[i][2] == algo for o in out)  # every rank picks the same path
            if fn == "all_reduce_coalesced" and (p == 1 or n == 0):
                assert sent == [0] * p  # returns before choosing a path
                continue
            if n == BIG and p > 1:  # the world communicator reduces in shared memory
                assert algo == "shm"
        root = kw.get("src", kw.get("dst", 0))
        want = [expected_sent(fn, algo, p, r, n, dtype.itemsize, root) for r in range(p)]
        assert sent == want, (fn, algo, n, dtype)


def test_headline_formulas():
    """The issue's wording, literally, on a length every p divides."""
    def fn(comm, n):
        x, res = torch.ones(n), {}
        for algo in ("ring", "naive", "halving_doubling"):
            comm.stats.reset()
            md.all_reduce(comm, x, algorithm=algo)
            res[algo] = comm.stats.bytes_sent
        return res

    n, N = 840, 840 * 4
    for p in (2, 4):
        out = md.launch(fn, p, args=(n,))
        for r, res in enumerate(out):
            assert res["ring"] == 2 * (p - 1) * N // p  # 2(p-1)/p * n per rank
            assert res["halving_doubling"] == 2 * (p - 1) * N // p
            assert res["naive"] == ((p - 1) * N if r == 0 else N)  # (p-1) n from the root
