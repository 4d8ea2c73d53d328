"""DistributedSampler: PyTorch's sharding, index for index; shards partition the dataset."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import minidist as md
from minidist.parallel.data.sampler import shard_indices


def _shards(n, p, **kw) -> list[list[int]]:
    return [shard_indices(n, r, p, **kw) for r in range(p)]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), p=st.integers(1, 8), shuffle=st.booleans(),
       drop_last=st.booleans(), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_same_indices_as_torch(n, p, shuffle, drop_last, seed, epoch):
    data = list(range(n))
    for rank in range(p):
        ref = TorchSampler(data, num_replicas=p, rank=rank, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
        ref.set_epoch(epoch)
        assert shard_indices(n, rank, p, shuffle, seed, epoch, drop_last) == list(ref)


@pytest.mark.parametrize("n,p", [(12, 4), (13, 4), (3, 4), (1, 3), (100, 7), (0, 2)])
@pytest.mark.parametrize("epoch", [0, 5])
def test_shards_partition_the_dataset(n, p, epoch):
    keep = _shards(n, p, epoch=epoch)
    sizes = {len(s) for s in keep}
    assert len(sizes) == 1  # equal steps on every rank, or an all-reduce waits forever
    flat = [i for s in keep for i in s]
    assert set(flat) == set(range(n))  # every sample is seen
    pad = -n % p if n else 0
    assert len(flat) == n + pad  # ... and only the padding is seen twice
    if n >= p:
        assert len(set(flat)) == len(flat) - pad

    drop = _shards(n, p, epoch=epoch, drop_last=True)
    flat = [i for s in drop for i in s]
    assert len(flat) == len(set(flat)) == n // p * p  # disjoint, short by less than p
    assert {len(s) for s in drop} == {n // p}


def test_set_epoch_reshuffles_and_stays_a_partition():
    orders = [_shards(40, 4, seed=3, epoch=e) for e in range(3)]
    assert orders[0] != orders[1] != orders[2]
    for shards in orders:
        assert sorted(i for s in shards for i in s) == list(range(40))
    assert _shards(40, 4, seed=3, epoch=1) == orders[1]  # deterministic
    assert _shards(40, 4, shuffle=False, epoch=7) == [list(range(r, 40, 4)) for r in range(4)]


def test_sampler_object_without_communication():
    comm = SimpleNamespace(rank=0, world_size=1)  # a world of one needs no messages
    ds = TensorDataset(torch.arange(10.0))
    s = md.DistributedSampler(ds, comm, shuffle=True, seed=4)
    first = list(s)
    assert len(s) == 10 and sorted(first) == list(range(10))
    s.set_epoch(1)
    assert list(s) != first and sorted(s) == list(range(10))
    s.set_epoch(0)
    assert list(s) == first


def test_sampler_errors():
    comm = SimpleNamespace(rank=0, world_size=1)
    with pytest.raises(TypeError, match="__len__"):
        md.DistributedSampler(iter(range(5)), comm)
    with pytest.raises(TypeError, match="seed must be an int"):
        md.DistributedSampler(list(range(5)), comm, seed=1.5)
    s = md.DistributedSampler(list(range(5)), comm)
    for bad in (-1, 1.0, "2", True):
        with pytest.raises(ValueError, match="epoch must be a non-negative int"):
            s.set_epoch(bad)


def _load_shards(comm, n, drop_last):
    ds = TensorDataset(torch.arange(n))
    sampler = md.DistributedSampler(ds, comm, seed=11, drop_last=drop_last)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=3, sampler=sampler)
        seen.append([int(i) for (batch,) in loader for i in batch])
    try:
        md.DistributedSampler(ds, comm, seed=comm.rank)  # ranks disagree on the seed
    except ValueError as e:
        return seen, str(e)
    return seen, None


@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_across_ranks(drop_last):
    n, p = 23, 3
    out = md.launch(_load_shards, p, args=(n, drop_last))
    for epoch in range(2):
        shards = [out[r][0][epoch] for r in range(p)]
        assert shards == _shards(n, p, seed=11, epoch=epoch, drop_last=drop_last)
        flat = [i for s in shards for i in s]
        assert set(flat) == set(range(n)) if not drop_last else len(set(flat)) == n // p * p
    assert out[0][0][0] != out[0][0][1]  # set_epoch reshuffled
    for _, err in out:
        assert err is not None and "same seed" in err and "rank 0 has 0 and rank 1 has 1" in err
