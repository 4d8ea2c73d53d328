"""The elastic sampler: every sample of an epoch exactly once whatever the world sizes and
rollbacks, the same global batches at every world size, and losses weighted so that the
ranks' average is the global batch's mean. Pure: no processes."""

from __future__ import annotations

import pytest
import torch

from minidist.parallel.data.sampler import shard_indices as ddp_shard_indices
from minidist.parallel.elastic import ElasticBatch, ElasticSampler


def _step(sampler: ElasticSampler, world: int) -> list[list[int]]:
    """Every rank's ids for the next step (then advance), or [] at the end of the epoch."""
    parts = [sampler.next_batch(r, world) for r in range(world)]
    if parts[0] is None:
        return []
    sampler.advance(parts[0])
    return [p.ids.tolist() for p in parts]


@pytest.mark.parametrize("worlds", [[1], [4], [3, 2, 4, 1, 3], [2, 3, 5, 5, 1, 2, 7]])
@pytest.mark.parametrize("n, batch", [(37, 6), (40, 8), (5, 7)])
def test_every_sample_once_per_epoch_whatever_the_world_sizes(worlds, n, batch):
    sampler = ElasticSampler(n, batch, seed=3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen, k = [], 0
        while parts := _step(sampler, worlds[k % len(worlds)]):
            global_batch = sampler.permutation()[len(seen):len(seen) + batch]
            assert sorted(i for p in parts for i in p) == sorted(global_batch)
            seen += global_batch
            k += 1
        assert sorted(seen) == list(range(n)) and seen == sampler.permutation(epoch)


def test_rollback_recuts_the_same_samples_for_the_new_world():
    sampler = ElasticSampler(30, 6, seed=1)
    _step(sampler, 3)
    committed = sampler.state_dict()
    lost = _step(sampler, 3) + _step(sampler, 3)  # done at world 3, then lost in a failure
    sampler.load_state_dict(committed)
    redone = _step(sampler, 2) + _step(sampler, 2)
    assert sorted(sum(lost, [])) == sorted(sum(redone, []))
    assert redone[0] == sampler.permutation()[6:12][0::2] and len(redone) == 4


def test_strided_like_distributed_sampler_and_same_permutation():
    sampler = ElasticSampler(24, 24, seed=5)
    sampler.set_epoch(2)
    for r in range(4):  # one step = the whole epoch: DistributedSampler's shards exactly
        got = sampler.next_batch(r, 4).ids.tolist()
        assert got == ddp_shard_indices(24, r, 4, shuffle=True, seed=5, epoch=2)
    assert ElasticSampler(9, 2, shuffle=False).permutation() == list(range(9))


@pytest.mark.parametrize("n, world", [(6, 4), (1, 3), (7, 2)])
def test_mean_weights_uneven_and_empty_parts_to_the_global_mean(n, world):
    sampler = ElasticSampler(n, n, shuffle=False)
    losses = torch.arange(n, dtype=torch.float64) ** 2
    parts = [sampler.next_batch(r, world) for r in range(world)]
    averaged = sum(p.mean(losses[p.ids]) for p in parts) / world  # what DDP's average does
    assert torch.allclose(averaged, losses.mean(), rtol=1e-15, atol=0)
    assert any(len(p.ids) != len(parts[0].ids) for p in parts) or n % world == 0


def test_errors_name_the_mistake():
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        ElasticSampler(10, 0)
    with pytest.raises(ValueError, match="num_samples"):
        ElasticSampler(-1, 2)
    sampler = ElasticSampler(10, 4)
    with pytest.raises(ValueError, match="rank 3 is not a rank of a world of 3"):
        sampler.next_batch(3, 3)
    batch = sampler.next_batch(0, 2)
    sampler.advance(batch)
    with pytest.raises(ValueError, match="advance each batch once"):
        sampler.advance(batch)
    with pytest.raises(ValueError, match="one loss per sample"):
        batch.mean(torch.zeros(3))
    with pytest.raises(ValueError, match="epoch must be a non-negative int"):
        sampler.set_epoch(-1)
    assert isinstance(sampler.next_batch(1, 2), ElasticBatch)
