"""Tests of exercise 02: the sampler's shards and bucket assignment (here), and the stages
of data parallelism's mechanism, hooks, buckets and overlap (``ddp_stages.py``).

References are the real systems: ``torch.utils.data.DistributedSampler`` for the shards,
the bucket assignment of ``md.DistributedDataParallel``
(``minidist.parallel.data.buckets.assign_buckets``, the rule of PyTorch's
``_compute_bucket_assignment_by_size`` for one dtype), and one process training on the
whole batch for the stages."""

from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from ...parallel.data.buckets import assign_buckets
from ..engine.feedback import Mistake
from ..engine.sandbox import BUCKETS, SAMPLER
from ..engine.spec import GradedTest
from .ddp_stages import TESTS as STAGES

# -- the sampler's shards ---------------------------------------------------------------------
SHARD_CASES = [(10, 3, False, 0, 0), (12, 4, False, 0, 0), (10, 3, True, 0, 0),
               (10, 3, True, 0, 1), (17, 4, True, 42, 5), (2, 4, True, 7, 0),
               (1, 1, True, 0, 0), (100, 8, True, 3, 2), (2, 5, True, 1, 0),
               (3, 8, False, 0, 0)]


def check_shard_indices(learner) -> str:
    calls, labels = [], []
    for n, p, shuffle, seed, epoch in SHARD_CASES:
        case = f"n={n}, world_size={p}, shuffle={shuffle}, seed={seed}, epoch={epoch}"
        calls += [(n, r, p, shuffle, seed, epoch) for r in range(p)]
        labels += [case] * p
    results = iter(learner.call_each("shard_indices", calls, labels))
    for n, p, shuffle, seed, epoch in SHARD_CASES:
        case = f"n={n}, world_size={p}, shuffle={shuffle}, seed={seed}, epoch={epoch}"
        got = [_as_list(next(results), r, case) for r in range(p)]
        want = [list(_torch_sampler(n, r, p, shuffle, seed, epoch)) for r in range(p)]
        for r in range(p):
            if got[r] != want[r]:
                raise Mistake(f"with {case}: rank {r} got {_short(got[r])}, expected "
                              f"{_short(want[r])} (torch's DistributedSampler); "
                              f"{_shard_hint(got, want, n, p, (shuffle, seed, epoch))}")
    return f"the same shards as torch's DistributedSampler in {len(SHARD_CASES)} cases"


def _torch_sampler(n, rank, p, shuffle, seed, epoch):
    sampler = DistributedSampler(range(n), num_replicas=p, rank=rank, shuffle=shuffle,
                                 seed=seed)
    sampler.set_epoch(epoch)
    return sampler


def _as_list(result, rank, case) -> list[int]:
    """The indices as a list of ints: from a list, a tuple or a tensor (the same answer)."""
    if isinstance(result, torch.Tensor):
        result = result.flatten().tolist()
    if isinstance(result, (list, tuple)) and all(
            isinstance(i, int) or isinstance(i, float) and i.is_integer() for i in result):
        return [int(i) for i in result]
    raise Mistake(f"with {case}: rank {rank}: shard_indices returned {result!r:.80}, "
                  "expected a list of ints")


def _short(xs, limit=10) -> str:
    return str(xs) if len(xs) <= limit else str(xs[:limit])[:-1] + f", ... ({len(xs)} items)]"


def _shard_hint(got, want, n, p, order) -> str:
    shuffle, seed, epoch = order
    if any(len(g) != len(want[0]) for g in got):
        short = " (when more padding is needed than n, repeat the list more than once)" \
            if p * len(want[0]) - n > n else ""
        return (f"every rank gets ceil(n / world_size) = {len(want[0])} indices: pad the list "
                f"by repeating it from the start until its length divides by world_size{short}")
    if shuffle and epoch and got == [list(_torch_sampler(n, r, p, True, seed, 0))
                                     for r in range(p)]:
        return ("these are the shards of epoch 0: the order must change every epoch, the "
                "same on every rank: seed the generator with seed + epoch")
    if sorted(sum(got, [])) == sorted(sum(want, [])):
        return ("the right indices, split the wrong way: rank r takes every world_size-th "
                "index starting at r (indices[rank::world_size])")
    if shuffle:
        return ("the order differs: permute with torch.randperm(n, generator=g) where "
                "g = torch.Generator(); g.manual_seed(seed + epoch), the same on every rank")
    return "without shuffling, the indices are 0, 1, ..., n-1 (padded), split by rank"


# -- bucket assignment -----------------------------------------------------------------------
BUCKET_CASES = [  # (parameter sizes in bytes, cap in bytes)
    ([4000] * 10, 10_000), ([400, 4_000_000, 40, 40, 40_000], 50_000),
    ([100, 200, 300], 10**9), ([], 1000), ([4096, 4096, 4096, 4096], 8192),
    ([1000, 1, 1, 1, 50_000, 1, 1], 1000),
]


def check_assign_buckets(learner) -> str:
    labels = [f"parameter sizes {sizes} bytes and cap {cap} bytes" for sizes, cap in BUCKET_CASES]
    results = learner.call_each("assign_buckets", [(list(s), c) for s, c in BUCKET_CASES],
                                labels)
    for (sizes, cap), case, got in zip(BUCKET_CASES, labels, results):
        want = assign_buckets([torch.empty(s, dtype=torch.uint8) for s in sizes], cap)
        if _buckets(got) != want:
            raise Mistake(f"with {case}: got {got!r:.200}, expected {want}; "
                          f"{_bucket_hint(got, want, sizes, cap)}")
    return f"the buckets of md.DistributedDataParallel in {len(BUCKET_CASES)} cases"


def _buckets(got) -> list[list[int]] | None:
    """A list of lists of ints from any sequences of sequences of integers (tuples,
    tensors): the same answer in another container."""
    try:
        if isinstance(got, torch.Tensor) or not isinstance(got, (list, tuple)):
            return None
        out = [b.tolist() if isinstance(b, torch.Tensor) else list(b) for b in got]
        return out if all(isinstance(i, int) for b in out for i in b) else None
    except TypeError:
        return None


def _bucket_hint(got, want, sizes, cap) -> str:
    buckets = _buckets(got)
    if buckets is None:
        return "return a list of buckets, each a list of parameter indices"
    flat = [i for b in buckets for i in b]
    if sorted(flat) != list(range(len(sizes))):
        return "every parameter index must be in exactly one bucket"
    if flat != list(range(len(sizes)))[::-1]:
        return ("fill buckets in reverse order, starting from the last parameter: backward "
                "produces the gradients of the last layers first")
    return ("close a bucket as soon as it holds cap bytes or more (the parameter that "
            "crosses the cap stays in it), then start a new one; a last, partly full "
            "bucket closes at the end")


TESTS = [  # in notebook order
    GradedTest("test_shard_indices", 2, ("shard_indices",), check_shard_indices, (SAMPLER,)),
    STAGES[0],  # register_allreduce_hooks
    GradedTest("test_assign_buckets", 2, ("assign_buckets",), check_assign_buckets,
               (BUCKETS,)),
    *STAGES[1:],  # register_bucket_hooks, register_overlapped_hooks (stretch)
]
