"""A subset of the collective tests on the torch backend (gloo): correctness, bitwise
agreement, sub-communicators, byte formulas, mismatch errors. ``auto`` on the world
communicator is torch.distributed's own all_reduce there."""

from __future__ import annotations

import torch
from collectives_ref import run_cases
from conftest import ALL_DTYPES
from test_collectives import _check_all, all_reduce_cases, other_cases
from test_collectives_bytes import _cases as byte_cases
from test_collectives_bytes import _traffic, expected_sent
from test_collectives_errors import MISMATCHES, _on_every_rank

import minidist as md


def test_every_collective_on_gloo():
    p = 3
    cases = [c for c in all_reduce_cases(p) if c["shape"] != (1031,)][::2]
    cases += other_cases(p)[::4]
    outs = md.launch(run_cases, p, args=(cases,), backend="torch")
    _check_all(cases, outs, p)


def test_auto_is_torch_all_reduce_on_the_world_and_exact_on_every_dtype():
    def fn(comm):
        from minidist.collectives.auto import choose

        picks, outs = [], []
        for dtype in ALL_DTYPES:
            x = torch.arange(10, dtype=dtype) + comm.rank
            picks.append(choose(comm, x))
            outs.append(md.all_reduce(comm, x, op="max"))
        sub = comm.split(comm.rank % 2)
        return picks, choose(sub, torch.zeros(1 << 20)), outs

    out = md.launch(fn, 3, backend="torch")
    for picks, sub_pick, outs in out:
        assert picks == ["native"] * len(ALL_DTYPES) and sub_pick != "native"
        for dtype, x in zip(ALL_DTYPES, outs):
            assert torch.equal(x, torch.arange(10, dtype=dtype) + 2)


def test_sub_communicators_on_gloo():
    cases = [c for c in all_reduce_cases(2) if c["dtype"] == torch.float32][::3]
    cases += [c for c in other_cases(2) if c["dtype"] == torch.int64][::3]
    out = md.launch(_split_out_rank_one, 3, args=(cases,), backend="torch")
    assert out[1] is None
    _check_all(cases, [out[2], out[0]], 2)  # ranks 2, 0 in that order (key = -rank)


def _split_out_rank_one(comm, cases):
    sub = comm.split(None if comm.rank == 1 else 0, key=-comm.rank)
    return None if sub is None else run_cases(sub, cases)


def test_bytes_on_gloo():
    p = 3
    cases = [c for c in byte_cases(p) if c[1] in (7, 840)]
    out = md.launch(_traffic, p, args=(cases,), backend="torch")
    for i, (fn, n, dtype, kw) in enumerate(cases):
        sent = [o[i][0] for o in out]
        algo = kw.get("algorithm")
        if algo == "auto":  # gloo's own traffic: not ours to count, but what it was handed is
            assert out[0][i][2] == "native" and sent == [0] * p
            assert [o[i][3] for o in out] == [n * dtype.itemsize] * p
            continue
        root = kw.get("src", kw.get("dst", 0))
        assert sent == [expected_sent(fn, algo, p, r, n, dtype.itemsize, root)
                        for r in range(p)], (fn, algo, n)


def test_mismatch_on_gloo():
    calls = [MISMATCHES[k] for k in ("length", "dtype", "collective")]
    out = md.launch(_on_every_rank, 3, args=(calls,), backend="torch", timeout=30)
    for errors, after in out:
        assert after == [3.0] * 5
        assert all(e is not None and e[0] == "CollectiveMismatchError" for e in errors)
