"""minidist.horovod's collectives against torch computed on one process (the oracle: every
rank's input is a known function of its rank, so the expected result is computed here)."""

from __future__ import annotations

import pytest
import torch

import minidist as md
import minidist.horovod as hvd

P = 3


def inputs(r: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float64).reshape(2, 3) * (r + 1) - r


def _collectives(comm):
    hvd.init(comm)
    r, out = hvd.rank(), {}
    x = inputs(r)
    for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
        out[f"op{op}"] = hvd.allreduce(x, op=op)
    out["unchanged"] = torch.equal(x, inputs(r))
    out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    y = x.clone()
    hvd.allreduce_(y, name="inplace")
    out["inplace"] = y
    handles = [hvd.allreduce_async(x * k, name=f"async.{k}") for k in range(4)]
    out["async"] = [hvd.synchronize(h) for h in handles]
    h = hvd.allreduce_async_(x.clone(), op=hvd.Sum)
    while not hvd.poll(h):
        pass
    out["polled"] = hvd.synchronize(h)
    out["fp16"] = hvd.allreduce(x.float(), compression=hvd.Compression.fp16)
    out["gather"] = hvd.allgather(torch.full((r + 1, 2), float(r)))
    out["gather_async"] = hvd.synchronize(hvd.allgather_async(torch.tensor([r])))
    out["bcast"] = hvd.broadcast(x, root_rank=2)
    z = x.clone()
    hvd.broadcast_(z, root_rank=1)
    out["bcast_"] = z
    out["bcast_async"] = hvd.synchronize(hvd.broadcast_async(x, 0))
    z = x.clone()
    out["bcast_async_"] = hvd.synchronize(hvd.broadcast_async_(z, 0)) is not None and z
    rows = torch.arange(2 * P, dtype=torch.float32) + 100 * r
    out["a2a_equal"] = hvd.alltoall(rows)
    splits = torch.tensor([(r + j) % 3 for j in range(P)])
    data = torch.arange(int(splits.sum()), dtype=torch.float32) + 100 * r
    out["a2a"] = hvd.alltoall(data, splits=splits)
    out["a2a_async"] = hvd.synchronize(hvd.alltoall_async(data, splits=splits))
    hvd.barrier()
    hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def got():
    return md.launch(_collectives, P)


def test_allreduce_ops_match_torch(got):
    xs = torch.stack([inputs(r) for r in range(P)])
    want = {hvd.Average: xs.mean(0), hvd.Sum: xs.sum(0), hvd.Min: xs.min(0).values,
            hvd.Max: xs.max(0).values, hvd.Product: xs.prod(0)}
    for r in range(P):
        for op, w in want.items():
            torch.testing.assert_close(got[r][f"op{op}"], w, rtol=1e-12, atol=1e-12)
        assert got[r]["unchanged"]
        torch.testing.assert_close(got[r]["scaled"], xs.sum(0) * 1.5)
        torch.testing.assert_close(got[r]["inplace"], xs.mean(0))
        for k, t in enumerate(got[r]["async"]):
            torch.testing.assert_close(t, xs.mean(0) * k)
        torch.testing.assert_close(got[r]["polled"], xs.sum(0))
        assert got[r]["fp16"].dtype == torch.float32  # decompressed to the input's dtype
        torch.testing.assert_close(got[r]["fp16"], xs.mean(0).float(), rtol=2e-3, atol=2e-3)


def test_allgather_concatenates_rows_of_different_counts(got):
    want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(P)])
    for r in range(P):
        assert torch.equal(got[r]["gather"], want)
        assert got[r]["gather_async"].tolist() == list(range(P))


def test_broadcast_forms(got):
    for r in range(P):
        assert torch.equal(got[r]["bcast"], inputs(2))
        assert torch.equal(got[r]["bcast_"], inputs(1))
        assert torch.equal(got[r]["bcast_async"], inputs(0))
        assert torch.equal(got[r]["bcast_async_"], inputs(0))


def test_alltoall_routes_rows(got):
    for r in range(P):
        want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * s
                          for s in range(P)])
        assert torch.equal(got[r]["a2a_equal"], want)
        pieces, received = [], []
        for s in range(P):  # rank s sends rows splits_s[r] (after the first r pieces) to r
            sp = [(s + j) % 3 for j in range(P)]
            start = sum(sp[:r])
            pieces.append(torch.arange(start, start + sp[r], dtype=torch.float32) + 100 * s)
            received.append(sp[r])
        out, rs = got[r]["a2a"]
        assert torch.equal(out, torch.cat(pieces)) and rs.tolist() == received
        assert torch.equal(got[r]["a2a_async"][0], out)


def _join(comm):
    """Rank 0 runs out of data after one step; the others do two more allreduces."""
    hvd.init(comm)
    r, out = hvd.rank(), []
    out.append(hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum).item())
    if r > 0:
        out.append(hvd.allreduce(torch.tensor([float(r + 1)]), name="late").item())
        out.append(hvd.allreduce(torch.tensor([float(r)]), op=hvd.Min).item())
        out.append(hvd.allgather(torch.tensor([r])).tolist())
        out.append(hvd.broadcast(torch.tensor([float(r)]), root_rank=2).item())
    if r == 1:
        hvd.allreduce(torch.tensor([0.0]), name="one more for rank 1")
    last = hvd.join()
    hvd.shutdown()
    return out, last


def test_join_fills_in_for_a_rank_that_has_finished():
    got = md.launch(_join, P)
    for r in range(P):
        out, last = got[r]
        assert out[0] == 6.0
        assert last == 1  # rank 1's extra allreduce kept it out of join one round longer
        if r > 0:  # Average over all 3 ranks, rank 0 contributing zeros, as in Horovod
            assert out[1] == pytest.approx((2 + 3) / 3)
            assert out[2] == 1.0  # rank 0 contributes Min's identity, not a zero
            assert out[3] == [1, 2]  # rank 0 contributes no rows
            assert out[4] == 2.0
