"""``md.elastic.run``: the training loop that commits every k steps and stops at a commit
when the membership should change (Horovod's ``hvd.elastic.run``, as a loop).

Per step: this rank's part of the next global batch (``ElasticSampler``), the user's
``train_step(batch)`` (forward, backward, optimizer step), then the sampler's position and
the step count move on. Every ``commit_every`` steps the state is committed and the ranks
agree on the membership: rank 0 asks the rendezvous how many slots are offered now and
broadcasts the answer, so all ranks take the same decision even if the answer comes from
outside (a file, a scheduler). If it differs from the world size, every rank raises
``HostsUpdatedInterrupt`` right after the commit; the agent (``agent.py``) relaunches the
job at the new size, which resumes from that very commit: nothing is lost by a join.

A failure between commits loses the steps since the last one: ``k / 2`` on average, each
redone at the new world size after the restart (``costmodel.elastic``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...checks import integer
from ...collectives import broadcast
from .elastic_sampler import ElasticBatch
from .rendezvous import Rendezvous
from .state import TorchState


class HostsUpdatedInterrupt(Exception):
    """Raised on every rank at a commit when the rendezvous offers ``world_size`` slots
    instead of the current number (Horovod's name). ``step``: the committed step."""

    def __init__(self, world_size: int, step: int):
        self.world_size, self.step = world_size, step
        super().__init__(f"membership change at step {step}: {world_size} slots offered")

    def __reduce__(self):
        return (HostsUpdatedInterrupt, (self.world_size, self.step))


def run(train_step: Callable[[ElasticBatch], object], comm, state: TorchState,
        rdzv: Rendezvous, epochs: int, commit_every: int) -> TorchState:
    """Train ``epochs`` epochs from the last commit; return the state at the end.

    ``train_step(batch)`` runs one step on this rank's ``batch`` (an ``ElasticBatch``).
    Commits every ``commit_every`` steps and at the end. Raises ``HostsUpdatedInterrupt``
    after a commit when the membership changes (the agent catches it)."""
    _check_run_args(train_step, state, epochs, commit_every)
    if not state.restore(comm):
        state.commit(comm)  # step 0: every restart before the first commit starts here too
    sampler, committed = state.sampler, state.step
    while sampler.epoch < epochs:
        batch = sampler.next_batch(comm.rank, comm.world_size)
        if batch is None:
            sampler.set_epoch(sampler.epoch + 1)
            continue
        train_step(batch)
        sampler.advance(batch)
        state.step += 1
        if state.step % commit_every == 0:
            state.commit(comm)
            committed = state.step
            check_membership(comm, rdzv, state.step)
    if committed != state.step:
        state.commit(comm)
    return state


def check_membership(comm, rdzv: Rendezvous, step: int) -> None:
    """The agreement step: rank 0's view of the offered slots, broadcast to all."""
    offered = torch.tensor([rdzv.offered(step) if comm.rank == 0 else 0], dtype=torch.int64,
                           device=comm.device)  # NCCL broadcasts CUDA tensors only
    broadcast(comm, offered, src=0)
    if int(offered) != comm.world_size:
        raise HostsUpdatedInterrupt(int(offered), step)


def _check_run_args(train_step, state, epochs, commit_every) -> None:
    if not callable(train_step):
        raise TypeError(f"train_step must be a function of the batch, got "
                        f"{type(train_step).__name__}")
    if not isinstance(state, TorchState) or state.sampler is None:
        raise TypeError("state must be an md.elastic.TorchState with a sampler= (an "
                        "md.elastic.ElasticSampler)")
    integer(epochs, "epochs", low=0), integer(commit_every, "commit_every")
