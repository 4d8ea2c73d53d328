"""Tests of exercise 02: the sampler's shards, the gradient average, bucket assignment.

References are the real systems: ``torch.utils.data.DistributedSampler`` for the shards,
single-process big-batch gradients for the average, and the bucket assignment of
``md.DistributedDataParallel`` (``minidist.parallel.data.buckets.assign_buckets``, the rule
of PyTorch's
``_compute_bucket_assignment_by_size`` for one dtype)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from ...parallel.data.buckets import assign_buckets
from ..feedback import Mistake
from ..registry import GradedTest
from .harness import run_ranks

# -- the sampler's shards ---------------------------------------------------------------------
SHARD_CASES = [(10, 3, False, 0, 0), (12, 4, False, 0, 0), (10, 3, True, 0, 0),
               (10, 3, True, 0, 1), (17, 4, True, 42, 5), (2, 4, True, 7, 0),
               (1, 1, True, 0, 0), (100, 8, True, 3, 2)]


def check_shard_indices(shard_indices) -> str:
    for n, p, shuffle, seed, epoch in SHARD_CASES:
        case = f"n={n}, world_size={p}, shuffle={shuffle}, seed={seed}, epoch={epoch}"
        got = [_as_list(shard_indices(n, r, p, shuffle, seed, epoch), r, case)
               for r in range(p)]
        want = [list(_torch_sampler(n, r, p, shuffle, seed, epoch)) for r in range(p)]
        for r in range(p):
            if got[r] != want[r]:
                raise Mistake(f"with {case}: rank {r} got {_short(got[r])}, expected "
                              f"{_short(want[r])} (torch's DistributedSampler); "
                              f"{_shard_hint(got, want, n, p, shuffle)}")
    return f"the same shards as torch's DistributedSampler in {len(SHARD_CASES)} cases"


def _torch_sampler(n, rank, p, shuffle, seed, epoch):
    sampler = DistributedSampler(range(n), num_replicas=p, rank=rank, shuffle=shuffle,
                                 seed=seed)
    sampler.set_epoch(epoch)
    return sampler


def _as_list(result, rank, case) -> list[int]:
    try:
        return [int(i) for i in result]
    except TypeError:
        raise Mistake(f"with {case}: rank {rank}: shard_indices returned "
                      f"{type(result).__name__}, expected a list of ints") from None


def _short(xs, limit=10) -> str:
    return str(xs) if len(xs) <= limit else str(xs[:limit])[:-1] + f", ... ({len(xs)} items)]"


def _shard_hint(got, want, n, p, shuffle) -> str:
    if any(len(g) != len(want[0]) for g in got):
        return (f"every rank gets ceil(n / world_size) = {len(want[0])} indices: pad the list "
                "by repeating it from the start until its length divides by world_size")
    if sorted(sum(got, [])) == sorted(sum(want, [])):
        return ("the right indices, split the wrong way: rank r takes every world_size-th "
                "index starting at r (indices[rank::world_size])")
    if shuffle:
        return ("the order differs: permute with torch.randperm(n, generator=g) where "
                "g = torch.Generator(); g.manual_seed(seed + epoch), the same on every rank")
    return "without shuffling, the indices are 0, 1, ..., n-1 (padded), split by rank"


# -- the gradient average ---------------------------------------------------------------------
BATCH = 12  # divisible by every world size tested, so shards are equal


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    model[0].bias.requires_grad_(False)  # frozen: its .grad stays None
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=g, dtype=torch.float64))


def _grads(model, x, y) -> dict:
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _average_body(comm, average_gradients):
    model, (x, y) = _model(), _batch()
    shard = slice(comm.rank * BATCH // comm.world_size, (comm.rank + 1) * BATCH // comm.world_size)
    local = _grads(model, x[shard], y[shard])
    average_gradients(comm, model)
    after = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return local, after


def check_average_gradients(average_gradients) -> str:
    model, (x, y) = _model(), _batch()
    full = _grads(model, x, y)
    for p in (1, 2, 3, 4):
        ranks = run_ranks(_average_body, p, (average_gradients,), "average_gradients",
                          f"world_size={p}")
        for rank, (local, after) in enumerate(ranks):
            for name, want in full.items():
                _check_grad(after[name], want, local[name], name, rank, p)
    return ("every rank ends with the full-batch gradient on world sizes 1 to 4 "
            "(frozen parameters left alone)")


def _check_grad(got, want, local, name, rank, p) -> None:
    where = f"with world_size={p}: rank {rank}, parameter {name}"
    if want is None:
        if got is not None:
            raise Mistake(f"{where} is frozen (requires_grad=False) and had no gradient, but "
                          "now has one: skip parameters whose .grad is None")
        return
    if got is None:
        raise Mistake(f"{where}: .grad is None after average_gradients; average it in place")
    if torch.allclose(got, want, rtol=1e-9, atol=1e-12):
        return
    if p > 1 and torch.allclose(got, want * p, rtol=1e-9, atol=1e-12):
        hint = f"it is {p} times too large: you summed the gradients; divide by world_size"
    elif p > 1 and torch.allclose(got, local, rtol=1e-9, atol=1e-12):
        hint = "it is still this rank's own gradient: all-reduce it across the ranks"
    else:
        err = (got - want).abs().max().item()
        hint = f"it differs from the full-batch gradient by up to {err:.3g}"
    raise Mistake(f"{where}: {hint}")


# -- bucket assignment -----------------------------------------------------------------------
BUCKET_CASES = [  # (parameter sizes in bytes, cap in bytes)
    ([4000] * 10, 10_000), ([400, 4_000_000, 40, 40, 40_000], 50_000),
    ([100, 200, 300], 10**9), ([], 1000), ([4096, 4096, 4096, 4096], 8192),
    ([1000, 1, 1, 1, 50_000, 1, 1], 1000),
]


def check_assign_buckets(assign_buckets_fn) -> str:
    for sizes, cap in BUCKET_CASES:
        case = f"parameter sizes {sizes} bytes and cap {cap} bytes"
        got = assign_buckets_fn(list(sizes), cap)
        want = assign_buckets([torch.empty(s, dtype=torch.uint8) for s in sizes], cap)
        if not isinstance(got, list) or [list(map(int, b)) for b in got] != want:
            raise Mistake(f"with {case}: got {got!r}, expected {want}; "
                          f"{_bucket_hint(got, want, sizes, cap)}")
    return f"the buckets of md.DistributedDataParallel in {len(BUCKET_CASES)} cases"


def _bucket_hint(got, want, sizes, cap) -> str:
    try:
        flat = [int(i) for b in got for i in b]
    except TypeError:
        return "return a list of buckets, each a list of parameter indices"
    if sorted(flat) != list(range(len(sizes))):
        return "every parameter index must be in exactly one bucket"
    if flat != list(range(len(sizes)))[::-1]:
        return ("fill buckets in reverse order, starting from the last parameter: backward "
                "produces the gradients of the last layers first")
    return ("close a bucket as soon as it holds cap bytes or more (the parameter that "
            "crosses the cap stays in it), then start a new one; a last, partly full "
            "bucket closes at the end")


TESTS = [
    GradedTest("test_shard_indices", 2, ("shard_indices",), check_shard_indices),
    GradedTest("test_average_gradients", 3, ("average_gradients",), check_average_gradients),
    GradedTest("test_assign_buckets", 3, ("assign_buckets",), check_assign_buckets),
]
