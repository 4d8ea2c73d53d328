"""Top-k with error feedback: nothing is lost, only delayed; the naive version beside it.

Exactness. The gradients here are small integers stored in float64, so every sum of them is
exact and "exactly" means bitwise (``torch.equal``): sum_t sent_t + e_T == sum_t g_t on every
rank. The DDP run compares ratio=1 with one process in float64 at 1e-13 (the tolerance of
tests/parallel/data/test_data_parallel.py, which explains it).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from oracles import assert_params_close, assert_replicas_bitwise, params_of, train_single
from test_data_parallel import SGD, batches, mlp, train

import minidist as md
from minidist.compression import TopK, topk_bytes, topk_naive
from minidist.costmodel.collectives import ring_bytes

SIZES = (37, 10)  # two buckets of uneven sizes: per-bucket state must not mix
RATIO, STEPS = 0.2, 6


def int_grad(rank: int, step: int, index: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + index)
    return torch.randint(-8, 9, (n,), generator=g).double()


def dense(indices: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=values.dtype).index_put_((indices.long(),), values)


def _feedback_rank(comm):
    hook = TopK(RATIO)
    sent_sum = [torch.zeros(n, dtype=torch.float64) for n in SIZES]
    true_sum = [torch.zeros(n, dtype=torch.float64) for n in SIZES]
    for step in range(STEPS):
        for index, n in enumerate(SIZES):
            g = int_grad(comm.rank, step, index, n)
            corrected = g + (hook.residual(index) if step else 0)
            out = hook(comm, SimpleNamespace(buffer=g.clone(), index=index))
            mine = dense(*hook.last_sent[index], n)
            k = hook.last_sent[index][0].numel()
            assert k == math.ceil(n * RATIO)
            left = hook.residual(index)
            assert torch.equal(mine + left, corrected)  # every entry sent or kept
            assert (mine != 0).sum() <= k
            if k < n:  # the k largest magnitudes were sent
                kept = corrected.abs()[left != 0]
                assert kept.numel() == 0 or corrected.abs().topk(k).values.min() >= kept.max()
            every = md.all_gather(comm, mine)  # what each rank transmitted
            assert torch.equal(out, every.sum(0) / comm.world_size)
            assert_replicas_bitwise(comm, [out])
            sent_sum[index] += mine
            true_sum[index] += g
    for index in range(len(SIZES)):
        assert torch.equal(sent_sum[index] + hook.residual(index), true_sum[index])
    return hook.report()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_error_feedback_loses_nothing(world_size):
    """Per rank and bucket, over several steps: transmitted + residual == true, bitwise."""
    for report in md.launch(_feedback_rank, world_size, timeout=60):
        assert report["steps"] == STEPS
        want = sum(topk_bytes(n, 8, world_size, RATIO) for n in SIZES)
        assert report["bytes_sent"] == want
        assert 0 < report["relative_error"] < 1


def _naive_rank(comm):
    """TopK without error feedback and the naive dense version: the same average; bytes as
    counted by comm.stats against the formulas."""
    n, out = 29, []
    ours, naive = TopK(0.25, error_feedback=False), topk_naive(0.25)
    for step in range(3):
        g = int_grad(comm.rank, step, 0, n)
        before = comm.stats.bytes_sent
        a = ours(comm, SimpleNamespace(buffer=g.clone(), index=0))
        sparse_bytes = comm.stats.bytes_sent - before
        before = comm.stats.bytes_sent
        b = naive(comm, SimpleNamespace(buffer=g.clone(), index=0))
        dense_bytes = comm.stats.bytes_sent - before
        out.append((torch.equal(a, b), sparse_bytes, dense_bytes, ours.report()["bytes_sent"]))
    return out


def test_without_feedback_equals_naive_and_bytes_match_formula():
    p, n = 3, 29
    for rank, rows in enumerate(md.launch(_naive_rank, p, timeout=60)):
        for same, sparse_bytes, dense_bytes, reported in rows:
            assert same
            assert sparse_bytes == reported == topk_bytes(n, 8, p, 0.25) == (p - 1) * 8 * 12
            assert dense_bytes == ring_bytes(n, 8, p, rank)


def _ddp_rank(comm, ratio):
    model = mlp(seed=comm.rank)
    hook = TopK(ratio)
    ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=0.001, comm_hook=hook)
    train(ddp, batches("mlp"), comm.rank, comm.world_size)
    assert_replicas_bitwise(comm, model)
    return params_of(model), hook.report()


@pytest.mark.parametrize("world_size", [2, 3])
def test_ratio_one_is_plain_ddp(world_size):
    """ratio=1 sends every entry: DDP's average, one process's training (float64, 1e-13)."""
    want = train_single(mlp, batches("mlp"), **SGD).params
    for got, report in md.launch(_ddp_rank, world_size, args=(1.0,), timeout=60):
        assert_params_close(got, want, atol=1e-13)
        assert report["relative_error"] == 0.0


def test_sparse_ddp_keeps_replicas_equal():
    """A real sparse ratio under DDP: replicas stay bitwise equal (checked in the rank),
    training differs from dense (so the hook is really in the loop)."""
    want = train_single(mlp, batches("mlp"), **SGD).params
    for got, report in md.launch(_ddp_rank, 2, args=(0.1,), timeout=60):
        assert report["compression"] > 1
        with pytest.raises(AssertionError):
            assert_params_close(got, want, atol=1e-6)


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, True, "0.1", None])
def test_bad_ratio_is_named(ratio):
    with pytest.raises(ValueError, match="ratio must be a number in \\(0, 1\\]"):
        TopK(ratio)
    with pytest.raises(ValueError, match="ratio"):
        topk_naive(ratio)


def test_bad_error_feedback_and_missing_residual():
    with pytest.raises(TypeError, match="error_feedback"):
        TopK(0.1, error_feedback="yes")
    with pytest.raises(KeyError, match="bucket 3"):
        TopK(0.1).residual(3)
