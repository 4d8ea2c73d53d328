"""Exercise 02's sampler and bucket tests: the learner's shards against torch's
``DistributedSampler``, the buckets against ``md.DistributedDataParallel``'s own rule."""

from __future__ import annotations

import torch

from ....parallel.data.buckets import assign_buckets
from ...engine.feedback import Mistake
from .mistakes import bucket_hint, buckets_of, shard_hint, short
from .ranks import torch_sampler

SHARD_CASES = [(10, 3, False, 0, 0), (12, 4, False, 0, 0), (10, 3, True, 0, 0),
               (10, 3, True, 0, 1), (17, 4, True, 42, 5), (2, 4, True, 7, 0),
               (1, 1, True, 0, 0), (100, 8, True, 3, 2), (2, 5, True, 1, 0),
               (3, 8, False, 0, 0)]
BUCKET_CASES = [  # (parameter sizes in bytes, cap in bytes)
    ([4000] * 10, 10_000), ([400, 4_000_000, 40, 40, 40_000], 50_000),
    ([100, 200, 300], 10**9), ([], 1000), ([4096, 4096, 4096, 4096], 8192),
    ([1000, 1, 1, 1, 50_000, 1, 1], 1000),
]


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
        want = [list(torch_sampler(n, r, p, shuffle, seed, epoch)) for r in range(p)]
        for r in range(p):
            if got[r] != want[r]:
                raise Mistake(f"with {case}: rank {r} got {short(got[r])}, expected "
                              f"{short(want[r])} (torch's DistributedSampler); "
                              f"{shard_hint(got, want, n, p, (shuffle, seed, epoch))}")
    return f"the same shards as torch's DistributedSampler in {len(SHARD_CASES)} cases"


def _as_list(result, rank, case) -> list[int]:
    """The indices as a list of ints: from a list, a tuple or a tensor (the same answer)."""
    if isinstance(result, torch.Tensor):
        result = result.flatten().tolist()
    if isinstance(result, (list, tuple)) and all(
            isinstance(i, int) or isinstance(i, float) and i.is_integer() for i in result):
        return [int(i) for i in result]
    raise Mistake(f"with {case}: rank {rank}: shard_indices returned {result!r:.80}, "
                  "expected a list of ints")


def check_assign_buckets(learner) -> str:
    labels = [f"parameter sizes {sizes} bytes and cap {cap} bytes" for sizes, cap in BUCKET_CASES]
    results = learner.call_each("assign_buckets", [(list(s), c) for s, c in BUCKET_CASES],
                                labels)
    for (sizes, cap), case, got in zip(BUCKET_CASES, labels, results):
        want = assign_buckets([torch.empty(s, dtype=torch.uint8) for s in sizes], cap)
        if buckets_of(got) != want:
            raise Mistake(f"with {case}: got {got!r:.200}, expected {want}; "
                          f"{bucket_hint(got, want, sizes, cap)}")
    return f"the buckets of md.DistributedDataParallel in {len(BUCKET_CASES)} cases"
