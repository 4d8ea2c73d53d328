"""Communication volume from ``comm.stats``: every algorithm sends exactly the bytes its
docstring states (payload only: the agreement check is control traffic and not counted)."""

from __future__ import annotations

import pytest
import torch

import minidist as md
from minidist.collectives.auto import choose

LENGTHS = [0, 1, 7, 24, 840, 1031]  # 24 and 840 are divisible by every p <= 8


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
        getattr(md, fn)(comm, x, **kw)
        out.append((comm.stats.bytes_sent, comm.stats.bytes_received, picked))
    return out


def _chunks(n, p):
    return [len(c) for c in torch.arange(n).tensor_split(p)]


def _children(v, p):
    """Binomial tree numbered from the root: v's children are v + 2^k for 2^k below v's
    lowest set bit (any 2^k < p for the root)."""
    low = v & -v if v else 1 << p.bit_length()
    return sum(1 for k in range(p.bit_length()) if (1 << k) < low and v + (1 << k) < p)


def _folded(p):
    pp = 1 << (p.bit_length() - 1)
    return pp, p - pp


def expected_sent(fn, algo, p, r, n, size, root=0):
    """Bytes rank r sends, from the formulas in the docstrings (n elements of ``size``)."""
    N, v = n * size, (r - root) % p
    if fn == "broadcast":
        return N * _children(v, p)
    if fn in ("reduce", "gather"):
        return 0 if r == root else N
    if fn == "scatter":
        return (p - 1) * N if r == root else 0
    if fn in ("all_gather", "all_to_all"):
        return (p - 1) * N
    c = [k * size for k in _chunks(n, p)]
    if fn == "reduce_scatter":
        return N - c[r]
    if algo == "naive":
        return (p - 1) * N if r == 0 else N
    if algo == "tree":
        return (N if r else 0) + N * _children(r, p)
    if algo == "ring":
        return 2 * N - c[r] - c[(r + 1) % p]
    pp, e = _folded(p)
    if r < 2 * e and r % 2 == 0:
        return N  # folded away: sends its tensor once, gets the result back
    extra = N if r < 2 * e else 0
    v = r // 2 if r < 2 * e else r - e
    lg = pp.bit_length() - 1
    if algo == "recursive_doubling":
        return extra + lg * N
    c = [k * size for k in _chunks(n, pp)]  # halving_doubling: chunks over the p' ranks
    halving = N - c[v]  # every chunk but its own, each sent once
    doubling = sum(sum(c[(v >> k << k):(v >> k << k) + (1 << k)]) for k in range(lg))
    return extra + halving + doubling


def _cases(p):
    cases = []
    for n in LENGTHS:
        for dtype in (torch.float32, torch.float16):
            for algo in md.ALL_REDUCE_ALGORITHMS:
                cases.append(("all_reduce", n, dtype, {"algorithm": algo}))
        root = p - 1
        cases += [("broadcast", n, torch.int64, {"src": root}),
                  ("reduce", n, torch.int64, {"dst": root}),
                  ("gather", n, torch.int64, {"dst": root}),
                  ("scatter", n, torch.int64, {"src": root}),
                  ("all_gather", n, torch.int64, {}), ("all_to_all", n, torch.int64, {}),
                  ("reduce_scatter", n, torch.int64, {})]
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
            if algo in ("shm", "native"):  # no messages: shared memory / torch's own
                assert sum(sent) == 0
                continue
        size = dtype.itemsize
        root = kw.get("src", kw.get("dst", 0))
        want = [expected_sent(fn, algo, p, r, n, size, root) for r in range(p)]
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
