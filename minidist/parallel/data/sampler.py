"""``DistributedSampler``: give each rank its own disjoint shard of a dataset.

Data parallelism needs every rank to see different samples in a step, and all ranks
together to see the whole dataset in an epoch. The recipe is PyTorch's
(``torch.utils.data.distributed.DistributedSampler``), reproduced index for index:

1. every rank draws the same permutation (the generator is seeded with ``seed + epoch``, so
   ranks agree without talking, and ``set_epoch`` reshuffles each epoch);
2. the list is padded by repeating its head (``drop_last=False``) or cut (``drop_last=True``)
   to a multiple of the world size, so that every rank gets the same number of samples and
   takes the same number of steps (a rank with one step fewer would leave the others waiting
   in an all-reduce forever);
3. rank r takes every p-th index starting at r (a strided split, not a contiguous one).

Since the permutation is computed on each rank, the ranks must agree on the dataset length
and on ``seed``, ``shuffle`` and ``drop_last``; the constructor checks that once, so a
mismatch is an error rather than silently overlapping shards.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from ...checks import integer
from ...collectives.agreement import disagreement


def shard_indices(n: int, rank: int, world_size: int, shuffle: bool = True, seed: int = 0,
                  epoch: int = 0, drop_last: bool = False) -> list[int]:
    """The indices of a dataset of ``n`` samples that ``rank`` of ``world_size`` reads."""
    num_samples, total = shard_sizes(n, world_size, drop_last)
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    if drop_last:
        indices = indices[:total]  # drop the tail that does not divide evenly
    elif total > n:  # pad by repeating from the start (several times if n < world_size)
        indices = (indices * math.ceil(total / n))[:total]
    return indices[rank:total:world_size]


def shard_sizes(n: int, world_size: int, drop_last: bool) -> tuple[int, int]:
    """(samples per rank, samples per epoch over all ranks), as PyTorch computes them."""
    if drop_last and n % world_size != 0:
        per_rank = math.ceil((n - world_size) / world_size)
    else:
        per_rank = math.ceil(n / world_size)
    per_rank = max(per_rank, 0)
    return per_rank, per_rank * world_size


class DistributedSampler(Sampler[int]):
    """Sample this rank's shard of ``dataset``: ``DataLoader(ds, sampler=DistributedSampler(ds,
    comm))``. Call ``set_epoch(e)`` at the start of every epoch, or each epoch repeats the
    order of the first one (exactly as with PyTorch's sampler)."""

    def __init__(self, dataset, comm, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        if not hasattr(dataset, "__len__"):
            raise TypeError("DistributedSampler needs a dataset with a length (a map-style "
                            f"dataset); got {type(dataset).__name__}, which has no __len__")
        integer(seed, "seed", low=None, error=TypeError)
        self.dataset, self.comm = dataset, comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.epoch = 0
        self.num_samples, self.total_size = shard_sizes(len(dataset), self.world_size,
                                                        self.drop_last)
        _check_ranks_agree(comm, len(dataset), self.seed, self.shuffle, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Use a fresh shuffle for ``epoch``; every rank must pass the same number."""
        integer(epoch, "epoch", low=0)
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(shard_indices(len(self.dataset), self.rank, self.world_size, self.shuffle,
                                  self.seed, self.epoch, self.drop_last))

    def __len__(self) -> int:
        return self.num_samples


def _check_ranks_agree(comm, n: int, seed: int, shuffle: bool, drop_last: bool) -> None:
    """Every rank computes the permutation itself, so all must agree on what goes into it."""
    mine = [n, seed, int(shuffle), int(drop_last)]
    texts = disagreement(comm, json.dumps(mine), op="DistributedSampler check")
    if texts is None:
        return
    table = [json.loads(t) for t in texts]
    names = ("len(dataset)", "seed", "shuffle", "drop_last")
    for r, row in enumerate(table):
        for name, a, b in zip(names, table[0], row):
            if a != b:
                raise ValueError(
                    f"DistributedSampler: every rank must pass the same {name}, but rank 0 "
                    f"has {a} and rank {r} has {b}; otherwise the ranks shuffle differently "
                    "and their shards overlap")
