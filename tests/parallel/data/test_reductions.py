"""The seam between DDP's bucket scheduler and a pluggable ``BucketReduction``: a custom
reduction sees every bucket once per synchronizing backward, in bucket order, in the layout
it asked for; what it leaves is what ``.grad`` gets (or nothing, with ``write_back =
False``); ``finish`` runs once after the last bucket; and ``no_sync`` lives in the scheduler
alone, so a pipeline can synchronize only its last micro-batch."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close
from test_data_parallel import TINY, batches, mlp
from torch import nn

import minidist as md
from minidist.parallel.data import Average, BucketReduction, Wrapped
from minidist.parallel.data.buckets import allreduce_hook, assign_buckets

RTOL = 1e-12  # summing before or after dividing by p: a rounding's difference


class Recording(BucketReduction):
    """Sums instead of averaging, in place on ``bucket.grads`` (either layout), and records
    every call."""

    def __init__(self, flat: bool):
        self.flat, self.calls, self.finished = flat, [], []

    def needs_flat(self, bucket):
        return self.flat

    def reduce(self, comm, bucket):
        self.calls.append((bucket.index, sum(g.numel() for g in bucket.grads), bucket.flat,
                           threading.current_thread().name))
        md.all_reduce_coalesced(comm, bucket.grads, op="sum")

    def finish(self, comm, buckets):
        self.finished.append(([b.index for b in buckets], len(self.calls)))


class ShardedGradients(BucketReduction):
    """ZeRO-2's gradient step: each rank keeps its shard of every averaged bucket."""

    write_back = False

    def __init__(self):
        self.shards = {}

    def divisor(self, comm, bucket):
        return comm.world_size

    def reduce(self, comm, bucket):
        self.shards[bucket.index] = md.reduce_scatter(comm, bucket.buffer, op="sum")


class Halved(Wrapped):
    """A step after any reduction (as mixed precision's unscaling would be)."""

    def reduce(self, comm, bucket):
        super().reduce(comm, bucket)
        for g in bucket.grads:
            g.mul_(0.5)


def _step(comm, x, y, **kwargs):
    model = mlp()
    ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=TINY, **kwargs)
    F.mse_loss(ddp(x), y).backward()
    return ddp, [p.grad.clone() for p in model.parameters()]


def _seam_rank(comm):
    x, y = (t.chunk(comm.world_size)[comm.rank] for t in batches("mlp", steps=1)[0])
    out = {"n": len(_step(comm, x, y)[0].buckets)}
    _, out["avg"] = _step(comm, x, y)
    _, out["local"] = _step(comm.split(comm.rank), x, y)  # a world of one: no reduction
    for flat in (True, False):
        for overlap in (True, False):
            rec = Recording(flat)
            ddp, grads = _step(comm, x, y, overlap=overlap, reduction=rec)
            with ddp.no_sync():  # no reduction, no finish
                F.mse_loss(ddp(x), y).backward()
            out["sum", flat, overlap] = (grads, rec.calls, rec.finished,
                                         [b.buffer.numel() for b in ddp.buckets])
    sharded = ShardedGradients()
    ddp, out["sharded_grads"] = _step(comm, x, y, reduction=sharded)
    out["shards"] = sharded.shards
    ddp, out["halved"] = _step(comm, x, y, reduction=Halved(Average()))
    out["halved_layout"] = [b.flat for b in ddp.buckets]
    try:
        ddp.reduction = "avg"
    except TypeError as e:
        out["bad"] = str(e)
    return out


def test_custom_reductions_plug_in():
    results = md.launch(_seam_rank, 2)
    for out in results:
        n, avg, local = out["n"], out["avg"], out["local"]
        for flat in (True, False):
            for overlap in (True, False):
                grads, calls, finished, sizes = out["sum", flat, overlap]
                for g_sum, g_avg in zip(grads, avg):  # what reduce left is what .grad got
                    torch.testing.assert_close(g_sum, 2 * g_avg, rtol=RTOL, atol=0)
                # each bucket once, in order, whole, in the layout asked for; started on the
                # communication thread during backward, the last one on the caller's
                assert [c[:3] for c in calls] == [(i, sizes[i], flat) for i in range(n)]
                threads = [c[3] for c in calls]
                want = ["minidist-ddp-comm"] * (n - 1) + ["MainThread"] if overlap else \
                    ["MainThread"] * n
                assert threads == want
                assert finished == [(list(range(n)), n)]  # once, after every bucket
        # ZeRO-2 style: .grad is left as this rank computed it; the ranks' shards of each
        # bucket, put together, are the averaged bucket
        for g, g_local in zip(out["sharded_grads"], local):
            assert torch.equal(g, g_local)
        assert sorted(out["shards"]) == list(range(n))
        for g_half, g_avg in zip(out["halved"], avg):
            torch.testing.assert_close(g_half, g_avg / 2, rtol=RTOL, atol=0)
        assert out["halved_layout"] == [False] * n  # Wrapped keeps Average's in-place layout
        assert "reduction must be a BucketReduction" in out["bad"]
    members = assign_buckets(list(mlp().parameters()), TINY * 2**20)
    for b, idx in enumerate(members):
        full = torch.cat([results[r]["shards"][b] for r in range(2)])
        want = torch.cat([results[0]["avg"][i].reshape(-1) for i in idx])
        torch.testing.assert_close(full, want, rtol=RTOL, atol=0)


def _pipeline_rank(comm):
    """Two micro-batches, both forwards first (as a pipeline runs them), synchronizing only
    the last backward: forwards under no_sync, then the scheduler re-armed before it."""
    x, y = (t.chunk(comm.world_size)[comm.rank] for t in batches("mlp", steps=1)[0])
    model = mlp()
    ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=TINY)
    with ddp.no_sync():
        outs = [ddp(xi) for xi in x.chunk(2)]
    before = comm.stats.bytes_sent
    (F.mse_loss(outs[0], y.chunk(2)[0]) / 2).backward()
    quiet = comm.stats.bytes_sent - before
    ddp.scheduler.prepare(outs[1], sync=True)
    (F.mse_loss(outs[1], y.chunk(2)[1]) / 2).backward()
    return {n: p.grad for n, p in model.named_parameters()}, quiet


def test_pipeline_synchronizes_only_the_last_micro_batch():
    x, y = batches("mlp", steps=1)[0]
    ref = mlp()
    F.mse_loss(ref(x), y).backward()
    want = {n: p.grad for n, p in ref.named_parameters()}
    for grads, quiet in md.launch(_pipeline_rank, 2):
        assert quiet == 0
        assert_params_close(grads, want, atol=1e-14)


def test_reduction_argument_errors():
    comm = SimpleNamespace(rank=0, world_size=2, isend=None)
    with pytest.raises(TypeError, match="reduction must be a BucketReduction"):
        md.DistributedDataParallel(nn.Linear(2, 2), comm, reduction=lambda c, b: None)
    with pytest.raises(ValueError, match="comm_hook or reduction, not both"):
        md.DistributedDataParallel(nn.Linear(2, 2), comm, reduction=Average(),
                                   comm_hook=allreduce_hook)
    with pytest.raises(TypeError, match="inner must be a BucketReduction"):
        Halved("avg")
    with pytest.raises(TypeError, match="abstract"):
        BucketReduction()
