"""Every collective and every all_reduce algorithm against a torch reference, world sizes
1 to 8, many lengths, shapes, dtypes and ops, on the local backend. Many cases run in one
launch (the rank function loops) to keep the suite fast."""

from __future__ import annotations

import pytest
import torch
from collectives_ref import assert_same_bits, check, run_cases
from conftest import ALL_DTYPES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minidist as md
from minidist.collectives.ops import OPS
from minidist.transports.shm_segment import SCRATCH_SLOT

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LENGTHS = [0, 1, 2, 7, 13, 1031]  # empty, single, primes, not divisible by p


def _ops_for(dtype):
    return [op for op in OPS if op != "avg" or dtype.is_floating_point]


def all_reduce_cases(p):
    cases = []
    for algo in md.ALL_REDUCE_ALGORITHMS:
        for dtype in ALL_DTYPES:
            for n in LENGTHS:
                cases.append(dict(fn="all_reduce", shape=(n,), dtype=dtype, values="int",
                                  kw={"op": "sum", "algorithm": algo}, seed=len(cases)))
            for op in _ops_for(dtype):
                cases.append(dict(fn="all_reduce", shape=(3, 5), dtype=dtype, values="int",
                                  kw={"op": op, "algorithm": algo}, seed=len(cases)))
        for dtype in FLOATS:
            for op in ("sum", "avg", "max", "prod"):
                cases.append(dict(fn="all_reduce", shape=(100,), dtype=dtype, values="float",
                                  kw={"op": op, "algorithm": algo}, seed=len(cases)))
    return cases


def other_cases(p):
    cases, roots = [], sorted({0, p - 1, p // 2})
    shapes = [(0,), (1,), (7,), (100,), (3, 5), (0, 4), (2, 3, 2)]
    for dtype in ALL_DTYPES:
        for shape in shapes:
            base = dict(shape=shape, dtype=dtype, values="int")
            cases += [dict(base, fn="all_gather", kw={}), dict(base, fn="all_to_all", kw={})]
            for root in roots:
                cases += [dict(base, fn="broadcast", kw={"src": root}),
                          dict(base, fn="gather", kw={"dst": root}),
                          dict(base, fn="scatter", kw={"src": root})]
            for op in _ops_for(dtype):
                cases += [dict(base, fn="reduce", kw={"dst": roots[-1], "op": op}),
                          dict(base, fn="reduce_scatter", kw={"op": op})]
        if dtype in FLOATS:
            base = dict(shape=(13, 3), dtype=dtype, values="float")
            cases += [dict(base, fn="reduce", kw={"dst": roots[0], "op": "sum"}),
                      dict(base, fn="reduce_scatter", kw={"op": "avg"})]
    return [dict(c, seed=i) for i, c in enumerate(cases)]


def _check_all(cases, outs, p):
    for i, case in enumerate(cases):
        got = [o[i] for o in outs]
        check(case, got, p)
        if case["fn"] in ("all_reduce", "broadcast", "all_gather"):
            assert_same_bits(got)


@pytest.mark.parametrize("world_size", range(1, 9))
def test_every_collective_every_algorithm(world_size):
    cases = all_reduce_cases(world_size) + other_cases(world_size)
    outs = md.launch(run_cases, world_size, args=(cases,))
    _check_all(cases, outs, world_size)


def test_numpy_arrays_in_and_out():
    cases = [c for c in all_reduce_cases(3) + other_cases(3) if c["dtype"] != torch.bfloat16]
    cases = cases[::3]
    outs = md.launch(run_cases, 3, args=(cases, True))
    _check_all(cases, outs, 3)


def _split_cases(comm, cases):
    sub = comm.split(comm.rank % 2, key=-comm.rank)  # reversed order inside each part
    return comm.rank % 2, sub.world_size, run_cases(sub, cases)


def test_sub_communicators_every_collective():
    """Two halves of a split world run every collective at the same time."""
    cases = [c for c in all_reduce_cases(3) + other_cases(3)
             if c["dtype"] in (torch.float16, torch.int32, torch.float64)][::2]
    out = md.launch(_split_cases, 7, args=(cases,))
    for color in (0, 1):
        # key=-rank: the sub-communicator's rank 0 is the highest world rank of the colour
        members = sorted((r for r in range(7) if r % 2 == color), reverse=True)
        p = out[members[0]][1]
        assert p == len(members)
        _check_all(cases, [out[r][2] for r in members], p)


SMALL_PIECE = 4096  # bytes: many pieces even for small tensors


def _shm_path(comm, cases):
    from minidist.collectives import ops
    from minidist.collectives import shared_memory as shm_collectives

    shm_collectives.PIECE = SMALL_PIECE  # in this rank process only
    assert shm_collectives.available(comm, torch.empty(1))
    outs = []
    for case in cases:
        from collectives_ref import input_of

        x = input_of(case, comm.rank, comm.world_size)
        shm_collectives.all_reduce_shm(comm, x.reshape(-1), case["kw"]["op"])
        outs.append(ops.finish_(x, case["kw"]["op"], comm.world_size))  # avg: sum, then /p
    return outs


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_shared_memory_path(world_size):
    """The local backend's fast path: lengths around its piece size, every dtype and op."""
    from minidist.collectives.shared_memory import PIECE

    cases = []
    for dtype in ALL_DTYPES:
        per_piece = SMALL_PIECE // dtype.itemsize
        for n in (0, 1, 5, per_piece - 1, 2 * per_piece + 3):
            for op in _ops_for(dtype):
                if n > 5 and op not in ("sum", "max") or n == per_piece - 1 and op == "max":
                    continue
                values = "float" if dtype.is_floating_point and op != "max" else "int"
                cases.append(dict(fn="all_reduce", shape=(n,), dtype=dtype, values=values,
                                  kw={"op": op}, seed=len(cases)))
    outs = md.launch(_shm_path, world_size, args=(cases,))
    _check_all(cases, outs, world_size)
    assert SCRATCH_SLOT >= PIECE  # the real piece fits the scratch that launch creates


def _auto_large(comm, n):
    from minidist.collectives.auto import choose

    x = torch.full((n,), float(comm.rank + 1))
    picked = choose(comm, x)
    md.all_reduce(comm, x)
    sub = comm.split(comm.rank // 2)
    y = torch.full((n,), float(comm.rank + 1))
    sub_picked = choose(sub, y)
    md.all_reduce(sub, y)
    return picked, sub_picked, x.unique().tolist(), y.unique().tolist()


def test_auto_on_large_tensors_and_sub_communicators():
    n = (1 << 20) + 3
    out = md.launch(_auto_large, 4, args=(n,))
    for r, (picked, sub_picked, x, y) in enumerate(out):
        assert picked in md.ALL_REDUCE_ALGORITHMS or picked == "shm"
        assert sub_picked != "shm"  # split-off ranks must not share the world's slots
        assert x == [10.0] and y == [3.0 if r < 2 else 7.0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_size=st.integers(2, 6), n=st.integers(0, 300), dtype=st.sampled_from(ALL_DTYPES),
       algorithm=st.sampled_from(md.ALL_REDUCE_ALGORITHMS), op=st.sampled_from(OPS),
       values=st.sampled_from(["int", "float"]), root=st.integers(0, 5))
def test_any_combination(world_size, n, dtype, algorithm, op, values, root):
    if op == "avg" and not dtype.is_floating_point:
        op = "sum"
    root %= world_size
    base = dict(shape=(n,), dtype=dtype, values=values, seed=n)
    cases = [dict(base, fn="all_reduce", kw={"op": op, "algorithm": algorithm}),
             dict(base, fn="reduce", kw={"op": op, "dst": root}),
             dict(base, fn="reduce_scatter", kw={"op": op}),
             dict(base, fn="broadcast", kw={"src": root}),
             dict(base, fn="scatter", kw={"src": root}),
             dict(base, fn="all_to_all", kw={})]
    outs = md.launch(run_cases, world_size, args=(cases,))
    _check_all(cases, outs, world_size)


def _coalesced(comm, lengths, dtype, algorithm, piece):
    """all_reduce_coalesced of tensors of ``lengths`` (rank r holds i + 1000 r + k in
    tensor k): returns them after the reduction."""
    from minidist.collectives import shared_memory as shm_collectives
    from minidist.collectives.auto import choose

    shm_collectives.PIECE = piece  # in this rank process only: many pieces
    xs = [(torch.arange(n, dtype=torch.float64) + 1000 * comm.rank + k).to(dtype)
          for k, n in enumerate(lengths)]
    path = choose(comm, xs[0], sum(lengths) * xs[0].element_size())
    comm.stats.reset()
    md.all_reduce_coalesced(comm, xs, op="avg", algorithm=algorithm)
    return xs, comm.stats.bytes_sent, path


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("algorithm", ["auto", "ring"])
def test_all_reduce_coalesced(world_size, algorithm):
    """Tensors reduced as one concatenation, straddling pieces (auto: shared memory, in
    place) or through one flat buffer (ring: the bytes show in stats): both equal the
    reference average of every rank's tensors."""
    lengths = [0, 1, 7, 300, 5, 1000, 3, 100_000, 20_000, 11]  # 1 MB: auto takes shm
    outs = md.launch(_coalesced, world_size, args=(lengths, torch.float64, algorithm, 4096))
    p = world_size
    for xs, sent, path in outs:
        for k, (x, n) in enumerate(zip(xs, lengths)):
            want = torch.arange(n, dtype=torch.float64) + k + 1000 * (p - 1) / 2
            assert torch.allclose(x, want, rtol=0, atol=1e-12), (k, x[:4], want[:4])
        if p > 1:
            assert path == "shm"
            assert sent > 0  # shm moves no messages, but counts the bytes it replaces
    assert all(torch.equal(a, b) for a, b in zip(outs[0][0], outs[-1][0]))  # same bits


def test_all_reduce_coalesced_rejects_mixed_dtypes():
    def fn(comm):
        try:
            md.all_reduce_coalesced(comm, [torch.ones(2), torch.ones(2, dtype=torch.float64)])
        except TypeError as e:
            return str(e)

    assert "one dtype" in md.launch(fn, 2)[0]
