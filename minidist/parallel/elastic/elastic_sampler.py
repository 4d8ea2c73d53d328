"""``ElasticSampler``: shard what is left of an epoch over however many ranks there are now.

``DistributedSampler`` fixes the shards at the start of an epoch: rank r of p reads
``perm[r::p]``. When p changes in the middle of an epoch (a rank died, one joined), those
shards no longer add up: a sample of the dead rank's shard is never seen, or the new rank
repeats one. The elastic sampler therefore remembers one number, ``position``: how many
samples of this epoch's permutation the job has *consumed* (committed with the model), and
cuts the next step's global batch from what remains::

    perm (seed + epoch, the same on every rank)   [ 7 2 9 0 4 1 8 3 6 5 ]
    position = 4 (committed)                        ^^^^^^^ done
    next global batch (batch_size = 3)                      [ 4 1 8 ]
    world 2:  rank 0 -> [4, 8]   rank 1 -> [1]        (strided, as DistributedSampler)
    world 3:  rank 0 -> [4]      rank 1 -> [1]   rank 2 -> [8]

The *global* batch size is fixed, not the per-rank one: whatever the world size, step t of
an epoch trains on the same samples, so a run that changes world size computes (up to the
order of floating-point sums) exactly what one process would. The price: per-rank batches
are uneven when the world size does not divide the batch, so each rank's loss must be
weighted: ``ElasticBatch.mean(per_sample_losses)`` is ``sum(local) * p / n_global``, which
DDP's and ZeRO's average over p ranks turns into the mean over the whole global batch.
Horovod Elastic instead keeps the per-rank batch and asks the user to rescale the learning
rate with the world size; torchrun leaves it to the user.

Every sample of an epoch is consumed exactly once provided ``position`` is committed
together with the parameters: a rollback rewinds both, and the samples of the lost steps
are cut again, for the new world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import integer


@dataclass(frozen=True)
class ElasticBatch:
    """This rank's part of one step's global batch.

    ``ids``: the sample indices (int64, possibly empty on the last step of an epoch);
    ``global_size``: samples in the global batch over all ranks; ``world_size``: ranks
    sharing it; ``epoch`` and ``position``: where the global batch starts."""

    ids: torch.Tensor
    global_size: int
    world_size: int
    epoch: int
    position: int

    def mean(self, per_sample_losses: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward`` on: ``sum(local) * world_size / global_size``.

        Averaged over the ranks (DDP, ZeRO), it is the mean over the global batch, even
        when the ranks hold different numbers of samples (a plain ``.mean()`` would weight
        a rank's sample by 1 / its own count) and even on a rank that holds none."""
        if per_sample_losses.shape[:1] != self.ids.shape:
            raise ValueError(f"per_sample_losses must hold one loss per sample of this batch "
                             f"({len(self.ids)}), got shape {tuple(per_sample_losses.shape)}; "
                             "use reduction='none'")
        return per_sample_losses.sum() * (self.world_size / self.global_size)


class ElasticSampler:
    """The epoch's seeded permutation, consumed ``batch_size`` samples per step.

    ``num_samples``: the dataset's length; ``batch_size``: the global batch (all ranks
    together); ``shuffle``/``seed``: as ``DistributedSampler`` (generator seeded with
    ``seed + epoch``). ``epoch`` and ``position`` are the state a commit saves."""

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool = True, seed: int = 0):
        integer(num_samples, "num_samples"), integer(batch_size, "batch_size")
        integer(seed, "seed", low=None, error=TypeError)
        self.num_samples, self.batch_size = num_samples, batch_size
        self.shuffle, self.seed = bool(shuffle), seed
        self.epoch, self.position = 0, 0
        self.cached: tuple[int, list[int]] | None = None  # (epoch, its permutation)

    def permutation(self, epoch: int | None = None) -> list[int]:
        """The order of ``epoch`` (this one by default): the same on every rank."""
        epoch = self.epoch if epoch is None else epoch
        if self.cached is None or self.cached[0] != epoch:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + epoch)
                order = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                order = list(range(self.num_samples))
            self.cached = (epoch, order)
        return list(self.cached[1])

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a new epoch's position is 0)."""
        integer(epoch, "epoch", low=0)
        self.epoch, self.position = epoch, 0

    def remaining(self) -> int:
        """Samples of this epoch not consumed yet."""
        return self.num_samples - self.position

    def next_batch(self, rank: int, world_size: int) -> ElasticBatch | None:
        """This rank's part of the next global batch, or None at the end of the epoch. Does
        not move ``position``: ``advance`` does, once the step is done."""
        if not (isinstance(world_size, int) and world_size >= 1 and 0 <= rank < world_size):
            raise ValueError(f"rank {rank!r} is not a rank of a world of {world_size!r}")
        if self.remaining() <= 0:
            return None
        end = min(self.position + self.batch_size, self.num_samples)
        self.permutation()  # fills the cache for this epoch
        chunk = self.cached[1][self.position:end]
        ids = torch.tensor(chunk[rank::world_size], dtype=torch.int64)
        return ElasticBatch(ids, len(chunk), world_size, self.epoch, self.position)

    def advance(self, batch: ElasticBatch) -> None:
        """Count ``batch``'s global samples as consumed."""
        if (batch.epoch, batch.position) != (self.epoch, self.position):
            raise ValueError(f"advance got the batch of epoch {batch.epoch} at position "
                             f"{batch.position}, but the sampler is at epoch {self.epoch}, "
                             f"position {self.position}: advance each batch once, in order")
        self.position += batch.global_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def __repr__(self) -> str:
        return (f"ElasticSampler(num_samples={self.num_samples}, batch_size={self.batch_size}, "
                f"epoch={self.epoch}, position={self.position})")
