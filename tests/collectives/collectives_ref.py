"""Shared by the collective tests: deterministic inputs, a rank-side runner that executes
many cases in one launch, and numpy/torch references to compare against.

A case is a dict: ``fn`` (the collective's name), ``shape`` (of one rank's tensor, or one
piece for scatter/all_to_all), ``dtype``, ``kw`` (keyword arguments), ``values`` ("int":
small integers, so every sum is exact in every dtype and results must match the reference
exactly; "float": random floats, compared within a tolerance) and ``seed``.
"""

from __future__ import annotations

import numpy as np
import torch

import minidist as md

EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23,
       torch.float64: 2.0**-52}


def make_input(rank: int, shape, dtype, values: str, seed: int, op: str = "sum"):
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if values == "int":
        lo, hi = (-2, 3) if op == "prod" else (-4, 5)
        t = torch.randint(lo, hi, tuple(shape), generator=g, dtype=torch.int64)
    elif op == "prod":
        t = torch.rand(tuple(shape), generator=g, dtype=torch.float64) + 0.5
    else:
        t = torch.rand(tuple(shape), generator=g, dtype=torch.float64) * 2 - 1
    return t.to(dtype)


def rows_of(case, p):
    """Shape of one rank's input: scatter's root and all_to_all pass one piece per rank."""
    if case["fn"] in ("all_to_all", "scatter"):
        return (p, *case["shape"])
    return tuple(case["shape"])


def input_of(case, rank, p):
    op = case["kw"].get("op", "sum")
    return make_input(rank, rows_of(case, p), case["dtype"], case["values"], case["seed"], op)


def run_case(comm, case, numpy_io=False):
    """Run one case on this rank; returns what the collective returned (or the tensor it
    changed in place)."""
    p, r, fn, kw = comm.world_size, comm.rank, case["fn"], case["kw"]
    x = input_of(case, r, p)
    if fn == "scatter" and r != kw.get("src", 0):
        x = torch.empty(tuple(case["shape"]), dtype=case["dtype"])
    if numpy_io and x.dtype != torch.bfloat16:
        x = x.numpy()
    out = getattr(md, fn)(comm, x, **kw)
    if fn in ("all_reduce", "broadcast", "reduce"):
        assert out is x  # in place, and returns its argument
    if isinstance(out, np.ndarray):
        return torch.from_numpy(out.copy())
    return out


def run_cases(comm, cases, numpy_io=False):
    return [run_case(comm, c, numpy_io) for c in cases]


def reduce_ref(xs, op):
    """Reduction of a list of tensors in float64 (int64 for integers)."""
    wide = torch.stack([x.to(torch.float64 if x.is_floating_point() else torch.int64)
                        for x in xs])
    if op == "sum":
        return wide.sum(0)
    if op == "avg":
        return wide.sum(0) / len(xs)
    if op == "prod":
        return wide.prod(0)
    return wide.amax(0) if op == "max" else wide.amin(0)


def expected(case, p, xs=None):
    """What each rank should get, by rank (None where the collective returns nothing)."""
    fn, kw = case["fn"], case["kw"]
    xs = [input_of(case, r, p) for r in range(p)] if xs is None else xs
    op = kw.get("op", "sum")
    if fn == "all_reduce":
        return [reduce_ref(xs, op)] * p
    if fn == "reduce":
        dst = kw.get("dst", 0)
        return [reduce_ref(xs, op) if r == dst else xs[r] for r in range(p)]
    if fn == "broadcast":
        return [xs[kw.get("src", 0)]] * p
    if fn == "reduce_scatter":
        return list(torch.tensor_split(reduce_ref(xs, op), p, dim=0))
    if fn == "all_gather":
        return [torch.stack(xs)] * p
    if fn == "gather":
        dst = kw.get("dst", 0)
        return [torch.stack(xs) if r == dst else None for r in range(p)]
    if fn == "scatter":
        return [xs[kw.get("src", 0)][r] for r in range(p)]
    if fn == "all_to_all":
        return [torch.stack([xs[s][r] for s in range(p)]) for r in range(p)]
    raise ValueError(fn)


REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def check(case, outs, p):
    """Compare every rank's output with the reference; raise AssertionError naming the case.

    Exact for data movement and for small-integer inputs (every partial result is exact);
    for random floats within p roundings, each off by at most half an ulp of a partial
    result, which is at most the sum of the inputs' magnitudes.
    """
    xs = [input_of(case, r, p) for r in range(p)]
    want, dtype = expected(case, p, xs), case["dtype"]
    exact = (case["values"] == "int" or not dtype.is_floating_point
             or case["fn"] not in REDUCING)
    tol = 0.0
    if not exact:
        op = case["kw"].get("op", "sum")
        mags = [x.abs() for x in xs]
        scale = reduce_ref(mags, "sum" if op in ("sum", "avg") else op)
        tol = 2 * p * EPS[dtype] * (float(scale.max()) if scale.numel() else 1.0)
    for r, (got, ref) in enumerate(zip(outs, want)):
        where = f"{case} rank {r}"
        if ref is None:
            assert got is None, where
            continue
        assert got.dtype == dtype, f"{where}: dtype {got.dtype}"
        assert tuple(got.shape) == tuple(ref.shape), f"{where}: {got.shape} vs {ref.shape}"
        if exact:
            assert torch.equal(got, ref.to(dtype)), f"{where}: {got} != {ref}"
        elif got.numel():
            err = float((got.to(torch.float64) - ref.to(torch.float64)).abs().max())
            assert err <= tol, f"{where}: max error {err} > {tol}"


def assert_same_bits(outs):
    """Every rank returned the same bits (data-parallel replicas never drift)."""
    def bits(t):
        return t.reshape(-1).view(torch.uint8) if t.numel() else t

    first = bits(outs[0])
    for r, o in enumerate(outs[1:], 1):
        got = bits(o)
        assert torch.equal(got, first), f"rank {r} differs from rank 0"
